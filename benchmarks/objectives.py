#!/usr/bin/env python
"""Every objective on the embedded default, same budget and seed, side by side: prints a table and writes JSON.

Trains IFCL, the ablations of the IFCL paper's Table 2, SimCSE, ConIsI, PCL and miCSE, each with ``run_ifcl.py``
in its own process (all-MiniLM-L6-v2, the English side of trans-de-en, STS-B dev for checkpoint selection), and
reports STS-B dev and test Spearman × 100 before and after, seconds per step, and peak memory: on a GPU the
peak of ``torch.cuda`` allocations during training (``train_peak_gpu_memory_mb``), on the CPU the run's peak
resident memory (model loading and evaluation included; the Trainer's own memory metrics are not used, since
their monitoring thread keeps a CPU core busy and would slow the runs it measures).

    python benchmarks/objectives.py                                # all runs, the embedded default's budget
    python benchmarks/objectives.py --max_steps 60 --only simcse,conisi
    python benchmarks/objectives.py --readme                       # also put the table into README.md

Runs of an earlier call with the same budget on the same device are kept in ``results/objectives.json`` (and
the table) unless run again, so ``--only`` can add or redo single runs.
    python benchmarks/objectives.py -- --per_device_train_batch_size 64   # after --: passed to every run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README_START, README_END = "<!-- objectives-table:start -->", "<!-- objectives-table:end -->"

# (key, what the table calls it, --objective, its own flags). The IFCL ablations are the paper's Table 2.
RUNS = [
    ("ifcl", "IFCL", "ifcl", []),
    ("ifcl-no-fi-tl", "IFCL w/o fraternal twins and Twins loss", "ifcl", ["--fraternal_loss_weight", "0", "--twins_loss_weight", "0"]),
    ("ifcl-no-hq", "IFCL w/o queue", "ifcl", ["--queue_size", "0"]),
    ("ifcl-no-tl-hq", "IFCL w/o Twins loss and queue", "ifcl", ["--twins_loss_weight", "0", "--queue_size", "0"]),
    ("simcse", "SimCSE", "simcse", []),
    ("conisi", "ConIsI-s", "conisi", []),
    ("pcl", "PCL", "pcl", []),
    ("micse", "miCSE", "micse", []),
]  # fmt: skip


def train(key: str, objective: str, flags: list[str], budget: list[str], extra: list[str]) -> dict:
    """One ``run_ifcl.py`` run in a fresh process; its all_results.json plus wall time."""
    output_dir = os.path.join(RESULTS, "objectives", key)
    shutil.rmtree(output_dir, ignore_errors=True)
    os.makedirs(output_dir)
    command = [
        sys.executable, os.path.join(ROOT, "run_ifcl.py"),
        "--objective", objective, *flags,
        "--output_dir", output_dir,
        *budget, *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    with open(output_dir + ".log", "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        # wait4 gives this child's own resource use: its peak RSS, whatever earlier runs reached.
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    returncode = os.waitstatus_to_exitcode(status)
    if returncode != 0:
        return {"error": f"run_ifcl.py failed (exit {returncode}); see {output_dir}.log"}
    with open(os.path.join(output_dir, "all_results.json"), encoding="utf-8") as f:
        results = json.load(f)
    # Keep the figures and the curves; the weights of eight models are not worth the disk.
    for name in os.listdir(output_dir):
        if name not in ("all_results.json", "training_curves.png", "README.md", "config.json"):
            path = os.path.join(output_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    results["wall_seconds"] = wall
    results["peak_rss_mb"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return results


def row(name: str, results: dict) -> str:
    """A Markdown table row of one run."""
    if "error" in results:
        return f"| {name} | {results['error']} | | | |"
    dev0, dev1 = results["init_eval_stsb_spearman"], results["eval_stsb_spearman"]
    test0, test1 = results["init_test_stsb_spearman"], results["test_stsb_spearman"]
    peak_mb = results.get("train_peak_gpu_memory_mb", results["peak_rss_mb"])
    return (
        f"| {name} | {dev0:.2f} → {dev1:.2f} | {test0:.2f} → {test1:.2f} ({test1 - test0:+.2f}) "
        f"| {results['train_seconds_per_step']:.2f} | {peak_mb:.0f} |"
    )


def table(rows: list[tuple[str, dict]]) -> str:
    header = (
        "| objective | STS-B dev before → after | STS-B test before → after (Δ) | s/step | peak memory (MB) |\n"
        "|---|---|---|---|---|"
    )
    return "\n".join([header, *(row(name, results) for name, results in rows)])


def put_into_readme(text: str) -> None:
    """Replace what lies between the README's objectives-table markers."""
    path = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    if README_START not in readme or README_END not in readme:
        raise SystemExit(f"{path} has no {README_START} … {README_END} markers to put the table between.")
    before, rest = readme.split(README_START, 1)
    after = rest.split(README_END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{before}{README_START}\n{text}\n{README_END}{after}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max_steps", type=int, default=None, help="Steps per run (default: run_ifcl.py's, 200).")
    parser.add_argument("--eval_steps", type=int, default=None, help="Dev evaluation every so many steps.")
    parser.add_argument("--only", default=None, help=f"Comma-separated run keys: {', '.join(k for k, *_ in RUNS)}.")
    parser.add_argument("--readme", action="store_true", help="Put the table into README.md between its markers.")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    budget = []
    if args.max_steps is not None:
        budget += ["--max_steps", str(args.max_steps)]
    if args.eval_steps is not None:
        budget += ["--eval_steps", str(args.eval_steps), "--save_steps", str(args.eval_steps)]
    wanted = set(args.only.split(",")) if args.only else {key for key, *_ in RUNS}
    unknown = wanted - {key for key, *_ in RUNS}
    if unknown:
        raise SystemExit(f"--only: unknown run(s) {sorted(unknown)}; choose from {[k for k, *_ in RUNS]}.")

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    path = os.path.join(RESULTS, "objectives.json")
    records = {}
    if os.path.isfile(path):  # runs of an earlier call with the same budget and device stay in the table
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
        if earlier.get("budget") == budget + extra and earlier.get("device") == device:
            records = earlier["runs"]
    for key, name, objective, flags in RUNS:
        if key not in wanted:
            continue
        print(f"training {name} …", flush=True)
        results = train(key, objective, flags, budget, extra)
        records[key] = {"name": name, "objective": objective, "flags": flags, **results}
        print(row(name, results), flush=True)

    rows = [(name, records[key]) for key, name, *_ in RUNS if key in records]
    text = table(rows)
    budget_text = " ".join(budget + extra) or "run_ifcl.py's defaults"
    caption = (
        f"{device}, torch {torch.__version__}; all-MiniLM-L6-v2 on trans-de-en (English side for the objectives "
        f"without fraternal twins), seed 42, budget: {budget_text}. Best dev checkpoint, then STS-B test."
    )
    print("\n" + caption + "\n\n" + text)
    os.makedirs(RESULTS, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"device": device, "budget": budget + extra, "runs": records}, f, indent=2)
    print(f"\nwritten: {path}")
    if args.readme:
        put_into_readme(caption + "\n\n" + text)


if __name__ == "__main__":
    main()
