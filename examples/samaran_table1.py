#!/usr/bin/env python
"""Samaran et al. (2021), Table 1: VGP fine-tuning of the single-stream model with each attention supervision, then VQA
v2 and RefCOCO+ fine-tuning from each resulting checkpoint, and one table comparing the settings downstream.

    accelerate launch examples/samaran_table1.py --config examples/configs/samaran_table1.yaml \
        --flickr30k_entities_dir F30K --vgp_train_csv full_data_type_phrase_pair_train.csv \
        --vgp_eval_csv full_data_type_phrase_pair_val.csv --features FLICKR_STORE \
        --vqa_dir VQA --coco_features COCO_STORE --refcoco_dir refcoco+ --output_dir outputs/samaran_table1
    # your own photos, every stage in the user-data format (docs: "Your own data"; validation files optional; the
    # paper's config's settings of its published data, VGP `negatives` and the evaluation splits, are left out)
    accelerate launch examples/samaran_table1.py --config examples/configs/samaran_table1.yaml \
        --train_file vgp_train.jsonl --validation_file vgp_val.jsonl \
        --vqa_train_file vqa_train.jsonl --vqa_validation_file vqa_val.jsonl \
        --refcoco_train_file refcoco_train.jsonl --refcoco_validation_file refcoco_val.jsonl --output_dir outputs/t1

For every supervision of `--supervisions` (none, direct, semi_direct, indirect) and every seed of `--seeds`, three
sub-runs, in this process (the same `accelerate launch`), one after the other:

1. `examples/finetune_vgp.py` with `--supervision <setting>` on Flickr30k Entities + the VGP csvs (`--features`: a
   region-feature store of the Flickr30k images) -> `<output_dir>/<setting>/seed<seed>/vgp`;
2. `examples/finetune_vqa.py --dataset vqa_v2 --model_name_or_path <the VGP run>` (`--coco_features`: a store of the
   COCO images) -> `.../vqa`, evaluated on `--vqa_eval_split` (val: VQA v2 test-dev answers are only scored by the
   evaluation server);
3. `examples/finetune_refcoco.py --dataset refcoco+ --model_name_or_path <the VGP run>` -> `.../refcoco`, evaluated on
   the first split of `--refcoco_splits` during training and on every one of them after it (val, testA, testB).

The downstream runs train without attention supervision, as the authors' VQA / RefCOCO+ configs do (no
SUPERVISE_ATTENTION there); only the VGP stage differs between the settings. A sub-run whose folder holds
`eval_results.json` is finished and skipped when the command runs again; an unfinished one resumes from its last
`checkpoint-*`. Each sub-run's flags are written to `<output_dir>/configs/<setting>/seed<seed>/<stage>.json` (the
`--config` it is given), so any sub-run can be rerun alone with its own example.

The config file (`--config`, YAML or JSON) holds the driver's flags (`supervisions`, `seeds`, paths, ...) and four
sections of sub-run flags: `common` (every sub-run), `vgp`, `vqa`, `refcoco`. The command line overrides it: driver
flags as usual and sub-run flags as `--<section>.<flag> VALUE` (e.g. `--vqa.max_steps 10`). The flags the driver sets
itself (output folders, seeds, the supervision of the VGP stage, the checkpoint and data of the downstream stages) are
refused in the sections.

Each stage reads either its published files or your own in the user-data format: the VGP stage `--train_file`
(`vgp` rows) instead of `--flickr30k_entities_dir`, `--vgp_train_csv`, `--vgp_eval_csv` and `--features`; VQA
`--vqa_train_file` (`vqa` rows) instead of `--vqa_dir`; RefCOCO+ `--refcoco_train_file` (`refcoco` rows) instead of
`--refcoco_dir` (then evaluated on its validation rows only: `--refcoco_splits` is RefCOCO+'s). Each `*_validation_file`
is optional (without it, the example holds out the rows of a seeded 10% of the training file's images). The
downstream stages start from the VGP model, so their region features must have its dimension: with your own files in
every stage, the same `--common.grid_size` / `--common.region_encoder` make them alike. The paper's config runs on
your files as it is: its settings of the published data (`vqa_eval_split`, `refcoco_splits`, the VGP section's
`negatives`) are left out for the stages reading your files, and the log says which; typed on the command line, they
are refused.

Writes `<output_dir>/table1.json` (per setting: the Table 1 metrics, mean over the seeds, each seed's values and the VGP
stage's own results) and `<output_dir>/table1.md` (the table).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from accelerate import PartialState
from transformers import HfArgumentParser
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from hf_vlalign.recipes import DataArguments, MixedPrecisionArguments, ModelArguments
from hf_vlalign.recipes.arguments import ThreadArguments, read_config_file, split_config_flag
from hf_vlalign.trainers import TaskTrainingArguments, VGPTrainingArguments
from hf_vlalign.utils.typed_options import typed_options
from hf_vlalign.utils.user_errors import run_command

logger = logging.get_logger(__name__)

EXAMPLES = Path(__file__).resolve().parent
SUPERVISIONS = ("none", "direct", "semi_direct", "indirect")
STAGES = ("vgp", "vqa", "refcoco")
SECTIONS = ("common", *STAGES)
RESULTS_FILE = "eval_results.json"
REFCOCO_SPLITS = ("val", "testA", "testB")

# the flags each stage's sub-run gets from the driver; a config section or `--<stage>.<flag>` may not set them
DRIVER_FLAGS = {
    "vgp": ("output_dir", "seed", "supervision", "flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "features",
            "train_file", "validation_file", "resume_from_checkpoint"),
    "vqa": ("output_dir", "seed", "model_name_or_path", "model_family", "dataset", "data_dir", "features",
            "eval_split", "train_file", "validation_file", "resume_from_checkpoint"),
    "refcoco": ("output_dir", "seed", "model_name_or_path", "model_family", "dataset", "data_dir", "features",
                "eval_split", "test_splits", "train_file", "validation_file", "resume_from_checkpoint"),
}  # fmt: skip
# each stage's data: its published files (driver flags) or a user-format training file (and validation file)
PUBLISHED_DATA = {
    "vgp": ("flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "features"),
    "vqa": ("vqa_dir",),
    "refcoco": ("refcoco_dir",),
}
USER_FILES = {
    "vgp": ("train_file", "validation_file"),
    "vqa": ("vqa_train_file", "vqa_validation_file"),
    "refcoco": ("refcoco_train_file", "refcoco_validation_file"),
}
# the driver flags that only the published data of a stage reads
PUBLISHED_ONLY = {"vqa": ("vqa_eval_split",), "refcoco": ("refcoco_splits",)}
# the column of a stage's accuracy on your own data
USER_COLUMN = {"vqa": "VQA (user data)", "refcoco": "referring expressions (user data)"}


def load_example(name: str) -> ModuleType:
    """`examples/<name>.py` as module `name` (registered in sys.modules, where dataclasses look their module up)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(EXAMPLES / f"{name}.py"):
        return sys.modules[name]
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stage_examples() -> dict[str, ModuleType]:
    return {
        "vgp": load_example("finetune_vgp"),
        "vqa": load_example("finetune_vqa"),
        "refcoco": load_example("finetune_refcoco"),
    }


