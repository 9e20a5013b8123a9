"""The IFCL loss, one small module per term (Xiao et al., arXiv:2307.10932, Section 3.3), and Eq. 4's forgetting
coefficients of the hippocampus queue.

Every term is computed in float32 (float64 for a float64 model) with autocast off, so bf16/fp16 training does not
round the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# The IFCL paper's BibTeX entry: model cards and sentence-transformers' generated cards cite it.
IFCL_CITATION = """@inproceedings{xiao2023ifcl,
  title     = {Identical and Fraternal Twins: Fine-Grained Semantic Contrastive Learning of Sentence Representations},
  author    = {Xiao, Qingfa and Li, Shuangyin and Chen, Lei},
  booktitle = {Proceedings of the 26th European Conference on Artificial Intelligence (ECAI)},
  year      = {2023},
  eprint    = {2307.10932},
  archivePrefix = {arXiv}
}"""


def float32_region(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """A region where autocast is off for ``tensor``'s device type."""
    return torch.autocast(device_type=tensor.device.type, enabled=False)


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in the loss's precision: float32 for half types, float64 left as it is."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def cosine_to_stored_rows(unit_rows: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
    """sim(rows_i, stored_j) for already normalized ``unit_rows``: the logits divided by the stored rows' norms, as
    normalizing a large queue would copy all of it every step. All-zero rows (never written) give 0."""
    norms = torch.linalg.vector_norm(stored, dim=-1).float().clamp_min(1e-12)
    return (unit_rows @ stored.to(unit_rows.dtype).T) / norms


def forgetting_coefficients(ages: torch.Tensor, forgetting_rate: float) -> torch.Tensor:
    """Eq. 4: the weight p_m = 1 − λ·⌈m/N⌉ of each hippocampus queue entry H_m, given its age ⌈m/N⌉ in optimizer
    steps (1 for the newest step's anchors, as ``ifcl.queue.entries`` gives it); 0 for an empty entry (age 0)."""
    return torch.where(ages > 0, 1.0 - forgetting_rate * ages, 0.0)


@dataclass(frozen=True)
class Matryoshka:
    """Matryoshka sizes (Kusupati et al., "Matryoshka Representation Learning", NeurIPS 2022), as sentence-transformers'
    ``MatryoshkaLoss`` trains them: a contrastive term becomes Σ_d w_d · term(h[:, :d]), the embeddings cut to their
    first d dimensions (the cosine re-normalises each cut), so that each prefix is an embedding of its own."""

    dims: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def of(cls, config) -> Matryoshka | None:
        """The sizes a model config names (``matryoshka_dims``, ``matryoshka_weights``: default all 1); None: none."""
        dims = tuple(getattr(config, "matryoshka_dims", None) or ())
        weights = tuple(getattr(config, "matryoshka_weights", None) or (1.0,) * len(dims))
        return cls(dims, weights) if dims else None


def over_sizes(matryoshka: Matryoshka | None, loss_at: Callable[[int | None], Any]) -> Any:
    """Σ_d w_d · ``loss_at(d)`` over the Matryoshka sizes, or ``loss_at(None)`` (the full size) without them; a
    ``loss_at`` that returns (loss, terms by name) is summed term by term."""
    if matryoshka is None:
        return loss_at(None)
    results = [(weight, loss_at(dim)) for dim, weight in zip(matryoshka.dims, matryoshka.weights)]
    if not isinstance(results[0][1], tuple):
        return sum(weight * loss for weight, loss in results)
    names = results[0][1][1]
    total = sum(weight * loss for weight, (loss, _) in results)
    return total, {name: sum(weight * terms[name] for weight, (_, terms) in results) for name in names}


