"""prepare_fraternal.py --engine ctranslate2 against --engine transformers, on the tiny random-weight Marian, T5,
NLLB (M2M100) and mBART-50 models of conftest.py; the conversion folder's guarantees (reused, only ours, checked and
repaired when damaged); several processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TRANSLATION_SENTENCES, SimulatedCrash, folder_state, free_port, read_pairs, tool_args

import ifcl.translation as prepare_fraternal
from ifcl import ctranslate2_engine
from ifcl.translation import SettingsError

pytest.importorskip("ctranslate2")

SENTENCES = TRANSLATION_SENTENCES
LANGUAGES = {
    "marian": [],
    "t5": ["--source_lang", "English", "--target_lang", "German"],
    "nllb": ["--source_lang", "eng_Latn", "--target_lang", "deu_Latn"],
    "mbart50": ["--source_lang", "en_XX", "--target_lang", "de_DE"],
}

# The models are tiny: one thread is fastest, and far faster than two on a busy machine (conftest.py).
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.fixture(scope="module")
def converted(tiny_marian_dir, sentences_file, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny Marian model converted by a CTranslate2 run, and that run's output."""
    folder = tmp_path_factory.mktemp("converted")
    output = folder / "pairs.txt"
    engine = ["--engine", "ctranslate2", "--ct2_model_dir", str(folder / "marian-ct2")]
    prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir, *engine))
    return folder / "marian-ct2", output


@pytest.mark.parametrize("family", LANGUAGES)
def test_greedy_output_equals_the_transformers_engine(family, sentences_file, tmp_path, request):
    model = request.getfixturevalue(f"tiny_{family}_dir")
    by_engine = {}
    for engine in ("transformers", "ctranslate2"):
        output = tmp_path / f"{engine}.txt"
        summary = prepare_fraternal.run(
            tool_args(sentences_file, output, model, *LANGUAGES[family], "--engine", engine)
        )
        assert summary.translated == len(SENTENCES)
        by_engine[engine] = read_pairs(output)
    assert [sentence for sentence, _ in by_engine["ctranslate2"]] == SENTENCES, "input order"
    same = sum(a == b for a, b in zip(by_engine["transformers"], by_engine["ctranslate2"]))
    assert same >= 0.95 * len(SENTENCES), (family, same, by_engine)
    if family in ("marian", "t5"):  # the small-init NLLB and mBART models say the same thing to every sentence
        translations = [translation for _, translation in by_engine["ctranslate2"]]
        assert len(set(translations)) >= len(SENTENCES) // 3, "order errors would show"
    record = json.loads((tmp_path / f"{model.name}-ct2" / ctranslate2_engine.CONVERSION_RECORD).read_text())
    assert record["model_name_or_path"] == str(model.resolve()) and record["converted_by"].startswith("ifcl")
    converted_names = {path.name for path in (tmp_path / f"{model.name}-ct2").iterdir()}
    assert set(record["files"]) == converted_names - {ctranslate2_engine.CONVERSION_RECORD}


def test_the_converted_folder_is_reused_and_only_ours(
    tiny_marian_dir, tiny_t5_dir, sentences_file, converted, tmp_path, monkeypatch, capsys
):
    ct2_dir, first = converted
    second = tmp_path / "second.txt"
    engine = ["--engine", "ctranslate2", "--ct2_model_dir", str(ct2_dir), "--compute_type", "float32"]
    with monkeypatch.context() as patch:
        patch.setattr(ctranslate2_engine, "convert_model", lambda *a: pytest.fail("converted twice"))
        prepare_fraternal.run(tool_args(sentences_file, second, tiny_marian_dir, *engine, "--max_sentences", "5"))
    assert read_pairs(second) == read_pairs(first)[:5]

    # Another model's folder, and a folder that is not ours: refused before anything is written; left as they are.
    capsys.readouterr()
    for model, folder, message in (
        (tiny_t5_dir, ct2_dir, "converted from another model or with other settings"),
        (tiny_marian_dir, tmp_path, "was not converted by prepare_fraternal.py"),
    ):
        before = sorted(path.name for path in Path(folder).iterdir())
        output = tmp_path / "refused.txt"
        arguments = tool_args(sentences_file, output, model, "--engine", "ctranslate2", "--ct2_model_dir", str(folder))
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(arguments)
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.splitlines()[-1]
        assert error.startswith(f"prepare_fraternal.py: error: --ct2_model_dir {folder}: ") and message in error
        assert sorted(path.name for path in Path(folder).iterdir()) == before and not output.exists()


