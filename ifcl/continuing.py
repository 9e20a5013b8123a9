"""Continuing an IFCL model: ``run_ifcl.py --model_name_or_path`` given a folder (or Hub id) this project saved. It
loads with this project's own ``IFCLModel`` (no remote code), and the command's settings replace the saved ones,
within what the saved model can continue with."""

from __future__ import annotations

import logging
import os
from typing import Any

from configuration_ifcl import DEFAULT_OBJECTIVE, IFCLConfig, ifcl_config_dict, uses_fraternal_twins

logger = logging.getLogger(__name__)


def saved_ifcl_config(model_name_or_path: str) -> dict[str, Any] | None:
    """The config.json of an IFCL model (a folder this project wrote, or a Hub id of one, read from the cache when
    offline) in IFCLConfig's form (``ifcl_config_dict``); None for any other model, or one whose config cannot be read
    here (its own loading then says why)."""
    import json

    if os.path.isdir(model_name_or_path):
        path = os.path.join(model_name_or_path, "config.json")
    else:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(model_name_or_path, "config.json")
        except Exception:  # offline and not cached, no such repo, no config.json: not one to continue from
            return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return ifcl_config_dict(config) if isinstance(config, dict) else None


def check_continued_model(
    model_name_or_path: str, saved: dict[str, Any], objective: str, fraternal_model: str | None, settings: dict
) -> None:
    """Refuse continuing an IFCL model with what it cannot continue with: another objective, another fraternal
    model, or fraternal twins that its saved model has no word table for. Reads only its config."""
    saved_objective = saved.get("objective", DEFAULT_OBJECTIVE)
    if saved_objective != objective:
        raise ValueError(
            f"--model_name_or_path {model_name_or_path} is an IFCL model trained with --objective {saved_objective}, "
            f"not --objective {objective}: continue it with --objective {saved_objective}, or start --objective "
            f"{objective} from a plain encoder."
        )
    saved_fraternal = saved.get("fraternal_model_name_or_path")
    if fraternal_model is not None and fraternal_model != saved_fraternal:
        raise ValueError(
            f"--fraternal_model_name_or_path {fraternal_model}: --model_name_or_path {model_name_or_path} is an IFCL "
            f"model, whose own fraternal word table (from {saved_fraternal or 'its encoder'}) training continues "
            f"with. Drop --fraternal_model_name_or_path, or start from a plain encoder."
        )
    # A saved config of another objective holds both weights at 0 (IFCLConfig sets them so): no table.
    has_table = uses_fraternal_twins(saved.get("fraternal_loss_weight", 1.0), saved.get("twins_loss_weight", 1.0))
    needs_table = IFCLConfig(**settings).uses_fraternal_twins
    if needs_table and not has_table:
        raise ValueError(
            f"--model_name_or_path {model_name_or_path} has no fraternal word table (it was trained with "
            f"--fraternal_loss_weight 0 and --twins_loss_weight 0): continue it with both at 0, or start from a "
            f"plain encoder."
        )


def load_continued_model(model_name_or_path: str, saved: dict[str, Any], settings: dict[str, Any]):
    """The IFCL model of ``model_name_or_path`` with this command's ``settings`` (IFCLConfig fields, checked by
    IFCLConfig), loaded by this project's ``IFCLModel`` (no remote code). Encoder, fraternal table, MLP and queue
    are the saved ones; the queue is rebuilt empty when its k or N differ from the saved ones."""
    from modeling_ifcl import HippocampusQueue, IFCLModel

    config = IFCLConfig.from_dict({**saved, **settings})
    wanted_queue = (config.queue_size, config.queue_batch_size)
    saved_queue = (saved.get("queue_size", 0), saved.get("queue_batch_size", config.queue_batch_size))
    # The saved queue's shape, so that its buffers load; replaced below when this command's differs.
    config.queue_size, config.queue_batch_size = saved_queue
    model = IFCLModel.from_pretrained(model_name_or_path, config=config)
    if saved_queue != wanted_queue:
        size, batch = wanted_queue
        model.config.queue_size, model.config.queue_batch_size = size, batch
        if saved_queue[0] or size:  # a queue was saved, or is wanted now
            logger.warning(
                f"{model_name_or_path}: the hippocampus queue was k = {saved_queue[0]} mini-batches of N = "
                f"{saved_queue[1]}, this command's is k = {size} of N = {batch}: it starts empty."
            )
            model.queue = (
                HippocampusQueue(size, batch, model.hidden_size, model.config.forgetting_rate) if size > 0 else None
            )
    return model
