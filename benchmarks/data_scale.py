#!/usr/bin/env python
"""Memory and time of reading and tokenizing training files of 10^4–10^6 generated pairs, before and after the
training data moved off the heap; the heap of a one-step ``run_ifcl.py`` run on 10^5 and on 10^6 pairs; and what the
text cache's content hashes cost.

    python benchmarks/data_scale.py                            # 10^4, 10^5, 10^6 pairs; every part
    python benchmarks/data_scale.py --sizes 10000 100000 --parts tokenize
    python benchmarks/data_scale.py --parts text_cache         # the hashes alone
    python benchmarks/data_scale.py --parts run stream --run_sizes 100000 1000000 10000000
    python benchmarks/data_scale.py --parts sampler            # 10^6, 10^7, 10^8 rows

Each measurement runs in a fresh process (this script with ``--worker``), on a ``sentence<TAB>translation`` .txt
file of generated English–German pairs, with the real tokenizer of all-MiniLM-L6-v2 (the embedded default):

- ``old``: the previous code path (``ifcl/data.py`` before the Arrow cache, kept below as :func:`old_read_train_txt`):
  the file read into Python lists, then an in-memory ``Dataset.from_dict``, tokenized in memory by the same
  ``tokenize_training_text``;
- ``new``: ``load_train_dataset`` (parsed into a memory-mapped Arrow file) and ``tokenize_training_text`` (tokens
  cached on disk), from an empty cache;
- ``new, cached``: the same again, the caches now present (what the other ranks and later runs do);
- ``run``: ``run_ifcl.main`` with ``--do_train --max_steps 1`` (no evaluation), from an empty cache: the time to the
  first step (and the model's save after it) on the memory-mapped route;
- ``stream``: the same with ``--streaming``, which writes no cache;
- ``sampler``: the first row of an epoch's order of 10^6–10^8 map-style rows (``--sampler_sizes``), ``before`` by
  accelerate's seeded random sampler (the Trainer's, a Python list of every row) and ``after`` by
  ``ifcl.data.ShuffledRows``;
- ``text_cache``: ``load_train_dataset`` from an empty cache (the parse) and from the cache (best of 3), and the two
  SHA-256 hashes a cached read makes (best of 3, the files in the page cache): the training file's, which names its
  cache, and the Arrow cache's, which shows it unchanged since written.

Memory: peak RSS (``VmHWM``) and the peak of anonymous memory (``RssAnon``: the heap, what the process allocated
itself; memory-mapped file pages are not in it), sampled every 10 ms, each also above the process's memory after
its imports and model load. Prints a table and writes ``benchmarks/results/data_scale.json``, keeping the figures
of the parts and sizes not measured this time; ``machine`` is the machine of ``tokenize`` and ``run``, and
``text_cache`` names its own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runs import AnonymousMemoryPeak, machine, memory_mb, reset_peak_rss, write_record  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = os.path.join(ROOT, "benchmarks", "results", "data_scale.json")
PATHS = ("old", "new", "new_cached")
PARTS = ("tokenize", "run", "stream", "text_cache", "sampler")
SAMPLERS = ("before", "after")
ENGLISH_WORDS = (
    "the a man woman child dog cat house city river tree book letter friend teacher doctor train car road "
    "morning evening night day week year water bread music garden window door table street market school "
    "reads writes sees finds opens closes buys sells carries brings takes gives loves knows hears wants "
    "old new small large quiet loud early late green red happy tired slowly quickly today yesterday often "
    "in on under near with without behind before after and but because"
).split()
GERMAN_WORDS = (
    "der die das ein eine Mann Frau Kind Hund Katze Haus Stadt Fluss Baum Buch Brief Freund Lehrer Arzt Zug "
    "Auto Straße Morgen Abend Nacht Tag Woche Jahr Wasser Brot Musik Garten Fenster Tür Tisch Markt Schule "
    "liest schreibt sieht findet öffnet schließt kauft verkauft trägt bringt nimmt gibt liebt kennt hört will "
    "alt neu klein groß leise laut früh spät grün rot glücklich müde langsam schnell heute gestern oft "
    "in auf unter neben mit ohne hinter vor nach und aber weil"
).split()


def write_pairs(path: str, count: int, seed: int = 0) -> None:
    """``count`` generated ``English<TAB>German`` lines of 6–16 words each (deterministic for a seed)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(count):
            english = " ".join(rng.choices(ENGLISH_WORDS, k=rng.randint(6, 16)))
            german = " ".join(rng.choices(GERMAN_WORDS, k=rng.randint(6, 16)))
            handle.write(f"{english.capitalize()}.\t{german[0].upper()}{german[1:]}.\n")


