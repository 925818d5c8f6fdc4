"""Meshed-memory transformer detections HDF5 (`coco_detections.hdf5`, aimagelab/meshed-memory-transformer).

Per image, datasets named by the COCO id at the root: `<id>_features` (R, D), `<id>_boxes` (R, 4) pixels and
`<id>_cls_prob` (R, 1601), whose argmax over the object columns gives `object_ids` / `object_conf`. The image size is
not stored: pass `image_sizes` (a dict or COCO's annotation JSON), or `image_size` is None.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...utils.optional import require
from ...utils.validation import check_existing_path
from .region_records import (
    RecordDecoder,
    RecordError,
    check_array_size,
    check_on_error,
    is_pixel_size,
    iter_checked_records,
)
from .text_files import FileFormatError, read_json_file

if TYPE_CHECKING:
    import h5py

FEATURES_SUFFIX, BOXES_SUFFIX, CLASSES_SUFFIX = "_features", "_boxes", "_cls_prob"
NUM_VG_CLASSES_WITH_BACKGROUND = 1601  # Visual Genome's 1600 object classes + background (column 0)


def classes_from_scores(
    scores: np.ndarray, with_background: int = NUM_VG_CLASSES_WITH_BACKGROUND
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, confidences) of the best class of each box from (R, C) scores.

    When C == `with_background` the first column is the detector's background and is left out, so ids are 0-based
    over the real classes (1601 -> 1600 Visual Genome objects, 401 -> 400 attributes); otherwise all columns count.
    """
    scores = np.asarray(scores)
    first = 1 if scores.shape[1] == with_background else 0
    ids = scores[:, first:].argmax(axis=1)
    return ids.astype(np.int64), scores[np.arange(len(scores)), ids + first].astype(np.float32)


def load_image_sizes(image_sizes: None | str | Path | Mapping) -> dict[str, tuple[int, int]] | None:
    """`image_sizes` as {str(image_id): (height, width)}: None, a mapping, or a COCO-style JSON file whose
    `images` list holds {"id", "width", "height"} (e.g. `captions_train2014.json`)."""
    if image_sizes is None:
        return None
    if isinstance(image_sizes, Mapping):
        where, pairs = "`image_sizes`", list(image_sizes.items())
    elif isinstance(image_sizes, (str, Path)) and Path(image_sizes).is_file():
        where, pairs = f"`image_sizes` {image_sizes}", _coco_image_sizes(Path(image_sizes))
    else:
        raise ValueError(
            "`image_sizes` must be None, a dict {image_id: (height, width)} or an existing COCO-style JSON file, "
            f"got {image_sizes!r}."
        )
    sizes = {}
    for image_id, size in pairs:
        if not is_pixel_size(size):
            raise ValueError(f"{where}: expected (height, width) positive ints for image {image_id!r}, got {size!r}.")
        sizes[str(image_id)] = (int(size[0]), int(size[1]))
    return sizes


def _coco_image_sizes(path: Path) -> list[tuple[object, tuple]]:
    try:
        content = read_json_file(path)
    except FileFormatError as error:
        raise FileFormatError(f"`image_sizes` {error} Expected a COCO-style JSON object.") from None
    images = content.get("images") if isinstance(content, dict) else None
    if not isinstance(images, list) or not all(isinstance(image, dict) for image in images):
        raise ValueError(f"`image_sizes` {path}: expected an 'images' list of {{'id', 'width', 'height'}} objects.")
    missing = [image for image in images if not {"id", "width", "height"} <= image.keys()]
    if missing:
        raise ValueError(
            f"`image_sizes` {path}: expected 'id', 'width' and 'height' in every image, got {missing[0]!r}."
        )
    return [(image["id"], (image["height"], image["width"])) for image in images]


def size_of(image_sizes: dict[str, tuple[int, int]] | None, image_id: str) -> tuple[int, int] | None:
    """The size of one image, None without `image_sizes`; a RecordError when `image_sizes` lacks the image."""
    if image_sizes is None:
        return None
    if image_id not in image_sizes:
        raise RecordError("image_sizes", f"expected the size of image {image_id!r}, which `image_sizes` does not give.")
    return image_sizes[image_id]


