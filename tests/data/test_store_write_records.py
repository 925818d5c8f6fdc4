"""Records given directly to `RegionFeatureStore.write` (issue 32) are checked like the file readers' records: each bad
record raises a `ValueError` naming the record (counting from 1), its image id and the column, before any store is
written; zero-area boxes are refused here, not later in a model's forward."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hf_vlalign.data import RegionFeatureStore

NAN, INF = float("nan"), float("inf")


def good(image_id: str = "img1", **changes) -> dict:
    record = {
        "image_id": image_id,
        "image_size": (40, 60),
        "boxes": np.array([[0, 0, 10, 10], [5, 5, 30, 20]], np.float32),
        "features": np.ones((2, 3), np.float32),
        "object_ids": np.array([1, 2]),
        "object_conf": np.array([0.5, 0.9], np.float32),
        "attr_ids": None,
        "attr_conf": None,
    }
    record.update(changes)
    return record


def without(column: str) -> dict:
    return {key: value for key, value in good().items() if key != column}


def boxes(*rows) -> np.ndarray:
    return np.array(rows, np.float32)


# one record per kind of refusal: (record, column named, what the message says)
BAD_RECORDS = {
    "not a dict (str)": ("img", None, r"expected a dict with the columns .*, got str"),
    "unknown column": (good(score=1.0), None, r"unknown column\(s\) \['score'\]"),
    "no boxes": (without("boxes"), None, r"missing the column\(s\) \['boxes'\]"),
    "image id with a tab": (good("a\tb"), "image_id", r"without tabs or line breaks"),
    "boxes of 5 values": (good(boxes=np.ones((2, 5), np.float32)), "boxes", r"shape \(R, 4\) .*got \(2, 5\)"),
    "boxes NaN": (good(boxes=boxes([0, 0, 10, 10], [NAN, 5, 30, 20])), "boxes", r"finite values, got 1 NaN/inf"),
    "zero-width box": (good(boxes=boxes([0, 0, 10, 10], [5, 5, 5, 20])), "boxes",
                       r"0 <= x1 < x2 <= width .*zero width or height .*got box 1 = \[5.0, 5.0, 5.0, 20.0\]"),
    "box past the width": (good(boxes=boxes([0, 0, 10, 10], [5, 5, 61, 20])), "boxes",
                           r"with image width=60, height=40, got box 1"),
    "features of another R": (good(features=np.ones((3, 3), np.float32)), "features", r"\(R=2, D\) .*got \(3, 3\)"),
    "features of objects": (good(features=np.array([[None] * 3] * 2)), "features", r"expected numbers, got .*object"),
    "image size a string": (good(image_size="40x60"), "image_size", r"two positive integers \(pixels\), got '40x60'"),
    "object ids of another R": (good(object_ids=np.array([1, 2, 3])), "object_ids", r"one value per box \(R=2\), got shape \(3,\)"),
    "object ids fractional": (good(object_ids=np.array([1.5, 2.0])), "object_ids", r"expected integer ids"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_RECORDS)
def test_bad_record_is_refused_naming_record_image_and_column(name, tmp_path):
    record, column, problem = BAD_RECORDS[name]
    position = 2
    records = [good(f"ok{i}") for i in range(1, position)] + [record, good("after")]
    image = rf", image id {record['image_id']!r}" if isinstance(record, dict) and isinstance(record.get("image_id"), str) else ""
    named_column = rf", column '{column}': " if column else ": "
    match = rf"^`records`, record {position} \(counting from 1\){re.escape(image)}{named_column}.*{problem}"
    with pytest.raises(ValueError, match=match):
        RegionFeatureStore.write(records, tmp_path / "store")
    assert list(tmp_path.iterdir()) == []  # nothing written, no partial folder left


def test_feature_dimension_differing_from_the_first_record_names_the_record(tmp_path):
    records = [good("a"), good("b", features=np.ones((2, 4), np.float32))]
    match = r"`records`, record 2 \(counting from 1\), image id 'b', column 'features': expected D=3 values per box"
    with pytest.raises(ValueError, match=match):
        RegionFeatureStore.write(records, tmp_path / "store")


def test_repeated_image_id_names_both_records(tmp_path):
    with pytest.raises(ValueError, match=r"image id 'a' of record 3 repeats record 1"):
        RegionFeatureStore.write([good("a"), good("b"), good("a")], tmp_path / "store")


def test_good_records_with_columns_left_out_are_written(tmp_path):
    minimal = {"image_id": "m", "boxes": boxes([0, 0, 1, 1]), "features": np.ones((1, 3), np.float64)}
    integral_ids = good("f", object_ids=np.array([1.0, 7.0]), image_size=np.array([40, 60]))
    store = RegionFeatureStore.write([good("a"), minimal, integral_ids], tmp_path / "store")
    assert store.image_ids == ["a", "m", "f"] and store["m"]["image_size"] is None
    assert store["f"]["object_ids"].tolist() == [1, 7]
