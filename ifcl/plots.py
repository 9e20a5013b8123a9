"""Training curves of a run as a PNG: the loss terms and the STS dev Spearman against the optimizer step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def logged_points(log_history: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    """The steps at which ``name`` was logged, and its values there."""
    points = [(entry["step"], entry[name]) for entry in log_history if name in entry and "step" in entry]
    return [step for step, _ in points], [value for _, value in points]


def plot_training_curves(
    log_history: list[dict[str, Any]],
    path: str,
    loss_terms: Sequence[str],
    sts_metric: str = "eval_stsb_spearman",
) -> list[str]:
    """Draw ``log_history`` (``trainer.state.log_history``) into ``path``; returns the loss curves drawn.

    One panel for the total ``loss`` and each of ``loss_terms`` (the objective's own, ``Objective.loss_terms``) that
    was logged; one for ``sts_metric`` at each evaluation, the best one marked. A panel with nothing to draw is left
    out, and with nothing at all no file is written. A curve of one point is drawn as a marker.
    """
    curves = {term: logged_points(log_history, term) for term in ("loss", *loss_terms)}
    curves = {term: points for term, points in curves.items() if points[0]}
    sts_steps, sts_values = logged_points(log_history, sts_metric)
    panels = int(bool(curves)) + int(bool(sts_steps))
    if not panels:
        return []

    # matplotlib takes about a second to import: only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    figure, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    panel = iter(axes[0])
    if curves:
        loss_axes = next(panel)
        for term, (steps, values) in curves.items():
            marker = "o" if len(steps) == 1 else None
            loss_axes.plot(steps, values, label=term, marker=marker, linewidth=2 if term == "loss" else 1)
        loss_axes.set(xlabel="optimizer step", ylabel="loss", title="Training loss terms")
        loss_axes.set_yscale("symlog", linthresh=1e-3)
        loss_axes.legend()
        loss_axes.grid(alpha=0.3)
    if sts_steps:
        sts_axes = next(panel)
        sts_axes.plot(sts_steps, sts_values, marker="o")
        best = max(range(len(sts_values)), key=sts_values.__getitem__)
        sts_axes.scatter(
            [sts_steps[best]], [sts_values[best]], s=120, facecolors="none", edgecolors="red", label="best"
        )
        sts_axes.legend()
        sts_axes.set(xlabel="optimizer step", ylabel="Spearman × 100", title=sts_metric)
        sts_axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return list(curves)
