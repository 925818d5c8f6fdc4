"""RegionFeatureStore: writing, opening, random access, failure safety, conversion and the CLI verb."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from datasets.table import MemoryMappedTable

from hf_vlalign.cli import main as cli_main
from hf_vlalign.data import RegionFeatureStore, convert_features
from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv


def record(index: int, num_boxes: int, dim: int = 6, optional: bool = True, size=(50, 80)) -> dict:
    rng = np.random.default_rng(index)
    corners = rng.uniform(0, 30, size=(num_boxes, 2)).astype(np.float32)
    out = {
        "image_id": f"img{index}",
        "image_size": size,
        "boxes": np.concatenate([corners, corners + 20], axis=1),
        "features": rng.standard_normal((num_boxes, dim), dtype=np.float32),
    }
    if optional:
        out |= {
            "object_ids": rng.integers(0, 1600, num_boxes),
            "object_conf": rng.random(num_boxes, dtype=np.float32),
            "attr_ids": rng.integers(0, 400, num_boxes),
            "attr_conf": rng.random(num_boxes, dtype=np.float32),
        }
    return out


def test_round_trip_with_varying_regions_and_missing_columns(tmp_path):
    records = [record(0, 1), record(1, 7, optional=False, size=None), record(2, 36)]
    store = RegionFeatureStore.write(iter(records), tmp_path / "store", source="test")

    assert len(store) == 3 and store.feature_dim == 6 and store.image_ids == ["img0", "img1", "img2"]
    assert isinstance(store.dataset.data, MemoryMappedTable)
    assert json.loads((tmp_path / "store" / "store.json").read_text())["num_images"] == 3
    reopened = RegionFeatureStore.load(tmp_path / "store")
    for expected in records:
        image = reopened[expected["image_id"]]
        np.testing.assert_array_equal(image["features"].numpy(), expected["features"])
        np.testing.assert_array_equal(image["boxes"].numpy(), expected["boxes"])
        for column in ("object_ids", "object_conf", "attr_ids", "attr_conf"):
            if column in expected:
                np.testing.assert_array_equal(image[column].numpy(), expected[column])
            else:
                assert image[column] is None
        assert (image["image_size"] is None) == (expected["image_size"] is None)
    assert reopened["img0"]["image_size"].tolist() == [50, 80]
    # the fast path agrees with datasets' own row formatting
    by_datasets = reopened.dataset[2]
    np.testing.assert_array_equal(by_datasets["features"].numpy(), reopened["img2"]["features"].numpy())
    assert [image["image_id"] for image in reopened.batch(["img2", "img0"])] == ["img2", "img0"]
    assert [image["image_id"] for image in reopened] == reopened.image_ids


def test_a_bad_record_leaves_nothing_behind_and_never_replaces_a_store(tmp_path):
    out = tmp_path / "store"
    bad = record(1, 3)
    bad["features"][0, 0] = np.nan
    with pytest.raises(ValueError, match=r"features.*expected finite values|NaN"):
        RegionFeatureStore.write([record(0, 2), bad], out)
    assert not out.exists() and list(tmp_path.iterdir()) == []

    RegionFeatureStore.write([record(0, 2)], out)
    with pytest.raises(ValueError, match=r"`directory` .*store already exists; pass overwrite=True"):
        RegionFeatureStore.write([record(5, 2)], out)
    with pytest.raises(ValueError, match=r"expected D=6 values per box like the first record, got 3"):
        RegionFeatureStore.write([record(5, 2), record(6, 2, dim=3)], out, overwrite=True)
    assert RegionFeatureStore.load(out).image_ids == ["img0"]  # the failed overwrite kept the old store


def test_clear_errors_for_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"`records` is empty"):
        RegionFeatureStore.write([], tmp_path / "empty")
    with pytest.raises(ValueError, match=r"is not a region-feature store: expected region_features.arrow"):
        RegionFeatureStore.load(tmp_path)
    store = RegionFeatureStore.write([record(0, 2)], tmp_path / "store")
    with pytest.raises(ValueError, match=r"`image_id` 'nope' is not in the region-feature store"):
        store["nope"]
    with pytest.raises(ValueError, match=r"image ids of a region-feature store must be unique"):
        RegionFeatureStore.write([record(0, 2), record(0, 3)], tmp_path / "dupes")
    with pytest.raises(ValueError, match=r"`format` must be one of .*'lxmert_tsv'.*got 'caffe'"):
        convert_features(tmp_path / "x", "caffe", tmp_path / "out")
    metadata = tmp_path / "store" / "store.json"
    metadata.write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ValueError, match=r"store format version 99 is not the supported 1"):
        RegionFeatureStore.load(tmp_path / "store")


def test_convert_features_cli(tmp_path, capsys):
    records = [record(i, 3 + i) for i in range(3)]
    write_lxmert_tsv(tmp_path / "feats.tsv", records)
    out = tmp_path / "store"
    assert cli_main(["convert-features", str(tmp_path / "feats.tsv"), "--format", "lxmert_tsv", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"out": str(out), "num_images": 3, "feature_dim": 6}
    np.testing.assert_array_equal(RegionFeatureStore.load(out)["img2"]["features"].numpy(), records[2]["features"])
    with pytest.raises(SystemExit, match="2"):  # a user mistake: one line on stderr, exit status 2
        cli_main(["convert-features", str(tmp_path / "feats.tsv"), "--format", "lxmert_tsv", "--out", str(out)])
    assert "already exists" in capsys.readouterr().err
    assert cli_main(["convert-features", str(tmp_path / "feats.tsv"), "--format", "lxmert_tsv", "--out", str(out), "--overwrite"]) == 0


def test_every_registered_format_has_its_reader():
    import importlib

    from hf_vlalign.data.feature_store import FEATURE_FORMATS

    for name in FEATURE_FORMATS:
        reader = getattr(importlib.import_module(f"hf_vlalign.data.formats.{name}"), f"iter_{name}_records")
        assert callable(reader)


def test_extract_features_cli_on_real_png_files(tmp_path, capsys):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for index, colour in enumerate(["red", "blue"]):
        Image.new("RGB", (64, 48), colour).save(images / f"photo{index}.png")
    out = tmp_path / "store"
    assert cli_main(["extract-features", str(images), "--out", str(out), "--grid_size", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["num_images"] == 2
    store = RegionFeatureStore.load(out)
    assert store.image_ids == ["photo0", "photo1"] and store["photo1"]["image_size"].tolist() == [48, 64]
    assert store["photo0"]["boxes"].tolist()[-1] == [32.0, 24.0, 64.0, 48.0]
    assert not np.array_equal(store["photo0"]["features"].numpy(), store["photo1"]["features"].numpy())


def test_padded_gathers_one_column_with_zero_padding(tmp_path):
    records = [record(0, 1), record(1, 7, optional=False), record(2, 4)]
    store = RegionFeatureStore.write(iter(records), tmp_path / "store", source="test")
    padded = store.padded(["img1", "img0", "img2"], "features")
    assert padded.shape == (3, 7, 6) and padded.dtype == torch.float32
    for index, expected in enumerate([records[1], records[0], records[2]]):
        count = len(expected["features"])
        np.testing.assert_array_equal(padded[index, :count].numpy(), expected["features"])
        assert not padded[index, count:].any()
    assert torch.equal(store.padded(["img2"], "boxes")[0], store["img2"]["boxes"])
    # the batch without a column still carries every other one
    (image,) = store.batch(["img2"], without=("features",))
    assert "features" not in image and torch.equal(image["boxes"], store["img2"]["boxes"])
    with pytest.raises(ValueError, match=r"`name` must be one of the store's columns"):
        store.padded(["img0"], "pixels")
    with pytest.raises(ValueError, match=r"has no 'object_ids' for some of `image_ids`"):
        store.padded(["img0", "img1"], "object_ids")
    with pytest.raises(ValueError, match=r"`image_id` 'img9' is not in the region-feature store"):
        store.padded(["img9"])
