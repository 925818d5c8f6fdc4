"""`hf_vlalign.evaluation.baselines` and the grounding baselines of `hf_vlalign.metrics.grounding` on hand-made labels
and boxes: exact baseline values, and the `baselines` entry of `eval_results.json` that compares each accuracy with its
baseline."""

import datasets
import pytest

from hf_vlalign.evaluation.baselines import (
    Baseline,
    answer_label_baselines,
    compare_with_baselines,
    gqa_baselines,
    majority_class_accuracy,
    majority_label,
    majority_soft_score,
    majority_soft_score_accuracy,
    pretraining_baselines,
    question_answering_baselines,
    vgp_baselines,
    visual_reasoning_baselines,
)
from hf_vlalign.metrics import largest_region_accuracy, largest_region_recall


def test_majority_label_ignores_the_ignore_index_and_breaks_ties_by_the_smallest_label():
    assert majority_label([2, 2, 1, -100, -100, -100]) == 2
    assert majority_label([3, 1, 3, 1]) == 1  # a tie: the smallest, whatever the order
    assert majority_label(["no", "yes", "yes"], None) == "yes"
    with pytest.raises(ValueError, match=r"`labels` must hold at least one label \(other than -100\), got 2"):
        majority_label([-100, -100])


def test_majority_class_accuracy_is_the_training_majority_scored_on_the_evaluation_labels():
    # training majority 1; evaluation: 2 of the 4 labelled rows are 1 (the -100 row is left out, as the metric does)
    assert majority_class_accuracy([1, 1, 0], [1, 0, 1, 2, -100]) == pytest.approx(2 / 4)
    # the evaluation split's own majority (0) does not matter: the baseline reads the training labels
    assert majority_class_accuracy([1, 1, 0], [0, 0, 0, 1]) == pytest.approx(1 / 4)
    assert majority_class_accuracy([0, -1, -1, -1], [-1, 0, 1], ignore_index=-1) == pytest.approx(1 / 2)


def test_majority_soft_score_sums_the_training_soft_scores():
    train = [{"red": 1.0, "blue": 0.3}, {"blue": 0.9}, {"blue": 0.3, "green": 0.6}]  # blue 1.5 > red 1.0 > green 0.6
    assert majority_soft_score(train) == "blue"
    evaluation = [{"blue": 0.6}, {"red": 1.0}, {"blue": 1.0, "red": 0.3}]
    assert majority_soft_score_accuracy(train, evaluation) == pytest.approx((0.6 + 0.0 + 1.0) / 3)
    with pytest.raises(ValueError, match="`train_scores` must give at least one answer a score"):
        majority_soft_score([{}, {}])


def test_largest_region_accuracy():
    regions = [
        [[0, 0, 10, 10], [0, 0, 2, 2]],  # the largest region is the gold box
        [[0, 0, 4, 4], [0, 0, 10, 10]],  # the largest is the second, the gold box is the first
        [[5, 5, 6, 6], [0, 0, 9, 10]],  # the largest overlaps the gold box at IoU 90 / 100 = 0.9
    ]
    gold = [[0, 0, 10, 10], [0, 0, 4, 4], [0, 0, 10, 10]]
    assert largest_region_accuracy(regions, gold) == pytest.approx(2 / 3)
    assert largest_region_accuracy(regions, gold, iou_threshold=0.95) == pytest.approx(1 / 3)


def test_largest_region_recall_ranks_the_regions_by_area():
    regions = [[[0, 0, 10, 10], [0, 0, 1, 1], [0, 0, 5, 5]], [[0, 0, 10, 10], [0, 0, 5, 5], [0, 0, 1, 1]]]
    # phrase 1: its box is the smallest region (rank 3); phrase 2: two boxes merged into [0, 0, 5, 5] (rank 2)
    gold = [[[0, 0, 1, 1]], [[0, 0, 2, 5], [2, 0, 5, 5]]]
    assert largest_region_recall(regions, gold, ks=(1, 2, 3)) == {1: 0.0, 2: 0.5, 3: 1.0}


def test_compare_with_baselines_flags_an_accuracy_that_does_not_beat_its_baseline():
    results = {"accuracy": 0.5, "vgp_accuracy": 0.75, "per_class": None, "supervision": "none"}
    baselines = {
        "accuracy": Baseline(0.5, "majority_class"),  # a tie does not beat the baseline
        "vgp_accuracy": Baseline(0.25, "majority_class"),
        "per_class": Baseline(0.1, "majority_class"),  # no result (a class without evaluation rows): left out
        "missing": Baseline(0.1, "largest_region"),
    }
    assert compare_with_baselines(results, baselines) == {
        "accuracy": {"value": 0.5, "baseline": 0.5, "kind": "majority_class", "beats": False},
        "vgp_accuracy": {"value": 0.75, "baseline": 0.25, "kind": "majority_class", "beats": True},
    }


