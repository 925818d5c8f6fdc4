"""The collator of NLVR2 rows: one sentence, two images."""

from __future__ import annotations

from dataclasses import dataclass

from .base import RegionTextCollator, _labels
from .regions import pad_regions
from .rows import check_row_int


@dataclass
class ImagePairCollator(RegionTextCollator):
    """NLVR2 rows: one sentence, two images. Region tensors get a pair axis: `visual_feats` (B, 2, R, Dv),
    `visual_boxes` (B, 2, R, 4), `visual_attention_mask` (B, 2, R); `labels` (B,)."""

    image_columns: tuple[str, str] = ("left_image_id", "right_image_id")

    def required_columns(self) -> tuple[str, ...]:
        return (*self.image_columns, *self.text_columns, "label")

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        check_row_int(index, example, "label", range(2))  # NLVR2: false or true

    def region_tensors(self, examples):
        image_ids = [
            self.store_image_id(example, column, column.replace("image_id", "feature_row"))
            for example in examples
            for column in self.image_columns
        ]
        regions = pad_regions(self.region_features, image_ids)
        return {name: value.reshape(len(examples), 2, *value.shape[1:]) for name, value in regions.items()}

    def task_tensors(self, examples, encoding, batch):
        return {"labels": _labels(examples, "label")}
