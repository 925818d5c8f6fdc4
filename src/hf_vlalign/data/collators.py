"""Collators: builder rows + a `RegionFeatureStore` -> the DESIGN.md tensors of a batch, one per task family.

| collator | rows from | text | extra outputs |
|---|---|---|---|
| `CaptionCollator` | flickr30k_entities, visual_genome, coco_captions, synthetic_scenes | one caption | `labels` if a label column is named |
| `PhraseGroundingCollator` | flickr30k_entities, synthetic_scenes (captions) | one caption | `phrase_labels` (B, P, R) |
| `VGPCollator` | vgp | caption pair | `phrase1_mask`, `phrase2_mask`, `id_labels`, `vgp_labels` |
| `QuestionAnsweringCollator` | vqa_v2 (soft scores), gqa (one answer) | question | `labels` (B, num_answers) soft or (B,) |
| `ImagePairCollator` | nlvr2 | sentence | visual tensors with a pair axis: (B, 2, R, ...); `labels` |
| `ReferringExpressionCollator` | refcoco+ | expression | `labels` (best-IoU region), `target_region_iou` (B, R) |
| `CaptioningCollator` | coco_captions | caption as target | `labels` (B, T) with -100 padding, `decoder_attention_mask` |
| `PretrainingCollator` | gqa, synthetic_scenes (questions), captions | one text | masked words / objects, `matched_labels`, `answer_labels`, soft A* |
| `SentenceImagePretrainingCollator` | flickr30k_entities, coco_captions, synthetic_scenes (captions) | caption pair (or one) | masked words / regions, `sentence_image_labels` |

Regions are padded to the longest image of the batch, flagged by `visual_attention_mask`; boxes are normalised once,
by `alignment.boxes.normalize_boxes`, with the store's image size. Grounded phrases (`<text>_phrase_spans` with
`<text>_phrase_regions` from `load_dataset(..., region_features=store)`, or `<text>_phrase_boxes` matched here by IoU) give
`word_region_alignment` (B, T, R) and `phrase_masks` (B, P, T).

Truncation (`max_text_length`): one long row never stops a run. Texts are truncated the way the tokenizer does
(`truncation=True`: a caption pair loses word pieces from the longer caption first). A grounded phrase with a word
piece beyond the truncation (partly or wholly cut) loses its alignment: no `word_region_alignment` rows, no
`phrase_masks` / `phrase_labels` entry. A span a row cannot be trained without (`required_spans`: the VGP phrase pair)
is kept as far as it survives, or replaced by its caption's remaining tokens when wholly cut; such rows should be
removed before training with `drop_overlong_rows` (or `collator.drop_overlong_rows(dataset)`), which counts and warns.
Every collator counts what truncation cost in `truncation_stats` (`TruncationStats`: rows collated, rows truncated,
phrases cut, rows whose required span was cut) and warns once, with the counts, the first time it truncates.

Malformed rows (a missing column, a text that is not a string, a label that is not an int, a span outside its text,
`_phrase_boxes` not one per span, a NaN box, references given as one string) are refused with a `ValueError` naming the
batch row, the column, what was expected and what came (`check_row`). A gold box that overlaps no region of its image
gets no target (never region 0): its `phrase_labels` and `word_region_alignment` rows are zero (it stays in
`phrase_masks` and the probe targets, a miss for Recall@k), counted in `unmatched_phrases` and warned about once; a
referring expression whose box overlaps no region gets `labels` -100.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import datasets
import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from ..alignment.boxes import alignment_target, gold_region_iou, normalize_boxes
from ..alignment.soft_targets import SoftAlignmentTargets
from .feature_store import RegionFeatureStore

logger = logging.getLogger(__name__)

PROBE_KEYS = ("phrase_token_index", "phrase_region_iou", "region_confidence")
# region tensors the collators read but no model takes
REGION_ONLY_KEYS = ("region_boxes_pixels", "region_object_ids", "region_attr_ids")
# the batch entry (popped before the batch is returned) holding each row's word pieces lost to truncation
CUT_KEY = "_cut_word_pieces"


# ----------------------------------------------------------------------------------------------------------------
# Regions
# ----------------------------------------------------------------------------------------------------------------


def pad_regions(store: RegionFeatureStore, image_ids: Sequence[str]) -> dict[str, torch.Tensor]:
    """Region tensors of `image_ids`, padded to the longest: `visual_feats`, `visual_boxes` (normalised),
    `visual_attention_mask`, plus `region_boxes_pixels`, `region_confidence` (1 where the store has none) and the
    detector's `region_object_ids` / `region_attr_ids` (-1 where the store has none, and on padding)."""
    images = store.batch(image_ids, without=("features",))
    num_regions, batch_size = max(len(image["boxes"]) for image in images), len(images)
    feats = store.padded(image_ids, "features")  # one copy from the mapped buffers, the bulk of the bytes
    boxes = torch.tensor([0.0, 0.0, 1.0, 1.0]).repeat(batch_size, num_regions, 1)  # padding: a valid dummy box
    pixels = torch.zeros(batch_size, num_regions, 4)
    mask = torch.zeros(batch_size, num_regions, dtype=torch.long)
    confidence = torch.zeros(batch_size, num_regions)
    object_ids = torch.full((batch_size, num_regions), -1, dtype=torch.long)
    attr_ids = torch.full((batch_size, num_regions), -1, dtype=torch.long)
    for i, image in enumerate(images):
        if image["image_size"] is None:
            raise ValueError(
                f"image {image['image_id']!r} has no image size in the region-feature store {store.directory}; "
                "convert its features again with the image sizes (e.g. `image_sizes=`) so that boxes can be normalised."
            )
        count = len(image["boxes"])
        height, width = image["image_size"].tolist()
        boxes[i, :count] = normalize_boxes(image["boxes"], width, height)
        pixels[i, :count] = image["boxes"]
        mask[i, :count] = 1
        confidence[i, :count] = image["object_conf"] if image["object_conf"] is not None else 1.0
        if image["object_ids"] is not None:
            object_ids[i, :count] = torch.as_tensor(image["object_ids"]).reshape(count, -1)[:, 0]
        if image["attr_ids"] is not None:
            attr_ids[i, :count] = torch.as_tensor(image["attr_ids"]).reshape(count, -1)[:, 0]
    return {
        "visual_feats": feats,
        "visual_boxes": boxes,
        "visual_attention_mask": mask,
        "region_boxes_pixels": pixels,
        "region_confidence": confidence,
        "region_object_ids": object_ids,
        "region_attr_ids": attr_ids,
    }


