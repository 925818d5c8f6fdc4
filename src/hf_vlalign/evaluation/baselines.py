"""The baseline each accuracy is compared with: what a model gets that ignores the text or the image.

Every accuracy the examples write to `eval_results.json` (and `hf-vlalign evaluate` prints) stands beside one, under
`baselines`: `{key: {"value": accuracy, "baseline": b, "kind": kind, "beats": accuracy > b}}` (`compare_with_baselines`;
a tie does not beat it). The kinds are `BASELINE_KINDS`, each scored with the task's own metric: the majority training
label (VQA v2: the answer of the largest summed soft score; per answer type, the "per Q-type prior" of Antol et al.
2015), the majority of the evaluation rows where no training labels exist (pre-training), the image's largest region
for referring expressions and phrase grounding (the text-blind baseline of Mao et al. 2016, MAttNet, UNITER; stricter
than the uniform random region, `chance_accuracy`), and for the attention probes the most confident detected region
(Li et al. 2020) where the region store holds detection confidences, else each image's first stored region (a grid or
the user-data builder's regions: the whole image first; `analysis.grounding_probe.probe_baseline_kind`), and the
centre patch for patch models. Caption metrics get no baseline.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..analysis.grounding_probe import GroundingProbeResult

__all__ = [
    "BASELINE_KINDS",
    "Baseline",
    "answer_label_baselines",
    "compare_with_baselines",
    "gqa_baselines",
    "grounding_probe_baselines",
    "majority_class_accuracy",
    "majority_label",
    "majority_soft_score",
    "majority_soft_score_accuracy",
    "phrase_grounding_baselines",
    "pretraining_baselines",
    "question_answering_baselines",
    "referring_baselines",
    "vgp_baselines",
    "visual_reasoning_baselines",
]

BASELINE_KINDS = {
    "majority_class": "the most frequent training label, predicted for every evaluation row",
    "majority_class_per_type": "each answer type's most frequent training answer, predicted for that type's questions",
    "majority_class_eval": "the most frequent label of the evaluation rows themselves (no training labels at hand)",
    "largest_region": "the image's largest region (by box area), whatever the text says",
    "detection_confidence": "the image's most confident detected region (Li et al. 2020)",
    "store_order": "the image's first region as the region store holds it (a store without detection confidences, e.g. "
    "the whole image before a grid: the user-data builder's default regions)",
    "detection_confidence_or_store_order": "the most confident detected region where the store holds confidences, "
    "else the image's first stored region",
    "centre_patch": "the patch at the image's centre (patches have no detection confidence)",
}  # each also named and described in the model cards' results table (model_cards/_results.md)


@dataclass(frozen=True)
class Baseline:
    """The baseline `value` of one accuracy, of kind `kind` (a `BASELINE_KINDS` key)."""

    value: float
    kind: str


def compare_with_baselines(results: Mapping, baselines: Mapping[str, Baseline]) -> dict[str, dict]:
    """The `baselines` entry of `eval_results.json`: for every key of `baselines` whose result in `results` is a number,
    `{"value": result, "baseline": b, "kind": kind, "beats": result > b}`. A key whose result is missing or None (e.g.
    a class without evaluation rows) is left out."""
    compared = {}
    for key, baseline in baselines.items():
        value = results.get(key)
        if value is None:
            continue
        compared[key] = {
            "value": float(value),
            "baseline": float(baseline.value),
            "kind": baseline.kind,
            "beats": bool(value > baseline.value),
        }
    return compared


# Classification: the majority class of the training labels


def _kept(labels: Sequence, ignore_index: int | None, argument: str) -> list:
    kept = [label for label in labels if ignore_index is None or label != ignore_index]
    if not kept:
        raise ValueError(f"`{argument}` must hold at least one label (other than {ignore_index}), got {len(labels)}.")
    return kept


def majority_label(
    labels: Sequence[Hashable], ignore_index: int | None = -100, *, argument: str = "labels"
) -> Hashable:
    """The most frequent of `labels` (those equal to `ignore_index` left out); ties go to the smallest label, so the
    baseline does not depend on the rows' order."""
    counts = Counter(_kept(labels, ignore_index, argument))
    return min(counts, key=lambda label: (-counts[label], label))


def majority_class_accuracy(
    train_labels: Sequence[Hashable], eval_labels: Sequence[Hashable], ignore_index: int | None = -100
) -> float:
    """The accuracy on `eval_labels` of always predicting the most frequent of `train_labels` (labels equal to
    `ignore_index` left out of both, as the models' metrics leave them out)."""
    majority = majority_label(train_labels, ignore_index, argument="train_labels")
    kept = _kept(eval_labels, ignore_index, "eval_labels")
    return sum(label == majority for label in kept) / len(kept)


