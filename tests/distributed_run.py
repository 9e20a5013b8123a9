"""Run ``run_ifcl.py`` under ``accelerate launch`` and save each rank's queue (used by test_run.py)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import run_ifcl  # noqa: E402

if __name__ == "__main__":
    trainer, _ = run_ifcl.run(sys.argv[1:])
    queue = trainer.accelerator.unwrap_model(trainer.model).queue
    rank = trainer.accelerator.process_index
    state = {name: buffer.detach().cpu() for name, buffer in queue.named_buffers()}
    torch.save(state, os.path.join(trainer.args.output_dir, f"queue_rank{rank}.pt"))
