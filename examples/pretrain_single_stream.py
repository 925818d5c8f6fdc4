#!/usr/bin/env python
"""Pre-train a single-stream model the way VisualBERT does (Li et al. 2019, sec. 3.3): masked language modelling with
the image and sentence-image prediction, optionally with VL-BERT's masked regions (Su et al. 2020).

    accelerate launch examples/pretrain_single_stream.py          # offline: the synthetic scenes' captions, MiniLM
    accelerate launch examples/pretrain_single_stream.py --region_mask_probability 0.15    # + masked RoI modelling
    accelerate launch examples/pretrain_single_stream.py --no_sentence_image_prediction    # task-specific: MLM only
    accelerate launch examples/pretrain_single_stream.py --dataset coco_captions --data_dir KARPATHY --features STORE_DIR
    accelerate launch examples/pretrain_single_stream.py --dataset flickr30k_entities --data_dir F30K --features STORE_DIR
    accelerate launch examples/pretrain_single_stream.py --train_file captions.jsonl --validation_file val.jsonl
        # your own photos: `caption` rows of the user-data format; sentence-image prediction pairs two captions of
        # an image, so give each image at least two different captions (`phrases` give attention supervision)

(`hf-vlalign convert-features` makes STORE_DIR; `--data_dir` holds `dataset_coco.json`, or Flickr30k Entities'
split lists, `Sentences/` and `Annotations/`.)

Task-agnostic pre-training (the default, `--sentence_image_prediction`): each caption c1 of an image is paired as
`[CLS] c1 [SEP] c2 [SEP]` with c2 another caption of the same image (label 0) or, with probability
`--random_caption_probability`, a caption of a random other image of the split (label 1), and the model predicts which
from [CLS]; words of both captions are masked BERT's way (`--mlm_probability`). Task-specific pre-training
(`--no_sentence_image_prediction`): the caption alone, masked words only. `--region_mask_probability` > 0 zeroes that
fraction of the regions, which the model regresses and, with `--num_object_labels` > 0 (default: the store's detector
classes), classifies. Grounded phrases of c1 give `word_region_alignment`, so `--supervision direct|semi_direct|indirect`
adds attention supervision.

Metrics, every `--eval_steps` and at the end, on the evaluation split collated the same way at every evaluation (words
masked and second captions drawn with a seed of their own, `eval_collation_seed`): `mlm_accuracy` (masked words
predicted exactly; `mlm_most_frequent_token_accuracy` is always predicting the most frequent masked word),
`sentence_image_accuracy` (chance: 0.5) and every loss component.

Texts longer than --max_text_length word pieces (a caption pair together) are truncated, never refused: grounded
phrases cut lose their alignment, and the counts are reported under `truncation` in `eval_results.json`.

Writes to --output_dir: safetensors weights, config, tokenizer, `eval_results.json`, README.md (model card),
`training_args.json` and TensorBoard logs under runs/ (when tensorboard is installed). The folder is a starting point
for the downstream tasks: `SingleStreamForQuestionAnswering.from_pretrained(output_dir, num_qa_labels=N)` (or any
`SingleStreamFor*`, `AutoModel`) keeps the encoder and initialises the new head, as does `--model_name_or_path
output_dir` in the fine-tuning examples.
Every transformers `TrainingArguments` flag works too (--seed, --max_steps, --eval_steps, --push_to_hub,
--resume_from_checkpoint, ...), and those of `SingleStreamPretrainingTrainingArguments` (--distill_from, --ewc_weight,
...).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import datasets
import pyarrow.compute as pc
from transformers import set_seed

from hf_vlalign import SingleStreamForPreTraining
from hf_vlalign.data import RegionFeatureStore, SingleStreamPretrainingCollator, build_dataset, group_captions_by_image
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.evaluation.baselines import compare_with_baselines, pretraining_baselines
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.task_metrics import predictions_for_metrics, pretraining_metrics
from hf_vlalign.hub.model_card import render_task_model_card
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
from hf_vlalign.trainers import SingleStreamPretrainingTrainer, SingleStreamPretrainingTrainingArguments
from hf_vlalign.utils.user_errors import run_command

logger = logging.getLogger(__name__)

DATASETS = ("synthetic_scenes", "flickr30k_entities", "coco_captions")
TEXT_COLUMNS = {"synthetic_scenes": "sentence", "flickr30k_entities": "sentence", "coco_captions": "caption"}
USER_DATA = "user data"


@dataclass
class SingleStreamPretrainingArguments:
    sentence_image_prediction: bool = field(
        default=True,
        metadata={"help": "caption pairs + sentence-image prediction (task-agnostic); --no_sentence_image_prediction: "
                  "the caption alone, masked words only (task-specific pre-training)."},
    )  # fmt: skip
    random_caption_probability: float = field(
        default=0.5, metadata={"help": "probability that the second caption comes from a random other image."}
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "BERT's masking probability of each word."})
    region_mask_probability: float = field(
        default=0.0, metadata={"help": "probability of masking each region (VL-BERT); 0: VisualBERT, no masked regions."}
    )
    num_object_labels: int | None = field(
        default=None,
        metadata={"help": "detector classes of the masked-region classifier (default, with masked regions: 1 + the "
                  "largest class id of the feature store; 0: no classifier)."},
    )  # fmt: skip
    counts_from_zero: ClassVar[tuple[str, ...]] = ("num_object_labels",)  # 0 is a count here (no classifier)
    text_column: str | None = field(
        default=None, metadata={"help": "the caption column (default: 'sentence', 'caption' for coco_captions)."}
    )


def parse_args(
    argv: list[str],
) -> tuple[ModelArguments, DataArguments, SingleStreamPretrainingArguments, SingleStreamPretrainingTrainingArguments]:
    return parse_recipe_args(
        argv,
        (ModelArguments, DataArguments, SingleStreamPretrainingArguments),
        SingleStreamPretrainingTrainingArguments,
        data_source_flags=("text_column",),  # the user format's captions are its `caption` column
        output_dir="outputs/single_stream_pretraining",
        max_steps=100,  # about 5 minutes on 2 CPU cores; VisualBERT pre-trains for 10 epochs of COCO
        learning_rate=2e-4,  # the new visual embeddings and heads learn slowly at BERT's usual 5e-5
        warmup_steps=10,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        save_steps=50,
        max_text_length=64,  # two captions
        synthetic_eval_images=40,
    )


def check_arguments(model_args: ModelArguments, task_args: SingleStreamPretrainingArguments) -> None:
    if model_args.model_family != "single_stream":
        raise ValueError(
            f"`--model_family {model_args.model_family}`: this example pre-trains single-stream models (VisualBERT); "
            "pre-train a two-stream (LXMERT-style) model with examples/pretrain_two_stream.py."
        )
    for name in ("random_caption_probability", "mlm_probability", "region_mask_probability"):
        value = getattr(task_args, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"`--{name}` must be a probability in [0, 1], got {value}.")
    if task_args.mlm_probability == 0 and not task_args.sentence_image_prediction:
        raise ValueError("`--mlm_probability 0` with `--no_sentence_image_prediction` leaves nothing to learn.")


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CaptionData:
    """The caption rows of both splits joined to their region features, and each split's captions by image."""

    train: datasets.Dataset
    eval: datasets.Dataset
    store: RegionFeatureStore
    train_captions: dict[str, list[str]]
    eval_captions: dict[str, list[str]]
    dataset: str
    text_column: str
    # `--train_file`: what the data is, and the `extract_region_features` options of its features
    source: str | None = None
    region_options: dict | None = None


