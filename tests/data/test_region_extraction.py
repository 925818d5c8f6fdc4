"""Region features for one's own images: RoIAlign against independent computations, the pixel encoder end to end,
tiny transformers backbones (ResNet, ViT) saved to a folder against a manual computation, and bad input."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModel, ConvNextImageProcessor, ResNetConfig, ViTConfig, ViTImageProcessor

from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.data.region_extraction import (
    ROI_OUTPUT_SIZE,
    ROI_SAMPLING_RATIO,
    CropEncoder,
    extract_region_features,
    grid_boxes,
    roi_align,
    with_whole_image,
)

IMAGE_SIZES = {"beach.png": (40, 60), "kitchen.jpg": (48, 36)}  # (height, width)
BACKBONE_INPUT = 32  # both tiny backbones see 32 x 32 inputs and give 4 x 4 maps
BACKBONE_CHANNELS = {"resnet": 12, "vit": 20}


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, (height, width) in IMAGE_SIZES.items():
        # smooth colour gradients plus noise: the crops differ, and JPEG keeps them apart
        ys, xs = np.mgrid[0:height, 0:width]
        base = np.stack([255 * xs / width, 255 * ys / height, 128 + 60 * np.sin(xs / 5.0)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / name)
    return folder


# ----------------------------------------------------------------------------------------------------------------
# RoIAlign against independent computations
# ----------------------------------------------------------------------------------------------------------------


def _bilinear(feature_map: np.ndarray, y: float, x: float) -> np.ndarray:
    """Bilinear value at index coordinates (y, x) (cell centres at integers), clamped to the map like torchvision."""
    _, height, width = feature_map.shape
    y, x = min(max(y, 0.0), height - 1.0), min(max(x, 0.0), width - 1.0)
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    dy, dx = y - y0, x - x0
    return (
        (1 - dy) * (1 - dx) * feature_map[:, y0, x0]
        + (1 - dy) * dx * feature_map[:, y0, x1]
        + dy * (1 - dx) * feature_map[:, y1, x0]
        + dy * dx * feature_map[:, y1, x1]
    )


def _reference_roi_align(feature_map: np.ndarray, box, output_size: int, sampling_ratio: int) -> np.ndarray:
    """A point-by-point loop after torchvision's CPU kernel (aligned=True): (C, output_size, output_size), float64."""
    x1, y1, x2, y2 = (float(v) for v in box)
    bin_w, bin_h = (x2 - x1) / output_size, (y2 - y1) / output_size
    out = np.zeros((feature_map.shape[0], output_size, output_size))
    for row, col, iy, ix in product(range(output_size), range(output_size), range(sampling_ratio), range(sampling_ratio)):
        y = y1 + row * bin_h + (iy + 0.5) * bin_h / sampling_ratio - 0.5
        x = x1 + col * bin_w + (ix + 0.5) * bin_w / sampling_ratio - 0.5
        out[:, row, col] += _bilinear(feature_map, y, x) / sampling_ratio**2
    return out


def test_roi_align_of_a_cell_aligned_box_averages_exactly_those_cells():
    cells = torch.randn(3, 6, 8)  # one constant value per cell
    box = torch.tensor([[1.0, 2.0, 4.0, 5.0]])  # columns 1..3, rows 2..4
    pooled = roi_align(cells, box, output_size=3, sampling_ratio=1)[0]
    torch.testing.assert_close(pooled, cells[:, 2:5, 1:4], rtol=0, atol=1e-6)
    torch.testing.assert_close(pooled.mean(dim=(1, 2)), cells[:, 2:5, 1:4].mean(dim=(1, 2)), rtol=0, atol=1e-6)


def test_roi_align_of_a_linear_ramp_gives_the_analytic_mean():
    # f(y, x) = a * y + b * x + c at the cell centres (index coordinates); bilinear sampling is exact on it, so the
    # mean over a box's symmetric sample grid is f at the box centre (as long as no sample is clamped at an edge)
    height, width = 6, 8
    a, b, c = torch.tensor([0.5, -2.0]), torch.tensor([1.5, 0.25]), torch.tensor([3.0, -1.0])
    rows, cols = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij")
    ramp = a[:, None, None] * rows + b[:, None, None] * cols + c[:, None, None]
    x1, y1, x2, y2 = 1.3, 0.7, 6.2, 4.9  # within [0.5, size - 0.5]: no clamping
    pooled = roi_align(ramp, torch.tensor([[x1, y1, x2, y2]]), output_size=4, sampling_ratio=3)[0]
    centre_y, centre_x = (y1 + y2) / 2 - 0.5, (x1 + x2) / 2 - 0.5
    torch.testing.assert_close(pooled.mean(dim=(1, 2)), a * centre_y + b * centre_x + c, rtol=0, atol=1e-5)
    # each bin is f at its own centre
    bin_y = y1 + (torch.arange(4) + 0.5) * (y2 - y1) / 4 - 0.5
    bin_x = x1 + (torch.arange(4) + 0.5) * (x2 - x1) / 4 - 0.5
    expected = a[:, None, None] * bin_y[:, None] + b[:, None, None] * bin_x[None, :] + c[:, None, None]
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-5)


