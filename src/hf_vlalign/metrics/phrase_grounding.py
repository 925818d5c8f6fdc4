"""Phrase grounding Recall@k on Flickr30k Entities (Plummer et al. 2015): a phrase is recalled at k when one of the
k highest-ranked boxes predicted for it has IoU >= 0.5 with its ground truth:

    >>> phrase_grounding_recall([[[0, 0, 1, 1], [0, 0, 4, 4]]], [[[0, 0, 4, 4]]], ks=(1, 2))
    {'recall@1': 0.0, 'recall@2': 1.0, 'num_phrases': 1}

A phrase with several gold boxes is scored, by default, against their union box (Plummer et al.; MDETR's
MERGED-BOXES, Kamath et al. 2021, `datasets/flickr_eval.py`); `merge_gold_boxes=False` gives MDETR's ANY-BOX protocol
(any one gold box may be matched). Numbers of the two protocols are not comparable.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..alignment.boxes import box_iou
from .local_modules import MODULES_DIR, load_local_metric
from .referring import as_box_tensor

PHRASE_GROUNDING_METRIC_PATH = MODULES_DIR / "phrase_grounding_recall"
DEFAULT_KS = (1, 5, 10)


def union_box(boxes: torch.Tensor) -> torch.Tensor:
    """The smallest box enclosing boxes (G, 4) -> (1, 4) (MDETR flickr_eval.py `_merge_boxes`)."""
    return torch.cat([boxes[:, :2].amin(dim=0), boxes[:, 2:].amax(dim=0)]).unsqueeze(0)


def phrase_hits(
    ranked: torch.Tensor, gold: torch.Tensor, ks: tuple[int, ...], iou_threshold: float, merge_gold_boxes: bool
) -> list[bool]:
    """For one phrase: is one of the top-k ranked boxes (K, 4) within `iou_threshold` of the gold (G, 4), per k."""
    if merge_gold_boxes:
        gold = union_box(gold)
    ious = box_iou(ranked, gold)  # (K, G)
    # MDETR flickr_eval.py: maxi = ious[:k].max(); positive if maxi >= iou_thresh (a phrase with no box is a miss)
    return [bool(ious[:k].numel()) and float(ious[:k].max()) >= iou_threshold for k in ks]


def phrase_grounding_recall(
    ranked_boxes,
    gold_boxes,
    ks: Sequence[int] = DEFAULT_KS,
    iou_threshold: float = 0.5,
    merge_gold_boxes: bool = True,
) -> dict:
    """Recall@k of ranked box predictions for each phrase.

    Args:
        ranked_boxes: per phrase, the predicted boxes (K, 4) as x1, y1, x2, y2, best first (K may be 0, or smaller
            than k: then all K boxes are used).
        gold_boxes: per phrase, its gold boxes (G, 4), G >= 1, in the same coordinates.
        ks: the k of each Recall@k.
        iou_threshold: 0.5 on Flickr30k Entities.
        merge_gold_boxes: True (default): compare with the union box of the gold boxes (Plummer et al.,
            MERGED-BOXES); False: any single gold box may be matched (MDETR's ANY-BOX).

    Returns {"recall@k" for each k, "num_phrases"}.
    """
    ks = (ks,) if isinstance(ks, int) else tuple(dict.fromkeys(ks))  # order kept, duplicates dropped
    if len(ranked_boxes) == 0 or len(ranked_boxes) != len(gold_boxes):
        raise ValueError(
            f"`ranked_boxes` and `gold_boxes` must hold one entry per phrase each (at least one), got "
            f"{len(ranked_boxes)} and {len(gold_boxes)} phrases."
        )
    hits = torch.zeros(len(ks), dtype=torch.float64)
    for i, (ranked, gold) in enumerate(zip(ranked_boxes, gold_boxes)):
        ranked = as_box_tensor(f"ranked_boxes[{i}]", ranked, allow_empty=True)
        gold = as_box_tensor(f"gold_boxes[{i}]", gold)
        hits += torch.tensor(phrase_hits(ranked, gold, ks, iou_threshold, merge_gold_boxes), dtype=torch.float64)
    recalls = hits / len(ranked_boxes)
    result = {f"recall@{k}": float(recall) for k, recall in zip(ks, recalls)}
    result["num_phrases"] = len(ranked_boxes)
    return result


def rank_boxes(scores, boxes, k: int | None = None) -> torch.Tensor:
    """The boxes (R, 4) sorted by their scores (R,), best first, ready for `phrase_grounding_recall`: e.g. one
    phrase's grounding logits over the real regions of its image with those regions' boxes. Ties keep the boxes'
    order (a stable sort). With `k`, only the k best boxes are kept.

        >>> rank_boxes([0.1, 0.9, 0.5], [[0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 3, 3]], k=2).tolist()
        [[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 3.0, 3.0]]
    """
    boxes = as_box_tensor("boxes", boxes, allow_empty=True)
    try:
        scores = torch.as_tensor(scores, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"`scores` must be one number per box (R,), got {type(scores).__name__}: {error}") from None
    if scores.dim() != 1 or len(scores) != len(boxes):
        raise ValueError(
            f"`scores` must hold one score per box: shape ({len(boxes)},) for `boxes` of shape {tuple(boxes.shape)}, "
            f"got shape {tuple(scores.shape)}."
        )
    if bool(torch.isnan(scores).any()):
        raise ValueError("`scores` must not hold NaN (a NaN score cannot be ranked).")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"`k` must be a positive integer or None, got {k!r}.")
    order = torch.sort(scores, descending=True, stable=True).indices
    return boxes[order[:k] if k is not None else order]


def load_phrase_grounding_metric(**kwargs):
    """`evaluate.load` of this package's phrase grounding module from its local folder (no Hub access):
    `load_phrase_grounding_metric().compute(predictions=[[[x1, y1, x2, y2], ...], ...], references=[[[...]], ...])`
    returns `phrase_grounding_recall`'s dict."""
    return load_local_metric("phrase_grounding_recall", **kwargs)


__all__ = [
    "DEFAULT_KS",
    "PHRASE_GROUNDING_METRIC_PATH",
    "load_phrase_grounding_metric",
    "phrase_grounding_recall",
    "phrase_hits",
    "rank_boxes",
    "union_box",
]
