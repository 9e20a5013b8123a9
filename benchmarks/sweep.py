#!/usr/bin/env python
"""The embedded default's IFCL settings swept over seeds, judged on STS-B dev only: prints a table, writes JSON.

One setting changes at a time around the centre (ε = 0.5, both word tables frozen, lr 1e-5, 200 steps, batch 32);
each setting trains with ``run_ifcl.py`` at every seed. The table gives STS-B dev (best checkpoint) mean ± std
and the per-seed paired difference to the centre; a difference within the spread between seeds is a tie. The
test figures are recorded in the JSON file but not shown: settings are chosen on dev, never on test.

    python benchmarks/sweep.py                           # every setting, seeds 1 2 3, two runs at a time
    python benchmarks/sweep.py --only eps0.3 --seeds 4   # one setting; the others stay as recorded
    python benchmarks/sweep.py --readme                  # also put the table into benchmarks/README.md

Runs already finished (``results/sweep/<setting>/seed-<s>/all_results.json``, or recorded in ``results/sweep.json``)
are read, not trained again; ``--only`` trains the settings it names and keeps every earlier record in the JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics

from runs import (
    RESULTS,
    Run,
    machine,
    metric,
    package_versions,
    paired,
    pm,
    put_into_readme,
    read_finished,
    relative,
    restore_recorded,
    summary,
    train_all,
    verdict,
    write_record,
)

README_START, README_END = "<!-- sweep-table:start -->", "<!-- sweep-table:end -->"
CENTRE = {
    "--fusion_rate": "0.5",
    "--freeze_word_embeddings": "True",
    "--freeze_fraternal_embeddings": "True",
    "--learning_rate": "1e-5",
    "--max_steps": "200",
}

# key -> (what changes, the flags that differ from the centre). The first is the centre itself.
SETTINGS: dict[str, tuple[str, dict[str, str]]] = {
    "centre": ("ε 0.5, both tables frozen, lr 1e-5, 200 steps", {}),
    "eps0.3": ("ε 0.3", {"--fusion_rate": "0.3"}),
    "eps0.7": ("ε 0.7", {"--fusion_rate": "0.7"}),
    "trained": (
        "both word tables trained",
        {"--freeze_word_embeddings": "False", "--freeze_fraternal_embeddings": "False"},
    ),
    "lr3e-5": ("lr 3e-5", {"--learning_rate": "3e-5"}),
    "steps100": ("100 steps", {"--max_steps": "100"}),
}


def flags_of(changes: dict[str, str]) -> list[str]:
    merged = {**CENTRE, **changes}
    return [item for pair in merged.items() for item in pair]


def settings_record(runs: dict[str, list[Run]]) -> dict:
    """The record of each setting that finished runs: its dev summary over seeds, the per-seed paired dev
    difference to the centre and its verdict, and every run's figures."""
    centre = runs["centre"]
    centre_spread = summary(centre).get("dev", (0.0, 0.0))[1]
    records = {}
    for key, key_runs in runs.items():
        result = summary(key_runs)
        if not result:
            continue
        differences = paired(key_runs, centre, "dev") if key != "centre" else {}
        spread = max(result["dev"][1], centre_spread)
        records[key] = {
            "setting": SETTINGS[key][0],
            "flags": flags_of(SETTINGS[key][1]),
            "summary": result,
            "paired_dev_difference_to_centre": differences,
            "verdict": verdict(differences, spread) if key != "centre" else "",
            "runs": {
                str(run.seed): {
                    "output_dir": relative(run.output_dir),
                    "dev": metric(run.results, "dev"),
                    "test": metric(run.results, "test"),
                    "results": run.results,
                }
                for run in key_runs
                if run.results and "error" not in run.results
            },
        }
    return records


def readme_text(record: dict) -> str:
    """The caption and table that benchmarks/README.md shows, from the JSON record alone. A record written before
    ``jobs`` was recorded gives a caption without the runs at a time."""
    settings = record["settings"]
    at_a_time = f", {record['jobs']} run(s) at a time" if "jobs" in record else ""
    caption = (
        f"{record['machine']}, torch {record['packages']['torch']}; all-MiniLM-L6-v2 on trans-de-en, batch 32, seeds "
        f"{', '.join(map(str, record['seeds']))}{at_a_time}; STS-B dev (Spearman × 100) of the best dev checkpoint, "
        f"before training {settings['centre']['summary']['dev0']:.2f}. Verdict: a mean paired difference within the "
        "larger of the two settings' seed std is a tie."
    )
    lines = [
        "| setting | STS-B dev (mean ± std) | paired dev difference to the centre, per seed | verdict |",
        "|---|---|---|---|",
    ]
    for key, entry in settings.items():
        cells = "| |"
        if key != "centre":
            differences = entry["paired_dev_difference_to_centre"]
            mean_difference = statistics.fmean(differences.values()) if differences else 0.0
            per_seed = ", ".join(f"{d:+.2f}" for d in differences.values())
            cells = f"{mean_difference:+.2f} ({per_seed}) | {entry['verdict']} |"
        lines.append(f"| {entry['setting']} | {pm(entry['summary']['dev'])} | {cells}")
    return caption + "\n\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="Seeds of every setting.")
    parser.add_argument("--only", default=None, help=f"Comma-separated settings: {', '.join(SETTINGS)}.")
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (each gets cores / jobs threads).")
    parser.add_argument("--redo", action="store_true", help="Train finished runs again.")
    parser.add_argument("--report", action="store_true", help="Train nothing: the table of the finished runs.")
    parser.add_argument(
        "--readme", action="store_true", help="Put the table into benchmarks/README.md between its markers."
    )
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else list(SETTINGS)
    unknown = set(wanted) - set(SETTINGS)
    if unknown:
        raise SystemExit(f"--only: unknown setting(s) {sorted(unknown)}; choose from {list(SETTINGS)}.")
    if args.report:
        wanted = []
    keys = list(SETTINGS)  # every setting is reported: those this call trains, and those recorded before

    runs = {
        key: [
            Run(key, seed, flags_of(SETTINGS[key][1]), os.path.join(RESULTS, "sweep", key, f"seed-{seed}"))
            for seed in args.seeds
        ]
        for key in keys
    }
    # Seed by seed across settings, so that a stopped sweep has whole seeds rather than whole settings.
    order = [runs[key][i] for i in range(len(args.seeds)) for key in keys]
    path = os.path.join(RESULTS, "sweep.json")
    # Recorded runs count as finished, except those this call trains again (--redo).
    restore_recorded([run for run in order if not (args.redo and run.key in wanted)], path)
    train_all([run for run in order if run.key in wanted], jobs=args.jobs, redo=args.redo)
    read_finished(order)

    record = {
        "machine": machine(),
        "packages": package_versions(),
        "seeds": args.seeds,
        "jobs": args.jobs,
        "centre": CENTRE,
        "settings": settings_record(runs),
    }
    text = readme_text(record)
    print("\n" + text)
    write_record(path, record)
    if args.readme:
        put_into_readme(text, README_START, README_END)


if __name__ == "__main__":
    main()
