"""`RegionTextCollator`, the collator every task collator extends: tokenised texts, the regions of each row's image
and the word-region alignment of its grounded phrases."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import datasets
import torch
from transformers import PreTrainedTokenizerBase

from ...alignment.boxes import alignment_target_from_iou, box_iou
from ..feature_store import RegionFeatureStore
from .regions import pad_regions, store_image_id
from .rows import _as_list, check_fast_tokenizer, check_row_columns, check_row_phrases, check_row_text, gold_boxes, kind_of, row_error
from .truncation import (
    CUT_KEY,
    TruncationStats,
    check_max_text_length,
    cut_word_pieces,
    drop_overlong_rows,
    row_truncation,
    span_is_cut,
)

logger = logging.getLogger(__name__)

PROBE_KEYS = ("phrase_token_index", "phrase_region_iou", "region_confidence")
# region tensors the collators read but no model takes
REGION_ONLY_KEYS = ("region_boxes_pixels", "region_object_ids", "region_attr_ids")


def span_token_mask(offsets: torch.Tensor, in_sentence: torch.Tensor, span) -> torch.Tensor:
    """Tokens of one sentence (`in_sentence`, (T,) bool) whose character offsets overlap [span[0], span[1])."""
    start, end = int(span[0]), int(span[1])
    overlaps = (offsets[:, 0] < end) & (offsets[:, 1] > start) & (offsets[:, 1] > offsets[:, 0])
    return in_sentence & overlaps


@dataclass
class RegionTextCollator:
    """Tokenises `text_columns` (one text, or a pair encoded `[CLS] a [SEP] b [SEP]`), adds the regions of each row's
    image and the word-region alignment of its grounded phrases; task collators add their labels in `task_tensors`.
    With `return_probe_targets`, the batch also carries what the grounding probe needs (`PROBE_KEYS`). Texts longer
    than `max_text_length` are truncated, never refused (`truncation_stats`).
    """

    # `phrase_labels` (each grounded phrase's target over regions) is returned by the phrase grounding collator only
    returns_phrase_labels: ClassVar[bool] = False

    tokenizer: PreTrainedTokenizerBase
    region_features: RegionFeatureStore
    text_columns: tuple[str, ...] = ("sentence",)
    max_text_length: int = 64
    iou_threshold: float = 0.5
    return_probe_targets: bool = False
    truncation_stats: TruncationStats = field(default_factory=TruncationStats, init=False, compare=False)
    # grounded phrases (and referring expressions) whose gold boxes overlap no region of their image: not aligned
    unmatched_phrases: int = field(default=0, init=False, compare=False)
    # the evaluation pass whose batches are being made (`evaluation_pass`), named in the warnings
    pass_name: str | None = field(default=None, init=False, compare=False)
    warn_unmatched: bool = field(default=True, init=False, repr=False, compare=False)
    _warned: set = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_fast_tokenizer(self.tokenizer)
        if not isinstance(self.region_features, RegionFeatureStore):
            raise ValueError(
                f"`region_features` must be a RegionFeatureStore, got {kind_of(self.region_features)} (open one with "
                "RegionFeatureStore.load(directory))."
            )
        if len(self.text_columns) not in (1, 2):
            raise ValueError(f"`text_columns` must name one text or a pair, got {self.text_columns}.")
        check_max_text_length(self.tokenizer, self.max_text_length, len(self.text_columns))

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        self.check_rows(examples)
        return self.collate(examples)

    @contextmanager
    def evaluation_pass(self, name: str, *, other_images: bool = False) -> Iterator[None]:
        """The batches made inside belong to the pass `name` (e.g. the image-use check's "shuffled images"): its
        warnings name it. With `other_images` (rows joined to another image's regions), a gold box overlapping no
        region is expected: counted in `unmatched_phrases`, not warned."""
        saved = self.pass_name, self.warn_unmatched
        self.pass_name, self.warn_unmatched = name, not other_images
        try:
            yield
        finally:
            self.pass_name, self.warn_unmatched = saved

    def _warning_source(self) -> str:
        """The collator, and the pass its batches are made for, as its warnings name them."""
        return type(self).__name__ + (f" ({self.pass_name} pass)" if self.pass_name else "")

    def check_rows(self, examples: list[dict]) -> None:
        """Refuses an empty batch or a malformed row (`check_row`)."""
        if not examples:
            raise ValueError("`examples` must hold at least one example, got an empty batch.")
        for index, example in enumerate(examples):
            self.check_row(index, example)

    def collate(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        """The batch of checked rows."""
        texts = [[example[column] for column in self.text_columns] for example in examples]
        encoding = self.tokenizer(
            *[[row[k] for row in texts] for k in range(len(self.text_columns))],
            padding="longest",
            truncation=True,
            max_length=self.max_text_length,
            return_offsets_mapping=True,
            return_token_type_ids=True,
            return_tensors="pt",
        )
        cuts = cut_word_pieces(self.tokenizer, texts, encoding, self.max_text_length)
        self._count_truncation(examples, cuts)
        batch = {name: encoding[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
        batch[CUT_KEY] = cuts
        batch.update(self.region_tensors(examples))
        batch.update(self.task_tensors(examples, encoding, batch))
        for key in (*REGION_ONLY_KEYS, CUT_KEY):
            batch.pop(key, None)
        if not self.returns_phrase_labels:
            batch.pop("phrase_labels", None)
        if not self.return_probe_targets:
            for key in PROBE_KEYS:
                batch.pop(key, None)
        return batch

    def required_columns(self) -> tuple[str, ...]:
        return ("image_id", *self.text_columns)

    def check_row(self, index: int, example: dict) -> None:
        """Refuses a row missing a column or holding a value of the wrong type, naming the row and the column."""
        check_row_columns(index, example, self.required_columns(), type(self).__name__)
        for column in self.required_columns():
            value = example[column]
            if column.endswith("image_id") and (isinstance(value, bool) or not isinstance(value, (str, numbers.Integral))):
                raise row_error(index, column, "an image id (a string or an int)", value)
        for column in self.text_columns:
            check_row_text(index, example, column)
            check_row_phrases(index, example, column)

    def region_tensors(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        return pad_regions(self.region_features, [self.store_image_id(example) for example in examples])

    # truncation --------------------------------------------------------------------------------------------------

    @property
    def dataset_text_columns(self) -> tuple[str, ...]:
        """The text columns as the dataset holds them (what `drop_overlong_rows` tokenises)."""
        return tuple(self.text_columns)

    def required_spans(self) -> dict[str, str]:
        """{span column: its text column} of the spans a row cannot be trained without (none here)."""
        return {}

    def drop_overlong_rows(
        self, dataset: datasets.Dataset, where: str = "dataset"
    ) -> tuple[datasets.Dataset, TruncationStats]:
        """`drop_overlong_rows` with this collator's tokenizer, `max_text_length`, text columns and required spans."""
        return drop_overlong_rows(
            dataset,
            self.tokenizer,
            self.max_text_length,
            text_columns=self.dataset_text_columns,
            required_spans=self.required_spans(),
            where=where,
        )

    def _count_truncation(self, examples: list[dict], cuts: list) -> None:
        """Adds the batch to `truncation_stats`; warns the first time a row is truncated and the first time a required
        span is cut."""
        required = self.required_spans()
        batch = TruncationStats()
        for example, cut in zip(examples, cuts):
            batch = batch + row_truncation(example, cut, self.text_columns, required)
        self.truncation_stats = self.truncation_stats + batch
        stats, name = self.truncation_stats, self._warning_source()
        if batch.rows_truncated and "truncated" not in self._warned:
            self._warned.add("truncated")
            logger.warning(
                "%s: texts longer than max_text_length=%d word pieces are truncated (%d of %d rows so far; %d grounded "
                "phrase(s) cut, whose alignment is dropped). Warned once; the counts go on in `truncation_stats`.",
                name, self.max_text_length, stats.rows_truncated, stats.rows, stats.phrases_cut,
            )  # fmt: skip
        if batch.required_spans_cut and "required" not in self._warned:
            self._warned.add("required")
            logger.warning(
                "%s: %d row(s) lost part of a required span (%s) to truncation at max_text_length=%d; they are kept with "
                "what survives (or their caption's tokens), but cannot be trained as meant: remove them beforehand with "
                "`collator.drop_overlong_rows(dataset)`. Warned once; the counts go on in `truncation_stats`.",
                name, stats.required_spans_cut, ", ".join(required), self.max_text_length,
            )  # fmt: skip

    def store_image_id(self, example: dict, id_column: str = "image_id", row_column: str = "feature_row") -> str:
        return store_image_id(self.region_features, example, id_column, row_column)

    def task_tensors(self, examples: list[dict], encoding, batch: dict) -> dict[str, torch.Tensor]:
        return self.grounding_tensors(examples, encoding, batch)

    # grounding ---------------------------------------------------------------------------------------------------

    def grounding_tensors(self, examples: list[dict], encoding, batch: dict) -> dict[str, torch.Tensor]:
        """`word_region_alignment`, `phrase_masks` and the probe targets of every grounded phrase of the texts."""
        batch_size, text_length = encoding["input_ids"].shape
        num_regions = batch["visual_feats"].shape[-2]
        grounded = [self._grounded_phrases(i, example, encoding, batch) for i, example in enumerate(examples)]
        num_phrases = max(1, max(len(phrases) for phrases in grounded))
        alignment = torch.zeros(batch_size, text_length, num_regions)
        phrase_masks = torch.zeros(batch_size, num_phrases, text_length, dtype=torch.bool)
        token_index = torch.full((batch_size, num_phrases), -1, dtype=torch.long)
        region_iou = torch.zeros(batch_size, num_phrases, num_regions)
        phrase_labels = torch.zeros(batch_size, num_phrases, num_regions)
        for i, phrases in enumerate(grounded):
            for p, (mask, target, iou) in enumerate(phrases):
                alignment[i, mask] = target
                phrase_masks[i, p] = mask
                token_index[i, p] = int(mask.nonzero().max())  # the probe reads the phrase's last sub-word
                region_iou[i, p] = iou
                phrase_labels[i, p] = target
        return {
            "word_region_alignment": alignment,
            "phrase_masks": phrase_masks,
            "phrase_token_index": token_index,
            "phrase_region_iou": region_iou,
            "phrase_labels": phrase_labels,
        }

    def _grounded_phrases(self, i: int, example: dict, encoding, batch: dict) -> list[tuple]:
        offsets = encoding["offset_mapping"][i]
        sequence_ids = torch.tensor([-1 if sid is None else sid for sid in encoding.sequence_ids(i)])
        region_mask = batch["visual_attention_mask"][i]
        pixels = batch["region_boxes_pixels"][i]
        cuts = batch.get(CUT_KEY)
        phrases = []
        for sequence, column in enumerate(self.text_columns):
            spans = example.get(f"{column}_phrase_spans") or []
            boxes = example.get(f"{column}_phrase_boxes") or [None] * len(spans)
            regions = example.get(f"{column}_phrase_regions")
            cut = cuts[i][sequence] if cuts is not None else ()
            kept = []  # (index, span, token mask, gold boxes) of the phrases truncation left
            for p, (span, gold) in enumerate(zip(spans, boxes)):
                if span_is_cut(cut, span):
                    continue  # a word piece lost to truncation: the phrase keeps no alignment (`truncation_stats`)
                mask = self.required_mask(offsets, sequence_ids == sequence, span, example, column)
                kept.append((p, span, mask, gold_boxes(i, f"{column}_phrase_boxes", gold)))
            # each region's best IoU with each phrase's gold boxes: the probe's target and the alignment row's
            gold_ious = phrases_gold_iou([gold for *_, gold in kept], pixels)
            for (p, span, mask, gold), gold_iou in zip(kept, gold_ious):
                iou = gold_iou * region_mask if gold_iou is not None else torch.zeros(len(region_mask))
                phrase = example[column][span[0] : span[1]]
                target = self.phrase_target(i, phrase, gold, None if regions is None else regions[p], batch, gold_iou)
                if target is not None:
                    phrases.append((mask, target, iou))
        return phrases

    def phrase_target(
        self, i: int, phrase: str, gold: torch.Tensor, regions: list | None, batch: dict, gold_iou: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Alignment row of one phrase of example `i` over its regions; None when the phrase is not grounded.
        `gold_iou`: each region's best IoU with `gold` (`gold_region_iou`), None without gold boxes."""
        region_mask = batch["visual_attention_mask"][i]
        if regions is not None:  # built against the store by `build_dataset(..., region_features=store)`
            if not len(gold) and _all_zero(regions):  # a phrase without a box (GQA without scene graphs): all zeros
                return None
            return self._checked_regions(i, regions, region_mask, batch)
        if len(gold):  # IoU in pixels: scale-free, so the annotation's and the store's pixels agree
            if not bool(((gold_iou > 0) & region_mask.bool()).any()):
                # no region to put the mass on (never region 0): kept as a phrase without target, so that Recall@k
                # counts it as the miss it is; counted and warned once
                self._count_unmatched()
                return torch.zeros(len(region_mask))
            return alignment_target_from_iou(gold_iou, region_mask, self.iou_threshold)
        return None  # a phrase without any box (e.g. Flickr30k's nobndbox) is not grounded

    def _count_unmatched(self) -> None:
        self.unmatched_phrases += 1
        if self.warn_unmatched and "unmatched" not in self._warned:
            self._warned.add("unmatched")
            logger.warning(
                "%s: a gold box overlaps no region of its image; the phrase (or expression) gets no alignment target "
                "(and counts as a miss in evaluation). Warned once; the count goes on in `unmatched_phrases`.",
                self._warning_source(),
            )

    def _checked_regions(self, i: int, regions: list, region_mask: torch.Tensor, batch: dict) -> torch.Tensor:
        """A `<text>_phrase_regions` row: one finite non-negative weight per region of the image, summing to 1."""
        column = f"{self.text_columns[0] if len(self.text_columns) == 1 else '<text>'}_phrase_regions"
        try:
            values = torch.as_tensor(_as_list(regions), dtype=torch.float32).flatten()
        except (TypeError, ValueError, RuntimeError):
            raise row_error(i, column, "lists of region weights (numbers)", regions) from None
        count = int(region_mask.sum())
        if len(values) > count:
            raise ValueError(
                f"`{column}` of batch row {i} must give at most one weight per region of its image ({count}), got "
                f"{len(values)}; were the rows joined with another region-feature store?"
            )
        total = float(values.sum()) if len(values) else 0.0
        if not bool(torch.isfinite(values).all()) or bool((values < 0).any()) or abs(total - 1.0) > 1e-3:
            raise ValueError(
                f"`{column}` of batch row {i} must be finite non-negative weights that sum to 1, got sum {total:.4g} "
                f"(min {float(values.min()) if len(values) else 0.0:.4g})."
            )
        target = torch.zeros(len(region_mask))
        target[: len(values)] = values
        return target

    def required_mask(self, offsets, in_sentence, span, example: dict, column: str, cut=()) -> torch.Tensor:
        """The tokens of a span. A span wholly cut by truncation (`cut`: the text's lost word pieces) gets the text's
        remaining tokens instead (counted in `truncation_stats`); a span with no token otherwise is an error."""
        mask = span_token_mask(offsets, in_sentence, span)
        if bool(mask.any()):
            return mask
        if span_is_cut(cut, span) and bool(in_sentence.any()):
            return in_sentence.clone()
        raise ValueError(
            f"`{column}_phrase_spans` (or the phrase span of `{column}`): the phrase at characters {list(span)} of "
            f"{column} {example[column]!r} (image {example['image_id']}) has no token after tokenisation; expected a "
            f"span covering a word inside the text (of length {len(example[column])})."
        )


def _labels(examples: list[dict], column: str, dtype=torch.long) -> torch.Tensor:
    return torch.tensor([example[column] for example in examples], dtype=dtype)


def phrases_gold_iou(golds: list[torch.Tensor], region_boxes: torch.Tensor) -> list[torch.Tensor | None]:
    """`gold_region_iou` of each phrase's gold boxes (G_p, 4) with the (R, 4) regions, None for a phrase without a
    box: one `box_iou` over every phrase's boxes (a text's dozen phrases cost one small matrix, not a dozen)."""
    sizes = [len(gold) for gold in golds]
    if not any(sizes):
        return [None] * len(golds)
    per_box = box_iou(torch.cat([gold for gold in golds if len(gold)]), region_boxes)
    best = iter(per_box.split([size for size in sizes if size]))
    return [next(best).amax(dim=0) if size else None for size in sizes]


def _all_zero(regions: object) -> bool:
    """Whether a `<text>_phrase_regions` row holds only zeros; False for a value that is no row, which
    `_checked_regions` then refuses by name."""
    try:
        return not any(_as_list(regions))
    except TypeError:
        return False
