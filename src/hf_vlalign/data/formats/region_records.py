"""The one record every region-feature reader yields, its validation, and the loop that reports bad records.

A record is a dict with the `RegionFeatureStore` columns (`RECORD_COLUMNS`). A reader yields `(location, decode)`
pairs; `iter_checked_records` runs the decoders, checks every record the same way, and either stops at the first
problem (`on_error="raise"`) or skips it and reports the count at the end (`on_error="skip"`).
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from ...utils.size_limits import MAX_ARRAY_BYTES
from .text_files import short_repr

logger = logging.getLogger(__name__)

ON_ERROR_CHOICES = ("raise", "skip")
OPTIONAL_COLUMNS = {
    "object_ids": np.dtype("<i8"),
    "object_conf": np.dtype("<f4"),
    "attr_ids": np.dtype("<i8"),
    "attr_conf": np.dtype("<f4"),
}
RECORD_COLUMNS = ("image_id", "image_size", "boxes", "features", *OPTIONAL_COLUMNS)


class RecordError(ValueError):
    """A problem with one record; `field` names the field of the file it was read from ("" for the whole record)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


RecordDecoder = Callable[[], dict]
# what damaged data can make NumPy, h5py or the decoders raise beyond `RecordError`; reported like a RecordError,
# naming the record, instead of escaping as an internal error
_DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, UnicodeDecodeError)


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_CHOICES:
        raise ValueError(f"`on_error` must be one of {ON_ERROR_CHOICES}, got {on_error!r}.")


def decode_base64_array(field: str, text: str | bytes, dtype: np.dtype | str) -> np.ndarray:
    """Raw little-endian array bytes stored as base64 (the LXMERT / bottom-up-attention / VL-BERT convention)."""
    dtype = np.dtype(dtype)
    if not isinstance(text, (str, bytes)):  # a JSON number or list (VL-BERT's files)
        raise RecordError(field, f"expected base64 text of {dtype.name} values, got {type(text).__name__}.")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise RecordError(field, f"expected base64 text, got undecodable data ({error}).") from None
    if len(raw) % dtype.itemsize:
        raise RecordError(field, f"expected a whole number of {dtype.name} values, got {len(raw)} bytes.")
    return np.frombuffer(raw, dtype=dtype)


def encode_base64_array(values: np.ndarray, dtype: np.dtype | str) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def rows_of(field: str, values: np.ndarray, num_boxes: int, width: int | None = None) -> np.ndarray:
    """Flat stored values -> (num_boxes, width); `width` None means any width >= 1 (the feature dimension)."""
    values = np.asarray(values)
    expected = f"{width}" if width is not None else "D"
    if values.size == 0 or values.size % num_boxes or (width is not None and values.size != width * num_boxes):
        raise RecordError(field, f"expected num_boxes={num_boxes} rows of {expected} values, got {values.size} values.")
    return values.reshape(num_boxes, -1)


def parse_int(field: str, text: object) -> int:
    if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):  # NaN, inf, 240.5: not counts
        raise RecordError(field, f"expected an integer, got {text!r}.")
    try:
        return int(text)
    except (TypeError, ValueError, OverflowError):
        raise RecordError(field, f"expected an integer, got {str(text)[:20]!r}.") from None


def parse_image_size(fields: dict, height_field: str, width_field: str) -> tuple[int, int]:
    """(height, width) from two integer fields of a record, each checked to be a positive pixel count."""
    size = []
    for field in (height_field, width_field):
        value = parse_int(field, fields[field])
        if value <= 0:
            raise RecordError(field, f"expected a positive image size in pixels, got {value}.")
        size.append(value)
    return size[0], size[1]


