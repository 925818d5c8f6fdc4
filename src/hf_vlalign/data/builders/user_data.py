"""Your own images and texts: one documented file format per task (JSON lines or CSV) -> the rows every collator reads,
joined to region features extracted from the images. The columns of each task (`USER_TASKS`, `_REQUIRED`,
`_OPTIONAL`), the phrase and region formats: docs/own_data.md. Image paths are relative to the file's folder; boxes
are `[x1, y1, x2, y2]` pixels; without `regions` a grid or detector makes them (`region_options`).
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from ...metrics.vqa import answer_credit, normalize_vqa_answer
from ..feature_store import RegionFeatureStore
from ..formats.text_files import iter_csv_rows, parse_json, read_text
from ..formats.vgp import TYPOLOGY_LABELS
from ._common import IMAGE_SIZE, attach_region_features, grounding_features
from .nlvr2 import attach_pair_features
from .vgp import ID_LABELS, VGP_FEATURES

USER_TASKS = ("caption", "vqa", "nlvr2", "refcoco", "vgp")
USER_FILE_SUFFIXES = (".jsonl", ".json", ".csv")
# the regions of an image when the file gives none: a 4 x 4 grid after the whole image, pooled by the pixel encoder
DEFAULT_REGION_OPTIONS = {"grid_size": 4, "include_whole_image": True, "encoder": "pixel"}

# the options that make regions, left out when the file gives them (`regions`): only the encoder's options remain
_REGION_SOURCE_OPTIONS = ("grid_size", "include_whole_image", "detector", "detector_threshold", "max_regions")
_IMAGE_COLUMNS = {"nlvr2": ("left_image", "right_image")}
_REQUIRED = {
    "caption": ("image", "caption"),
    "vqa": ("image", "question"),
    "nlvr2": ("left_image", "right_image", "sentence", "label"),
    "refcoco": ("image", "expression", "box"),
    "vgp": ("image", "caption1", "caption2", "phrase1", "phrase2", "label"),
}
_OPTIONAL = {
    "caption": ("phrases", "regions"),
    "vqa": ("answer", "answers", "answer_type", "phrases", "regions"),
    "nlvr2": (),
    "refcoco": ("regions",),
    "vgp": ("type", "phrases1", "phrases2", "regions"),
}
_LIST_COLUMNS = ("phrases", "phrases1", "phrases2", "regions", "answers", "box")
_ID_LABEL_OF = {name: label for label, name in ID_LABELS.items()}
_TYPE_LABEL_OF = {name: label for label, name in TYPOLOGY_LABELS.items()}
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


class UserDataError(ValueError):
    """A user-format file that does not follow its task's format: names the file, the line and the column."""


@dataclass
class UserRow:
    """One example as read: its line, its columns, and the image paths it names."""

    line: int
    values: dict
    images: dict[str, Path] = field(default_factory=dict)


@dataclass
class UserData:
    """The splits of a user's files joined to their images' region features. `region_options` are the
    `extract_region_features` options the features were made with: save them with the model
    (`recipes.save_model(..., region_options=...)`) so that its processor makes the same regions and features."""

    task: str
    train: datasets.Dataset
    validation: datasets.Dataset | None
    store: RegionFeatureStore
    region_options: dict
    answer_vocab: dict[str, int] | None = None  # {answer: id} of the training answers, for the `vqa` task
    image_paths: dict[str, Path] = field(default_factory=dict)


def read_user_rows(path: str | os.PathLike, task: str) -> list[UserRow]:
    """The rows of a user-format file of `task`, checked: required columns present, no unknown column, images
    present. A JSON-lines file holds one JSON object per line (blank lines are skipped); a CSV file has a header."""
    if task not in USER_TASKS:
        raise ValueError(f"`task` must be one of {USER_TASKS}, got {task!r}.")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"the data file {str(path)!r} is not a file.")
    if path.suffix.lower() not in USER_FILE_SUFFIXES:
        raise UserDataError(f"{path}: a data file must be JSON lines (.jsonl/.json) or CSV (.csv), got {path.suffix!r}.")
    raw = _csv_rows(path) if path.suffix.lower() == ".csv" else _json_lines(path)
    rows = [_checked_row(path, line, values, task) for line, values in raw]
    if not rows:
        raise UserDataError(f"{path}: holds no example.")
    return rows


