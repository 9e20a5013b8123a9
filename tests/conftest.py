"""Shared fixtures: tiny random-weight encoders and tokenizers built in the test session (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENGLISH = [
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "The cat sits on the mat.",
    "Two dogs run across the green field.",
    "A child is riding a horse on the beach.",
    "The weather is cold and rainy today.",
    "She reads a book in the quiet library.",
    "He arrived yesterday by train from the city.",
    "Say hello to your aunt for me.",
    "It would never have occurred to me.",
    "Of course, this requires patience.",
    "There is nothing wrong with it.",
]
GERMAN = [
    "Ein Mann spielt Gitarre.",
    "Eine Frau schneidet eine Zwiebel.",
    "Die Katze sitzt auf der Matte.",
    "Zwei Hunde rennen über das grüne Feld.",
    "Ein Kind reitet am Strand auf einem Pferd.",
    "Das Wetter ist heute kalt und regnerisch.",
    "Sie liest ein Buch in der ruhigen Bibliothek.",
    "Er kam gestern mit dem Zug aus der Stadt an.",
    "Grüß deine Tante von mir.",
    "Darauf wäre ich nie gekommen.",
    "Dazu gehört natürlich Geduld.",
    "Daran ist nichts auszusetzen.",
]

# Mandarin sentences and their Cantonese translations (the paper's Chinese setting).
MANDARIN = [
    "我今天很高兴。",
    "你在做什么？",
    "他们明天去北京。",
    "这本书很有意思。",
    "我不知道他在哪里。",
    "天气越来越冷了。",
    "我们一起吃饭吧。",
    "这个多少钱？",
    "他说的话我听不懂。",
    "你要不要喝茶？",
    "我住在香港。",
    "她每天早上跑步。",
]
CANTONESE = [
    "我今日好開心。",
    "你喺度做緊乜嘢？",
    "佢哋聽日去北京。",
    "呢本書好有意思。",
    "我唔知佢喺邊度。",
    "天氣越嚟越凍喇。",
    "我哋一齊食飯啦。",
    "呢個幾多錢？",
    "佢講嘅嘢我聽唔明。",
    "你要唔要飲茶？",
    "我住喺香港。",
    "佢每日朝早跑步。",
]


def build_tokenizer(sentences: list[str], vocab_size: int = 200):
    """A BERT-style WordPiece fast tokenizer trained on ``sentences``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(sentences, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def build_tiny_bert(
    folder: Path, sentences: list[str], hidden_size: int = 32, seed: int = 0, dropout: float = 0.1
) -> Path:
    """Save a random-weight 2-layer BERT and its tokenizer to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = build_tokenizer(sentences)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def ifcl_data_cache(tmp_path_factory) -> Path:
    """Training files the tests parse are cached in the session's folder (scripts run by the tests inherit it),
    not in the user's datasets cache."""
    folder = tmp_path_factory.mktemp("ifcl_data_cache")
    os.environ["IFCL_DATA_CACHE"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> Path:
    """A tiny English BERT (width 32) with a tokenizer trained on English and German sentences."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_encoder"), ENGLISH + GERMAN, hidden_size=32)


@pytest.fixture(scope="session")
def tiny_fraternal_dir(tmp_path_factory) -> Path:
    """A tiny 'German' BERT of another width (24) and vocabulary, to exercise the fraternal projection."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_fraternal"), GERMAN, hidden_size=24, seed=1)


@pytest.fixture(scope="session")
def english_sts_data(tmp_path_factory) -> Path:
    """``train.txt`` (the English sentences, one per line, three times) and ``sts.tsv`` (pairs of them, made-up
    scores): the data of the objectives' tiny runs, which need no translations."""
    folder = tmp_path_factory.mktemp("english")
    (folder / "train.txt").write_text("\n".join(ENGLISH * 3) + "\n", encoding="utf-8")
    write_sts_file(folder / "sts.tsv")
    return folder


def write_sts_file(path: Path) -> None:
    """A small STS file: each English sentence with the next one, made-up scores 0–5, with a header."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("sentence1\tsentence2\tscore\n")
        for i, (first, second) in enumerate(zip(ENGLISH, ENGLISH[1:] + ENGLISH[:1])):
            f.write(f"{first}\t{second}\t{(i * 7) % 6}\n")


def objective_run_args(encoder: Path, data: Path, output: Path, objective: str, *extra: str) -> list[str]:
    """A 4-step ``run_ifcl.py`` run of ``--objective`` on the tiny encoder and :func:`english_sts_data`."""
    return [
        "--objective", objective,
        "--model_name_or_path", str(encoder),
        "--train_file", str(data / "train.txt"),
        "--validation_file", str(data / "sts.tsv"),
        "--test_file", str(data / "sts.tsv"),
        "--output_dir", str(output),
        "--max_steps", "4",
        "--per_device_train_batch_size", "4",
        "--eval_steps", "2",
        "--save_steps", "2",
        "--logging_steps", "2",
        "--use_cpu",
        *extra,
    ]  # fmt: skip


def saved_weight_names(folder: Path) -> set[str]:
    """The tensor names in ``folder/model.safetensors``."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        return set(weights.keys())


def losses_by_step(trainer) -> dict[int, float]:
    """The training loss the trainer logged at each step."""
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def train_and_resume(fresh_trainer, tmp_path: Path, checkpoint: str) -> tuple:
    """Train ``fresh_trainer(output_dir)`` without a stop, then a second one resumed from the first's
    ``checkpoint`` folder. Returns the losses by step of both (uninterrupted, resumed), then both trainers."""
    uninterrupted = fresh_trainer(str(tmp_path / "a"))
    uninterrupted.train()
    resumed = fresh_trainer(str(tmp_path / "b"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / checkpoint))
    return losses_by_step(uninterrupted), losses_by_step(resumed), uninterrupted, resumed


@pytest.fixture(scope="module")
def one_cpu_thread():
    """torch on one thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_cpu_thread")``)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
