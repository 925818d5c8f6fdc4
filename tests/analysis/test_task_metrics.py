"""Task metrics: VQA accuracy (official vqaEval.py normalisation and leave-one-out accuracy), NLVR2 accuracy and
consistency (nlvr2/eval/metrics.py), RefCOCO accuracy at IoU >= 0.5, Flickr30k Entities Recall@k; hand-computed
values, the real VQA v2 / NLVR2 samples, the evaluate modules loaded from their local folders, and input errors."""

import json
from collections import Counter, defaultdict

import evaluate
import pytest
import torch

from hf_vlalign.metrics.nlvr2 import NLVR2_METRIC_PATH, load_nlvr2_metric, nlvr2_scores, sentence_key
from hf_vlalign.metrics.phrase_grounding import (
    PHRASE_GROUNDING_METRIC_PATH,
    load_phrase_grounding_metric,
    phrase_grounding_recall,
)
from hf_vlalign.metrics.referring import REFERRING_METRIC_PATH, load_referring_metric, referring_expression_accuracy
from hf_vlalign.metrics.vqa import VQA_METRIC_PATH, load_vqa_metric, normalize_vqa_answer, vqa_accuracy
from tests.shared_samples import real_sample

# --------------------------------------------------------------------------------------------------------------------
# VQA
# --------------------------------------------------------------------------------------------------------------------


def official_accuracy(num_matching: int, num_answers: int = 10) -> float:
    """Closed form of vqaEval.py's leave-one-out mean: a left-out matching answer leaves m - 1 matches, any other m."""
    m, n = num_matching, num_answers
    return (m * min(1.0, (m - 1) / 3) + (n - m) * min(1.0, m / 3)) / n


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("two", "2"),  # manualMap
        ("Ten", "10"),
        ("none", "0"),  # manualMap maps "none" to "0" too
        ("a dog", "dog"),  # articles
        ("The Cat", "cat"),
        ("an apple", "apple"),
        ("yes.", "yes"),  # periodStrip
        ("3.5", "3.5"),  # a period before a digit stays
        ("5.", "5"),
        ("a.b", "ab"),
        ("1,000", "1000"),  # commaStrip matches: every punctuation mark is deleted, not spaced
        ("yes, sir", "yes sir"),  # ", " touches a space: deleted
        ("t-shirt", "t shirt"),  # "-" touches no space: replaced by a space
        ("Yes!", "yes"),
        ("dont", "don't"),  # contractions
        ("whats", "what's"),
        ("it's", "it's"),  # "'" is no punctuation mark for the script
        ("its", "its"),  # and "its" is no key of the contractions map
        ("Im", "im"),  # the map's key "Im" has a capital, so it never matches the lower-cased word
        ("\tblack and  white\n", "black and white"),
    ],
)
def test_normalize_vqa_answer(answer, expected):
    assert normalize_vqa_answer(answer) == expected


def test_period_strip_count_quirk():
    # vqaEval.py passes re.UNICODE (= 32) as re.sub's count: only the first 32 periods go
    assert normalize_vqa_answer("." * 40) == "." * 8


def test_normalisation_is_idempotent_on_the_real_vqa_answer_vocabulary():
    # LXMERT's 3129 VQA v2 answers were produced by this normalisation: each is left unchanged
    answers = json.loads(real_sample("vqa_v2", "trainval_label2ans.json").read_text())
    assert len(answers) == 3129
    assert [answer for answer in answers if normalize_vqa_answer(answer) != answer] == []


