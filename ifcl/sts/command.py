#!/usr/bin/env python
"""Evaluate a sentence encoder on the STS tasks of the IFCL paper (Tables 1 and 3) and on your own STS files.

With ``ifcl.STSEvaluator``, the Trainer's evaluator; docs/evaluation.md tells the rest.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import HfArgumentParser

from configuration_ifcl import POOLER_TYPES
from ifcl.arguments import check_within, command_line
from ifcl.data import load_train_dataset
from ifcl.failures import failures_of_the_run, run_command
from ifcl.files import RUN_IN_PROGRESS_FILE, check_model_path, write_json_atomically
from ifcl.hub import check_model_reachable
from ifcl.processes import log_to_stdout
from ifcl.reports import markdown_table, scatter_plot, score_text
from ifcl.sts.encoders import (
    MODEL_TYPES,
    MutualInformationEvaluator,
    consecutive_batches,
    load_encoder,
    mutual_information,
)
from ifcl.sts.evaluator import STSEvaluator
from ifcl.sts.tasks import (
    ALL_TASKS,
    CHINESE_TASKS,
    ENGLISH_TASKS,
    TASK_TITLES,
    STSData,
    load_requests,
    parse_task_requests,
)

logger = logging.getLogger("evaluate_sts")

RESULTS_MARKDOWN = "sts_results.md"
RESULTS_JSON = "sts_results.json"
# The folder, inside the output folder, of the results of --truncate_dim N: each size keeps its own files.
SIZE_FOLDER = re.compile(r"truncate_dim_(\d+)")


@dataclass
class ModelArguments:
    """Which encoder, and how it embeds."""

    model_name_or_path: str = field(
        metadata={"help": "Folder or Hub id of an IFCL, transformers or sentence-transformers model."}
    )
    model_type: str = field(
        default="auto", metadata={"help": f"One of {MODEL_TYPES}; auto: from config.json and modules.json."}
    )
    pooler_type: str | None = field(
        default=None,
        metadata={"help": f"One of {POOLER_TYPES}; None: an IFCL model's own, avg for plain encoders."},
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Truncation length; None: the model's own limit, as IFCLModel.encode and the Trainer."},
    )
    truncate_dim: int | None = field(
        default=None,
        metadata={
            "help": "Score the embeddings' first that many dimensions (a Matryoshka size); its results go to "
            "truncate_dim_<N>/ inside the output folder. None: all of them."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Run the code a plain or sentence-transformers model ships with; an IFCL model's never runs."
        },
    )

    def __post_init__(self) -> None:

        if os.path.isfile(os.path.join(self.model_name_or_path, RUN_IN_PROGRESS_FILE)):
            raise ValueError(
                f"--model_name_or_path {self.model_name_or_path} holds an unfinished training run "
                f"({RUN_IN_PROGRESS_FILE}: interrupted, or still going), so its weights may not be the final ones. "
                f"Evaluate one of its checkpoint-* folders, or resume the run with --resume_from_checkpoint last."
            )
        check_model_path("--model_name_or_path", self.model_name_or_path)
        check_model_reachable("--model_name_or_path", self.model_name_or_path)
        check_within(self, "[1, inf)", "max_seq_length", "truncate_dim")


@dataclass
class EvaluationArguments:
    """Which STS sets, where their files lie, how to run, where results go."""

    tasks: list[str] = field(
        default_factory=list,
        metadata={
            "help": f"Tasks ({' '.join(ALL_TASKS)}), the groups english and chinese, your STS files (PATH or "
            "NAME=PATH), or none. None given: every task whose data can be reached."
        },
    )
    data_dir: str = field(
        default="data/sts",
        metadata={"help": "Folder with the task files (SentEval's data/downstream works as is)."},
    )
    use_hub: bool = field(
        default=True,
        metadata={"help": "Read a task's Hub copy when its local files are missing and the Hub can be reached."},
    )
    batch_size: int = field(default=128, metadata={"help": "Sentences per encoder call (the Trainer's too)."})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1, ...; None: cuda if available."})
    bf16: bool = field(default=False, metadata={"help": "Encode in bfloat16 (for GPUs)."})
    fp16: bool = field(default=False, metadata={"help": "Encode in float16 (for GPUs)."})
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where results go; None: a folder of the model's own under outputs/sts/."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace another model's results (sts_results.*, scatter_*.png, those of every truncate_dim_<N>/) "
            "in --output_dir."
        },
    )
    scatter_plots: bool = field(
        default=True, metadata={"help": "Write scatter_<task>.png (--no_scatter_plots: none)."}
    )
    show_progress_bar: bool = field(default=True, metadata={"help": "Progress bars while encoding."})

    def __post_init__(self) -> None:
        if self.bf16 and self.fp16:
            raise ValueError("--bf16 and --fp16 exclude each other.")
        check_within(self, "[1, inf)", "batch_size")


@dataclass
class MutualInformationArguments:
    """The paper's Eq. 10 (Table 4) between dropout twins and between anchors and fraternal twins."""

    mutual_information: str | None = field(
        default=None,
        metadata={"help": "File of sentence pairs (as --train_file of run_ifcl.py): MI(h, h+) and MI(h, h-)."},
    )
    mi_batch_size: int = field(default=64, metadata={"help": "N of Eq. 10: sentences per batch."})
    mi_temperature: float = field(default=0.05, metadata={"help": "τ of Eq. 10."})
    mi_max_batches: int | None = field(default=None, metadata={"help": "Use at most this many batches (None: all)."})
    mi_task_batch_size: int | None = field(
        default=None,
        metadata={"help": "N of MI_task (Table 4), at most; None: all of STS-B's top-score pairs as one batch."},
    )
    seed: int = field(default=42, metadata={"help": "Seed of the dropout masks."})

    def __post_init__(self) -> None:
        if self.mutual_information is not None and not os.path.isfile(self.mutual_information):
            raise FileNotFoundError(f"--mutual_information {self.mutual_information}: no such file.")
        check_within(self, "[2, inf)", "mi_batch_size", "mi_task_batch_size")
        check_within(self, "(0, inf)", "mi_temperature")


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, EvaluationArguments, MutualInformationArguments]:
    """Command line (or one .json file of arguments) → the three argument dataclasses."""
    parser = HfArgumentParser(
        (ModelArguments, EvaluationArguments, MutualInformationArguments), description=__doc__.split("\n")[0]
    )
    return parser.parse_args_into_dataclasses(args=command_line(argv, parser)[0])


