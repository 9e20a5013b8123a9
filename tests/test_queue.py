"""The hippocampus queue against its specification (the paper's Section 3.2, Eq. 4: p_m = 1 − λ·⌈m/N⌉)."""

from __future__ import annotations

import math

import pytest
import torch

from configuration_ifcl import IFCLConfig
from modeling_ifcl import HippocampusQueue

N, K, DIM, LAMBDA = 3, 2, 4, 0.2


def batch(value: float, rows: int = N) -> torch.Tensor:
    """Rows that tell which push they came from: every entry of push v is v, v+0.1, v+0.2, ..."""
    return torch.tensor([[value + 0.1 * r] * DIM for r in range(rows)])


def test_newest_first_with_coefficient_by_age():
    queue = HippocampusQueue(K, N, DIM, LAMBDA)
    queue.push(batch(1.0))
    queue.push(batch(2.0))
    embeddings, coefficients = queue.ordered()
    assert torch.equal(embeddings, torch.cat([batch(2.0), batch(1.0)]))
    # p_m = 1 − λ·⌈m/N⌉ for m = 1..k·N, written out by hand.
    expected = [1 - LAMBDA * math.ceil(m / N) for m in range(1, K * N + 1)]
    assert coefficients.tolist() == pytest.approx(expected)
    assert coefficients.tolist() == pytest.approx([0.8, 0.8, 0.8, 0.6, 0.6, 0.6])


def test_oldest_batch_drops_out():
    queue = HippocampusQueue(K, N, DIM, LAMBDA)
    for value in (1.0, 2.0, 3.0):
        queue.push(batch(value))
    embeddings, _ = queue.ordered()
    assert torch.equal(embeddings, torch.cat([batch(3.0), batch(2.0)]))
    assert len(queue) == K * N


def test_empty_slots_take_no_part():
    queue = HippocampusQueue(3, N, DIM, LAMBDA)
    assert len(queue) == 0
    queue.push(batch(1.0))
    embeddings, log_coefficients = queue.entries()
    assert embeddings.shape == (3 * N, DIM)
    finite = torch.isfinite(log_coefficients)
    assert int(finite.sum()) == N
    assert torch.equal(embeddings[finite], batch(1.0))
    assert log_coefficients[finite].exp().tolist() == pytest.approx([1 - LAMBDA] * N)


def test_short_batch_fills_only_its_rows():
    queue = HippocampusQueue(K, N, DIM, LAMBDA)
    queue.push(batch(1.0))
    queue.push(batch(2.0, rows=1))
    embeddings, coefficients = queue.ordered()
    assert torch.equal(embeddings, torch.cat([batch(2.0, rows=1), batch(1.0)]))
    assert coefficients.tolist() == pytest.approx([0.8, 0.6, 0.6, 0.6])
    # The short batch's slot, overwritten later by a full one, is whole again.
    queue.push(batch(3.0))
    assert torch.equal(queue.ordered()[0], torch.cat([batch(3.0), batch(2.0, rows=1)]))


def test_entries_match_ordered_view_as_sets():
    queue = HippocampusQueue(K, N, DIM, LAMBDA)
    for value in (1.0, 2.0, 3.0):
        queue.push(batch(value))
    embeddings, log_coefficients = queue.entries()
    stored = sorted(zip(embeddings[:, 0].tolist(), log_coefficients.exp().tolist()))
    ordered_embeddings, ordered_coefficients = queue.ordered()
    expected = sorted(zip(ordered_embeddings[:, 0].tolist(), ordered_coefficients.tolist()))
    assert len(stored) == len(expected)
    for (value, coefficient), (expected_value, expected_coefficient) in zip(stored, expected):
        assert value == expected_value
        assert coefficient == pytest.approx(expected_coefficient)


def test_too_many_anchors_for_one_step_is_an_error():
    queue = HippocampusQueue(K, N, DIM, LAMBDA)
    with pytest.raises(ValueError, match="queue_batch_size"):
        queue.push(batch(1.0, rows=N + 1))


@pytest.mark.parametrize("k, lam", [(10, 0.1), (4, 0.25), (2, 0.6)])
def test_settings_with_a_non_positive_weight_are_rejected(k, lam):
    with pytest.raises(ValueError, match="forgetting_rate"):
        IFCLConfig(queue_size=k, forgetting_rate=lam)


def test_largest_valid_forgetting_rate_is_accepted():
    config = IFCLConfig(queue_size=4, forgetting_rate=0.24)
    assert 1 - config.forgetting_rate * config.queue_size > 0


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"fusion_rate": 1.5}, "fusion_rate"),
        ({"fusion_rate": -0.1}, "fusion_rate"),
        ({"queue_size": -1}, "queue_size"),
        ({"contrastive_temperature": 0.0}, "temperature"),
        ({"pooler_type": "max"}, "pooler_type"),
    ],
)
def test_other_impossible_settings_are_rejected(setting, message):
    with pytest.raises(ValueError, match=message):
        IFCLConfig(**setting)


def test_ring_buffer_fills_whole_slots_and_keeps_the_newest_rows():
    """The ring buffer both queues share: a push fills ⌈count/N⌉ slots, a partial last slot's unwritten rows are
    invalid, and a push larger than the queue keeps the newest rows in the slots they would have reached."""
    from modeling_ifcl import RingBufferQueue

    queue = RingBufferQueue(num_slots=3, slot_size=2, dim=1)
    column = lambda *values: torch.tensor(values, dtype=torch.float).unsqueeze(1)  # noqa: E731
    queue.push(column(1, 2, 3))  # slots 0 and 1, the second half empty
    assert queue.valid.tolist() == [[True, True], [True, False], [False, False]] and queue.head.item() == 1
    assert queue.slot_ages().tolist() == [2, 1, 3]
    embeddings, log_weights = queue.entries()
    assert embeddings.flatten().tolist()[:3] == [1, 2, 3] and log_weights.tolist()[2:] == [0] + [float("-inf")] * 3
    # 8 rows, 4 slots for a queue of 3: one slot at a time, (4, 5) would go to slot 2 and be overwritten by (10, 11)
    queue.push(column(*range(4, 12)))
    assert queue.embeddings.flatten().tolist() == [6, 7, 8, 9, 10, 11] and queue.valid.all()
    assert queue.head.item() == 2 and len(queue) == 6
