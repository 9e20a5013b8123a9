#!/usr/bin/env python
"""Matryoshka sizes on the embedded default, over seeds: prints a table and writes JSON.

Trains IFCL's embedded default (all-MiniLM-L6-v2, trans-de-en, 200 steps of batch 32) with and without
``--matryoshka_dims 384 256 128 64 32``, at every seed, each run in its own process. Each finished model (its best dev
checkpoint) is then scored here, the same way for both: STS-B dev and test Spearman × 100 of its embeddings cut to
each size (``STSEvaluator`` with ``truncate_dims``: one encoding per set, cut afterwards). The table gives mean ± std
over the seeds and, per size, the per-seed paired test difference (Matryoshka − plain): a mean within the larger
seed std of the two is a tie.

    python benchmarks/matryoshka.py                      # seeds 1 2 3, two runs at a time
    python benchmarks/matryoshka.py --report --readme    # the table of the finished runs into benchmarks/README.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import runs as benchmark_runs
from runs import RESULTS, Run, machine, mean_std, package_versions, pm, relative, verdict

SIZES = (384, 256, 128, 64, 32)
SETTINGS = {"plain": [], "matryoshka": ["--matryoshka_dims", *map(str, SIZES)]}
README_START, README_END = "<!-- matryoshka-table:start -->", "<!-- matryoshka-table:end -->"
RECORD = os.path.join(RESULTS, "matryoshka.json")


def scores(folder: str) -> dict[str, float]:
    """STS-B dev and test Spearman × 100 of the saved model at each size (``dev_64``, ``test_64``, ...)."""
    from ifcl.data import load_stsb
    from ifcl.model import IFCLModel
    from ifcl.sts.evaluator import STSEvaluator

    model = IFCLModel.from_pretrained(folder)
    figures = {}
    for split, label in (("dev", "dev"), ("test", "test")):
        evaluator = STSEvaluator.from_dataset(load_stsb(split), name=label, truncate_dims=SIZES[1:])
        for name, value in evaluator(model, show_progress_bar=False).items():
            if name.startswith("spearman"):
                size = name.rpartition("_")[2] if "_" in name else str(SIZES[0])
                figures[f"{label}_{size}"] = value
    return figures


def train_and_score(run: Run, threads: int | None) -> None:
    """Train ``run`` (or read it), score its weights at each size before the benchmark's pruning, keep the figures."""
    scored = os.path.join(run.output_dir, "sizes.json")
    if os.path.isfile(scored):
        with open(scored, encoding="utf-8") as handle:
            run.results = json.load(handle)
        return
    results = benchmark_runs.train(run, threads, keep=True)  # the weights are scored below, then pruned
    if "error" in results:
        raise SystemExit(results["error"])
    run.results = {**results, **scores(run.output_dir)}
    benchmark_runs.prune(run.output_dir)  # all_results.json stays; the figures per size go beside it
    with open(scored, "w", encoding="utf-8") as handle:
        json.dump(run.results, handle, indent=2)


def sizes_record(runs: dict[str, list[Run]]) -> dict:
    """The record's figures per size: both settings' dev and test over seeds, and the paired test difference."""
    record = {}
    for size in SIZES:
        entry = {}
        for key in SETTINGS:
            done = [run for run in runs[key] if run.results]
            entry[key] = {
                split: mean_std([run.results[f"{split}_{size}"] for run in done]) for split in ("dev", "test")
            }
        plain = {run.seed: run.results[f"test_{size}"] for run in runs["plain"] if run.results}
        differences = {
            run.seed: run.results[f"test_{size}"] - plain[run.seed]
            for run in runs["matryoshka"]
            if run.results and run.seed in plain
        }
        spread = max(entry["plain"]["test"][1], entry["matryoshka"]["test"][1])
        mean = statistics.fmean(differences.values())
        entry["paired_test_difference"] = {
            "per_seed": differences,
            "mean": mean,
            "verdict": verdict(differences, spread),
        }
        record[str(size)] = entry
    return record


def readme_text(record: dict) -> str:
    """The caption and table that benchmarks/README.md shows, from the JSON record alone."""
    sizes = record["sizes"]
    caption = (
        f"{record['machine']}, torch {record['packages']['torch']}, {record['how']}; all-MiniLM-L6-v2 on "
        f"trans-de-en, 200 steps of batch 32, lr 1e-5, seeds {', '.join(map(str, record['seeds']))}; plain: the "
        f"embedded default; Matryoshka: the same with --matryoshka_dims {' '.join(sizes)}. Best dev checkpoint, its "
        "embeddings cut to each size, STS-B Spearman × 100, mean ± std over seeds; paired test difference "
        f"Matryoshka − plain per seed (record: `{relative(RECORD)}`, made by `python benchmarks/matryoshka.py`)."
    )
    lines = [
        "| dimensions | plain dev | plain test | Matryoshka dev | Matryoshka test | paired test difference |",
        "|---|---|---|---|---|---|",
    ]
    for size, entry in sizes.items():
        cells = [size]
        for key in SETTINGS:
            cells += [pm(entry[key]["dev"]), pm(entry[key]["test"])]
        paired = entry["paired_test_difference"]
        per_seed = ", ".join(
            f"{value:+.2f}" for _, value in sorted(paired["per_seed"].items(), key=lambda item: int(item[0]))
        )
        cells.append(f"{paired['mean']:+.2f} ({per_seed}): {paired['verdict']}")
        lines.append("| " + " | ".join(cells) + " |")
    return caption + "\n\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="Seeds of both settings.")
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (each gets cores / jobs threads).")
    parser.add_argument("--report", action="store_true", help="Train nothing: the table of the finished runs.")
    parser.add_argument("--readme", action="store_true", help="Put the table into benchmarks/README.md.")
    args = parser.parse_args()
    folder = os.path.join(RESULTS, "matryoshka")
    runs = {
        key: [Run(key, seed, flags, os.path.join(folder, key, f"seed-{seed}")) for seed in args.seeds]
        for key, flags in SETTINGS.items()
    }
    todo = [run for seed_runs in zip(*runs.values()) for run in seed_runs]
    if args.report:
        todo = [run for run in todo if os.path.isfile(os.path.join(run.output_dir, "sizes.json"))]
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda run: train_and_score(run, threads), todo))
    how = f"{args.jobs} runs at a time, {threads or 'all'} thread(s) each"
    record = {
        "machine": machine(),
        "packages": package_versions(),
        "how": how,
        "seeds": args.seeds,
        "sizes": sizes_record(runs),
    }
    text = readme_text(record)
    print("\n" + text)
    benchmark_runs.write_record(RECORD, record)
    if args.readme:
        benchmark_runs.put_into_readme(text, README_START, README_END)


if __name__ == "__main__":
    main()