def majority_soft_score(train_scores: Sequence[Mapping[Hashable, float]]) -> Hashable:
    """The answer of the largest summed soft score over `train_scores` (one {answer: score} dict per question, VQA v2's
    `labels` / `scores`); ties go to the smallest answer."""
    totals = Counter()
    for row in train_scores:
        totals.update(row)
    if not totals:
        raise ValueError("`train_scores` must give at least one answer a score, got only empty dicts.")
    return min(totals, key=lambda answer: (-totals[answer], answer))


def majority_soft_score_accuracy(
    train_scores: Sequence[Mapping[Hashable, float]], eval_scores: Sequence[Mapping[Hashable, float]]
) -> float:
    """The mean soft score on `eval_scores` of always answering `majority_soft_score(train_scores)` (VQA v2's
    `accuracy`: the label score of the predicted answer, 0 when no annotator gave it)."""
    majority = majority_soft_score(train_scores)
    return sum(row.get(majority, 0.0) for row in eval_scores) / len(eval_scores)


# The tasks' baselines, keyed as the examples' and `hf-vlalign evaluate`'s results


def vgp_baselines(train_rows, eval_rows, vgp_task: str) -> dict[str, Baseline]:
    """`image_description_accuracy` and `vgp_accuracy` of VGP fine-tuning: the majority `id_label`, and the majority
    `type_label` (rows without a type, -1, left out as the metric leaves them out) or `vgp_label` with `vgp_task`
    "binary", of the training rows."""
    vgp_column, ignore_index = ("type_label", -1) if vgp_task == "type" else ("vgp_label", None)
    return {
        "image_description_accuracy": Baseline(
            majority_class_accuracy(train_rows["id_label"], eval_rows["id_label"], None), "majority_class"
        ),
        "vgp_accuracy": Baseline(
            majority_class_accuracy(train_rows[vgp_column], eval_rows[vgp_column], ignore_index), "majority_class"
        ),
    }


def question_answering_baselines(
    answer_vocab: Mapping[str, int], train_rows, eval_rows, eval_questions: Mapping[str, dict] | None = None
) -> dict[str, Baseline]:
    """The baselines of the keys of `task_metrics.answer_metrics`, scored with the same metrics: for GQA-style rows (a
    `label` column) the most frequent training answer of the vocabulary (with `eval_questions`, also the GQA script's
    `gqa_*` metrics); for VQA v2 rows (`labels` / `scores`) the training answer of the largest summed soft score
    (`vqa_accuracy` when the rows have the annotators' `answers`, and per answer type that type's own majority)."""
    from ..metrics import vqa_accuracy

    answers = sorted(answer_vocab, key=answer_vocab.get)
    if "label" in train_rows.column_names:
        train_answers, eval_answers = _answer_strings(train_rows, answers), _answer_strings(eval_rows, answers)
        known = [answer for answer in train_answers if answer in answer_vocab]
        majority = majority_label(known, None, argument="train_rows' answers (in the answer vocabulary)")
        hits = sum(answer == majority for answer in eval_answers)
        baselines = {"accuracy": Baseline(hits / len(eval_answers), "majority_class")}
        if eval_questions is not None:
            baselines |= gqa_baselines(majority, {qid: eval_questions[qid] for qid in eval_rows["question_id"]})
        return baselines
    train_scores = [dict(zip(labels, scores)) for labels, scores in zip(train_rows["labels"], train_rows["scores"])]
    eval_scores = [dict(zip(labels, scores)) for labels, scores in zip(eval_rows["labels"], eval_rows["scores"])]
    majority = majority_soft_score(train_scores)
    baselines = {"accuracy": Baseline(majority_soft_score_accuracy(train_scores, eval_scores), "majority_class")}
    if "answers" not in eval_rows.column_names:  # no annotators' answers: no official VQA accuracy
        return baselines
    official = vqa_accuracy([answers[majority]] * len(eval_rows), eval_rows["answers"])
    baselines["vqa_accuracy"] = Baseline(official["accuracy"], "majority_class")
    typed = all("answer_type" in rows.column_names for rows in (train_rows, eval_rows))
    train_types, eval_types = (train_rows["answer_type"], eval_rows["answer_type"]) if typed else ([], [None])
    if all(isinstance(answer_type, str) for answer_type in (*train_types, *eval_types)):
        by_type = defaultdict(list)
        for row, answer_type in zip(train_scores, train_types):
            by_type[answer_type].append(row)
        per_type = {answer_type: majority_soft_score(rows) for answer_type, rows in by_type.items()}
        predicted = [answers[per_type.get(answer_type, majority)] for answer_type in eval_types]
        official = vqa_accuracy(predicted, eval_rows["answers"], eval_types)
        for answer_type, value in official.get("per_answer_type", {}).items():
            baselines[f"vqa_accuracy_{answer_type.replace('/', '_')}"] = Baseline(value, "majority_class_per_type")
    return baselines


