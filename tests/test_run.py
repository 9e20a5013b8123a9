"""run_ifcl.py end to end on a tiny random-weight BERT, one process and two, and its answers to bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import (
    CANTONESE,
    ENGLISH,
    GERMAN,
    MANDARIN,
    ROOT,
    build_tiny_bert,
    launch,
    objective_run_args,
    write_sts_file,
)

import run_ifcl


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    with open(folder / "train.txt", "w", encoding="utf-8") as f:
        for _ in range(4):
            for english, german in zip(ENGLISH, GERMAN):
                f.write(f"{english}\t{german}\n")
            f.write("   \n")  # whitespace-only lines are skipped
    write_sts_file(folder / "sts.tsv")
    return folder


def tiny_args(encoder: Path, fraternal: Path, data: Path, output: Path, *extra: str) -> list[str]:
    """A 6-step IFCL run with a fraternal model and a queue of k = 2 (conftest's one argument builder)."""
    queue = ("--queue_size", "2", "--forgetting_rate", "0.2")
    return objective_run_args(encoder, data, output, "ifcl", *queue, *extra, fraternal=fraternal, max_steps=6)


@pytest.mark.slow
def test_one_process_end_to_end(tiny_encoder_dir, tiny_fraternal_dir, data_dir, tmp_path):
    output = tmp_path / "out"
    result = launch(tiny_args(tiny_encoder_dir, tiny_fraternal_dir, data_dir, output))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    results = json.loads((output / "all_results.json").read_text())
    for key in ("init_eval_stsb_spearman", "init_test_stsb_spearman", "eval_stsb_spearman", "test_stsb_spearman"):
        assert -100.0 <= results[key] <= 100.0, key
    assert results["train_steps"] == 6
    assert results["train_samples"] == 4 * len(ENGLISH)  # the whitespace lines were skipped

    config = json.loads((output / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_ifcl.IFCLModel"
    settings = config["ifcl"]  # IFCL's settings under one key; the rest is the encoder's own config
    assert config["model_type"] == "bert" and config["architectures"] == ["IFCLModel"]
    assert settings["fusion_rate"] == 0.5 and settings["queue_size"] == 2 and settings["queue_batch_size"] == 4
    for name in ("modeling_ifcl.py", "configuration_ifcl.py", "model.safetensors", "tokenizer.json"):
        assert (output / name).is_file(), name
    assert (output / "fraternal_tokenizer" / "tokenizer.json").is_file()

    assert (output / "training_curves.png").stat().st_size > 10_000
    assert (output / "modules.json").is_file()  # loads with sentence-transformers too
    card = (output / "README.md").read_text()
    assert "trust_remote_code=True" in card and "| stsb | test |" in card
    assert f"{results['test_stsb_spearman']:.2f}" in card

    state = json.loads((output / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    assert logged and all({"loss_identical", "loss_fraternal", "loss_twins"} <= set(entry) for entry in logged)
    assert any("eval_stsb_spearman" in entry for entry in state["log_history"])
    assert "skipped 4 empty" in (result.stdout + result.stderr)

    # What a push publishes names no path of this machine (the output folder here is an absolute one).
    from ifcl.hub import PUSH_IGNORE_PATTERNS

    published = [
        path
        for path in output.rglob("*")
        if path.suffix in (".json", ".md")
        and not any(path.relative_to(output).match(p) for p in PUSH_IGNORE_PATTERNS)
        and not str(path.relative_to(output)).startswith("checkpoint-")
    ]
    assert "trainer_state.json" in {path.name for path in published}
    for path in published:
        text = path.read_text(encoding="utf-8")
        assert str(tmp_path) not in text and str(tiny_encoder_dir) not in text and str(ROOT) not in text, path
    assert state["best_model_checkpoint"] in ("checkpoint-3", "checkpoint-6")  # relative to the folder


@pytest.mark.slow
def test_two_processes_end_with_the_same_queue(tiny_encoder_dir, tiny_fraternal_dir, data_dir, tmp_path):
    output = tmp_path / "ddp"
    args = tiny_args(tiny_encoder_dir, tiny_fraternal_dir, data_dir, output, "--queue_size", "3")
    args += ["--per_device_train_batch_size", "2", "--eval_strategy", "no", "--save_strategy", "no"]
    args += ["--load_best_model_at_end", "false", "--max_steps", "4"]
    result = launch(args, processes=2, script="tests/distributed_run.py")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    queues = [torch.load(output / f"queue_rank{rank}.pt") for rank in (0, 1)]
    # N = 2 per process × 2 processes = 4 anchors per step, the config says so, and 3 of 4 steps stay.
    assert json.loads((output / "config.json").read_text())["ifcl"]["queue_batch_size"] == 4
    assert queues[0]["valid"].sum().item() == 3 * 4
    for name in ("embeddings", "valid", "head"):
        assert torch.equal(queues[0][name], queues[1][name]), name
    assert queues[0]["embeddings"].abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "two_process_flags",
    [[], ["--cache_mini_batch_size", "1"]],
    ids=["uncached", "gradient cache"],
)
def test_two_processes_train_exactly_like_one_process_with_the_global_batch(data_dir, tmp_path, two_process_flags):
    """Batch 2 on each of 2 processes = batch 4 on one: same losses at every step (dropout off, so the only
    randomness is the data order), which needs the in-batch candidates of both processes, in rank order, with
    gradients flowing back to both; also with Matryoshka sizes, and with the 2 processes' rows embedded one at a
    time through the gradient cache."""
    encoder = build_tiny_bert(tmp_path / "encoder", ENGLISH + GERMAN, dropout=0.0)
    fraternal = build_tiny_bert(tmp_path / "fraternal", GERMAN, hidden_size=24, seed=1, dropout=0.0)
    sizes = ["--matryoshka_dims", "32", "8"] if two_process_flags else []
    histories = {}
    for processes, batch, flags in ((1, 4, []), (2, 2, two_process_flags)):
        output = tmp_path / f"p{processes}"
        args = tiny_args(encoder, fraternal, data_dir, output, "--per_device_train_batch_size", str(batch))
        args += ["--max_steps", "4", "--logging_steps", "1", "--learning_rate", "5e-3", "--eval_strategy", "no"]
        args += ["--save_strategy", "no", "--load_best_model_at_end", "false", "--queue_size", "2"]
        args += ["--training_dropout", "0", *sizes, *flags]  # no dropout, knowingly
        result = launch(args, processes=processes)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        state = json.loads((output / "trainer_state.json").read_text())
        histories[processes] = [entry for entry in state["log_history"] if "loss" in entry]
    assert len(histories[1]) == len(histories[2]) == 4
    for one, two in zip(histories[1], histories[2]):
        for term in ("loss", "loss_identical", "loss_fraternal", "loss_twins"):
            assert two[term] == pytest.approx(one[term], abs=1e-5), (one["step"], term)
    # The learning rate is large enough that training moves: equal losses at later steps mean equal gradients.
    assert abs(histories[1][-1]["loss"] - histories[1][0]["loss"]) > 1e-3


@pytest.mark.slow
def test_chinese_mandarin_with_cantonese_twins_end_to_end(tmp_path):
    """The paper's Chinese setting in miniature: Mandarin anchors, Cantonese fraternal twins with their own
    tokenizer, a C-STS-B-like dev file and a SimCLUE-like test file with binary labels."""
    encoder = build_tiny_bert(tmp_path / "mandarin", MANDARIN + CANTONESE)
    fraternal = build_tiny_bert(tmp_path / "cantonese", CANTONESE, hidden_size=24, seed=1)
    with open(tmp_path / "train.txt", "w", encoding="utf-8") as f:
        for _ in range(3):
            f.writelines(f"{mandarin}\t{cantonese}\n" for mandarin, cantonese in zip(MANDARIN, CANTONESE))
    with open(tmp_path / "cstsb.tsv", "w", encoding="utf-8") as f:
        f.write("sentence1\tsentence2\tscore\n")
        f.writelines(f"{a}\t{b}\t{i % 5 + 1}\n" for i, (a, b) in enumerate(zip(MANDARIN, MANDARIN[3:] + MANDARIN[:3])))
    with open(tmp_path / "simclue.jsonl", "w", encoding="utf-8") as f:
        for i, (a, b) in enumerate(zip(MANDARIN, CANTONESE)):
            f.write(json.dumps({"sentence1": a, "sentence2": b if i % 2 else MANDARIN[i - 1], "score": i % 2}) + "\n")
    output = tmp_path / "out"
    args = [
        "--model_name_or_path",
        str(encoder),
        "--fraternal_model_name_or_path",
        str(fraternal),
        "--train_file",
        str(tmp_path / "train.txt"),
        "--validation_file",
        str(tmp_path / "cstsb.tsv"),
        "--test_file",
        str(tmp_path / "simclue.jsonl"),
        "--sts_task_name",
        "cstsb",
        "--output_dir",
        str(output),
        "--max_steps",
        "4",
        "--per_device_train_batch_size",
        "4",
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--queue_size",
        "2",
    ]
    result = launch(args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads((output / "all_results.json").read_text())
    for key in ("init_eval_cstsb_spearman", "eval_cstsb_spearman", "init_test_cstsb_spearman", "test_cstsb_spearman"):
        assert -100.0 <= results[key] <= 100.0, key

    from ifcl.model import IFCLModel

    model = IFCLModel.from_pretrained(output)
    ids = model.tokenizer(MANDARIN[0])["input_ids"]
    assert model.tokenizer.unk_token_id not in ids and len(ids) == len(MANDARIN[0]) + 2  # one token per character

    cantonese_ids = model.fraternal_tokenizer(CANTONESE[1])["input_ids"]
    assert model.fraternal_tokenizer.unk_token_id not in cantonese_ids
    embeddings = model.encode(MANDARIN)
    assert embeddings.shape == (len(MANDARIN), 32) and torch.isfinite(embeddings).all()


# ---------------------------------------------------------------- bad input: stops before a model is loaded


def run_in_process(*args: str, tmp_path: Path) -> None:
    """Run with a model path that does not exist: any error must come before the model would be loaded."""
    run_ifcl.main(
        ["--model_name_or_path", str(tmp_path / "no-such-model"), "--output_dir", str(tmp_path / "out"), *args]
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--queue_size", "10", "--forgetting_rate", "0.1"], "forgetting_rate"),
        (["--fusion_rate", "1.2"], "fusion_rate"),
        (["--queue_size", "-1"], "queue_size"),
        (["--temperature", "0"], "temperature"),
        (["--pooler_type", "max"], "pooler_type"),
    ],
)
def test_impossible_settings_stop_before_anything_is_loaded(args, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run_in_process(*args, tmp_path=tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name, content, named",
    [
        ("bad.txt", "A sentence.\tEin Satz.\n\nNo tab on this line.\n", r"bad\.txt.*line 3"),  # a line without a tab
        ("bad.csv", "text,translation\nA sentence.,Ein Satz.\n", r"bad\.csv.*sentence.*text"),  # the columns found
    ],
)
def test_bad_training_file_is_named_with_its_line_or_columns(name, content, named, tmp_path, data_dir):
    train = tmp_path / name
    train.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=named):
        run_in_process("--train_file", str(train), "--validation_file", str(data_dir / "sts.tsv"), tmp_path=tmp_path)
    assert not (tmp_path / "out").exists()


def test_sts_score_that_is_not_a_number_names_file_and_line(tmp_path, data_dir):
    sts = tmp_path / "bad_sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\nA.\tB.\t3.0\nC.\tD.\thigh\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad_sts\.tsv.*line 3"):
        run_in_process("--train_file", str(data_dir / "train.txt"), "--validation_file", str(sts), tmp_path=tmp_path)


def test_missing_train_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        run_in_process("--train_file", str(tmp_path / "nothing.txt"), tmp_path=tmp_path)


def test_single_json_file_gives_all_arguments_over_the_embedded_defaults(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"max_steps": 7, "fusion_rate": 0.3, "output_dir": str(tmp_path / "o")}))
    arguments = run_ifcl.parse_arguments([str(path)])
    data_args, ifcl_args, training_args = arguments.data, arguments.ifcl, arguments.training
    assert training_args.max_steps == 7 and ifcl_args.fusion_rate == 0.3
    assert training_args.eval_steps == run_ifcl.TRAINING_DEFAULTS["eval_steps"]
    assert data_args.max_seq_length == 32
    # Flags after the file win: the resume command the script prints (``args.json --resume_from_checkpoint last``).
    arguments = run_ifcl.parse_arguments([str(path), "--fusion_rate", "0.4", "--resume_from_checkpoint", "last"])
    assert arguments.ifcl.fusion_rate == 0.4 and arguments.training.max_steps == 7
    assert arguments.training.resume_from_checkpoint == "last"


def test_push_to_hub_sends_the_finished_folder(tiny_encoder_dir, tiny_fraternal_dir, data_dir, tmp_path, monkeypatch):
    """The push uploads the output folder once everything is saved, without checkpoints; the Hub is mocked."""
    import huggingface_hub

    sent = {}

    def create_repo(self, repo_id, **kwargs):
        sent["repo_id"] = repo_id
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, repo_id, folder_path, ignore_patterns=None, **kwargs):
        import fnmatch

        files = []
        for path in Path(folder_path).rglob("*"):
            relative = path.relative_to(folder_path).as_posix()
            if path.is_file() and not any(fnmatch.fnmatch(relative, p) for p in ignore_patterns or []):
                files.append(relative)
        sent["files"] = sorted(files)
        return None

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    output = tmp_path / "out"
    args = tiny_args(tiny_encoder_dir, tiny_fraternal_dir, data_dir, output, "--max_steps", "3", "--eval_steps", "3")
    run_ifcl.main(
        [*args, "--save_steps", "3", "--push_to_hub", "--hub_model_id", "someone/ifcl-tiny", "--hub_token", "x"]
    )
    assert sent["repo_id"] == "someone/ifcl-tiny"
    files = sent["files"]
    for name in (
        "README.md",
        "config.json",
        "model.safetensors",
        "modeling_ifcl.py",
        "configuration_ifcl.py",
        "tokenizer.json",
        "fraternal_tokenizer/tokenizer.json",
        "modules.json",
        "all_results.json",
        "training_curves.png",
    ):
        assert name in files, name
    assert not any(name.startswith("checkpoint-") or name == "training_args.bin" for name in files)
    assert json.loads((output / "config.json").read_text())["auto_map"]["AutoModel"] == "modeling_ifcl.IFCLModel"
    assert "someone/ifcl-tiny" in (output / "README.md").read_text()


