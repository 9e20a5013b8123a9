"""IFCL sentence encoder: any ``AutoModel`` encoder plus a fraternal word-embedding table and a hippocampus queue.

Paper: Xiao et al., "Identical and Fraternal Twins: Fine-Grained Semantic Contrastive Learning of Sentence
Representations" (ECAI 2023, arXiv:2307.10932). This file travels with every saved model as remote code, so it
imports nothing from this project but ``configuration_ifcl.py`` (its neighbour).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers import initialization as init
from transformers.utils import ModelOutput, cached_file, logging

logger = logging.get_logger(__name__)

try:  # loaded as remote code (a package made by transformers)
    from .configuration_ifcl import POOLER_TYPES, IFCLConfig, check_model_path
except ImportError:  # imported from a checkout of the project
    from configuration_ifcl import POOLER_TYPES, IFCLConfig, check_model_path

FRATERNAL_TOKENIZER_FOLDER = "fraternal_tokenizer"
# Weights that a folder may leave out: the queue (training state, left out of a published model: loading starts it
# empty) and a fraternal table that is a copy of the encoder's (loading copies it again; see IFCLConfig.shares_word_table).
OPTIONAL_WEIGHTS = (r"^queue\.", r"^fraternal_embeddings\.")
# What a sentence-transformers base encoder says about itself (see read_sentence_transformers_base), saved beside
# config.json so that a loaded model writes the same sentence-transformers view as the one trained from the base.
SENTENCE_TRANSFORMERS_BASE_FILE = "sentence_transformers_base.json"
# The module classes as sentence-transformers 6 names them in modules.json (the older sentence_transformers.models.*
# names still load, through deprecated aliases).
ST_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
ST_POOLING = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
ST_DENSE = "sentence_transformers.base.modules.dense.Dense"
ST_NORMALIZE = "sentence_transformers.base.modules.normalize.Normalize"
# How each evaluation pooler is written for sentence-transformers: its Pooling mode, and whether SimCSE's MLP
# follows as a Dense layer. avg_first_last and avg_top2 have no sentence-transformers module.
SENTENCE_TRANSFORMERS_POOLING = {"avg": ("mean", False), "cls_before_pooler": ("cls", False), "cls": ("cls", True)}
# The download settings of from_pretrained that also locate SENTENCE_TRANSFORMERS_BASE_FILE.
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "proxies", "subfolder")
# Poolers that read more than the last layer, so the encoder must return all hidden states.
ALL_LAYER_POOLERS = ("avg_first_last", "avg_top2")


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` [B, L, D] over the real tokens of ``attention_mask`` [B, L]."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def pool_hidden_states(
    pooler_type: str,
    attention_mask: torch.Tensor,
    hidden_states: Sequence[torch.Tensor],
    cls_head: nn.Module | None = None,
) -> torch.Tensor:
    """Sentence representation from an encoder's hidden states (``hidden_states[0]`` the embedding layer; for the
    last-layer poolers a 1-tuple of the last layer will do). ``cls`` passes [CLS] through ``cls_head``."""
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
    raise ValueError(f"Unknown pooler_type {pooler_type!r}; expected one of {', '.join(POOLER_TYPES)}.")


def max_input_length(tokenizer: PreTrainedTokenizerBase, encoder_config) -> int:
    """The longest input an encoder takes: its tokenizer's limit, capped by its position embeddings (512 when
    neither says). Tokenizers without a limit report a huge ``model_max_length``, which does not count."""
    limit = getattr(encoder_config, "max_position_embeddings", None) or 512
    if tokenizer.model_max_length and tokenizer.model_max_length < 100_000:
        limit = min(limit, tokenizer.model_max_length)
    return limit


def pad_to_length(tensor: torch.Tensor, length: int, value: int) -> torch.Tensor:
    """Right-pad a [B, L] tensor along its last dimension to ``length``."""
    missing = length - tensor.shape[-1]
    return tensor if missing <= 0 else nn.functional.pad(tensor, (0, missing), value=value)


@torch.no_grad()
def scaled_orthogonal_projection(
    projection: nn.Linear, source_table: torch.Tensor, fraternal_table: torch.Tensor
) -> None:
    """Set ``projection`` (BEL_F's width → BEL_S's) so that the projected BEL_F starts at BEL_S's scale.

    Decision (docs/paper-reading.md): a randomly initialised projection of, say, ALBERT's 128-wide table would start BEL_F at a
    fraction of BEL_S's scale, so that at first the fraternal twin would carry almost no fraternal language. The
    projection starts instead as an orthogonal map scaled so that the projected table's per-dimension standard
    deviation (root mean square over dimensions) equals BEL_S's, with the bias that gives it BEL_S's mean. Both
    come from the tables' statistics (BEL_F's covariance is only width × width), whatever the two models.
    """
    source = source_table.detach().float()
    fraternal = fraternal_table.detach().float()
    weight = torch.empty(projection.weight.shape, device=fraternal.device)
    nn.init.orthogonal_(weight)
    fraternal_mean = fraternal.mean(dim=0)
    centred = fraternal - fraternal_mean
    covariance = centred.T @ centred / max(fraternal.shape[0] - 1, 1)
    # Per-dimension variances of the projected table: diag(W Σ Wᵀ).
    projected_variance = ((weight @ covariance) * weight).sum(dim=1).mean()
    target_variance = source.var(dim=0).mean()
    weight *= (target_variance / projected_variance.clamp_min(1e-12)).sqrt()
    projection.weight.copy_(weight)
    projection.bias.copy_(source.mean(dim=0) - weight @ fraternal_mean)


def fuse_word_embeddings(
    word_table: Callable[[torch.Tensor], torch.Tensor],
    fraternal_table: Callable[[torch.Tensor], torch.Tensor],
    fusion_rate: float,
    tokens: tuple[torch.Tensor, torch.Tensor, int],
    fraternal_tokens: tuple[torch.Tensor, torch.Tensor, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fraternal twin input of Eq. 3: ε·BEL_S(x) + (1−ε)·BEL_F(x⁻), at the word-embedding level.

    ``tokens`` and ``fraternal_tokens`` are (input ids, attention mask, pad id). The two token sequences differ in
    length. Decision (docs/paper-reading.md): both are right-padded with their own tokenizer's pad id to one length L, and the
    fused sequence attends to the union of the two masks. Returns (BEL_S(x) padded to L, fused embeddings, the anchor
    mask padded to L, the union mask). Shared by ``IFCLModel`` and ``ifcl.IFCLLoss``.
    """
    (input_ids, attention_mask, pad_id), (fraternal_ids, fraternal_mask, fraternal_pad_id) = tokens, fraternal_tokens
    length = max(input_ids.shape[1], fraternal_ids.shape[1])
    input_ids = pad_to_length(input_ids, length, pad_id)
    attention_mask = pad_to_length(attention_mask, length, 0)
    fraternal_ids = pad_to_length(fraternal_ids, length, fraternal_pad_id)
    fraternal_mask = pad_to_length(fraternal_mask, length, 0)
    words = word_table(input_ids)
    fused = fusion_rate * words + (1.0 - fusion_rate) * fraternal_table(fraternal_ids)
    union_mask = (attention_mask.bool() | fraternal_mask.bool()).to(attention_mask.dtype)
    return words, fused, attention_mask, union_mask


