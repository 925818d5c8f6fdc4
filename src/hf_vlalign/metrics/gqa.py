"""GQA metrics (Hudson & Manning 2019) as the official evaluation script computes them (`eval.py` of the GQA
download, the version with `--consistency`, `binary` / `open` and `distribution / 100`); each formula below cites the
script's line it follows:

    >>> gqa_scores({"q1": "yes"}, {"q1": {"answer": "yes", "types": {"structural": "verify", "semantic": "attr"}}})
    {'accuracy': 1.0, 'binary': 1.0, 'open': None, ...}

Only the balanced questions are scored (a record without `isBalanced` counts as balanced), by exact string match.
Binary questions are those whose structural type is not "query". A hand-made record may hold only its `answer`: it
counts in `accuracy`, and in `binary` / `open` and the per-type splits only when it has `types` (they are None / empty
when no record has them). Consistency averages, over the correctly answered questions with entailed questions, the
accuracy on those; validity / plausibility need the choices file; distribution is the chi-square between gold and
predicted answer counts per global group / 100 (lower is better).

Unlike the script, accuracies are fractions in [0, 1], and a metric whose inputs are missing is None instead of 0
(`computed` lists the metrics that have a value).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from .local_modules import MODULES_DIR, load_local_metric

GQA_METRIC_PATH = MODULES_DIR / "gqa_accuracy"

# eval.py: answerType = "open" if question["types"]["structural"] == "query" else "binary"
OPEN_STRUCTURAL_TYPE = "query"
# eval.py belongs(): `if "Common" in question["types"]["detailed"]: group = ["color", "material", "shape"]`
COMMON_GROUP = ("color", "material", "shape")
METRICS = ("accuracy", "binary", "open", "consistency", "validity", "plausibility", "distribution")
_SHOWN_IDS = 5


def _first_ids(ids: list[str]) -> str:
    shown = ", ".join(repr(qid) for qid in ids[:_SHOWN_IDS])
    return shown + (f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else "")


def _check_record(qid: str, question) -> None:
    if not isinstance(question, Mapping):
        raise ValueError(
            f"`questions[{qid!r}]` must be a question record such as {{'answer': 'yes'}} (GQA's, or one holding only "
            f"the gold answer), got {type(question).__name__}: {question!r}."
        )


def _check_question(qid: str, question) -> None:
    if not isinstance(question.get("answer"), str):
        raise ValueError(
            f"`questions[{qid!r}]['answer']` must be the gold answer string, got {question.get('answer')!r} "
            "(test, challenge and submission questions are published without answers)."
        )


def _balanced_ids(questions) -> list[str]:
    for qid, question in questions.items():
        _check_record(qid, question)
    balanced = [qid for qid, question in questions.items() if is_balanced(question)]
    if not balanced:
        raise ValueError(
            f"`questions` must hold at least one balanced question (isBalanced true), got {len(questions)}."
        )
    for qid in balanced:
        _check_question(qid, questions[qid])
    return balanced


def is_balanced(question: Mapping) -> bool:
    """Whether GQA's script scores `question` (a record): `isBalanced`, true when absent (hand-made records)."""
    # eval.py: `if question["isBalanced"]:` (a record without the field counts as balanced here)
    return bool(question.get("isBalanced", True))


def _check_covered(ids: list[str], mapping: Mapping, name: str, what: str) -> None:
    missing = [qid for qid in ids if qid not in mapping]
    if missing:
        raise ValueError(
            f"`{name}` must hold {what} for every scored question; missing {len(missing)}: {_first_ids(missing)}."
        )


def _entailed_ids(qid: str, question: Mapping) -> list[str]:
    # eval.py updateConsistency(): inferredQuestions = [eid for eid in question["entailed"] if eid != questionId]
    return [eid for eid in question.get("entailed") or [] if eid != qid]


def _resolve_consistency(consistency: bool | None, questions: Mapping, balanced: list[str]) -> list[str] | None:
    """The entailed question ids to score, or None when consistency is not computed. Auto (None): computed when some
    balanced question has entailed questions and every one of them is in `questions`."""
    if consistency is False:
        return None
    entailed = sorted({eid for qid in balanced for eid in _entailed_ids(qid, questions[qid])})
    missing = [eid for eid in entailed if eid not in questions]
    if consistency is None and (not entailed or missing):
        return None
    if missing:
        raise ValueError(
            f"`questions` must hold the entailed questions of the balanced ones to compute consistency (the script "
            f"reads questions[eid]['answer']; pass the all_questions file); missing {len(missing)}: "
            f"{_first_ids(missing)}."
        )
    for eid in entailed:
        _check_question(eid, questions[eid])
    return entailed


def _average(values: list[float]) -> float | None:
    # eval.py avg(): float(sum(l)) / len(l) (0 for an empty list there, None here)
    return float(sum(values)) / len(values) if values else None


def _types(question: Mapping) -> Mapping:
    """The record's `types` ({} for a hand-made record without them)."""
    return question.get("types") or {}


def belongs(answer: str, group: list[str], question: Mapping) -> bool:
    """eval.py `belongs`: is `answer` in `group`; "...Common" questions always use ("color", "material", "shape")."""
    if "Common" in _types(question).get("detailed", ""):
        group = COMMON_GROUP
    return answer in group


def chi_square(gold: Mapping[str, Mapping[str, int]], predicted: Mapping[str, Mapping[str, int]]) -> float:
    """eval.py `chiSquare`: per group sum over gold answers of (o - e)^2 / e, averaged weighted by the group's size."""
    sum_score, sum_overall = 0.0, 0
    for group, gold_counts in gold.items():
        # eval.py: score += ((float(o - e) ** 2) / e); overall += goldDist[group][ans]
        score = sum((predicted.get(group, {}).get(answer, 0) - e) ** 2 / e for answer, e in gold_counts.items())
        overall = sum(gold_counts.values())
        # eval.py: sumScore += score * overall; sumOverall += overall
        sum_score += score * overall
        sum_overall += overall
    return sum_score / sum_overall


