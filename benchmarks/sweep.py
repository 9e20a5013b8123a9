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

    centre = runs["centre"]
    centre_spread = summary(centre).get("dev", (0.0, 0.0))[1]
    lines = [
        "| setting | STS-B dev (mean ± std) | paired dev difference to the centre, per seed | verdict |",
        "|---|---|---|---|",
    ]
    records = {}
    for key in keys:
        result = summary(runs[key])
        if not result:
            continue
        differences = paired(runs[key], centre, "dev") if key != "centre" else {}
        spread = max(result["dev"][1], centre_spread)
        mean_difference = statistics.fmean(differences.values()) if differences else 0.0
        per_seed = ", ".join(f"{d:+.2f}" for d in differences.values())
        judged = verdict(differences, spread) if key != "centre" else ""
        lines.append(
            f"| {SETTINGS[key][0]} | {pm(result['dev'])} | "
            + (f"{mean_difference:+.2f} ({per_seed}) | {judged} |" if key != "centre" else "| |")
        )
        records[key] = {
            "setting": SETTINGS[key][0],
            "flags": flags_of(SETTINGS[key][1]),
            "summary": result,
            "paired_dev_difference_to_centre": differences,
            "verdict": judged,
            "runs": {
                str(run.seed): {
                    "output_dir": relative(run.output_dir),
                    "dev": metric(run.results, "dev"),
                    "test": metric(run.results, "test"),
                    "results": run.results,
                }
                for run in runs[key]
                if run.results and "error" not in run.results
            },
        }
    caption = (
        f"{machine()}, torch {package_versions()['torch']}; all-MiniLM-L6-v2 on trans-de-en, batch 32, seeds "
        f"{', '.join(map(str, args.seeds))}, {args.jobs} run(s) at a time; STS-B dev (Spearman × 100) of the best dev "
        f"checkpoint, before training {summary(centre)['dev0']:.2f}. Verdict: a mean paired difference within the "
        f"larger of the two settings' seed std is a tie."
    )
    text = caption + "\n\n" + "\n".join(lines)
    print("\n" + text)
    write_record(
        path,
        {
            "machine": machine(),
            "packages": package_versions(),
            "seeds": args.seeds,
            "centre": CENTRE,
            "settings": records,
        },
    )
    if args.readme:
        put_into_readme(text, README_START, README_END)


if __name__ == "__main__":
    main()
