"""GQA metrics as the official evaluation script (eval.py of the GQA download) computes them: hand-computed values for
every metric, the script's rules (exact string match, "choose" counts as binary, "...Common" questions, unbalanced
questions read only as entailed ones), input errors, the evaluate module loaded from its local folder, and the real
GQA question records of the shared samples."""

import json

import pytest

from hf_vlalign.metrics.gqa import GQA_METRIC_PATH, METRICS, belongs, chi_square, gqa_scores, load_gqa_metric
from tests.shared_samples import real_sample


def _question(answer: str, structural: str, semantic: str, group: str | None, entailed=(), balanced=True, detailed=""):
    return {
        "answer": answer,
        "isBalanced": balanced,
        "types": {"structural": structural, "semantic": semantic, "detailed": detailed},
        "groups": {"global": group, "local": "local-group"},
        "entailed": list(entailed),
    }


# q3 is unbalanced: never scored itself, read only as an entailed question of q1 and q4
QUESTIONS = {
    "q1": _question("yes", "verify", "attr", None, entailed=["q2", "q3", "q1"], detailed="verifyAttr"),
    "q2": _question("cat", "query", "rel", "animal", detailed="relS"),
    "q3": _question("red", "query", "attr", "color", balanced=False, detailed="queryAttr"),
    "q4": _question("left", "choose", "attr", None, entailed=["q3"], detailed="chooseAttr"),
    "q5": _question("dog", "query", "cat", "animal", detailed="categoryThat"),
    "q6": _question("color", "query", "attr", None, detailed="twoCommon"),
    "q7": _question("red", "query", "attr", "color", detailed="queryAttr"),
}
PREDICTIONS = {"q1": "yes", "q2": "dog", "q3": "red", "q4": "left", "q5": "dog", "q6": "material", "q7": "blue"}
CHOICES = {
    "q1": {"valid": ["yes", "no"], "plausible": ["yes", "no"]},
    "q2": {"valid": ["cat", "dog", "table"], "plausible": ["cat", "dog"]},
    "q4": {"valid": ["left", "right"], "plausible": ["left", "right"]},
    "q5": {"valid": ["cat", "dog"], "plausible": ["cat"]},
    "q6": {"valid": ["yes"], "plausible": []},  # a "Common" question: the script uses (color, material, shape)
    "q7": {"valid": ["red", "green"], "plausible": ["red"]},
}


def test_hand_computed_metrics():
    scores = gqa_scores(PREDICTIONS, QUESTIONS, CHOICES)
    # balanced q1 q2 q4 q5 q6 q7; correct q1 q4 q5 -> 3 / 6
    assert scores["num_questions"] == 6
    assert scores["accuracy"] == pytest.approx(3 / 6)
    # eval.py: "open" iff structural == "query": binary = q1 (verify) + q4 (choose) -> 2 / 2; open = q2 q5 q6 q7 -> 1 / 4
    assert scores["binary"] == pytest.approx(1.0)
    assert scores["open"] == pytest.approx(1 / 4)
    # correct questions with entailed ones: q1 -> [q2 wrong, q3 right] (itself excluded) = 1/2; q4 -> [q3 right] = 1;
    # q5 is correct but entails nothing, q2 is wrong -> mean(1/2, 1) = 3/4
    assert scores["consistency"] == pytest.approx(3 / 4)
    # valid: all but q7 ("blue" not in [red, green]); q6 "material" is valid by the Common rule -> 5 / 6
    assert scores["validity"] == pytest.approx(5 / 6)
    # plausible: q1 q2 q4 q6 yes; q5 ("dog" not in [cat]) and q7 no -> 4 / 6
    assert scores["plausibility"] == pytest.approx(4 / 6)
    # groups: animal gold {cat: 1, dog: 1} vs predicted {dog: 2}: (0-1)^2/1 + (2-1)^2/1 = 2, 2 questions;
    # color gold {red: 1} vs predicted {blue: 1}: (0-1)^2/1 = 1 ("blue" is no gold answer: not counted), 1 question;
    # q1 q4 q6 have no global group -> (2 x 2 + 1 x 1) / 3, / 100
    assert scores["distribution"] == pytest.approx(5 / 3 / 100)
    assert scores["accuracy_per_structural_type"] == pytest.approx({"choose": 1.0, "query": 1 / 4, "verify": 1.0})
    assert scores["questions_per_structural_type"] == {"choose": 1, "query": 4, "verify": 1}
    # attr: q1 right, q4 right, q6 wrong, q7 wrong; cat: q5 right; rel: q2 wrong
    assert scores["accuracy_per_semantic_type"] == pytest.approx({"attr": 0.5, "cat": 1.0, "rel": 0.0})
    assert scores["questions_per_semantic_type"] == {"attr": 4, "cat": 1, "rel": 1}
    every_metric = ["accuracy", "binary", "open", "consistency", "validity", "plausibility", "distribution"]
    assert scores["computed"] == every_metric == list(METRICS)


