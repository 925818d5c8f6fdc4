#!/usr/bin/env python
"""Fine-tune phrase grounding on Flickr30k Entities with VisualBERT's head (Li et al. 2019, sec. 4.4), either family.

Each phrase's mean token state queries every region's final state through one attention head; the scores are the
phrase's region logits, trained with KL divergence to the gold distribution over regions. The result is Recall@1/5/10
of the phrases (Plummer et al. 2015): a phrase is recalled at k when one of its k best-scored regions has IoU >= 0.5
with the union of its gold boxes (MERGED-BOXES), measured after training with
`hf_vlalign.metrics.phrase_grounding_recall`.

    accelerate launch examples/finetune_flickr_grounding.py                         # offline: synthetic scenes, MiniLM
    accelerate launch examples/finetune_flickr_grounding.py --model_family two_stream --supervision direct
    accelerate launch examples/finetune_flickr_grounding.py --dataset flickr30k_entities --data_dir F30K \
        --features STORE_DIR   # real data: the annotation folder and a region-feature store of its images
                               # (hf-vlalign convert-features makes STORE_DIR from BUTD / LXMERT features)
    accelerate launch examples/finetune_flickr_grounding.py --train_file train.jsonl --validation_file val.jsonl
        # your own photos: `caption` rows of the user-data format whose `phrases` give boxes (docs: "Your own data")

Writes to --output_dir: safetensors weights, config, tokenizer, README.md (model card with the results),
eval_results.json, and grounding_scores.png (one evaluation caption's phrase x region probabilities).
Every transformers `TrainingArguments` flag works too (--seed, --eval_steps, --resume_from_checkpoint, --push_to_hub,
--gradient_accumulation_steps, ...), and those of `PhraseGroundingTrainingArguments` (--head_learning_rate,
--distill_from, --ewc_weight, ...).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
from transformers import set_seed

from hf_vlalign import SingleStreamForPhraseGrounding, TwoStreamForPhraseGrounding
from hf_vlalign.alignment.boxes import box_iou
from hf_vlalign.analysis.attention_plots import plot_word_region_heatmap
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import (
    PhraseGroundingCollator,
    drop_overlong_rows,
    store_image_id,
)
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.evaluation.task_metrics import (
    IOU_THRESHOLD,
    grounded_phrases_only,
    phrase_region_scores,
    recall_at_1_any_box,
    recall_results,
)
from hf_vlalign.hub.model_card import metrics_from_eval_results, render_task_model_card
from hf_vlalign.metrics.phrase_grounding import union_box
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
    rename_text_columns,
    save_model,
    synthetic_scene_config,
    take_push_to_hub,
    training_callbacks,
    training_summary,
    truncation_results,
    write_results,
)
from hf_vlalign.trainers import PhraseGroundingTrainer, PhraseGroundingTrainingArguments
from hf_vlalign.utils.user_errors import run_command

logger = logging.getLogger(__name__)

TASK_CLASSES = {"single_stream": SingleStreamForPhraseGrounding, "two_stream": TwoStreamForPhraseGrounding}


@dataclass
class GroundingArguments:
    hub_model_id_for_card: str | None = field(default=None, metadata={"help": "model id shown in the card."})


def parse_args(
    argv: list[str],
) -> tuple[ModelArguments, DataArguments, GroundingArguments, PhraseGroundingTrainingArguments]:
    return parse_recipe_args(
        argv,
        (ModelArguments, DataArguments, GroundingArguments),
        PhraseGroundingTrainingArguments,
        output_dir="outputs/flickr_grounding",
        # the grounding head and the visual embeddings, which a text checkpoint lacks (--learning_rate for the rest;
        # pass the same value for one rate everywhere): on the synthetic scenes, recall@1 after 120 steps of 32
        # captions was 0.90 with 1e-3 here, 0.60 with 1e-4
        head_learning_rate=1e-3,
        # synthetic default: 2,000 training captions once, in batches of 16 (125 steps; < 4 min on 2 busy CPU cores)
        synthetic_train_images=400,
        synthetic_eval_images=100,
        num_train_epochs=1,
        learning_rate=1e-4,
        warmup_steps=20,
        weight_decay=0.01,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        save_steps=100,
    )


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_user_captions(
    args: DataArguments, training_args
) -> tuple[datasets.Dataset, datasets.Dataset, RegionFeatureStore, str, dict]:
    """(train rows, eval rows, store, description, region options) of `--train_file` / `--validation_file`: `caption`
    rows, read as Flickr30k Entities' `sentence` rows; each split needs grounded phrases."""
    data = load_user_splits(args, "caption", training_args)
    splits = []
    for name, rows in (("training", data.train), ("evaluation", data.eval)):
        if not any(boxes for phrases in rows["caption_phrase_boxes"] for boxes in phrases):
            raise ValueError(
                f"phrase grounding learns from grounded phrases, but no {name} row of {data.source} gives one: add "
                '`phrases` ([{"text": "a cat", "boxes": [[x1, y1, x2, y2]]}]) to the `caption` rows.'
            )
        splits.append(rename_text_columns(rows, "caption", "sentence"))
    return *splits, data.store, data.source, data.region_options