def check_data_arguments(data_args: DataArguments) -> str:
    """The dataset name (synthetic_scenes when --dataset is not given), after checking the arguments it needs."""
    dataset = data_args.dataset or "synthetic_scenes"
    if dataset not in DATASETS:
        raise ValueError(f"`--dataset` must be one of {DATASETS[1:]} (or absent: synthetic scenes), got {dataset!r}.")
    if dataset == "synthetic_scenes":
        given = [name for name in ("data_dir", "features") if getattr(data_args, name) is not None]
        if given:
            raise ValueError(
                f"`--{given[0]}` reads a real dataset: pass `--dataset flickr30k_entities` or `--dataset coco_captions` "
                "with it (the synthetic scenes are generated into $HF_VLALIGN_CACHE)."
            )
    elif data_args.data_dir is None or data_args.features is None:
        raise ValueError(
            f"`--dataset {dataset}` needs `--data_dir` (its published files) and `--features` (a RegionFeatureStore "
            f"folder of its images), got data_dir={data_args.data_dir!r}, features={data_args.features!r}."
        )
    return dataset


def load_user_captions(data_args: DataArguments, task_args, training_args) -> CaptionData:
    """The `caption` rows of `--train_file` / `--validation_file` (several rows of an image: its captions)."""
    user = load_user_splits(data_args, "caption", training_args)
    splits = {}
    roles = (("train", user.train, data_args.max_train_samples), ("eval", user.eval, data_args.max_eval_samples))
    for role, rows, count in roles:
        rows, captions = pairable_rows(rows, "caption", f"{USER_DATA} {role}", task_args.sentence_image_prediction)
        splits[role] = (first_rows(rows, count), captions)
    (train, train_captions), (evaluation, eval_captions) = splits["train"], splits["eval"]
    return CaptionData(
        train, evaluation, user.store, train_captions, eval_captions, USER_DATA, "caption", user.source,
        user.region_options,
    )  # fmt: skip


