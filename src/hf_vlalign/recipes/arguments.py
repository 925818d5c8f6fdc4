"""The examples' shared arguments (`ModelArguments`, `DataArguments`, `MixedPrecisionArguments`,
`ThreadArguments`), their `TrainingArguments` defaults and checks, and `parse_recipe_args`, which parses them and
refuses an `--output_dir` that meets one of the run's inputs (`check_output_dir`)."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from huggingface_hub.dataclasses import type_validator
from transformers import AutoConfig, HfArgumentParser, TrainingArguments
from transformers.integrations import is_tensorboard_available
from transformers.utils import logging

from ..models.family import FAMILIES as FAMILY_SPECS
from ..synthetic import SyntheticSceneConfig
from ..utils.output_paths import refuse_output_overlapping_inputs
from ..utils.typed_options import typed_options
from .schedule import EVALUATION_RULE, EVALUATIONS_PER_RUN, EarlyStoppingArguments, keep_asked_length
from .threads import check_distributed_launch, set_cpu_threads

logger = logging.get_logger(__name__)

# the families whose task models the recipes train: those that take the attention-supervision arguments
FAMILIES = tuple(name for name, spec in FAMILY_SPECS.items() if spec.attention_supervision)
_FAMILY_OF_MODEL_TYPE = {FAMILY_SPECS[name].model_type: name for name in FAMILIES}
MIXED_PRECISION = ("no", "fp16", "bf16")


@dataclass
class MixedPrecisionArguments:
    mixed_precision: str | None = field(
        default=None,
        metadata={"help": "no | fp16 | bf16 (default: what `accelerate launch --mixed_precision` or --bf16/--fp16 set)."},
    )


@dataclass
class ThreadArguments:
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads of each process (torch.set_num_threads). Default: on CPU, your OMP_NUM_THREADS, else "
            "the available cores divided by the processes of this machine (accelerate launch's own OMP_NUM_THREADS=1 "
            "counts as unset)."
        },
    )


@dataclass
class ModelArguments(MixedPrecisionArguments):
    model_family: str = field(default="single_stream", metadata={"help": "single_stream | two_stream"})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "a BERT-family text checkpoint (default: MiniLM) or an hf_vlalign checkpoint of the family."},
    )
    supervision: str = field(default="none", metadata={"help": "attention supervision: none | direct | semi_direct | indirect"})
    supervision_weight: float = field(default=1.0, metadata={"help": "weight of the attention loss."})
    supervised_layers: str | None = field(default=None, metadata={"help": "comma-separated layer indices (default all)."})
    supervised_heads: str | None = field(default=None, metadata={"help": "comma-separated head indices (default all)."})
    l_layers: int = field(default=2, metadata={"help": "two-stream from a text checkpoint: language layers."})
    r_layers: int = field(default=1, metadata={"help": "two-stream from a text checkpoint: object layers."})
    x_layers: int = field(default=3, metadata={"help": "two-stream from a text checkpoint: cross-modality layers."})
    dropout: float | None = field(
        default=None, metadata={"help": "if set, every dropout probability of the model (default: the checkpoint's)."}
    )


@dataclass
class UserDataArguments:
    """Your own images and texts in the user-data format (`hf_vlalign.data.builders.user_data`): `--train_file`,
    `--validation_file` and how the region features of their images are made."""

    train_file: str | None = field(
        default=None,
        metadata={
            "help": "your own data: a JSON lines (.jsonl) or CSV file of the example's task in the user-data format "
            "(image paths relative to the file); its images' region features are extracted and cached. Replaces "
            "the flags of the example's other data (--dataset, --data_dir, --features, ...)."
        },
    )
    validation_file: str | None = field(
        default=None,
        metadata={
            "help": "the evaluation rows, in --train_file's format (default: the rows of a seeded 10%% of the "
            "training file's images, at least 2, are held out for evaluation)."
        },
    )
    grid_size: int = field(
        default=4,
        metadata={"help": "with --train_file whose rows give no `regions`: a g x g grid after the whole image."},
    )
    region_encoder: str = field(
        default="pixel",
        metadata={
            "help": "with --train_file: the region feature encoder, `pixel` (the deterministic pooled-pixel "
            "CropEncoder, 256 dimensions, offline) or a transformers vision backbone (Hub id or local folder)."
        },
    )


SYNTHETIC_WORLD_HELP = "version of the synthetic world: v1 (the first, kept) or v2 (docs/synthetic_world.md)."

# the data-source flags of `DataArguments` that `--train_file` replaces (an example adds its own with
# `parse_recipe_args(data_source_flags=...)`)
DATA_SOURCE_FLAGS = (
    "dataset", "data_dir", "features", "train_split", "eval_split",
    "synthetic_seed", "synthetic_train_images", "synthetic_eval_images", "synthetic_distractors", "synthetic_world",
)  # fmt: skip
# the `UserDataArguments` flags that only `--train_file` reads
USER_DATA_FLAGS = ("validation_file", "grid_size", "region_encoder")


def check_user_data_flags(parsed: Iterable[Any], given: set[str], data_source_flags: Iterable[str] = ()) -> None:
    """Refuses `--validation_file`, `--grid_size` or `--region_encoder` without `--train_file`, and, with it, a flag
    that names another data source (`DATA_SOURCE_FLAGS`, `data_source_flags`): the user's files replace them."""
    user = next((args for args in parsed if isinstance(args, UserDataArguments)), None)
    if user is None:
        return
    if user.train_file is None:
        unread = [flag for flag in USER_DATA_FLAGS if flag in given]
        if unread:
            raise ValueError(
                f"`--{unread[0]}` applies only to your own data: pass `--train_file` (a user-format file) with it."
            )
        return
    replaced = [flag for flag in (*DATA_SOURCE_FLAGS, *data_source_flags) if flag in given]
    if replaced:
        raise ValueError(
            f"`--{replaced[0]}` names another data source than `--train_file` {user.train_file}: drop it (your file's "
            "images give the region features)."
        )


