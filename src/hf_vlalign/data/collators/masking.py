"""Masking of the pre-training collators: masked words (BERT's, through transformers) and masked regions."""

from __future__ import annotations

import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase


def word_masker(tokenizer: PreTrainedTokenizerBase, mlm_probability: float) -> DataCollatorForLanguageModeling:
    """transformers' BERT masking (80 % [MASK], 10 % random word, 10 % kept) at `mlm_probability`."""
    return DataCollatorForLanguageModeling(tokenizer, mlm_probability=max(mlm_probability, 1e-12))


def mask_words(
    masker: DataCollatorForLanguageModeling, input_ids: torch.Tensor, mlm_probability: float
) -> dict[str, torch.Tensor]:
    """Masked `input_ids` and their `labels` (the original ids on masked positions, -100 elsewhere); special tokens
    and padding are never masked. With `mlm_probability` 0, only all -100 `labels` (and no random draw)."""
    if mlm_probability == 0:
        return {"labels": torch.full_like(input_ids, -100)}
    masked_ids, labels = masker.torch_mask_tokens(input_ids.clone())
    return {"input_ids": masked_ids, "labels": labels}


def mask_regions(
    batch: dict[str, torch.Tensor], probability: float, zero_fraction: float = 0.8, replace_fraction: float = 0.1
) -> dict[str, torch.Tensor]:
    """Masks each real region of `batch` with `probability`: `zero_fraction` of the masked regions get zero features,
    `replace_fraction` the feature of a random real region of the batch, the rest keep theirs (LXMERT: 0.8 / 0.1;
    VL-BERT: 1 / 0). Returns the new `visual_feats`, the original ones as `feature_labels`, `masked_regions` (B, R) and
    the detector's `object_labels` / `attribute_labels` of the masked regions (-100 elsewhere or where the store has
    none); `batch` needs `visual_feats`, `visual_attention_mask`, `region_object_ids` and `region_attr_ids`."""
    features, real = batch["visual_feats"], batch["visual_attention_mask"].bool()
    masked = (torch.rand(real.shape) < probability) & real
    choice = torch.rand(real.shape)
    zeroed = masked & (choice < zero_fraction)
    replaced = masked & (choice >= zero_fraction) & (choice < zero_fraction + replace_fraction)
    new_features = features.masked_fill(zeroed.unsqueeze(-1), 0.0)
    if bool(replaced.any()):
        pool = features[real]
        new_features[replaced] = pool[torch.randint(len(pool), (int(replaced.sum()),))]

    def labels_of(ids: torch.Tensor) -> torch.Tensor:
        return torch.where(masked & (ids >= 0), ids, torch.full_like(ids, -100))

    return {
        "visual_feats": new_features,
        "feature_labels": features,
        "masked_regions": masked.long(),
        "object_labels": labels_of(batch["region_object_ids"]),
        "attribute_labels": labels_of(batch["region_attr_ids"]),
    }