def store_image_id(
    store: RegionFeatureStore, example: dict, id_column: str = "image_id", row_column: str = "feature_row"
) -> str:
    """The row's image as the store names it: its `image_id` when the store has it, else the store row
    `load_dataset(..., region_features=store)` matched it to (`feature_row`; e.g. COCO id "581857" stored as
    "COCO_train2014_000000581857")."""
    image_id, row = example[id_column], example.get(row_column)
    if image_id in store or row is None:
        return image_id  # a missing image without a row fails in `pad_regions`, naming it
    if isinstance(row, bool) or not isinstance(row, numbers.Integral) or not 0 <= row < len(store):
        raise ValueError(
            f"`{row_column}` of image {image_id!r} must be a row of the region-feature store (0 to "
            f"{len(store) - 1}), got {row!r}; were the rows joined with another store?"
        )
    store_id = store.image_id_at(int(row))
    if not _names_same_image(str(image_id), store_id):
        raise ValueError(
            f"`image_id` {image_id!r} is not in the region-feature store, and its `{row_column}` {row} is the image "
            f"{store_id!r}, not the same id in another naming; were the rows joined with another store?"
        )
    return store_id


def span_token_mask(offsets: torch.Tensor, in_sentence: torch.Tensor, span) -> torch.Tensor:
    """Tokens of one sentence (`in_sentence`, (T,) bool) whose character offsets overlap [span[0], span[1])."""
    start, end = int(span[0]), int(span[1])
    overlaps = (offsets[:, 0] < end) & (offsets[:, 1] > start) & (offsets[:, 1] > offsets[:, 0])
    return in_sentence & overlaps


# ----------------------------------------------------------------------------------------------------------------
# Truncation
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TruncationStats:
    """What truncating texts to `max_text_length` cost: counted by a collator over the rows it collates (its
    `truncation_stats`; a row collated in several epochs or evaluations counts each time), or by `drop_overlong_rows`
    over a dataset.

    Attributes:
        rows: rows seen.
        rows_truncated: rows whose text (or caption pair) lost at least one word piece.
        phrases_cut: grounded phrases (with a gold box or region weights) that lost a word piece: their alignment is
            dropped.
        required_spans_cut: rows whose required span (e.g. VGP's phrase pair) lost a word piece.
        rows_dropped: rows removed (by `drop_overlong_rows`: those whose required span was cut; a collator never drops
            a row).
    """

    rows: int = 0
    rows_truncated: int = 0
    phrases_cut: int = 0
    required_spans_cut: int = 0
    rows_dropped: int = 0

    def __add__(self, other: TruncationStats) -> TruncationStats:
        if not isinstance(other, TruncationStats):
            return NotImplemented
        return TruncationStats(**{name: getattr(self, name) + getattr(other, name) for name in self.to_dict()})

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def check_max_text_length(tokenizer: PreTrainedTokenizerBase, max_text_length: int, num_texts: int) -> None:
    """`max_text_length` must leave at least one word piece to each text beside the special tokens."""
    smallest = tokenizer.num_special_tokens_to_add(pair=num_texts == 2) + num_texts
    if isinstance(max_text_length, bool) or not isinstance(max_text_length, int) or max_text_length < smallest:
        raise ValueError(
            f"`max_text_length` must be an int >= {smallest} (the special tokens plus one word piece per text, "
            f"{num_texts} text(s)), got {max_text_length!r}."
        )


def cut_word_pieces(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[Sequence[str]], encoding, max_text_length: int
) -> list[list[list[tuple[int, int]]]]:
    """The word pieces truncation removed. `encoding` is the tokenizer's output for `texts` (per row, its one text or
    its pair) with `truncation=True, max_length=max_text_length`; returns, per row and per text, the character offsets
    (start, end) of the word pieces that did not fit (an empty list for a whole text)."""
    attention = encoding["attention_mask"]
    lengths = attention.sum(-1).tolist() if isinstance(attention, torch.Tensor) else [sum(row) for row in attention]
    cuts: list[list[list[tuple[int, int]]]] = [[[] for _ in row] for row in texts]
    full_rows = [i for i, length in enumerate(lengths) if length >= max_text_length]  # only these can be truncated
    if not full_rows:
        return cuts
    whole = tokenizer(
        [text for i in full_rows for text in texts[i]], add_special_tokens=False, return_offsets_mapping=True
    )["offset_mapping"]
    position = 0
    for i in full_rows:
        sequence_ids = encoding.sequence_ids(i)
        for k in range(len(texts[i])):
            offsets, position = whole[position], position + 1
            kept = sum(1 for sequence_id in sequence_ids if sequence_id == k)
            lost = offsets[kept:] if tokenizer.truncation_side == "right" else offsets[: len(offsets) - kept]
            cuts[i][k] = [(int(start), int(end)) for start, end in lost]
    return cuts


