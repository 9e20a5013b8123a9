"""run_ifcl.py keeps the habits of the transformers example scripts: one push at the end whose failure loses nothing
(exit code 1, the ``hf upload`` command to push later), ``--hub_strategy end`` only, an honest ``--help``,
``--do_train``/``--do_eval``/``--do_predict`` honoured, ``--eval_strategy no`` and ``--eval_steps`` alone working,
and ``--model_name_or_path`` an IFCL model (a folder this script wrote, or a Hub id of one) to continue from."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, objective_run_args

import ifcl.hub
import run_ifcl
from ifcl.arguments import strategy_name
from ifcl.checks import check_training_settings
from ifcl.failures import run_command
from ifcl.files import RUN_IN_PROGRESS_FILE

IFCL_EXTRA = ("--queue_size", "2", "--forgetting_rate", "0.2")


def main_exit_code(argv: list[str], monkeypatch) -> int:
    """``run_ifcl.py`` with ``argv`` on the command line: its exit code (0 when it returns)."""
    monkeypatch.delenv("IFCL_DEBUG", raising=False)
    try:
        run_command("run_ifcl.py", lambda: run_ifcl.main(argv))
    except SystemExit as exit_info:
        return int(exit_info.code or 0)
    return 0


def bad_input(*args: str, tmp_path: Path) -> list[str]:
    """A command whose model does not exist: an error must come before it would be loaded."""
    return ["--model_name_or_path", str(tmp_path / "no-such-model"), "--output_dir", str(tmp_path / "out"), *args]


def results(folder: Path) -> dict[str, float]:
    return json.loads((folder / "all_results.json").read_text())


# ---------------------------------------------------------------- A. the Hub push


def test_a_failed_push_ends_with_exit_code_1_after_everything_is_saved(
    tiny_encoder_dir, english_sts_data, tmp_path, monkeypatch, capsys
):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    output = tmp_path / "out"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, output, "simcse", "--max_steps", "2")
    code = main_exit_code([*args, "--push_to_hub", "--hub_model_id", "you/x"], monkeypatch)
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "run_ifcl.py: error: --push_to_hub: could not push to you/x" in err and "Traceback" not in err
    # Everything is saved before the push: results, model, card, plot; the run is marked finished.
    for name in ("all_results.json", "model.safetensors", "config.json", "README.md", "training_curves.png"):
        assert (output / name).is_file(), name
    assert not (output / RUN_IN_PROGRESS_FILE).exists()
    assert results(output)["test_stsb_spearman"] is not None
    # The command that pushes later, as the push would: the folder's content at the repo's root, the same exclusions.
    command = err.split("push it later with: ", 1)[1].splitlines()[0]
    words = shlex.split(command)
    assert words[:5] == ["hf", "upload", "you/x", str(output), "."]
    excluded = [words[i + 1] for i, word in enumerate(words) if word == "--exclude"]
    assert excluded == ifcl.hub.PUSH_IGNORE_PATTERNS


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints"])
def test_hub_strategies_other_than_end_are_refused_before_any_model_loads(strategy, tmp_path):
    with pytest.raises(ValueError, match=f"--hub_strategy {strategy}: this script pushes once, at the end"):
        run_ifcl.main(bad_input("--push_to_hub", "--hub_strategy", strategy, tmp_path=tmp_path))
    assert not (tmp_path / "out").exists()


def test_hub_strategy_end_is_the_default_and_accepted(tmp_path):
    arguments = run_ifcl.parse_arguments(["--output_dir", str(tmp_path / "out")])
    assert strategy_name(arguments.training.hub_strategy) == "end"
    check_training_settings(arguments.training)  # no error
    arguments = run_ifcl.parse_arguments(["--hub_strategy", "end", "--output_dir", str(tmp_path / "out")])
    check_training_settings(arguments.training)


def test_a_bad_hub_strategy_exits_with_code_2(tmp_path, monkeypatch, capsys):
    code = main_exit_code(bad_input("--hub_strategy", "checkpoint", tmp_path=tmp_path), monkeypatch)
    assert code == 2
    assert "run_ifcl.py: error: --hub_strategy checkpoint" in capsys.readouterr().err


def test_help_says_what_push_to_hub_and_the_do_flags_do_here(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_ifcl.parse_arguments(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert text.startswith("usage: run_ifcl.py") and "Train a sentence encoder with IFCL" in text[:300]
    assert "every time the model is saved" not in text
    assert "Push the finished output folder to --hub_model_id once, at the end, after training" in text
    assert "a failed push loses nothing and prints the command that pushes later" in text
    assert "Only 'end' (the default here)" in text
    assert "With none of --do_train, --do_eval, --do_predict given, all three run" in text
    assert "Not directly used by Trainer" not in text
    assert "(default: sentence-transformers/all-" in text  # the embedded default, said once


# ---------------------------------------------------------------- B4. --do_train, --do_eval, --do_predict


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], (True, True, True)),
        (["--do_train"], (True, False, False)),
        (["--do_eval", "--do_predict"], (False, True, True)),
        (["--do_predict"], (False, False, True)),
        (["--do_train", "--do_eval", "--do_predict", "False"], (True, True, False)),
        (["--eval_strategy", "steps", "--do_train"], (True, False, False)),  # TrainingArguments would set do_eval
    ],
)
def test_the_do_flags_given_are_what_runs(flags, expected, tmp_path):
    training = run_ifcl.parse_arguments([*flags, "--output_dir", str(tmp_path)]).training
    assert (training.do_train, training.do_eval, training.do_predict) == expected


def test_the_do_flags_in_a_json_file(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"do_predict": True, "output_dir": str(tmp_path / "o")}))
    training = run_ifcl.parse_arguments([str(path)]).training
    assert (training.do_train, training.do_eval, training.do_predict) == (False, False, True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--do_train", "False"], "--do_train False: nothing left to do"),
        (["--do_eval", "--push_to_hub"], "--push_to_hub without --do_train"),
        (["--do_predict", "--resume_from_checkpoint", "somewhere"], "--resume_from_checkpoint without --do_train"),
    ],
)
def test_do_flags_that_cannot_work_are_refused_before_any_model_loads(args, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run_ifcl.main(bad_input(*args, tmp_path=tmp_path))
    assert not (tmp_path / "out").exists()


def test_do_train_alone_trains_with_dev_evaluations_and_nothing_else(tiny_encoder_dir, english_sts_data, tmp_path):
    output = tmp_path / "out"
    run_ifcl.main([*objective_run_args(tiny_encoder_dir, english_sts_data, output, "simcse"), "--do_train"])
    written = results(output)
    assert written["train_steps"] == 4
    assert not [key for key in written if key.startswith(("init_", "eval_", "test_"))]
    assert (output / "model.safetensors").is_file() and (output / "README.md").is_file()
    state = json.loads((output / "trainer_state.json").read_text())
    assert any("eval_stsb_spearman" in entry for entry in state["log_history"])  # the dev evaluations while training
    assert not (output / RUN_IN_PROGRESS_FILE).exists()


def test_do_train_and_do_predict_give_the_test_figures_before_and_after(tiny_encoder_dir, english_sts_data, tmp_path):
    output = tmp_path / "out"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, output, "simcse", "--do_train", "--do_predict")
    _, metrics = run_ifcl.main(args)
    assert {"init_test_stsb_spearman", "test_stsb_spearman", "train_steps"} <= set(results(output))
    assert not [key for key in metrics if key.startswith(("init_eval_", "eval_"))]


def test_without_do_train_the_model_is_evaluated_as_it_is(tiny_encoder_dir, english_sts_data, tmp_path):
    output = tmp_path / "out"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, output, "simcse", "--do_eval", "--do_predict")
    _, metrics = run_ifcl.main(args)
    written = results(output)
    assert set(written) == set(metrics)
    assert -100 <= written["eval_stsb_spearman"] <= 100 and -100 <= written["test_stsb_spearman"] <= 100
    assert not [key for key in written if key.startswith(("init_", "train_"))]
    # The same file for dev and test here: the same figure, of the untrained encoder.
    assert written["eval_stsb_spearman"] == pytest.approx(written["test_stsb_spearman"])
    assert not (output / "model.safetensors").exists() and not (output / "README.md").exists()
    assert not (output / RUN_IN_PROGRESS_FILE).exists()

    only_test = tmp_path / "test_only"
    _, metrics = run_ifcl.main(
        objective_run_args(tiny_encoder_dir, english_sts_data, only_test, "simcse", "--do_predict")
    )
    assert metrics["test_stsb_spearman"] == pytest.approx(written["test_stsb_spearman"])
    assert not [key for key in results(only_test) if key.startswith("eval_")]


# ---------------------------------------------------------------- B5. --eval_strategy no, --eval_steps alone


def test_eval_strategy_no_turns_off_keeping_the_best_checkpoint(tmp_path):
    arguments = run_ifcl.parse_arguments(["--eval_strategy", "no", "--output_dir", str(tmp_path)])
    training = arguments.training
    assert not training.load_best_model_at_end and training.metric_for_best_model is None
    assert any("--eval_strategy no" in note and "load_best_model_at_end" in note for note in arguments.notes)
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"eval_strategy": "no", "output_dir": str(tmp_path / "o")}))
    assert not run_ifcl.parse_arguments([str(path)]).training.load_best_model_at_end


def test_eval_strategy_no_runs_end_to_end(tiny_encoder_dir, english_sts_data, tmp_path):
    output = tmp_path / "out"
    args = objective_run_args(tiny_encoder_dir, english_sts_data, output, "simcse", "--eval_strategy", "no")
    _, metrics = run_ifcl.main(args)
    assert metrics["train_steps"] == 4 and "eval_stsb_spearman" in metrics and "test_stsb_spearman" in metrics
    state = json.loads((output / "trainer_state.json").read_text())
    assert not any("eval_stsb_spearman" in entry for entry in state["log_history"])  # none while training


def test_eval_steps_alone_makes_save_steps_follow(tmp_path):
    arguments = run_ifcl.parse_arguments(["--eval_steps", "7", "--output_dir", str(tmp_path)])
    assert arguments.training.eval_steps == 7 and arguments.training.save_steps == 7
    assert any("--save_steps follows --eval_steps 7" in note for note in arguments.notes)
    arguments = run_ifcl.parse_arguments(["--eval_strategy", "epoch", "--output_dir", str(tmp_path)])
    assert strategy_name(arguments.training.save_strategy) == "epoch"
    # Given together and fitting, or without keeping the best checkpoint: as given.
    training = run_ifcl.parse_arguments(["--eval_steps", "5", "--save_steps", "10", "--output_dir", str(tmp_path)])
    assert training.training.save_steps == 10 and not training.notes
    args = ["--eval_steps", "7", "--save_steps", "10", "--load_best_model_at_end", "False"]
    assert run_ifcl.parse_arguments([*args, "--output_dir", str(tmp_path)]).training.save_steps == 10


@pytest.mark.parametrize(
    "args, message",
    [
        (["--eval_steps", "7", "--save_steps", "10"], "--save_steps 10 is not a multiple of --eval_steps 7"),
        (["--save_steps", "30"], "--save_steps 30 is not a multiple of --eval_steps 50"),
        (
            ["--eval_strategy", "no", "--load_best_model_at_end", "True"],
            "--load_best_model_at_end with --eval_strategy no",
        ),
        (["--save_strategy", "epoch"], "--save_strategy epoch with --eval_strategy steps"),
    ],
)
def test_evaluation_and_saving_that_cannot_fit_name_the_flag(args, message, tmp_path, monkeypatch, capsys):
    code = main_exit_code(bad_input(*args, tmp_path=tmp_path), monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and f"run_ifcl.py: error: {message}" in err, err
    if "--eval_steps 7" in message:
        assert "Change --save_steps to 14" in err


# ---------------------------------------------------------------- B6. continuing from an IFCL model


def test_training_continues_from_an_finished_run(finished_run, pairs_data, tmp_path):
    folder_a, metrics_a = finished_run
    assert json.loads((folder_a / "config.json").read_text())["ifcl"]["objective"] == "ifcl"
    folder_b = tmp_path / "b"
    _, metrics_b = run_ifcl.main(objective_run_args(folder_a, pairs_data, folder_b, "ifcl", *IFCL_EXTRA))
    # Before training, B's model embeds exactly as A's saved model: the same STS figures.
    assert metrics_b["init_eval_stsb_spearman"] == pytest.approx(metrics_a["eval_stsb_spearman"], abs=1e-9)
    assert metrics_b["init_test_stsb_spearman"] == pytest.approx(metrics_a["test_stsb_spearman"], abs=1e-9)
    assert metrics_b["train_steps"] == 4
    config_b = json.loads((folder_b / "config.json").read_text())
    config_a = json.loads((folder_a / "config.json").read_text())
    encoder_a, encoder_b = ({k: v for k, v in config.items() if k != "ifcl"} for config in (config_a, config_b))
    assert config_b["model_type"] == "bert" and encoder_b == encoder_a
    assert (folder_b / "tokenizer.json").is_file()


def test_a_continued_model_holds_the_saved_weights_and_starts_an_empty_queue(finished_run, tmp_path):
    from safetensors.torch import load_file

    from configuration_ifcl import IFCLSettings
    from ifcl import queue as ring
    from ifcl.model import StartingModel
    from ifcl.objectives import build_objective
    from ifcl.objectives.ifcl import IFCLObjective

    folder_a, _ = finished_run
    start = StartingModel.read(str(folder_a))
    assert start.saved is not None and start.saved.queue_size == 2 and start.saved.queue_batch_size == 4
    weights = load_file(str(folder_a / "model.safetensors"))
    settings = {"queue_size": 2, "queue_batch_size": 4, "fusion_rate": 0.3, "max_seq_length": 16}
    model = start.load(str(folder_a), None, settings)
    state = model.state_dict()
    assert model.config.fusion_rate == 0.3 and model.config.max_seq_length == 16  # this command's settings
    # A published model leaves its run's queue out (checkpoints keep it): continuing starts it empty.
    assert not any(name.startswith("queue.") for name in weights) and ring.size(model.queue) == 0
    encoder = [name for name in weights if name.startswith("bert.")]
    assert encoder and all(torch.equal(state[name], weights[name]) for name in weights)
    build_objective(model).prepare(model, global_batch=4)
    assert not model.get_input_embeddings().weight.requires_grad  # frozen as the config says, for training

    # Another queue and global batch: the queue starts empty, shaped for them, when the run is prepared.
    model = start.load(str(folder_a), None, {"queue_size": 3, "queue_batch_size": 8})
    IFCLObjective(model, IFCLSettings(queue_size=3)).prepare(model, global_batch=8)
    assert model.config.queue_size == 3 and model.config.queue_batch_size == 8
    assert tuple(model.queue.embeddings.shape[:2]) == (3, 8) and ring.size(model.queue) == 0


def test_plain_encoders_are_not_taken_for_ifcl_models(tiny_encoder_dir, tmp_path):
    from ifcl.model import StartingModel

    assert StartingModel.read(str(tiny_encoder_dir)).saved is None
    with pytest.raises(OSError, match="owner/not-in-the-cache"):  # offline: the encoder's config cannot be read
        StartingModel.read("owner/not-in-the-cache")


@pytest.mark.parametrize(
    "objective, extra, message",
    [
        ("simcse", (), "trained with --objective ifcl, not --objective simcse"),
        ("ifcl", ("--fraternal_model_name_or_path", "owner/other"), "--fraternal_model_name_or_path owner/other"),
        ("ifcl", ("--max_seq_length", "4096"), "--max_seq_length: longer than the 128 tokens"),
    ],
)
def test_what_an_ifcl_model_cannot_continue_with_is_refused_before_it_loads(
    finished_run, pairs_data, tmp_path, objective, extra, message
):
    folder_a, _ = finished_run
    extra = (*IFCL_EXTRA, *extra) if objective == "ifcl" else extra
    with pytest.raises(ValueError, match=message):
        run_ifcl.main(objective_run_args(folder_a, pairs_data, tmp_path / "c", objective, *extra))
    assert not (tmp_path / "c").exists()


def fake_hub_cache(folder: Path, cache: Path, repo_id: str) -> None:
    """``folder`` as the Hub client's cache holds a downloaded snapshot of ``repo_id`` (read offline)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit, ignore=shutil.ignore_patterns("checkpoint-*"))


