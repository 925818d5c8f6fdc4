"""Region-feature stores: conversion is resumable after a kill or an error, re-running is idempotent, and a damaged
store (row count or sha256 not matching store.json) is refused on load."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers.testing_utils import CaptureLogger

from hf_vlalign.data import RegionFeatureStore, convert_features
from hf_vlalign.data import feature_store as feature_store_module
from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv

NUM_IMAGES = 600  # > 2 Arrow batches of 256, so a run killed at image 400 has written part of the file


def record(index: int) -> dict:
    rng = np.random.default_rng(index)
    num_boxes = 2 + index % 5
    corners = rng.uniform(0, 30, size=(num_boxes, 2)).astype(np.float32)
    return {
        "image_id": f"img{index}",
        "image_size": (60, 90),
        "boxes": np.concatenate([corners, corners + 20], axis=1),
        "features": rng.standard_normal((num_boxes, 8), dtype=np.float32),
        "object_ids": rng.integers(0, 1600, num_boxes),
        "object_conf": rng.random(num_boxes, dtype=np.float32),
        "attr_ids": rng.integers(0, 400, num_boxes),
        "attr_conf": rng.random(num_boxes, dtype=np.float32),
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("source") / "feats.tsv"
    write_lxmert_tsv(path, [record(i) for i in range(NUM_IMAGES)])
    return path


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> Path:
    """The store of an uninterrupted conversion."""
    out = tmp_path_factory.mktemp("reference") / "store"
    convert_features(source, "lxmert_tsv", out)
    return out


def store_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def partials(directory: Path) -> list[Path]:
    return sorted(directory.parent.glob(f"{directory.name}.partial-*"))


_KILLED_CONVERSION = """
import os, signal, sys
from hf_vlalign.data import RegionFeatureStore
from hf_vlalign.data.feature_store import iter_feature_records

def killed_midway(records, at):
    for index, record in enumerate(records):
        if index == at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup runs: what a power cut or the OOM killer leaves
        yield record

