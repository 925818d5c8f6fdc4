#!/usr/bin/env python
"""Fine-tune a single-stream or two-stream model on NLVR2 (Suhr et al. 2019): is the sentence true of the image pair?

The sentence is encoded once with each image, the two pooled states are concatenated and a head gives one score,
trained with binary cross-entropy (`SingleStreamForVisualReasoning` / `TwoStreamForVisualReasoning`, LXMERT's "pair"
setting).

    accelerate launch examples/finetune_nlvr2.py            # offline: the synthetic scenes' NLVR2 statements, MiniLM
    accelerate launch examples/finetune_nlvr2.py --model_family two_stream
    accelerate launch examples/finetune_nlvr2.py --dataset nlvr2 --data_dir nlvr/nlvr2/data --features STORE_DIR
    accelerate launch examples/finetune_nlvr2.py --dataset nlvr2 --data_dir nlvr/nlvr2/data --features STORE_DIR \
        --eval_split test1 --eval_subset balanced
    accelerate launch examples/finetune_nlvr2.py --train_file train.jsonl --validation_file val.jsonl
        # your own photos: `nlvr2` rows of the user-data format (left_image, right_image, sentence, label)

`--data_dir` is the `nlvr2/data` folder of lil-lab/nlvr (train.json, dev.json, test1.json, balanced/); STORE_DIR is a
RegionFeatureStore of the pair images keyed by NLVR2's image ids ("dev-850-0-img0", "dev-850-0-img1"), the `img_id` of
LXMERT's NLVR2 feature files (`hf-vlalign convert-features` makes it). The synthetic default writes the same files:
sets of four image pairs, each sentence judged against every pair of its set, labels exactly balanced.

Attention supervision: the NLVR2 data carries no word-region alignment and the visual reasoning heads take none, so
`--supervision` must stay `none` (the default); another value is refused.

Metrics, every `--eval_steps` and at the end, on the evaluation split in order, with
`hf_vlalign.metrics.nlvr2_scores`: `accuracy` and `consistency` (the share of sentences whose every image pair is
judged right). `eval_results.json` adds the evaluation loss, the majority-label baseline (the most frequent
training label predicted for every evaluation example; its consistency is 0 when every sentence has a True and a False
pair, as in NLVR2) and `chance_consistency`, the expected consistency of random guesses.

Writes to --output_dir: safetensors weights, config, tokenizer, `eval_results.json`, README.md (model card),
`training_args.json` and TensorBoard logs under runs/ (when tensorboard is installed).
Every transformers `TrainingArguments` flag works too (--seed, --eval_steps, --push_to_hub, --resume_from_checkpoint, ...),
and those of `TaskTrainingArguments` (--distill_from, --ewc_weight, ...).
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from dataclasses import dataclass, field

import datasets
import numpy as np
from transformers import set_seed

from hf_vlalign import SingleStreamForVisualReasoning, TwoStreamForVisualReasoning
from hf_vlalign.data import RegionFeatureStore, build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import ImagePairCollator
from hf_vlalign.evaluation.baselines import compare_with_baselines, visual_reasoning_baselines
from hf_vlalign.evaluation.task_metrics import predicted_truth, reasoning_metrics
from hf_vlalign.hub.model_card import render_task_model_card
from hf_vlalign.metrics import nlvr2_scores
from hf_vlalign.metrics.nlvr2 import sentence_key
from hf_vlalign.recipes import (
    DEFAULT_BASE_MODEL,
    DataArguments,
    ModelArguments,
    build_processor,
    evaluation_subset,
    final_evaluation,
    first_rows,
    image_use_results,
    load_task_model,
    load_tokenizer,
    load_user_splits,
    parse_recipe_args,
    save_model,
    synthetic_scene_config,
    take_push_to_hub,
    training_callbacks,
    training_summary,
    truncation_results,
    write_results,
)
from hf_vlalign.trainers import TaskTrainer, TaskTrainingArguments
from hf_vlalign.utils.user_errors import run_command

logger = logging.getLogger(__name__)

TASK_CLASSES = {"single_stream": SingleStreamForVisualReasoning, "two_stream": TwoStreamForVisualReasoning}
DATASETS = ("synthetic_scenes", "nlvr2")
DEFAULT_SPLITS = {"synthetic_scenes": ("train", "val"), "nlvr2": ("train", "dev")}
ON_MISSING_IMAGE = ("raise", "skip")
USER_DATA = "user data"


@dataclass
class VisualReasoningArguments:
    eval_subset: str | None = field(
        default=None,
        metadata={"help": "NLVR2: evaluate on the balanced | unbalanced subset of dev / test1 (default: the full split)."},
    )
    on_missing_image: str = field(
        default="raise",
        metadata={"help": "NLVR2: raise | skip the examples with an image of the pair missing from --features."},
    )


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, VisualReasoningArguments, TaskTrainingArguments]:
    return parse_recipe_args(
        argv,
        (ModelArguments, DataArguments, VisualReasoningArguments),
        TaskTrainingArguments,
        data_source_flags=("eval_subset", "on_missing_image"),  # NLVR2's own: refused with --train_file
        output_dir="outputs/nlvr2",
        num_train_epochs=2,
        learning_rate=5e-5,  # higher rates (1e-4, 2e-4) collapse to one answer on the synthetic statements
        warmup_steps=14,
        weight_decay=0.01,
        per_device_train_batch_size=16,  # more updates in the default's budget than 32
        per_device_eval_batch_size=64,
        save_steps=80,
    )


@dataclass
class VisualReasoningData:
    """The two splits joined to both images' region features."""

    train: datasets.Dataset
    eval: datasets.Dataset
    store: RegionFeatureStore
    dataset: str
    # `--train_file`: what the data is, and the `extract_region_features` options of its features
    source: str | None = None
    region_options: dict | None = None


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def check_data_arguments(data_args: DataArguments, nlvr2_args: VisualReasoningArguments) -> str:
    """The dataset name (synthetic_scenes when --dataset is not given), after checking the arguments it needs."""
    dataset = data_args.dataset or "synthetic_scenes"
    if dataset not in DATASETS:
        raise ValueError(f"`--dataset` must be 'nlvr2' (or absent: synthetic scenes), got {dataset!r}.")
    if nlvr2_args.on_missing_image not in ON_MISSING_IMAGE:
        raise ValueError(f"`--on_missing_image` must be one of {ON_MISSING_IMAGE}, got {nlvr2_args.on_missing_image!r}.")
    if dataset == "synthetic_scenes":
        given = [name for name in ("data_dir", "features") if getattr(data_args, name) is not None]
        given += ["eval_subset"] if nlvr2_args.eval_subset is not None else []
        if given:
            raise ValueError(
                f"`--{given[0]}` reads the real NLVR2: pass `--dataset nlvr2` with it (the synthetic scenes are "
                "generated into $HF_VLALIGN_CACHE)."
            )
        return dataset
    missing = [name for name in ("data_dir", "features") if getattr(data_args, name) is None]
    if missing:
        raise ValueError(
            f"`--{missing[0]}` is required with `--dataset nlvr2`: --data_dir the nlvr2/data folder of lil-lab/nlvr, "
            "--features a RegionFeatureStore folder of its pair images."
        )
    return dataset


