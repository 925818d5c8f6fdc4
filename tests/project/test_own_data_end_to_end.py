"""Issue 33's acceptance, as a new user goes: a folder of real photos (scikit-image's, from its installed wheel) and a
user-format file -> `examples/finetune_flickr_grounding.py --train_file` (run in the test's process) -> in a fresh
process, offline, `AutoProcessor` + `AutoModel` from the saved folder, the "word-region-attention" pipeline's output
and its explorer page. The processor must make, for a training photo, exactly the regions and features the run
trained on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import skimage
from launch_helpers import run_example
from PIL import Image
from script_modules import load_script

from hf_vlalign.data import RegionFeatureStore

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = Path(os.path.dirname(skimage.__file__)) / "data"

pytestmark = pytest.mark.slow  # the example's whole run, then the reload in a new process

# photo -> (caption, grounded phrase, its box as fractions of the width and height)
CAPTIONS = {
    "astronaut.png": ("an astronaut stands beside a flag .", "an astronaut", (0.25, 0.0, 0.8, 1.0)),
    "chelsea.png": ("a cat looks to the side .", "a cat", (0.1, 0.05, 0.95, 1.0)),
    "coffee.png": ("a red cup of coffee on a saucer .", "a red cup", (0.15, 0.05, 0.85, 0.8)),
    "rocket.jpg": ("a rocket stands on the launch pad .", "a rocket", (0.55, 0.05, 0.8, 0.7)),
    "horse.png": ("a black horse in profile .", "a black horse", (0.05, 0.1, 0.95, 0.95)),
    "motorcycle_left.png": ("a motorcycle parked on a road .", "a motorcycle", (0.05, 0.1, 0.95, 0.95)),
}
VALIDATION = ("horse.png", "motorcycle_left.png")

RELOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoProcessor, pipeline

    import hf_vlalign  # registers the families, the processor and the pipeline task

    model_dir, photo, caption, page = sys.argv[1:]
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir)
    inputs = processor(images=[Image.open(photo)], text=[caption], return_tensors="pt", return_region_boxes=True)
    region_boxes = inputs.pop("region_boxes")
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    grounder = pipeline("word-region-attention", model=model_dir)
    result = grounder(photo, text=caption, top_k=1, explorer=page)
    print(json.dumps({
        "processor": type(processor).__name__,
        "model": type(model).__name__,
        "region_options": processor.image_processor.region_options,
        "visual_feats": inputs["visual_feats"][0].tolist(),
        "region_boxes": region_boxes[0].tolist(),
        "attention_layers": len(outputs.attentions),
        "words": [(word["word"], word["top_boxes"][0]["box"], sum(word["weights"])) for word in result["words"]],
        "explorer": str(result["explorer"]),
    }))
    """
)


def _write_rows(folder: Path, names: list[str], path: Path) -> Path:
    rows = []
    for name in names:
        caption, phrase, (x1, y1, x2, y2) = CAPTIONS[name]
        with Image.open(folder / name) as image:
            width, height = image.size
        box = [round(x1 * width), round(y1 * height), round(x2 * width), round(y2 * height)]
        rows.append({"image": f"photos/{name}", "caption": caption, "phrases": [{"text": phrase, "boxes": [box]}]})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run(argv: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    completed = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed


def test_photos_and_a_caption_file_to_a_model_its_processor_pipeline_and_explorer(tmp_path, monkeypatch):
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in CAPTIONS:
        shutil.copy(PHOTOS / name, photos / name)
    train = _write_rows(photos, [name for name in CAPTIONS if name not in VALIDATION], tmp_path / "train.jsonl")
    validation = _write_rows(photos, list(VALIDATION), tmp_path / "val.jsonl")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(tmp_path / "cache")}
    model_dir = tmp_path / "grounding"
    monkeypatch.chdir(tmp_path)
    example = load_script("finetune_flickr_grounding", ROOT / "examples" / "finetune_flickr_grounding.py")
    run_example(
        example.main,
        [
            "--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(model_dir),
            "--max_steps", "4", "--per_device_train_batch_size", "2", "--save_strategy", "no", "--report_to", "none",
            "--image_use_examples", "2",
        ],
        tmp_path / "cache",
    )  # fmt: skip
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert results["data"].startswith("user data: train.jsonl (4 rows), val.jsonl (2 rows)")

    photo, (caption, _, _) = photos / "chelsea.png", CAPTIONS["chelsea.png"]
    page = tmp_path / "chelsea.html"
    reload = _run([sys.executable, "-c", RELOAD, str(model_dir), str(photo), caption, str(page)], env, tmp_path)
    out = json.loads(reload.stdout.strip().splitlines()[-1])

    assert (out["processor"], out["model"]) == ("VLAlignProcessor", "SingleStreamModel")
    options = {key: value for key, value in out["region_options"].items() if value is not None}
    assert options | {"encoder": "pixel"} == options and options["grid_size"] == 4 and options["include_whole_image"]
    # the processor's regions and features of a training photo are those the run trained on
    stores = [path.parent for path in (tmp_path / "cache" / "user_features").glob("*/store.json")]
    assert len(stores) == 1, stores
    trained = RegionFeatureStore.load(stores[0])["chelsea"]
    np.testing.assert_allclose(out["region_boxes"], trained["boxes"].numpy())
    np.testing.assert_allclose(out["visual_feats"], trained["features"].numpy(), rtol=1e-5, atol=1e-5)
    assert out["attention_layers"] == 6  # MiniLM's layers, the embedded default

    words = [word for word, _, _ in out["words"]]
    assert words == caption.split()
    width, height = Image.open(photo).size
    for word, (x1, y1, x2, y2), total in out["words"]:
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, (word, x1, y1, x2, y2)
        assert total == pytest.approx(1.0, abs=1e-4), word
    assert Path(out["explorer"]) == page
    html = page.read_text()
    assert "data:image/" in html and "looks" in html  # the photo is embedded under its boxes, with the caption
