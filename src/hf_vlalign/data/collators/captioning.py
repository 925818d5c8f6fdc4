"""The collator of caption rows as generation targets (the captioner)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RegionTextCollator
from .rows import _as_list, row_error


@dataclass
class CaptioningCollator(RegionTextCollator):
    """Caption rows as generation targets: `labels` (B, T) are the caption's tokens followed by [SEP], -100 on padding,
    and `decoder_attention_mask` flags them; the leading [CLS] is dropped because the captioner's decoder starts from
    it (`decoder_start_token_id`) and reads the labels shifted right. The encoder reads regions only, so no
    `input_ids` are returned. `reference_column` (a list of the image's reference captions per row) is passed through
    as `references`, a list of lists of strings, for self-critical training."""

    text_columns: tuple[str, ...] = ("caption",)
    reference_column: str | None = None

    def required_columns(self) -> tuple[str, ...]:
        return (*super().required_columns(), *([self.reference_column] if self.reference_column is not None else []))

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        if self.reference_column is not None:
            references = _as_list(example[self.reference_column])
            if not isinstance(references, (list, tuple)) or not references or not all(
                isinstance(reference, str) for reference in references
            ):
                raise row_error(index, self.reference_column, "a non-empty list of reference captions (strings)", references)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        batch = super().__call__(examples)
        if self.reference_column is not None:  # the image's reference captions, as strings (self-critical rewards)
            batch["references"] = [list(example[self.reference_column]) for example in examples]
        tokens, keep = batch.pop("input_ids")[:, 1:], batch.pop("attention_mask")[:, 1:]
        batch.pop("token_type_ids")
        for key in ("word_region_alignment", "phrase_masks"):  # token-indexed: follow the dropped [CLS]
            if key in batch:
                batch[key] = batch[key][..., 1:, :] if key == "word_region_alignment" else batch[key][..., 1:]
        if "phrase_token_index" in batch:
            batch["phrase_token_index"] = torch.where(batch["phrase_token_index"] > 0, batch["phrase_token_index"] - 1, -1)
        batch["labels"] = tokens.masked_fill(keep == 0, -100)
        batch["decoder_attention_mask"] = keep
        return batch
