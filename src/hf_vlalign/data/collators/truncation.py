"""Truncation of the collators' texts to `max_text_length` word pieces: what was cut, what it cost
(`TruncationStats`), and the removal of the rows that cannot be trained once truncated (`drop_overlong_rows`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import datasets
import torch
from transformers import PreTrainedTokenizerBase

from .rows import check_fast_tokenizer

logger = logging.getLogger(__name__)

# the batch entry (popped before the batch is returned) holding each row's word pieces lost to truncation
CUT_KEY = "_cut_word_pieces"


@dataclass
class TruncationStats:
    """What truncating texts to `max_text_length` cost, counted by a collator over the rows it collates (each time) or
    by `drop_overlong_rows` over a dataset.

    Attributes:
        rows: rows seen.
        rows_truncated: rows whose text (or caption pair) lost at least one word piece.
        phrases_cut: grounded phrases that lost a word piece (their alignment is dropped).
        required_spans_cut: rows whose required span (e.g. VGP's phrase pair) lost a word piece.
        rows_dropped: rows removed by `drop_overlong_rows` (a collator never drops a row).
    """

    rows: int = 0
    rows_truncated: int = 0
    phrases_cut: int = 0
    required_spans_cut: int = 0
    rows_dropped: int = 0

    def __add__(self, other: TruncationStats) -> TruncationStats:
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
    """Removes the rows whose required span (`required_spans`, {span column: its text column}, e.g. VGP's
    {"phrase1_span": "caption1", "phrase2_span": "caption2"}) loses a word piece once `text_columns` (one text or a
    pair) are truncated to `max_text_length` as the collators do; the collators truncate the other rows themselves.

    Returns the kept rows and their `TruncationStats`, warned (naming `where`) when anything is truncated. Raises a
    ValueError on a bad argument or when no row is left. `collator.drop_overlong_rows(dataset)` passes its own settings.
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
    check_fast_tokenizer(tokenizer)
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
