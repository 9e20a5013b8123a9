"""IFCL sentence encoder: any ``AutoModel`` encoder, a fraternal word-embedding table and a queue of past rows.

Remote code that every saved model carries: it imports nothing from this project but its neighbour
``configuration_ifcl.py``; what training adds (fitting a model to a run, objectives, losses, the
sentence-transformers view) is in ``ifcl/``, which imports this module, never the other way.
"""

from __future__ import annotations

import json
import numbers
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers import initialization as init
from transformers.utils import ModelOutput, cached_file, logging

try:  # loaded as remote code (a package made by transformers)
    from .configuration_ifcl import POOLER_TYPES, IFCLConfig, ifcl_config_dict
except ImportError:  # imported from a checkout of the project
    from configuration_ifcl import POOLER_TYPES, IFCLConfig, ifcl_config_dict

ALL_LAYER_POOLERS = ("avg_first_last", "avg_top2")  # poolers that read more than the last layer
FRATERNAL_TOKENIZER = "fraternal_tokenizer"  # the sub-folder of a saved model that holds the fraternal tokenizer
# How sentence-transformers' Pooling module names each pooler (``cls``: SimCSE's MLP after [CLS], a Dense module);
# avg_first_last and avg_top2 read more than the last layer and have none.
SENTENCE_TRANSFORMERS_POOLING = {"avg": "mean", "cls_before_pooler": "cls", "cls": "cls", "last": "lasttoken"}
# A sentence-transformers base's Pooling mode -> the pooler that pools alike.
POOLER_OF_POOLING = {"mean": "avg", "cls": "cls_before_pooler", "lasttoken": "last"}
POOLER_SETTINGS = ("pooler_type", "eval_pooler_type")
# The files a tokenizer is read from, any one of them: a fast tokenizer's, a slow one's settings or vocabulary.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)

logger = logging.get_logger(__name__)