def test_push_to_hub_offline_keeps_everything_and_says_how_to_push_later(
    tiny_encoder_dir, tiny_fraternal_dir, data_dir, tmp_path, monkeypatch
):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    output = tmp_path / "out"
    args = tiny_args(
        tiny_encoder_dir, tiny_fraternal_dir, data_dir, output, "--max_steps", "2", "--eval_strategy", "no"
    )
    from ifcl.failures import RunFailure

    with pytest.raises(RunFailure, match="push it later with: hf upload someone/x"):
        run_ifcl.main([*args, "--load_best_model_at_end", "false", "--push_to_hub", "--hub_model_id", "someone/x"])
    assert (output / "all_results.json").is_file() and (output / "model.safetensors").is_file()


# ---------------------------------------------------------------- the model as the script loads it


def cased_lowercasing_base(tiny_encoder_dir: Path, folder: Path) -> Path:
    """The tiny encoder as a sentence-transformers model whose tokenizer keeps case but whose
    sentence_bert_config.json says ``do_lower_case`` (as older sentence-transformers models do)."""
    import shutil

    from tokenizers import normalizers
    from transformers import AutoTokenizer

    shutil.copytree(tiny_encoder_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_encoder_dir))
    tokenizer.backend_tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.save_pretrained(str(folder))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}', encoding="utf-8")
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 20, "do_lower_case": true}', "utf-8")
    return folder