def test_answers_are_compared_exactly_as_given():
    # eval.py: correct = (predicted == gold), no normalisation
    for prediction, expected in (("yes", 1.0), ("Yes", 0.0), ("yes ", 0.0), ("yes.", 0.0)):
        assert gqa_scores({"q1": prediction}, {"q1": QUESTIONS["q1"]}, consistency=False)["accuracy"] == expected


def test_choices_are_optional():
    scores = gqa_scores(PREDICTIONS, QUESTIONS)
    assert scores["validity"] is None and scores["plausibility"] is None
    assert "validity" not in scores["computed"] and "plausibility" not in scores["computed"]
    assert scores["accuracy"] == pytest.approx(0.5) and scores["consistency"] == pytest.approx(0.75)


def test_belongs_and_the_common_rule():
    assert belongs("red", ["red"], QUESTIONS["q7"]) and not belongs("blue", ["red"], QUESTIONS["q7"])
    # eval.py belongs(): "Common" in types.detailed -> the group is ["color", "material", "shape"], whatever is given
    assert belongs("shape", [], QUESTIONS["q6"]) and not belongs("yes", ["yes"], QUESTIONS["q6"])


def test_chi_square_on_a_tiny_distribution():
    # group a: gold {x: 2, y: 1} vs predicted {x: 1, y: 1, z: 1}: (1-2)^2/2 + (1-1)^2/1 = 0.5 (z is no gold answer),
    # 3 questions; group b: gold {u: 1} vs predicted {u: 1}: 0, 1 question -> (0.5 x 3 + 0 x 1) / 4 = 0.375
    gold = {"a": {"x": 2, "y": 1}, "b": {"u": 1}}
    predicted = {"a": {"x": 1, "y": 1, "z": 1}, "b": {"u": 1}}
    assert chi_square(gold, predicted) == pytest.approx(0.375)
    questions = {
        "1": _question("x", "query", "attr", "a"),
        "2": _question("x", "query", "attr", "a"),
        "3": _question("y", "query", "attr", "a"),
        "4": _question("u", "query", "attr", "b"),
    }
    scores = gqa_scores({"1": "x", "2": "z", "3": "y", "4": "u"}, questions)
    # eval.py: scores["distribution"] = chiSquare(dist["gold"], dist["predicted"]) / 100
    assert scores["distribution"] == pytest.approx(0.375 / 100)
    assert gqa_scores({"1": "x", "2": "x", "3": "y", "4": "u"}, questions)["distribution"] == 0.0
    # a group with no prediction at all: every gold answer counts e -> (0 - e)^2 / e = e
    assert chi_square({"a": {"x": 3}}, {}) == pytest.approx(3.0)


def test_metrics_without_inputs_are_none():
    # no entailed questions -> no consistency; no global group -> no distribution; only binary questions -> no open
    questions = {"1": _question("yes", "verify", "attr", None), "2": _question("no", "logical", "obj", None)}
    scores = gqa_scores({"1": "yes", "2": "yes"}, questions)
    assert scores["accuracy"] == pytest.approx(0.5) and scores["binary"] == pytest.approx(0.5)
    assert scores["open"] is None and scores["consistency"] is None and scores["distribution"] is None
    assert scores["computed"] == ["accuracy", "binary"]
    # entailed questions exist but no correctly answered question has any -> consistency None (the script's avg: 0)
    questions["1"]["entailed"] = ["2"]
    assert gqa_scores({"1": "no", "2": "yes"}, questions)["consistency"] is None
    assert gqa_scores({"1": "yes", "2": "yes"}, questions)["consistency"] == 0.0
    assert gqa_scores({"1": "yes", "2": "no"}, questions)["consistency"] == 1.0


def test_consistency_modes():
    # q1 entails q9, which `questions` lacks (a balanced file without its all_questions companion)
    questions = {"q1": {**QUESTIONS["q1"], "entailed": ["q9"]}, "q2": QUESTIONS["q2"]}
    predictions = {"q1": "yes", "q2": "cat"}
    assert gqa_scores(predictions, questions)["consistency"] is None  # automatic: left out
    with pytest.raises(ValueError, match=r"`questions` must hold the entailed questions.*'q9'"):
        gqa_scores(predictions, questions, consistency=True)
    assert gqa_scores(PREDICTIONS, QUESTIONS, consistency=False)["consistency"] is None
    assert gqa_scores(PREDICTIONS, QUESTIONS, consistency=True)["consistency"] == pytest.approx(0.75)
    # the unbalanced q3 needs a prediction only when consistency is computed
    without_q3 = {qid: answer for qid, answer in PREDICTIONS.items() if qid != "q3"}
    assert gqa_scores(without_q3, QUESTIONS, consistency=False)["accuracy"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"`predictions` must hold a predicted answer.*missing 1: 'q3'"):
        gqa_scores(without_q3, QUESTIONS)


