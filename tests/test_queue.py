"""The hippocampus queue against its specification (the paper's Section 3.2, Eq. 4: p_m = 1 − λ·⌈m/N⌉), and the
ring buffer under it (``ifcl.queue`` over ``modeling_ifcl.QueueBuffers``)."""

from __future__ import annotations

import math

import pytest
import torch

from configuration_ifcl import IFCLConfig, IFCLSettings, SharedSettings
from ifcl import queue as ring
from ifcl.losses import forgetting_coefficients
from modeling_ifcl import QueueBuffers

N, K, DIM, LAMBDA = 3, 2, 4, 0.2


def batch(value: float, rows: int = N) -> torch.Tensor:
    """Rows that tell which push they came from: every entry of push v is v, v+0.1, v+0.2, ..."""
    return torch.tensor([[value + 0.1 * r] * DIM for r in range(rows)])


def column(*values: float) -> torch.Tensor:
    """One-wide rows holding ``values``."""
    return torch.tensor(values, dtype=torch.float).unsqueeze(1)


def test_newest_first_with_coefficient_by_age():
    queue = QueueBuffers(K, N, DIM)
    ring.push(queue, batch(1.0))
    ring.push(queue, batch(2.0))
    rows, ages = ring.newest_first(queue)
    assert torch.equal(rows, torch.cat([batch(2.0), batch(1.0)]))
    assert ages.tolist() == [1, 1, 1, 2, 2, 2]
    # p_m = 1 − λ·⌈m/N⌉ for m = 1..k·N, written out by hand.
    expected = [1 - LAMBDA * math.ceil(m / N) for m in range(1, K * N + 1)]
    assert forgetting_coefficients(ages, LAMBDA).tolist() == pytest.approx(expected)
    assert forgetting_coefficients(ages, LAMBDA).tolist() == pytest.approx([0.8, 0.8, 0.8, 0.6, 0.6, 0.6])


def test_oldest_batch_drops_out():
    queue = QueueBuffers(K, N, DIM)
    for value in (1.0, 2.0, 3.0):
        ring.push(queue, batch(value))
    rows, ages = ring.newest_first(queue)
    assert torch.equal(rows, torch.cat([batch(3.0), batch(2.0)]))
    assert ages.tolist() == [1, 1, 1, 2, 2, 2]
    assert ring.size(queue) == K * N


def test_empty_slots_take_no_part():
    queue = QueueBuffers(3, N, DIM)
    assert ring.size(queue) == 0 and ring.newest_first(queue)[0].shape == (0, DIM)
    ring.push(queue, batch(1.0))
    rows, ages = ring.entries(queue)
    assert rows.shape == (3 * N, DIM) and ages.shape == (3 * N,)
    filled = ages > 0
    assert int(filled.sum()) == N == ring.size(queue)
    assert torch.equal(rows[filled], batch(1.0))
    coefficients = forgetting_coefficients(ages, LAMBDA)
    assert coefficients[filled].tolist() == pytest.approx([1 - LAMBDA] * N)
    assert coefficients[~filled].tolist() == [0.0] * (2 * N)
    assert ring.size(None) == 0  # k = 0: no queue


def test_short_batch_fills_only_its_rows():
    queue = QueueBuffers(K, N, DIM)
    ring.push(queue, batch(1.0))
    ring.push(queue, batch(2.0, rows=1))
    rows, ages = ring.newest_first(queue)
    assert torch.equal(rows, torch.cat([batch(2.0, rows=1), batch(1.0)]))
    assert forgetting_coefficients(ages, LAMBDA).tolist() == pytest.approx([0.8, 0.6, 0.6, 0.6])
    # The short batch's slot, overwritten later by a full one, is whole again.
    ring.push(queue, batch(3.0))
    ring.push(queue, batch(4.0))
    assert torch.equal(ring.newest_first(queue)[0], torch.cat([batch(4.0), batch(3.0)]))


def test_negatives_are_the_entries_with_the_log_of_eq4_weights():
    """What every loss reads (IFCL's objective, IFCLLoss, miCSE): all rows, and log p_m by age; −inf for an empty
    row. With λ = 0 (miCSE's queue) every filled row weighs 1: log 0."""
    queue = QueueBuffers(3, N, DIM)
    ring.push(queue, batch(1.0))
    ring.push(queue, batch(2.0))
    rows, log_weights = ring.negatives(queue, LAMBDA)
    stored, ages = ring.entries(queue)
    assert torch.equal(rows, stored) and rows.data_ptr() == queue.embeddings.data_ptr()  # no copy
    assert log_weights.tolist() == pytest.approx(forgetting_coefficients(ages, LAMBDA).log().tolist())
    by_age = {1: math.log(1 - LAMBDA), 2: math.log(1 - 2 * LAMBDA), 0: -math.inf}
    assert log_weights.tolist() == pytest.approx([by_age[age] for age in ages.tolist()])
    _, unweighted = ring.negatives(queue)
    assert unweighted.dtype == torch.float32
    assert torch.equal(unweighted, torch.zeros(3 * N).masked_fill(ages == 0, -math.inf))