def drop_published_data_settings(
    config_values: dict[str, Any], typed: set[str], data_source_flags: Iterable[str], config_path: str | None
) -> dict[str, Any]:
    """`config_values` without the settings of another data source (`DATA_SOURCE_FLAGS`, `data_source_flags`) when
    `--train_file` is typed on the command line, saying which: a paper's config (examples/configs/) holds its
    published data's settings (evaluation split, negatives, ...), and your own file replaces that data
    (docs/own_data.md, "Each paper's recipe on your data"). Typed on the command line, they stay refused."""
    if "train_file" not in typed:
        return config_values
    dropped = [name for name in (*DATA_SOURCE_FLAGS, *data_source_flags) if name in config_values]
    if dropped:
        logger.warning(
            f"`--config` {config_path}: {', '.join(dropped)} set the published data, which `--train_file` replaces: "
            "not used."
        )
    return {name: value for name, value in config_values.items() if name not in dropped}


@dataclass
class SubsetArguments:
    """`--max_train_samples` / `--max_eval_samples` (transformers' `run_*.py` flags): the first N rows of a split."""

    max_train_samples: int | None = field(default=None, metadata={"help": "keep the first N training rows."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "keep the first N evaluation rows (every evaluation reads them all)."}
    )


@dataclass
class DataArguments(UserDataArguments, SubsetArguments, EarlyStoppingArguments):
    dataset: str | None = field(default=None, metadata={"help": "a dataset builder name (default: synthetic scenes)."})
    data_dir: str | None = field(default=None, metadata={"help": "the folder of the dataset's published files."})
    features: str | None = field(
        default=None, metadata={"help": "RegionFeatureStore folder of the images (hf-vlalign convert-features)."}
    )
    train_split: str | None = field(default=None, metadata={"help": "default: the dataset's training split."})
    eval_split: str | None = field(
        default=None, metadata={"help": "default: the dataset's validation split (also named by 'validation')."}
    )
    image_use_examples: int | None = field(
        default=1000,
        metadata={
            "help": "the own-image vs shuffled-image check after training (`image_use` in eval_results.json) reads a "
            "seeded sample of N evaluation rows (None: all of them)."
        },
    )
    eval_subset_size: int | None = field(
        default=None,
        metadata={
            "help": "evaluations during training read a seeded sample of N evaluation rows (default: all of them); "
            "the final evaluation always reads the whole evaluation split."
        },
    )
    synthetic_seed: int = field(default=0, metadata={"help": "seed of the synthetic scenes (default data)."})
    synthetic_train_images: int = field(default=800)
    synthetic_distractors: bool = field(
        default=False,
        metadata={"help": "each synthetic scene's first shape gets a same-kind and a same-colour distractor."},
    )
    synthetic_eval_images: int = field(default=150)
    synthetic_world: str = field(
        default="v1",
        metadata={"help": SYNTHETIC_WORLD_HELP},
    )
    max_text_length: int = field(default=48)


