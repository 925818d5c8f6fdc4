#!/usr/bin/env python
"""Does `examples/finetune_vqa.py` read the image on real-layout low-dimensional features? Before / after the region
feature standardisation, per family, per answer type, with the own-image vs shuffled-image gap.

    python benchmarks/image_use.py                        # 600 / 150 images, 3 epochs, both families (~10 min, 2 cores)
    python benchmarks/image_use.py --quick                # 200 / 60 images, 4 epochs, single-stream (~2 min)
    python benchmarks/image_use.py --json out.json --families single_stream --epochs 1

Data: `benchmarks/simple_vqa_fixture.py` (simple images of coloured shapes, 17 boxes, 192-dim raw 0..255 pooled-colour
features in an LXMERT TSV converted to a store, VQA v2 question / annotation files), generated into `--out_dir`.

Settings, each trained by the example's own `main()` with its defaults (plus `--num_train_epochs`):

- "before": the architecture before the fix: the model starts from a checkpoint of the same text weights saved with
  `visual_feature_normalization="none"` (`--model_name_or_path`), i.e. features reach the projection as they are;
- "after": the example's default start (`from_text_pretrained`, new configs standardise), its statistics fitted from
  the training images by the trainer.

Per run: the example's `vqa_accuracy` overall and per answer type (yes/no, other = colour and shape, number), and
the `image_use` entry the example writes (`hf_vlalign.evaluation.image_use_gap`): accuracy with each question's own
image and with another image's regions (a seeded derangement of the evaluation images), their gap overall and per
answer type, and the loss gap. A model that ignores the image has gaps of ~0.

The table of docs/datasets.md is generated from the committed `benchmarks/results/image_use.json`:
`python benchmarks/image_use.py --docs benchmarks/results/image_use.json` (a test checks they agree).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from example_scripts import load_example  # noqa: E402  (benchmarks/example_scripts.py)
import simple_vqa_fixture  # noqa: E402  (benchmarks/simple_vqa_fixture.py)
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from transformers import AutoTokenizer  # noqa: E402

import hf_vlalign  # noqa: E402, F401  (registers the Auto classes)
from hf_vlalign import SingleStreamForQuestionAnswering, TwoStreamForQuestionAnswering, default_text_model_path  # noqa: E402
from hf_vlalign.data.builders import vqa_v2  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "finetune_vqa.py"
ANSWER_TYPES = ("yes_no", "other", "number")
TWO_STREAM_SIZES = {"l_layers": 2, "r_layers": 1, "x_layers": 3}  # the example's defaults from a text checkpoint


def unnormalised_start(family: str, out_dir: Path, feature_dim: int, num_answers: int) -> Path:
    """A checkpoint of the text weights with the pre-fix architecture (features read as they are)."""
    folder = out_dir / f"start_{family}_no_standardisation"
    torch.manual_seed(0)
    model_class = SingleStreamForQuestionAnswering if family == "single_stream" else TwoStreamForQuestionAnswering
    sizes = TWO_STREAM_SIZES if family == "two_stream" else {}
    model = model_class.from_text_pretrained(
        visual_feat_dim=feature_dim, num_qa_labels=num_answers, visual_feature_normalization="none", **sizes
    )
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_text_model_path()).save_pretrained(folder)
    return folder


def run(example, fixture, family: str, setting: str, epochs: float, out_dir: Path, vocab: dict, seed: int) -> dict:
    output_dir = out_dir / f"{family}_{setting}"
    argv = [
        "--dataset", "vqa_v2", "--data_dir", str(fixture.data_dir), "--features", str(fixture.store_dir),
        "--model_family", family, "--num_train_epochs", str(epochs), "--output_dir", str(output_dir),
        "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", str(seed),
        *ONE_LEARNING_RATE,
    ]  # fmt: skip
    if setting == "before":
        argv += ["--model_name_or_path", str(unnormalised_start(family, out_dir, 192, len(vocab)))]
    start = time.perf_counter()
    results = example.main(argv)
    seconds = time.perf_counter() - start
    config = json.loads((output_dir / "config.json").read_text())
    return {
        "family": family,
        "setting": setting,
        "visual_feature_normalization": config["visual_feature_normalization"],
        "vqa_accuracy": results["vqa_accuracy"],
        **{f"vqa_accuracy_{kind}": results.get(f"vqa_accuracy_{kind}") for kind in ANSWER_TYPES},
        **results["image_use"],  # the example's own check: every evaluation question, own vs shuffled image
        "seconds": seconds,
    }


def table(rows: list[dict]) -> str:
    header = (
        "| family | setting | VQA acc | yes/no | other | number | own / shuffled acc | acc gap | gap yes/no | "
        "gap other | gap number | loss gap | time |"
    )
    lines = [header, "|" + "---|" * 13]
    for row in rows:
        lines.append(
            f"| {row['family']} | {row['setting']} ({row['visual_feature_normalization']}) | {row['vqa_accuracy']:.3f} | "
            + " | ".join(f"{row[f'vqa_accuracy_{kind}']:.3f}" for kind in ANSWER_TYPES)
            + f" | {row['own_image_accuracy']:.3f} / {row['shuffled_image_accuracy']:.3f} | {row['image_use_accuracy_gap']:+.3f} | "
            + " | ".join(f"{row.get(f'image_use_accuracy_gap_{kind}', float('nan')):+.3f}" for kind in ANSWER_TYPES)
            + f" | {row['image_use_loss_gap']:+.4f} | {row['seconds']:.0f} s |"
        )
    return "\n".join(lines)


# the rate these results were measured with, written out so that they mean the same whatever the example's defaults
ONE_LEARNING_RATE = ("--learning_rate", "2e-4", "--head_learning_rate", "2e-4")
DOCS_BEGIN = "<!-- benchmarks/image_use.py table: begin -->"
DOCS_END = "<!-- benchmarks/image_use.py table: end -->"
RESULTS = ROOT / "benchmarks" / "results" / "image_use.json"


def docs_block(report: dict) -> str:
    """The docs' table and its one-line setting, from a results file this script wrote."""
    settings = report["settings"]
    caption = (
        f"{settings['train_images']} train / {settings['val_images']} eval images (17 regions, 192-dim raw pooled "
        f"colours), {settings['epochs']:g} epochs of `examples/finetune_vqa.py` with its defaults but one learning rate "
        f"of 2e-4 for every parameter, seed {settings['seed']}; "
        f"{settings['machine']}, torch {settings['torch']}, `python benchmarks/image_use.py --json {RESULTS.relative_to(ROOT)}`"
    )
    return f"{DOCS_BEGIN}\n{caption}\n\n{table(report['runs'])}\n{DOCS_END}"


