#!/usr/bin/env python
"""Translation speed of prepare_fraternal.py's two engines, side by side: transformers' ``generate`` against
CTranslate2, on a random-weight Marian model of opus-mt-en-de's size (d_model 512, 6 + 6 layers, 8 heads, feed-forward
2048, 58,101 tokens), every translation exactly ``--target_tokens`` tokens long on both engines (minimum = maximum
length), greedy, in interleaved rounds over the same sentences. On the CPU, and on a GPU when there is one.

    python benchmarks/translate_speed.py                       # 64 sentences, 3 rounds, 32 target tokens
    python benchmarks/translate_speed.py --sentences 256 --rounds 5

Nothing is downloaded: the model is built from its config with random weights, and its tokenizer is a word-level one
built here whose vocabulary is the benchmark sentences' words padded with filler tokens to opus-mt-en-de's 58,101
(the speed of a model does not depend on what its tokens mean; the vocabulary size sets the output layer's cost).
Writes ``benchmarks/results/translate_speed.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runs import cpu, package_versions, write_record  # noqa: E402

OPUS_MT_EN_DE = {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab_size": 58101, "positions": 512}
WORDS = (
    "the a man woman child dog cat plays reads runs sits walks on in at with from to city field book train music "
    "quietly yesterday today green cold small large old new river house street morning evening and but because "
    "while after before under over between garden school window table friend teacher doctor market station"
).split()
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "translate_speed.json")


def make_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` sentences of 12 to 28 words (about opus-mt's typical source length)."""
    generator = random.Random(seed)
    return [
        " ".join(generator.choice(WORDS) for _ in range(generator.randint(12, 28))).capitalize() + "."
        for _ in range(count)
    ]


