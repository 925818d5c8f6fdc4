"""`synthesize`, `convert-features`, `convert` and `extract-features`: the verbs that write data and checkpoints in the
library's formats (the synthetic scenes, a region-feature store, a converted checkpoint)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..utils.size_limits import int_at_most
from .common import DISTRACTORS_HELP, SYNTHETIC_WORLD_HELP, SYNTHETIC_WORLDS, Output, print_result

# the parser's choices, spelled out so that `--help` imports nothing heavy (tests/cli/test_cli.py checks them against
# `data.feature_store.FEATURE_FORMATS`)
FEATURE_FORMATS = ("butd_h5", "butd_tsv", "lxmert_tsv", "m2_hdf5", "npz_dir", "vlbert_json")
# a converted checkpoint's tokenizer must split this sentence into word pieces of a real vocabulary
TOKENIZER_CHECK_SENTENCE = "a man rides a horse"
MIN_VOCABULARY_SIZE = 100


def run_synthesize(args: argparse.Namespace) -> int:
    from ..synthetic import SyntheticSceneConfig, generate_synthetic_scenes

    config = SyntheticSceneConfig(
        num_train_images=args.train_images,
        num_val_images=args.val_images,
        seed=args.seed,
        distractors=args.distractors,
        world=args.world,
    )
    paths = generate_synthetic_scenes(args.out, config)
    print_result(json.dumps({"root": str(paths.root), "features_tsv": str(paths.features_tsv)}, indent=2))
    return 0


def add_synthesize(add_verb) -> None:
    parser = add_verb(
        "synthesize", "write the synthetic grounded scenes in the published formats", run_synthesize,
        outputs={"out": Output("folder")},
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="folder to write the scenes' files into")
    parser.add_argument("--train_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=800, help="training images")
    parser.add_argument("--val_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=150, help="validation images")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scenes")
    parser.add_argument("--distractors", action="store_true", help=DISTRACTORS_HELP)
    parser.add_argument("--world", choices=SYNTHETIC_WORLDS, default="v1", help=SYNTHETIC_WORLD_HELP)


def run_convert_features(args: argparse.Namespace) -> int:
    from ..data.feature_store import check_store_output, convert_features

    check_store_output(args.out, "--out", overwrite=args.overwrite)
    options = {name: getattr(args, name) for name in ("id_map", "image_sizes", "box_dir") if getattr(args, name)}
    store = convert_features(args.src, args.format, args.out, on_error=args.on_error, overwrite=args.overwrite, **options)
    print_result(json.dumps({"out": str(args.out), "num_images": len(store), "feature_dim": store.feature_dim}, indent=2))
    return 0


def add_convert_features(add_verb) -> None:
    parser = add_verb(
        "convert-features", "published region features -> a RegionFeatureStore folder", run_convert_features,
        option_settings={
            "id_map": ("format", ("butd_h5",)),
            "image_sizes": ("format", ("m2_hdf5", "npz_dir")),
            "box_dir": ("format", ("npz_dir",)),
        },
        required_options={("format", "butd_h5"): ("id_map",)},
        outputs={"out": Output("folder")},
    )  # fmt: skip
    parser.add_argument("src", type=Path, help="the feature file or folder as published")
    parser.add_argument("--format", required=True, choices=FEATURE_FORMATS, help="the published layout of `src`")
    parser.add_argument("--out", type=Path, required=True, help="the store folder to write")
    parser.add_argument(
        "--on_error", choices=("raise", "skip"), default="raise", help="a malformed record: stop, or skip it (counted)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--id_map", type=Path, help="butd_h5: image id -> index map (.json or .pkl)")
    parser.add_argument("--image_sizes", type=Path, help="m2_hdf5, npz_dir: COCO-style JSON with the images' sizes")
    parser.add_argument("--box_dir", type=Path, help="npz_dir: folder of <id>.npy boxes")


def tokenizer_problem(tokenizer, vocab_size: int) -> str | None:
    """Why `tokenizer` is not a real vocabulary for a model with `vocab_size` word embeddings (None when it is)."""
    size = len(tokenizer)
    if size < MIN_VOCABULARY_SIZE:
        return f"its vocabulary has {size} tokens"
    ids = tokenizer(TOKENIZER_CHECK_SENTENCE, add_special_tokens=False)["input_ids"]
    if not ids or all(token == tokenizer.unk_token_id for token in ids):
        return f"it tokenizes {TOKENIZER_CHECK_SENTENCE!r} into unknown tokens only"
    if size > vocab_size:
        return f"its {size} tokens exceed the model's {vocab_size} word embeddings"
    return None


def converted_tokenizer(source: str, tokenizer: str | None, vocab_size: int) -> tuple[object, str]:
    """(tokenizer, where it came from) for a converted checkpoint: `tokenizer` when given, else the source's own, else
    the text model its config names. Refuses rather than save an empty vocabulary (every word [UNK])."""
    from transformers import AutoConfig, AutoTokenizer

    if tokenizer is not None:
        candidates = [("`--tokenizer`", tokenizer)]
    else:
        text_config = getattr(AutoConfig.from_pretrained(source), "text_config", None)
        text_model = getattr(text_config, "_name_or_path", None)
        candidates = [("`src`", source)] + ([("the text model of `src`'s config", text_model)] if text_model else [])
    problems = []
    for where, name in candidates:
        try:
            loaded = AutoTokenizer.from_pretrained(name)
        except (ValueError, OSError) as error:
            problems.append(f"{where} {name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
            continue
        problem = tokenizer_problem(loaded, vocab_size)
        if problem is None:
            return loaded, name
        problems.append(f"{where} {name}: {problem}")
    hint = "" if tokenizer is not None else (
        "; pass `--tokenizer PATH_OR_ID`, the text model the checkpoint was trained with (e.g. bert-base-uncased)"
    )
    raise ValueError(f"no usable tokenizer for the converted checkpoint ({'; '.join(problems)}){hint}.")


def run_convert_checkpoint(args: argparse.Namespace) -> int:
    from ..hub import convert_lxmert, convert_visualbert
    from ..hub.conversion import check_conversion_output

    inputs = {"src": args.src, "--tokenizer": args.tokenizer}
    check_conversion_output(args.out, inputs, overwrite=args.overwrite, output_argument="--out")
    overrides = {"attention_supervision": args.attention_supervision} if args.attention_supervision else {}
    converter = {"visualbert": convert_visualbert, "lxmert": convert_lxmert}[args.source_format]
    model = converter(args.src, **overrides)
    tokenizer, tokenizer_source = converted_tokenizer(args.src, args.tokenizer, model.config.vocab_size)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    summary = {"out": str(args.out), "model": type(model).__name__, "tokenizer": tokenizer_source}
    print_result(json.dumps(summary | {"vocabulary_size": len(tokenizer)}, indent=2))
    return 0


def add_convert(add_verb) -> None:
    parser = add_verb(
        "convert", "transformers' VisualBert / Lxmert checkpoint -> an hf_vlalign model", run_convert_checkpoint,
        checkpoint_argument="src", outputs={"out": Output("folder")},
    )  # fmt: skip
    parser.add_argument("src", help="the VisualBert / Lxmert checkpoint: a local folder or a Hub id")
    parser.add_argument("--from", dest="source_format", choices=("visualbert", "lxmert"), required=True, help="the family of `src`")
    parser.add_argument("--out", type=Path, required=True, help="folder for the converted checkpoint and its tokenizer")
    parser.add_argument(
        "--tokenizer", help="folder or Hub id of the tokenizer to save with it (default: src's own, which must be a real "
        "vocabulary: VisualBERT checkpoints ship none, use e.g. bert-base-uncased)",
    )  # fmt: skip
    parser.add_argument("--attention_supervision", choices=("none", "direct", "semi_direct", "indirect"), help="set the converted config's attention supervision")
    parser.add_argument("--overwrite", action="store_true", help="replace the files of an existing --out")


def run_extract_features(args: argparse.Namespace) -> int:
    from ..data.feature_store import check_store_output
    from ..data.region_extraction import extract_region_features

    check_store_output(args.out, "--out", overwrite=args.overwrite)
    store = extract_region_features(
        args.images, args.out, boxes=args.boxes, grid_size=args.grid_size, detector=args.detector,
        detector_threshold=args.detector_threshold, max_regions=args.max_regions,
        include_whole_image=args.include_whole_image, encoder=args.encoder, overwrite=args.overwrite,
    )  # fmt: skip
    print_result(json.dumps({"out": str(args.out), "num_images": len(store), "feature_dim": store.feature_dim}, indent=2))
    return 0


def add_extract_features(add_verb) -> None:
    parser = add_verb(
        "extract-features", "region features of your own images -> a RegionFeatureStore", run_extract_features,
        outputs={"out": Output("folder")},
    )  # fmt: skip
    parser.add_argument("images", type=Path, help="folder of .jpg/.png images")
    parser.add_argument("--out", type=Path, required=True, help="the store folder to write")
    parser.add_argument("--boxes", type=Path, help='JSON {"<image>": [[x1, y1, x2, y2], ...]} in pixels')
    parser.add_argument("--grid_size", type=int_at_most("MAX_GRID_SIZE"), help="a fixed g x g grid of boxes instead of --boxes")
    parser.add_argument("--detector", help="instead: a transformers object detection model's Hub id / path finds the boxes")
    parser.add_argument("--detector_threshold", type=float, default=0.5, help="keep the detector's boxes scoring >= this")
    parser.add_argument(
        "--max_regions", type=int_at_most("MAX_REGIONS_PER_IMAGE"), default=36, help="the detector's best boxes kept per image"
    )
    parser.add_argument("--include_whole_image", action="store_true", help="put the whole-image box first")
    parser.add_argument("--encoder", default="pixel", help="'pixel' (offline) or a vision backbone's Hub id / path")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")


VERB_PARSERS = (add_synthesize, add_convert_features, add_convert, add_extract_features)
