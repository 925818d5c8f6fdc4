"""`hf-vlalign <verb>`: the library's one console entry point."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _synthesize(args: argparse.Namespace) -> int:
    from .data.synthetic import SyntheticSceneConfig, generate_synthetic_vgp

    config = SyntheticSceneConfig(num_train_images=args.train_images, num_val_images=args.val_images, seed=args.seed)
    paths = generate_synthetic_vgp(args.out, config)
    print(json.dumps({"root": str(paths.root), "features_tsv": str(paths.features_tsv)}, indent=2))
    return 0


def _probe(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .analysis.evaluate_grounding import evaluate_grounding
    from .analysis.plots import plot_head_accuracy
    from .data.builders import load_vgp_data
    from .data.collators import VGPCollator
    from .models import AutoModelForVisualParaphrase

    data = load_vgp_data(args.flickr30k_entities_dir, args.vgp_train_csv, args.vgp_eval_csv, args.features_tsv)
    model = AutoModelForVisualParaphrase.from_pretrained(args.model)
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), data.region_features, return_probe_targets=True)
    result = evaluate_grounding(model, data.eval, collator, args.batch_size)
    print(json.dumps({k: v for k, v in result.to_dict().items() if k != "accuracy"}, indent=2))
    if args.plot:
        plot_head_accuracy(result.accuracy, args.plot, title=f"grounding accuracy per head: {args.model}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-vlalign", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    synthesize = verbs.add_parser("synthesize", help="write the synthetic grounded scenes in the published formats")
    synthesize.add_argument("--out", type=Path, required=True)
    synthesize.add_argument("--train_images", type=int, default=800)
    synthesize.add_argument("--val_images", type=int, default=150)
    synthesize.add_argument("--seed", type=int, default=0)
    synthesize.set_defaults(run=_synthesize)

    probe = verbs.add_parser("probe", help="grounding probe (Li et al.) of a saved VGP model on the eval split")
    probe.add_argument("model", help="folder (or Hub id) of a SingleStreamForVisualParaphrase checkpoint")
    probe.add_argument("--flickr30k_entities_dir")
    probe.add_argument("--vgp_train_csv")
    probe.add_argument("--vgp_eval_csv")
    probe.add_argument("--features_tsv")
    probe.add_argument("--batch_size", type=int, default=32)
    probe.add_argument("--plot", type=Path, help="write the layer x head accuracy heatmap here (PNG)")
    probe.set_defaults(run=_probe)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
