#!/usr/bin/env python
"""Cost of one training step, side by side in one run: prints a table and writes JSON.

1. IFCL step / SimCSE-ablation step (the fraternal view adds one forward and backward over N sequences: 1.5×
   is the ceiling to beat).
2. Our SimCSE ablation / sentence-transformers' MultipleNegativesRankingLoss step, same model, batch and data
   (ours must not be slower: ratio ≤ 1).
3. Peak memory of a step with queue sizes 0, 4, 16, 64 (a fresh process each, the queue filled) against the
   queue's own buffer size (CPU: model state plus the profiler's peak of live tensors in the step; GPU:
   ``torch.cuda.max_memory_allocated``).
4. On a GPU: samples/s and model FLOPs utilisation of a BERT-base-sized random-weight encoder at batch 64,
   length 32, bf16, and the projected time for one epoch of 10^6 sentences.

With ``--bf16``, instead: the IFCL and SimCSE steps in float32 and under bf16 autocast (``--bf16``'s mixed precision,
on the CPU when there is no GPU, labelled so), side by side, written to ``results/train_step_bf16.json``.

    python benchmarks/train_step.py                      # all-MiniLM-L6-v2, batch 32, length 32
    python benchmarks/train_step.py --steps 20 --batch_size 64
    python benchmarks/train_step.py --bf16               # float32 against bf16 autocast
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runs import DEFAULT_MODEL_NAME, default_model, machine, package_versions, write_record  # noqa: E402

from ifcl import queue as ring  # noqa: E402
from ifcl.data import parse_trans_de_en  # noqa: E402
from ifcl.losses import IFCLTerms  # noqa: E402
from ifcl.model import IFCLModel  # noqa: E402
from ifcl.objectives import fit_model  # noqa: E402

# Dense bf16 peak of the GPUs this project measures on, for model FLOPs utilisation.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


@functools.cache
def training_pairs() -> list[tuple[str, str]]:
    """The trans-de-en pairs, parsed once per process."""
    return parse_trans_de_en()


def batches(
    tokenizer, batch_size: int, max_length: int, count: int, device, fixed_length: bool = True
) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of trans-de-en pairs (English sentence, German fraternal).

    ``fixed_length``: every sequence padded to ``max_length``, so all runners see the same sequence length (the
    comparison the ratios are about); otherwise each side is padded to its own longest, as in training, where the
    German side is longer in the English vocabulary and the fraternal view costs more than one English view.
    """
    pairs = training_pairs()
    padding = "max_length" if fixed_length else True
    result = []
    for index in range(count):
        chunk = pairs[index * batch_size : (index + 1) * batch_size]
        sentence = tokenizer(
            [e for e, _ in chunk], padding=padding, truncation=True, max_length=max_length, return_tensors="pt"
        )
        fraternal = tokenizer(
            [g for _, g in chunk], padding=padding, truncation=True, max_length=max_length, return_tensors="pt"
        )
        batch = {k: v.to(device) for k, v in sentence.items()}
        batch["fraternal_input_ids"] = fraternal["input_ids"].to(device)
        batch["fraternal_attention_mask"] = fraternal["attention_mask"].to(device)
        result.append(batch)
    return result


def trainer_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The Trainer's default optimizer (``adamw_torch_fused``) over the parameters that require gradients, as the
    Trainer builds it (frozen word tables get no optimizer state); each runner also clips gradients as it does."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors (AdamW: two moments per trained parameter)."""
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if torch.is_tensor(v)
    )


class IFCLStep:
    """One optimizer step of IFCL (or an ablation): the model's twins, the loss of Eq. 9, backward, AdamW, queue."""

    def __init__(self, model_path: str, device, batch_size: int, dtype, **settings) -> None:
        self.model = IFCLModel.from_encoder(model_path, queue_batch_size=batch_size, **settings).to(device).train()
        fit_model(self.model)  # as the IFCL objective does before training
        config = self.model.config
        self.loss = IFCLTerms(config.contrastive_temperature, config.fraternal_loss_weight, config.twins_loss_weight)
        self.optimizer = trainer_optimizer(self.model)
        self.device, self.dtype = device, dtype

    def __call__(self, batch: dict[str, torch.Tensor]) -> None:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            twins = self.model(**batch, return_twins=True)
            queue, negatives = self.model.queue, (None, None)
            if queue is not None:
                negatives = ring.negatives(queue, self.model.config.forgetting_rate)
            loss, _ = self.loss(twins, *negatives)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if queue is not None:
            ring.push(queue, twins.anchor.detach())