def read_json(name_or_path: str, filename: str, subfolder: str = "") -> Any:
    """A JSON file of a folder or Hub repo (the Hub's cache offline), or None when there is none to read (a local
    folder that does not exist included: ``check_model_path`` names it where it matters)."""
    looks_local = str(name_or_path).startswith((".", "/", "~")) or str(name_or_path).count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(str(name_or_path))):
        return None
    path = cached_file(
        name_or_path,
        filename,
        subfolder=subfolder,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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
        """The pooler, or the modes this project has none for (``max + mean``)."""
        return self.pooler or " + ".join(self.modes) or "nothing"


def base_pooling(name_or_path: str) -> BasePooling | None:
    """How ``name_or_path`` pools as a sentence-transformers model; None for a model without a Pooling module."""
    modules = read_json(name_or_path, "modules.json")
    modules = modules if isinstance(modules, list) else []
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if pooling is None:
        return None
    settings = read_json(name_or_path, "config.json", pooling.get("path", "")) or {}
    modes = settings.get("pooling_mode")  # sentence-transformers 6; before it, one flag per mode
    if modes is None:
        modes = [
            key[len("pooling_mode_") :].removesuffix("_tokens").removesuffix("_token")
            for key, on in settings.items()
            if key.startswith("pooling_mode_") and on is True
        ]
    modes = [modes] if isinstance(modes, str) else list(modes) or ["mean"]  # none named: its default, mean
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


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` [B, L, D] over the real tokens of ``attention_mask`` [B, L]."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def last_token(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The state of each row's last real token (the ``last`` pooler of decoder-based embedders), either padding side."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (positions * attention_mask.bool()).argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def right_padded(attention_mask: torch.Tensor, *rows: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """A batch padded on the left moved to right padding, each row's real tokens first (the mask, then ``rows``
    reordered alike): positions then count from each sentence's first token, and fusion pairs token i of a sentence
    with token i of its translation (docs/paper-reading.md). A right-padded batch comes back as it was (a stable
    sort, and no check that would wait for the device on every call)."""
    order = torch.argsort((attention_mask == 0).to(torch.int8), dim=1, stable=True)
    return tuple(None if row is None else row.gather(1, order) for row in (attention_mask, *rows))


def pool_hidden_states(
    pooler_type: str, attention_mask: torch.Tensor, hidden_states: Sequence[torch.Tensor], cls_head=None
) -> torch.Tensor:
    """Sentence embeddings from hidden states (index 0 the embedding layer; ``cls``: [CLS] through ``cls_head``)."""
    last = hidden_states[-1]
    if pooler_type == "cls":
        return cls_head(last[:, 0])
    if pooler_type == "cls_before_pooler":
        return last[:, 0]
    if pooler_type == "avg":
        return mean_pool(last, attention_mask)
    if pooler_type == "avg_first_last":
        return mean_pool((hidden_states[1] + last) / 2.0, attention_mask)
    if pooler_type == "avg_top2":
        return mean_pool((hidden_states[-2] + last) / 2.0, attention_mask)
    if pooler_type == "last":
        return last_token(last, attention_mask)
    raise ValueError(f"Unknown pooler_type {pooler_type!r}; expected one of {', '.join(POOLER_TYPES)}.")


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, prompt: str) -> int:
    """How many tokens ``prompt`` takes at the start of a sentence, as sentence-transformers counts them: the prompt
    tokenized alone, less a special token the tokenizer ends it with."""
    ids = tokenizer(prompt)["input_ids"]
    return len(ids) - (1 if ids and ids[-1] in tokenizer.all_special_ids else 0)


def simcse_mlp(width: int) -> nn.Module:
    """SimCSE's MLP over [CLS] (dense + tanh): the ``cls`` pooler."""
    return nn.Sequential(OrderedDict(dense=nn.Linear(width, width), activation=nn.Tanh()))


def max_input_length(tokenizer: PreTrainedTokenizerBase, encoder_config) -> int:
    """The longest input an encoder takes: its tokenizer's limit (a huge one is none), at most its positions."""
    limit = getattr(encoder_config, "max_position_embeddings", None) or 512
    if tokenizer.model_max_length and tokenizer.model_max_length < 100_000:
        limit = min(limit, tokenizer.model_max_length)
    return limit


def pad_to_length(tensor: torch.Tensor, length: int, value: int) -> torch.Tensor:
    """Right-pad a [B, L] tensor to ``length``."""
    missing = length - tensor.shape[-1]
    return tensor if missing <= 0 else nn.functional.pad(tensor, (0, missing), value=value)


@dataclass
class IFCLTwinsOutput(ModelOutput):
    """The three views of a batch (Section 3.1) and their mean-pooled embedding-layer outputs (Eq. 8's ``emb``)."""

    anchor: torch.Tensor | None = None
    identical: torch.Tensor | None = None
    fraternal: torch.Tensor | None = None
    anchor_embedding_output: torch.Tensor | None = None
    identical_embedding_output: torch.Tensor | None = None
    fraternal_embedding_output: torch.Tensor | None = None


@dataclass
class IFCLEncoderOutput(ModelOutput):
    """Sentence embeddings, the last token states, and when asked all hidden states and attention maps."""

    sentence_embedding: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def twin_views(
    encode: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    word_table: Callable[[torch.Tensor], torch.Tensor],
    tokens: tuple[torch.Tensor, torch.Tensor, int],
    fraternal: tuple[Callable[[torch.Tensor], torch.Tensor], float, torch.Tensor, torch.Tensor, int] | None = None,
    stack: bool = False,
) -> IFCLTwinsOutput:
    """The training views of a batch, for ``IFCLModel`` and the sentence-transformers ``IFCLLoss`` alike.

    ``encode`` maps (word embeddings, mask) to (sentence embeddings, mean-pooled embedding-layer outputs). Anchors and
    identical twins are the same words twice in one call, each row its own dropout mask (Eq. 1); with ``fraternal`` =
    (BEL_F, ε, ids, mask, pad id), fraternal twins ε·BEL_S(x) + (1−ε)·BEL_F(x⁻) (Eq. 2–3), both sequences padded to
    one length and attending to the union of the masks, in the same call with ``stack``, else in a second one.
    """
    input_ids, attention_mask, pad_id = tokens
    if fraternal is None:
        words = word_table(input_ids)
        calls = [(torch.cat([words, words]), torch.cat([attention_mask, attention_mask]))]
    else:
        fraternal_table, fusion_rate, fraternal_ids, fraternal_mask, fraternal_pad_id = fraternal
        length = max(input_ids.shape[1], fraternal_ids.shape[1])
        padded_mask = pad_to_length(attention_mask, length, 0)
        fraternal_mask = pad_to_length(fraternal_mask, length, 0)
        # One lookup of the word table, so that its backward builds one gradient of it, not two.
        padded_words = word_table(pad_to_length(input_ids, length, pad_id))
        fraternal_words = fraternal_table(pad_to_length(fraternal_ids, length, fraternal_pad_id))
        fused = fusion_rate * padded_words + (1.0 - fusion_rate) * fraternal_words
        union_mask = (padded_mask.bool() | fraternal_mask.bool()).to(attention_mask.dtype)
        if stack:
            calls = [(torch.cat([padded_words] * 2 + [fused]), torch.cat([padded_mask] * 2 + [union_mask]))]
        else:  # right padding: the first columns of the padded lookup are BEL_S(x)
            words = padded_words[:, : input_ids.shape[1]]
            calls = [(torch.cat([words, words]), torch.cat([attention_mask, attention_mask])), (fused, union_mask)]
    pooled, embedding_outputs = [], []
    for inputs_embeds, mask in calls:
        sentences, embedding_output = encode(inputs_embeds, mask)
        pooled += sentences.split(input_ids.shape[0])
        embedding_outputs += embedding_output.split(input_ids.shape[0])
    fraternal_view = len(pooled) == 3
    return IFCLTwinsOutput(
        anchor=pooled[0],
        identical=pooled[1],
        fraternal=pooled[2] if fraternal_view else None,
        anchor_embedding_output=embedding_outputs[0],
        identical_embedding_output=embedding_outputs[1],
        fraternal_embedding_output=embedding_outputs[2] if fraternal_view else None,
    )


class QueueBuffers(nn.Module):
    """The queue of past rows as registered buffers, so that checkpoints carry it: k slots of N rows
    (``embeddings``), which rows are filled (``valid``) and the newest slot (``head``, -1 when empty). Training fills
    and reads it as a ring buffer (``ifcl.queue``)."""

    def __init__(self, num_slots: int, slot_size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("embeddings", torch.zeros(num_slots, slot_size, dim))
        self.register_buffer("valid", torch.zeros(num_slots, slot_size, dtype=torch.bool))
        self.register_buffer("head", torch.tensor(-1))


@torch.no_grad()
def embed_sorted_by_length(
    sentences: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    embed: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    batch_size: int,
    max_length: int,
    show_progress_bar: bool = False,
    description: str = "Encoding",
) -> torch.Tensor:
    """One float32 CPU row per sentence, in input order: ``embed`` of padded batches, longest sentences first."""
    encoded = tokenizer(list(sentences), truncation=True, max_length=max_length)
    rows = [{key: values[i] for key, values in encoded.items()} for i in range(len(sentences))]
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]["input_ids"]))
    starts = range(0, len(order), batch_size)
    if show_progress_bar:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=description, unit="batch")
    batches = []
    for start in starts:
        batch = [rows[i] for i in order[start : start + batch_size]]
        batches.append(embed(tokenizer.pad(batch, padding_side="right", return_tensors="pt")).float().cpu())
    embeddings = torch.cat(batches)
    in_input_order = torch.empty_like(embeddings)
    in_input_order[torch.tensor(order)] = embeddings
    return in_input_order


@contextmanager
def outside_mixed_precision(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` without the autocast wrapper that accelerate puts around its ``forward`` for mixed-precision training
    (keeping the original as ``_original_forward``), for the ``with`` block: it embeds in its weights' own precision,
    as the folder it is saved to does. A model without the wrapper is left as it is."""
    wrapped, original = model.__dict__.get("forward"), model.__dict__.get("_original_forward")
    if wrapped is None or original is None:
        yield model
        return
    model.forward = original
    try:
        yield model
    finally:
        model.forward = wrapped


def checked_truncate_dim(truncate_dim: Any, size: int | None = None) -> int | None:
    """``truncate_dim`` itself when it is None or a whole number of dimensions in 1 … ``size`` (the embeddings'
    width; None: not known yet); ``TypeError`` or ``ValueError`` in one line otherwise."""
    if truncate_dim is None:
        return None
    if isinstance(truncate_dim, bool) or not isinstance(truncate_dim, numbers.Integral):
        raise TypeError(f"truncate_dim must be a whole number of dimensions, got {truncate_dim!r}.")
    if truncate_dim < 1 or (size is not None and truncate_dim > size):
        raise ValueError(
            f"truncate_dim must lie in [1, {size or 'the width'}], the embeddings' size; got {truncate_dim}."
        )
    return int(truncate_dim)


def checked_sentences(sentences: str | Sequence[str]) -> list[str]:
    """``encode``'s input as a list: a str, or a sequence of them (sentence-transformers' contract); ``TypeError``
    naming anything else, or the first item that is not a str and its index."""
    if isinstance(sentences, str):
        return [sentences]
    if sentences is None or isinstance(sentences, (bytes, dict)) or not hasattr(sentences, "__len__"):
        raise TypeError(f"sentences must be a str or a sequence of str, got {type(sentences).__name__}.")
    sentences = list(sentences)
    bad = next((i for i, sentence in enumerate(sentences) if not isinstance(sentence, str)), None)
    if bad is not None:
        item = sentences[bad]
        raise TypeError(f"sentences[{bad}] is {item!r} ({type(item).__name__}): every sentence must be a str.")
    return sentences


def drop_pooler_head(encoder: PreTrainedModel) -> PreTrainedModel:
    """Remove the encoder's pooler head (BERT's): no pooler uses it, and DDP rejects weights without gradient."""
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None
    return encoder


def dropout_settings(encoder_config: dict[str, Any]) -> dict[str, float]:
    """An encoder config's dropout rates by name (its classifier's left out): where they are all 0, training gives
    the encoder ``training_dropout`` (:func:`fit_dropout`); where one is not, the encoder trains with its own."""
    return {
        k: float(v)
        for k, v in encoder_config.items()
        if "dropout" in k and "classifier" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def fit_dropout(encoder: nn.Module, rate: float) -> str | None:
    """Identical twins are a sentence under two dropout masks, so an ``encoder`` (a transformers model) whose every
    dropout is 0 (most decoders, ModernBERT, ALBERT) gets ``rate`` (the config's ``training_dropout``) in every
    dropout of its config and modules, as LLM2Vec gives one; returns what was set (or, with ``rate`` 0, that the
    twins are copies), for the log. ``ValueError`` naming the setting when the encoder has no dropout to set."""
    encoder_config = encoder.config
    rates = dropout_settings(encoder_config.to_dict())
    if any(value > 0 for value in rates.values()):
        return None
    # LoRA's dropout on the adapters' input (ifcl.lora) is its own setting, --lora_dropout.
    places = [m for n, m in encoder.named_modules() if isinstance(m, nn.Dropout) and "lora_dropout" not in n]
    floats = [(m, k) for m in encoder.modules() for k, v in vars(m).items() if "dropout" in k and type(v) is float]
    encoder_name = type(encoder).__name__
    if rate == 0:
        return (
            f"{encoder_name} has no dropout and --training_dropout is 0: identical twins are exact copies of the "
            "anchors"
        )
    if not (places or floats):
        raise ValueError(
            f"{encoder_name} has no dropout ({', '.join(rates) or 'no dropout setting'} 0), so identical twins "
            "would be exact copies of the anchors; set --training_dropout (e.g. 0.1) to train it with dropout."
        )
    for name in rates:
        setattr(encoder_config, name, rate)
    for module in places:
        module.p = rate
    for module, name in floats:
        setattr(module, name, rate)
    return f"{encoder_name} has no dropout: its dropout is {rate} while training"


def check_vocabulary(tokenizer: PreTrainedTokenizerBase, rows: int | None, name_or_path: str) -> None:
    """``ValueError`` in one line for a tokenizer with more ids than the word table's ``rows`` (its config's
    ``vocab_size``; None: unknown, unchecked): a token past the last row could not be embedded."""
    if rows is not None and len(tokenizer) > rows:
        raise ValueError(
            f"{name_or_path}: its tokenizer has {len(tokenizer)} ids, more than the {rows} rows of its word table "
            f"(vocab_size), so a token with id {rows} or above could not be embedded: resize the table to the "
            "tokenizer (model.resize_token_embeddings(len(tokenizer))) and save both, or give the tokenizer the "
            "model was trained with."
        )


def check_encoder_class(encoder_config: PretrainedConfig, name_or_path: str) -> None:
    """``ValueError`` in one line for an encoder transformers does not implement itself (its config.json's
    ``auto_map``, run with ``trust_remote_code``): a published IFCL folder rebuilds its encoder from transformers' own
    classes and carries no encoder code, so the model could not be loaded as it trained."""
    if type(encoder_config).__module__.split(".")[0] != "transformers":
        raise ValueError(
            f"{name_or_path}: its encoder is custom code (model type {encoder_config.model_type}, its config.json's "
            "auto_map), which IFCL cannot train: a published IFCL folder rebuilds its encoder with transformers' own "
            "classes and carries no encoder code. Choose an encoder transformers implements."
        )


def word_table_of(model: nn.Module, name: str) -> nn.Embedding:
    """The word-embedding table of ``model``, or ``ValueError`` naming ``name`` when it has none."""
    table = model.get_input_embeddings()
    if not isinstance(table, nn.Embedding):
        raise ValueError(f"{name}: the encoder has no word-embedding table (get_input_embeddings gave {table!r}).")
    return table


def check_model_path(option: str, path: str | None) -> None:
    """Name a model path that is neither a folder here nor a Hub id (``name`` or ``owner/name``), and a folder that
    holds no model: neither a config.json nor a sentence-transformers modules.json (an empty folder, another kind of
    files)."""
    looks_local = path is not None and (path.startswith((".", "/", "~")) or path.count("/") > 1)
    folder = os.path.expanduser(path) if path is not None else ""
    if looks_local and not os.path.isdir(folder):
        raise FileNotFoundError(f"{option} {path}: no such folder (and not a Hub id of the form owner/name).")
    if os.path.isdir(folder) and not any(
        os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "modules.json")
    ):
        raise FileNotFoundError(
            f"{option} {path}: the folder holds no model (no config.json; "
            f"{'it is empty' if not os.listdir(folder) else 'it holds ' + ', '.join(sorted(os.listdir(folder))[:3])}"
            "): give the folder a model was saved to (save_pretrained), or a Hub id."
        )


def load_tokenizer(
    name_or_path: str, subfolder: str = "", trust_remote_code: bool = False, **options
) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained``, except that a local folder without any of :data:`TOKENIZER_FILES` is refused
    (transformers would build a tokenizer from nothing, which reads every word as [UNK]), and a tokenizer JSON file
    that is not valid JSON is named; both as ``OSError`` naming the folder or file. Hub ids load as they are."""
    folder = os.path.join(name_or_path, subfolder) if subfolder else str(name_or_path)
    local = os.path.isdir(folder)
    if local and not any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES):
        raise OSError(
            f"{folder} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...), and one built from nothing "
            "would read every word as [UNK]: save the model's tokenizer into it (tokenizer.save_pretrained), e.g. "
            "its base encoder's."
        )
    try:
        return AutoTokenizer.from_pretrained(
            name_or_path, subfolder=subfolder, trust_remote_code=trust_remote_code, **options
        )
    except ValueError:  # json.JSONDecodeError, without the file's name
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
            path = os.path.join(folder, name)
            if local and os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as handle:
                        json.load(handle)
                except ValueError as error:
                    raise OSError(f"{path} is not valid JSON ({error}): save or copy the tokenizer again.") from None
        raise


