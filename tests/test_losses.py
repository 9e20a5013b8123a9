"""Each IFCL loss term and Eq. 4's forgetting coefficients against values computed by hand (plain ``math``) from
small hand-made vectors."""

from __future__ import annotations

import math

import pytest
import torch

from ifcl.losses import FraternalTwinsLoss, IdenticalTwinsLoss, IFCLTerms, TwinsLoss, forgetting_coefficients
from modeling_ifcl import IFCLTwinsOutput

TAU = 0.5

# Three sentences in 2-D, chosen so that cosine similarities are easy to read off.
ANCHOR = [[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]
IDENTICAL = [[2.0, 0.0], [1.0, 1.0], [0.0, -1.0]]
FRATERNAL = [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]]
QUEUE = [[-1.0, 0.0], [0.0, 1.0]]  # H_1 (newest), H_2
QUEUE_WEIGHTS = [0.9, 0.6]  # p_1, p_2


def cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def hand_info_nce(anchors, positives, tau, queue=(), weights=(), offset=0) -> float:
    """−(1/N) Σ_i log( e^{s_ii/τ} / (Σ_j e^{s_ij/τ} + Σ_m p_m e^{sim(h_i,H_m)/τ}) ), written out; anchor i's
    positive is candidate ``offset + i``."""
    total = 0.0
    for i, anchor in enumerate(anchors):
        numerator = math.exp(cos(anchor, positives[offset + i]) / tau)
        denominator = sum(math.exp(cos(anchor, positive) / tau) for positive in positives)
        denominator += sum(p * math.exp(cos(anchor, h) / tau) for h, p in zip(queue, weights))
        total += -math.log(numerator / denominator)
    return total / len(anchors)


def hand_twins(anchors, identical, fraternal, emb, emb_plus, emb_minus) -> float:
    total = 0.0
    for i in range(len(anchors)):
        margin = math.exp(cos(emb[i], emb_plus[i])) - math.exp(cos(emb[i], emb_minus[i]))
        gap = math.exp(cos(anchors[i], identical[i])) - math.exp(cos(anchors[i], fraternal[i]))
        total += abs(gap - margin)
    return total / len(anchors)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_identical_loss_without_queue_is_in_batch_info_nce():
    loss = IdenticalTwinsLoss(TAU)(t(ANCHOR), t(IDENTICAL))
    assert loss.item() == pytest.approx(hand_info_nce(ANCHOR, IDENTICAL, TAU), rel=1e-5)


def test_identical_loss_weights_queue_negatives_by_forgetting_coefficients():
    log_weights = torch.tensor(QUEUE_WEIGHTS).log()
    loss = IdenticalTwinsLoss(TAU)(t(ANCHOR), t(IDENTICAL), t(QUEUE), log_weights)
    expected = hand_info_nce(ANCHOR, IDENTICAL, TAU, QUEUE, QUEUE_WEIGHTS)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # The weights matter: unweighted queue negatives give another value.
    unweighted = hand_info_nce(ANCHOR, IDENTICAL, TAU, QUEUE, [1.0, 1.0])
    assert abs(expected - unweighted) > 1e-3


def test_forgetting_coefficients_are_eq4_by_age_and_zero_for_empty_entries():
    """p_m = 1 − λ·⌈m/N⌉ with ⌈m/N⌉ the entry's age in optimizer steps; age 0 marks an empty entry."""
    ages = torch.tensor([1, 2, 3, 0, 1])
    coefficients = forgetting_coefficients(ages, 0.2)
    assert coefficients.tolist() == pytest.approx([1 - 0.2 * 1, 1 - 0.2 * 2, 1 - 0.2 * 3, 0.0, 1 - 0.2 * 1])
    assert forgetting_coefficients(ages, 0.0).tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]  # λ = 0: no forgetting


def test_empty_queue_entries_take_no_part():
    """An empty entry's coefficient is 0, so its log weight −inf removes it from the denominator."""
    log_weights = forgetting_coefficients(torch.tensor([1, 0]), 0.1).log()
    loss = IdenticalTwinsLoss(TAU)(t(ANCHOR), t(IDENTICAL), t(QUEUE), log_weights)
    expected = hand_info_nce(ANCHOR, IDENTICAL, TAU, QUEUE[:1], [0.9])
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_fraternal_loss_is_in_batch_info_nce_against_fraternal_twins():
    loss = FraternalTwinsLoss(TAU)(t(ANCHOR), t(FRATERNAL))
    assert loss.item() == pytest.approx(hand_info_nce(ANCHOR, FRATERNAL, TAU), rel=1e-5)