def old_read_train_txt(path: str) -> dict[str, list[str]]:
    """The previous reading of a .txt training file (``ifcl.data._read_train_txt`` before the Arrow cache): every
    pair into two Python lists. Error handling left out: the benchmark's file is well formed."""
    sentences: list[str] = []
    fraternals: list[str] = []
    with open(path, "rb") as handle:
        for raw in handle:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            sentences.append(fields[0].strip())
            fraternals.append(fields[1].strip())
    return {"sentence": sentences, "fraternal": fraternals}


def tokenize_file(path_kind: str, train_file: str) -> None:
    """Read and tokenize ``train_file`` the ``old`` or ``new`` way. The model and tokenizer are loaded before the
    measurement starts."""
    import datasets

    from ifcl.data import embedded_model_path, load_train_dataset
    from ifcl.model import IFCLModel
    from ifcl.objectives import build_objective

    model = IFCLModel.from_encoder(embedded_model_path())
    objective = build_objective(model)
    reset_peak_rss()
    baseline = memory_mb()
    start = time.perf_counter()
    with AnonymousMemoryPeak() as anonymous:
        if path_kind == "old":
            text = datasets.Dataset.from_dict(old_read_train_txt(train_file))
        else:
            text = load_train_dataset(train_file)
        features = objective.tokenize_dataset(text, model.tokenizer, 32)
        rows = len(features)
    report(baseline, anonymous.peak, time.perf_counter() - start, rows=rows)


def one_step_run(train_file: str, output_dir: str, streaming: bool = False) -> None:
    """``run_ifcl.main`` training one step on ``train_file`` (no evaluation), the memory-mapped route or, with
    ``streaming``, ``--streaming``, measured from its start."""
    import run_ifcl

    settings = "--do_train --max_steps 1 --eval_strategy no --save_strategy no --load_best_model_at_end false"
    settings += " --use_cpu --report_to none --logging_steps 1" + (" --streaming" if streaming else "")
    argv = ["--train_file", train_file, "--output_dir", output_dir, *settings.split()]
    reset_peak_rss()
    baseline = memory_mb()
    start = time.perf_counter()
    with AnonymousMemoryPeak() as anonymous:
        _, metrics = run_ifcl.main(argv)
    report(baseline, anonymous.peak, time.perf_counter() - start, rows=int(metrics["train_samples"]))


def first_row_of_an_epoch(kind: str, rows: int) -> None:
    """The first row of an epoch's order of ``rows`` map-style rows: ``before``, accelerate's seeded random sampler
    (the order the Trainer's sampler gave, as a Python list of every row); ``after``, ``ifcl.data.ShuffledRows``."""
    from accelerate.data_loader import SeedableRandomSampler

    from ifcl.data import ShuffledRows

    reset_peak_rss()
    baseline = memory_mb()
    start = time.perf_counter()
    with AnonymousMemoryPeak() as anonymous:
        sampler = SeedableRandomSampler(data_source=range(rows), data_seed=42) if kind == "before" else None
        first = next(iter(sampler if sampler is not None else ShuffledRows(rows, 42)))
    assert isinstance(first, int)
    report(baseline, anonymous.peak, time.perf_counter() - start, rows=rows)


def best_seconds(work, repeats: int = 3) -> tuple[float, object]:
    """The shortest of ``repeats`` timings of ``work()`` (the others' noise is another job's), and its result."""
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        timings.append(time.perf_counter() - start)
    return round(min(timings), 3), result


def text_cache(train_file: str) -> None:
    """``load_train_dataset`` parsing ``train_file`` into an empty text cache, then reading it back; and the two
    hashes of a cached read, timed alone."""
    from ifcl.data import file_sha256, load_train_dataset

    start = time.perf_counter()
    rows = len(load_train_dataset(train_file))
    parse = round(time.perf_counter() - start, 2)
    cached_read, dataset = best_seconds(lambda: load_train_dataset(train_file))
    (arrow,) = [entry["filename"] for entry in dataset.cache_files]
    figures = {
        "rows": rows,
        "parse_seconds": parse,
        "cached_read_seconds": cached_read,
        "content_hash_seconds": best_seconds(lambda: file_sha256(train_file))[0],
        "cache_check_seconds": best_seconds(lambda: file_sha256(arrow))[0],
        "arrow_mb": round(os.path.getsize(arrow) / 2**20, 1),
    }
    print("DATA_SCALE " + json.dumps(figures), flush=True)


