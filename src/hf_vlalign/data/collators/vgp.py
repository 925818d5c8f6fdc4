"""The collator of VGP rows (a caption pair with a phrase in each)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RegionTextCollator, _labels
from .rows import check_row_int, check_row_span
from .truncation import CUT_KEY


@dataclass
class VGPCollator(RegionTextCollator):
    """VGP rows: `[CLS] c1 [SEP] c2 [SEP]`, the two phrase masks and the identification / VGP labels."""

    text_columns: tuple[str, ...] = ("caption1", "caption2")

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        missing = [name for name in ("phrase1_span", "phrase2_span", "id_label", "vgp_label") if name not in example]
        if missing:
            raise ValueError(
                f"VGPCollator rows must have the columns {', '.join(f'`{name}`' for name in missing)}; batch row "
                f"{index} has {sorted(example)}."
            )
        for sequence, column in enumerate(self.text_columns):
            check_row_span(index, f"phrase{sequence + 1}_span", example[f"phrase{sequence + 1}_span"], example[column])
        for column in ("id_label", "vgp_label"):
            check_row_int(index, example, column)

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
        tensors["vgp_labels"] = _labels(examples, "vgp_label")
        return tensors
