"""Image patches as regions: the patch grid of a patch-based vision-language model (ViLT, LLaVA, PaliGemma, ...) and how
gold boxes, in the original image's pixels, map onto it through the processed image ([`ImageGeometry`]). A cell matches
a box by **coverage**, the share of the cell's area inside a box of the phrase (covered at 0.5): Li et al.'s IoU >= 0.5
is reached by no patch for a box larger than two patches. Cells are numbered row-major, as CLIP, SigLIP and ViT flatten
their patch embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..utils.validation import check_finite

__all__ = [
    "DEFAULT_COVERAGE_THRESHOLD",
    "ImageGeometry",
    "cell_boxes",
    "cell_coverage",
    "centre_prior",
    "covered_cells_target",
]

DEFAULT_COVERAGE_THRESHOLD = 0.5


def _check_grid(grid: tuple[int, int]) -> tuple[int, int]:
    if not isinstance(grid, (tuple, list)) or len(grid) != 2:
        raise ValueError(f"`grid` must be (rows, columns), got {grid!r}.")
    rows, columns = grid
    for name, value in (("rows", rows), ("columns", columns)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`grid` {name} must be a positive int, got {value!r}.")
    return int(rows), int(columns)


def cell_boxes(grid: tuple[int, int]) -> torch.Tensor:
    """(rows * columns, 4) boxes x1, y1, x2, y2 of the grid's cells, normalised to [0, 1], row-major."""
    rows, columns = _check_grid(grid)
    row, column = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    row, column = row.flatten().float(), column.flatten().float()
    return torch.stack([column / columns, row / rows, (column + 1) / columns, (row + 1) / rows], dim=-1)