def span_is_cut(cut: Sequence[tuple[int, int]], span) -> bool:
    """Whether a character span [span[0], span[1]) overlaps one of the word pieces truncation removed (`cut`)."""
    start, end = int(span[0]), int(span[1])
    return any(piece_start < end and piece_end > start and piece_end > piece_start for piece_start, piece_end in cut)


def is_grounded_phrase(example: Mapping, column: str, index: int) -> bool:
    """Whether phrase `index` of `column` has gold boxes (`<column>_phrase_boxes`) or region weights
    (`<column>_phrase_regions`): the phrases that give alignment targets."""
    boxes = example.get(f"{column}_phrase_boxes")
    regions = example.get(f"{column}_phrase_regions")
    has_boxes = boxes is not None and index < len(boxes) and bool(boxes[index])
    has_regions = regions is not None and index < len(regions) and regions[index] is not None and any(regions[index])
    return has_boxes or has_regions


def row_truncation(
    example: Mapping,
    cut: Sequence[Sequence[tuple[int, int]]],
    text_columns: Sequence[str],
    required_spans: Mapping[str, str],
) -> TruncationStats:
    """The truncation counts of one row, from the word pieces `cut` from each of its `text_columns`."""
    if not any(cut):
        return TruncationStats(rows=1)
    phrases_cut = 0
    for k, column in enumerate(text_columns):
        for p, span in enumerate(example.get(f"{column}_phrase_spans") or []):
            phrases_cut += is_grounded_phrase(example, column, p) and span_is_cut(cut[k], span)
    required_cut = any(
        span_is_cut(cut[list(text_columns).index(column)], example[span_column])
        for span_column, column in required_spans.items()
    )
    return TruncationStats(rows=1, rows_truncated=1, phrases_cut=phrases_cut, required_spans_cut=int(required_cut))


def drop_overlong_rows(
    dataset: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_text_length: int,
    *,
    text_columns: Sequence[str] = ("sentence",),
    required_spans: Mapping[str, str] | None = None,
    where: str = "dataset",
    batch_size: int = 1000,
) -> tuple[datasets.Dataset, TruncationStats]:
    """Removes the rows that cannot be trained once their texts are truncated to `max_text_length` word pieces: those
    whose required span (`required_spans`, {span column: the text column it indexes}, e.g. VGP's
    {"phrase1_span": "caption1", "phrase2_span": "caption2"}) loses a word piece. The other rows are kept as they are:
    the collators truncate them and drop the alignment of their cut phrases. Texts are tokenised as the collators do
    (`text_columns`: one text, or a pair encoded together, `truncation=True`).

    `collator.drop_overlong_rows(dataset)` passes a collator's own tokenizer, `max_text_length`, text columns and
    required spans. Returns the kept rows and the counts (rows, rows truncated, grounded phrases cut, required spans
    cut = rows dropped), logged as a warning (naming `where`) when anything is truncated.

    Raises:
        ValueError: on a bad argument, or when no row is left.
    """
    required_spans = dict(required_spans or {})
    text_columns = tuple(text_columns) if not isinstance(text_columns, str) else (text_columns,)
    _check_filter_arguments(dataset, tokenizer, max_text_length, text_columns, required_spans, batch_size)
    phrase_columns = [
        name
        for column in text_columns
        for name in (f"{column}_phrase_spans", f"{column}_phrase_boxes", f"{column}_phrase_regions")
        if name in dataset.column_names
    ]
    needed = dataset.select_columns([*text_columns, *required_spans, *phrase_columns])
    stats, kept = TruncationStats(), []
    for start in range(0, len(needed), batch_size):
        columns = needed[start : start + batch_size]
        examples = [dict(zip(columns, values)) for values in zip(*columns.values())]
        texts = [[example[column] for column in text_columns] for example in examples]
        encoding = tokenizer(*[list(column) for column in zip(*texts)], truncation=True, max_length=max_text_length)
        cuts = cut_word_pieces(tokenizer, texts, encoding, max_text_length)
        for offset, (example, cut) in enumerate(zip(examples, cuts)):
            row = row_truncation(example, cut, text_columns, required_spans)
            stats = stats + row
            if not row.required_spans_cut:
                kept.append(start + offset)
    stats.rows_dropped = len(dataset) - len(kept)
    if stats.rows_truncated:
        logger.warning(
            "%s: %d of %d rows are longer than max_text_length=%d word pieces and are truncated; %d grounded "
            "phrase(s) cut lose their alignment; %d row(s) whose required span (%s) is cut are dropped.",
            where, stats.rows_truncated, stats.rows, max_text_length, stats.phrases_cut, stats.rows_dropped,
            ", ".join(required_spans) or "none",
        )  # fmt: skip
    if len(dataset) and not kept:
        raise ValueError(
            f"{where}: every one of the {len(dataset)} rows loses a required span ({', '.join(required_spans)}) to "
            f"truncation at max_text_length={max_text_length}; raise `max_text_length`."
        )
    return (dataset.select(kept) if stats.rows_dropped else dataset), stats


