"""IFCL as a sentence-transformers loss: ``SentenceTransformerTrainer`` with ``IFCLLoss(model)``.

The same equations, settings and code as the trainer's IFCL objective (``modeling_ifcl.twin_views``,
``ifcl.losses.IFCLTerms``, ``ifcl.queue``), Matryoshka sizes included (``matryoshka_dims``). BEL_F, its projection and
the queue live in the loss module and are not saved, so the trained model stays a plain sentence-transformers model.
``CachedIFCLLoss`` is the same loss with a gradient cache (GradCache), for batches larger than memory.

What the losses rely on of sentence-transformers, all of it names its modules export: ``SentenceTransformer``,
``SentenceTransformerDataCollator``, ``CachedLossMixin`` and ``RandContext`` (the gradient cache: a loss writes
``calculate_loss`` and may replace ``embed_minibatch``), ``util``'s process helpers, and the ``uses_gradient_cache``
attribute that loss modifiers (``MatryoshkaLoss``, ``AdaptiveLayerLoss``) read to choose how to wrap a loss, which
the IFCL losses answer by refusing to be wrapped. Only this module needs sentence-transformers to load.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from datasets import Dataset, IterableDataset
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses import CachedLossMixin, RandContext
from sentence_transformers.sentence_transformer import SentenceTransformerDataCollator
from sentence_transformers.util import all_gather, all_gather_with_grad, get_rank, get_world_size
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

import ifcl.queue as ring
from configuration_ifcl import IFCLSettings, SharedSettings, check_setting_types
from ifcl.data import check_text_dataset, check_text_row, check_training_data_size
from ifcl.files import check_model_path, public_name
from ifcl.losses import IFCL_CITATION, IFCLTerms, Matryoshka
from ifcl.model import fit_dropout, load_fraternal, scaled_orthogonal_projection
from ifcl.tokenization import check_vocabulary, fit_tokenizer
from modeling_ifcl import (
    IFCLTwinsOutput,
    QueueBuffers,
    check_matryoshka_width,
    fraternal_word_table,
    mean_pool,
    right_padded,
    twin_views,
    word_table_of,
)

logger = logging.getLogger(__name__)


@dataclass
class LossOptions:
    """The options of the sentence-transformers losses beside IFCL's settings, checked as those are: one line
    naming the option."""

    gather_across_devices: bool = False
    mini_batch_size: int = 32
    show_progress_bar: bool = False

    def __post_init__(self) -> None:
        check_setting_types(self)
        if self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be a positive integer, got {self.mini_batch_size}.")


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
        matryoshka_dims, matryoshka_weights: Matryoshka sizes and their weights (default all 1), as
            ``run_ifcl.py --matryoshka_dims``: Eq. 9 summed over the sizes, ℓ^I (the queue's rows cut alike) and ℓ^F
            on the embeddings' first d dimensions, ℓ^T at the full size counted at each (``IFCLTerms``).
        settings: the fields of ``configuration_ifcl.IFCLSettings`` (``fusion_rate``, ``queue_size``, ...), with
            its defaults and checks.

    Inputs: the sentence and its fraternal twin (a translation), taken by name with :meth:`data_collator`. Batches
    padded on the left (decoder tokenizers) are moved to the right first, as ``IFCLModel`` does, so that fusion pairs
    each sentence's tokens from its first one. A tokenizer without a pad token (Llama's, Mistral's) pads with its
    end-of-sequence token, and with ``lasttoken`` pooling one that ends no sentence with that token gets it once at
    the end (``modeling_ifcl.fit_tokenizer``), as the trainer route does; the log says so.

    The queue takes one slot per optimizer step: the anchors of the step's batches (of all processes with
    ``gather_across_devices``), pushed after the step of an optimizer that trains the model.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        fraternal_model_name_or_path: str | None = None,
        temperature: float = SharedSettings.temperature,
        training_dropout: float = SharedSettings.training_dropout,
        gather_across_devices: bool = False,
        matryoshka_dims: list[int] | None = None,
        matryoshka_weights: list[float] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.settings = IFCLSettings(**settings)
        shared = SharedSettings(
            temperature=temperature,
            training_dropout=training_dropout,
            matryoshka_dims=[] if matryoshka_dims is None else matryoshka_dims,
            matryoshka_weights=[] if matryoshka_weights is None else matryoshka_weights,
        )
        LossOptions(gather_across_devices=gather_across_devices)
        check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
        self.model = model
        self.embedding_dimension = model.get_embedding_dimension()
        check_matryoshka_width(shared.matryoshka_dims, self.embedding_dimension)
        self.gather_across_devices = gather_across_devices
        weights = (self.settings.fraternal_loss_weight, self.settings.twins_loss_weight)
        self.terms = IFCLTerms(temperature, *weights, Matryoshka.of(shared))
        dropout = fit_dropout(self.encoder, training_dropout)
        if dropout:
            logger.warning(f"{type(self).__name__}: {dropout} (training_dropout).")
        last_token = any(getattr(module, "pooling_mode", None) == "lasttoken" for module in self.sentence_transformer)
        for change in fit_tokenizer(self.sentence_transformer.tokenizer, end_with_eos=last_token):
            logger.warning(f"{type(self).__name__}: {change} (the model saves it so).")
        words = word_table_of(self.encoder, type(self).__name__)
        check_vocabulary(self.sentence_transformer.tokenizer, words.num_embeddings, self.encoder.name_or_path)
        words.weight.requires_grad_(not self.settings.freeze_word_embeddings)
        self.fraternal_model_name_or_path = fraternal_model_name_or_path
        self.fraternal_tokenizer = self.fraternal_embeddings = self.fraternal_projection = None
        self.fraternal_pad_token_id = self.encoder.config.pad_token_id or 0
        if self.settings.uses_fraternal_twins:  # else no BEL_F at all, as in IFCLModel
            self.set_up_fraternal_table(words)
        self.to(words.weight.device)
        for parameter in self.own_parameters():
            if parameter.requires_grad:
                parameter.register_hook(averaged_over_processes)
        self.collator_made = False  # whether data_collator() made this loss's collator
        self.queue: QueueBuffers | None = None  # built at the first push: one slot holds one optimizer step's anchors
        self.step_anchors: list[torch.Tensor] = []  # the anchors of this optimizer step's batches
        push_after_optimizer_steps(self)

    @property
    def sentence_transformer(self) -> SentenceTransformer:
        """The model, out of the ``DistributedDataParallel`` wrapper that ``SentenceTransformerTrainer`` hands the
        loss in several processes (``self.model`` then)."""
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    @property
    def encoder(self) -> nn.Module:
        """The transformers model inside the SentenceTransformer's first module."""
        return self.sentence_transformer[0].auto_model

    @property
    def uses_gradient_cache(self) -> bool:
        """What a sentence-transformers loss modifier (``MatryoshkaLoss``, ``AdaptiveLayerLoss``) asks of the loss it
        wraps: an IFCL loss is not wrapped, so ``TypeError`` in one line, with the parameter that gives the sizes."""
        name, frame, owner = type(self).__name__, inspect.currentframe(), None
        while frame is not None:  # up to the modifier being built around this loss
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module) and owner is not self:
                break
            frame = frame.f_back
        modifier = type(owner).__name__ if frame is not None else "a loss modifier"
        if modifier == "MatryoshkaLoss":
            raise TypeError(
                f"{name} takes Matryoshka sizes itself and is not wrapped by MatryoshkaLoss: "
                f"{name}(model, matryoshka_dims=[...], matryoshka_weights=[...]) instead of MatryoshkaLoss(model, {name}(...), ...)."
            )
        raise TypeError(
            f"{name} is not wrapped by {modifier}: it embeds its three views (anchor, identical and fraternal twins) "
            f"itself, so {modifier} cannot hand it other embeddings; train {name} alone (Matryoshka sizes are its "
            "own setting, matryoshka_dims)."
        )

    def own_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters the loss holds beside the model's: BEL_F and its projection."""
        for part in (self.fraternal_embeddings, self.fraternal_projection):
            if part is not None:
                yield from part.parameters()

    def set_up_fraternal_table(self, words: nn.Embedding) -> None:
        """BEL_F and its projection from ``modeling_ifcl.fraternal_word_table``, as ``IFCLModel`` builds them: the
        fraternal model's word table (and its tokenizer for the fraternal column), else BEL_S itself when both tables
        are frozen, else a copy of it."""
        table, pad_token_id = words.weight, self.encoder.config.pad_token_id
        if self.fraternal_model_name_or_path is not None:
            table, self.fraternal_tokenizer = load_fraternal(self.fraternal_model_name_or_path)
            pad_token_id = self.fraternal_tokenizer.pad_token_id
        elif self.settings.freeze_word_embeddings and self.settings.freeze_fraternal_embeddings:
            return  # BEL_F is BEL_S: a copy would never differ
        self.fraternal_pad_token_id = pad_token_id or 0
        self.fraternal_embeddings, self.fraternal_projection = fraternal_word_table(
            words, table, pad_token_id=pad_token_id, frozen=self.settings.freeze_fraternal_embeddings
        )
        if self.fraternal_projection is not None:  # at BEL_S's scale from the first step, as IFCLModel's
            scaled_orthogonal_projection(self.fraternal_projection, words.weight, table)

    def data_collator(self, train_dataset: Dataset | IterableDataset, **kwargs: Any) -> IFCLDataCollator:
        """The collator for ``SentenceTransformerTrainer(data_collator=...)``, given the same ``train_dataset``,
        which it checks at once as ``IFCLTrainer`` checks its text (an empty set, a missing column, a row that is not
        a sentence, named by its index in the set) and, at the first batch, against the queue's size; a streamed
        ``IterableDataset``, which cannot be read ahead, by its columns when it names them, then row by row as each
        batch is collated. Each batch keeps only the columns ``sentence`` and ``fraternal``, taken by name (other
        columns are left out), the fraternal one tokenized by the fraternal model's tokenizer. ``kwargs``:
        ``SentenceTransformerDataCollator``'s. A stream wants ``accelerator_config={"dispatch_batches": False}``.

        The set is required: sentence-transformers hands a collator rows without their indices, and builds its card
        statistics from the set (stopping at a None) before the first batch."""
        num_rows = None
        if isinstance(train_dataset, IterableDataset):
            missing = [
                name for name in self.text_columns if name not in (train_dataset.column_names or self.text_columns)
            ]
            if missing:
                raise ValueError(
                    f"The training stream has columns {train_dataset.column_names}, but {type(self).__name__} reads "
                    f"{', '.join(self.text_columns)}: it lacks {', '.join(missing)}."
                )
        else:
            check_text_dataset(train_dataset, self.text_columns, reader=type(self).__name__)
            num_rows = len(train_dataset)
        self.collator_made = True
        preprocess = self.sentence_transformer.preprocess
        return IFCLDataCollator(preprocess_fn=preprocess, loss=self, num_rows=num_rows, **kwargs)

    @property
    def text_columns(self) -> tuple[str, ...]:
        return ("sentence", "fraternal") if self.settings.uses_fraternal_twins else ("sentence",)

    def forward(
        self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The terms of Eq. 9 by name, each times its weight: the trainer sums them (Eq. 9) and logs each."""
        return self.weighted_terms(self.embed_twins(self.checked_columns(sentence_features)))

    def weighted_terms(self, twins: IFCLTwinsOutput) -> dict[str, torch.Tensor]:
        """Eq. 9's terms of the batch's views by name, each times its weight, at the loss's Matryoshka sizes: the
        trainer route's ``IFCLTerms`` over the queue's rows and, with ``gather_across_devices``, every process's
        twins. A training batch's anchors are kept for the queue's push after the optimizer step."""
        queue_rows = queue_log_weights = None
        if self.queue is not None:
            queue_rows, queue_log_weights = ring.negatives(self.queue, self.settings.forgetting_rate)
        identical, fraternal, offset = self.candidates(twins.identical, twins.fraternal)
        terms = self.terms.terms(twins, queue_rows, queue_log_weights, identical, fraternal, offset)
        if self.model.training and self.settings.queue_size > 0:
            anchors = twins.anchor.detach().float()
            self.step_anchors.append(all_gather(anchors) if self.gather_across_devices else anchors)
        return {name: self.terms.weight(name) * term for name, term in terms.items()}

    def checked_columns(self, sentence_features: Iterable[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """The batch's columns, which must be those the loss needs; a warning, once, when they come by position."""
        columns = list(sentence_features)
        if not self.collator_made:
            warn_of_columns_by_position()
        if self.settings.uses_fraternal_twins and len(columns) < 2:
            raise ValueError(
                f"{type(self).__name__} needs two text columns, the sentence and its fraternal twin (a translation); "
                "or set fraternal_loss_weight = twins_loss_weight = 0."
            )
        return columns

    def trained_by(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` trains the model or the loss's own parameters."""
        own = {id(parameter) for parameter in self.parameters()}
        return any(id(parameter) in own for group in optimizer.param_groups for parameter in group["params"])

    @torch.no_grad()
    def push_step_anchors(self) -> None:
        """The anchors of the optimizer step just taken enter the queue, in one slot (IFCL's Section 3.2)."""
        anchors = torch.cat(self.step_anchors)
        self.step_anchors.clear()
        if self.queue is None:
            self.queue = QueueBuffers(self.settings.queue_size, *anchors.shape).to(anchors.device)
        ring.push(self.queue, anchors)

    def fraternal_word_embeddings(self, fraternal_input_ids: torch.Tensor) -> torch.Tensor:
        """BEL_F(x⁻) at BEL_S's width (BEL_S itself when the tables are shared)."""
        shared = self.fraternal_embeddings is None
        embeddings = (self.encoder.get_input_embeddings() if shared else self.fraternal_embeddings)(
            fraternal_input_ids
        )
        return embeddings if self.fraternal_projection is None else self.fraternal_projection(embeddings)

    def encode_views(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One forward pass of the model on word embeddings, through the trainer's DDP wrapper, which then
        synchronises the gradients: the sentence embeddings (the model's modules after the Transformer: pooling,
        and e.g. Normalize) and the mean-pooled embedding-layer outputs."""
        outputs = self.model({"inputs_embeds": inputs_embeds, "attention_mask": attention_mask})
        return outputs["sentence_embedding"], mean_pool(outputs["all_layer_embeddings"][0], attention_mask)

    def embed_twins(self, columns: list[dict[str, torch.Tensor]]) -> IFCLTwinsOutput:
        """The three views of the rows of ``columns`` (the sentence, then its fraternal twin): ``twin_views``."""
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
        with hidden_states_returned(self.encoder.config):
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

    def get_config_dict(self) -> dict[str, Any]:
        """The loss's settings, for the model card sentence-transformers generates (the fraternal model by a public
        name, never a path of this machine; the Matryoshka sizes when it has them)."""
        sizes = self.terms.matryoshka
        return {
            **asdict(self.settings),
            "temperature": self.terms.identical_loss.temperature,
            "gather_across_devices": self.gather_across_devices,
            "fraternal_model": public_name(self.fraternal_model_name_or_path),
            **({"matryoshka_dims": list(sizes.dims), "matryoshka_weights": list(sizes.weights)} if sizes else {}),
        }

    @property
    def citation(self) -> str:
        """The IFCL paper's BibTeX entry, which sentence-transformers' generated card cites."""
        return IFCL_CITATION


def push_after_optimizer_steps(loss: IFCLLoss) -> None:
    """After each step of an optimizer that trains ``loss``, the step's anchors enter its queue: a hook on every
    optimizer's step (torch's ``register_optimizer_step_post_hook``), which goes with the loss. An optimizer that
    skips a step (gradient accumulation between steps, a gradient scaler's overflow) pushes nothing."""
    reference = weakref.ref(loss)

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        owner = reference()
        if owner is not None and owner.step_anchors and owner.trained_by(optimizer):
            owner.push_step_anchors()

    weakref.finalize(loss, register_optimizer_step_post_hook(after_step).remove)


@functools.cache
def warn_of_columns_by_position() -> None:
    """The warning, once, that a batch's columns are taken by position."""
    logger.warning(
        "IFCLLoss: the batch comes from another data collator, so its columns are taken by position (the first the "
        "sentence, the second its fraternal twin), unchecked. Pass data_collator=loss.data_collator(train_dataset) "
        "to take and check columns by name."
    )


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


class CachedIFCLLoss(CachedLossMixin, IFCLLoss):
    """:class:`IFCLLoss` with a gradient cache, GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch
    Size under Memory Limited Setup", arXiv:2101.06983), through sentence-transformers' own ``CachedLossMixin``: a
    batch of any size trains in the memory of ``mini_batch_size`` rows, to the same loss and gradients (dropout
    aside, whose masks are drawn per mini-batch), for one more forward pass of the encoder.

    (1) Each mini-batch's views (anchors and identical twins: the sentence twice under two dropout masks; fraternal
    twins: the encoder on fused word embeddings) and their mean-pooled embedding-layer outputs (ℓ^T's margin, which
    carries no gradient) are computed without gradients, the random state recorded before. (2) Eq. 9 over the whole
    batch, by :meth:`IFCLLoss.weighted_terms` (the queue and the Matryoshka sizes included), is back-propagated to
    them. (3) In the backward pass, each mini-batch is embedded again with gradients under its recorded random state,
    so that every dropout mask, and so each identical twin, is the one of (1), and its cached gradients are
    back-propagated into the model. Returns the total of Eq. 9, as sentence-transformers' cached losses do.

    Args: those of :class:`IFCLLoss`, and ``mini_batch_size``, the rows embedded at once (memory, not the loss:
    the in-batch negatives and the queue's slot are the whole batch's), and ``show_progress_bar``. With
    ``gather_across_devices`` the whole batches of all processes are gathered, as ``CachedMultipleNegativesRankingLoss``
    gathers them, in the loss over the cached views.
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
        LossOptions(gather_across_devices, mini_batch_size, show_progress_bar)
        super().__init__(
            model, fraternal_model_name_or_path, temperature, gather_across_devices=gather_across_devices, **settings
        )
        self.mini_batch_size, self.show_progress_bar = mini_batch_size, show_progress_bar

    uses_gradient_cache = IFCLLoss.uses_gradient_cache  # refused, as IFCLLoss's (the mixin's True comes first)

    def forward(
        self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The total of Eq. 9, back-propagated through the gradient cache: the sentence and its fraternal twin go
        into the mini-batches as one column, so that each mini-batch holds a sentence and its own fraternal twin."""
        return self.forward_cached([joined(self.checked_columns(sentence_features))], labels)

    def embed_minibatch(
        self,
        sentence_feature: dict[str, torch.Tensor],
        begin: int,
        end: int,
        with_grad: bool,
        copy_random_state: bool,
        random_state: RandContext | None = None,
    ) -> tuple[torch.Tensor, RandContext | None]:
        """Rows ``begin:end``'s views and their embedding-layer outputs (:func:`cached_rows`), under
        ``random_state`` when one is given, the state first recorded when ``copy_random_state``."""
        columns = [rows_of(column, begin, end) for column in split(sentence_feature)]
        with nullcontext() if random_state is None else random_state, torch.set_grad_enabled(with_grad):
            random_state = RandContext(*columns[0].values()) if copy_random_state else None
            twins = self.embed_twins(columns)
        return cached_rows(twins), random_state

    def calculate_loss(
        self, reps: list[list[torch.Tensor]], labels: torch.Tensor | None = None, *, with_backward: bool = False
    ) -> torch.Tensor:
        """Eq. 9 over the whole batch from the mini-batches' cached rows (``reps[0]``), back-propagated to them and
        detached with ``with_backward``."""
        views = 3 if self.settings.uses_fraternal_twins else 2
        twins = twins_of(torch.cat(reps[0]), views, self.embedding_dimension)
        total = sum(self.weighted_terms(twins).values())
        if not with_backward:
            return total
        total.backward()
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


def cached_rows(twins: IFCLTwinsOutput) -> torch.Tensor:
    """A mini-batch's views and their embedding-layer outputs side by side in one row per sentence, the one tensor
    ``CachedLossMixin`` caches: [anchor, identical, (fraternal,) their outputs], in their common precision."""
    names = ("anchor", "identical", "fraternal", "anchor_embedding_output", "identical_embedding_output")
    parts = [twins[name] for name in (*names, "fraternal_embedding_output") if twins.get(name) is not None]
    dtype = functools.reduce(torch.promote_types, (part.dtype for part in parts))
    return torch.cat([part.to(dtype) for part in parts], dim=-1)


def twins_of(rows: torch.Tensor, views: int, width: int) -> IFCLTwinsOutput:
    """The views (each ``width`` wide) and embedding-layer outputs of :func:`cached_rows`' rows."""
    output_width = (rows.shape[-1] - views * width) // views
    parts = rows.split([width] * views + [output_width] * views, dim=-1)
    names = ["anchor", "identical", "fraternal"][:views]
    outputs = [name + "_embedding_output" for name in names]
    return IFCLTwinsOutput(**dict(zip(names + outputs, parts)))


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

    loss: Any = None  # the IFCLLoss this collator feeds
    num_rows: int | None = None  # the training set's size (None: a stream)
    size_checked: bool = field(default=False, init=False, repr=False)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.size_checked and self.num_rows is not None:  # the first batch: is the data larger than the queue?
            check_training_data_size(self.num_rows, len(features), self.loss.settings.queue_size)
            self.size_checked = True
        if self.num_rows is None:  # a stream, checked as it is read
            for row in features:
                check_text_row(row, self.loss.text_columns, "A row of the training stream")
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