def load_caption_data(
    data_args: DataArguments, task_args: SingleStreamPretrainingArguments, training_args=None
) -> CaptionData:
    """Train and evaluation caption rows of `--train_file` (which needs `training_args`), `--dataset` or, by default,
    the synthetic scenes' captions."""
    if data_args.train_file is not None:
        return load_user_captions(data_args, task_args, training_args)
    name = check_data_arguments(data_args)
    text_column = task_args.text_column or TEXT_COLUMNS[name]
    train_split, eval_split = data_args.train_split or "train", data_args.eval_split or "val"
    if name == "synthetic_scenes":
        config = synthetic_scene_config(data_args)
        store = synthetic_region_features(config=config)

        def load(split: str) -> datasets.Dataset:
            return build_dataset(name, None, split, task="captions", config=config, region_features=store)

    else:
        store = RegionFeatureStore.load(data_args.features)

        def load(split: str) -> datasets.Dataset:
            return build_dataset(name, data_args.data_dir, split, region_features=store, on_missing_image="skip")

    splits = {}
    roles = (("train", train_split, data_args.max_train_samples), ("eval", eval_split, data_args.max_eval_samples))
    for role, split, count in roles:
        rows = load(split)
        if text_column not in rows.column_names:
            raise ValueError(f"`--text_column` {text_column!r} is not a column of {name} ({rows.column_names}).")
        rows, captions = pairable_rows(rows, text_column, f"{name} {split}", task_args.sentence_image_prediction)
        splits[role] = (first_rows(rows, count), captions)  # second captions come from the whole split
    (train, train_captions), (evaluation, eval_captions) = splits["train"], splits["eval"]
    return CaptionData(train, evaluation, store, train_captions, eval_captions, name, text_column)


