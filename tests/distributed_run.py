"""Run ``run_ifcl.py`` under ``accelerate launch`` and save each rank's state (used by the multi-process tests):
``queue_rank<r>.pt`` (IFCL's queue buffers) and ``state_rank<r>.pt`` (every weight and buffer of the model and
of its training objective, as the rank holds them at the end)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import run_ifcl  # noqa: E402
from ifcl.objectives import unwrap_model  # noqa: E402

if __name__ == "__main__":
    trainer, _ = run_ifcl.main(sys.argv[1:])
    model = unwrap_model(trainer.model)
    rank = trainer.args.process_index
    if model.queue is not None:
        state = {name: buffer.detach().cpu() for name, buffer in model.queue.named_buffers()}
        torch.save(state, os.path.join(trainer.args.output_dir, f"queue_rank{rank}.pt"))
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save(state, os.path.join(trainer.args.output_dir, f"state_rank{rank}.pt"))