@pytest.mark.parametrize("num_matching, expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)])
def test_vqa_accuracy_hand_computed(num_matching, expected):
    # m = 2 of 10: leaving out one of the 2 "cat" (2 subsets) leaves 1 match -> 1/3; leaving out a "dog" (8 subsets)
    # leaves 2 -> 2/3; mean (2 * 1/3 + 8 * 2/3) / 10 = 18 / 30 = 0.6. m = 1: (1 * 0 + 9 * 1/3) / 10 = 0.3;
    # m = 3: (3 * 2/3 + 7 * 1) / 10 = 0.9; m = 4: every subset keeps >= 3 matches -> 1.
    answers = ["cat"] * num_matching + ["dog"] * (10 - num_matching)
    result = vqa_accuracy(["cat"], [answers])
    assert result == {"accuracy": pytest.approx(expected, abs=1e-12), "num_questions": 1}
    assert result["accuracy"] == pytest.approx(official_accuracy(num_matching), abs=1e-12)


def test_vqa_accuracy_normalises_the_prediction_and_reports_per_answer_type():
    predictions = ["Two.", "A dog", "No"]
    answers = [["2"] * 10, ["dog", "dog"] + ["cat"] * 8, ["yes"] * 10]
    result = vqa_accuracy(predictions, answers, answer_types=["number", "other", "yes/no"])
    # "Two." -> "2": 10 matches -> 1; "A dog" -> "dog": 2 matches -> 0.6; "no" -> 0
    assert result["accuracy"] == pytest.approx((1.0 + 0.6 + 0.0) / 3)
    assert result["per_answer_type"] == {"number": 1.0, "other": pytest.approx(0.6), "yes/no": 0.0}
    assert result["num_questions"] == 3
    assert list(vqa_accuracy(predictions[:1], answers[:1])) == ["accuracy", "num_questions"]


def test_human_answers_get_only_processPunctuation_and_only_when_they_differ():
    # vqaEval.py: the human answers go through processPunctuation only when the ten are not all identical, and never
    # through processDigitArticle (the released answers are already normalised)
    assert vqa_accuracy(["yes"], [["yes."] * 5 + ["no"] * 5])["accuracy"] == 1.0  # "yes." -> "yes": 5 matches
    assert vqa_accuracy(["yes"], [["yes."] * 10])["accuracy"] == 0.0  # all identical: kept as "yes."
    assert vqa_accuracy(["two"], [["two"] * 10])["accuracy"] == 0.0  # the prediction becomes "2", "two" stays
    assert vqa_accuracy(["two"], [["two"] * 10], normalize_references=True)["accuracy"] == 1.0


def test_vqa_accuracy_on_the_real_vqa_v2_sample():
    annotations = json.loads(real_sample("vqa_v2", "allennlp_fixture", "annotations.json").read_text())["annotations"]
    answers = [[entry["answer"] for entry in record["answers"]] for record in annotations]
    assert len(answers) == 3 and all(len(human) == 10 for human in answers)
    # the most common human answer of each question, and the least common one
    most_common = [Counter(human).most_common(1)[0][0] for human in answers]
    least_common = [Counter(human).most_common()[-1][0] for human in answers]
    for predictions in (most_common, least_common):
        expected = sum(official_accuracy(human.count(p)) for p, human in zip(predictions, answers)) / len(answers)
        assert vqa_accuracy(predictions, answers)["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert most_common == ["net", "pitcher", "orange"]
    assert vqa_accuracy(most_common, answers)["accuracy"] == 1.0
    # "netting", "catcher" are given once (0.3 each), "orange" ten times (1.0)
    assert vqa_accuracy(["Netting", "catcher.", "the orange"], answers)["accuracy"] == pytest.approx(1.6 / 3)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((["yes"], [["yes"], ["no"]]), {}, r"`answers` must hold one list of human answers per prediction .* got 2"),
        ((["yes"], [["yes"]]), {"answer_types": ["yes/no", "other"]}, r"`answer_types` must hold one type per"),
    ],
)
def test_vqa_accuracy_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        vqa_accuracy(*args, **kwargs)


# --------------------------------------------------------------------------------------------------------------------
# NLVR2
# --------------------------------------------------------------------------------------------------------------------

NLVR2_IDENTIFIERS = ["dev-1-0-0", "dev-1-1-0", "dev-1-2-0", "dev-1-0-1", "dev-1-1-1", "dev-2-0-0"]
NLVR2_LABELS = ["True", "False", "True", "True", "False", "True"]
NLVR2_PREDICTIONS = [True, 0, "true", False, "FALSE", 1]


def test_nlvr2_hand_computed():
    # sentences (split-setId-sentenceId): dev-1--0 (3 pairs, all right), dev-1--1 (pair 0 wrong), dev-2--0 (right;
    # same sentenceId 0 as the first but another set, so another sentence) -> accuracy 5/6, consistency 2/3
    result = nlvr2_scores(NLVR2_PREDICTIONS, NLVR2_LABELS, NLVR2_IDENTIFIERS)
    assert result == {
        "accuracy": pytest.approx(5 / 6),
        "consistency": pytest.approx(2 / 3),
        "num_examples": 6,
        "num_sentences": 3,
    }
    assert sentence_key("dev-850-1-0") == "dev-850--0"  # metrics.py: anon_label[2] = ''


