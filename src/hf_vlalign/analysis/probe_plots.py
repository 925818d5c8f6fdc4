"""PNG plots of grounding-probe accuracies (Li et al. 2020): the layer x head accuracy heatmap; Figure 3, every head's
accuracy against its layer, one dot per head; and Table 2 (the best head per dependency relation) as a bar chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..utils.optional import require
from .figures import annotate_cells, as_numpy, new_figure, save_png
from .grounding_probe import BEST_AMONG_ACTIVE, best_active_head

if TYPE_CHECKING:
    from matplotlib.colors import BoundaryNorm
    from matplotlib.figure import Figure

__all__ = [
    "draw_head_accuracy",
    "draw_layer_accuracy_scatter",
    "plot_head_accuracy",
    "plot_layer_accuracy_scatter",
    "plot_relation_accuracy_scatter",
    "plot_top_relations",
]


def _decile_norm(matrix: np.ndarray) -> BoundaryNorm | None:
    """Colour bins holding a tenth of the values each (bounds: the deciles), or None when the values are too alike to
    split."""
    require("matplotlib", extra="plots")
    from matplotlib.colors import BoundaryNorm

    bounds = np.unique(np.round(np.quantile(matrix, np.linspace(0.0, 1.0, 11)), 6))
    return BoundaryNorm(bounds, ncolors=256) if len(bounds) >= 3 else None


def _colourbar_baseline(colourbar, baseline: float, bounds: np.ndarray, name: str) -> None:
    """The baseline as a dashed line across the colourbar with its own red tick label (the bound labels next to it
    dropped), or, outside the scale, said in the colourbar's label."""
    if not bounds[0] <= baseline <= bounds[-1]:
        where = "below" if baseline < bounds[0] else "above"
        colourbar.set_label(f"{colourbar.ax.get_ylabel()}\n{name} {baseline:.3f} lies {where} the scale")
        return
    # positions along the bar: the bins are drawn with equal heights
    position = np.interp(baseline, bounds, np.linspace(0.0, 1.0, len(bounds)))
    ticks = [tick for tick in bounds if abs(np.interp(tick, bounds, np.linspace(0.0, 1.0, len(bounds))) - position) > 0.05]
    colourbar.ax.axhline(baseline, color="red", linestyle="--", linewidth=2)
    colourbar.set_ticks([*ticks, baseline], labels=[f"{tick:.3f}" for tick in ticks] + [f"{name} {baseline:.3f}"])
    colourbar.ax.get_yticklabels()[-1].set_color("red")