def _json_lines(path: Path) -> list[tuple[int, dict]]:
    lines = enumerate(read_text(path).splitlines(), start=1)
    return [(number, parse_json(text, path, record=f"line {number}")) for number, text in lines if text.strip()]


def _csv_rows(path: Path) -> list[tuple[int, dict]]:
    records = list(iter_csv_rows(path, read_text(path, encoding="utf-8-sig")))
    if not records:
        return []
    (_, header), rows = records[0], []
    for line, cells in records[1:]:
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(header):
            raise UserDataError(f"{path}, line {line}: {len(cells)} cells, but the header names {len(header)} columns.")
        values = {}
        for column, cell in zip(header, cells):
            if cell == "":
                continue  # an empty cell is an absent value
            values[column] = parse_json(cell, path, f"line {line}, column {column!r}") if column in _LIST_COLUMNS else cell
        rows.append((line, values))
    return rows


def _checked_row(path: Path, line: int, values: object, task: str) -> UserRow:
    where = f"{path}, line {line}"
    if not isinstance(values, dict):
        raise UserDataError(f"{where}: an example must be a JSON object of columns, got {type(values).__name__}.")
    missing = [column for column in _REQUIRED[task] if values.get(column) is None]
    if missing:
        raise UserDataError(f"{where}: the `{task}` task needs the columns {list(_REQUIRED[task])}; missing {missing}.")
    unknown = sorted(set(values) - set(_REQUIRED[task]) - set(_OPTIONAL[task]))
    if unknown:
        expected = [*_REQUIRED[task], *_OPTIONAL[task]]
        raise UserDataError(f"{where}: unknown column(s) {unknown} for the `{task}` task (its columns: {expected}).")
    if task == "vqa" and (values.get("answer") is None) == (values.get("answers") is None):
        raise UserDataError(f"{where}: a `vqa` example needs exactly one of `answer` (a string) and `answers` (a list).")
    row = UserRow(line=line, values=values)
    for column in _IMAGE_COLUMNS.get(task, ("image",)):
        row.images[column] = _image_path(path, where, column, values[column])
    return row


def _image_path(path: Path, where: str, column: str, value: object) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise UserDataError(f"{where}: `{column}` must be an image path (a string), got {value!r}.")
    image = Path(value).expanduser()
    image = image if image.is_absolute() else path.parent / image
    if not image.is_file():
        raise FileNotFoundError(f"{where}: `{column}` {value!r} is not a file (looked for {image}).")
    return image


def _text(where: str, values: Mapping, column: str) -> str:
    text = values[column]
    if not isinstance(text, str) or not text.strip():
        raise UserDataError(f"{where}: `{column}` must be a non-empty string, got {text!r}.")
    return text


def _box(where: str, column: str, value: object, size: tuple[int, int]) -> list[float]:
    height, width = size
    four = isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 4
    if not four or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise UserDataError(f"{where}: `{column}` must hold boxes [x1, y1, x2, y2] of 4 numbers (pixels), got {value!r}.")
    x1, y1, x2, y2 = (float(v) for v in value)
    if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
        raise UserDataError(
            f"{where}: `{column}` box {list(value)} must satisfy 0 <= x1 < x2 <= {width} and 0 <= y1 < y2 <= {height} "
            "(the image's width and height in pixels)."
        )
    return [x1, y1, x2, y2]


def _boxes(where: str, column: str, value: object, size: tuple[int, int]) -> list[list[float]]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise UserDataError(f"{where}: `{column}` must be a non-empty list of [x1, y1, x2, y2] boxes, got {value!r}.")
    return [_box(where, column, box, size) for box in value]


def _span(where: str, column: str, text: str, phrase: object, start: object = None) -> list[int]:
    """The character span of `phrase` in `text`: at `start` when given, else its first occurrence."""
    if not isinstance(phrase, str) or not phrase.strip():
        raise UserDataError(f"{where}: `{column}` must name a phrase of the text (a non-empty string), got {phrase!r}.")
    if start is None:
        start = text.find(phrase)
        if start < 0:
            raise UserDataError(f"{where}: `{column}` {phrase!r} is not in the text {text!r}.")
    elif isinstance(start, bool) or not isinstance(start, int) or text[start : start + len(phrase)] != phrase:
        raise UserDataError(f"{where}: `{column}` {phrase!r} does not start at character {start!r} of {text!r}.")
    return [start, start + len(phrase)]


