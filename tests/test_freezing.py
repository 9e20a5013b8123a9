"""BEL_S and BEL_F frozen or trained (``freeze_word_embeddings``, ``freeze_fraternal_embeddings``: IFCL's settings,
applied by its objective when training starts), and the width-matching projection's starting scale."""

from __future__ import annotations

import pytest
import torch
from conftest import ENGLISH, GERMAN, build_tiny_bert, cpu_training_args
from datasets import Dataset
from transformers import AutoModel

from configuration_ifcl import IFCLConfig, IFCLSettings
from ifcl.model import IFCLModel
from ifcl.objectives import build_objective, fit_model
from trainer_ifcl import IFCLTrainer


def train_a_few_steps(model: IFCLModel, tmp_path, steps: int = 3) -> IFCLTrainer:
    """Train ``model`` on the English–German pairs as the Python API does: the trainer builds the objective, which
    freezes the tables before the optimizer is made."""
    args = cpu_training_args(
        tmp_path / "out", per_device_train_batch_size=4, max_steps=steps, learning_rate=1e-2, seed=0
    )
    trainer = IFCLTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict({"sentence": ENGLISH, "fraternal": GERMAN})
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("freeze_word, freeze_fraternal", [(True, True), (False, False), (True, False)])
def test_frozen_tables_keep_their_values_and_have_no_gradient_or_optimizer_state(
    tiny_encoder_dir, tiny_fraternal_dir, tmp_path, freeze_word, freeze_fraternal
):
    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir),
        str(tiny_fraternal_dir),
        queue_size=2,
        queue_batch_size=4,
        freeze_word_embeddings=freeze_word,
        freeze_fraternal_embeddings=freeze_fraternal,
    )
    word_before = model.get_input_embeddings().weight.detach().clone()
    fraternal_before = model.fraternal_embeddings.weight.detach().clone()
    projection_before = model.fraternal_projection.weight.detach().clone()
    trainer = train_a_few_steps(model, tmp_path)

    word, fraternal = model.get_input_embeddings().weight, model.fraternal_embeddings.weight
    assert torch.equal(word, word_before) == freeze_word
    assert torch.equal(fraternal, fraternal_before) == freeze_fraternal
    # The width-matching projection trains either way.
    assert not torch.equal(model.fraternal_projection.weight, projection_before)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    for table, frozen in ((word, freeze_word), (fraternal, freeze_fraternal)):
        assert table.requires_grad != frozen
        if frozen:  # (the Trainer sets trained parameters' gradients to None after each step as well)
            assert table.grad is None
        assert (id(table) in optimized) != frozen
        assert (table in trainer.optimizer.state) != frozen


def test_freeze_settings_round_trip_and_apply_to_a_loaded_model(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(
        str(tiny_encoder_dir), queue_size=0, freeze_word_embeddings=True, freeze_fraternal_embeddings=False
    )
    model.save_pretrained(tmp_path / "saved")
    config = IFCLConfig.from_pretrained(tmp_path / "saved")
    assert config.freeze_word_embeddings is True and config.freeze_fraternal_embeddings is False
    for loaded in (
        IFCLModel.from_pretrained(tmp_path / "saved"),
        AutoModel.from_pretrained(tmp_path / "saved", trust_remote_code=True),
    ):
        assert loaded.config.freeze_word_embeddings is True and loaded.config.freeze_fraternal_embeddings is False
        assert all(p.requires_grad for p in loaded.parameters())  # a loaded model trains all until IFCL prepares it
        build_objective(loaded).prepare(loaded, global_batch=4)
        assert not loaded.get_input_embeddings().weight.requires_grad
        assert loaded.fraternal_embeddings.weight.requires_grad
        assert all(p.requires_grad for n, p in loaded.encoder.named_parameters() if "word_embeddings" not in n)


def test_the_paper_freezes_both_tables_by_default_and_other_objectives_train_them(tiny_encoder_dir):
    assert IFCLSettings().freeze_word_embeddings and IFCLSettings().freeze_fraternal_embeddings
    assert IFCLConfig().freeze_word_embeddings and IFCLConfig().freeze_fraternal_embeddings
    model = IFCLModel.from_encoder(str(tiny_encoder_dir))
    fit_model(model)
    assert not model.get_input_embeddings().weight.requires_grad
    assert [n for n, p in model.named_parameters() if not p.requires_grad] == [
        "bert.embeddings.word_embeddings.weight"
    ]

    fitting = {"micse": {"micse_attention_layers": "top2"}}  # the tiny encoder has 2 layers
    for objective in ("simcse", "conisi", "pcl", "micse"):
        model = IFCLModel.from_encoder(
            str(tiny_encoder_dir), objective=objective, objective_settings=fitting.get(objective)
        )
        build_objective(model).prepare(model, global_batch=4)
        assert not model.config.freeze_word_embeddings and not model.config.freeze_fraternal_embeddings, objective
        assert all(p.requires_grad for p in model.parameters()), objective


@pytest.mark.parametrize("fraternal_scale", [0.01, 1.0, 300.0])
def test_projection_starts_at_the_scale_of_bel_s(tiny_encoder_dir, tmp_path, fraternal_scale):
    """Whatever the fraternal model's width and scale, the projected BEL_F starts with BEL_S's per-dimension std
    (within a factor of 2: by construction it is equal) and mean."""
    from safetensors.torch import load_file, save_file

    for width in (24, 48):  # narrower and wider than the encoder's 32
        folder = build_tiny_bert(tmp_path / f"fraternal{width}", GERMAN, hidden_size=width, seed=3)
        weights = load_file(folder / "model.safetensors")
        key = next(k for k in weights if k.endswith("word_embeddings.weight"))
        weights[key] = weights[key] * fraternal_scale + 0.5  # another scale, and an offset
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

        model = IFCLModel.from_encoder(str(tiny_encoder_dir), str(folder), queue_size=0)
        assert model.fraternal_projection.in_features == width
        source = model.get_input_embeddings().weight.detach()
        projected = model.fraternal_word_embeddings(torch.arange(model.fraternal_embeddings.num_embeddings)).detach()
        source_std = source.std(dim=0).pow(2).mean().sqrt()
        projected_std = projected.std(dim=0).pow(2).mean().sqrt()
        assert 0.5 < float(projected_std / source_std) < 2.0
        assert float(projected_std / source_std) == pytest.approx(1.0, rel=1e-3)
        assert torch.allclose(projected.mean(dim=0), source.mean(dim=0), atol=1e-4)
        # The projection is an orthogonal map up to its scale: it keeps the fraternal table's geometry.
        weight = model.fraternal_projection.weight.detach()
        gram = weight.T @ weight if width < 32 else weight @ weight.T
        assert torch.allclose(gram / gram.diagonal().mean(), torch.eye(gram.shape[0]), atol=1e-4)
