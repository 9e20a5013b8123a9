"""prepare_fraternal.py end to end on the tiny random-weight Marian, T5 and NLLB (M2M100) models of conftest.py.

Greedy decoding of the tiny Marian model gives each sentence the same translation whatever batch it is in (the
first test checks it), so an interrupted and resumed run must write exactly the file of an uninterrupted one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ENGLISH, GERMAN, TRANSLATION_SENTENCES, SimulatedCrash, folder_state, read_pairs, tool_args

import ifcl.files
import ifcl.translation as prepare_fraternal
from ifcl.data import DataFormatError, load_train_dataset
from ifcl.failures import RunFailure
from ifcl.translation import PrepareFraternalArguments, SettingsError, Translator

SENTENCES = TRANSLATION_SENTENCES  # tool_args: chunks of 8 sentences, so 3 chunks and 6 batches
UNPATCHED_TRANSLATE_BATCH = Translator.translate_batch
UNPATCHED_COUNT_FINISHED_LINES = prepare_fraternal.count_finished_lines

# The models are tiny: one thread is fastest, and far faster than two on a busy machine (conftest.py).
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.fixture(scope="module")
def reference_output(tiny_marian_dir, sentences_file, tmp_path_factory) -> Path:
    """The output of one uninterrupted run."""
    output = tmp_path_factory.mktemp("reference") / "pairs.txt"
    summary = prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir))
    assert (summary.input_sentences, summary.empty_input_lines, summary.translated) == (24, 2, 24)
    return output


def work_folder(output: Path) -> Path:
    return Path(str(output.resolve()) + ".parts")


@pytest.fixture
def recorded_batches(monkeypatch) -> list[list[str]]:
    """Every batch of sentences sent to the model, in order (translate_batch is one generate call)."""
    batches: list[list[str]] = []

    def recording(self, sentences):
        batches.append(list(sentences))
        return UNPATCHED_TRANSLATE_BATCH(self, sentences)

    monkeypatch.setattr(Translator, "translate_batch", recording)
    return batches


def crash_on_batch(monkeypatch, batch_number: int, batches: list[list[str]]) -> None:
    """Make the ``batch_number``-th translate_batch call (1-based) raise before translating; record the others."""
    calls = []

    def crashing(self, sentences):
        calls.append(1)
        if len(calls) == batch_number:
            raise SimulatedCrash
        batches.append(list(sentences))
        return UNPATCHED_TRANSLATE_BATCH(self, sentences)

    monkeypatch.setattr(Translator, "translate_batch", crashing)


def crash(*args) -> None:
    raise SimulatedCrash


def interrupted_run(monkeypatch, arguments: list[str], batch_number: int = 4) -> None:
    """A run stopped by a crash at its ``batch_number``-th batch (the 4th: chunk 1 finished, chunk 2 in flight)."""
    with monkeypatch.context() as patch:
        crash_on_batch(patch, batch_number, [])
        with pytest.raises(SimulatedCrash):
            prepare_fraternal.run(arguments)


def test_output_is_a_training_file_in_input_order(reference_output, tiny_marian_dir):
    pairs = read_pairs(reference_output)
    assert [sentence for sentence, _ in pairs] == SENTENCES
    assert all(line.count("\t") == 1 for line in reference_output.read_text(encoding="utf-8").splitlines())
    translations = [translation for _, translation in pairs]
    assert all(translation.strip() for translation in translations)
    assert len(set(translations)) == len(SENTENCES), "each sentence has its own translation: order errors show"
    # Each line holds the translation of its own sentence, although batches were sorted by length.
    arguments = PrepareFraternalArguments(
        "unused", "unused.txt", str(tiny_marian_dir), max_length=12, num_beams=1, device="cpu"
    )
    translator = Translator.from_arguments(arguments)
    alone = [prepare_fraternal.clean_field(translator.translate_batch([s])[0]) for s in SENTENCES]
    assert translations == alone
    dataset = load_train_dataset(reference_output)
    assert dataset["sentence"] == SENTENCES and dataset["fraternal"] == translations
    assert sorted(path.name for path in reference_output.parent.iterdir()) == ["pairs.txt"], "no work folder or lock"


def test_batches_are_sorted_by_length_within_chunks(tiny_marian_dir, sentences_file, tmp_path, recorded_batches):
    prepare_fraternal.run(tool_args(sentences_file, tmp_path / "pairs.txt", tiny_marian_dir))
    assert len(recorded_batches) == 6
    for chunk_number in range(3):
        chunk = SENTENCES[8 * chunk_number : 8 * chunk_number + 8]
        first, second = recorded_batches[2 * chunk_number : 2 * chunk_number + 2]
        assert sorted(first + second) == sorted(chunk)
        assert min(map(len, first)) >= max(map(len, second))


def test_interrupted_run_resumes_with_its_finished_chunks(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch
):
    output = tmp_path / "pairs.txt"
    arguments = tool_args(sentences_file, output, tiny_marian_dir)
    interrupted_run(monkeypatch, arguments)  # batches 1-3 done: chunk 1 and half of chunk 2
    parts = work_folder(output)
    assert not output.exists(), "the output is only ever written whole"
    assert sorted(path.name for path in parts.iterdir()) == ["0000000000-0000000008.txt", "manifest.json"]
    assert read_pairs(parts / "0000000000-0000000008.txt") == read_pairs(reference_output)[:8]
    (parts / "0000000008-0000000016.txt.tmp-99999").write_text("cut short by kill -9\tab", encoding="utf-8")

    translated: list[list[str]] = []
    crash_on_batch(monkeypatch, 0, translated)  # no crash this time
    summary = prepare_fraternal.run(arguments)
    sentences_sent = Counter(sentence for batch in translated for sentence in batch)
    assert sorted(sentences_sent) == sorted(SENTENCES[8:]) and max(sentences_sent.values()) == 1
    assert (summary.already_translated, summary.translated, summary.output_lines) == (8, 16, 24)
    assert output.read_bytes() == reference_output.read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"], "the work folder is removed"


def test_max_sentences_then_continue(tiny_marian_dir, sentences_file, reference_output, tmp_path, recorded_batches):
    output = tmp_path / "pairs.txt"
    summary = prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir, "--max_sentences", "10"))
    assert summary.output_lines == 10 and read_pairs(output) == read_pairs(reference_output)[:10]
    summary = prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir))
    assert (summary.already_translated, summary.translated, summary.output_lines) == (10, 14, 24)
    assert sum(len(batch) for batch in recorded_batches) == 24
    assert output.read_bytes() == reference_output.read_bytes()
    # A finished output: nothing to translate, the model is not even loaded, nothing is written.
    mtime = output.stat().st_mtime_ns
    summary = prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir))
    assert summary.translated == 0 and summary.output_lines == 24 and len(recorded_batches) == 7
    assert output.read_bytes() == reference_output.read_bytes() and output.stat().st_mtime_ns == mtime
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"]


def test_an_output_that_is_a_link_is_continued_through_it(tiny_marian_dir, sentences_file, reference_output, tmp_path):
    real = tmp_path / "data" / "pairs.txt"
    real.parent.mkdir()
    link = tmp_path / "pairs.txt"
    link.symlink_to(real)
    prepare_fraternal.run(tool_args(sentences_file, link, tiny_marian_dir, "--max_sentences", "10"))
    summary = prepare_fraternal.run(tool_args(sentences_file, link, tiny_marian_dir))
    assert (summary.already_translated, summary.translated) == (10, 14)
    assert link.is_symlink() and real.read_bytes() == reference_output.read_bytes()
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["data", "pairs.txt", "pairs.txt"]


def test_output_of_another_input_is_refused(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    reference_lines = reference_output.read_text(encoding="utf-8").splitlines(keepends=True)
    started = "".join(reference_lines[:3]) + reference_lines[3][:10]  # a last line cut short
    output.write_text(started, encoding="utf-8")
    other_input = tmp_path / "other.txt"
    other_input.write_text("\n".join(["", *SENTENCES[:2], "Another third sentence.", *SENTENCES[3:]]) + "\n")
    monkeypatch.setattr(Translator, "from_arguments", lambda *a: pytest.fail("model loaded before the check"))
    with pytest.raises(DataFormatError) as error:
        prepare_fraternal.run(tool_args(other_input, output, tiny_marian_dir))
    message = str(error.value)
    assert f"{output}: line 3:" in message and f"{other_input} (line 4:" in message
    assert "Another third sentence." in message and SENTENCES[2] in message
    assert output.read_text(encoding="utf-8") == started, "the output is left as it was"
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(other_input, output, tiny_marian_dir))
    assert exit_info.value.code == 2
    assert re.search("prepare_fraternal.py: error: .*line 3", capsys.readouterr().err)
    # A shorter input than the output: refused too.
    short_input = tmp_path / "short.txt"
    short_input.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="line 2: the output has more lines than"):
        prepare_fraternal.run(tool_args(short_input, output, tiny_marian_dir))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["other.txt", "pairs.txt", "short.txt"]
    # --overwrite_output_file starts over.
    monkeypatch.undo()
    prepare_fraternal.run(
        tool_args(other_input, output, tiny_marian_dir, "--overwrite_output_file", "--max_sentences", "3")
    )
    assert [sentence for sentence, _ in read_pairs(output)] == [*SENTENCES[:2], "Another third sentence."]


def started_output(reference_output: Path, path: Path) -> bytes:
    """Write an output that holds 10 finished lines and the start of an 11th; return its bytes."""
    reference_lines = reference_output.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(reference_lines[:10]) + reference_lines[10][:12])
    return path.read_bytes()


def lock_path_of(output: Path) -> Path:
    return Path(str(output.resolve()) + ".lock")


def test_bad_model_path_leaves_every_file_as_it_was(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    started_output(reference_output, output)
    interrupted_run(monkeypatch, tool_args(sentences_file, output, tiny_marian_dir), batch_number=3)
    before = folder_state(tmp_path)
    capsys.readouterr()
    assert sorted(before) == [
        "pairs.txt",
        "pairs.txt.parts/0000000010-0000000016.txt",
        "pairs.txt.parts/manifest.json",
    ]
    for bad_model in (str(tmp_path / "opus-mt-en-dee"), "Helsinki-NLP/opus-mt-en-dee"):
        for extra in ([], ["--overwrite_output_file"]):
            with pytest.raises(SystemExit) as exit_info:
                prepare_fraternal.main(tool_args(sentences_file, output, Path(bad_model), *extra))
            assert exit_info.value.code == 2
            message = capsys.readouterr().err  # the model's error, or the work folder's other model_name_or_path
            assert message.startswith("prepare_fraternal.py: error: ") and bad_model in message
            assert folder_state(tmp_path) == before, "not even the unfinished last line is cut"
    # With the right model, the run continues as if nothing had happened; the unfinished line is left out.
    summary = prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir))
    assert (summary.already_translated, summary.translated) == (16, 8)
    assert output.read_bytes() == reference_output.read_bytes()


def test_overwrite_replaces_the_output_only_when_the_run_finished(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    output.write_text("Old sentence.\tAlter Satz.\nCut off\tAb", encoding="utf-8")
    old = output.read_bytes()
    overwrite = tool_args(sentences_file, output, tiny_marian_dir, "--overwrite_output_file")
    interrupted_run(monkeypatch, overwrite)
    assert output.read_bytes() == old
    assert sorted(path.name for path in work_folder(output).iterdir()) == [
        "0000000000-0000000008.txt",
        "manifest.json",
    ]

    def interrupted(self, sentences):
        raise KeyboardInterrupt

    monkeypatch.setattr(Translator, "translate_batch", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(overwrite)
    assert exit_info.value.code == 130
    message = capsys.readouterr().err
    assert f"{output} is unchanged; run the same command again" in message and "Traceback" not in message
    assert output.read_bytes() == old

    translated: list[list[str]] = []
    crash_on_batch(monkeypatch, 0, translated)
    summary = prepare_fraternal.run(overwrite)
    assert (summary.already_translated, summary.translated, summary.output_lines) == (8, 16, 24), "continued"
    assert sorted(sentence for batch in translated for sentence in batch) == sorted(SENTENCES[8:])
    assert output.read_bytes() == reference_output.read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"], "no work folder, temporary or lock left"


def test_work_folder_of_other_settings_or_not_ours(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    interrupted_run(monkeypatch, tool_args(sentences_file, output, tiny_marian_dir))
    parts = work_folder(output)
    before = folder_state(parts)
    other_input = tmp_path / "other.txt"
    other_input.write_text("\n".join(reversed(SENTENCES)) + "\n", encoding="utf-8")
    monkeypatch.setattr(Translator, "from_arguments", lambda *a: pytest.fail("model loaded"))
    for input_path, extra, named in (
        (sentences_file, ["--max_batch_tokens", "40"], "another max_batch_tokens (None there, 40 now)"),
        (other_input, [], "another input_sha256"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(tool_args(input_path, output, tiny_marian_dir, *extra))
        assert exit_info.value.code == 2
        message = capsys.readouterr().err
        assert f"prepare_fraternal.py: error: {parts}: holds the finished chunks of an interrupted run" in message
        assert named in message and "or pass --overwrite_output_file to start over." in message
        assert folder_state(parts) == before and not output.exists()
    # --overwrite_output_file starts the folder over (it is ours), once the model has loaded.
    monkeypatch.undo()
    rerun = tool_args(sentences_file, output, tiny_marian_dir, "--max_batch_tokens", "40", "--overwrite_output_file")
    summary = prepare_fraternal.run(rerun)
    assert (summary.already_translated, summary.translated) == (0, 24)
    assert output.read_bytes() == reference_output.read_bytes()
    # A folder this project did not make is never touched.
    output.unlink()
    parts.mkdir()
    (parts / "notes.txt").write_text("someone else's", encoding="utf-8")
    with pytest.raises(SettingsError, match=re.escape(f"{parts}: exists and was not made by prepare_fraternal.py")):
        prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir, "--overwrite_output_file"))
    assert folder_state(parts) == {"notes.txt": b"someone else's"}


def test_the_manifest_records_the_types_the_run_translated_in(tiny_marian_dir, sentences_file, tmp_path, monkeypatch):
    """Resolved, never ``auto``: shards translated in another type are not joined with this run's."""
    output = tmp_path / "pairs.txt"
    interrupted_run(monkeypatch, tool_args(sentences_file, output, tiny_marian_dir))
    parts = work_folder(output)
    manifest = json.loads((parts / "manifest.json").read_text(encoding="utf-8"))
    assert (manifest["dtype"], manifest["compute_type"], manifest["max_length"]) == ("float32", None, 12)


