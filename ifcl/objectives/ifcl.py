"""IFCL as an objective: ℓ^I + w_F·ℓ^F + w_T·ℓ^T (Xiao et al., arXiv:2307.10932, Eq. 9), with the hippocampus queue.

The loss terms are in ``ifcl/losses.py``; the fraternal word table and the queue belong to the model itself
(``IFCLModel.fraternal_embeddings``, ``IFCLModel.queue``), which this objective asks for. Its settings are
``configuration_ifcl.IFCLSettings``, held by the model's config.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

import ifcl.queue as ring
from configuration_ifcl import IFCLSettings
from ifcl.losses import IFCL_CITATION, IFCLTerms, Matryoshka
from modeling_ifcl import IFCLTwinsOutput

from .base import (
    Embeddings,
    Gather,
    Objective,
    ObjectiveOutput,
    Paper,
    RowGather,
    no_gather,
    no_row_gather,
    pad_features,
    tokenizer_fingerprint,
    unwrap_model,
)


class IFCLObjective(Objective):
    """Anchors, identical twins (dropout) and fraternal twins (Eq. 1–3); ℓ^I takes the queue's weighted negatives.

    The anchors of each optimizer step, of all processes, are pushed into the model's queue, which holds one slot
    of N = the global batch per step.
    """

    name = "ifcl"
    paper = Paper(
        "IFCL",
        "Identical and Fraternal Twins contrastive learning ([Xiao et al., 2023](https://arxiv.org/abs/2307.10932))",
        IFCL_CITATION,
    )
    loss_terms = ("loss_identical", "loss_fraternal", "loss_twins")
    settings_class = IFCLSettings
    card_settings = (*IFCLSettings.__dataclass_fields__, "queue_batch_size", "fraternal_model_name_or_path")
    own_arguments = ("fraternal_model_name_or_path", "fraternal_column")
    token_groups_at_own_length = ("", "fraternal_")

    @classmethod
    def stored_settings(cls, config) -> IFCLSettings:
        """IFCL's settings are the config's own fields, not ``objective_settings``."""
        return IFCLSettings(**{name: getattr(config, name) for name in IFCLSettings.__dataclass_fields__})

    def __init__(self, model: nn.Module, settings: IFCLSettings | None = None) -> None:
        config = model.config
        super().__init__(model, settings if settings is not None else self.stored_settings(config))
        weights = (self.settings.fraternal_loss_weight, self.settings.twins_loss_weight)
        self.terms = IFCLTerms(config.contrastive_temperature, *weights, Matryoshka.of(config))
        self.fraternal_pad_token_id = config.fraternal_pad_token_id or 0
        # A fraternal model's own tokenizer reads the fraternal text; without one, the encoder's does.
        self.fraternal_tokenizer = model.fraternal_tokenizer if config.fraternal_model_name_or_path else None

    @property
    def text_columns(self) -> tuple[str, ...]:
        return ("sentence", "fraternal") if self.settings.uses_fraternal_twins else ("sentence",)

    def tokenize(self, batch: dict[str, list[str]], tokenizer, max_length: int) -> dict[str, list]:
        features = super().tokenize(batch, tokenizer, max_length)
        if "fraternal" in batch:
            fraternal = (self.fraternal_tokenizer or tokenizer)(
                batch["fraternal"], truncation=True, max_length=max_length
            )
            features["fraternal_input_ids"] = fraternal["input_ids"]
            features["fraternal_attention_mask"] = fraternal["attention_mask"]
        return features

    def feature_key(self) -> Any:
        """The features depend on the text columns and the fraternal model's tokenizer alone, not on the loss's
        settings (queue, forgetting rate, fusion rate, loss weights, frozen tables)."""
        fraternal = tokenizer_fingerprint(self.fraternal_tokenizer) if self.fraternal_tokenizer is not None else None
        return [self.text_columns, fraternal]

    def collate(self, features: list[dict[str, Any]], tokenizer) -> dict[str, torch.Tensor]:
        return pad_features(features, {"": tokenizer.pad_token_id or 0, "fraternal_": self.fraternal_pad_token_id})

    @classmethod
    def run_settings(cls, settings: IFCLSettings, lora: bool = False) -> dict[str, Any]:
        """IFCL trains with its own settings, the model config's own fields (none under ``objective_settings``),
        its word tables frozen or trained as they say, with LoRA too."""
        return {**asdict(settings), "objective": cls.name, "objective_settings": {}}

    def embed(self, model: nn.Module, inputs: dict[str, torch.Tensor], replay: bool = False) -> Embeddings:
        """The three views and their mean-pooled embedding-layer outputs (ℓ^T's margin), by ``IFCLTwinsOutput``'s
        field names."""
        if self.settings.uses_fraternal_twins and "fraternal_input_ids" not in inputs:
            raise ValueError(
                "The batch has no fraternal_input_ids, but fraternal_loss_weight or twins_loss_weight is > 0: "
                "give a fraternal (translation) column, or set both weights to 0."
            )
        twins = model(**inputs, return_twins=True)
        return {name: rows for name, rows in twins.items() if rows is not None}

    def loss_from(
        self, model: nn.Module, embeddings: Embeddings, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        twins = IFCLTwinsOutput(**embeddings)
        queue = unwrap_model(model).queue
        queue_rows = queue_log_weights = None
        if queue is not None:
            queue_rows, queue_log_weights = ring.negatives(queue, self.settings.forgetting_rate)
        identical_candidates, label_offset = gather(twins.identical)
        fraternal_candidates = gather(twins.fraternal)[0] if twins.fraternal is not None else None
        loss, components = self.terms(
            twins, queue_rows, queue_log_weights, identical_candidates, fraternal_candidates, label_offset
        )
        if queue is not None and model.training:
            self.queue_rows(twins.anchor.float())
        return ObjectiveOutput(loss, components)

    @torch.no_grad()
    def on_step_end(self, model: nn.Module, gather_rows: RowGather = no_row_gather) -> None:
        """The anchors of the step just taken, of all processes, enter the hippocampus queue (Section 3.2)."""
        rows = self.step_rows(gather_rows)
        if rows is not None:
            ring.push(model.queue, rows)
