"""LXMERT feature TSV writer and streaming reader, into a RegionFeatureStore.

No published feature TSV is small enough to keep among the real data samples, so the lines here are encoded by hand
with LXMERT's own convention (base64 of the raw array bytes) independently of the writer under test.
"""

from __future__ import annotations

import base64
import logging
import re

import numpy as np
from datasets.table import MemoryMappedTable
import pytest

from hf_vlalign.data.feature_store import RegionFeatureStore, convert_features
from hf_vlalign.data.formats import LXMERT_TSV_FIELDS, write_lxmert_tsv


ARRAY_DTYPES = {
    "object_ids": np.int64,
    "object_conf": np.float32,
    "attr_ids": np.int64,
    "attr_conf": np.float32,
    "boxes": np.float32,
    "features": np.float32,
}


def make_record(index: int, num_boxes: int = 3, dim: int = 8) -> dict:
    rng = np.random.default_rng(index)
    corners = rng.uniform(0, 100, size=(num_boxes, 2)).astype(np.float32)
    return {
        "image_id": f"COCO_val2014_{index:012d}",
        "image_size": (240, 320),  # height, width
        "object_ids": rng.integers(0, 1600, num_boxes),
        "object_conf": rng.random(num_boxes, dtype=np.float32),
        "attr_ids": rng.integers(0, 400, num_boxes),
        "attr_conf": rng.random(num_boxes, dtype=np.float32),
        "boxes": np.concatenate([corners, corners + 50], axis=1),
        "features": rng.standard_normal((num_boxes, dim), dtype=np.float32),
    }


def encode(array: np.ndarray, dtype: type) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode()


def tsv_line(record: dict, **overrides: str) -> str:
    """A line in LXMERT's layout, encoded here by hand; `overrides` replace raw TSV fields."""
    fields = {
        "img_id": record["image_id"],
        "img_h": str(record["image_size"][0]),
        "img_w": str(record["image_size"][1]),
        "objects_id": encode(record["object_ids"], np.int64),
        "objects_conf": encode(record["object_conf"], np.float32),
        "attrs_id": encode(record["attr_ids"], np.int64),
        "attrs_conf": encode(record["attr_conf"], np.float32),
        "num_boxes": str(len(record["boxes"])),
        "boxes": encode(record["boxes"], np.float32),
        "features": encode(record["features"], np.float32),
    }
    fields.update(overrides)
    return "\t".join(fields[name] for name in LXMERT_TSV_FIELDS)


def assert_same_record(row: dict, record: dict) -> None:
    assert row["image_id"] == record["image_id"]
    assert list(np.asarray(row["image_size"])) == list(record["image_size"])
    for column, dtype in ARRAY_DTYPES.items():
        np.testing.assert_array_equal(np.asarray(row[column], dtype=dtype), record[column])


def read_lxmert_tsv(path, on_error: str = "raise") -> RegionFeatureStore:
    """The TSV converted into a store, as `hf-vlalign convert-features --format lxmert_tsv` does."""
    out = path.parent / "store"
    return convert_features(path, "lxmert_tsv", out, on_error=on_error, overwrite=True)


# ----------------------------------------------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------------------------------------------


def test_reads_hand_encoded_lines_into_an_arrow_dataset(tmp_path):
    records = [make_record(i) for i in range(3)]
    path = tmp_path / "feats.tsv"
    path.write_text("".join(tsv_line(record) + "\r\n" for record in records))  # csv.DictWriter's line ending

    dataset = read_lxmert_tsv(path)

    assert len(dataset) == 3 and dataset.feature_dim == 8
    assert dataset.dataset.features["features"].dtype == "float32"
    for row, record in zip(dataset, records, strict=True):
        assert_same_record(row, record)


def test_write_then_read_round_trip(tmp_path):
    records = [make_record(i, num_boxes=n) for i, n in enumerate([1, 4, 36])]
    path = tmp_path / "feats.tsv"

    assert write_lxmert_tsv(path, iter(records)) == 3
    assert path.read_text().splitlines()[0] == tsv_line(records[0])
    dataset = read_lxmert_tsv(path)
    for row, record in zip(dataset, records, strict=True):
        assert_same_record(row, record)

    write_lxmert_tsv(tmp_path / "again.tsv", dataset)  # rows of the store are records too
    assert (tmp_path / "again.tsv").read_bytes() == path.read_bytes()