@pytest.mark.slow
def test_a_hub_id_of_an_ifcl_model_loads_offline_without_remote_code(finished_run, pairs_data, tmp_path):
    """The script as a user runs it, offline, the model in the Hub cache, no terminal to answer a prompt."""
    folder_a, metrics_a = finished_run
    fake_hub_cache(folder_a, tmp_path / "cache", "you/ifcl-tiny")
    output = tmp_path / "out"
    args = objective_run_args(Path("you/ifcl-tiny"), pairs_data, output, "ifcl", *IFCL_EXTRA)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "run_ifcl.py"), *args, "--do_eval", "--do_predict"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "you/ifcl-tiny is an IFCL model" in result.stdout + result.stderr
    written = results(output)
    assert written["eval_stsb_spearman"] == pytest.approx(metrics_a["eval_stsb_spearman"], abs=1e-9)
    assert written["test_stsb_spearman"] == pytest.approx(metrics_a["test_stsb_spearman"], abs=1e-9)


@pytest.mark.slow
def test_the_readme_launcher_prints_one_error_line(tmp_path):
    """README command 1's launcher, after the set-up wrote accelerate's default config: a bad setting prints one
    line, with no traceback and no block of accelerate's warnings, and exits non-zero."""
    import re

    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    blocks = re.findall(r"<<'PY'\n(.*?)\nPY\n", setup, flags=re.DOTALL)
    writer = next(block for block in blocks if "write_basic_config" in block)  # its accelerate-config step
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    subprocess.run([sys.executable, "-c", writer], env=env, check=True, capture_output=True)
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "-q",
        str(ROOT / "run_ifcl.py"),
        "--fusion_rate",
        "2",
    ]
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == ["run_ifcl.py: error: fusion_rate must lie in [0, 1] (Eq. 3 mixes ε·y + (1−ε)·y⁻), got 2.0."]
