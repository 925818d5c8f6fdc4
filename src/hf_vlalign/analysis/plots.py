"""PNG plots of attention analyses: word x region heatmaps and layer x head probe accuracies.

Figures are drawn on matplotlib's Agg canvas through `matplotlib.figure.Figure` (never `pyplot`), so plotting
needs no display and leaves the global backend and figure registry untouched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


__all__ = ["plot_head_accuracy", "plot_word_region_heatmap", "plot_word_region_heatmaps"]

# cell values are written inside the heatmap only while they stay legible
_MAX_ANNOTATED_CELLS = 400


def _as_matrix(name: str, values: object, layout: str) -> np.ndarray:
    """A finite, non-empty 2-D float array (accepts numpy arrays, nested lists and CPU/GPU tensors)."""
    if hasattr(values, "detach"):  # torch.Tensor without importing torch here
        values = values.detach().cpu().numpy()
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"`{name}` must be a non-empty 2-D array {layout}, got shape {matrix.shape}.")
    if not np.isfinite(matrix).all():
        raise ValueError(f"`{name}` must be finite, got {int((~np.isfinite(matrix)).sum())} NaN/inf value(s).")
    return matrix


def _check_labels(name: str, labels: list[str], expected: int, what: str) -> None:
    if len(labels) != expected:
        raise ValueError(f"`{name}` must hold one label per {what} ({expected}), got {len(labels)}.")


def _annotate(ax, matrix: np.ndarray, fmt: str, vmin: float, vmax: float) -> None:
    """Writes each cell's value, dark on light cells and light on dark ones."""
    if matrix.size > _MAX_ANNOTATED_CELLS:
        return
    middle = (vmin + vmax) / 2
    for (row, column), value in np.ndenumerate(matrix):
        color = "white" if value < middle else "black"
        ax.text(column, row, format(value, fmt), ha="center", va="center", fontsize=7, color=color)


def _save(figure: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=120, bbox_inches="tight")
    return path


def plot_word_region_heatmap(
    attention: np.ndarray, words: list[str], region_labels: list[str], path: str | Path, title: str = ""
) -> Path:
    """Heatmap of a word x region attention matrix (rows: words, columns: regions), saved as a PNG.

    Args:
        attention: (W, R) attention of each word over the regions, e.g. one head's rows from
            `text_to_region_attention`.
        words: W row labels (tokens or phrases).
        region_labels: R column labels (e.g. detector class names).
        path: where to write the PNG; parent folders are created.
        title: optional figure title.

    Returns:
        The path of the written PNG.
    """
    matrix = _as_matrix("attention", attention, "(W, R)")
    figure = Figure(figsize=(max(4.0, 0.6 * matrix.shape[1] + 2.5), max(3.0, 0.45 * matrix.shape[0] + 1.5)))
    _draw_word_region(figure, figure.subplots(), matrix, words, region_labels, title)
    return _save(figure, path)


def plot_word_region_heatmaps(
    panels: list[tuple[np.ndarray, str]], words: list[str], region_labels: list[str], path: str | Path
) -> Path:
    """Word x region heatmaps side by side (one per `(attention, title)` panel, same words and regions), e.g. the
    cross-attention of a model trained with and without a loss (Kervadec et al. 2020, Figure 4), saved as a PNG."""
    if not isinstance(panels, (list, tuple)) or not panels:
        raise ValueError(f"`panels` must be a non-empty list of (attention, title) pairs, got {panels!r}.")
    matrices = [_as_matrix(f"panels[{i}] attention", attention, "(W, R)") for i, (attention, _) in enumerate(panels)]
    shapes = {matrix.shape for matrix in matrices}
    if len(shapes) != 1:
        raise ValueError(f"`panels` must all have the same (W, R) shape, got {sorted(shapes)}.")
    height, width = matrices[0].shape
    figure = Figure(figsize=(len(panels) * max(4.0, 0.6 * width + 2.5), max(3.0, 0.45 * height + 1.5)))
    for ax, matrix, (_, title) in zip(np.atleast_1d(figure.subplots(1, len(panels))), matrices, panels):
        _draw_word_region(figure, ax, matrix, words, region_labels, title)
    return _save(figure, path)


def _draw_word_region(figure: Figure, ax, matrix: np.ndarray, words: list[str], region_labels: list[str], title: str) -> None:
    _check_labels("words", words, matrix.shape[0], "row of `attention` (W)")
    _check_labels("region_labels", region_labels, matrix.shape[1], "column of `attention` (R)")
    vmin, vmax = min(0.0, float(matrix.min())), max(float(matrix.max()), 1e-12)
    image = ax.imshow(matrix, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(matrix.shape[1]), labels=[str(label) for label in region_labels], rotation=45, ha="right")
    ax.set_yticks(range(matrix.shape[0]), labels=[str(word) for word in words])
    ax.set_xlabel("region")
    ax.set_ylabel("word")
    if title:
        ax.set_title(title)
    _annotate(ax, matrix, ".2f", vmin, vmax)
    figure.colorbar(image, ax=ax, label="attention")


def plot_head_accuracy(accuracy: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Layer x head heatmap of grounding-probe accuracy (Li et al. 2020), best head outlined, saved as a PNG.

    Args:
        accuracy: (L, H) accuracy in [0, 1] of each head, e.g. `GroundingProbeResult.accuracy`.
        path: where to write the PNG; parent folders are created.
        title: optional figure title.

    Returns:
        The path of the written PNG.
    """
    matrix = _as_matrix("accuracy", accuracy, "(L, H)")
    if matrix.min() < 0 or matrix.max() > 1:
        raise ValueError(f"`accuracy` must hold values in [0, 1], got [{matrix.min():.4g}, {matrix.max():.4g}].")

    num_layers, num_heads = matrix.shape
    figure = Figure(figsize=(max(4.0, 0.55 * num_heads + 2.5), max(3.0, 0.45 * num_layers + 1.5)))
    ax = figure.subplots()
    image = ax.imshow(matrix, cmap="magma", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(num_heads))
    ax.set_yticks(range(num_layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if title:
        ax.set_title(title)
    _annotate(ax, matrix, ".2f", 0.0, 1.0)
    best_layer, best_head = np.unravel_index(int(np.argmax(matrix)), matrix.shape)
    ax.add_patch(Rectangle((best_head - 0.5, best_layer - 0.5), 1, 1, fill=False, edgecolor="cyan", linewidth=2))
    figure.colorbar(image, ax=ax, label="grounding accuracy")
    return _save(figure, path)

