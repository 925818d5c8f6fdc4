"""LXMERT / bottom-up-attention region feature TSV: one image per line, 10 tab-separated fields.

Arrays are stored as base64 of their raw little-endian bytes (LXMERT's `np.frombuffer(base64.b64decode(s), dtype)`):
`objects_id`/`attrs_id` int64, `objects_conf`/`attrs_conf` float32, `boxes` float32 (num_boxes, 4) pixels x1, y1,
x2, y2, and `features` float32 (num_boxes, D). Nothing is unpickled.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
import numpy as np
from datasets.exceptions import DatasetGenerationError
from tqdm.auto import tqdm


logger = logging.getLogger(__name__)

FIELDS = [
    "img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes", "boxes",
    "features",
]  # fmt: skip

# TSV field -> (dataset column, dtype of the stored bytes)
_ARRAY_FIELDS = {
    "objects_id": ("object_ids", np.dtype("<i8")),
    "objects_conf": ("object_conf", np.dtype("<f4")),
    "attrs_id": ("attr_ids", np.dtype("<i8")),
    "attrs_conf": ("attr_conf", np.dtype("<f4")),
    "boxes": ("boxes", np.dtype("<f4")),
    "features": ("features", np.dtype("<f4")),
}
_INT_FIELDS = {"img_h": "image_h", "img_w": "image_w", "num_boxes": "num_boxes"}
_FIELD_OF_COLUMN = {
    "image_id": "img_id",
    **{column: name for name, column in _INT_FIELDS.items()},
    **{column: name for name, (column, _) in _ARRAY_FIELDS.items()},
}

FEATURES = datasets.Features(
    {
        "image_id": datasets.Value("string"),
        "image_h": datasets.Value("int64"),
        "image_w": datasets.Value("int64"),
        "num_boxes": datasets.Value("int64"),
        "object_ids": datasets.List(datasets.Value("int64")),
        "object_conf": datasets.List(datasets.Value("float32")),
        "attr_ids": datasets.List(datasets.Value("int64")),
        "attr_conf": datasets.List(datasets.Value("float32")),
        "boxes": datasets.List(datasets.List(datasets.Value("float32"), length=4)),
        "features": datasets.List(datasets.List(datasets.Value("float32"))),
    }
)

_FIELD_SIZE_LIMIT = 2**31 - 1  # a 36 x 2048 float32 feature field is ~400k base64 characters, over csv's default


class _FieldError(ValueError):
    """A problem with one column of a record; the reader and the writer each say where the record came from."""

    def __init__(self, column: str, problem: str) -> None:
        super().__init__(problem)
        self.column = column


# ----------------------------------------------------------------------------------------------------------------
# One record: validation shared by the reader and the writer
# ----------------------------------------------------------------------------------------------------------------


def _check_record(record: dict, feature_dim: int | None) -> int:
    """Checks a record (dataset column names, numpy arrays) and returns its feature dimension D.

    `feature_dim` is the D of the records before this one (None for the first): one file holds one D.
    """
    image_id = record["image_id"]
    if not isinstance(image_id, str) or not image_id or any(c in image_id for c in "\t\r\n"):
        raise _FieldError("image_id", f"expected a non-empty id without tabs or line breaks, got {image_id!r}.")
    for column in ("image_h", "image_w"):
        if record[column] <= 0:
            raise _FieldError(column, f"expected a positive image size in pixels, got {record[column]}.")
    num_boxes = record["num_boxes"]
    _check_num_boxes(num_boxes)
    for column in ("object_ids", "object_conf", "attr_ids", "attr_conf"):
        if record[column].shape != (num_boxes,):
            raise _FieldError(column, f"expected num_boxes={num_boxes} values, got shape {record[column].shape}.")
    if record["boxes"].shape != (num_boxes, 4):
        raise _FieldError("boxes", f"expected shape (num_boxes={num_boxes}, 4), got {record['boxes'].shape}.")
    features = record["features"]
    if features.ndim != 2 or features.shape[0] != num_boxes or features.shape[1] == 0:
        raise _FieldError("features", f"expected shape (num_boxes={num_boxes}, D) with D >= 1, got {features.shape}.")
    if feature_dim is not None and features.shape[1] != feature_dim:
        raise _FieldError(
            "features", f"expected D={feature_dim} values per box like the first record, got {features.shape[1]}."
        )
    for column in ("object_conf", "attr_conf", "boxes", "features"):
        bad = int((~np.isfinite(record[column])).sum())
        if bad:
            raise _FieldError(column, f"expected finite values, got {bad} NaN/inf value(s).")
    _check_boxes(record["boxes"], record["image_w"], record["image_h"])
    return features.shape[1]


def _check_num_boxes(num_boxes: int) -> None:
    if num_boxes < 1:
        raise _FieldError("num_boxes", f"expected at least one box, got {num_boxes}.")


def _check_boxes(boxes: np.ndarray, width: int, height: int) -> None:
    x1, y1, x2, y2 = boxes.T
    bad = (x1 < 0) | (y1 < 0) | (x2 > width) | (y2 > height) | (x2 < x1) | (y2 < y1)
    if bad.any():
        index = int(bad.argmax())
        raise _FieldError(
            "boxes",
            f"expected 0 <= x1 <= x2 <= img_w={width} and 0 <= y1 <= y2 <= img_h={height} (pixels), "
            f"got box {index} = {boxes[index].tolist()}.",
        )


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------


def _decode_row(row: list[str], feature_dim: int | None) -> tuple[dict, int]:
    """One TSV row -> (record with dataset column names, its feature dimension)."""
    if len(row) != len(FIELDS):
        raise _FieldError("", f"expected {len(FIELDS)} tab-separated fields ({', '.join(FIELDS)}), got {len(row)}.")
    fields = dict(zip(FIELDS, row))
    record = {"image_id": fields["img_id"]}
    for name, column in _INT_FIELDS.items():
        try:
            record[column] = int(fields[name])
        except ValueError:
            raise _FieldError(column, f"expected an integer, got {fields[name][:20]!r}.") from None
    _check_num_boxes(record["num_boxes"])
    for name, (column, dtype) in _ARRAY_FIELDS.items():
        record[column] = _decode_array(column, fields[name], dtype)
    for column in ("boxes", "features"):
        record[column] = _per_box(record[column], column, record["num_boxes"])
    return record, _check_record(record, feature_dim)


def _decode_array(column: str, text: str, dtype: np.dtype) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as error:
        raise _FieldError(column, f"expected base64 text, got undecodable data ({error}).") from None
    if len(raw) % dtype.itemsize:
        raise _FieldError(column, f"expected a whole number of {dtype.name} values, got {len(raw)} bytes.")
    return np.frombuffer(raw, dtype=dtype)


def _per_box(values: np.ndarray, column: str, num_boxes: int) -> np.ndarray:
    """Flat stored values -> (num_boxes, width): 4 for boxes, the feature dimension D for features."""
    if values.size == 0 or values.size % num_boxes or (column == "boxes" and values.size != 4 * num_boxes):
        width = "4" if column == "boxes" else "D"
        raise _FieldError(column, f"expected num_boxes={num_boxes} rows of {width} values, got {values.size} values.")
    return values.reshape(num_boxes, -1)


def _generate_records(path: str, on_error: str) -> Iterator[dict]:
    csv.field_size_limit(_FIELD_SIZE_LIMIT)
    feature_dim, kept = None, 0
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in tqdm(reader, desc=f"Reading {Path(path).name}", unit=" images"):
            try:
                record, feature_dim = _decode_row(row, feature_dim)
            except _FieldError as error:
                field = f", field '{_FIELD_OF_COLUMN[error.column]}'" if error.column else ""
                message = f"{path}, line {reader.line_num}{field}: {error}"
                if on_error == "raise":
                    raise ValueError(message) from None
                logger.info("Skipping %s", message)
                continue
            kept += 1
            yield record
    if not kept:
        raise ValueError(f"{path}: no valid record among {reader.line_num} line(s); expected one image per line.")


def _count_lines(path: Path) -> int:
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            count, last = count + chunk.count(b"\n"), chunk[-1:]
    return count + (last != b"\n")


def _fingerprint(path: Path, on_error: str) -> str:
    """Cache key of a read: the file (path, size, modification time) and the error policy."""
    stat = path.stat()
    key = f"lxmert_tsv|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{on_error}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def read_lxmert_tsv(path: str | Path, on_error: str = "raise", cache_dir: str | None = None) -> datasets.Dataset:
    """Streams an LXMERT feature TSV into a memory-mapped Arrow `datasets.Dataset` (columns: `FEATURES`).

    Args:
        path: the TSV file.
        on_error: "raise" stops at the first bad record with a ValueError naming file, line, field and problem;
            "skip" drops bad records (each logged at INFO level) and warns with their count.
        cache_dir: where datasets keeps the Arrow file (its default cache when None); a read of an unchanged file
            with the same `on_error` reuses it.
    """
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        raise ValueError(f"`path` must be an existing LXMERT feature TSV file, got {path!r}.")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"`on_error` must be 'raise' or 'skip', got {on_error!r}.")
    path = Path(path)
    try:
        dataset = datasets.Dataset.from_generator(
            _generate_records,
            features=FEATURES,
            cache_dir=None if cache_dir is None else str(cache_dir),
            gen_kwargs={"path": str(path), "on_error": on_error},
            fingerprint=_fingerprint(path, on_error),
        )
    except DatasetGenerationError as error:
        if isinstance(error.__cause__, ValueError):
            raise error.__cause__ from None
        raise
    if on_error == "skip":
        total = _count_lines(path)
        if total > len(dataset):
            logger.warning(
                "Skipped %d of %d records of %s (on_error='skip'); on_error='raise' stops at the first problem.",
                total - len(dataset),
                total,
                path,
            )
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------------------


def _encode_record(record: dict, feature_dim: int | None) -> tuple[list[str], int]:
    """A record with dataset column names -> (the 10 TSV fields, its feature dimension)."""
    if not isinstance(record, dict):
        raise _FieldError("", f"expected a dict, got {type(record).__name__}.")
    missing = [column for column in FEATURES if column not in record]
    if missing:
        raise _FieldError("", f"expected the columns {list(FEATURES)}, missing {missing}.")
    checked = {"image_id": record["image_id"]}
    for column in _INT_FIELDS.values():
        if not isinstance(record[column], (int, np.integer)) or isinstance(record[column], bool):
            raise _FieldError(column, f"expected an int, got {record[column]!r}.")
        checked[column] = int(record[column])
    for column, dtype in _ARRAY_FIELDS.values():
        checked[column] = _as_array(column, record[column], dtype)
    feature_dim = _check_record(checked, feature_dim)
    row = {"img_id": checked["image_id"]}
    row |= {name: str(checked[column]) for name, column in _INT_FIELDS.items()}
    for name, (column, _) in _ARRAY_FIELDS.items():
        row[name] = base64.b64encode(checked[column].tobytes()).decode("ascii")
    return [row[name] for name in FIELDS], feature_dim


def _as_array(column: str, values: object, dtype: np.dtype) -> np.ndarray:
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as error:
        problem = f"expected a numeric array of {dtype.name}, got {type(values).__name__} ({error})."
        raise _FieldError(column, problem) from None


def write_lxmert_tsv(path: str | Path, records: Iterable[dict]) -> int:
    """Writes records (dataset column names, arrays or nested lists) as an LXMERT TSV; returns how many.

    Every record is validated as the reader would; on a bad record nothing is left behind at `path`.
    """
    if not isinstance(records, Iterable) or isinstance(records, (str, bytes, dict)):
        raise ValueError(f"`records` must be an iterable of dicts, got {type(records).__name__}.")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count, feature_dim = 0, None
    try:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            for count, record in enumerate(records, start=1):
                try:
                    row, feature_dim = _encode_record(record, feature_dim)
                except _FieldError as error:
                    column = f", column '{error.column}'" if error.column else ""
                    raise ValueError(f"`records[{count - 1}]`{column}: {error}") from None
                handle.write("\t".join(row) + "\n")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return count
