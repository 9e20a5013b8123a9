#!/usr/bin/env python
"""Memory and time of building an IFCL model from a large decoder, against loading the decoder alone.

    python benchmarks/load_memory.py                                  # this checkout
    git worktree add /tmp/ifcl-before 7dddf86
    python benchmarks/load_memory.py --before /tmp/ifcl-before        # and the code of another checkout, side by side

A random Qwen3-shaped decoder is saved once, in float32 safetensors: Qwen3's vocabulary of 151,936 ids, width 1,024
(16 query heads and 8 key-value heads of 128), 7 layers with MLPs of 3,072: 266M parameters, 1.06 GB. Its tokenizer is
the test suite's Qwen3-shaped one (byte-level BPE, no pad token), as the real one's files cannot be had offline here;
the word table's 151,936 rows are what the memory depends on. Each measurement runs in a fresh process, after its
imports:

- ``AutoModel.from_pretrained(folder)``: the decoder alone;
- ``IFCLModel.from_encoder(folder, pooler_type="last", eval_pooler_type="last")``: the model IFCL trains, with this
  checkout's code (and with ``--before``'s).

Memory: the peak resident memory (``VmHWM``) and the peak of anonymous memory (``RssAnon``, what the process allocated
itself, sampled every 10 ms; weights read from a memory-mapped file are not in it), both above the process's memory
after its imports, in GB (10^9 bytes), with every weight read once after the load (as the first training step reads
them: safetensors' memory-mapped weights are resident only once read); and the wall seconds of the load alone. Each
figure is the median of ``--repeats`` processes. Prints a table
and writes ``benchmarks/results/load_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runs import AnonymousMemoryPeak, machine, memory_mb, package_versions, reset_peak_rss, write_record  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHAPE = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 7,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": True,
}
GB = 1e9


def build_decoder(folder: str) -> dict:
    """The Qwen3-shaped decoder of :data:`SHAPE`, random, saved in float32 with the tests' Qwen3 tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from conftest import build_decoder_tokenizer

    build_decoder_tokenizer("qwen3", Path(folder))
    torch.manual_seed(0)
    model = Qwen3Model(Qwen3Config(**SHAPE))
    model.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    return {"parameters": parameters, "float32_gb": round(parameters * 4 / GB, 3)}


def worker(kind: str, folder: str, code: str | None) -> None:
    """One load in this process, its figures printed as a ``LOAD_MEMORY`` JSON line."""
    if code is not None:
        sys.path.insert(0, code)
    import torch
    from transformers import AutoModel

    from ifcl.model import IFCLModel

    baseline = memory_mb()
    reset_peak_rss()
    start = time.perf_counter()
    with AnonymousMemoryPeak() as anonymous:
        if kind == "AutoModel":
            model = AutoModel.from_pretrained(folder)
        else:
            model = IFCLModel.from_encoder(folder, pooler_type="last", eval_pooler_type="last")
        seconds = time.perf_counter() - start
        with torch.no_grad():  # every weight read once, as the first step does: memory-mapped ones count then
            for parameter in model.parameters():
                parameter.sum()
    figures = {
        "peak_rss_gb": (memory_mb()["VmHWM"] - baseline["VmRSS"]) * 2**20 / GB,
        "peak_anonymous_gb": (anonymous.peak - baseline["RssAnon"]) * 2**20 / GB,
        "seconds": seconds,
        "dtype": str(next(model.parameters()).dtype),
    }
    print("LOAD_MEMORY " + json.dumps(figures))


def measure(kind: str, folder: str, code: str | None, repeats: int) -> dict:
    """The median of ``repeats`` fresh processes."""
    runs = []
    for _ in range(repeats):
        command = [sys.executable, __file__, "--worker", kind, "--folder", folder]
        if code is not None:
            command += ["--code", code]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
        lines = [line for line in result.stdout.splitlines() if line.startswith("LOAD_MEMORY ")]
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"{kind} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
        runs.append(json.loads(lines[-1].removeprefix("LOAD_MEMORY ")))
    median = {
        key: round(statistics.median(run[key] for run in runs), 3)
        for key in ("peak_rss_gb", "peak_anonymous_gb", "seconds")
    }
    return {**median, "dtype": runs[0]["dtype"], "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another checkout whose IFCLModel.from_encoder to measure beside this one's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "load_memory.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--code", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.folder, args.code)
        return
    with tempfile.TemporaryDirectory() as work_dir:
        folder = os.path.join(work_dir, "qwen3-266m")
        decoder = build_decoder(folder)
        loads = {"AutoModel.from_pretrained": measure("AutoModel", folder, None, args.repeats)}
        loads["IFCLModel.from_encoder"] = measure("from_encoder", folder, None, args.repeats)
        if args.before:
            loads["IFCLModel.from_encoder, before"] = measure("from_encoder", folder, args.before, args.repeats)
    weights = decoder["float32_gb"]
    print(f"\n{decoder['parameters'] / 1e6:.0f}M parameters, {weights} GB in float32 ({machine()})")
    print(f"{'load':34} {'peak RSS GB':>12} {'peak anon GB':>13} {'× weights':>10} {'seconds':>8}")
    for name, figures in loads.items():
        ratio = max(figures["peak_rss_gb"], figures["peak_anonymous_gb"]) / weights
        figures["peak_over_weights"] = round(ratio, 2)
        print(
            f"{name:34} {figures['peak_rss_gb']:12.2f} {figures['peak_anonymous_gb']:13.2f} {ratio:10.2f} {figures['seconds']:8.1f}"
        )
    write_record(
        args.output,
        {
            "command": "python benchmarks/load_memory.py" + (" --before CHECKOUT" if args.before else ""),
            "machine": machine(),
            "versions": package_versions(),
            "decoder": {"shape": SHAPE, **decoder},
            "units": "GB = 10^9 bytes above the process's memory after its imports, every weight read once; seconds of wall time of the load; medians",
            "loads": loads,
        },
    )


if __name__ == "__main__":
    main()
