"""Training curves of a run as a PNG: the loss terms and the STS dev Spearman against the optimizer step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def plot_training_curves(
    log_history: list[dict[str, Any]],
    path: str,
    loss_terms: Sequence[str],
    sts_metric: str = "eval_stsb_spearman",
) -> list[str]:
    """Draw ``log_history`` (``trainer.state.log_history``) into ``path``; returns the curves drawn on the left.

    Left: the total ``loss`` and each of ``loss_terms`` (the objective's own, ``Objective.loss_terms``) that was
    logged. Right: ``sts_metric`` at each evaluation, the best one marked.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axes, sts_axes) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = []
    for term in ("loss", *loss_terms):
        points = [(entry["step"], entry[term]) for entry in log_history if term in entry and "step" in entry]
        if points:
            steps, values = zip(*points)
            loss_axes.plot(steps, values, label=term, linewidth=2 if term == "loss" else 1)
            drawn.append(term)
    loss_axes.set(xlabel="optimizer step", ylabel="loss", title="Training loss terms")
    loss_axes.set_yscale("symlog", linthresh=1e-3)
    loss_axes.legend()
    loss_axes.grid(alpha=0.3)

    points = [(entry["step"], entry[sts_metric]) for entry in log_history if sts_metric in entry and "step" in entry]
    if points:
        steps, values = zip(*points)
        sts_axes.plot(steps, values, marker="o")
        best = max(range(len(values)), key=values.__getitem__)
        sts_axes.scatter([steps[best]], [values[best]], s=120, facecolors="none", edgecolors="red", label="best")
        sts_axes.legend()
    sts_axes.set(xlabel="optimizer step", ylabel="Spearman × 100", title=sts_metric)
    sts_axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return drawn
