"""VL-BERT per-image Faster R-CNN JSON (jackroos/VL-BERT), in a folder or in an uncompressed zip of such files.

One `{image_id:08d}.json` per image: {"image_id", "image_h", "image_w", "num_boxes", "boxes", "classes", "attrs",
"features"}, the arrays as base64 of raw float32 bytes, boxes in pixels. `object_ids` / `attr_ids` are the argmax
over the `classes` / `attrs` scores, leaving out column 0 (background / no attribute) when there are 1601 / 401
columns (LXMERT's convention); `classes` and `attrs` are optional.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from ...utils.validation import check_existing_path
from .m2_hdf5 import NUM_VG_CLASSES_WITH_BACKGROUND, classes_from_scores, sorted_ids
from .region_records import (
    RecordDecoder,
    RecordError,
    check_on_error,
    decode_base64_array,
    decode_boxes_and_features,
    iter_checked_records,
    parse_image_size,
    parse_num_boxes,
    rows_of,
)
from .text_files import FileFormatError, decode_utf8, parse_json

REQUIRED_KEYS = ("image_id", "image_h", "image_w", "num_boxes", "boxes", "features")
NUM_VG_ATTRIBUTES_WITH_NONE = 401
FIELDS = {"object_ids": "classes", "object_conf": "classes", "attr_ids": "attrs", "attr_conf": "attrs"}


def _decode_json(text: bytes) -> dict:
    try:
        data = parse_json(decode_utf8(text, "the text"), "the text")
    except FileFormatError as error:
        raise RecordError("", f"expected a JSON object, got undecodable text ({error})") from None
    if not isinstance(data, dict):
        raise RecordError("", f"expected a JSON object, got {type(data).__name__}.")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise RecordError(missing[0], f"expected the keys {list(REQUIRED_KEYS)}, missing {missing}.")
    if isinstance(data["image_id"], (dict, list, bool)) or data["image_id"] is None:
        raise RecordError("image_id", f"expected an int or string id, got {data['image_id']!r}.")
    image_size = parse_image_size(data, "image_h", "image_w")
    num_boxes = parse_num_boxes(data["num_boxes"])
    record = {"image_id": str(data["image_id"]), "image_size": image_size, **decode_boxes_and_features(data, num_boxes)}
    for key, columns, with_background in (
        ("classes", ("object_ids", "object_conf"), NUM_VG_CLASSES_WITH_BACKGROUND),
        ("attrs", ("attr_ids", "attr_conf"), NUM_VG_ATTRIBUTES_WITH_NONE),
    ):
        if key in data:
            scores = rows_of(key, decode_base64_array(key, data[key], "<f4"), num_boxes)
            record.update(zip(columns, classes_from_scores(scores, with_background), strict=True))
    return record


def _by_id(names: list[str]) -> list[str]:
    """JSON file names sorted like their ids (numerically when all are numbers)."""
    stem_of = {name: Path(name).stem for name in names}
    order = {stem: position for position, stem in enumerate(sorted_ids(sorted(set(stem_of.values()))))}
    return sorted(names, key=lambda name: (order[stem_of[name]], name))


def _json_files(path: Path) -> list[Path]:
    files = [file for file in path.iterdir() if file.suffix.lower() == ".json" and file.is_file()]
    if not files:
        raise ValueError(f"`path` {path}: expected per-image VL-BERT .json files, found none.")
    by_name = {file.name: file for file in files}
    return [by_name[name] for name in _by_id(list(by_name))]


def _zip_members(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            members = [info.filename for info in archive.infolist() if not info.is_dir()]
    except (zipfile.BadZipFile, OSError) as error:
        raise ValueError(f"`path` {path} is not a readable zip file ({error}).") from None
    members = [name for name in members if name.lower().endswith(".json")]
    if not members:
        raise ValueError(f"`path` {path}: expected per-image VL-BERT .json members, found none.")
    return _by_id(members)


def _decode_member(archive: zipfile.ZipFile, member: str) -> dict:
    try:
        text = archive.read(member)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise RecordError("", f"expected a readable zip member, got an error ({error}).") from None
    return _decode_json(text)


def _decode_file(file: Path) -> dict:
    return _decode_json(file.read_bytes())


def _iter_zip_decoders(path: Path, members: list[str]) -> Iterator[tuple[str, RecordDecoder]]:
    with zipfile.ZipFile(path) as archive:
        for member in members:
            yield f"{path.name}:{member}", partial(_decode_member, archive, member)


def iter_vlbert_json_records(path: str | Path, *, on_error: str = "raise") -> Iterator[dict]:
    """Streams the records of VL-BERT's per-image Faster R-CNN JSON files, a folder of `<id>.json` or a zip of them
    (`train_frcnn.zip`), one file at a time, sorted by file id; `on_error` "raise" or "skip" (see
    `iter_checked_records`)."""
    check_on_error(on_error)
    path = check_existing_path("path", path, "folder or .zip of VL-BERT per-image JSON files", kind="any")
    if path.is_dir():
        files = _json_files(path)
        decoders = ((f"{path.name}/{file.name}", partial(_decode_file, file)) for file in files)
        total = len(files)
    else:
        members = _zip_members(path)
        decoders, total = _iter_zip_decoders(path, members), len(members)
    return iter_checked_records(decoders, source=str(path), on_error=on_error, total=total, fields=FIELDS)
