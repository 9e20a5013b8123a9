"""Shared fixtures: tiny random-weight encoders and tokenizers built in the test session (no downloads), and the
helpers the test modules share (no test module imports from another)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where the README's default run saves its model: docs blocks and the MTEB snippet read a published model there.
DEFAULT_RUN = "outputs/ifcl-all-MiniLM-L6-v2-trans-de-en"
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
    """A BERT-style WordPiece fast tokenizer of ``sentences``: BERT's normalizer, pre-tokenizer, decoder and
    [CLS]/[SEP] template over a vocabulary of ``vocab_size`` as WordPiece training makes one (the special tokens,
    every character alone and as a ``##`` continuation, the words, most frequent first, then their endings as ``##``
    pieces). Built, not trained: the trainer breaks ties between equally frequent merges differently in each process,
    so the fixtures' vocabulary, and every figure of the tiny models, changed from run to run."""
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(
        word
        for sentence in sentences
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence))
    )
    characters = sorted({character for word in words for character in word})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *characters, *(f"##{c}" for c in characters)]
    frequent = [word for word, _ in sorted(words.items(), key=lambda item: (-item[1], item[0]))]  # then a-z
    endings = [f"##{word[i:]}" for word in frequent for i in range(1, len(word) - 1)]  # "##ing", "##ng"
    for piece in (*frequent, *endings):
        if len(vocab) >= vocab_size:
            break
        if piece not in vocab:
            vocab.append(piece)
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
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


OWN_CONFIG_CODE = """from transformers import BertConfig


class MyBertConfig(BertConfig):
    model_type = "mybert"
"""
OWN_MODEL_CODE = """from transformers import BertModel, PreTrainedModel

from .configuration_mybert import MyBertConfig


class MyBertModel(PreTrainedModel):
    \"\"\"A BERT under its own class and parameter names (body.*), as an encoder that ships its code has them.\"\"\"

    config_class = MyBertConfig
    base_model_prefix = "mybert"

    def __init__(self, config):
        super().__init__(config)
        self.body = BertModel(config, add_pooling_layer=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.body.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.body.set_input_embeddings(value)

    def forward(self, **inputs):
        return self.body(**inputs)
"""


def build_own_code_encoder(folder: Path, sentences: list[str], code_folder: Path | None = None) -> Path:
    """A tiny encoder that ships its own code, as nomic-embed or gte do: its ``configuration_mybert.py`` and
    ``modeling_mybert.py`` (a model type transformers does not know, its own class and parameter names), the
    ``auto_map`` naming them and a tokenizer. With ``code_folder``, the code lies there and the ``auto_map`` points at
    it as at another repository (``repo--module.Class``)."""
    import json

    from transformers import AutoConfig, AutoModel

    bert = build_tiny_bert(folder, sentences)
    code = code_folder or folder
    code.mkdir(parents=True, exist_ok=True)
    (code / "configuration_mybert.py").write_text(OWN_CONFIG_CODE, encoding="utf-8")
    (code / "modeling_mybert.py").write_text(OWN_MODEL_CODE, encoding="utf-8")
    prefix = f"{code_folder}--" if code_folder else ""
    auto_map = {
        "AutoConfig": f"{prefix}configuration_mybert.MyBertConfig",
        "AutoModel": f"{prefix}modeling_mybert.MyBertModel",
    }
    config = json.loads((bert / "config.json").read_text(encoding="utf-8"))
    config.update(model_type="mybert", architectures=["MyBertModel"], auto_map=auto_map)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    model = AutoModel.from_config(
        AutoConfig.from_pretrained(str(folder), trust_remote_code=True), trust_remote_code=True
    )
    model.save_pretrained(str(folder))  # random weights under its own names
    if code_folder:  # as published: the code in the other repository only
        for name in ("configuration_mybert.py", "modeling_mybert.py"):
            (folder / name).unlink(missing_ok=True)
        (folder / "config.json").write_text(
            json.dumps({**json.loads((folder / "config.json").read_text()), "auto_map": auto_map}), encoding="utf-8"
        )
    return folder


