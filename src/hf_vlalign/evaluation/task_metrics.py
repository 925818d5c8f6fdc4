"""The evaluation of the task examples (`examples/finetune_*.py`), shared with `hf-vlalign evaluate`: for each task
the `compute_metrics` (and `preprocess_logits_for_metrics`) of `Trainer.evaluate`, or a pass over the rows scored
afterwards (`chosen_regions` -> `referring_results`, `phrase_region_scores` -> `recall_results`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import datasets
import numpy as np
import torch
from transformers import EvalPrediction

from ..alignment.boxes import box_iou
from ..data.collators import cut_word_pieces, span_is_cut, store_image_id
from ..data.feature_store import RegionFeatureStore
from ..metrics import gqa_scores, nlvr2_scores, phrase_grounding_recall, referring_expression_accuracy, vqa_accuracy
from ..metrics.grounding import IOU_THRESHOLD, largest_region_accuracy, largest_region_recall
from ..metrics.phrase_grounding import rank_boxes
from .baselines import compare_with_baselines, phrase_grounding_baselines, referring_baselines
from .inference import inference_batches

logger = logging.getLogger(__name__)

KS = (1, 5, 10)  # recall@k of phrase grounding
GQA_SCRIPT_METRICS = ("accuracy", "binary", "open", "consistency", "distribution")
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


# Question answering


def predicted_answer_ids(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`preprocess_logits_for_metrics`: only the best answer of each question is gathered, not every answer's score."""
    return logits.argmax(dim=-1)


