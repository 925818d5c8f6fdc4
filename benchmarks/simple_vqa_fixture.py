#!/usr/bin/env python
"""A real-layout VQA v2 fixture of simple images, generated on demand (nothing binary is committed).

What a user with a third-party converter has: small RGB images of coloured shapes on textured backgrounds, 17
detector-like boxes per image (each shape's box, jittered copies of it, the whole image and random boxes, in a
shuffled order), and *pooled-colour* region features: every box cropped and area-pooled to 8 x 8 RGB pixels, written
raw (0..255 by default, as the converter writes them; `feature_scale=1.0` for 0..1), 8 * 8 * 3 = 192 values. Nothing
in these features is normalised or made easy: colour and shape have to be read from 64 pixel triples that also cover
background.

Files, in the published layouts and read by the library's real readers:

- `features.tsv`: LXMERT's 10-field TSV (`hf_vlalign.data.formats.lxmert_tsv.write_lxmert_tsv`), image ids
  `COCO_{train,val}2014_{id:012d}`, converted into a `RegionFeatureStore` at `store/` (`convert_features`, what
  `hf-vlalign convert-features` runs);
- `vqa/v2_OpenEnded_mscoco_{train,val}2014_questions.json` and `vqa/v2_mscoco_{train,val}2014_annotations.json`:
  the official VQA v2 layouts (header fields, 10 answers per question with `answer_confidence` and `answer_id`,
  `question_type`, `answer_type`, `multiple_choice_answer`).

Questions (every answer needs the image; none can be read from the question alone better than chance;
`max_shapes=1` makes one shape per image and no counting question, like the easy-VQA set):

- yes/no: "Is there a red circle?" (half yes; a "no" names a colour and a shape that are both in the image, on
  different shapes, so that colour and shape must be bound to the same region);
- other (colour): "What color is the triangle?";
- other (shape): "What shape is the blue object?";
- number: "How many shapes are there?" (1 to 3).

Every image holds 1 to `max_shapes` (default 3) shapes of distinct kinds and distinct colours, so every question
has one answer; with one shape a "no" names a pair absent from the image.

    python benchmarks/simple_vqa_fixture.py OUT_DIR [--train_images 600 --val_images 150 --max_shapes 3]
        [--feature_scale 255]

then `examples/finetune_vqa.py --dataset vqa_v2 --data_dir OUT_DIR/vqa --features OUT_DIR/store`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {"red": (200, 30, 35), "green": (40, 160, 60), "blue": (35, 60, 200), "yellow": (225, 205, 40)}
SHAPES = ("circle", "square", "triangle")
NUM_REGIONS = 17
POOL = 8  # 8 x 8 RGB = 192 values per region
SPLIT_OFFSET = {"train": 100_000, "val": 500_000}  # COCO-like integer image ids, distinct across splits


@dataclass(frozen=True)
class SimpleVQAFixture:
    root: Path
    data_dir: Path  # the VQA v2 files
    store_dir: Path  # the RegionFeatureStore converted from features.tsv
    tsv: Path
    num_train_images: int
    num_val_images: int


def _store_id(split: str, image_id: int) -> str:
    return f"COCO_{split}2014_{image_id:012d}"


def _render(rng: np.random.Generator, size: int, max_shapes: int) -> tuple[Image.Image, list[dict]]:
    """An image of 1 to `max_shapes` shapes (distinct kinds, distinct colours) on a noisy two-tone background."""
    base = rng.integers(90, 200, size=3)
    other = np.clip(base + rng.integers(-50, 51, size=3), 0, 255)
    ramp = np.linspace(0.0, 1.0, size)[None, :, None] if rng.random() < 0.5 else np.linspace(0.0, 1.0, size)[:, None, None]
    background = base[None, None, :] * (1 - ramp) + other[None, None, :] * ramp
    background = background + rng.normal(0.0, 12.0, size=(size, size, 3))
    image = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    count = int(rng.integers(1, max_shapes + 1))
    kinds = rng.choice(len(SHAPES), size=count, replace=False)
    colours = rng.choice(len(COLOURS), size=count, replace=False)
    shapes, placed = [], []
    for kind, colour in zip(kinds, colours):
        for _ in range(50):
            side = int(rng.integers(size // 5, size // 2.6))
            x1, y1 = (int(v) for v in rng.integers(1, size - side - 1, size=2))
            box = (x1, y1, x1 + side, y1 + side)
            if all(box[2] + 2 <= b[0] or b[2] + 2 <= box[0] or box[3] + 2 <= b[1] or b[3] + 2 <= box[1] for b in placed):
                break
        else:
            continue  # no room left: fewer shapes
        placed.append(box)
        name, rgb = list(COLOURS.items())[colour]
        fill = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in rgb)
        shape = SHAPES[kind]
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) / 2, box[1])], fill=fill)
        shapes.append({"shape": shape, "colour": name, "box": box})
    return image, shapes


def _regions(rng: np.random.Generator, shapes: list[dict], size: int) -> np.ndarray:
    """17 boxes (x1, y1, x2, y2 pixels): each shape's box and jittered copies, the whole image, random boxes; shuffled."""
    boxes = [(0.0, 0.0, float(size), float(size))]
    for shape in shapes:
        x1, y1, x2, y2 = shape["box"]
        boxes.append((x1 - 1.0, y1 - 1.0, x2 + 1.0, y2 + 1.0))
        for _ in range(2):
            w, h = x2 - x1, y2 - y1
            jitter = rng.normal(0.0, 0.12, size=4) * np.array([w, h, w, h])
            boxes.append(tuple(np.array([x1, y1, x2, y2], dtype=float) + jitter))
    while len(boxes) < NUM_REGIONS:
        w, h = rng.uniform(size * 0.15, size * 0.7, size=2)
        x1, y1 = rng.uniform(0, size - w), rng.uniform(0, size - h)
        boxes.append((x1, y1, x1 + w, y1 + h))
    boxes = np.clip(np.array(boxes[:NUM_REGIONS], dtype=np.float32), 0.0, float(size))
    boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 2.0)
    boxes = np.clip(boxes, 0.0, float(size))
    return boxes[rng.permutation(len(boxes))]