def test_the_script_tokenizes_its_training_text_with_the_tokenizer_of_the_base(tiny_encoder_dir, tmp_path):
    """``StartingModel.load`` gives the tokenizer the base's lowercasing and truncation before the training text is tokenized,
    so the script trains on the tokens it evaluates and publishes with, as the Python API does; an IFCL folder
    continued takes its base's facts too."""
    from datasets import Dataset

    from ifcl.model import StartingModel
    from ifcl.objectives import build_objective
    from ifcl.pooling import read_base
    from ifcl.publishing import save_published

    base = cased_lowercasing_base(tiny_encoder_dir, tmp_path / "base")
    settings = {"queue_size": 2, "queue_batch_size": 4, "fraternal_loss_weight": 0.0, "twins_loss_weight": 0.0}
    model = StartingModel.read(str(base)).load(str(base), None, settings)
    text = Dataset.from_dict({"sentence": [sentence.upper() for sentence in ENGLISH[:4]]})
    features = build_objective(model).prepare(model, 4, text, on_the_fly=True)
    lowercased = model.tokenizer([sentence.lower() for sentence in ENGLISH[:4]])["input_ids"]
    assert [features[i]["input_ids"] for i in range(4)] == lowercased
    assert model.tokenizer.unk_token_id not in lowercased[0] and model.tokenizer.model_max_length == 20

    save_published(model, tmp_path / "published")
    folder = tmp_path / "published"
    continued = StartingModel.read(str(folder)).load(str(folder), None, settings)
    build_objective(continued).prepare(continued, 4)
    assert continued.sentence_transformers_base == read_base(str(folder))
    assert continued.tokenizer.model_max_length == 20
