"""What a run shows its reader: figures as text, Markdown tables, and plots as PNG files (the training curves of a
run, an STS set's scatter plot). Used by the model card and ``evaluate_sts.py``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def score_text(value: float | None) -> str:
    """A figure as its tables show it, two decimals; "–" where there is none (not measured, or NaN)."""
    return "–" if value is None or math.isnan(value) else f"{value:.2f}"


def markdown_table(header: list[str], rows: list[list[Any]], align: str | list[str] = "---") -> str:
    """A Markdown table of cells as they are to show; ``align``: the separator of every column, or of each."""
    aligns = [align] * len(header) if isinstance(align, str) else align
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files (the Agg backend)."""
    # matplotlib takes about a second to import: only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    return plt


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

    plt = pyplot()
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


def scatter_plot(path: str, gold_scores: Sequence[float], similarities: np.ndarray, title: str) -> None:
    """An STS set's predicted cosines against its gold scores, with the gold scores rescaled to [0, 1] as the line
    of a perfect model (the paper's Fig. 4b)."""
    plt = pyplot()
    gold = np.asarray(gold_scores, dtype=np.float64)
    figure, axes = plt.subplots(figsize=(5.5, 4.5), dpi=120)
    axes.scatter(gold, similarities, s=6, alpha=0.35, color="tab:blue", linewidths=0)
    low, high = float(gold.min()), float(gold.max())
    if high > low:
        axes.plot([low, high], [0.0, 1.0], color="gray", linewidth=1, label="gold rescaled to [0, 1]")
        axes.legend(loc="lower right", fontsize=8)
    axes.set_xlabel("gold score")
    axes.set_ylabel("predicted cosine similarity")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
