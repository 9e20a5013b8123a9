"""What a published folder holds beyond the model's weights, config and remote code: the tokenizers and the
sentence-transformers view, written by ``IFCLTrainer.save_model`` or :func:`save_published`.

The sentence-transformers view lets ``SentenceTransformer(folder)`` embed like ``IFCLModel.encode`` without remote
code. The folder itself is the Transformer module, as in sentence-transformers' own published models (config.json is
the encoder's config and the weights carry its own names, so nothing is stored twice); then the evaluation pooler
(``1_Pooling/``), for ``cls`` SimCSE's MLP (``2_Dense/``), and a ``Normalize`` module when the base encoder is a
sentence-transformers model that normalizes. A sentence-transformers base's truncation length, lowercasing, prompts
and similarity function carry over (``ifcl.pooling.BaseFolder``, :func:`adopt_base`). sentence-transformers itself is
not needed to write the view. Published files name models and files by ``ifcl.files.public_name``, never by a path of
the training machine.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import normalizers

from ifcl.files import public_name, write_json_atomically
from ifcl.lora import merged_adapters
from ifcl.pooling import SENTENCE_TRANSFORMERS_POOLING, BaseFolder
from ifcl.tokenization import fit_tokenizer
from modeling_ifcl import max_input_length

logger = logging.getLogger(__name__)

# The module classes as sentence-transformers 6 names them in modules.json.
ST_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
ST_POOLING = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
ST_DENSE = "sentence_transformers.base.modules.dense.Dense"
ST_NORMALIZE = "sentence_transformers.base.modules.normalize.Normalize"
# The model's sub-modules that only training needs: checkpoints keep them (exact resume), published folders leave
# them out. An objective's own modules (heads, peer network, momentum encoder) and IFCL's hippocampus queue (a
# loaded model starts it empty).
TRAINING_ONLY = ("training_objective", "queue")


def adopt_base(model) -> dict[str, Any] | None:
    """Make ``model`` embed as its sentence-transformers base does, read from ``model.name_or_path`` (the base
    encoder of ``IFCLModel.from_encoder``, or the IFCL folder loaded): its tokenizer truncates at the base's
    ``max_seq_length`` (else at the encoder's own limit, which it is saved with) and lowercases when the base does;
    the config names its base and fraternal model by :func:`public_name`. Returns the facts, also kept as
    ``model.sentence_transformers_base``; modules the model leaves out are warned about. The base's files are those
    ``from_encoder`` read (``model.base_folder``), else read here."""
    folder = getattr(model, "base_folder", None)
    if folder is None or folder.path != str(model.name_or_path):
        folder = BaseFolder.read(model.name_or_path)
    base = folder.sentence_transformers
    model.sentence_transformers_base = base
    for name in ("encoder_name_or_path", "fraternal_model_name_or_path"):  # published files name no local path
        setattr(model.config, name, public_name(getattr(model.config, name)))
    tokenizer = model.tokenizer
    if base is not None and base["max_seq_length"]:
        tokenizer.model_max_length = base["max_seq_length"]
    tokenizer.model_max_length = max_input_length(tokenizer, model.encoder.config)
    tokenizer.padding_side = "right"  # as training and encode pad: sentence-transformers reads the saved side
    for change in fit_tokenizer(tokenizer, "last" in (model.config.pooler_type, model.config.eval_pooler_type)):
        logger.info(f"{public_name(model.name_or_path)}: {change}.")
    if base is None:
        return None
    if base["do_lower_case"]:
        normalizer = tokenizer.backend_tokenizer.normalizer
        if normalizer is None or normalizer.normalize_str("A") != "a":
            steps = [normalizers.Lowercase()] + ([normalizer] if normalizer is not None else [])
            tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(steps)
    if base["omitted_modules"]:
        logger.warning(
            f"{model.name_or_path}: its sentence-transformers modules {', '.join(base['omitted_modules'])} are not "
            "part of the IFCL model; encode and the saved sentence-transformers view embed without them."
        )
    return base


@contextmanager
def without_training_state(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` as it is published, for the ``with`` block: without its :data:`TRAINING_ONLY` sub-modules, and with
    LoRA adapters merged into their layers (``ifcl.lora.merged_adapters``); restored after, in their order."""
    modules = dict(model._modules)
    for name in TRAINING_ONLY:
        model._modules.pop(name, None)
    try:
        with merged_adapters(model):
            yield model
    finally:
        model._modules.clear()
        model._modules.update(modules)


def save_published(model, folder: str) -> None:
    """Save ``model`` as a published folder: weights (without :data:`TRAINING_ONLY`: the queue and an objective a
    Trainer attached), config, remote code, tokenizers and the sentence-transformers view (what
    ``IFCLTrainer.save_model`` writes, for a model trained otherwise)."""
    if not hasattr(model, "sentence_transformers_base"):
        adopt_base(model)
    with without_training_state(model):
        model.save_pretrained(folder)  # with its tokenizers
    save_view(model, folder)


def save_view(model, folder: str) -> bool:
    """Write the sentence-transformers view of ``model`` into ``folder``, where its weights and tokenizer are saved.

    Returns:
        False, writing nothing, for a pooler sentence-transformers has no module for (avg_first_last, avg_top2).
    """
    pooler = model.config.eval_pooler_type
    if pooler not in SENTENCE_TRANSFORMERS_POOLING:
        return False
    if hasattr(model, "sentence_transformers_base"):  # adopt_base's facts, None for a plain encoder: not read again
        base = model.sentence_transformers_base or {}
    else:
        base = BaseFolder.read(model.name_or_path).sentence_transformers or {}
    transformer = {
        "transformer_task": "feature-extraction",
        "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
        "module_output_name": "token_embeddings",
    }
    if "add_pooling_layer" in inspect.signature(type(model.encoder).__init__).parameters:
        transformer["model_kwargs"] = {"add_pooling_layer": False}  # saved without its pooler head, built so
    # Written as sentence-transformers writes them: a module's config indented by 4, its own files by 2.
    write_json_atomically(os.path.join(folder, "sentence_bert_config.json"), transformer, sort_keys=True, indent=4)
    modules = [("", ST_TRANSFORMER)]

    def add_module(name: str, module_type: str, config: dict[str, Any]) -> str:
        path = f"{len(modules)}_{name}"
        os.makedirs(os.path.join(folder, path), exist_ok=True)
        write_json_atomically(os.path.join(folder, path, "config.json"), config, sort_keys=True, indent=4)
        modules.append((path, module_type))
        return os.path.join(folder, path)

    width = model.hidden_size
    add_module(
        "Pooling",
        ST_POOLING,
        {
            "embedding_dimension": width,
            "pooling_mode": SENTENCE_TRANSFORMERS_POOLING[pooler],
            "include_prompt": model.config.include_prompt,
        },
    )
    embedding = {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}
    if pooler == "cls":  # SimCSE's MLP after [CLS]
        dense = {"in_features": width, "out_features": width, "bias": True}
        dense["activation_function"] = "torch.nn.modules.activation.Tanh"
        dense_folder = add_module("Dense", ST_DENSE, dense | embedding)
        weights = {"linear.weight": model.mlp.dense.weight, "linear.bias": model.mlp.dense.bias}
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in weights.items()},
            os.path.join(dense_folder, "model.safetensors"),
        )
    if base.get("normalize"):
        add_module("Normalize", ST_NORMALIZE, embedding)
    write_json_atomically(
        os.path.join(folder, "modules.json"),
        [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(modules)],
        sort_keys=True,
    )
    versions = {"pytorch": torch.__version__, "transformers": transformers.__version__}
    try:
        versions["sentence_transformers"] = metadata.version("sentence-transformers")
    except metadata.PackageNotFoundError:
        pass
    settings = {
        "__version__": versions,
        "default_prompt_name": base.get("default_prompt_name"),
        "model_type": "SentenceTransformer",
        "prompts": {"query": "", "document": ""} | base.get("prompts", {}),
        "similarity_fn_name": base.get("similarity_fn_name") or "cosine",
    }
    write_json_atomically(os.path.join(folder, "config_sentence_transformers.json"), settings, sort_keys=True)
    return True
