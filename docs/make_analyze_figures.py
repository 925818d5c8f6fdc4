"""Writes the figures of docs/analysis.md of `hf-vlalign analyze` (docs/images/analyze_*.png) from a saved model.

    python docs/make_analyze_figures.py                              # the main job's model, outputs/vgp
    python docs/make_analyze_figures.py --no_syntactic_grounding     # leaves analyze_syntactic_grounding.png alone
    python docs/make_analyze_figures.py --model DIR --analysis_dir DIR --out_dir DIR

Runs `hf-vlalign analyze` (as `analyze_model`) on the synthetic scenes' evaluation split, writing `analysis.json` and
its PNGs into `--analysis_dir`, then copies every PNG it wrote into `--out_dir` as `analyze_<name>.png`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_figures(analysis_dir: Path, out_dir: Path, prefix: str = "analyze") -> list[Path]:
    """Every PNG of `analysis_dir`, copied into `out_dir` as `<prefix>_<name>.png`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for png in sorted(analysis_dir.glob("*.png")):
        copied.append(Path(shutil.copyfile(png, out_dir / f"{prefix}_{png.name}")))
    return copied


def main(argv: list[str] | None = None) -> list[Path]:
    from hf_vlalign.evaluation.model_analysis import analyze_model
    from hf_vlalign.synthetic import SyntheticSceneConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("outputs/vgp"), help="run from the repository root")
    parser.add_argument("--analysis_dir", type=Path, default=Path("outputs/vgp_analysis_figures"),
                        help="where analyze writes analysis.json and its PNGs (emptied of PNGs first)")  # fmt: skip
    parser.add_argument("--out_dir", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--no_syntactic_grounding", action="store_true", help="skip spaCy's per-relation analysis")
    parser.add_argument("--synthetic_train_images", type=int, default=800)
    parser.add_argument("--synthetic_eval_images", type=int, default=150)
    parser.add_argument("--synthetic_seed", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not (args.model / "model.safetensors").is_file():
        raise SystemExit(
            f"{args.model} holds no model.safetensors: run `accelerate launch examples/finetune_vgp.py` first."
        )
    for stale in args.analysis_dir.glob("*.png"):  # only this run's figures get copied
        stale.unlink()
    synthetic = SyntheticSceneConfig(args.synthetic_train_images, args.synthetic_eval_images, seed=args.synthetic_seed)
    report = analyze_model(
        args.model, args.analysis_dir, synthetic=synthetic, syntactic_grounding=not args.no_syntactic_grounding,
        progress=False,
    )  # fmt: skip
    paths = copy_figures(args.analysis_dir, args.out_dir)
    probe = report["grounding_probe"]
    keys = ("best_layer", "best_head", "best_head_accuracy", "mean_head_accuracy", "baseline_accuracy", "num_phrases")
    summary = {key: probe[key] for key in keys}
    print(json.dumps({"analysis": str(args.analysis_dir), "probe": summary, "figures": [str(p) for p in paths]}, indent=2))
    return paths


if __name__ == "__main__":
    main()