def load_user_pairs(data_args: DataArguments, training_args: TaskTrainingArguments) -> VisualReasoningData:
    """`--train_file` / `--validation_file` of `nlvr2` rows (two images, a sentence, its truth)."""
    user = load_user_splits(data_args, "nlvr2", training_args)
    train = first_rows(user.train, data_args.max_train_samples)
    evaluation = first_rows(user.eval, data_args.max_eval_samples)
    return VisualReasoningData(train, evaluation, user.store, USER_DATA, user.source, user.region_options)


def load_pair_data(
    data_args: DataArguments, nlvr2_args: VisualReasoningArguments, training_args: TaskTrainingArguments | None = None
) -> VisualReasoningData:
    """Train and evaluation rows of `--train_file` (which needs `training_args`), `--dataset` or, by default, the
    synthetic scenes' NLVR2 statements, with both images' region features (`left_feature_row`,
    `right_feature_row`)."""
    if data_args.train_file is not None:
        return load_user_pairs(data_args, training_args)
    name = check_data_arguments(data_args, nlvr2_args)
    train_split = data_args.train_split or DEFAULT_SPLITS[name][0]
    eval_split = data_args.eval_split or DEFAULT_SPLITS[name][1]
    if name == "synthetic_scenes":
        config = synthetic_scene_config(data_args)
        store = synthetic_region_features(config=config, task="nlvr2")
        train = build_dataset(name, None, train_split, task="nlvr2", config=config, region_features=store)
        eval_rows = build_dataset(name, None, eval_split, task="nlvr2", config=config, region_features=store)
    else:
        store = RegionFeatureStore.load(data_args.features)
        options = {"region_features": store, "on_missing_image": nlvr2_args.on_missing_image}
        train = build_dataset(name, data_args.data_dir, train_split, **options)
        eval_rows = build_dataset(name, data_args.data_dir, eval_split, subset=nlvr2_args.eval_subset, **options)
    train = first_rows(train, data_args.max_train_samples)
    eval_rows = first_rows(eval_rows, data_args.max_eval_samples)
    return VisualReasoningData(train, eval_rows, store, name)


# ----------------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------------


def baselines(data: VisualReasoningData) -> dict[str, float | int]:
    """The most frequent training label predicted for every evaluation example, scored like the model, and the
    consistency that guessing each example's truth at random has in expectation (a sentence judged against n image
    pairs is all right with probability 0.5 ** n): the yardstick of a model that is no better than chance."""
    majority = Counter(data.train["label"]).most_common(1)[0][0]
    scores = nlvr2_scores([majority] * len(data.eval), data.eval["label"], data.eval["identifier"])
    pairs_per_sentence = Counter(sentence_key(identifier) for identifier in data.eval["identifier"])
    return {
        "majority_label": int(majority),
        "majority_baseline_accuracy": scores["accuracy"],
        "majority_baseline_consistency": scores["consistency"],
        "chance_consistency": float(np.mean([0.5**count for count in pairs_per_sentence.values()])),
        "eval_sentences": len(pairs_per_sentence),
    }


