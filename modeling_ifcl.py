"""IFCL sentence encoder: any ``AutoModel`` encoder, a fraternal word-embedding table and a queue of past rows.

Remote code that every saved model carries: it imports nothing from this project but its neighbour
``configuration_ifcl.py``; what training adds (fitting a model to a run, objectives, losses, the
sentence-transformers view) is in ``ifcl/``, which imports this module, never the other way.
"""

from __future__ import annotations

import json
import numbers
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers import initialization as init
from transformers.utils import ModelOutput

try:  # loaded as remote code (a package made by transformers)
    from .configuration_ifcl import POOLER_TYPES, IFCLConfig
except ImportError:  # imported from a checkout of the project
    from configuration_ifcl import POOLER_TYPES, IFCLConfig

ALL_LAYER_POOLERS = ("avg_first_last", "avg_top2")  # poolers that read more than the last layer
FRATERNAL_TOKENIZER = "fraternal_tokenizer"  # the sub-folder of a saved model that holds the fraternal tokenizer
# A tokenizer is read from a file whose name starts so (tokenizer.json, tokenizer_config.json, vocab.txt, vocab.json)
# or from a SentencePiece model (spiece.model, sentencepiece.bpe.model, tokenizer.model).
TOKENIZER_FILE_STARTS = ("tokenizer", "vocab")


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
    # anchors, identical twins, fraternal twins (None without them), then their embedding-layer outputs alike
    return IFCLTwinsOutput(*(pooled + [None])[:3], *(embedding_outputs + [None])[:3])


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


def word_table_of(model: nn.Module, name: str) -> nn.Embedding:
    """The word-embedding table of ``model``, or ``ValueError`` naming ``name`` when it has none."""
    table = model.get_input_embeddings()
    if not isinstance(table, nn.Embedding):
        raise ValueError(f"{name}: the encoder has no word-embedding table (get_input_embeddings gave {table!r}).")
    return table


def load_tokenizer(
    name_or_path: str, subfolder: str = "", trust_remote_code: bool = False, **options
) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained``, except that a local folder without a tokenizer's file is refused
    (transformers would build a tokenizer from nothing, which reads every word as [UNK]), and a tokenizer JSON file
    that is not valid JSON is named; both as ``OSError`` naming the folder or file. Hub ids load as they are."""
    folder = os.path.join(name_or_path, subfolder) if subfolder else str(name_or_path)
    local = os.path.isdir(folder)
    names = os.listdir(folder) if local else []
    if local and not any(name.startswith(TOKENIZER_FILE_STARTS) or name.endswith(".model") for name in names):
        raise OSError(
            f"{folder} holds no tokenizer files (tokenizer.json, tokenizer_config.json, a vocabulary), and one built "
            "from nothing would read every word as [UNK]: save the model's tokenizer into it "
            "(tokenizer.save_pretrained), e.g. its base encoder's."
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
    ``frozen`` says; and, when its width differs from BEL_S's, a linear map to it (training starts it at BEL_S's
    scale: ``ifcl.model.scaled_orthogonal_projection``).
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
    return embedding, projection


def check_matryoshka_width(dims: list[int] | None, width: int) -> None:
    """``ValueError`` for a Matryoshka size wider than the embeddings."""
    if max(dims or [0]) > width:
        raise ValueError(f"matryoshka_dims {list(dims)}: the embeddings have {width} dimensions.")


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

    def __init__(
        self,
        config: IFCLConfig,
        add_pooling_layer: bool = False,
        *,
        encoder: PreTrainedModel | None = None,
        fraternal_table: torch.Tensor | None = None,
    ) -> None:
        """The model of ``config``: around ``encoder`` when given (a loaded encoder, kept as it is, with BEL_F
        holding ``fraternal_table``: ``ifcl.IFCLModel.from_encoder``), else around a new encoder of the config's, whose weights
        ``from_pretrained`` loads. ``add_pooling_layer``: sentence-transformers passes it; no pooler head is held."""
        super().__init__(config)
        # Registered directly: add_module would take the ``encoder`` property for a clash.
        self.encoder_prefix = config.encoder_prefix or "encoder"
        given = encoder is not None
        if not given:  # an encoder with its own code (encoder_code) builds from the files of the model's folder
            encoder = AutoModel.from_config(config.build_encoder_config(), trust_remote_code=bool(config.encoder_code))
        if getattr(encoder, "pooler", None) is not None:  # BERT's head: no pooler uses it, DDP rejects it unused
            encoder.pooler = None
        self._modules[self.encoder_prefix] = encoder
        words = word_table_of(self.encoder, type(self.encoder).__name__)
        # The sentence embeddings' width: the word table may be narrower (ALBERT, ELECTRA), and BEL_F matches it.
        self.hidden_size = getattr(self.encoder.config, "hidden_size", None) or words.embedding_dim
        check_matryoshka_width(config.matryoshka_dims, self.hidden_size)
        self.fraternal_embeddings = self.fraternal_projection = None
        if not given:  # else built after post_init, which would draw new values over its table
            self.set_fraternal_table()
        self.mlp = simcse_mlp(self.hidden_size) if "cls" in (config.pooler_type, config.eval_pooler_type) else None
        self.queue = self.new_queue()
        self._tokenizer = self._fraternal_tokenizer = None  # loaded from the folder when first asked for
        self.truncate_dim: int | None = None  # encode's default size (from_pretrained's truncate_dim)
        self.post_init()  # initialises what is new; a loaded encoder's weights are marked as loaded and kept
        if given:
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
        """``PreTrainedModel.from_pretrained``, and two things of a sentence encoder's:

        - ``truncate_dim``: ``encode`` keeps each embedding's first that many dimensions unless told otherwise (a
          Matryoshka size), as ``SentenceTransformer(..., truncate_dim=...)`` does.
        - ``attn_implementation`` (``"eager"``, ``"sdpa"``, ``"flash_attention_2"``, ...) is the encoder's, which
          checks it (the rest of the model has no attention); by default the encoder's own default.
        """
        checked_truncate_dim(truncate_dim)  # its type, before anything loads
        config = kwargs.get("config")
        if isinstance(config, PretrainedConfig) and config._attn_implementation is not None:  # AutoModel put it there
            attn_implementation, config._attn_implementation = attn_implementation or config._attn_implementation, None
        with_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        if any(".lora_" in key for key in info["unexpected_keys"]):  # the ifcl package's class merges them
            message = "is a checkpoint of a LoRA run: load it with the ifcl package's IFCLModel.from_pretrained"
            raise ValueError(f"{pretrained_model_name_or_path} {message}, which merges its adapters.")
        if attn_implementation is not None:
            model.encoder.set_attn_implementation(attn_implementation)
        model.truncate_dim = checked_truncate_dim(truncate_dim, model.hidden_size)
        return (model, info) if with_info else model

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