SMALL = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}
# The encoder families users bring: (config class name, its settings beyond SMALL, whether its tokenizer gives token
# type ids).
FAMILIES = {
    "bert": ("BertConfig", {"hidden_size": 32}, True),
    "roberta": ("RobertaConfig", {"hidden_size": 32, "type_vocab_size": 1}, False),
    "mpnet": ("MPNetConfig", {"hidden_size": 32}, False),
    "distilbert": ("DistilBertConfig", {"dim": 32, "hidden_dim": 64}, False),
    "xlm-roberta": ("XLMRobertaConfig", {"hidden_size": 32, "type_vocab_size": 1}, False),
    "deberta-v2": ("DebertaV2Config", {"hidden_size": 32, "type_vocab_size": 0}, False),
    "modernbert": ("ModernBertConfig", {"hidden_size": 32, "global_attn_every_n_layers": 2}, False),
    "electra": ("ElectraConfig", {"hidden_size": 32, "embedding_size": 16}, True),
    "albert": ("AlbertConfig", {"hidden_size": 32, "embedding_size": 16}, True),
}


def build_tiny_encoder(family: str, folder: Path) -> Path:
    """A random tiny encoder of ``family`` (hidden size 32) and a WordPiece tokenizer whose special ids its config
    uses, saved to ``folder``."""
    import torch
    import transformers
    from transformers import AutoModel

    config_class, settings, token_types = FAMILIES[family]
    tokenizer = build_tokenizer(ENGLISH + GERMAN)
    if not token_types:
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.cls_token_id}
    special["eos_token_id"] = tokenizer.sep_token_id
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), **SMALL, **settings, **special)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
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
def tiny_model(tiny_encoder_dir):
    """The tiny encoder as an ``IFCLModel`` with its defaults and no queue (BEL_F is BEL_S), for tests that only read
    it: they neither train it nor change its config, and set the training mode they rely on."""
    from ifcl.model import IFCLModel

    return IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)


@pytest.fixture(scope="session")
def model(tiny_encoder_dir, tiny_fraternal_dir):
    """An ``IFCLModel`` with every part: the tiny encoder, BEL_F from the tiny fraternal model (width 24, so with a
    projection), fusion rate 0.3 and a queue of 2 slots of 4 rows; for tests that only read it, as ``tiny_model``."""
    from ifcl.model import IFCLModel

    return IFCLModel.from_encoder(
        str(tiny_encoder_dir), str(tiny_fraternal_dir), fusion_rate=0.3, queue_size=2, queue_batch_size=4
    )


@pytest.fixture(scope="session")
def published_dir(tiny_model, tmp_path_factory) -> Path:
    """``tiny_model`` as a published folder (weights, tokenizer, the sentence-transformers view), as a training run
    saves one; for tests that only read it. A test that needs it at a given path, or changes it, copies it there
    (``shutil.copytree``)."""
    from ifcl.publishing import save_published

    folder = tmp_path_factory.mktemp("published")
    save_published(tiny_model, str(folder))
    return folder


@pytest.fixture(scope="session")
def english_sts_data(tmp_path_factory) -> Path:
    """``train.txt`` (the English sentences, one per line, three times) and ``sts.tsv`` (pairs of them, made-up
    scores): the data of the objectives' tiny runs, which need no translations."""
    folder = tmp_path_factory.mktemp("english")
    (folder / "train.txt").write_text("\n".join(ENGLISH * 3) + "\n", encoding="utf-8")
    write_sts_file(folder / "sts.tsv")
    return folder


@pytest.fixture(scope="session")
def pairs_data(tmp_path_factory) -> Path:
    """``train.txt`` (English<TAB>German, 36 lines) and ``sts.tsv``: the data of a tiny IFCL run with twins."""
    folder = tmp_path_factory.mktemp("pairs")
    lines = [f"{english}\t{german}\n" for english, german in zip(ENGLISH, GERMAN)] * 3
    (folder / "train.txt").write_text("".join(lines), encoding="utf-8")
    write_sts_file(folder / "sts.tsv")
    return folder