class SimCSEMLP(nn.Module):
    """SimCSE's MLP over [CLS] (dense + tanh), the ``cls`` pooler."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(features))


class RingBufferQueue(nn.Module):
    """A queue of past embeddings in registered buffers (so checkpoints carry it): k slots of N rows, a ring buffer.

    A push of ``count`` rows fills the next ⌈count/N⌉ slots in place, overwriting the oldest ones, so no step copies
    the whole queue; the rows of a last partial slot that were not written are marked invalid and take no part,
    like slots never written. More rows than the queue holds keep the newest, as if pushed one slot at a time.
    IFCL's hippocampus queue takes one slot per optimizer step (N = the global batch); miCSE's queue of momentum
    embeddings takes one row per slot (N = 1).
    """

    def __init__(self, num_slots: int, slot_size: int, dim: int) -> None:
        super().__init__()
        self.num_slots = num_slots
        self.slot_size = slot_size
        self.register_buffer("embeddings", torch.zeros(num_slots, slot_size, dim))
        self.register_buffer("valid", torch.zeros(num_slots, slot_size, dtype=torch.bool))
        # Index of the newest slot; -1 before the first push.
        self.register_buffer("head", torch.tensor(-1, dtype=torch.long))

    def reset(self) -> None:
        """Empty the queue."""
        self.embeddings.zero_()
        self.valid.zero_()
        self.head.fill_(-1)

    @torch.no_grad()
    def push(self, rows: torch.Tensor) -> None:
        """Put ``rows`` (the newest last) in front."""
        count = rows.shape[0]
        if count == 0:
            return
        num_new = -(-count // self.slot_size)
        skipped = max(num_new - self.num_slots, 0)  # slots that would be overwritten within this push
        rows = rows[skipped * self.slot_size :]
        kept = num_new - skipped
        padded = torch.zeros(kept * self.slot_size, self.embeddings.shape[-1], device=self.embeddings.device,
                             dtype=self.embeddings.dtype)  # fmt: skip
        padded[: rows.shape[0]] = rows.detach().to(padded.dtype)
        row_valid = torch.arange(kept * self.slot_size, device=padded.device) < rows.shape[0]
        slots = (self.head + 1 + skipped + torch.arange(kept, device=padded.device)) % self.num_slots
        self.embeddings.index_copy_(0, slots, padded.view(kept, self.slot_size, -1))
        self.valid.index_copy_(0, slots, row_valid.view(kept, self.slot_size))
        self.head.copy_((self.head + num_new) % self.num_slots)

    def slot_ages(self) -> torch.Tensor:
        """Age in pushes of every slot, 1 for the newest (``⌈m/N⌉`` of its entries)."""
        slots = torch.arange(self.num_slots, device=self.head.device)
        return (self.head - slots) % self.num_slots + 1

    def entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All k·N rows and their log weights, 0 for written rows and −inf for empty ones, in storage order (no host
        sync, no copy)."""
        log_weights = torch.zeros(self.valid.shape, device=self.embeddings.device)
        return self.embeddings.flatten(0, 1), log_weights.masked_fill(~self.valid, float("-inf")).flatten()

    def __len__(self) -> int:
        return int(self.valid.sum())


