"""LoRA adapters on an ``IFCLModel``'s encoder, through ``peft`` (the optional extra ``ifcl[peft]``).

:func:`add_lora` puts adapters into the encoder's layers in place (peft's ``inject_adapter_in_model``): the model
stays an ``IFCLModel``, so the Trainer, the objectives, the queue and checkpoints (which hold the adapters beside the
frozen weights, for exact resume) work as without LoRA. Only the adapters of the encoder train; the word tables stay
as the config says (frozen by default). A published folder holds merged weights (:func:`merged_adapters`), which load
through ``AutoModel`` and ``SentenceTransformer`` without ``peft``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers.pytorch_utils import Conv1D
from transformers.utils import cached_file

from ifcl.arguments import check_within

logger = logging.getLogger(__name__)

PEFT_MISSING = "LoRA needs peft: pip install 'ifcl[peft]' (or pip install peft)."
# The adapters' input dropout when none is given, in Python (add_lora) and on the command line (--lora_dropout).
DEFAULT_LORA_DROPOUT = 0.05


def require_peft() -> None:
    """``ImportError`` in one line when ``peft`` is not installed."""
    try:
        import peft  # noqa: F401
    except ImportError:
        raise ImportError(PEFT_MISSING) from None


def default_target_modules(model_type: str) -> list[str] | str:
    """The layers LoRA adapts in an encoder of ``model_type``: peft's choice for that family (the attention's query
    and value projections: ``q_proj``, ``v_proj`` for Qwen, Llama, Mistral and Gemma; ``query``, ``value`` for BERT),
    else every linear layer (``all-linear``)."""
    require_peft()
    # peft is an optional extra (ifcl[peft])
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, [])) or "all-linear"


def resolved_alpha(r: int, alpha: float | None) -> float:
    """LoRA's alpha as :func:`add_lora` sets it: ``alpha``, else 2·r."""
    return alpha if alpha is not None else 2 * r


# Options of peft's LoraConfig that add_lora passes on beyond its own: those under which a checkpoint's adapters
# still merge as plain LoRA (IFCLModel.merge_lora); DoRA, LoRA biases and the like would need peft to load.
LORA_OPTIONS = ("use_rslora", "layers_to_transform", "layers_pattern", "exclude_modules")


def check_lora_settings(r: Any, alpha: Any, dropout: Any) -> None:
    """``TypeError`` or ``ValueError``, in one line naming the setting as ``run_ifcl.py``'s flag, for a rank that is
    not a whole number ≥ 1, an alpha that is not a finite number > 0 (None: 2·r), or a dropout outside [0, 1)."""
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"--lora_r must be a whole number, got {r!r}.")
    if dropout is None:
        raise TypeError("--lora_dropout must be a number, got None.")
    settings = SimpleNamespace(lora_r=r, lora_alpha=alpha, lora_dropout=dropout)
    check_within(settings, "[1, inf)", "lora_r", meaning="to train LoRA")
    check_within(settings, "(0, inf)", "lora_alpha")
    check_within(settings, "[0, 1)", "lora_dropout")


def unknown_target_modules(encoder: nn.Module, targets: list[str] | str) -> list[str]:
    """The names of ``targets`` that match no layer of ``encoder`` as peft matches a list (a layer's name, or its
    end after a dot); peft drops such a name silently when another one matches."""
    if isinstance(targets, str):  # "all-linear" or a regular expression: peft's own check
        return []
    names = [name for name, _ in encoder.named_modules()]
    return [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in names)]


def unadaptable_target_modules(encoder: nn.Module, targets: list[str] | str) -> list[str]:
    """The names of ``targets`` that match a module LoRA cannot adapt (a block of layers, a norm), with its class:
    peft adapts linear, embedding and convolution layers, and attention as ``nn.MultiheadAttention``."""
    if isinstance(targets, str):
        return []
    layers = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention, Conv1D)
    return [
        f"{target} ({type(module).__name__})"
        for target in targets
        for name, module in encoder.named_modules()
        if (name == target or name.endswith(f".{target}")) and not isinstance(module, layers)
    ]