def cell_coverage(boxes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Share of each cell's area inside the boxes: (..., G, 4) normalised boxes -> (..., rows * columns), the largest
    share over the G boxes of each leading index."""
    if boxes.dim() < 2 or boxes.shape[-1] != 4:
        raise ValueError(f"`boxes` must be (..., G, 4) normalised x1, y1, x2, y2, got shape {tuple(boxes.shape)}.")
    check_finite("boxes", boxes)
    if boxes.numel() and (float(boxes.min()) < 0 or float(boxes.max()) > 1):
        raise ValueError(
            f"`boxes` must be normalised to [0, 1], got values in [{float(boxes.min()):.4g}, {float(boxes.max()):.4g}]."
        )
    cells = cell_boxes(grid).to(boxes.device, torch.float32)
    box, cell = boxes.float().unsqueeze(-2), cells  # (..., G, 1, 4), (C, 4)
    width = (torch.minimum(box[..., 2], cell[:, 2]) - torch.maximum(box[..., 0], cell[:, 0])).clamp(min=0)
    height = (torch.minimum(box[..., 3], cell[:, 3]) - torch.maximum(box[..., 1], cell[:, 1])).clamp(min=0)
    cell_area = (cell[:, 2] - cell[:, 0]) * (cell[:, 3] - cell[:, 1])
    coverage = (width * height / cell_area).clamp(max=1.0)  # (..., G, C)
    if coverage.shape[-2] == 0:
        return coverage.sum(-2)
    return coverage.amax(dim=-2)


def covered_cells_target(
    coverage: torch.Tensor, coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD
) -> torch.Tensor:
    """(..., C) coverage -> (..., C) target distribution, uniform over the covered cells (coverage >=
    `coverage_threshold`); a row whose best cell is below the threshold puts all its mass on that cell; an all-zero
    row (no box) stays zero."""
    if not 0.0 < coverage_threshold <= 1.0:
        raise ValueError(f"`coverage_threshold` must be in (0, 1], got {coverage_threshold!r}.")
    covered = (coverage >= coverage_threshold).float()
    best = coverage.amax(dim=-1, keepdim=True)
    fallback = ((coverage == best) & (best > 0)).float()
    covered = torch.where(covered.sum(-1, keepdim=True) > 0, covered, fallback)
    return covered / covered.sum(-1, keepdim=True).clamp(min=1.0)


def centre_prior(grid: tuple[int, int]) -> torch.Tensor:
    """(rows * columns,) score of each cell for the centre baseline, higher nearer the image centre, so the baseline
    predicts the central cell. Patches have no detection confidence (Li et al.'s baseline); the image centre is the
    usual prior of pointing benchmarks. The score is minus the cell's rank by distance to the centre, cells equally far
    (the four central cells of an even grid) ranked in row-major order: whole numbers, so that the baseline is the same
    cell in any float precision and whatever an argmax kernel does with ties."""
    rows, columns = _check_grid(grid)
    row, column = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    # the squared distance times (2 * rows * columns) ** 2, in integers: equally far cells tie exactly (float
    # centres do not, e.g. on a 12 x 12 grid), so the stable sort ranks them row-major
    distance = (((2 * column + 1 - columns) * rows) ** 2 + ((2 * row + 1 - rows) * columns) ** 2).flatten()
    score = torch.empty(rows * columns)
    score[torch.sort(distance, stable=True).indices] = -torch.arange(rows * columns, dtype=torch.float32)
    return score


@dataclass(frozen=True)
class ImageGeometry:
    """How an image processor maps the pixels of an original image into the processed image: scale, then shift.

    `x_processed = x * scale_x - offset_x` (likewise y); `width` x `height` is the processed image the patch grid covers
    (padding included: ViLT pads images to the batch's largest).
    """

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    width: int
    height: int

    @classmethod
    def from_processor(
        cls,
        image_processor,
        original_size: tuple[int, int],
        processed_size: tuple[int, int],
        content_size: tuple[int, int] | None = None,
    ) -> ImageGeometry:
        """The geometry of one image.

        Args:
            image_processor: the model's image processor (its `do_center_crop`, `size` and `crop_size` are read).
            original_size: (width, height) of the original image in pixels.
            processed_size: (width, height) of `pixel_values`.
            content_size: (width, height) of the image inside `pixel_values` when it was padded (the extent of ViLT's
                `pixel_mask`); default: all of it.

        A processor that centre-crops resizes the shortest edge to `size["shortest_edge"]` first (CLIP's); any other
        resizes the image onto its content size (SigLIP's fixed size, ViLT's aspect-preserving resize before padding).
        """
        width, height = original_size
        if width <= 0 or height <= 0:
            raise ValueError(f"`original_size` must be a positive (width, height), got {original_size!r}.")
        processed_width, processed_height = processed_size
        if getattr(image_processor, "do_center_crop", False):
            size = image_processor.size
            shortest = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
            if shortest is None:
                raise ValueError(
                    f"`image_processor` ({type(image_processor).__name__}) centre-crops but its `size` has no "
                    f"`shortest_edge`: the crop's place in the original image is unknown, got size "
                    f"{image_processor.size!r}."
                )
            scale = int(shortest) / min(width, height)
            resized_width, resized_height = int(round(width * scale)), int(round(height * scale))
            return cls(
                scale,
                scale,
                (resized_width - processed_width) / 2,
                (resized_height - processed_height) / 2,
                processed_width,
                processed_height,
            )
        content_width, content_height = content_size if content_size is not None else processed_size
        return cls(content_width / width, content_height / height, 0.0, 0.0, processed_width, processed_height)

    def normalised_boxes(self, boxes: torch.Tensor) -> torch.Tensor:
        """(..., 4) pixel boxes of the original image -> boxes in the processed image normalised to [0, 1] (parts
        cropped away are clipped)."""
        boxes = torch.as_tensor(boxes, dtype=torch.float32)
        if boxes.shape[-1] != 4:
            raise ValueError(f"`boxes` must end with 4 coordinates (x1, y1, x2, y2), got shape {tuple(boxes.shape)}.")
        scale = boxes.new_tensor([self.scale_x, self.scale_y, self.scale_x, self.scale_y])
        offset = boxes.new_tensor([self.offset_x, self.offset_y, self.offset_x, self.offset_y])
        size = boxes.new_tensor([self.width, self.height, self.width, self.height])
        return ((boxes * scale - offset) / size).clamp(0.0, 1.0)
