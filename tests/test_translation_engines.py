"""prepare_fraternal.py --engine ctranslate2 against --engine transformers, on tiny random-weight Marian, T5,
NLLB (M2M100) and mBART-50 models built here (CTranslate2's converter wants Marian's ``<pad>`` as the last token of
its vocabulary, and a bos token), and the conversion folder's guarantees."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from test_prepare_fraternal import SENTENCES, build_tiny_nllb, build_tiny_t5, read_pairs

import ifcl.translation as prepare_fraternal
from ifcl import ctranslate2_engine
from ifcl.translation import SettingsError

pytest.importorskip("ctranslate2")


def build_tiny_marian_for_ct2(folder: Path) -> Path:
    """A random-weight one-layer MarianMTModel whose word-level tokenizer has ``<pad>`` last (as opus-mt's have),
    ``<s>``, ``</s>`` and ``<unk>``; its generation config as opus-mt's: pad never generated, end forced at the
    length limit."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.BertPreTokenizer()
    words = sorted(
        {word for s in SENTENCES for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(s))}
    )
    vocabulary = {token: i for i, token in enumerate(["</s>", "<unk>", "<s>", *words, "<pad>"])}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>", bos_token="<s>"
    )
    torch.manual_seed(3)
    config = MarianConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        init_std=0.5,
    )
    model = MarianMTModel(config)
    model.generation_config.bad_words_ids = [[tokenizer.pad_token_id]]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_mbart50(folder: Path) -> Path:
    """A random-weight one-layer mBART model with an MBart50Tokenizer (unigram trained here; mBART-50's language
    codes are its special tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import MBart50Tokenizer, MBartConfig, MBartForConditionalGeneration

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    special = [
        "<unk>",
        "<s>",
        "</s>",
    ]  # a sentencepiece model's first pieces; the tokenizer adds <pad> (fairseq order)
    unigram.train_from_iterator(SENTENCES, trainers.UnigramTrainer(vocab_size=120, special_tokens=special))
    vocab = [tuple(entry) for entry in json.loads(unigram.to_str())["model"]["vocab"]]
    tokenizer = MBart50Tokenizer(vocab=vocab, src_lang="en_XX", tgt_lang="de_DE")
    torch.manual_seed(0)
    config = MBartConfig(
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
        bos_token_id=tokenizer.convert_tokens_to_ids("<s>"),  # the tokenizer itself has no bos token
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        tokenizer_class="MBart50Tokenizer",
    )
    MBartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


FAMILIES = {
    "marian": (build_tiny_marian_for_ct2, []),
    "t5": (build_tiny_t5, ["--source_lang", "English", "--target_lang", "German"]),
    "nllb": (build_tiny_nllb, ["--source_lang", "eng_Latn", "--target_lang", "deu_Latn"]),
    "mbart50": (build_tiny_mbart50, ["--source_lang", "en_XX", "--target_lang", "de_DE"]),
}


# The models are tiny: one thread is fastest, and far faster than two on a busy machine (conftest.py).
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return build_tiny_marian_for_ct2(tmp_path_factory.mktemp("marian"))


@pytest.fixture(scope="module")
def input_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("input") / "sentences.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return path


def tool_args(input_path: Path, output_path: Path, model: Path, *extra: str) -> list[str]:
    return [
        "--input_file", str(input_path), "--output_file", str(output_path), "--model_name_or_path", str(model),
        "--batch_size", "4", "--batches_per_chunk", "2", "--max_length", "12", "--num_beams", "1", "--device", "cpu",
        *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_equals_the_transformers_engine(family, input_file, tmp_path):
    build, languages = FAMILIES[family]
    model = build(tmp_path / family)
    by_engine = {}
    for engine in ("transformers", "ctranslate2"):
        output = tmp_path / f"{engine}.txt"
        summary = prepare_fraternal.run(tool_args(input_file, output, model, *languages, "--engine", engine))
        assert summary.translated == len(SENTENCES)
        by_engine[engine] = read_pairs(output)
    assert [sentence for sentence, _ in by_engine["ctranslate2"]] == SENTENCES, "input order"
    same = sum(a == b for a, b in zip(by_engine["transformers"], by_engine["ctranslate2"]))
    assert same >= 0.95 * len(SENTENCES), (family, same, by_engine)
    if family in ("marian", "t5"):  # the small-init NLLB and mBART models say the same thing to every sentence
        translations = [translation for _, translation in by_engine["ctranslate2"]]
        assert len(set(translations)) >= len(SENTENCES) // 3, "order errors would show"
    record = json.loads((tmp_path / f"{family}-ct2" / ctranslate2_engine.CONVERSION_RECORD).read_text())
    assert record["model_name_or_path"] == str(model.resolve()) and record["converted_by"].startswith("ifcl")


def test_the_converted_folder_is_reused_and_only_ours(marian_dir, input_file, tmp_path, monkeypatch, capsys):
    ct2_dir = tmp_path / "converted"
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    engine = ["--engine", "ctranslate2", "--ct2_model_dir", str(ct2_dir), "--compute_type", "int8"]
    prepare_fraternal.run(tool_args(input_file, first, marian_dir, *engine))
    with monkeypatch.context() as patch:
        patch.setattr(ctranslate2_engine, "convert_model", lambda *a: pytest.fail("converted twice"))
        prepare_fraternal.run(tool_args(input_file, second, marian_dir, *engine, "--max_sentences", "5"))
    assert read_pairs(second) == read_pairs(first)[:5]

    # Another model's folder, and a folder that is not ours: refused before anything is written; left as they are.
    other_model = build_tiny_t5(tmp_path / "t5")
    capsys.readouterr()
    for model, folder, message in (
        (other_model, ct2_dir, "converted from another model or with other settings"),
        (marian_dir, tmp_path, "was not converted by prepare_fraternal.py"),
    ):
        before = sorted(path.name for path in Path(folder).iterdir())
        output = tmp_path / "refused.txt"
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(tool_args(input_file, output, model, "--engine", "ctranslate2", "--ct2_model_dir",
                                             str(folder)))  # fmt: skip
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.splitlines()[-1]
        assert error.startswith(f"prepare_fraternal.py: error: --ct2_model_dir {folder}: ") and message in error
        assert sorted(path.name for path in Path(folder).iterdir()) == before and not output.exists()


def test_engine_settings_are_checked_before_anything_loads(marian_dir, input_file, tmp_path, monkeypatch, capsys):
    output = tmp_path / "pairs.txt"
    monkeypatch.setattr(prepare_fraternal, "output_lock", lambda output_file: pytest.fail("output locked"))
    cases = {
        ("--compute_type", "int8"): "--compute_type: only for --engine ctranslate2",
        ("--engine", "ctranslate2", "--compute_type", "int4"): "--compute_type int4: not one of",
        ("--engine", "ctranslate2", "--compute_type", "float16"): "--compute_type float16: CTranslate2",
    }
    for extra, message in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            prepare_fraternal.main(tool_args(input_file, output, marian_dir, *extra))
        assert exit_info.value.code == 2
        assert re.match(f"prepare_fraternal.py: error: {re.escape(message)}", capsys.readouterr().err)
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_max_batch_tokens_caps_the_padded_batch(marian_dir, input_file, tmp_path, monkeypatch):
    reference = tmp_path / "reference.txt"
    prepare_fraternal.run(tool_args(input_file, reference, marian_dir))
    batches = []
    original = prepare_fraternal.Translator.translate_batch

    def recording(self, sentences):
        batches.append(prepare_fraternal.source_token_counts(self, sentences))
        return original(self, sentences)

    monkeypatch.setattr(prepare_fraternal.Translator, "translate_batch", recording)
    output = tmp_path / "pairs.txt"
    prepare_fraternal.run(tool_args(input_file, output, marian_dir, "--max_batch_tokens", "24"))
    assert all(len(counts) * max(counts) <= 24 or len(counts) == 1 for counts in batches)
    assert any(len(counts) < 4 for counts in batches) and all(len(counts) <= 4 for counts in batches)
    assert output.read_bytes() == reference.read_bytes()


def test_token_batches_are_sorted_longest_first():
    sentences = [
        prepare_fraternal.InputSentence(i + 1, text) for i, text in enumerate(["a b c", "a", "a b", "a b c d"])
    ]
    batches = prepare_fraternal.length_sorted_batches(
        range(4), sentences, 3, max_batch_tokens=8, token_count=lambda texts: [len(t.split()) for t in texts]
    )
    assert batches == [[3, 0], [2, 1]]


def test_unsupported_family_and_missing_package_are_clear(tmp_path, input_file, monkeypatch):
    args = prepare_fraternal.PrepareFraternalArguments(
        str(input_file), str(tmp_path / "out.txt"), str(tmp_path), engine="ctranslate2"
    )
    monkeypatch.setattr(ctranslate2_engine, "import_ctranslate2", lambda: (_ for _ in ()).throw(
        ctranslate2_engine.EngineSettingsError("--engine ctranslate2 needs the ctranslate2 package")))  # fmt: skip
    with pytest.raises(SettingsError, match="pip install|needs the ctranslate2 package"):
        prepare_fraternal.check_engine(args)


def test_two_processes_write_the_file_of_one(marian_dir, tmp_path):
    """accelerate launch on two CPU processes (through torchrun: --multi_gpu with --device cpu; accelerate's own
    --cpu --num_processes 2 needs mpirun), each translating its chunks: byte-identical to one process's file."""
    import subprocess
    import sys

    source = tmp_path / "sentences.txt"
    source.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")  # 72 sentences: 4 rounds of 2 chunks
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    engine = ["--engine", "ctranslate2", "--ct2_model_dir", str(tmp_path / "converted")]
    prepare_fraternal.run(tool_args(source, one, marian_dir, *engine))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    script = str(Path(__file__).resolve().parents[1] / "prepare_fraternal.py")
    done = subprocess.run(
        [*launch, script, *tool_args(source, two, marian_dir, *engine)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert two.read_bytes() == one.read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["converted", "one.txt", "sentences.txt", "two.txt"]


def test_translations_left_in_another_process_side_file_are_not_translated_again(
    marian_dir, input_file, tmp_path, monkeypatch
):
    reference = tmp_path / "reference.txt"
    prepare_fraternal.run(tool_args(input_file, reference, marian_dir))
    lines = reference.read_text(encoding="utf-8").splitlines(keepends=True)
    output = tmp_path / "pairs.txt"
    output.write_text("".join(lines[:8]), encoding="utf-8")  # a killed two-process run: round 1 written,
    side_file = Path(f"{output}.pending.rank1")  # process 1's chunk of round 2 done, process 0's not
    side_file.write_text("".join(f"{index}\t{lines[index]}" for index in range(16, 24)), encoding="utf-8")
    sent = []
    original = prepare_fraternal.Translator.translate_batch
    monkeypatch.setattr(
        prepare_fraternal.Translator,
        "translate_batch",
        lambda self, batch: sent.extend(batch) or original(self, batch),
    )
    summary = prepare_fraternal.run(tool_args(input_file, output, marian_dir))
    assert sorted(sent) == sorted(SENTENCES[8:16]) and summary.translated == 8
    assert output.read_bytes() == reference.read_bytes() and not side_file.exists()
