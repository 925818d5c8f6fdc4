"""The processor saved with every trained model: the default region options of the synthetic scenes reproduce their
features, other features get an extractor without encoder, and the main job's folder and its checkpoints load with
`AutoProcessor` and run the pipeline."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from launch_helpers import save_tiny_bert
from script_modules import ROOT, load_script
from transformers import AutoProcessor, pipeline

import hf_vlalign  # noqa: F401  (registers the processor and the pipeline)
from hf_vlalign.data import extract_region_features
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.processing import RegionFeatureExtractor, VLAlignProcessor
from hf_vlalign.recipes import SYNTHETIC_INFERENCE_GRID, default_region_options
from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from hf_vlalign.synthetic.scenes import FIRST_IMAGE_ID


def test_the_synthetic_scenes_default_reproduces_their_features(tmp_path):
    scenes = SyntheticSceneConfig(num_train_images=2, num_val_images=1, feature_dim=64, seed=7)
    store = synthetic_region_features(tmp_path / "cache", config=scenes)
    options = default_region_options(SimpleNamespace(visual_feat_dim=64), store)
    assert options == {"encoder": "pixel", "feature_dim": 64, "seed": 7, **SYNTHETIC_INFERENCE_GRID}
    # with the scenes' own "detector" boxes, the extractor computes the features the scenes were written with
    images = load_or_generate_synthetic_vgp(tmp_path / "cache", config=scenes).images
    extractor = RegionFeatureExtractor(**{**options, "include_whole_image": False})
    for image_id in store.image_ids[:2]:
        record = store[image_id]
        outputs = extractor(images / f"{image_id}.png", boxes=record["boxes"].numpy())
        np.testing.assert_allclose(outputs["visual_feats"][0].numpy(), record["features"].numpy(), rtol=1e-4, atol=1e-4)


def test_features_the_extractor_cannot_reproduce_get_no_encoder(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 24), (200, 30, 30)).save(folder / "red.png")
    store = extract_region_features(folder, tmp_path / "store", grid_size=1, feature_dim=8)
    options = default_region_options(SimpleNamespace(visual_feat_dim=2048), store)
    assert options["encoder"] is None and options["feature_dim"] == 2048


@pytest.mark.slow  # runs an example end to end (in-process)
def test_the_main_job_and_its_checkpoints_save_the_processor(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    example = load_script("finetune_vgp", ROOT / "examples" / "finetune_vgp.py")
    output_dir = tmp_path / "vgp"
    example.main([
        "--model_name_or_path", str(save_tiny_bert(tmp_path / "bert")), "--output_dir", str(output_dir),
        "--synthetic_train_images", "6", "--synthetic_eval_images", "3", "--max_steps", "2", "--save_strategy", "steps",
        "--save_steps", "1",
        "--per_device_train_batch_size", "8", "--eval_strategy", "no", "--image_use_examples", "8", "--use_cpu",
    ])  # fmt: skip
    saved = json.loads((output_dir / "processor_config.json").read_text())["image_processor"]
    assert {key: saved[key] for key in ("encoder", "feature_dim", "seed", "grid_size", "include_whole_image")} == {
        "encoder": "pixel", "feature_dim": 256, "seed": 0, "grid_size": 3, "include_whole_image": True,
    }  # fmt: skip
    for folder in (output_dir, output_dir / "checkpoint-1"):
        processor = AutoProcessor.from_pretrained(folder)
        assert type(processor) is VLAlignProcessor and processor.image_processor.to_dict()["encoder"] == "pixel"
    photo = load_or_generate_synthetic_vgp(config=SyntheticSceneConfig(6, 3)).images / f"{FIRST_IMAGE_ID}.png"
    result = pipeline("word-region-attention", model=str(output_dir))(photo, text="a red circle", top_k=1)
    assert [word["word"] for word in result["words"]] == ["a", "red", "circle"]
    assert len(result["region_boxes"]) == 10  # the whole image and a 3 x 3 grid