def write_docs(results: Path) -> None:
    replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(json.loads(results.read_text())))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", default="outputs/image_use_benchmark")
    parser.add_argument("--train_images", type=int, default=600)
    parser.add_argument("--val_images", type=int, default=150)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--families", nargs="+", default=["single_stream", "two_stream"], choices=["single_stream", "two_stream"])
    parser.add_argument("--settings", nargs="+", default=["before", "after"], choices=["before", "after"])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true", help="200 / 60 images, 4 epochs, single-stream")
    parser.add_argument("--json", default=None, help=f"also write the runs as JSON here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' table from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(Path(args.docs))
        return []
    if args.quick:
        args.train_images, args.val_images, args.epochs, args.families = 200, 60, 4.0, ["single_stream"]
    out_dir = Path(args.out_dir)
    fixture = simple_vqa_fixture.generate(
        out_dir / "fixture", num_train_images=args.train_images, num_val_images=args.val_images
    )
    vocab = vqa_v2.build_answer_vocab(fixture.data_dir / vqa_v2.ANNOTATIONS_FILE["train"])  # what the example builds
    example = load_example(EXAMPLE)
    rows = []
    for family in args.families:
        for setting in args.settings:
            rows.append(run(example, fixture, family, setting, args.epochs, out_dir, vocab, args.seed))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    settings = {
        "train_images": args.train_images,
        "val_images": args.val_images,
        "epochs": args.epochs,
        "seed": args.seed,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    print(docs_block({"settings": settings, "runs": rows}))
    if args.json:
        write_results(args.json, {"settings": settings, "runs": rows})
    return rows


if __name__ == "__main__":
    main()