def synthetic_scene_config(args) -> SyntheticSceneConfig:
    """The synthetic scenes (the default data) of `args`' `--synthetic_train_images`, `--synthetic_eval_images`,
    `--synthetic_seed` and `--synthetic_distractors` (`DataArguments` or an example's own arguments)."""
    return SyntheticSceneConfig(
        args.synthetic_train_images,
        args.synthetic_eval_images,
        seed=args.synthetic_seed,
        distractors=args.synthetic_distractors,
        world=args.synthetic_world,
    )


# shared `TrainingArguments` defaults of the examples; each script adds its own (learning rate, epochs, ...)
TRAINING_DEFAULTS = {
    "eval_strategy": "steps",
    "eval_steps": 1 / EVALUATIONS_PER_RUN,
    "logging_steps": 20,
    "save_strategy": "steps",
    "save_steps": 100,
    "save_total_limit": 2,
    "remove_unused_columns": False,  # the collators read the text-level columns
    "dataloader_num_workers": 0,
    "seed": 42,
}


def parse_recipe_args(
    argv: list[str],
    dataclass_types: tuple[type, ...],
    training_args_class: type[TrainingArguments] = TrainingArguments,
    data_source_flags: tuple[str, ...] = (),
    **defaults,
) -> tuple:
    """Parses `argv` into `dataclass_types` + `training_args_class` (returned in that order) over the examples' shared
    defaults, then `defaults`, then a `--config FILE`'s values (YAML or JSON, see `examples/configs/`; without its
    published-data settings when `--train_file` is typed: `drop_published_data_settings`); then checks
    them (counts, `--mixed_precision`, `--dropout`, flags their setting does not read, the other data sources' flags
    with `--train_file`, the output folder), switches a default early stopping off for a run whose length is given
    (`keep_asked_length`) and sets the CPU threads (`--num_threads`)."""
    dataclass_types = (*dataclass_types, ThreadArguments, training_args_class)
    parser = HfArgumentParser(dataclass_types)
    parser.add_argument(
        "--config", default=None, help="a YAML or JSON file of flag values, which the other flags override (examples/configs/)."
    )
    parser._option_string_actions["--eval_steps"].help = f"with --eval_strategy steps: {EVALUATION_RULE}."
    config_path, argv = split_config_flag(argv)
    config_values = read_recipe_config(config_path, dataclass_types) if config_path else {}
    typed = typed_options(parser, argv)
    config_values = drop_published_data_settings(config_values, typed, data_source_flags, config_path)
    parser.set_defaults(
        **{
            **TRAINING_DEFAULTS,
            "report_to": "tensorboard" if is_tensorboard_available() else "none",  # logs under <output_dir>/runs
            "dataloader_pin_memory": torch.accelerator.is_available(),  # else torch warns at every DataLoader
            **defaults,
            **config_values,
        }
    )
    *parsed, threads, training_args, _ = parser.parse_args_into_dataclasses(argv)  # _: the `--config` namespace
    given = typed | set(config_values)
    for value in (*parsed, threads):
        check_counts(value)
    check_training_counts(training_args)
    for value in parsed:
        if isinstance(value, ModelArguments):
            if value.model_family not in FAMILIES:
                raise ValueError(f"`--model_family` must be one of {FAMILIES}, got {value.model_family!r}.")
            check_layer_flags(value, given)
        if getattr(value, "dropout", None) is not None and not 0.0 <= value.dropout < 1.0:
            raise ValueError(f"`--dropout` must be in [0, 1), got {value.dropout}.")
        check_flags_read(value, given)
        if hasattr(value, "mixed_precision"):
            apply_mixed_precision(training_args, value.mixed_precision)
    check_user_data_flags(parsed, given, data_source_flags)
    keep_asked_length(parsed, given)
    check_distributed_launch(training_args)
    if training_args.output_dir is not None:
        check_output_dir(parsed, training_args, config_path)  # before anything is written
    set_cpu_threads(training_args, threads.num_threads)
    return (*parsed, training_args)


