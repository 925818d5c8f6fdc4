"""Helpers shared by the analysis plots and the explorer: input arrays as numpy, images as RGB, cell values written
on heatmaps, and PNG saving on matplotlib's Agg canvas through `matplotlib.figure.Figure` (never `pyplot`), so
plotting needs no display and leaves the global backend and figure registry untouched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ..utils.atomic_folders import atomic_file
from ..utils.optional import require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_ANNOTATED_CELLS", "annotate_cells", "as_numpy", "new_figure", "rgb_image", "save_png"]

# cell values are written inside the heatmap only while they stay legible
MAX_ANNOTATED_CELLS = 400


def as_numpy(values: object) -> np.ndarray:
    """A float64 numpy array of numpy arrays, nested lists and CPU/GPU tensors."""
    if hasattr(values, "detach"):  # torch.Tensor without importing torch here
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def rgb_image(image: str | os.PathLike | Image.Image, name: str) -> Image.Image:
    """`image`, an image file or a PIL image, in RGB; argument `name` is named when it is neither."""
    if isinstance(image, (str, os.PathLike)):
        if not Path(image).is_file():
            raise ValueError(f"`{name}` must be an existing image file, got {str(image)!r} which does not exist.")
        with Image.open(image) as opened:
            return opened.convert("RGB")
    if not isinstance(image, Image.Image):
        raise ValueError(f"`{name}` must be a path or a PIL.Image, got {type(image).__name__}.")
    return image.convert("RGB")


def new_figure(**kwargs) -> Figure:
    """A `matplotlib.figure.Figure` with `kwargs` (never a pyplot figure), matplotlib's absence named."""
    require("matplotlib", extra="plots")
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def annotate_cells(ax, image, matrix: np.ndarray, fmt: str) -> None:
    """Writes each cell's value, dark on light cells and light on dark ones (by the cell colour's luminance)."""
    if matrix.size > MAX_ANNOTATED_CELLS:
        return
    for (row, column), value in np.ndenumerate(matrix):
        red, green, blue, _ = image.to_rgba(value)
        color = "white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black"
        ax.text(column, row, format(value, fmt), ha="center", va="center", fontsize=7, color=color)


def save_png(figure: Figure, path: str | Path) -> Path:
    """Saves `figure` as a PNG at `path` (120 dpi, tight bounding box), creating parent folders; returns the path. The
    file is replaced atomically: a full disk or a kill leaves the previous plot whole."""
    require("matplotlib", extra="plots")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    FigureCanvasAgg(figure)
    with atomic_file(path) as partial:
        figure.savefig(partial, format="png", dpi=120, bbox_inches="tight")
    return path
