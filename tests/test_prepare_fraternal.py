"""prepare_fraternal.py end to end on tiny random-weight Marian, T5 and NLLB (M2M100) models built here.

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
from conftest import ENGLISH, GERMAN

import ifcl.translation as prepare_fraternal
from ifcl.data import DataFormatError, load_train_dataset
from ifcl.translation import PrepareFraternalArguments, SettingsError, Translator

SENTENCES = ENGLISH + GERMAN  # 24 sentences of different lengths
BATCH_SIZE, BATCHES_PER_CHUNK = 4, 2  # chunks of 8 sentences: 3 chunks, 6 batches
UNPATCHED_TRANSLATE_BATCH = Translator.translate_batch
UNPATCHED_COUNT_FINISHED_LINES = prepare_fraternal.count_finished_lines


class SimulatedCrash(Exception):
    """Raised by a patched translate_batch to interrupt a run."""


def build_word_tokenizer(sentences: list[str]):
    """A word-level fast tokenizer whose vocabulary is the sorted words of ``sentences``.

    Built rather than trained: the `tokenizers` trainers break ties differently from run to run, which would make
    the random models below translate differently in every session.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.BertPreTokenizer()
    words = sorted(
        {word for s in sentences for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(s))}
    )
    special = ["[PAD]", "[UNK]", "[SEP]"]
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(special + words)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.post_processor = processors.TemplateProcessing(single="$A [SEP]", special_tokens=[("[SEP]", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", eos_token="[SEP]")


def build_tiny_marian(folder: Path) -> Path:
    """A random-weight one-layer MarianMTModel with a word-level tokenizer, saved to ``folder``."""
    from transformers import MarianConfig, MarianMTModel

    tokenizer = build_word_tokenizer(SENTENCES)
    torch.manual_seed(1)
    config = MarianConfig(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        init_std=1.0,  # larger than usual: a distinct translation for each of the 24 sentences, clear argmax margins
    )
    MarianMTModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_t5(folder: Path) -> Path:
    """A random-weight one-layer T5ForConditionalGeneration with a word-level tokenizer, saved to ``folder``."""
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = build_word_tokenizer(SENTENCES + ["translate English to German:"])
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_nllb(folder: Path) -> Path:
    """A random-weight one-layer M2M100 model with an NllbTokenizer (BPE trained here) that knows three languages."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    bpe.train_from_iterator(SENTENCES, trainer)
    model_json = json.loads(bpe.to_str())["model"]
    tokenizer = NllbTokenizer(
        vocab=model_json["vocab"],
        merges=[tuple(merge) for merge in model_json["merges"]],
        extra_special_tokens=["eng_Latn", "deu_Latn", "fra_Latn"],
    )
    torch.manual_seed(0)
    config = M2M100Config(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
    )
    M2M100ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# The models are tiny: one thread is fastest, and far faster than two on a busy machine (conftest.py).
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return build_tiny_marian(tmp_path_factory.mktemp("tiny_marian"))


@pytest.fixture(scope="module")
def input_file(tmp_path_factory) -> Path:
    """The 24 sentences, one a line, with an empty and a whitespace-only line among them."""
    path = tmp_path_factory.mktemp("input") / "sentences.txt"
    lines = SENTENCES[:5] + [""] + SENTENCES[5:17] + ["  \t "] + SENTENCES[17:]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tool_args(input_path: Path, output_path: Path, model: Path, *extra: str) -> list[str]:
    return [
        "--input_file", str(input_path),
        "--output_file", str(output_path),
        "--model_name_or_path", str(model),
        "--batch_size", str(BATCH_SIZE),
        "--batches_per_chunk", str(BATCHES_PER_CHUNK),
        "--max_length", "12",
        "--num_beams", "1",
        "--device", "cpu",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reference_output(marian_dir, input_file, tmp_path_factory) -> Path:
    """The output of one uninterrupted run."""
    output = tmp_path_factory.mktemp("reference") / "pairs.txt"
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert (summary.input_sentences, summary.empty_input_lines, summary.translated) == (24, 2, 24)
    return output


def read_pairs(path: Path) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()]


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


def test_output_is_a_training_file_in_input_order(reference_output, marian_dir):
    pairs = read_pairs(reference_output)
    assert [sentence for sentence, _ in pairs] == SENTENCES
    assert all(line.count("\t") == 1 for line in reference_output.read_text(encoding="utf-8").splitlines())
    translations = [translation for _, translation in pairs]
    assert all(translation.strip() for translation in translations)
    assert len(set(translations)) == len(SENTENCES), "each sentence has its own translation: order errors show"
    # Each line holds the translation of its own sentence, although batches were sorted by length.
    translator = Translator.from_arguments(
        PrepareFraternalArguments(
            input_file="unused", output_file="unused.txt", model_name_or_path=str(marian_dir), max_length=12,
            num_beams=1, device="cpu",
        )
    )  # fmt: skip
    alone = [prepare_fraternal.clean_field(translator.translate_batch([s])[0]) for s in SENTENCES]
    assert translations == alone
    dataset = load_train_dataset(reference_output)
    assert dataset["sentence"] == SENTENCES and dataset["fraternal"] == translations
    assert not Path(str(reference_output) + ".pending").exists()


def test_batches_are_sorted_by_length_within_chunks(marian_dir, input_file, tmp_path, recorded_batches):
    prepare_fraternal.run(tool_args(input_file, tmp_path / "pairs.txt", marian_dir))
    assert len(recorded_batches) == 6
    for chunk_number in range(3):
        chunk = SENTENCES[8 * chunk_number : 8 * chunk_number + 8]
        first, second = recorded_batches[2 * chunk_number : 2 * chunk_number + 2]
        assert sorted(first + second) == sorted(chunk)
        assert min(map(len, first)) >= max(map(len, second))


def test_interrupted_run_resumes_without_translating_twice(
    marian_dir, input_file, reference_output, tmp_path, monkeypatch
):
    output = tmp_path / "pairs.txt"
    translated: list[list[str]] = []
    crash_on_batch(monkeypatch, 4, translated)  # batches 1-3 done: chunk 1 and the longer half of chunk 2
    with pytest.raises(SimulatedCrash):
        prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert len(translated) == 3
    written = read_pairs(output)
    assert [sentence for sentence, _ in written] == SENTENCES[: len(written)]
    assert len(written) < 12 <= len(written) + 4, "the longer half of chunk 2 waits in the side file"
    pending = Path(str(output) + ".pending")
    assert pending.exists()
    # A kill while writing leaves half a line: it is dropped on restart.
    with open(output, "a", encoding="utf-8") as handle:
        handle.write(SENTENCES[len(written)] + "\tcut of")

    crash_on_batch(monkeypatch, 0, translated)  # no crash this time
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    sentences_sent = Counter(sentence for batch in translated for sentence in batch)
    assert sorted(sentences_sent) == sorted(SENTENCES) and max(sentences_sent.values()) == 1
    assert summary.already_translated == len(written) and summary.translated == 24 - 12
    assert output.read_bytes() == reference_output.read_bytes()
    assert not pending.exists()


def test_max_sentences_then_continue(marian_dir, input_file, reference_output, tmp_path, recorded_batches):
    output = tmp_path / "pairs.txt"
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir, "--max_sentences", "10"))
    assert summary.output_lines == 10 and len(read_pairs(output)) == 10
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert (summary.already_translated, summary.translated, summary.output_lines) == (10, 14, 24)
    assert sum(len(batch) for batch in recorded_batches) == 24
    assert output.read_bytes() == reference_output.read_bytes()
    # A finished output: nothing to translate, the model is not even loaded.
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert summary.translated == 0 and len(recorded_batches) == 7
    assert output.read_bytes() == reference_output.read_bytes()


def test_output_of_another_input_is_refused(marian_dir, input_file, reference_output, tmp_path, monkeypatch, capsys):
    output = tmp_path / "pairs.txt"
    reference_lines = reference_output.read_text(encoding="utf-8").splitlines(keepends=True)
    started = "".join(reference_lines[:3]) + reference_lines[3][:10]  # an interrupted run of the first input
    output.write_text(started, encoding="utf-8")
    other_input = tmp_path / "other.txt"
    other_input.write_text("\n".join(["", *SENTENCES[:2], "Another third sentence.", *SENTENCES[3:]]) + "\n")
    monkeypatch.setattr(Translator, "from_arguments", lambda args: pytest.fail("model loaded before the check"))
    with pytest.raises(DataFormatError) as error:
        prepare_fraternal.run(tool_args(other_input, output, marian_dir))
    message = str(error.value)
    assert f"{output}: line 3:" in message and f"{other_input} (line 4:" in message
    assert "Another third sentence." in message and SENTENCES[2] in message
    assert output.read_text(encoding="utf-8") == started, "the output is left as it was"
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(other_input, output, marian_dir))
    assert exit_info.value.code == 2
    assert re.search("prepare_fraternal.py: error: .*line 3", capsys.readouterr().err)
    # A shorter input than the output: refused too.
    short_input = tmp_path / "short.txt"
    short_input.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="line 2: the output has more lines than"):
        prepare_fraternal.run(tool_args(short_input, output, marian_dir))
    # --overwrite_output_file starts over.
    monkeypatch.undo()
    prepare_fraternal.run(
        tool_args(other_input, output, marian_dir, "--overwrite_output_file", "--max_sentences", "3")
    )
    assert [sentence for sentence, _ in read_pairs(output)] == [*SENTENCES[:2], "Another third sentence."]


def started_output(reference_output: Path, path: Path) -> bytes:
    """Write an output that an interrupted run left: 10 finished lines, the start of the 11th; return its bytes."""
    reference_lines = reference_output.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(reference_lines[:10]) + reference_lines[10][:12])
    return path.read_bytes()


def lock_path_of(output: Path) -> Path:
    return Path(str(output.resolve()) + ".lock")


def test_bad_model_path_leaves_the_output_as_it_was(marian_dir, input_file, reference_output, tmp_path, capsys):
    output = tmp_path / "pairs.txt"
    before = started_output(reference_output, output)
    pending = Path(str(output) + ".pending")
    sentence, translation = read_pairs(reference_output)[12]
    pending.write_text(f"12\t{sentence}\t{translation}\n", encoding="utf-8")  # translated ahead of its turn
    pending_before = pending.read_bytes()
    for bad_model in (str(tmp_path / "opus-mt-en-dee"), "Helsinki-NLP/opus-mt-en-dee"):
        for extra in ([], ["--overwrite_output_file"]):
            with pytest.raises(SystemExit) as exit_info:
                prepare_fraternal.main(tool_args(input_file, output, Path(bad_model), *extra))
            assert output.read_bytes() == before, "not even the unfinished last line is cut"
            assert pending.read_bytes() == pending_before
            assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt", "pairs.txt.pending"]
            assert exit_info.value.code == 2
            assert f"prepare_fraternal.py: error: --model_name_or_path {bad_model}: " in capsys.readouterr().err
    # With the right model, the run continues the output as if nothing had happened.
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert (summary.already_translated, summary.translated) == (10, 13)
    assert output.read_bytes() == reference_output.read_bytes()


def test_overwrite_replaces_the_output_only_when_the_run_finished(
    marian_dir, input_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    output.write_text("Old sentence.\tAlter Satz.\nCut off\tAb", encoding="utf-8")
    old = output.read_bytes()
    pending = Path(str(output) + ".pending")
    pending.write_text("5\tOld fifth.\tAlter fünfter.\n", encoding="utf-8")
    old_pending = pending.read_bytes()
    new, new_pending = Path(str(output) + ".new"), Path(str(output) + ".new.pending")
    overwrite = tool_args(input_file, output, marian_dir, "--overwrite_output_file")

    translated: list[list[str]] = []
    crash_on_batch(monkeypatch, 4, translated)
    with pytest.raises(SimulatedCrash):
        prepare_fraternal.run(overwrite)
    assert output.read_bytes() == old and pending.read_bytes() == old_pending
    assert 0 < len(read_pairs(new)) < 12 and new_pending.exists(), "the interrupted run wrote beside the output"

    def interrupted(self, sentences):
        raise KeyboardInterrupt

    monkeypatch.setattr(Translator, "translate_batch", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(overwrite)
    assert exit_info.value.code == 130
    assert f"{output} is unchanged" in capsys.readouterr().err
    assert output.read_bytes() == old and pending.read_bytes() == old_pending

    translated.clear()
    crash_on_batch(monkeypatch, 0, translated)
    new.write_bytes(b"".join(reference_output.read_bytes().splitlines(keepends=True)[:5]))  # left over
    summary = prepare_fraternal.run(overwrite)
    assert (summary.already_translated, summary.translated, summary.output_lines) == (0, 24, 24), "started over"
    assert sorted(sentence for batch in translated for sentence in batch) == sorted(SENTENCES)
    assert output.read_bytes() == reference_output.read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"], "no .new, .pending or .lock left"


def test_second_run_on_the_same_output_is_refused(
    marian_dir, input_file, reference_output, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "pairs.txt"
    before = started_output(reference_output, output)
    refused = f"--output_file {output}: another prepare_fraternal.py run is writing it"
    # Another run holds the lock: refused before the output is read or the model loaded.
    with open(lock_path_of(output), "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with monkeypatch.context() as patch:
            patch.setattr(Translator, "from_arguments", lambda args: pytest.fail("model loaded"))
            patch.setattr(prepare_fraternal, "count_finished_lines", lambda *a: pytest.fail("output read"))
            for extra in ([], ["--overwrite_output_file"]):
                with pytest.raises(SystemExit) as exit_info:
                    prepare_fraternal.main(tool_args(input_file, output, marian_dir, *extra))
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
                prepare_fraternal.run(tool_args(input_file, output, marian_dir))
            second_run_errors.append(error.value)
        return UNPATCHED_TRANSLATE_BATCH(self, sentences)

    monkeypatch.setattr(Translator, "translate_batch", start_a_second_run)
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert len(second_run_errors) == 1 and summary.translated == 14
    assert output.read_bytes() == reference_output.read_bytes(), "every pair once"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"], "the lock file is removed at the end"


@pytest.mark.parametrize("holder_ends", ["removed", "replaced"])
def test_lock_file_removed_by_its_holder_is_not_trusted(
    reference_output, input_file, tmp_path, monkeypatch, holder_ends
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
        prepare_fraternal,
        "fcntl",
        SimpleNamespace(flock=flock_after_the_holder_left, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB),
    )
    monkeypatch.setattr(prepare_fraternal, "count_finished_lines", check_the_lock)
    summary = prepare_fraternal.run(tool_args(input_file, output, Path("not/loaded")))
    assert summary.translated == 0 and len(flock_calls) == 2, "the first lock was let go, the second kept"
    if holder_ends == "replaced":
        assert flock_calls[0] != flock_calls[1]
    assert output.read_bytes() == reference_output.read_bytes() and not lock_path.exists()


def test_bad_input_files(marian_dir, tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(missing, tmp_path / "out.txt", marian_dir))
    assert exit_info.value.code == 2
    assert f"prepare_fraternal.py: error: input file not found: {missing}" in capsys.readouterr().err
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{blank}: no sentences")):
        prepare_fraternal.run(tool_args(blank, tmp_path / "out.txt", marian_dir))
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(blank, tmp_path / "out.tsv", marian_dir))
    assert exit_info.value.code == 2 and "must end in .txt" in capsys.readouterr().err
    not_ours = tmp_path / "not_ours.txt"
    not_ours.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    source = tmp_path / "source.txt"
    source.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{not_ours}: line 1: expected 'sentence<TAB>translation'")):
        prepare_fraternal.run(tool_args(source, not_ours, marian_dir))
    with pytest.raises(SettingsError, match="--batch_size must be"):
        prepare_fraternal.run(tool_args(source, tmp_path / "out.txt", marian_dir, "--batch_size", "0"))


def test_tabs_line_breaks_and_empty_translations(marian_dir, tmp_path, monkeypatch):
    source = tmp_path / "source.txt"
    source.write_bytes(b"A sentence\twith a tab.\nSecond sentence.\nThird\x0bone.\nFourth.\n")
    answers = {
        "A sentence with a tab.": "Ein Satz\tmit\nTab.",
        "Second sentence.": " \n ",
        "Third one.": "Dritter\u2028Satz.\r",
        "Fourth.": "Vierter.",
    }
    monkeypatch.setattr(Translator, "translate_batch", lambda self, batch: [answers[s] for s in batch])
    output = tmp_path / "pairs.txt"
    summary = prepare_fraternal.run(tool_args(source, output, marian_dir))
    assert summary.empty_translations == 1
    assert output.read_text(encoding="utf-8").split("\n") == [
        "A sentence with a tab.\tEin Satz mit Tab.",
        "Second sentence.\tSecond sentence.",
        "Third one.\tDritter Satz.",
        "Fourth.\tVierter.",
        "",
    ]
    assert len(load_train_dataset(output)) == 4
    assert prepare_fraternal.run(tool_args(source, output, marian_dir)).already_translated == 4


def test_t5_gets_its_task_prefix(tmp_path, monkeypatch):
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    model_dir = build_tiny_t5(tmp_path / "t5")
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


def test_marian_multilingual_target_token(marian_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(marian_dir)
    tokenizer.add_tokens([">>deu<<", ">>fra<<"], special_tokens=True)
    marian = SimpleNamespace(model_type="marian")
    args = PrepareFraternalArguments("in.txt", "out.txt", "model", target_lang="fra")
    assert prepare_fraternal.resolve_prefix(marian, tokenizer, args) == ">>fra<< "
    args = PrepareFraternalArguments("in.txt", "out.txt", "model", target_lang="ita")
    assert prepare_fraternal.resolve_prefix(marian, tokenizer, args) == ""


def test_nllb_source_language_and_forced_target_token(tmp_path, monkeypatch):
    from transformers import AutoTokenizer, M2M100ForConditionalGeneration

    model_dir = build_tiny_nllb(tmp_path / "nllb")
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


def test_bfloat16_weights(marian_dir):
    args = PrepareFraternalArguments(
        "in.txt", "out.txt", str(marian_dir), max_length=6, num_beams=1, device="cpu", dtype="bfloat16"
    )
    translator = Translator.from_arguments(args)
    assert translator.model.dtype == torch.bfloat16
    assert len(translator.translate_batch(SENTENCES[:3])) == 3


def without_max_length(arguments: list[str]) -> list[str]:
    """``arguments`` without ``--max_length`` and its value: the run takes the default."""
    at = arguments.index("--max_length")
    return arguments[:at] + arguments[at + 2 :]


def test_max_length_beyond_the_model_positions_is_refused(
    marian_dir, input_file, reference_output, tmp_path, monkeypatch, capsys
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
        PrepareFraternalArguments("in.txt", "out.txt", str(marian_dir), max_length=64, num_beams=1, device="cpu")
    )
    long_sentence = " ".join(SENTENCES)  # 181 tokens: truncated to --max_length
    assert len(translator.translate_batch([long_sentence, SENTENCES[0]])) == 2
    assert generated == [(64, 1 + 64)], "64 tokens read, 64 written (after the decoder's start token)"
    one_more = Translator(translator.model, translator.tokenizer, max_length=65, num_beams=1)
    with pytest.raises(IndexError):
        one_more.translate_batch([long_sentence])
    with pytest.raises(IndexError):
        one_more.translate_batch([SENTENCES[0]])  # a short input: the 65th generated token is too many
    monkeypatch.undo()

    output = tmp_path / "pairs.txt"
    before = started_output(reference_output, output)
    monkeypatch.setattr(Translator, "from_arguments", lambda args: pytest.fail("model loaded"))
    monkeypatch.setattr(prepare_fraternal, "output_lock", lambda output_file: pytest.fail("output locked"))
    with pytest.raises(SystemExit) as exit_info:
        prepare_fraternal.main(tool_args(input_file, output, marian_dir, "--max_length", "65"))
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert f"prepare_fraternal.py: error: --max_length 65: more than the 64 positions of {marian_dir}" in message
    assert "pass --max_length 64 or less, or leave it out (64)." in message and "Traceback" not in message
    assert output.read_bytes() == before and sorted(path.name for path in tmp_path.iterdir()) == ["pairs.txt"]


def test_default_max_length_is_lowered_to_the_model_positions(marian_dir, input_file, tmp_path, monkeypatch, caplog):
    lengths = []

    def recording(self, sentences):
        lengths.append((self.max_length, self.generation_kwargs["max_new_tokens"]))
        return UNPATCHED_TRANSLATE_BATCH(self, sentences)

    monkeypatch.setattr(Translator, "translate_batch", recording)
    output = tmp_path / "pairs.txt"
    arguments = without_max_length(tool_args(input_file, output, marian_dir, "--max_sentences", "4"))
    with caplog.at_level(logging.INFO, logger="prepare_fraternal"):
        summary = prepare_fraternal.run(arguments)
    assert summary.translated == 4 and lengths == [(64, 64)]
    assert f"--max_length 64: {marian_dir} has 64 positions, fewer than the default 128" in caplog.text


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
    marian_dir, input_file, reference_output, tmp_path, monkeypatch, capsys, no_gpu
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
    monkeypatch.setattr(Translator, "from_arguments", lambda args: pytest.fail("model loaded"))
    monkeypatch.setattr(prepare_fraternal, "output_lock", lambda output_file: pytest.fail("output locked"))
    for device in ("cuda", "cuda:1", "gpu"):
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(tool_args(input_file, output, marian_dir, "--device", device))
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
