"""Your own images and texts: one documented file format per task (JSON lines or CSV) -> the rows every collator reads,
joined to region features extracted from the images. The columns of each task (`USER_TASKS`, `_REQUIRED`,
`_OPTIONAL`), the phrase and region formats: docs/own_data.md. Image paths are relative to the file's folder; boxes
are `[x1, y1, x2, y2]` pixels; without `regions` a grid or detector makes them (`region_options`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from ...metrics.vqa import answer_credit, normalize_vqa_answer
from ...utils.atomic_folders import writer_tag
from ..feature_store import METADATA_FILE, PARTIAL_MARKER, RegionFeatureStore
from ..formats.text_files import iter_csv_rows, parse_json, read_text
from ..formats.vgp import TYPOLOGY_LABELS
from ._common import IMAGE_SIZE, attach_region_features, grounding_features
from .nlvr2 import attach_pair_features
from .vgp import ID_LABELS, VGP_FEATURES

logger = logging.getLogger(__name__)

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


# what a store of the cache records of its images in its store.json (`extra_metadata`): each image's file and content
# (`_image_record`) and the region options, so that a later run reuses the features of every unchanged image and
# drops the stores whose images changed
CACHE_IMAGES_FIELD = "user_images"
CACHE_OPTIONS_FIELD = "user_region_options"
# a cached store being removed: renamed first (atomic), so no half-removed folder ever looks like a store
STALE_MARKER = ".stale-"


def user_features_cache() -> Path:
    """Where `load_user_data` keeps stores by default: `user_features/` in $HF_VLALIGN_CACHE or ~/.cache/hf_vlalign."""
    root = os.environ.get("HF_VLALIGN_CACHE") or Path.home() / ".cache" / "hf_vlalign"
    return Path(root) / "user_features"


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _image_record(image: Path, boxes: list | None) -> dict:
    """One image as the cache knows it: its id, file (path, size, modification time), content hash and given boxes."""
    stat = image.stat()
    return {
        "image_id": image.stem,
        "path": str(image.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": _file_sha256(image),
        "boxes": boxes,
    }


def _content_key(record: dict) -> str:
    """What makes an image's regions and features under fixed options: its content and its given boxes."""
    return json.dumps([record["sha256"], record["boxes"]])


def _normalised(options: Mapping) -> dict:
    return json.loads(json.dumps(dict(options), sort_keys=True, default=str))


def _cache_key(records: Sequence[dict], options: Mapping) -> str:
    """The cache folder of a set of images: their ids and contents, their given boxes and the options."""
    content = [[record["image_id"], record["sha256"], record["boxes"]] for record in records]
    return hashlib.sha256(json.dumps([content, _normalised(options)]).encode()).hexdigest()[:24]


def _cached_stores(root: Path) -> list[tuple[Path, dict]]:
    """(folder, store.json) of every complete store in the cache `root` written by `load_user_data` (one that records
    its images); folders being written or removed, and stores of other writers, are left out."""
    stores = []
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if PARTIAL_MARKER in folder.name or STALE_MARKER in folder.name or not (folder / METADATA_FILE).is_file():
            continue
        try:
            metadata = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(metadata, dict) and isinstance(metadata.get(CACHE_IMAGES_FIELD), list):
            stores.append((folder, metadata))
    return stores


def _is_current(record: dict) -> bool:
    """Whether the file a cached image was read from still holds that image (hashed again only when its size or
    modification time changed)."""
    path = Path(record["path"])
    try:
        stat = path.stat()
    except OSError:
        return False
    if (stat.st_size, stat.st_mtime_ns) == (record["size"], record["mtime_ns"]):
        return True
    return path.is_file() and _file_sha256(path) == record["sha256"]