@pytest.fixture(scope="session")
def finished_run(tiny_encoder_dir, pairs_data, tmp_path_factory) -> tuple[Path, dict[str, float]]:
    """One finished 4-step IFCL run of ``run_ifcl.py`` (fraternal twins, a queue of k = 2 mini-batches of N = 4), for
    the tests that only read it: its folder and its results."""
    import run_ifcl

    folder = tmp_path_factory.mktemp("runs") / "finished"
    extra = ("--queue_size", "2", "--forgetting_rate", "0.2")
    _, metrics = run_ifcl.main(objective_run_args(tiny_encoder_dir, pairs_data, folder, "ifcl", *extra))
    return folder, metrics


def write_sts_file(path: Path) -> None:
    """A small STS file: each English sentence with the next one, made-up scores 0–5, with a header."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("sentence1\tsentence2\tscore\n")
        for i, (first, second) in enumerate(zip(ENGLISH, ENGLISH[1:] + ENGLISH[:1])):
            f.write(f"{first}\t{second}\t{(i * 7) % 6}\n")


def cpu_training_args(output_dir: Path | str, **settings):
    """``TrainingArguments`` of a test run: on the CPU, reporting to no logger, saving nothing, unless ``settings`` say
    otherwise."""
    from transformers import TrainingArguments

    defaults = {"output_dir": str(output_dir), "use_cpu": True, "report_to": "none", "save_strategy": "no"}
    return TrainingArguments(**{**defaults, **settings})


def st_training_args(output_dir: Path | str, **settings):
    """``SentenceTransformerTrainingArguments`` of a test run, as :func:`cpu_training_args` for the Trainer."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    defaults = {"output_dir": str(output_dir), "use_cpu": True, "report_to": [], "save_strategy": "no"}
    return SentenceTransformerTrainingArguments(**{**defaults, **settings})


def without_dropout(module):
    """``module`` with every dropout of its sub-modules set to 0."""
    from torch import nn

    for child in module.modules():
        if isinstance(child, nn.Dropout):
            child.p = 0.0
    return module


def objective_run_args(
    encoder: Path,
    data: Path,
    output: Path,
    objective: str,
    *extra: str,
    fraternal: Path | None = None,
    max_steps: int = 4,
) -> list[str]:
    """The arguments of a tiny ``run_ifcl.py`` run of ``--objective`` on ``encoder`` (and the ``fraternal`` model) with
    ``data``'s train.txt and sts.tsv, batch 4, on the CPU: evaluated and saved every ``max_steps // 2`` steps."""
    flags = {
        "--objective": objective,
        "--model_name_or_path": encoder,
        "--fraternal_model_name_or_path": fraternal,
        "--train_file": data / "train.txt",
        "--validation_file": data / "sts.tsv",
        "--test_file": data / "sts.tsv",
        "--output_dir": output,
        "--max_steps": max_steps,
        "--per_device_train_batch_size": 4,
        "--eval_steps": max_steps // 2,
        "--save_steps": max_steps // 2,
        "--logging_steps": 2,
    }
    pairs = [(flag, str(value)) for flag, value in flags.items() if value is not None]
    return [*(item for pair in pairs for item in pair), "--use_cpu", *extra]


def run_script(script: str, *args: str, cwd: Path, input: str | None = None) -> subprocess.CompletedProcess:
    """``script`` of the repository as a command in a fresh interpreter, in ``cwd`` (also its HOME), offline, with
    a bare environment and one OpenMP thread; ``input``: what its standard input reads (else nothing)."""
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        input=input,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(cwd), "OMP_NUM_THREADS": "1"},
        timeout=300,
    )