def test_a_damaged_shard_is_named(tiny_marian_dir, sentences_file, tmp_path, monkeypatch, capsys):
    output = tmp_path / "pairs.txt"
    with monkeypatch.context() as patch:  # killed after the last shard was written, before they were joined
        patch.setattr(prepare_fraternal, "join_shards", crash)
        with pytest.raises(SimulatedCrash):
            prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir, "--max_sentences", "16"))
    shard = work_folder(output) / "0000000008-0000000016.txt"
    assert not output.exists() and shard.exists()
    shard.write_text(shard.read_text(encoding="utf-8").replace(SENTENCES[9], "Edited."), encoding="utf-8")
    monkeypatch.setattr(Translator, "from_arguments", lambda *a: pytest.fail("every chunk is done: no model needed"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(sentences_file, output, tiny_marian_dir, "--max_sentences", "16"))
    assert exit_info.value.code == 1
    error = capsys.readouterr().err.splitlines()
    assert error[0] == (
        f"prepare_fraternal.py: error: {shard}: does not hold the translations of sentences 9 to 16 of "
        f"{sentences_file}; delete it and run the same command again."
    )
    assert not output.exists()


def test_second_run_on_the_same_output_is_refused(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    before = started_output(reference_output, output)
    refused = f"--output_file {output}: another prepare_fraternal.py run is writing it"
    # Another run holds the lock: refused before the output is read or the model loaded.
    with open(lock_path_of(output), "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with monkeypatch.context() as patch:
            patch.setattr(Translator, "from_arguments", lambda *a: pytest.fail("model loaded"))
            patch.setattr(prepare_fraternal, "count_finished_lines", lambda *a: pytest.fail("output read"))
            for extra in ([], ["--overwrite_output_file"]):
                with pytest.raises(SystemExit) as exit_info:
                    prepare_fraternal.main(tool_args(sentences_file, output, tiny_marian_dir, *extra))
                assert exit_info.value.code == 2
                assert f"prepare_fraternal.py: error: {refused}" in capsys.readouterr().err
                assert output.read_bytes() == before
    assert lock_path_of(output).exists(), "the holder's lock file stays: it is the holder's"

    # Two runs at once: the second starts while the first translates (the lock file the holder above left, locked
    # by no one now, is taken over).
    second_run_errors = []

    def start_a_second_run(self, sentences):
        if not second_run_errors:
            with pytest.raises(SettingsError, match=re.escape(refused)) as error:
                prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir))
            second_run_errors.append(error.value)
        return UNPATCHED_TRANSLATE_BATCH(self, sentences)

    monkeypatch.setattr(Translator, "translate_batch", start_a_second_run)
    summary = prepare_fraternal.run(tool_args(sentences_file, output, tiny_marian_dir))
    assert len(second_run_errors) == 1 and summary.translated == 14
    assert output.read_bytes() == reference_output.read_bytes(), "every pair once"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"], "the lock file is removed at the end"


@pytest.mark.parametrize("holder_ends", ["removed", "replaced"])
def test_lock_file_removed_by_its_holder_is_not_trusted(
    reference_output, sentences_file, tmp_path, monkeypatch, holder_ends
):
    """A run that opens the lock file just before its holder removes it must lock the file now at that path."""
    output = tmp_path / "pairs.txt"
    output.write_bytes(reference_output.read_bytes())  # finished: no model needed
    lock_path = lock_path_of(output)
    flock_calls = []

    def flock_after_the_holder_left(descriptor, operation):
        flock_calls.append(os.fstat(descriptor).st_ino)
        if len(flock_calls) == 1:  # the holder removes its lock file between our open and our flock
            os.remove(lock_path)
            if holder_ends == "replaced":  # ... and a third run has already created the next one
                lock_path.write_bytes(b"")
        fcntl.flock(descriptor, operation)

    def check_the_lock(*args):
        with open(lock_path, "rb") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return UNPATCHED_COUNT_FINISHED_LINES(*args)

    monkeypatch.setattr(
        ifcl.files,
        "fcntl",
        SimpleNamespace(flock=flock_after_the_holder_left, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB),
    )
    monkeypatch.setattr(prepare_fraternal, "count_finished_lines", check_the_lock)
    summary = prepare_fraternal.run(tool_args(sentences_file, output, Path("not/loaded")))
    assert summary.translated == 0 and len(flock_calls) == 2, "the first lock was let go, the second kept"
    if holder_ends == "replaced":
        assert flock_calls[0] != flock_calls[1]
    assert output.read_bytes() == reference_output.read_bytes() and not lock_path.exists()


def test_bad_input_files(tiny_marian_dir, tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(missing, tmp_path / "out.txt", tiny_marian_dir))
    assert exit_info.value.code == 2
    assert f"prepare_fraternal.py: error: input file not found: {missing}" in capsys.readouterr().err
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{blank}: no sentences")):
        prepare_fraternal.run(tool_args(blank, tmp_path / "out.txt", tiny_marian_dir))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"First line.\nZweite Zeile f\xfcr dich.\n")
    with pytest.raises(DataFormatError, match=re.escape(f"{latin1}: line 2: not valid UTF-8")):
        prepare_fraternal.run(tool_args(latin1, tmp_path / "out.txt", tiny_marian_dir))
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(blank, tmp_path / "out.tsv", tiny_marian_dir))
    assert exit_info.value.code == 2 and "must end in .txt" in capsys.readouterr().err
    not_ours = tmp_path / "not_ours.txt"
    not_ours.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    source = tmp_path / "source.txt"
    source.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{not_ours}: line 1: expected 'sentence<TAB>translation'")):
        prepare_fraternal.run(tool_args(source, not_ours, tiny_marian_dir))
    with pytest.raises(SettingsError, match="--batch_size must be"):
        prepare_fraternal.run(tool_args(source, tmp_path / "out.txt", tiny_marian_dir, "--batch_size", "0"))
    assert not (tmp_path / "out.txt").exists()