def fit_tokenizer(tokenizer: PreTrainedTokenizerBase, end_with_eos: bool) -> list[str]:
    """Make ``tokenizer`` ready to embed with, in place, and say what changed (for the log): a pad token where it has
    none (Llama's and Mistral's): its end-of-sequence token; and, with ``end_with_eos`` (the ``last`` pooler, whose
    embedding is the last token's state), that token once at the end of every sentence where the tokenizer adds none
    (most decoders'; one without such a token that closes each sentence with another special token, BERT's [SEP],
    is left as it is: the last pooler reads that), in its post-processor, so that training, ``encode`` and a saved folder's tokenizer
    (sentence-transformers' view included) all read ``[BOS] tokens EOS``. ``ValueError`` naming the tokenizer when
    neither can be done."""
    changes = []
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"{tokenizer.name_or_path}: its tokenizer has no pad token and no end-of-sequence token to pad with; "
                "set one (tokenizer.pad_token = ...) and save it with the model."
            )
        tokenizer.pad_token = tokenizer.eos_token
        changes.append(f"its tokenizer has no pad token: it pads with its end-of-sequence token {tokenizer.eos_token}")
    probe = "A man plays."
    before = tokenizer(probe)["input_ids"]
    eos_id = tokenizer.eos_token_id
    closing = before[-1:] == [eos_id] or (eos_id is None and before[-1:] in ([i] for i in tokenizer.all_special_ids))
    if not end_with_eos or closing:
        return (
            changes  # it ends every sentence with its end-of-sequence token, or, having none, another (BERT's [SEP])
        )
    if eos_id is None or not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{tokenizer.name_or_path}: the last pooler embeds with each sentence's last token, and its tokenizer "
            "ends a sentence with no end-of-sequence token nor has a fast tokenizer's post-processor to add one; "
            "give a fast tokenizer with an eos_token, or another pooler."
        )
    backend = tokenizer.backend_tokenizer
    backend.post_processor = post_processor_ending_with(backend, tokenizer.eos_token, eos_id)
    after = tokenizer(probe)["input_ids"]
    if after != before + [eos_id]:  # checked token by token
        raise ValueError(
            f"{tokenizer.name_or_path}: appending {tokenizer.eos_token} to its post-processor read {probe!r} as "
            f"{tokenizer.convert_ids_to_tokens(after)}, not as before plus one {tokenizer.eos_token}."
        )
    changes.append(f"its tokenizer ends each sentence with {tokenizer.eos_token}, which the last pooler reads")
    return changes