def add_lora(
    model: nn.Module,
    r: int = 16,
    alpha: float | None = None,
    dropout: float = DEFAULT_LORA_DROPOUT,
    target_modules: list[str] | str | None = None,
    **options: Any,
) -> Any:
    """Adapters of rank ``r`` into ``model.encoder`` (an ``IFCLModel``), scaled by ``alpha / r`` (default alpha
    2·r), with ``dropout`` on their input, in ``target_modules`` (default :func:`default_target_modules`); ``options``
    are the peft ``LoraConfig`` fields of :data:`LORA_OPTIONS`. The adapters are float32 whatever the encoder's dtype;
    the encoder's own weights are frozen (the word tables then train or not as the config says, when the run is
    prepared: ``fit_model``). The config's ``lora`` records them, for checkpoints to load merged and the model card.
    Every setting is checked before anything changes, in the command line's words. Returns the ``LoraConfig``."""
    check_lora_settings(r, alpha, dropout)
    unknown_options = sorted(set(options) - set(LORA_OPTIONS))
    if unknown_options:
        raise ValueError(
            f"add_lora does not take {', '.join(unknown_options)}: a checkpoint's adapters are merged by the model's "
            f"own code, which knows plain LoRA with {', '.join(LORA_OPTIONS)}."
        )
    require_peft()
    # peft is an optional extra (ifcl[peft])
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import cast_adapter_dtype

    encoder = model.encoder
    targets = target_modules or default_target_modules(encoder.config.model_type)
    unknown = unknown_target_modules(encoder, targets)
    if unknown:
        raise ValueError(
            f"--lora_target_modules {' '.join(unknown)}: no layer of {type(encoder).__name__} is named so (peft "
            "matches a layer's name or its end after a dot, e.g. q_proj); leave the flag out for the family's "
            "default."
        )
    unadaptable = unadaptable_target_modules(encoder, targets)
    if unadaptable:
        raise ValueError(
            f"--lora_target_modules {unadaptable[0]}: LoRA adapts linear, embedding and convolution layers, not this; "
            "name layers inside it (e.g. word_embeddings, query), or leave the flag out for the family's default."
        )
    config = LoraConfig(
        r=r,
        lora_alpha=resolved_alpha(r, alpha),
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        **options,
    )
    inject_adapter_in_model(config, encoder)
    cast_adapter_dtype(encoder, "default")  # float32 adapters on a bf16/fp16 base, as get_peft_model keeps them
    model.config.lora = {
        "r": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "target_modules": sorted(config.target_modules) if not isinstance(config.target_modules, str) else targets,
        "use_rslora": config.use_rslora,
        "fan_in_fan_out": config.fan_in_fan_out,  # peft sets it for GPT-2's Conv1D layers
    }
    logger.info(f"LoRA r={config.r}, alpha={config.lora_alpha}, dropout={dropout} on {sorted(config.target_modules)}")
    return config


def adapter_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every layer of ``model`` that holds LoRA adapters, by name (none when peft is not installed)."""
    try:
        # peft is an optional extra (ifcl[peft])
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return []
    return [(name, module) for name, module in model.named_modules() if isinstance(module, LoraLayer)]


@contextmanager
def merged_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with each LoRA layer replaced by a merged copy of its base layer (W + B·A·alpha/r, in the base
    weight's dtype; peft's own merge, on a copy) for the ``with`` block; the adapters come back after, unchanged. Only
    the adapted layers are copied."""
    layers = adapter_layers(model)
    for name, layer in layers:
        merged = copy.deepcopy(layer)
        merged.merge(safe_merge=True)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, merged.get_base_layer())
    try:
        yield model
    finally:
        for name, layer in layers:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)


def lora_config(model: nn.Module) -> Any:
    """The ``peft.LoraConfig`` of ``model``'s adapters (:func:`add_lora`), None without adapters."""
    return getattr(getattr(model, "encoder", None), "peft_config", {}).get("default")


ADAPTER_FOLDER = "adapter"  # a checkpoint's sub-folder of peft's adapter files


