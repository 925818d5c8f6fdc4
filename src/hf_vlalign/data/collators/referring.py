"""The collator of referring-expression rows (RefCOCO+)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...alignment.boxes import gold_region_iou
from .base import RegionTextCollator
from .rows import check_row_list, gold_boxes, row_error


@dataclass
class ReferringExpressionCollator(RegionTextCollator):
    """RefCOCO+ rows: `labels` is the region with the best IoU with the referred box, `target_region_iou` (B, R) every
    region's IoU with it (for accuracy at IoU >= 0.5); the expression is aligned to the referred box."""

    text_columns: tuple[str, ...] = ("expression",)

    def required_columns(self) -> tuple[str, ...]:
        return (*super().required_columns(), "expression_phrase_boxes")

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        boxes = example["expression_phrase_boxes"]
        check_row_list(index, "expression_phrase_boxes", boxes, what="a list holding the referred object's boxes")
        if not boxes or gold_boxes(index, "expression_phrase_boxes", boxes[0]).numel() == 0:
            raise row_error(index, "expression_phrase_boxes", "a list holding the referred object's boxes", boxes)

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        target_iou = torch.zeros_like(batch["visual_attention_mask"], dtype=torch.float32)
        for i, example in enumerate(examples):
            gold = gold_boxes(i, "expression_phrase_boxes", example["expression_phrase_boxes"][0])
            target_iou[i] = gold_region_iou(gold, batch["region_boxes_pixels"][i]) * batch["visual_attention_mask"][i]
        labels = target_iou.argmax(dim=1)
        for i in (target_iou.amax(dim=1) <= 0).nonzero().flatten().tolist():  # no region to name: ignored, not region 0
            self._count_unmatched()
            labels[i] = -100
        tensors["labels"] = labels
        tensors["target_region_iou"] = target_iou
        return tensors