def change_bytes(path: Path) -> None:
    """256 bytes of the file altered in place (the size stays)."""
    content = bytearray(path.read_bytes())
    middle = len(content) // 2
    content[middle : middle + 256] = bytes(255 - byte for byte in content[middle : middle + 256])
    path.write_bytes(bytes(content))


DAMAGES = {
    "bytes changed in model.bin": ("model.bin", change_bytes, "model.bin differs from the file converted"),
    "model.bin cut short": (
        "model.bin",
        lambda path: path.write_bytes(path.read_bytes()[:1000]),
        "model.bin has 1000",
    ),
    "vocabulary removed": ("shared_vocabulary.json", Path.unlink, "shared_vocabulary.json is missing"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_converted_folder_is_converted_again(
    damage, tiny_marian_dir, sentences_file, converted, tmp_path, caplog
):
    ct2_dir, reference = converted
    damaged = tmp_path / "marian-ct2"
    shutil.copytree(ct2_dir, damaged)
    name, spoil, found = DAMAGES[damage]
    spoil(damaged / name)
    output = tmp_path / "pairs.txt"
    with caplog.at_level("WARNING", logger="ifcl.ctranslate2_engine"):
        prepare_fraternal.run(
            tool_args(
                sentences_file, output, tiny_marian_dir, "--engine", "ctranslate2", "--ct2_model_dir", str(damaged)
            )
        )
    assert (
        f"--ct2_model_dir {damaged}: {found}" in caplog.text and "into it again (this project made it)" in caplog.text
    )
    assert output.read_bytes() == reference.read_bytes(), "the training file of the undamaged folder"
    record = ctranslate2_engine.read_conversion_record(str(damaged), str(tiny_marian_dir))
    assert ctranslate2_engine.find_damage(str(damaged), record) is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["marian-ct2", "pairs.txt"], "no temporary folder left"


def test_a_converted_folder_whose_record_cannot_be_read_is_refused(
    tiny_marian_dir, sentences_file, converted, tmp_path, capsys
):
    damaged = tmp_path / "marian-ct2"
    shutil.copytree(converted[0], damaged)
    record = damaged / ctranslate2_engine.CONVERSION_RECORD
    record.write_text(record.read_text()[:40], encoding="utf-8")
    before = folder_state(damaged)
    output = tmp_path / "pairs.txt"
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(
            tool_args(
                sentences_file, output, tiny_marian_dir, "--engine", "ctranslate2", "--ct2_model_dir", str(damaged)
            )
        )
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(
        f"prepare_fraternal.py: error: --ct2_model_dir {damaged}: its {ctranslate2_engine.CONVERSION_RECORD} cannot "
        "be read ("
    )
    assert "delete the folder to convert the model again" in error and len(error.splitlines()) == 1
    assert folder_state(damaged) == before and not output.exists()


def test_engine_settings_are_checked_before_anything_loads(
    tiny_marian_dir, sentences_file, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    monkeypatch.setattr(prepare_fraternal, "lock_output", lambda *a: pytest.fail("output locked"))
    monkeypatch.setattr(ctranslate2_engine, "prepare_model_dir", lambda *a: pytest.fail("model converted"))
    assert "bfloat16" not in ctranslate2_engine.import_ctranslate2().get_supported_compute_types("cpu")
    cases = {
        ("--compute_type", "int8"): "--compute_type: only for --engine ctranslate2",
        ("--engine", "ctranslate2", "--compute_type", "int4"): "--compute_type int4: not one of",
        ("--engine", "ctranslate2", "--compute_type", "float16"): "--compute_type float16: CTranslate2",
        # Without --compute_type, CTranslate2 computes in --dtype's type: that is the one checked.
        ("--engine", "ctranslate2", "--dtype", "bfloat16"): "--dtype bfloat16: CTranslate2",
    }
    for extra, message in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(tool_args(sentences_file, output, tiny_marian_dir, *extra))
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert re.match(f"prepare_fraternal.py: error: {re.escape(message)}", error)
        assert len(error.splitlines()) == 1, error
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_max_batch_tokens_caps_the_padded_batch(tiny_marian_dir, sentences_file, tmp_path, monkeypatch):
    reference = tmp_path / "reference.txt"
    prepare_fraternal.run(tool_args(sentences_file, reference, tiny_marian_dir))
    batches = []
    original = prepare_fraternal.Translator.translate_batch

    def recording(self, sentences):
        batches.append(prepare_fraternal.source_token_counts(self, sentences))
        return original(self, sentences)

    monkeypatch.setattr(prepare_fraternal.Translator, "translate_batch", recording)
    output = tmp_path / "pairs.txt"
    prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir, "--max_batch_tokens", "24"))
    assert all(len(counts) * max(counts) <= 24 or len(counts) == 1 for counts in batches)
    assert any(len(counts) < 4 for counts in batches) and all(len(counts) <= 4 for counts in batches)
    assert output.read_bytes() == reference.read_bytes()


def test_token_batches_are_sorted_longest_first():
    batches = prepare_fraternal.length_sorted_batches(
        ["a b c", "a", "a b", "a b c d"],
        3,
        max_batch_tokens=8,
        token_counts=[3, 1, 2, 4],
    )
    assert batches == [[3, 0], [2, 1]]


def test_unsupported_family_and_missing_package_are_clear(tmp_path, sentences_file, tiny_marian_dir, monkeypatch):
    args = prepare_fraternal.PrepareFraternalArguments(
        str(sentences_file), str(tmp_path / "out.txt"), str(tiny_marian_dir), engine="ctranslate2"
    )

    def not_installed():
        raise ctranslate2_engine.EngineSettingsError("--engine ctranslate2 needs the ctranslate2 package")

    monkeypatch.setattr(ctranslate2_engine, "import_ctranslate2", not_installed)
    with pytest.raises(SettingsError, match="needs the ctranslate2 package"):
        prepare_fraternal.check_engine(args)


def test_two_processes_continue_one_and_write_its_file(tiny_marian_dir, converted, tmp_path, monkeypatch):
    """A one-process run interrupted after two chunks, continued by accelerate launch on two CPU processes (through
    torchrun: --multi_gpu with --device cpu; accelerate's own --cpu --num_processes 2 needs mpirun), each
    translating its share of the chunks left: byte-identical to an uninterrupted one-process run."""
    source = tmp_path / "sentences.txt"
    source.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")  # 72 sentences: 9 chunks
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    engine = ["--engine", "ctranslate2", "--ct2_model_dir", str(converted[0])]
    prepare_fraternal.run(tool_args(source, one, tiny_marian_dir, *engine))
    chunks = []
    original = ctranslate2_engine.CTranslate2Translator.translate_batches

    def crash_at_the_third_chunk(self, batches):
        chunks.append(batches)
        if len(chunks) == 3:
            raise SimulatedCrash
        return original(self, batches)

    with monkeypatch.context() as patch:
        patch.setattr(ctranslate2_engine.CTranslate2Translator, "translate_batches", crash_at_the_third_chunk)
        with pytest.raises(SimulatedCrash):
            prepare_fraternal.run(tool_args(source, two, tiny_marian_dir, *engine))
    assert len(list(Path(f"{two.resolve()}.parts").glob("0*.txt"))) == 2
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--main_process_port", str(free_port())]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    arguments = [*launch, str(ROOT / "prepare_fraternal.py"), *tool_args(source, two, tiny_marian_dir, *engine)]
    done = subprocess.run(arguments, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "+16 in" in done.stdout and "56 to translate" in done.stdout
    assert two.read_bytes() == one.read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["one.txt", "sentences.txt", "two.txt"]