def sorted_ids(ids: list[str]) -> list[str]:
    """Numerically when every id is a number (COCO ids), else as strings."""
    if all(image_id.isdigit() for image_id in ids):
        return sorted(ids, key=int)
    return sorted(ids)


def open_hdf5(path: Path) -> h5py.File:
    """The HDF5 file at `path`, open for reading; a ValueError naming it when it is not one."""
    h5py = require("h5py", extra="hdf5")
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"`path` {path} is not a readable HDF5 file ({error}).") from None


def _image_ids(path: Path) -> list[str]:
    with open_hdf5(path) as handle:
        ids = [name[: -len(FEATURES_SUFFIX)] for name in handle.keys() if name.endswith(FEATURES_SUFFIX)]
    if not ids:
        raise ValueError(f"{path}: expected datasets named '<image_id>{FEATURES_SUFFIX}' at the root, found none.")
    return sorted_ids(ids)


def _read_dataset(handle: h5py.File, name: str) -> np.ndarray:
    h5py = require("h5py", extra="hdf5")
    dataset = handle.get(name)
    if not isinstance(dataset, h5py.Dataset):
        raise RecordError(name, "expected this dataset beside the image's features, it is missing.")
    check_array_size(name, dataset.shape, dataset.dtype)
    try:
        return np.asarray(dataset[()])
    except OSError as error:  # a damaged chunk: a problem of this image only
        raise RecordError(name, f"expected readable data, got an HDF5 error ({error}).") from None


def _decode_image(handle: h5py.File, image_id: str, image_sizes: dict | None, use_cls_prob: bool) -> dict:
    names = {suffix: f"{image_id}{suffix}" for suffix in (FEATURES_SUFFIX, BOXES_SUFFIX, CLASSES_SUFFIX)}
    features = _read_dataset(handle, names[FEATURES_SUFFIX])
    boxes = _read_dataset(handle, names[BOXES_SUFFIX])
    record = {"image_id": image_id, "image_size": size_of(image_sizes, image_id), "boxes": boxes, "features": features}
    if use_cls_prob and names[CLASSES_SUFFIX] in handle:
        scores = _read_dataset(handle, names[CLASSES_SUFFIX])
        if scores.ndim != 2 or scores.shape[1] < 2:
            raise RecordError(
                names[CLASSES_SUFFIX],
                f"expected (R, C) class probabilities with C >= 2, got {scores.shape} (pass use_cls_prob=False to read features and boxes only).",
            )
        record["object_ids"], record["object_conf"] = classes_from_scores(scores)
    return record


def _iter_decoders(
    path: Path, image_ids: list[str], image_sizes: dict | None, use_cls_prob: bool
) -> Iterator[tuple[str, RecordDecoder]]:
    with open_hdf5(path) as handle:
        for image_id in image_ids:
            yield f"{path.name}, image {image_id}", partial(_decode_image, handle, image_id, image_sizes, use_cls_prob)


def iter_m2_hdf5_records(
    path: str | Path,
    *,
    image_sizes: None | str | Path | Mapping = None,
    use_cls_prob: bool = True,
    on_error: str = "raise",
) -> Iterator[dict]:
    """Streams the records of a meshed-memory transformer `coco_detections.hdf5`, one image at a time, in numeric id
    order. `image_sizes`: None (`image_size` None), a dict {image_id: (height, width)} or a COCO-style annotation JSON
    (`images`: [{"id", "width", "height"}]; an image it lacks is a bad record); `use_cls_prob`: derive `object_ids` /
    `object_conf` from `<id>_cls_prob` where present; `on_error`: "raise" or "skip" (see `iter_checked_records`).
    """
    check_on_error(on_error)
    path = check_existing_path("path", path, "meshed-memory transformer detections HDF5 file")
    sizes = load_image_sizes(image_sizes)
    image_ids = _image_ids(path)
    decoders = _iter_decoders(path, image_ids, sizes, use_cls_prob)
    suffixes = {"boxes": BOXES_SUFFIX, "features": FEATURES_SUFFIX, "object_ids": CLASSES_SUFFIX, "object_conf": CLASSES_SUFFIX}
    fields = {column: "{image_id}" + suffix for column, suffix in suffixes.items()}
    return iter_checked_records(decoders, source=str(path), on_error=on_error, total=len(image_ids), fields=fields)