# fields of the examples' arguments that name what a run writes, not what it reads
OUTPUT_FIELDS = ("output_dir", "logging_dir")


def _path_values(value: Any) -> list[str | os.PathLike]:
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, (str, os.PathLike))]
    return []


def recipe_inputs(parsed: Iterable[Any], training_args: TrainingArguments, config_path: str | None) -> dict[str, Any]:
    """The paths a run reads, by flag: every path-valued field of the examples' own arguments (a list entry by entry)
    and of the fields a `TrainingArguments` subclass adds, `--resume_from_checkpoint` and `--config`. Values that are
    no existing path (a Hub id, a split name) are skipped by the overlap check."""
    base_fields = {one.name for one in fields(TrainingArguments)}
    own = [(args, {one.name for one in fields(args)}) for args in parsed]
    own.append((training_args, {one.name for one in fields(training_args)} - base_fields))
    inputs: dict[str, Any] = {}
    for args, names in own:
        for name in sorted(names - set(OUTPUT_FIELDS)):
            values = _path_values(getattr(args, name))
            for index, value in enumerate(values):
                inputs[f"--{name}" if len(values) == 1 else f"--{name}[{index}]"] = value
    inputs["--resume_from_checkpoint"] = training_args.resume_from_checkpoint
    inputs["--config"] = config_path
    return inputs


def check_output_dir(parsed: Iterable[Any], training_args: TrainingArguments, config_path: str | None = None) -> None:
    """Refuses an `--output_dir` that is one of the run's inputs (`recipe_inputs`), is inside one or holds one, before
    anything is written: the Trainer's checkpoints and the final save would replace or rotate them away. Only
    `--resume_from_checkpoint` may lie inside `--output_dir` (a checkpoint of the same run)."""
    refuse_output_overlapping_inputs(
        training_args.output_dir,
        recipe_inputs(parsed, training_args, config_path),
        output_argument="--output_dir",
        inputs_may_be_inside_output=("--resume_from_checkpoint",),
    )


# flags that only some settings read: arguments class -> {flag: (setting, the values that read it)}; a flag given
# (on the command line or in `--config`) with another value of its setting is refused (`check_flags_read`)
SUPERVISIONS = ("direct", "semi_direct", "indirect")
FLAGS_READ_WITH: dict[type, dict[str, tuple[str, tuple]]] = {
    ModelArguments: {
        **{name: ("model_family", ("two_stream",)) for name in ("l_layers", "r_layers", "x_layers")},
        **{name: ("supervision", SUPERVISIONS) for name in ("supervision_weight", "supervised_layers", "supervised_heads")},
    },
    DataArguments: {
        name: ("dataset", (None, "synthetic_scenes"))
        for name in ("synthetic_seed", "synthetic_train_images", "synthetic_eval_images", "synthetic_distractors")
    },
}


def _setting_text(setting: str, value: object) -> str:
    return f"no `--{setting}`" if value is None else f"`--{setting} {value}`"


def check_flags_read(arguments: object, given: set[str]) -> None:
    """Refuses a flag of `arguments` given with a setting that does not read it (`FLAGS_READ_WITH`), naming both:
    e.g. `--l_layers` (two-stream layer counts) with `--model_family single_stream`."""
    reads = {flag: rule for kind, rules in FLAGS_READ_WITH.items() if isinstance(arguments, kind) for flag, rule in rules.items()}
    for flag, (setting, values) in reads.items():
        value = getattr(arguments, setting)
        if flag in given and value not in values:
            allowed = " or ".join(_setting_text(setting, allowed) for allowed in values)
            raise ValueError(f"`--{flag}` applies only to {allowed}, not to {_setting_text(setting, value)}: drop it.")


