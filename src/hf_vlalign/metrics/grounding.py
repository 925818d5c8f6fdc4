"""Grounding accuracy, the one rule behind every grounding number of the library: a phrase (or word) is grounded
correctly when the best-scored real region (a head's most attended, a model's best logit, the most confident
detection, the largest box) has IoU >= 0.5 with its gold box (Li et al. 2020; MAttNet's RefCOCO `if IoU >= 0.5`):

    >>> region_hits(torch.tensor([0.1, 0.7, 0.2]), torch.tensor([0.0, 0.6, 0.9])).item()
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..alignment.boxes import box_area, box_iou
from .phrase_grounding import phrase_grounding_recall, rank_boxes

IOU_THRESHOLD = 0.5

__all__ = ["IOU_THRESHOLD", "largest_region_accuracy", "largest_region_recall", "region_hits"]


def region_hits(
    scores: torch.Tensor,
    region_iou: torch.Tensor,
    region_mask: torch.Tensor | None = None,
    iou_threshold: float = IOU_THRESHOLD,
) -> torch.Tensor:
    """Whether the best-scored real region of each row has IoU >= `iou_threshold` with the row's gold.

    Args:
        scores: (..., R) a score per region (attention, logits, detection confidence, box area); ties go to the
            first region.
        region_iou: (..., R) each region's IoU with the gold boxes, broadcast against `scores`.
        region_mask: (..., R) 1 for real regions, broadcast against `scores`; None: every region is real.
        iou_threshold: the IoU at which the picked region counts as the gold (0.5).

    Returns:
        (...) bool tensor, one hit per row of `scores`.
    """
    if region_mask is not None:
        scores = scores.masked_fill(~region_mask.bool(), float("-inf"))
    picked = scores.argmax(dim=-1, keepdim=True)
    return torch.take_along_dim(region_iou, picked, dim=-1).squeeze(-1) >= iou_threshold


def largest_region_accuracy(
    region_boxes: Sequence, gold_boxes: Sequence, iou_threshold: float = IOU_THRESHOLD
) -> float:
    """The share of rows whose image's largest region (by box area) has IoU >= `iou_threshold` with the row's gold box.

    Args:
        region_boxes: per row, the (R, 4) boxes of its image's regions (x1, y1, x2, y2, in the gold boxes' units).
        gold_boxes: per row, the referred object's box (x1, y1, x2, y2).
        iou_threshold: the IoU at which a region counts as the object (0.5 for RefCOCO+).
    """
    hits = 0
    for boxes, gold in zip(region_boxes, gold_boxes):
        boxes = torch.as_tensor(boxes, dtype=torch.float64)
        iou = box_iou(boxes, torch.as_tensor([gold], dtype=torch.float64))[:, 0]
        hits += int(region_hits(box_area(boxes), iou, iou_threshold=iou_threshold))
    return hits / len(gold_boxes)


def largest_region_recall(
    region_boxes: Sequence, gold_boxes: Sequence, ks: Sequence[int] = (1, 5, 10), iou_threshold: float = IOU_THRESHOLD
) -> dict[int, float]:
    """Recall@k (MERGED-BOXES, Plummer et al.) of ranking every phrase's image regions by decreasing area: {k: the share
    of phrases one of whose k largest regions has IoU >= `iou_threshold` with the union of the phrase's gold boxes}.

    Args:
        region_boxes: per phrase, the (R, 4) boxes of its image's regions.
        gold_boxes: per phrase, its (G >= 1, 4) gold boxes, merged into their enclosing box as the protocol does.
    """
    ranked = []
    for boxes in region_boxes:
        boxes = torch.as_tensor(boxes, dtype=torch.float64)
        ranked.append(rank_boxes(box_area(boxes), boxes, k=max(ks)).tolist())
    recall = phrase_grounding_recall(ranked, gold_boxes, tuple(ks), iou_threshold)
    return {k: recall[f"recall@{k}"] for k in ks}