def free_port() -> int:
    """A port no process listens on now, for the rendezvous of several processes: torchrun's default, 29500, is taken
    while another test run launches its own, and port 0 makes torchrun wait."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(args: list[str], processes: int = 1, script: str = "run_ifcl.py") -> subprocess.CompletedProcess:
    """``accelerate launch`` on CPU. Several CPU processes go through torchrun (``--multi_gpu`` with
    ``--use_cpu``): accelerate's own ``--cpu --num_processes 2`` starts one process unless mpirun is set up."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
    if processes > 1:
        command += ["--multi_gpu", "--main_process_port", str(free_port())]
        args = [*args, "--use_cpu"]
    else:
        command += ["--cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, str(ROOT / script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def saved_weight_names(folder: Path) -> set[str]:
    """The tensor names in ``folder/model.safetensors``."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        return set(weights.keys())


def losses_by_step(trainer) -> dict[int, float]:
    """The training loss the trainer logged at each step."""
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def one_training_step(trainer, batch: dict, cache: int | None = None, autocast: bool = False) -> tuple:
    """One training micro-batch of ``trainer`` (through a gradient cache of ``cache`` rows when given, under bf16
    autocast with ``autocast``): its loss, logged terms, every parameter's gradient, and the rows it queued."""
    import torch

    trainer.cache_mini_batch_size = cache
    model, objective = trainer.model, trainer.objective
    model.train()
    model.zero_grad()
    objective.pending_rows.clear()
    device = next(iter(batch.values())).device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        loss, output = trainer.compute_loss(model, batch, return_outputs=True)
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), output.components, gradients, [rows.clone() for rows in objective.pending_rows]


@contextmanager
def stopped_in_step(step: int) -> Iterator[None]:
    """Inside the block, training stops as Ctrl-C would at the end of optimizer step ``step`` (after its checkpoint,
    when it saves one)."""
    from trainer_ifcl import ObjectiveStepCallback

    on_step_end = ObjectiveStepCallback.on_step_end

    def stop(self, args, state, control, **kwargs):
        if state.global_step == step:
            raise KeyboardInterrupt
        return on_step_end(self, args, state, control, **kwargs)

    ObjectiveStepCallback.on_step_end = stop
    try:
        yield
    finally:
        ObjectiveStepCallback.on_step_end = on_step_end


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


# ---- translation fixtures ----
# Tiny random-weight translation models built in the session (no downloads) and the tool's helpers, shared by
# test_prepare_fraternal.py and test_translation_engines.py.
TRANSLATION_SENTENCES = ENGLISH + GERMAN  # 24 sentences of different lengths
TOOL_BATCH_SIZE, TOOL_BATCHES_PER_CHUNK = 4, 2  # tool_args: chunks of 8 sentences, so 3 chunks and 6 batches


class SimulatedCrash(Exception):
    """Raised by a patched translate_batch to interrupt a run."""


def tool_args(input_path: Path, output_path: Path, model: Path, *extra: str) -> list[str]:
    """``prepare_fraternal.py``'s arguments: ``model`` on the CPU, greedy, batches of :data:`TOOL_BATCH_SIZE`,
    chunks of :data:`TOOL_BATCHES_PER_CHUNK` batches, at most 12 tokens; ``extra`` after them."""
    options = {
        "batch_size": TOOL_BATCH_SIZE,
        "batches_per_chunk": TOOL_BATCHES_PER_CHUNK,
        "max_length": 12,
        "num_beams": 1,
    }
    arguments = ["--input_file", str(input_path), "--output_file", str(output_path)]
    arguments += ["--model_name_or_path", str(model), "--device", "cpu"]
    for name, value in options.items():
        arguments += [f"--{name}", str(value)]
    return [*arguments, *extra]


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """The (sentence, translation) lines of a training file the tool wrote."""
    return [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()]