def checkpoint_family(name_or_path: str) -> str | None:
    """"single_stream" / "two_stream" for an hf_vlalign checkpoint of that family, None for a text checkpoint."""
    return _FAMILY_OF_MODEL_TYPE.get(AutoConfig.from_pretrained(name_or_path).model_type)


def check_layer_flags(args: ModelArguments, given: set[str]) -> None:
    """Refuses `--l_layers` / `--r_layers` / `--x_layers` with an hf_vlalign checkpoint as `--model_name_or_path`: they
    size a model built from a text checkpoint, and a checkpoint keeps its own layers. A path that does not load is
    left to the model loading, which names it."""
    flags = [f"--{name}" for name in ("l_layers", "r_layers", "x_layers") if name in given]
    if not flags or args.model_name_or_path is None:
        return
    try:
        family = checkpoint_family(args.model_name_or_path)
    except (OSError, ValueError):
        return
    if family is not None:
        raise ValueError(
            f"{' / '.join(flags)} size a model built from a text checkpoint, but `--model_name_or_path` "
            f"{args.model_name_or_path} is a {family} checkpoint, which keeps its own layers: drop them."
        )


def split_config_flag(argv: list[str]) -> tuple[str | None, list[str]]:
    """(`--config` value, the other flags): the config file sets defaults before the other flags are parsed."""
    found = [index for index, flag in enumerate(argv) if flag == "--config" or flag.startswith("--config=")]
    if not found:
        return None, list(argv)
    if len(found) > 1:
        raise ValueError("`--config` expects one YAML or JSON file, got it twice: pass the settings in one file.")
    index, flag = found[0], argv[found[0]]
    if "=" in flag:
        return flag.split("=", 1)[1], argv[:index] + argv[index + 1 :]
    if index + 1 == len(argv):
        raise ValueError("`--config` expects a YAML or JSON file, got nothing after it.")
    return argv[index + 1], argv[:index] + argv[index + 2 :]


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what a file of flag values never needs: aliases (`*name`, which a few lines
    can expand to billions of values) and a key given twice (the second would silently win)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(problem=f"an alias (*{event.anchor}), which a config file does not take", problem_mark=event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.MarkedYAMLError(problem=f"the key {key!r} is given twice", problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        raise ValueError(f"the key {repeated!r} is given twice")
    return dict(pairs)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a `--config` file holds: YAML (`.yaml`/`.yml`, or any other suffix) or JSON (`.json`), UTF-8,
    without aliases or repeated keys."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`--config` must be an existing YAML or JSON file, got {str(path)!r} (no such file).")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"`--config` {str(path)!r} is not UTF-8 text (the byte 0x{data[error.start]:02x} at offset {error.start}).") from None
    try:
        values = json.loads(text, object_pairs_hook=_refuse_repeated_keys) if path.suffix == ".json" else yaml.load(text, ConfigLoader)
    except json.JSONDecodeError as error:
        raise ValueError(f"`--config` {str(path)!r}, line {error.lineno}: not valid JSON: {error.msg}.") from None
    except yaml.MarkedYAMLError as error:
        line = f", line {error.problem_mark.line + 1}" if error.problem_mark is not None else ""
        raise ValueError(f"`--config` {str(path)!r}{line}: not valid YAML: {error.problem}.") from None
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"`--config` {str(path)!r}: not valid {path.suffix[1:].upper() or 'YAML'}: {error}.") from None
    if not isinstance(values, dict):
        raise ValueError(f"`--config` {str(path)!r} must hold a mapping of flag names to values, got {type(values).__name__}.")
    return values


def _fits(name: str, value: Any, annotation: Any) -> bool:
    try:
        type_validator(name, value, annotation)  # the check of huggingface_hub's strict dataclasses
    except TypeError:
        return False
    return True


