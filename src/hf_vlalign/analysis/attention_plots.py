"""PNG plots of attention maps: word x region heatmaps (one layer, or one per layer), one heatmap per head of a
layer, and each word's most attended boxes drawn on the image (drawn as `figures.py` says).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ..utils.optional import require
from .figures import annotate_cells, as_numpy, new_figure, rgb_image, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "draw_top_regions_on_image",
    "draw_word_region_heatmaps",
    "format_region_labels",
    "plot_head_grid",
    "plot_layer_heatmaps",
    "plot_top_regions_on_image",
    "plot_word_region_heatmap",
    "plot_word_region_heatmaps",
]


def _grid(count: int, max_columns: int = 4) -> tuple[int, int]:
    columns = min(count, max_columns)
    return -(-count // columns), columns


def format_region_labels(boxes: object, classes: list[str] | None = None, digits: int = 2) -> list[str]:
    """Column labels "r<i> <class> (x1,y1)-(x2,y2)" of R regions, e.g. "r3 circle (0.12,0.40)-(0.30,0.62)".

    Args:
        boxes: (R, 4) boxes x1, y1, x2, y2 (normalised to [0, 1] or in pixels; printed as given).
        classes: optional R class names (e.g. the detector's label of each region).
        digits: decimals of the coordinates.
    """
    boxes = as_numpy(boxes)
    labels = []
    for index, (x1, y1, x2, y2) in enumerate(boxes):
        name = f" {classes[index]}" if classes is not None else ""
        labels.append(f"r{index}{name} ({x1:.{digits}f},{y1:.{digits}f})-({x2:.{digits}f},{y2:.{digits}f})")
    return labels


def _gold_indices(gold: object) -> list[list[int]] | None:
    """None, or one list of column indices per row (an empty list: no gold for that row)."""
    if gold is None:
        return None
    return [[int(value) for value in np.asarray(indices).reshape(-1)] for indices in gold]


def _shared_range(matrices: list[np.ndarray], vmax: float | None) -> tuple[float, float]:
    """One colour range for every panel: from min(0, smallest value) to `vmax` (default: the largest value)."""
    vmin = min(0.0, *(float(matrix.min()) for matrix in matrices))
    if vmax is None:
        return vmin, max(max(float(matrix.max()) for matrix in matrices), vmin + 1e-12)
    return vmin, float(vmax)


def draw_word_region_heatmaps(
    panels: list[tuple[np.ndarray, str]],
    words: list[str],
    region_labels: list[str],
    gold_regions: list[list[int]] | None = None,
    title: str = "",
    vmax: float | None = None,
    gold_label: str = "gold region",
    regions_as_rows: bool = False,
    axis_labels: tuple[str, str] = ("word", "region"),
    value_label: str = "attention weight (softmax prob.)",
) -> Figure:
    """The figure of `plot_word_region_heatmaps`, not saved."""
    require("matplotlib", extra="plots")
    from matplotlib.patches import Rectangle

    matrices = [as_numpy(attention) for attention, _ in panels]
    gold = _gold_indices(gold_regions)
    vmin, vmax = _shared_range(matrices, vmax)
    rows, columns = (region_labels, words) if regions_as_rows else (words, region_labels)
    row_name, column_name = axis_labels[::-1] if regions_as_rows else axis_labels
    row_room = 0.065 * max(len(str(label)) for label in rows)  # inches of horizontal row labels
    column_room = 0.06 * max(len(str(label)) for label in columns)  # rotated column labels
    panel_width = max(2.4, 0.5 * len(columns) + 0.4)
    figure = new_figure(
        figsize=(len(panels) * panel_width + row_room + 1.6, 0.36 * len(rows) + column_room + 1.6), layout="constrained"
    )
    axes = np.atleast_1d(figure.subplots(1, len(panels), sharey=True))
    for ax, matrix, (_, panel_title) in zip(axes, matrices, panels):
        shown = matrix.T if regions_as_rows else matrix
        image = ax.imshow(shown, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(len(columns)), labels=[str(label) for label in columns], rotation=45, ha="right",
                      rotation_mode="anchor", fontsize=8)  # fmt: skip
        ax.set_xlabel(column_name)
        if panel_title:
            width = max(20, int(panel_width * 14))  # wrapped at `width` characters, its own line breaks kept
            ax.set_title("\n".join(textwrap.fill(line, width) for line in str(panel_title).splitlines()), fontsize=9)
        annotate_cells(ax, image, shown, ".2f")
        for word, regions in enumerate(gold or []):
            for region in regions:
                x, y = (word, region) if regions_as_rows else (region, word)
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.2))
    axes[0].set_yticks(range(len(rows)), labels=[str(label) for label in rows], fontsize=8)
    axes[0].set_ylabel(row_name)
    shared = f";\none scale for all {len(panels)} panels" if len(panels) > 1 else ""
    figure.colorbar(image, ax=axes.tolist(), label=f"{value_label}{shared}", shrink=0.9, pad=0.01)
    if gold is not None:
        handle = Rectangle((0, 0), 1, 1, fill=False, edgecolor="red", linewidth=2.2, label=gold_label)
        figure.legend(handles=[handle], loc="outside lower center", fontsize=8, frameon=False)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def plot_word_region_heatmap(
    attention: np.ndarray,
    words: list[str],
    region_labels: list[str],
    path: str | Path,
    title: str = "",
    gold_regions: list[list[int]] | None = None,
) -> Path:
    """Heatmap of a word x region attention matrix (rows: words, columns: regions), saved as a PNG.

    Args:
        attention: (W, R) attention of each word over the regions, e.g. one head's rows from
            `text_to_region_attention`.
        words: W row labels (tokens or phrases).
        region_labels: R column labels (e.g. `format_region_labels(boxes, classes)`).
        path: where to write the PNG; parent folders are created.
        title: optional figure title.
        gold_regions: optional, per word, the column indices of its gold region(s) (outlined; [] for none).

    Returns:
        The path of the written PNG.
    """
    matrix = as_numpy(attention)
    return save_png(draw_word_region_heatmaps([(matrix, title)], words, region_labels, gold_regions), path)


def plot_word_region_heatmaps(
    panels: list[tuple[np.ndarray, str]],
    words: list[str],
    region_labels: list[str],
    path: str | Path,
    gold_regions: list[list[int]] | None = None,
    title: str = "",
    vmax: float | None = None,
    gold_label: str = "gold region",
    regions_as_rows: bool = False,
    axis_labels: tuple[str, str] = ("word", "region"),
) -> Path:
    """Word x region heatmaps side by side (one per `(attention, title)` panel, same words and regions), e.g. the
    cross-attention of a model trained with and without a loss (Kervadec et al. 2020, Figure 4), saved as a PNG.

    The panels share one colour scale, from min(0, smallest value) to `vmax` (default: the largest value).
    `gold_regions` (per word, the column indices of its gold regions) are outlined in red and named `gold_label` in
    the legend. With `regions_as_rows`, regions are the rows (long labels stay readable); `axis_labels` names the
    word and region axes.
    """
    figure = draw_word_region_heatmaps(
        panels, words, region_labels, gold_regions, title, vmax, gold_label, regions_as_rows, axis_labels
    )
    return save_png(figure, path)


def plot_layer_heatmaps(
    attention: np.ndarray,
    words: list[str],
    region_labels: list[str],
    path: str | Path,
    title: str = "layer",
    gold_regions: list[list[int]] | None = None,
) -> Path:
    """`plot_word_region_heatmaps` of one (W, R) panel per layer of `attention` (L, W, R), panel l titled
    "<title> l", e.g. `torch.stack(text_to_region_rows(blocks))[:, 0].mean(1)` for example 0 with heads averaged."""
    layers = as_numpy(attention)
    panels = [(matrix, f"{title} {index}".strip()) for index, matrix in enumerate(layers)]
    return plot_word_region_heatmaps(panels, words, region_labels, path, gold_regions)


def plot_head_grid(
    attention: np.ndarray, query_labels: list[str], key_labels: list[str], path: str | Path, title: str = ""
) -> Path:
    """One small query x key heatmap per head of one layer, in a grid, saved as a PNG.

    Args:
        attention: (H, Q, K) attention of one layer and example, e.g. `blocks.word_to_region[layer][0]`.
        query_labels / key_labels: the Q row and K column labels.
        path: where to write the PNG; parent folders are created.
        title: optional figure title.
    """
    heads = as_numpy(attention)
    num_heads, num_queries, num_keys = heads.shape
    rows, columns = _grid(num_heads)
    panel_width, panel_height = max(2.5, 0.35 * num_keys + 1.5), max(2.0, 0.3 * num_queries + 1.2)
    figure = new_figure(figsize=(columns * panel_width, rows * panel_height), layout="constrained")
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    vmax = max(float(heads.max()), 1e-12)
    for head, ax in enumerate(axes):
        if head >= num_heads:
            ax.set_axis_off()
            continue
        image = ax.imshow(heads[head], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        ax.set_title(f"head {head}", fontsize=9)
        ax.set_xticks(range(num_keys), labels=[str(label) for label in key_labels], rotation=90, fontsize=6)
        ax.set_yticks(range(num_queries), labels=[str(label) for label in query_labels], fontsize=6)
    figure.colorbar(image, ax=axes.tolist(), label="attention", shrink=0.8)
    if title:
        figure.suptitle(title)
    return save_png(figure, path)


_TOP_COLOURS = ("lime", "yellow", "cyan", "magenta", "orange")


def _outlined(patch, width: float):
    """A dark outline keeps a box visible on any background."""
    require("matplotlib", extra="plots")
    from matplotlib import patheffects

    patch.set_path_effects([patheffects.withStroke(linewidth=width + 2, foreground="black"), patheffects.Normal()])
    return patch


def _draw_top_regions(
    ax,
    pixels: np.ndarray,
    boxes: np.ndarray,
    weights: np.ndarray,
    top_k: int,
    title: str,
    gold_boxes: np.ndarray | None,
    region_labels: list[str] | None,
) -> None:
    """The image with the `top_k` most attended boxes (line width and opacity growing with the weight) and the gold
    boxes dashed red; the legend gives each drawn box's rank, name and weight."""
    require("matplotlib", extra="plots")
    from matplotlib.patches import Rectangle

    ax.imshow(pixels)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    top = np.argsort(-weights, kind="stable")[:top_k]
    strongest = max(float(weights[top[0]]), 1e-12)
    handles = []
    for rank, region in enumerate(top):
        x1, y1, x2, y2 = boxes[region]
        share = max(float(weights[region]), 0.0) / strongest
        color, width = _TOP_COLOURS[rank % len(_TOP_COLOURS)], 1 + 3 * share
        name = region_labels[region] if region_labels is not None else f"r{region}"
        box = Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=color, linewidth=width,
                        alpha=0.35 + 0.65 * share, label=f"#{rank + 1} {name}: {weights[region]:.2f}")  # fmt: skip
        handles.append(ax.add_patch(_outlined(box, width)))
    for number, (x1, y1, x2, y2) in enumerate(gold_boxes if gold_boxes is not None else []):
        box = Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="red", linewidth=2, linestyle=(0, (4, 2)),
                        label="gold box" if number == 0 else None)  # fmt: skip
        patch = ax.add_patch(box)
        if number == 0:
            handles.append(patch)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), fontsize=7, frameon=False,
              title="attention weight (softmax prob.)", title_fontsize=7)  # fmt: skip