def test_vgp_baselines_read_the_training_labels():
    train = datasets.Dataset.from_dict({"id_label": [0, 1, 1], "type_label": [2, 2, -1], "vgp_label": [0, 0, 1]})
    evaluation = datasets.Dataset.from_dict({"id_label": [1, 0], "type_label": [-1, 2], "vgp_label": [1, 1]})
    assert vgp_baselines(train, evaluation, "type") == {
        "image_description_accuracy": Baseline(0.5, "majority_class"),
        "vgp_accuracy": Baseline(1.0, "majority_class"),  # the untyped row is left out on both sides
    }
    assert vgp_baselines(train, evaluation, "binary")["vgp_accuracy"] == Baseline(0.0, "majority_class")


def gqa_record(answer: str, structural: str) -> dict:
    return {"answer": answer, "types": {"structural": structural, "semantic": "attr"}, "isBalanced": True}


def test_question_answering_baselines_of_gqa_rows_score_the_majority_answer_with_the_gqa_script():
    vocab = {"yes": 0, "no": 1, "red": 2}
    answers = ["red", "yes", "yes", "purple", "purple", "purple"]
    train = datasets.Dataset.from_dict({"answer": answers, "label": [2, 0, 0, -1, -1, -1]})
    questions = {"a": gqa_record("yes", "verify"), "b": gqa_record("no", "verify"), "c": gqa_record("red", "query")}
    evaluation = datasets.Dataset.from_dict(
        {"question_id": ["a", "b", "c"], "answer": ["yes", "no", "red"], "label": [0, 1, 2]}
    )
    baselines = question_answering_baselines(vocab, train, evaluation, questions)
    # "purple" is the most frequent training answer but outside the vocabulary: "yes" is the majority
    assert baselines == {
        "accuracy": Baseline(1 / 3, "majority_class"),
        "gqa_accuracy": Baseline(1 / 3, "majority_class"),
        "gqa_binary": Baseline(1 / 2, "majority_class"),
        "gqa_open": Baseline(0.0, "majority_class"),
    }
    # rows without answer strings (a user's labels only): the same majority, read through the vocabulary
    labels_only = question_answering_baselines(vocab, train.remove_columns("answer"), evaluation.remove_columns("answer"))
    assert labels_only == {"accuracy": Baseline(1 / 3, "majority_class")}
    assert gqa_baselines("red", questions, prefix="") == {
        "accuracy": Baseline(1 / 3, "majority_class"),
        "binary": Baseline(0.0, "majority_class"),
        "open": Baseline(1.0, "majority_class"),
    }


def test_question_answering_baselines_of_vqa_rows_use_the_soft_scores_and_each_answer_type():
    vocab = {"yes": 0, "no": 1, "2": 2}
    train = datasets.Dataset.from_dict({
        "labels": [[0], [0, 1], [2]], "scores": [[1.0], [0.3, 1.0], [0.6]], "answer_type": ["yes/no", "yes/no", "number"],
    })  # fmt: skip  (summed: yes 1.3, no 1.0, 2 0.6; per type: yes/no -> yes, number -> 2)
    evaluation = datasets.Dataset.from_dict({
        "labels": [[0], [1], [2]], "scores": [[1.0], [1.0], [0.3]],
        "answers": [["yes"] * 10, ["no"] * 10, ["2"] + ["3"] * 9], "answer_type": ["yes/no", "yes/no", "number"],
    })  # fmt: skip
    baselines = question_answering_baselines(vocab, train, evaluation)
    assert baselines["accuracy"] == Baseline(1 / 3, "majority_class")  # "yes": 1.0, 0, 0
    assert baselines["vqa_accuracy"].value == pytest.approx(1 / 3) and baselines["vqa_accuracy"].kind == "majority_class"
    assert baselines["vqa_accuracy_yes_no"] == Baseline(0.5, "majority_class_per_type")
    # "2" given by 1 of 10 annotators: min(1, 1 / 3) over the 9-annotator subsets that hold it (9 of 10) -> 0.3
    assert baselines["vqa_accuracy_number"].value == pytest.approx(0.3)
    # without answer types: no per-type baselines; without the annotators' answers: no official accuracy either
    untyped = question_answering_baselines(vocab, train.remove_columns("answer_type"), evaluation)
    assert set(untyped) == {"accuracy", "vqa_accuracy"}
    assert set(question_answering_baselines(vocab, train, evaluation.remove_columns("answers"))) == {"accuracy"}


def test_visual_reasoning_answer_label_and_pretraining_baselines():
    baselines = visual_reasoning_baselines([1, 1, 0], [1, 0, 1, 1], ["dev-1-0-0", "dev-1-1-0", "dev-2-0-0", "dev-2-1-0"])
    assert baselines == {"accuracy": Baseline(0.75, "majority_class"), "consistency": Baseline(0.5, "majority_class")}
    train = datasets.Dataset.from_dict({"label": [3, 3, -1, 1]})
    evaluation = datasets.Dataset.from_dict({"label": [3, 1, -1]})
    assert answer_label_baselines(train, evaluation) == {"vqa_accuracy": Baseline(0.5, "majority_class")}
    assert answer_label_baselines(datasets.Dataset.from_dict({"sentence": ["a"]}), evaluation) == {}
    results = {"mlm_accuracy": 0.2, "mlm_most_frequent_token_accuracy": 0.1}
    assert pretraining_baselines(results) == {"mlm_accuracy": Baseline(0.1, "majority_class_eval")}
