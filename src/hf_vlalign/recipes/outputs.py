"""Finishing a run: the final evaluation, the weights, `eval_results.json` and its entries, the model card's training
summary, and the push."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import datasets
from huggingface_hub import ModelCard
from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments
from transformers.modeling_utils import unwrap_model

from ..data.collators import RegionTextCollator, TruncationStats
from ..data.feature_store import RegionFeatureStore
from ..evaluation.image_use import image_use_gap
from ..hub import push_folder_to_hub
from ..processing import RegionFeatureExtractor, VLAlignProcessor
from .schedule import early_stopping_summary
from .subsets import evaluation_subset


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


# regions of a new image for a model trained on the synthetic scenes, whose "detector" boxes exist only for the
# rendered scenes: the whole image and a 3 x 3 grid (10 regions, near the scenes' 12)
SYNTHETIC_INFERENCE_GRID = {"grid_size": 3, "include_whole_image": True}


def save_model(trainer: Trainer, output_dir: str | Path, region_options: Mapping[str, Any] | None = None) -> None:
    """Weights, config, tokenizer and processor in `output_dir` (every process calls it; FSDP / DeepSpeed gather
    there), and the arguments as JSON instead of the pickled `training_args.bin`, so the folder is pickle-free. The
    processor (the trainer's `VLAlignProcessor`, else `build_processor` with `region_options`) becomes the trainer's
    `processing_class`, so that `AutoProcessor.from_pretrained(output_dir)` loads it."""
    processor = trainer.processing_class
    if isinstance(processor, VLAlignProcessor) and region_options is not None:
        processor = processor.tokenizer
    if isinstance(processor, PreTrainedTokenizerBase):
        store = getattr(trainer.data_collator, "region_features", None)
        trainer.processing_class = build_processor(processor, trainer.model, store, region_options)
    trainer.save_model(str(output_dir))
    if trainer.is_world_process_zero():
        (Path(output_dir) / "training_args.bin").unlink(missing_ok=True)
        (Path(output_dir) / "training_args.json").write_text(trainer.args.to_json_string())


def build_processor(
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    region_features: RegionFeatureStore | None = None,
    region_options: Mapping[str, Any] | None = None,
) -> VLAlignProcessor:
    """The `VLAlignProcessor` of a run: `tokenizer` and `RegionFeatureExtractor(**region_options)` checked against the
    model's `visual_feat_dim` (None: `default_region_options`). As the Trainer's `processing_class` it is saved in
    every checkpoint-N folder."""
    config = unwrap_model(model).config
    options = dict(default_region_options(config, region_features) if region_options is None else region_options)
    expected = config.visual_feat_dim
    if options.get("encoder", "pixel") == "pixel" and options.get("feature_dim") is None:
        options["feature_dim"] = expected  # the pixel encoder without a `feature_dim` takes the model's
    if options.get("feature_dim") not in (None, expected):
        raise ValueError(
            f"`region_options` feature_dim={options['feature_dim']} differs from the model's visual_feat_dim={expected}."
        )
    return VLAlignProcessor(RegionFeatureExtractor(**options), tokenizer)


def default_region_options(config: PreTrainedConfig, store: RegionFeatureStore | None) -> dict[str, Any]:
    """The region options of a model trained on `store`'s features, when the run gives none: for the synthetic scenes
    (a `manifest.json` above the features file of the store's source) the pixel encoder with their `feature_dim` and
    `seed`; for any other store (e.g. published bottom-up-attention features, which the extractor cannot reproduce) no
    encoder and the model's `visual_feat_dim`. Both with `SYNTHETIC_INFERENCE_GRID` as the boxes of a new image."""
    _, _, features_file = (getattr(store, "metadata", None) or {}).get("source", "").partition(":")
    for folder in list(Path(features_file).parents)[:3] if features_file else []:
        try:
            scenes = json.loads((folder / "manifest.json").read_text()).get("config")
        except (OSError, ValueError, AttributeError):  # no manifest, or not a JSON object
            continue
        if isinstance(scenes, dict) and {"feature_dim", "seed"} <= set(scenes):
            return {"encoder": "pixel", "feature_dim": scenes["feature_dim"], "seed": scenes["seed"], **SYNTHETIC_INFERENCE_GRID}
    return {"encoder": None, "feature_dim": config.visual_feat_dim, **SYNTHETIC_INFERENCE_GRID}


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


# evaluation rows the image-use check of the examples reads by default (three forward passes over each)
IMAGE_USE_EXAMPLES = 1000


def image_use_results(
    model: PreTrainedModel,
    dataset: datasets.Dataset | list[dict],
    collator,
    batch_size: int,
    seed: int,
    max_examples: int | None = IMAGE_USE_EXAMPLES,
    group_column: str | None = None,
    perturb_boxes: bool = False,
) -> dict[str, Any]:
    """The `image_use` entry of `eval_results.json`: [`image_use_gap`] of the trained model on a seeded sample of
    `max_examples` evaluation rows (None: all), with the geometry check's passes when `perturb_boxes`. Run it on every
    process (the model may be sharded)."""
    rows = evaluation_subset(dataset, max_examples, seed, argument="--image_use_examples")
    columns = rows.column_names if isinstance(rows, datasets.Dataset) else list(rows[0]) if rows else []
    if group_column not in columns:
        group_column = None  # e.g. VQA's `answer_type`, absent from other question sets
    return image_use_gap(
        model, rows, collator, batch_size, seed=seed, group_column=group_column, perturb_boxes=perturb_boxes,
        progress=False,
    )  # fmt: skip


def truncation_results(
    max_text_length: int, splits: Mapping[str, TruncationStats], collators: Iterable[RegionTextCollator] = ()
) -> dict[str, Any]:
    """The `truncation` entry of `eval_results.json`: `max_text_length`, what `drop_overlong_rows` counted on each
    split, and under `collated` the sum of the collators' `truncation_stats` in this process (a row collated several
    times counts each time)."""
    for name, stats in splits.items():
        if not isinstance(stats, TruncationStats):
            raise ValueError(
                f"`splits[{name!r}]` must be a TruncationStats (from drop_overlong_rows), got {type(stats).__name__}."
            )
    collated = sum((collator.truncation_stats for collator in collators), TruncationStats())
    return {
        "max_text_length": max_text_length,
        **{name: stats.to_dict() for name, stats in splits.items()},
        "collated": collated.to_dict(),
    }


def trained_amount(trainer: Trainer) -> str:
    """The steps and epochs the run actually trained (`trainer.state`), and what was planned (`--max_steps` or
    `--num_train_epochs`): e.g. "15 steps (0.37 of an epoch; planned: 2 epochs)" for a run stopped early."""
    state, args = trainer.state, trainer.args
    epochs = state.epoch or 0.0
    trained = "1 epoch" if round(epochs, 2) == 1 else f"{epochs:.2g} of an epoch" if epochs < 1 else f"{epochs:.3g} epochs"
    if args.max_steps > 0:
        planned = f"{args.max_steps} step{'s' if args.max_steps != 1 else ''} (--max_steps)"
    else:
        planned = f"{args.num_train_epochs:g} epoch{'s' if args.num_train_epochs != 1 else ''}"
    steps = state.global_step
    return f"{steps} optimizer step{'s' if steps != 1 else ''} ({trained}; planned: {planned})"


def training_summary(trainer: Trainer, data_source: str, eval_examples: int) -> dict[str, object]:
    """The training settings a model card shows; `trained` is what the run did (`trained_amount`), not what the
    arguments asked for, and `stopping` the early-stopping rule when the run had one."""
    args = trainer.args
    stopping = early_stopping_summary(trainer)
    return {
        "data": data_source,
        "trained": trained_amount(trainer),
        **({"stopping": stopping} if stopping is not None else {}),
        "learning_rate": args.learning_rate,
        "batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "processes": args.world_size,
        "mixed_precision": args.mixed_precision,
        "seed": args.seed,
        "train_examples": len(trainer.train_dataset),
        "eval_examples": eval_examples,
    }