def load_splits(
    args: DataArguments, training_args
) -> tuple[datasets.Dataset, datasets.Dataset, RegionFeatureStore, str, dict | None]:
    """(train rows, eval rows, region-feature store, description of the data, the region options of features made
    from the images) of `--train_file`, Flickr30k Entities or, by default, of the synthetic scenes' captions (written
    in the Flickr30k Entities format and read by its builder)."""
    if args.train_file is not None:
        return load_user_captions(args, training_args)
    if args.dataset in (None, "synthetic_scenes"):
        config = synthetic_scene_config(args)
        store = synthetic_region_features(config=config)
        options = {"task": "captions", "config": config, "region_features": store}
        train = build_dataset("synthetic_scenes", None, args.train_split or "train", **options)
        evaluation = build_dataset("synthetic_scenes", None, args.eval_split or "val", **options)
        source = f"synthetic scenes, captions ({config.num_train_images} train / {config.num_val_images} val images)"
        return train, evaluation, store, source, None
    if args.dataset != "flickr30k_entities":
        raise ValueError(f"`--dataset` must be flickr30k_entities (or unset: synthetic scenes), got {args.dataset!r}.")
    if args.data_dir is None or args.features is None:
        raise ValueError(
            "`--dataset flickr30k_entities` needs `--data_dir` (the folder with Sentences/, Annotations/ and the split "
            f"lists) and `--features` (a region-feature store of its images), got --data_dir {args.data_dir!r} and "
            f"--features {args.features!r}."
        )
    store = RegionFeatureStore.load(args.features)
    options = {"region_features": store, "on_missing_image": "skip"}  # rows whose image has no features: counted, warned
    train = build_dataset("flickr30k_entities", args.data_dir, args.train_split or "train", **options)
    evaluation = build_dataset("flickr30k_entities", args.data_dir, args.eval_split or "val", **options)
    return train, evaluation, store, f"Flickr30k Entities ({args.data_dir})", None