def stage_flag_names(examples: dict[str, ModuleType]) -> dict[str, set[str]]:
    """The flags each stage's example takes (the fields of the dataclasses its `parse_args` parses)."""
    types = {
        "vgp": (examples["vgp"].VGPArguments, MixedPrecisionArguments, ThreadArguments, VGPTrainingArguments),
        "vqa": (ModelArguments, DataArguments, examples["vqa"].QuestionAnsweringArguments, ThreadArguments,
                TaskTrainingArguments),
        "refcoco": (ModelArguments, DataArguments, examples["refcoco"].ReferringArguments, ThreadArguments,
                    TaskTrainingArguments),
    }  # fmt: skip
    return {stage: {item.name for kind in kinds for item in fields(kind)} for stage, kinds in types.items()}


# ----------------------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Table1Arguments:
    output_dir: str | None = field(default=None, metadata={"help": "folder of the sub-runs, table1.json and table1.md"})
    supervisions: str = field(
        default=",".join(SUPERVISIONS), metadata={"help": f"comma-separated settings among {SUPERVISIONS}"}
    )
    seeds: str = field(default="42", metadata={"help": "comma-separated seeds; each setting runs once per seed"})
    flickr30k_entities_dir: str | None = field(
        default=None, metadata={"help": "VGP: Flickr30k Entities (Sentences/, Annotations/)"}
    )
    vgp_train_csv: str | None = field(default=None, metadata={"help": "VGP: the training pairs csv"})
    vgp_eval_csv: str | None = field(default=None, metadata={"help": "VGP: the evaluation pairs csv"})
    features: str | None = field(default=None, metadata={"help": "VGP: region-feature store of the Flickr30k images"})
    vqa_dir: str | None = field(
        default=None, metadata={"help": "VQA v2: folder of the official question and annotation files"}
    )
    coco_features: str | None = field(
        default=None,
        metadata={"help": "VQA v2 and RefCOCO+: region-feature store of the COCO images (default: --features)"},
    )
    refcoco_dir: str | None = field(
        default=None, metadata={"help": "RefCOCO+: lichengunc/refer's refcoco+ folder (refs(unc).p, instances.json)"}
    )
    vqa_eval_split: str = field(default="val", metadata={"help": "VQA v2: the evaluated split (answers needed)"})
    refcoco_splits: str = field(
        default=",".join(REFCOCO_SPLITS),
        metadata={"help": "RefCOCO+: the evaluated splits, the first also during training"},
    )
    train_file: str | None = field(
        default=None, metadata={"help": "VGP from your own data: `vgp` rows of the user-data format (.jsonl / .csv)"}
    )
    validation_file: str | None = field(default=None, metadata={"help": "VGP: your own evaluation rows"})
    vqa_train_file: str | None = field(
        default=None, metadata={"help": "VQA from your own data: `vqa` rows of the user-data format (not --vqa_dir)"}
    )
    vqa_validation_file: str | None = field(default=None, metadata={"help": "VQA: your own evaluation rows"})
    refcoco_train_file: str | None = field(
        default=None,
        metadata={"help": "referring expressions from your own data: `refcoco` rows (instead of --refcoco_dir)"},
    )
    refcoco_validation_file: str | None = field(default=None, metadata={"help": "RefCOCO: your own evaluation rows"})

    def user_data(self, stage: str) -> bool:
        """Whether `stage` reads your own files (`USER_FILES`)."""
        return getattr(self, USER_FILES[stage][0]) is not None

    @property
    def supervision_list(self) -> list[str]:
        return parse_list(self.supervisions, "--supervisions", SUPERVISIONS)

    @property
    def seed_list(self) -> list[int]:
        return [parse_int(seed, "--seeds") for seed in parse_list(self.seeds, "--seeds")]

    @property
    def refcoco_split_list(self) -> list[str]:
        return parse_list(self.refcoco_splits, "--refcoco_splits", REFCOCO_SPLITS)