def _consistency(
    predictions: Mapping[str, str], questions: Mapping, balanced: list[str], correct: dict[str, bool]
) -> float | None:
    per_question = []
    for qid in balanced:
        entailed = _entailed_ids(qid, questions[qid])
        # eval.py updateConsistency(): `if correct and len(inferredQuestions) > 0`: avg of toScore(predicted == gold)
        if correct[qid] and entailed:
            per_question.append(_average([float(predictions[eid] == questions[eid]["answer"]) for eid in entailed]))
    return _average(per_question)


def _distribution(predictions: Mapping[str, str], questions: Mapping, balanced: list[str]) -> float | None:
    gold, predicted = defaultdict(lambda: defaultdict(int)), defaultdict(lambda: defaultdict(int))
    for qid in balanced:
        # eval.py: globalGroup = question["groups"]["global"]; if globalGroup is not None: ... += 1
        group = (questions[qid].get("groups") or {}).get("global")
        if group is not None:
            gold[group][questions[qid]["answer"]] += 1
            predicted[group][predictions[qid]] += 1
    # eval.py: scores["distribution"] = chiSquare(dist["gold"], dist["predicted"]) / 100
    return chi_square(gold, predicted) / 100 if gold else None


def _accuracy_per_type(balanced: list[str], questions: Mapping, correct: dict[str, bool], kind: str) -> dict:
    # eval.py: scores["accuracyPerStructuralType"][question["types"]["structural"]].append(score) (same for semantic)
    per_type = defaultdict(list)
    for qid in balanced:
        if kind in _types(questions[qid]):
            per_type[questions[qid]["types"][kind]].append(float(correct[qid]))
    return {name: _average(values) for name, values in sorted(per_type.items())}


def gqa_scores(
    predictions: dict[str, str],
    questions: dict[str, dict],
    choices: dict[str, dict] | None = None,
    *,
    consistency: bool | None = None,
) -> dict:
    """The GQA evaluation script's metrics for `predictions` (question id -> answer string) on `questions` (a GQA
    questions file as published: question id -> {answer, types, entailed, groups, isBalanced, ...}).

    `choices` (the `{split}_choices.json` file, question id -> {"valid": [...], "plausible": [...]}) enables validity
    and plausibility. `consistency`: None (default) computes it when the balanced questions have entailed questions
    and all of them are in `questions` (the script's `--consistency` needs the all_questions file); True requires it
    (ValueError naming the entailed questions missing); False skips it.

    Returns accuracy, binary, open, consistency, validity, plausibility (fractions in [0, 1], None when not computed),
    distribution (the script's number, lower is better), accuracy_per_structural_type, accuracy_per_semantic_type
    (type -> accuracy), questions_per_structural_type, questions_per_semantic_type (type -> count), num_questions (the
    balanced questions scored) and computed (the names of the metrics that have a value).
    """
    balanced = _balanced_ids(questions)
    entailed = _resolve_consistency(consistency, questions, balanced)
    _check_covered(balanced + (entailed or []), predictions, "predictions", "a predicted answer")
    if choices is not None:
        _check_covered(balanced, choices, "choices", "the valid and plausible answers")

    # eval.py: correct = (predicted == gold)
    correct = {qid: predictions[qid] == questions[qid]["answer"] for qid in balanced}
    # only the records with a structural type are binary or open
    is_open = {
        qid: _types(questions[qid])["structural"] == OPEN_STRUCTURAL_TYPE
        for qid in balanced
        if "structural" in _types(questions[qid])
    }
    scores = {
        "accuracy": _average([float(correct[qid]) for qid in balanced]),
        "binary": _average([float(correct[qid]) for qid, open_ in is_open.items() if not open_]),
        "open": _average([float(correct[qid]) for qid, open_ in is_open.items() if open_]),
        "consistency": None if entailed is None else _consistency(predictions, questions, balanced, correct),
        "validity": None,
        "plausibility": None,
        "distribution": _distribution(predictions, questions, balanced),
    }
    if choices is not None:
        for metric, key in (("validity", "valid"), ("plausibility", "plausible")):
            # eval.py: valid = belongs(predicted, choices[qid]["valid"], question) (same with "plausible")
            scores[metric] = _average(
                [float(belongs(predictions[qid], choices[qid][key], questions[qid])) for qid in balanced]
            )
    for kind in ("structural", "semantic"):
        scores[f"accuracy_per_{kind}_type"] = _accuracy_per_type(balanced, questions, correct, kind)
        counts = defaultdict(int)
        for qid in balanced:
            if kind in _types(questions[qid]):
                counts[questions[qid]["types"][kind]] += 1
        scores[f"questions_per_{kind}_type"] = dict(sorted(counts.items()))
    scores["num_questions"] = len(balanced)
    scores["computed"] = [metric for metric in METRICS if scores[metric] is not None]
    return scores


def load_gqa_metric(**kwargs):
    """`evaluate.load` of this package's GQA metric module from its local folder (no Hub access):
    `load_gqa_metric().compute(predictions=[...], question_ids=[...], questions=..., choices=...)` returns
    `gqa_scores`'s dict."""
    return load_local_metric("gqa_accuracy", **kwargs)


__all__ = [
    "COMMON_GROUP",
    "GQA_METRIC_PATH",
    "METRICS",
    "belongs",
    "chi_square",
    "gqa_scores",
    "is_balanced",
    "load_gqa_metric",
]
