"""LoRA adapters on an ``IFCLModel``'s encoder, through ``peft`` (the optional extra ``ifcl[peft]``).

:func:`add_lora` puts adapters into the encoder's layers in place (peft's ``inject_adapter_in_model``): the model
stays an ``IFCLModel``, so the Trainer, the objectives, the queue and checkpoints (which hold the adapters beside the
frozen weights, for exact resume) work as without LoRA. Only the adapters of the encoder train; the word tables stay
as the config says (frozen by default). A published folder holds merged weights (:func:`merged_adapters`), which load
through ``AutoModel`` and ``SentenceTransformer`` without ``peft``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)

PEFT_MISSING = "LoRA needs peft: pip install 'ifcl[peft]' (or pip install peft)."


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
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, [])) or "all-linear"


def resolved_alpha(r: int, alpha: float | None) -> float:
    """LoRA's alpha as :func:`add_lora` sets it: ``alpha``, else 2·r."""
    return alpha if alpha is not None else 2 * r


def add_lora(
    model: nn.Module,
    r: int = 16,
    alpha: float | None = None,
    dropout: float = 0.05,
    target_modules: list[str] | str | None = None,
    **options: Any,
) -> Any:
    """Adapters of rank ``r`` into ``model.encoder`` (an ``IFCLModel``), scaled by ``alpha / r`` (default alpha
    2·r), with ``dropout`` on their input, in ``target_modules`` (default :func:`default_target_modules`); ``options``
    are other ``peft.LoraConfig`` fields. The adapters are float32 whatever the encoder's dtype; the encoder's own
    weights are frozen (the word tables then train or not as the config says, when the run is prepared:
    ``fit_model``). Returns the ``LoraConfig``."""
    require_peft()
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import cast_adapter_dtype

    if r < 1:
        raise ValueError(f"--lora_r must be at least 1, got {r}.")
    encoder = model.encoder
    targets = target_modules or default_target_modules(encoder.config.model_type)
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
    logger.info(f"LoRA r={config.r}, alpha={config.lora_alpha}, dropout={dropout} on {sorted(config.target_modules)}")
    return config


def adapter_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every layer of ``model`` that holds LoRA adapters, by name (none when peft is not installed)."""
    try:
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


def save_adapters(model: nn.Module, folder: str) -> None:
    """Write ``model``'s adapters into ``folder`` as peft does (``adapter_config.json``,
    ``adapter_model.safetensors``), so that a checkpoint's adapters load onto the base encoder with
    ``peft.PeftModel.from_pretrained``; nothing without adapters."""
    config = lora_config(model)
    if config is None:
        return
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    weights = get_peft_model_state_dict(model.encoder)
    tensors = {f"base_model.model.{name}": tensor.detach().contiguous().cpu() for name, tensor in weights.items()}
    save_file(tensors, f"{folder}/adapter_model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(folder)
