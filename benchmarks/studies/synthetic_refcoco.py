"""The synthetic scenes' referring expressions as user-format `refcoco` files, one per split, for `hf-vlalign
localization-heads` (`--selection_data_file` train.jsonl, `--data_file` val.jsonl).

The scenes write their expressions in RefCOCO+'s own layout (`refcoco+/refs(unc).p` and `instances.json`, UNC splits
train / val: one ref per shape, 1-3 expressions naming its appearance, `hf_vlalign.synthetic.tasks`); the library's
RefCOCO+ builder (`hf_vlalign.data.builders.refcoco.build`) reads them back, and each row is written as
docs/own_data.md's `refcoco` row: the rendered image, the expression and the referred shape's box in pixels.

    python benchmarks/studies/synthetic_refcoco.py outputs/studies/synthetic_refcoco --train_images 800 --distractors
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_vlalign.data.builders.refcoco import build
from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp

SPLITS = ("train", "val")


def write_synthetic_refcoco(folder: str | Path, config: SyntheticSceneConfig) -> Path:
    """Writes (once: a folder holding both files is kept as it is) `<folder>/train.jsonl` and `val.jsonl`, the
    referring expressions of the scenes of `config`, with the rendered images' absolute paths."""
    folder = Path(folder)
    if all((folder / f"{split}.jsonl").is_file() for split in SPLITS):
        return folder
    scenes = load_or_generate_synthetic_vgp(config=config)
    folder.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        rows = [
            {"image": str((scenes.images / row["file_name"]).resolve()), "expression": row["expression"],
             "box": row["expression_phrase_boxes"][0][0]}
            for row in build(scenes.refcoco_dir, split)
        ]  # fmt: skip
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--train_images", type=int, default=800)
    parser.add_argument("--val_images", type=int, default=150)
    parser.add_argument("--distractors", action="store_true")
    args = parser.parse_args()
    config = SyntheticSceneConfig(args.train_images, args.val_images, distractors=args.distractors)
    print(write_synthetic_refcoco(args.folder, config))


if __name__ == "__main__":
    main()
