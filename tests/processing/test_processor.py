"""The processor: `RegionFeatureExtractor` (given boxes, a grid, a transformers detector; the pixel encoder) equal to
`extract_region_features`, `VLAlignProcessor` saved and loaded by `AutoProcessor`, its tensors run the models, and
bad input named."""

from __future__ import annotations

import json

import matplotlib.cbook
import numpy as np
import pytest
import torch
from analysis_models import tiny_family_model
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModel,
    AutoProcessor,
    AutoTokenizer,
    YolosConfig,
    YolosForObjectDetection,
    YolosImageProcessorPil,
)

import hf_vlalign  # noqa: F401  (registers the Auto classes, the processor and the pipeline)
from hf_vlalign import default_text_model_path
from hf_vlalign.cli import main
from hf_vlalign.data import RegionFeatureStore, extract_region_features
from hf_vlalign.processing import RegionFeatureExtractor, VLAlignProcessor

PHOTO = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    """Two real photos of different sizes (matplotlib's sample Grace Hopper, scaled and cropped)."""
    folder = tmp_path_factory.mktemp("images")
    with Image.open(PHOTO) as photo:
        photo.convert("RGB").resize((96, 112)).save(folder / "hopper.png")
        photo.convert("RGB").crop((100, 50, 400, 250)).resize((120, 80)).save(folder / "face.jpg", quality=95)
    return folder


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """A tiny randomly initialised YOLOS detector with its image processor, saved to a folder (offline)."""
    folder = tmp_path_factory.mktemp("yolos")
    config = YolosConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=[64, 64],
        patch_size=16, num_detection_tokens=6, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    YolosForObjectDetection(config).save_pretrained(folder)
    YolosImageProcessorPil(size={"shortest_edge": 64, "longest_edge": 64}).save_pretrained(folder)
    return folder


def _stored_like_extractor(store: RegionFeatureStore, image_id: str, outputs, index: int) -> None:
    count = int(outputs["visual_attention_mask"][index].sum())
    stored = store[image_id]
    np.testing.assert_allclose(outputs["visual_feats"][index, :count].numpy(), stored["features"].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs["region_boxes"][index, :count].numpy(), stored["boxes"].numpy(), atol=1e-4)


@pytest.mark.parametrize(
    "options",
    [
        {"grid_size": 3, "include_whole_image": True, "feature_dim": 24, "seed": 3},
        {"grid_size": 2, "feature_dim": 80, "seed": 0},
    ],
    ids=["grid-with-whole-image", "grid"],
)
def test_grid_features_equal_extract_region_features(options, image_dir, tmp_path):
    store = extract_region_features(image_dir, tmp_path / "store", **options)
    extractor = RegionFeatureExtractor(**options)
    outputs = extractor([image_dir / "face.jpg", image_dir / "hopper.png"])
    _stored_like_extractor(store, "face", outputs, 0)
    _stored_like_extractor(store, "hopper", outputs, 1)
    assert outputs["visual_feats"].shape[-1] == options["feature_dim"]