def drop_stale_user_features(root: str | os.PathLike | None = None, keep: Sequence[Path] = ()) -> list[Path]:
    """Removes the stores of the user-features cache (default `user_features_cache()`) that no current file refers
    to: those with an image whose file changed or is gone. `keep`: folders left alone. Returns the removed folders."""
    root = Path(root) if root is not None else user_features_cache()
    removed = []
    for folder, metadata in _cached_stores(root):
        if folder in keep or all(_is_current(record) for record in metadata[CACHE_IMAGES_FIELD]):
            continue
        doomed = folder.with_name(f"{folder.name}{STALE_MARKER}{writer_tag()}")
        try:
            os.rename(folder, doomed)  # atomic: the store is whole or gone
        except OSError:  # another process removed it first
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(folder)
    return removed


def _reusable_features(root: Path, records: Sequence[dict], options: dict) -> dict[str, dict]:
    """{content key: store record} of the wanted images whose regions and features a cached store of the same options
    holds (the record renamed to the wanted image's id)."""
    wanted = {_content_key(record): record["image_id"] for record in records}
    found = {}
    for folder, metadata in _cached_stores(root):
        if metadata.get(CACHE_OPTIONS_FIELD) != options:
            continue
        rows = {
            _content_key(record): row
            for row, record in enumerate(metadata[CACHE_IMAGES_FIELD])
            if _content_key(record) in wanted and _content_key(record) not in found
        }
        if rows:
            store = RegionFeatureStore.load(folder)
            for key, row in rows.items():
                found[key] = _numpy_record(store.image_at(row)) | {"image_id": wanted[key]}
    return found


def _numpy_record(image: dict) -> dict:
    return {name: value.numpy() if hasattr(value, "numpy") else value for name, value in image.items() if value is not None}


def _cached_user_features(images: Sequence[Path], boxes: Mapping | None, options: dict) -> RegionFeatureStore:
    """The store of `images` in the cache: reused whole when present; else made from the cached features of the
    unchanged images and those extracted of the others, then the stores of changed images dropped. Says which."""
    from ..region_extraction import extract_region_features

    root = user_features_cache()
    records = [_image_record(image, boxes.get(image.stem) if boxes is not None else None) for image in images]
    options = _normalised(options)
    directory = root / _cache_key(records, options)
    if (directory / METADATA_FILE).is_file():
        logger.warning(
            "Region features of the %d images: reused from the cache %s (the images and options are unchanged; "
            "delete the folder to extract them again).", len(images), directory,
        )  # fmt: skip
        return RegionFeatureStore.load(directory)
    reused = _reusable_features(root, records, options)
    missing = [image for image, record in zip(images, records) if _content_key(record) not in reused]
    extracted, source = {}, None
    if missing:
        given = {"boxes": {image.stem: boxes[image.stem] for image in missing}} if boxes is not None else {}
        with tempfile.TemporaryDirectory(prefix="hf_vlalign-user-features-") as scratch:
            store = extract_region_features(missing, Path(scratch) / "store", **given, **options)
            extracted = {image["image_id"]: _numpy_record(image) for image in store}
            source = store.metadata.get("source")
            del store  # its memory map closes before the scratch folder goes
    ordered = [reused.get(_content_key(record)) or extracted[record["image_id"]] for record in records]
    extra = {CACHE_OPTIONS_FIELD: options, CACHE_IMAGES_FIELD: records}
    store = RegionFeatureStore.write(ordered, directory, source=source or "load_user_data (cached)", extra_metadata=extra)
    dropped = drop_stale_user_features(root, keep=[directory])
    logger.warning(
        "Region features of the %d images: %d reused from the cache %s, %d extracted; %d cached store(s) of images "
        "that changed since dropped.", len(images), len(images) - len(missing), root, len(missing), len(dropped),
    )  # fmt: skip
    return store


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
        store_dir: where to write the store, reused when present (default: in the cache `user_features_cache()`, a
            store named by the images' content and the options: reused when present, else made from the cached
            features of every unchanged image and those extracted of the others; the stores of images changed since
            are dropped; the log says which).
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
    if store_dir is None:
        store = _cached_user_features(images, boxes, options)
    elif (Path(store_dir) / METADATA_FILE).is_file():
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