def _phrases(
    where: str, text: str, value: object, size: tuple[int, int], column: str = "phrases"
) -> tuple[list, list]:
    """(spans, boxes) of a `phrases` list."""
    if value is None:
        return [], []
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise UserDataError(f"{where}: `{column}` must be a list of {{\"text\", \"boxes\"}} objects, got {value!r}.")
    spans, boxes = [], []
    for index, phrase in enumerate(value):
        if not isinstance(phrase, Mapping) or "text" not in phrase or "boxes" not in phrase:
            raise UserDataError(f"{where}: `{column}[{index}]` must be an object with `text` and `boxes`, got {phrase!r}.")
        unknown = sorted(set(phrase) - {"text", "boxes", "start"})
        if unknown:
            raise UserDataError(f"{where}: `{column}[{index}]` has unknown key(s) {unknown} (keys: text, boxes, start).")
        spans.append(_span(where, f"{column}[{index}].text", text, phrase["text"], phrase.get("start")))
        boxes.append(_boxes(where, f"{column}[{index}].boxes", phrase["boxes"], size))
    return spans, boxes


def _bool_label(where: str, value: object) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (str, int)) and str(value).strip().lower() in (*_TRUE, *_FALSE):
        return int(str(value).strip().lower() in _TRUE)
    raise UserDataError(f"{where}: `label` must be true or false, got {value!r}.")


def _answers(where: str, values: Mapping) -> list[str]:
    answers = [values["answer"]] if values.get("answer") is not None else values["answers"]
    if not isinstance(answers, Sequence) or isinstance(answers, str) or not answers:
        raise UserDataError(f"{where}: `answers` must be a non-empty list of strings, got {answers!r}.")
    if not all(isinstance(answer, str) and answer.strip() for answer in answers):
        raise UserDataError(f"{where}: every answer must be a non-empty string, got {answers!r}.")
    # VQA's answer normalisation, as the published answers have had ("Two" -> "2", "a cat" -> "cat"): one answer, one
    # spelling, in the vocabulary and for the metric
    normalised = [normalize_vqa_answer(answer) for answer in answers]
    if not all(normalised):
        raise UserDataError(
            f"{where}: every answer must keep a word once normalised as VQA's (articles and punctuation dropped), "
            f"got {answers!r}."
        )
    return normalised


def _row(task: str, row: UserRow, where: str, sizes: Mapping[Path, tuple[int, int]]) -> dict:
    values = row.values
    if task == "nlvr2":
        left, right = row.images["left_image"], row.images["right_image"]
        return {
            "image_id": left.stem,
            "left_image_id": left.stem,
            "right_image_id": right.stem,
            "image_size": list(sizes[left]),
            "sentence": _text(where, values, "sentence"),
            "label": _bool_label(where, values["label"]),
        }
    image = row.images["image"]
    out = {"image_id": image.stem, "image_size": list(sizes[image])}
    if task == "caption":
        caption = _text(where, values, "caption")
        spans, boxes = _phrases(where, caption, values.get("phrases"), sizes[image])
        out.update(caption=caption, caption_phrase_spans=spans, caption_phrase_boxes=boxes)
    elif task == "vqa":
        question = _text(where, values, "question")
        spans, boxes = _phrases(where, question, values.get("phrases"), sizes[image])
        answer_type = values.get("answer_type")
        out.update(question=question, question_phrase_spans=spans, question_phrase_boxes=boxes)
        out.update(answers=_answers(where, values), answer_type=str(answer_type) if answer_type is not None else "")
    elif task == "refcoco":
        expression = _text(where, values, "expression")
        box = _box(where, "box", values["box"], sizes[image])
        out.update(expression=expression, expression_phrase_spans=[[0, len(expression)]], expression_phrase_boxes=[[box]])
    else:
        out.update(_vgp_columns(where, values, sizes[image]))
    return out