# ---------------------------------------------------------------------------------------------------- output


def model_label(model_name_or_path: str, pooler_type: str | None, truncate_dim: int | None = None) -> str:
    """Row name of the results table: the folder name (or Hub id), the pooler and a Matryoshka size."""
    name = model_name_or_path.rstrip("/\\")
    if os.path.isdir(name):
        name = os.path.basename(os.path.abspath(name))
    details = [part for part in (pooler_type, truncate_dim and f"{truncate_dim} dimensions") if part]
    return f"{name} ({', '.join(details)})" if details else name


def safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def model_identity(model_name_or_path: str) -> tuple[str, str]:
    """What makes two evaluations the same model: ``("local", absolute path)`` for a folder (symbolic links
    resolved), ``("hub", id)`` for anything else."""
    if os.path.isdir(model_name_or_path):
        return "local", os.path.normcase(os.path.realpath(model_name_or_path))
    return "hub", model_name_or_path.rstrip("/\\")


def default_output_dir(model_name_or_path: str) -> str:
    """``outputs/sts/<name>``, one per model: for a local folder its last two path parts and a hash of its absolute
    path (``a/checkpoint-8`` → ``a_checkpoint-8-<hash>``), for a Hub id the id made file-safe."""
    kind, key = model_identity(model_name_or_path)
    if kind == "hub":
        return os.path.join("outputs", "sts", safe_file_name(key))
    parts = [part for part in re.split(r"[\\/]", key) if part][-2:] or ["root"]
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return os.path.join("outputs", "sts", f"{safe_file_name('_'.join(parts))}-{digest}")