def test_twins_loss_with_innate_margin():
    emb = [[1.0, 2.0], [2.0, 1.0], [1.0, -1.0]]
    emb_plus = [[1.0, 1.0], [2.0, 2.0], [1.0, 0.0]]
    emb_minus = [[0.0, 1.0], [-1.0, 1.0], [1.0, 1.0]]
    loss = TwinsLoss()(t(ANCHOR), t(IDENTICAL), t(FRATERNAL), t(emb), t(emb_plus), t(emb_minus))
    expected = hand_twins(ANCHOR, IDENTICAL, FRATERNAL, emb, emb_plus, emb_minus)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_twins_margin_carries_no_gradient():
    emb = t([[1.0, 2.0], [2.0, 1.0], [1.0, -1.0]]).requires_grad_()
    anchor = t(ANCHOR).requires_grad_()
    loss = TwinsLoss()(anchor, t(IDENTICAL), t(FRATERNAL), emb, t(FRATERNAL), t(IDENTICAL))
    loss.backward()
    assert emb.grad is None
    assert anchor.grad is not None and anchor.grad.abs().sum() > 0


def three_twins(anchor_embedding_output: list[list[float]]) -> IFCLTwinsOutput:
    """The test's three twins, with the twins' embedding-layer outputs as ``TwinsLoss`` takes them."""
    return IFCLTwinsOutput(
        anchor=t(ANCHOR),
        identical=t(IDENTICAL),
        fraternal=t(FRATERNAL),
        anchor_embedding_output=t(anchor_embedding_output),
        identical_embedding_output=t(IDENTICAL),
        fraternal_embedding_output=t(FRATERNAL),
    )


def test_total_is_weighted_sum_of_terms_and_logs_each():
    emb = [[1.0, 2.0], [2.0, 1.0], [1.0, -1.0]]
    twins = three_twins(anchor_embedding_output=emb)
    ages = torch.tensor([1, 4])  # H_1 one step old, H_2 four: with λ = 0.1, p = 0.9 and 0.6
    total, parts = IFCLTerms(TAU, fraternal_loss_weight=0.5, twins_loss_weight=2.0)(
        twins, t(QUEUE), forgetting_coefficients(ages, 0.1).log()
    )
    identical = hand_info_nce(ANCHOR, IDENTICAL, TAU, QUEUE, QUEUE_WEIGHTS)
    fraternal = hand_info_nce(ANCHOR, FRATERNAL, TAU)
    twins_term = hand_twins(ANCHOR, IDENTICAL, FRATERNAL, emb, IDENTICAL, FRATERNAL)
    assert parts["loss_identical"].item() == pytest.approx(identical, rel=1e-5)
    assert parts["loss_fraternal"].item() == pytest.approx(fraternal, rel=1e-5)
    assert parts["loss_twins"].item() == pytest.approx(twins_term, rel=1e-5)
    assert total.item() == pytest.approx(identical + 0.5 * fraternal + 2.0 * twins_term, rel=1e-5)
    assert not any(part.requires_grad for part in parts.values())  # logged values, detached


def test_candidates_of_other_processes_join_the_in_batch_negatives():
    """With several processes the twins of all of them are the candidates, this process's starting at the offset."""
    others_identical, others_fraternal = [[1.0, -1.0], [2.0, 1.0]], [[0.0, -1.0], [-1.0, 1.0]]
    twins = three_twins(anchor_embedding_output=ANCHOR)
    terms = IFCLTerms(TAU, twins_loss_weight=0.0).terms(
        twins,
        identical_candidates=t(others_identical + IDENTICAL),
        fraternal_candidates=t(others_fraternal + FRATERNAL),
        label_offset=2,
    )
    assert set(terms) == {"loss_identical", "loss_fraternal"}
    identical = hand_info_nce(ANCHOR, others_identical + IDENTICAL, TAU, offset=2)
    fraternal = hand_info_nce(ANCHOR, others_fraternal + FRATERNAL, TAU, offset=2)
    assert terms["loss_identical"].item() == pytest.approx(identical, rel=1e-5)
    assert terms["loss_fraternal"].item() == pytest.approx(fraternal, rel=1e-5)


