"""What every training objective is: a module that turns a batch and the model into a loss.

``IFCLTrainer`` runs any objective the same way: the data collator calls :meth:`Objective.collate`, ``compute_loss``
calls the objective, and :meth:`Objective.on_step_end` runs after each optimizer step with the unwrapped model and a
gather across processes (queue pushes, momentum updates). An objective's own
modules (heads, a peer network, a momentum encoder) are a sub-module of the model while it trains, so the
optimizer, data parallelism and checkpoints take them like any weight; the published model leaves them out.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

import datasets
import torch
from accelerate.utils import extract_model_from_parallel
from datasets.fingerprint import Hasher
from torch import nn

import ifcl.queue as ring
from configuration_ifcl import IFCLSettings, SharedSettings
from ifcl.data import check_text_dataset, check_training_data_size, is_text_dataset, training_cache_dir
from ifcl.failures import cache_write_failures_named
from ifcl.model import fit_dropout
from ifcl.publishing import adopt_base

logger = logging.getLogger(__name__)

# (local rows) -> (rows of all processes in rank order, where this process's rows start). Keeps the autograd graph.
Gather = Callable[[torch.Tensor], tuple[torch.Tensor, int]]
# (local rows, any number) -> the rows of all processes in rank order, without gradient: what a queue takes.
RowGather = Callable[[torch.Tensor], torch.Tensor]
# A batch's rows that the loss reads, by name, each [B, ...] with row i of sentence i (:meth:`Objective.embed`).
Embeddings = dict[str, torch.Tensor]

# Fields of a tokenized feature that are padded per group: "<prefix>input_ids" leads its group.
TOKEN_FIELDS = ("input_ids", "attention_mask", "token_type_ids")

# IFCL's parts switched off: no fraternal table, no queue, both word tables trained. The peer objectives train so.
WITHOUT_IFCL: dict[str, Any] = {
    "queue_size": 0,
    "fraternal_loss_weight": 0.0,
    "twins_loss_weight": 0.0,
    "freeze_word_embeddings": False,
    "freeze_fraternal_embeddings": False,
}


def no_gather(local: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The one-process :data:`Gather`: the rows themselves, starting at 0."""
    return local, 0


def no_row_gather(local: torch.Tensor) -> torch.Tensor:
    """The one-process :data:`RowGather`: the rows themselves."""
    return local


def settings_as_dict(settings: Any) -> dict[str, Any]:
    """A settings dataclass as the dict the model config stores (``IFCLConfig.objective_settings``)."""
    return asdict(settings) if is_dataclass(settings) else {}


def tokenizer_fingerprint(tokenizer) -> Any:
    """What a tokenizer's output depends on, for cache fingerprints: its vocabulary and rules (a fast tokenizer's
    JSON without the truncation and padding a call sets), special tokens and class, so a tokenizer rewritten in the
    same folder gives new caches."""
    if getattr(tokenizer, "is_fast", False):
        rules = json.loads(tokenizer.backend_tokenizer.to_str())
        rules.pop("truncation", None)
        rules.pop("padding", None)
    else:
        rules = sorted(tokenizer.get_vocab().items())
    return [type(tokenizer).__name__, tokenizer.name_or_path, len(tokenizer), rules, tokenizer.all_special_tokens]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside a data-parallel, DeepSpeed or compiled wrapper (the model itself when unwrapped)."""
    return extract_model_from_parallel(model)


def fit_model(model: nn.Module, **settings: Any) -> None:
    """Give a built ``IFCLModel`` the settings of a run (``IFCLConfig`` fields): the config takes them (IFCL's checked
    as :class:`IFCLSettings`), the queue starts empty when its shape changes, a fraternal table no longer used goes, a
    shared one becomes a copy when it will train, and the word tables are frozen or trained as the config now says."""
    config = model.config
    ifcl_names = [f.name for f in fields(IFCLSettings)]
    IFCLSettings(**{name: settings.get(name, getattr(config, name)) for name in ifcl_names})  # refuses bad values
    queue_shape = (config.queue_size, config.queue_batch_size)
    for name, value in settings.items():
        setattr(config, name, value)
    if (config.queue_size, config.queue_batch_size) != queue_shape:
        if ring.size(model.queue):
            logger.warning(f"The hippocampus queue held {ring.size(model.queue)} rows; it starts empty.")
        model.queue = model.new_queue()
    if not config.uses_fraternal_twins or model.fraternal_embeddings is None:  # none, or BEL_F was BEL_S: a copy
        model.set_fraternal_table()
    # BEL_S and BEL_F fixed or trained (IFCL's reading of BEL_S: "the embedding layer without trainable parameters"):
    # a frozen table gets no gradient and so no optimizer state. BEL_F's width-matching projection always trains.
    model.get_input_embeddings().weight.requires_grad_(not config.freeze_word_embeddings)
    if model.fraternal_embeddings is not None:
        model.fraternal_embeddings.weight.requires_grad_(not config.freeze_fraternal_embeddings)


@dataclass(frozen=True)
class Paper:
    """The paper an objective implements: how a model card names it, a one-line description with its link, and
    the BibTeX entry to cite."""

    title: str
    description: str
    citation: str


@dataclass
class ObjectiveOutput:
    """A batch's loss and its terms for the logs."""

    loss: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)