def _check_filter_arguments(dataset, tokenizer, max_text_length, text_columns, required_spans, batch_size) -> None:
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"`dataset` must be a datasets.Dataset, got {type(dataset).__name__}.")
    if not isinstance(tokenizer, PreTrainedTokenizerBase) or not tokenizer.is_fast:
        raise ValueError(
            f"`tokenizer` must be a fast tokenizer (character offsets are needed), got {type(tokenizer).__name__}."
        )
    if len(text_columns) not in (1, 2):
        raise ValueError(f"`text_columns` must name one text or a pair, got {text_columns}.")
    check_max_text_length(tokenizer, max_text_length, len(text_columns))
    missing = [name for name in (*text_columns, *required_spans) if name not in dataset.column_names]
    if missing:
        raise ValueError(
            f"`dataset` lacks the column(s) {missing} (`text_columns` / `required_spans`); it has {dataset.column_names}."
        )
    unknown = {span: column for span, column in required_spans.items() if column not in text_columns}
    if unknown:
        raise ValueError(
            f"`required_spans` must map span columns to one of `text_columns` {list(text_columns)}, got {unknown}."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}.")


# ----------------------------------------------------------------------------------------------------------------
# Row checks: a malformed row is refused naming its batch row, its column, what was expected and what came
# ----------------------------------------------------------------------------------------------------------------


def _as_list(value: object) -> object:
    """Arrays and tensors (rows of a dataset in numpy or torch format) as the lists the checks read."""
    return value.tolist() if isinstance(value, (np.ndarray, torch.Tensor)) else value


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def row_error(index: int, column: str, expected: str, got: object) -> ValueError:
    return ValueError(f"batch row {index}: `{column}` must be {expected}, got {_shown(got)}.")


def check_row_columns(index: int, example: Mapping, columns: Sequence[str], collator: str) -> None:
    if not isinstance(example, Mapping):
        raise ValueError(f"batch row {index} must be a dict of columns for {collator}, got {_shown(example)}.")
    missing = [column for column in columns if column not in example]
    if missing:
        raise ValueError(
            f"rows must have the columns {missing} for {collator}; batch row {index} has {sorted(map(str, example))}."
        )


def check_row_text(index: int, example: Mapping, column: str) -> None:
    if not isinstance(example[column], str):
        raise row_error(index, column, "a string", example[column])


def check_row_int(index: int, example: Mapping, column: str) -> None:
    value = example[column]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise row_error(index, column, "an int label", value)


def check_row_span(index: int, column: str, span: object, text: str) -> None:
    """A character span [start, end) of `text`: two ints, 0 <= start <= end <= len(text) (an empty span is refused
    later, by `required_mask`, as a span without tokens)."""
    span = _as_list(span)
    if (
        isinstance(span, (str, bytes, Mapping))
        or not isinstance(span, Sequence)
        or len(span) != 2
        or any(isinstance(value, bool) or not isinstance(value, numbers.Integral) for value in span)
    ):
        raise row_error(index, column, "a character span [start, end] of two ints", span)
    if not 0 <= span[0] <= span[1] <= len(text):
        raise row_error(index, column, f"a span with 0 <= start <= end <= {len(text)} (the text's length)", list(span))


def check_row_list(
    index: int, column: str, value: object, length: int | None = None, what: str = "a list", per: str = "phrase span"
) -> None:
    value = _as_list(value)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise row_error(index, column, what, value)
    if length is not None and len(value) != length:
        raise row_error(index, column, f"{what} of {length} (one per {per})", value)


def check_row_phrases(index: int, example: Mapping, column: str) -> None:
    """`<column>_phrase_spans` (character spans of the text), `_phrase_boxes` and `_phrase_regions` (one entry per
    span) when the row has them."""
    spans = _as_list(example.get(f"{column}_phrase_spans"))
    if spans is None:
        return
    check_row_list(index, f"{column}_phrase_spans", spans, what="a list of character spans")
    for span in spans:
        check_row_span(index, f"{column}_phrase_spans", span, example[column])
    for suffix in ("_phrase_boxes", "_phrase_regions"):
        if example.get(f"{column}{suffix}") is not None:
            check_row_list(index, f"{column}{suffix}", example[f"{column}{suffix}"], len(spans), "a list")


def check_answer_columns(index: int, example: Mapping, first: Mapping, collator: str) -> None:
    """The answer columns the batch's `first` row has, in every row: VQA soft scores (`labels`: answer ids, `scores`:
    one score in [0, 1] per id), or GQA's single `label` (an int)."""
    if "scores" in first:
        check_row_columns(index, example, ("labels", "scores"), "VQA soft scores")
        check_row_list(index, "labels", example["labels"], what="a list of answer ids")
        check_row_list(index, "scores", example["scores"], len(example["labels"]), "a list of scores in [0, 1]", "answer id")
        for score in _as_list(example["scores"]):
            if isinstance(score, bool) or not isinstance(score, numbers.Real) or not 0 <= score <= 1:
                raise row_error(index, "scores", "a list of scores in [0, 1] (one per answer id)", example["scores"])
    elif "label" in first:
        check_row_columns(index, example, ("label",), collator)
        check_row_int(index, example, "label")