def results_folder(output_dir: str, truncate_dim: int | None) -> str:
    """Where an evaluation's files go: ``output_dir`` for the full embeddings, ``output_dir/truncate_dim_<N>`` for
    their first N dimensions, so that the results of each size stay beside the others'."""
    return output_dir if truncate_dim is None else os.path.join(output_dir, f"truncate_dim_{truncate_dim}")


def results_folders(output_dir: str) -> list[str]:
    """``output_dir`` and its ``truncate_dim_<N>`` folders (the sizes evaluated there), smallest size first."""
    sizes = {}
    for entry in os.scandir(output_dir) if os.path.isdir(output_dir) else []:
        match = SIZE_FOLDER.fullmatch(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            sizes[entry.path] = int(match.group(1))
    return [output_dir, *sorted(sizes, key=sizes.__getitem__)]


def check_output_dir(output_dir: str, model_name_or_path: str, overwrite: bool, default: bool) -> str | None:
    """Refuse a folder whose results (``sts_results.json``, of any size) belong to another model, unless
    ``overwrite``; reads only. Returns the other model whose results are to be replaced (None: nothing to replace).
    ``default``: no --output_dir given."""
    where = f"The default output folder {output_dir}" if default else f"--output_dir {output_dir}"
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"{where} is a file, not a folder. Choose another --output_dir.")
    way_on = "Choose another --output_dir, or replace them with --overwrite_output_dir."
    identity = model_identity(model_name_or_path)
    for folder in results_folders(output_dir):
        results_path = os.path.join(folder, RESULTS_JSON)
        if not os.path.exists(results_path):
            continue
        try:
            with open(results_path, encoding="utf-8") as handle:
                results = json.load(handle)
            name, owner = results["model_name_or_path"], results["model_path"]  # model_path None: a Hub id
            owner_identity = ("hub", name.rstrip("/\\")) if owner is None else ("local", os.path.normcase(owner))
            owner = owner or name
        except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:  # not this script's results
            shown = os.path.relpath(results_path, output_dir)
            if overwrite:
                return f"an unknown model ({shown} could not be read)"
            raise ValueError(
                f"{where} holds a {shown} that cannot be read as this script's results ({error}), so which "
                f"model they belong to is unknown. {way_on}"
            ) from error
        if owner_identity == identity:
            continue
        if overwrite:
            return owner
        raise ValueError(
            f"{where} already holds the STS results of another model, {owner} (not {identity[1]}). {way_on}"
        )
    return None


def remove_results(output_dir: str) -> list[str]:
    """Delete this script's files (sts_results.json first), of every size, from ``output_dir``, and a size's folder
    left empty; other files stay. Returns their paths relative to ``output_dir``."""
    removed = []
    for folder in results_folders(output_dir):
        scatter_plots = glob.glob(os.path.join(glob.escape(folder), "scatter_*.png"))
        names = [RESULTS_JSON, RESULTS_MARKDOWN] + sorted(os.path.basename(path) for path in scatter_plots)
        here = [name for name in names if os.path.isfile(os.path.join(folder, name))]
        for name in here:
            os.remove(os.path.join(folder, name))
            removed.append(os.path.relpath(os.path.join(folder, name), output_dir))
        if here and folder != output_dir and not os.listdir(folder):
            os.rmdir(folder)
    return removed


def english_average(results: dict[str, dict[str, Any]]) -> float | None:
    """Mean Spearman of the seven English tasks, only when all seven were evaluated (Table 1's Avg.)."""
    if not all(name in results for name in ENGLISH_TASKS):
        return None
    return float(np.mean([results[name]["spearman"] for name in ENGLISH_TASKS]))


