"""IFCL as an objective: ℓ^I + w_F·ℓ^F + w_T·ℓ^T (Xiao et al., arXiv:2307.10932, Eq. 9), with the hippocampus queue.

The loss terms are in ``ifcl/losses.py``; the fraternal word table and the queue belong to the model itself
(``IFCLModel.fraternal_embeddings``, ``IFCLModel.queue``), so this objective owns no weights.
"""

from __future__ import annotations

import torch
from torch import nn

from ifcl.losses import IFCLLoss

from .base import Gather, Objective, ObjectiveOutput, Paper, RowGather, no_gather, no_row_gather, unwrap_model


class IFCLObjective(Objective):
    """Anchors, identical twins (dropout) and fraternal twins (Eq. 1–3); ℓ^I takes the queue's weighted negatives.

    Settings are the model config's (fusion rate, queue, forgetting rate, τ, loss weights). The anchors of each
    optimizer step are pushed into the model's queue.
    """

    name = "ifcl"
    paper = Paper(
        "IFCL",
        "Identical and Fraternal Twins contrastive learning ([Xiao et al., 2023](https://arxiv.org/abs/2307.10932))",
        """@inproceedings{xiao2023ifcl,
  title     = {Identical and Fraternal Twins: Fine-Grained Semantic Contrastive Learning of Sentence Representations},
  author    = {Xiao, Qingfa and Li, Shuangyin and Chen, Lei},
  booktitle = {Proceedings of the 26th European Conference on Artificial Intelligence (ECAI)},
  year      = {2023},
  eprint    = {2307.10932},
  archivePrefix = {arXiv}
}""",
    )
    loss_terms = ("loss_identical", "loss_fraternal", "loss_twins")
    card_settings = (
        "fusion_rate",
        "freeze_word_embeddings",
        "freeze_fraternal_embeddings",
        "queue_size",
        "queue_batch_size",
        "forgetting_rate",
        "fraternal_loss_weight",
        "twins_loss_weight",
        "fraternal_model_name_or_path",
    )
    own_arguments = (
        "fusion_rate",
        "freeze_word_embeddings",
        "freeze_fraternal_embeddings",
        "queue_size",
        "forgetting_rate",
        "fraternal_loss_weight",
        "twins_loss_weight",
        "fraternal_model_name_or_path",
        "fraternal_column",
    )

    def __init__(self, model: nn.Module, settings=None) -> None:
        super().__init__(model, settings)
        self.loss = IFCLLoss.from_config(model.config)
        self.uses_fraternal_twins = model.config.uses_fraternal_twins

    def tokenize(self, batch, tokenizer, max_length: int, fraternal_tokenizer=None) -> dict[str, list]:
        features = super().tokenize(batch, tokenizer, max_length)
        if "fraternal" in batch:
            fraternal = (fraternal_tokenizer or tokenizer)(batch["fraternal"], truncation=True, max_length=max_length)
            features["fraternal_input_ids"] = fraternal["input_ids"]
            features["fraternal_attention_mask"] = fraternal["attention_mask"]
        return features

    def forward(
        self, model: nn.Module, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        unwrapped = unwrap_model(model)
        if self.uses_fraternal_twins and "fraternal_input_ids" not in inputs:
            raise ValueError(
                "The batch has no fraternal_input_ids, but fraternal_loss_weight or twins_loss_weight is > 0: "
                "give a fraternal (translation) column, or set both weights to 0."
            )
        twins = model(**inputs, return_twins=True)
        queue = unwrapped.queue
        queue_embeddings, queue_log_coefficients = queue.entries() if queue is not None else (None, None)
        identical_candidates, label_offset = gather(twins.identical)
        fraternal_candidates = gather(twins.fraternal)[0] if twins.fraternal is not None else None
        loss, components = self.loss(
            twins, queue_embeddings, queue_log_coefficients, identical_candidates, fraternal_candidates, label_offset
        )
        if queue is not None and model.training:
            self.queue_rows(twins.anchor.float())
        return ObjectiveOutput(loss, components)

    @torch.no_grad()
    def on_step_end(self, model: nn.Module, gather_rows: RowGather = no_row_gather) -> None:
        """The anchors of the step just taken, of all processes, enter the hippocampus queue (Section 3.2)."""
        rows = self.step_rows(gather_rows)
        if rows is not None:
            model.queue.push(rows)