def gold_boxes(index: int, column: str, gold: object) -> torch.Tensor:
    """One phrase's gold boxes (x1, y1, x2, y2 in pixels) as a (G, 4) tensor; None or [] is no box."""
    if gold is None:
        return torch.zeros(0, 4)
    try:
        boxes = torch.tensor(gold, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise row_error(index, column, "lists of [x1, y1, x2, y2] pixel boxes (numbers)", gold) from None
    if boxes.numel() % 4 or not bool(torch.isfinite(boxes).all()):
        raise row_error(index, column, "lists of 4 finite numbers [x1, y1, x2, y2] per box", gold)
    return boxes.reshape(-1, 4)


# ----------------------------------------------------------------------------------------------------------------
# The shared collator
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RegionTextCollator:
    """Tokenises `text_columns` (one text, or a pair encoded `[CLS] a [SEP] b [SEP]`), adds the regions of each row's
    image and the word-region alignment of its grounded phrases. Task collators add their labels in `task_tensors`.

    With `return_probe_targets`, the batch also carries what the grounding probe needs (`PROBE_KEYS`): each phrase's
    last sub-word, its regions' IoU with the gold boxes, and the detector confidence of each region.

    Texts longer than `max_text_length` word pieces are truncated, never refused: a grounded phrase that loses a word
    piece loses its alignment, and `truncation_stats` counts what was cut (see the module docstring).
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
    _warned: set = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.region_features, RegionFeatureStore):
            raise ValueError(
                f"`region_features` must be a RegionFeatureStore, got {type(self.region_features).__name__} "
                "(open one with RegionFeatureStore.load(directory))."
            )
        if not self.tokenizer.is_fast:
            raise ValueError("`tokenizer` must be a fast tokenizer (character offsets are needed to find phrase tokens).")
        if len(self.text_columns) not in (1, 2):
            raise ValueError(f"`text_columns` must name one text or a pair, got {self.text_columns}.")
        check_max_text_length(self.tokenizer, self.max_text_length, len(self.text_columns))

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("`examples` must hold at least one example, got an empty batch.")
        for index, example in enumerate(examples):
            self.check_row(index, example)
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
        stats, name = self.truncation_stats, type(self).__name__
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
            for p, (span, gold) in enumerate(zip(spans, boxes)):
                if span_is_cut(cut, span):
                    continue  # a word piece lost to truncation: the phrase keeps no alignment (`truncation_stats`)
                mask = self.required_mask(offsets, sequence_ids == sequence, span, example, column)
                gold = gold_boxes(i, f"{column}_phrase_boxes", gold)
                iou = gold_region_iou(gold, pixels) * region_mask if len(gold) else torch.zeros(len(region_mask))
                target = self.phrase_target(i, example[column][span[0] : span[1]], gold, None if regions is None else regions[p], batch)
                if target is not None:
                    phrases.append((mask, target, iou))
        return phrases

    def phrase_target(self, i: int, phrase: str, gold: torch.Tensor, regions: list | None, batch: dict) -> torch.Tensor | None:
        """Alignment row of one phrase of example `i` over its regions; None when the phrase is not grounded."""
        region_mask = batch["visual_attention_mask"][i]
        if regions is not None:  # built against the store by `load_dataset(..., region_features=store)`
            if not len(gold) and not any(regions):  # a phrase without a box (GQA without scene graphs): all zeros
                return None
            return self._checked_regions(i, regions, region_mask, batch)
        if len(gold):  # IoU in pixels: scale-free, so the annotation's and the store's pixels agree
            if not self._overlaps_a_region(gold, batch["region_boxes_pixels"][i], region_mask):
                # no region to put the mass on (never region 0 by default): kept as a phrase without target, so that
                # Recall@k counts it as the miss it is; counted and warned once
                return torch.zeros(len(region_mask))
            return alignment_target(gold, batch["region_boxes_pixels"][i], region_mask, self.iou_threshold)
        return None  # a phrase without any box (e.g. Flickr30k's nobndbox) is not grounded

    def _overlaps_a_region(self, gold: torch.Tensor, pixels: torch.Tensor, region_mask: torch.Tensor) -> bool:
        """Whether a gold box overlaps a real region; counts (`unmatched_phrases`) and warns once when none does."""
        if bool(((gold_region_iou(gold, pixels) > 0) & region_mask.bool()).any()):
            return True
        self._count_unmatched()
        return False

    def _count_unmatched(self) -> None:
        self.unmatched_phrases += 1
        if "unmatched" not in self._warned:
            self._warned.add("unmatched")
            logger.warning(
                "%s: a gold box overlaps no region of its image; the phrase (or expression) gets no alignment target "
                "(and counts as a miss in evaluation). Warned once; the count goes on in `unmatched_phrases`.",
                type(self).__name__,
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


def _names_same_image(image_id: str, store_id: str) -> bool:
    """Whether a store id names a dataset's image in another convention: COCO's "581857" and
    "COCO_train2014_000000581857" (the same number, zero-padded), or an id inside a template such as "581857.jpg"."""
    if image_id.isdigit():
        trailing = re.search(r"(\d+)\D*$", store_id)
        return trailing is not None and int(trailing.group(1)) == int(image_id)
    return image_id in store_id


def _labels(examples: list[dict], column: str, dtype=torch.long) -> torch.Tensor:
    return torch.tensor([example[column] for example in examples], dtype=dtype)


# ----------------------------------------------------------------------------------------------------------------
# Masking (the pre-training collators)
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Task families
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CaptionCollator(RegionTextCollator):
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


@dataclass
class QuestionAnsweringCollator(RegionTextCollator):
    """Question rows. VQA's soft scores (`labels` + `scores` lists) become `labels` (B, num_answers) float; GQA's single
    `label` becomes `labels` (B,), with -100 for answers outside the vocabulary (ignored by the loss)."""

    text_columns: tuple[str, ...] = ("question",)
    num_answers: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.num_answers, int) or self.num_answers < 1:
            raise ValueError(f"`num_answers` must be the size of the answer vocabulary (>= 1), got {self.num_answers!r}.")

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        for index, example in enumerate(examples):
            check_answer_columns(index, example, examples[0], type(self).__name__)
        if "scores" in examples[0]:
            targets = torch.zeros(len(examples), self.num_answers)
            for i, example in enumerate(examples):
                for label, score in zip(example["labels"], example["scores"]):
                    targets[i, self._checked(label)] = score
            tensors["labels"] = targets
        elif "label" in examples[0]:
            tensors["labels"] = torch.tensor([self._checked(e["label"]) if e["label"] >= 0 else -100 for e in examples])
        return tensors

    def _checked(self, label: int) -> int:
        return _checked_answer(label, self.num_answers)


@dataclass
class ImagePairCollator(RegionTextCollator):
    """NLVR2 rows: one sentence, two images. Region tensors get a pair axis: `visual_feats` (B, 2, R, Dv),
    `visual_boxes` (B, 2, R, 4), `visual_attention_mask` (B, 2, R); `labels` (B,)."""

    image_columns: tuple[str, str] = ("left_image_id", "right_image_id")

    def required_columns(self) -> tuple[str, ...]:
        return (*self.image_columns, *self.text_columns, "label")

    def check_row(self, index: int, example: dict) -> None:
        super().check_row(index, example)
        check_row_int(index, example, "label")

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
            expected = "a list of reference captions (strings)"
            check_row_list(index, self.reference_column, references, what=expected)
            if not references or not all(isinstance(reference, str) for reference in references):
                raise row_error(index, self.reference_column, f"a non-empty {expected[2:]}", references)

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

@dataclass
class PretrainingCollator(RegionTextCollator):
    """Two-stream pre-training batches (LXMERT; Kervadec et al. 2020, sec. 4): one text per row (a question with
    pointers, or a caption) with its image, then

    - image-sentence matching: with probability `mismatch_probability` the row's image is replaced by another image
      of the store (`matched_labels` 0); a mismatched row keeps no alignment and no answer;
    - masked words: BERT's 15 % masking (80 % [MASK], 10 % random, 10 % kept) through transformers'
      `DataCollatorForLanguageModeling`; `labels` holds the targets, -100 elsewhere;
    - masked objects: each real region with probability `object_mask_probability` (LXMERT: 80 % of them zeroed,
      10 % replaced by another region's feature, 10 % kept); `object_labels` / `attribute_labels` are the detector's
      class / attribute of the masked regions (-100 elsewhere, or where the store has none), `feature_labels` the
      original features and `masked_regions` the mask;
    - answers: `answer_labels` (B,) from a `label` column (-100 when absent, unknown or mismatched), or (B, A) soft
      scores from VQA's `labels` / `scores` columns (all zero on mismatched rows), when `num_answers` > 0;
    - `word_region_alignment`: the soft targets A* of eqs. 15-18 when `soft_targets` is given (the store must have
      detector class ids), else the IoU targets of the other collators.

    Set the three probabilities to 0 for evaluation batches (nothing masked, every image matched).
    """

    text_columns: tuple[str, ...] = ("question",)
    mlm_probability: float = 0.15
    object_mask_probability: float = 0.15
    mismatch_probability: float = 0.5
    num_answers: int = 0
    soft_targets: SoftAlignmentTargets | None = None

    def __post_init__(self):
        super().__post_init__()
        for name in ("mlm_probability", "object_mask_probability", "mismatch_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {value!r}.")
        if not isinstance(self.num_answers, int) or self.num_answers < 0:
            raise ValueError(f"`num_answers` must be the answer vocabulary size (0 for no answers), got {self.num_answers!r}.")
        if self.mismatch_probability > 0 and len(self.region_features) < 2:
            raise ValueError("`mismatch_probability` > 0 needs a region-feature store of at least two images.")
        self._masker = word_masker(self.tokenizer, self.mlm_probability)
        self._image_ids = self.region_features.image_ids  # the candidates of a mismatched image, listed once

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("`examples` must hold at least one example, got an empty batch.")
        for index, example in enumerate(examples):
            self.check_row(index, example)
        mismatched = (torch.rand(len(examples)) < self.mismatch_probability).tolist()
        return super().__call__([self._with_image(example, swap) for example, swap in zip(examples, mismatched)])

    def _with_image(self, example: dict, swap: bool) -> dict:
        """The row itself (matched), or the row with another image and none of its grounding (mismatched)."""
        if not swap:
            return {**example, "_matched": True}
        other = self._image_ids[int(torch.randint(len(self._image_ids) - 1, ()))]
        other = other if other != example["image_id"] else self._image_ids[-1]
        ungrounded = {key: [] for key in example if key.endswith(("_phrase_spans", "_phrase_boxes", "_phrase_regions"))}
        return {**example, **ungrounded, "image_id": other, "_matched": False}

    def task_tensors(self, examples, encoding, batch):
        matched = torch.tensor([example["_matched"] for example in examples])
        tensors = self.grounding_tensors(examples, encoding, batch)
        tensors["matched_labels"] = matched.long()
        tensors.update(self._masked_words(batch["input_ids"]))
        tensors.update(self._masked_objects(batch))
        if self.num_answers:
            tensors["answer_labels"] = self._answer_labels(examples, matched)
        return tensors

    def phrase_target(self, i, phrase, gold, regions, batch):
        if self.soft_targets is None or not len(gold):
            return super().phrase_target(i, phrase, gold, regions, batch)
        region_mask = batch["visual_attention_mask"][i].bool()
        object_ids = batch["region_object_ids"][i][region_mask]
        if bool((object_ids < 0).any()):
            raise ValueError(
                f"soft alignment targets need the detector's class ids, but the region-feature store "
                f"{self.region_features.directory} has none for the image of batch row {i}."
            )
        attr_ids = batch["region_attr_ids"][i][region_mask]
        target = torch.zeros(len(region_mask))
        target[region_mask] = self.soft_targets(
            phrase,
            gold,
            batch["region_boxes_pixels"][i][region_mask],
            object_ids,
            attr_ids if self.soft_targets.attribute_vectors is not None and bool((attr_ids >= 0).all()) else None,
        )
        return target if float(target.sum()) > 0 else None

    def _masked_words(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return mask_words(self._masker, input_ids, self.mlm_probability)

    def _masked_objects(self, batch: dict) -> dict[str, torch.Tensor]:
        return mask_regions(batch, self.object_mask_probability)  # LXMERT's 80 % zeroed, 10 % replaced, 10 % kept

    def _answer_labels(self, examples: list[dict], matched: torch.Tensor) -> torch.Tensor:
        if "scores" not in examples[0] and "label" not in examples[0]:
            raise ValueError(f"rows must have a `label` (or VQA `labels`/`scores`) column when `num_answers` > 0; got {sorted(examples[0])}.")
        for index, example in enumerate(examples):
            check_answer_columns(index, example, examples[0], type(self).__name__)
        if "scores" in examples[0]:
            targets = torch.zeros(len(examples), self.num_answers)
            for i, example in enumerate(examples):
                for label, score in zip(example["labels"], example["scores"]):
                    targets[i, _checked_answer(label, self.num_answers)] = score if bool(matched[i]) else 0.0
            return targets
        return torch.tensor([
            _checked_answer(example["label"], self.num_answers) if bool(matched[i]) and example["label"] >= 0 else -100
            for i, example in enumerate(examples)
        ])  # fmt: skip


def group_captions_by_image(
    rows: datasets.Dataset | Sequence[Mapping], text_column: str = "sentence"
) -> dict[str, list[str]]:
    """{image id: its captions, in row order} from caption rows (a dataset or a list of rows with `image_id` and
    `text_column`): the pool from which `SentenceImagePretrainingCollator` draws second captions."""
    if isinstance(rows, datasets.Dataset):
        missing = [name for name in ("image_id", text_column) if name not in rows.column_names]
        if missing:
            raise ValueError(f"caption rows must have the columns {missing}; got {rows.column_names}.")
        rows = ({"image_id": image_id, text_column: text} for image_id, text in zip(rows["image_id"], rows[text_column]))
    grouped: dict[str, list[str]] = {}
    for index, row in enumerate(rows):
        if "image_id" not in row or text_column not in row:
            raise ValueError(
                f"caption row {index} must have the columns `image_id` and `{text_column}`; got {sorted(row)}."
            )
        grouped.setdefault(str(row["image_id"]), []).append(row[text_column])
    return grouped


@dataclass
class SentenceImagePretrainingCollator(RegionTextCollator):
    """VisualBERT's pre-training batches (Li et al. 2019, sec. 3.3) for `SingleStreamForPreTraining`, from caption
    rows (one row per caption, with `image_id` and `text_column`; e.g. flickr30k_entities, coco_captions or the
    synthetic scenes' captions):

    - sentence-image prediction (`paired=True`, task-agnostic pre-training): the text is `[CLS] c1 [SEP] c2 [SEP]`, c1
      the row's caption and c2, with probability `random_caption_probability`, a caption of a random other image
      (`sentence_image_labels` 1), else another caption of the row's image (0: transformers' VisualBERT convention),
      drawn from `captions_by_image` ({image id: captions}, or the caption dataset itself, grouped here);
    - `paired=False` (task-specific pre-training on a task's own texts): the row's text alone, masked words only, no
      `sentence_image_labels`;
    - masked words, on both captions: BERT's 15 % (80 % [MASK], 10 % random, 10 % kept) through transformers'
      `DataCollatorForLanguageModeling`; `labels` holds the original ids of the masked tokens, -100 elsewhere. A batch
      in which no word was drawn gets one masked word ([MASK]), so every batch has a masked-word loss;
    - masked regions, with `region_mask_probability` > 0 (VL-BERT's masked RoI modelling; 0, the default, is
      VisualBERT): each real region is masked with that probability and its features zeroed; `masked_regions` (B, R),
      `feature_labels` (the original features) and, with `return_object_labels`, `object_labels` (the store's detector
      class of each masked region, -100 elsewhere or where the store has none);
    - the grounded phrases of c1 (rows with phrase spans and boxes or regions) give `word_region_alignment` and
      `phrase_masks`, for attention supervision alongside; c2's phrases are not used.

    Random draws come from torch's RNG (the trainers seed the collation of each training batch). With `seed` set,
    every batch is collated with the RNG seeded from `seed` and the batch's rows (image ids and texts), so that an
    evaluation batch is masked and paired the same way at every evaluation, and for a reloaded model.
    """

    # derived from `text_column` and `paired`: the row's text, then the drawn second caption
    text_columns: tuple[str, ...] = field(default=("sentence",), init=False)
    text_column: str = "sentence"
    captions_by_image: Mapping[str, Sequence[str]] | datasets.Dataset | None = None
    paired: bool = True
    random_caption_probability: float = 0.5
    mlm_probability: float = 0.15
    region_mask_probability: float = 0.0
    return_object_labels: bool = True
    seed: int | None = None

    second_text_column: ClassVar[str] = "_second_caption"

    @property
    def dataset_text_columns(self) -> tuple[str, ...]:
        """The row's caption (the second caption is drawn at collation, so `drop_overlong_rows` counts the first
        alone; the pairs' truncation is counted in `truncation_stats`)."""
        return (self.text_column,)

    def __post_init__(self):
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(
                f"`text_column` must name the rows' caption column (e.g. 'sentence'), got {self.text_column!r}."
            )
        self.text_columns = (self.text_column, self.second_text_column) if self.paired else (self.text_column,)
        super().__post_init__()
        for name in ("random_caption_probability", "mlm_probability", "region_mask_probability"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
                raise ValueError(f"`{name}` must be a probability in [0, 1], got {value!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"`seed` must be an int (or None to use torch's current RNG), got {self.seed!r}.")
        self._masker = word_masker(self.tokenizer, self.mlm_probability)
        self._captions = self._caption_pool() if self.paired else {}
        self._pool_ids = list(self._captions)
        self._pool_index = {image_id: index for index, image_id in enumerate(self._pool_ids)}

    def _caption_pool(self) -> dict[str, list[str]]:
        pool = self.captions_by_image
        if pool is None:
            raise ValueError(
                "`captions_by_image` is required with `paired=True` (the second captions are drawn from it): pass "
                "{image id: captions} or the caption dataset; or `paired=False` for masked words alone."
            )
        if isinstance(pool, datasets.Dataset):
            pool = group_captions_by_image(pool, self.text_column)
        if not isinstance(pool, Mapping):
            raise ValueError(
                f"`captions_by_image` must be a mapping {{image id: captions}} or a dataset, got {type(pool).__name__}."
            )
        grouped = {}
        for image_id, captions in pool.items():
            if isinstance(captions, str) or not all(isinstance(caption, str) for caption in captions):
                raise ValueError(
                    f"`captions_by_image[{image_id!r}]` must be a list of caption strings, got {captions!r}."
                )
            grouped[str(image_id)] = list(captions)
        if self.random_caption_probability > 0 and len(grouped) < 2:
            raise ValueError(
                f"`captions_by_image` must hold at least two images to draw random captions "
                f"(`random_caption_probability`={self.random_caption_probability}), got {len(grouped)}."
            )
        if self.random_caption_probability < 1:
            single = [image_id for image_id, captions in grouped.items() if len(set(captions)) < 2]
            if single:
                raise ValueError(
                    f"every image of `captions_by_image` must have at least two different captions (a same-image pair "
                    f"needs another caption), but {len(single)} of {len(grouped)} have fewer, e.g. {single[:3]}; leave "
                    "those images out, or set `random_caption_probability`=1."
                )
        return grouped

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("`examples` must hold at least one example, got an empty batch.")
        if self.seed is None:
            return self._collate(examples)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._batch_seed(examples))
            return self._collate(examples)

    def _collate(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if self.paired:
            examples = [self._with_second_caption(index, example) for index, example in enumerate(examples)]
        return super().__call__(examples)

    def _batch_seed(self, examples: list[dict]) -> int:
        """A seed from `seed` and the batch's rows, the same in every process (unlike Python's salted `hash`)."""
        key = "\x1f".join([str(self.seed), *(f"{e.get('image_id')}\x1e{e.get(self.text_column)}" for e in examples)])
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") % 2**63

    def _with_second_caption(self, index: int, example: dict) -> dict:
        """The row with a second caption (`second_text_column`) and whether it is a random one (`_random_caption`)."""
        missing = [name for name in ("image_id", self.text_column) if name not in example]
        if missing:
            raise ValueError(f"batch row {index} must have the columns {missing}; got {sorted(example)}.")
        image_id, caption = str(example["image_id"]), example[self.text_column]
        own = self._pool_index.get(image_id)
        if own is None:
            raise ValueError(
                f"the image {image_id!r} of batch row {index} is not in `captions_by_image` ({len(self._pool_ids)} "
                "images); build it from the same caption rows (e.g. `group_captions_by_image(dataset)`)."
            )
        random_caption = bool(torch.rand(()) < self.random_caption_probability)
        if random_caption:
            other = int(torch.randint(len(self._pool_ids) - 1, ()))
            candidates = self._captions[self._pool_ids[other + (other >= own)]]
        else:
            candidates = [other for other in self._captions[image_id] if other != caption]
            if not candidates:
                raise ValueError(
                    f"the image {image_id!r} of batch row {index} has no caption other than {caption!r} in "
                    "`captions_by_image`; a same-image pair needs two different captions."
                )
        second = candidates[int(torch.randint(len(candidates), ()))]
        return {**example, self.second_text_column: second, "_random_caption": random_caption}

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        if self.paired:
            tensors["sentence_image_labels"] = torch.tensor([int(example["_random_caption"]) for example in examples])
        tensors.update(self._masked_words(batch["input_ids"], batch["attention_mask"]))
        if self.region_mask_probability > 0:
            regions = mask_regions(batch, self.region_mask_probability, zero_fraction=1.0, replace_fraction=0.0)
            regions.pop("attribute_labels")
            if not self.return_object_labels:
                regions.pop("object_labels")
            tensors.update(regions)
        return tensors

    def _masked_words(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        words = mask_words(self._masker, input_ids, self.mlm_probability)
        if self.mlm_probability == 0 or bool((words["labels"] != -100).any()):
            return words
        special = torch.tensor(self.tokenizer.all_special_ids)
        maskable = (attention_mask.bool() & ~torch.isin(input_ids, special)).nonzero()
        if len(maskable):  # none drawn: mask one word, so that the batch has a masked-word loss
            row, position = maskable[int(torch.randint(len(maskable), ()))].tolist()
            words["labels"][row, position] = input_ids[row, position]
            words["input_ids"][row, position] = self.tokenizer.mask_token_id
        return words


def _checked_answer(label: int, num_answers: int) -> int:
    if not isinstance(label, numbers.Integral) or isinstance(label, bool) or not 0 <= label < num_answers:
        raise ValueError(
            f"answer label {label!r} is outside the vocabulary of `num_answers`={num_answers}: `label` must be an int "
            f"in [0, {num_answers - 1}]."
        )
    return label