def post_processor_ending_with(backend, eos: str, eos_id: int):
    """``backend``'s post-processor (a ``tokenizers.Tokenizer``'s) with ``eos`` once at the end of each sequence:
    its template extended (one template: a second one after it would read each piece of the first as a sentence of
    its own), BERT's and RoBERTa's written as the templates they are, a byte-level one or none followed by a template
    that adds ``eos``; ``ValueError`` for any other."""
    from tokenizers import Tokenizer

    state = json.loads(backend.to_str())
    steps = state["post_processor"]
    steps = [] if steps is None else steps["processors"] if steps["type"] == "Sequence" else [steps]
    templates = [
        i
        for i, step in enumerate(steps)
        if step["type"] in ("TemplateProcessing", "BertProcessing", "RobertaProcessing")
    ]
    others = {step["type"] for i, step in enumerate(steps) if i not in templates} - {"ByteLevel"}
    if others or len(templates) > 1:
        raise ValueError(
            f"a post-processor of {', '.join(step['type'] for step in steps)} cannot be made to end each sentence "
            f"with {eos}: give a tokenizer that ends sentences with it, or another pooler."
        )
    template = as_template(steps[templates[0]]) if templates else as_template(None)
    single, pair = template["single"], template["pair"]
    eos_of = lambda type_id: {"SpecialToken": {"id": eos, "type_id": type_id}}  # noqa: E731
    type_a = next(item["Sequence"]["type_id"] for item in pair if "Sequence" in item)
    b_index = next(i for i, item in enumerate(pair) if item.get("Sequence", {}).get("id") == "B")
    type_b = pair[b_index]["Sequence"]["type_id"]
    end_of_a = b_index  # before the special tokens that open the second sequence
    while end_of_a > 0 and type_b != type_a and pair[end_of_a - 1].get("SpecialToken", {}).get("type_id") == type_b:
        end_of_a -= 1
    template["single"] = [*single, eos_of(type_a)]
    template["pair"] = [*pair[:end_of_a], eos_of(type_a), *pair[end_of_a:], eos_of(type_b)]
    template["special_tokens"] = {**template["special_tokens"], eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}}
    if templates:
        steps[templates[0]] = template
    else:
        steps.append(template)
    state["post_processor"] = steps[0] if len(steps) == 1 else {"type": "Sequence", "processors": steps}
    return Tokenizer.from_str(json.dumps(state)).post_processor


def as_template(step: dict | None) -> dict:
    """A post-processor's state (``tokenizers``' JSON) as the ``TemplateProcessing`` it amounts to: a template's
    own, BERT's ``[CLS] $A [SEP]`` and RoBERTa's ``<s> $A </s>`` written out, none as ``$A``."""

    def special(token: str, type_id: int = 0) -> dict:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def sequence(name: str, type_id: int = 0) -> dict:
        return {"Sequence": {"id": name, "type_id": type_id}}

    if step is None:
        return {
            "type": "TemplateProcessing",
            "single": [sequence("A")],
            "pair": [sequence("A"), sequence("B", 1)],
            "special_tokens": {},
        }
    if step["type"] == "TemplateProcessing":
        return dict(step)
    (cls, cls_id), (sep, sep_id) = step["cls"], step["sep"]
    specials = {
        token: {"id": token, "ids": [token_id], "tokens": [token]}
        for token, token_id in ((cls, cls_id), (sep, sep_id))
    }
    single = [special(cls), sequence("A"), special(sep)]
    if step["type"] == "BertProcessing":
        pair = [*single, sequence("B", 1), special(sep, 1)]
    else:  # RobertaProcessing: <s> A </s></s> B </s>
        pair = [*single, special(sep), sequence("B"), special(sep)]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def load_fraternal(name_or_path: str, trust_remote_code: bool = False) -> tuple[torch.Tensor, PreTrainedTokenizerBase]:
    """BEL_F's starting table, the fraternal model's word table (checked as the encoder's is), and its tokenizer
    (read first: a folder without one is refused before any weights load)."""
    tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    check_vocabulary(tokenizer, getattr(config, "vocab_size", None), name_or_path)
    model = AutoModel.from_pretrained(name_or_path, config=config, trust_remote_code=trust_remote_code)
    return word_table_of(model, name_or_path).weight, tokenizer


