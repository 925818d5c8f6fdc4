"""Image tokens as boxes: every image token of a vision-language model's input placed in the original image's pixels.

A model sees one image through one or more *views* (the whole image, tiles, a thumbnail, pan-and-scan crops), each a
grid of image tokens laid linearly over a rectangle of the original image. Every family describes its images as views
(its processor's resize, crop, padding and tiling, and its model's merging or pooling); the probe, the supervision
targets, the centre baseline, the explorer and the localization heads work from the boxes the views give, for any
number of views. Tokens in no view (LLaVA-NeXT's row newlines) have no box.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["ImageTokenMap", "TokenView"]


@dataclass(frozen=True)
class TokenView:
    """One view of an image: `grid` (rows, columns) of tokens laid linearly over `box`.

    name: what the view is ("image", "base", "tiles", "thumbnail", "global", "crop").
    grid: (rows, columns) of its tokens.
    box: (x0, y0, x1, y1) in the original image's pixels that the grid covers (a padded or cropped view may reach
        outside the image: boxes are clipped to it).
    token_index: (rows * columns,) long, the index of each cell (row-major) among the image's tokens.
    """

    name: str
    grid: tuple[int, int]
    box: tuple[float, float, float, float]
    token_index: torch.Tensor

    def cell_boxes(self) -> torch.Tensor:
        """(rows * columns, 4) the box of each cell in the original image's pixels (row-major, unclipped)."""
        rows, columns = self.grid
        x0, y0, x1, y1 = self.box
        xs = torch.linspace(x0, x1, columns + 1)
        ys = torch.linspace(y0, y1, rows + 1)
        top, left = torch.meshgrid(ys[:-1], xs[:-1], indexing="ij")
        bottom, right = torch.meshgrid(ys[1:], xs[1:], indexing="ij")
        return torch.stack([left, top, right, bottom], dim=-1).reshape(-1, 4)


@dataclass
class ImageTokenMap:
    """The image tokens of one image, in their order in `input_ids`, and the views they form.

    image_size: (width, height) of the original image in pixels.
    num_tokens: the image's tokens in `input_ids` (those in no view included).
    views: its views, in the order the model reads them.
    """

    image_size: tuple[int, int]
    num_tokens: int
    views: list[TokenView] = field(default_factory=list)

    def token_boxes(self) -> torch.Tensor:
        """(num_tokens, 4) each token's box in the original image's pixels, clipped to the image; NaN for a token in
        no view."""
        boxes = torch.full((self.num_tokens, 4), float("nan"))
        width, height = self.image_size
        limits = torch.tensor([width, height, width, height], dtype=torch.float32)
        for view in self.views:
            boxes[view.token_index] = torch.minimum(view.cell_boxes().clamp(min=0.0), limits)
        return boxes

    def token_views(self) -> torch.Tensor:
        """(num_tokens,) long, the view of each token; -1 for a token in no view."""
        index = torch.full((self.num_tokens,), -1, dtype=torch.long)
        for number, view in enumerate(self.views):
            index[view.token_index] = number
        return index

    def coverage(self, boxes: torch.Tensor) -> torch.Tensor:
        """(G, 4) boxes in the original image's pixels -> (num_tokens,) the share of each token's (clipped) box inside
        them, the largest over the G boxes; 0 for a token without a box or of no area."""
        tokens = self.token_boxes()
        boxes = torch.as_tensor(boxes, dtype=torch.float32).view(-1, 4)
        width = torch.minimum(tokens[:, None, 2], boxes[:, 2]) - torch.maximum(tokens[:, None, 0], boxes[:, 0])
        height = torch.minimum(tokens[:, None, 3], boxes[:, 3]) - torch.maximum(tokens[:, None, 1], boxes[:, 1])
        area = ((tokens[:, 2] - tokens[:, 0]) * (tokens[:, 3] - tokens[:, 1]))[:, None]
        share = width.clamp(min=0) * height.clamp(min=0) / area
        share = torch.nan_to_num(share, nan=0.0, posinf=0.0).clamp(max=1.0)
        return share.amax(dim=1) if boxes.shape[0] else torch.zeros(self.num_tokens)
