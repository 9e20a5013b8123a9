"""How ``run_ifcl.py`` reads its arguments, where it differs from a stock ``HfArgumentParser``, each a small policy:

- arguments given in a JSON file mean what they mean on the command line: each value is checked against its
  argument's type, and converted the way the command line converts it, before anything loads
  (:func:`read_arguments_file`);
- ``--do_train``/``--do_eval``/``--do_predict``: none given means all three (:func:`chosen_steps`);
- keeping the best checkpoint (on by default) follows the evaluation flags given (:func:`fit_best_model_selection`);
- a setting of an objective other than the chosen one is refused (:func:`refuse_other_objectives_settings`);
- ``--help`` describes what the script does with the Trainer's push and step flags (:data:`HELP_IN_THIS_SCRIPT`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from transformers import HfArgumentParser


def argument_actions(parser: HfArgumentParser) -> dict[str, argparse.Action]:
    """Each argument's action by its name (the ``--name`` action; not the ``--no_name`` of a boolean)."""
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and not action.option_strings[0].startswith("--no_"):
            actions.setdefault(action.dest, action)
    return actions


def expected_kind(action: argparse.Action) -> str:
    """What an argument takes, for messages: "true or false", "an integer", "a number", one of its choices, text."""
    if action.choices:
        return "one of " + ", ".join(map(str, action.choices))
    name = getattr(action.type, "__name__", "")
    return {"string_to_bool": "true or false", "int": "an integer", "float": "a number"}.get(name, "text")


def list_arguments(parser: HfArgumentParser) -> set[str]:
    """Arguments whose dataclass type admits a list though the command line takes one value (``report_to``)."""
    import dataclasses

    return {
        field.name for cls in parser.dataclass_types for field in dataclasses.fields(cls) if "list" in str(field.type)
    }


def convert_value(action: argparse.Action, value: Any, takes_list: bool = False) -> Any:
    """``value`` as the command line's ``--name value`` would give it; ValueError when it would be refused there.

    JSON booleans and numbers count as the words the command line would read (``true``, ``3``), so ``"false"`` and
    ``false`` both mean false; a number with a fraction is no integer, a boolean no number, a list or an object no
    scalar (except for arguments that take several values, or a dict, such as ``lr_scheduler_kwargs``).
    """
    if isinstance(value, dict) and action.type is str:
        return value  # arguments typed dict | str (TrainingArguments' *_kwargs) take a JSON object as it is
    kind = expected_kind(action)
    if isinstance(value, dict) or (isinstance(value, list) and action.nargs not in ("+", "*") and not takes_list):
        raise ValueError(f"expected {kind}, got {json.dumps(value)}")
    if isinstance(value, list):
        return [convert_value_scalar(action, item, kind) for item in value]
    converted = convert_value_scalar(action, value, kind)
    return [converted] if action.nargs in ("+", "*") else converted


def convert_value_scalar(action: argparse.Action, value: Any, kind: str) -> Any:
    """One scalar JSON value through the argument's command-line type."""
    name = getattr(action.type, "__name__", "")
    if isinstance(value, bool) and name in ("int", "float"):
        raise ValueError(f"expected {kind}, got {json.dumps(value)}")
    if isinstance(value, float) and name == "int" and not value.is_integer():
        raise ValueError(f"expected {kind}, got {json.dumps(value)}")
    if isinstance(value, float) and name == "int":
        value = int(value)
    text = json.dumps(value) if isinstance(value, bool) else str(value)
    try:
        converted = action.type(text) if action.type is not None else text
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise ValueError(f"expected {kind}, got {json.dumps(value)}") from None
    if action.choices and converted not in action.choices:
        raise ValueError(f"expected {kind}, got {json.dumps(value)}")
    return converted


def read_arguments_file(path: str, parser: HfArgumentParser) -> dict[str, Any]:
    """The arguments of a JSON file (one object of names and values), each checked and converted as the command
    line would; ValueError naming the file and every argument that is unknown or of the wrong type."""
    try:
        with open(path, encoding="utf-8") as handle:
            given = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(given, dict):
        raise ValueError(f"{path}: expected a JSON object of argument names and values.")
    actions = argument_actions(parser)
    takes_list = list_arguments(parser)
    unknown = sorted(name for name in given if name not in actions)
    if unknown:
        raise ValueError(f"{path}: unknown argument(s) {', '.join(unknown)}; `--help` lists them.")
    values, problems = {}, []
    for name, value in given.items():
        action = actions[name]
        if value is None:
            if action.default is not None:
                problems.append(f"{name}: expected {expected_kind(action)}, got null")
            else:
                values[name] = None
            continue
        try:
            values[name] = convert_value(action, value, name in takes_list)
        except ValueError as error:
            problems.append(f"{name}: {error}")
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}.")
    return values


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

    from ifcl.objectives import OBJECTIVES

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


def model_settings(arguments) -> dict[str, Any]:
    """The IFCLConfig fields a ``run_ifcl.py`` command (its ``RunArguments``) sets (the model is built from them once the input is checked)."""
    from ifcl.objectives import settings_as_dict
    from trainer_ifcl import global_batch_size

    ifcl_args = arguments.ifcl
    return dict(
        fusion_rate=ifcl_args.fusion_rate,
        freeze_word_embeddings=ifcl_args.freeze_word_embeddings,
        freeze_fraternal_embeddings=ifcl_args.freeze_fraternal_embeddings,
        queue_size=ifcl_args.queue_size,
        queue_batch_size=global_batch_size(arguments.training),
        forgetting_rate=ifcl_args.forgetting_rate,
        contrastive_temperature=ifcl_args.temperature,
        fraternal_loss_weight=ifcl_args.fraternal_loss_weight,
        twins_loss_weight=ifcl_args.twins_loss_weight,
        objective=arguments.objective.objective,
        objective_settings=settings_as_dict(arguments.objective_settings),
        pooler_type=ifcl_args.pooler_type,
        eval_pooler_type=ifcl_args.eval_pooler_type,
        max_seq_length=arguments.data.max_seq_length,
    )