class HippocampusQueue(RingBufferQueue):
    """Queue of the anchors of the last k optimizer steps, the extra negatives of ℓ^I (Section 3.2, Eq. 4).

    One slot of N rows per optimizer step (N = anchors per step). Entry m (m = 1 the newest) lies in the slot of age
    a = ⌈m/N⌉ and has the forgetting coefficient p_m = 1 − λ·a.
    """

    def __init__(self, num_slots: int, slot_size: int, dim: int, forgetting_rate: float) -> None:
        super().__init__(num_slots, slot_size, dim)
        self.forgetting_rate = forgetting_rate

    @torch.no_grad()
    def push(self, anchors: torch.Tensor) -> None:
        """Put the anchors of one optimizer step (at most N rows, already gathered from all processes) in front."""
        count = anchors.shape[0]
        if count > self.slot_size:
            raise ValueError(
                f"{count} anchors in one step, but the queue was built for N = {self.slot_size} per step "
                f"(IFCLConfig.queue_batch_size). Set it to the global batch: per-device batch × processes × "
                f"gradient accumulation steps."
            )
        super().push(anchors)

    def entries(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All k·N rows and their log forgetting coefficients (−inf for empty rows), in storage order.

        ℓ^I sums over queue entries, so storage order serves it as well as age order, without a copy.
        """
        coefficients = 1.0 - self.forgetting_rate * self.slot_ages().to(self.embeddings.dtype)
        log_coefficients = coefficients.log().unsqueeze(1).expand(-1, self.slot_size)
        log_coefficients = log_coefficients.masked_fill(~self.valid, float("-inf"))
        return self.embeddings.flatten(0, 1), log_coefficients.flatten()

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled entries newest first (m = 1, 2, ...) with their coefficients p_m. For inspection and tests."""
        order = torch.argsort(self.slot_ages())
        embeddings, valid = self.embeddings[order].flatten(0, 1), self.valid[order].flatten()
        ages = self.slot_ages()[order].repeat_interleave(self.slot_size)
        return embeddings[valid], (1.0 - self.forgetting_rate * ages.to(embeddings.dtype))[valid]


@dataclass
class IFCLTwinsOutput(ModelOutput):
    """The three views of a batch (Section 3.1), pooled with the training pooler.

    ``*_embedding_output`` are the embedding-layer outputs of the same views, mean-pooled over their real tokens:
    the ``emb`` of the innate margin M in the Twins loss (Eq. 8).
    """

    anchor: torch.Tensor | None = None
    identical: torch.Tensor | None = None
    fraternal: torch.Tensor | None = None
    anchor_embedding_output: torch.Tensor | None = None
    identical_embedding_output: torch.Tensor | None = None
    fraternal_embedding_output: torch.Tensor | None = None


@dataclass
class IFCLEncoderOutput(ModelOutput):
    """Sentence embeddings (evaluation pooler, or the training pooler when asked) plus the encoder's token states.

    ``hidden_states`` (index 0 the embedding layer) and ``attentions`` are there when asked for (or, for
    ``hidden_states``, when the pooler needs them).
    """

    sentence_embedding: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def read_json_file(name_or_path: str, filename: str, **hub_kwargs) -> Any:
    """A JSON file of a folder or Hub repo, or None when it has none (or the Hub cannot be reached)."""
    path = cached_file(
        name_or_path,
        filename,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def public_model_name(name_or_path: str | None) -> str | None:
    """How a saved model names the model it started from, never by a path of the training machine: a Hub id as it
    is; a local folder by the Hub id its own model card loads itself by (``from_pretrained('owner/name')`` or
    ``SentenceTransformer('owner/name')`` with the card's title as name, as the PyPI copy of all-MiniLM-L6-v2's card
    does), else by the folder's name."""
    if name_or_path is None or not os.path.isdir(name_or_path):
        return name_or_path
    folder_name = os.path.basename(os.path.normpath(os.path.abspath(name_or_path)))
    card = os.path.join(name_or_path, "README.md")
    if os.path.isfile(card):
        import re

        with open(card, encoding="utf-8", errors="replace") as f:
            text = f.read()
        title = re.search(r"^# +(\S+)\s*$", text, flags=re.MULTILINE)
        names = {title.group(1) if title else None, folder_name}
        for hub_id in re.findall(r"(?:from_pretrained|SentenceTransformer)\(\s*['\"]([\w.-]+/[\w.-]+)['\"]", text):
            if hub_id.split("/")[1] in names:
                return hub_id
    return folder_name


def stored_weight_names(name_or_path: str, **hub_kwargs) -> set[str] | None:
    """The weight names a folder or Hub repo holds (model.safetensors, or the index of a sharded one); None when
    neither can be read here."""
    index = read_json_file(name_or_path, "model.safetensors.index.json", **hub_kwargs)
    if isinstance(index, dict) and isinstance(index.get("weight_map"), dict):
        return set(index["weight_map"])
    path = cached_file(
        name_or_path,
        "model.safetensors",
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )
    if path is None:
        return None
    from safetensors import safe_open

    with safe_open(path, framework="pt") as weights:
        return set(weights.keys())


def read_sentence_transformers_base(name_or_path: str, **hub_kwargs) -> dict[str, Any] | None:
    """How a sentence-transformers model (a folder or Hub repo with a modules.json) embeds, beyond its encoder and
    pooling; None for a plain encoder. The facts are:

    - ``max_seq_length``: its truncation length, from its sentence_bert_config.json or, where sentence-transformers
      6 keeps it, its tokenizer's ``model_max_length`` (None: no limit but the position embeddings');
      ``do_lower_case``: whether sentence-transformers lowercases the input;
    - ``normalize``: whether a ``Normalize`` module follows the pooling (embeddings of length 1);
    - ``prompts``, ``default_prompt_name``, ``similarity_fn_name``: from its config_sentence_transformers.json;
    - ``omitted_modules``: its other modules after the encoder (``Dense``, ``LayerNorm``, ...), whose weights an
      :class:`IFCLModel` does not hold or train, so that neither ``encode`` nor the sentence-transformers view
      applies them (``Dropout`` does nothing at inference and is not listed).
    """
    modules = read_json_file(name_or_path, "modules.json", **hub_kwargs)
    if not isinstance(modules, list) or not modules:
        return None
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    transformer_path = modules[0].get("path", "") if kinds[0] == "Transformer" else ""
    transformer_config = (
        read_json_file(name_or_path, "sentence_bert_config.json", subfolder=transformer_path, **hub_kwargs) or {}
    )
    model_config = read_json_file(name_or_path, "config_sentence_transformers.json", **hub_kwargs) or {}
    max_seq_length = transformer_config.get("max_seq_length")
    if max_seq_length is None:  # sentence-transformers 6 keeps it in the tokenizer
        tokenizer_config = (
            read_json_file(name_or_path, "tokenizer_config.json", subfolder=transformer_path, **hub_kwargs) or {}
        )
        tokenizer_limit = tokenizer_config.get("model_max_length")
        if isinstance(tokenizer_limit, int) and tokenizer_limit < 100_000:  # huge: no limit (see max_input_length)
            max_seq_length = tokenizer_limit
    return {
        "base_model": public_model_name(str(name_or_path)),
        "max_seq_length": max_seq_length,
        "do_lower_case": bool(transformer_config.get("do_lower_case", False)),
        "normalize": "Normalize" in kinds,
        "prompts": {name: text or "" for name, text in (model_config.get("prompts") or {}).items()},
        "default_prompt_name": model_config.get("default_prompt_name"),
        "similarity_fn_name": model_config.get("similarity_fn_name"),
        "omitted_modules": [
            module["type"]
            for module, kind in zip(modules, kinds)
            if kind not in ("Transformer", "Pooling", "Normalize", "Dropout")
        ],
    }


def lowercase_input(tokenizer: PreTrainedTokenizerBase) -> None:
    """Make a fast tokenizer lowercase its input (what sentence-transformers' ``do_lower_case`` does), unless its
    normalizer already does; saved with the tokenizer."""
    from tokenizers import normalizers

    normalizer = tokenizer.backend_tokenizer.normalizer
    if normalizer is not None and normalizer.normalize_str("A") == "a":
        return
    steps = [normalizers.Lowercase()] + ([normalizer] if normalizer is not None else [])
    tokenizer.backend_tokenizer.normalizer = normalizers.Sequence(steps)


def write_json(path: str, content: Any, indent: int = 2, sort_keys: bool = False) -> None:
    """Write ``content`` as JSON to ``path``, making its folder."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=indent, sort_keys=sort_keys)


def library_versions() -> dict[str, str]:
    """The versions config_sentence_transformers.json records (sentence-transformers' when it is installed)."""
    from importlib import metadata

    import transformers

    versions = {"pytorch": torch.__version__, "transformers": transformers.__version__}
    try:
        versions["sentence_transformers"] = metadata.version("sentence-transformers")
    except metadata.PackageNotFoundError:
        pass
    return versions


def drop_pooler_head(encoder: PreTrainedModel) -> PreTrainedModel:
    """Remove the encoder's own pooler head (BERT's dense+tanh over [CLS]), when it has one.

    No IFCL pooler uses it (the ``cls`` pooler is SimCSE's separate MLP); left in place its weights would get no
    gradient, which data-parallel training rejects.
    """
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None
    return encoder


def encoder_attribute_name(encoder: PreTrainedModel | type[PreTrainedModel]) -> str:
    """The attribute an :class:`IFCLModel` holds ``encoder`` (a model or its class) under: its own
    ``base_model_prefix`` (``bert``, ``roberta``, ...), so that the saved weight names are the ones its plain
    ``AutoModel`` reads; ``encoder`` when it has none or the name is taken by IFCLModel's own parts."""
    prefix = getattr(encoder, "base_model_prefix", "") or ""
    taken = {"encoder", "mlp", "queue", "fraternal_embeddings", "fraternal_projection", "training_objective"}
    return prefix if prefix.isidentifier() and prefix not in taken else "encoder"


def build_encoder(encoder_config) -> PreTrainedModel:
    """The bare encoder for a config (random weights until loaded), without its pooler head."""
    return drop_pooler_head(AutoModel.from_config(encoder_config))


class IFCLModel(PreTrainedModel):
    """Sentence encoder trained with IFCL.

    Holds the encoder, the fraternal word-embedding table BEL_F (with a learned linear map to the encoder's width
    when the widths differ), SimCSE's MLP for the ``cls`` pooler, and the hippocampus queue. ``forward`` gives
    evaluation embeddings; ``forward(..., return_twins=True)`` gives the training views; ``encode`` embeds text.
    """

    config_class = IFCLConfig
    base_model_prefix = "encoder"  # the property that gives the wrapped encoder (PreTrainedModel.base_model)
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _keys_to_ignore_on_load_missing = list(OPTIONAL_WEIGHTS)
    # A copy of the encoder's table saved before such copies were left out: the model now reads the encoder's own.
    _keys_to_ignore_on_load_unexpected = [r"^fraternal_embeddings\."]

    def __init__(self, config: IFCLConfig, add_pooling_layer: bool = False) -> None:
        # add_pooling_layer: what sentence-transformers' Transformer module passes (the folder's
        # sentence_bert_config.json says False); IFCL's encoder never holds the pooler head (drop_pooler_head).
        super().__init__(config)
        # Held under the encoder's own base_model_prefix (config.encoder_prefix), so that the weight names are those
        # a plain AutoModel of the encoder reads from the same file.
        self.encoder_prefix = config.encoder_prefix or "encoder"
        # Registered directly: add_module would take the ``encoder`` property for a clash when the name is "encoder".
        self._modules[self.encoder_prefix] = build_encoder(config.build_encoder_config())
        word_embeddings = self.encoder.get_input_embeddings()
        if not isinstance(word_embeddings, nn.Embedding):
            raise ValueError(
                f"The encoder {type(self.encoder).__name__} has no word-embedding layer "
                f"(get_input_embeddings() gave {type(word_embeddings).__name__}); IFCL fuses word embeddings (Eq. 3)."
            )
        hidden_size = word_embeddings.embedding_dim
        self.hidden_size = hidden_size

        self.fraternal_embeddings: nn.Embedding | None = None
        self.fraternal_projection: nn.Linear | None = None
        # BEL_F is the encoder's own (frozen) table when a copy of it would never differ: nothing to hold or store.
        self.shares_word_table = config.shares_word_table
        if config.uses_fraternal_twins and not self.shares_word_table:
            vocab_size = config.fraternal_vocab_size or word_embeddings.num_embeddings
            width = config.fraternal_embedding_size or hidden_size
            self.fraternal_embeddings = nn.Embedding(vocab_size, width, padding_idx=config.fraternal_pad_token_id)
            if width != hidden_size:
                self.fraternal_projection = nn.Linear(width, hidden_size)

        needs_mlp = "cls" in (config.pooler_type, config.eval_pooler_type)
        self.mlp = SimCSEMLP(hidden_size) if needs_mlp else None
        self.queue = (
            HippocampusQueue(config.queue_size, config.queue_batch_size, hidden_size, config.forgetting_rate)
            if config.queue_size > 0
            else None
        )
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._fraternal_tokenizer: PreTrainedTokenizerBase | None = None
        # How the base encoder embeds as a sentence-transformers model (read_sentence_transformers_base), None for
        # a plain encoder: read by from_encoder, saved to and loaded from SENTENCE_TRANSFORMERS_BASE_FILE.
        self.sentence_transformers_base: dict[str, Any] | None = None
        self.post_init()
        self.freeze_word_tables()

    @property
    def encoder(self) -> PreTrainedModel:
        """The wrapped encoder (registered under :attr:`encoder_prefix`)."""
        return self._modules[self.encoder_prefix]

    @property
    def has_fraternal_view(self) -> bool:
        """Whether the model can build fraternal twins: it holds BEL_F, or reads the encoder's table as BEL_F."""
        return self.fraternal_embeddings is not None or self.shares_word_table

    def freeze_word_tables(self) -> None:
        """Make BEL_S and BEL_F trainable or fixed as the config says (``freeze_word_embeddings``,
        ``freeze_fraternal_embeddings``).

        A frozen table gets no gradient buffer and, since the Trainer's optimizer takes only parameters that require
        gradients, no optimizer state. The width-matching projection of BEL_F always trains.
        """
        if self.shares_word_table and not self.config.shares_word_table:
            raise ValueError(
                "This IFCL model reads BEL_F from the encoder's own frozen word table (both tables were frozen when it "
                "was built); to train a table, build the model with that setting (IFCLModel.from_encoder(..., "
                "freeze_word_embeddings=False), or from_pretrained(folder, freeze_word_embeddings=False))."
            )
        self.get_input_embeddings().weight.requires_grad_(not self.config.freeze_word_embeddings)
        if self.fraternal_embeddings is not None:
            self.fraternal_embeddings.weight.requires_grad_(not self.config.freeze_fraternal_embeddings)

    @torch.no_grad()
    def init_fraternal_projection(self) -> None:
        """Start the width-matching projection of BEL_F at BEL_S's scale (no-op when the widths agree); see
        :func:`scaled_orthogonal_projection`."""
        if self.fraternal_projection is not None:
            scaled_orthogonal_projection(
                self.fraternal_projection, self.get_input_embeddings().weight, self.fraternal_embeddings.weight
            )

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, RingBufferQueue):
            init.zeros_(module.embeddings)
            init.zeros_(module.valid)
            init.constant_(module.head, -1)

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> IFCLModel:
        """``PreTrainedModel.from_pretrained``, then the word tables frozen as the config says (loading replaces
        the parameters that ``__init__`` marked) and the base encoder's sentence-transformers facts read from
        the same folder or repo. A folder of the earlier layout is read into this one (:meth:`earlier_layout_kwargs`)."""
        name_or_path = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        hub_kwargs = {key: kwargs[key] for key in HUB_KWARGS if kwargs.get(key) is not None}
        earlier = (
            cls.earlier_layout_kwargs(str(name_or_path), kwargs.get("config"), **hub_kwargs) if name_or_path else {}
        )
        loaded = super().from_pretrained(*args, **kwargs, **earlier)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info gives a pair
        if earlier:
            model._weight_conversions = None  # saved again in this layout, not renamed back to the earlier one
        if name_or_path is not None:
            model.fill_left_out_weights(stored_weight_names(str(name_or_path), **hub_kwargs))
        model.freeze_word_tables()
        if name_or_path is not None:
            model.sentence_transformers_base = read_json_file(
                str(name_or_path), SENTENCE_TRANSFORMERS_BASE_FILE, **hub_kwargs
            )
        base = model.config.encoder_name_or_path
        if model.sentence_transformers_base is None and base and os.path.isdir(base):
            # Saved before the facts were: the base encoder's folder still tells them (no download for this).
            model.sentence_transformers_base = read_sentence_transformers_base(base)
        return loaded

    @staticmethod
    def earlier_layout_kwargs(name_or_path: str, config: IFCLConfig | None, **hub_kwargs) -> dict[str, Any]:
        """Folders saved before config.json became the encoder's own (``"model_type": "ifcl"``) hold the encoder's
        weights under ``encoder.``: they load under the encoder's own prefix (its weights renamed as they load), so
        that saving the model again writes the layout every loader reads. The from_pretrained arguments for that;
        none for other folders."""
        saved = read_json_file(name_or_path, "config.json", **hub_kwargs)
        if not isinstance(saved, dict) or saved.get("model_type") != IFCLConfig.model_type:
            return {}
        from transformers.models.auto.modeling_auto import MODEL_MAPPING

        source = config if isinstance(config, IFCLConfig) and config.encoder_config else IFCLConfig.from_dict(saved)
        encoder_config = source.build_encoder_config()
        prefix = (
            encoder_attribute_name(MODEL_MAPPING[type(encoder_config)])
            if type(encoder_config) in MODEL_MAPPING
            else "encoder"
        )
        if prefix == "encoder":
            return {}
        renamed = {"key_mapping": {r"^encoder\.": f"{prefix}."}}
        if isinstance(config, IFCLConfig):
            config.encoder_prefix = prefix
            return renamed
        return {**renamed, "encoder_prefix": prefix}

    @torch.no_grad()
    def fill_left_out_weights(self, stored: set[str] | None) -> None:
        """Give the weights that a folder may leave out (:data:`OPTIONAL_WEIGHTS`) their meaning: an empty queue,
        and BEL_F copied from the encoder's table when this model holds its own copy (its settings now train a
        table). ``stored``: the weight names the folder holds (None: unknown, nothing is done)."""
        if stored is None:
            return
        if self.queue is not None and not any(name.startswith("queue.") for name in stored):
            self.queue.reset()
        if self.fraternal_embeddings is not None and "fraternal_embeddings.weight" not in stored:
            if self.config.fraternal_model_name_or_path is not None:
                raise ValueError(
                    f"{self.name_or_path}: the weights hold no fraternal word table (BEL_F), though it came from "
                    f"{self.config.fraternal_model_name_or_path}; the folder is incomplete."
                )
            self.fraternal_embeddings.weight.copy_(self.get_input_embeddings().weight)

    @classmethod
    def from_encoder(
        cls,
        encoder_name_or_path: str,
        fraternal_model_name_or_path: str | None = None,
        **settings,
    ) -> IFCLModel:
        """Start IFCL training from a pretrained encoder (a Hub id or a local folder).

        BEL_F is initialised from the word embeddings of ``fraternal_model_name_or_path`` (whose tokenizer then
        tokenizes the fraternal text), or, without one, copied from the encoder's own word embeddings. ``settings``
        are :class:`IFCLConfig` fields (fusion_rate, queue_size, ...).
        """
        check_model_path("encoder_name_or_path", encoder_name_or_path)
        check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
        encoder = drop_pooler_head(AutoModel.from_pretrained(encoder_name_or_path))
        encoder_table = encoder.get_input_embeddings()
        if not isinstance(encoder_table, nn.Embedding):
            raise ValueError(
                f"{encoder_name_or_path}: the encoder has no word-embedding layer (get_input_embeddings)."
            )
        tokenizer = AutoTokenizer.from_pretrained(encoder_name_or_path)
        sentence_transformers_base = read_sentence_transformers_base(encoder_name_or_path)
        if sentence_transformers_base is not None:
            # The tokenizer truncates and lowercases as sentence-transformers does with the base (it keeps the
            # truncation length in the tokenizer too), so encode and the saved view agree with the base.
            if sentence_transformers_base["max_seq_length"]:
                tokenizer.model_max_length = sentence_transformers_base["max_seq_length"]
            if sentence_transformers_base["do_lower_case"]:
                lowercase_input(tokenizer)
            if sentence_transformers_base["omitted_modules"]:
                logger.warning(
                    f"{encoder_name_or_path}: its sentence-transformers modules "
                    f"{', '.join(sentence_transformers_base['omitted_modules'])} are not part of the IFCL model; "
                    f"encode and the saved sentence-transformers view embed without them."
                )

        fraternal_tokenizer = None
        fraternal_table = encoder_table.weight
        fraternal_pad_token_id = tokenizer.pad_token_id
        if fraternal_model_name_or_path is not None:
            fraternal_model = AutoModel.from_pretrained(fraternal_model_name_or_path)
            table = fraternal_model.get_input_embeddings()
            if not isinstance(table, nn.Embedding):
                raise ValueError(
                    f"{fraternal_model_name_or_path}: the fraternal model has no word-embedding layer "
                    f"(get_input_embeddings gave {type(table).__name__})."
                )
            fraternal_table = table.weight
            fraternal_tokenizer = AutoTokenizer.from_pretrained(fraternal_model_name_or_path)
            fraternal_pad_token_id = fraternal_tokenizer.pad_token_id

        config = IFCLConfig(
            encoder_config=encoder.config.to_dict(),
            encoder_name_or_path=public_model_name(encoder_name_or_path),
            fraternal_vocab_size=fraternal_table.shape[0],
            fraternal_embedding_size=fraternal_table.shape[1],
            fraternal_pad_token_id=fraternal_pad_token_id,
            fraternal_model_name_or_path=public_model_name(fraternal_model_name_or_path),
            encoder_prefix=encoder_attribute_name(encoder),
            **settings,
        )
        model = cls(config)
        model.encoder.load_state_dict(encoder.state_dict())
        if model.fraternal_embeddings is not None:
            with torch.no_grad():
                model.fraternal_embeddings.weight.copy_(fraternal_table)
            model.init_fraternal_projection()
        model.set_tokenizers(tokenizer, fraternal_tokenizer)
        model.sentence_transformers_base = sentence_transformers_base
        return model

    # ---------------------------------------------------------------- tokenizers

    def set_tokenizers(
        self, tokenizer: PreTrainedTokenizerBase, fraternal_tokenizer: PreTrainedTokenizerBase | None = None
    ) -> None:
        """Attach the tokenizers that ``encode`` uses and ``save_pretrained`` writes beside the weights."""
        self._tokenizer = tokenizer
        self._fraternal_tokenizer = fraternal_tokenizer

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The encoder's tokenizer, loaded from the model's folder or Hub repo when none was attached."""
        if self._tokenizer is None:
            # The encoder's own config tells AutoTokenizer what it needs; the folder's config.json is IFCL's.
            self._tokenizer = AutoTokenizer.from_pretrained(
                self.name_or_path, config=self.config.build_encoder_config()
            )
        return self._tokenizer

    @property
    def fraternal_tokenizer(self) -> PreTrainedTokenizerBase:
        """The fraternal language's tokenizer (the encoder's own when no fraternal model was given)."""
        if self.config.fraternal_model_name_or_path is None:
            return self.tokenizer
        if self._fraternal_tokenizer is None:
            self._fraternal_tokenizer = AutoTokenizer.from_pretrained(
                self.name_or_path, subfolder=FRATERNAL_TOKENIZER_FOLDER, config=self.config.build_encoder_config()
            )
        return self._fraternal_tokenizer

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """Save weights, config and remote code, plus the tokenizers (fraternal one in a sub-folder), the base
        encoder's sentence-transformers facts and the sentence-transformers view."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return
        # A loaded model's tokenizers come from its folder or repo: a re-save keeps them, unused or not.
        if self._tokenizer is not None or self.name_or_path:
            tokenizer = self.tokenizer
            # Saved with the length encode truncates at, which sentence-transformers 6 reads as max_seq_length.
            own_limit = tokenizer.model_max_length
            tokenizer.model_max_length = self.max_input_length(tokenizer)
            try:
                tokenizer.save_pretrained(save_directory)
            finally:
                tokenizer.model_max_length = own_limit
        if self._fraternal_tokenizer is not None or (self.name_or_path and self.config.fraternal_model_name_or_path):
            self.fraternal_tokenizer.save_pretrained(os.path.join(save_directory, FRATERNAL_TOKENIZER_FOLDER))
        if self.sentence_transformers_base is not None:
            write_json(os.path.join(save_directory, SENTENCE_TRANSFORMERS_BASE_FILE), self.sentence_transformers_base)
        if self.config.export_sentence_transformers:
            self.save_sentence_transformers_modules(save_directory)

    def save_sentence_transformers_modules(self, save_directory: str | os.PathLike) -> bool:
        """Write the files that let ``SentenceTransformer(save_directory)`` embed like ``encode``, without remote
        code, as sentence-transformers 6 writes them.

        The Transformer module is the folder itself, as in sentence-transformers' own published models: config.json
        is the encoder's config (IFCL's settings under one key of it) and the encoder's weights in model.safetensors
        carry the names its plain ``AutoModel`` reads, so nothing is stored twice. The evaluation pooler goes to
        ``1_Pooling/``, for ``cls`` SimCSE's MLP to ``2_Dense/``, and when the base encoder
        is a sentence-transformers model that normalizes, a ``Normalize`` module after them; the truncation length,
        prompts and similarity function are the base's too (:attr:`sentence_transformers_base`). Returns False
        (writing nothing) for poolers sentence-transformers has no module for (avg_first_last, avg_top2) or when no
        tokenizer is known.
        """
        from safetensors.torch import save_file

        pooler = SENTENCE_TRANSFORMERS_POOLING.get(self.config.eval_pooler_type)
        if pooler is None or (self._tokenizer is None and not self.name_or_path):
            return False
        pooling_mode, with_mlp = pooler
        base = self.sentence_transformers_base or {}
        transformer_config: dict[str, Any] = {
            "transformer_task": "feature-extraction",
            "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
            "module_output_name": "token_embeddings",
        }
        if "add_pooling_layer" in inspect.signature(type(self.encoder).__init__).parameters:
            # Saved without its pooler head (drop_pooler_head): built without one, it loads with every weight.
            transformer_config["model_kwargs"] = {"add_pooling_layer": False}
        write_json(os.path.join(save_directory, "sentence_bert_config.json"), transformer_config, indent=4)
        modules = [("", ST_TRANSFORMER)]

        def add_module(name: str, module_type: str, config: dict[str, Any]) -> str:
            folder = f"{len(modules)}_{name}"
            write_json(os.path.join(save_directory, folder, "config.json"), config, indent=4)
            modules.append((folder, module_type))
            return os.path.join(save_directory, folder)

        add_module(
            "Pooling",
            ST_POOLING,
            {"embedding_dimension": self.hidden_size, "pooling_mode": pooling_mode, "include_prompt": True},
        )
        embedding = {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}
        if with_mlp:
            dense_config = {
                "in_features": self.hidden_size,
                "out_features": self.hidden_size,
                "bias": True,
                "activation_function": "torch.nn.modules.activation.Tanh",
            }
            dense_folder = add_module("Dense", ST_DENSE, dense_config | embedding)
            weights = {"linear.weight": self.mlp.dense.weight, "linear.bias": self.mlp.dense.bias}
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in weights.items()},
                os.path.join(dense_folder, "model.safetensors"),
            )
        if base.get("normalize"):
            add_module("Normalize", ST_NORMALIZE, embedding)
        write_json(
            os.path.join(save_directory, "modules.json"),
            [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(modules)],
        )
        write_json(
            os.path.join(save_directory, "config_sentence_transformers.json"),
            {
                "__version__": library_versions(),
                "default_prompt_name": self.default_prompt_name,
                "model_type": "SentenceTransformer",
                "prompts": self.prompts,
                "similarity_fn_name": base.get("similarity_fn_name") or "cosine",
            },
            sort_keys=True,
        )
        return True

    @property
    def prompts(self) -> dict[str, str]:
        """The named prompts ``encode(prompt_name=...)`` prepends: sentence-transformers' defaults ("query" and
        "document", both empty) and those of a sentence-transformers base encoder."""
        return {"query": "", "document": ""} | (self.sentence_transformers_base or {}).get("prompts", {})

    @property
    def default_prompt_name(self) -> str | None:
        """The prompt ``encode`` prepends when given none (a sentence-transformers base encoder's; usually None)."""
        return (self.sentence_transformers_base or {}).get("default_prompt_name")

    # ---------------------------------------------------------------- embeddings

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.get_input_embeddings()

    def pool(
        self,
        pooler_type: str,
        attention_mask: torch.Tensor,
        hidden_states: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """Sentence representation from the encoder's hidden states (:func:`pool_hidden_states`; ``cls`` goes
        through SimCSE's MLP)."""
        return pool_hidden_states(pooler_type, attention_mask, hidden_states, self.mlp)

    def fraternal_word_embeddings(self, fraternal_input_ids: torch.Tensor) -> torch.Tensor:
        """BEL_F(x⁻) at the encoder's width."""
        if not self.has_fraternal_view:
            raise ValueError(
                "This IFCL model has no fraternal embeddings: it was configured with fraternal_loss_weight = "
                "twins_loss_weight = 0 (the SimCSE ablation)."
            )
        table = self.get_input_embeddings() if self.fraternal_embeddings is None else self.fraternal_embeddings
        embeddings = table(fraternal_input_ids)
        if self.fraternal_projection is not None:
            embeddings = self.fraternal_projection(embeddings)
        return embeddings

    def fuse(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        fraternal_input_ids: torch.Tensor,
        fraternal_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fraternal twin input of Eq. 3 (:func:`fuse_word_embeddings`): returns (BEL_S(x) padded to the common
        length L, fused embeddings, the anchor mask padded to L, the union mask)."""
        return fuse_word_embeddings(
            self.get_input_embeddings(),
            self.fraternal_word_embeddings,
            self.config.fusion_rate,
            (input_ids, attention_mask, self.encoder.config.pad_token_id or 0),
            (fraternal_input_ids, fraternal_attention_mask, self.config.fraternal_pad_token_id or 0),
        )

    def _encode_tokens(
        self,
        token_type_ids: torch.Tensor | None = None,
        all_hidden_states: bool = True,
        output_attentions: bool = False,
        **inputs: torch.Tensor,
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
        """The encoder's hidden states (index 0 the embedding layer, or only the last layer's as a 1-tuple) and,
        when asked, its attention maps.

        Token type ids are passed only when given (not every encoder takes them).
        """
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        outputs = self.encoder(
            **inputs, output_hidden_states=all_hidden_states, output_attentions=output_attentions, return_dict=True
        )
        hidden_states = outputs.hidden_states if all_hidden_states else (outputs.last_hidden_state,)
        return hidden_states, outputs.attentions if output_attentions else None

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
    ) -> IFCLEncoderOutput | IFCLTwinsOutput:
        """Evaluation embeddings, or with ``return_twins=True`` the training views of the batch (always as a
        ``ModelOutput``: ``return_dict`` is accepted for callers that pass it, such as sentence-transformers).

        ``training_pooler=True`` pools with the training pooler instead (what the peer objectives contrast);
        ``output_hidden_states`` / ``output_attentions`` add the encoder's states and attention maps (the latter
        needs an encoder with eager attention).

        Training views: anchors and identical twins are the same input encoded twice in one call (each row draws
        its own dropout mask, Eq. 1); the fraternal twins (Eq. 2–3) join that call or follow in a second one, see
        :meth:`stacks_views`. Without fraternal ids, or in a model built without fraternal twins (the SimCSE
        ablation), the fraternal view is not computed at all and fraternal ids are ignored.
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if not return_twins:
            pooler_type = self.config.pooler_type if training_pooler else self.config.eval_pooler_type
            all_hidden_states = output_hidden_states or pooler_type in ALL_LAYER_POOLERS
            hidden_states, attentions = self._encode_tokens(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                all_hidden_states=all_hidden_states,
                output_attentions=output_attentions,
            )
            return IFCLEncoderOutput(
                sentence_embedding=self.pool(pooler_type, attention_mask, hidden_states),
                last_hidden_state=hidden_states[-1],
                hidden_states=hidden_states if all_hidden_states else None,
                attentions=attentions,
            )

        batch_size = input_ids.shape[0]
        if fraternal_input_ids is None or not self.has_fraternal_view:
            words = self.get_input_embeddings()(input_ids)
            views = [(torch.cat([words, words]), torch.cat([attention_mask, attention_mask]), 2)]
        else:
            if fraternal_attention_mask is None:
                fraternal_attention_mask = torch.ones_like(fraternal_input_ids)
            padded_words, fused, padded_mask, union_mask = self.fuse(
                input_ids, attention_mask, fraternal_input_ids, fraternal_attention_mask
            )
            if self.stacks_views(input_ids.device):
                views = [
                    (torch.cat([padded_words, padded_words, fused]), torch.cat([padded_mask] * 2 + [union_mask]), 3)
                ]
            else:
                # Right padding: the first columns of BEL_S(x) padded are BEL_S(x). One lookup of the word table,
                # so its backward builds one dense gradient of the table, not two.
                words = padded_words[:, : input_ids.shape[1]]
                views = [
                    (torch.cat([words, words]), torch.cat([attention_mask, attention_mask]), 2),
                    (fused, union_mask, 1),
                ]
        pooled, embedding_outputs = [], []
        for inputs_embeds, masks, num_views in views:
            token_types = None
            if token_type_ids is not None:
                token_types = pad_to_length(token_type_ids, inputs_embeds.shape[1], 0).repeat(num_views, 1)
            hidden_states, _ = self._encode_tokens(
                inputs_embeds=inputs_embeds, attention_mask=masks, token_type_ids=token_types
            )
            pooled += self.pool(self.config.pooler_type, masks, hidden_states).split(batch_size)
            embedding_outputs += mean_pool(hidden_states[0], masks).split(batch_size)
        has_fraternal = len(pooled) == 3
        return IFCLTwinsOutput(
            anchor=pooled[0],
            identical=pooled[1],
            fraternal=pooled[2] if has_fraternal else None,
            anchor_embedding_output=embedding_outputs[0],
            identical_embedding_output=embedding_outputs[1],
            fraternal_embedding_output=embedding_outputs[2] if has_fraternal else None,
        )

    def stacks_views(self, device: torch.device) -> bool:
        """Whether the three views go through the encoder in one call (``IFCLConfig.stack_views``).

        One call fills a GPU better; on CPU the anchors would be padded to the (often longer) fraternal length,
        so two calls ([anchor; identical] at their own length, then the fused view) are faster there.
        """
        if self.config.stack_views is None:
            return device.type != "cpu"
        return self.config.stack_views

    def max_input_length(self, tokenizer: PreTrainedTokenizerBase) -> int:
        """The longest input the encoder takes (:func:`max_input_length`), capped by a sentence-transformers base
        encoder's ``max_seq_length`` (what the saved sentence-transformers view truncates at)."""
        limit = max_input_length(tokenizer, self.encoder.config)
        base_limit = (self.sentence_transformers_base or {}).get("max_seq_length")
        return min(limit, base_limit) if base_limit else limit

    @torch.no_grad()
    def encode(
        self,
        sentences: str | Sequence[str],
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 64,
        show_progress_bar: bool = False,
        convert_to_numpy: bool = False,
        convert_to_tensor: bool | None = None,
        device: str | torch.device | None = None,
        normalize_embeddings: bool = False,
        *,
        max_length: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> torch.Tensor | np.ndarray | list[torch.Tensor]:
        """Evaluation embeddings of ``sentences``, one float32 row per sentence, by default as one CPU tensor.

        The arguments that ``SentenceTransformer.encode`` has too come in its order and mean the same:
        ``prompt_name`` / ``prompt`` prepend a prompt (:attr:`prompts`, :attr:`default_prompt_name`);
        ``normalize_embeddings`` scales each row to length 1; ``convert_to_numpy=True`` gives a numpy array,
        ``convert_to_tensor=True`` a tensor (it wins over numpy), and both False a list of rows. Unlike
        sentence-transformers the default is a tensor (``convert_to_tensor=None``: a tensor unless numpy is asked
        for), always on the CPU, and a single string gives a 1-row matrix.

        Sentences are batched by length (longest first) so padding stays short; the order of the result follows
        the input. They are truncated only at the encoder's own limit (:meth:`max_input_length`; ``max_length`` to
        change it): the training length ``max_seq_length`` does not apply, as STS evaluation uses whole sentences.
        The model's training mode is restored afterwards.
        """
        if isinstance(sentences, str):
            sentences = [sentences]
        if prompt is None:
            if prompt_name is not None:
                if prompt_name not in self.prompts:
                    raise ValueError(f"Prompt name {prompt_name!r} is not one of {', '.join(self.prompts)}.")
                prompt = self.prompts[prompt_name]
            elif self.default_prompt_name is not None:
                prompt = self.prompts.get(self.default_prompt_name)
        if prompt:
            sentences = [prompt + sentence for sentence in sentences]
        tokenizer = tokenizer or self.tokenizer
        max_length = max_length or self.max_input_length(tokenizer)
        device = torch.device(device) if device is not None else self.device
        if device != self.device:
            self.to(device)
        # Tokenized once; batches of similar token counts, so padding stays short.
        encoded = tokenizer(list(sentences), truncation=True, max_length=max_length)
        order = sorted(range(len(sentences)), key=lambda i: -len(encoded["input_ids"][i]))
        padding = {"input_ids": tokenizer.pad_token_id or 0, "attention_mask": 0, "token_type_ids": 0}
        embeddings = torch.empty(len(sentences), self.hidden_size)
        was_training = self.training
        self.eval()
        starts = range(0, len(order), batch_size)
        if show_progress_bar:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="Encoding", unit="batch")
        try:
            for start in starts:
                indices = order[start : start + batch_size]
                length = len(encoded["input_ids"][indices[0]])
                batch = {
                    key: torch.tensor(
                        [encoded[key][i] + [pad] * (length - len(encoded[key][i])) for i in indices], device=device
                    )
                    for key, pad in padding.items()
                    if key in encoded
                }
                embeddings[indices] = self(**batch).sentence_embedding.float().cpu()
        finally:
            self.train(was_training)
        if normalize_embeddings:
            embeddings = nn.functional.normalize(embeddings, p=2, dim=1)
        if convert_to_tensor or (convert_to_tensor is None and not convert_to_numpy):
            return embeddings
        if convert_to_numpy:
            return embeddings.numpy()
        return list(embeddings)


IFCLConfig.register_for_auto_class()
IFCLModel.register_for_auto_class("AutoModel")