def _vgp_columns(where: str, values: Mapping, size: tuple[int, int]) -> dict:
    caption1, caption2 = _text(where, values, "caption1"), _text(where, values, "caption2")
    label = values["label"]
    if label not in _ID_LABEL_OF:
        raise UserDataError(f"{where}: `label` must be one of {list(_ID_LABEL_OF)} (which caption describes the image), got {label!r}.")
    kind = values.get("type")
    if kind is not None and kind not in _TYPE_LABEL_OF:
        raise UserDataError(f"{where}: `type` must be one of {list(_TYPE_LABEL_OF)} or null, got {kind!r}.")
    columns = {
        "caption1": caption1,
        "caption2": caption2,
        "phrase1_span": _span(where, "phrase1", caption1, values["phrase1"]),
        "phrase2_span": _span(where, "phrase2", caption2, values["phrase2"]),
        "id_label": _ID_LABEL_OF[label],
        "vgp_label": int(kind is not None),
        "type_label": _TYPE_LABEL_OF[kind] if kind is not None else -1,
    }
    for k, caption in ((1, caption1), (2, caption2)):
        spans, boxes = _phrases(where, caption, values.get(f"phrases{k}"), size, f"phrases{k}")
        columns.update({f"caption{k}_phrase_spans": spans, f"caption{k}_phrase_boxes": boxes})
    return columns


def _features(task: str) -> datasets.Features:
    if task == "vgp":
        return VGP_FEATURES
    common = {"image_id": datasets.Value("string"), "image_size": IMAGE_SIZE}
    string, integer = datasets.Value("string"), datasets.Value("int32")
    if task == "caption":
        return datasets.Features({**common, "caption": string, **grounding_features("caption")})
    if task == "vqa":
        answers = {"answers": datasets.List(string), "answer_type": string}
        return datasets.Features({**common, "question": string, **grounding_features("question"), **answers})
    if task == "nlvr2":
        pair = {"left_image_id": string, "right_image_id": string, "identifier": string}
        return datasets.Features({**common, **pair, "sentence": string, "label": integer})
    return datasets.Features({**common, "expression": string, **grounding_features("expression")})


def build_user_dataset(path: str | os.PathLike, task: str) -> datasets.Dataset:
    """The rows of a user-format file of `task` in the columns the task's collator reads (before the join to region
    features: `load_user_data` does both)."""
    rows = read_user_rows(path, task)
    return _dataset(Path(path), task, rows, _image_sizes(rows))


def _dataset(path: Path, task: str, rows: Sequence[UserRow], sizes: Mapping[Path, tuple[int, int]]) -> datasets.Dataset:
    examples = [_row(task, row, f"{path}, line {row.line}", sizes) for row in rows]
    if task == "nlvr2":
        _add_nlvr2_identifiers(examples)
    return datasets.Dataset.from_list(examples, features=_features(task))


def _add_nlvr2_identifiers(examples: list[dict]) -> None:
    """NLVR2 identifiers "user-<sentence>-<pair>-0": the rows of one sentence (judged against several image pairs)
    share its number, so NLVR2's consistency groups them as it groups the published sentences."""
    sentences, pairs = {}, {}
    for example in examples:
        number = sentences.setdefault(example["sentence"], len(sentences))
        pairs[number] = pairs.get(number, -1) + 1
        example["identifier"] = f"user-{number}-{pairs[number]}-0"


def _image_sizes(rows: Sequence[UserRow]) -> dict[Path, tuple[int, int]]:
    """(height, width) of every image the rows name, reading headers only; two files of one stem are refused."""
    from ..region_extraction import read_image_entries

    paths = list(dict.fromkeys(image for row in rows for image in row.images.values()))
    return {entry.path: (entry.height, entry.width) for entry in read_image_entries(paths, "image")}


def _given_regions(rows: Sequence[UserRow], sizes: Mapping[Path, tuple[int, int]], path: Path) -> dict[str, list] | None:
    """{image id: boxes} of the rows' `regions` columns; None when no row gives them (all or none must)."""
    given, without = {}, []
    for row in rows:
        image = row.images.get("image")
        if image is None:
            continue
        if row.values.get("regions") is None:
            without.append(row.line)
            continue
        boxes = _boxes(f"{path}, line {row.line}", "regions", row.values["regions"], sizes[image])
        if given.setdefault(image.stem, boxes) != boxes:
            raise UserDataError(f"{path}, line {row.line}: `regions` of {image.name} differ from an earlier row's.")
    if given and without:
        raise UserDataError(
            f"{path}: `regions` are given on some rows but not on line {without[0]} (and {len(without) - 1} more): give "
            "them on every row or on none (a grid or a detector then makes the regions)."
        )
    return given or None