def pad_features(features: list[dict[str, Any]], pad_token_ids: dict[str, int]) -> dict[str, torch.Tensor]:
    """Pad a list of tokenized features into tensors, each group of fields to its own longest sequence.

    A group is ``<prefix>input_ids`` with ``<prefix>attention_mask`` and ``<prefix>token_type_ids`` (prefix "" for
    the sentences, or an objective's own, e.g. "pair_"); its ``input_ids`` are padded with ``pad_token_ids[prefix]``
    (``pad_token_ids[""]`` for a prefix not listed), the rest with 0. Other list fields are padded with 0 to their
    own longest; scalar fields become 1-d tensors.
    """
    batch: dict[str, torch.Tensor] = {}
    for key in features[0]:
        values = [feature[key] for feature in features]
        if not isinstance(values[0], (list, tuple)):
            batch[key] = torch.tensor(values)
            continue
        prefix = next((key[: -len(name)] for name in TOKEN_FIELDS if key.endswith(name)), None)
        lead = f"{prefix}input_ids" if prefix is not None and f"{prefix}input_ids" in features[0] else key
        length = max(len(feature[lead]) for feature in features)
        pad = pad_token_ids.get(prefix, pad_token_ids[""]) if key.endswith("input_ids") else 0
        batch[key] = torch.tensor([list(v) + [pad] * (length - len(v)) for v in values], dtype=torch.long)
    return batch


