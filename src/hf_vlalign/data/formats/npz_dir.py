"""Per-image NumPy files: the `<name>_att` / `<name>_box` folders of ruotianluo/self-critical.pytorch, and kin.

`<name>_att/<id>.npz` holds the (R, D) features under `feat` (or a bare `.npy`), `<name>_box/<id>.npy` the (R, 4)
pixel boxes. The keys of MILVLG/bottom-up-attention.pytorch (`x`, `bbox`, `num_bbox`, `image_h`, `image_w`) and
LXMERT's `objects_id`, `objects_conf`, `attrs_id`, `attrs_conf` are read where present; pickled object arrays (its
`info`) are never loaded. The image size comes from `image_h`/`image_w`, else from `image_sizes`, else it is None.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path

import numpy as np

from ...utils.size_limits import MAX_ARRAY_BYTES
from ...utils.validation import check_existing_path
from .m2_hdf5 import load_image_sizes, size_of, sorted_ids
from .region_records import RecordError, check_on_error, iter_checked_records

FEATURE_KEYS = ("feat", "x")  # self-critical.pytorch, MILVLG bottom-up-attention.pytorch
OPTIONAL_KEYS = {
    "objects_id": "object_ids",
    "objects_conf": "object_conf",
    "attrs_id": "attr_ids",
    "attrs_conf": "attr_conf",
}
SUFFIXES = (".npz", ".npy")


def _feature_files(path: Path) -> list[tuple[str, Path]]:
    """(image_id, file) of every `<id>.npz` / `<id>.npy` in the folder, sorted by id."""
    files = {}
    for file in path.iterdir():
        if file.suffix.lower() not in SUFFIXES or not file.is_file():
            continue
        if file.stem in files:
            raise ValueError(
                f"`path` {path}: image {file.stem!r} has two feature files, {files[file.stem].name} and {file.name}."
            )
        files[file.stem] = file
    if not files:
        raise ValueError(
            f"`path` {path}: expected per-image feature files <image_id>.npz or <image_id>.npy, found none."
        )
    return [(image_id, files[image_id]) for image_id in sorted_ids(list(files))]


def _resolve_box_dir(path: Path, box_dir: str | Path | None) -> Path | None:
    """`box_dir` when given (it must exist); else the `_box` sibling of an `_att` folder when there is one."""
    if box_dir is not None:
        if not isinstance(box_dir, (str, Path)) or not Path(box_dir).is_dir():
            raise ValueError(f"`box_dir` must be an existing folder of <image_id>.npy boxes, got {box_dir!r}.")
        return Path(box_dir)
    cut = path.name.rfind("_att")
    if cut < 0:
        return None
    sibling = path.with_name(path.name[:cut] + "_box" + path.name[cut + len("_att") :])
    return sibling if sibling.is_dir() else None


def _load_arrays(file: Path) -> dict[str, np.ndarray]:
    """The arrays this reader uses from one feature file (never the pickled ones)."""
    if file.suffix.lower() == ".npy":
        return {"feat": _load_npy(file, field="")}
    try:
        with zipfile.ZipFile(file) as archive:
            members = set(archive.namelist())
            arrays = {}
            for key in (*FEATURE_KEYS, "bbox", "num_bbox", "image_h", "image_w", *OPTIONAL_KEYS):
                if f"{key}.npy" in members:
                    with archive.open(f"{key}.npy") as handle:
                        arrays[key] = _read_npy(handle, archive.getinfo(f"{key}.npy").file_size, key)
            return arrays
    except (OSError, EOFError, zipfile.BadZipFile) as error:
        raise RecordError("", f"expected a readable .npz file written by NumPy, got an error ({error}).") from None


def _load_npy(file: Path, field: str) -> np.ndarray:
    """One `.npy` array, never unpickled; a RecordError naming `field` when the file is not a plain NumPy array."""
    try:
        with open(file, "rb") as handle:
            return _read_npy(handle, file.stat().st_size, field)
    except OSError as error:
        raise RecordError(field, f"expected a readable .npy file, got an error ({error}).") from None


def _read_npy(handle, size: int, field: str) -> np.ndarray:
    """The array of a `.npy` stream of `size` bytes. Its header is checked before anything is allocated: NumPy would
    allocate the declared array first, and a small (compressed) file can declare gigabytes. Refused: a header NumPy
    cannot parse, a dtype that is not numbers (nothing is unpickled), and more bytes than the file holds or than
    `MAX_ARRAY_BYTES`."""
    try:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
    except Exception as error:  # noqa: BLE001 - NumPy parses the header with ast: ValueError, SyntaxError, ...
        raise RecordError(field, f"expected a .npy file written by NumPy, got an unreadable header ({type(error).__name__}: {error}).") from None
    if dtype.kind not in "biuf":
        raise RecordError(field, f"expected an array of numbers, got the dtype {dtype} (nothing is unpickled).")
    declared, held = math.prod(shape) * dtype.itemsize, size - handle.tell()
    if declared > min(held, MAX_ARRAY_BYTES):
        raise RecordError(
            field,
            f"the .npy header declares shape {shape} of {dtype} ({declared} bytes); the file holds {held}, and one array "
            f"may have at most MAX_ARRAY_BYTES = {MAX_ARRAY_BYTES} (hf_vlalign.utils.size_limits).",
        )
    data = handle.read(declared)
    if len(data) != declared:
        raise RecordError(field, f"expected {declared} bytes of array data, the file ends after {len(data)}.")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")


def _load_boxes(arrays: dict, box_file: Path | None) -> np.ndarray:
    """The box file when there is one, else the file's own `bbox`."""
    if box_file is not None and box_file.is_file():
        return _load_npy(box_file, field=f"{box_file.parent.name}/{box_file.name}")
    if "bbox" in arrays:
        return arrays["bbox"]
    where = f"no {box_file}" if box_file is not None else "no box folder: pass `box_dir`"
    raise RecordError("bbox", f"expected boxes in the file's 'bbox' or in a box file; found neither ({where}).")


