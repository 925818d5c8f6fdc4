"""Referring expression comprehension accuracy (RefCOCO / RefCOCO+ / RefCOCOg): an expression is correctly grounded
when the predicted box overlaps its gold box with IoU >= 0.5 (Yu et al. 2016; MAttNet's evaluation `if IoU >= 0.5`):

    >>> referring_expression_accuracy([[0, 0, 2, 1]], [[0, 0, 1, 1]])  # IoU exactly 0.5 counts
    {'accuracy': 1.0, 'num_expressions': 1}

Boxes are x1, y1, x2, y2, pixels or normalised, the same for both sides (x, y, w, h boxes must be converted first).
"""

from __future__ import annotations

import torch

from ..alignment.boxes import box_iou
from ..utils.validation import check_finite
from .local_modules import MODULES_DIR, load_local_metric

REFERRING_METRIC_PATH = MODULES_DIR / "referring_accuracy"


def as_box_tensor(name: str, boxes, allow_empty: bool = False) -> torch.Tensor:
    """Boxes as an (N, 4) float64 tensor of x1, y1, x2, y2 with x2 >= x1 and y2 >= y1."""
    try:
        tensor = torch.as_tensor(boxes, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"`{name}` must be boxes (N, 4) as x1, y1, x2, y2, got {type(boxes).__name__}: {error}"
        ) from None
    if tensor.numel() == 0 and allow_empty:
        return tensor.reshape(0, 4)
    if tensor.dim() != 2 or tensor.shape[-1] != 4 or tensor.shape[0] == 0:
        raise ValueError(
            f"`{name}` must be boxes of shape (N, 4) with N >= 1 (x1, y1, x2, y2), got shape {tuple(tensor.shape)}."
        )
    check_finite(name, tensor)
    inverted = (tensor[:, 2] < tensor[:, 0]) | (tensor[:, 3] < tensor[:, 1])
    if bool(inverted.any()):
        row = int(inverted.nonzero()[0])
        raise ValueError(
            f"`{name}` must hold x1, y1, x2, y2 boxes with x2 >= x1 and y2 >= y1, got {tensor[row].tolist()} at row "
            f"{row} (x, y, w, h boxes must be converted first)."
        )
    return tensor


def referring_expression_accuracy(predicted_boxes, gold_boxes, iou_threshold: float = 0.5) -> dict:
    """Share of expressions whose predicted box has IoU >= `iou_threshold` with the gold box.

    Args:
        predicted_boxes: one predicted box per expression, (N, 4) as x1, y1, x2, y2 (list, array or tensor).
        gold_boxes: the gold box of each expression, (N, 4) in the same coordinates.
        iou_threshold: 0.5 in RefCOCO / RefCOCO+ / RefCOCOg.

    Returns {"accuracy", "num_expressions"}.
    """
    predicted = as_box_tensor("predicted_boxes", predicted_boxes)
    gold = as_box_tensor("gold_boxes", gold_boxes)
    if predicted.shape[0] != gold.shape[0]:
        raise ValueError(
            f"`predicted_boxes` and `gold_boxes` must hold one box per expression each, got {predicted.shape[0]} and "
            f"{gold.shape[0]} boxes."
        )
    # IoU of each prediction with its own gold box: (N, 1, 4) x (N, 1, 4) -> (N, 1, 1)
    ious = box_iou(predicted.unsqueeze(1), gold.unsqueeze(1)).reshape(-1)
    # MAttNet / UNITER RefCOCO evaluation: correct when IoU >= 0.5
    correct = ious >= iou_threshold
    return {"accuracy": float(correct.double().mean()), "num_expressions": int(correct.numel())}


def load_referring_metric(**kwargs):
    """`evaluate.load` of this package's referring expression module from its local folder (no Hub access):
    `load_referring_metric().compute(predictions=[[x1, y1, x2, y2], ...], references=[[...], ...])` returns
    `referring_expression_accuracy`'s dict."""
    return load_local_metric("referring_accuracy", **kwargs)


__all__ = [
    "REFERRING_METRIC_PATH",
    "as_box_tensor",
    "load_referring_metric",
    "referring_expression_accuracy",
]