def report(baseline: dict[str, float], anonymous_peak: float, seconds: float, rows: int) -> None:
    """Print the worker's figures as one JSON line for the parent."""
    final = memory_mb()
    figures = {
        "rows": rows,
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(final["VmHWM"], 1),
        "peak_anonymous_mb": round(anonymous_peak, 1),
        "baseline_rss_mb": round(baseline["VmRSS"], 1),
        "baseline_anonymous_mb": round(baseline["RssAnon"], 1),
        "anonymous_above_baseline_mb": round(anonymous_peak - baseline["RssAnon"], 1),
    }
    print("DATA_SCALE " + json.dumps(figures), flush=True)


def run_worker(kind: str, size: int, work_dir: str) -> dict:
    """One measurement in a fresh process; ``new_cached`` and ``run`` reuse or own caches as their names say."""
    train_file = os.path.join(work_dir, f"pairs_{size}.txt")
    cache = os.path.join(work_dir, f"cache_{kind.replace('_cached', '')}_{size}")
    if kind != "new_cached":  # from an empty cache (and a new output folder for the run)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(os.path.join(work_dir, f"{kind}_{size}"), ignore_errors=True)
    env = {**os.environ, "IFCL_DATA_CACHE": cache, "HF_DATASETS_CACHE": cache, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--worker", kind, "--size", str(size), "--work_dir", work_dir]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in result.stdout.splitlines() if line.startswith("DATA_SCALE ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} on {size} pairs failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    figures = json.loads(lines[-1].removeprefix("DATA_SCALE "))
    figures["cache_disk_mb"] = round(folder_size(cache) / 2**20, 1) if os.path.isdir(cache) else 0.0
    if os.path.isfile(train_file):
        figures["file_mb"] = round(os.path.getsize(train_file) / 2**20, 1)
    return figures