def pooled_colour_features(image: Image.Image, boxes: np.ndarray, scale: float = 255.0) -> np.ndarray:
    """(R, 192) float32: each box area-pooled to 8 x 8 RGB, values in [0, scale] (255: raw pixel values)."""
    crops = [np.asarray(image.resize((POOL, POOL), Image.Resampling.BOX, box=tuple(box))) for box in boxes.tolist()]
    return (np.stack(crops).reshape(len(boxes), -1).astype(np.float32) * (scale / 255.0)).astype(np.float32)


def _questions(rng: np.random.Generator, shapes: list[dict], max_shapes: int) -> list[tuple[str, str, str, str]]:
    """(question, answer, question_type, answer_type) of one image; no counting question when every image holds one
    shape (its answer would not need the image)."""
    present = {(s["colour"], s["shape"]) for s in shapes}
    if rng.random() < 0.5:  # "yes": a pair of the image
        colour, shape = sorted(present)[int(rng.integers(len(present)))]
        answer = "yes"
    elif len(shapes) >= 2 and rng.random() < 0.5:  # hard "no": the colour of one shape with the kind of another
        first, second = rng.choice(len(shapes), size=2, replace=False)
        colour, shape = shapes[first]["colour"], shapes[second]["shape"]
        answer = "no"
    else:  # "no": a pair absent from the image
        absent = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in present]
        colour, shape = absent[int(rng.integers(len(absent)))]
        answer = "no"
    questions = [(f"Is there a {colour} {shape}?", answer, "is there a", "yes/no")]
    target = shapes[int(rng.integers(len(shapes)))]
    questions.append((f"What color is the {target['shape']}?", target["colour"], "what color is the", "other"))
    target = shapes[int(rng.integers(len(shapes)))]
    questions.append((f"What shape is the {target['colour']} object?", target["shape"], "what", "other"))
    if max_shapes > 1 and rng.random() < 0.5:
        questions.append(("How many shapes are there?", str(len(shapes)), "how many", "number"))
    return questions


