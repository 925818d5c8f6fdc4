"""Collators of image-caption rows with grounded phrases: one caption per row, and phrase grounding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import RegionTextCollator, _labels
from .rows import check_row_int


@dataclass
class GroundedCaptionCollator(RegionTextCollator):
    """Image-caption rows (one text per row); `label_column` (e.g. an image-text match label) becomes `labels`."""

    label_column: str | None = None

    def required_columns(self) -> tuple[str, ...]:
        return (*super().required_columns(), *([self.label_column] if self.label_column is not None else []))

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        if self.label_column is not None:
            check_row_int(index, example, self.label_column)

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        if self.label_column is not None:
            tensors["labels"] = _labels(examples, self.label_column)
        return tensors


@dataclass
class PhraseGroundingCollator(RegionTextCollator):
    """Caption rows for phrase grounding (Flickr30k Entities): adds `phrase_labels` (B, P, R), each grounded phrase's
    target distribution over regions (its `word_region_alignment` row), beside `phrase_masks` (B, P, T). With
    `return_probe_targets`, `phrase_region_iou` (B, P, R) gives every region's best IoU with the phrase's gold boxes,
    from which Recall@k is read."""

    returns_phrase_labels: ClassVar[bool] = True