def build_model(folder: str) -> None:
    """Save a random-weight Marian model of opus-mt-en-de's size and its word-level tokenizer (``<pad>`` last, as
    opus-mt's and as CTranslate2's converter wants) into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    words = sorted({word.lower() for word in WORDS} | {word.capitalize() for word in WORDS} | {"."})
    size = OPUS_MT_EN_DE["vocab_size"]
    tokens = ["</s>", "<unk>", "<s>", *words]
    tokens += [f"filler{i}" for i in range(size - len(tokens) - 1)] + ["<pad>"]
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(tokens)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>", bos_token="<s>"
    )
    torch.manual_seed(0)
    shape = OPUS_MT_EN_DE
    config = MarianConfig(
        vocab_size=size,
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"],
        max_position_embeddings=shape["positions"],
        pad_token_id=size - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
        decoder_start_token_id=size - 1,
    )
    MarianMTModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def transformers_runner(folder: str, device: str, dtype: torch.dtype, batch_size: int, target_tokens: int):
    """A function that translates sentences with ``generate`` at exactly ``target_tokens`` new tokens; returns the
    number of target tokens it generated."""
    from transformers import AutoTokenizer, MarianMTModel

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder, dtype=dtype).to(device).eval()

    def run(sentences: list[str]) -> int:
        generated = 0
        for start in range(0, len(sentences), batch_size):
            encoded = tokenizer(sentences[start : start + batch_size], padding=True, return_tensors="pt").to(device)
            with torch.inference_mode():
                output = model.generate(
                    **encoded, num_beams=1, do_sample=False, min_new_tokens=target_tokens, max_new_tokens=target_tokens
                )
            generated += (output.shape[1] - 1) * output.shape[0]  # all rows are target_tokens long (no padding)
        return generated

    return run


def ctranslate2_runner(ct2_folder: str, folder: str, device: str, compute_type: str, batch_size: int, target_tokens):
    """The same with CTranslate2 (``min_decoding_length = max_decoding_length``)."""
    import ctranslate2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    options = {"intra_threads": torch.get_num_threads()} if device == "cpu" else {}
    translator = ctranslate2.Translator(ct2_folder, device=device, compute_type=compute_type, **options)

    def run(sentences: list[str]) -> int:
        tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sentences)["input_ids"]]
        results = translator.translate_batch(
            tokens,
            max_batch_size=batch_size,
            beam_size=1,
            min_decoding_length=target_tokens,
            max_decoding_length=target_tokens,
        )
        return sum(len(result.hypotheses[0]) for result in results)

    return run


def measure(runners: dict[str, Any], sentences: list[str], rounds: int) -> dict[str, dict[str, float]]:
    """Each runner once to warm up, then ``rounds`` interleaved rounds; each runner's median round."""
    for run in runners.values():
        run(sentences[: min(len(sentences), 8)])
    times: dict[str, list[float]] = {name: [] for name in runners}
    tokens: dict[str, int] = {}
    for round_number in range(rounds):
        for name, run in runners.items():
            started = time.perf_counter()
            tokens[name] = run(sentences)
            times[name].append(time.perf_counter() - started)
            print(f"round {round_number + 1}: {name}: {times[name][-1]:.2f} s", flush=True)
    report = {}
    for name in runners:
        median = sorted(times[name])[len(times[name]) // 2]
        report[name] = {
            "seconds_median": round(median, 3),
            "seconds_all": [round(t, 3) for t in times[name]],
            "sentences_per_second": round(len(sentences) / median, 2),
            "target_tokens_per_second": round(tokens[name] / median, 1),
            "target_tokens_per_sentence": tokens[name] / len(sentences),
        }
    return report


def machine_record() -> dict[str, Any]:
    """The machine, its threads and the versions that made the figures."""
    return {
        "cpu": cpu(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "ctranslate2_intra_threads": torch.get_num_threads(),
        **package_versions("ctranslate2"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target_tokens", type=int, default=32, help="tokens every translation has, both engines")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of both engines")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from ifcl.ctranslate2_engine import make_converter

    sentences = make_sentences(args.sentences)
    report: dict[str, Any] = {
        "machine": machine_record(),
        "model": OPUS_MT_EN_DE,
        "settings": {k: v for k, v in vars(args).items() if k != "output"} | {"beam": 1},
    }
    with tempfile.TemporaryDirectory() as scratch:
        folder, ct2_folder = os.path.join(scratch, "marian"), os.path.join(scratch, "marian-ct2")
        build_model(folder)
        make_converter(folder).convert(ct2_folder)
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            batch, tokens = args.batch_size, args.target_tokens
            if device == "cpu":
                runners = {
                    "transformers float32": transformers_runner(folder, device, torch.float32, batch, tokens),
                    "ctranslate2 int8": ctranslate2_runner(ct2_folder, folder, device, "int8", batch, tokens),
                    "ctranslate2 float32": ctranslate2_runner(ct2_folder, folder, device, "float32", batch, tokens),
                }
            else:
                runners = {
                    "transformers float16": transformers_runner(folder, device, torch.float16, batch, tokens),
                    "ctranslate2 float16": ctranslate2_runner(ct2_folder, folder, device, "float16", batch, tokens),
                    "ctranslate2 int8_float16": ctranslate2_runner(
                        ct2_folder, folder, device, "int8_float16", batch, tokens
                    ),
                }
            figures = measure(runners, sentences, args.rounds)
            baseline = next(name for name in figures if name.startswith("transformers"))
            for name, figure in figures.items():
                figure["speedup_vs_transformers"] = round(
                    figure["sentences_per_second"] / figures[baseline]["sentences_per_second"], 2
                )
            report[device] = figures
    for device in ("cpu", "cuda"):
        for name, figure in report.get(device, {}).items():
            print(
                f"{device} {name:28s} {figure['sentences_per_second']:8.2f} sentences/s "
                f"{figure['target_tokens_per_second']:9.1f} target tokens/s  x{figure['speedup_vs_transformers']}"
            )
    write_record(args.output, report)


if __name__ == "__main__":
    main()