class SentenceTransformersStep:
    """One optimizer step of sentence-transformers' MultipleNegativesRankingLoss with (x, x) pairs: SimCSE."""

    def __init__(self, model_path: str, device, batch_size: int, dtype) -> None:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        self.model = SentenceTransformer(model_path, device=str(device)).train()
        self.loss = MultipleNegativesRankingLoss(self.model, scale=20.0)
        self.optimizer = trainer_optimizer(self.model)
        self.device, self.dtype = device, dtype

    def __call__(self, batch: dict[str, torch.Tensor]) -> None:
        features = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.loss([dict(features), dict(features)], labels=None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(steps: dict[str, object], data: list[dict], rounds: int, warmup: int, device) -> dict[str, float]:
    """Median seconds per step of each runner; the runners take turns batch by batch, so noise hits all alike."""
    for runner in steps.values():
        for batch in data[:warmup]:
            runner(batch)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for batch in data[warmup:]:
            for name, runner in steps.items():
                sync(device)
                start = time.perf_counter()
                runner(batch)
                sync(device)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def queue_memory(args, device) -> list[dict[str, float]]:
    """Peak memory of IFCL training steps for each queue size, and the queue's own buffer size."""
    rows = []
    for queue_size in (0, 4, 16, 64):
        command = [sys.executable, __file__, "--measure_queue_memory", str(queue_size)] + [
            f"--{k}={v}"
            for k, v in (
                ("model", args.model),
                ("batch_size", args.batch_size),
                ("max_length", args.max_length),
                ("device", device.type),
            )
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
    base = rows[0]["peak_bytes"]
    for row in rows:
        row["added_bytes"] = row["peak_bytes"] - base
    return rows


def peak_cpu_allocation(step) -> int:
    """Peak bytes held by the tensors that ``step()`` allocates, from the profiler's allocation timeline.

    On the CPU, PyTorch keeps no allocator statistics and the process's peak RSS is set by model loading; the
    profiler records every allocation and release, and their running sum gives the peak of live tensor bytes.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    events = sorted(profiler.events(), key=lambda event: event.time_range.start)
    live = peak = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def state_bytes(runner: IFCLStep) -> int:
    """Bytes of what lives between steps: parameters, buffers (the queue among them), gradients, optimizer state."""
    tensors = list(runner.model.parameters()) + list(runner.model.buffers())
    tensors += [
        value for state in runner.optimizer.state.values() for value in state.values() if torch.is_tensor(value)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_queue_memory(args, device, dtype) -> None:
    """(Child process) peak memory of an IFCL step with one queue size; prints one JSON line.

    The queue is filled first, so every slot takes part in the loss. GPU: ``torch.cuda.max_memory_allocated``.
    CPU: the model's state plus the peak of what one step allocates (:func:`peak_cpu_allocation`).
    """
    queue_size = args.measure_queue_memory
    runner = IFCLStep(args.model, device, args.batch_size, dtype, queue_size=queue_size, forgetting_rate=0.0)
    data = batches(runner.model.tokenizer, args.batch_size, args.max_length, 2, device)
    runner(data[0])  # optimizer state and allocator warm
    if queue_size:
        for _ in range(queue_size):
            ring.push(runner.model.queue, torch.randn(args.batch_size, runner.model.hidden_size, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        runner(data[1])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = state_bytes(runner) + peak_cpu_allocation(lambda: runner(data[1]))
    hidden = runner.model.hidden_size
    print(
        json.dumps(
            {
                "queue_size": queue_size,
                "peak_bytes": peak,
                "queue_buffer_bytes": queue_size * args.batch_size * hidden * 4,
            }
        )
    )


def encoder_only_ratio(runner: IFCLStep, batch_size: int, max_length: int, device, rounds: int = 4) -> float:
    """Forward and backward of the bare encoder over 3N sequences against 2N, the 3N as the model makes them: one
    stacked call where it stacks the views (``stack_views``, the default off the CPU), else two calls, 2N and N.

    The floor of the IFCL/SimCSE ratio on this machine: what the third view costs with nothing else around it (in
    the runners' precision).
    """
    encoder = runner.model.encoder
    hidden = runner.model.hidden_size
    inputs = torch.randn(3 * batch_size, max_length, hidden, device=device)
    stacked = runner.model.config.stack_views
    stacked = device.type != "cpu" if stacked is None else stacked
    three_views = (3 * batch_size,) if stacked else (2 * batch_size, batch_size)

    def forward_backward(rows: int) -> None:
        embeds = inputs[:rows].clone().requires_grad_()
        with torch.autocast(device.type, dtype=runner.dtype, enabled=runner.dtype != torch.float32):
            hidden = encoder(inputs_embeds=embeds).last_hidden_state
        hidden.float().sum().backward()

    times: dict[str, list[float]] = {"2N": [], "3N": []}
    forward_backward(2 * batch_size)
    for _ in range(rounds):
        for name, calls in (("2N", (2 * batch_size,)), ("3N", three_views)):
            sync(device)
            start = time.perf_counter()
            for rows in calls:
                forward_backward(rows)
            sync(device)
            times[name].append(time.perf_counter() - start)
    encoder.zero_grad(set_to_none=True)
    return statistics.median(times["3N"]) / statistics.median(times["2N"])


def gpu_throughput(args, device) -> dict[str, float]:
    """BERT-base-sized random-weight encoder, batch 64, length 32, bf16: samples/s, MFU, and the projected time of an
    epoch of 10^6 sentences, from the median of ``--throughput_steps`` timed steps (the batches taken in turn)."""
    import tempfile

    from transformers import BertConfig, BertModel, BertTokenizerFast

    with tempfile.TemporaryDirectory() as folder:
        BertModel(BertConfig()).save_pretrained(folder)
        tokenizer = BertTokenizerFast.from_pretrained(args.model)  # any WordPiece vocabulary of 30522 will do
        tokenizer.save_pretrained(folder)
        runner = IFCLStep(folder, device, 64, torch.bfloat16, queue_size=4)
        data = batches(runner.model.tokenizer, 64, 32, 53, device)
        timed = [data[3 + step % 50] for step in range(args.throughput_steps)]
        seconds = time_steps({"ifcl": runner}, data[:3] + timed, rounds=1, warmup=3, device=device)["ifcl"]
    parameters = sum(p.numel() for n, p in runner.model.encoder.named_parameters() if "embeddings" not in n)
    tokens = sum(int(batch["attention_mask"].numel()) for batch in data[:1]) * 3  # three views
    flops = 6 * parameters * tokens
    name = torch.cuda.get_device_name(device)
    peak = next((value for key, value in PEAK_BF16_FLOPS.items() if key in name), None)
    return {
        "device": name,
        "seconds_per_step": seconds,
        "timed_steps": args.throughput_steps,
        "samples_per_second": 64 / seconds,
        "model_flops_utilisation": (flops / seconds / peak) if peak else None,
        "projected_epoch_hours_1e6_sentences": 1e6 / 64 * seconds / 3600,
    }


def profile_step(runner: IFCLStep, data: list[dict], device, path: str) -> None:
    """``torch.profiler`` over 5 IFCL steps after 2 warm-ups: the operators by their own device time (CPU time
    without a GPU), as a table written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for batch in data[:2]:
        runner(batch)
    with profile(activities=activities) as profiler:
        for batch in data[2:7]:
            runner(batch)
        sync(device)
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(profiler.key_averages().table(sort_by=sort_by, row_limit=30) + "\n")
    print(f"profile of the IFCL step: {path}")


def bf16_against_float32(args, device, model_name: str) -> None:
    """The IFCL and SimCSE steps in float32 and under bf16 autocast, taking turns batch by batch: s/step and ratios."""
    runners = {
        f"{name}_{label}": IFCLStep(args.model, device, args.batch_size, dtype, **settings)
        for name, settings in (
            ("ifcl", {"queue_size": 4, "forgetting_rate": 0.1}),
            ("simcse", {"objective": "simcse"}),
        )
        for label, dtype in (("float32", torch.float32), ("bf16_autocast", torch.bfloat16))
    }
    data = batches(runners["ifcl_float32"].model.tokenizer, args.batch_size, args.max_length, args.steps + 2, device)
    seconds = time_steps(runners, data, rounds=args.rounds, warmup=2, device=device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    results = {
        "device": where,
        "machine": machine(),
        "model": model_name,
        "packages": package_versions(),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "seconds_per_step": seconds,
        "bf16_over_float32": {
            name: seconds[f"{name}_bf16_autocast"] / seconds[f"{name}_float32"] for name in ("ifcl", "simcse")
        },
    }
    print(
        f"\nTraining step, float32 and bf16 autocast on the {where}, batch {args.batch_size}, length {args.max_length}"
    )
    print("| runner | s/step |\n|---|---|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.3f} |")
    for name, ratio in results["bf16_over_float32"].items():
        print(f"{name}: bf16 autocast / float32 s/step {ratio:.2f}×")
    write_record(os.path.join(os.path.dirname(args.output), "train_step_bf16.json"), results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="encoder folder or Hub id (default: all-MiniLM-L6-v2)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "train_step.json"))
    parser.add_argument("--measure_queue_memory", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help="float32 against bf16 autocast (train_step_bf16.json)")
    parser.add_argument("--throughput_steps", type=int, default=500, help="timed steps of the GPU's BERT-base figures")
    parser.add_argument("--profile", default=None, help="write torch.profiler's table of the IFCL step to this file")
    args = parser.parse_args()
    model_name = args.model or DEFAULT_MODEL_NAME
    args.model = args.model or default_model()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.measure_queue_memory is not None:
        measure_queue_memory(args, device, dtype)
        return
    if args.bf16:
        bf16_against_float32(args, device, model_name)
        return

    # "ifcl": the default, both word tables frozen; "ifcl_trained_tables": both trained; "simcse": the SimCSE
    # objective, which trains the whole encoder as its paper does; "simcse_ablation": IFCL without fraternal twins,
    # Twins loss and queue (its word table frozen like IFCL's).
    runners = {
        "ifcl": IFCLStep(args.model, device, args.batch_size, dtype, queue_size=4, forgetting_rate=0.1),
        "ifcl_trained_tables": IFCLStep(
            args.model,
            device,
            args.batch_size,
            dtype,
            queue_size=4,
            forgetting_rate=0.1,
            freeze_word_embeddings=False,
            freeze_fraternal_embeddings=False,
        ),
        "simcse": IFCLStep(args.model, device, args.batch_size, dtype, objective="simcse"),
        "simcse_ablation": IFCLStep(
            args.model, device, args.batch_size, dtype, queue_size=0, fraternal_loss_weight=0.0, twins_loss_weight=0.0
        ),
    }
    try:
        runners["sentence_transformers_mnrl"] = SentenceTransformersStep(args.model, device, args.batch_size, dtype)
    except ImportError:
        print('sentence-transformers is not installed: pip install -e ".[sentence-transformers]" for that comparison')
    tokenizer = runners["ifcl"].model.tokenizer
    data = batches(tokenizer, args.batch_size, args.max_length, args.steps + 2, device)
    seconds = time_steps(runners, data, rounds=args.rounds, warmup=2, device=device)
    # The same two runners on the training data as the collator pads it (each side to its own longest).
    natural = batches(tokenizer, args.batch_size, args.max_length, args.steps + 2, device, fixed_length=False)
    natural_seconds = time_steps(
        {name: runners[name] for name in ("ifcl", "ifcl_trained_tables", "simcse")},
        natural,
        rounds=args.rounds,
        warmup=0,
        device=device,
    )
    tokens = {
        side: statistics.mean(float(b[key].sum()) / b[key].shape[0] for b in natural)
        for side, key in (("sentence", "attention_mask"), ("fraternal", "fraternal_attention_mask"))
    }
    floor = encoder_only_ratio(runners["ifcl"], args.batch_size, args.max_length, device)
    results = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)",
        "machine": machine(),
        "model": model_name,
        "packages": package_versions(*(["sentence_transformers"] if "sentence_transformers_mnrl" in runners else [])),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "seconds_per_step": seconds,
        "ifcl_over_simcse": seconds["ifcl"] / seconds["simcse"],
        "ifcl_trained_tables_over_simcse": seconds["ifcl_trained_tables"] / seconds["simcse"],
        "ifcl_over_ifcl_trained_tables": seconds["ifcl"] / seconds["ifcl_trained_tables"],
        "ifcl_over_simcse_ablation": seconds["ifcl"] / seconds["simcse_ablation"],
        "encoder_only_3n_over_2n": floor,
        "optimizer_state_mb": {
            name: optimizer_state_bytes(runner.optimizer) / 2**20
            for name, runner in runners.items()
            if isinstance(runner, IFCLStep)
        },
        "training_lengths": {
            "seconds_per_step": natural_seconds,
            "ifcl_over_simcse": natural_seconds["ifcl"] / natural_seconds["simcse"],
            "ifcl_trained_tables_over_simcse": natural_seconds["ifcl_trained_tables"] / natural_seconds["simcse"],
            "mean_tokens_per_sentence": tokens,
        },
    }
    if "sentence_transformers_mnrl" in seconds:
        results["simcse_over_sentence_transformers"] = seconds["simcse"] / seconds["sentence_transformers_mnrl"]
    if args.profile:
        profile_step(runners["ifcl"], data, device, args.profile)
    results["queue_memory"] = queue_memory(args, device)
    if device.type == "cuda":
        results["bert_base_bf16"] = gpu_throughput(args, device)

    print(f"\nTraining step, {results['device']}, batch {args.batch_size}, length {args.max_length}")
    print("| runner | s/step |\n|---|---|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.3f} |")
    print(f"\nIFCL (tables frozen) / SimCSE: {results['ifcl_over_simcse']:.2f}× (ceiling 1.5×)")
    print(f"IFCL (tables trained) / SimCSE: {results['ifcl_trained_tables_over_simcse']:.2f}×")
    print(f"IFCL frozen / trained tables: {results['ifcl_over_ifcl_trained_tables']:.2f}×")
    print(f"IFCL / SimCSE ablation (word table frozen in both): {results['ifcl_over_simcse_ablation']:.2f}×")
    print(f"bare encoder, forward and backward over 3N against 2N sequences: {floor:.2f}×")
    print("optimizer state (MB): " + ", ".join(f"{k} {v:.1f}" for k, v in results["optimizer_state_mb"].items()))
    lengths = results["training_lengths"]
    print(
        f"with training padding (English {tokens['sentence']:.1f}, German {tokens['fraternal']:.1f} tokens on average): "
        f"IFCL {natural_seconds['ifcl']:.3f} s, IFCL trained tables {natural_seconds['ifcl_trained_tables']:.3f} s, "
        f"SimCSE {natural_seconds['simcse']:.3f} s: {lengths['ifcl_over_simcse']:.2f}× and "
        f"{lengths['ifcl_trained_tables_over_simcse']:.2f}×"
    )
    if "simcse_over_sentence_transformers" in results:
        print(
            f"our SimCSE / sentence-transformers MNRL: {results['simcse_over_sentence_transformers']:.2f}× (≤ 1 is not slower)"
        )
    print("\nPeak memory of one step (model state included; the queue filled):")
    print("| queue size k | peak memory (MB) | added vs k=0 (MB) | queue buffer (MB) |\n|---|---|---|---|")
    for row in results["queue_memory"]:
        print(
            f"| {row['queue_size']} | {row['peak_bytes'] / 2**20:.1f} | {row['added_bytes'] / 2**20:.2f} | {row['queue_buffer_bytes'] / 2**20:.2f} |"
        )
    if "bert_base_bf16" in results:
        gpu = results["bert_base_bf16"]
        print(
            f"\nBERT-base bf16 batch 64 on {gpu['device']}: {gpu['samples_per_second']:.0f} samples/s, "
            f"MFU {gpu['model_flops_utilisation']}, one epoch of 10^6 sentences ≈ {gpu['projected_epoch_hours_1e6_sentences']:.2f} h"
        )
    write_record(args.output, results)


if __name__ == "__main__":
    main()