def test_roi_align_matches_a_point_by_point_reference():
    rng = np.random.default_rng(1)
    feature_map = rng.standard_normal((4, 5, 7))
    boxes = np.array([[0.0, 0.0, 7.0, 5.0], [0.2, 3.1, 1.4, 5.0], [2.5, 1.25, 2.75, 1.5], [6.0, 0.0, 7.0, 1.0]])
    pooled = roi_align(torch.tensor(feature_map, dtype=torch.float32), torch.tensor(boxes), output_size=3, sampling_ratio=2)
    for index, box in enumerate(boxes):
        expected = _reference_roi_align(feature_map, box, output_size=3, sampling_ratio=2)
        np.testing.assert_allclose(pooled[index].numpy(), expected, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Pixel encoder, end to end
# ----------------------------------------------------------------------------------------------------------------


def _expected_grid(height: int, width: int) -> np.ndarray:
    return np.array(
        [
            [0, 0, width, height],  # the whole image first
            [0, 0, width / 2, height / 2],
            [width / 2, 0, width, height / 2],
            [0, height / 2, width / 2, height],
            [width / 2, height / 2, width, height],
        ],
        dtype=np.float32,
    )


def test_grid_boxes_cover_the_image_row_by_row():
    np.testing.assert_array_equal(with_whole_image(grid_boxes(40, 60, 2), 60, 40), _expected_grid(40, 60))
    boxes = grid_boxes(10, 7, 3)
    assert boxes.shape == (9, 4) and boxes[-1].tolist() == [pytest.approx(14 / 3), pytest.approx(20 / 3), 7.0, 10.0]


def test_pixel_encoder_on_a_grid_end_to_end_is_deterministic(image_dir, tmp_path):
    kwargs = {"grid_size": 2, "include_whole_image": True, "feature_dim": 32}
    store = extract_region_features(image_dir, tmp_path / "first", **kwargs)
    again = extract_region_features(image_dir, tmp_path / "second", **kwargs)

    assert isinstance(store, RegionFeatureStore) and store.feature_dim == 32
    assert store.image_ids == ["beach", "kitchen"]  # file stems, in file-name order
    assert "grid_size=2" in store.metadata["source"]
    reopened = RegionFeatureStore.load(tmp_path / "first")
    for name, (height, width) in IMAGE_SIZES.items():
        image_id = Path(name).stem
        row = reopened[image_id]
        assert row["image_size"].tolist() == [height, width]
        np.testing.assert_array_equal(row["boxes"].numpy(), _expected_grid(height, width))
        with Image.open(image_dir / name) as image:
            direct = CropEncoder(32, seed=0).encode(image.convert("RGB"), _expected_grid(height, width))
        np.testing.assert_array_equal(row["features"].numpy(), direct)
        np.testing.assert_array_equal(row["features"].numpy(), again[image_id]["features"].numpy())
    assert not np.allclose(store["beach"]["features"][1].numpy(), store["beach"]["features"][2].numpy())


def test_pixel_encoder_with_boxes_from_a_file(image_dir, tmp_path):
    boxes = {"beach.png": [[3, 5, 50, 30], [0, 0, 60, 40]], "kitchen": [[10.5, 7.25, 30, 47.5]]}  # a file name and an id
    boxes_file = tmp_path / "boxes.json"
    boxes_file.write_text(json.dumps(boxes))
    paths = [image_dir / "kitchen.jpg", image_dir / "beach.png"]  # a list keeps its order
    store = extract_region_features(paths, tmp_path / "store", boxes=boxes_file, batch_size=1)

    assert store.image_ids == ["kitchen", "beach"] and store.feature_dim == 256
    for image_id, name, key in (("beach", "beach.png", "beach.png"), ("kitchen", "kitchen.jpg", "kitchen")):
        row = store[image_id]
        assert row["image_size"].tolist() == list(IMAGE_SIZES[name])
        np.testing.assert_array_equal(row["boxes"].numpy(), np.array(boxes[key], dtype=np.float32))
        with Image.open(image_dir / name) as image:
            np.testing.assert_array_equal(row["features"].numpy(), CropEncoder(256).encode(image, np.array(boxes[key])))


def test_files_that_are_not_images_are_left_out_of_a_folder_with_a_warning(image_dir, tmp_path, caplog):
    (image_dir / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING, logger="hf_vlalign.data.region_extraction"):
        store = extract_region_features(image_dir, tmp_path / "store", grid_size=1)
    assert store.image_ids == ["beach", "kitchen"]
    assert "Leaving out 1 file(s)" in caplog.text


# ----------------------------------------------------------------------------------------------------------------
# transformers backbones loaded from a local folder
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backbones(tmp_path_factory) -> dict[str, Path]:
    """A tiny ResNet (CNN map) and a tiny ViT (CLS + patch tokens), each saved with its image processor."""
    torch.manual_seed(0)
    resnet = ResNetConfig(embedding_size=8, hidden_sizes=[8, BACKBONE_CHANNELS["resnet"]], depths=[1, 1], layer_type="basic")
    vit = ViTConfig(
        image_size=BACKBONE_INPUT, patch_size=8, hidden_size=BACKBONE_CHANNELS["vit"], num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32,
    )
    processors = {
        # resize 32 / crop_pct then centre-crop 32 by itself: the encoder resizes the whole image to 32 x 32 instead
        "resnet": ConvNextImageProcessor(size={"shortest_edge": BACKBONE_INPUT}, image_mean=[0.4, 0.5, 0.6], image_std=[0.2, 0.25, 0.3]),
        "vit": ViTImageProcessor(size={"height": BACKBONE_INPUT, "width": BACKBONE_INPUT}),
    }
    folders = {}
    for kind, config in (("resnet", resnet), ("vit", vit)):
        folders[kind] = tmp_path_factory.mktemp(kind)
        AutoModel.from_config(config).save_pretrained(folders[kind])
        processors[kind].save_pretrained(folders[kind])
    return folders


def _manual_features(folder: Path, image_path: Path, box: list[float]) -> np.ndarray:
    """The model run by hand on the whole image resized to 32 x 32, pooled with `_reference_roi_align`."""
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    with Image.open(image_path) as image:
        width, height = image.size
        resized = image.convert("RGB").resize((BACKBONE_INPUT, BACKBONE_INPUT), Image.Resampling(preprocessor["resample"]))
    pixels = (np.asarray(resized, dtype=np.float64) / 255 - preprocessor["image_mean"]) / preprocessor["image_std"]
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        hidden = model(pixel_values=torch.tensor(pixels.transpose(2, 0, 1)[None], dtype=torch.float32)).last_hidden_state
    if hidden.ndim == 3:  # ViT: the CLS token, then 4 x 4 patch tokens row by row
        hidden = hidden[:, 1:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    assert hidden.shape[2:] == (4, 4)
    cells_per_pixel = 4 / BACKBONE_INPUT
    scale = np.array([BACKBONE_INPUT / width, BACKBONE_INPUT / height] * 2) * cells_per_pixel
    pooled = _reference_roi_align(hidden[0].double().numpy(), np.array(box) * scale, ROI_OUTPUT_SIZE, ROI_SAMPLING_RATIO)
    return pooled.mean(axis=(1, 2))


@pytest.mark.parametrize("kind", ["resnet", "vit"])
def test_backbone_features_equal_a_manual_computation(kind, backbones, image_dir, tmp_path):
    boxes = {"beach": [[3, 5, 50, 30], [0, 0, 60, 40]], "kitchen": [[10.5, 7.25, 30, 47.5]]}
    store = extract_region_features(image_dir, tmp_path / "store", boxes=boxes, encoder=str(backbones[kind]), batch_size=2)

    assert store.feature_dim == BACKBONE_CHANNELS[kind]
    assert store["beach"]["features"].shape == (2, BACKBONE_CHANNELS[kind])
    assert store["kitchen"]["image_size"].tolist() == [48, 36]
    np.testing.assert_array_equal(store["kitchen"]["boxes"].numpy(), np.array(boxes["kitchen"], dtype=np.float32))
    for image_id, name in (("beach", "beach.png"), ("kitchen", "kitchen.jpg")):
        for index, box in enumerate(boxes[image_id]):
            expected = _manual_features(backbones[kind], image_dir / name, box)
            np.testing.assert_allclose(store[image_id]["features"][index].numpy(), expected, rtol=1e-4, atol=1e-5)

    one_by_one = extract_region_features(image_dir, tmp_path / "batch1", boxes=boxes, encoder=str(backbones[kind]), batch_size=1)
    np.testing.assert_allclose(one_by_one["beach"]["features"].numpy(), store["beach"]["features"].numpy(), rtol=1e-5, atol=1e-6)


def test_backbone_feature_dim_must_match_its_channels(backbones, image_dir, tmp_path):
    with pytest.raises(ValueError, match=r"`feature_dim` is 7, but the backbone .* gives 12 channels"):
        extract_region_features(image_dir, tmp_path / "store", grid_size=2, encoder=str(backbones["resnet"]), feature_dim=7)
    huge = tmp_path / "huge_input"  # a preprocessor_config.json whose size would resize every image to 10^10 pixels
    shutil.copytree(backbones["vit"], huge)
    config = json.loads((huge / "preprocessor_config.json").read_text())
    (huge / "preprocessor_config.json").write_text(json.dumps(config | {"size": {"height": 100_000, "width": 100_000}}))
    with pytest.raises(ValueError, match=r"`encoder` .*output size \(100000, 100000\) exceeds MAX_BACKBONE_INPUT_SIDE"):
        extract_region_features(image_dir, tmp_path / "store", grid_size=2, encoder=str(huge))


def test_an_encoder_that_cannot_be_loaded_is_named(image_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="`encoder` .*missing_model"):
        extract_region_features(image_dir, tmp_path / "store", grid_size=2, encoder=str(tmp_path / "missing_model"))


# ----------------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------------


def _boxes_file(tmp_path: Path, boxes: dict) -> Path:
    path = tmp_path / "boxes.json"
    path.write_text(json.dumps(boxes))
    return path


def test_a_box_outside_the_image_names_file_image_and_box(image_dir, tmp_path):
    path = _boxes_file(tmp_path, {"beach.png": [[0, 0, 10, 10], [50, 5, 61, 20]], "kitchen.jpg": [[0, 0, 5, 5]]})
    message = re.escape(f"`boxes` file {path}: image 'beach.png': box 1 = [50, 5, 61, 20]") + ".*width=60, height=40"
    with pytest.raises(ValueError, match=message):
        extract_region_features(image_dir, tmp_path / "store", boxes=path)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("box", [[10, 5, 10, 20], [-1, 0, 5, 5]])
def test_degenerate_or_negative_boxes_are_rejected(box, image_dir, tmp_path):
    boxes = {"beach": [box], "kitchen": [[0, 0, 5, 5]]}
    with pytest.raises(ValueError, match=r"`boxes`: image 'beach': box 0 = .*must satisfy 0 <= x1 < x2 <= width"):
        extract_region_features(image_dir, tmp_path / "store", boxes=boxes)


@pytest.mark.parametrize("value", [[], [["0", "0", "5", "5"]]])
def test_malformed_box_lists_are_rejected(value, image_dir, tmp_path):
    with pytest.raises(ValueError, match=r"image 'beach': expected a non-empty list of \[x1, y1, x2, y2\] boxes"):
        extract_region_features(image_dir, tmp_path / "store", boxes={"beach": value, "kitchen": [[0, 0, 5, 5]]})


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"grid_size": 2, "boxes": {"beach": [[0, 0, 5, 5]]}}],
)
def test_exactly_one_of_boxes_grid_size_and_detector(kwargs, image_dir, tmp_path):
    with pytest.raises(ValueError, match="exactly one of `boxes` .*, `grid_size` .* and `detector`"):
        extract_region_features(image_dir, tmp_path / "store", **kwargs)


