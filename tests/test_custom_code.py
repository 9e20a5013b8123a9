"""Encoders that ship their own code (nomic-embed, jina, gte): trained with ``--trust_remote_code`` as any other, and
published with that code beside IFCL's, so that the folder loads offline in every loader with its base gone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    ENGLISH,
    GERMAN,
    build_own_code_encoder,
    launch,
    objective_run_args,
    run_script,
    st_training_args,
    stopped_in_step,
)

import run_ifcl
from ifcl.failures import Interrupted
from ifcl.model import IFCLModel

CODE_FILES = ("configuration_mybert.py", "modeling_mybert.py")
LOCAL_CODE = {"AutoConfig": "configuration_mybert.MyBertConfig", "AutoModel": "modeling_mybert.MyBertModel"}
LOADERS = """
import json, sys
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel
from ifcl import IFCLModel

folder, sentences = sys.argv[1], json.loads(sys.argv[2])
rows = {
    "AutoModel": AutoModel.from_pretrained(folder, trust_remote_code=True).encode(sentences),
    "IFCLModel": IFCLModel.from_pretrained(folder, trust_remote_code=True).encode(sentences),
    "SentenceTransformer": SentenceTransformer(folder, trust_remote_code=True, device="cpu").encode(
        sentences, convert_to_tensor=True
    ),
}
print(json.dumps({name: embeddings.tolist() for name, embeddings in rows.items()}))
"""


def load_offline_elsewhere(folder: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """``folder``'s embeddings of four sentences through the three loaders, in a fresh process, offline, with an empty
    transformers modules cache (its HOME is ``tmp_path``'s new folder, as on another machine)."""
    (tmp_path / "elsewhere").mkdir()
    script = tmp_path / "elsewhere" / "load_three_ways.py"
    script.write_text(LOADERS, encoding="utf-8")
    result = run_script(str(script), str(folder), json.dumps(ENGLISH[:4]), cwd=tmp_path / "elsewhere")
    assert result.returncode == 0, result.stderr[-3000:]
    return {name: torch.tensor(rows) for name, rows in json.loads(result.stdout.splitlines()[-1]).items()}


@pytest.fixture(params=["own folder", "another repository", "sentence-transformers folder"])
def own_code_base(request, tmp_path) -> tuple[Path, Path | None]:
    """The base, and the folder its auto_map points at when that is another one (None: its own). As gte v1.5 ships,
    the sentence-transformers folder adds modules.json with a CLS Pooling module of its own."""
    code = tmp_path / "code" if request.param == "another repository" else None
    base = build_own_code_encoder(tmp_path / "base", ENGLISH + GERMAN, code)
    if request.param == "sentence-transformers folder":
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        (base / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
        (base / "1_Pooling").mkdir()
        pooling = {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
        (base / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    return base, code


@pytest.mark.slow
def test_an_encoder_with_its_own_code_trains_and_its_folder_loads_offline_without_its_base(
    own_code_base, pairs_data, tmp_path
):
    """``run_ifcl.py --trust_remote_code`` trains it (IFCL, a checkpoint, an interrupted run resumed); the published
    folder and each checkpoint carry its code with an auto_map that resolves inside the folder, and its card says so;
    with the base (and the repository its code came from) gone and an empty modules cache, AutoModel, IFCLModel and
    SentenceTransformer load it in another process and embed alike. Without trust_remote_code, the package's loader
    refuses it in one line."""
    base, code = own_code_base
    output = tmp_path / "run"
    args = objective_run_args(base, pairs_data, output, "ifcl", "--trust_remote_code", max_steps=4)
    with stopped_in_step(3), pytest.raises(Interrupted):
        run_ifcl.main(args)
    run_ifcl.main([*args, "--resume_from_checkpoint", "last"])
    for folder in (output, *output.glob("checkpoint-*")):
        assert all((folder / name).is_file() for name in (*CODE_FILES, "modeling_ifcl.py")), sorted(os.listdir(folder))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        assert config["ifcl"]["encoder_code"] == LOCAL_CODE and config["model_type"] == "mybert"
        assert config["auto_map"] == {
            "AutoConfig": "configuration_ifcl.IFCLConfig",
            "AutoModel": "modeling_ifcl.IFCLModel",
        }
        own_pooler = "cls_before_pooler" if (base / "modules.json").exists() else "avg"  # the base's own pooling kept
        assert config["ifcl"]["eval_pooler_type"] == own_pooler
    card = (output / "README.md").read_text(encoding="utf-8")
    assert "The encoder runs its own code: `configuration_mybert.py`, `modeling_mybert.py`, copied into" in card
    assert f'SentenceTransformer("<user>/{output.name}", trust_remote_code=True)' in card
    expected = IFCLModel.from_pretrained(str(output), trust_remote_code=True).encode(ENGLISH[:4])
    shutil.rmtree(base)
    if code is not None:
        shutil.rmtree(code)
    for name, embeddings in load_offline_elsewhere(output, tmp_path).items():
        torch.testing.assert_close(embeddings, expected, atol=1e-5, rtol=0, msg=name)
    with pytest.raises(ValueError, match="its encoder runs its own code .* only with trust_remote_code=True") as error:
        IFCLModel.from_pretrained(str(output))
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_a_published_folder_with_its_own_code_continues_training_only_when_trusted(
    own_code_base, pairs_data, tmp_path
):
    """Continuing a published IFCL folder whose encoder has its own code: one line naming --trust_remote_code
    without the flag, before any weights load; trained further with it."""
    from ifcl.publishing import save_published

    base, _ = own_code_base
    published = tmp_path / "published"
    save_published(IFCLModel.from_encoder(str(base), trust_remote_code=True, queue_size=2), str(published))
    args = objective_run_args(published, pairs_data, tmp_path / "more", "ifcl", "--queue_size", "2", max_steps=2)
    with pytest.raises(ValueError, match="its encoder runs its own code .*--trust_remote_code") as error:
        run_ifcl.main(args)
    assert "\n" not in str(error.value)
    trainer, _ = run_ifcl.main([*args, "--trust_remote_code"])
    assert type(trainer.model.encoder).__name__ == "MyBertModel"
    assert all((tmp_path / "more" / name).is_file() for name in CODE_FILES)
    checkpoint = next((tmp_path / "more").glob("checkpoint-*"))  # a checkpoint as the model to start from
    again = objective_run_args(checkpoint, pairs_data, tmp_path / "again", "ifcl", "--queue_size", "2", max_steps=2)
    trainer, _ = run_ifcl.main([*again, "--trust_remote_code"])
    assert type(trainer.model.encoder).__name__ == "MyBertModel"


@pytest.mark.slow
def test_ifcl_loss_trains_an_encoder_with_its_own_code(own_code_base, tmp_path):
    """The sentence-transformers route: ``SentenceTransformer(base, trust_remote_code=True)`` with ``IFCLLoss``
    trains, and the saved model loads offline with its base gone, embedding as it did."""
    pytest.importorskip("sentence_transformers")
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer

    from ifcl import IFCLLoss

    base, code = own_code_base
    model = SentenceTransformer(str(base), trust_remote_code=True, device="cpu")
    loss = IFCLLoss(model, queue_size=0)
    train = Dataset.from_dict({"sentence": ENGLISH[:8], "fraternal": GERMAN[:8]})
    args = st_training_args(tmp_path / "st-run", max_steps=2, per_device_train_batch_size=4)
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=train, loss=loss, data_collator=loss.data_collator(train)
    )
    trainer.train()
    model.save(str(tmp_path / "st"))
    expected = model.encode(ENGLISH[:4], convert_to_tensor=True)
    shutil.rmtree(base)
    if code is not None:
        shutil.rmtree(code)
    loaded = SentenceTransformer(str(tmp_path / "st"), trust_remote_code=True, device="cpu")
    torch.testing.assert_close(loaded.encode(ENGLISH[:4], convert_to_tensor=True), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["ifcl", "simcse", "pcl"])
def test_an_encoder_with_its_own_code_trains_with_lora_sizes_and_the_gradient_cache(objective, pairs_data, tmp_path):
    """Every route of training reaches such an encoder: LoRA adapters in its own layers, Matryoshka sizes and the
    gradient cache, with IFCL and its peers; the published folder holds the adapters merged and loads with its code."""
    pytest.importorskip("peft")
    base = build_own_code_encoder(tmp_path / "base", ENGLISH + GERMAN)
    extra = ["--trust_remote_code", "--lora_r", "4", "--matryoshka_dims", "32", "16", "--cache_mini_batch_size", "2"]
    trainer, _ = run_ifcl.main(objective_run_args(base, pairs_data, tmp_path / "run", objective, *extra, max_steps=2))
    assert type(trainer.model.encoder).__name__ == "MyBertModel"
    expected = trainer.model.encode(ENGLISH[:4])
    loaded = IFCLModel.from_pretrained(str(tmp_path / "run"), trust_remote_code=True)
    assert not [name for name, _ in loaded.named_parameters() if "lora_" in name]
    torch.testing.assert_close(loaded.encode(ENGLISH[:4]), expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_an_encoder_with_its_own_code_trains_in_two_processes(pairs_data, tmp_path, monkeypatch):
    """``accelerate launch --num_processes 2 run_ifcl.py --trust_remote_code``: both processes import the encoder's
    code into an empty modules cache at once, train it with gathered candidates, and the published folder carries
    the code and loads through AutoModel and IFCLModel alike."""
    from transformers import AutoModel

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))  # empty, as on a fresh machine
    base = build_own_code_encoder(tmp_path / "base", ENGLISH + GERMAN)
    output = tmp_path / "run"
    result = launch([*objective_run_args(base, pairs_data, output, "ifcl", "--trust_remote_code")], processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all((output / name).is_file() for name in (*CODE_FILES, "modeling_ifcl.py"))
    state = json.loads((output / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["global_step"] == 4
    trained = IFCLModel.from_pretrained(str(output), trust_remote_code=True)
    assert type(trained.encoder).__name__ == "MyBertModel"
    expected = trained.encode(ENGLISH[:4])
    loaded = AutoModel.from_pretrained(str(output), trust_remote_code=True).encode(ENGLISH[:4])
    torch.testing.assert_close(loaded, expected, atol=1e-5, rtol=0)