def test_given_boxes_equal_extract_region_features_and_pad_like_the_collators(image_dir, tmp_path):
    boxes = {"face": [[0, 0, 60, 40], [30, 10, 120, 80]], "hopper": [[10, 20, 50, 100]]}
    store = extract_region_features(image_dir, tmp_path / "store", boxes=boxes, include_whole_image=True, feature_dim=16)
    extractor = RegionFeatureExtractor(include_whole_image=True, feature_dim=16)
    outputs = extractor([image_dir / "face.jpg", Image.open(image_dir / "hopper.png")], boxes=[boxes["face"], boxes["hopper"]])
    _stored_like_extractor(store, "face", outputs, 0)
    _stored_like_extractor(store, "hopper", outputs, 1)
    assert outputs["visual_attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    # normalised boxes: pixels / image size; padding: zero features and the box (0, 0, 1, 1)
    torch.testing.assert_close(outputs["visual_boxes"][0, 2], torch.tensor([30 / 120, 10 / 80, 1.0, 1.0]))
    torch.testing.assert_close(outputs["visual_boxes"][1, 0], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(outputs["visual_boxes"][1, 2], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert not outputs["visual_feats"][1, 2].any()


def test_detector_boxes_equal_extract_region_features_and_the_cli(detector, image_dir, tmp_path):
    options = {"detector": str(detector), "detector_threshold": 0.0, "max_regions": 4, "feature_dim": 32}
    store = extract_region_features(image_dir, tmp_path / "store", **options)
    outputs = RegionFeatureExtractor(**options)([image_dir / "face.jpg", image_dir / "hopper.png"])
    assert outputs["visual_attention_mask"].sum(1).tolist() == [4, 4]  # max_regions, best scores first
    _stored_like_extractor(store, "face", outputs, 0)
    _stored_like_extractor(store, "hopper", outputs, 1)
    # every box inside its image, with an area
    boxes = store["face"]["boxes"].numpy()
    assert (boxes[:, 2:] > boxes[:, :2]).all() and (boxes >= 0).all() and (boxes[:, [0, 2]] <= 120).all()
    code = main([
        "extract-features", str(image_dir), "--out", str(tmp_path / "cli"), "--detector", str(detector),
        "--detector_threshold", "0", "--max_regions", "4", "--include_whole_image",
    ])  # fmt: skip
    assert code == 0
    cli_store = RegionFeatureStore.load(tmp_path / "cli")
    np.testing.assert_allclose(cli_store["face"]["boxes"].numpy()[1:], boxes, atol=1e-4)  # after the whole image


def test_a_high_threshold_leaves_the_whole_image(detector, image_dir):
    outputs = RegionFeatureExtractor(detector=str(detector), detector_threshold=1.0, feature_dim=8)(image_dir / "face.jpg")
    assert outputs["region_boxes"][0].tolist() == [[0.0, 0.0, 120.0, 80.0]]


def test_the_processor_round_trips_through_auto_processor(tokenizer, image_dir, tmp_path):
    model = tiny_family_model("single_stream", tokenizer)
    extractor = RegionFeatureExtractor(grid_size=2, include_whole_image=True, feature_dim=model.config.visual_feat_dim, seed=4)
    processor = VLAlignProcessor(extractor, tokenizer)
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "processor_config.json").read_text())
    assert saved["processor_class"] == "VLAlignProcessor"
    assert saved["image_processor"]["encoder"] == "pixel" and saved["image_processor"]["seed"] == 4

    loaded = AutoProcessor.from_pretrained(tmp_path / "model")
    assert type(loaded) is VLAlignProcessor and loaded.image_processor.to_dict() == extractor.to_dict()
    assert type(AutoImageProcessor.from_pretrained(tmp_path / "model")) is RegionFeatureExtractor
    extractor.save_pretrained(tmp_path / "extractor")  # on its own: preprocessor_config.json
    assert RegionFeatureExtractor.from_pretrained(tmp_path / "extractor").to_dict() == extractor.to_dict()

    text = ["a woman in a uniform", "a face"]
    images = [image_dir / "hopper.png", image_dir / "face.jpg"]
    expected, inputs = processor(images=images, text=text), loaded(images=images, text=text)
    assert set(inputs) == {"input_ids", "token_type_ids", "attention_mask", "visual_feats", "visual_boxes", "visual_attention_mask"}
    for name in inputs:
        torch.testing.assert_close(inputs[name], expected[name])
    assert inputs["visual_feats"].shape == (2, 5, model.config.visual_feat_dim)
    encoder = AutoModel.from_pretrained(tmp_path / "model").eval()  # the bare SingleStreamModel
    assert encoder(**inputs).last_hidden_state.shape[0] == 2  # the inputs run the model as they are


def test_text_pairs_and_the_region_boxes_for_drawing(tokenizer, image_dir):
    processor = VLAlignProcessor(RegionFeatureExtractor(grid_size=1, feature_dim=8), tokenizer)
    inputs = processor(
        images=image_dir / "face.jpg", text="a red circle", text_pair="a crimson disc", return_region_boxes=True
    )
    assert inputs["token_type_ids"][0].tolist() == [0] * 5 + [1] * 4  # [CLS] a red circle [SEP] a crimson disc [SEP]
    assert inputs.pop("region_boxes")[0].tolist() == [[0.0, 0.0, 120.0, 80.0]]


@pytest.mark.parametrize("family", ["two_stream", "captioner"])
def test_the_inputs_run_the_other_families(family, tokenizer, image_dir):
    model = tiny_family_model(family, tokenizer).eval()
    processor = VLAlignProcessor(RegionFeatureExtractor(grid_size=2, feature_dim=model.config.visual_feat_dim), tokenizer)
    inputs = processor(images=[image_dir / "face.jpg"], text=["a face"])
    if family == "captioner":  # the text is the caption: the decoder's labels
        outputs = model(
            visual_feats=inputs["visual_feats"], visual_boxes=inputs["visual_boxes"],
            visual_attention_mask=inputs["visual_attention_mask"], labels=inputs["input_ids"],
        )  # fmt: skip
        assert torch.isfinite(outputs.loss)
    else:
        assert model(**inputs).cross_relationship_score.shape == (1, 2)


def test_a_model_of_published_features_processes_text_only(tokenizer, image_dir, tmp_path):
    processor = VLAlignProcessor(RegionFeatureExtractor(encoder=None, feature_dim=2048), tokenizer)
    processor.save_pretrained(tmp_path)
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert loaded.image_processor.encoder is None
    assert loaded(text="two dogs")["input_ids"].shape[0] == 1
    with pytest.raises(ValueError, match="pass the model `visual_feats`.*or set an encoder"):
        loaded(images=image_dir / "face.jpg", text="two dogs")


def test_bad_input_is_named(tokenizer, image_dir, tmp_path):
    processor = VLAlignProcessor(RegionFeatureExtractor(feature_dim=8), tokenizer)
    with pytest.raises(ValueError, match="one image per sentence, got 2 image.*and 1 sentence"):
        processor(images=[image_dir / "face.jpg", image_dir / "hopper.png"], text=["a face"])
    with pytest.raises(ValueError, match=r"`boxes\[0\]`: box 0 .*width=120, height=80"):
        processor(images=image_dir / "face.jpg", boxes=[[0, 0, 130, 40]])
    with pytest.raises(ValueError, match=r"`boxes\[0\]`: no boxes given .*neither a `detector` nor a `grid_size`"):
        processor(images=image_dir / "face.jpg")
    with pytest.raises(ValueError, match="`boxes` must hold one entry .* per image \\(2\\), got 1"):
        processor(images=[image_dir / "face.jpg", image_dir / "hopper.png"], boxes=[[[0, 0, 5, 5]]])
    with pytest.raises(FileNotFoundError, match="`images\\[0\\]`.*missing.png"):
        processor(images=tmp_path / "missing.png")
    with pytest.raises(FileNotFoundError, match="`encoder` .*no_backbone"):
        RegionFeatureExtractor(grid_size=1, encoder=str(tmp_path / "no_backbone"))(image_dir / "face.jpg")
    with pytest.raises(FileNotFoundError, match="`detector` .*no_detector"):
        RegionFeatureExtractor(detector=str(tmp_path / "no_detector"))(image_dir / "face.jpg")
    with pytest.raises(ValueError, match="`detector_threshold` must be a score in \\[0, 1\\], got 2"):
        RegionFeatureExtractor(detector="org/name", detector_threshold=2)
    saved = tmp_path / "saved"
    processor.save_pretrained(saved)
    options = json.loads((saved / "processor_config.json").read_text())
    options["image_processor"]["feature_dim"] = 10**9  # the pixel encoder would allocate a 520 x 10^9 projection
    (saved / "processor_config.json").write_text(json.dumps(options))
    with pytest.raises(ValueError, match=r"processor_config.json, field 'image_processor': `feature_dim` must be <= 16384"):
        AutoProcessor.from_pretrained(saved)
    with pytest.raises(ValueError, match="`image_processor` must be a RegionFeatureExtractor"):
        VLAlignProcessor(tokenizer, tokenizer)
    model = tiny_family_model("single_stream", tokenizer)
    with pytest.raises(ValueError, match="feature_dim=8, but the model reads visual_feat_dim=256"):
        processor.check_model(model)