def _header(split: str) -> dict:
    return {
        "info": {"description": "Simple-image fixture in the VQA v2 layout.", "version": "2.0", "year": 2017},
        "task_type": "Open-Ended",
        "data_type": "mscoco",
        "license": {"url": "http://creativecommons.org/licenses/by/4.0/", "name": "CC BY 4.0"},
        "data_subtype": f"{split}2014",
    }


def generate(
    out_dir: str | Path,
    *,
    num_train_images: int = 600,
    num_val_images: int = 150,
    image_size: int = 64,
    max_shapes: int = 3,
    feature_scale: float = 255.0,
    seed: int = 0,
    save_images: bool = False,
) -> SimpleVQAFixture:
    """Writes the fixture under `out_dir` (images only with `save_images`) and returns its paths."""
    from hf_vlalign.data import convert_features
    from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv

    if num_train_images < 2 or num_val_images < 2:
        raise ValueError(f"need >= 2 images per split, got {num_train_images} / {num_val_images}.")
    if max_shapes not in (1, 2, 3):
        raise ValueError(f"max_shapes must be 1, 2 or 3 (one shape of each kind at most), got {max_shapes}.")
    root = Path(out_dir)
    data_dir = root / "vqa"
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records = []
    for split, count in (("train", num_train_images), ("val", num_val_images)):
        questions, annotations = [], []
        for index in range(count):
            image_id = SPLIT_OFFSET[split] + index
            image, shapes = _render(rng, image_size, max_shapes)
            boxes = _regions(rng, shapes, image_size)
            if save_images:
                (root / "images").mkdir(exist_ok=True)
                image.save(root / "images" / f"{_store_id(split, image_id)}.png")
            records.append(
                {
                    "image_id": _store_id(split, image_id),
                    "image_size": [image_size, image_size],
                    "boxes": boxes,
                    "features": pooled_colour_features(image, boxes, feature_scale),
                    # a converter without a detector vocabulary writes placeholder ids and confidences
                    "object_ids": np.zeros(len(boxes), dtype=np.int64),
                    "object_conf": np.ones(len(boxes), dtype=np.float32),
                    "attr_ids": np.zeros(len(boxes), dtype=np.int64),
                    "attr_conf": np.ones(len(boxes), dtype=np.float32),
                }
            )
            questions_of_image = _questions(rng, shapes, max_shapes)
            for number, (question, answer, question_type, answer_type) in enumerate(questions_of_image):
                question_id = image_id * 1000 + number
                questions.append({"image_id": image_id, "question": question, "question_id": question_id})
                answers = [{"answer": answer, "answer_confidence": "yes", "answer_id": k + 1} for k in range(10)]
                annotations.append(
                    {
                        "question_type": question_type,
                        "multiple_choice_answer": answer,
                        "answers": answers,
                        "image_id": image_id,
                        "answer_type": answer_type,
                        "question_id": question_id,
                    }
                )
        (data_dir / f"v2_OpenEnded_mscoco_{split}2014_questions.json").write_text(
            json.dumps({**_header(split), "questions": questions})
        )
        (data_dir / f"v2_mscoco_{split}2014_annotations.json").write_text(
            json.dumps({**_header(split), "annotations": annotations})
        )
    tsv = root / "features.tsv"
    write_lxmert_tsv(tsv, records)
    store_dir = root / "store"
    convert_features(tsv, "lxmert_tsv", store_dir, overwrite=True)
    return SimpleVQAFixture(root, data_dir, store_dir, tsv, num_train_images, num_val_images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--train_images", type=int, default=600)
    parser.add_argument("--val_images", type=int, default=150)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--max_shapes", type=int, default=3, help="1: one shape per image (easy-VQA-like)")
    parser.add_argument("--feature_scale", type=float, default=255.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save_images", action="store_true")
    args = parser.parse_args()
    fixture = generate(
        args.out_dir,
        num_train_images=args.train_images,
        num_val_images=args.val_images,
        image_size=args.image_size,
        max_shapes=args.max_shapes,
        feature_scale=args.feature_scale,
        seed=args.seed,
        save_images=args.save_images,
    )
    print(json.dumps({k: str(v) for k, v in fixture.__dict__.items()}, indent=1))


if __name__ == "__main__":
    main()