def test_tabs_line_breaks_and_empty_translations(tiny_marian_dir, tmp_path, monkeypatch, caplog):
    source = tmp_path / "source.txt"
    source.write_bytes(b"A sentence\twith a tab.\nSecond sentence.\n\nThird\x0bone.\nFourth.\n")
    answers = {
        "A sentence with a tab.": "Ein Satz\tmit\nTab.",
        "Second sentence.": " \n ",
        "Third one.": "Dritter\u2028Satz.\r",
        "Fourth.": "Vierter.",
    }
    sent = []
    monkeypatch.setattr(
        Translator, "translate_batch", lambda self, batch: sent.extend(batch) or [answers[s] for s in batch]
    )
    expected = ["A sentence with a tab.\tEin Satz mit Tab.", "Third one.\tDritter Satz.", "Fourth.\tVierter.", ""]
    output = tmp_path / "pairs.txt"
    with caplog.at_level(logging.WARNING, logger="ifcl.translation"):
        summary = prepare_fraternal.run(tool_args(source, output, tiny_marian_dir))
    assert (summary.empty_translations, summary.output_lines) == (1, 3)
    assert f"1 translation(s) came out empty and are left out of {output}: lines 2 of {source}" in caplog.text
    assert output.read_text(encoding="utf-8").split("\n") == expected, "never 'sentence<TAB>sentence'"
    assert len(load_train_dataset(output)) == 3
    summary = prepare_fraternal.run(tool_args(source, output, tiny_marian_dir))
    assert (summary.already_translated, summary.translated) == (4, 0)
    # Continuing an output past a sentence left out: it is not translated again.
    output.unlink()
    sent.clear()
    assert prepare_fraternal.run(tool_args(source, output, tiny_marian_dir, "--max_sentences", "3")).output_lines == 2
    summary = prepare_fraternal.run(tool_args(source, output, tiny_marian_dir))
    assert (summary.already_translated, summary.translated) == (3, 1) and sent.count("Second sentence.") == 1
    assert output.read_text(encoding="utf-8").split("\n") == expected