class Objective(nn.Module):
    """Base class of the training objectives (IFCL, SimCSE, ConIsI, PCL, miCSE).

    Subclasses set ``name`` (``--objective``), ``paper`` (model card and citation), ``loss_terms`` (the terms
    :meth:`forward` logs, which the training-curve plot draws) and ``settings_class`` (a dataclass of the objective's
    own command-line settings, checked in ``__post_init__``), and implement :meth:`forward`;
    :data:`ifcl.objectives.OBJECTIVES` registers them. They are built from the model by
    :func:`ifcl.objectives.build_objective`; they must not keep the model as an attribute (they become its sub-module
    while training), only what they copy from it.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[Paper]
    loss_terms: ClassVar[tuple[str, ...]] = ()
    settings_class: ClassVar[type | None] = None
    # The model-config fields this objective alone reads, shown on the model card.
    card_settings: ClassVar[tuple[str, ...]] = ()
    # The command-line settings this objective alone reads beyond ``settings_class`` (refused with another objective).
    own_arguments: ClassVar[tuple[str, ...]] = ()
    # Why ``matryoshka_dims`` cannot train this objective's embeddings (None: its contrastive terms take them).
    without_matryoshka: ClassVar[str | None] = None
    # The token groups (prefixes of TOKEN_FIELDS: "" the sentences) that a gradient cache's mini-batch embeds at its
    # own length, each group on its own: those whose rows' embeddings do not change with the padding after them.
    # Groups left out keep the batch's length (ConIsI and PCL stack theirs into one call of one length).
    token_groups_at_own_length: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: nn.Module, settings: Any = None) -> None:
        super().__init__()
        if settings is None and self.settings_class is not None:
            settings = self.settings_class()
        self.check_config(model.config, settings)
        self.settings = settings
        # Rows this process's micro-batches queued since the last optimizer step (see :meth:`queue_rows`).
        self.pending_rows: list[torch.Tensor] = []

    @classmethod
    def stored_settings(cls, config) -> Any:
        """This objective's settings as the model ``config`` stores them: the fields of ``settings_class`` under the
        config's ``objective_settings`` (those a config written by an older version lacks take their defaults); None
        for an objective without settings. The one place that says where they are stored."""
        if cls.settings_class is None:
            return None
        stored = getattr(config, "objective_settings", None) or {}
        known = {f.name for f in fields(cls.settings_class)}
        return cls.settings_class(**{k: v for k, v in stored.items() if k in known})

    # ------------------------------------------------------------------ data

    @property
    def text_columns(self) -> tuple[str, ...]:
        """The text columns a training row needs."""
        return ("sentence",)

    def tokenize(self, batch: dict[str, list[str]], tokenizer, max_length: int) -> dict[str, list]:
        """``datasets.map`` hook: the features of a batch of training text (:attr:`text_columns`), each sentence
        truncated at ``max_length`` (``--max_seq_length``)."""
        return dict(tokenizer(batch["sentence"], truncation=True, max_length=max_length))

    def feature_key(self) -> Any:
        """What :meth:`tokenize`'s output depends on beyond the encoder's tokenizer and ``max_length``: part of the
        token cache's fingerprint, so a change of it tokenizes again. By default all the objective's settings."""
        return settings_as_dict(self.settings)

    def collate(self, features: list[dict[str, Any]], tokenizer) -> dict[str, torch.Tensor]:
        """Data-collator hook: features → a batch of tensors. Augmentations made per batch go here."""
        return pad_features(features, {"": tokenizer.pad_token_id or 0})

    @classmethod
    def longest_input(cls, tokenizer, max_seq_length: int) -> tuple[int, str]:
        """The longest input this objective gives the encoder for ``--max_seq_length`` (checked against the encoder's
        limit before it loads), and how to name it in an error. By default the sentences themselves."""
        return max_seq_length, "--max_seq_length"

    @classmethod
    def run_settings(cls, settings: Any, lora: bool = False) -> dict[str, Any]:
        """The model-config settings this objective trains with given its ``settings``, whatever the model was built
        with: the encoder alone (:data:`WITHOUT_IFCL`: no fraternal table, no queue, both word tables trained, as
        the peers' papers train), and this objective's name and settings; with ``lora`` (the encoder trains LoRA
        adapters) the word tables stay frozen, so that the adapters alone train. ``run_ifcl.py`` plans the run's
        config with them before any model loads; :meth:`prepare` gives them to the model."""
        frozen = {"freeze_word_embeddings": True, "freeze_fraternal_embeddings": True} if lora else {}
        return {**WITHOUT_IFCL, **frozen, "objective": cls.name, "objective_settings": settings_as_dict(settings)}

    @classmethod
    def check_config(cls, config, settings: Any = None) -> None:
        """``ValueError`` in one line for a model config this objective cannot train with its ``settings`` (default
        those the config stores), e.g. ``matryoshka_dims`` where :attr:`without_matryoshka` says why not:
        ``run_ifcl.py`` asks before any model loads, the objective when it is built."""
        if cls.without_matryoshka and getattr(config, "matryoshka_dims", None):
            raise ValueError(f"--matryoshka_dims with --objective {cls.name}: {cls.without_matryoshka}")

    def prepare(
        self,
        model: nn.Module,
        global_batch: int,
        train_dataset=None,
        tokenizer=None,
        main_process_first: Callable[[], AbstractContextManager] = nullcontext,
        num_proc: int | None = None,
        on_the_fly: bool = False,
    ):
        """The run's one preparation (``IFCLTrainer`` calls it, so ``run_ifcl.py`` too): the unwrapped ``model`` embeds
        as its sentence-transformers base does (``adopt_base``) and takes :meth:`run_settings` with a queue slot of
        ``global_batch`` rows (``fit_model``); a text ``train_dataset`` is tokenized under ``main_process_first``
        and its size checked (``check_training_data_size``); a stream (``ifcl.streaming.TrainingStream``: ``IFCLTrainer``
        wraps a ``datasets.IterableDataset`` in one) is checked and tokenized as each row is read. Returns the
        training features."""
        adopt_base(model)
        dropout = fit_dropout(model.encoder, model.config.training_dropout)
        if dropout:
            logger.warning(f"{dropout} (--training_dropout).")
        elif model.config.training_dropout != SharedSettings.training_dropout:
            logger.warning(
                f"training_dropout {model.config.training_dropout:g} is not applied: {type(model.encoder).__name__} "
                "has dropout of its own, which it trains with (training_dropout is for encoders without any)."
            )
        queue_batch_size = {"queue_batch_size": global_batch} if model.config.queue_batch_size != global_batch else {}
        fit_model(model, **self.run_settings(self.settings, bool(model.config.lora)), **queue_batch_size)
        if model.queue is not None and queue_batch_size:
            logger.info(f"Hippocampus queue: {model.config.queue_size} slots of the global batch N = {global_batch}.")
        if isinstance(train_dataset, torch.utils.data.IterableDataset):  # a stream: checked and tokenized as read
            tokenizer, max_length = tokenizer or model.tokenizer, model.config.max_seq_length
            train_dataset.set_transform(self.text_columns, lambda batch: self.tokenize(batch, tokenizer, max_length))
        elif is_text_dataset(train_dataset):
            with main_process_first():
                train_dataset = self.tokenize_dataset(
                    train_dataset, tokenizer or model.tokenizer, model.config.max_seq_length, num_proc, on_the_fly
                )
        if train_dataset is not None and hasattr(train_dataset, "__len__"):
            check_training_data_size(len(train_dataset), global_batch, model.config.queue_size)
        return train_dataset

    def tokenize_dataset(self, dataset, tokenizer, max_length: int, num_proc: int | None = None, on_the_fly=False):
        """The features of a text ``datasets.Dataset`` (:attr:`text_columns`, checked; other columns dropped) by
        :meth:`tokenize`: once, with ``map``, cached beside a file-backed dataset for later runs and the other
        processes, under a fingerprint of what the features depend on (:attr:`name`, :meth:`feature_key`, the
        tokenizer, ``max_length``; not the loss's settings); with ``on_the_fly``, as the data loader reads each row
        (``with_transform``), for corpora whose token cache would not fit on disk. A failed write of the cache (a full
        disk) names its folder and the ways out, and leaves no temporary file there."""
        check_text_dataset(dataset, self.text_columns, reader=f"--objective {self.name}")
        dataset = dataset.select_columns(list(self.text_columns))

        def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
            return self.tokenize(batch, tokenizer, max_length)

        if on_the_fly:
            return dataset.with_transform(tokenize)
        fingerprint = Hasher.hash(
            [dataset._fingerprint, self.name, self.feature_key(), tokenizer_fingerprint(tokenizer), max_length]
        )

        def tokenized():
            return dataset.map(
                tokenize,
                batched=True,
                remove_columns=dataset.column_names,
                num_proc=num_proc,
                desc="Tokenizing",
                new_fingerprint=fingerprint,
            )

        if not dataset.cache_files:  # in memory: so are its features
            return tokenized()
        # The token cache lies beside the dataset's Arrow file: a failed write there is named with the ways out.
        folder = os.path.dirname(os.path.abspath(dataset.cache_files[0]["filename"]))
        roots = {"IFCL_DATA_CACHE": training_cache_dir(), "HF_DATASETS_CACHE": datasets.config.HF_DATASETS_CACHE}
        real = {name: os.path.realpath(str(root)) for name, root in roots.items()}
        inside = [name for name, root in real.items() if os.path.commonpath([root, os.path.realpath(folder)]) == root]
        elsewhere = f"set {inside[0]} to another folder" if inside else "keep the training set in another folder"
        ways_out = (
            f"{elsewhere}, or tokenize as the rows are read (--tokenize_on_the_fly; IFCLTrainer's "
            "tokenize_on_the_fly=True)"
        )
        with cache_write_failures_named(folder, "the token cache of the training set", ways_out):
            return tokenized()

    # ------------------------------------------------------------------ training

    def forward(
        self, model: nn.Module, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        """The loss of one micro-batch: :meth:`loss_from` of :meth:`embed`. ``model`` is the (possibly wrapped) model:
        call it, not its sub-modules, so data parallelism sees the forward. ``gather`` brings in-batch candidates
        from all processes."""
        return self.loss_from(model, self.embed(model, inputs), inputs, gather)

    def embed(self, model: nn.Module, inputs: dict[str, torch.Tensor], replay: bool = False) -> Embeddings:
        """The rows of a batch that :meth:`loss_from` reads, each [B, ...] with row i of sentence i: all the model and
        dropout work, none across rows, so a gradient cache (``IFCLTrainer(cache_mini_batch_size=...)``) can embed a
        batch mini-batch by mini-batch. ``replay``: the cache's re-forward with gradients, which may leave out rows
        that take none (a momentum encoder's)."""
        raise NotImplementedError

    @classmethod
    def gradient_cache_refusal(cls, processes: int) -> str | None:
        """Why a gradient cache cannot train this objective on ``processes`` processes (None: it can);
        ``check_cache_mini_batch_size`` refuses ``--cache_mini_batch_size`` with it. By default, when the objective
        has no :meth:`embed`."""
        return None if cls.embed is not Objective.embed else "its loss is not split into embed and loss_from."

    def loss_from(
        self, model: nn.Module, embeddings: Embeddings, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        """The loss of a micro-batch given its :meth:`embed` rows (all of them, the cache's too); what runs once per
        micro-batch (queue rows, the objective's heads) goes here."""
        raise NotImplementedError

    def queue_rows(self, rows: torch.Tensor) -> None:
        """Keep ``rows`` of a training micro-batch for a queue; :meth:`step_rows` hands them over after the optimizer
        step, so a queue takes a whole step's rows once, whatever the gradient accumulation."""
        self.pending_rows.append(rows.detach())

    def step_rows(self, gather_rows: RowGather) -> torch.Tensor | None:
        """The rows queued since the last optimizer step, of all processes (None when there are none)."""
        if not self.pending_rows:
            return None
        rows = torch.cat(self.pending_rows)
        self.pending_rows.clear()
        return gather_rows(rows)

    @torch.no_grad()
    def on_step_end(self, model: nn.Module, gather_rows: RowGather = no_row_gather) -> None:
        """After each optimizer step, with the unwrapped ``model`` and a gather of rows across processes: queue
        pushes (:meth:`step_rows`), momentum updates and the like. Nothing by default."""