# ----------------------------------------------------------------------------------------------------------------
# Run
# ----------------------------------------------------------------------------------------------------------------


def check_supervision(model_args: ModelArguments) -> None:
    """NLVR2 gives no word-region alignment and the visual reasoning heads take none."""
    if model_args.supervision != "none":
        raise ValueError(
            f"`--supervision` must be 'none' for NLVR2, got {model_args.supervision!r}: its sentences are not grounded "
            "to regions, so there is no word-region alignment to supervise the attention with."
        )


def data_source(data: VisualReasoningData, data_args: DataArguments) -> str:
    if data.source is not None:
        return data.source
    if data.dataset == "synthetic_scenes":
        return (
            f"synthetic scenes' NLVR2-format statements ({data_args.synthetic_train_images} train / "
            f"{data_args.synthetic_eval_images} eval images, seed {data_args.synthetic_seed})"
        )
    return f"NLVR2 ({data_args.data_dir})"


def write_report(
    trainer, metrics, data, model_args, data_args, training_args, push_to_hub, truncation, image_use
) -> dict:
    """`eval_results.json` and the model card in --output_dir, then the push (main process)."""
    results = {
        "accuracy": metrics["eval_accuracy"],
        "consistency": metrics["eval_consistency"],
        "eval_loss": metrics["eval_loss"],
        **baselines(data),
        "dataset": data.dataset,
        "data": data_source(data, data_args),
        "model_family": model_args.model_family,
        "eval_examples": len(data.eval),
        "truncation": truncation,
        "image_use": image_use,
    }
    majority = visual_reasoning_baselines(data.train["label"], data.eval["label"], data.eval["identifier"])
    results["baselines"] = compare_with_baselines(results, majority)
    card = render_task_model_card(
        "visual_reasoning",
        model_family=model_args.model_family,
        model_id=training_args.hub_model_id,
        base_model=model_args.model_name_or_path or DEFAULT_BASE_MODEL,
        results={key: value for key, value in results.items() if isinstance(value, float)},
        baselines=results["baselines"],
        training=training_summary(trainer, data_source(data, data_args), len(data.eval)),
        config=trainer.model.config,
        synthetic_data=data.dataset == "synthetic_scenes",
        dataset_name=None if data.dataset == "synthetic_scenes" else data.dataset,
    )
    write_results(
        training_args.output_dir,
        results,
        card,
        push_to_hub=push_to_hub,
        training_args=training_args,
        commit_message=f"hf_vlalign {data.dataset} visual reasoning ({model_args.model_family})",
    )
    return results


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, nlvr2_args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    check_supervision(model_args)
    set_seed(training_args.seed)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        data = load_pair_data(data_args, nlvr2_args, training_args)
    model = load_task_model(TASK_CLASSES, model_args, data.store.feature_dim)
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    collator = ImagePairCollator(tokenizer, data.store, max_text_length=data_args.max_text_length)
    # sentences longer than max_text_length are truncated (counted); no row needs a span, so none is dropped
    data.train, train_truncation = collator.drop_overlong_rows(data.train, f"{data.dataset} train")
    data.eval, eval_truncation = collator.drop_overlong_rows(data.eval, f"{data.dataset} eval")
    push_to_hub = take_push_to_hub(training_args)
    eval_subset = evaluation_subset(data.eval, data_args.eval_subset_size, training_args.seed)
    training_args.label_names = ["labels"]  # what compute_metrics reads
    trainer = TaskTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=eval_subset,
        data_collator=collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, data.store, data.region_options),
        compute_metrics=reasoning_metrics(eval_subset),
        preprocess_logits_for_metrics=predicted_truth,
        # bounded evaluations, early stopping with --early_stopping_patience, learning_curve.json
        callbacks=training_callbacks(training_args, len(eval_subset), data_args.early_stopping_patience),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_model(trainer, training_args.output_dir)
    metrics = final_evaluation(trainer, data.eval, reasoning_metrics)
    # own image pair vs another pair's regions: ~0 means the truth values come from the sentence alone
    image_use = image_use_results(
        trainer.model, data.eval, collator, training_args.per_device_eval_batch_size, training_args.seed,
        data_args.image_use_examples,
    )  # fmt: skip
    results = {}
    if trainer.is_world_process_zero():
        truncation = truncation_results(
            data_args.max_text_length, {"train": train_truncation, "eval": eval_truncation}, [collator]
        )
        results = write_report(
            trainer, metrics, data, model_args, data_args, training_args, push_to_hub, truncation, image_use
        )
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_command("finetune_nlvr2.py", main)