def pairable_rows(
    rows: datasets.Dataset, text_column: str, where: str, paired: bool
) -> tuple[datasets.Dataset, dict[str, list[str]]]:
    """The rows whose image has another, different caption (a same-image pair needs one), and the captions by image;
    the other rows are counted in a warning. Without pairs, every row and no grouping."""
    if not paired:
        return rows, {}
    captions = group_captions_by_image(rows, text_column)
    kept_images = {image_id for image_id, texts in captions.items() if len(set(texts)) >= 2}
    if len(kept_images) < len(captions):
        kept = [index for index, image_id in enumerate(rows["image_id"]) if str(image_id) in kept_images]
        logger.warning(
            "%s: %d of %d rows dropped: their image has no second, different caption for a same-image pair.",
            where, len(rows) - len(kept), len(rows),
        )  # fmt: skip
        rows = rows.select(kept)
    if len(kept_images) < 2:
        raise ValueError(
            f"{where}: sentence-image prediction needs at least two images with two different captions each, got "
            f"{len(kept_images)}."
        )
    return rows, {image_id: texts for image_id, texts in captions.items() if image_id in kept_images}


def detector_num_classes(store: RegionFeatureStore) -> int:
    """1 + the largest detector class id of the store's regions (the synthetic scenes: 6 shapes); 0 when it has none."""
    table = store.dataset.data.table if hasattr(store.dataset.data, "table") else store.dataset.data
    largest = pc.max(pc.list_flatten(table.column("object_ids"))).as_py()
    return 0 if largest is None or largest < 0 else int(largest) + 1


def num_object_labels(task_args: SingleStreamPretrainingArguments, store: RegionFeatureStore) -> int:
    if task_args.num_object_labels is not None:
        return task_args.num_object_labels
    return detector_num_classes(store) if task_args.region_mask_probability > 0 else 0


def make_collator(
    data: CaptionData, tokenizer, task_args, max_text_length: int, *, train: bool, num_classes: int, seed: int | None
) -> SingleStreamPretrainingCollator:
    """The collator of the training (unseeded: the trainer seeds each batch) or evaluation split."""
    return SingleStreamPretrainingCollator(
        tokenizer=tokenizer,
        region_features=data.store,
        text_column=data.text_column,
        captions_by_image=data.train_captions if train else data.eval_captions,
        paired=task_args.sentence_image_prediction,
        random_caption_probability=task_args.random_caption_probability,
        mlm_probability=task_args.mlm_probability,
        region_mask_probability=task_args.region_mask_probability,
        return_object_labels=num_classes > 0,
        max_text_length=max_text_length,
        seed=seed,
    )


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def data_source(data: CaptionData, data_args: DataArguments) -> str:
    if data.source is not None:
        return data.source
    if data.dataset == "synthetic_scenes":
        return (
            f"synthetic scenes' captions ({data_args.synthetic_train_images} train / {data_args.synthetic_eval_images} "
            f"eval images, seed {data_args.synthetic_seed})"
        )
    return f"{data.dataset} ({data_args.data_dir})"


def write_report(
    trainer, metrics, data, model_args, data_args, task_args, training_args, push_to_hub, truncation, image_use
) -> dict:
    """`eval_results.json` and the model card in --output_dir, then the push (main process)."""
    measured = {key[len("eval_") :]: value for key, value in metrics.items() if _is_metric(key)}
    results = {
        **measured,
        "dataset": data.dataset,
        "data": data_source(data, data_args),
        "sentence_image_prediction": task_args.sentence_image_prediction,
        "random_caption_probability": task_args.random_caption_probability,
        "mlm_probability": task_args.mlm_probability,
        "region_mask_probability": task_args.region_mask_probability,
        "eval_collation_seed": training_args.seed,
        "supervision": model_args.supervision,
        "eval_examples": len(data.eval),
        "truncation": truncation,
        "image_use": image_use,
        # the pre-training losses with the own image vs another image's (minus the loss), and any supervision's loss
        "diagnostics": mechanism_diagnostics(
            image_use, {"pretraining": "loss"}, trainer.state.log_history,
            attention_loss_key="loss_attention_supervision",
        ),  # fmt: skip
    }
    results["baselines"] = compare_with_baselines(results, pretraining_baselines(results))
    objectives = ["masked words"]
    if task_args.sentence_image_prediction:
        objectives.append(f"sentence-image prediction (random second caption: {task_args.random_caption_probability})")
    if task_args.region_mask_probability:
        objectives.append(f"masked regions ({task_args.region_mask_probability})")
    training = {
        **training_summary(trainer, data_source(data, data_args), len(data.eval)),
        "objectives": " + ".join(objectives),
        "mlm_probability": task_args.mlm_probability,
        "supervision": model_args.supervision,
    }
    card = render_task_model_card(
        "pretraining",
        model_family="single_stream",
        model_id=training_args.hub_model_id,
        base_model=model_args.model_name_or_path or DEFAULT_BASE_MODEL,
        results={key: value for key, value in measured.items() if key != "num_masked_words"},
        baselines=results["baselines"],
        training=training,
        config=trainer.model.config,
        synthetic_data=data.dataset == "synthetic_scenes",
        dataset_name=None if data.dataset == "synthetic_scenes" else data.dataset,  # shown as its paper names it
    )
    write_results(
        training_args.output_dir,
        results,
        card,
        push_to_hub=push_to_hub,
        training_args=training_args,
        commit_message=f"hf_vlalign single-stream pre-training ({data.dataset})",
    )
    return results


