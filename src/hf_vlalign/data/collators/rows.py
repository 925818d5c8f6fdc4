"""Row checks of the collators: a malformed row is refused naming its batch row, its column, what was expected and
what came."""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from ..formats.text_files import short_repr


def _as_list(value: object) -> object:
    """Arrays and tensors (rows of a dataset in numpy or torch format) as the lists the checks read."""
    return value.tolist() if isinstance(value, (np.ndarray, torch.Tensor)) else value


def _shown(value: object) -> str:
    return f"{type(value).__name__} {short_repr(value, 60)}"


def kind_of(value: object) -> str:
    """What came, as a refusal of an argument of the wrong kind names it: None, or its type (and a string's value)."""
    if value is None:
        return "None"
    return f"{type(value).__name__} {str(value)!r}" if isinstance(value, (str, os.PathLike)) else type(value).__name__


def check_fast_tokenizer(tokenizer: object) -> None:
    """A fast transformers tokenizer (its character offsets find the phrase tokens); a name is refused with how to
    load it."""
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        hint = " (load it with AutoTokenizer.from_pretrained(name_or_path))" if isinstance(tokenizer, str) else ""
        raise ValueError(
            f"`tokenizer` must be a transformers tokenizer (PreTrainedTokenizerBase), got {kind_of(tokenizer)}{hint}."
        )
    if not tokenizer.is_fast:
        raise ValueError("`tokenizer` must be a fast tokenizer (character offsets are needed to find phrase tokens).")


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


def check_row_int(index: int, example: Mapping, column: str, labels: range | None = None) -> None:
    """An int label, in `labels` when the classes are known (a label outside them would index past the logits)."""
    value = example[column]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise row_error(index, column, "an int label", value)
    if labels is not None and value not in labels:
        raise row_error(index, column, f"a label in [{labels.start}, {labels.stop - 1}]", value)


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


def _checked_answer(label: int, num_answers: int) -> int:
    if not isinstance(label, numbers.Integral) or isinstance(label, bool) or not 0 <= label < num_answers:
        raise ValueError(
            f"answer label {label!r} is outside the vocabulary of `num_answers`={num_answers}: `label` must be an int "
            f"in [0, {num_answers - 1}]."
        )
    return label


def answer_labels(
    examples: Sequence[Mapping],
    num_answers: int,
    collator: str,
    matched: Sequence[bool] | None = None,
    sample: Callable[[int, Mapping], int] | None = None,
) -> torch.Tensor:
    """The answer targets of checked rows (`check_answer_columns`): VQA soft scores as (B, num_answers) floats, else
    GQA's `label` as (B,) ids, -100 for label -1 and for the rows not `matched` (their image swapped); `sample(i, row)`,
    when given, draws each matched row's id instead."""
    for index, example in enumerate(examples):
        check_answer_columns(index, example, examples[0], collator)
    matched = [True] * len(examples) if matched is None else matched
    if "scores" in examples[0]:
        targets = torch.zeros(len(examples), num_answers)
        for i, example in enumerate(examples):
            for label, score in zip(example["labels"], example["scores"]):
                targets[i, _checked_answer(label, num_answers)] = score if matched[i] else 0.0
        return targets
    if sample is not None:
        return torch.tensor([sample(i, example) if matched[i] else -100 for i, example in enumerate(examples)])
    return torch.tensor(
        [
            _checked_answer(example["label"], num_answers) if matched[i] and example["label"] >= 0 else -100
            for i, example in enumerate(examples)
        ]
    )