def _gold_boxes(gold_boxes: object) -> list[np.ndarray | None] | None:
    """None, or per word None / an (N, 4) array of gold boxes in pixels."""
    if gold_boxes is None:
        return None
    return [None if boxes is None or len(boxes) == 0 else as_numpy(boxes) for boxes in gold_boxes]


def draw_top_regions_on_image(
    image: str | Path | Image.Image,
    boxes: np.ndarray,
    words: list[str],
    attention: np.ndarray,
    top_k: int = 3,
    title: str = "",
    gold_boxes: list | None = None,
    region_labels: list[str] | None = None,
) -> Figure:
    """The figure of `plot_top_regions_on_image`, not saved."""
    boxes, matrix = as_numpy(boxes), as_numpy(attention)
    gold = _gold_boxes(gold_boxes)
    pixels = np.asarray(rgb_image(image, "image"))
    rows, columns = _grid(matrix.shape[0], max_columns=3)
    height, width = pixels.shape[:2]
    panel_width = 3.6
    legend_room = 0.2 + 0.16 * min(top_k, boxes.shape[0]) + (0.16 if gold is not None else 0.0)
    panel_height = max(1.5, panel_width * height / max(width, 1)) + 0.5 + legend_room
    figure = new_figure(figsize=(columns * panel_width, rows * panel_height + 0.4), layout="constrained")
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    for index, ax in enumerate(axes):
        if index < matrix.shape[0]:
            word_gold = gold[index] if gold is not None else None
            _draw_top_regions(ax, pixels, boxes, matrix[index], min(top_k, boxes.shape[0]), str(words[index]),
                              word_gold, region_labels)  # fmt: skip
        else:
            ax.set_axis_off()
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def plot_top_regions_on_image(
    image: str | Path | Image.Image,
    boxes: np.ndarray,
    words: list[str],
    attention: np.ndarray,
    path: str | Path,
    top_k: int = 3,
    title: str = "",
    gold_boxes: list | None = None,
    region_labels: list[str] | None = None,
) -> Path:
    """A grid with one panel per word: the image with the word's `top_k` most attended boxes drawn (thicker and more
    opaque for higher weights; the legend under the panel gives rank, region and weight) and the word's gold box(es)
    dashed red, saved as a PNG.

    Args:
        image: the image, as a file path or a `PIL.Image`.
        boxes: (R, 4) region boxes in pixels, x1, y1, x2, y2.
        words: W panel titles (e.g. "'disc' - layer 5, head 10").
        attention: (W, R) attention of each word over the regions (one layer and head, or heads averaged).
        path: where to write the PNG; parent folders are created.
        top_k: how many boxes to draw per word (at most R).
        title: optional figure title.
        gold_boxes: optional, per word, its gold boxes in pixels ((N, 4), or None / [] for a word without one).
        region_labels: optional R names of the boxes for the legend (default "r<i>").
    """
    figure = draw_top_regions_on_image(image, boxes, words, attention, top_k, title, gold_boxes, region_labels)
    return save_png(figure, path)
