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


# (record, column named, what the message says)
BAD_RECORDS = {
    "not a dict (str)": ("img", None, r"expected a dict with the columns .*, got str"),
    "not a dict (list)": ([["img1"]], None, r"expected a dict with the columns .*, got list"),
    "not a dict (None)": (None, None, r"expected a dict .*got NoneType"),
    "not a dict (tuple)": (("img1", None), None, r"expected a dict .*got tuple"),
    "unknown column": (good(score=1.0), None, r"unknown column\(s\) \['score'\]"),
    "misspelt column": (good(bbox=boxes([0, 0, 1, 1])), None, r"unknown column\(s\) \['bbox'\]"),
    "no image_id": (without("image_id"), None, r"missing the column\(s\) \['image_id'\]"),
    "no boxes": (without("boxes"), None, r"missing the column\(s\) \['boxes'\]"),
    "no features": (without("features"), None, r"missing the column\(s\) \['features'\]"),
    "int image id": (good(3), "image_id", r"expected a non-empty id .*got 3"),
    "empty image id": (good(""), "image_id", r"expected a non-empty id .*got ''"),
    "None image id": (good(None), "image_id", r"expected a non-empty id .*got None"),
    "bytes image id": (good(b"img1"), "image_id", r"expected a non-empty id .*got b'img1'"),
    "image id with a tab": (good("a\tb"), "image_id", r"without tabs or line breaks"),
    "image id with a newline": (good("a\nb"), "image_id", r"without tabs or line breaks"),
    "boxes a list": (good(boxes=[[0, 0, 1, 1], [0, 0, 2, 2]]), "boxes", r"expected an array of shape \(R, 4\)"),
    "boxes 1-D": (good(boxes=np.zeros(4, np.float32)), "boxes", r"expected an array of shape \(R, 4\) .*got \(4,\)"),
    "boxes of 5 values": (good(boxes=np.ones((2, 5), np.float32)), "boxes", r"shape \(R, 4\) .*got \(2, 5\)"),
    "no box": (good(boxes=np.zeros((0, 4), np.float32)), "boxes", r"R >= 1, got \(0, 4\)"),
    "boxes of strings": (good(boxes=np.array([["0"] * 4] * 2)), "boxes", r"expected numbers, got an array of dtype <U1"),
    "boxes NaN": (good(boxes=boxes([0, 0, 10, 10], [NAN, 5, 30, 20])), "boxes", r"finite values, got 1 NaN/inf"),
    "boxes inf": (good(boxes=boxes([0, 0, INF, 10], [5, 5, 30, 20])), "boxes", r"finite values"),
    "zero-width box": (good(boxes=boxes([0, 0, 10, 10], [5, 5, 5, 20])), "boxes",
                       r"0 <= x1 < x2 <= width .*zero width or height .*got box 1 = \[5.0, 5.0, 5.0, 20.0\]"),
    "zero-height box": (good(boxes=boxes([3, 4, 10, 4], [5, 5, 30, 20])), "boxes", r"zero width or height .*got box 0"),
    "zero-area point": (good(boxes=boxes([0, 0, 10, 10], [7, 7, 7, 7])), "boxes", r"got box 1 = \[7.0, 7.0, 7.0, 7.0\]"),
    "x2 < x1": (good(boxes=boxes([10, 0, 2, 10], [5, 5, 30, 20])), "boxes", r"got box 0"),
    "negative x1": (good(boxes=boxes([-1, 0, 2, 10], [5, 5, 30, 20])), "boxes", r"got box 0"),
    "box past the width": (good(boxes=boxes([0, 0, 10, 10], [5, 5, 61, 20])), "boxes",
                           r"with image width=60, height=40, got box 1"),
    "box past the height": (good(boxes=boxes([0, 0, 10, 41], [5, 5, 30, 20])), "boxes", r"height=40, got box 0"),
    "normalised zero-area box, no size": (good(image_size=None, boxes=boxes([0, 0, 0.5, 0.5], [0.2, 0.2, 0.2, 0.9])),
                                          "boxes", r"zero width or height has no area\), got box 1"),
    "features a list": (good(features=[[1.0] * 3] * 2), "features", r"expected shape \(R=2, D\)"),
    "features 1-D": (good(features=np.ones(3, np.float32)), "features", r"expected shape \(R=2, D\) .*got \(3,\)"),
    "features of another R": (good(features=np.ones((3, 3), np.float32)), "features", r"\(R=2, D\) .*got \(3, 3\)"),
    "features of D=0": (good(features=np.ones((2, 0), np.float32)), "features", r"D >= 1, got \(2, 0\)"),
    "features NaN": (good(features=np.array([[1, 2, NAN], [1, 2, 3]], np.float32)), "features", r"1 NaN/inf"),
    "features inf": (good(features=np.full((2, 3), -INF, np.float32)), "features", r"6 NaN/inf"),
    "features of objects": (good(features=np.array([[None] * 3] * 2)), "features", r"expected numbers, got .*object"),
    "features complex": (good(features=np.ones((2, 3), np.complex64)), "features", r"expected numbers, got .*complex64"),
    "image size a string": (good(image_size="40x60"), "image_size", r"two positive integers \(pixels\), got '40x60'"),
    "image size of one value": (good(image_size=(40,)), "image_size", r"two positive integers .*got \(40,\)"),
    "image size of three values": (good(image_size=(40, 60, 3)), "image_size", r"got \(40, 60, 3\)"),
    "image size zero": (good(image_size=(0, 60)), "image_size", r"got \(0, 60\)"),
    "image size negative": (good(image_size=(40, -60)), "image_size", r"got \(40, -60\)"),
    "image size floats": (good(image_size=(40.0, 60.0)), "image_size", r"got \(40.0, 60.0\)"),
    "image size bools": (good(image_size=(True, True)), "image_size", r"got \(True, True\)"),
    "image size a number": (good(image_size=40), "image_size", r"got 40"),
    "image size a dict": (good(image_size={"height": 40, "width": 60}), "image_size", r"got \{'height'"),
    "object ids of another R": (good(object_ids=np.array([1, 2, 3])), "object_ids", r"one value per box \(R=2\), got shape \(3,\)"),
    "object ids fractional": (good(object_ids=np.array([1.5, 2.0])), "object_ids", r"expected integer ids"),
    "object ids strings": (good(object_ids=np.array(["a", "b"])), "object_ids", r"expected numbers"),
    "object conf NaN": (good(object_conf=np.array([NAN, 0.5])), "object_conf", r"1 NaN/inf"),
    "attr ids of another R": (good(attr_ids=np.array([1])), "attr_ids", r"one value per box"),
    "attr ids fractional": (good(attr_ids=np.array([0.25, 1.0])), "attr_ids", r"expected integer ids"),
    "attr conf 2-D": (good(attr_conf=np.ones((2, 1))), "attr_conf", r"one value per box"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_RECORDS)
@pytest.mark.parametrize("position", [1, 3])
def test_bad_record_is_refused_naming_record_image_and_column(name, position, tmp_path):
    record, column, problem = BAD_RECORDS[name]
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