def test_lines_of_control_characters_only_are_skipped(
    tiny_marian_dir, reference_output, tmp_path, monkeypatch, recorded_batches, caplog
):
    """A line with nothing printable once control and format characters go (a lone NUL; escapes, DEL and a
    zero-width space) is no sentence: never sent to the model nor written as a pair, counted apart from empty lines,
    and skipped alike when a run is resumed from its shards or continued from its output."""
    source = tmp_path / "source.txt"
    control_only = "\x01\x1b\x7f \u200b\x00\x1f"
    lines = [*SENTENCES[:3], "\x00", *SENTENCES[3:7], control_only, "", *SENTENCES[7:10]]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = read_pairs(reference_output)[:10]
    output = tmp_path / "pairs.txt"
    arguments = tool_args(source, output, tiny_marian_dir)
    interrupted_run(monkeypatch, arguments, batch_number=3)  # chunk 1 (lines 1 to 10) finished, chunk 2 not
    with caplog.at_level(logging.WARNING, logger="ifcl.translation"):
        summary = prepare_fraternal.run(arguments)
    assert (summary.input_sentences, summary.empty_input_lines, summary.control_input_lines) == (10, 1, 2)
    assert (summary.already_translated, summary.translated, summary.output_lines) == (8, 2, 10)
    assert f"{source}: skipped 2 line(s) holding only control characters" in caplog.text
    assert f"{source}: skipped 1 empty line(s)" in caplog.text
    assert read_pairs(output) == expected
    assert recorded_batches and all(prepare_fraternal.is_sentence(s) for batch in recorded_batches for s in batch)
    summary = prepare_fraternal.run(arguments)
    assert (summary.control_input_lines, summary.already_translated, summary.translated) == (2, 10, 0)
    # Continuing an output that ends just before the NUL line: the next sentence is the one after it.
    output.unlink()
    assert prepare_fraternal.run([*arguments, "--max_sentences", "3"]).output_lines == 3
    summary = prepare_fraternal.run(arguments)
    assert (summary.already_translated, summary.translated) == (3, 7)
    assert read_pairs(output) == expected
    nothing_printable = tmp_path / "controls.txt"
    nothing_printable.write_text(f"\x00\n{control_only}\n\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{nothing_printable}: no sentences")):
        prepare_fraternal.run(tool_args(nothing_printable, tmp_path / "none.txt", tiny_marian_dir))