@pytest.mark.parametrize(
    ("predictions", "questions", "choices", "message"),
    [
        ({}, {"a": QUESTIONS["q2"], "b": QUESTIONS["q5"]}, None, r"`predictions` must hold .* missing 2: 'a', 'b'"),
        ({"q3": "red"}, {"q3": QUESTIONS["q3"]}, None, "at least one balanced question"),
        ({"q": "yes"}, {"q": {**QUESTIONS["q2"], "answer": None}}, None, r"`questions\['q'\]\['answer'\]`.*got None"),
        ({"q2": "cat"}, {"q2": QUESTIONS["q2"]}, {}, r"`choices` must hold .* missing 1: 'q2'"),
    ],
)
def test_input_errors_name_the_argument(predictions, questions, choices, message):
    with pytest.raises(ValueError, match=message):
        gqa_scores(predictions, questions, choices)


def test_missing_predictions_are_named_first_few():
    questions = {str(i): _question("yes", "verify", "attr", None) for i in range(8)}
    with pytest.raises(ValueError, match=r"missing 8: '0', '1', '2', '3', '4' and 3 more"):
        gqa_scores({}, questions)


def test_evaluate_module_from_the_local_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import evaluate

    assert (GQA_METRIC_PATH / "gqa_accuracy.py").is_file()
    metric = evaluate.load(str(GQA_METRIC_PATH))
    question_ids = list(PREDICTIONS)
    answers = [PREDICTIONS[qid] for qid in question_ids]
    from_module = metric.compute(predictions=answers, question_ids=question_ids, questions=QUESTIONS, choices=CHOICES)
    assert from_module == gqa_scores(PREDICTIONS, QUESTIONS, CHOICES)
    assert from_module["consistency"] == pytest.approx(0.75) and from_module["validity"] == pytest.approx(5 / 6)
    helper = load_gqa_metric()
    for qid, answer in zip(question_ids, answers):
        helper.add(predictions=answer, question_ids=qid)
    assert helper.compute(questions=QUESTIONS) == gqa_scores(PREDICTIONS, QUESTIONS)
    with pytest.raises(ValueError, match="`question_ids` must be unique"):
        metric.compute(predictions=["yes", "no"], question_ids=["q1", "q1"], questions=QUESTIONS)
    with pytest.raises(ValueError, match="`questions` must be given"):
        metric.compute(predictions=["yes"], question_ids=["q1"])


def _real_questions() -> dict:
    # AllenNLP's GQA fixture: 202218649 (balanced, open, group "thing", entails 202218648 which is not in the sample)
    # and 20240871 (unbalanced, logical, no global group)
    questions = json.loads(real_sample("gqa", "allennlp_fixture", "questions.json").read_text())
    shard = real_sample("gqa", "allennlp_fixture", "question_dir", "questions1.json")
    questions.update(json.loads(shard.read_text()))
    return questions


def test_real_gqa_questions():
    questions = _real_questions()
    assert set(questions) == {"202218649", "20240871"}
    gold = {qid: question["answer"] for qid, question in questions.items()}
    scores = gqa_scores(gold, questions)
    assert scores["num_questions"] == 1  # only the balanced one is scored
    assert scores["accuracy"] == 1.0 and scores["open"] == 1.0 and scores["distribution"] == 0.0
    assert scores["binary"] is None
    assert scores["accuracy_per_structural_type"] == {"query": 1.0}
    assert scores["accuracy_per_semantic_type"] == {"rel": 1.0}
    # its entailed question 202218648 is not in the sample: consistency is left out, or an error when required
    assert scores["consistency"] is None and scores["computed"] == ["accuracy", "open", "distribution"]
    with pytest.raises(ValueError, match="'202218648'"):
        gqa_scores(gold, questions, consistency=True)
    # a wrong answer: group "thing" gold {picture: 1} vs predicted {painting: 1} -> (0 - 1)^2 / 1 = 1, / 100
    wrong = gqa_scores({**gold, "202218649": "painting"}, questions)
    assert wrong["accuracy"] == 0.0 and wrong["distribution"] == pytest.approx(0.01)
    # with the 20240871 record marked balanced (a copy; the file is untouched): logical -> binary, no global group
    both = {**questions, "20240871": {**questions["20240871"], "isBalanced": True}}
    scores = gqa_scores(gold, both)
    assert scores["binary"] == 1.0 and scores["accuracy"] == 1.0 and scores["distribution"] == 0.0
    assert scores["questions_per_structural_type"] == {"logical": 1, "query": 1}