def test_an_unknown_image_in_the_boxes_file_is_named(image_dir, tmp_path):
    path = _boxes_file(tmp_path, {"beach.png": [[0, 0, 5, 5]], "kitchen": [[0, 0, 5, 5]], "garden.png": [[0, 0, 5, 5]]})
    with pytest.raises(ValueError, match=re.escape(f"`boxes` file {path}: image 'garden.png' is not among the 2 images")):
        extract_region_features(image_dir, tmp_path / "store", boxes=path)


def test_images_without_boxes_are_not_skipped_silently(image_dir, tmp_path):
    with pytest.raises(ValueError, match=re.escape("no boxes for 1 of the 2 images (kitchen.jpg)")):
        extract_region_features(image_dir, tmp_path / "store", boxes={"beach": [[0, 0, 5, 5]]})


def test_one_image_under_two_keys_is_rejected(image_dir, tmp_path):
    boxes = {"beach": [[0, 0, 5, 5]], "beach.png": [[0, 0, 5, 5]], "kitchen": [[0, 0, 5, 5]]}
    with pytest.raises(ValueError, match="'beach.png' has boxes under two keys"):
        extract_region_features(image_dir, tmp_path / "store", boxes=boxes)


def test_a_boxes_file_that_is_not_json_is_named(image_dir, tmp_path):
    path = tmp_path / "boxes.json"
    path.write_text("{beach: [[0, 0, 5, 5]]")
    with pytest.raises(ValueError, match=re.escape(f"{path}, line 1: not valid JSON")):
        extract_region_features(image_dir, tmp_path / "store", boxes=path)
    path.write_text("[[0, 0, 5, 5]]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        extract_region_features(image_dir, tmp_path / "store", boxes=path)


def test_a_non_image_file_is_named(image_dir, tmp_path):
    (image_dir / "broken.png").write_text("this is not a PNG")
    with pytest.raises(ValueError, match=r"`images`: .*broken\.png is not a readable image"):
        extract_region_features(image_dir, tmp_path / "store", grid_size=2)
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image either")
    with pytest.raises(ValueError, match=r"`images`: .*notes\.txt is not a readable image"):
        extract_region_features([image_dir / "beach.png", notes], tmp_path / "store", grid_size=2)


def test_bad_images_arguments(image_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no .jpg/.jpeg/.png file"):
        extract_region_features(empty, tmp_path / "store", grid_size=2)
    with pytest.raises(ValueError, match="not a folder"):
        extract_region_features(tmp_path / "nowhere", tmp_path / "store", grid_size=2)
    with pytest.raises(ValueError, match="missing.png is not a file"):
        extract_region_features([image_dir / "beach.png", image_dir / "missing.png"], tmp_path / "store", grid_size=2)
    (image_dir / "beach.jpg").write_bytes((image_dir / "kitchen.jpg").read_bytes())
    with pytest.raises(ValueError, match="share the image id 'beach'"):
        extract_region_features(image_dir, tmp_path / "store", grid_size=2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"grid_size": 0}, "grid_size"),
        ({"grid_size": 2, "batch_size": 0}, "batch_size"),
        ({"grid_size": 2, "feature_dim": 10**9}, "feature_dim"),
        ({"grid_size": 2, "device": "not-a-device"}, "device"),
        ({"grid_size": 2, "encoder": ""}, "encoder"),
        ({"boxes": [[0, 0, 5, 5]]}, "boxes"),
    ],
)
def test_bad_arguments_are_named(kwargs, name, image_dir, tmp_path):
    with pytest.raises(ValueError, match=f"`{name}`"):
        extract_region_features(image_dir, tmp_path / "store", **kwargs)


