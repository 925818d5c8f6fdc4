"""Collators: builder examples + a region-feature dataset -> the DESIGN.md tensors of a batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from ..alignment.boxes import alignment_target, gold_region_iou, normalize_boxes

PROBE_KEYS = ("phrase_token_index", "phrase_region_iou", "region_confidence")


class RegionFeatureLookup:
    """Random access by image id into a region-feature dataset (columns of `read_lxmert_tsv`)."""

    def __init__(self, region_features: datasets.Dataset):
        required = {"image_id", "image_h", "image_w", "boxes", "features", "object_conf"}
        missing = required - set(region_features.column_names)
        if missing:
            raise ValueError(f"`region_features` must have the columns {sorted(required)}, missing {sorted(missing)}.")
        self.dataset = region_features.with_format("numpy")
        self.row_of = {image_id: row for row, image_id in enumerate(region_features["image_id"])}

    def __getitem__(self, image_id: str) -> dict[str, np.ndarray]:
        if image_id not in self.row_of:
            raise ValueError(f"`image_id` {image_id!r} has no region features in the feature dataset.")
        record = self.dataset[self.row_of[image_id]]
        return {
            "features": np.stack(record["features"]).astype(np.float32),
            "boxes": np.stack(record["boxes"]).astype(np.float32),
            "confidence": np.asarray(record["object_conf"], dtype=np.float32),
            "width": float(record["image_w"]),
            "height": float(record["image_h"]),
        }


def _span_token_mask(offsets: torch.Tensor, in_sentence: torch.Tensor, span) -> torch.Tensor:
    """Tokens of one sentence (`in_sentence`, (T,) bool) whose character offsets overlap [span[0], span[1])."""
    start, end = int(span[0]), int(span[1])
    overlaps = (offsets[:, 0] < end) & (offsets[:, 1] > start) & (offsets[:, 1] > offsets[:, 0])
    return in_sentence & overlaps


@dataclass
class VGPCollator:
    """Builds a VGP batch: `[CLS] c1 [SEP] c2 [SEP]` tokens, regions, phrase masks and `word_region_alignment`.

    Each grounded token's alignment row is uniform over the regions whose IoU with a gold box of its phrase is
    >= `iou_threshold`, else on the best-IoU region (`alignment/boxes.py`). With `return_probe_targets`, the batch also
    carries what the grounding probe needs (`PROBE_KEYS`), which the model does not take.
    """

    tokenizer: PreTrainedTokenizerBase
    region_features: datasets.Dataset
    max_text_length: int = 64
    iou_threshold: float = 0.5
    return_probe_targets: bool = False
    _lookup: RegionFeatureLookup = field(init=False, repr=False)

    def __post_init__(self):
        if not self.tokenizer.is_fast:
            raise ValueError("`tokenizer` must be a fast tokenizer (character offsets are needed to find phrase tokens).")
        self._lookup = RegionFeatureLookup(self.region_features)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("`examples` must hold at least one example, got an empty batch.")
        encoding = self.tokenizer(
            [example["caption1"] for example in examples],
            [example["caption2"] for example in examples],
            padding="longest",
            truncation=True,
            max_length=self.max_text_length,
            return_offsets_mapping=True,
            return_token_type_ids=True,
            return_tensors="pt",
        )
        regions = [self._lookup[example["image_id"]] for example in examples]
        batch = {
            "input_ids": encoding["input_ids"],
            "attention_mask": encoding["attention_mask"],
            "token_type_ids": encoding["token_type_ids"],
            **self._pad_regions(regions),
            "id_labels": torch.tensor([example["id_label"] for example in examples], dtype=torch.long),
            "vgp_labels": torch.tensor([example["vgp_label"] for example in examples], dtype=torch.long),
        }
        batch.update(self._phrase_tensors(examples, encoding, batch["visual_boxes"], batch["visual_attention_mask"]))
        if not self.return_probe_targets:
            for key in PROBE_KEYS:
                batch.pop(key)
        return batch

    def _pad_regions(self, regions: list[dict]) -> dict[str, torch.Tensor]:
        num_regions = max(len(r["boxes"]) for r in regions)
        batch_size, feature_dim = len(regions), regions[0]["features"].shape[1]
        feats = torch.zeros(batch_size, num_regions, feature_dim)
        boxes = torch.tensor([0.0, 0.0, 1.0, 1.0]).repeat(batch_size, num_regions, 1)  # padding: a valid dummy box
        mask = torch.zeros(batch_size, num_regions, dtype=torch.long)
        confidence = torch.zeros(batch_size, num_regions)
        for i, region in enumerate(regions):
            count = len(region["boxes"])
            if region["features"].shape[1] != feature_dim:
                raise ValueError(f"region features of one batch must share a dimension, got {feature_dim} and {region['features'].shape[1]}.")
            feats[i, :count] = torch.from_numpy(region["features"])
            boxes[i, :count] = normalize_boxes(torch.from_numpy(region["boxes"]), region["width"], region["height"])
            mask[i, :count] = 1
            confidence[i, :count] = torch.from_numpy(region["confidence"])
        return {"visual_feats": feats, "visual_boxes": boxes, "visual_attention_mask": mask, "region_confidence": confidence}

    def _phrase_tensors(self, examples, encoding, region_boxes, region_mask) -> dict[str, torch.Tensor]:
        batch_size, text_length = encoding["input_ids"].shape
        num_regions = region_boxes.shape[1]
        pair_masks = torch.zeros(2, batch_size, text_length, dtype=torch.bool)
        grounded = []  # per example: list of (token mask, gold boxes normalised)
        for i, example in enumerate(examples):
            offsets, sequence_ids = encoding["offset_mapping"][i], torch.tensor([-1 if sid is None else sid for sid in encoding.sequence_ids(i)])
            size = (example["image_width"], example["image_height"])
            phrases = []
            for sentence in (0, 1):
                in_sentence = sequence_ids == sentence
                pair_masks[sentence, i] = self._required_mask(offsets, in_sentence, sentence, example[f"phrase{sentence + 1}_span"], example, f"phrase{sentence + 1}")
                spans, boxes = example[f"caption{sentence + 1}_phrase_spans"], example[f"caption{sentence + 1}_phrase_boxes"]
                for span, gold in zip(spans, boxes):
                    mask = self._required_mask(offsets, in_sentence, sentence, span, example, f"a grounded phrase of caption{sentence + 1}")
                    phrases.append((mask, normalize_boxes(torch.tensor(gold, dtype=torch.float32).reshape(-1, 4), *size)))
            grounded.append(phrases)

        num_phrases = max(1, max(len(phrases) for phrases in grounded))
        alignment = torch.zeros(batch_size, text_length, num_regions)
        phrase_masks = torch.zeros(batch_size, num_phrases, text_length, dtype=torch.bool)
        token_index = torch.full((batch_size, num_phrases), -1, dtype=torch.long)
        region_iou = torch.zeros(batch_size, num_phrases, num_regions)
        for i, phrases in enumerate(grounded):
            for p, (mask, gold) in enumerate(phrases):
                alignment[i, mask] = alignment_target(gold, region_boxes[i], region_mask[i], self.iou_threshold)
                phrase_masks[i, p] = mask
                token_index[i, p] = int(mask.nonzero().max())  # the probe reads the phrase's last sub-word
                region_iou[i, p] = gold_region_iou(gold, region_boxes[i]) * region_mask[i]
        return {
            "phrase1_mask": pair_masks[0],
            "phrase2_mask": pair_masks[1],
            "phrase_masks": phrase_masks,
            "word_region_alignment": alignment,
            "phrase_token_index": token_index,
            "phrase_region_iou": region_iou,
        }

    def _required_mask(self, offsets, in_sentence, sentence, span, example, what) -> torch.Tensor:
        mask = _span_token_mask(offsets, in_sentence, span)
        if not bool(mask.any()):
            caption = example[f"caption{sentence + 1}"]
            raise ValueError(
                f"{what} at characters {list(span)} of caption{sentence + 1} {caption!r} (image {example['image_id']}) "
                f"has no token after tokenisation with max_text_length={self.max_text_length}; raise `max_text_length` "
                "or shorten the captions."
            )
        return mask