def markdown_tables(label: str, results: dict[str, dict[str, Any]]) -> str:
    """sts_results.md: Spearman × 100 in the layouts of docs/evaluation.md; a set with a note gets a footnote."""

    def table(columns: list[str], cells: list[str]) -> str:
        return markdown_table(["Model", *columns], [[label, *cells]])

    def cell(name: str) -> str:
        marker = "*" if results.get(name, {}).get("note") else ""
        return score_text(results[name]["spearman"]) + marker if name in results else "–"

    tables: list[str] = []
    if any(name in results for name in ENGLISH_TASKS):
        columns = [TASK_TITLES[name] for name in ENGLISH_TASKS] + ["Avg."]
        tables.append(table(columns, [cell(name) for name in ENGLISH_TASKS] + [score_text(english_average(results))]))
    if any(name in results for name in CHINESE_TASKS):
        tables.append(table([TASK_TITLES[name] for name in CHINESE_TASKS], [cell(name) for name in CHINESE_TASKS]))
    others = [name for name, result in results.items() if result["table"] == "other"]
    if others:
        tables.append(table(others, [cell(name) for name in others]))
    notes = [f"\\* {result['title']}: {result['note']}." for result in results.values() if result.get("note")]
    if notes:
        tables.append("\n".join(notes))
    return "\n\n".join(tables) + "\n"


# ---------------------------------------------------------------------------------------------------- MI


def task_mutual_information(
    encoder, data: STSData, batch_size: int | None, temperature: float, encode_batch_size: int
) -> dict[str, Any] | None:
    """MI_task of Table 4 (docs/evaluation.md): Eq. 10 between the two sentences of the top-gold-score pairs,
    evaluation embeddings; ``batch_size`` None: all of them as one batch, else :func:`consecutive_batches` of N."""
    top = max(data.scores)
    rows = [i for i, score in enumerate(data.scores) if score == top]
    if len(rows) < 2:
        return None
    sentences = [data.sentences1[i] for i in rows] + [data.sentences2[i] for i in rows]
    first, second = encoder.encode(sentences, batch_size=encode_batch_size).split(len(rows))
    batches = consecutive_batches(len(rows), batch_size or len(rows))
    values = [
        mutual_information(first[batch.start : batch.stop], second[batch.start : batch.stop], temperature)
        for batch in batches
    ]
    size = len(batches[0])
    return {
        "mi_task": float(np.mean(values)),
        "task": data.name,
        "gold_score": top,
        "pairs": len(rows),
        "batch_size": size,
        "num_batches": len(values),
        "upper_bound": float(np.log(size)),
    }


# ---------------------------------------------------------------------------------------------------- main


def evaluate_sts_set(encoder, data: STSData, eval_args, output_dir: str, label: str) -> dict[str, Any]:
    """One STS set's figures (and its scatter plot with ``--scatter_plots``), as sts_results.json holds them."""
    evaluator = STSEvaluator(data.sentences1, data.sentences2, data.scores, data.name, eval_args.batch_size)
    start = time.perf_counter()
    evaluation = evaluator.evaluate(encoder, show_progress_bar=eval_args.show_progress_bar)
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "title": data.title,
        "table": data.table,
        "spearman": evaluation.spearman,
        "pearson": evaluation.pearson,
        "num_pairs": evaluation.num_pairs,
        "source": data.source,
        "note": data.note,
        "seconds": round(seconds, 3),
    }
    if data.details:
        result["pairs_per_subset"] = data.details
    if eval_args.scatter_plots:
        plot_name = f"scatter_{safe_file_name(data.name)}.png"
        title = f"{data.title}: Spearman {score_text(evaluation.spearman)}\n{label}"
        scatter_plot(os.path.join(output_dir, plot_name), data.scores, evaluation.similarities, title)
        result["scatter_plot"] = plot_name
    logger.info(
        f"{data.title}: Spearman {evaluation.spearman:.2f}, Pearson {evaluation.pearson:.2f} "
        f"({evaluation.num_pairs} pairs, {seconds:.1f} s)"
    )
    return result


