"""No code runs that the user did not trust: an IFCL folder's own ``.py`` files are never imported, unless the user
says ``trust_remote_code``; and a model folder with broken weights ends ``evaluate_sts.py`` in one line."""

from __future__ import annotations

import pytest
import torch
from conftest import run_script, write_sts_file
from safetensors.torch import load_file, save_file

from ifcl.model import IFCLModel

SENTINEL_CODE = "import pathlib; pathlib.Path({path!r}).write_text('ran')\n"


@pytest.fixture
def saved_model(tiny_encoder_dir, tmp_path):
    from ifcl.model import IFCLModel

    folder = tmp_path / "model"
    IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0).save_pretrained(folder)
    write_sts_file(tmp_path / "sts.tsv")
    return folder


def poison(folder, sentinel) -> None:
    """Make every ``.py`` file the folder carries write ``sentinel`` when imported."""
    for code in folder.glob("*.py"):
        code.write_text(SENTINEL_CODE.format(path=str(sentinel)) + code.read_text(encoding="utf-8"), encoding="utf-8")


@pytest.mark.slow
def test_an_edited_ifcl_folder_never_runs_its_code(saved_model, tmp_path):
    sentinel = tmp_path / "sentinel"
    poison(saved_model, sentinel)
    sts = str(tmp_path / "sts.tsv")
    result = run_script("evaluate_sts.py", "--model_name_or_path", str(saved_model), "--tasks", sts, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not sentinel.exists(), "evaluate_sts.py ran the folder's code"

    train = tmp_path / "train.txt"
    train.write_text("".join(f"Sentence number {i} is here.\tSatz Nummer {i} ist hier.\n" for i in range(16)))
    result = run_script(
        "run_ifcl.py",
        "--model_name_or_path",
        str(saved_model),
        "--train_file",
        str(train),
        "--validation_file",
        sts,
        "--test_file",
        sts,
        "--output_dir",
        str(tmp_path / "out"),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--queue_size",
        "0",
        "--max_seq_length",
        "16",
        "--use_cpu",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not sentinel.exists(), "run_ifcl.py ran the folder's code"


def test_without_remote_code_the_folder_loads_with_the_package_or_as_its_plain_encoder(saved_model, tmp_path):
    """IFCLModel.from_pretrained uses this package's classes; AutoModel without trust_remote_code reads the folder
    as the encoder it holds (config.json is the encoder's own config). Neither imports the folder's code."""
    from transformers import AutoModel

    import ifcl

    sentinel = tmp_path / "sentinel"
    poison(saved_model, sentinel)
    model = ifcl.IFCLModel.from_pretrained(saved_model)
    plain = AutoModel.from_pretrained(saved_model)
    assert type(model) is ifcl.IFCLModel and type(plain).__name__ == "BertModel"
    for name, tensor in plain.state_dict().items():
        if not name.startswith("pooler."):  # BERT's pooler head, which IFCL does not train
            assert torch.equal(tensor, model.encoder.state_dict()[name]), name
    assert not sentinel.exists()


@pytest.mark.slow
def test_nan_weights_are_named_by_evaluate_sts(saved_model, tmp_path):
    weights = saved_model / "model.safetensors"
    tensors = load_file(weights)
    name = next(key for key in tensors if key.endswith("embeddings.word_embeddings.weight"))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})
    result = run_script(
        "evaluate_sts.py", "--model_name_or_path", str(saved_model), "--tasks", str(tmp_path / "sts.tsv"), cwd=tmp_path
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "NaN or infinite embeddings for 12 of the 12 sentences of STS set 'sts'" in result.stderr, result.stderr


@pytest.mark.slow
def test_truncated_weights_end_evaluate_sts_in_one_line(saved_model, tmp_path):
    weights = saved_model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_script(
        "evaluate_sts.py", "--model_name_or_path", str(saved_model), "--tasks", str(tmp_path / "sts.tsv"), cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"{saved_model}: its weights cannot be read" in result.stderr, result.stderr


@pytest.fixture
def custom_code_dir(tiny_encoder_dir, tmp_path):
    """A plain encoder whose config names custom code (``auto_map``, a model type transformers does not know), in a
    ``.py`` file that writes ``tmp_path/marker`` when it runs."""
    import json
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(tiny_encoder_dir, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["model_type"] = "custom-bert"
    config["auto_map"] = {"AutoConfig": "custom.CustomConfig", "AutoModel": "custom.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "custom.py").write_text(
        SENTINEL_CODE.format(path=str(tmp_path / "marker"))
        + "from transformers import BertConfig, BertModel\n\n\n"
        + "class CustomConfig(BertConfig):\n    model_type = 'custom-bert'\n\n\n"
        + "class CustomModel(BertModel):\n    config_class = CustomConfig\n",
        encoding="utf-8",
    )
    return folder


def test_custom_code_runs_only_when_trusted_and_nothing_asks(custom_code_dir, saved_model, tmp_path, monkeypatch):
    """run_ifcl.py's reader and evaluate_sts.py's loader refuse a plain model's custom code in one line naming
    --trust_remote_code (for the fraternal model too), without a prompt; with the flag it runs; an IFCL folder's own
    code is never needed."""
    from types import SimpleNamespace

    from ifcl.checks import check_model_paths
    from ifcl.model import StartingModel
    from ifcl.pooling import BaseFolder
    from ifcl.sts.encoders import load_encoder

    monkeypatch.setattr("builtins.input", lambda *args: pytest.fail("a prompt was shown"))
    path = str(custom_code_dir)
    for load in (
        lambda: StartingModel.read(path),
        lambda: load_encoder(path, device="cpu"),
        lambda: check_model_paths(
            SimpleNamespace(
                model_name_or_path=str(saved_model), fraternal_model_name_or_path=path, trust_remote_code=False
            ),
            BaseFolder.read(str(saved_model)),
        ),
    ):
        with pytest.raises(ValueError, match="--trust_remote_code") as error:
            load()
        assert str(error.value).startswith(f"{path}/config.json names custom code") and "\n" not in str(error.value)
    assert not (tmp_path / "marker").exists()
    assert StartingModel.read(str(saved_model)).saved is not None  # an IFCL folder: the package's own class

    with pytest.raises(ValueError, match="--trust_remote_code") as error:  # the Python API, before any import
        IFCLModel.from_encoder(path)
    assert not (tmp_path / "marker").exists()

    # Trusted, its code runs, and the encoder is one to train like any other (run_ifcl.py and the Python API alike).
    assert StartingModel.read(path, trust_remote_code=True).encoder_config.model_type == "custom-bert"
    assert type(IFCLModel.from_encoder(path, trust_remote_code=True, queue_size=0).encoder).__name__ == "CustomModel"
    assert (tmp_path / "marker").exists(), "--trust_remote_code did not reach transformers"


@pytest.mark.slow
def test_a_yes_on_standard_input_runs_no_custom_code(custom_code_dir, tmp_path):
    """``echo y | python run_ifcl.py --model_name_or_path F``: no prompt takes the answer, F's code never runs, and the
    script ends in one line naming --trust_remote_code (evaluate_sts.py alike)."""
    write_sts_file(tmp_path / "sts.tsv")
    (tmp_path / "train.txt").write_text("".join(f"Sentence {i}.\tSatz {i}.\n" for i in range(16)), encoding="utf-8")
    sts = str(tmp_path / "sts.tsv")
    for script, args in (
        ("run_ifcl.py", ["--train_file", str(tmp_path / "train.txt"), "--validation_file", sts, "--test_file", sts]),
        ("evaluate_sts.py", ["--tasks", sts]),
    ):
        out = str(tmp_path / "out")
        command = [script, "--model_name_or_path", str(custom_code_dir), *args, "--output_dir", out]
        result = run_script(*command, cwd=tmp_path, input="y\n")
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.count("\n") == 1 and "--trust_remote_code" in result.stderr, result.stderr[-2000:]
        assert result.stderr.startswith(f"{script}: error: {custom_code_dir}/config.json names custom code")
        assert "[y/N]" not in result.stdout + result.stderr
        assert not (tmp_path / "marker").exists(), f"{script} ran the folder's code"
        assert not (tmp_path / "out").exists()
