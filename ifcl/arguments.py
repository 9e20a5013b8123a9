"""How the scripts read their arguments where they differ from a stock ``HfArgumentParser`` (docs/training.md gives
each difference with its reason), and the checks of a value that every settings class makes alike."""

from __future__ import annotations

import argparse
import json
import math
import numbers
from typing import Any

from transformers import HfArgumentParser

STEP_FLAGS = ("do_train", "do_eval", "do_predict")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, each setting with its default."""


class ScriptArgumentParser(HfArgumentParser):
    """``HfArgumentParser`` whose errors are ``ValueError`` (one line, exit code 2), and whose ``--help`` starts with
    the script's description as written."""

    def __init__(self, dataclass_types, **kwargs) -> None:
        super().__init__(dataclass_types, formatter_class=HelpFormatter, **kwargs)

    def error(self, message: str):
        raise ValueError(message)


def check_within(settings: Any, interval: str, *names: str, meaning: str = "") -> None:
    """``ValueError`` naming the flag (and its ``meaning``, such as "λ of Eq. 10") for the first of ``names``
    (attributes of ``settings``) that is set and not a finite number in ``interval``, written as in mathematics:
    "[0, 1]", "(0, 1)", "[1, inf)"; ``TypeError`` for one that is no number (text or a bool given through the Python
    API or a config)."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    for name in names:
        value, flag = getattr(settings, name), f"--{name} ({meaning})" if meaning else f"--{name}"
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{flag} must be a number, got {value!r} ({type(value).__name__}).")
        if (
            math.isfinite(value)
            and (value > low if interval[0] == "(" else value >= low)
            and (value < high if interval[-1] == ")" else value <= high)
        ):
            continue
        wanted = f"in {interval}" if math.isfinite(high) else f"{'>' if interval[0] == '(' else '≥'} {low:g}"
        number = "" if math.isfinite(value) else "a finite number "
        raise ValueError(f"{flag} must be {number}{wanted}, got {value}.")


def check_choice(settings: Any, name: str, choices: tuple[str, ...]) -> None:
    """``ValueError`` naming the flag when ``settings.name`` is not one of ``choices``."""
    if getattr(settings, name) not in choices:
        raise ValueError(f"--{name} must be one of {', '.join(choices)}, got {getattr(settings, name)!r}.")


def command_line(argv: list[str], parser: HfArgumentParser) -> tuple[list[str], str]:
    """``argv`` as given, or, when its first word is a ``.json`` file of arguments (an object of names and values),
    the command line that file stands for followed by the rest of ``argv`` (whose flags win: ``args.json
    --resume_from_checkpoint last``), so that the command line's own types read its values (``null``: a default
    None); with the prefix (the file's name) that errors about those arguments take. Every script reads its
    arguments so."""
    if not argv or not argv[0].endswith(".json"):
        return argv, ""
    path = argv[0]
    try:
        with open(path, encoding="utf-8") as handle:
            given = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(given, dict):
        raise ValueError(f"{path}: expected a JSON object of argument names and values.")
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:  # the --name action before a boolean's --no_name
        actions.setdefault(action.dest, action)
    unknown = sorted(name for name in given if name not in actions)
    if unknown:
        raise ValueError(f"{path}: unknown argument(s) {', '.join(unknown)}; `--help` lists them.")
    words = []
    for name, value in given.items():
        if value is None and actions[name].default is not None:
            raise ValueError(f"{path}: {name} needs a value, got null.")
        if isinstance(value, list) and actions[name].nargs not in ("+", "*"):
            raise ValueError(f"{path}: {name} takes one value, got the list {json.dumps(value)}.")
        if value is not None:
            values = value if isinstance(value, list) else [value]
            words += [f"--{name}"] + [json.dumps(v) if isinstance(v, bool | dict) else str(v) for v in values]
    return words + argv[1:], f"{path}: "


def given_setting_names(argv: list[str]) -> set[str]:
    """The settings a command line names (``--name value``, ``--name=value``, ``--no_name``, dashes or not)."""
    names = set()
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name = token[2:].split("=", 1)[0].replace("-", "_")
            names.add(name[3:] if name.startswith("no_") else name)
    return names


def chosen_steps(values: dict[str, Any], given: set[str]) -> dict[str, bool]:
    """``do_train``, ``do_eval``, ``do_predict``: all three when none is given, otherwise only those given as true
    (read before TrainingArguments, which turns ``do_eval`` on whenever ``--eval_strategy`` is not no)."""
    named = [name for name in STEP_FLAGS if name in given]
    if not named:
        return dict.fromkeys(STEP_FLAGS, True)
    chosen = {name: name in named and bool(values[name]) for name in STEP_FLAGS}
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
    """Make keeping the best checkpoint (on by default here) fit the evaluation flags given (docs/training.md), before
    TrainingArguments checks them; returns what was changed, for the log."""
    if not values["load_best_model_at_end"]:
        return []
    evaluation = strategy_name(values.get("eval_strategy"))
    if evaluation == "no":
        if "load_best_model_at_end" in given:
            raise ValueError(
                "--load_best_model_at_end with --eval_strategy no: with no evaluations there is no best checkpoint "
                "to keep. Drop --load_best_model_at_end, or evaluate (--eval_strategy steps or epoch)."
            )
        values["load_best_model_at_end"] = False
        if "metric_for_best_model" not in given:
            values["metric_for_best_model"] = None
        return ["--eval_strategy no: the model saved at the end is the last step's (load_best_model_at_end off)."]
    changes, saving = [], strategy_name(values.get("save_strategy"))
    if saving not in ("best", evaluation):
        if "eval_strategy" not in given or "save_strategy" in given:
            raise ValueError(
                f"--save_strategy {saving} with --eval_strategy {evaluation}: keeping the best checkpoint (on by "
                f"default here) needs them equal. Change --save_strategy to {evaluation} (or best), or pass "
                "--load_best_model_at_end False."
            )
        values["save_strategy"] = evaluation
        changes.append(f"--save_strategy follows --eval_strategy {evaluation} (the best checkpoint is kept).")
    eval_steps, save_steps = values.get("eval_steps"), values.get("save_steps")
    if "eval_steps" in given and "save_steps" not in given and eval_steps != save_steps:
        values["save_steps"] = eval_steps
        changes.append(f"--save_steps follows --eval_steps {eval_steps:g} (the best checkpoint is kept).")
    elif isinstance(eval_steps, int | float) and isinstance(save_steps, int | float) and eval_steps >= 1:
        if save_steps >= 1 and save_steps % eval_steps:
            raise ValueError(
                f"--save_steps {save_steps:g} is not a multiple of --eval_steps {eval_steps:g}, which keeping the "
                f"best checkpoint (on by default here) needs. Change --save_steps to "
                f"{math.ceil(save_steps / eval_steps) * eval_steps:g}, or pass --load_best_model_at_end False."
            )
    return changes


# What this script does with TrainingArguments flags whose own help describes the Trainer, not this script.
HELP_IN_THIS_SCRIPT = {
    "push_to_hub": "Push the finished output folder to --hub_model_id once, at the end, after training, evaluation, "
    "the model card and the plots are saved; a failed push loses nothing and prints the command that pushes later.",
    "hub_strategy": "Only 'end' (the default here): the finished folder is pushed once (see --push_to_hub).",
    "do_train": "Train and save the model. With none of --do_train, --do_eval, --do_predict given, all three run.",
    "do_eval": "Evaluate on the STS dev set (--validation_file), before and after training.",
    "do_predict": "Evaluate on the STS test set (--test_file), before and after training.",
    "resume_from_checkpoint": "Continue the run in --output_dir from this checkpoint folder, or from its newest "
    "complete checkpoint with 'last'; its settings must be this command's (checked before anything loads).",
    "load_best_model_at_end": "Keep the checkpoint with the best --metric_for_best_model (on by default here).",
}


def describe_this_script(parser: HfArgumentParser) -> None:
    """Replace the help of the TrainingArguments flags this script handles its own way (``HELP_IN_THIS_SCRIPT``)."""
    for action in parser._actions:
        if action.dest in HELP_IN_THIS_SCRIPT and not action.option_strings[0].startswith("--no_"):
            action.help = HELP_IN_THIS_SCRIPT[action.dest]