def info_nce(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    temperature: float,
    extra_negatives: torch.Tensor | None = None,
    extra_log_weights: torch.Tensor | None = None,
    label_offset: int = 0,
    matryoshka: Matryoshka | None = None,
) -> torch.Tensor:
    """Mean InfoNCE of anchors against in-batch candidates ``positives`` (summed over ``matryoshka``'s sizes, the
    extra negatives cut alike, when given).

    Anchor i's positive is candidate ``label_offset + i``: with several processes, ``positives`` holds the
    candidates of all of them and the offset points at this process's own rows. ``extra_negatives`` [K, D] join the
    denominator, each weighted by ``exp(extra_log_weights)``: adding the log weight to the logit, then a
    cross-entropy, is the weighted sum of Eq. 6 in a numerically stable form. A log weight of −inf removes an entry.
    """
    if matryoshka is not None:
        extra = extra_negatives

        def at_size(d: int | None) -> torch.Tensor:
            cut = None if extra is None else extra[..., :d]
            return info_nce(anchors[..., :d], positives[..., :d], temperature, cut, extra_log_weights, label_offset)

        return over_sizes(matryoshka, at_size)
    with float32_region(anchors):
        unit_anchors = F.normalize(widened(anchors), dim=-1)
        logits = unit_anchors @ F.normalize(widened(positives), dim=-1).T / temperature
        if extra_negatives is not None and extra_negatives.shape[0] > 0:
            extra = cosine_to_stored_rows(unit_anchors, extra_negatives) / temperature
            if extra_log_weights is not None:
                extra = extra + widened(extra_log_weights).unsqueeze(0)
            logits = torch.cat([logits, extra], dim=1)
        labels = torch.arange(anchors.shape[0], device=anchors.device) + label_offset
        return F.cross_entropy(logits, labels)


class IdenticalTwinsLoss(nn.Module):
    """ℓ^I, Eq. 6: InfoNCE of anchors h_i against identical twins h_i⁺ (dropout twins, Eq. 1).

    Negatives: the other identical twins of the batch and the hippocampus queue entries H_m, each weighted by its
    forgetting coefficient p_m (Eq. 4):
    ℓ^I_i = −log e^{sim(h_i,h_i⁺)/τ} / (Σ_j e^{sim(h_i,h_j⁺)/τ} + Σ_m p_m e^{sim(h_i,H_m)/τ}).
    """

    def __init__(self, temperature: float = 0.05, matryoshka: Matryoshka | None = None) -> None:
        super().__init__()
        self.temperature, self.matryoshka = temperature, matryoshka

    def forward(
        self,
        anchor: torch.Tensor,
        identical: torch.Tensor,
        queue_embeddings: torch.Tensor | None = None,
        queue_log_coefficients: torch.Tensor | None = None,
        label_offset: int = 0,
    ) -> torch.Tensor:
        queue = (queue_embeddings, queue_log_coefficients)
        return info_nce(anchor, identical, self.temperature, *queue, label_offset, self.matryoshka)


class FraternalTwinsLoss(nn.Module):
    """ℓ^F, Eq. 7: in-batch InfoNCE of anchors h_i against fraternal twins h_i⁻ (embedding fusion, Eq. 2–3).

    No queue: ℓ^F is an auxiliary objective that adds the fraternal language's features.
    """

    def __init__(self, temperature: float = 0.05, matryoshka: Matryoshka | None = None) -> None:
        super().__init__()
        self.temperature, self.matryoshka = temperature, matryoshka

    def forward(self, anchor: torch.Tensor, fraternal: torch.Tensor, label_offset: int = 0) -> torch.Tensor:
        return info_nce(anchor, fraternal, self.temperature, label_offset=label_offset, matryoshka=self.matryoshka)


class TwinsLoss(nn.Module):
    """ℓ^T, the Twins loss of Eq. 8: keep the innate margin between identical and fraternal twins.

    ℓ^T_i = | e^{sim(h_i,h_i⁺)} − e^{sim(h_i,h_i⁻)} − M_i |, M_i = e^{sim(emb_i,emb_i⁺)} − e^{sim(emb_i,emb_i⁻)},
    with emb the mean-pooled embedding-layer outputs of the three views; no temperature. M is a target and carries no
    gradient (docs/paper-reading.md).
    """

    def forward(
        self,
        anchor: torch.Tensor,
        identical: torch.Tensor,
        fraternal: torch.Tensor,
        anchor_embedding_output: torch.Tensor,
        identical_embedding_output: torch.Tensor,
        fraternal_embedding_output: torch.Tensor,
    ) -> torch.Tensor:
        with float32_region(anchor):
            similarity = lambda a, b: F.cosine_similarity(widened(a), widened(b), dim=-1)  # noqa: E731
            with torch.no_grad():
                margin = (
                    similarity(anchor_embedding_output, identical_embedding_output).exp()
                    - similarity(anchor_embedding_output, fraternal_embedding_output).exp()
                )
            gap = similarity(anchor, identical).exp() - similarity(anchor, fraternal).exp()
            return (gap - margin).abs().mean()