def check_data_sources(args: Table1Arguments, typed: set[str]) -> None:
    """Each stage reads its published files or your own (`PUBLISHED_DATA`, `USER_FILES`), never both; a validation
    file needs its training file, and the published data's own flags typed on the command line (`typed`) are refused
    with your files."""
    if args.output_dir is None:
        raise ValueError("`--output_dir` is required (a flag or a config key).")
    for stage in STAGES:
        train, validation = USER_FILES[stage]
        published = [name for name in PUBLISHED_DATA[stage] if getattr(args, name) is not None]
        if getattr(args, validation) is not None and getattr(args, train) is None:
            raise ValueError(f"`--{validation}` is the evaluation rows of `--{train}`: pass `--{train}` too.")
        if args.user_data(stage):
            replaced = published + [name for name in PUBLISHED_ONLY.get(stage, ()) if name in typed]
            if replaced:
                raise ValueError(
                    f"`--{replaced[0]}` reads published data, but `--{train}` gives the {stage} stage's own: drop it."
                )
        elif len(published) < len(PUBLISHED_DATA[stage]):
            missing = [name for name in PUBLISHED_DATA[stage] if name not in published]
            raise ValueError(
                f"the {stage} stage reads `--{train}` (your own data) or its published files, which need "
                f"{['--' + name for name in PUBLISHED_DATA[stage]]}; missing: {missing}."
            )
    if args.coco_features is None and not (args.user_data("vqa") and args.user_data("refcoco")):
        args.coco_features = args.features
        if args.coco_features is None:
            raise ValueError(
                "`--coco_features` is required for the published VQA v2 / RefCOCO+ data (the COCO images' store)."
            )