def test_nlvr2_on_the_real_dev_sample():
    rows = [json.loads(line) for line in real_sample("nlvr2", "dev.json").read_text().splitlines() if line.strip()]
    labels = [row["label"] for row in rows]
    identifiers = [row["identifier"] for row in rows]
    assert nlvr2_scores(labels, labels, identifiers)["consistency"] == 1.0
    # always "True": consistent sentences are those whose labels are all True; group here by the sentence *text*,
    # which in this sample names the same groups as split-setId-sentenceId
    by_text = defaultdict(list)
    for row in rows:
        by_text[row["sentence"]].append(row["label"] == "True")
    result = nlvr2_scores([True] * len(rows), labels, identifiers)
    assert result["num_examples"] == len(rows) == 500
    assert result["accuracy"] == pytest.approx(labels.count("True") / len(rows))
    assert result["num_sentences"] == len(by_text)
    assert result["consistency"] == pytest.approx(sum(all(v) for v in by_text.values()) / len(by_text))
    assert 0 < result["consistency"] < result["accuracy"] < 1


@pytest.mark.parametrize(
    "predictions, labels, identifiers, match",
    [
        ([True], ["yes"], ["dev-1-0-0"], r"`labels\[0\]` must be a truth value .* got str: 'yes'"),
        ([2], ["True"], ["dev-1-0-0"], r"`predictions\[0\]` must be a truth value .* got int: 2"),
        ([True], ["True"], ["dev-1-0"], r"`identifiers\[0\]` must be an NLVR2 identifier .* got 'dev-1-0'"),
        ([True, True], ["True", "True"], ["dev-1-0-0"] * 2, r"`identifiers` must be unique .* 'dev-1-0-0'"),
        ([True], ["True", "False"], ["dev-1-0-0"], r"must have the same length .* got 1, 2 and 1"),
    ],
)
def test_nlvr2_errors(predictions, labels, identifiers, match):
    with pytest.raises(ValueError, match=match):
        nlvr2_scores(predictions, labels, identifiers)


# --------------------------------------------------------------------------------------------------------------------
# referring expressions
# --------------------------------------------------------------------------------------------------------------------

REF_PREDICTED = [[10, 10, 20, 20], [0, 0, 2, 1], [0, 0, 1, 1], [0, 0, 1, 1]]
REF_GOLD = [[10, 10, 20, 20], [0, 0, 1, 1], [5, 5, 6, 6], [0.5, 0, 1.5, 1]]


def test_referring_accuracy_hand_computed():
    # IoUs: 1; 1 / 2 (intersection 1, union 2: exactly 0.5 counts); 0 (disjoint); 0.5 / 1.5 = 1/3 -> 2 of 4
    assert referring_expression_accuracy(REF_PREDICTED, REF_GOLD) == {"accuracy": 0.5, "num_expressions": 4}
    assert referring_expression_accuracy(torch.tensor(REF_PREDICTED), torch.tensor(REF_GOLD))["accuracy"] == 0.5
    assert referring_expression_accuracy([[0, 0, 2, 1]], [[0, 0, 1, 1]])["accuracy"] == 1.0
    assert referring_expression_accuracy([[0, 0, 2.001, 1]], [[0, 0, 1, 1]])["accuracy"] == 0.0  # IoU just below
    assert referring_expression_accuracy(REF_PREDICTED, REF_GOLD, iou_threshold=0.3)["accuracy"] == 0.75


@pytest.mark.parametrize(
    "predicted, gold, kwargs, match",
    [
        ([[0, 0, 1]], [[0, 0, 1, 1]], {}, r"`predicted_boxes` must be boxes of shape \(N, 4\) .* got shape \(1, 3\)"),
        ([[0, 0, 1, 1]], [[0, 0, 1, 1]] * 2, {}, r"one box per expression each, got 1 and 2 boxes"),
        ([[0, 0, 1, 1]], [[0, 0, 10, -5]], {}, r"`gold_boxes` must hold x1, y1, x2, y2 boxes with x2 >= x1"),
        ([[0, 0, float("nan"), 1]], [[0, 0, 1, 1]], {}, r"`predicted_boxes` must be finite"),
    ],
)
def test_referring_errors(predicted, gold, kwargs, match):
    with pytest.raises(ValueError, match=match):
        referring_expression_accuracy(predicted, gold, **kwargs)


# --------------------------------------------------------------------------------------------------------------------
# phrase grounding
# --------------------------------------------------------------------------------------------------------------------

# phrase A: the 2nd ranked box is its gold box; phrase B: one box, the right one (k > K uses all K boxes);
# phrase C: two gold boxes in opposite corners, ranked [the first gold box, the union box]
PG_RANKED = [
    [[5, 5, 6, 6], [0, 0, 2, 2], [0, 0, 1, 1]],
    [[0, 0, 10, 10]],
    [[0, 0, 2, 2], [0, 0, 10, 10]],
]
PG_GOLD = [[[0, 0, 2, 2]], [[0, 0, 10, 10]], [[0, 0, 2, 2], [8, 8, 10, 10]]]


