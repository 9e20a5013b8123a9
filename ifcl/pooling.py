"""How a base model pools and prompts, read from its sentence-transformers files: the one reader of a Pooling module
(training, the model card and ``evaluate_sts.py`` read it here), and the choice of a run's poolers from it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from configuration_ifcl import POOLER_TYPES, ifcl_config_dict
from ifcl.files import read_json

# How sentence-transformers' Pooling module names each pooler (``cls``: SimCSE's MLP after [CLS], a Dense module);
# avg_first_last and avg_top2 read more than the last layer and have none.
SENTENCE_TRANSFORMERS_POOLING = {"avg": "mean", "cls_before_pooler": "cls", "cls": "cls", "last": "lasttoken"}
# A sentence-transformers base's Pooling mode -> the pooler that pools alike.
POOLER_OF_POOLING = {"mean": "avg", "cls": "cls_before_pooler", "lasttoken": "last"}
POOLER_SETTINGS = ("pooler_type", "eval_pooler_type")


@dataclass(frozen=True)
class BasePooling:
    """How a sentence-transformers model (a folder or Hub repo with a modules.json) pools, as its Pooling module's
    config (``file``) says: its modes, whether the tokens of a prompt are pooled, and its default prompt."""

    modes: tuple[str, ...]
    file: str
    include_prompt: bool = True
    default_prompt: str | None = None

    @property
    def pooler(self) -> str | None:
        """This project's pooler that pools alike; None for what it has none for (max, weightedmean, several)."""
        return POOLER_OF_POOLING.get(self.modes[0]) if len(self.modes) == 1 else None

    @property
    def name(self) -> str:
        """The pooler, or the modes this project has none for (``max + mean``); for a Pooling module whose file is
        missing, says so."""
        return self.pooler or " + ".join(self.modes) or f"a mode unknown here ({self.file} is missing)"


def base_pooling(name_or_path: str) -> BasePooling | None:
    """How ``name_or_path`` pools as a sentence-transformers model; None for a model without a Pooling module."""
    modules = read_json(name_or_path, "modules.json")
    modules = modules if isinstance(modules, list) else []
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if pooling is None:
        return None
    settings = read_json(name_or_path, "config.json", pooling.get("path", ""))
    modes = None if settings is None else settings.get("pooling_mode")  # sentence-transformers 6; before, flags
    if settings is None:  # the file is missing: how it pools is unknown (no modes), not its default
        settings, modes = {}, []
    elif modes is None:
        modes = [
            key[len("pooling_mode_") :].removesuffix("_tokens").removesuffix("_token")
            for key, on in settings.items()
            if key.startswith("pooling_mode_") and on is True
        ]
        modes = modes or ["mean"]  # none named: its default, mean
    modes = [modes] if isinstance(modes, str) else list(modes)
    prompts = read_json(name_or_path, "config_sentence_transformers.json") or {}
    default_prompt = (prompts.get("prompts") or {}).get(prompts.get("default_prompt_name")) or None
    file = os.path.join(pooling.get("path", ""), "config.json")
    return BasePooling(tuple(modes), file, settings.get("include_prompt", True) is not False, default_prompt)


def choose_poolers(name_or_path: str, given: dict[str, str]) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """``pooler_type`` and ``eval_pooler_type`` for a model to train from ``name_or_path``: those ``given``, the
    others the model's own (a saved IFCL model's config, else a sentence-transformers base's Pooling module, else
    ``avg``), and what to log about them: where each came from, and a warning for a given one that pools otherwise
    than the base does. ``ValueError`` naming the base's Pooling file for a base that pools in a way this project
    has no pooler for (max, weightedmean, several modes), unless both poolers are given."""
    config = read_json(name_or_path, "config.json")
    saved = ifcl_config_dict(config) if isinstance(config, dict) else None
    base = None
    if saved is not None:
        own = {name: saved.get(name, "avg") for name in POOLER_SETTINGS}
        source = f"the pooler {name_or_path} was trained with (its config.json)"
    else:
        base = base_pooling(name_or_path)
        if base is not None and base.pooler is None and set(given) != set(POOLER_SETTINGS):
            raise ValueError(
                f"{name_or_path}: its Pooling module ({base.file}) pools with {base.name}, which this project has no "
                f"pooler for; choose pooler_type and eval_pooler_type ({', '.join(POOLER_TYPES)}), knowing that the "
                "model will then embed otherwise than its base."
            )
        own = dict.fromkeys(POOLER_SETTINGS, base.pooler if base and base.pooler else "avg")
        source = f"as its base pools (its Pooling module, {base.file})" if base and base.pooler else "the default"
    chosen = {name: given.get(name, own[name]) for name in POOLER_SETTINGS}
    notes = []
    taken = [name for name in POOLER_SETTINGS if name not in given]
    if taken:
        notes.append((logging.INFO, f"{', '.join(f'{name} {chosen[name]}' for name in taken)}: {source}."))
    for name in POOLER_SETTINGS:
        if base and name in given and not pools_alike(given[name], base):
            notes.append(
                (
                    logging.WARNING,
                    f"{name} {given[name]} is set, but {name_or_path} pools with {base.name} (its Pooling module, "
                    f"{base.file}): the model will embed otherwise than its base.",
                )
            )
    return chosen, notes


def pools_alike(pooler: str, base: BasePooling) -> bool:
    """Whether ``pooler`` pools as ``base`` does."""
    return (
        base.pooler is not None
        and SENTENCE_TRANSFORMERS_POOLING.get(pooler) == SENTENCE_TRANSFORMERS_POOLING[base.pooler]
    )
