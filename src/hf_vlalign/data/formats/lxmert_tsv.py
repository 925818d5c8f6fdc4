"""LXMERT / bottom-up-attention region feature TSV: one image per line, 10 tab-separated fields.

Fields (LXMERT's `FIELDNAMES`) as below; arrays are base64 of their raw little-endian bytes: `objects_id`/`attrs_id`
int64, `objects_conf`/`attrs_conf` float32, `boxes` float32 (num_boxes, 4) pixels, `features` float32 (num_boxes, D).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ...utils.validation import check_existing_path
from .region_records import (
    OPTIONAL_COLUMNS,
    RecordError,
    check_on_error,
    decode_base64_array,
    decode_boxes_and_features,
    encode_base64_array,
    iter_checked_records,
    parse_int,
    parse_num_boxes,
)
from .text_files import decode_utf8, iter_csv_rows

FIELDS = [
    "img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "num_boxes", "boxes",
    "features",
]  # fmt: skip

# record column -> TSV field
FIELD_OF_COLUMN = {
    "image_id": "img_id",
    "image_size": "img_h",
    "object_ids": "objects_id",
    "object_conf": "objects_conf",
    "attr_ids": "attrs_id",
    "attr_conf": "attrs_conf",
    "boxes": "boxes",
    "features": "features",
}
FIELD_SIZE_LIMIT = 2**31 - 1  # a 36 x 2048 float32 feature field is ~400k base64 characters, over csv's default


def count_lines(path: Path) -> int:
    """Lines of a text file (a last line without a line break counts), read in 16 MB chunks."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            count, last = count + chunk.count(b"\n"), chunk[-1:]
    return count + (last != b"\n")


def iter_tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a tab-separated file with huge fields, streamed line by line."""
    csv.field_size_limit(FIELD_SIZE_LIMIT)
    with open(path, "rb") as handle:
        lines = (decode_utf8(line, path, first_line=number) for number, line in enumerate(handle, start=1))
        yield from iter_csv_rows(path, lines, "TSV", delimiter="\t", quoting=csv.QUOTE_NONE)


def check_field_count(row: list[str], fields: list[str]) -> dict[str, str]:
    if len(row) != len(fields):
        raise RecordError("", f"expected {len(fields)} tab-separated fields ({', '.join(fields)}), got {len(row)}.")
    return dict(zip(fields, row))


def _decode_row(row: list[str]) -> dict:
    fields = check_field_count(row, FIELDS)
    height, width = parse_int("img_h", fields["img_h"]), parse_int("img_w", fields["img_w"])
    num_boxes = parse_num_boxes(fields["num_boxes"])
    record = {"image_id": fields["img_id"], "image_size": (height, width)}
    for column, dtype in OPTIONAL_COLUMNS.items():
        record[column] = decode_base64_array(FIELD_OF_COLUMN[column], fields[FIELD_OF_COLUMN[column]], dtype)
    return record | decode_boxes_and_features(fields, num_boxes)


def iter_lxmert_tsv_records(path: str | Path, *, on_error: str = "raise") -> Iterator[dict]:
    """Streams an LXMERT feature TSV as store records (one per line), with a progress bar; `on_error` "raise" (stop
    at the first bad line) or "skip" (see `iter_checked_records`)."""
    path = check_existing_path("path", path, "LXMERT feature TSV file")
    check_on_error(on_error)
    decoders = ((f"{path}, line {line}", lambda row=row: _decode_row(row)) for line, row in iter_tsv_rows(path))
    return iter_checked_records(
        decoders, source=str(path), on_error=on_error, total=count_lines(path), fields=FIELD_OF_COLUMN
    )


def _encode_record(record: dict) -> list[str]:
    """A store record (arrays, or tensors of a store in torch format) -> the 10 TSV fields."""
    height, width = (int(side) for side in record["image_size"])
    row = {"img_id": record["image_id"], "img_h": str(height), "img_w": str(width), "num_boxes": str(len(record["boxes"]))}
    for column, dtype in {**OPTIONAL_COLUMNS, "boxes": np.dtype("<f4"), "features": np.dtype("<f4")}.items():
        values = record[column]
        row[FIELD_OF_COLUMN[column]] = encode_base64_array(values.numpy() if hasattr(values, "numpy") else values, dtype)
    return [row[name] for name in FIELDS]


def write_lxmert_tsv(path: str | Path, records: Iterable[dict]) -> int:
    """Writes store records (every column present) as an LXMERT TSV; returns how many. On an error nothing is left
    behind at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    try:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            for count, record in enumerate(records, start=1):
                handle.write("\t".join(_encode_record(record)) + "\n")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return count
