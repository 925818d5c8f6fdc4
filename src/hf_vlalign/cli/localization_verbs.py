"""`localization-heads`: Kang et al.'s localization heads of a transformers decoder VLM (every patch family but ViLT),
picked over referring expressions and scored by training-free grounding (`hf_vlalign.vlms.localization_heads`)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from ..utils.optional import require
from ..utils.size_limits import int_at_most
from .common import (
    USER_FILE,
    Output,
    add_data_file_argument,
    add_model_argument,
    print_result,
    reads_patch_model,
    write_json_result,
    write_result,
)

SELECTION_FILE = "localization_heads.json"
PLOT_FILE = "localization_heads.png"
SCORES_FILE = "grounding_scores.json"


def _examples(args: argparse.Namespace) -> tuple[list[dict], str]:
    from ..vlms.localization_heads import flickr30k_phrase_examples, refcoco_file_examples

    if args.data == USER_FILE:
        return refcoco_file_examples(args.data_file), f"{args.data_file} (refcoco layout)"
    examples = flickr30k_phrase_examples(args.flickr30k_entities_dir, args.images_dir, args.split, args.max_images)
    return examples, f"Flickr30k Entities {args.split} phrases"


def _split(examples: list[dict], args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """(selection examples, scored examples): a seeded random `--selection_samples` of the data select the heads and
    the others are scored (the paper selects on RefCOCO train and scores on val: no example does both); with
    `--selection_data_file`, that file's examples select (a seeded `--selection_samples` of them, all when fewer) and
    every example of the data is scored."""
    if args.selection_samples < 1:
        raise ValueError(f"`--selection_samples` must be >= 1, got {args.selection_samples}.")
    if args.selection_data_file is not None:
        from ..vlms.localization_heads import refcoco_file_examples

        selecting = refcoco_file_examples(args.selection_data_file)
        drawn = random.Random(args.seed).sample(range(len(selecting)), min(args.selection_samples, len(selecting)))
        order = sorted(drawn)
        return [selecting[i] for i in order], examples
    order = list(range(len(examples)))
    random.Random(args.seed).shuffle(order)
    if args.selection_samples >= len(examples):
        raise ValueError(
            f"`--selection_samples` {args.selection_samples} leaves none of the data's {len(examples)} examples to "
            "score: give fewer, or a `--selection_file` made on other data (e.g. RefCOCO train)."
        )
    chosen = set(order[: args.selection_samples])
    return [examples[i] for i in sorted(chosen)], [e for i, e in enumerate(examples) if i not in chosen]


def run_localization_heads(args: argparse.Namespace) -> int:
    from ..vlms.loading import load_patch_model
    from ..vlms.localization_heads import (
        HeadSelection,
        check_sigma,
        find_localization_heads,
        localization_head_grounding,
        plot_head_selection,
    )

    if not reads_patch_model(args):
        raise ValueError(
            f"`model` {args.model} must be a transformers decoder vision-language model (LLaVA, Qwen2-VL, ...): "
            "localization heads read the last text token's attention over the image tokens."
        )
    require("matplotlib", extra="plots")  # the selection's plot: checked before the model runs
    check_sigma("--smoothing_sigma", args.smoothing_sigma)
    model, processor = load_patch_model(args.model)
    examples, source = _examples(args)
    reuse = args.selection_file is not None and args.selection_file.is_file()
    if reuse and args.selection_data_file is not None:
        raise ValueError(
            f"`--selection_data_file` {args.selection_data_file} selects heads, but `--selection_file` "
            f"{args.selection_file} holds a selection to reuse: drop one."
        )
    if reuse:
        selection = HeadSelection.load(args.selection_file, model, args.model)
        scored = examples
    else:
        chosen, scored = _split(examples, args)
        selection = find_localization_heads(
            model, processor, chosen, args.model, num_heads=args.num_heads, threshold_factor=args.threshold_factor,
            component_share=args.component_share, excluded_layers=args.excluded_layers, batch_size=args.batch_size,
        )  # fmt: skip
        if args.selection_file is not None:
            write_result(args.selection_file, selection.save)
    scores = localization_head_grounding(
        model, processor, scored, selection, merge_gold_boxes=args.gold_boxes == "union", batch_size=args.batch_size,
        smoothing_sigma=args.smoothing_sigma,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(args.out / SELECTION_FILE, selection.save)
    write_result(args.out / PLOT_FILE, lambda partial: plot_head_selection(selection, partial))
    scores = {"model": args.model, "data": source, "selection_reused": reuse, "selection_samples": selection.num_samples, **scores}
    write_json_result(args.out / SCORES_FILE, scores)
    summary = {key: value for key, value in scores.items() if key != "predicted_boxes"}
    print_result(json.dumps({"out": str(args.out), "tau": selection.tau, **summary}, indent=2))
    return 0


def add_localization_heads(add_verb) -> None:
    parser = add_verb(
        "localization-heads", "localization heads (Kang et al. 2025) of a decoder VLM and their training-free grounding",
        run_localization_heads, outputs={"out": Output("folder")},
        patch_model_data=(USER_FILE, "flickr30k_entities"), data_file_task="refcoco",
    )  # fmt: skip
    add_model_argument(parser, "a transformers decoder VLM (LLaVA, PaliGemma, Qwen2-VL, Idefics3, Gemma 3, ...)")
    parser.add_argument(
        "--data", choices=(USER_FILE, "flickr30k_entities"), default="flickr30k_entities",
        help="referring expressions of your own file in the RefCOCO layout (--data_file), or Flickr30k Entities phrases "
        "with their images (--flickr30k_entities_dir, --images_dir, --split)",
    )  # fmt: skip
    add_data_file_argument(parser, "a `refcoco` file (image, expression, box in pixels)")
    group = parser.add_argument_group("Flickr30k Entities phrases (each boxed phrase alone is an expression)")
    group.add_argument("--flickr30k_entities_dir", help="the Flickr30k Entities folder (Sentences/, Annotations/)")
    group.add_argument("--images_dir", help="the Flickr30k images (<id>.jpg)")
    group.add_argument("--split", choices=("train", "val", "test"), default="val", help="the Flickr30k Entities split")
    group.add_argument("--max_images", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), help="only the first N images of the split (default: all)")
    group.add_argument(
        "--gold_boxes", choices=("union", "any"), default="union",
        help="a phrase of several boxes is right when its box meets their union (Plummer et al.) or any one (MDETR's ANY-BOX)",
    )  # fmt: skip
    group.add_argument(
        "--smoothing_sigma", type=float, default=1.0,
        help="sigma of the grounding's 7 x 7 Gaussian, in grid cells (the paper: 1 on LLaVA-1.5's 24 x 24 grid; grid "
        "side / 24 keeps that smoothing as a share of the image on another grid)",
    )  # fmt: skip
    group = parser.add_argument_group("head selection")
    group.add_argument(
        "--selection_file", type=Path, help="a selection to reuse (refused if made for another model config; the "
        "selection options below are then not read); when it does not exist, the heads are selected and saved there",
    )  # fmt: skip
    group.add_argument(
        "--selection_data_file", type=Path, help="a `refcoco` file whose expressions select the heads (the paper: "
        "RefCOCO train; --selection_samples of them drawn with --seed, all when fewer); every example of the data is "
        "then scored",
    )  # fmt: skip
    group.add_argument("--num_heads", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), default=3, help="localization heads kept (the paper: 3)")
    group.add_argument(
        "--selection_samples", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), default=1000,
        help="examples drawn at random (--seed) to select the heads on (the paper: 1,000); the others are scored",
    )  # fmt: skip
    group.add_argument("--seed", type=int, default=0, help="seed of the draw of the selection examples")
    group.add_argument(
        "--excluded_layers", type=int, default=2,
        help="the first layers never selected (the paper: 2, whose maps are diffuse); 0 for a model of 2 layers",
    )  # fmt: skip
    group.add_argument(
        "--component_share", choices=("area", "mass"), default="area",
        help="P(C) of the spatial entropy: a component's share of the area above the threshold (the paper) or of the "
        "attention above it (the official code)",
    )  # fmt: skip
    group.add_argument(
        "--threshold_factor", type=float, default=1.0,
        help="binarise each map above this times its mean (the paper: 1; the official code's overhaul: 2)",
    )  # fmt: skip
    parser.add_argument("--batch_size", type=int_at_most("MAX_BATCH_SIZE"), default=8, help="examples per forward pass")
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {SELECTION_FILE}, {PLOT_FILE} and {SCORES_FILE}")


VERB_PARSERS = (add_localization_heads,)
