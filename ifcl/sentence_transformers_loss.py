"""IFCL as a sentence-transformers loss: ``SentenceTransformerTrainer`` with ``IFCLLoss(model)``.

The same equations, settings and code as the trainer's IFCL objective (``modeling_ifcl.twin_views``,
``ifcl.losses.IFCLTerms``, ``ifcl.queue``). BEL_F, its projection and the queue live in the loss module and are not
saved, so the trained model stays a plain sentence-transformers model. Unlike ``IFCLTrainer``, the queue takes one
slot per batch, and the in-batch negatives are this process's own. ``CachedIFCLLoss`` is the same loss with a
gradient cache (GradCache), for batches larger than memory. Only this module imports sentence-transformers.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import asdict, astuple, dataclass, field
from typing import Any

import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses import CachedLossMixin, RandContext
from sentence_transformers.base.losses.gradcache import _create_minibatch
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
from sentence_transformers.sentence_transformer.losses.matryoshka import CachedLossDecorator, ForwardDecorator
from torch import nn

from configuration_ifcl import IFCLConfig, IFCLSettings, SharedSettings
from ifcl import queue as ring
from ifcl.data import check_text_dataset, check_training_data_size
from ifcl.losses import IFCL_CITATION, IFCLTerms, Matryoshka
from modeling_ifcl import (
    IFCLTwinsOutput,
    QueueBuffers,
    check_model_path,
    fit_dropout,
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
        settings: the fields of ``configuration_ifcl.IFCLSettings`` (``fusion_rate``, ``queue_size``, ...), with
            its defaults and checks.

    Inputs: the sentence and its fraternal twin (a translation), taken by name with :meth:`data_collator`. Batches
    padded on the left (decoder tokenizers) are moved to the right first, as ``IFCLModel`` does, so that fusion pairs
    each sentence's tokens from its first one.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        fraternal_model_name_or_path: str | None = None,
        temperature: float = SharedSettings.temperature,
        training_dropout: float = SharedSettings.training_dropout,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.settings = IFCLSettings(**settings)
        SharedSettings(temperature=temperature, training_dropout=training_dropout)  # their checks
        check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)
        self.model = model
        self.terms = IFCLTerms(temperature, self.settings.fraternal_loss_weight, self.settings.twins_loss_weight)
        dropout = fit_dropout(self.encoder, training_dropout)
        if dropout:
            logger.warning(f"IFCLLoss: {dropout} (training_dropout).")
        words = word_table_of(self.encoder, "IFCLLoss")
        words.weight.requires_grad_(not self.settings.freeze_word_embeddings)
        self.fraternal_model_name_or_path = fraternal_model_name_or_path
        self.fraternal_tokenizer = self.fraternal_embeddings = self.fraternal_projection = None
        if self.settings.uses_fraternal_twins:  # else no BEL_F at all, as in IFCLModel
            self.set_up_fraternal_table(words)
        self.to(words.weight.device)
        self.collated_by_name = False  # set by data_collator()'s collator at each batch
        self.warned_about_positions = False
        self.queue: QueueBuffers | None = None  # built at the first push: one slot holds one batch (N rows)
        self.pending_anchors: torch.Tensor | None = None  # the last training batch's anchors, pushed at the next one
        self.views_of_step: tuple | None = None  # inside MatryoshkaLoss: its decorator and the step's views

    @property
    def encoder(self) -> nn.Module:
        """The transformers model inside the SentenceTransformer's first module."""
        return self.model[0].auto_model

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
        return IFCLDataCollator(preprocess_fn=self.model.preprocess, loss=self, num_rows=len(train_dataset), **kwargs)

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
        """One encoder call: the model's own sentence embeddings (its modules after the Transformer: pooling, and
        e.g. Normalize) and the mean-pooled embedding-layer outputs."""
        outputs = self.encoder(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True, return_dict=True
        )
        features = {"token_embeddings": outputs.last_hidden_state, "attention_mask": attention_mask}
        for module in list(self.model.children())[1:]:
            features = module(features)
        return features["sentence_embedding"], mean_pool(outputs.hidden_states[0], attention_mask)

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None):
        """The terms of Eq. 9 by name, each times its weight: the trainer sums them (Eq. 9) and logs each.

        Inside sentence-transformers' ``MatryoshkaLoss`` (which calls it once per size, the largest first, with its
        ``ForwardDecorator`` on the model), the views are computed once, at the first call, and cut to each size: ℓ^I
        (the queue's rows cut alike) and ℓ^F at each size, ℓ^T at the full size in every call (so weighted by the sum
        of the sizes' weights, as in the trainer route); the queue takes one push per step; the weighted sum is
        returned, as ``MatryoshkaLoss`` adds tensors.
        """
        decorator = self.model.forward if isinstance(self.model.forward, ForwardDecorator) else None
        if decorator is not None and self.views_of_step is not None and self.views_of_step[0] is decorator:
            twins, queue_rows, queue_log_weights = self.views_of_step[1]
        else:
            twins, queue_rows, queue_log_weights = self.views(list(sentence_features))
            self.views_of_step = (decorator, (twins, queue_rows, queue_log_weights)) if decorator else None
        size = getattr(decorator, "dim", None)
        at_size = self.terms if size is None else self.terms.at_sizes(Matryoshka((size,), (1.0,)))
        terms = at_size.terms(twins, queue_rows, queue_log_weights)
        weighted = {name: self.terms.weight(name) * term for name, term in terms.items()}
        return weighted if decorator is None else sum(weighted.values())

    def views(self, columns: list[dict[str, torch.Tensor]]) -> tuple[IFCLTwinsOutput, torch.Tensor | None, Any]:
        """The batch's three views (the queue first takes the previous batch's anchors) and the queue's rows with
        their log weights."""
        self.start_step(columns)
        twins = self.embed_twins(columns)
        queue_rows, queue_log_weights = self.queue_negatives()
        self.keep_anchors(twins.anchor)
        return twins, queue_rows, queue_log_weights

    def start_step(self, columns: list[dict[str, torch.Tensor]]) -> None:
        """Check the batch's columns, and push the previous training batch's anchors into the queue."""
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
        if self.training and self.pending_anchors is not None:
            # The previous batch's anchors enter now, after its backward and optimizer step, as in IFCLTrainer.
            anchors, self.pending_anchors = self.pending_anchors, None
            if self.queue is None:
                self.queue = QueueBuffers(self.settings.queue_size, *anchors.shape).to(anchors.device)
            ring.push(self.queue, anchors)

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
        return twin_views(self.encode_views, self.encoder.get_input_embeddings(), tokens, fraternal)

    def queue_negatives(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The queue's rows and their log weights (None, None before the first push)."""
        if self.queue is None:
            return None, None
        return ring.negatives(self.queue, self.settings.forgetting_rate)

    def keep_anchors(self, anchors: torch.Tensor) -> None:
        """Keep a training batch's anchors, to push at the next batch."""
        if self.training and self.settings.queue_size > 0:
            self.pending_anchors = anchors.detach().float()

    def get_config_dict(self) -> dict[str, Any]:
        """The loss's settings, for the model card sentence-transformers generates (the fraternal model by a public
        name, never a path of this machine)."""
        from ifcl.publishing import public_name

        return {
            **asdict(self.settings),
            "temperature": self.terms.identical_loss.temperature,
            "fraternal_model": public_name(self.fraternal_model_name_or_path),
        }

    @property
    def citation(self) -> str:
        """The IFCL paper's BibTeX entry, which sentence-transformers' generated card cites."""
        return IFCL_CITATION


FRATERNAL_PREFIX = "fraternal_"  # the fraternal column's keys inside the one column a CachedIFCLLoss caches


class CachedIFCLLoss(CachedLossMixin, IFCLLoss):
    """:class:`IFCLLoss` with a gradient cache, GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch
    Size under Memory Limited Setup", arXiv:2101.06983), through sentence-transformers' own ``CachedLossMixin``: a
    batch of any size trains in the memory of ``mini_batch_size`` rows, to the same loss and gradients (dropout
    aside, whose masks are drawn per mini-batch), for one more forward pass of the encoder.

    (1) Each mini-batch's views (anchors and identical twins: the sentence twice under two dropout masks; fraternal
    twins: the encoder on fused word embeddings) are computed without gradients, the random state recorded before
    (``RandContext``), and the mean-pooled embedding-layer outputs kept (ℓ^T's margin, which carries no gradient).
    (2) Eq. 9 is computed over the whole batch, the queue's rows included (one push per step, as ``IFCLLoss``), and
    back-propagated to the views only. (3) In the backward pass, each mini-batch is embedded again with gradients
    under its recorded random state, so that every dropout mask, and so each identical twin, is the one of (1), and
    its cached gradients are back-propagated into the model.

    Args: those of :class:`IFCLLoss`, and ``mini_batch_size``, the rows embedded at once (memory, not the loss:
    the in-batch negatives and the queue's slot are the whole batch's), and ``show_progress_bar``.

    Inside sentence-transformers' ``MatryoshkaLoss``, whose ``CachedLossDecorator`` would cut every view, ℓ^T's
    included, the loss takes the decorator's sizes, weights and ``n_dims_per_step`` instead and sums over them itself:
    ℓ^I (the queue's rows cut alike) and ℓ^F at each size, ℓ^T at the full size for each, the same loss as
    :class:`IFCLLoss` inside ``MatryoshkaLoss``.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        fraternal_model_name_or_path: str | None = None,
        temperature: float = SharedSettings.temperature,
        mini_batch_size: int = 32,
        show_progress_bar: bool = False,
        **settings: Any,
    ) -> None:
        if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int) or mini_batch_size < 1:
            raise ValueError(f"CachedIFCLLoss: mini_batch_size must be a positive integer, not {mini_batch_size!r}.")
        super().__init__(model, fraternal_model_name_or_path, temperature, **settings)
        self.mini_batch_size, self.show_progress_bar = mini_batch_size, show_progress_bar
        self.matryoshka: Matryoshka | None = None  # the sizes of a MatryoshkaLoss around this loss
        self.n_dims_per_step = -1
        self.step_state: dict[str, Any] | None = None  # one forward pass's queue rows and embedding-layer outputs

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None):
        """The terms of Eq. 9 by name, each times its weight, as :meth:`IFCLLoss.forward`; their sum back-propagates
        through the gradient cache."""
        columns = list(sentence_features)
        self.start_step(columns)
        # One column for CachedLossMixin, so that each mini-batch holds a sentence and its own fraternal twin.
        merged = dict(columns[0])
        if self.settings.uses_fraternal_twins:
            merged.update({FRATERNAL_PREFIX + key: value for key, value in columns[1].items()})
        self.step_state = {"queue": self.queue_negatives(), "embedding_outputs": []}
        try:
            loss = self.forward_cached([merged], labels)  # detached, its hook running step (3)
            terms = self.step_state["terms"]
        finally:
            self.step_state = None
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
        """Rows ``begin:end``'s views stacked, [rows, 2 or 3, dim] (anchor, identical, fraternal), under
        ``random_state`` when one is given, the state first recorded when ``copy_random_state``; without gradients,
        their embedding-layer outputs are kept for :meth:`calculate_loss`."""
        sentence = {key: value for key, value in sentence_feature.items() if not key.startswith(FRATERNAL_PREFIX)}
        fraternal = {
            key[len(FRATERNAL_PREFIX) :]: value
            for key, value in sentence_feature.items()
            if key.startswith(FRATERNAL_PREFIX)
        }
        # CachedLossMixin's slicing: the rows, less the padding columns they all share.
        columns = [_create_minibatch(column, begin, end) for column in (sentence, fraternal) if column]
        with nullcontext() if random_state is None else random_state, nullcontext() if with_grad else torch.no_grad():
            random_state = RandContext(*columns[0].values()) if copy_random_state else None
            twins = self.embed_twins(columns)
        if not with_grad:
            self.step_state["embedding_outputs"].append(
                (twins.anchor_embedding_output, twins.identical_embedding_output, twins.fraternal_embedding_output)
            )
        views = [twins.anchor, twins.identical] + ([] if twins.fraternal is None else [twins.fraternal])
        return torch.stack(views, dim=1), random_state

    def loss_of_views(
        self, reps: list[list[torch.Tensor]], labels: torch.Tensor | None = None, *, with_backward: bool = False
    ) -> torch.Tensor:
        """``CachedLossMixin.calculate_loss``: Eq. 9 over the whole batch from the mini-batches' views (``reps[0]``),
        back-propagated to them with ``with_backward``; the weighted terms are kept for :meth:`forward`, the
        anchors for the queue's next push."""
        views = torch.cat(reps[0])
        outputs = [
            None if parts[0] is None else torch.cat(parts) for parts in zip(*self.step_state["embedding_outputs"])
        ]
        twins = IFCLTwinsOutput(
            anchor=views[:, 0],
            identical=views[:, 1],
            fraternal=views[:, 2] if views.shape[1] > 2 else None,
            anchor_embedding_output=outputs[0],
            identical_embedding_output=outputs[1],
            fraternal_embedding_output=outputs[2],
        )
        self.keep_anchors(twins.anchor)
        terms = self.terms
        if self.matryoshka is not None:
            (dims, weights), sizes = astuple(self.matryoshka), range(len(self.matryoshka.dims))
            if 0 < self.n_dims_per_step < len(sizes):  # as MatryoshkaLoss samples them
                sizes = sorted(random.sample(sizes, self.n_dims_per_step))
            terms = terms.at_sizes(Matryoshka(tuple(dims[i] for i in sizes), tuple(weights[i] for i in sizes)))
        weighted = {
            name: self.terms.weight(name) * term
            for name, term in terms.terms(twins, *self.step_state["queue"]).items()
        }
        total = sum(weighted.values())
        if with_backward:
            total.backward()
        self.step_state["terms"] = {name: term.detach() for name, term in weighted.items()}
        return total.detach()

    @property
    def calculate_loss(self):
        """``CachedLossMixin``'s loss over the cached views: :meth:`loss_of_views`."""
        return self.loss_of_views

    @calculate_loss.setter
    def calculate_loss(self, decorator: CachedLossDecorator) -> None:
        """What ``MatryoshkaLoss`` sets: its sizes, weights and ``n_dims_per_step`` are taken, the decorator not."""
        if not isinstance(decorator, CachedLossDecorator):
            raise TypeError(f"CachedIFCLLoss.calculate_loss takes a MatryoshkaLoss's sizes only, not {decorator!r}.")
        if self.matryoshka is not None:
            raise ValueError("CachedIFCLLoss is inside a MatryoshkaLoss already; one MatryoshkaLoss per loss.")
        self.matryoshka = Matryoshka(tuple(decorator.matryoshka_dims), tuple(decorator.matryoshka_weights))
        self.n_dims_per_step = decorator.n_dims_per_step

    def get_config_dict(self) -> dict[str, Any]:
        """:meth:`IFCLLoss.get_config_dict` and ``mini_batch_size``."""
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}

    @property
    def citation(self) -> str:
        """The IFCL paper's and GradCache's BibTeX entries."""
        return super().citation + GRADCACHE_CITATION


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
            fraternal, padding=True, truncation=True, max_length=self.loss.model.max_seq_length, return_tensors="pt"
        )
        batch["fraternal_input_ids"] = encoded["input_ids"]
        batch["fraternal_attention_mask"] = encoded["attention_mask"]
        batch.pop("fraternal_token_type_ids", None)  # the placeholder's, from the encoder's tokenizer
        return batch
