#!/usr/bin/env python
"""Fine-tune referring expression comprehension on RefCOCO+ by region scoring (VL-BERT, Su et al. 2020, sec. 4.3),
either family.

Every region's final state is scored; each real region is trained with binary cross-entropy against "IoU with the
referred box >= `referring_iou_threshold`", and the prediction is the best-scored region. An expression is correctly
grounded when that region's box has IoU >= 0.5 with the referred box (Yu et al. 2016), measured after training on the
evaluation split, in order, with `hf_vlalign.metrics.referring_expression_accuracy`. The same pass gives two references:
the detector-confidence baseline (the image's most confident region, Li et al. 2020) and the upper bound (an expression
is within reach when some region of its image has IoU >= 0.5 with its box: the detector's recall).

    accelerate launch examples/finetune_refcoco.py                          # offline: synthetic scenes, MiniLM
    accelerate launch examples/finetune_refcoco.py --model_family two_stream --supervision direct
    accelerate launch examples/finetune_refcoco.py --dataset refcoco+ --data_dir refcoco+ --features STORE_DIR \
        --eval_split val --test_splits testA,testB   # real data: lichengunc/refer's refcoco+ folder (refs(unc).p,
                                # instances.json) and a region-feature store of its COCO train2014 images
                                # (hf-vlalign convert-features)
    accelerate launch examples/finetune_refcoco.py --train_file train.jsonl --validation_file val.jsonl
        # your own photos: `refcoco` rows of the user-data format (image, expression, box in pixels)

`--supervision direct|semi_direct|indirect` trains the attention of the expression's words towards the referred box.

`--test_splits testA,testB` evaluates the trained model on those splits too (VL-BERT and Samaran et al. report val,
testA and testB): their results go under `test_splits` in `eval_results.json`, one entry per split.

Writes to --output_dir: safetensors weights, config, tokenizer, `eval_results.json`, README.md (model card),
`training_args.json` and TensorBoard logs under runs/ (when tensorboard is installed).
Every transformers `TrainingArguments` flag works too (--seed, --eval_steps, --resume_from_checkpoint, --push_to_hub,
...), and those of `TaskTrainingArguments` (--distill_from, --ewc_weight, ...).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field

import datasets
from transformers import set_seed

from hf_vlalign import SingleStreamForReferringExpression, TwoStreamForReferringExpression
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders import refcoco
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import ReferringExpressionCollator
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.task_metrics import (
    IOU_THRESHOLD,
    accuracy_from_region_iou,
    chosen_regions,
    referring_results,
)
from hf_vlalign.hub.model_card import metrics_from_eval_results, render_task_model_card
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
from hf_vlalign.trainers import ReferringExpressionTrainer, TaskTrainingArguments
from hf_vlalign.utils.user_errors import run_command

logger = logging.getLogger(__name__)

TASK_CLASSES = {"single_stream": SingleStreamForReferringExpression, "two_stream": TwoStreamForReferringExpression}
REAL_DATASET = "refcoco+"


@dataclass
class ReferringArguments:
    refs_file: str | None = field(
        default=None, metadata={"help": "RefCOCO+: the refs list to read instead of refs(unc).p (.p / .pkl / .json)."}
    )
    image_id_template: str | None = field(
        default=None,
        metadata={"help": "RefCOCO+: the store's image ids, e.g. 'COCO_train2014_{image_id:012d}' (default: both)."},
    )
    test_splits: str | None = field(
        default=None,
        metadata={
            "help": "RefCOCO+: comma-separated splits also evaluated after training, e.g. 'testA,testB' (results under "
            "`test_splits` in eval_results.json)."
        },
    )
    hub_model_id_for_card: str | None = field(default=None, metadata={"help": "model id shown in the card."})


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, ReferringArguments, TaskTrainingArguments]:
    return parse_recipe_args(
        argv,
        (ModelArguments, DataArguments, ReferringArguments),
        TaskTrainingArguments,
        data_source_flags=("refs_file", "image_id_template", "test_splits"),  # RefCOCO+'s: refused with --train_file
        output_dir="outputs/refcoco",
        num_train_epochs=1,
        learning_rate=2e-4,  # the new region head and visual embeddings learn slowly at BERT's usual 5e-5
        warmup_steps=20,
        weight_decay=0.01,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        save_steps=100,
        # the default data: ~2,700 training expressions (~165 steps), ~650 evaluation ones; a few minutes on 2 cores
        synthetic_train_images=320,
        synthetic_eval_images=80,
    )


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_splits(
    data_args: DataArguments, ref_args: ReferringArguments
) -> tuple[datasets.Dataset, datasets.Dataset, RegionFeatureStore, str]:
    """(train rows, eval rows, region-feature store, description of the data) of RefCOCO+ or, by default, of the
    synthetic scenes' referring expressions (written as RefCOCO+'s files and read by its builder)."""
    if data_args.dataset in (None, "synthetic_scenes"):
        config = synthetic_scene_config(data_args)
        store = synthetic_region_features(config=config)
        options = {"task": "refcoco", "config": config, "region_features": store}
        train = build_dataset("synthetic_scenes", None, data_args.train_split or "train", **options)
        evaluation = build_dataset("synthetic_scenes", None, data_args.eval_split or "val", **options)
        images = f"{config.num_train_images} train / {config.num_val_images} val images"
        source = f"synthetic scenes, referring expressions ({images})"
        return train, evaluation, store, source
    if data_args.dataset != REAL_DATASET:
        raise ValueError(f"`--dataset` must be {REAL_DATASET} (or unset: synthetic scenes), got {data_args.dataset!r}.")
    if data_args.data_dir is None or data_args.features is None:
        raise ValueError(
            f"`--dataset {REAL_DATASET}` needs `--data_dir` (the refcoco+ folder with refs(unc).p and instances.json) "
            f"and `--features` (a region-feature store of its COCO train2014 images), got --data_dir "
            f"{data_args.data_dir!r} and --features {data_args.features!r}."
        )
    store = RegionFeatureStore.load(data_args.features)
    train = load_refcoco_split(data_args, ref_args, store, data_args.train_split or "train")
    evaluation = load_refcoco_split(data_args, ref_args, store, data_args.eval_split or "val")
    return train, evaluation, store, f"RefCOCO+ ({data_args.data_dir})"


def load_data(
    data_args: DataArguments, ref_args: ReferringArguments, training_args: TaskTrainingArguments
) -> tuple[datasets.Dataset, datasets.Dataset, RegionFeatureStore, str, dict | None]:
    """`load_splits`, or the `refcoco` rows of `--train_file` / `--validation_file`, with the `extract_region_features`
    options of features made from the images (None for a given store)."""
    if data_args.train_file is None:
        return *load_splits(data_args, ref_args), None
    user = load_user_splits(data_args, "refcoco", training_args)
    return user.train, user.eval, user.store, user.source, user.region_options


def load_refcoco_split(
    data_args: DataArguments, ref_args: ReferringArguments, store: RegionFeatureStore, split: str
) -> datasets.Dataset:
    """One RefCOCO+ split joined to `store` (rows whose image has no features: counted, warned and left out)."""
    options = {"region_features": store, "on_missing_image": "skip"}
    if ref_args.refs_file is not None:
        options["refs_file"] = ref_args.refs_file
    if ref_args.image_id_template is not None:
        options["image_id_template"] = ref_args.image_id_template
    return build_dataset(REAL_DATASET, data_args.data_dir, split, **options)


def parse_test_splits(data_args: DataArguments, ref_args: ReferringArguments) -> list[str]:
    """The splits of `--test_splits` (RefCOCO+ only), checked."""
    if ref_args.test_splits is None:
        return []
    if data_args.dataset != REAL_DATASET:
        raise ValueError(
            f"`--test_splits` evaluates further RefCOCO+ splits: pass `--dataset {REAL_DATASET}` with it, got "
            f"--dataset {data_args.dataset!r}."
        )
    splits = [split.strip() for split in ref_args.test_splits.split(",") if split.strip()]
    bad = [split for split in splits if split not in refcoco.SPLITS]
    if not splits or bad:
        raise ValueError(
            f"`--test_splits` must be comma-separated RefCOCO+ splits among {refcoco.SPLITS}, got {ref_args.test_splits!r}."
        )
    return splits


def evaluate_test_splits(model, data_args, ref_args, store, collator, splits, batch_size) -> tuple[dict, dict]:
    """(`referring_results` of the trained model on each of `splits`, what `drop_overlong_rows` counted on each):
    forward passes, so every process runs them."""
    results, truncations = {}, {}
    for split in splits:
        rows = first_rows(load_refcoco_split(data_args, ref_args, store, split), data_args.max_eval_samples)
        rows, truncations[split] = collator.drop_overlong_rows(rows, f"referring {split}")
        results[split] = referring_results(rows, store, chosen_regions(model, rows, collator, batch_size))
    return results, truncations


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, ref_args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    test_splits = parse_test_splits(data_args, ref_args)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        train_rows, eval_rows, store, source, region_options = load_data(data_args, ref_args, training_args)
    train_dataset = first_rows(train_rows, data_args.max_train_samples)
    eval_dataset = first_rows(eval_rows, data_args.max_eval_samples)

    model = load_task_model(
        TASK_CLASSES, model_args, visual_feat_dim=store.feature_dim, referring_iou_threshold=IOU_THRESHOLD
    )
    collator = ReferringExpressionCollator(
        tokenizer, store, max_text_length=data_args.max_text_length, iou_threshold=IOU_THRESHOLD
    )
    # expressions longer than max_text_length are truncated, a cut expression losing its alignment: counted
    train_dataset, train_truncation = collator.drop_overlong_rows(train_dataset, "referring train")
    eval_dataset, eval_truncation = collator.drop_overlong_rows(eval_dataset, "referring eval")
    push_to_hub = take_push_to_hub(training_args)
    training_args.label_names = ["target_region_iou"]  # what compute_metrics reads
    eval_subset = evaluation_subset(eval_dataset, data_args.eval_subset_size, training_args.seed)
    trainer = ReferringExpressionTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_subset,
        data_collator=collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, store, region_options),
        compute_metrics=accuracy_from_region_iou,
        # bounded evaluations, early stopping with --early_stopping_patience, learning_curve.json
        callbacks=training_callbacks(training_args, len(eval_subset), data_args.early_stopping_patience),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_model(trainer, training_args.output_dir)
    metrics = final_evaluation(trainer, eval_dataset)

    choices = chosen_regions(trainer.model, eval_dataset, collator, training_args.per_device_eval_batch_size)
    split_results, split_truncation = evaluate_test_splits(
        trainer.model, data_args, ref_args, store, collator, test_splits, training_args.per_device_eval_batch_size
    )
    image_use = image_use_results(  # own image vs another image's regions: ~0 means the image is not read
        trainer.model, eval_dataset, collator, training_args.per_device_eval_batch_size, training_args.seed,
        data_args.image_use_examples,
    )  # fmt: skip
    results = {}
    if trainer.is_world_process_zero():
        synthetic = data_args.dataset in (None, "synthetic_scenes") and data_args.train_file is None
        results = {
            **referring_results(eval_dataset, store, choices),
            "accuracy_from_collator_iou": metrics["eval_accuracy"],
            "eval_loss": metrics["eval_loss"],
            **{key: metrics[key] for key in ("eval_loss_task", "eval_loss_attention_supervision") if key in metrics},
            "data": source,
            "model_family": model_args.model_family,
            "supervision": model_args.supervision,
            "truncation": truncation_results(
                data_args.max_text_length,
                {"train": train_truncation, "eval": eval_truncation, **split_truncation},
                [collator],
            ),
            "image_use": image_use,
            "diagnostics": mechanism_diagnostics(
                image_use, {"refcoco": "accuracy"}, trainer.state.log_history,
                attention_loss_key="loss_attention_supervision",
            ),  # fmt: skip
        }
        if split_results:
            results["test_splits"] = split_results
        card = render_task_model_card(
            "referring_expression",
            model_family=model_args.model_family,
            model_id=ref_args.hub_model_id_for_card or training_args.hub_model_id,
            base_model=model_args.model_name_or_path or DEFAULT_BASE_MODEL,
            results=metrics_from_eval_results(results),
            baselines=results["baselines"],
            training=training_summary(trainer, source, len(eval_dataset)),
            config=trainer.model.config,
            synthetic_data=synthetic,
            dataset_name=None if synthetic else "user data" if data_args.train_file is not None else REAL_DATASET,
        )
        write_results(
            training_args.output_dir, results, card, push_to_hub=push_to_hub, training_args=training_args,
            commit_message="hf_vlalign referring expression fine-tuning",
        )  # fmt: skip
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_command("finetune_refcoco.py", main)
