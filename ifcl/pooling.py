"""What a run reads of the model it starts from, once (:class:`BaseFolder`: its config.json and how its
sentence-transformers Pooling module pools and prompts), the one reader of a Pooling module (training, the model card
and ``evaluate_sts.py`` read it here), and the choice of a run's poolers from it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from configuration_ifcl import POOLER_TYPES, ifcl_config_dict
from ifcl.files import read_json

logger = logging.getLogger(__name__)

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


def read_base(name_or_path: str | None) -> dict[str, Any] | None:
    """How a sentence-transformers model (a folder or Hub repo with a modules.json, an IFCL folder too) embeds beyond
    its encoder and pooling (:attr:`BaseFolder.sentence_transformers`); None for a plain encoder."""
    return BaseFolder.read(name_or_path).sentence_transformers if name_or_path else None


def pooling_of(name_or_path: str, modules: list[dict], settings: dict) -> BasePooling | None:
    """The Pooling module among ``modules`` (modules.json's) as its config.json says, with the default prompt of
    ``settings`` (config_sentence_transformers.json's); None without one."""
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if pooling is None:
        return None
    config = read_json(name_or_path, "config.json", pooling.get("path", ""))
    modes = None if config is None else config.get("pooling_mode")  # sentence-transformers 6; before, flags
    if config is None:  # the file is missing: how it pools is unknown (no modes), not its default
        config, modes = {}, []
    elif modes is None:
        modes = [
            key[len("pooling_mode_") :].removesuffix("_tokens").removesuffix("_token")
            for key, on in config.items()
            if key.startswith("pooling_mode_") and on is True
        ]
        modes = modes or ["mean"]  # none named: its default, mean
    modes = [modes] if isinstance(modes, str) else list(modes)
    default_prompt = (settings.get("prompts") or {}).get(settings.get("default_prompt_name")) or None
    file = os.path.join(pooling.get("path", ""), "config.json")
    return BasePooling(tuple(modes), file, config.get("include_prompt", True) is not False, default_prompt)


# The sentence-transformers modules an IFCL model holds or stands for; any other one (Dense, LayerNorm) it leaves out.
KEPT = ("Transformer", "Pooling", "Normalize", "Dropout")


def sentence_transformers_facts(
    name_or_path: str, modules: list[dict], settings: dict, is_ifcl: bool
) -> dict[str, Any] | None:
    """What :attr:`BaseFolder.sentence_transformers` holds, from ``modules`` and ``settings`` (modules.json's and
    config_sentence_transformers.json's) and the Transformer module's own files; None without modules."""
    if not modules:
        return None
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    folder = modules[0].get("path", "") if kinds[0] == "Transformer" else ""
    transformer = read_json(name_or_path, "sentence_bert_config.json", folder) or {}
    max_seq_length = transformer.get("max_seq_length")
    if max_seq_length is None:
        limit = (read_json(name_or_path, "tokenizer_config.json", folder) or {}).get("model_max_length")
        max_seq_length = limit if isinstance(limit, int) and limit < 100_000 else None  # huge: no limit
    return {
        "max_seq_length": max_seq_length,
        "do_lower_case": bool(transformer.get("do_lower_case", False)),
        "normalize": "Normalize" in kinds,
        "prompts": {name: text or "" for name, text in (settings.get("prompts") or {}).items()},
        "default_prompt_name": settings.get("default_prompt_name"),
        "similarity_fn_name": settings.get("similarity_fn_name"),
        # an IFCL folder's Dense module is SimCSE's MLP, which it holds
        "omitted_modules": [] if is_ifcl else [m["type"] for m, kind in zip(modules, kinds) if kind not in KEPT],
    }


@dataclass(frozen=True)
class BaseFolder:
    """A model's folder or Hub repo as its files say, read once and passed on (the poolers' choice, the checks, the
    model's building, the sentence-transformers view): its config.json (None: none that can be read here; the loader
    says why), its IFCL settings when this project saved it, its sentence-transformers Pooling module (None: none)
    and, for a sentence-transformers model, how it embeds beyond its encoder and pooling: ``max_seq_length`` (its
    sentence_bert_config.json's, or its tokenizer's ``model_max_length`` where sentence-transformers 6 keeps it;
    None: no limit), ``do_lower_case``, ``normalize`` (a ``Normalize`` module follows the pooling), ``prompts``,
    ``default_prompt_name``, ``similarity_fn_name``, and ``omitted_modules``: its other modules after the encoder
    (``Dense``, ``LayerNorm``), which an IFCL model neither holds nor trains (None: a plain encoder);
    ``transformer_folder``: the sub-folder of its Transformer module's files ('' for the folder itself)."""

    path: str
    config: dict | None
    pooling: BasePooling | None
    sentence_transformers: dict[str, Any] | None
    transformer_folder: str = ""

    @classmethod
    def read(cls, path: str) -> BaseFolder:
        """Read ``path``'s config.json and sentence-transformers files, each once."""
        try:
            config = read_json(path, "config.json")
        except (OSError, ValueError):
            config = None
        config = config if isinstance(config, dict) else None
        modules = read_json(path, "modules.json")
        modules = modules if isinstance(modules, list) else []
        settings = (read_json(path, "config_sentence_transformers.json") or {}) if modules else {}
        is_ifcl = config is not None and ifcl_config_dict(config) is not None
        facts = sentence_transformers_facts(path, modules, settings, is_ifcl)
        transformer = next((m for m in modules if str(m.get("type", "")).endswith("Transformer")), {})
        return cls(str(path), config, pooling_of(path, modules, settings), facts, transformer.get("path", ""))

    @property
    def kind(self) -> str:
        """``ifcl`` (an IFCL model this project saved), ``sentence-transformers`` (a modules.json) or
        ``transformers``."""
        if self.saved is not None:
            return "ifcl"
        return "transformers" if self.sentence_transformers is None else "sentence-transformers"

    @property
    def saved(self) -> dict | None:
        """Its IFCL settings (:func:`ifcl_config_dict`) when it is an IFCL model this project saved, else None."""
        return ifcl_config_dict(self.config) if self.config is not None else None


def choose_poolers(folder: BaseFolder, given: dict[str, str]) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """``pooler_type`` and ``eval_pooler_type`` for a model to train from the ``folder`` read: those ``given``, the
    others the model's own (a saved IFCL model's config, else a sentence-transformers base's Pooling module, else
    ``avg``), and what to log about them: where each came from, and a warning for a given one that pools otherwise
    than the base does. ``ValueError`` naming the base's Pooling file for a base that pools in a way this project
    has no pooler for (max, weightedmean, several modes), unless both poolers are given."""
    name_or_path, saved = folder.path, folder.saved
    base = None if saved is not None else folder.pooling
    if saved is not None:
        own = {name: saved.get(name, "avg") for name in POOLER_SETTINGS}
        source = f"the pooler {name_or_path} was trained with (its config.json)"
    else:
        if base is not None and base.pooler is None and set(given) != set(POOLER_SETTINGS):
            raise no_pooler_for(base, name_or_path, "pooler_type and eval_pooler_type")
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


def no_pooler_for(base: BasePooling, name_or_path: str, flags: str) -> ValueError:
    """The one-line refusal of a base whose Pooling module pools in a way this project has no pooler for (max,
    weightedmean, several modes, a missing file), naming the ``flags`` that choose one."""
    return ValueError(
        f"{name_or_path}: its Pooling module ({base.file}) pools with {base.name}, which this project has no pooler "
        f"for; choose {flags} ({', '.join(POOLER_TYPES)}), knowing that the model will then embed otherwise than its "
        "base."
    )


def base_settings(folder: BaseFolder, settings: dict[str, Any]) -> dict[str, Any]:
    """A model's ``settings`` (``IFCLConfig`` fields) with what its base decides: the poolers not given
    (:func:`choose_poolers`, whose notes are logged) and, for a sentence-transformers base, whether its prompt's tokens
    are pooled and its default prompt, unless given."""
    poolers, notes = choose_poolers(folder, {name: settings[name] for name in POOLER_SETTINGS if name in settings})
    for level, note in notes:
        logger.log(level, note)
    base = folder.pooling
    own = {"include_prompt": base.include_prompt, "default_prompt": base.default_prompt} if base else {}
    return {**own, **settings, **poolers}


def pools_alike(pooler: str, base: BasePooling) -> bool:
    """Whether ``pooler`` pools as ``base`` does."""
    return (
        base.pooler is not None
        and SENTENCE_TRANSFORMERS_POOLING.get(pooler) == SENTENCE_TRANSFORMERS_POOLING[base.pooler]
    )
