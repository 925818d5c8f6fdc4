"""Region-feature readers: BUTD TSV, BUTD/BAN HDF5, meshed-memory HDF5, self-critical npz folders, VL-BERT JSON.

No published feature file is small enough to keep among the real data samples, so every fixture here is written by
hand the way the publishing script writes it (each reader's docstring names the script), independently of the
readers: base64 of raw float32 bytes, h5py datasets, `np.savez_compressed`, `pickle.dump`, `zipfile`.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import re
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.data.formats.butd_h5 import iter_butd_h5_records
from hf_vlalign.data.formats.butd_tsv import iter_butd_tsv_records
from hf_vlalign.data.formats.m2_hdf5 import iter_m2_hdf5_records
from hf_vlalign.data.formats.npz_dir import iter_npz_dir_records
from hf_vlalign.data.formats.vlbert_json import iter_vlbert_json_records


RECORDS_LOGGER = "hf_vlalign.data.formats.region_records"


# ----------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------


def make_image(seed: int, num_boxes: int = 3, dim: int = 8, height: int = 240, width: int = 320) -> dict:
    """Boxes inside a (height, width) image (x1, y1, x2, y2 pixels) and their features; not square, so that a
    swapped width/height shows."""
    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, [width / 2, height / 2], size=(num_boxes, 2))
    extents = rng.uniform(4, [width / 2, height / 2], size=(num_boxes, 2))
    boxes = np.concatenate([corners, corners + extents], axis=1).astype(np.float32)
    features = rng.standard_normal((num_boxes, dim)).astype(np.float32)
    return {"height": height, "width": width, "boxes": boxes, "features": features}


def b64(values: np.ndarray) -> str:
    """The publishing scripts' `base64.b64encode(float32 array)`."""
    return base64.b64encode(np.ascontiguousarray(values, dtype=np.float32).tobytes()).decode("ascii")


def with_value(values: np.ndarray, value: float, row: int = 1, column: int = 2) -> np.ndarray:
    values = values.copy()
    values[row, column] = value
    return values


def scores_for(rng: np.random.Generator, classes: np.ndarray, conf: np.ndarray, num_columns: int) -> np.ndarray:
    """Detector scores whose best non-background column is `classes + 1` with probability `conf`; the background
    (column 0) scores higher still, so a reader that forgets to leave it out gets the wrong ids."""
    scores = rng.uniform(0, 0.01, size=(len(classes), num_columns)).astype(np.float32)
    scores[:, 0] = 0.95
    scores[np.arange(len(classes)), classes + 1] = conf
    return scores


def store_of(records, tmp_path: Path) -> RegionFeatureStore:
    return RegionFeatureStore.write(records, tmp_path / "store")


def assert_image(store: RegionFeatureStore, image_id: str, image: dict, with_size: bool = True) -> None:
    row = store[image_id]
    np.testing.assert_array_equal(row["boxes"].numpy(), image["boxes"])
    np.testing.assert_array_equal(row["features"].numpy(), image["features"])
    if with_size:
        assert row["image_size"].tolist() == [image["height"], image["width"]]
    else:
        assert row["image_size"] is None