@torch.no_grad()
def scaled_orthogonal_projection(
    projection: nn.Linear, source_table: torch.Tensor, fraternal_table: torch.Tensor
) -> None:
    """Start ``projection`` (BEL_F's width → BEL_S's) as an orthogonal map scaled to give the projected table BEL_S's
    mean variance per dimension, with the bias that gives it BEL_S's mean (a random projection of a narrower table
    would start the fraternal twins at a fraction of BEL_S's scale)."""
    source, fraternal = source_table.detach().float(), fraternal_table.detach().float()
    weight = torch.empty(projection.weight.shape, device=fraternal.device)
    nn.init.orthogonal_(weight)
    fraternal_mean = fraternal.mean(dim=0)
    centred = fraternal - fraternal_mean
    covariance = centred.T @ centred / max(fraternal.shape[0] - 1, 1)
    projected_variance = ((weight @ covariance) * weight).sum(dim=1).mean()  # mean of diag(W Σ Wᵀ)
    weight *= (source.var(dim=0).mean() / projected_variance.clamp_min(1e-12)).sqrt()
    projection.weight.copy_(weight)
    projection.bias.copy_(source.mean(dim=0) - weight @ fraternal_mean)


def fraternal_word_table(
    words: nn.Embedding,
    table: torch.Tensor | None = None,
    *,
    shape: tuple[int, int] | None = None,
    pad_token_id: int | None = None,
    frozen: bool = True,
) -> tuple[nn.Embedding, nn.Linear | None]:
    """BEL_F and its map to BEL_S's width, for BEL_S = ``words``: the one place they are built, for ``IFCLModel`` and
    the sentence-transformers losses alike.

    A table holding ``table`` (the fraternal model's word table, or BEL_S's own for a copy), or, without one, of
    ``shape`` (default BEL_S's), its values left for the weights to load; ``pad_token_id`` as padding, frozen as
    ``frozen`` says; and, when its width differs from BEL_S's, a linear map to it, started by
    :func:`scaled_orthogonal_projection` when the table's values are known.
    """
    vocab_size, width = table.shape if table is not None else shape or words.weight.shape
    embedding = nn.Embedding(vocab_size, width, padding_idx=pad_token_id, device=words.weight.device)
    if table is not None:
        with torch.no_grad():
            embedding.weight.copy_(table)
    embedding.weight.requires_grad_(not frozen)
    projection = None
    if width != words.embedding_dim:
        projection = nn.Linear(width, words.embedding_dim, device=words.weight.device)
        if table is not None:
            scaled_orthogonal_projection(projection, words.weight, embedding.weight)
    return embedding, projection


def check_matryoshka_width(dims: list[int] | None, width: int) -> None:
    """``ValueError`` for a Matryoshka size wider than the embeddings."""
    if max(dims or [0]) > width:
        raise ValueError(f"matryoshka_dims {list(dims)}: the embeddings have {width} dimensions.")