class IFCLTerms(nn.Module):
    """Eq. 9: ℓ^I + w_F·ℓ^F + w_T·ℓ^T, each averaged over the batch, for the trainer's IFCL objective and the
    sentence-transformers ``IFCLLoss`` alike. With w_F = w_T = 0 and no queue this is unsupervised SimCSE. With
    ``matryoshka``, Eq. 9 is summed over its sizes: ℓ^I (the queue's rows cut alike) and ℓ^F at each size; ℓ^T,
    whose margin is the embedding layer's, at the full size for each, which keeps the terms' balance
    (docs/paper-reading.md)."""

    def __init__(
        self,
        temperature: float = 0.05,
        fraternal_loss_weight: float = 1.0,
        twins_loss_weight: float = 1.0,
        matryoshka: Matryoshka | None = None,
    ):
        super().__init__()
        self.matryoshka = matryoshka
        self.identical_loss = IdenticalTwinsLoss(temperature, matryoshka)
        self.fraternal_loss = FraternalTwinsLoss(temperature, matryoshka)
        self.twins_loss = TwinsLoss()
        self.fraternal_loss_weight = fraternal_loss_weight
        self.twins_loss_weight = twins_loss_weight

    def weight(self, term: str) -> float:
        """The weight of a term of Eq. 9 by its logged name (ℓ^I's is 1)."""
        weights = {"loss_fraternal": self.fraternal_loss_weight, "loss_twins": self.twins_loss_weight}
        return weights.get(term, 1.0)

    def terms(
        self,
        twins,
        queue_embeddings: torch.Tensor | None = None,
        queue_log_coefficients: torch.Tensor | None = None,
        identical_candidates: torch.Tensor | None = None,
        fraternal_candidates: torch.Tensor | None = None,
        label_offset: int = 0,
    ) -> dict[str, torch.Tensor]:
        """ℓ^I, and ℓ^F and ℓ^T when their weights are > 0, unweighted and with gradients, by their logged names
        (``loss_identical``, ``loss_fraternal``, ``loss_twins``).

        ``twins`` is the model's ``IFCLTwinsOutput``; ``queue_log_coefficients`` the log of
        :func:`forgetting_coefficients` of the queue's entries; ``identical_candidates`` / ``fraternal_candidates``
        the twins of all processes (default: this batch's), in which this process's rows start at ``label_offset``.
        """
        identical = twins.identical if identical_candidates is None else identical_candidates
        fraternal = twins.fraternal if fraternal_candidates is None else fraternal_candidates
        terms = {
            "loss_identical": self.identical_loss(
                twins.anchor, identical, queue_embeddings, queue_log_coefficients, label_offset
            )
        }
        if self.fraternal_loss_weight > 0:
            terms["loss_fraternal"] = self.fraternal_loss(twins.anchor, fraternal, label_offset)
        if self.twins_loss_weight > 0:
            twins_loss = self.twins_loss(
                twins.anchor,
                twins.identical,
                twins.fraternal,
                twins.anchor_embedding_output,
                twins.identical_embedding_output,
                twins.fraternal_embedding_output,
            )
            # ℓ^T is the same at every size: Σ_d w_d · ℓ^T keeps Eq. 9's balance with the terms summed over sizes.
            terms["loss_twins"] = over_sizes(self.matryoshka, lambda _: twins_loss)
        return terms

    def forward(
        self, twins, *args: torch.Tensor | int | None, **kwargs
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The total of Eq. 9 and each term (detached, for logging); arguments as :meth:`terms`."""
        terms = self.terms(twins, *args, **kwargs)
        total = sum(self.weight(name) * term for name, term in terms.items())
        return total, {name: term.detach() for name, term in terms.items()}
