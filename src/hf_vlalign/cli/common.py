"""What every verb shares: the door checks run before a verb reads or writes anything, the argument groups several
verbs take, and the atomic writing of their result files. Each verb declares beside its parser (`set_defaults`) what the
checks read: `option_settings` (option -> (setting, the values that read it)), `required_options` ((setting, value) ->
the options it needs), `model_requirements` (`--data` -> the architecture or family it reads), `outputs` (option ->
`Output`) and `data_file_task` (the user-data task of `--data_file`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from ..utils.output_paths import (
    OutputPathError,
    refuse_foreign_file,
    refuse_output_overlapping_inputs,
)
from ..utils.size_limits import int_at_most
from ..utils.user_errors import one_line

DISTRACTORS_HELP = "each scene's first shape gets a same-kind and a same-colour distractor"
USER_FILE = "user_file"  # the `--data` value of a user-format file (`--data_file`)
SYNTHETIC_OPTIONS = ("synthetic_train_images", "synthetic_eval_images", "synthetic_seed", "synthetic_distractors", "synthetic_world")
# synthetic.scenes.WORLDS, spelled here so that the CLI starts without importing torch (a test checks they agree)
SYNTHETIC_WORLDS = ("v1", "v2")
SYNTHETIC_WORLD_HELP = "version of the synthetic world: v1 (the first, kept) or v2 (docs/synthetic_world.md)"
SYNTHETIC_ONLY = {name: ("data", ("synthetic",)) for name in SYNTHETIC_OPTIONS}
USER_FILE_OPTIONS = {"data_file": ("data", (USER_FILE,))}
NEEDS_DATA_FILE = {("data", USER_FILE): ("data_file",)}
VGP_FILE_OPTIONS = ("flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "features")  # the four files of real VGP data
# verbs that also read transformers' own patch models (ViLT, LLaVA, PaliGemma: `hf_vlalign.vlms`), with the data each
# reads for them: the synthetic scenes' or Flickr30k Entities' images (never region features)
PATCH_MODEL_COMMON_OPTIONS = (
    "data", "batch_size", "max_examples", "max_text_length", "best_head_among", "out", "json", "plot", "num_examples",
    "probe_examples",
    # localization-heads
    "selection_file", "selection_data_file", "num_heads", "selection_samples", "seed", "component_share",
    "threshold_factor", "gold_boxes", "excluded_layers", "smoothing_sigma",
)  # fmt: skip
PATCH_MODEL_OPTIONS = {
    "synthetic": SYNTHETIC_OPTIONS,
    "flickr30k_entities": ("flickr30k_entities_dir", "images_dir", "split", "max_images"),
    USER_FILE: ("data_file", "image"),
}
# the `--help` of a verb's model argument where the verb reads transformers' VLMs too (the parser imports no torch, so
# the families are named in docs/vlms.md, not here)
VLM_MODEL_HELP = (
    "or a transformers vision-language model whose image tokens are patches of the image (a family of "
    "hf_vlalign.vlms: docs/vlms.md), saved with its processor; a VLM reads the images themselves: the synthetic scenes', "
    "Flickr30k Entities' (--images_dir) or those of --data_file"
)
# positional arguments that name what a verb reads (the options are spelled `--name`)
POSITIONAL_INPUTS = ("model", "src", "images", "output_dirs")
# options given as text that may name a local file or folder (a Hub id or a name, where they are none, is skipped)
TEXT_PATH_OPTIONS = ("flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "features", "images_dir", "spacy_model", "tokenizer", "detector", "encoder")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # a BERT-family tokenizer: the fast serialisation or the WordPiece vocabulary
# the JSON files of a checkpoint folder, read once so that a damaged one is named (tokenizers' own errors do not)
CHECKPOINT_JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")

# the stdout `hf-vlalign` was started with: `main` sends everything else printed during a verb to stderr
RESULT_STREAM: ContextVar = ContextVar("hf_vlalign_result_stream", default=None)


def print_result(text: str) -> None:
    """Prints a verb's result (its JSON summary or table) on the command's stdout, which holds nothing else: what
    libraries print meanwhile (e.g. DeepSpeed's accelerator notice when a save imports it) goes to stderr."""
    print(text, file=RESULT_STREAM.get() or sys.stdout, flush=True)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows the default of every option that has one (not `None` / `False`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _setting_text(setting: str, value: object) -> str:
    if isinstance(value, bool):
        return f"`--{setting}`" if value else f"a run without `--{setting}`"
    return f"`--{setting} {value}`"


def reads_patch_model(args: argparse.Namespace) -> bool:
    """Whether the verb runs on a transformers patch model (`hf_vlalign.vlms`) rather than an hf_vlalign one."""
    if not args.patch_model_data or not isinstance(getattr(args, "model", None), str):
        return False
    from ..vlms.loading import is_patch_model

    return is_patch_model(args.model)


def check_patch_model_options(args: argparse.Namespace, given: set[str]) -> None:
    """A patch model reads images: `--data` among the verb's `patch_model_data`, Flickr30k Entities with its images
    folder, and none of the region models' files (features, VGP pairs, user files)."""
    if args.data not in args.patch_model_data:
        choices = " or ".join(f"`--data {value}`" for value in args.patch_model_data)
        raise ValueError(f"`{args.verb}` of a transformers patch model reads {choices}, got `--data {args.data}`.")
    missing = [f"--{name}" for name in ("flickr30k_entities_dir", "images_dir") if getattr(args, name, None) is None]
    if args.data == "flickr30k_entities" and missing:
        raise ValueError(f"`--data flickr30k_entities` of a patch model needs {', '.join(missing)}.")
    readable = {*PATCH_MODEL_OPTIONS[args.data], *PATCH_MODEL_COMMON_OPTIONS}
    for option in sorted(given - readable):
        raise ValueError(f"`--{option}` does not apply to a transformers patch model with `--data {args.data}`: drop it.")


# counts of every verb that mean nothing at 0 or below (the upper bounds are checked while parsing: `int_at_most`)
POSITIVE_COUNTS = ("batch_size", "num_batches", "synthetic_train_images", "synthetic_eval_images")


def check_options(args: argparse.Namespace, given: set[str]) -> None:
    """`--data_file` alone means `--data user_file`; then refuses a count below 1 (`POSITIVE_COUNTS`), a setting
    without an option it needs (`required_options`) and an option that the chosen setting does not read
    (`option_settings`), naming both; a transformers patch model's options are checked by `check_patch_model_options`."""
    if "data_file" in given and "data" not in given:
        args.data = USER_FILE
    for option in POSITIVE_COUNTS:
        value = getattr(args, option, None)
        if value is not None and value < 1:
            raise ValueError(f"`--{option}` must be >= 1, got {value}.")
    if reads_patch_model(args):
        check_patch_model_options(args, given)
        return
    if "images_dir" in given:
        raise ValueError(
            "`--images_dir` applies only to transformers' patch models (ViLT, LLaVA, PaliGemma), which read the images; "
            "a region model reads --features."
        )
    for (setting, value), options in args.required_options.items():
        missing = [f"--{option}" for option in options if getattr(args, option) is None]
        if getattr(args, setting) == value and missing:
            raise ValueError(f"{_setting_text(setting, value)} needs {', '.join(missing)}.")
    for option in sorted(given):
        setting, values = args.option_settings.get(option, (None, ()))
        if setting is not None and getattr(args, setting) not in values:
            allowed = " or ".join(_setting_text(setting, value) for value in values)
            raise ValueError(
                f"`--{option}` applies only to {allowed}, not to {_setting_text(setting, getattr(args, setting))}: drop it."
            )


@dataclass(frozen=True)
class Output:
    """An output path of a verb: a "file" or a "folder"; for a file the CLI writes, what it is and how to recognise one
    the library wrote (`is_own`), the only kind of existing file it replaces (a folder's writer checks its own)."""

    kind: str
    description: str = ""
    is_own: Callable[[Path], bool] | None = None


def verb_inputs(args: argparse.Namespace) -> dict[str, Path | str]:
    """What a verb reads, by argument name: the checkpoint argument (a folder or a Hub id) and every path-typed
    argument that is not one of its outputs."""
    inputs: dict[str, Path | str] = {}
    for name, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        is_text_path = name == args.checkpoint_argument or name in TEXT_PATH_OPTIONS
        paths = [one for one in values if isinstance(one, Path) or (is_text_path and isinstance(one, str))]
        label = name if name in POSITIONAL_INPUTS else f"--{name}"
        for index, path in enumerate(paths if name not in args.outputs else []):
            inputs[label if len(paths) == 1 else f"{label}[{index}]"] = path
    if getattr(args, "data_file", None) is not None:  # the images the data file names are inputs too
        from ..evaluation.tasks import USER_FILE_TASKS
        from ..evaluation.user_files import user_file_images

        task = USER_FILE_TASKS[args.task] if args.verb == "evaluate" else args.data_file_task  # the file's format
        inputs |= user_file_images(args.data_file, task, argument="--data_file")
    return inputs


def check_outputs(args: argparse.Namespace) -> None:
    """Refuses, before anything runs, an output path that is a loop of symbolic links, meets an input
    (`refuse_output_overlapping_inputs`), is of the wrong kind (file or folder), or an existing file the library did
    not write (`Output.is_own`)."""
    inputs = verb_inputs(args)
    for option, output in args.outputs.items():
        if getattr(args, option) is None:
            continue
        path = Path(getattr(args, option)).expanduser()
        try:
            path.resolve()
        except (RuntimeError, OSError) as error:  # Python 3.11 raises RuntimeError on a loop, later ones OSError
            raise OutputPathError(f"`--{option}` {path} cannot be resolved ({error}): remove it or give another path.") from None
        refuse_output_overlapping_inputs(path, inputs, output_argument=f"--{option}")
        if output.kind == "file" and path.is_dir():
            raise IsADirectoryError(f"`--{option}` {path} is a folder; `{args.verb}` writes a file there: give a file path.")
        if output.kind == "folder" and path.exists() and not path.is_dir():
            raise NotADirectoryError(f"`--{option}` {path} is a file; `{args.verb}` writes a folder there: give a folder path.")
        blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
        if blocking is not None:
            raise NotADirectoryError(f"`--{option}` {path} cannot be written: {blocking} is a file, not a folder.")
        if output.is_own is not None:
            refuse_foreign_file(path, f"--{option}", description=output.description, is_own=output.is_own)


def write_result(path: Path, write: Callable[[Path], object]) -> None:
    """`write(temporary path)` then the file put in place of `path` at once (`utils.atomic_folders.atomic_file`): a
    full disk or an error midway leaves the previous result whole."""
    from ..utils.atomic_folders import atomic_file

    with atomic_file(Path(path).expanduser()) as partial:
        write(partial)


def write_json_result(path: Path, value: dict) -> None:
    write_result(path, lambda partial: partial.write_text(json.dumps(value, indent=2) + "\n"))


def imported_is_own(module: str, name: str) -> Callable[[Path], bool]:
    """`is_own` calling `hf_vlalign.<module>.<name>`, imported only then (building the parser stays light)."""
    return lambda path: getattr(importlib.import_module(f"hf_vlalign.{module}"), name)(path)


def is_json_result(*keys: str) -> Callable[[Path], bool]:
    """`is_own` of a JSON result: a JSON object holding `keys`."""

    def is_own(path: Path) -> bool:
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(value, dict) and set(keys) <= set(value)

    return is_own


def _looks_like_a_path(name: str) -> bool:
    """A name no Hub id can be ('./x', '/x', '~/x', 'a/b/c', 'a\\b', 'x/'): the user means a local folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")


def _check_hub_id(name: str, argument: str) -> None:
    """Refuses a Hub id whose config.json is neither cached nor downloadable (with `HF_HUB_OFFLINE=1`, every id
    outside the cache), naming the argument; transformers' own message names neither."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        hf_hub_download(name, "config.json")
    except (OSError, ValueError, EntryNotFoundError) as error:
        reason = (
            "not in the Hub cache, and HF_HUB_OFFLINE=1 forbids downloading it"
            if constants.HF_HUB_OFFLINE
            else f"no Hub model either ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        )
        raise FileNotFoundError(f"`{argument}`: no such folder: {name}; as a Hub id it is {reason}.") from None


def check_checkpoint(name_or_path: str, argument: str, needs_tokenizer: bool) -> None:
    """Refuses a model argument that cannot load, with one line: a local path that does not exist, a file, a folder
    without config.json, with a JSON file that is not a JSON object (each named), without a tokenizer where
    `needs_tokenizer`, or a Hub id that is neither cached nor downloadable (`_check_hub_id`)."""
    from ..data.formats.text_files import read_json_file

    path = Path(name_or_path).expanduser()
    if not path.exists():
        if _looks_like_a_path(name_or_path):
            raise FileNotFoundError(f"`{argument}`: no such folder: {name_or_path}")
        _check_hub_id(name_or_path, argument)
        return
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"`{argument}` {name_or_path} is not a checkpoint folder: it has no config.json.")
    for name in CHECKPOINT_JSON_FILES:
        if (path / name).is_file() and not isinstance(read_json_file(path / name), dict):
            raise ValueError(f"`{argument}` {path / name} must hold a JSON object.")
    if needs_tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"`{argument}` {name_or_path} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): save it beside the model "
            "(tokenizer.save_pretrained(folder))."
        )


def check_model_kind(args: argparse.Namespace) -> None:
    """Refuses, before loading it, a checkpoint of a family the verb does not read (naming the families it reads), and
    one the verb cannot read with the chosen `--data` (`model_requirements`), e.g. a two-stream model with the VGP
    pairs, which only the single-stream VGP model reads. A config.json field of the wrong type (huggingface_hub's
    strict dataclasses) is named with the file."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    from ..models.family import FAMILIES
    from ..vlms.families import PATCH_MODEL_TYPES

    try:
        config = AutoConfig.from_pretrained(args.model)
    except StrictDataclassError as error:
        raise ValueError(f"`model` {Path(args.model) / 'config.json'}: {one_line(str(error))}") from None
    model_type, architecture = config.model_type, (config.architectures or [type(config).__name__])[0]
    if args.patch_model_data and model_type in PATCH_MODEL_TYPES:
        return  # its options are checked by `check_patch_model_options`
    own = ", ".join(sorted(spec.model_type for spec in FAMILIES.values()))
    vlms = ", ".join(PATCH_MODEL_TYPES)
    if model_type not in {spec.model_type for spec in FAMILIES.values()}:
        if args.patch_model_data:
            reads = f"hf_vlalign checkpoints (model types {own}) and transformers' vision-language models of the families {vlms}"
        else:
            reads = f"hf_vlalign checkpoints (model types {own}); transformers' vision-language models ({vlms}) are read by `probe`, `analyze` and `explore`"
        raise ValueError(f"`model` {args.model} holds a {architecture} ({model_type}); `{args.verb}` reads {reads} (docs/vlms.md).")
    kind, name = args.model_requirements.get(getattr(args, "data", None), (None, None))
    if kind is None or kind == "architecture" and architecture == name or kind == "family" and model_type == FAMILIES[name].model_type:
        return
    wanted = name if kind == "architecture" else f"{name.replace('_', '-')} model"
    raise ValueError(
        f"`{args.verb}` with {_setting_text('data', args.data)} needs a {wanted}, but `model` {args.model} holds a "
        f"{architecture} ({model_type})."
    )


def add_model_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("model", help=f"{help}: a local folder or a Hub id")
    parser.set_defaults(checkpoint_argument="model")


def add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("synthetic scenes (the offline default data)")
    group.add_argument("--synthetic_train_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=800, help="training images of the scenes")
    group.add_argument("--synthetic_eval_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=150, help="evaluation images of the scenes")
    group.add_argument("--synthetic_seed", type=int, default=0, help="seed of the scenes")
    group.add_argument("--synthetic_distractors", action="store_true", help=DISTRACTORS_HELP)
    group.add_argument("--synthetic_world", choices=SYNTHETIC_WORLDS, default="v1", help=SYNTHETIC_WORLD_HELP)
    parser.add_argument("--batch_size", type=int_at_most("MAX_BATCH_SIZE"), default=32, help="examples per forward pass")


def synthetic_config(args: argparse.Namespace):
    from ..synthetic import SyntheticSceneConfig

    return SyntheticSceneConfig(
        args.synthetic_train_images,
        args.synthetic_eval_images,
        seed=args.synthetic_seed,
        distractors=args.synthetic_distractors,
        world=args.synthetic_world,
    )


def add_vgp_file_arguments(parser: argparse.ArgumentParser) -> None:
    """The four inputs of real VGP data: Flickr30k Entities, the two VGP CSVs and a RegionFeatureStore."""
    group = parser.add_argument_group("real VGP data (all four, instead of the synthetic scenes)")
    group.add_argument("--flickr30k_entities_dir", help="the Flickr30k Entities folder (Sentences/, Annotations/)")
    group.add_argument("--vgp_train_csv", help="the VGP training pairs (CSV as published)")
    group.add_argument("--vgp_eval_csv", help="the VGP evaluation pairs (CSV as published)")
    group.add_argument("--features", help="RegionFeatureStore folder of the images (hf-vlalign convert-features)")


def add_data_file_argument(parser: argparse.ArgumentParser, reads: str) -> None:
    """`--data_file`: a file of one's own images and texts in the user-data format (docs/own_data.md)."""
    group = parser.add_argument_group("your own data (--data_file alone means --data user_file)")
    group.add_argument(
        "--data_file", type=Path,
        help=f"{reads}; a file of the user-data format (JSON lines or CSV, image paths relative to the file: docs/own_data.md). "
        "The images' regions and features are made as the model's processor makes them (default: the whole image and "
        "a 4 x 4 grid, the pixel encoder at the model's visual_feat_dim) and kept in a cache reused while the images "
        "are unchanged: $HF_VLALIGN_CACHE/user_features (default ~/.cache/hf_vlalign/user_features)",
    )  # fmt: skip


def add_max_examples_argument(parser: argparse.ArgumentParser, what: str, where_counted: str) -> None:
    parser.add_argument(
        "--max_examples", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), help=f"{what} (default: all; more than the data "
        f"holds: all of them, with a warning, and {where_counted} says how many)",
    )  # fmt: skip
