#!/usr/bin/env python
"""Kervadec study pilot: can the tiny two-stream model learn image-sentence matching on the synthetic captions?

    python benchmarks/studies/matching_pilot.py --learning_rate 1e-4 --steps 300
    python benchmarks/studies/matching_pilot.py --learning_rate 1e-4 --steps 200 --constant_mismatch

Only the matching head trains (no masked words, objects, QA or alignment), on the scenes with distractors, batch 32,
half of the rows paired with another image. `--constant_mismatch` replaces a mismatched row's region features by a
constant, a mismatch visible in the features alone: the control that the image reaches the pooled output. Prints the
mean loss and accuracy of every 50 steps (results/kervadec_alignment/PILOTS.md, runs 9 and 10).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from hf_vlalign import TwoStreamForPreTraining
from hf_vlalign.data import TwoStreamPretrainingCollator, build_dataset, region_feature_statistics
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.recipes import from_checkpoint_or_text
from hf_vlalign.synthetic import SyntheticSceneConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_text_model import write_tiny_text_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

INPUTS = ("input_ids", "attention_mask", "token_type_ids", "visual_feats", "visual_boxes", "visual_attention_mask")
WINDOW = 50


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--constant_mismatch", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    text_model = str(write_tiny_text_model(ROOT / "outputs" / "studies" / "tiny_text_model"))
    scenes = SyntheticSceneConfig(num_train_images=800, num_val_images=150, distractors=True)
    store = synthetic_region_features(config=scenes)
    rows = build_dataset("synthetic_scenes", None, "train", task="captions", config=scenes, region_features=store)
    collator = TwoStreamPretrainingCollator(
        AutoTokenizer.from_pretrained(text_model), store, text_columns=("sentence",), mlm_probability=0.0,
        object_mask_probability=0.0, mismatch_probability=0.5,
    )  # fmt: skip
    sizes = {"l_layers": 2, "r_layers": 1, "x_layers": 2, "visual_feat_dim": store.feature_dim}
    model = from_checkpoint_or_text(TwoStreamForPreTraining, text_model, {"task_alignment": False}, sizes)
    model.config.task_mask_lm = model.config.task_obj_predict = model.config.task_qa = False
    model.set_visual_feature_statistics(*region_feature_statistics(store, max_images=len(store)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    model.train()
    window = []
    for step in range(1, args.steps + 1):
        batch = collator([rows[i] for i in torch.randint(len(rows), (32,)).tolist()])
        if args.constant_mismatch:
            batch["visual_feats"][batch["matched_labels"] == 0] = 3.0
        output = model(**{name: batch[name] for name in INPUTS}, matched_labels=batch["matched_labels"])
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        correct = (output.cross_relationship_score.argmax(-1) == batch["matched_labels"]).float().mean()
        window.append((output.loss.item(), correct.item()))
        if step % WINDOW == 0:
            loss, accuracy = (sum(values) / WINDOW for values in zip(*window[-WINDOW:]))
            print(f"step {step}: matching loss {loss:.4f}, accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
