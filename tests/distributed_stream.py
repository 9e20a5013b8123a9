"""Run ``run_ifcl.py --streaming`` under ``accelerate launch`` and save, for each rank, the sentences its stream read
(``rows_rank<r>.json`` in the output folder), to check that each row is read by exactly one process."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import run_ifcl  # noqa: E402
from ifcl.streaming import TrainingStream  # noqa: E402

if __name__ == "__main__":
    read: list[str] = []
    checked = TrainingStream.checked

    def recording(self, row):
        read.append(row["sentence"])
        return checked(self, row)

    TrainingStream.checked = recording
    trainer, _ = run_ifcl.main(sys.argv[1:])
    path = os.path.join(trainer.args.output_dir, f"rows_rank{trainer.args.process_index}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(read, handle)
