"""IFCL as a sentence-transformers loss: ``SentenceTransformerTrainer`` with ``IFCLLoss(model)``.

The same equations, settings and code as the trainer's IFCL objective (Xiao et al., arXiv:2307.10932, Eq. 1–9):
the three views of a batch (anchors, identical twins by dropout, fraternal twins by word-embedding fusion), then
ℓ^I + w_F·ℓ^F + w_T·ℓ^T (``ifcl.losses.IFCLLoss``), ℓ^I with the hippocampus queue's weighted negatives. What the
IFCL model keeps in itself lives here in the loss module: the fraternal word table BEL_F, its width-matching
projection and the queue. The trained model stays a plain sentence-transformers model.

    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from ifcl.sentence_transformers_loss import IFCLLoss

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    loss = IFCLLoss(model)                                    # BEL_F: a copy of the encoder's word table
    trainer = SentenceTransformerTrainer(model=model, train_dataset=pairs, loss=loss)   # columns: sentence, fraternal
    trainer.train()

With a fraternal model (``IFCLLoss(model, fraternal_model_name_or_path="dbmdz/bert-base-german-cased")``), BEL_F is
that model's word table and its tokenizer reads the fraternal column: pass ``data_collator=loss.data_collator()``.
The loss returns its three terms by name (``loss_identical``, ``loss_fraternal``, ``loss_twins``), which the trainer
logs. sentence-transformers is imported only here: the rest of the project does not need it.

Differences from ``IFCLTrainer``: the queue takes one slot per training batch of the loss, pushed when the next
batch comes (per micro-batch: with gradient accumulation the queue advances several slots per optimizer step),
in-batch negatives are this process's
own (as ``MultipleNegativesRankingLoss`` by default), and BEL_F, its projection and the queue are not saved with the
model (they are training devices, as in the published IFCL models).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
from torch import nn

from configuration_ifcl import check_ifcl_settings, check_model_path
from ifcl.losses import IFCLLoss as IFCLTerms  # the equations, shared with the trainer's objective
from modeling_ifcl import (
    HippocampusQueue,
    IFCLTwinsOutput,
    fuse_word_embeddings,
    mean_pool,
    scaled_orthogonal_projection,
)

logger = logging.getLogger(__name__)


class IFCLLoss(nn.Module):
    """IFCL, Eq. 9 (Xiao et al., 2023): ℓ^I + w_F·ℓ^F + w_T·ℓ^T over anchors, identical and fraternal twins.

    Inputs: two text columns, the sentence and its fraternal twin (a translation). Each batch is encoded as
    anchors and identical twins (the sentence twice, each with its own dropout mask, Eq. 1) and fraternal twins:
    the encoder run on ε·BEL_S(x) + (1−ε)·BEL_F(x⁻) (Eq. 3), with the sentence-transformers model's own pooling.

    Args:
        model: the SentenceTransformer to train (its first module a ``Transformer`` with a word-embedding table).
        fusion_rate: ε of Eq. 3 (the project's choice 0.5; the paper gives none).
        queue_size: k, slots of the hippocampus queue (0: no queue).
        forgetting_rate: λ of Eq. 4.
        temperature: τ of ℓ^I and ℓ^F.
        fraternal_loss_weight, twins_loss_weight: w_F and w_T of Eq. 9.
        fraternal_model_name_or_path: a model whose word table is BEL_F (its tokenizer reads the fraternal column,
            see :meth:`data_collator`); default a copy of the encoder's own table.
        freeze_word_embeddings: keep BEL_S, the encoder's word table, at its starting values (the paper's reading).
        freeze_fraternal_embeddings: keep BEL_F at its starting values (its projection, if any, still trains).
    """

    def __init__(
        self,
        model: SentenceTransformer,
        fusion_rate: float = 0.5,
        queue_size: int = 4,
        forgetting_rate: float = 0.1,
        temperature: float = 0.05,
        fraternal_loss_weight: float = 1.0,
        twins_loss_weight: float = 1.0,
        fraternal_model_name_or_path: str | None = None,
        freeze_word_embeddings: bool = True,
        freeze_fraternal_embeddings: bool = True,
    ) -> None:
        super().__init__()
        check_ifcl_settings(
            fusion_rate=fusion_rate,
            queue_size=queue_size,
            forgetting_rate=forgetting_rate,
            temperature=temperature,
            fraternal_loss_weight=fraternal_loss_weight,
            twins_loss_weight=twins_loss_weight,
        )
        self.model = model
        self.fusion_rate = fusion_rate
        self.queue_size = queue_size
        self.forgetting_rate = forgetting_rate
        self.ifcl_loss = IFCLTerms(temperature, fraternal_loss_weight, twins_loss_weight)
        encoder = self.encoder
        words = encoder.get_input_embeddings()
        if not isinstance(words, nn.Embedding):
            raise ValueError("IFCLLoss: the model's first module has no word-embedding table (get_input_embeddings).")
        words.weight.requires_grad_(not freeze_word_embeddings)
        self.fraternal_tokenizer = None
        self.fraternal_model_name_or_path = fraternal_model_name_or_path
        table, pad_token_id = words.weight.detach(), encoder.config.pad_token_id
        if fraternal_model_name_or_path is not None:
            from transformers import AutoModel, AutoTokenizer

            check_model_path("fraternal_model_name_or_path", fraternal_model_name_or_path)

            fraternal_model = AutoModel.from_pretrained(fraternal_model_name_or_path)
            table = fraternal_model.get_input_embeddings().weight.detach()
            self.fraternal_tokenizer = AutoTokenizer.from_pretrained(fraternal_model_name_or_path)
            pad_token_id = self.fraternal_tokenizer.pad_token_id
        self.fraternal_pad_token_id = pad_token_id or 0
        if fraternal_model_name_or_path is None and freeze_word_embeddings and freeze_fraternal_embeddings:
            self.fraternal_embeddings = words  # BEL_F is BEL_S itself, as in IFCLModel (IFCLConfig.shares_word_table)
        else:
            self.fraternal_embeddings = nn.Embedding.from_pretrained(
                table.clone(), freeze=freeze_fraternal_embeddings, padding_idx=pad_token_id
            )
        self.fraternal_projection = None
        if table.shape[1] != words.embedding_dim:
            self.fraternal_projection = nn.Linear(table.shape[1], words.embedding_dim)
            scaled_orthogonal_projection(self.fraternal_projection, words.weight, self.fraternal_embeddings.weight)
        self.to(words.weight.device)
        self.collated_by_name = False  # set by :meth:`data_collator`'s collator at each batch
        self.warned_about_positions = False
        self.queue: HippocampusQueue | None = None  # built at the first push: one slot holds one batch (N rows)
        self.pending_anchors: torch.Tensor | None = None  # the last training batch's anchors, pushed at the next one

    @property
    def encoder(self) -> nn.Module:
        """The transformers model inside the SentenceTransformer's first module."""
        return self.model[0].auto_model

    def data_collator(self, **kwargs: Any) -> IFCLDataCollator:
        """The collator for ``SentenceTransformerTrainer(data_collator=...)``: columns named ``sentence`` and
        ``fraternal`` are taken by name, whatever their order in the dataset, and the fraternal column is tokenized by
        the fraternal model's tokenizer (with ``fraternal_model_name_or_path``)."""
        return IFCLDataCollator(
            preprocess_fn=self.model.preprocess,
            fraternal_tokenizer=self.fraternal_tokenizer,
            max_length=self.model.max_seq_length,
            loss=self,
            **kwargs,
        )

    def fraternal_word_embeddings(self, fraternal_input_ids: torch.Tensor) -> torch.Tensor:
        """BEL_F(x⁻) at the encoder's width."""
        embeddings = self.fraternal_embeddings(fraternal_input_ids)
        return embeddings if self.fraternal_projection is None else self.fraternal_projection(embeddings)

    def pool(self, token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings by the model's own modules after the Transformer (pooling, and e.g. Normalize)."""
        features = {"token_embeddings": token_embeddings, "attention_mask": attention_mask}
        for module in list(self.model.children())[1:]:
            features = module(features)
        return features["sentence_embedding"]

    def encode_views(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(pooled sentence embeddings, mean-pooled embedding-layer outputs) of one encoder call."""
        outputs = self.encoder(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, output_hidden_states=True, return_dict=True
        )
        return self.pool(outputs.last_hidden_state, attention_mask), mean_pool(
            outputs.hidden_states[0], attention_mask
        )

    def twins(self, sentence: dict[str, torch.Tensor], fraternal: dict[str, torch.Tensor] | None) -> IFCLTwinsOutput:
        """The three views of a batch, as ``IFCLModel(..., return_twins=True)`` gives them."""
        input_ids, attention_mask = sentence["input_ids"], sentence["attention_mask"]
        batch_size = input_ids.shape[0]
        word_table = self.encoder.get_input_embeddings()
        fraternal_view = fraternal_embedding = None
        if fraternal is None:
            words = word_table(input_ids)
        else:
            padded_words, fused, _, union_mask = fuse_word_embeddings(
                word_table,
                self.fraternal_word_embeddings,
                self.fusion_rate,
                (input_ids, attention_mask, self.encoder.config.pad_token_id or 0),
                (fraternal["input_ids"], fraternal["attention_mask"], self.fraternal_pad_token_id),
            )
            # Right padding: BEL_S(x) is the first columns of its padded lookup (one lookup of the table, as in
            # IFCLModel).
            words = padded_words[:, : input_ids.shape[1]]
        # Anchors and identical twins first, then the fraternal twins: the dropout masks drawn in IFCLModel's order.
        anchors, embedding_outputs = self.encode_views(
            torch.cat([words, words]), torch.cat([attention_mask, attention_mask])
        )
        anchor, identical = anchors.split(batch_size)
        anchor_embedding, identical_embedding = embedding_outputs.split(batch_size)
        if fraternal is not None:
            fraternal_view, fraternal_embedding = self.encode_views(fused, union_mask)
        return IFCLTwinsOutput(
            anchor=anchor,
            identical=identical,
            fraternal=fraternal_view,
            anchor_embedding_output=anchor_embedding,
            identical_embedding_output=identical_embedding,
            fraternal_embedding_output=fraternal_embedding,
        )

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor | None = None):
        """The terms of Eq. 9 by name, each times its weight: the trainer sums them (Eq. 9) and logs each."""
        columns = list(sentence_features)
        if self.training and not self.collated_by_name and not self.warned_about_positions:
            self.warned_about_positions = True
            logger.warning(
                "IFCLLoss: the batch comes from another data collator, so its columns are taken by position (the "
                "first the sentence, the second its fraternal twin). Pass data_collator=loss.data_collator() to "
                "take columns named 'sentence' and 'fraternal' by name."
            )
        uses_fraternal = self.ifcl_loss.fraternal_loss_weight > 0 or self.ifcl_loss.twins_loss_weight > 0
        if uses_fraternal and len(columns) < 2:
            raise ValueError(
                "IFCLLoss needs two text columns, the sentence and its fraternal twin (a translation); "
                "or set fraternal_loss_weight = twins_loss_weight = 0."
            )
        if self.training and self.pending_anchors is not None:
            # The previous batch's anchors enter now, after its backward and optimizer step, as in IFCLTrainer
            # (its backward still needed the queue as it was).
            self.push(self.pending_anchors)
            self.pending_anchors = None
        twins = self.twins(columns[0], columns[1] if uses_fraternal else None)
        queue_embeddings = queue_log_coefficients = None
        if self.queue is not None:
            queue_embeddings, queue_log_coefficients = self.queue.entries()
        terms = self.ifcl_loss.terms(twins, queue_embeddings, queue_log_coefficients)
        if self.training and self.queue_size > 0:
            self.pending_anchors = twins.anchor.detach().float()
        return {name: self.ifcl_loss.weight(name) * term for name, term in terms.items()}

    @torch.no_grad()
    def push(self, anchors: torch.Tensor) -> None:
        """A batch's anchors enter the hippocampus queue (one slot per batch; the queue is built at the first)."""
        if self.queue is None:
            self.queue = HippocampusQueue(self.queue_size, anchors.shape[0], anchors.shape[1], self.forgetting_rate)
            self.queue.to(anchors.device)
        self.queue.push(anchors.float())

    def get_config_dict(self) -> dict[str, Any]:
        """The loss's settings, which sentence-transformers writes into the model card it generates (the fraternal
        model by its Hub id, or a local folder by its card's Hub id or base name: never a path of this machine)."""
        from ifcl.model_card import public_name

        terms = self.ifcl_loss
        return {
            "fusion_rate": self.fusion_rate,
            "queue_size": self.queue_size,
            "forgetting_rate": self.forgetting_rate,
            "temperature": terms.identical_loss.temperature,
            "fraternal_loss_weight": terms.fraternal_loss_weight,
            "twins_loss_weight": terms.twins_loss_weight,
            "fraternal_model": public_name(self.fraternal_model_name_or_path),
        }

    @property
    def citation(self) -> str:
        """The IFCL paper's BibTeX entry, which sentence-transformers' generated card cites."""
        from ifcl.objectives import objective_class

        return objective_class("ifcl").paper.citation


@dataclass
class IFCLDataCollator(SentenceTransformerDataCollator):
    """sentence-transformers' collator, with the fraternal column tokenized by the fraternal model's tokenizer."""

    fraternal_tokenizer: Any = None
    fraternal_column: str = "fraternal"
    sentence_column: str = "sentence"
    max_length: int | None = None
    loss: Any = None  # the IFCLLoss this collator feeds (told that its columns come by name)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        named = [name for name in (self.sentence_column, self.fraternal_column) if name in features[0]]
        if named:  # the named columns first, in the loss's order: sentence_features follow the batch's keys
            features = [{**{name: row[name] for name in named}, **row} for row in features]
        if self.loss is not None:
            self.loss.collated_by_name = True
        batch = super().__call__(features)
        if self.fraternal_tokenizer is not None and self.fraternal_column in features[0]:
            for key in [k for k in batch if k.startswith(f"{self.fraternal_column}_")]:
                del batch[key]
            encoded = self.fraternal_tokenizer(
                [row[self.fraternal_column] for row in features],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            batch[f"{self.fraternal_column}_input_ids"] = encoded["input_ids"]
            batch[f"{self.fraternal_column}_attention_mask"] = encoded["attention_mask"]
        return batch