def _as_float(value: Any) -> float | None:
    """A whole number, or a number string (YAML 1.1 reads 1e-5 as a string), as a float flag's parser reads it."""
    try:
        return None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def read_recipe_config(path: str | Path, dataclass_types: tuple[type, ...]) -> dict[str, Any]:
    """The flag values of an experiment's config file (`read_config_file`): a mapping of flag names (without `--`) to
    values; every name must be a flag of the recipe and every value of the flag's type."""
    values = read_config_file(path)
    types_by_flag = {
        item.name: typing.get_type_hints(dataclass_type)[item.name]
        for dataclass_type in dataclass_types
        for item in fields(dataclass_type)
    }
    unknown = sorted(set(values) - set(types_by_flag))
    if unknown:
        raise ValueError(f"`--config` {str(path)!r} names flags this recipe does not take: {unknown}.")
    for name, value in values.items():
        annotation, number = types_by_flag[name], _as_float(value)
        if not (_fits(name, value, annotation) or number is not None and _fits(name, number, annotation)):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            expected = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
            raise ValueError(f"`--config` {str(path)!r}: `{name}` must be of type {expected}, got {shown} ({type(value).__name__}).")
    return values


# the `TrainingArguments` counts that take no 0 or negative value (transformers does not check them)
TRAINING_COUNTS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")


def check_counts(arguments: Any) -> None:
    """Refuses an integer flag of the examples' own arguments below 1 (below 0: a seed, or a flag the arguments class
    lists in `counts_from_zero`): each is a count (of rows, images, layers, tokens, ...) where 0 or a negative number
    would silently mean all or none."""
    hints = typing.get_type_hints(type(arguments))
    from_zero = getattr(arguments, "counts_from_zero", ())
    for item in fields(arguments):
        value = getattr(arguments, item.name)
        minimum = 0 if item.name.endswith("seed") or item.name in from_zero else 1
        is_int = hints[item.name] is int or set(typing.get_args(hints[item.name])) == {int, type(None)}
        if is_int and value is not None and value < minimum:
            raise ValueError(f"`--{item.name}` must be an integer >= {minimum}, got {value}.")


def check_training_counts(training_args: TrainingArguments) -> None:
    """Refuses batch sizes or accumulation steps below 1, no epochs (without `--max_steps`) or a negative learning
    rate."""
    for name in TRAINING_COUNTS:
        if getattr(training_args, name) < 1:
            raise ValueError(f"`--{name}` must be an integer >= 1, got {getattr(training_args, name)}.")
    if training_args.max_steps <= 0 and not training_args.num_train_epochs > 0:
        raise ValueError(f"`--num_train_epochs` must be > 0 (or `--max_steps` set), got {training_args.num_train_epochs}.")
    if not training_args.learning_rate >= 0:
        raise ValueError(f"`--learning_rate` must be >= 0, got {training_args.learning_rate}.")


def apply_mixed_precision(training_args: TrainingArguments, mixed_precision: str | None) -> None:
    """`--mixed_precision bf16|fp16|no` as `TrainingArguments` sees it (None keeps --bf16 / --fp16 and accelerate's
    `ACCELERATE_MIXED_PRECISION`)."""
    if mixed_precision is None:
        return
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"`--mixed_precision` must be one of {MIXED_PRECISION}, got {mixed_precision!r}.")
    training_args.bf16 = mixed_precision == "bf16"
    training_args.fp16 = mixed_precision == "fp16"
    training_args.mixed_precision = mixed_precision


def parse_indices(text: str | None, argument: str) -> list[int] | None:
    """"0,2,5" -> [0, 2, 5]; None stays None."""
    if text is None:
        return None
    try:
        return [int(value) for value in text.split(",")]
    except ValueError:
        raise ValueError(f"`{argument}` must be comma-separated integers such as '0,2,5', got {text!r}.") from None


def supervision_settings(args: ModelArguments) -> dict[str, Any]:
    """The attention-supervision config fields of the supervision flags (`--supervision`, `--supervision_weight`,
    `--supervised_layers`, `--supervised_heads`) of `args` (`ModelArguments` or an example's own arguments)."""
    return {
        "attention_supervision": args.supervision,
        "attention_supervision_weight": args.supervision_weight,
        "supervised_layers": parse_indices(args.supervised_layers, "--supervised_layers"),
        "supervised_heads": parse_indices(args.supervised_heads, "--supervised_heads"),
    }