def _answer_strings(rows, answers: list[str]) -> list[str | None]:
    """The rows' `answer` strings, else their `label` ids read in the vocabulary (None outside it)."""
    if "answer" in rows.column_names:
        return rows["answer"]
    return [answers[label] if 0 <= label < len(answers) else None for label in rows["label"]]


def gqa_baselines(answer: str, questions: Mapping[str, dict], prefix: str = "gqa_") -> dict[str, Baseline]:
    """The official GQA script's `accuracy`, `binary` and `open` (`metrics.gqa_scores`, as `<prefix><name>`) of
    answering `answer` (the most frequent training answer) to every question of `questions` (GQA records by id)."""
    from ..metrics import gqa_scores

    official = gqa_scores(dict.fromkeys(questions, answer), questions)
    names = [name for name in ("accuracy", "binary", "open") if official[name] is not None]
    return {f"{prefix}{name}": Baseline(official[name], "majority_class") for name in names}


def answer_label_baselines(train_rows, eval_rows, key: str = "vqa_accuracy") -> dict[str, Baseline]:
    """The answer accuracy `key` of a question-answering head read from a `label` column (negative: no answer, left
    out on both sides as the collators make it -100): the majority training label. No `label` column (captions, or
    soft scores): no baseline."""
    if "label" not in train_rows.column_names or "label" not in eval_rows.column_names:
        return {}
    train_labels = [label for label in train_rows["label"] if label >= 0]
    eval_labels = [label for label in eval_rows["label"] if label >= 0]
    if not train_labels or not eval_labels:
        return {}
    return {key: Baseline(majority_class_accuracy(train_labels, eval_labels, None), "majority_class")}


def visual_reasoning_baselines(
    train_labels: Sequence[int], eval_labels: Sequence[int], eval_identifiers: Sequence[str]
) -> dict[str, Baseline]:
    """NLVR2's `accuracy` and `consistency` (`nlvr2_scores`) of the majority training truth value."""
    from ..metrics import nlvr2_scores

    majority = majority_label(train_labels, None, argument="train_labels")
    scores = nlvr2_scores([majority] * len(eval_labels), list(eval_labels), list(eval_identifiers))
    return {name: Baseline(scores[name], "majority_class") for name in ("accuracy", "consistency")}


def referring_baselines(results: Mapping) -> dict[str, Baseline]:
    """`accuracy` of `task_metrics.referring_results` against its `largest_region_accuracy`."""
    return {"accuracy": Baseline(results["largest_region_accuracy"], "largest_region")}


def phrase_grounding_baselines(results: Mapping, ks: Sequence[int] = (1, 5, 10)) -> dict[str, Baseline]:
    """`recall@k_merged_boxes` of `task_metrics.recall_results` against its `largest_region_recall@k_merged_boxes`."""
    return {
        f"recall@{k}_merged_boxes": Baseline(results[f"largest_region_recall@{k}_merged_boxes"], "largest_region")
        for k in ks
    }


def pretraining_baselines(results: Mapping) -> dict[str, Baseline]:
    """`mlm_accuracy` and `sentence_image_accuracy` (when measured) of `task_metrics.pretraining_metrics` against its
    most frequent masked word / match label of the evaluation rows (`majority_class_eval`: the masks and the mismatched
    captions are drawn at collation, so no training labels exist to count)."""
    pairs = {
        "mlm_accuracy": "mlm_most_frequent_token_accuracy",
        "sentence_image_accuracy": "sentence_image_most_frequent_label_accuracy",
    }
    measured = {key: baseline for key, baseline in pairs.items() if baseline in results}
    return {key: Baseline(results[baseline], "majority_class_eval") for key, baseline in measured.items()}


def grounding_probe_baselines(probe: GroundingProbeResult, keys: Sequence[str]) -> dict[str, Baseline]:
    """The attention-grounding accuracies `keys` (best head, mean head, ...) against the probe's baseline, of the kind
    it measured (`GroundingProbeResult.baseline_kind`: detection confidence, store order or centre patch)."""
    return {key: Baseline(probe.baseline_accuracy, probe.baseline_kind) for key in keys}