def test_a_mostly_empty_batch_stops_the_run(tiny_marian_dir, sentences_file, tmp_path, monkeypatch, capsys):
    def mostly_empty(self, batch):
        return ["" if position else "Etwas." for position in range(len(batch))]

    monkeypatch.setattr(Translator, "translate_batch", mostly_empty)
    output = tmp_path / "pairs.txt"
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(sentences_file, output, tiny_marian_dir))
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    lines = [line for line in error.splitlines() if line.startswith("prepare_fraternal.py")]
    assert len(lines) == 2 and lines[1] == "prepare_fraternal.py: the run failed; IFCL_DEBUG=1 shows the traceback."
    assert lines[0].startswith("prepare_fraternal.py: error: the model output is empty: 3 of the 4 translations of a ")
    assert f"Check --model_name_or_path {tiny_marian_dir}, --source_lang" in error and "Traceback" not in error
    assert not output.exists()
    # Half of a batch empty is not most of it: those sentences are left out, the run goes on.
    half_empty = SimpleNamespace(translate_batches=lambda batches: ([[""] * (len(b) - 1) + ["Ein."] for b in batches]))
    arguments = PrepareFraternalArguments("in.txt", "out.txt", "model", batch_size=4)
    sentences = [prepare_fraternal.InputSentence(number, text) for number, text in ((1, "A."), (2, "Bb."), (3, "C."))]
    assert prepare_fraternal.translate_chunk(sentences[:2], half_empty, arguments) == ["Ein.", ""]
    with pytest.raises(
        RunFailure, match=re.escape("2 of the 3 translations of a batch came out empty (lines 2, 1 of")
    ):
        prepare_fraternal.translate_chunk(sentences, half_empty, arguments)


