"""Bad settings and data stop ``run_ifcl.py`` before any model loads, with exit code 2, no traceback, and a
message that names the culprit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ENGLISH, GERMAN, ROOT, write_sts_file


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_encoder_dir):
    folder = tmp_path_factory.mktemp("bad")
    lines = [f"{e}\t{d}\n" for e, d in zip(ENGLISH, GERMAN)] * 3  # 36 pairs
    (folder / "train.txt").write_text("".join(lines), encoding="utf-8")
    write_sts_file(folder / "sts.tsv")
    (folder / "constant.tsv").write_text("sentence1\tsentence2\tscore\nA.\tB.\t3\nC.\tD.\t3\n", encoding="utf-8")
    (folder / "one_row.tsv").write_text("sentence1\tsentence2\tscore\nA.\tB.\t3\n", encoding="utf-8")
    (folder / "args.json").write_text('{"learning_rate": 1e-5,', encoding="utf-8")
    (folder / "good_args.json").write_text(json.dumps({"objective": "simcse", "queue_size": 2}), encoding="utf-8")
    return folder


CASES = [
    # (extra arguments; {files} and {model} are filled in), what the message must name
    (["--temperature", "nan"], "temperature"),
    (["--temperature", "inf"], "temperature"),
    (["--forgetting_rate", "nan"], "forgetting_rate"),
    (["--fusion_rate", "1.5"], "fusion_rate"),
    (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
    (["--max_train_samples", "0"], "--max_train_samples"),
    (["--max_seq_length", "4096"], "--max_seq_length"),
    (["--objective", "conisi", "--max_seq_length", "100"], "ConIsI's sentence pairs"),
    (["--objective", "simcse", "--pcl_beta", "2"], "--pcl_beta (--objective pcl)"),
    (["--per_device_train_batch_size", "48"], "fewer than one global batch"),
    (["--queue_size", "4", "--per_device_train_batch_size", "12"], "fewer than the hippocampus queue holds"),
    (["--validation_file", "{files}/constant.tsv"], "constant.tsv"),
    (["--validation_file", "{files}/one_row.tsv"], "one_row.tsv"),
    (["--model_name_or_path", "./no/such/model"], "./no/such/model"),
    (["--resume_from_checkpoint", "last"], "holds no checkpoint"),
    (["--sts_score_range", "5", "0"], "--sts_score_range"),
]


def run_script(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "run_ifcl.py"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize("extra, named", CASES, ids=[" ".join(case[0]) for case in CASES])
def test_bad_setting_stops_with_a_message_naming_it(files, tiny_encoder_dir, tmp_path, extra, named):
    base = [
        "--model_name_or_path", str(tiny_encoder_dir), "--train_file", str(files / "train.txt"),
        "--validation_file", str(files / "sts.tsv"), "--test_file", str(files / "sts.tsv"),
        "--output_dir", str(tmp_path / "out"), "--max_seq_length", "16", "--per_device_train_batch_size", "4",
        "--use_cpu",
    ]  # fmt: skip
    result = run_script([*base, *(a.replace("{files}", str(files)) for a in extra)], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert named in result.stderr, result.stderr[-2000:]
    assert "run_ifcl.py: error:" in result.stderr or "error:" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing written, no model loaded


@pytest.mark.slow
def test_invalid_json_arguments_file_is_named(files, tmp_path):
    result = run_script([str(files / "args.json")], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "args.json: not valid JSON" in result.stderr