def _decode_file(file: Path, image_id: str, box_file: Path | None, image_sizes: dict | None) -> dict:
    arrays = _load_arrays(file)
    feature_key = next((key for key in FEATURE_KEYS if key in arrays), None)
    if feature_key is None:
        raise RecordError("feat", f"expected the features under one of {list(FEATURE_KEYS)}, got keys {sorted(arrays)}.")
    features = arrays[feature_key]
    if "num_bbox" in arrays and _scalar("num_bbox", arrays["num_bbox"]) != len(features):
        raise RecordError("num_bbox", f"expected the {len(features)} rows of '{feature_key}', got {arrays['num_bbox']}.")
    record = {
        "image_id": image_id,
        "image_size": _image_size(arrays, image_id, image_sizes),
        "boxes": _load_boxes(arrays, box_file),
        "features": features,
    }
    for key, column in OPTIONAL_KEYS.items():
        if key in arrays:
            record[column] = arrays[key]
    return record


def _image_size(arrays: dict, image_id: str, image_sizes: dict | None) -> tuple[int, int] | None:
    if "image_h" in arrays and "image_w" in arrays:
        return _scalar("image_h", arrays["image_h"]), _scalar("image_w", arrays["image_w"])
    return size_of(image_sizes, image_id)


def _scalar(key: str, value: np.ndarray) -> int:
    if np.size(value) != 1 or not np.issubdtype(np.asarray(value).dtype, np.number):
        raise RecordError(key, f"expected one number, got {value!r}.")
    return int(np.asarray(value).reshape(()))


def iter_npz_dir_records(
    path: str | Path,
    *,
    box_dir: str | Path | None = None,
    image_sizes: None | str | Path | Mapping = None,
    on_error: str = "raise",
) -> Iterator[dict]:
    """Streams the records of a folder of per-image `.npz`/`.npy` feature files (self-critical.pytorch's `cocobu_att`),
    one file at a time, `image_id` = the file stem, sorted by id. `box_dir`: the folder of `<id>.npy` boxes, by default
    the `_box` sibling of an `_att` folder (files with their own `bbox` need none); `image_sizes`: as for `m2_hdf5`,
    for files without `image_h`/`image_w`; `on_error`: "raise" or "skip" (see `iter_checked_records`).
    """
    check_on_error(on_error)
    path = check_existing_path("path", path, "folder of per-image .npz/.npy feature files", kind="dir")
    boxes = _resolve_box_dir(path, box_dir)
    sizes = load_image_sizes(image_sizes)
    files = _feature_files(path)
    box_files = [None if boxes is None else boxes / f"{image_id}.npy" for image_id, _ in files]
    decoders = (
        (f"{path.name}/{file.name}", partial(_decode_file, file, image_id, box_file, sizes))
        for (image_id, file), box_file in zip(files, box_files)
    )
    fields = {"features": "feat", "boxes": "bbox" if boxes is None else f"{boxes.name}/{{image_id}}.npy"}
    return iter_checked_records(decoders, source=str(path), on_error=on_error, total=len(files), fields=fields)
