"""Bottom-up-attention features as HDF5 (BUTD-VQA and BAN), with the published `image_id -> index` map beside them.

Two layouts, both converted from the bottom-up-attention TSV: a fixed number of boxes (hengyuan-hu/bottom-up-attention-vqa,
`image_features` (N, K, D), `image_bb` (N, K, 4), `spatial_features` (N, K, 6)) and an adaptive one (jnhwkim/ban-vqa,
the same datasets flattened over all boxes, image `i` being rows `pos_boxes[i, 0]:pos_boxes[i, 1]`). `image_bb` holds
the TSV's pixel boxes; the image size is not stored, so it is recovered from `spatial_features` (box extents divided
by the image side) and every box is checked against it. The id map is the converters' pickle (read with the
restricted unpickler of `safe_pickle`) or a JSON file `{"<image_id>": index}`.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...utils.optional import require
from ...utils.validation import check_existing_path
from .m2_hdf5 import open_hdf5
from .region_records import RecordDecoder, RecordError, check_array_size, check_on_error, iter_checked_records
from .safe_pickle import load_restricted_pickle
from .text_files import FileFormatError, read_json_file, short_repr

if TYPE_CHECKING:
    import h5py

DATASETS = ("image_features", "image_bb", "spatial_features")
FIELDS = {"image_id": "id_map", "boxes": "image_bb", "features": "image_features", "image_size": "spatial_features"}

# spatial_features are float32 ratios in [0, 1]; 1e-4 is a tenth of a pixel at 1000 pixels
_SPATIAL_TOLERANCE = 1e-4


def _read_layout(path: Path) -> tuple[bool, int, int]:
    """Checks the datasets of the file; returns (adaptive, number of images, total rows of the box arrays)."""
    h5py = require("h5py", extra="hdf5")
    with open_hdf5(path) as handle:
        missing = [name for name in DATASETS if not isinstance(handle.get(name), h5py.Dataset)]
        if missing:
            raise ValueError(f"{path}: expected the HDF5 datasets {list(DATASETS)}, missing {missing}.")
        features, boxes, spatial = (handle[name] for name in DATASETS)
        if "pos_boxes" in handle:
            positions = handle["pos_boxes"]
            _expect_shape(path, "pos_boxes", positions.shape, (None, 2))
            _expect_shape(path, "image_features", features.shape, (None, None))
            total = features.shape[0]
            _expect_shape(path, "image_bb", boxes.shape, (total, 4))
            _expect_shape(path, "spatial_features", spatial.shape, (total, 6))
            return True, positions.shape[0], total
        _expect_shape(path, "image_features", features.shape, (None, None, None))
        num_images, num_boxes = features.shape[:2]
        _expect_shape(path, "image_bb", boxes.shape, (num_images, num_boxes, 4))
        _expect_shape(path, "spatial_features", spatial.shape, (num_images, num_boxes, 6))
        return False, num_images, num_images * num_boxes


def _expect_shape(path: Path, name: str, shape: tuple, expected: tuple) -> None:
    """`expected` uses None for any size."""
    if len(shape) != len(expected) or any(
        want is not None and got != want for got, want in zip(shape, expected, strict=True)
    ):
        readable = tuple("*" if want is None else want for want in expected)
        raise ValueError(f"{path}: expected dataset '{name}' of shape {readable}, got {shape}.")


def load_id_map(id_map: str | Path | Mapping, num_images: int | None = None) -> dict[str, int]:
    """The `image_id -> index` map (a pickle or JSON file, or a mapping) as {str(image_id): index}, checked.

    A `.json` file is read as JSON; any other file as a restricted pickle (`*_imgid2idx.pkl`). With `num_images`,
    every index must be below it.
    """
    if isinstance(id_map, Mapping):
        where, raw = "`id_map`", id_map
    elif isinstance(id_map, (str, Path)) and Path(id_map).is_file():
        where, raw = f"`id_map` {id_map}", _read_id_map_file(Path(id_map))
    else:
        raise ValueError(
            f"`id_map` must be a dict or an existing .pkl/.json file of image_id -> index, got {id_map!r}."
        )
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(
            f"{where}: expected a non-empty dict of image_id -> index, got {type(raw).__name__} {short_repr(raw, 60)}."
        )
    checked, owner_of = {}, {}
    for key, index in raw.items():
        if isinstance(key, bool) or not isinstance(key, (numbers.Integral, str)):
            raise ValueError(f"{where}: expected int or str image ids, got {type(key).__name__} {key!r}.")
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0:
            raise ValueError(f"{where}: expected a non-negative int index for image_id {key!r}, got {index!r}.")
        if num_images is not None and index >= num_images:
            raise ValueError(f"{where}: index {index} of image_id {key!r} is outside the file's {num_images} images.")
        if index in owner_of:
            raise ValueError(f"{where}: index {index} is given to both image_id {owner_of[index]!r} and {key!r}.")
        if str(key) in checked:
            raise ValueError(f"{where}: image_id {str(key)!r} appears twice (as {key!r} and as another type).")
        owner_of[index] = key
        checked[str(key)] = int(index)
    return checked


def _read_id_map_file(path: Path) -> object:
    if path.suffix.lower() != ".json":
        return load_restricted_pickle(path)
    try:
        return read_json_file(path)
    except FileFormatError as error:
        raise FileFormatError(f"`id_map` {error}") from None


def _decode_image(handle: h5py.File, index: int, image_id: str, adaptive: bool, total_rows: int) -> dict:
    rows = _rows_of_image(handle, index, total_rows) if adaptive else index
    features, boxes, spatial = (_read_rows(handle, name, rows) for name in DATASETS)
    for name, values in (("image_bb", boxes), ("spatial_features", spatial)):  # before the size is derived from them
        if not np.isfinite(values).all():
            raise RecordError(name, f"expected finite values, got {int((~np.isfinite(values)).sum())} NaN/inf value(s).")
    return {
        "image_id": image_id,
        "image_size": image_size_from_spatial(boxes, spatial),
        "boxes": boxes,
        "features": features,
    }


def _read_rows(handle: h5py.File, name: str, rows: int | slice) -> np.ndarray:
    dataset = handle[name]
    count = 1 if isinstance(rows, int) else rows.stop - rows.start
    check_array_size(name, (count, *dataset.shape[1:]), dataset.dtype)
    try:
        return dataset[rows]
    except OSError as error:  # a damaged chunk: a problem of this image only
        raise RecordError(name, f"expected readable data, got an HDF5 error ({error}).") from None


def _rows_of_image(handle: h5py.File, index: int, total_rows: int) -> slice:
    start, end = (int(value) for value in handle["pos_boxes"][index])
    if not 0 <= start < end <= total_rows:
        raise RecordError(
            "pos_boxes",
            f"expected 0 <= start < end <= {total_rows} (the rows of image_features), got [{start}, {end}].",
        )
    return slice(start, end)


def image_size_from_spatial(boxes: np.ndarray, spatial: np.ndarray) -> tuple[int, int]:
    """(height, width) in pixels from `image_bb` and `spatial_features`; a RecordError if they disagree."""
    boxes, spatial = np.asarray(boxes, dtype=np.float64), np.asarray(spatial, dtype=np.float64)
    box_widths, box_heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    width = _recover_side("width", box_widths, spatial[:, 4])
    height = _recover_side("height", box_heights, spatial[:, 5])
    scale = np.array([width, height, width, height], dtype=np.float64)
    expected = np.concatenate([boxes / scale, (box_widths / width)[:, None], (box_heights / height)[:, None]], axis=1)
    wrong = np.abs(spatial - expected).max(axis=1) > _SPATIAL_TOLERANCE
    if wrong.any():
        box = int(wrong.argmax())
        raise RecordError(
            "spatial_features",
            f"expected (x1/w, y1/h, x2/w, y2/h, (x2-x1)/w, (y2-y1)/h) of image_bb with the recovered image "
            f"width={width}, height={height}, got {spatial[box].round(6).tolist()} for box {box} = "
            f"{boxes[box].tolist()} (expected {expected[box].round(6).tolist()}).",
        )
    return height, width


def _recover_side(side: str, lengths: np.ndarray, fractions: np.ndarray) -> int:
    """One image side from the box of largest extent along it: length / (length / side)."""
    usable = np.flatnonzero((lengths > 0) & (fractions > 0))
    if usable.size == 0:
        raise RecordError(
            "spatial_features",
            f"cannot recover the image {side}: no box has a nonzero {side} in both image_bb and spatial_features.",
        )
    largest = usable[lengths[usable].argmax()]
    recovered = round(float(lengths[largest] / fractions[largest]))
    if recovered <= 0:
        raise RecordError(
            "spatial_features", f"expected a positive image {side}, recovered {recovered} from box {largest}."
        )
    return recovered


def _iter_decoders(
    path: Path, ordered: list[tuple[str, int]], adaptive: bool, total_rows: int
) -> Iterator[tuple[str, RecordDecoder]]:
    with open_hdf5(path) as handle:
        for image_id, index in ordered:
            location = f"{path.name}, image index {index} (image_id {image_id})"
            yield location, partial(_decode_image, handle, index, image_id, adaptive, total_rows)


def iter_butd_h5_records(path: str | Path, *, id_map: str | Path | Mapping, on_error: str = "raise") -> Iterator[dict]:
    """Streams the records of a BUTD-VQA / BAN feature HDF5 file (`train36.hdf5`, BAN's `train.hdf5`, ...; the layout
    is told by `pos_boxes`), one image at a time: `image_id` = str(id map key), `image_size` recovered from
    `spatial_features`, no object or attribute ids. `id_map` (`image_id -> index`: the published pickle
    `train36_imgid2idx.pkl`, a JSON file `{"<image_id>": index}` or a dict) names the images read, in index order;
    `on_error` "raise" (stop at the first bad record) or "skip" (see `iter_checked_records`).
    """
    check_on_error(on_error)
    path = check_existing_path("path", path, "BUTD/BAN feature HDF5 file")
    adaptive, num_images, total_rows = _read_layout(path)
    ids = load_id_map(id_map, num_images)
    ordered = sorted(ids.items(), key=lambda item: item[1])
    decoders = _iter_decoders(path, ordered, adaptive, total_rows)
    return iter_checked_records(decoders, source=str(path), on_error=on_error, total=len(ordered), fields=FIELDS)
