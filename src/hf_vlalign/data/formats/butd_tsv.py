"""Bottom-up-attention region feature TSV (peteanderson80/bottom-up-attention `tools/generate_tsv.py`).

One image per line: `image_id, image_w, image_h, num_boxes, boxes, features` (width *before* height, unlike LXMERT's
TSV), the arrays as base64 of raw float32 bytes, boxes (num_boxes, 4) in pixels. No class ids; nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

from ...utils.validation import check_existing_path
from .lxmert_tsv import check_field_count, iter_tsv_rows
from .region_records import (
    check_on_error,
    decode_boxes_and_features,
    iter_checked_records,
    parse_image_size,
    parse_num_boxes,
)

FIELDS = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]


def _decode_row(row: list[str]) -> dict:
    fields = check_field_count(row, FIELDS)
    image_size = parse_image_size(fields, "image_h", "image_w")
    num_boxes = parse_num_boxes(fields["num_boxes"])
    return {"image_id": fields["image_id"], "image_size": image_size, **decode_boxes_and_features(fields, num_boxes)}


def iter_butd_tsv_records(path: str | Path, *, on_error: str = "raise") -> Iterator[dict]:
    """Streams the records of a bottom-up-attention feature TSV (e.g. `trainval_resnet101_faster_rcnn_genome_36.tsv`),
    one line at a time: `image_size` = (image_h, image_w), no object or attribute ids; `on_error` "raise" (stop at the
    first bad record) or "skip" (see `iter_checked_records`)."""
    check_on_error(on_error)
    path = check_existing_path("path", path, "bottom-up-attention feature TSV file")
    # each row is read here, decoded (and checked) lazily by the loop of `iter_checked_records`
    decoders = ((f"{path.name}, line {line}", partial(_decode_row, row)) for line, row in iter_tsv_rows(path))
    return iter_checked_records(decoders, source=str(path), on_error=on_error)