def folder_size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def print_table(results: dict) -> None:
    print(
        "\n| pairs | path | s | peak RSS (MB) | peak anonymous (MB) | anonymous above start (MB) | cache on disk (MB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for size, by_path in results["tokenize"].items():
        for kind, figures in by_path.items():
            print(
                f"| {int(size):,} | {kind} | {figures['seconds']} | {figures['peak_rss_mb']} | "
                f"{figures['peak_anonymous_mb']} | {figures['anonymous_above_baseline_mb']} | "
                f"{figures['cache_disk_mb']} |"
            )
    if results.get("run"):
        print("\n| run_ifcl.py, 1 step | s | peak RSS (MB) | peak anonymous (MB) | anonymous above start (MB) |")
        print("|---|---|---|---|---|")
        for size, figures in results["run"].items():
            print(
                f"| {int(size):,} pairs | {figures['seconds']} | {figures['peak_rss_mb']} | "
                f"{figures['peak_anonymous_mb']} | {figures['anonymous_above_baseline_mb']} |"
            )
        if "run_heap_difference_mb" in results:
            print(f"\nHeap of the 1-step run, 10^6 pairs minus 10^5 pairs: {results['run_heap_difference_mb']} MB")
    if results.get("stream"):
        print(
            "\n| run_ifcl.py --streaming, 1 step | s | peak RSS (MB) | peak anonymous (MB) | anonymous above start (MB) |"
        )
        print("|---|---|---|---|---|")
        for size, figures in results["stream"].items():
            print(
                f"| {int(size):,} pairs | {figures['seconds']} | {figures['peak_rss_mb']} | "
                f"{figures['peak_anonymous_mb']} | {figures['anonymous_above_baseline_mb']} |"
            )
    if results.get("sampler"):
        print(f"\nFirst row of an epoch's order ({results['sampler']['machine']}):")
        print("\n| rows | sampler | s | anonymous above start (MB) |")
        print("|---|---|---|---|")
        for size, by_kind in results["sampler"]["rows"].items():
            for kind, figures in by_kind.items():
                print(f"| {int(size):,} | {kind} | {figures['seconds']} | {figures['anonymous_above_baseline_mb']} |")
    if results.get("text_cache"):
        print(f"\nText cache ({results['text_cache']['machine']}):")
        print(
            "\n| pairs | file (MB) | Arrow (MB) | parse s | cached read s | of which: content hash s | cache check s |"
        )
        print("|---|---|---|---|---|---|---|")
        for size, figures in results["text_cache"]["pairs"].items():
            print(
                f"| {int(size):,} | {figures['file_mb']} | {figures['arrow_mb']} | {figures['parse_seconds']} | "
                f"{figures['cached_read_seconds']} | {figures['content_hash_seconds']} | "
                f"{figures['cache_check_seconds']} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--run_sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--sampler_sizes", type=int, nargs="+", default=[10**6, 10**7, 10**8])
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="What to measure (default: all)."
    )
    parser.add_argument("--work_dir", default=None, help="Where the generated files and caches go (default: temp).")
    workers = [*PATHS, "run", "stream", "text_cache", *(f"sampler_{kind}" for kind in SAMPLERS)]
    parser.add_argument("--worker", choices=workers, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        train_file = os.path.join(args.work_dir, f"pairs_{args.size}.txt")
        if args.worker in ("run", "stream"):
            output = os.path.join(args.work_dir, f"{args.worker}_{args.size}")
            return one_step_run(train_file, output, streaming=args.worker == "stream")
        if args.worker.startswith("sampler_"):
            return first_row_of_an_epoch(args.worker.removeprefix("sampler_"), args.size)
        if args.worker == "text_cache":
            return text_cache(train_file)
        return tokenize_file(args.worker, train_file)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="ifcl_data_scale_")
    os.makedirs(work_dir, exist_ok=True)
    results = {}
    if os.path.isfile(RESULTS):
        with open(RESULTS, encoding="utf-8") as handle:
            results = json.load(handle)
    if {"tokenize", "run"} & set(args.parts):
        results.update(machine=machine(), tokenizer="all-MiniLM-L6-v2 (embedded)", max_seq_length=32)
    results.setdefault("tokenize", {})
    results.setdefault("run", {})
    results.setdefault("stream", {})
    run_sizes = args.run_sizes if {"run", "stream"} & set(args.parts) else []
    for size in sorted(set(args.sizes if {"tokenize", "text_cache"} & set(args.parts) else []) | set(run_sizes)):
        if not os.path.isfile(os.path.join(work_dir, f"pairs_{size}.txt")):
            write_pairs(os.path.join(work_dir, f"pairs_{size}.txt"), size)
    for size in args.sizes if "tokenize" in args.parts else []:
        results["tokenize"][str(size)] = {kind: run_worker(kind, size, work_dir) for kind in PATHS}
        print(f"{size:,} pairs: " + json.dumps(results["tokenize"][str(size)]), flush=True)
    for size in run_sizes:
        for part in ("run", "stream"):
            if part in args.parts:
                results[part][str(size)] = run_worker(part, size, work_dir)
                print(f"{part}: run_ifcl.py on {size:,} pairs: " + json.dumps(results[part][str(size)]), flush=True)
    if "sampler" in args.parts:
        results["sampler"] = {"machine": machine(), "rows": results.get("sampler", {}).get("rows", {})}
        for size in args.sampler_sizes:
            results["sampler"]["rows"][str(size)] = {
                kind: run_worker(f"sampler_{kind}", size, work_dir) for kind in SAMPLERS
            }
            print(f"sampler, {size:,} rows: " + json.dumps(results["sampler"]["rows"][str(size)]), flush=True)
    if {"100000", "1000000"} <= set(results["run"]):
        heap = {size: results["run"][size]["peak_anonymous_mb"] for size in ("100000", "1000000")}
        results["run_heap_difference_mb"] = round(heap["1000000"] - heap["100000"], 1)
    if "text_cache" in args.parts:
        results["text_cache"] = {"machine": machine(), "pairs": results.get("text_cache", {}).get("pairs", {})}
        for size in args.sizes:
            results["text_cache"]["pairs"][str(size)] = run_worker("text_cache", size, work_dir)
            print(
                f"text cache of {size:,} pairs: " + json.dumps(results["text_cache"]["pairs"][str(size)]), flush=True
            )
    print_table(results)
    write_record(RESULTS, results)
    print(f"(work folder {work_dir})")


if __name__ == "__main__":
    main()
