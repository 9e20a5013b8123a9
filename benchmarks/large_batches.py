#!/usr/bin/env python
"""Large batches on small memory: the peak memory and time of one IFCL training step of all-MiniLM-L6-v2 with and
without the gradient cache (``IFCLTrainer(cache_mini_batch_size=16)``), at several batch sizes, side by side in one
run: prints a table and writes JSON.

One step is ``compute_loss`` and its backward (no optimizer step), on trans-de-en pairs padded to length 32, the
queue off, the embedded default's settings otherwise. Peak memory: on the CPU the profiler's peak of live tensor bytes
in the step (``train_step.peak_cpu_allocation``: PyTorch keeps no CPU allocator statistics), on a GPU
``torch.cuda.max_memory_allocated`` above what was allocated before the step. Time: the mean of ``--rounds`` steps
after one warm-up, wall clock; the cached/uncached ratio is taken at each batch size.

    python benchmarks/large_batches.py                              # batches 32 128 512, mini-batch 16
    python benchmarks/large_batches.py --batch_sizes 64 256 --mini_batch_size 32
    python benchmarks/large_batches.py --model FOLDER --bf16 --output OTHER.json   # on a GPU (gpu_check.sh)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runs import (  # noqa: E402
    DEFAULT_MODEL_NAME,
    RESULTS,
    default_model,
    machine,
    package_versions,
    put_into_readme,
    relative,
    write_record,
)

RECORD = os.path.join(RESULTS, "large_batches.json")
README_START, README_END = "<!-- large-batches-table:start -->", "<!-- large-batches-table:end -->"
# How the peak memory is measured on each kind of device, for the caption.
PEAK_MEASURES = {"cuda": "GPU: torch.cuda.max_memory_allocated", "cpu": "CPU: profiler peak of live tensors"}


def trainer_of(model, batch_size: int, cache: int | None):
    """An IFCLTrainer of ``model`` at ``batch_size`` (with a gradient cache of ``cache`` rows when given)."""
    import torch
    from transformers import TrainingArguments

    from trainer_ifcl import IFCLTrainer

    args = TrainingArguments(
        output_dir="/tmp/large-batches",
        per_device_train_batch_size=batch_size,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
    )
    return IFCLTrainer(model=model, args=args, cache_mini_batch_size=cache)


def measure(
    model, batch: dict, batch_size: int, cache: int | None, rounds: int, device, bf16: bool = False
) -> dict[str, float]:
    """Peak memory (MB) and seconds of one step (under bf16 autocast with ``bf16``)."""
    import torch
    from train_step import peak_cpu_allocation

    trainer = trainer_of(model, batch_size, cache)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = trainer.compute_loss(model, batch)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = peak_cpu_allocation(step)
    start = time.perf_counter()
    for _ in range(rounds):
        step()
    return {"peak_mb": peak / 2**20, "seconds": (time.perf_counter() - start) / rounds}


def row_line(row: dict) -> str:
    """One batch size's line of the table, from its entry in the record's ``rows``."""
    plain, cached = row["uncached"], row["cached"]
    return (
        f"| {row['batch_size']} | {plain['peak_mb']:.0f} | {cached['peak_mb']:.0f} | {plain['seconds']:.2f} | "
        f"{cached['seconds']:.2f} | {row['time_ratio']:.2f} |"
    )


def readme_text(record: dict, path: str = RECORD) -> str:
    """The caption and table that benchmarks/README.md shows, from the JSON record (written to ``path``) alone."""
    caption = (
        f"{record['machine']}, torch {record['packages']['torch']}; {record['model']}, one IFCL step (loss and "
        f"backward, queue off, {record.get('precision', 'float32')}), trans-de-en pairs of length {record['max_length']}; gradient cache of "
        f"mini-batch {record['mini_batch_size']}; peak memory in MB ({PEAK_MEASURES[record['device']]}), seconds "
        f"per step wall clock (mean of {record['rounds']} after one warm-up); record: `{relative(path)}`, made "
        "by `python benchmarks/large_batches.py`."
    )
    header = "| batch | peak MB, uncached | peak MB, cached | s/step, uncached | s/step, cached | time ratio cached/uncached |"
    table = "\n".join([header, "|---|---|---|---|---|---|", *map(row_line, record["rows"])])
    return caption + "\n\n" + table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--mini_batch_size", type=int, default=16)
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None, help="encoder folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--bf16", action="store_true", help="each step under bf16 autocast")
    parser.add_argument("--output", default=RECORD, help="the JSON record")
    parser.add_argument("--readme", action="store_true", help="Put the table into benchmarks/README.md.")
    args = parser.parse_args()
    if args.readme and os.path.abspath(args.output) != RECORD:
        parser.error("--readme puts the default record's table into benchmarks/README.md: leave --output out.")

    import torch
    from train_step import batches

    from ifcl.model import IFCLModel

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = IFCLModel.from_encoder(args.model or default_model(), queue_size=0).to(device)
    model.train()
    rows = []
    for batch_size in args.batch_sizes:
        batch = batches(model.tokenizer, batch_size, args.max_length, 1, device)[0]
        plain = measure(model, batch, batch_size, None, args.rounds, device, args.bf16)
        cached = measure(model, batch, batch_size, args.mini_batch_size, args.rounds, device, args.bf16)
        ratio = cached["seconds"] / plain["seconds"]
        rows.append({"batch_size": batch_size, "uncached": plain, "cached": cached, "time_ratio": ratio})
        print(row_line(rows[-1]), flush=True)
    record = {
        "machine": machine(),
        "packages": package_versions(),
        "model": os.path.basename(os.path.normpath(args.model)) if args.model else DEFAULT_MODEL_NAME,
        "device": device.type,
        "precision": "bf16 autocast" if args.bf16 else "float32",
        "mini_batch_size": args.mini_batch_size,
        "max_length": args.max_length,
        "rounds": args.rounds,
        "unit": {"peak": "MB", "time": "seconds per step, wall clock"},
        "rows": rows,
    }
    text = readme_text(record, args.output)
    print("\n" + text)
    write_record(args.output, record)
    if args.readme:
        put_into_readme(text, README_START, README_END)


if __name__ == "__main__":
    main()