def evaluate_mutual_information(encoder, mi_pairs, sts_sets, mi_args, eval_args) -> dict[str, Any]:
    """MI(h, h⁺) and MI(h, h⁻) (Eq. 10) over the ``--mutual_information`` pairs, and MI_task when STS-B is scored."""
    torch.manual_seed(mi_args.seed)
    fraternals = list(mi_pairs["fraternal"]) if "fraternal" in mi_pairs.column_names else None
    mi_evaluator = MutualInformationEvaluator(
        list(mi_pairs["sentence"]), fraternals, mi_args.mi_batch_size, mi_args.mi_temperature, mi_args.mi_max_batches
    )
    mi_results = {
        "file": mi_args.mutual_information,
        "seed": mi_args.seed,
        **mi_evaluator(encoder, show_progress_bar=eval_args.show_progress_bar),
    }
    stsb = next((data for data in sts_sets if data.name == "stsb"), None)
    if stsb is not None:
        mi_results["task_relevant"] = task_mutual_information(
            encoder, stsb, mi_args.mi_task_batch_size, mi_args.mi_temperature, eval_args.batch_size
        )
    logger.info(f"Mutual information (Eq. 10): {json.dumps(mi_results)}")
    return mi_results


def read_evaluation_data(eval_args, mi_args) -> tuple[list[STSData], Any]:
    """The STS sets asked for (without ``--tasks``: those found, the rest named as skipped) and the
    ``--mutual_information`` pairs; ``ValueError`` when there is nothing to evaluate."""
    requests = parse_task_requests(eval_args.tasks or list(ALL_TASKS))
    sts_sets, skipped = load_requests(
        requests, eval_args.data_dir, eval_args.use_hub, skip_missing=not eval_args.tasks
    )
    for data in sts_sets:
        logger.info(f"{data.name}: {len(data)} pairs from {data.source}")
    for reason in skipped:
        logger.warning(f"Skipped {reason}.")
    if skipped:
        logger.warning("docs/evaluation.md says where the files of the skipped tasks go; --tasks chooses the tasks.")
    mi_pairs = None
    if mi_args.mutual_information is not None:
        mi_pairs = load_train_dataset(mi_args.mutual_information)
        logger.info(f"Mutual information: {len(mi_pairs)} sentence pairs from {mi_args.mutual_information}")
    if not sts_sets and mi_pairs is None:
        raise ValueError("Nothing to do: no STS set (--tasks) and no --mutual_information file.")
    return sts_sets, mi_pairs


