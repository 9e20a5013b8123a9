"""The queues of past rows, ring buffers over ``modeling_ifcl.QueueBuffers`` (registered buffers, so checkpoints
carry them): IFCL's hippocampus queue, one slot of N rows per optimizer step (the paper's Section 3.2), and miCSE's
queue of momentum embeddings, one row per slot.

A push of ``count`` rows fills the next ⌈count/N⌉ slots in place, the oldest first overwritten; the rows of a last
partial slot that were not written stay empty, like slots never written, and take no part.
"""

from __future__ import annotations

import torch

from ifcl.losses import forgetting_coefficients
from modeling_ifcl import QueueBuffers


@torch.no_grad()
def push(queue: QueueBuffers, rows: torch.Tensor) -> None:
    """Put ``rows`` (the newest last) in front; more rows than the queue holds keep the newest."""
    num_slots, slot_size = queue.valid.shape
    count = rows.shape[0]
    if count == 0:
        return
    num_new = -(-count // slot_size)
    skipped = max(num_new - num_slots, 0)  # slots that would be overwritten within this push
    rows, kept = rows[skipped * slot_size :], num_new - skipped
    padded = queue.embeddings.new_zeros(kept * slot_size, queue.embeddings.shape[-1])
    padded[: rows.shape[0]] = rows.detach().to(padded.dtype)
    row_valid = torch.arange(kept * slot_size, device=padded.device) < rows.shape[0]
    slots = (queue.head + 1 + skipped + torch.arange(kept, device=padded.device)) % num_slots
    queue.embeddings.index_copy_(0, slots, padded.view(kept, slot_size, -1))
    queue.valid.index_copy_(0, slots, row_valid.view(kept, slot_size))
    queue.head.copy_((queue.head + num_new) % num_slots)


def slot_ages(queue: QueueBuffers) -> torch.Tensor:
    """Age in pushes of every slot, 1 for the newest."""
    num_slots = queue.valid.shape[0]
    return (queue.head - torch.arange(num_slots, device=queue.head.device)) % num_slots + 1


def entries(queue: QueueBuffers) -> tuple[torch.Tensor, torch.Tensor]:
    """All k·N rows and the age of each (its slot's; 0 for an empty row), in storage order, without a copy.

    The losses sum over the queue's entries, so storage order serves as well as age order.
    """
    ages = slot_ages(queue).unsqueeze(1) * queue.valid
    return queue.embeddings.flatten(0, 1), ages.flatten()


def negatives(queue: QueueBuffers, forgetting_rate: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """All k·N rows, as the losses take them as extra negatives, and the log of each row's Eq. 4 weight
    (:func:`ifcl.losses.forgetting_coefficients`; λ = 0: every filled row weighs 1); −inf for an empty row, which
    so takes no part."""
    rows, ages = entries(queue)
    return rows, forgetting_coefficients(ages, forgetting_rate).log()


def newest_first(queue: QueueBuffers) -> tuple[torch.Tensor, torch.Tensor]:
    """The filled rows, newest first (m = 1, 2, ...), and the age of each: the queue as the paper writes it."""
    order = torch.argsort(slot_ages(queue))
    ages = slot_ages(queue)[order].repeat_interleave(queue.valid.shape[1])
    valid = queue.valid[order].flatten()
    return queue.embeddings[order].flatten(0, 1)[valid], ages[valid]


def size(queue: QueueBuffers | None) -> int:
    """How many rows the queue holds (0 for no queue)."""
    return 0 if queue is None else int(queue.valid.sum())