def assert_raises_then_skips(read, pattern: str, kept: list[str], caplog) -> None:
    """`read(on_error)` raises a ValueError matching `pattern` with "raise", and with "skip" keeps `kept` and warns."""
    with pytest.raises(ValueError, match=pattern):
        list(read("raise"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=RECORDS_LOGGER):
        assert [record["image_id"] for record in read("skip")] == kept
    total = len(kept) + 1
    warnings = [r.getMessage() for r in caplog.records if r.name == RECORDS_LOGGER and r.levelno == logging.WARNING]
    assert any(f"Skipped 1 of {total} records" in message for message in warnings), warnings


# ----------------------------------------------------------------------------------------------------------------
# Options and sources checked before any record
# ----------------------------------------------------------------------------------------------------------------


READERS = {
    "butd_tsv": lambda path, **kw: iter_butd_tsv_records(path, **kw),
    "butd_h5": lambda path, **kw: iter_butd_h5_records(path, id_map={"1": 0}, **kw),
    "m2_hdf5": lambda path, **kw: iter_m2_hdf5_records(path, **kw),
    "npz_dir": lambda path, **kw: iter_npz_dir_records(path, **kw),
    "vlbert_json": lambda path, **kw: iter_vlbert_json_records(path, **kw),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_readers_check_on_error_and_path_at_call(reader, tmp_path):
    with pytest.raises(ValueError, match="`on_error` must be one of"):
        READERS[reader](tmp_path / "missing", on_error="ignore")
    with pytest.raises(ValueError, match=r"`path` must be an existing .*missing"):
        READERS[reader](tmp_path / "missing")


# ----------------------------------------------------------------------------------------------------------------
# Bottom-up-attention TSV (generate_tsv.py: image_id, image_w, image_h, num_boxes, boxes, features)
# ----------------------------------------------------------------------------------------------------------------


def butd_tsv_line(image_id: str, image: dict, **overrides: str) -> str:
    fields = {
        "image_id": image_id,
        "image_w": str(image["width"]),
        "image_h": str(image["height"]),
        "num_boxes": str(len(image["boxes"])),
        "boxes": b64(image["boxes"]),
        "features": b64(image["features"]),
    }
    fields.update(overrides)
    return "\t".join(fields[name] for name in ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features"))


def test_butd_tsv_round_trip(tmp_path):
    images = {"391895": make_image(0), "9": make_image(1, num_boxes=5, height=480, width=640)}
    path = tmp_path / "trainval_resnet101_faster_rcnn_genome_36.tsv"
    path.write_text("".join(butd_tsv_line(image_id, image) + "\n" for image_id, image in images.items()))
    store = store_of(iter_butd_tsv_records(path), tmp_path)
    assert store.image_ids == ["391895", "9"]
    for image_id, image in images.items():
        assert_image(store, image_id, image)
        assert store[image_id]["object_ids"] is None


BAD_TSV_LINES = {
    "field count": (lambda image: butd_tsv_line("5", image).rsplit("\t", 1)[0], r": expected 6 tab-separated fields"),
    "num_boxes": (lambda image: butd_tsv_line("5", image, num_boxes="4"), r", field 'boxes': expected num_boxes=4"),
    "nan": (
        lambda image: butd_tsv_line("5", image, features=b64(with_value(image["features"], np.nan))),
        r", field 'features': expected finite values",
    ),
}


@pytest.mark.parametrize("case", list(BAD_TSV_LINES))
def test_butd_tsv_bad_line(case, tmp_path, caplog):
    bad_line, problem = BAD_TSV_LINES[case]
    path = tmp_path / "feats.tsv"
    lines = [butd_tsv_line("1", make_image(1)), bad_line(make_image(5)), butd_tsv_line("3", make_image(3))]
    path.write_text("\n".join(lines) + "\n")
    read = lambda on_error: iter_butd_tsv_records(path, on_error=on_error)  # noqa: E731
    assert_raises_then_skips(read, re.escape("feats.tsv, line 2") + problem, ["1", "3"], caplog)


# ----------------------------------------------------------------------------------------------------------------
# BUTD-VQA / BAN HDF5 (detection_features_converter.py, adaptive_detection_features_converter.py)
# ----------------------------------------------------------------------------------------------------------------


def butd_spatial_features(image: dict) -> np.ndarray:
    """The converters' `spatial_features`, computed as they do from the TSV's boxes and float image size."""
    boxes, image_w, image_h = image["boxes"], float(image["width"]), float(image["height"])
    box_width, box_height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    scaled_width, scaled_height = box_width / image_w, box_height / image_h
    scaled_x, scaled_y = boxes[:, 0] / image_w, boxes[:, 1] / image_h
    columns = (scaled_x, scaled_y, scaled_x + scaled_width, scaled_y + scaled_height, scaled_width, scaled_height)
    return np.stack(columns, axis=1)


def write_butd_h5_fixed(path: Path, images: list[dict]) -> None:
    num_boxes, dim = images[0]["features"].shape
    with h5py.File(path, "w") as handle:
        features = handle.create_dataset("image_features", (len(images), num_boxes, dim), "f")
        boxes = handle.create_dataset("image_bb", (len(images), num_boxes, 4), "f")
        spatial = handle.create_dataset("spatial_features", (len(images), num_boxes, 6), "f")
        for index, image in enumerate(images):
            features[index], boxes[index], spatial[index] = (
                image["features"],
                image["boxes"],
                butd_spatial_features(image),
            )


def write_butd_h5_adaptive(path: Path, images: list[dict]) -> None:
    total, dim = sum(len(image["boxes"]) for image in images), images[0]["features"].shape[1]
    with h5py.File(path, "w") as handle:
        features = handle.create_dataset("image_features", (total, dim), "f")
        boxes = handle.create_dataset("image_bb", (total, 4), "f")
        spatial = handle.create_dataset("spatial_features", (total, 6), "f")
        positions = handle.create_dataset("pos_boxes", (len(images), 2), dtype="int32")
        start = 0
        for index, image in enumerate(images):
            end = start + len(image["boxes"])
            positions[index, :] = np.array([start, end])
            features[start:end], boxes[start:end], spatial[start:end] = (
                image["features"], image["boxes"], butd_spatial_features(image),
            )  # fmt: skip
            start = end


@pytest.mark.parametrize("protocol", [0, pickle.DEFAULT_PROTOCOL])
def test_butd_h5_fixed_layout_with_pickled_id_map(protocol, tmp_path):
    images = [make_image(seed, num_boxes=4, height=240 + 16 * seed, width=320 + 8 * seed) for seed in range(3)]
    write_butd_h5_fixed(tmp_path / "train36.hdf5", images)
    id_map = tmp_path / "train36_imgid2idx.pkl"
    with open(id_map, "wb") as handle:  # the converter's `cPickle.dump(train_indices, ...)`: int image id -> index
        pickle.dump({391895: 0, 9: 2, 42: 1}, handle, protocol=protocol)
    store = store_of(iter_butd_h5_records(tmp_path / "train36.hdf5", id_map=id_map), tmp_path)
    assert store.image_ids == ["391895", "42", "9"]  # index order
    for image_id, index in {"391895": 0, "42": 1, "9": 2}.items():
        assert_image(store, image_id, images[index])
        assert store[image_id]["object_ids"] is None


def test_butd_h5_adaptive_layout_with_json_id_map(tmp_path):
    images = [make_image(0, num_boxes=3), make_image(1, num_boxes=6, height=375, width=500), make_image(2, num_boxes=1)]
    write_butd_h5_adaptive(tmp_path / "train.hdf5", images)
    id_map = tmp_path / "train_imgid2idx.json"
    id_map.write_text(json.dumps({"1000": 0, "7": 1, "12": 2}))
    store = store_of(iter_butd_h5_records(tmp_path / "train.hdf5", id_map=id_map), tmp_path)
    assert store.image_ids == ["1000", "7", "12"]
    for image_id, index in {"1000": 0, "7": 1, "12": 2}.items():
        assert_image(store, image_id, images[index])


class _TouchWhenUnpickled:
    """A pickle payload that runs code: unpickling it creates `target`."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_butd_h5_id_map_pickle_of_other_objects_is_refused(tmp_path):
    write_butd_h5_fixed(tmp_path / "val36.hdf5", [make_image(0)])
    with_array, with_code = tmp_path / "array.pkl", tmp_path / "code.pkl"
    with_array.write_bytes(pickle.dumps({9: np.arange(3)}, protocol=2))
    with_code.write_bytes(pickle.dumps({9: _TouchWhenUnpickled(tmp_path / "ran")}))
    for id_map in (with_array, with_code):
        with pytest.raises(ValueError, match=re.escape(str(id_map)) + ": not a pickle of plain dicts.*refused"):
            iter_butd_h5_records(tmp_path / "val36.hdf5", id_map=id_map)
    assert not (tmp_path / "ran").exists()
    pickle.loads(with_code.read_bytes())  # the payload is real: plain pickle runs it
    assert (tmp_path / "ran").exists()


def test_butd_h5_structural_problems_raise_at_call(tmp_path):
    path = tmp_path / "val36.hdf5"
    write_butd_h5_fixed(path, [make_image(0), make_image(1)])
    with pytest.raises(ValueError, match=r"`id_map`: index 2 of image_id 5 is outside the file's 2 images"):
        iter_butd_h5_records(path, id_map={5: 2})
    with pytest.raises(ValueError, match=r"index 0 is given to both image_id 5 and 6"):
        iter_butd_h5_records(path, id_map={5: 0, 6: 0})
    with h5py.File(path, "r+") as handle:
        del handle["spatial_features"]
    with pytest.raises(ValueError, match=r"val36\.hdf5: expected the HDF5 datasets .* missing \['spatial_features'\]"):
        iter_butd_h5_records(path, id_map={5: 0})


def _first_row(handle: h5py.File, index: int) -> int:
    return int(handle["pos_boxes"][index][0])


def _set_outside_box(handle: h5py.File, index: int = 1) -> None:
    """Box 0 of image `index` (320 x 240) runs 20 pixels past the right edge, its spatial features consistent."""
    row = _first_row(handle, index)
    outside = {"boxes": np.array([[0, 0, 340, 100]], np.float32), "width": 320, "height": 240}
    handle["image_bb"][row] = outside["boxes"][0]
    handle["spatial_features"][row] = butd_spatial_features(outside)[0]


BAD_H5_IMAGES = {
    "nan": (
        lambda handle: handle["image_features"].__setitem__((_first_row(handle, 1), 0), np.nan),
        r", field 'image_features': expected finite values",
    ),
    "num_boxes": (
        lambda handle: handle["pos_boxes"].__setitem__(1, [_first_row(handle, 1), handle["image_bb"].shape[0] + 2]),
        r", field 'pos_boxes': expected 0 <= start < end <= 9",
    ),
    "spatial": (
        lambda handle: handle["spatial_features"].__setitem__((_first_row(handle, 1) + 1, 0), 0.75),
        r", field 'spatial_features': expected \(x1/w, y1/h",
    ),
}


@pytest.mark.parametrize("case", list(BAD_H5_IMAGES))
def test_butd_h5_bad_image(case, tmp_path, caplog):
    corrupt, problem = BAD_H5_IMAGES[case]
    path = tmp_path / "trainval.hdf5"
    write_butd_h5_adaptive(path, [make_image(seed, num_boxes=3) for seed in range(3)])
    with h5py.File(path, "r+") as handle:
        corrupt(handle)
    id_map = {391895: 0, 9: 1, 42: 2}
    read = lambda on_error: iter_butd_h5_records(path, id_map=id_map, on_error=on_error)  # noqa: E731
    location = re.escape("trainval.hdf5, image index 1 (image_id 9)")
    assert_raises_then_skips(read, location + problem, ["391895", "42"], caplog)


# ----------------------------------------------------------------------------------------------------------------
# Meshed-memory transformer coco_detections.hdf5 (<id>_features, <id>_boxes, <id>_cls_prob)
# ----------------------------------------------------------------------------------------------------------------


def make_detections(seed: int, num_boxes: int = 3, height: int = 240, width: int = 320) -> dict:
    image = make_image(seed, num_boxes=num_boxes, height=height, width=width)
    rng = np.random.default_rng(100 + seed)
    image["object_ids"] = rng.integers(0, 1600, num_boxes)
    image["object_conf"] = rng.uniform(0.2, 0.9, num_boxes).astype(np.float32)
    image["cls_prob"] = scores_for(rng, image["object_ids"], image["object_conf"], 1601)
    return image


def write_m2_hdf5(path: Path, images: dict[str, dict]) -> None:
    with h5py.File(path, "w") as handle:
        for image_id, image in images.items():
            handle.create_dataset(f"{image_id}_features", data=image["features"])
            handle.create_dataset(f"{image_id}_boxes", data=image["boxes"])
            handle.create_dataset(f"{image_id}_cls_prob", data=image["cls_prob"])


def test_m2_hdf5_round_trip(tmp_path):
    images = {"391895": make_detections(0), "9": make_detections(1, num_boxes=5, height=427, width=640)}
    write_m2_hdf5(tmp_path / "coco_detections.hdf5", images)
    annotations = tmp_path / "captions_val2014.json"
    annotations.write_text(
        json.dumps(
            {
                "images": [
                    {"id": int(i), "file_name": f"{i}.jpg", "width": im["width"], "height": im["height"]}
                    for i, im in images.items()
                ]
            }
        )
    )
    store = store_of(iter_m2_hdf5_records(tmp_path / "coco_detections.hdf5", image_sizes=annotations), tmp_path)
    assert store.image_ids == ["9", "391895"]  # numeric order
    for image_id, image in images.items():
        assert_image(store, image_id, image)
        np.testing.assert_array_equal(store[image_id]["object_ids"].numpy(), image["object_ids"])
        np.testing.assert_array_equal(store[image_id]["object_conf"].numpy(), image["object_conf"])

    without_sizes = RegionFeatureStore.write(iter_m2_hdf5_records(tmp_path / "coco_detections.hdf5"), tmp_path / "s2")
    assert_image(without_sizes, "9", images["9"], with_size=False)


def test_m2_hdf5_without_cls_prob_and_with_partial_sizes(tmp_path):
    images = {"9": make_detections(0), "391895": make_detections(1)}
    path = tmp_path / "coco_detections.hdf5"
    write_m2_hdf5(path, images)
    with h5py.File(path, "r+") as handle:  # class probabilities for more rows than features: ignored on request
        _replace(handle, "9_cls_prob", np.concatenate([images["9"]["cls_prob"]] * 2))
    store = store_of(iter_m2_hdf5_records(path, use_cls_prob=False), tmp_path)
    assert store["9"]["object_ids"] is None and store["391895"]["object_conf"] is None
    assert_image(store, "9", images["9"], with_size=False)
    only_one = {"9": (240, 320)}
    with pytest.raises(ValueError, match=r"image 391895, field 'image_sizes': expected the size of image '391895'"):
        list(iter_m2_hdf5_records(path, image_sizes=only_one, use_cls_prob=False))


def _replace(handle: h5py.File, name: str, values: np.ndarray) -> None:
    del handle[name]
    handle.create_dataset(name, data=values)


BAD_M2_IMAGES = {
    "nan": (
        lambda handle, image: _replace(handle, "391895_features", with_value(image["features"], np.nan)),
        r", field '391895_features': expected finite values",
    ),
    "num_boxes": (
        lambda handle, image: _replace(handle, "391895_boxes", image["boxes"][:2]),
        r", field '391895_features': expected shape \(R=2, D\) like `boxes`",
    ),
}


@pytest.mark.parametrize("case", list(BAD_M2_IMAGES))
def test_m2_hdf5_bad_image(case, tmp_path, caplog):
    corrupt, problem = BAD_M2_IMAGES[case]
    images = {"9": make_detections(0), "391895": make_detections(1), "400000": make_detections(2)}
    path = tmp_path / "coco_detections.hdf5"
    write_m2_hdf5(path, images)
    with h5py.File(path, "r+") as handle:
        corrupt(handle, images["391895"])
    sizes = {image_id: (image["height"], image["width"]) for image_id, image in images.items()}
    read = lambda on_error: iter_m2_hdf5_records(path, image_sizes=sizes, on_error=on_error)  # noqa: E731
    location = re.escape("coco_detections.hdf5, image 391895")
    assert_raises_then_skips(read, location + problem, ["9", "400000"], caplog)


# ----------------------------------------------------------------------------------------------------------------
# Per-image npz folders (self-critical.pytorch make_bu_data.py; MILVLG bottom-up-attention.pytorch)
# ----------------------------------------------------------------------------------------------------------------


def write_self_critical(root: Path, images: dict[str, dict], npy_ids: tuple[str, ...] = ()) -> Path:
    """`make_bu_data.py`: <name>_att/<id>.npz (feat=), <name>_fc/<id>.npy, <name>_box/<id>.npy; ids in `npy_ids`
    get a bare .npy feature file instead."""
    for folder in ("cocobu_att", "cocobu_fc", "cocobu_box"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for image_id, image in images.items():
        if image_id in npy_ids:
            np.save(root / "cocobu_att" / image_id, image["features"])
        else:
            np.savez_compressed(root / "cocobu_att" / image_id, feat=image["features"])
        np.save(root / "cocobu_fc" / image_id, image["features"].mean(0))
        np.save(root / "cocobu_box" / image_id, image["boxes"])
    return root / "cocobu_att"


def test_npz_dir_self_critical_round_trip(tmp_path):
    images = {"10": make_image(0), "9": make_image(1, num_boxes=5, height=480, width=640), "100": make_image(2)}
    att = write_self_critical(tmp_path / "data", images, npy_ids=("100",))
    sizes = {image_id: (image["height"], image["width"]) for image_id, image in images.items()}
    store = store_of(iter_npz_dir_records(att, image_sizes=sizes), tmp_path)
    assert store.image_ids == ["9", "10", "100"]  # numeric order, the _box sibling found by default
    for image_id, image in images.items():
        assert_image(store, image_id, image)

    without_sizes = RegionFeatureStore.write(iter_npz_dir_records(att), tmp_path / "s2")
    assert_image(without_sizes, "10", images["10"], with_size=False)


def test_npz_dir_files_with_their_own_boxes_sizes_and_ids(tmp_path):
    folder = tmp_path / "bua_feats"
    folder.mkdir()
    plain, labelled = make_image(0), make_image(1, num_boxes=4, height=375, width=500)
    info = {"image_id": "7", "objects_id": np.arange(3), "objects_conf": np.ones(3)}  # saved pickled, never loaded
    np.savez_compressed(
        folder / "7", x=plain["features"], bbox=plain["boxes"], num_bbox=3, image_h=240, image_w=320, info=info
    )
    labels = {
        "objects_id": np.array([5, 0, 1599, 7]),
        "objects_conf": np.array([0.5, 0.25, 0.75, 1.0], np.float32),
        "attrs_id": np.array([1, 2, 3, 399]),
        "attrs_conf": np.array([0.1, 0.2, 0.3, 0.4], np.float32),
    }
    np.savez_compressed(
        folder / "8", x=labelled["features"], bbox=labelled["boxes"], image_h=375, image_w=500, **labels
    )
    store = store_of(iter_npz_dir_records(folder), tmp_path)
    assert_image(store, "7", plain)
    assert store["7"]["object_ids"] is None
    assert_image(store, "8", labelled)
    for key, column in (
        ("objects_id", "object_ids"),
        ("objects_conf", "object_conf"),
        ("attrs_id", "attr_ids"),
        ("attrs_conf", "attr_conf"),
    ):
        np.testing.assert_array_equal(store["8"][column].numpy(), labels[key])


BAD_NPZ_FILES = {
    "num_boxes": (
        lambda root, image: np.save(root / "cocobu_box" / "10", image["boxes"][:2]),
        r"cocobu_att/10\.npz, field 'feat': expected shape \(R=2, D\) like `boxes`",
    ),
    "num_bbox": (
        lambda root, image: np.savez_compressed(root / "cocobu_att" / "10", feat=image["features"], num_bbox=5),
        r"cocobu_att/10\.npz, field 'num_bbox': expected the 3 rows of 'feat', got 5",
    ),
    "no boxes": (
        lambda root, image: (root / "cocobu_box" / "10.npy").unlink(),
        r"cocobu_att/10\.npz, field 'bbox': expected boxes",
    ),
    "not npz": (
        lambda root, image: (root / "cocobu_att" / "10.npz").write_bytes(b"not a zip"),
        r"cocobu_att/10\.npz: expected a readable \.npz file written by NumPy",
    ),
}


@pytest.mark.parametrize("case", list(BAD_NPZ_FILES))
def test_npz_dir_bad_file(case, tmp_path, caplog):
    corrupt, problem = BAD_NPZ_FILES[case]
    images = {"9": make_image(0), "10": make_image(1), "11": make_image(2)}
    att = write_self_critical(tmp_path, images)
    corrupt(tmp_path, images["10"])
    sizes = {image_id: (image["height"], image["width"]) for image_id, image in images.items()}
    read = lambda on_error: iter_npz_dir_records(att, image_sizes=sizes, on_error=on_error)  # noqa: E731
    assert_raises_then_skips(read, problem, ["9", "11"], caplog)


# ----------------------------------------------------------------------------------------------------------------
# VL-BERT per-image Faster R-CNN JSON (generate_tsv_v2.py), in a folder or an uncompressed zip
# ----------------------------------------------------------------------------------------------------------------


def make_vlbert_image(seed: int, num_boxes: int = 3, height: int = 240, width: int = 320) -> dict:
    image = make_detections(seed, num_boxes=num_boxes, height=height, width=width)
    rng = np.random.default_rng(200 + seed)
    image["attr_ids"] = rng.integers(0, 400, num_boxes)
    image["attr_conf"] = rng.uniform(0.2, 0.9, num_boxes).astype(np.float32)
    image["attrs"] = scores_for(rng, image["attr_ids"], image["attr_conf"], 401)
    return image


def vlbert_json(image_id: int, image: dict, **overrides) -> str:
    data = {
        "image_id": image_id,
        "image_h": image["height"],
        "image_w": image["width"],
        "num_boxes": len(image["boxes"]),
        "boxes": b64(image["boxes"]),
        "classes": b64(image["cls_prob"]),
        "attrs": b64(image["attrs"]),
        "features": b64(image["features"]),
    }
    data.update(overrides)
    return json.dumps(data)


def write_vlbert(path: Path, texts: dict[int, str], container: str) -> Path:
    """`{image_id:08d}.json` files in a folder, or in a zip made like `zip -0` (stored, not compressed)."""
    if container == "folder":
        path.mkdir()
        for image_id, text in texts.items():
            (path / f"{image_id:08d}.json").write_text(text)
        return path
    with zipfile.ZipFile(path.with_suffix(".zip"), "w", compression=zipfile.ZIP_STORED) as archive:
        for image_id, text in texts.items():
            archive.writestr(f"{image_id:08d}.json", text)
    return path.with_suffix(".zip")


@pytest.mark.parametrize("container", ["folder", "zip"])
def test_vlbert_json_round_trip(container, tmp_path):
    images = {12: make_vlbert_image(0), 3: make_vlbert_image(1, num_boxes=5, height=480, width=640)}
    path = write_vlbert(tmp_path / "train_frcnn", {i: vlbert_json(i, image) for i, image in images.items()}, container)
    store = store_of(iter_vlbert_json_records(path), tmp_path)
    assert store.image_ids == ["3", "12"]
    for image_id, image in images.items():
        assert_image(store, str(image_id), image)
        for column in ("object_ids", "object_conf", "attr_ids", "attr_conf"):
            np.testing.assert_array_equal(store[str(image_id)][column].numpy(), image[column])


BAD_VLBERT_FILES = {
    "base64": (lambda image: vlbert_json(10, image, features="YWJj$ZGVm"), r", field 'features': expected base64"),
    "classes": (
        lambda image: vlbert_json(10, image, classes=b64(image["cls_prob"].ravel()[:-1])),
        r", field 'classes': expected num_boxes=3 rows",
    ),
    "outside": (
        lambda image: vlbert_json(10, image, boxes=b64(image["boxes"] + [0, 0, 0, 300])),
        r", field 'boxes': expected 0 <= x1 < x2 <= width",
    ),
    "json": (lambda image: vlbert_json(10, image)[:-5], r": expected a JSON object"),
}


@pytest.mark.parametrize(
    "case, container", [("base64", "folder"), ("classes", "folder"), ("outside", "zip"), ("json", "zip")]
)
def test_vlbert_json_bad_file(case, container, tmp_path, caplog):
    bad_text, problem = BAD_VLBERT_FILES[case]
    texts = {
        9: vlbert_json(9, make_vlbert_image(0)),
        10: bad_text(make_vlbert_image(1)),
        11: vlbert_json(11, make_vlbert_image(2)),
    }
    path = write_vlbert(tmp_path / "val_frcnn", texts, container)
    location = "val_frcnn/00000010.json" if container == "folder" else "val_frcnn.zip:00000010.json"
    read = lambda on_error: iter_vlbert_json_records(path, on_error=on_error)  # noqa: E731
    assert_raises_then_skips(read, re.escape(location) + problem, ["9", "11"], caplog)