def size_to_score(encoder, truncate_dim: int | None) -> tuple[int | None, int]:
    """``--truncate_dim`` checked against the embeddings' width and given to ``encoder`` (None when it is the
    width: the full size), and that width."""
    width = encoder.encode(["width"]).shape[1]
    if truncate_dim is not None and truncate_dim > width:
        raise ValueError(f"--truncate_dim {truncate_dim}: the embeddings have {width} dimensions.")
    encoder.truncate_dim = truncate_dim if truncate_dim != width else None
    return encoder.truncate_dim, width


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, evaluate, write the results. Returns what sts_results.json holds."""
    model_args, eval_args, mi_args = parse_arguments(sys.argv[1:] if argv is None else argv)
    log_to_stdout(level=logging.INFO)

    # 1. Everything that can be wrong with the input is found before the model is loaded.
    sts_sets, mi_pairs = read_evaluation_data(eval_args, mi_args)
    output_dir = eval_args.output_dir or default_output_dir(model_args.model_name_or_path)
    replaced = check_output_dir(
        output_dir,
        model_args.model_name_or_path,
        eval_args.overwrite_output_dir,
        default=eval_args.output_dir is None,
    )

    # 2. The model (a damaged weights file is still bad input: one line, exit code 2).
    dtype = torch.bfloat16 if eval_args.bf16 else torch.float16 if eval_args.fp16 else None
    loaded = load_encoder(
        model_args.model_name_or_path,
        model_type=model_args.model_type,
        pooler_type=model_args.pooler_type,
        max_length=model_args.max_seq_length,
        device=eval_args.device,
        dtype=dtype,
        trust_remote_code=model_args.trust_remote_code,
    )
    encoder = loaded.encoder
    truncate_dim, width = size_to_score(encoder, model_args.truncate_dim)
    if dtype is not None and encoder.device.type == "cpu":
        logger.warning(f"--{'bf16' if eval_args.bf16 else 'fp16'} on the CPU: half precision is meant for GPUs.")
    label = model_label(model_args.model_name_or_path, loaded.pooler_type, truncate_dim)
    results_dir = results_folder(output_dir, truncate_dim)

    # 3. The evaluation: what fails now is the run (exit code 1).
    with failures_of_the_run():
        os.makedirs(output_dir, exist_ok=True)
        if replaced is not None:
            removed = remove_results(output_dir)
            logger.warning(
                f"--overwrite_output_dir: deleted the results of {replaced} from {output_dir} ({', '.join(removed)})."
            )
        os.makedirs(results_dir, exist_ok=True)
        logger.info(f"Evaluating {label} ({loaded.model_type}) on {encoder.device}; results go to {results_dir}")
        results = {data.name: evaluate_sts_set(encoder, data, eval_args, results_dir, label) for data in sts_sets}
        mi_results = None
        if mi_pairs is not None:
            mi_results = evaluate_mutual_information(encoder, mi_pairs, sts_sets, mi_args, eval_args)

        # 4. The results.
        table = markdown_tables(label, results) if results else ""
        kind, key = model_identity(model_args.model_name_or_path)
        summary = {
            "model_name_or_path": model_args.model_name_or_path,
            "model_path": key if kind == "local" else None,  # whose results these are (check_output_dir)
            "model_label": label,
            "model_type": loaded.model_type,
            "pooler_type": loaded.pooler_type,
            "dimensions": truncate_dim or width,  # of the embeddings scored
            "arguments": {**asdict(model_args), **asdict(eval_args), **asdict(mi_args)},
            "device": str(encoder.device),
            "tasks": results,
            "english_average": english_average(results),
            "mutual_information": mi_results,
        }
        write_json_atomically(os.path.join(results_dir, RESULTS_JSON), summary)
        if table:
            with open(os.path.join(results_dir, RESULTS_MARKDOWN), "w", encoding="utf-8") as handle:
                handle.write(table)
    if table:
        print("\nSpearman × 100 (cosine similarity against gold scores)\n\n" + table)
    if mi_results is not None:
        print(format_mutual_information(mi_results))
    print(f"Results written to {results_dir}")
    return summary


def format_mutual_information(mi_results: dict[str, Any]) -> str:
    """The Table 4 figures as a Markdown table."""
    task = mi_results.get("task_relevant") or {}
    figures = [mi_results["mi_identical"], mi_results["mi_fraternal"], task.get("mi_task")]
    table = markdown_table(["MI(h, h+)", "MI(h, h-)", "MI_task"], [list(map(score_text, figures))])
    return (
        f"\nMutual information, Eq. 10 (N = {mi_results['batch_size']}, τ = {mi_results['temperature']}, "
        f"{mi_results['num_batches']} batches; at most log N = {mi_results['upper_bound']:.2f})\n\n{table}\n"
    )


def cli() -> None:
    """Command-line entry (``ifcl-evaluate-sts``)."""
    run_command("evaluate_sts.py", main)


if __name__ == "__main__":
    cli()
