"""The collator of VGP rows (a caption pair with a phrase in each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import RegionTextCollator, _labels
from ..formats.vgp import TYPOLOGY_LABELS
from .rows import check_row_int, check_row_span
from .truncation import CUT_KEY


# the classes of each label column: identification (c1, c2, both; eq. 1), VGP or not, and the semantic type (-1: none)
LABELS = {"id_label": range(3), "vgp_label": range(2), "type_label": range(-1, len(TYPOLOGY_LABELS))}


@dataclass
class VGPCollator(RegionTextCollator):
    """VGP rows: `[CLS] c1 [SEP] c2 [SEP]`, the two phrase masks and the identification / VGP labels.

    `vgp_task` picks what `vgp_labels` holds (the model's `config.vgp_task`): "type" (the default) the row's
    `type_label`, the pair's semantic type, with -100 (left out of the loss) for the rows without one (`type_label`
    -1: pairs that are not VGPs); "binary" the row's `vgp_label` (1: a VGP, 0: not). The builder counts the rows
    without a type (`hf_vlalign.data.builders.vgp.count_vgp_types`).
    """

    # the label of a pair without a type: cross-entropy's ignore index
    ignore_index: ClassVar[int] = -100

    text_columns: tuple[str, ...] = ("caption1", "caption2")
    vgp_task: str = "type"

    def __post_init__(self):
        super().__post_init__()
        if self.vgp_task not in ("type", "binary"):
            raise ValueError(f"`vgp_task` must be 'type' or 'binary', got {self.vgp_task!r}.")

    def _label_columns(self) -> tuple[str, str]:
        return ("id_label", "type_label" if self.vgp_task == "type" else "vgp_label")

    def required_columns(self) -> tuple[str, ...]:
        return (*super().required_columns(), "phrase1_span", "phrase2_span", *self._label_columns())

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        for sequence, column in enumerate(self.text_columns):
            check_row_span(index, f"phrase{sequence + 1}_span", example[f"phrase{sequence + 1}_span"], example[column])
        for column in self._label_columns():
            check_row_int(index, example, column, LABELS[column])

    def required_spans(self) -> dict[str, str]:
        """The phrase pair: `phrase1_span` in the first caption, `phrase2_span` in the second."""
        return {f"phrase{sequence + 1}_span": column for sequence, column in enumerate(self.text_columns)}

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        for sequence, column in enumerate(self.text_columns):
            masks = []
            for i, example in enumerate(examples):
                in_sentence = torch.tensor([sid == sequence for sid in encoding.sequence_ids(i)])
                span, cut = example[f"phrase{sequence + 1}_span"], batch[CUT_KEY][i][sequence]
                masks.append(self.required_mask(encoding["offset_mapping"][i], in_sentence, span, example, column, cut))
            tensors[f"phrase{sequence + 1}_mask"] = torch.stack(masks)
        tensors["id_labels"] = _labels(examples, "id_label")
        if self.vgp_task == "type":
            labels = _labels(examples, "type_label")
            tensors["vgp_labels"] = labels.masked_fill(labels == -1, self.ignore_index)
        else:
            tensors["vgp_labels"] = _labels(examples, "vgp_label")
        return tensors