def save_adapters(model: nn.Module, folder: str) -> None:
    """Write ``model``'s adapters into ``folder/adapter/`` as peft does (``adapter_config.json``,
    ``adapter_model.safetensors``), so that they load onto the base encoder with
    ``peft.PeftModel.from_pretrained(encoder, "checkpoint-N/adapter")``; nothing without adapters. A sub-folder: in
    the checkpoint itself, transformers' ``from_pretrained`` would take the folder for an adapter and load it through
    its own PEFT integration, while ``IFCLModel.from_pretrained`` loads the checkpoint merged."""
    config = lora_config(model)
    if config is None:
        return

    # peft is an optional extra (ifcl[peft])
    from peft import get_peft_model_state_dict

    weights = get_peft_model_state_dict(model.encoder)
    tensors = {f"base_model.model.{name}": tensor.detach().contiguous().cpu() for name, tensor in weights.items()}
    os.makedirs(os.path.join(folder, ADAPTER_FOLDER), exist_ok=True)
    save_file(tensors, os.path.join(folder, ADAPTER_FOLDER, "adapter_model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(os.path.join(folder, ADAPTER_FOLDER))


def lora_weights(name_or_path: str | os.PathLike, options: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The LoRA adapters a folder's or repo's weights hold, and the base layers they sit beside (a LoRA run's
    checkpoint, ``ifcl.lora``), by name; {} when they hold none (a published folder's are merged). ``options``: those of
    ``from_pretrained`` (subfolder, revision, cache). ``ValueError`` naming the file for adapters that are not plain
    LoRA (DoRA, a trained LoRA bias), which only peft merges."""
    download = {
        k: options[k] for k in ("subfolder", "revision", "cache_dir", "token", "local_files_only") if k in options
    }

    def local_copy(filename: str) -> str | None:
        return cached_file(
            str(name_or_path),
            filename,
            **download,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )

    index = local_copy("model.safetensors.index.json")  # sharded weights
    if index is not None:
        with open(index, encoding="utf-8") as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    adapters = {}
    for file in files:
        path = local_copy(file)
        if path is None:
            return {}  # no safetensors weights: from_pretrained says what is missing
        with safe_open(path, framework="pt") as weights:
            names = [name for name in weights.keys() if ".lora_" in name or ".base_layer." in name]
            unsupported = [
                name
                for name in names
                if ".lora_" in name and (not re.search(r"\.lora_(embedding_)?(A|B)\.", name) or name.endswith(".bias"))
            ]
            if unsupported:
                raise ValueError(
                    f"{path} holds adapters other than plain LoRA ({unsupported[0]}, ...), which this model's loader "
                    "does not merge: load the base encoder and the adapters with peft, and merge them there."
                )
            adapters.update({name: weights.get_tensor(name) for name in names})
    check_lora_complete(adapters, str(name_or_path))
    return adapters


def check_lora_complete(adapters: dict[str, torch.Tensor], name_or_path: str) -> None:
    """``ValueError`` in one line, naming the folder and a tensor it lacks, for LoRA weights with an adapter's
    ``lora_A`` but not its ``lora_B`` (or the other way round), or an adapted layer without its ``base_layer``."""
    for name in adapters:
        match = re.match(r"(.*)\.lora_(embedding_)?(A|B)\.(.*)", name)
        if match is None:
            continue
        layer, embedding, half, adapter = match.groups()
        other = f"{layer}.lora_{embedding or ''}{'B' if half == 'A' else 'A'}.{adapter}"
        base = f"{layer}.base_layer.weight"
        missing = next((needed for needed in (other, base) if needed not in adapters), None)
        if missing is not None:
            raise ValueError(
                f"{name_or_path}: its weights hold {name} but not {missing}: the LoRA checkpoint is incomplete (a file "
                "cut short or edited); load an intact checkpoint, or the run's published folder."
            )


@torch.no_grad()
def merge_lora(model: nn.Module, adapters: dict[str, torch.Tensor]) -> None:
    """Give each adapted layer its base layer's weights with the LoRA ``adapters`` merged in (a checkpoint's
    ``base_layer``, ``lora_A`` and ``lora_B`` tensors by their names in the model), as peft's merge does:
    W = W_base + B·A·s, transposed for an embedding table or a ``fan_in_fan_out`` layer, with s = alpha / r
    (alpha / √r with rsLoRA) from the config's ``lora``; in float32, then the layer's dtype."""
    lora = model.config.lora or {}
    if "alpha" not in lora:
        raise ValueError("The weights hold LoRA adapters, but config.json names no LoRA alpha (its ifcl.lora).")
    for name, base in adapters.items():
        if ".base_layer." in name:
            model.get_parameter(name.replace(".base_layer.", ".")).copy_(base)
    for name_a, down in adapters.items():
        if ".lora_A." not in name_a and ".lora_embedding_A." not in name_a:
            continue
        layer_name, kind, adapter = re.match(r"(.*)\.lora_(A|embedding_A)\.(.*)", name_a).groups()
        up = adapters[f"{layer_name}.lora_{kind.replace('A', 'B')}.{adapter}"]
        rank = down.shape[0]
        scale = lora["alpha"] / (rank**0.5 if lora.get("use_rslora") else rank)
        delta = up.float() @ down.float() * scale
        if kind == "embedding_A" or lora.get("fan_in_fan_out"):
            delta = delta.T
        weight = model.get_submodule(layer_name).weight
        weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))