def check_array_size(field: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuses an array a file declares (HDF5 dataset shapes, .npy headers) before it is read: beyond numbers (nothing
    is unpickled), or beyond `MAX_ARRAY_BYTES` (a small file can declare gigabytes, which would be allocated first)."""
    if dtype.kind not in "biuf":
        raise RecordError(field, f"expected an array of numbers, got the dtype {dtype}.")
    declared = math.prod(shape) * dtype.itemsize
    if declared > MAX_ARRAY_BYTES:
        raise RecordError(
            field,
            f"the file declares shape {tuple(shape)} of {dtype} ({declared} bytes) for one image, more than "
            f"MAX_ARRAY_BYTES = {MAX_ARRAY_BYTES} (hf_vlalign.utils.size_limits).",
        )


def parse_num_boxes(text: object) -> int:
    """The `num_boxes` field of a record: an integer >= 1."""
    num_boxes = parse_int("num_boxes", text)
    if num_boxes < 1:
        raise RecordError("num_boxes", f"expected at least one box, got {num_boxes}.")
    return num_boxes


def decode_boxes_and_features(fields: Mapping, num_boxes: int) -> dict[str, np.ndarray]:
    """`boxes` (num_boxes, 4) and `features` (num_boxes, D) from their base64 float32 fields."""
    return {
        "boxes": rows_of("boxes", decode_base64_array("boxes", fields["boxes"], "<f4"), num_boxes, width=4),
        "features": rows_of("features", decode_base64_array("features", fields["features"], "<f4"), num_boxes),
    }


def check_region_record(record: dict, feature_dim: int | None, fields: dict[str, str] | None = None) -> int:
    """Checks a record (see the module docstring) and returns its feature dimension D.

    `feature_dim` is the D of the records before this one (None for the first): one store holds one D. `fields` maps
    record columns to the names the file uses (with "{image_id}" for the record's id), so that the error names what
    the user can find in the file.
    """
    fields = fields or {}
    image_id = record.get("image_id")

    def fail(column: str, problem: str) -> RecordError:  # a file's per-image name, e.g. "{image_id}_boxes", filled in
        return RecordError(fields.get(column, column).replace("{image_id}", str(image_id)), problem)

    if not isinstance(image_id, str) or not image_id or any(c in image_id for c in "\t\r\n"):
        raise fail("image_id", f"expected a non-empty id without tabs or line breaks, got {image_id!r}.")
    boxes, features = record.get("boxes"), record.get("features")
    if not isinstance(boxes, np.ndarray) or boxes.ndim != 2 or boxes.shape[1] != 4 or boxes.shape[0] < 1:
        raise fail("boxes", f"expected an array of shape (R, 4) with R >= 1, got {getattr(boxes, 'shape', boxes)!r}.")
    num_boxes = boxes.shape[0]
    if not isinstance(features, np.ndarray) or features.ndim != 2 or features.shape[0] != num_boxes or features.shape[1] < 1:
        got = getattr(features, "shape", features)
        raise fail("features", f"expected shape (R={num_boxes}, D) like `boxes`, with D >= 1, got {got!r}.")
    if feature_dim is not None and features.shape[1] != feature_dim:
        raise fail("features", f"expected D={feature_dim} values per box like the first record, got {features.shape[1]}.")
    for column in ("boxes", "features", *OPTIONAL_COLUMNS):
        if record.get(column) is None:
            continue
        values = np.asarray(record[column])
        if column in OPTIONAL_COLUMNS and values.shape != (num_boxes,):
            raise fail(column, f"expected one value per box (R={num_boxes}), got shape {values.shape}.")
        if values.dtype.kind not in "biuf":
            raise fail(column, f"expected numbers, got an array of dtype {values.dtype}.")
        if column.endswith("_ids") and not _are_integers(values):
            raise fail(column, f"expected integer ids, got {values[:5].tolist()}...")
        if not column.endswith("_ids") and (bad := int((~np.isfinite(values)).sum())):
            raise fail(column, f"expected finite values, got {bad} NaN/inf value(s).")
    size = record.get("image_size")
    if size is not None:
        if not is_pixel_size(size):
            raise fail("image_size", f"expected (height, width), two positive integers (pixels), got {short_repr(tuple(size) if isinstance(size, (list, np.ndarray)) else size)}.")
        _check_boxes_inside(boxes, height=size[0], width=size[1], fail=fail)
    else:
        _check_boxes_inside(boxes, height=np.inf, width=np.inf, fail=fail)
    return features.shape[1]


def _check_boxes_inside(boxes: np.ndarray, height: float, width: float, fail) -> None:
    x1, y1, x2, y2 = boxes.T
    # a box of zero width or height is refused here, where the file and record are known: the models refuse it too
    bad = (x1 < 0) | (y1 < 0) | (x2 > width) | (y2 > height) | (x2 <= x1) | (y2 <= y1)
    if bad.any():
        index = int(bad.argmax())
        limits = "" if np.isinf(width) else f" with image width={width:g}, height={height:g}"
        raise fail(
            "boxes",
            f"expected 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height (pixels; a box of zero width or height has no "
            f"area){limits}, got box {index} = {boxes[index].tolist()}.",
        )


def is_pixel_size(size: object) -> bool:
    """Whether `size` is (height, width): two positive integers."""
    if isinstance(size, (str, bytes)) or not isinstance(size, (Sequence, np.ndarray)) or len(size) != 2:
        return False
    return all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0 for v in size)


def _are_integers(values: np.ndarray) -> bool:
    if values.dtype.kind in "iu":
        return True
    return values.dtype.kind == "f" and bool(np.isfinite(values).all() and (values == np.round(values)).all())


# what `RegionFeatureStore.write` requires of a record given directly (file readers always give every column)
REQUIRED_COLUMNS = ("image_id", "boxes", "features")


def check_store_record(record: object, index: int, feature_dim: int | None) -> int:
    """Checks a record given to `RegionFeatureStore.write` as the file readers' records are checked
    (`check_region_record`), plus its layout: a dict with the `RECORD_COLUMNS` (`image_size` and the id / confidence
    columns may be left out or None) and nothing else. Returns its feature dimension D. The `RecordError` names the
    record (`index` counting from 0, said counting from 1 like the repeated-id error), its image id and the column."""
    where = f"`records`, record {index + 1} (counting from 1)"
    if not isinstance(record, Mapping):
        raise RecordError("", f"{where}: expected a dict with the columns {list(RECORD_COLUMNS)}, got {type(record).__name__}.")
    image_id = record.get("image_id")
    where += f", image id {image_id!r}" if isinstance(image_id, str) else ""
    unknown = [key for key in record if key not in RECORD_COLUMNS]
    if unknown:
        raise RecordError(
            str(unknown[0]),
            f"{where}: unknown column(s) {unknown}; a record has the columns {list(RECORD_COLUMNS)} (nothing else is stored).",
        )
    missing = [column for column in REQUIRED_COLUMNS if column not in record]
    if missing:
        raise RecordError(missing[0], f"{where}: missing the column(s) {missing} (has {list(record)}).")
    try:
        return check_region_record(dict(record), feature_dim)
    except RecordError as error:
        raise RecordError(error.field, f"{where}, column '{error.field}': {error}") from None


def normalise_record(record: dict) -> dict:
    """The stored form of a checked record: float32/int64 arrays, `image_size` a list or None, absent columns None."""
    size = record.get("image_size")
    out = {
        "image_id": record["image_id"],
        "image_size": None if size is None else [int(size[0]), int(size[1])],
        "boxes": np.ascontiguousarray(record["boxes"], dtype=np.float32),
        "features": np.ascontiguousarray(record["features"], dtype=np.float32),
    }
    for column, dtype in OPTIONAL_COLUMNS.items():
        values = record.get(column)
        out[column] = None if values is None else np.asarray(values, dtype=dtype)
    return out


def iter_checked_records(
    decoders: Iterable[tuple[str, RecordDecoder]],
    *,
    source: str,
    on_error: str = "raise",
    total: int | None = None,
    fields: dict[str, str] | None = None,
) -> Iterator[dict]:
    """Decodes and checks every record; bad ones raise `ValueError("<location>, field 'f': problem")` or are skipped.
    An image id that repeats always raises, naming both locations.

    With `on_error="skip"` the number of skipped records is logged as a warning at the end (each one at INFO).
    A source with no valid record at all raises, whatever `on_error` says.
    """
    feature_dim, kept, skipped = None, 0, 0
    first_location = {}  # image id -> where it was read: a repeated id is refused whatever `on_error` says
    for location, decode in tqdm(decoders, desc=f"Reading {source}", unit=" images", total=total):
        try:
            record = decode()
            feature_dim = check_region_record(record, feature_dim, fields)
        except (RecordError, *_DATA_ERRORS) as error:
            field = f", field '{error.field}'" if isinstance(error, RecordError) and error.field else ""
            problem = error if isinstance(error, RecordError) else f"unreadable record ({type(error).__name__}: {error})"
            message = f"{location}{field}: {problem}"
            if on_error == "raise":
                raise ValueError(message) from None
            skipped += 1
            logger.info("Skipping %s", message)
            continue
        image_id = record["image_id"]
        if image_id in first_location:
            raise ValueError(
                f"{location}, field 'image_id': the image id {image_id!r} repeats (first at {first_location[image_id]}); "
                "a region-feature store needs unique ids: which copy to keep is ambiguous, so none is written."
            )
        first_location[image_id] = location
        kept += 1
        yield normalise_record(record)
    if skipped:
        logger.warning(
            "Skipped %d of %d records of %s (on_error='skip'); on_error='raise' stops at the first problem.",
            skipped,
            kept + skipped,
            source,
        )
    if not kept:
        raise ValueError(f"{source}: no valid record among {skipped} record(s); expected at least one image.")
