"""IFCL as a sentence-transformers loss: ``SentenceTransformerTrainer`` with ``IFCLLoss(model)``.

The same equations, settings and code as the trainer's IFCL objective (``modeling_ifcl.twin_views``,
``ifcl.losses.IFCLTerms``, ``ifcl.queue``). BEL_F, its projection and the queue live in the loss module and are not
saved, so the trained model stays a plain sentence-transformers model. Unlike ``IFCLTrainer``, the queue takes one
slot per batch. In several processes (DDP, as ``torchrun`` or ``accelerate launch`` start them) the in-batch
negatives and the queue are each process's own, as in sentence-transformers' ``MultipleNegativesRankingLoss``;
``gather_across_devices=True`` gathers them from all processes, as ``IFCLTrainer`` does. ``CachedIFCLLoss`` is the
same loss with a gradient cache (GradCache), for batches larger than memory. Only this module and
``ifcl.sentence_transformers_matryoshka`` (what the losses rely on of ``MatryoshkaLoss``) need sentence-transformers to
load.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from datasets import Dataset
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses import CachedLossMixin, RandContext
from sentence_transformers.sentence_transformer import SentenceTransformerDataCollator
from sentence_transformers.util import all_gather, all_gather_with_grad, get_rank, get_world_size
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from configuration_ifcl import IFCLConfig, IFCLSettings, SharedSettings
from ifcl import queue as ring
from ifcl.data import check_text_dataset, check_training_data_size
from ifcl.losses import IFCL_CITATION, IFCLTerms, Matryoshka
from ifcl.sentence_transformers_matryoshka import (
    FULL_SIZE_EMBEDDING,
    ModelRuns,
    check_sizes,
    cut,
    full_size_kept,
    matryoshka_size,
    matryoshka_sizes,
    over_drawn_sizes,
)
from modeling_ifcl import (
    IFCLTwinsOutput,
    QueueBuffers,
    check_model_path,
    fit_dropout,
    fit_tokenizer,
    fraternal_word_table,
    load_fraternal,
    mean_pool,
    right_padded,
    twin_views,
    word_table_of,
)

logger = logging.getLogger(__name__)


class IFCLLoss(nn.Module):
    """IFCL, Eq. 9 (Xiao et al., 2023, arXiv:2307.10932): ℓ^I + w_F·ℓ^F + w_T·ℓ^T over anchors, identical twins
    (the sentence again under another dropout mask, Eq. 1) and fraternal twins (the encoder run on
    ε·BEL_S(x) + (1−ε)·BEL_F(x⁻), Eq. 3), pooled by the model's own modules; ℓ^I takes the hippocampus queue's
    past anchors as negatives, weighted by their forgetting coefficients (Eq. 4).

    Args:
        model: the SentenceTransformer to train (its first module a ``Transformer`` with a word-embedding table).
        fraternal_model_name_or_path: a model whose word table is BEL_F and whose tokenizer reads the fraternal
            column (through :meth:`data_collator`); default the encoder's own table.
        temperature: τ of ℓ^I and ℓ^F (``SharedSettings``' default).
        training_dropout: the dropout an encoder whose every dropout is 0 (decoder-based ones) trains with, so that
            identical twins differ from their anchors (``SharedSettings``' default, 0.1; 0: none, said in the log).
        gather_across_devices: in several processes, gather the identical and fraternal twins of all processes,
            with their gradients, as the candidates of ℓ^I and ℓ^F, and push all processes' anchors into every
            process's queue, so that P processes of batch N train as one process of batch P·N (``IFCLTrainer``'s
            way); by default each process keeps its own, as sentence-transformers' losses do.
        settings: the fields of ``configuration_ifcl.IFCLSettings`` (``fusion_rate``, ``queue_size``, ...), with
            its defaults and checks.

    Inputs: the sentence and its fraternal twin (a translation), taken by name with :meth:`data_collator`. Batches
    padded on the left (decoder tokenizers) are moved to the right first, as ``IFCLModel`` does, so that fusion pairs
    each sentence's tokens from its first one. A tokenizer without a pad token (Llama's, Mistral's) pads with its
    end-of-sequence token, and with ``lasttoken`` pooling one that ends no sentence with that token gets it once at
    the end (``modeling_ifcl.fit_tokenizer``), as the trainer route does; the log says so.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        fraternal_model_name_or_path: str | None = None,
        temperature: float = SharedSettings.temperature,
        training_dropout: float = SharedSettings.training_dropout,
        gather_across_devices: bool = False,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.settings = IFCLSettings(**settings)
        SharedSettings(temperature=temperature, training_dropout=training_dropout)  # their checks
        check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
        self.model = model
        self.gather_across_devices = gather_across_devices
        self.terms = IFCLTerms(temperature, self.settings.fraternal_loss_weight, self.settings.twins_loss_weight)
        # ℓ^I and ℓ^F, the terms that take each Matryoshka size; ℓ^T is self.terms' at the full size.
        self.terms_at_each_size = IFCLTerms(temperature, self.settings.fraternal_loss_weight, twins_loss_weight=0.0)
        dropout = fit_dropout(self.encoder, training_dropout)
        if dropout:
            logger.warning(f"IFCLLoss: {dropout} (training_dropout).")
        last_token = any(getattr(module, "pooling_mode", None) == "lasttoken" for module in self.sentence_transformer)
        for change in fit_tokenizer(self.sentence_transformer.tokenizer, end_with_eos=last_token):
            logger.warning(f"IFCLLoss: {change} (the model saves it so).")
        words = word_table_of(self.encoder, "IFCLLoss")
        words.weight.requires_grad_(not self.settings.freeze_word_embeddings)
        self.fraternal_model_name_or_path = fraternal_model_name_or_path
        self.fraternal_tokenizer = self.fraternal_embeddings = self.fraternal_projection = None
        if self.settings.uses_fraternal_twins:  # else no BEL_F at all, as in IFCLModel
            self.set_up_fraternal_table(words)
        self.to(words.weight.device)
        for parameter in self.own_parameters():
            if parameter.requires_grad:
                parameter.register_hook(averaged_over_processes)
        self.collated_by_name = False  # set by data_collator()'s collator at each batch
        self.warned_about_positions = False
        self.queue: QueueBuffers | None = None  # built at the first push: one slot holds one batch (N rows)
        self.pending_anchors: torch.Tensor | None = None  # the last training batch's anchors, pushed at the next one
        self.sizes_of_step: list[int] = []  # inside MatryoshkaLoss: the sizes this step was computed at so far

    @property
    def sentence_transformer(self) -> SentenceTransformer:
        """The model, out of the ``DistributedDataParallel`` wrapper that ``SentenceTransformerTrainer`` hands the
        loss in several processes (``self.model`` then)."""
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    @property
    def encoder(self) -> nn.Module:
        """The transformers model inside the SentenceTransformer's first module."""
        return self.sentence_transformer[0].auto_model

    def own_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters the loss holds beside the model's: BEL_F and its projection."""
        for part in (self.fraternal_embeddings, self.fraternal_projection):
            if part is not None:
                yield from part.parameters()

    def set_up_fraternal_table(self, words: nn.Embedding) -> None:
        """BEL_F and its projection from ``modeling_ifcl.fraternal_word_table``, as ``IFCLModel`` builds them: the
        fraternal model's word table (and its tokenizer for the fraternal column), else BEL_S itself when both tables
        are frozen, else a copy of it."""
        table, pad_token_id = None, self.encoder.config.pad_token_id
        if self.fraternal_model_name_or_path is not None:
            table, self.fraternal_tokenizer = load_fraternal(self.fraternal_model_name_or_path)
            pad_token_id = self.fraternal_tokenizer.pad_token_id
        self.fraternal_pad_token_id = pad_token_id or 0
        config = IFCLConfig(
            **asdict(self.settings),
            fraternal_model_name_or_path=self.fraternal_model_name_or_path,
            fraternal_pad_token_id=pad_token_id,
        )
        self.fraternal_embeddings, self.fraternal_projection = fraternal_word_table(words, config, table)

    def data_collator(self, train_dataset: Dataset, **kwargs: Any) -> IFCLDataCollator:
        """The collator for ``SentenceTransformerTrainer(data_collator=...)``, given the same ``train_dataset``,
        which it checks at once as ``IFCLTrainer`` checks its text (an empty set, a missing column, a row that is not
        a sentence, named by its index in the set) and, at the first batch, against the queue's size. Each batch
        keeps only the columns ``sentence`` and ``fraternal``, taken by name (other columns are left out), the
        fraternal one tokenized by the fraternal model's tokenizer. ``kwargs``: ``SentenceTransformerDataCollator``'s.

        The set is required: sentence-transformers hands a collator rows without their indices, and builds its card
        statistics from the set (stopping at a None) before the first batch."""
        check_text_dataset(train_dataset, self.text_columns, reader="IFCLLoss")
        preprocess = self.sentence_transformer.preprocess
        return IFCLDataCollator(preprocess_fn=preprocess, loss=self, num_rows=len(train_dataset), **kwargs)

    @property
    def text_columns(self) -> tuple[str, ...]:
        return ("sentence", "fraternal") if self.settings.uses_fraternal_twins else ("sentence",)

    def fraternal_word_embeddings(self, fraternal_input_ids: torch.Tensor) -> torch.Tensor:
        """BEL_F(x⁻) at BEL_S's width (BEL_S itself when the tables are shared)."""
        shared = self.fraternal_embeddings is None
        embeddings = (self.encoder.get_input_embeddings() if shared else self.fraternal_embeddings)(
            fraternal_input_ids
        )
        return embeddings if self.fraternal_projection is None else self.fraternal_projection(embeddings)

    def encode_views(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One forward pass of the model on word embeddings, through the trainer's DDP wrapper, which then
        synchronises the gradients: the full-size sentence embeddings (the model's modules after the Transformer:
        pooling, and e.g. Normalize) and the mean-pooled embedding-layer outputs."""
        outputs = self.model({"inputs_embeds": inputs_embeds, "attention_mask": attention_mask})
        return outputs[FULL_SIZE_EMBEDDING], mean_pool(outputs["all_layer_embeddings"][0], attention_mask)

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None):
        """The terms of Eq. 9 by name, each times its weight: the trainer sums them (Eq. 9) and logs each.

        Inside sentence-transformers' ``MatryoshkaLoss``, which calls it once per size, the model runs in the first
        call and MatryoshkaLoss hands its outputs back for the others (``ifcl.sentence_transformers_matryoshka``):
        ℓ^I (the queue's rows cut alike) and ℓ^F of the views cut to the size of the call as MatryoshkaLoss cuts
        them, ℓ^T at the full size in every call (so weighted by the sum of the sizes' weights, as in the trainer
        route); the queue takes one push per step; the weighted sum is returned, as ``MatryoshkaLoss`` adds tensors.
        """
        size = matryoshka_size(self.model)
        if size is not None:
            check_sizes([size])  # MatryoshkaLoss takes 64.5 or "64" as it comes
        twins, queue_rows, queue_log_weights = self.views(list(sentence_features))
        if size is not None:  # MatryoshkaLoss's sizes of the step: its weights it keeps to itself
            if size in self.sizes_of_step:
                check_sizes([*self.sizes_of_step, size])  # names the size given twice
            self.sizes_of_step.append(size)
        at_size = twins if size is None else cut_to(twins, size)
        terms = {**self.terms_at_size(at_size, queue_rows, queue_log_weights), **self.twins_term(twins)}
        return terms if size is None else sum(terms.values())

    def terms_at_size(
        self, twins: IFCLTwinsOutput, queue_rows: torch.Tensor | None, queue_log_weights: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """ℓ^I and w_F·ℓ^F by name, of the views of ``twins`` whole or cut to a Matryoshka size (the queue's rows
        cut alike)."""
        identical, fraternal, offset = self.candidates(twins.identical, twins.fraternal)
        rows = None if queue_rows is None else queue_rows[..., : twins.anchor.shape[-1]]
        terms = self.terms_at_each_size.terms(twins, rows, queue_log_weights, identical, fraternal, offset)
        return {name: self.terms.weight(name) * term for name, term in terms.items()}

    def twins_term(self, twins: IFCLTwinsOutput) -> dict[str, torch.Tensor]:
        """w_T·ℓ^T by name, of the full-size views (nothing when w_T = 0, as ``IFCLTerms.terms``)."""
        if self.terms.twins_loss_weight == 0:
            return {}
        views = (twins.anchor, twins.identical, twins.fraternal)
        outputs = (twins.anchor_embedding_output, twins.identical_embedding_output, twins.fraternal_embedding_output)
        return {"loss_twins": self.terms.weight("loss_twins") * self.terms.twins_loss(*views, *outputs)}

    def views(
        self, columns: list[dict[str, torch.Tensor]]
    ) -> tuple[IFCLTwinsOutput, torch.Tensor | None, torch.Tensor | None]:
        """The batch's three views at the full size, and the queue's rows with their log weights. Once per step,
        where the model ran (inside MatryoshkaLoss: at its first size), the queue first takes the previous training
        batch's anchors, and this batch's are kept for the next."""
        self.check_columns(columns)
        runs = ModelRuns()
        twins = self.embed_twins(columns, runs)
        if runs.ran:
            self.sizes_of_step = []
            self.push_pending_anchors()
        queue_rows, queue_log_weights = self.queue_negatives()
        if runs.ran:
            self.keep_anchors(twins.anchor)
        return twins, queue_rows, queue_log_weights

    def check_columns(self, columns: list[dict[str, torch.Tensor]]) -> None:
        """The batch has the columns the loss needs; a warning, once, when they come by position."""
        if self.training and not self.collated_by_name and not self.warned_about_positions:
            self.warned_about_positions = True
            logger.warning(
                "IFCLLoss: the batch comes from another data collator, so its columns are taken by position (the "
                "first the sentence, the second its fraternal twin), unchecked. Pass "
                "data_collator=loss.data_collator(train_dataset) to take and check columns by name."
            )
        if self.settings.uses_fraternal_twins and len(columns) < 2:
            raise ValueError(
                "IFCLLoss needs two text columns, the sentence and its fraternal twin (a translation); "
                "or set fraternal_loss_weight = twins_loss_weight = 0."
            )

    def push_pending_anchors(self) -> None:
        """The previous training batch's anchors enter the queue, after its backward pass and optimizer step, as in
        IFCLTrainer."""
        if self.training and self.pending_anchors is not None:
            anchors, self.pending_anchors = self.pending_anchors, None
            if self.queue is None:
                self.queue = QueueBuffers(self.settings.queue_size, *anchors.shape).to(anchors.device)
            ring.push(self.queue, anchors)

    def embed_twins(self, columns: list[dict[str, torch.Tensor]], runs: ModelRuns | None = None) -> IFCLTwinsOutput:
        """The three views of the rows of ``columns`` (the sentence, then its fraternal twin) at the full size:
        ``twin_views``; ``runs`` notes whether the model ran."""
        mask, input_ids = right_padded(columns[0]["attention_mask"], columns[0]["input_ids"])
        fraternal = None
        if self.settings.uses_fraternal_twins:
            fraternal_mask, fraternal_ids = right_padded(columns[1]["attention_mask"], columns[1]["input_ids"])
            fraternal = (
                self.fraternal_word_embeddings,
                self.settings.fusion_rate,
                fraternal_ids,
                fraternal_mask,
                self.fraternal_pad_token_id,
            )
        tokens = (input_ids, mask, self.encoder.config.pad_token_id or 0)
        runs = ModelRuns() if runs is None else runs
        with hidden_states_returned(self.encoder.config), full_size_kept(self.sentence_transformer, runs):
            return twin_views(self.encode_views, self.encoder.get_input_embeddings(), tokens, fraternal)

    def candidates(
        self, identical: torch.Tensor, fraternal: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """The candidates of ℓ^I and ℓ^F, and where this process's rows start among them: with
        ``gather_across_devices``, the twins of all processes in rank order, gathered with their gradients, so that
        each process's loss sends gradient back to every process's rows; else this process's own."""
        if not self.gather_across_devices:
            return identical, fraternal, 0
        gathered = [None if view is None else all_gather_with_grad(view) for view in (identical, fraternal)]
        return gathered[0], gathered[1], get_rank() * identical.shape[0]

    def queue_negatives(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The queue's rows and their log weights (None, None before the first push)."""
        if self.queue is None:
            return None, None
        return ring.negatives(self.queue, self.settings.forgetting_rate)

    def keep_anchors(self, anchors: torch.Tensor) -> None:
        """Keep a training batch's anchors, to push at the next batch: with ``gather_across_devices``, those of all
        processes in rank order, so that every process's queue is the same."""
        if self.training and self.settings.queue_size > 0:
            anchors = anchors.detach().float()
            self.pending_anchors = all_gather(anchors) if self.gather_across_devices else anchors

    def get_config_dict(self) -> dict[str, Any]:
        """The loss's settings, for the model card sentence-transformers generates (the fraternal model by a public
        name, never a path of this machine)."""
        from ifcl.publishing import public_name

        return {
            **asdict(self.settings),
            "temperature": self.terms.identical_loss.temperature,
            "gather_across_devices": self.gather_across_devices,
            "fraternal_model": public_name(self.fraternal_model_name_or_path),
        }

    @property
    def citation(self) -> str:
        """The IFCL paper's BibTeX entry, which sentence-transformers' generated card cites."""
        return IFCL_CITATION


def cut_to(twins: IFCLTwinsOutput, size: int) -> IFCLTwinsOutput:
    """The three views of ``twins`` cut to a Matryoshka size as MatryoshkaLoss cuts embeddings."""
    views = {"anchor": twins.anchor, "identical": twins.identical, "fraternal": twins.fraternal}
    return IFCLTwinsOutput(**{name: None if view is None else cut(view, size) for name, view in views.items()})


def averaged_over_processes(gradient: torch.Tensor) -> torch.Tensor:
    """A gradient of the loss's own parameters averaged over the training processes, as DDP averages the model's
    (which it wraps; the loss's it does not), so that every process keeps the same BEL_F and projection."""
    world_size = get_world_size()
    if world_size == 1:
        return gradient
    total = gradient.clone()
    dist.all_reduce(total)
    return total / world_size


@contextmanager
def hidden_states_returned(config) -> Iterator[None]:
    """While inside, the encoder returns its hidden states, which sentence-transformers' ``Transformer`` module
    passes on as ``all_layer_embeddings`` (the switch its own ``AdaptiveLayerLoss`` turns)."""
    before, config.output_hidden_states = config.output_hidden_states, True
    try:
        yield
    finally:
        config.output_hidden_states = before


FRATERNAL_PREFIX = "fraternal_"  # the fraternal column's keys inside the one column a CachedIFCLLoss caches


@dataclass
class CachedStep:
    """What a :class:`CachedIFCLLoss` forward pass hands ``CachedLossMixin`` as the labels, which the mixin passes on
    to the loss over the cached views: the queue's rows and log weights, and, written there, the weight of each size
    the loss was computed at and the weighted terms by name."""

    queue_rows: torch.Tensor | None
    queue_log_weights: torch.Tensor | None
    size_weights: list[float] = field(default_factory=list)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


class CachedIFCLLoss(CachedLossMixin, IFCLLoss):
    """:class:`IFCLLoss` with a gradient cache, GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch
    Size under Memory Limited Setup", arXiv:2101.06983), through sentence-transformers' own ``CachedLossMixin``: a
    batch of any size trains in the memory of ``mini_batch_size`` rows, to the same loss and gradients (dropout
    aside, whose masks are drawn per mini-batch), for one more forward pass of the encoder.

    (1) Each mini-batch's views (anchors and identical twins: the sentence twice under two dropout masks; fraternal
    twins: the encoder on fused word embeddings) are computed without gradients, the random state recorded before
    (``RandContext``), with their mean-pooled embedding-layer outputs (ℓ^T's margin, which carries no gradient).
    (2) Eq. 9 is computed over the whole batch, the queue's rows included (one push per step, as ``IFCLLoss``), and
    back-propagated to the views only. (3) In the backward pass, each mini-batch is embedded again with gradients
    under its recorded random state, so that every dropout mask, and so each identical twin, is the one of (1), and
    its cached gradients are back-propagated into the model.

    Args: those of :class:`IFCLLoss`, and ``mini_batch_size``, the rows embedded at once (memory, not the loss:
    the in-batch negatives and the queue's slot are the whole batch's), and ``show_progress_bar``. With
    ``gather_across_devices`` the whole batches of all processes are gathered, as ``CachedMultipleNegativesRankingLoss``
    gathers them, in the loss over the cached views.

    Inside sentence-transformers' ``MatryoshkaLoss`` the loss takes its sizes, weights and ``n_dims_per_step``
    (``ifcl.sentence_transformers_matryoshka``): ℓ^I (the queue's rows cut alike) and ℓ^F at each size it draws, by
    MatryoshkaLoss's own code, and ℓ^T at the full size for each, the same loss as :class:`IFCLLoss` inside
    ``MatryoshkaLoss``.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        fraternal_model_name_or_path: str | None = None,
        temperature: float = SharedSettings.temperature,
        mini_batch_size: int = 32,
        show_progress_bar: bool = False,
        gather_across_devices: bool = False,
        **settings: Any,
    ) -> None:
        if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int) or mini_batch_size < 1:
            raise ValueError(f"CachedIFCLLoss: mini_batch_size must be a positive integer, not {mini_batch_size!r}.")
        super().__init__(
            model, fraternal_model_name_or_path, temperature, gather_across_devices=gather_across_devices, **settings
        )
        self.mini_batch_size, self.show_progress_bar = mini_batch_size, show_progress_bar
        self.matryoshka: Matryoshka | None = None  # the sizes of a MatryoshkaLoss around this loss
        self.n_dims_per_step = -1

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None):
        """The terms of Eq. 9 by name, each times its weight, as :meth:`IFCLLoss.forward`; their sum back-propagates
        through the gradient cache."""
        columns = list(sentence_features)
        self.check_columns(columns)
        self.push_pending_anchors()
        step = CachedStep(*self.queue_negatives())
        loss = self.forward_cached([joined(columns)], step)  # detached, its hook running step (3)
        terms = step.terms
        first = next(iter(terms))
        terms[first] = terms[first] + (loss - loss.detach())  # the trainer sums the terms: one path to the hook
        return terms

    def embed_minibatch(
        self,
        sentence_feature: dict[str, torch.Tensor],
        begin: int,
        end: int,
        with_grad: bool,
        copy_random_state: bool,
        random_state: RandContext | None = None,
    ) -> tuple[torch.Tensor, RandContext | None]:
        """Rows ``begin:end``'s views and their embedding-layer outputs, :func:`packed`, under ``random_state`` when
        one is given, the state first recorded when ``copy_random_state``."""
        columns = [rows_of(column, begin, end) for column in split(sentence_feature)]
        with nullcontext() if random_state is None else random_state, torch.set_grad_enabled(with_grad):
            random_state = RandContext(*columns[0].values()) if copy_random_state else None
            twins = self.embed_twins(columns)
        return packed(twins), random_state

    @property
    def calculate_loss(self) -> Callable[..., torch.Tensor]:
        """``CachedLossMixin``'s loss over the cached views: :meth:`loss_of_views`."""
        return self.loss_of_views

    @calculate_loss.setter
    def calculate_loss(self, decorator: Any) -> None:
        """What ``MatryoshkaLoss`` sets: the loss takes its sizes, weights and ``n_dims_per_step``
        (``ifcl.sentence_transformers_matryoshka.matryoshka_sizes``)."""
        if self.matryoshka is not None:
            raise ValueError("CachedIFCLLoss is inside a MatryoshkaLoss already; one MatryoshkaLoss per loss.")
        self.matryoshka, self.n_dims_per_step = matryoshka_sizes(decorator)

    def loss_of_views(
        self, reps: list[list[torch.Tensor]], step: CachedStep, *, with_backward: bool = False
    ) -> torch.Tensor:
        """Eq. 9 over the whole batch from the mini-batches' packed views (``reps[0]``), back-propagated to them
        with ``with_backward``: ℓ^I and ℓ^F by :meth:`loss_at_size`, at each Matryoshka size drawn, ℓ^T at the full
        size, weighted by the sum of their weights. The weighted terms go into ``step``, the anchors to the queue's
        next push."""
        twins = unpacked(torch.cat(reps[0]))
        self.keep_anchors(twins.anchor)
        views = [[packed_views(rows) for rows in reps[0]]]
        at_sizes = self.loss_at_size
        if self.matryoshka is not None:
            at_sizes = over_drawn_sizes(self.loss_at_size, self.matryoshka, self.n_dims_per_step)
        total = at_sizes(views, step, with_backward=with_backward)
        for name, term in self.twins_term(twins).items():
            weighted = sum(step.size_weights) * term
            if with_backward:
                weighted.backward()
            step.terms[name] = weighted.detach()
            total = total + weighted.detach()
        return total

    def loss_at_size(
        self, reps: list[list[torch.Tensor]], step: CachedStep, *, with_backward: bool = False
    ) -> torch.Tensor:
        """ℓ^I and w_F·ℓ^F of the views in ``reps`` (rows × views × size: cut to one of MatryoshkaLoss's sizes, or
        whole; the queue's rows cut alike), back-propagated to them with ``with_backward``; the size's weight and its
        weighted terms go into ``step``."""
        views = torch.cat(reps[0])
        size = views.shape[-1]
        weight = 1.0 if self.matryoshka is None else dict(zip(self.matryoshka.dims, self.matryoshka.weights))[size]
        fraternal = views[:, 2] if views.shape[1] > 2 else None
        twins = IFCLTwinsOutput(anchor=views[:, 0], identical=views[:, 1], fraternal=fraternal)
        weighted = self.terms_at_size(twins, step.queue_rows, step.queue_log_weights)
        total = sum(weighted.values())
        if with_backward:
            total.backward()
        step.size_weights.append(weight)
        for name, term in weighted.items():
            step.terms[name] = step.terms.get(name, 0.0) + weight * term.detach()
        return total.detach()

    def get_config_dict(self) -> dict[str, Any]:
        """:meth:`IFCLLoss.get_config_dict` and ``mini_batch_size``."""
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}

    @property
    def citation(self) -> str:
        """The IFCL paper's and GradCache's BibTeX entries."""
        return super().citation + GRADCACHE_CITATION


def joined(columns: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The sentence column and the fraternal one (its keys prefixed) as one, for ``CachedLossMixin``, so that each
    mini-batch holds a sentence and its own fraternal twin: :func:`split` parts them again."""
    column = dict(columns[0])
    if len(columns) > 1:
        column.update({FRATERNAL_PREFIX + key: value for key, value in columns[1].items()})
    return column


def split(column: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The columns that :func:`joined` made one: the sentence, then the fraternal twin when there is one."""
    sentence = {key: value for key, value in column.items() if not key.startswith(FRATERNAL_PREFIX)}
    fraternal = {key.removeprefix(FRATERNAL_PREFIX): value for key, value in column.items() if key not in sentence}
    return [sentence, fraternal] if fraternal else [sentence]


def rows_of(column: dict[str, Any], begin: int, end: int) -> dict[str, Any]:
    """Rows ``begin:end`` of a tokenized column (its tensors; other entries, such as the modality, as they are), less
    the padding columns at the end that they all share, so that a mini-batch of short sentences is embedded at its
    own length."""
    mask = column["attention_mask"][begin:end]
    used = mask.bool().any(dim=0).nonzero()
    length = int(used.max()) + 1 if len(used) else mask.shape[1]

    def rows(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return value[begin:end, :length] if value.shape[1:2] == mask.shape[1:2] else value[begin:end]

    return {key: rows(value) for key, value in column.items()}


def packed(twins: IFCLTwinsOutput) -> torch.Tensor:
    """A mini-batch's views and their embedding-layer outputs as the one tensor ``CachedLossMixin`` caches,
    [rows, 2 × views, width]: the views, then their outputs, zero-padded to one width, which keeps their cosines, all
    that the loss takes of them. :func:`unpacked` reverses it."""
    parts = [
        part
        for part in (twins.anchor, twins.identical, twins.fraternal)
        + (twins.anchor_embedding_output, twins.identical_embedding_output, twins.fraternal_embedding_output)
        if part is not None
    ]
    width = max(part.shape[-1] for part in parts)
    dtype = functools.reduce(torch.promote_types, (part.dtype for part in parts))
    return torch.stack([F.pad(part.to(dtype), (0, width - part.shape[-1])) for part in parts], dim=1)


def packed_views(reps: torch.Tensor) -> torch.Tensor:
    """The views of a :func:`packed` tensor, [rows, views, width]."""
    return reps[:, : reps.shape[1] // 2]


def unpacked(reps: torch.Tensor) -> IFCLTwinsOutput:
    """The views and embedding-layer outputs of a :func:`packed` tensor."""
    views, outputs = packed_views(reps), reps[:, reps.shape[1] // 2 :]
    fraternal = views.shape[1] > 2
    return IFCLTwinsOutput(
        anchor=views[:, 0],
        identical=views[:, 1],
        fraternal=views[:, 2] if fraternal else None,
        anchor_embedding_output=outputs[:, 0],
        identical_embedding_output=outputs[:, 1],
        fraternal_embedding_output=outputs[:, 2] if fraternal else None,
    )


GRADCACHE_CITATION = """
@misc{gao2021scaling,
    title={Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup},
    author={Luyu Gao and Yunyi Zhang and Jiawei Han and Jamie Callan},
    year={2021},
    eprint={2101.06983},
    archivePrefix={arXiv},
    primaryClass={cs.LG}
}
"""


@dataclass
class IFCLDataCollator(SentenceTransformerDataCollator):
    """The collator of :meth:`IFCLLoss.data_collator`."""

    loss: Any = None  # the IFCLLoss this collator feeds (told that its columns come by name)
    num_rows: int = 0  # the training set's size
    size_checked: bool = field(default=False, init=False, repr=False)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.size_checked:  # the first batch: is the data larger than the queue?
            check_training_data_size(self.num_rows, len(features), self.loss.settings.queue_size)
            self.size_checked = True
        self.loss.collated_by_name = True
        # Only the loss's columns, in its order (sentence_features follow the batch's keys), and the dataset's name
        # that sentence-transformers adds for its prompts and routes.
        kept = (*self.loss.text_columns, "dataset_name")
        features = [{name: row[name] for name in kept if name in row} for row in features]
        if self.loss.fraternal_tokenizer is None or "fraternal" not in kept:
            return super().__call__(features)
        # The fraternal twins are read by the fraternal model's tokenizer alone; an empty placeholder keeps the
        # column's place (second) in the batch, and its tensors are replaced there.
        fraternal = [row["fraternal"] for row in features]
        batch = super().__call__([{**row, "fraternal": ""} for row in features])
        encoded = self.loss.fraternal_tokenizer(
            fraternal,
            padding=True,
            truncation=True,
            max_length=self.loss.sentence_transformer.max_seq_length,
            return_tensors="pt",
        )
        batch["fraternal_input_ids"] = encoded["input_ids"]
        batch["fraternal_attention_mask"] = encoded["attention_mask"]
        batch.pop("fraternal_token_type_ids", None)  # the placeholder's, from the encoder's tokenizer
        return batch
