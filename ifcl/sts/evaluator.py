"""STS evaluation as SimCSE, IFCL, ConIsI, PCL and miCSE do it: Spearman × 100 of the cosine similarity of sentence
embeddings against gold scores, one correlation over all pairs, no regressor.

The Trainer and ``evaluate_sts.py`` both go through :class:`STSEvaluator`; :func:`sts_correlations` is the maths,
which the ``evaluate`` metric (``ifcl.STS_METRIC_PATH``) calls too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr
from torch.nn import functional as F


class SentenceEncoder(Protocol):
    """What :class:`STSEvaluator` encodes with: ``IFCLModel.encode``'s signature."""

    def encode(
        self, sentences: Sequence[str], batch_size: int = ..., show_progress_bar: bool = ..., *, description: str = ...
    ) -> torch.Tensor: ...


def sts_correlations(similarities: Sequence[float], scores: Sequence[float]) -> dict[str, float]:
    """``{"spearman": ..., "pearson": ...}`` × 100 of predicted ``similarities`` against gold ``scores``, in float64.

    A constant input, or one holding a NaN, has no correlation: NaN (scipy warns with ``ConstantInputWarning``).
    """
    predicted = np.asarray(similarities, dtype=np.float64)
    gold = np.asarray(scores, dtype=np.float64)
    if len(gold) < 2:
        raise ValueError(f"STS correlations need at least 2 pairs; got {len(gold)}.")
    return {
        "spearman": float(spearmanr(predicted, gold).statistic * 100),
        "pearson": float(pearsonr(predicted, gold).statistic * 100),
    }


@dataclass
class STSEvaluation:
    """Figures of one STS set under one encoder; correlations × 100."""

    spearman: float
    pearson: float
    similarities: np.ndarray
    num_pairs: int


class STSEvaluator:
    """Spearman × 100 between cos(emb(sentence1), emb(sentence2)) and the gold scores of one STS set.

    Each distinct sentence is encoded once, ``batch_size`` at a time, under a progress bar named ``STS <name>``.
    Calling it returns ``{"spearman": ..., "pearson": ...}``, and for each of ``truncate_dims`` (Matryoshka sizes)
    the figures of the embeddings cut to their first d dimensions (``spearman_<d>``, ``pearson_<d>``), from the same
    encoding; :meth:`evaluate` also gives the cosine of every pair.
    """

    def __init__(
        self,
        sentences1: Sequence[str],
        sentences2: Sequence[str],
        scores: Sequence[float],
        name: str = "sts",
        batch_size: int = 128,
        truncate_dims: Sequence[int] = (),
    ) -> None:
        if not (len(sentences1) == len(sentences2) == len(scores)):
            raise ValueError(
                f"STS set {name!r}: {len(sentences1)} first sentences, {len(sentences2)} second sentences and "
                f"{len(scores)} scores; they must be equal in number."
            )
        if len(scores) < 2:
            raise ValueError(f"STS set {name!r} has {len(scores)} pairs; a correlation needs at least 2.")
        self.sentences1 = list(sentences1)
        self.sentences2 = list(sentences2)
        self.scores = np.asarray(scores, dtype=np.float64)
        self.name = name
        self.batch_size = batch_size
        self.truncate_dims = tuple(truncate_dims)

    @classmethod
    def from_dataset(cls, dataset, name: str = "sts", batch_size: int = 128, truncate_dims=()) -> STSEvaluator:
        """From a ``datasets.Dataset`` with columns sentence1, sentence2, score."""
        columns = (dataset["sentence1"], dataset["sentence2"], dataset["score"])
        return cls(*columns, name=name, batch_size=batch_size, truncate_dims=truncate_dims)

    def __len__(self) -> int:
        """The number of pairs (the Trainer's speed metrics count them)."""
        return len(self.scores)

    def pair_embeddings(
        self, model: SentenceEncoder, batch_size: int | None = None, show_progress_bar: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The evaluation embeddings of every pair's two sentences (float32), each distinct sentence encoded once;
        ``FloatingPointError`` naming the model, the set and the first sentence whose embedding is not finite."""
        unique = list(dict.fromkeys(self.sentences1 + self.sentences2))
        embeddings = model.encode(
            unique,
            batch_size=batch_size or self.batch_size,
            show_progress_bar=show_progress_bar,
            description=f"STS {self.name}",
        )
        broken = (~torch.isfinite(embeddings.float())).any(dim=-1)
        if broken.any():
            count, first_broken = int(broken.sum()), int(broken.nonzero()[0])
            model_name = getattr(model, "name_or_path", None) or getattr(
                getattr(model, "model", None), "name_or_path", None
            )
            raise FloatingPointError(
                f"{model_name or type(model).__name__} gives NaN or infinite embeddings for {count} of the "
                f"{len(unique)} sentences of STS set {self.name!r} (the first: {unique[first_broken]!r}): its weights "
                "hold NaN or infinities, or half precision overflowed; no correlation can be computed."
            )
        index = {sentence: i for i, sentence in enumerate(unique)}
        first = embeddings[[index[s] for s in self.sentences1]].float()
        return first, embeddings[[index[s] for s in self.sentences2]].float()

    def similarities(
        self, model: SentenceEncoder, batch_size: int | None = None, show_progress_bar: bool = True
    ) -> np.ndarray:
        """Cosine similarity of every pair under ``model``'s evaluation embeddings."""
        first, second = self.pair_embeddings(model, batch_size, show_progress_bar)
        return F.cosine_similarity(first, second, dim=-1).numpy().astype(np.float64)

    def evaluate(
        self, model: SentenceEncoder, batch_size: int | None = None, show_progress_bar: bool = True
    ) -> STSEvaluation:
        """Correlations and the cosine of every pair, of the whole embeddings."""
        predicted = self.similarities(model, batch_size, show_progress_bar)
        figures = sts_correlations(predicted, self.scores)
        return STSEvaluation(figures["spearman"], figures["pearson"], predicted, len(self))

    def __call__(
        self, model: SentenceEncoder, batch_size: int | None = None, show_progress_bar: bool = True
    ) -> dict[str, float]:
        """``{"spearman": ..., "pearson": ...}`` (and ``spearman_<d>``, ``pearson_<d>`` for each of
        :attr:`truncate_dims`), what the Trainer logs."""
        first, second = self.pair_embeddings(model, batch_size, show_progress_bar)
        figures = {}
        for d in (None, *self.truncate_dims):
            predicted = F.cosine_similarity(first[:, :d], second[:, :d], dim=-1).numpy().astype(np.float64)
            suffix = "" if d is None else f"_{d}"
            figures.update(
                {f"{name}{suffix}": value for name, value in sts_correlations(predicted, self.scores).items()}
            )
        return figures