def answer_metrics(
    answer_vocab: dict[str, int], eval_questions: dict[str, dict] | None, rows: datasets.Dataset
) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics` of the evaluation rows `rows` (the split, or the sample `--eval_subset_size` draws):
    `accuracy` and the official GQA or VQA metrics. The predictions come in the order of `rows` (Trainer's evaluation
    is sequential), whose answers the official metrics read; `eval_questions` are GQA's question records by id (the
    script reads their types; None for VQA v2)."""
    answers = sorted(answer_vocab, key=answer_vocab.get)

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predicted = np.asarray(prediction.predictions).reshape(-1)
        labels = np.asarray(prediction.label_ids)
        if len(predicted) != len(rows):
            raise ValueError(f"got {len(predicted)} predictions for the {len(rows)} evaluation questions.")
        predicted_answers = [answers[index] for index in predicted]
        if labels.ndim == 2:  # VQA v2's soft scores: the score of the predicted answer
            metrics = {"accuracy": float(labels[np.arange(len(predicted)), predicted].mean())}
            answer_types = rows["answer_type"]
            typed = all(isinstance(answer_type, str) and answer_type for answer_type in answer_types)
            official = vqa_accuracy(predicted_answers, rows["answers"], answer_types if typed else None)
            metrics["vqa_accuracy"] = official["accuracy"]
            for answer_type, value in official.get("per_answer_type", {}).items():
                metrics[f"vqa_accuracy_{answer_type.replace('/', '_')}"] = value
            return metrics
        metrics = {"accuracy": float((predicted == labels).mean())}  # answers outside the vocabulary count as wrong
        # the script's metrics over the evaluated questions (a sample of the split, or what truncation left)
        questions = {qid: eval_questions[qid] for qid in rows["question_id"]}
        official = gqa_scores(dict(zip(rows["question_id"], predicted_answers)), questions)
        metrics.update({f"gqa_{name}": official[name] for name in GQA_SCRIPT_METRICS if official[name] is not None})
        return metrics

    return compute_metrics


# NLVR2


def predicted_truth(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`preprocess_logits_for_metrics`: the predicted truth value (score > 0, i.e. probability > 0.5) as 0 / 1."""
    return (logits > 0).long()


def reasoning_metrics(eval_rows: datasets.Dataset) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics` of the evaluation split: NLVR2's `accuracy` and `consistency` (`nlvr2_scores`). The
    predictions come in the order of `eval_rows` (Trainer's evaluation is sequential), whose identifiers group the
    examples by sentence."""
    identifiers = eval_rows["identifier"]

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predicted = np.asarray(prediction.predictions).reshape(-1)
        labels = np.asarray(prediction.label_ids).reshape(-1)
        if len(predicted) != len(identifiers):
            raise ValueError(f"got {len(predicted)} predictions for the {len(identifiers)} evaluation examples.")
        scores = nlvr2_scores(predicted.tolist(), labels.tolist(), identifiers)
        return {"accuracy": scores["accuracy"], "consistency": scores["consistency"]}

    return compute_metrics


# Referring expressions


@torch.no_grad()
def chosen_regions(model, dataset: datasets.Dataset, collator, batch_size: int) -> list[int]:
    """The index of the best-scored region of every row of `dataset`, in order. Every process runs it (sharded models
    need all of them)."""
    model.eval()
    choices = []
    for batch in inference_batches(model, dataset, collator, batch_size):
        choices += model(**batch.inputs).logits.argmax(-1).tolist()  # padding regions hold the dtype's minimum
    return choices


def referring_results(dataset, store: RegionFeatureStore, choices: list[int]) -> dict:
    """Accuracy (IoU >= 0.5 with the referred box, pixels) of the chosen regions, of the detector-confidence baseline
    (when the store has confidences), of the upper bound (the region of best IoU), of a uniformly drawn region
    (`chance_accuracy`) and of the image's largest region (the text-blind baseline `baselines` compares with)."""
    chosen, confident, best, gold, chance, regions = [], [], [], [], [], []
    with_confidence = True
    for row, choice in zip(dataset, choices, strict=True):
        image = store[store_image_id(store, row)]  # the row's image, whatever the store calls it
        boxes, box = image["boxes"], row["expression_phrase_boxes"][0][0]  # phrases -> boxes -> x1, y1, x2, y2
        iou = box_iou(boxes, torch.tensor([box], dtype=boxes.dtype)).squeeze(-1)
        chosen.append(boxes[choice].tolist())
        regions.append(boxes)
        best.append(boxes[int(iou.argmax())].tolist())
        gold.append(box)
        chance.append(float((iou >= IOU_THRESHOLD).double().mean()))
        if image["object_conf"] is None:
            with_confidence = False
        else:
            confident.append(boxes[int(torch.as_tensor(image["object_conf"]).argmax())].tolist())
    model = referring_expression_accuracy(chosen, gold, IOU_THRESHOLD)
    results = {
        "accuracy": model["accuracy"],
        "upper_bound_accuracy": referring_expression_accuracy(best, gold, IOU_THRESHOLD)["accuracy"],
        "chance_accuracy": float(np.mean(chance)),
        "largest_region_accuracy": largest_region_accuracy(regions, gold, IOU_THRESHOLD),
        "num_expressions": model["num_expressions"],
    }
    if with_confidence:
        baseline = referring_expression_accuracy(confident, gold, IOU_THRESHOLD)
        results["baseline_confidence_accuracy"] = baseline["accuracy"]
    else:
        logger.warning("The region-feature store has no detection confidences: no confidence baseline.")
    results["baselines"] = compare_with_baselines(results, referring_baselines(results))
    return results


def accuracy_from_region_iou(prediction: EvalPrediction) -> dict[str, float]:
    """`compute_metrics` during training, from the collator's `target_region_iou` (float32 IoUs with the referred box)
    as `ReferringExpressionTrainer` predicts them: the accuracy, and the share of expressions some region reaches (the
    upper bound)."""
    top1_iou, best_iou = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    return {
        "accuracy": float((top1_iou >= IOU_THRESHOLD).mean()),
        "upper_bound": float((best_iou >= IOU_THRESHOLD).mean()),
    }


# Phrase grounding


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
            bool(gold)
            and any(start < span[1] and end > span[0] for start, end in tokens)  # a kept token overlaps the span
            and not span_is_cut(cuts[i][0], span)
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


@torch.no_grad()
def phrase_region_scores(model, dataset: datasets.Dataset, collator, batch_size: int) -> list[list[torch.Tensor]]:
    """The grounding logits of every phrase of every row of `dataset`, in order: per row, per phrase, a (R_image,)
    tensor over the real regions of its image. Every process runs it (sharded models need all of them)."""
    model.eval()
    scores = []
    for batch in inference_batches(model, dataset, collator, batch_size):
        logits = model(**batch.inputs).logits.float().cpu()
        regions = batch.batch["visual_attention_mask"].sum(-1).tolist()
        for i, row in enumerate(batch.rows):
            scores.append([logits[i, p, : regions[i]] for p in range(len(row["sentence_phrase_spans"]))])
    return scores


def recall_results(dataset: datasets.Dataset, store: RegionFeatureStore, scores: list[list[torch.Tensor]]) -> dict:
    """Recall@k (MERGED-BOXES, pixel boxes) of the model's ranking, of the detector-confidence ranking (Li et al.
    2020), of the regions by decreasing area (the baseline `baselines` compares with) and the upper bound (any region
    of the image at IoU >= 0.5)."""
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
    largest = largest_region_recall(every_region, gold, KS, IOU_THRESHOLD)
    results.update({f"largest_region_recall@{k}_merged_boxes": largest[k] for k in KS})
    results["upper_bound_merged_boxes"] = upper_bound
    results["num_phrases"] = model["num_phrases"]
    results["baselines"] = compare_with_baselines(results, phrase_grounding_baselines(results, KS))
    return results


def recall_at_1_any_box(prediction: EvalPrediction) -> dict[str, float]:
    """`compute_metrics` during training: recall@1 from the collator's `phrase_region_iou` (each region's best IoU with
    *any* of the phrase's gold boxes: MDETR's ANY-BOX protocol) as `PhraseGroundingTrainer` predicts it; the same as
    MERGED-BOXES for phrases with one gold box."""
    top1_iou, token_index = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    real = token_index >= 0
    return {"recall@1_any_box": float((top1_iou[real] >= IOU_THRESHOLD).mean()) if real.any() else 0.0}


# Single-stream pre-training


def predictions_for_metrics(logits: tuple[torch.Tensor, torch.Tensor], labels) -> tuple[torch.Tensor, torch.Tensor]:
    """`preprocess_logits_for_metrics`: the predicted word of each position (not the whole vocabulary's scores) and the
    sentence-image logits."""
    prediction_logits, seq_relationship_logits = logits
    return prediction_logits.argmax(dim=-1), seq_relationship_logits


def pretraining_metrics(paired: bool) -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics`: masked-word accuracy and, with pairs, sentence-image accuracy, each beside always predicting
    the evaluation rows' most frequent label (`baselines.pretraining_baselines`: masks and pairs are drawn at
    collation, so there are no training labels to count)."""

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predicted_words, sentence_image_logits = prediction.predictions
        label_ids = prediction.label_ids if paired else (prediction.label_ids,)
        words = np.asarray(label_ids[0])
        masked = words != -100
        targets = words[masked]
        metrics = {
            "mlm_accuracy": float((np.asarray(predicted_words)[masked] == targets).mean()),
            "mlm_most_frequent_token_accuracy": float(np.bincount(targets).max() / len(targets)),
            "num_masked_words": float(len(targets)),
        }
        if paired:
            predicted = np.asarray(sentence_image_logits).argmax(axis=-1)
            matches = np.asarray(label_ids[1]).reshape(-1)
            metrics["sentence_image_accuracy"] = float((predicted == matches).mean())
            metrics["sentence_image_most_frequent_label_accuracy"] = float(np.bincount(matches).max() / len(matches))
        return metrics

    return compute_metrics


__all__ = [
    "GQA_SCRIPT_METRICS",
    "IOU_THRESHOLD",
    "KS",
    "PHRASE_COLUMNS",
    "accuracy_from_region_iou",
    "answer_metrics",
    "chosen_regions",
    "grounded_phrases_only",
    "phrase_region_scores",
    "predicted_answer_ids",
    "predicted_truth",
    "predictions_for_metrics",
    "pretraining_metrics",
    "reasoning_metrics",
    "recall_at_1_any_box",
    "recall_results",
    "referring_results",
]