def folder_state(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` (recursively) and its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def build_word_tokenizer(sentences: list[str]):
    """A word-level fast tokenizer over the sorted words of ``sentences``, laid out as opus-mt's: ``</s>``,
    ``<unk>``, ``<s>``, the words, ``<pad>`` last (CTranslate2's converter wants it last).

    Built rather than trained: the `tokenizers` trainers break ties differently from run to run, which would make
    the random models below translate differently in every session.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.BertPreTokenizer()
    words = sorted(
        {
            word
            for sentence in sentences
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence))
        }
    )
    vocabulary = {token: i for i, token in enumerate(["</s>", "<unk>", "<s>", *words, "<pad>"])}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>", bos_token="<s>"
    )


# Tiny decoder families (tests/test_decoders.py, test_lora.py, test_gpu.py): each config class, its settings, and its
# tokenizer as the family ships it: the class tokenizer_config.json names, its special tokens (None: it has none; Llama
# 3 and Mistral have no pad token) and how its tokenizer.json ends a sentence, which for none of them is with EOS: Qwen
# with a byte-level post-processor and no BOS, Llama 3 with a byte-level step then a BOS template, Mistral and Gemma
# with a BOS template (and add_bos_token in tokenizer_config.json).
QWEN_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
DECODERS = {
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16}),
}
DECODER_TOKENIZERS = {
    "qwen2": ("Qwen2Tokenizer", {"bos": None, "eos": "<|endoftext|>", "pad": "<|endoftext|>"}),
    "qwen3": ("Qwen2Tokenizer", {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}),
    "llama": ("PreTrainedTokenizerFast", {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": None}),
    "mistral": ("LlamaTokenizer", {"bos": "<s>", "eos": "</s>", "pad": None, "unk": "<unk>"}),
    "gemma3": ("GemmaTokenizer", {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"}),
}
LAST = {"pooler_type": "last", "eval_pooler_type": "last", "max_seq_length": 16}


def build_decoder_tokenizer(family: str, folder: Path, padding_side: str = "left") -> Path:
    """A BPE tokenizer trained on the test sentences, saved to ``folder`` as ``family``'s is shipped (see
    :data:`DECODER_TOKENIZERS`): byte-level for Qwen and Llama 3, SentencePiece-style (▁ for spaces) for Mistral and
    Gemma; its files written as theirs are, so that ``AutoTokenizer`` loads it with their class and post-processor."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer_class, tokens = DECODER_TOKENIZERS[family]
    special = list(dict.fromkeys(token for token in tokens.values() if token))
    byte_level = family in ("qwen2", "qwen3", "llama")
    bpe = Tokenizer(models.BPE(unk_token=tokens.get("unk"), byte_fallback=not byte_level))
    if byte_level:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        bpe.pre_tokenizer = pre_tokenizers.Metaspace()
        bpe.decoder = decoders.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, initial_alphabet=alphabet)
    bpe.train_from_iterator(ENGLISH + GERMAN, trainer)
    named = {f"{name}_token": token for name, token in tokens.items() if token}
    PreTrainedTokenizerFast(tokenizer_object=bpe, **named).save_pretrained(folder)
    with open(folder / "tokenizer.json", encoding="utf-8") as handle:
        state = json.load(handle)
    bos = tokens["bos"]
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bpe.token_to_id(bos)], "tokens": [bos]}} if bos else {},
    }
    llama_byte_level = {**QWEN_BYTE_LEVEL, "add_prefix_space": True, "use_regex": True}
    state["post_processor"] = {
        "qwen2": QWEN_BYTE_LEVEL,
        "qwen3": QWEN_BYTE_LEVEL,
        "llama": {"type": "Sequence", "processors": [llama_byte_level, template]},
    }.get(family, template)
    with open(folder / "tokenizer.json", "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    with open(folder / "tokenizer_config.json", encoding="utf-8") as handle:
        settings = json.load(handle)
    settings.update(tokenizer_class=tokenizer_class, padding_side=padding_side)
    settings.update({f"{name}_token": token for name, token in tokens.items()})
    if family in ("mistral", "gemma3"):
        settings.update(add_bos_token=True, add_eos_token=False)
    if family == "gemma3":
        settings["processor_class"] = "Gemma3Processor"  # as Gemma 3's text models ship it
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as handle:
        json.dump(settings, handle)
    return folder


def build_tiny_decoder(family: str, folder: Path, padding_side: str = "left") -> Path:
    """A random tiny decoder of ``family`` (hidden size 32, attention dropout 0 as theirs is) with its family's
    tokenizer (:func:`build_decoder_tokenizer`), saved to ``folder``; its config names the tokenizer's special ids."""
    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_decoder_tokenizer(family, folder, padding_side))
    config_class, settings = DECODERS[family]
    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("pad", "bos", "eos")}
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
        **ids,
        **settings,
    )
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    return folder


def one_layer_seq2seq(config_class, tokenizer, d_model: int = 16, ffn_dim: int = 32, **settings):
    """A config of ``config_class`` (Marian, M2M100, mBART) for ``tokenizer``: one encoder and one decoder layer of
    two heads, 64 positions, the tokenizer's pad and end tokens."""
    return config_class(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **settings,
    )


def build_tiny_marian(folder: Path) -> Path:
    """A random-weight one-layer MarianMTModel with a word-level tokenizer, its generation config as opus-mt's (pad
    never generated, the end forced at the length limit). Greedy decoding gives each of the 24 sentences its own
    translation, the same whatever batch the sentence is in, on both engines."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    tokenizer = build_word_tokenizer(TRANSLATION_SENTENCES)
    torch.manual_seed(3)
    config = one_layer_seq2seq(
        MarianConfig,
        tokenizer,
        d_model=32,
        ffn_dim=64,
        forced_eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        init_std=1.0,  # larger than usual: clear argmax margins
    )
    model = MarianMTModel(config)
    model.generation_config.bad_words_ids = [[tokenizer.pad_token_id]]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_t5(folder: Path) -> Path:
    """A random-weight one-layer T5ForConditionalGeneration with a word-level tokenizer, saved to ``folder``."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer = build_word_tokenizer(TRANSLATION_SENTENCES + ["translate English to German:"])
    torch.manual_seed(2)
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
        initializer_factor=4.0,  # larger than usual: different sentences get different translations
    )
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_nllb(folder: Path) -> Path:
    """A random-weight one-layer M2M100 model with an NllbTokenizer (BPE trained here) that knows three languages."""
    import json

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    bpe.train_from_iterator(TRANSLATION_SENTENCES, trainer)
    model_json = json.loads(bpe.to_str())["model"]
    tokenizer = NllbTokenizer(
        vocab=model_json["vocab"],
        merges=[tuple(merge) for merge in model_json["merges"]],
        extra_special_tokens=["eng_Latn", "deu_Latn", "fra_Latn"],
    )
    torch.manual_seed(0)
    config = one_layer_seq2seq(
        M2M100Config,
        tokenizer,
        bos_token_id=tokenizer.bos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
    )
    M2M100ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_mbart50(folder: Path) -> Path:
    """A random-weight one-layer mBART model with an MBart50Tokenizer (unigram trained here; mBART-50's language
    codes are its special tokens; the tokenizer has no bos token, the config names ``<s>``)."""
    import json

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import MBart50Tokenizer, MBartConfig, MBartForConditionalGeneration

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    special = [
        "<unk>",
        "<s>",
        "</s>",
    ]  # a sentencepiece model's first pieces; the tokenizer adds <pad> (fairseq order)
    unigram.train_from_iterator(TRANSLATION_SENTENCES, trainers.UnigramTrainer(vocab_size=120, special_tokens=special))
    vocab = [tuple(entry) for entry in json.loads(unigram.to_str())["model"]["vocab"]]
    tokenizer = MBart50Tokenizer(vocab=vocab, src_lang="en_XX", tgt_lang="de_DE")
    torch.manual_seed(0)
    config = one_layer_seq2seq(
        MBartConfig,
        tokenizer,
        bos_token_id=tokenizer.convert_tokens_to_ids("<s>"),
        forced_eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        tokenizer_class="MBart50Tokenizer",
    )
    MBartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_marian_dir(tmp_path_factory) -> Path:
    return build_tiny_marian(tmp_path_factory.mktemp("tiny_marian"))


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory) -> Path:
    return build_tiny_t5(tmp_path_factory.mktemp("tiny_t5"))


@pytest.fixture(scope="session")
def tiny_nllb_dir(tmp_path_factory) -> Path:
    return build_tiny_nllb(tmp_path_factory.mktemp("tiny_nllb"))


@pytest.fixture(scope="session")
def tiny_mbart50_dir(tmp_path_factory) -> Path:
    return build_tiny_mbart50(tmp_path_factory.mktemp("tiny_mbart50"))


@pytest.fixture(scope="session")
def sentences_file(tmp_path_factory) -> Path:
    """The 24 sentences, one a line, with an empty and a whitespace-only line among them (lines 6 and 19)."""
    path = tmp_path_factory.mktemp("sentences") / "sentences.txt"
    lines = TRANSLATION_SENTENCES[:5] + [""] + TRANSLATION_SENTENCES[5:17] + ["  \t "] + TRANSLATION_SENTENCES[17:]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
