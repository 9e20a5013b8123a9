#!/usr/bin/env python
"""Every objective on the embedded default over several seeds, at equal steps and at equal time: prints tables,
writes JSON.

Trains IFCL, the ablations of the IFCL paper's Table 2, SimCSE, ConIsI, PCL and miCSE with ``run_ifcl.py``, each
run in its own process (all-MiniLM-L6-v2, trans-de-en, STS-B dev for checkpoint selection), at every seed. For each
it reports STS-B dev and test mean ± std over the seeds, the per-seed paired test difference to SimCSE (a mean
difference within the spread between seeds is a tie), seconds per step and peak memory: on a GPU the peak of
``torch.cuda`` allocations during training, on the CPU the run's peak resident memory (model loading and
evaluation included; the Trainer's own memory metrics are not used, since their monitoring thread keeps a CPU core
busy and would slow the runs it measures).

Equal time (``--equal_time``): IFCL, SimCSE, PCL and miCSE each get the training time of the IFCL default instead of its
number of steps, counted in one unit: CPU seconds of training with the STS evaluations left out, on both sides. The
budget is the IFCL runs' mean; a method's steps are the budget over its training CPU seconds per step, taken from its
equal-step runs where they recorded it, else from a 20-step calibration run without evaluations
(``results/objectives-step-cost/``); ConIsI's is measured the same way and recorded beside theirs, so that every
cost ratio the READMEs give is in this one unit. Each equal-time run has four dev evaluations, as the default has;
the table shows the training CPU seconds each actually spent.

    python benchmarks/objectives.py                               # every run, seeds 1 2 3, two runs at a time
    python benchmarks/objectives.py --only ifcl,simcse --seeds 1 2 3 4 5          # the headline at five seeds
    python benchmarks/objectives.py --equal_time --readme         # both tables into benchmarks/README.md, the headline
                                                                  # (IFCL and SimCSE) into README.md

Finished runs (``results/objectives/<key>/seed-<s>/all_results.json``, or the runs ``results/objectives.json``
records) are read, not trained again; ``--redo`` trains the ``--only`` runs again. Each row is summarised over every
seed it has, which the table names, so a call for some runs at more seeds keeps the others' records.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import runs as benchmark_runs
from runs import (
    RESULTS,
    Run,
    machine,
    package_versions,
    paired,
    pm,
    read_finished,
    relative,
    summary,
    train_all,
    verdict,
)

README_START, README_END = "<!-- objectives-table:start -->", "<!-- objectives-table:end -->"
EQUAL_TIME_START, EQUAL_TIME_END = "<!-- equal-time-table:start -->", "<!-- equal-time-table:end -->"
HEADLINE_START, HEADLINE_END = "<!-- headline-table:start -->", "<!-- headline-table:end -->"

# (key, what the table calls it, --objective, its own flags). The IFCL ablations are the paper's Table 2.
RUNS = [
    ("ifcl", "IFCL", "ifcl", []),
    (
        "ifcl-no-fi-tl",
        "IFCL w/o fraternal twins and Twins loss",
        "ifcl",
        ["--fraternal_loss_weight", "0", "--twins_loss_weight", "0"],
    ),
    ("ifcl-no-hq", "IFCL w/o queue", "ifcl", ["--queue_size", "0"]),
    ("ifcl-no-tl-hq", "IFCL w/o Twins loss and queue", "ifcl", ["--twins_loss_weight", "0", "--queue_size", "0"]),
    ("simcse", "SimCSE", "simcse", []),
    ("conisi", "ConIsI-s", "conisi", []),
    ("pcl", "PCL", "pcl", ["--pcl_untied_peer"]),  # the paper ties the peer only for large models
    ("micse", "miCSE", "micse", []),
]
NAMES = {key: name for key, name, *_ in RUNS}
BASELINE = "simcse"
EQUAL_TIME_RUNS = ("ifcl", "simcse", "pcl", "micse")
COSTED_ONLY = ("conisi",)  # its training CPU seconds per step recorded beside theirs, for the ratios in one unit
DEFAULT_STEPS = 200  # run_ifcl.py's embedded default


def objective_runs(
    keys: list[str], seeds: list[int] | dict[str, list[int]], extra: list[str], folder: str = "objectives"
) -> dict:
    """Run objects of the wanted keys and seeds (the same seeds for all, or each key's own), output folders under
    ``results/<folder>/``."""
    return {
        key: [
            Run(
                key,
                seed,
                ["--objective", objective, *flags, *extra],
                os.path.join(RESULTS, folder, key, f"seed-{seed}"),
            )
            for seed in (seeds[key] if isinstance(seeds, dict) else seeds)
        ]
        for key, _, objective, flags in RUNS
        if key in keys
    }


def recorded_seeds(previous: dict, section: str) -> dict[str, list[int]]:
    """The seeds of each key's runs that a section of the JSON file records."""
    records = previous.get(section, {})
    records = records.get("runs", {}) if section == "equal_time" else records
    return {key: [int(seed) for seed in record.get("runs", {})] for key, record in records.items()}


# The unit of the equal-time budget. A budget recorded in another unit (wall-clock seconds, evaluations included, as
# before this one) is computed anew.
EQUAL_TIME_UNIT = "training CPU seconds, STS evaluations excluded"
CALIBRATION_STEPS = 20


def training_cpu_seconds(results: dict) -> float | None:
    """CPU seconds a run spent training, its STS evaluations left out; None for runs that did not record them."""
    if "train_evaluation_cpu_seconds" not in results:
        return None
    return results["train_cpu_seconds"] - results["train_evaluation_cpu_seconds"]


def recorded_step_cost(runs: list[Run]) -> float | None:
    """Mean training CPU seconds per step (evaluations excluded) of the runs that recorded it, else None."""
    costs = [
        run.results["train_cpu_seconds_per_step"]
        for run in runs
        if run.results and training_cpu_seconds(run.results) is not None
    ]
    return statistics.fmean(costs) if costs else None


def calibrated_step_cost(key: str, extra: list[str], jobs: int) -> float:
    """Training CPU seconds per step of ``key`` from a short run without evaluations (seed 1)."""
    flags = [
        *extra,
        "--max_steps",
        str(CALIBRATION_STEPS),
        "--do_train",
        "True",
        "--do_eval",
        "False",
        "--do_predict",
        "False",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "no",
        "--load_best_model_at_end",
        "False",
    ]
    run = objective_runs([key], [1], flags, folder="objectives-step-cost")[key]
    train_all(run, jobs=jobs)
    read_finished(run)
    cost = recorded_step_cost(run)
    if cost is None:
        raise SystemExit(f"--equal_time: the {key} calibration run failed: {run[0].results}")
    return cost


def trained_equal_time_steps(key: str, previous: dict) -> int | None:
    """The steps of ``key``'s equal-time runs if some are trained already (a folder, or the JSON's record): its
    budget in steps is fixed once runs have spent it, so that seeds trained later run the same number of steps."""
    folder = os.path.join(RESULTS, "objectives-equal-time", key)
    for seed_folder in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        results_path = os.path.join(folder, seed_folder, "all_results.json")
        if os.path.isfile(results_path):
            with open(results_path, encoding="utf-8") as f:
                return int(json.load(f)["train_steps"])
    return previous.get("equal_time", {}).get("steps", {}).get(key)


def by_seed(runs: dict[str, list[Run]]) -> list[Run]:
    """Seed by seed across settings, so that a stopped benchmark has whole seeds rather than whole settings."""
    count = max(len(r) for r in runs.values())
    return [runs[key][i] for i in range(count) for key in runs if i < len(runs[key])]


def table_record(
    runs: dict[str, list[Run]], steps: dict[str, int] | None = None, baseline_key: str = BASELINE
) -> dict:
    """The record of each objective's runs over seeds: its summary, the per-seed paired test difference to the
    ``baseline_key`` objective (SimCSE; IFCL at equal time) and its verdict, and every run's figures; ``steps``: each
    objective's steps (equal time), else the default's."""
    baseline = runs.get(baseline_key, [])
    baseline_summary = summary(baseline) if baseline else {}
    records = {}
    for key, key_runs in runs.items():
        key_steps = steps[key] if steps else DEFAULT_STEPS
        result = summary(key_runs)
        if not result:
            records[key] = {"name": NAMES[key], "steps": key_steps, "summary": {}}  # a "not run" row
            continue
        differences = paired(key_runs, baseline, "test") if key != baseline_key else {}
        spread = max(result["test"][1], baseline_summary.get("test", (0, 0))[1])
        records[key] = {
            "name": NAMES[key],
            "flags": key_runs[0].flags,
            "steps": key_steps,
            "summary": result,
            f"paired_test_difference_to_{baseline_key}": differences,
            "verdict": verdict(differences, spread) if key != baseline_key else "",
            "runs": {
                str(run.seed): {"output_dir": relative(run.output_dir), "results": run.results}
                for run in key_runs
                if run.results and "error" not in run.results
            },
        }
    return records


def table_text(records: dict, equal_time: bool = False) -> str:
    """The Markdown table of a ``table_record``. At ``equal_time`` each objective's steps are shown, the paired
    differences are to IFCL, and the CPU seconds of training its runs spent, evaluations excluded, take the place of
    the wall-clock s/step."""
    baseline_key = "ifcl" if equal_time else BASELINE
    steps_column = " steps |" if equal_time else ""
    cost_column = "training CPU s (evaluations excluded)" if equal_time else "s/step (wall clock)"
    lines = [
        f"| objective | seeds |{steps_column} STS-B dev | STS-B test | test gain | paired test difference to "
        f"{NAMES[baseline_key]}, per seed | verdict | {cost_column} | peak memory (MB) |",
        "|---|---|" + ("---|" if equal_time else "") + "---|---|---|---|---|---|---|",
    ]
    for entry in records.values():
        steps_cell = f" {entry['steps']} |" if equal_time else ""
        result = entry["summary"]
        if not result:
            lines.append(f"| {entry['name']} | |{steps_cell} not run | | | | | | |")
            continue
        differences = entry[f"paired_test_difference_to_{baseline_key}"]
        mean_difference = f"{statistics.fmean(differences.values()):+.2f}" if differences else ""
        per_seed = f"{mean_difference} ({', '.join(f'{d:+.2f}' for d in differences.values())})" if differences else ""
        if equal_time:
            spent = [training_cpu_seconds(run["results"]) for run in entry["runs"].values()]
            cost = f"{statistics.fmean(spent):.0f}" if None not in spent else "not recorded"
        else:
            cost = f"{result['seconds_per_step'][0]:.2f}"
        lines.append(
            f"| {entry['name']} | {len(result['seeds'])} |{steps_cell} {pm(result['dev'])} | {pm(result['test'])} | "
            f"{result['gain'][0]:+.2f} | {per_seed} | {entry['verdict']} | {cost} | "
            f"{result['peak_memory_mb'][0]:.0f} |"
        )
    return "\n".join(lines)


def readme_text(record: dict) -> str:
    """The caption and equal-step table that benchmarks/README.md shows, from the JSON record alone."""
    extra = record["extra"]
    caption = (
        f"{record['machine']}, torch {record['packages']['torch']}, {record['how']}; all-MiniLM-L6-v2 on trans-de-en "
        f"(English side for the objectives without fraternal twins), {DEFAULT_STEPS} steps of batch 32, lr 1e-5, avg "
        f"pooling, every objective at its paper's defaults; the seeds counted in each row (from 1 up)"
        f"{' ' + ' '.join(extra) if extra else ''}. Best dev checkpoint, then STS-B test; Spearman × 100, mean ± std "
        "over seeds. Verdict: a mean paired difference within the larger seed std of the two is a tie."
    )
    return caption + "\n\n" + table_text(record["equal_steps"])


def runs_in_record(key: str, entry: dict) -> list[Run]:
    """The runs one objective's entry of the record holds, with their results."""
    return [
        Run(key, int(seed), entry["flags"], run["output_dir"], run["results"]) for seed, run in entry["runs"].items()
    ]


def headline_text(record: dict) -> str:
    """The main README's table, from the JSON record alone: IFCL against SimCSE at equal steps on the seeds both
    have, with the spread of the paired difference (its mean ± std over seeds, then each seed's)."""
    ifcl = runs_in_record("ifcl", record["equal_steps"]["ifcl"])
    simcse = runs_in_record(BASELINE, record["equal_steps"][BASELINE])
    differences = paired(ifcl, simcse, "test")
    seeds = sorted(differences)
    ifcl_summary = summary([run for run in ifcl if run.seed in differences])
    simcse_summary = summary([run for run in simcse if run.seed in differences])
    spread = statistics.stdev(differences.values()) if len(differences) > 1 else float("nan")
    caption = (
        f"all-MiniLM-L6-v2 on trans-de-en, {DEFAULT_STEPS} steps of batch 32, lr 1e-5; best dev checkpoint, then "
        f"STS-B test; Spearman × 100, mean ± std over seeds {', '.join(map(str, seeds))} ({record['machine']}; record: "
        "`benchmarks/results/objectives.json`, made by `python benchmarks/objectives.py --only ifcl,simcse --seeds "
        f"{' '.join(map(str, seeds))}`)."
    )
    per_seed = ", ".join(f"{differences[seed]:+.2f}" for seed in seeds)
    return "\n".join(
        [
            caption,
            "",
            "| objective | STS-B dev | STS-B test | paired test difference to SimCSE: mean ± std (per seed) |",
            "|---|---|---|---|",
            f"| IFCL | {pm(ifcl_summary['dev'])} | {pm(ifcl_summary['test'])} | "
            f"{statistics.fmean(differences.values()):+.2f} ± {spread:.2f} ({per_seed}) |",
            f"| SimCSE | {pm(simcse_summary['dev'])} | {pm(simcse_summary['test'])} | |",
        ]
    )


def equal_time_text(record: dict) -> str:
    """The equal-time caption and table that benchmarks/README.md shows, from the JSON record's ``equal_time``
    (in the format of ``equal_time``'s record: one with a ``unit``)."""
    timed = record["equal_time"]
    costs = timed["step_cpu_seconds"]
    caption = (
        f"Equal time: each objective trains for the IFCL default's mean training time at {DEFAULT_STEPS} steps, "
        f"{timed['budget_cpu_seconds']:.0f} {timed['unit']}, as many steps as its own training CPU seconds per step "
        f"allow (IFCL {costs['ifcl']:.2f}, "
        + ", ".join(f"{NAMES[key]} {costs[key]:.2f}" for key in timed["steps"] if key != "ifcl")
        + "), four dev evaluations each; otherwise as above."
    )
    return caption + "\n\n" + table_text(timed["runs"], equal_time=True)


def equal_time(args, extra: list[str], equal_steps: dict, previous: dict, wanted: list[str]) -> dict:
    """Train the equal-time runs; returns their JSON record (``equal_time_text`` is its table). The budget is the mean
    training time of IFCL's equal-step runs at the table's seeds (this call's and those recorded before)."""
    recorded = recorded_seeds(previous, "equal_time")
    seeds = {key: sorted(set(args.seeds) | set(recorded.get(key, []))) for key in EQUAL_TIME_RUNS}
    ifcl_runs = [run for run in equal_steps["ifcl"] if run.seed in seeds["ifcl"]]
    spent = [training_cpu_seconds(run.results) for run in ifcl_runs if run.results]
    if not spent or None in spent:
        raise SystemExit(
            f"--equal_time needs IFCL runs at equal steps at seeds {seeds['ifcl']} that recorded their training CPU "
            "seconds: train them first (--only ifcl --redo)."
        )
    budget = statistics.fmean(spent)
    kept = previous.get("equal_time", {})
    same_budget = kept.get("unit") == EQUAL_TIME_UNIT and not args.redo
    steps, step_costs = {"ifcl": DEFAULT_STEPS}, {"ifcl": budget / DEFAULT_STEPS}
    for key in EQUAL_TIME_RUNS[1:]:
        if same_budget and key in kept.get("steps", {}):  # a budget once trained on is kept
            steps[key], step_costs[key] = kept["steps"][key], kept["step_cpu_seconds"][key]
            continue
        at_seeds = [run for run in equal_steps[key] if run.seed in seeds[key]]
        cost = recorded_step_cost(at_seeds) or calibrated_step_cost(key, extra, args.jobs)
        steps[key], step_costs[key] = max(4, round(budget / cost)), cost
    costs = dict(step_costs)
    for key in COSTED_ONLY:
        costs[key] = kept.get("step_cpu_seconds", {}).get(key) if same_budget else None
        costs[key] = costs[key] or calibrated_step_cost(key, extra, args.jobs)
    # IFCL's equal-time runs are its equal-step runs: the budget is their time.
    timed = {"ifcl": ifcl_runs}
    for key in steps:
        if key == "ifcl":
            continue
        every = str(max(1, steps[key] // 4))
        budget_flags = ["--max_steps", str(steps[key]), "--eval_steps", every, "--save_steps", every]
        timed[key] = objective_runs([key], seeds, [*extra, *budget_flags], folder="objectives-equal-time")[key]
    benchmark_runs.restore_recorded(by_seed(timed), os.path.join(RESULTS, "objectives.json"))
    train_all([run for run in by_seed(timed) if run.key in wanted and run.key != "ifcl"], jobs=args.jobs)
    read_finished(by_seed(timed))
    return {
        "unit": EQUAL_TIME_UNIT,
        "budget_cpu_seconds": budget,
        "steps": steps,
        "step_cpu_seconds": costs,
        "runs": table_record(timed, steps, baseline_key="ifcl"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="Seeds of every run (default: 3).")
    parser.add_argument("--only", default=None, help=f"Comma-separated run keys: {', '.join(k for k, *_ in RUNS)}.")
    parser.add_argument(
        "--equal_time", action="store_true", help="Also the equal-time table (IFCL, SimCSE, PCL, miCSE)."
    )
    parser.add_argument("--jobs", type=int, default=2, help="Runs at a time (each gets cores / jobs threads).")
    parser.add_argument("--redo", action="store_true", help="Train finished runs again.")
    parser.add_argument("--report", action="store_true", help="Train nothing: the tables of the finished runs.")
    parser.add_argument(
        "--readme", action="store_true", help="Put the tables into benchmarks/README.md between their markers."
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    keys = [key for key, *_ in RUNS]
    wanted = args.only.split(",") if args.only else keys
    unknown = set(wanted) - set(keys)
    if unknown:
        raise SystemExit(f"--only: unknown run(s) {sorted(unknown)}; choose from {keys}.")

    recorded = os.path.join(RESULTS, "objectives.json")
    previous: dict = {}
    if os.path.isfile(recorded):
        with open(recorded, encoding="utf-8") as f:
            previous = json.load(f)
    # Each key keeps the seeds the JSON records for it, beside this call's.
    seeds = {key: sorted(set(args.seeds) | set(recorded_seeds(previous, "equal_steps").get(key, []))) for key in keys}
    equal_steps = objective_runs(keys, seeds, extra)
    if args.report:
        wanted = []
    trained = [run for run in by_seed(equal_steps) if run.key in wanted and run.seed in args.seeds]
    if not args.redo:
        benchmark_runs.restore_recorded(by_seed(equal_steps), recorded)
    else:  # --redo trains this call's runs again; the others stay as recorded
        benchmark_runs.restore_recorded([run for run in by_seed(equal_steps) if run not in trained], recorded)
    train_all(trained, jobs=args.jobs, redo=args.redo)
    read_finished(by_seed(equal_steps))  # and what earlier calls finished
    shown = {key: runs for key, runs in equal_steps.items() if any(run.results for run in runs)}
    how = f"{args.jobs} runs at a time, {max(1, (os.cpu_count() or 1) // args.jobs)} thread(s) each"
    output: dict = {
        "machine": machine(),
        "packages": package_versions(),
        "extra": extra,
        "how": how,
        "equal_steps": table_record(shown),
    }
    print("\n" + readme_text(output))

    if args.equal_time:
        output["equal_time"] = equal_time(args, extra, equal_steps, previous, wanted)
        print("\n" + equal_time_text(output))
    elif "equal_time" in previous:
        output["equal_time"] = previous["equal_time"]  # kept as recorded: this call did not look at it
    benchmark_runs.write_record(recorded, output)
    if args.readme:
        benchmark_runs.put_into_readme(readme_text(output), README_START, README_END)
        main_readme = os.path.join(os.path.dirname(RESULTS), os.pardir, "README.md")
        benchmark_runs.put_into_readme(headline_text(output), HEADLINE_START, HEADLINE_END, path=main_readme)
        if "unit" in output.get("equal_time", {}):  # a record from before the unit was recorded has no table here
            benchmark_runs.put_into_readme(equal_time_text(output), EQUAL_TIME_START, EQUAL_TIME_END)


if __name__ == "__main__":
    main()