def test_t5_gets_its_task_prefix(tiny_t5_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    model_dir = tiny_t5_dir
    source = tmp_path / "source.txt"
    source.write_text("\n".join(ENGLISH[:3]) + "\n", encoding="utf-8")
    generate_inputs = []
    original_generate = T5ForConditionalGeneration.generate

    def recording_generate(self, **kwargs):
        generate_inputs.append(kwargs["input_ids"])
        return original_generate(self, **kwargs)

    monkeypatch.setattr(T5ForConditionalGeneration, "generate", recording_generate)
    output = tmp_path / "pairs.txt"
    languages = ["--source_lang", "English", "--target_lang", "German"]
    prepare_fraternal.run(tool_args(source, output, model_dir, *languages, "--max_length", "40"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    (input_ids,) = generate_inputs
    sent = sorted(ENGLISH[:3], key=len, reverse=True)
    for row, sentence in zip(input_ids.tolist(), sent):
        expected = tokenizer("translate English to German: " + sentence)["input_ids"]
        assert row[: len(expected)] == expected
    assert [sentence for sentence, _ in read_pairs(output)] == ENGLISH[:3]

    def prefix(config, **languages):
        args = PrepareFraternalArguments("in.txt", "out.txt", "model", **languages)
        return prepare_fraternal.resolve_prefix(config, tokenizer, args)

    t5_small = SimpleNamespace(
        model_type="t5", task_specific_params={"translation_en_to_fr": {"prefix": "translate English to French: "}}
    )
    assert prefix(t5_small, source_lang="en", target_lang="fr") == "translate English to French: "
    assert prefix(t5_small, source_lang="English", target_lang="Romanian") == "translate English to Romanian: "
    assert prefix(t5_small, source_lang="English", target_lang="German", prefix="") == ""
    assert prefix(t5_small) == ""
    assert prefix(SimpleNamespace(model_type="bart"), source_lang="English", target_lang="German") == ""


def test_marian_multilingual_target_token(tiny_marian_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_marian_dir)
    tokenizer.add_tokens([">>deu<<", ">>fra<<"], special_tokens=True)
    marian = SimpleNamespace(model_type="marian")
    args = PrepareFraternalArguments("in.txt", "out.txt", "model", target_lang="fra")
    assert prepare_fraternal.resolve_prefix(marian, tokenizer, args) == ">>fra<< "
    args = PrepareFraternalArguments("in.txt", "out.txt", "model", target_lang="ita")
    assert prepare_fraternal.resolve_prefix(marian, tokenizer, args) == ""


def test_nllb_source_language_and_forced_target_token(tiny_nllb_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer, M2M100ForConditionalGeneration

    model_dir = tiny_nllb_dir
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    german, french = tokenizer.convert_tokens_to_ids(["deu_Latn", "fra_Latn"])
    source = tmp_path / "source.txt"
    source.write_text("\n".join(GERMAN[:5]) + "\n", encoding="utf-8")
    generated = []
    original_generate = M2M100ForConditionalGeneration.generate

    def recording_generate(self, **kwargs):
        output_ids = original_generate(self, **kwargs)
        generated.append((kwargs["input_ids"], output_ids))
        return output_ids

    monkeypatch.setattr(M2M100ForConditionalGeneration, "generate", recording_generate)
    output = tmp_path / "pairs.txt"
    languages = ["--source_lang", "deu_Latn", "--target_lang", "fra_Latn"]
    prepare_fraternal.run(tool_args(source, output, model_dir, *languages))
    assert len(generated) == 2
    for input_ids, output_ids in generated:
        assert (input_ids[:, 0] == german).all(), "the source language code starts every input"
        assert (output_ids[:, 1] == french).all(), "the target language code is the first generated token"
    assert [sentence for sentence, _ in read_pairs(output)] == GERMAN[:5]
    assert len(load_train_dataset(output)) == 5

    other_output = tmp_path / "other.txt"
    with pytest.raises(SettingsError, match="pass --source_lang and --target_lang"):
        prepare_fraternal.run(tool_args(source, other_output, model_dir))
    with pytest.raises(SettingsError, match="--target_lang xx_Yyyy: not a language code"):
        prepare_fraternal.run(tool_args(source, other_output, model_dir, *languages[:2], "--target_lang", "xx_Yyyy"))
    assert not other_output.exists(), "settings are checked before the output is created"


def test_m2m100_language_ids_and_dtype():
    class M2M100Like:
        """Stands for M2M100Tokenizer (sentencepiece): language "de" is the token "__de__"."""

        src_lang = "en"

        def get_lang_id(self, code: str) -> int:
            return {"en": 7, "de": 8}[code]

    tokenizer = M2M100Like()
    args = PrepareFraternalArguments("in.txt", "out.txt", "model", source_lang="de", target_lang="en")
    assert prepare_fraternal.set_up_languages(tokenizer, args) == 7 and tokenizer.src_lang == "de"
    args = PrepareFraternalArguments("in.txt", "out.txt", "model", source_lang="de", target_lang="ro")
    with pytest.raises(SettingsError, match="--target_lang ro"):
        prepare_fraternal.set_up_languages(tokenizer, args)

    assert prepare_fraternal.resolve_device_and_dtype("cpu", "auto") == (torch.device("cpu"), torch.float32)
    assert prepare_fraternal.resolve_device_and_dtype("cpu", "bfloat16")[1] == torch.bfloat16


def test_bfloat16_weights(tiny_marian_dir):
    args = PrepareFraternalArguments(
        "in.txt", "out.txt", str(tiny_marian_dir), max_length=6, num_beams=1, device="cpu", dtype="bfloat16"
    )
    translator = Translator.from_arguments(args)
    assert translator.model.dtype == torch.bfloat16
    assert len(translator.translate_batch(SENTENCES[:3])) == 3


def without_max_length(arguments: list[str]) -> list[str]:
    """``arguments`` without ``--max_length`` and its value: the run takes the default."""
    at = arguments.index("--max_length")
    return arguments[:at] + arguments[at + 2 :]


def test_max_length_beyond_the_model_positions_is_refused(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys
):
    """The tiny Marian model has 64 positions (max_position_embeddings=64) on both sides: 64 tokens in and out
    work, one more on either side is an IndexError; --max_length 65 is refused before anything loads."""
    from transformers import MarianMTModel

    generated = []
    original_generate = MarianMTModel.generate

    def recording_generate(self, **kwargs):
        output_ids = original_generate(self, **kwargs)
        generated.append((kwargs["input_ids"].shape[1], output_ids.shape[1]))
        return output_ids

    monkeypatch.setattr(MarianMTModel, "generate", recording_generate)
    translator = Translator.from_arguments(
        PrepareFraternalArguments("in.txt", "out.txt", str(tiny_marian_dir), max_length=64, num_beams=1, device="cpu")
    )
    long_sentence = " ".join(SENTENCES)  # 181 tokens: truncated to --max_length
    assert len(translator.translate_batch([long_sentence, SENTENCES[0]])) == 2
    assert generated == [(64, 1 + 64)], "64 tokens read, 64 written (after the decoder's start token)"
    one_more = Translator(translator.model, translator.tokenizer, max_length=65, num_beams=1)
    with pytest.raises(IndexError):
        one_more.translate_batch([long_sentence])
    with pytest.raises(IndexError):
        one_more.generation_kwargs["min_new_tokens"] = 65  # a short input whose translation does not end sooner:
        one_more.translate_batch([SENTENCES[0]])  # the 65th generated token is too many
    monkeypatch.undo()

    output = tmp_path / "pairs.txt"
    before = started_output(reference_output, output)
    monkeypatch.setattr(Translator, "from_arguments", lambda *a: pytest.fail("model loaded"))
    monkeypatch.setattr(prepare_fraternal, "lock_output", lambda *a: pytest.fail("output locked"))
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(sentences_file, output, tiny_marian_dir, "--max_length", "65"))
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert f"prepare_fraternal.py: error: --max_length 65: more than the 64 positions of {tiny_marian_dir}" in message
    assert "pass --max_length 64 or less, or leave it out (64)." in message and "Traceback" not in message
    assert output.read_bytes() == before and sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"]


def test_default_max_length_is_lowered_to_the_model_positions(
    tiny_marian_dir, sentences_file, tmp_path, monkeypatch, caplog
):
    lengths = []

    def recording(self, sentences):
        lengths.append((self.max_length, self.generation_kwargs["max_new_tokens"]))
        return UNPATCHED_TRANSLATE_BATCH(self, sentences)

    monkeypatch.setattr(Translator, "translate_batch", recording)
    output = tmp_path / "pairs.txt"
    arguments = without_max_length(tool_args(sentences_file, output, tiny_marian_dir, "--max_sentences", "4"))
    with caplog.at_level(logging.INFO, logger="prepare_fraternal"):
        summary = prepare_fraternal.run(arguments)
    assert summary.translated == 4 and lengths == [(64, 64)]
    assert f"--max_length 64: {tiny_marian_dir} has 64 positions, fewer than the default 128" in caplog.text


def test_max_length_against_the_positions_of_each_model_family():
    from transformers import (
        BertConfig,
        EncoderDecoderConfig,
        GPT2Config,
        LEDConfig,
        M2M100Config,
        MarianConfig,
        MBartConfig,
        T5Config,
    )

    limit = prepare_fraternal.position_limit
    assert limit(MarianConfig(max_position_embeddings=512)) == 512  # opus-mt
    assert limit(M2M100Config(max_position_embeddings=1024)) == 1024  # M2M100, NLLB
    assert limit(MBartConfig(max_position_embeddings=1024)) == 1024
    assert limit(LEDConfig(max_encoder_position_embeddings=16384, max_decoder_position_embeddings=1024)) == 1024
    bert_to_gpt2 = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(max_position_embeddings=512), GPT2Config(n_positions=256)
    )
    assert limit(bert_to_gpt2) == 256, "the decoder writes the translation: its positions count too"
    t5 = T5Config(n_positions=512)  # as t5-base's config.json says; relative positions have no limit
    assert limit(t5) is None

    def resolve(max_length, config):
        return prepare_fraternal.resolve_max_length(max_length, config, "model")

    assert (resolve(None, t5), resolve(2000, t5)) == (128, 2000)
    marian = MarianConfig(max_position_embeddings=512)
    assert (resolve(None, marian), resolve(512, marian)) == (128, 512)
    with pytest.raises(SettingsError, match=re.escape("--max_length 513: more than the 512 positions of model")):
        resolve(513, marian)
    with pytest.raises(SettingsError, match=re.escape("or leave it out (128).")):
        resolve(513, marian)
    assert resolve(None, MarianConfig(max_position_embeddings=100)) == 100


@pytest.fixture
def no_gpu(monkeypatch):
    """A CPU-only torch, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)


def test_unavailable_device_is_refused_before_anything_loads(
    tiny_marian_dir, sentences_file, reference_output, tmp_path, monkeypatch, capsys, no_gpu
):
    select = prepare_fraternal.select_device
    assert select(None) == torch.device("cpu") and select("cpu") == torch.device("cpu")
    with pytest.raises(SettingsError) as error:
        select("cuda")
    assert str(error.value) == (
        "--device cuda: not on this machine (this torch is built without CUDA); it has cpu. Pass one of them, or "
        "leave --device out for a GPU when there is one."
    )
    for unavailable in ("mps", "meta", "xpu"):
        with pytest.raises(SettingsError, match=f"^--device {unavailable}: not on this machine; it has cpu\\."):
            select(unavailable)
    with pytest.raises(
        SettingsError,
        match=re.escape(
            "--device gpu: not a device name torch understands (cpu, cuda, cuda:1, mps...); this machine has cpu."
        ),
    ):
        select("gpu")

    output = tmp_path / "pairs.txt"
    before = started_output(reference_output, output)
    monkeypatch.setattr(Translator, "from_arguments", lambda *a: pytest.fail("model loaded"))
    monkeypatch.setattr(prepare_fraternal, "lock_output", lambda *a: pytest.fail("output locked"))
    for device in ("cuda", "cuda:1", "gpu"):
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(tool_args(sentences_file, output, tiny_marian_dir, "--device", device))
        assert exit_info.value.code == 2
        message = capsys.readouterr().err
        assert message.startswith(f"prepare_fraternal.py: error: --device {device}: ") and "Traceback" not in message
    assert output.read_bytes() == before and sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"]


def test_gpu_index_beyond_the_gpus_present_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    select = prepare_fraternal.select_device
    assert select(None) == torch.device("cuda") and select("cuda") == torch.device("cuda")
    assert select("cuda:1") == torch.device("cuda:1")
    with pytest.raises(
        SettingsError, match=re.escape("--device cuda:2: not on this machine; it has cpu, cuda:0, cuda:1.")
    ):
        select("cuda:2")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select(None) == torch.device("mps") and select("mps") == torch.device("mps")
    assert select("mps:0") == torch.device("mps:0")
    with pytest.raises(SettingsError, match=re.escape("--device mps:1: not on this machine; it has cpu, mps.")):
        select("mps:1")


def test_a_control_character_inside_a_sentence_is_dropped_from_the_pair_written(tiny_marian_dir, tmp_path):
    """A NUL (or an escape, or DEL) inside a sentence would go into the ``sentence<TAB>translation`` file, where a
    reader of text stops or fails: it is dropped from the sentence as read, the same in every pass."""
    source = tmp_path / "source.txt"
    source.write_text("A man\x00 plays the guitar.\nThe cat \x1bsits.\n" + "\n".join(SENTENCES[:2]) + "\n", "utf-8")
    output = tmp_path / "pairs.txt"
    prepare_fraternal.run(tool_args(source, output, tiny_marian_dir))
    sentences = [sentence for sentence, _ in read_pairs(output)]
    assert sentences[:2] == ["A man plays the guitar.", "The cat sits."]
    assert not any(ord(c) < 32 for line in output.read_text(encoding="utf-8").splitlines() for c in line if c != "\t")