def dataset_name(args: DataArguments) -> str | None:
    """The data set the model card names: None for the synthetic scenes."""
    if args.train_file is not None:
        return "user data"
    return None if args.dataset in (None, "synthetic_scenes") else "flickr30k_entities"


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def plot_grounding_scores(dataset, store, scores, path: Path, title: str) -> Path:
    """Phrase x region probabilities (softmax of the logits over the image's regions) of the first evaluation caption
    with the most phrases among the first 50; each phrase is labelled with its gold regions (IoU >= 0.5)."""
    index = max(range(min(50, len(dataset))), key=lambda i: len(scores[i]))
    row = dataset[index]
    boxes = store[store_image_id(store, row)]["boxes"]
    probabilities = torch.stack([phrase.softmax(-1) for phrase in scores[index]]).numpy()
    labels = []
    for (start, end), gold in zip(row["sentence_phrase_spans"], row["sentence_phrase_boxes"]):
        iou = box_iou(boxes, union_box(torch.tensor(gold))).squeeze(-1)  # MERGED-BOXES, as the recall
        hits = [f"r{j}" for j in (iou >= IOU_THRESHOLD).nonzero().flatten().tolist()]
        labels.append(f"{row['sentence'][start:end]} (gold: {', '.join(hits) or 'none'})")
    region_labels = [f"r{j}" for j in range(len(boxes))]
    return plot_word_region_heatmap(probabilities, labels, region_labels, path, title=f"{title}\n{row['sentence']}")


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, grounding_args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        train_rows, eval_rows, store, source, region_options = load_splits(data_args, training_args)
        truncation = {  # captions longer than max_text_length: counted before their cut phrases are left out
            split: drop_overlong_rows(rows, tokenizer, data_args.max_text_length, where=f"phrase grounding {split}")[1]
            for split, rows in (("train", train_rows), ("eval", eval_rows))
        }
        train_dataset, _ = grounded_phrases_only(train_rows, tokenizer, data_args.max_text_length)
        eval_dataset, eval_counts = grounded_phrases_only(eval_rows, tokenizer, data_args.max_text_length)
    train_dataset = first_rows(train_dataset, data_args.max_train_samples)
    eval_dataset = first_rows(eval_dataset, data_args.max_eval_samples)

    model = load_task_model(TASK_CLASSES, model_args, visual_feat_dim=store.feature_dim)
    collator = PhraseGroundingCollator(
        tokenizer, store, max_text_length=data_args.max_text_length, iou_threshold=IOU_THRESHOLD,
        return_probe_targets=True,  # `phrase_region_iou` for recall@1 during training (kept out of the model)
    )  # fmt: skip
    push_to_hub = take_push_to_hub(training_args)
    training_args.label_names = ["phrase_region_iou", "phrase_token_index"]  # what recall_at_1_any_box reads
    eval_subset = evaluation_subset(eval_dataset, data_args.eval_subset_size, training_args.seed)
    trainer = PhraseGroundingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_subset,
        data_collator=collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, store, region_options),
        compute_metrics=recall_at_1_any_box,
        # bounded evaluations, early stopping with --early_stopping_patience, learning_curve.json
        callbacks=training_callbacks(training_args, len(eval_subset), data_args.early_stopping_patience),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_model(trainer, training_args.output_dir)
    metrics = final_evaluation(trainer, eval_dataset)

    scores = phrase_region_scores(trainer.model, eval_dataset, collator, training_args.per_device_eval_batch_size)
    image_use = image_use_results(  # own image vs another image's regions: ~0 means the image is not read
        trainer.model, eval_dataset, collator, training_args.per_device_eval_batch_size, training_args.seed,
        data_args.image_use_examples,
    )  # fmt: skip
    results = {}
    if trainer.is_world_process_zero():
        results = {
            **recall_results(eval_dataset, store, scores),
            "recall@1_any_box": metrics["eval_recall@1_any_box"],
            "eval_loss": metrics["eval_loss"],
            **{key: metrics[key] for key in ("eval_loss_task", "eval_loss_attention_supervision") if key in metrics},
            "model_family": model_args.model_family,
            "supervision": model_args.supervision,
            "data": source,
            "eval_captions": len(eval_dataset),
            **{f"eval_{name}_left_out": eval_counts[name] for name in ("phrases_without_box", "phrases_truncated")},
            "truncation": truncation_results(data_args.max_text_length, truncation, [collator]),
            "image_use": image_use,
        }
        output_dir = Path(training_args.output_dir)
        plot_grounding_scores(
            eval_dataset, store, scores, output_dir / "grounding_scores.png",
            title=f"{model_args.model_family} phrase grounding, supervision: {model_args.supervision}",
        )  # fmt: skip
        card = render_task_model_card(
            "phrase_grounding",
            model_family=model_args.model_family,
            model_id=grounding_args.hub_model_id_for_card or training_args.hub_model_id,
            base_model=model_args.model_name_or_path or DEFAULT_BASE_MODEL,
            results=metrics_from_eval_results(results),
            baselines=results["baselines"],
            training={
                **training_summary(trainer, source, len(eval_dataset)),
                "head_learning_rate": training_args.head_learning_rate,
            },
            config=trainer.model.config,
            synthetic_data=data_args.dataset in (None, "synthetic_scenes") and data_args.train_file is None,
            dataset_name=dataset_name(data_args),
        )
        write_results(
            output_dir, results, card, push_to_hub=push_to_hub, training_args=training_args,
            commit_message="hf_vlalign phrase grounding fine-tuning",
        )  # fmt: skip
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    run_command("finetune_flickr_grounding.py", main)