def test_an_existing_store_is_replaced_only_with_overwrite(image_dir, tmp_path):
    first = extract_region_features(image_dir, tmp_path / "store", grid_size=1, feature_dim=8)
    with pytest.raises(ValueError, match="already exists; pass overwrite=True"):
        extract_region_features(image_dir, tmp_path / "store", grid_size=2)
    second = extract_region_features(image_dir, tmp_path / "store", grid_size=2, feature_dim=8, overwrite=True)
    assert first["beach"]["boxes"].shape == (1, 4) and second["beach"]["boxes"].shape == (4, 4)


_FILL_CACHE = """
import sys, time
from pathlib import Path
from hf_vlalign.data.region_extraction import extract_region_features
images, out, ready, other = sys.argv[1:]
Path(ready).touch()
while not Path(other).exists():  # both processes extract at the same time
    time.sleep(0.005)
print(len(extract_region_features(images, out, grid_size=4, feature_dim=16)))
"""


@pytest.mark.slow
def test_two_processes_filling_one_feature_cache_both_end_with_the_complete_store(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(40):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(folder / f"{index:02d}.png")
    cache = tmp_path / "cache" / "store"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    ready = [tmp_path / "ready0", tmp_path / "ready1"]
    fillers = [
        subprocess.Popen(
            [sys.executable, "-c", _FILL_CACHE, str(folder), str(cache), str(ready[i]), str(ready[1 - i])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]  # fmt: skip
    for filler in fillers:
        out, err = filler.communicate(timeout=300)
        assert filler.returncode == 0 and out.strip() == "40", err[-2000:]
    assert sorted(path.name for path in cache.parent.iterdir()) == ["store"]  # no partial folder left
    reference = extract_region_features(folder, tmp_path / "reference", grid_size=4, feature_dim=16)
    assert (cache / "region_features.arrow").read_bytes() == (reference.directory / "region_features.arrow").read_bytes()
    assert len(RegionFeatureStore.load(cache)) == 40
