"""Box geometry: normalisation (the one place pixels become [0, 1]), IoU, and gold word-region alignment targets."""

from __future__ import annotations

import torch



def normalize_boxes(boxes: torch.Tensor, image_width: float, image_height: float) -> torch.Tensor:
    """Pixel boxes (..., 4) as x1, y1, x2, y2 -> boxes divided by the image size and clamped to [0, 1].

    Clamping absorbs the one-pixel overhang of 1-based annotation files (Flickr30k Entities boxes may end at
    `width`); anything further outside the image is an error, not something to clamp silently.
    """
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    if boxes.shape[-1] != 4:
        raise ValueError(f"`boxes` must have a last dim of 4 (x1, y1, x2, y2), got shape {tuple(boxes.shape)}.")
    if not (image_width > 0 and image_height > 0):
        raise ValueError(f"`image_width`/`image_height` must be positive, got {image_width} x {image_height}.")
    if not bool(torch.isfinite(boxes).all()):
        raise ValueError("`boxes` must be finite, got NaN or inf values.")
    scale = boxes.new_tensor([image_width, image_height, image_width, image_height])
    normalised = boxes / scale
    tolerance = 1.0 / min(image_width, image_height) + 1e-6
    if boxes.numel() and (float(normalised.min()) < -tolerance or float(normalised.max()) > 1 + tolerance):
        raise ValueError(
            f"`boxes` must lie inside the {image_width} x {image_height} image, got pixel values in "
            f"[{float(boxes.min()):.1f}, {float(boxes.max()):.1f}]."
        )
    return normalised.clamp(0.0, 1.0)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Area of boxes (..., 4) given as x1, y1, x2, y2."""
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of (..., N, 4) and (..., M, 4) boxes -> (..., N, M); zero where a union is empty."""
    a, b = boxes_a.unsqueeze(-2), boxes_b.unsqueeze(-3)
    width = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(min=0)
    height = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp(min=0)
    intersection = width * height
    union = box_area(a) + box_area(b) - intersection
    return torch.where(union > 0, intersection / union.clamp(min=1e-12), torch.zeros_like(union))


def gold_region_iou(gold_boxes: torch.Tensor, region_boxes: torch.Tensor) -> torch.Tensor:
    """Best IoU of each region with any of a phrase's gold boxes: (G, 4), (R, 4) -> (R,)."""
    return box_iou(gold_boxes, region_boxes).amax(dim=0)


def alignment_target(
    gold_boxes: torch.Tensor, region_boxes: torch.Tensor, region_mask: torch.Tensor | None = None, threshold: float = 0.5
) -> torch.Tensor:
    """Distribution over regions for one grounded phrase (VGP paper, sec. 3): uniform over the regions whose IoU
    with a gold box is >= `threshold`, else all mass on the best-IoU region. Padded regions get zero."""
    return alignment_target_from_iou(gold_region_iou(gold_boxes, region_boxes), region_mask, threshold)


def alignment_target_from_iou(
    iou: torch.Tensor, region_mask: torch.Tensor | None = None, threshold: float = 0.5
) -> torch.Tensor:
    """`alignment_target` from the phrase's `gold_region_iou` (R,), for callers that already hold it."""
    if region_mask is not None:
        iou = torch.where(region_mask.bool(), iou, torch.full_like(iou, -1.0))
    hits = iou >= threshold
    if not bool(hits.any()):
        hits = torch.zeros_like(hits)
        hits[iou.argmax()] = True
    return hits.float() / hits.sum()