def test_store_is_memory_mapped_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "feats.tsv"
    write_lxmert_tsv(path, [make_record(0), make_record(1, num_boxes=5)])
    store = read_lxmert_tsv(path)
    assert store.dataset.cache_files[0]["filename"].endswith("region_features.arrow")
    assert isinstance(store.dataset.data, MemoryMappedTable)
    again = RegionFeatureStore.load(tmp_path / "store")
    np.testing.assert_array_equal(again[make_record(1)["image_id"]]["features"].numpy(), make_record(1, num_boxes=5)["features"])
    with pytest.raises(ValueError, match=r"`out` .*store already exists; pass overwrite=True"):
        convert_features(path, "lxmert_tsv", tmp_path / "store")
    np.testing.assert_array_equal(RegionFeatureStore.load(tmp_path / "store")[make_record(0)["image_id"]]["boxes"].numpy(), make_record(0)["boxes"])


# ----------------------------------------------------------------------------------------------------------------
# Bad records: on_error="raise" and on_error="skip"
# ----------------------------------------------------------------------------------------------------------------


def nan_features() -> str:
    features = make_record(1)["features"]
    features[1, 2] = np.nan
    return encode(features, np.float32)


def box(values: list[float]) -> str:
    boxes = make_record(1)["boxes"]
    boxes[2] = values
    return encode(boxes, np.float32)


BAD_LINES = {
    "field count": (lambda line: line + "\textra", r"line 2: expected 10 tab-separated fields \(img_id, .*\), got 11"),
    "base64": (
        lambda line: tsv_line(make_record(1), features="not*base64"),
        r"line 2, field 'features': expected base64 text, got undecodable data",
    ),
    "num_boxes": (
        lambda line: tsv_line(make_record(1), num_boxes="4"),
        r"line 2, field 'boxes': expected num_boxes=4 rows of 4 values, got 12 values",
    ),
    "NaN features": (
        lambda line: tsv_line(make_record(1), features=nan_features()),
        r"line 2, field 'features': expected finite values, got 1 NaN/inf value\(s\)",
    ),
    "feature dim": (
        lambda line: tsv_line(make_record(1, dim=4)),
        r"line 2, field 'features': expected D=8 values per box like the first record, got 4",
    ),
    "box outside": (
        lambda line: tsv_line(make_record(1), boxes=box([10, 10, 330, 20])),
        r"line 2, field 'boxes': expected 0 <= x1 < x2 <= width .* with image width=320, height=240, got box 2 = \[10.0, 10.0, 330.0, 20.0\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_record_raises_naming_file_line_and_field(tmp_path, case):
    corrupt, problem = BAD_LINES[case]
    path = tmp_path / "feats.tsv"
    good = tsv_line(make_record(0))
    path.write_text(f"{good}\n{corrupt(tsv_line(make_record(1)))}\n{good}\n")

    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, {problem}"):
        read_lxmert_tsv(path, on_error="raise")


def test_skip_drops_bad_records_counts_and_warns(tmp_path, caplog):
    records = [make_record(i) for i in range(3)]
    bad = [corrupt(tsv_line(make_record(9))) for corrupt, _ in list(BAD_LINES.values())[:4]]
    path = tmp_path / "feats.tsv"
    path.write_text("\n".join([tsv_line(records[0]), *bad, tsv_line(records[1]), "", tsv_line(records[2])]) + "\n")

    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        dataset = read_lxmert_tsv(path, on_error="skip")
    assert [row["image_id"] for row in dataset] == [record["image_id"] for record in records]
    assert f"Skipped 5 of 8 records of {path}" in caplog.text


def test_file_without_valid_records(tmp_path):
    path = tmp_path / "feats.tsv"
    path.write_text("")
    with pytest.raises(ValueError, match=r"no valid record among 0 record\(s\)"):
        read_lxmert_tsv(path)
    path.write_text("only one field\n")
    with pytest.raises(ValueError, match=r"no valid record among 1 record\(s\)"):
        read_lxmert_tsv(path, on_error="skip")


def test_reader_argument_errors(tmp_path):
    with pytest.raises(ValueError, match=r"`path` must be an existing LXMERT feature TSV file"):
        read_lxmert_tsv(tmp_path / "missing.tsv")
    path = tmp_path / "feats.tsv"
    write_lxmert_tsv(path, [make_record(0)])
    with pytest.raises(ValueError, match=r"`on_error` must be one of \('raise', 'skip'\), got 'ignore'"):
        read_lxmert_tsv(path, on_error="ignore")


# ----------------------------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------------------------


def test_a_writer_error_midway_leaves_no_file(tmp_path):
    path = tmp_path / "feats.tsv"

    def records():
        yield make_record(0)
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        write_lxmert_tsv(path, records())
    assert not path.exists()
