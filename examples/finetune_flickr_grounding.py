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

Writes to --output_dir: safetensors weights, config, tokenizer, README.md (model card with the results),
eval_results.json, and grounding_scores.png (one evaluation caption's phrase x region probabilities).
Every transformers `TrainingArguments` flag works too (--seed, --eval_steps, --resume_from_checkpoint, --push_to_hub,
--gradient_accumulation_steps, ...).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import torch
from transformers import AutoTokenizer, EvalPrediction, TrainingArguments, set_seed

from hf_vlalign import SingleStreamForPhraseGrounding, TwoStreamForPhraseGrounding, default_text_model_path
from hf_vlalign.alignment.boxes import box_iou
from hf_vlalign.analysis.plots import plot_word_region_heatmap
from hf_vlalign.data import load_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import (
    PhraseGroundingCollator,
    cut_word_pieces,
    drop_overlong_rows,
    span_is_cut,
    store_image_id,
)
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.hub.model_card import metrics_from_eval_results, render_task_model_card
from hf_vlalign.metrics import phrase_grounding_recall
from hf_vlalign.metrics.phrase_grounding import rank_boxes, union_box
from hf_vlalign.trainers import TaskTrainer
from hf_vlalign.trainers.recipes import (
    DEFAULT_BASE_MODEL,
    DataArguments,
    ModelArguments,
    evaluation_subset,
    final_evaluation,
    first_rows,
    image_use_results,
    load_task_model,
    parse_recipe_args,
    save_model,
    take_push_to_hub,
    training_summary,
    truncation_results,
    write_results,
)

logger = logging.getLogger(__name__)

TASK_CLASSES = {"single_stream": SingleStreamForPhraseGrounding, "two_stream": TwoStreamForPhraseGrounding}
KS = (1, 5, 10)
# the modules a text checkpoint lacks in both families, trained at --head_learning_rate
NEW_MODULES = ("visual_embeddings", "grounding_head")
IOU_THRESHOLD = 0.5
# the columns of a Flickr30k Entities row that hold one entry per phrase, filtered together
PHRASE_COLUMNS = (
    "sentence_phrase_spans",
    "sentence_phrase_boxes",
    "sentence_phrase_regions",
    "sentence_phrase_token_spans",
    "phrase_ids",
    "phrase_types",
    "phrase_nobndbox",
    "phrase_scene",
)


@dataclass
class GroundingArguments:
    head_learning_rate: float = field(
        default=1e-3,
        metadata={
            "help": "learning rate of the grounding head and the visual embeddings, which a text checkpoint lacks "
            "(--learning_rate for the rest; pass the same value for one rate everywhere). On the synthetic scenes, "
            "recall@1 after 120 steps of 32 captions was 0.90 with 1e-3 here, 0.60 with 1e-4."
        },
    )
    hub_model_id_for_card: str | None = field(default=None, metadata={"help": "model id shown in the card."})


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, GroundingArguments, TrainingArguments]:
    return parse_recipe_args(
        argv,
        (ModelArguments, DataArguments, GroundingArguments),
        output_dir="outputs/flickr_grounding",
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


def grounded_phrases_only(dataset: datasets.Dataset, tokenizer, max_text_length: int) -> tuple[datasets.Dataset, dict]:
    """Keeps, in every row, the phrases that can be grounded and scored: those with at least one gold box (Flickr30k's
    `notvisual` and `nobndbox` phrases have none) whose word pieces all fit in `max_text_length` (the collator drops
    the alignment of a phrase cut by the truncation, so the rows' phrases stay the collator's); rows left without a
    phrase are dropped. Returns the rows and the counts of what was left out (also logged)."""
    data = dataset.to_dict()
    offsets = tokenizer(data["sentence"], truncation=True, max_length=max_text_length, return_offsets_mapping=True)
    cuts = cut_word_pieces(tokenizer, [[sentence] for sentence in data["sentence"]], offsets, max_text_length)
    counts = {"phrases": 0, "phrases_without_box": 0, "phrases_truncated": 0, "rows_without_phrase": 0}
    columns = [name for name in PHRASE_COLUMNS if name in data]
    rows_kept = []
    for i, (spans, boxes) in enumerate(zip(data["sentence_phrase_spans"], data["sentence_phrase_boxes"])):
        tokens = [(start, end) for start, end in offsets["offset_mapping"][i] if end > start]
        keep = [
            bool(gold) and _has_token(span, tokens) and not span_is_cut(cuts[i][0], span)
            for span, gold in zip(spans, boxes)
        ]
        counts["phrases"] += len(spans)
        counts["phrases_without_box"] += sum(not gold for gold in boxes)
        counts["phrases_truncated"] += sum(bool(gold) and not k for gold, k in zip(boxes, keep))
        for name in columns:
            data[name][i] = [value for value, k in zip(data[name][i], keep) if k]
        if any(keep):
            rows_kept.append(i)
    counts["rows_without_phrase"] = len(dataset) - len(rows_kept)
    if not rows_kept:
        raise ValueError(
            f"none of the {len(dataset)} captions has a phrase with a gold box (`sentence_phrase_boxes`) within "
            f"max_text_length={max_text_length} tokens; phrase grounding needs such phrases."
        )
    if counts["phrases_without_box"] or counts["phrases_truncated"] or counts["rows_without_phrase"]:
        logger.warning(
            "Phrase grounding: of %d phrases, %d have no gold box and %d fall beyond max_text_length=%d; they are left "
            "out, and %d caption(s) without any phrase left are dropped.",
            counts["phrases"], counts["phrases_without_box"], counts["phrases_truncated"], max_text_length,
            counts["rows_without_phrase"],
        )  # fmt: skip
    kept = {name: [values[i] for i in rows_kept] for name, values in data.items()}
    return datasets.Dataset.from_dict(kept, features=dataset.features), counts


def _has_token(span: list[int], tokens: list[tuple[int, int]]) -> bool:
    """Whether a character span overlaps one of the (kept, non-special) tokens' character offsets."""
    return any(start < span[1] and end > span[0] for start, end in tokens)


def load_splits(args: DataArguments) -> tuple[datasets.Dataset, datasets.Dataset, RegionFeatureStore, str]:
    """(train rows, eval rows, region-feature store, description of the data) of Flickr30k Entities or, by default,
    of the synthetic scenes' captions (written in the Flickr30k Entities format and read by its builder)."""
    if args.dataset in (None, "synthetic_scenes"):
        config = args.synthetic_config()
        store = synthetic_region_features(config=config)
        options = {"task": "captions", "config": config, "features": store}
        train = load_dataset("synthetic_scenes", None, args.train_split or "train", **options)
        evaluation = load_dataset("synthetic_scenes", None, args.eval_split or "val", **options)
        source = f"synthetic scenes, captions ({config.num_train_images} train / {config.num_val_images} val images)"
        return train, evaluation, store, source
    if args.dataset != "flickr30k_entities":
        raise ValueError(f"`--dataset` must be flickr30k_entities (or unset: synthetic scenes), got {args.dataset!r}.")
    if args.data_dir is None or args.features is None:
        raise ValueError(
            "`--dataset flickr30k_entities` needs `--data_dir` (the folder with Sentences/, Annotations/ and the split "
            f"lists) and `--features` (a region-feature store of its images), got --data_dir {args.data_dir!r} and "
            f"--features {args.features!r}."
        )
    store = RegionFeatureStore.load(args.features)
    options = {"features": store, "on_missing_image": "skip"}  # rows whose image has no features: counted, warned
    train = load_dataset("flickr30k_entities", args.data_dir, args.train_split or "train", **options)
    evaluation = load_dataset("flickr30k_entities", args.data_dir, args.eval_split or "val", **options)
    return train, evaluation, store, f"Flickr30k Entities ({args.data_dir})"




# ----------------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------------


class PhraseGroundingTrainer(TaskTrainer):
    """`TaskTrainer` with a learning rate of its own for the new parts of the model (`head_learning_rate`), and whose
    evaluation predictions are, per phrase, the IoU of its top-scored region with the gold boxes (B, P) and whose
    labels are the phrases' token index (B, P; < 0 on padding phrases): both concatenate and gather across batches
    and processes even when the number of regions differs between images."""

    def __init__(self, *args, head_learning_rate: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if head_learning_rate is not None and not head_learning_rate > 0:
            raise ValueError(f"`--head_learning_rate` must be > 0 (or None), got {head_learning_rate!r}.")
        self.head_learning_rate = head_learning_rate

    def create_optimizer(self, model=None):
        """Trainer's optimizer, with the parameters of `NEW_MODULES` moved to groups at `head_learning_rate` (before
        any step, so no optimizer state exists yet; the scheduler, made afterwards, scales every group alike)."""
        optimizer = super().create_optimizer(model)
        if self.head_learning_rate is None:
            return optimizer
        names = {id(parameter): name for name, parameter in (model or self.model).named_parameters()}
        for group in list(optimizer.param_groups):
            new = [p for p in group["params"] if any(f"{module}." in names.get(id(p), "") for module in NEW_MODULES)]
            if new:
                group["params"] = [p for p in group["params"] if all(p is not q for q in new)]
                optimizer.add_param_group({**group, "params": new, "lr": self.head_learning_rate})
        return optimizer

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if logits is None or labels is None:
            return loss, logits, labels
        region_iou, token_index = labels
        top1_iou = region_iou.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)
        return loss, top1_iou, token_index


def recall_at_1_any_box(prediction: EvalPrediction) -> dict[str, float]:
    """Recall@1 during training, from the collator's `phrase_region_iou` (each region's best IoU with *any* of the
    phrase's gold boxes: MDETR's ANY-BOX protocol); the same as MERGED-BOXES for phrases with one gold box."""
    top1_iou, token_index = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    real = token_index >= 0
    return {"recall@1_any_box": float((top1_iou[real] >= IOU_THRESHOLD).mean()) if real.any() else 0.0}


@torch.no_grad()
def phrase_region_scores(model, dataset: datasets.Dataset, collator, batch_size: int) -> list[list[torch.Tensor]]:
    """The grounding logits of every phrase of every row of `dataset`, in order: per row, per phrase, a (R_image,)
    tensor over the real regions of its image. Every process runs it (sharded models need all of them)."""
    model.eval()
    device = next(model.parameters()).device
    scores = []
    for start in range(0, len(dataset), batch_size):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        batch = collator(rows)
        inputs = {key: value.to(device) for key, value in batch.items() if key not in TaskTrainer.non_model_keys}
        logits = model(**inputs).logits.float().cpu()
        regions = batch["visual_attention_mask"].sum(-1).tolist()
        for i, row in enumerate(rows):
            scores.append([logits[i, p, : regions[i]] for p in range(len(row["sentence_phrase_spans"]))])
    return scores


def recall_results(dataset: datasets.Dataset, store: RegionFeatureStore, scores: list[list[torch.Tensor]]) -> dict:
    """Recall@k (MERGED-BOXES) of the model's ranking, of the detector-confidence baseline (Li et al. 2020: every phrase
    gets the image's regions by decreasing detection confidence) and the upper bound (any region of the image at
    IoU >= 0.5), each computed with `phrase_grounding_recall` on pixel boxes."""
    ranked, by_confidence, every_region, gold = [], [], [], []
    without_confidence = 0
    for row, row_scores in zip(dataset, scores):
        image = store.image_at(store.row_of(store_image_id(store, row)), without=("features",))
        confidence = image["object_conf"]
        if confidence is None:  # ties: the store's order of the regions
            without_confidence += 1
            confidence = torch.ones(len(image["boxes"]))
        for p, phrase_scores in enumerate(row_scores):
            ranked.append(rank_boxes(phrase_scores, image["boxes"], k=max(KS)))
            by_confidence.append(rank_boxes(confidence, image["boxes"], k=max(KS)))
            every_region.append(image["boxes"])
            gold.append(row["sentence_phrase_boxes"][p])
    if without_confidence:
        logger.warning(
            "%d caption(s) have no detection confidence in the region-feature store: the baseline ranks their regions "
            "in the store's order.",
            without_confidence,
        )
    model = phrase_grounding_recall(ranked, gold, KS, IOU_THRESHOLD)
    baseline = phrase_grounding_recall(by_confidence, gold, KS, IOU_THRESHOLD)
    most_regions = max(len(boxes) for boxes in every_region)
    upper_bound = phrase_grounding_recall(every_region, gold, (most_regions,), IOU_THRESHOLD)[f"recall@{most_regions}"]
    results = {f"recall@{k}_merged_boxes": model[f"recall@{k}"] for k in KS}
    results.update({f"baseline_confidence_recall@{k}_merged_boxes": baseline[f"recall@{k}"] for k in KS})
    results["upper_bound_merged_boxes"] = upper_bound
    results["num_phrases"] = model["num_phrases"]
    return results


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
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path or default_text_model_path())
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        train_rows, eval_rows, store, source = load_splits(data_args)
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
    trainer = PhraseGroundingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=evaluation_subset(eval_dataset, data_args.eval_subset_size, training_args.seed),
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=recall_at_1_any_box,
        label_names=["phrase_region_iou", "phrase_token_index"],
        head_learning_rate=grounding_args.head_learning_rate,
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
            **{key: metrics[key] for key in ("eval_loss_task", "eval_loss_att") if key in metrics},
            "model_family": model_args.model_family,
            "supervision": model_args.supervision,
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
            training={
                **training_summary(trainer, source, len(eval_dataset)),
                "head_learning_rate": grounding_args.head_learning_rate,
            },
            config=trainer.model.config,
            synthetic_data=data_args.dataset in (None, "synthetic_scenes"),
            dataset_name=None if data_args.dataset in (None, "synthetic_scenes") else "flickr30k_entities",
        )
        write_results(
            output_dir, results, card, push_to_hub=push_to_hub, training_args=training_args,
            commit_message="hf_vlalign phrase grounding fine-tuning",
        )  # fmt: skip
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