def _is_metric(key: str) -> bool:
    return key.startswith("eval_") and key not in ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_epoch")


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, task_args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    check_arguments(model_args, task_args)
    set_seed(training_args.seed)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        data = load_caption_data(data_args, task_args, training_args)
    num_classes = num_object_labels(task_args, data.store)
    model = load_task_model(
        {"single_stream": SingleStreamForPreTraining}, model_args, data.store.feature_dim, num_object_labels=num_classes
    )
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    collate = {"num_classes": num_classes, "max_text_length": data_args.max_text_length}
    # the evaluation batches are masked and paired the same way at every evaluation (and for a reloaded model)
    eval_collator = make_collator(data, tokenizer, task_args, train=False, seed=training_args.seed, **collate)
    train_collator = make_collator(data, tokenizer, task_args, train=True, seed=None, **collate)
    # long captions are truncated (no caption pre-training row needs a span): counted here, and by the collators
    data.train, train_truncation = train_collator.drop_overlong_rows(data.train, f"{data.dataset} train")
    data.eval, eval_truncation = eval_collator.drop_overlong_rows(data.eval, f"{data.dataset} eval")
    # the metrics read the masked-word and sentence-image labels; the loss needs them to be listed too
    training_args.label_names = ["labels", "sentence_image_labels"] if task_args.sentence_image_prediction else ["labels"]
    push_to_hub = take_push_to_hub(training_args)
    eval_subset = evaluation_subset(data.eval, data_args.eval_subset_size, training_args.seed)
    trainer = SingleStreamPretrainingTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        eval_dataset=eval_subset,
        data_collator=train_collator,
        eval_data_collator=eval_collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, data.store, data.region_options),
        compute_metrics=pretraining_metrics(task_args.sentence_image_prediction),
        preprocess_logits_for_metrics=predictions_for_metrics,
        # bounded evaluations, early stopping with --early_stopping_patience, learning_curve.json
        callbacks=training_callbacks(training_args, len(eval_subset), data_args.early_stopping_patience),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_model(trainer, training_args.output_dir)
    metrics = final_evaluation(trainer, data.eval)
    # own image vs another image's regions, the same words masked in both: ~0 means the image is not read
    image_use = image_use_results(
        trainer.model, data.eval, eval_collator, training_args.per_device_eval_batch_size, training_args.seed,
        data_args.image_use_examples,
    )  # fmt: skip
    results = {}
    if trainer.is_world_process_zero():
        splits = {"train": train_truncation, "eval": eval_truncation}
        truncation = truncation_results(data_args.max_text_length, splits, [train_collator, eval_collator])
        results = write_report(
            trainer, metrics, data, model_args, data_args, task_args, training_args, push_to_hub, truncation, image_use
        )
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_command("pretrain_single_stream.py", main)