def lora_weights(name_or_path: str | os.PathLike, options: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The LoRA adapters a folder's or repo's weights hold, and the base layers they sit beside (a LoRA run's
    checkpoint, ``ifcl.lora``), by name; {} when they hold none (a published folder's are merged). ``options``: those of
    ``from_pretrained`` (subfolder, revision, cache). ``ValueError`` naming the file for adapters that are not plain
    LoRA (DoRA, a trained LoRA bias), which only peft merges."""
    from safetensors import safe_open

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


def without_processor_class(path: str) -> None:
    """A saved tokenizer config without the multimodal processor its base named (Gemma 3's ships
    ``processor_class: Gemma3Processor``), which would make sentence-transformers and ``AutoProcessor`` look for an
    image processor this text-only model has not: its tokenizer is all it reads."""
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as handle:
        settings = json.load(handle)
    if settings.pop("processor_class", None) is not None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(settings, handle, indent=2, ensure_ascii=False)
            handle.write("\n")


class IFCLModel(PreTrainedModel):
    """Sentence encoder trained with IFCL: the encoder, the fraternal word table BEL_F (with a linear map to BEL_S's
    width when they differ; BEL_S itself when a copy would never differ), SimCSE's MLP for the ``cls`` pooler and the
    queue of past anchors. ``forward`` embeds, ``forward(..., return_twins=True)`` gives the training views."""

    config_class = IFCLConfig
    base_model_prefix = "encoder"  # the property that gives the wrapped encoder (PreTrainedModel.base_model)
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    # Left out of published folders: the queue (a loaded model starts it empty) and a BEL_F that copies BEL_S.
    _keys_to_ignore_on_load_missing = [r"^queue\.", r"^fraternal_embeddings\."]
    # A LoRA checkpoint's adapters, which from_pretrained merges into their layers itself.
    _keys_to_ignore_on_load_unexpected = [r"\.lora_(A|B|embedding_A|embedding_B)\.", r"\.base_layer\."]

    def __init__(
        self,
        config: IFCLConfig,
        add_pooling_layer: bool = False,
        *,
        encoder: PreTrainedModel | None = None,
        fraternal_table: torch.Tensor | None = None,
    ) -> None:
        """The model of ``config``: around ``encoder`` when given (a loaded encoder, kept as it is, with BEL_F
        holding ``fraternal_table``: :meth:`from_encoder`), else around a new encoder of the config's, whose weights
        ``from_pretrained`` loads. ``add_pooling_layer``: sentence-transformers passes it; no pooler head is held."""
        super().__init__(config)
        # Registered directly: add_module would take the ``encoder`` property for a clash.
        self.encoder_prefix = config.encoder_prefix or "encoder"
        self._modules[self.encoder_prefix] = drop_pooler_head(
            encoder if encoder is not None else AutoModel.from_config(config.build_encoder_config())
        )
        words = word_table_of(self.encoder, type(self.encoder).__name__)
        # The sentence embeddings' width: the word table may be narrower (ALBERT, ELECTRA), and BEL_F matches it.
        self.hidden_size = getattr(self.encoder.config, "hidden_size", None) or words.embedding_dim
        check_matryoshka_width(config.matryoshka_dims, self.hidden_size)
        self.fraternal_embeddings = self.fraternal_projection = None
        if encoder is None:  # else built after post_init, which would draw new values over its table
            self.set_fraternal_table()
        self.mlp = simcse_mlp(self.hidden_size) if "cls" in (config.pooler_type, config.eval_pooler_type) else None
        self.queue = self.new_queue()
        self._tokenizer = self._fraternal_tokenizer = None  # loaded from the folder when first asked for
        self.truncate_dim: int | None = None  # encode's default size (from_pretrained's truncate_dim)
        self.post_init()  # initialises what is new; a loaded encoder's weights are marked as loaded and kept
        if encoder is not None:
            self.set_fraternal_table(fraternal_table)

    def set_fraternal_table(self, table: torch.Tensor | None = None) -> None:
        """BEL_F and its projection as the config says (:func:`fraternal_word_table`): none when training has no
        fraternal twins or BEL_F is BEL_S itself (``config.shares_word_table``); else a table holding ``table`` (the
        fraternal model's), or BEL_S's values when the config names no fraternal model, or left for the weights to
        load."""
        config = self.config
        if not config.uses_fraternal_twins or config.shares_word_table:
            self.fraternal_embeddings = self.fraternal_projection = None
            return
        words = self.get_input_embeddings()
        if table is None and config.fraternal_model_name_or_path is None:
            table = words.weight
        shape = (
            config.fraternal_vocab_size or words.num_embeddings,
            config.fraternal_embedding_size or words.embedding_dim,
        )
        self.fraternal_embeddings, self.fraternal_projection = fraternal_word_table(
            words,
            table,
            shape=shape,
            pad_token_id=config.fraternal_pad_token_id,
            frozen=config.freeze_fraternal_embeddings,
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args,
        truncate_dim: int | None = None,
        attn_implementation: str | None = None,
        **kwargs,
    ) -> IFCLModel:
        """``PreTrainedModel.from_pretrained``, and three things of a sentence encoder's:

        - ``truncate_dim``: ``encode`` keeps each embedding's first that many dimensions unless told otherwise (a
          Matryoshka size), as ``SentenceTransformer(..., truncate_dim=...)`` does.
        - ``attn_implementation`` (``"eager"``, ``"sdpa"``, ``"flash_attention_2"``, ...) is the encoder's, which
          checks it (the rest of the model has no attention); by default the encoder's own default.
        - A checkpoint of a LoRA run (its weights hold the adapters beside their base layers, ``ifcl.lora``) loads
          as the model of that step: the adapters merged into their layers (W + B·A·alpha/r, :meth:`merge_lora`),
          as a published folder holds them; no peft is needed.
        """
        checked_truncate_dim(truncate_dim)  # its type, before anything loads
        config = kwargs.get("config")
        if isinstance(config, PretrainedConfig) and config._attn_implementation is not None:  # AutoModel put it there
            attn_implementation, config._attn_implementation = attn_implementation or config._attn_implementation, None
        adapters = lora_weights(pretrained_model_name_or_path, kwargs)
        # The adapted layers' own weights are not in the file under their names (peft's base_layer holds them): not
        # missing, since merge_lora writes them; nothing else is left out of the load report.
        merged = [re.escape(name.replace(".base_layer.", ".")) for name in adapters if ".base_layer." in name]
        ignored = cls._keys_to_ignore_on_load_missing
        cls._keys_to_ignore_on_load_missing = [*ignored, *merged]
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        finally:
            cls._keys_to_ignore_on_load_missing = ignored
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading info) when asked for
        if attn_implementation is not None:
            model.encoder.set_attn_implementation(attn_implementation)
        if adapters:
            model.merge_lora(adapters)
        model.truncate_dim = checked_truncate_dim(truncate_dim, model.hidden_size)
        return loaded

    @torch.no_grad()
    def merge_lora(self, adapters: dict[str, torch.Tensor]) -> None:
        """Give each adapted layer its base layer's weights with the LoRA ``adapters`` merged in (a checkpoint's
        ``base_layer``, ``lora_A`` and ``lora_B`` tensors by their names in the model), as peft's merge does:
        W = W_base + B·A·s, transposed for an embedding table or a ``fan_in_fan_out`` layer, with s = alpha / r
        (alpha / √r with rsLoRA) from the config's ``lora``; in float32, then the layer's dtype."""
        lora = self.config.lora or {}
        if "alpha" not in lora:
            raise ValueError("The weights hold LoRA adapters, but config.json names no LoRA alpha (its ifcl.lora).")
        for name, base in adapters.items():
            if ".base_layer." in name:
                self.get_parameter(name.replace(".base_layer.", ".")).copy_(base)
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
            weight = self.get_submodule(layer_name).weight
            weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))

    @property
    def encoder(self) -> PreTrainedModel:
        """The wrapped encoder (registered under :attr:`encoder_prefix`)."""
        return self._modules[self.encoder_prefix]

    def new_queue(self) -> QueueBuffers | None:
        """An empty queue of the config's k slots of N rows (None for k = 0), on the model's device."""
        if self.config.queue_size == 0:
            return None
        queue = QueueBuffers(self.config.queue_size, self.config.queue_batch_size, self.hidden_size)
        return queue.to(self.encoder.device)

    def _init_weights(self, module: nn.Module) -> None:
        if module is self.fraternal_embeddings and self.fraternal_projection is None:
            init.copy_(module.weight, self.get_input_embeddings().weight)  # left out of the folder: BEL_S's copy
        elif isinstance(module, QueueBuffers):
            init.zeros_(module.embeddings)
            init.zeros_(module.valid)
            init.constant_(module.head, -1)
        else:
            super()._init_weights(module)

    @classmethod
    def from_encoder(
        cls,
        encoder_name_or_path: str,
        fraternal_model_name_or_path: str | None = None,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        encoder_config: PretrainedConfig | None = None,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
        **settings,
    ) -> IFCLModel:
        """An IFCL model to train, built from a pretrained encoder.

        Args:
            encoder_name_or_path: a Hub id or a local folder of any encoder ``AutoModel`` loads.
            fraternal_model_name_or_path: a model of the fraternal language whose word table initialises BEL_F and
                whose tokenizer reads the fraternal text; without one BEL_F is the encoder's own table.
            tokenizer, encoder_config: the encoder's, when already read (else read from ``encoder_name_or_path``).
            trust_remote_code: run the code the encoder and fraternal model ship with (transformers' own classes
                otherwise, and a model that needs its code is refused; no prompt is ever shown).
            attn_implementation: the encoder's attention (``"sdpa"``, ``"flash_attention_2"``, ...), which it checks;
                default its own default. Not saved: :meth:`from_pretrained` takes it again.
            settings: :class:`IFCLConfig` fields (``fusion_rate``, ``queue_size``, ``pooler_type``, ...). The
                poolers not given are the encoder's own: those of its sentence-transformers Pooling module (CLS,
                last token or mean), else ``avg`` (:func:`choose_poolers`, which logs where each came from).

        Returns:
            The model, with the encoder's tokenizer (and the fraternal one) attached.
        """
        cls.config_class(**settings)  # unknown settings and wrong values refused before any weights load
        check_model_path("encoder_name_or_path", encoder_name_or_path)
        check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
        given = {name: settings[name] for name in POOLER_SETTINGS if name in settings}
        poolers, notes = choose_poolers(encoder_name_or_path, given)
        settings.update(poolers)
        base = base_pooling(encoder_name_or_path)
        if base is not None:  # its prompt pooled or not, and its default prompt, as the base defines them
            settings = {"include_prompt": base.include_prompt, "default_prompt": base.default_prompt, **settings}
        for level, note in notes:
            logger.log(level, note)
        tokenizer = tokenizer or load_tokenizer(encoder_name_or_path, trust_remote_code=trust_remote_code)
        for change in fit_tokenizer(tokenizer, "last" in poolers.values()):
            logger.info(f"{encoder_name_or_path}: {change}.")
        encoder_config = encoder_config or AutoConfig.from_pretrained(
            encoder_name_or_path, trust_remote_code=trust_remote_code
        )
        check_encoder_class(encoder_config, encoder_name_or_path)
        check_vocabulary(tokenizer, getattr(encoder_config, "vocab_size", None), encoder_name_or_path)
        fraternal_table = fraternal_tokenizer = None
        if fraternal_model_name_or_path is not None:  # checked, then loaded, before the encoder's weights load
            fraternal_table, fraternal_tokenizer = load_fraternal(fraternal_model_name_or_path, trust_remote_code)
        encoder = AutoModel.from_pretrained(
            encoder_name_or_path, config=encoder_config, trust_remote_code=trust_remote_code
        )
        word_table_of(encoder, encoder_name_or_path)  # refused before the model is built when it has none
        prefix = getattr(encoder, "base_model_prefix", "")  # its own, so that the weights keep their names
        config = cls.config_class(
            encoder_config=encoder.config.to_dict(),
            encoder_name_or_path=encoder_name_or_path,
            encoder_prefix=prefix if prefix.isidentifier() and prefix != "encoder" else "encoder",
            # None: the encoder's own table's (see IFCLConfig.shares_word_table)
            fraternal_vocab_size=fraternal_table.shape[0] if fraternal_tokenizer else None,
            fraternal_embedding_size=fraternal_table.shape[1] if fraternal_tokenizer else None,
            fraternal_pad_token_id=(fraternal_tokenizer or tokenizer).pad_token_id,
            fraternal_model_name_or_path=fraternal_model_name_or_path,
            **settings,
        )
        model = cls(config, encoder=encoder, fraternal_table=fraternal_table)
        if attn_implementation is not None:
            model.encoder.set_attn_implementation(attn_implementation)
        model.name_or_path = encoder_name_or_path  # where its tokenizer and sentence-transformers settings come from
        model._tokenizer, model._fraternal_tokenizer = tokenizer, fraternal_tokenizer
        return model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The encoder's tokenizer (loaded from the model's folder when none was attached; ``OSError`` naming a
        folder that holds none, :func:`load_tokenizer`)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.name_or_path, config=self.encoder.config)
        return self._tokenizer

    @property
    def fraternal_tokenizer(self) -> PreTrainedTokenizerBase:
        """The fraternal language's tokenizer: the fraternal model's (attached, else read from the folder's
        ``fraternal_tokenizer/``), or the encoder's own without a fraternal model."""
        if self.config.fraternal_model_name_or_path is None:
            return self.tokenizer
        if self._fraternal_tokenizer is None:
            self._fraternal_tokenizer = load_tokenizer(self.name_or_path, subfolder=FRATERNAL_TOKENIZER)
        return self._fraternal_tokenizer

    def save_pretrained(
        self, save_directory: str | os.PathLike, is_main_process: bool = True, push_to_hub: bool = False, **kwargs
    ) -> None:
        """``PreTrainedModel.save_pretrained``, and, as sentence-transformers' ``save`` does, the tokenizer the model
        holds (attached, or read from where the model was loaded) with, when the config names a fraternal model, the
        fraternal one in ``fraternal_tokenizer/``: a folder that loads alone. A fast tokenizer's file holds no truncation
        nor padding of the last call before it (the training length, say): its limit is ``model_max_length``. With ``push_to_hub`` (``repo_id``:
        default the folder's name) the folder is pushed with them, by :meth:`push_to_hub`."""
        hub_names = ("repo_id", "commit_message", "commit_description", "private", "create_pr", "revision", "tags")
        hub = {name: kwargs.pop(name) for name in hub_names if name in kwargs}
        super().save_pretrained(save_directory, is_main_process, **kwargs)
        if not is_main_process:
            return
        tokenizers = {"": "tokenizer"}
        if self.config.fraternal_model_name_or_path is not None:
            tokenizers[FRATERNAL_TOKENIZER] = "fraternal_tokenizer"
        for subfolder, attribute in tokenizers.items():
            try:
                tokenizer = getattr(self, attribute)
            except (OSError, ValueError) as error:  # none attached nor loadable: the folder's loaders say so
                logger.warning(f"{save_directory}: no {attribute} saved ({str(error).splitlines()[0]}).")
                continue
            if getattr(tokenizer, "is_fast", False):  # the last call's truncation and padding are not the model's
                tokenizer.backend_tokenizer.no_truncation()
                tokenizer.backend_tokenizer.no_padding()
            tokenizer.save_pretrained(os.path.join(save_directory, subfolder))
            without_processor_class(os.path.join(save_directory, subfolder, "tokenizer_config.json"))
        if push_to_hub:
            repo_id = hub.pop("repo_id", os.path.basename(os.path.normpath(save_directory)))
            options = {name: kwargs[name] for name in ("token", "max_shard_size") if name in kwargs}
            self.push_to_hub(repo_id, **options, **hub)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.get_input_embeddings()

    def fraternal_word_embeddings(self, fraternal_input_ids: torch.Tensor) -> torch.Tensor:
        """BEL_F(x⁻) at the encoder's width."""
        table = self.get_input_embeddings() if self.fraternal_embeddings is None else self.fraternal_embeddings
        embeddings = table(fraternal_input_ids)
        return embeddings if self.fraternal_projection is None else self.fraternal_projection(embeddings)

    def encode_tokens(
        self,
        pooler_type: str,
        all_hidden_states: bool = False,
        output_attentions: bool = False,
        prompt_length: int = 0,
        **inputs,
    ) -> IFCLEncoderOutput:
        """One encoder call pooled with ``pooler_type``, the first ``prompt_length`` tokens of each (right-padded)
        row left out of the pooling; inputs given as None are left out."""
        inputs = {key: value for key, value in inputs.items() if value is not None}
        all_hidden_states = all_hidden_states or pooler_type in ALL_LAYER_POOLERS
        outputs = self.encoder(
            **inputs, output_hidden_states=all_hidden_states, output_attentions=output_attentions, return_dict=True
        )
        hidden_states = outputs.hidden_states if all_hidden_states else (outputs.last_hidden_state,)
        pooled = inputs["attention_mask"]
        if prompt_length:  # as sentence-transformers' Pooling with include_prompt False
            pooled = pooled.clone()
            pooled[:, :prompt_length] = 0
        return IFCLEncoderOutput(
            sentence_embedding=pool_hidden_states(pooler_type, pooled, hidden_states, self.mlp),
            last_hidden_state=hidden_states[-1],
            hidden_states=hidden_states if all_hidden_states else None,
            attentions=outputs.attentions if output_attentions else None,
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        fraternal_input_ids: torch.Tensor | None = None,
        fraternal_attention_mask: torch.Tensor | None = None,
        return_twins: bool = False,
        training_pooler: bool = False,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        return_dict: bool | None = None,
        prompt_length: int = 0,
    ) -> IFCLEncoderOutput | IFCLTwinsOutput:
        """Evaluation embeddings (``training_pooler``: with the training pooler; ``prompt_length``: the tokens of a
        prompt before each sentence, left out of the pooling), or with ``return_twins`` the training views
        (:func:`twin_views`). ``return_dict`` is accepted and ignored: the output is a ``ModelOutput``."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask, input_ids, token_type_ids = right_padded(attention_mask, input_ids, token_type_ids)
        if not return_twins:
            pooler = self.config.pooler_type if training_pooler else self.config.eval_pooler_type
            return self.encode_tokens(
                pooler,
                output_hidden_states,
                output_attentions,
                prompt_length,
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            )

        def encode(inputs_embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            output = self.encode_tokens(
                self.config.pooler_type, True, inputs_embeds=inputs_embeds, attention_mask=mask
            )
            return output.sentence_embedding, mean_pool(output.hidden_states[0], mask)

        fraternal = None
        if fraternal_input_ids is not None and self.config.uses_fraternal_twins:
            if fraternal_attention_mask is None:
                fraternal_attention_mask = torch.ones_like(fraternal_input_ids)
            fraternal_attention_mask, fraternal_input_ids = right_padded(fraternal_attention_mask, fraternal_input_ids)
            fraternal = (
                self.fraternal_word_embeddings,
                self.config.fusion_rate,
                fraternal_input_ids,
                fraternal_attention_mask,
                self.config.fraternal_pad_token_id or 0,
            )
        tokens = (input_ids, attention_mask, self.encoder.config.pad_token_id or 0)
        stack = self.config.stack_views if self.config.stack_views is not None else input_ids.device.type != "cpu"
        return twin_views(encode, self.get_input_embeddings(), tokens, fraternal, stack)

    @torch.no_grad()
    def encode(
        self,
        sentences: str | Sequence[str],
        prompt: str | None = None,
        batch_size: int = 64,
        show_progress_bar: bool = False,
        convert_to_numpy: bool = False,
        convert_to_tensor: bool | None = None,
        device: str | torch.device | None = None,
        normalize_embeddings: bool = False,
        *,
        max_length: int | None = None,
        truncate_dim: int | None = None,
        description: str = "Encoding",
    ) -> torch.Tensor | np.ndarray | list[torch.Tensor]:
        """Evaluation embeddings of ``sentences``, one float32 row per sentence, by default as one CPU tensor.

        Args:
            sentences: a sentence or a list of them (a single string gives a 1-row matrix).
            prompt: text put before every sentence; default the model's ``default_prompt`` (a sentence-transformers
                base's default prompt), "" for none. Its tokens are pooled unless ``include_prompt`` is False, as the
                base pools.
            batch_size: sentences per encoder call, batched by length so that padding stays short.
            show_progress_bar: a progress bar named ``description``.
            convert_to_numpy, convert_to_tensor: a numpy array, a tensor (the default, it wins over numpy), or, both
                False, a list of rows.
            device: where to compute (the model moves there).
            normalize_embeddings: scale each row to length 1 (not normalised by default: take their cosine).
            max_length: truncation length; default the encoder's own limit (:func:`max_input_length`), not the
                training length.
            truncate_dim: keep each embedding's first that many dimensions (a Matryoshka size, ``matryoshka_dims``),
                before any normalisation, as sentence-transformers does; default the model's own ``truncate_dim``
                (``from_pretrained(..., truncate_dim=64)``), else the full size.

        Returns:
            The embeddings in input order, computed in the weights' own precision outside any autocast (also in the
            process that trained with ``--bf16``), as a loaded folder computes them. The model's training mode is
            restored afterwards.
        """
        sentences = checked_sentences(sentences)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}.")
        truncate_dim = checked_truncate_dim(
            self.truncate_dim if truncate_dim is None else truncate_dim, self.hidden_size
        )
        tokenizer = self.tokenizer
        prompt = self.config.default_prompt if prompt is None else prompt
        prompt_length = 0
        if prompt:
            sentences = [prompt + sentence for sentence in sentences]
            if not self.config.include_prompt:
                prompt_length = prompt_tokens(tokenizer, prompt)
        device = torch.device(device) if device is not None else self.device
        if device != self.device:
            self.to(device)
        embeddings = torch.empty(0, self.encoder.config.hidden_size)  # no sentences, no rows
        if sentences:
            was_training = self.training
            self.eval()
            try:
                with outside_mixed_precision(self):
                    embeddings = embed_sorted_by_length(
                        sentences,
                        tokenizer,
                        lambda batch: self(**batch.to(device), prompt_length=prompt_length).sentence_embedding,
                        batch_size,
                        max_length or max_input_length(tokenizer, self.encoder.config),
                        show_progress_bar,
                        description,
                    )
            finally:
                self.train(was_training)
        embeddings = embeddings[:, :truncate_dim]
        if normalize_embeddings:
            embeddings = nn.functional.normalize(embeddings, p=2, dim=1)
        if convert_to_tensor or (convert_to_tensor is None and not convert_to_numpy):
            return embeddings
        return embeddings.numpy() if convert_to_numpy else list(embeddings)


IFCLConfig.register_for_auto_class()
IFCLModel.register_for_auto_class("AutoModel")