def test_entries_match_newest_first_as_sets():
    """The losses read the entries in storage order: the same rows with the same ages as the paper's order."""
    queue = QueueBuffers(K, N, DIM)
    for value in (1.0, 2.0, 3.0):
        ring.push(queue, batch(value))
    rows, ages = ring.entries(queue)
    stored = sorted(zip(rows[:, 0].tolist(), ages.tolist()))
    ordered_rows, ordered_ages = ring.newest_first(queue)
    assert stored == sorted(zip(ordered_rows[:, 0].tolist(), ordered_ages.tolist()))


@pytest.mark.parametrize("k, lam", [(10, 0.1), (4, 0.25), (2, 0.6)])
def test_settings_with_a_non_positive_weight_are_rejected(k, lam):
    for settings in (IFCLSettings, IFCLConfig):
        with pytest.raises(ValueError, match="forgetting_rate"):
            settings(queue_size=k, forgetting_rate=lam)


@pytest.mark.parametrize("k", [1, 2, 4, 10])
def test_a_forgetting_rate_just_below_one_over_k_is_accepted_and_weighs_every_entry(k):
    """The boundary of λ·k < 1: just below it the oldest entry still weighs p = 1 − λ·k > 0; at it, refused."""
    lam = (1 - 1e-3) / k
    assert IFCLConfig(queue_size=k, forgetting_rate=lam).forgetting_rate == lam
    queue = QueueBuffers(k, 1, 1)
    ring.push(queue, column(*range(k)))
    coefficients = forgetting_coefficients(ring.newest_first(queue)[1], lam)
    assert coefficients[-1].item() == pytest.approx(1e-3, rel=1e-3)  # the oldest, p_k = 1 − λ·k
    assert coefficients.min() > 0 and coefficients.argmin() == k - 1
    with pytest.raises(ValueError, match="forgetting_rate"):
        IFCLSettings(queue_size=k, forgetting_rate=1 / k)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"fusion_rate": 1.5}, "fusion_rate"),
        ({"fusion_rate": -0.1}, "fusion_rate"),
        ({"fusion_rate": float("nan")}, "fusion_rate"),
        ({"queue_size": -1}, "queue_size"),
        ({"twins_loss_weight": -1.0}, "twins_loss_weight"),
        ({"contrastive_temperature": 0.0}, "temperature"),
        ({"pooler_type": "max"}, "pooler_type"),
        ({"eval_pooler_type": "max"}, "eval_pooler_type"),
    ],
)
def test_other_impossible_settings_are_rejected(setting, message):
    """The settings dataclasses check them, and the model config through them."""
    with pytest.raises(ValueError, match=message):
        IFCLConfig(**setting)
    name, value = next(iter(setting.items()))
    settings = IFCLSettings if name in IFCLSettings.__dataclass_fields__ else SharedSettings
    with pytest.raises(ValueError, match=message):
        settings(**{name.replace("contrastive_", ""): value})


def test_ring_buffer_fills_whole_slots_and_keeps_the_newest_rows():
    """The ring buffer both queues share: a push fills ⌈count/N⌉ slots, a partial last slot's unwritten rows are
    empty, and a push larger than the queue keeps the newest rows in the slots they would have reached."""
    queue = QueueBuffers(num_slots=3, slot_size=2, dim=1)
    assert queue.head.item() == -1 and not queue.valid.any()
    ring.push(queue, column(1, 2, 3))  # slots 0 and 1, the second half empty
    assert queue.valid.tolist() == [[True, True], [True, False], [False, False]] and queue.head.item() == 1
    assert ring.slot_ages(queue).tolist() == [2, 1, 3]
    rows, ages = ring.entries(queue)
    assert rows.flatten().tolist()[:3] == [1, 2, 3] and ages.tolist() == [2, 2, 1, 0, 0, 0]
    # 8 rows, 4 slots for a queue of 3: one slot at a time, (4, 5) would go to slot 2 and be overwritten by (10, 11)
    ring.push(queue, column(*range(4, 12)))
    assert queue.embeddings.flatten().tolist() == [6, 7, 8, 9, 10, 11] and queue.valid.all()
    assert queue.head.item() == 2 and ring.size(queue) == 6
    assert ring.newest_first(queue)[0].flatten().tolist() == [10, 11, 8, 9, 6, 7]
    ring.push(queue, column())  # nothing to push: nothing changes
    assert queue.head.item() == 2 and ring.size(queue) == 6


def test_pushed_rows_carry_no_gradient_and_take_the_queues_dtype():
    queue = QueueBuffers(2, 2, 3)
    rows = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    ring.push(queue, rows)
    stored = ring.newest_first(queue)[0]
    assert not stored.requires_grad and stored.dtype == torch.float32
    torch.testing.assert_close(stored, rows.detach().float())
    assert set(dict(queue.named_buffers())) == {"embeddings", "valid", "head"}  # checkpoints carry all three