source, out, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
RegionFeatureStore.write(killed_midway(iter_feature_records(source, "lxmert_tsv"), at), out)
"""


@pytest.mark.slow
def test_a_conversion_killed_midway_is_redone_to_the_same_bytes(source, reference, tmp_path, caplog):
    out = tmp_path / "store"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-c", _KILLED_CONVERSION, str(source), str(out), "400"], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    [leftover] = partials(out)  # the killed writer's folder, with part of an Arrow file in it
    prefix = f"store.partial-{socket.gethostname()}-"
    assert leftover.name.startswith(prefix) and leftover.name[len(prefix) :].isdigit(), leftover.name
    assert (leftover / "region_features.arrow").stat().st_size > 0 and not out.exists()

    with caplog.at_level(logging.WARNING, logger="hf_vlalign.utils.atomic_folders"):
        store = convert_features(source, "lxmert_tsv", out)
    assert "Removed 1 folder(s) of interrupted writes" in caplog.text
    assert partials(out) == [] and len(store) == NUM_IMAGES
    assert store_bytes(out) == store_bytes(reference)  # Arrow file and store.json, byte for byte


def test_a_reader_error_midway_leaves_nothing_and_a_rerun_matches(source, reference, tmp_path):
    out = tmp_path / "store"

    def failing_midway():
        for index, image in enumerate(feature_store_module.iter_feature_records(source, "lxmert_tsv")):
            if index == 300:
                raise OSError("the network drive went away")
            yield image

    with pytest.raises(OSError, match="network drive"):
        RegionFeatureStore.write(failing_midway(), out, source=f"lxmert_tsv:{source.resolve()}")
    assert partials(out) == [] and list(tmp_path.iterdir()) == []
    convert_features(source, "lxmert_tsv", out)
    assert store_bytes(out) == store_bytes(reference)


@pytest.mark.slow
def test_partial_folders_of_live_writers_and_other_hosts_are_left_alone(source, tmp_path):
    out = tmp_path / "store"
    host = socket.gethostname()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = tmp_path / f"store.partial-{host}-{int(finished.stdout)}"
    live = tmp_path / f"store.partial-{host}-{os.getppid()}"  # pytest's parent process: running
    elsewhere = tmp_path / "store.partial-some-other-host-12345"
    for folder in (dead, live, elsewhere):
        folder.mkdir()
        (folder / "region_features.arrow").write_bytes(b"half")

    convert_features(source, "lxmert_tsv", out)
    assert not dead.exists() and live.exists() and elsewhere.exists()
    assert partials(out) == sorted([elsewhere, live])


def test_rerunning_on_a_complete_store_refuses_without_overwrite_and_is_identical_with_it(source, reference, tmp_path):
    out = tmp_path / "store"
    convert_features(source, "lxmert_tsv", out)
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    with pytest.raises(ValueError, match=r"`out` .*store already exists; pass overwrite=True \(--overwrite\)"):
        convert_features(source, "lxmert_tsv", out)
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == before  # untouched
    convert_features(source, "lxmert_tsv", out, overwrite=True)
    assert store_bytes(out) == store_bytes(reference) and partials(out) == []


def test_store_json_records_row_count_and_the_sha256_of_the_arrow_file(reference):
    metadata = json.loads((reference / "store.json").read_text())
    arrow = (reference / "region_features.arrow").read_bytes()
    assert metadata["num_images"] == NUM_IMAGES
    assert metadata["sha256"] == {"region_features.arrow": hashlib.sha256(arrow).hexdigest()}


def _copy(reference: Path, tmp_path: Path) -> Path:
    out = tmp_path / "store"
    out.mkdir()
    for name, data in store_bytes(reference).items():
        (out / name).write_bytes(data)
    return out


def test_a_store_whose_arrow_bytes_changed_is_refused(reference, tmp_path):
    out = _copy(reference, tmp_path)
    arrow = out / "region_features.arrow"
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the feature values: still valid Arrow
    arrow.write_bytes(bytes(data))
    expected = json.loads((out / "store.json").read_text())["sha256"]["region_features.arrow"]
    got = hashlib.sha256(bytes(data)).hexdigest()
    message = f"Region-feature store {out} is damaged: the sha256 of region_features.arrow is {got}, but store.json expects {expected}"
    with pytest.raises(ValueError, match=message):
        RegionFeatureStore.load(out)
    assert len(RegionFeatureStore.load(out, verify=False)) == NUM_IMAGES  # what verify=False trades away


def test_a_store_whose_row_count_differs_is_refused_even_without_verification(reference, tmp_path):
    out = _copy(reference, tmp_path)
    metadata = json.loads((out / "store.json").read_text())
    (out / "store.json").write_text(json.dumps({**metadata, "num_images": NUM_IMAGES + 1}))
    for verify in (True, False):
        with pytest.raises(ValueError, match=rf"store {out} is damaged: store.json expects num_images={NUM_IMAGES + 1}, but region_features.arrow has {NUM_IMAGES} rows"):
            RegionFeatureStore.load(out, verify=verify)


def test_a_truncated_arrow_file_is_refused_with_or_without_verification(reference, tmp_path):
    out = _copy(reference, tmp_path)
    arrow = out / "region_features.arrow"
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 3])
    with pytest.raises(ValueError, match=rf"store {out} is damaged: the sha256 of region_features.arrow"):
        RegionFeatureStore.load(out)
    with pytest.raises(ValueError, match=rf"store {out} is damaged: (region_features.arrow cannot be read as Arrow|store.json expects num_images)"):
        RegionFeatureStore.load(out, verify=False)
    (out / "store.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"store.json, line 1: not valid JSON"):
        RegionFeatureStore.load(out)


def test_a_store_written_before_checksums_loads_with_a_warning(reference, tmp_path):
    out = _copy(reference, tmp_path)
    metadata = json.loads((out / "store.json").read_text())
    del metadata["sha256"]
    (out / "store.json").write_text(json.dumps(metadata))
    with CaptureLogger(feature_store_module.logger) as captured:
        store = RegionFeatureStore.load(out)
    assert f"Region-feature store {out}: store.json records no checksum" in captured.out and "unverified" in captured.out
    np.testing.assert_array_equal(store["img7"]["features"].numpy(), record(7)["features"])
    with CaptureLogger(feature_store_module.logger) as captured:
        RegionFeatureStore.load(reference)
    assert captured.out == ""