def test_phrase_grounding_recall_hand_computed():
    # union box (default, Plummer et al.): C's union is [0, 0, 10, 10]; its 1st box has IoU 4/100 with it, its 2nd 1
    # -> hits at k = 1: A no, B yes, C no (1/3); k = 2 and 3: all (3/3)
    merged = phrase_grounding_recall(PG_RANKED, PG_GOLD, ks=(1, 2, 3))
    assert merged == {"recall@1": pytest.approx(1 / 3), "recall@2": 1.0, "recall@3": 1.0, "num_phrases": 3}
    # any gold box (MDETR's ANY-BOX): C's 1st box equals a gold box -> k = 1: B and C (2/3)
    any_box = phrase_grounding_recall(PG_RANKED, PG_GOLD, ks=(1, 2, 3), merge_gold_boxes=False)
    assert any_box == {"recall@1": pytest.approx(2 / 3), "recall@2": 1.0, "recall@3": 1.0, "num_phrases": 3}
    # a phrase with no predicted box is a miss at every k; default ks are 1, 5, 10
    assert phrase_grounding_recall([[], [[0, 0, 1, 1]]], [[[0, 0, 1, 1]], [[0, 0, 1, 1]]]) == {
        "recall@1": 0.5,
        "recall@5": 0.5,
        "recall@10": 0.5,
        "num_phrases": 2,
    }


@pytest.mark.parametrize(
    "ranked, gold, kwargs, match",
    [
        ([[[0, 0, 1, 1]]], [[]], {}, r"`gold_boxes\[0\]` must be boxes of shape \(N, 4\) with N >= 1"),
        ([[[0, 0, 1, 1]]], [[[0, 0, 1, 1]]] * 2, {}, r"one entry per phrase each \(at least one\), got 1 and 2"),
    ],
)
def test_phrase_grounding_errors(ranked, gold, kwargs, match):
    with pytest.raises(ValueError, match=match):
        phrase_grounding_recall(ranked, gold, **kwargs)


# --------------------------------------------------------------------------------------------------------------------
# evaluate modules, loaded from their local folders
# --------------------------------------------------------------------------------------------------------------------


def test_vqa_module_matches_the_function():
    predictions = ["Two.", "A dog", "No"]
    answers = [["2"] * 10, ["dog", "dog"] + ["cat"] * 8, ["yes"] * 10]
    types = ["number", "other", "yes/no"]
    metric = evaluate.load(str(VQA_METRIC_PATH))
    expected = vqa_accuracy(predictions, answers, answer_types=types)
    assert metric.compute(predictions=predictions, references=answers, answer_types=types) == expected
    assert load_vqa_metric().compute(predictions=predictions, references=answers) == vqa_accuracy(predictions, answers)


def test_nlvr2_module_matches_the_function():
    metric = evaluate.load(str(NLVR2_METRIC_PATH))
    expected = nlvr2_scores(NLVR2_PREDICTIONS, NLVR2_LABELS, NLVR2_IDENTIFIERS)
    result = metric.compute(predictions=NLVR2_PREDICTIONS, references=NLVR2_LABELS, identifiers=NLVR2_IDENTIFIERS)
    assert result == expected
    helper = load_nlvr2_metric()
    for prediction, label, identifier in zip(NLVR2_PREDICTIONS, NLVR2_LABELS, NLVR2_IDENTIFIERS):
        helper.add(prediction=prediction, reference=label, identifiers=identifier)
    assert helper.compute() == expected
    with pytest.raises(ValueError, match=r"`predictions\[0\]` must be a truth value"):
        helper.compute(predictions=[2], references=["True"], identifiers=["dev-1-0-0"])


def test_referring_module_matches_the_function():
    metric = evaluate.load(str(REFERRING_METRIC_PATH))
    assert metric.compute(predictions=REF_PREDICTED, references=REF_GOLD) == referring_expression_accuracy(
        REF_PREDICTED, REF_GOLD
    )
    result = load_referring_metric().compute(predictions=REF_PREDICTED, references=REF_GOLD, iou_threshold=0.3)
    assert result == referring_expression_accuracy(REF_PREDICTED, REF_GOLD, iou_threshold=0.3)


def test_phrase_grounding_module_matches_the_function():
    metric = evaluate.load(str(PHRASE_GROUNDING_METRIC_PATH))
    result = metric.compute(predictions=PG_RANKED, references=PG_GOLD, ks=[1, 2, 3])
    assert result == phrase_grounding_recall(PG_RANKED, PG_GOLD, ks=(1, 2, 3))
    result = load_phrase_grounding_metric().compute(predictions=PG_RANKED, references=PG_GOLD, merge_gold_boxes=False)
    assert result == phrase_grounding_recall(PG_RANKED, PG_GOLD, merge_gold_boxes=False)