def _cache_key(images: Sequence[Path], boxes: Mapping | None, options: Mapping) -> str:
    digest = hashlib.sha256()
    for image in images:
        stat = image.stat()
        digest.update(f"{image.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    digest.update(json.dumps([boxes, dict(options)], sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def user_features_cache() -> Path:
    """Where `load_user_data` keeps stores by default: `user_features/` in $HF_VLALIGN_CACHE or ~/.cache/hf_vlalign."""
    root = os.environ.get("HF_VLALIGN_CACHE") or Path.home() / ".cache" / "hf_vlalign"
    return Path(root) / "user_features"


def load_user_data(
    train_file: str | os.PathLike,
    task: str,
    validation_file: str | os.PathLike | None = None,
    *,
    region_options: Mapping | None = None,
    store_dir: str | os.PathLike | None = None,
    iou_threshold: float = 0.5,
) -> UserData:
    """The user-format files of `task` (one of `USER_TASKS`; `validation_file` optional, same format) joined to their
    images' region features.

    Args:
        region_options: keyword arguments of `extract_region_features` (default `DEFAULT_REGION_OPTIONS`); with
            `regions` in the files, its encoder options only (the regions are exactly the files' boxes).
        store_dir: where to write the store (default: under `user_features_cache()`, named by the images' content and
            the options, reused when present).
        iou_threshold: IoU at which a region counts as showing a phrase's gold box.
    """
    from ..region_extraction import extract_region_features

    files = [Path(train_file)] + ([Path(validation_file)] if validation_file is not None else [])
    splits = [read_user_rows(path, task) for path in files]
    sizes = _image_sizes([row for rows in splits for row in rows])
    boxes = None
    for path, rows in zip(files, splits):
        given = _given_regions(rows, sizes, path)
        if given is not None and boxes is not None and any(boxes.get(k, v) != v for k, v in given.items()):
            raise UserDataError(f"{path}: `regions` of an image differ from those of {files[0]}.")
        boxes = {**(boxes or {}), **given} if given is not None else boxes
    options = dict(DEFAULT_REGION_OPTIONS if region_options is None else region_options)
    if boxes is not None:
        options = {key: value for key, value in options.items() if key not in _REGION_SOURCE_OPTIONS}
    images = sorted(sizes, key=str)
    store_dir = Path(store_dir) if store_dir is not None else user_features_cache() / _cache_key(images, boxes, options)
    if (store_dir / "store.json").is_file():
        store = RegionFeatureStore.load(store_dir)
    else:
        store = extract_region_features(images, store_dir, **({"boxes": boxes} if boxes is not None else {}), **options)
    joined = [_joined(_dataset(path, task, rows, sizes), store, iou_threshold, str(path)) for path, rows in zip(files, splits)]
    if task == "vqa":
        vocab = answer_vocabulary(joined[0])
        joined = [with_soft_scores(split, vocab) for split in joined]
    return UserData(
        task=task,
        train=joined[0],
        validation=joined[1] if len(joined) > 1 else None,
        store=store,
        region_options=options,
        answer_vocab=vocab if task == "vqa" else None,
        image_paths={image.stem: image for image in images},
    )


def _joined(dataset: datasets.Dataset, store: RegionFeatureStore, iou_threshold: float, source: str) -> datasets.Dataset:
    if "right_image_id" in dataset.column_names:  # nlvr2: two images per example
        return attach_pair_features(dataset, store)
    return attach_region_features(dataset, store, iou_threshold=iou_threshold, source=source)


def answer_vocabulary(dataset: datasets.Dataset) -> dict[str, int]:
    """{answer: id} of every answer of the training rows, the most frequent first (ties by name)."""
    counts = Counter(answer for answers in dataset["answers"][:] for answer in answers)
    return {answer: index for index, (answer, _) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}


def with_soft_scores(dataset: datasets.Dataset, answer_vocab: Mapping[str, int]) -> datasets.Dataset:
    """`labels` (answer ids) and `scores` of each row: each answer's `metrics.vqa.answer_credit`, min(1, count /
    min(3, n)) of n answers (VQA's soft score min(count / 3, 1) from three answers on, 1 for a single `answer`), the
    credit `vqa_accuracy` gives it; answers outside `answer_vocab` get no label (the row then scores 0)."""

    def scores(row: dict) -> dict:
        counts = Counter(answer for answer in row["answers"] if answer in answer_vocab)
        return {
            "labels": [answer_vocab[answer] for answer in counts],
            "scores": [answer_credit(count, len(row["answers"])) for count in counts.values()],
        }

    features = dataset.features.copy()
    features["labels"] = datasets.List(datasets.Value("int32"))
    features["scores"] = datasets.List(datasets.Value("float32"))
    return dataset.map(scores, features=features)
