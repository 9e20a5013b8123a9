"""Run under ``torch.distributed.run --nproc_per_node 2`` (gloo, CPU): gathers rows of different counts per process
with ``trainer_ifcl.gather_rows_in_one_collective`` and with the three-collective gather it replaced, counts the
collectives each makes, and saves ``gather_rank<r>.pt`` in the folder given as the argument."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer_ifcl import gather_rows_in_one_collective  # noqa: E402

CAPACITY = 4
# Rows per process (rank 0, rank 1) in each case: equal, unequal, one empty, both full.
ROW_COUNTS = [(2, 2), (3, 1), (0, 4), (4, 4)]


def three_collective_gather(accelerator, rows: torch.Tensor) -> torch.Tensor:
    """IFCLTrainer.gather_rows before it made one collective: the counts, the padding's sizes, the padded rows."""
    count = torch.tensor([rows.shape[0]], device=rows.device)
    counts = accelerator.gather(count)
    padded = accelerator.pad_across_processes(rows, dim=0)
    gathered = accelerator.gather(padded).view(len(counts), padded.shape[0], -1)
    keep = torch.arange(padded.shape[0], device=rows.device) < counts.unsqueeze(1)
    return gathered[keep]


def counting_collectives() -> list[str]:
    """Wrap torch.distributed's gathers so that each call is recorded in the returned list."""
    calls: list[str] = []
    for name in ("all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "all_reduce"):
        original = getattr(dist, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    return calls


if __name__ == "__main__":
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    calls = counting_collectives()
    results = []
    for case, counts in enumerate(ROW_COUNTS):
        generator = torch.Generator().manual_seed(100 * case + rank)
        rows = torch.randn(counts[rank], 3, generator=generator)
        calls.clear()
        old = three_collective_gather(accelerator, rows)
        old_calls = list(calls)
        calls.clear()
        new = gather_rows_in_one_collective(accelerator, rows, CAPACITY)
        results.append({"rows": rows, "old": old, "new": new, "old_calls": old_calls, "new_calls": list(calls)})
    torch.save(results, os.path.join(sys.argv[1], f"gather_rank{rank}.pt"))
    accelerator.end_training()  # destroys the process group: without it gloo may abort the process as it exits