def report_published_settings_unused(args: Table1Arguments, config_values: dict[str, Any], path: str | None) -> None:
    """Says which of the config file's published-data settings (`PUBLISHED_ONLY`: the paper's evaluation splits) a
    stage reading your own files leaves unused, so that the paper's config runs on your data (typed on the command
    line, `check_data_sources` refuses them)."""
    unused = [name for stage, names in PUBLISHED_ONLY.items() if args.user_data(stage) for name in names]
    unused = [name for name in unused if name in config_values]
    if unused:
        logger.warning(
            f"`--config` {path}: {', '.join(unused)} set the published data, which your own files replace: not used."
        )


def split_section_flags(argv: list[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(driver flags, {section: {flag: value}}) of `argv`, where `--<section>.<flag> VALUE` (or `=VALUE`) is a
    sub-run flag."""
    driver, sections, index = [], {section: {} for section in SECTIONS}, 0
    while index < len(argv):
        flag = argv[index]
        name = flag[2:].split("=", 1)[0] if flag.startswith("--") else ""
        section = name.split(".", 1)[0] if "." in name else None
        if section is None:
            driver.append(flag)
            index += 1
            continue
        if section not in SECTIONS:
            raise ValueError(f"`{flag}`: a sub-run flag is `--<section>.<flag>` with section one of {SECTIONS}.")
        if "=" in flag:
            value, index = flag.split("=", 1)[1], index + 1
        elif index + 1 < len(argv):
            value, index = argv[index + 1], index + 2
        else:
            raise ValueError(f"`{flag}` expects a value, got nothing after it.")
        sections[section][name.split(".", 1)[1]] = typed_flag_value(value)
    return driver, sections


def typed_flag_value(text: str) -> Any:
    """A sub-run flag's text as the value its `--config` JSON holds: `2` an int, `8e-5` a float, `true` / `false` a
    bool, anything else the text (`no` stays a string, as the flag's parser reads it, where YAML would read False)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def read_config(path: str | None, driver_names: set[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(driver values, {section: flag values}) of the config file; unknown names are an error naming them."""
    if path is None:
        return {}, {section: {} for section in SECTIONS}
    values = read_config_file(path)
    unknown = sorted(set(values) - driver_names - set(SECTIONS))
    if unknown:
        raise ValueError(
            f"`--config` {path!r} names keys this command does not take: {unknown} (it takes the driver flags "
            f"{sorted(driver_names)} and the sections {list(SECTIONS)})."
        )
    sections = {}
    for section in SECTIONS:
        value = values.get(section) or {}
        if not isinstance(value, dict):
            raise ValueError(f"`--config` {path!r}: section `{section}` must be a mapping of flags, got {value!r}.")
        sections[section] = value
    return {key: value for key, value in values.items() if key not in SECTIONS}, sections


def check_section_flags(sections: dict[str, dict[str, Any]], flag_names: dict[str, set[str]], where: str) -> None:
    """Every flag of a section is one its stages take and not one the driver sets."""
    for section, values in sections.items():
        stages = STAGES if section == "common" else (section,)
        unknown = sorted(name for name in values if not any(name in flag_names[stage] for stage in stages))
        if unknown:
            taken = "any sub-run" if section == "common" else f"examples/{stage_file(section)}"
            raise ValueError(f"{where}: section `{section}` names flags {unknown} that {taken} does not take.")
        owned = sorted(name for name in values if any(name in DRIVER_FLAGS[stage] for stage in stages))
        if owned:
            raise ValueError(
                f"{where}: section `{section}` sets {owned}, which the driver sets for each sub-run (use the driver's "
                "own flags: --output_dir, --seeds, --supervisions and the data paths)."
            )


def stage_file(stage: str) -> str:
    return {"vgp": "finetune_vgp.py", "vqa": "finetune_vqa.py", "refcoco": "finetune_refcoco.py"}[stage]


def parse_args(argv: list[str]) -> tuple[Table1Arguments, dict[str, dict[str, Any]]]:
    """(driver arguments, {stage: flag values of its sub-runs}), the config file's values under the command line's."""
    driver_argv, cli_sections = split_section_flags(argv)
    config_path, driver_argv = split_config_flag(driver_argv)
    driver_names = {item.name for item in fields(Table1Arguments)}
    config_values, config_sections = read_config(config_path, driver_names)
    parser = HfArgumentParser(
        Table1Arguments,
        description="Samaran et al. (2021), Table 1: VGP fine-tuning with each supervision, then VQA v2 and RefCOCO+.",
        epilog="Sub-run flags: --<section>.<flag> VALUE, section one of common, vgp, vqa, refcoco (e.g. "
        "--vqa.max_steps 10); they override the config file's sections.",
    )
    parser.add_argument("--config", help="YAML or JSON: driver flags and the sections common / vgp / vqa / refcoco")
    parser.set_defaults(**{name: str(value) for name, value in config_values.items()})
    args, _ = parser.parse_args_into_dataclasses(driver_argv)  # _: the `--config` namespace
    check_data_sources(args, typed_options(parser, driver_argv))
    report_published_settings_unused(args, config_values, config_path)
    _ = (args.supervision_list, args.seed_list, args.refcoco_split_list)  # checked now, before any training

    flag_names = stage_flag_names(stage_examples())
    check_section_flags(config_sections, flag_names, f"`--config` {config_path!r}")
    check_section_flags(cli_sections, flag_names, "the command line")
    # the config file's `common`, then its stage section, then the same two from the command line
    stage_flags = {}
    for stage in STAGES:
        stage_flags[stage] = {}
        for sections in (config_sections, cli_sections):
            common = {name: value for name, value in sections["common"].items() if name in flag_names[stage]}
            stage_flags[stage].update({**common, **sections[stage]})
    return args, stage_flags


def parse_list(text: str, argument: str, choices: tuple[str, ...] | None = None) -> list[str]:
    values = [value.strip() for value in str(text).split(",") if value.strip()]
    if not values:
        raise ValueError(f"`{argument}` must list at least one value, got {text!r}.")
    if len(set(values)) < len(values):
        raise ValueError(f"`{argument}` lists a value twice: {text!r}.")
    bad = [value for value in values if choices is not None and value not in choices]
    if bad:
        raise ValueError(f"`{argument}` must be comma-separated values among {choices}, got {bad} in {text!r}.")
    return values


def parse_int(text: str, argument: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"`{argument}` must be comma-separated integers, got {text!r}.") from None


# ----------------------------------------------------------------------------------------------------------------
# Sub-runs
# ----------------------------------------------------------------------------------------------------------------


def run_folder(output_dir: Path, supervision: str, seed: int) -> Path:
    return output_dir / supervision / f"seed{seed}"


def driver_flags(stage: str, args: Table1Arguments, supervision: str, seed: int, folder: Path) -> dict[str, Any]:
    """The flags the driver sets for one sub-run (on top of its config sections)."""
    flags: dict[str, Any] = {"output_dir": str(folder / stage), "seed": seed}
    if stage == "vgp":
        flags["supervision"] = supervision
        if args.user_data(stage):
            return {**flags, **user_files(args, stage)}
        flags.update(
            flickr30k_entities_dir=args.flickr30k_entities_dir, vgp_train_csv=args.vgp_train_csv,
            vgp_eval_csv=args.vgp_eval_csv, features=args.features,
        )  # fmt: skip
        return flags
    # the downstream runs start from the VGP run's weights (its single-stream encoder; the task head is new)
    flags.update(model_name_or_path=str(folder / "vgp"), model_family="single_stream")
    if args.user_data(stage):
        return {**flags, **user_files(args, stage)}
    flags["features"] = args.coco_features
    if stage == "vqa":
        flags.update(dataset="vqa_v2", data_dir=args.vqa_dir, eval_split=args.vqa_eval_split)
    else:
        flags.update(dataset="refcoco+", data_dir=args.refcoco_dir, eval_split=args.refcoco_split_list[0])
        if len(args.refcoco_split_list) > 1:
            flags["test_splits"] = ",".join(args.refcoco_split_list[1:])
    return flags


def user_files(args: Table1Arguments, stage: str) -> dict[str, str]:
    """`--train_file` (and `--validation_file`) of a stage that reads your own data."""
    train, validation = (getattr(args, name) for name in USER_FILES[stage])
    return {"train_file": train, **({"validation_file": validation} if validation is not None else {})}


def run_stage(
    example: ModuleType, stage: str, config_file: Path, flags: dict[str, Any], state: PartialState
) -> dict[str, Any]:
    """One sub-run: skipped when its folder holds results, resumed from its last checkpoint when it has one, else run;
    its `eval_results.json` (read after every process has finished it)."""
    output_dir = Path(flags["output_dir"])
    results_file = output_dir / RESULTS_FILE
    if results_file.is_file():
        if state.is_main_process:
            print(f"[samaran_table1] {output_dir}: finished earlier ({RESULTS_FILE}), skipped.", flush=True)
        return json.loads(results_file.read_text())
    last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if last is not None:
        flags = {**flags, "resume_from_checkpoint": last}
    argv = ["--config", str(config_file)]
    for name, value in flags.items():
        argv += [f"--{name}", str(value)]
    if state.is_main_process:
        print(f"[samaran_table1] {stage}: {stage_file(stage)} {' '.join(argv)}", flush=True)
    example.main(argv)
    state = PartialState()  # each sub-run's TrainingArguments resets accelerate's state; this one is the current
    state.wait_for_everyone()  # the main process has written the results
    return json.loads(results_file.read_text())


def write_stage_config(path: Path, values: dict[str, Any], state: PartialState) -> None:
    """The sub-run's config-section flags as the `--config` JSON it reads (written by the main process)."""
    if state.is_main_process:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2) + "\n")
    state.wait_for_everyone()


# ----------------------------------------------------------------------------------------------------------------
# Table
# ----------------------------------------------------------------------------------------------------------------

# the columns of Table 1: the downstream accuracies of the model VGP-fine-tuned with each setting
# (VQA: the official VQA accuracy on --vqa_eval_split; RefCOCO+: accuracy at IoU >= 0.5 per split)
VQA_COLUMN = "VQA {split}"
REFCOCO_COLUMN = "RefCOCO+ {split}"
# the VGP stage's own results, shown beside them
VGP_COLUMNS = {"VGP accuracy": "vgp_accuracy", "grounding accuracy (best head)": "grounding_accuracy_best_head"}


def vqa_column(args: Table1Arguments) -> str:
    return USER_COLUMN["vqa"] if args.user_data("vqa") else VQA_COLUMN.format(split=args.vqa_eval_split)


def refcoco_columns(args: Table1Arguments) -> list[str]:
    """One column per RefCOCO+ split, or one of your own validation rows."""
    if args.user_data("refcoco"):
        return [USER_COLUMN["refcoco"]]
    return [REFCOCO_COLUMN.format(split=split) for split in args.refcoco_split_list]


def table_columns(args: Table1Arguments) -> list[str]:
    return [vqa_column(args), *refcoco_columns(args)]


def seed_metrics(args: Table1Arguments, vgp: dict, vqa: dict, refcoco: dict) -> dict[str, float]:
    """One seed's row: the Table 1 columns, then the VGP stage's."""
    row = {vqa_column(args): vqa["vqa_accuracy"]}
    first, *others = refcoco_columns(args)
    row[first] = refcoco["accuracy"]
    for column, split in zip(others, args.refcoco_split_list[1:]):
        row[column] = refcoco["test_splits"][split]["accuracy"]
    row.update({column: vgp[key] for column, key in VGP_COLUMNS.items()})
    return row


def summarise(per_seed: dict[int, dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(mean, sample standard deviation; 0 with one seed) of every column over the seeds."""
    columns = next(iter(per_seed.values()))
    means, stds = {}, {}
    for column in columns:
        values = [row[column] for row in per_seed.values()]
        means[column] = sum(values) / len(values)
        spread = sum((value - means[column]) ** 2 for value in values) / max(len(values) - 1, 1)
        stds[column] = math.sqrt(spread)
    return means, stds


def render_table(table: dict) -> str:
    columns = table["columns"] + table["vgp_columns"]
    seeds = table["seeds"]
    lines = [
        "# Samaran et al. (2021), Table 1: downstream accuracy (%) after VGP fine-tuning with each attention supervision",
        "",
        f"Seeds: {', '.join(map(str, seeds))}" + (" (mean ± standard deviation)" if len(seeds) > 1 else "") + ". "
        "The last columns are the VGP stage's own results.",
        "",
        "| supervision | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for setting, entry in table["settings"].items():
        cells = []
        for column in columns:
            cell = f"{100 * entry['metrics'][column]:.2f}"
            if len(seeds) > 1:
                cell += f" ± {100 * entry['std'][column]:.2f}"
            cells.append(cell)
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    args, stage_flags = parse_args(sys.argv[1:] if argv is None else argv)
    examples = stage_examples()
    output_dir = Path(args.output_dir)
    state = PartialState()
    settings = {}
    for supervision in args.supervision_list:
        per_seed, runs = {}, {}
        for seed in args.seed_list:
            folder = run_folder(output_dir, supervision, seed)
            results = {}
            for stage in STAGES:
                config_file = output_dir / "configs" / supervision / f"seed{seed}" / f"{stage}.json"
                write_stage_config(config_file, stage_flags[stage], state)
                flags = driver_flags(stage, args, supervision, seed, folder)
                results[stage] = run_stage(examples[stage], stage, config_file, flags, state)
                state = PartialState()
            per_seed[str(seed)] = seed_metrics(args, results["vgp"], results["vqa"], results["refcoco"])
            runs[str(seed)] = {stage: str(folder / stage) for stage in STAGES}
        means, stds = summarise(per_seed)
        settings[supervision] = {"metrics": means, "std": stds, "per_seed": per_seed, "runs": runs}
    table = {
        "paper": "Samaran et al. 2021, Attending Self-Attention, Table 1",
        "columns": table_columns(args),
        "vgp_columns": list(VGP_COLUMNS),
        "seeds": args.seed_list,
        "settings": settings,
    }
    if state.is_main_process:
        (output_dir / "table1.json").write_text(json.dumps(table, indent=2) + "\n")
        markdown = render_table(table)
        (output_dir / "table1.md").write_text(markdown)
        print(markdown)
    state.wait_for_everyone()
    return table


if __name__ == "__main__":
    run_command("samaran_table1.py", main)