def draw_head_accuracy(
    accuracy: np.ndarray,
    title: str = "",
    baseline: float | None = None,
    num_phrases: int | None = None,
    active_share: np.ndarray | None = None,
    active_threshold: float = 0.2,
    baseline_name: str = "detection-confidence baseline",
    active_heads_only: bool = True,
) -> Figure:
    """The figure of `plot_head_accuracy`, not saved."""
    require("matplotlib", extra="plots")
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    matrix = as_numpy(accuracy)
    # one colour per decile of the heads: close accuracies of many good heads (0.86 vs 0.88) still get distinct
    # colours, where a linear 0-1 (or min-max) scale would paint them alike
    norm = _decile_norm(matrix)
    if norm is None:  # (nearly) one value: a linear scale around it
        middle = float(matrix.mean())
        norm = Normalize(max(0.0, middle - 0.005), min(1.0, middle + 0.005))
        bounds, scale = np.array([norm.vmin, norm.vmax]), "linear scale"
    else:
        bounds, scale = norm.boundaries, f"colour bins: deciles of the {matrix.size} heads"
    num_layers, num_heads = matrix.shape
    size = (max(4.5, 0.62 * num_heads + 3.2), max(3.6, 0.45 * num_layers + 1.9))
    figure = new_figure(figsize=size, layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(matrix, cmap="viridis", norm=norm, aspect="auto")
    ax.set_xticks(range(num_heads))
    ax.set_yticks(range(num_layers))
    ax.set_xlabel("head (counted from 0)")
    ax.set_ylabel("layer (counted from 0)")
    annotate_cells(ax, image, matrix, ".3f")
    if active_share is not None:
        active_share = as_numpy(active_share)
        # Li et al.: only actively attending heads are candidates for the best head; the others are hatched
        for layer, head in zip(*np.nonzero(active_share <= active_threshold)):
            ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.55", linewidth=0))
    best_layer, best_head, among = best_active_head(matrix, active_share, active_threshold, active_heads_only)
    ax.add_patch(Rectangle((best_head - 0.5, best_layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    colourbar = figure.colorbar(image, ax=ax, spacing="uniform", label=f"grounding accuracy (share of phrases)\n{scale}")
    colourbar.set_ticks(bounds, labels=[f"{bound:.3f}" for bound in bounds])
    if baseline is not None:
        _colourbar_baseline(colourbar, float(baseline), bounds, "baseline")
    facts = [f"best (red, of {among}): layer {best_layer}, head {best_head} = {matrix[best_layer, best_head]:.3f}"]
    if active_share is not None:
        facts[0] += f", active share {active_share[best_layer, best_head]:.2f} (hatched: share <= {active_threshold:g})"
    if baseline is not None:
        facts.append(f"{baseline_name} {float(baseline):.3f}")
    if num_phrases is not None:
        facts.append(f"n = {num_phrases:,} phrases")
    ax.set_title("\n".join(part for part in (title, "; ".join(facts)) if part), fontsize=10)
    return figure


def plot_head_accuracy(
    accuracy: np.ndarray,
    path: str | Path,
    title: str = "",
    baseline: float | None = None,
    num_phrases: int | None = None,
    active_share: np.ndarray | None = None,
    active_threshold: float = 0.2,
    baseline_name: str = "detection-confidence baseline",
    active_heads_only: bool = True,
) -> Path:
    """Layer x head heatmap of grounding-probe accuracy (Li et al. 2020), one colour per decile of the heads, each
    cell's value written in it, the best head outlined in red and named in the title, saved as a PNG.

    Args:
        accuracy: (L, H) accuracy in [0, 1] of each head, e.g. `GroundingProbeResult.accuracy`.
        path: where to write the PNG; parent folders are created.
        title: optional first title line.
        baseline: optional baseline accuracy in [0, 1], e.g. `GroundingProbeResult.baseline_accuracy`, drawn on the
            colourbar (or said to lie below / above its scale).
        num_phrases: optional number of phrases the accuracies are over.
        active_share: optional (L, H) share of attention on the regions (`GroundingProbeResult.active_share`): heads
            at or below `active_threshold` are hatched, and the best head is the best actively attending one.
        active_threshold: the share above which a head is actively attending.
        baseline_name: how the title names the baseline (`GroundingProbeResult.baseline_name`).
        active_heads_only: False: the best head is the best of all heads (the inactive ones still hatched); the title
            names the candidates either way.

    Returns:
        The path of the written PNG.
    """
    figure = draw_head_accuracy(
        accuracy, title, baseline, num_phrases, active_share, active_threshold, baseline_name, active_heads_only
    )
    return save_png(figure, path)


def _draw_scatter(
    ax, accuracy: np.ndarray, baseline: float | None, title: str, baseline_label: str = "baseline"
) -> None:
    """One dot per head at (layer, accuracy), the baseline as a horizontal line (Li et al. Figure 3)."""
    num_layers, num_heads = accuracy.shape
    layers = np.repeat(np.arange(num_layers), num_heads)
    ax.scatter(layers, accuracy.reshape(-1), s=14, alpha=0.7, color="tab:blue", label=f"one head ({num_heads} per layer)")
    if baseline is not None:
        ax.axhline(float(baseline), color="tab:red", linestyle="--", linewidth=1.2,
                   label=f"{baseline_label} ({float(baseline):.3f})")  # fmt: skip
    ax.set_xticks(range(num_layers))
    ax.set_xlim(-0.5, num_layers - 0.5)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(axis="y", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_xlabel("layer (counted from 0)")
    ax.set_ylabel("accuracy (share of items)")
    if title:
        ax.set_title(title, fontsize=10)


def draw_layer_accuracy_scatter(
    accuracy: np.ndarray,
    baseline: float | None = None,
    title: str = "",
    num_phrases: int | None = None,
    baseline_label: str = "baseline",
) -> Figure:
    """The figure of `plot_layer_accuracy_scatter`, not saved."""
    matrix = as_numpy(accuracy)
    if num_phrases is not None:
        title = f"{title} (n = {num_phrases:,} phrases)".strip()
    figure = new_figure(figsize=(max(5.0, 0.45 * matrix.shape[0] + 3.0), 3.8), layout="constrained")
    ax = figure.subplots()
    _draw_scatter(ax, matrix, baseline, title, baseline_label)
    ax.set_ylabel("grounding accuracy (share of phrases)")
    ax.legend(loc="lower right", fontsize=7)
    return figure


def plot_layer_accuracy_scatter(
    accuracy: np.ndarray,
    path: str | Path,
    baseline: float | None = None,
    title: str = "",
    num_phrases: int | None = None,
    baseline_label: str = "baseline",
) -> Path:
    """Per-layer scatter of every head's grounding accuracy (Li et al. 2020, Figure 3), saved as a PNG.

    Args:
        accuracy: (L, H) accuracy of each head, e.g. `GroundingProbeResult.accuracy`.
        path: where to write the PNG; parent folders are created.
        baseline: optional accuracy drawn as a horizontal line (e.g. `GroundingProbeResult.baseline_accuracy`).
        title: optional figure title.
        num_phrases: optional number of phrases the accuracies are over, added to the title as "(n = ... phrases)".
        baseline_label: the baseline's name in the legend (e.g. "detection-confidence baseline").

    Returns:
        The path of the written PNG.
    """
    return save_png(draw_layer_accuracy_scatter(accuracy, baseline, title, num_phrases, baseline_label), path)


def plot_relation_accuracy_scatter(
    accuracy: Mapping[str, np.ndarray],
    path: str | Path,
    baselines: Mapping[str, float | None] | None = None,
    relations: Sequence[str] | None = None,
    columns: int = 3,
) -> Path:
    """Li et al. 2020, Figure 3 per dependency relation: one layer x accuracy scatter panel per relation.

    Args:
        accuracy: relation -> (L, H) accuracies, e.g. `SyntacticGroundingResult.accuracy`.
        path: where to write the PNG; parent folders are created.
        baselines: optional relation -> baseline accuracy (e.g. `SyntacticGroundingResult.baseline_accuracy`).
        relations: which relations to draw, in order (default: all, in the mapping's order).
        columns: panels per row.

    Returns:
        The path of the written PNG.
    """
    relations = list(accuracy) if relations is None else list(relations)
    baselines = baselines or {}
    columns = min(columns, len(relations))
    rows = math.ceil(len(relations) / columns)
    figure = new_figure(figsize=(4.0 * columns, 3.2 * rows))
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).reshape(-1)
    for ax, relation in zip(axes, relations):
        _draw_scatter(ax, as_numpy(accuracy[relation]), baselines.get(relation), relation)
        ax.set_ylabel("accuracy (share of arcs)")
    for ax in axes[len(relations):]:
        ax.set_visible(False)
    figure.tight_layout()
    return save_png(figure, path)


def plot_top_relations(
    rows: Sequence[Mapping], path: str | Path, title: str = "", baseline_label: str = "detection-confidence baseline"
) -> Path:
    """Li et al. 2020, Table 2 as bars: per dependency relation, the accuracy of its best (actively attending) head,
    the mean over heads (lighter bar) and the baseline (a black line), on one 0-1 scale.

    Args:
        rows: `SyntacticGroundingResult.top_relations(k)` rows, optionally with a `mean_accuracy` key.
        path: where to write the PNG; parent folders are created.
        title: optional figure title.
        baseline_label: the baseline's name in the legend (`GroundingProbeResult.baseline_name` of the same data).

    Returns:
        The path of the written PNG.
    """
    rows = list(rows)
    figure = new_figure(figsize=(7.5, 1.2 + 0.42 * len(rows)))
    ax = figure.subplots()
    positions = np.arange(len(rows))[::-1]  # the most frequent relation on top
    best = [float(row["accuracy"]) for row in rows]
    among = {row.get("best_among", BEST_AMONG_ACTIVE) for row in rows}  # each relation's candidates
    among = among.pop() if len(among) == 1 else "active heads; all heads where none is active"
    ax.barh(positions, best, height=0.7, color="tab:blue", label=f"best head (of {among})")
    if all(row.get("mean_accuracy") is not None for row in rows):
        mean = [float(row["mean_accuracy"]) for row in rows]
        ax.barh(positions, mean, height=0.35, color="lightsteelblue", label="mean over heads")
    for position, row in zip(positions, rows):
        if row.get("baseline_accuracy") is not None:
            value = float(row["baseline_accuracy"])
            ax.plot([value, value], [position - 0.42, position + 0.42], color="black", linewidth=2, label=baseline_label)
            baseline_label = None  # one legend entry
        # the best head's accuracy and place, in a column right of the axes (never over a bar or a line)
        share = "" if row.get("active_share") is None else f", active share {float(row['active_share']):.2f}"
        ax.text(1.02, position, f"{float(row['accuracy']):.2f}  layer {row['layer']}, head {row['head']}{share}",
                transform=ax.get_yaxis_transform(), va="center", fontsize=7)
    ax.set_yticks(positions)
    ax.set_yticklabels([f"{row['relation']} (n={row['count']:,})" for row in rows], fontsize=8)
    ax.set_xlim(0.0, 1.01)  # room for a baseline of exactly 1
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_xlabel("accuracy: share of arcs whose w2 attends most to a region of w1's gold box (IoU >= 0.5); n = arcs",
                  fontsize=8)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=7, frameon=False)  # between title and bars
    if title:
        ax.set_title(title, fontsize=10, pad=18)
    figure.tight_layout()
    return save_png(figure, path)
