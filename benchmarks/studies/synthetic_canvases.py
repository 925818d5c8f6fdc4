"""The synthetic scenes on canvases of several sizes and aspects, as user-format files: the world of the Qwen2-VL
mechanism check's second plan (results/vlm_qwen2vl_mechanism/PLAN_v2.md), where dynamic resolution acts.

Each scene (128 x 128 pixels) is placed at a seeded random offset on a canvas drawn per image from `CANVASES`, the
rest filled with the scene's own background (its border's median colour and noise), so that an image keeps its
shapes whole and its boxes move by the offset. Written per split (`train`, `val`):

- `<split>.jsonl`: docs/own_data.md's `caption` rows (each caption, its boxed phrases at their character offsets),
- `refcoco_<split>.jsonl`: its `refcoco` rows (the scenes' referring expressions, RefCOCO+'s layout read by the
  library's builder, and the referred shape's box),
- `images/<image id>.png`, and `canvases.json` (each image's canvas and offset, and the counts).

    python benchmarks/studies/synthetic_canvases.py outputs/studies/synthetic_canvases
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from hf_vlalign.data.builders.refcoco import build
from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from hf_vlalign.vlms.data import grounded_caption_examples

SPLITS = ("train", "val")
# (width, height) in pixels: square, landscape and portrait; Qwen2-VL keeps each (multiples of its 16-pixel merged
# patch), so the images have 8 x 8, 10 x 8, 8 x 10, 12 x 8 and 8 x 12 image tokens
CANVASES = ((128, 128), (160, 128), (128, 160), (192, 128), (128, 192))
# the second plan's scenes: every image holds four to six shapes, its target with a same-kind and a same-colour
# distractor (v1 captions: patch models read pixels, not v1's region features that give the boxes away)
STUDY_SCENES = SyntheticSceneConfig(800, 150, min_shapes=4, max_shapes=6, distractors=True)
FILES = (*(f"{split}.jsonl" for split in SPLITS), *(f"refcoco_{split}.jsonl" for split in SPLITS), "canvases.json")


def place_on_canvas(scene: Image.Image, canvas: tuple[int, int], rng: np.random.Generator) -> tuple[Image.Image, tuple]:
    """`scene` at a random offset on a `canvas` (width, height) of its own background; returns (image, (dx, dy))."""
    pixels = np.asarray(scene.convert("RGB"), dtype=np.float64)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    background = np.median(border, axis=0)
    noise = border.std(axis=0).mean()
    width, height = canvas
    filled = background + rng.normal(0.0, noise, size=(height, width, 3))
    dx = int(rng.integers(0, width - scene.width + 1))
    dy = int(rng.integers(0, height - scene.height + 1))
    filled[dy : dy + scene.height, dx : dx + scene.width] = pixels
    return Image.fromarray(np.clip(filled.round(), 0, 255).astype(np.uint8)), (dx, dy)


def _shifted(box: list, offset: tuple[int, int]) -> list:
    dx, dy = offset
    x1, y1, x2, y2 = box
    return [x1 + dx, y1 + dy, x2 + dx, y2 + dy]


def _caption_row(example: dict, image: str, offset: tuple[int, int]) -> dict:
    phrases = [
        {"text": example["caption"][p["char_start"] : p["char_end"]], "start": p["char_start"],
         "boxes": [_shifted(box, offset) for box in p["boxes"]]}
        for p in example["phrases"]
    ]  # fmt: skip
    return {"image": image, "caption": example["caption"], "phrases": phrases}


def write_synthetic_canvases(folder: str | Path, config: SyntheticSceneConfig = STUDY_SCENES, seed: int = 0) -> Path:
    """Writes (once: a folder holding every file is kept as it is) the scenes of `config` on `CANVASES` drawn with
    `seed`, as the module docstring lists."""
    folder = Path(folder)
    if all((folder / name).is_file() for name in FILES):
        return folder
    scenes = load_or_generate_synthetic_vgp(config=config)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    placements, counts = {}, {}
    for split in SPLITS:
        examples, counts[split] = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, split)
        for example in examples:
            image_id = example["image_id"]
            if image_id not in placements:
                canvas = CANVASES[int(rng.integers(len(CANVASES)))]
                image, offset = place_on_canvas(Image.open(example["image_path"]), canvas, rng)
                image.save(folder / "images" / f"{image_id}.png")
                placements[image_id] = {"canvas": list(canvas), "offset": list(offset)}
        rows = [_caption_row(e, f"images/{e['image_id']}.png", placements[e["image_id"]]["offset"]) for e in examples]
        _write_jsonl(folder / f"{split}.jsonl", rows)
        expressions = [
            {"image": f"images/{Path(row['file_name']).stem}.png", "expression": row["expression"],
             "box": _shifted(row["expression_phrase_boxes"][0][0], placements[Path(row["file_name"]).stem]["offset"])}
            for row in build(scenes.refcoco_dir, split)
        ]  # fmt: skip
        _write_jsonl(folder / f"refcoco_{split}.jsonl", expressions)
        counts[split]["expressions"] = len(expressions)
    summary = {"config": vars(config), "seed": seed, "counts": counts, "placements": placements}
    (folder / "canvases.json").write_text(json.dumps(summary, indent=1))
    return folder


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    print(write_synthetic_canvases(parser.parse_args().folder))


if __name__ == "__main__":
    main()
