"""Unsupervised SimCSE (Gao et al., "SimCSE: Simple Contrastive Learning of Sentence Embeddings", EMNLP 2021).

The positive of a sentence is the same sentence encoded again with another dropout mask; the other sentences of the
batch (of all processes) are the negatives:
ℓ_i = −log e^{sim(h_i,h_i⁺)/τ} / Σ_j e^{sim(h_i,h_j⁺)/τ}   (SimCSE, Eq. 1).
SimCSE's own recipe pools with an MLP over [CLS] in training only: ``--pooler_type cls --eval_pooler_type
cls_before_pooler``.
"""

from __future__ import annotations

import torch
from torch import nn

from ifcl.losses import Matryoshka, info_nce

from .base import Embeddings, Gather, Objective, ObjectiveOutput, Paper, no_gather


class SimCSEObjective(Objective):
    """Dropout twins with in-batch negatives; τ is the model config's ``contrastive_temperature``."""

    name = "simcse"
    paper = Paper(
        "SimCSE",
        "unsupervised SimCSE ([Gao et al., 2021](https://arxiv.org/abs/2104.08821))",
        """@inproceedings{gao2021simcse,
  title     = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author    = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of EMNLP},
  year      = {2021}
}""",
    )
    loss_terms = ("loss_contrastive",)
    token_groups_at_own_length = ("",)

    def __init__(self, model: nn.Module, settings=None) -> None:
        super().__init__(model, settings)
        self.temperature, self.matryoshka = model.config.contrastive_temperature, Matryoshka.of(model.config)

    def embed(self, model: nn.Module, inputs: dict[str, torch.Tensor], replay: bool = False) -> Embeddings:
        """The anchors and their dropout twins."""
        inputs = {k: v for k, v in inputs.items() if not k.startswith("fraternal_")}
        twins = model(**inputs, return_twins=True)
        return {"anchor": twins.anchor, "identical": twins.identical}

    def loss_from(
        self, model: nn.Module, embeddings: Embeddings, inputs: dict[str, torch.Tensor], gather: Gather = no_gather
    ) -> ObjectiveOutput:
        positives, offset = gather(embeddings["identical"])
        anchors = embeddings["anchor"]
        loss = info_nce(anchors, positives, self.temperature, label_offset=offset, matryoshka=self.matryoshka)
        return ObjectiveOutput(loss, {"loss_contrastive": loss.detach()})
