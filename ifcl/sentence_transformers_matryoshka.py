"""The one place where IFCL's sentence-transformers losses rely on how sentence-transformers' ``MatryoshkaLoss`` works
inside, for want of a public hook.

IFCL keeps ℓ^T at the full size, counted at each size (as the trainer route does, docs/paper-reading.md), and its
hippocampus queue takes full-size anchors once per step; MatryoshkaLoss tells the loss it wraps neither its sizes
nor which of its calls starts a step, and cuts every embedding. What this module relies on holds for
sentence-transformers 6.0.0, 6.0.1, 6.1.0 and 6.2.0, whose MatryoshkaLoss was read against it (6.0 and 6.1 also cut
``token_embeddings``, which the losses do not read); ``tests/test_sentence_transformers_loss.py`` checks it on the
installed version (``test_the_matryoshka_adapter_holds_for_sentence_transformers_6``):

1. Around a loss without gradient cache, MatryoshkaLoss sets the model's forward to its ``ForwardDecorator`` for
   the step, calls the loss once per size it draws, the largest first, with the decorator's ``dim`` set to it; the
   model runs in the first call, and the decorator hands the same output dicts back in the others, their
   ``sentence_embedding`` cut to the size and normalised (its ``shrink``, which :func:`cut` is).
   :func:`matryoshka_size` reads the size; :func:`full_size_kept` keeps each output's full-size embedding beside the
   cut one and notes whether the model ran.
2. Around a gradient-cache loss (``CachedLossMixin``), it replaces the loss's ``calculate_loss`` by its
   ``CachedLossDecorator``, which holds the sizes, weights and ``n_dims_per_step``: :func:`matryoshka_sizes` reads
   them, and :func:`over_drawn_sizes` wraps a loss of one size in the same decorator, so that MatryoshkaLoss's own code
   draws the sizes, cuts the embeddings, weights each size and back-propagates through the cuts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from sentence_transformers.sentence_transformer.losses.matryoshka import CachedLossDecorator, ForwardDecorator, shrink
from torch import nn

from configuration_ifcl import SharedSettings
from ifcl.losses import Matryoshka

# The key under which a model output keeps its full-size sentence embedding while MatryoshkaLoss cuts the other one.
FULL_SIZE_EMBEDDING = "ifcl_full_size_embedding"


def matryoshka_size(model: nn.Module) -> int | None:
    """The size a MatryoshkaLoss around the loss computes it at in this call: its ``ForwardDecorator``'s ``dim`` (the
    decorator is on the model's forward for the step); None outside MatryoshkaLoss."""
    forward = model.forward
    return forward.dim if isinstance(forward, ForwardDecorator) else None


@dataclass
class ModelRuns:
    """Whether the model ran while :func:`full_size_kept` was on; False when MatryoshkaLoss handed back the outputs
    of the step's first size."""

    ran: bool = False


@contextmanager
def full_size_kept(sentence_transformer: nn.Module, runs: ModelRuns) -> Iterator[None]:
    """While inside, each output of ``sentence_transformer`` keeps its sentence embedding under
    :data:`FULL_SIZE_EMBEDDING` too, which MatryoshkaLoss does not cut (a hook on the model's last module, so inside
    the forward pass that MatryoshkaLoss wraps), and ``runs.ran`` is set when the model runs."""

    def keep(module: nn.Module, args: tuple, output: dict[str, torch.Tensor]) -> None:
        output[FULL_SIZE_EMBEDDING] = output["sentence_embedding"]
        runs.ran = True

    handle = list(sentence_transformer.children())[-1].register_forward_hook(keep)
    try:
        yield
    finally:
        handle.remove()


def cut(embeddings: torch.Tensor, size: int) -> torch.Tensor:
    """``embeddings`` cut to ``size`` as MatryoshkaLoss cuts them: their first ``size`` dimensions, normalised."""
    return shrink(embeddings, size)


def check_sizes(dims: list, weights: list | None = None) -> None:
    """The checks ``run_ifcl.py --matryoshka_dims`` makes (``SharedSettings``), for sizes and weights a
    MatryoshkaLoss around an IFCL loss holds, which MatryoshkaLoss itself does not make (a size of 64.5, a size
    twice, a negative weight): ``TypeError`` or ``ValueError`` in one line, in the same words."""
    try:
        SharedSettings(matryoshka_dims=list(dims), matryoshka_weights=list(weights or []))
    except (TypeError, ValueError) as error:
        raise type(error)(f"MatryoshkaLoss around an IFCL loss: {error}") from None


def matryoshka_sizes(decorator: object) -> tuple[Matryoshka, int]:
    """The sizes and weights, and ``n_dims_per_step``, of the ``CachedLossDecorator`` that MatryoshkaLoss puts in
    place of a gradient-cache loss's ``calculate_loss``, checked (:func:`check_sizes`)."""
    if not isinstance(decorator, CachedLossDecorator):
        raise TypeError(f"Only a MatryoshkaLoss sets the calculate_loss of an IFCL loss, not {decorator!r}.")
    check_sizes(decorator.matryoshka_dims, decorator.matryoshka_weights)
    sizes = Matryoshka(tuple(decorator.matryoshka_dims), tuple(decorator.matryoshka_weights))
    return sizes, decorator.n_dims_per_step


def over_drawn_sizes(
    loss_at_size: Callable[..., torch.Tensor], sizes: Matryoshka, n_dims_per_step: int
) -> Callable[..., torch.Tensor]:
    """``loss_at_size(reps, *args, **kwargs)``, a loss of embeddings cut to one size, in MatryoshkaLoss's own
    ``CachedLossDecorator``: each call draws ``n_dims_per_step`` of the sizes (all with -1), cuts the embeddings to
    each, calls ``loss_at_size`` at each (which back-propagates to the cut embeddings when asked) and returns the
    weighted sum, the gradients carried back through the cuts."""
    return CachedLossDecorator(loss_at_size, sizes.dims, sizes.weights, n_dims_per_step)
