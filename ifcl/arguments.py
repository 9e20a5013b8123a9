"""Arguments given in a JSON file mean what they mean on the command line: each value is checked against its
argument's type, and converted the way the command line converts it, before anything loads."""

from __future__ import annotations

import argparse
import json
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