def test_simcse_ablation_computes_only_the_identical_term():
    twins = IFCLTwinsOutput(anchor=t(ANCHOR), identical=t(IDENTICAL))
    total, parts = IFCLTerms(TAU, fraternal_loss_weight=0.0, twins_loss_weight=0.0)(twins)
    assert set(parts) == {"loss_identical"}
    assert total.item() == pytest.approx(hand_info_nce(ANCHOR, IDENTICAL, TAU), rel=1e-5)


def test_loss_is_float32_under_bf16_autocast():
    anchor = t(ANCHOR).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = IdenticalTwinsLoss(TAU)(anchor, t(IDENTICAL).to(torch.bfloat16))
    assert loss.dtype == torch.float32
    rounded = [[float(x) for x in row] for row in anchor.float().tolist()]
    assert loss.item() == pytest.approx(hand_info_nce(rounded, IDENTICAL, TAU), rel=1e-4)


# The same sentences in 3-D: their first two dimensions are the 2-D vectors above, the third is made up.
ANCHOR_3D = [[1.0, 0.0, 2.0], [0.0, 2.0, -1.0], [3.0, 3.0, 0.5]]
IDENTICAL_3D = [[2.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, -1.0, 3.0]]
FRATERNAL_3D = [[1.0, 1.0, -2.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
QUEUE_3D = [[-1.0, 0.0, 1.0], [0.0, 1.0, 2.0]]


def test_matryoshka_sums_each_contrastive_term_over_the_cut_embeddings():
    """Σ_d w_d · ℓ(h[:, :d]) for ℓ^I (the queue's rows cut alike) and ℓ^F, by hand at d = 3 and d = 2; ℓ^T keeps the
    full size (its margin is the embedding layer's) and is weighted by Σ_d w_d = 1.5, as the other terms are."""
    from ifcl.losses import Matryoshka, info_nce

    sizes = Matryoshka(dims=(3, 2), weights=(1.0, 0.5))

    def cut(rows, d):
        return [row[:d] for row in rows]

    def by_hand(anchors, positives, queue=(), weights=()):
        return sum(
            w * hand_info_nce(cut(anchors, d), cut(positives, d), TAU, cut(queue, d), weights)
            for d, w in ((3, 1.0), (2, 0.5))
        )

    log_weights = torch.tensor(QUEUE_WEIGHTS).log()
    got = info_nce(torch.tensor(ANCHOR_3D), torch.tensor(IDENTICAL_3D), TAU, torch.tensor(QUEUE_3D), log_weights)
    assert got.item() == pytest.approx(hand_info_nce(ANCHOR_3D, IDENTICAL_3D, TAU, QUEUE_3D, QUEUE_WEIGHTS), rel=1e-5)
    twins = IFCLTwinsOutput(
        anchor=torch.tensor(ANCHOR_3D),
        identical=torch.tensor(IDENTICAL_3D),
        fraternal=torch.tensor(FRATERNAL_3D),
        anchor_embedding_output=torch.tensor(ANCHOR),
        identical_embedding_output=torch.tensor(IDENTICAL),
        fraternal_embedding_output=torch.tensor(FRATERNAL),
    )
    plain = IFCLTerms(TAU).terms(twins, torch.tensor(QUEUE_3D), log_weights)
    terms = IFCLTerms(TAU, matryoshka=sizes).terms(twins, torch.tensor(QUEUE_3D), log_weights)
    assert terms["loss_identical"].item() == pytest.approx(by_hand(ANCHOR_3D, IDENTICAL_3D, QUEUE_3D, QUEUE_WEIGHTS))
    assert terms["loss_fraternal"].item() == pytest.approx(by_hand(ANCHOR_3D, FRATERNAL_3D))
    assert terms["loss_twins"].item() == pytest.approx(1.5 * plain["loss_twins"].item())  # not cut
    assert terms["loss_identical"].item() != pytest.approx(plain["loss_identical"].item())


def test_matryoshka_sizes_are_checked_with_the_settings():
    from configuration_ifcl import SharedSettings

    assert SharedSettings(matryoshka_dims=[4, 2]).matryoshka_dims == [4, 2]
    for dims, weights, named in [
        ([0], [], "matryoshka_dims"),
        ([4, 4], [], "matryoshka_dims"),
        ([4, 2], [1.0], "matryoshka_weights"),
    ]:
        with pytest.raises(ValueError, match=named):
            SharedSettings(matryoshka_dims=dims, matryoshka_weights=weights)
