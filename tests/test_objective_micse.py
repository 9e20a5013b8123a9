"""miCSE objective: L_D (attention mutual information) and L_C (InfoNCE with a momentum queue) against hand
computations, the sampling of attention positions, the queue, the EMA update, settings, and a tiny run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ENGLISH, objective_run_args, saved_weight_names

from ifcl import queue as ring
from ifcl.losses import info_nce
from ifcl.model import IFCLModel
from ifcl.objectives import build_objective, settings_as_dict
from ifcl.objectives.micse import (
    AttentionMutualInformationLoss,
    MiCSEObjective,
    MiCSESettings,
    attention_layer_indices,
    attention_slices,
    sample_attention_positions,
    valid_attention_positions,
)
from modeling_ifcl import QueueBuffers


def tiny_micse_model(encoder_dir: Path, **settings) -> IFCLModel:
    """A 2-layer, 2-head encoder with miCSE settings that fit it."""
    chosen = MiCSESettings(**{"micse_attention_layers": "top2", "micse_queue_size": 8, **settings})
    return IFCLModel.from_encoder(
        str(encoder_dir),
        objective="micse",
        objective_settings=settings_as_dict(chosen),
        pooler_type="cls",
        eval_pooler_type="cls_before_pooler",
    )


def made_up_attentions(batch: int, layers: int, heads: int, length: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, length, generator=generator).softmax(-1) for _ in range(layers)]


# ---------------------------------------------------------------------------------------------------- L_D


def test_attention_loss_matches_a_hand_computation():
    """Eq. 3–5 with fixed indices: slices = mean of adjacent head pairs of layers 2 and 3 (1-based), ρ = Pearson
    correlation of the log-attentions at the same positions in both views, MI = −½·log(1 − ρ²), loss −λ·mean."""
    batch, num_layers, heads, length = 2, 3, 4, 4
    view_1 = made_up_attentions(batch, num_layers, heads, length, seed=1)
    view_2 = made_up_attentions(batch, num_layers, heads, length, seed=2)
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    layers, group, weight = [1, 2], 2, 2.5e-3
    slices = len(layers) * heads // group
    # Sentence 0 may use all 16 positions, sentence 1 only query and key < 3: q·4 + k.
    allowed = [list(range(16)), [q * 4 + k for q in range(3) for k in range(3)]]
    generator = torch.Generator().manual_seed(3)
    draws = [torch.randint(len(positions), (slices, 7), generator=generator) for positions in allowed]
    indices = torch.stack([torch.tensor(positions)[drawn] for positions, drawn in zip(allowed, draws)])
    sample_mask = torch.ones_like(indices, dtype=torch.bool)
    sample_mask[1, 2, 4:] = False  # one slice counts only its first 4 samples

    loss_module = AttentionMutualInformationLoss(weight, layers, group, num_samples=7)
    loss, mean_mi = loss_module(view_1, view_2, attention_mask, indices, sample_mask)

    expected = []
    for b in range(batch):
        for r in range(slices):
            layer, head = layers[r // (heads // group)], group * (r % (heads // group))
            x = view_1[layer][b, head : head + group].double().mean(0).flatten().numpy()
            y = view_2[layer][b, head : head + group].double().mean(0).flatten().numpy()
            keep = indices[b, r][sample_mask[b, r]].numpy()
            rho = np.corrcoef(np.log(x[keep]), np.log(y[keep]))[0, 1]
            expected.append(-0.5 * math.log(1.0 - rho**2))
    assert mean_mi.item() == pytest.approx(np.mean(expected), rel=1e-5)
    assert loss.item() == pytest.approx(-weight * np.mean(expected), rel=1e-5)


def test_identical_views_give_the_bounded_maximum_and_gradients_stay_finite():
    attentions = [a.requires_grad_() for a in made_up_attentions(2, 2, 2, 5, seed=4)]
    loss_module = AttentionMutualInformationLoss(1.0, [0, 1], 2, num_samples=20, epsilon=1e-6)
    loss, mean_mi = loss_module(attentions, attentions, torch.ones(2, 5, dtype=torch.long))
    assert mean_mi.item() == pytest.approx(-0.5 * math.log(1e-6), rel=1e-4)
    loss.backward()
    assert all(torch.isfinite(a.grad).all() for a in attentions)


def test_slices_average_adjacent_heads_layer_by_layer():
    attentions = made_up_attentions(1, 3, 4, 3, seed=5)
    slices = attention_slices(attentions, [0, 2], heads_per_group=2)
    assert slices.shape == (1, 4, 3, 3)
    torch.testing.assert_close(slices[0, 1], attentions[0][0, 2:4].mean(0))
    torch.testing.assert_close(slices[0, 2], attentions[2][0, 0:2].mean(0))
    with pytest.raises(ValueError, match="micse_heads_per_group=3"):
        attention_slices(attentions, [0], heads_per_group=3)


def test_sampling_takes_only_the_non_padding_part_where_both_views_are_positive():
    attention_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    view_1 = torch.rand(2, 1, 4, 4) + 0.1
    view_2 = view_1.clone()
    view_2[0, 0, 1, 2] = 0.0  # an entry dropped by attention dropout in one view
    valid = valid_attention_positions(view_1, view_2, attention_mask)
    assert valid[0, 0].sum() == 15 and not valid[0, 0, 1 * 4 + 2]
    assert valid[1, 0].nonzero().flatten().tolist() == [0, 1, 4, 5]  # the 2×2 part of a 2-token sentence

    first = sample_attention_positions(valid, 150, True, torch.Generator().manual_seed(0))
    again = sample_attention_positions(valid, 150, True, torch.Generator().manual_seed(0))
    assert torch.equal(first[0], again[0]) and first[1].all()
    assert valid.gather(2, first[0]).all()  # every draw lies where Eq. 3 gives probability 1/s²
    counts = torch.bincount(first[0][1, 0], minlength=16)[[0, 1, 4, 5]]
    assert counts.sum() == 150 and counts.min() > 20  # about uniform over the 4 positions

    distinct, mask = sample_attention_positions(valid, 6, False, torch.Generator().manual_seed(0))
    assert len(set(distinct[0, 0].tolist())) == 6 and mask[0, 0].all()
    assert mask[1, 0].sum() == 4 and set(distinct[1, 0][mask[1, 0]].tolist()) == {0, 1, 4, 5}


# ---------------------------------------------------------------------------------------------------- L_C and Q


def test_contrastive_loss_with_queue_matches_a_hand_computation():
    generator = torch.Generator().manual_seed(6)
    first, second = torch.randn(3, 5, generator=generator), torch.randn(3, 5, generator=generator)
    queue = QueueBuffers(num_slots=4, slot_size=1, dim=5)  # Q: one momentum embedding per slot
    rows = torch.randn(2, 5, generator=generator)
    ring.push(queue, rows)  # two of four rows filled; the empty ones take no part
    stored, ages = ring.entries(queue)
    tau = 0.05
    loss = info_nce(first, second, tau, stored[ages > 0])  # L_C as miCSE computes it

    def d(u, v):
        return math.exp(torch.dot(u, v).item() / (u.norm() * v.norm()).item() / tau)

    expected = 0.0
    for i in range(3):
        denominator = sum(d(first[i], second[j]) for j in range(3)) + sum(d(first[i], q) for q in rows)
        expected -= math.log(d(first[i], second[i]) / denominator)
    assert loss.item() == pytest.approx(expected / 3, rel=1e-5)


def test_queue_pushes_in_order_and_overwrites_the_oldest():
    queue = QueueBuffers(num_slots=5, slot_size=1, dim=1)
    column = lambda *values: torch.tensor(values, dtype=torch.float).unsqueeze(1)  # noqa: E731
    ring.push(queue, column(0, 1, 2))
    assert ring.size(queue) == 3 and queue.head.item() == 2
    assert ring.entries(queue)[1].tolist() == [3, 2, 1, 0, 0]  # ages; 0: empty
    ring.push(queue, column(3, 4, 5))  # 5 overwrites 0, the oldest
    assert queue.embeddings.flatten().tolist() == [5, 1, 2, 3, 4]
    assert ring.size(queue) == 5 and queue.head.item() == 0 and (ring.entries(queue)[1] > 0).all()
    ring.push(queue, column(*range(6, 13)))  # more rows than the queue: the last 5, as if pushed one by one
    assert queue.embeddings.flatten().tolist() == [10, 11, 12, 8, 9] and queue.head.item() == 2


def test_momentum_encoder_follows_the_ema_formula(tiny_encoder_dir):
    model = tiny_micse_model(tiny_encoder_dir, micse_momentum=0.9)
    objective = build_objective(model)
    with torch.no_grad():
        for parameter in objective.momentum_encoder.parameters():
            parameter.normal_()
    before = {name: p.clone() for name, p in objective.momentum_encoder.named_parameters()}
    objective.on_step_end(model)
    online = dict(model.encoder.named_parameters())
    for name, parameter in objective.momentum_encoder.named_parameters():
        torch.testing.assert_close(parameter, 0.9 * before[name] + 0.1 * online[name].detach())
        assert not parameter.requires_grad


# ---------------------------------------------------------------------------------------------------- objective


def test_objective_reads_attentions_and_fills_its_queue(tiny_encoder_dir):
    model = tiny_micse_model(tiny_encoder_dir)
    objective = build_objective(model)
    model.training_objective = objective
    model.train()
    assert isinstance(objective, MiCSEObjective)
    assert model.encoder.config._attn_implementation == "eager"
    dropouts = [m.p for m in objective.momentum_encoder.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(p == 0.3 for p in dropouts)
    assert objective.momentum_encoder.config.hidden_dropout_prob == 0.3
    assert model.encoder.config.hidden_dropout_prob == 0.1  # the online encoder keeps its own

    inputs = dict(model.tokenizer(ENGLISH[:4], padding=True, return_tensors="pt"))
    encoded = model(**inputs, training_pooler=True, output_attentions=True)
    length = inputs["input_ids"].shape[1]
    assert len(encoded.attentions) == 2 and encoded.attentions[0].shape == (4, 2, length, length)

    output = objective(model, inputs)
    assert {"loss_contrastive", "loss_attention", "attention_mutual_information"} <= set(output.components)
    assert output.components["loss_attention"] < 0
    assert len(objective.pending_rows) == 1 and objective.pending_rows[0].shape == (4, model.hidden_size)
    output.loss.backward()
    assert model.encoder.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in objective.momentum_encoder.parameters())

    objective.on_step_end(model)  # the step's momentum embeddings enter the queue
    assert ring.size(objective.queue) == 4 and not objective.pending_rows
    # With 4 of its 8 rows filled, the queue's filled rows are the extra negatives, each weighing 1.
    model.eval()
    with torch.no_grad():
        without_dropout = objective(model, inputs).components["loss_contrastive"]
        views = model(**inputs, training_pooler=True).sentence_embedding
    stored, ages = ring.entries(objective.queue)
    expected = info_nce(views, views, model.config.contrastive_temperature, stored[ages > 0])
    torch.testing.assert_close(without_dropout, expected)
    model.train()
    state = model.state_dict()
    assert "training_objective.queue.embeddings" in state and "training_objective.queue.valid" in state
    assert any(key.startswith("training_objective.momentum_encoder.") for key in state)


def test_without_attention_weight_or_queue_it_is_simcse_plus_the_other_term(tiny_encoder_dir):
    model = tiny_micse_model(tiny_encoder_dir, micse_attention_weight=0.0, micse_queue_size=0)
    objective = build_objective(model)
    assert objective.momentum_encoder is None and objective.queue is None
    assert model.encoder.config._attn_implementation != "eager"  # nothing needs attention maps
    output = objective(model, dict(model.tokenizer(ENGLISH[:3], padding=True, return_tensors="pt")))
    assert set(output.components) == {"loss_contrastive"} and not objective.pending_rows


# ---------------------------------------------------------------------------------------------------- settings


def test_attention_layers_setting():
    assert attention_layer_indices("top4", 12) == [8, 9, 10, 11]
    assert attention_layer_indices("8-12", 12) == [7, 8, 9, 10, 11]
    assert attention_layer_indices("8, 10-12", 12) == [7, 9, 10, 11]
    assert attention_layer_indices("top2", 2) == [0, 1]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"micse_attention_weight": -1.0}, "micse_attention_weight"),
        ({"micse_attention_layers": "last4"}, "micse_attention_layers"),
        ({"micse_attention_layers": "0-3"}, "micse_attention_layers"),
        ({"micse_attention_layers": "top0"}, "micse_attention_layers"),
        ({"micse_heads_per_group": 0}, "micse_heads_per_group"),
        ({"micse_num_samples": 1}, "micse_num_samples"),
        ({"micse_queue_size": -1}, "micse_queue_size"),
        ({"micse_momentum": 1.5}, "micse_momentum"),
        ({"micse_momentum_dropout": 1.0}, "micse_momentum_dropout"),
    ],
)
def test_impossible_settings_are_rejected(settings, message):
    with pytest.raises(ValueError, match=message):
        MiCSESettings(**settings)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"micse_attention_layers": "top4"}, "top 4 layers, but the encoder has 2"),
        ({"micse_attention_layers": "2-3"}, "names layer\\(s\\) 3, but the encoder has 2"),
        ({"micse_heads_per_group": 3}, "micse_heads_per_group=3 does not divide"),
    ],
)
def test_layers_and_heads_the_encoder_lacks_are_rejected(tiny_encoder_dir, settings, message):
    model = tiny_micse_model(tiny_encoder_dir, **settings)
    with pytest.raises(ValueError, match=message):
        build_objective(model)


# ---------------------------------------------------------------------------------------------------- end to end


def test_tiny_run_end_to_end(tiny_encoder_dir, english_sts_data, tmp_path):
    import run_ifcl

    output = tmp_path / "out"
    settings = "--micse_attention_layers top2 --micse_queue_size 6 --micse_num_samples 20"
    poolers = "--pooler_type cls --eval_pooler_type cls_before_pooler"
    run_ifcl.main(
        objective_run_args(tiny_encoder_dir, english_sts_data, output, "micse", *settings.split(), *poolers.split())
    )

    results = json.loads((output / "all_results.json").read_text())
    assert math.isfinite(results["eval_stsb_spearman"])
    state = json.loads((output / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    wanted = {"loss_contrastive", "loss_attention", "attention_mutual_information"}
    assert logged and all(wanted <= set(entry) for entry in logged)
    assert not any(key.startswith("training_objective.") for key in saved_weight_names(output))
    config = json.loads((output / "config.json").read_text())["ifcl"]
    assert config["objective"] == "micse" and config["objective_settings"]["micse_queue_size"] == 6
