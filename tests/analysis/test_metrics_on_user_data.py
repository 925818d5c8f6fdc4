"""Every metric of `hf_vlalign.metrics` on rows in the user formats (docs/own_data.md), each value computed by hand: VQA
accuracy with one to nine answers (a correct single answer scores 1) beside the official ten-answer score, the user
files' answers normalised as VQA's and their training scores equal to the metric's credit, NLVR2 consistency over
sentence texts, GQA records holding only an answer, captions with a single reference; and docs/own_data.md's
"Metrics" section, whose printed values are the code's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import skimage
from transformers import EvalPrediction

from hf_vlalign.data.builders.user_data import UserDataError, answer_vocabulary, build_user_dataset, with_soft_scores
from hf_vlalign.evaluation.task_metrics import answer_metrics
from hf_vlalign.metrics import gqa_scores, nlvr2_scores, vqa_accuracy
from tests.hub.test_task_model_cards import render
from tests.project.test_readme import python_blocks

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = Path(os.path.dirname(skimage.__file__)) / "data"


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("chelsea.png", "coffee.png"):
        shutil.copy(PHOTOS / name, folder / name)
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --------------------------------------------------------------------------------------------------------------------
# VQA
# --------------------------------------------------------------------------------------------------------------------


def test_a_correct_single_answer_scores_one():
    # the case: leave-one-out over one answer leaves no answer, so the official loop gave 0 to every row
    assert vqa_accuracy(["cat", "red"], [["cat"], ["red"]]) == {"accuracy": 1.0, "num_questions": 2}
    assert vqa_accuracy(["cat", "blue"], [["cat"], ["red"]])["accuracy"] == 0.5


@pytest.mark.parametrize(
    "answers, expected",
    [
        (["cat", "cat"], 1.0),  # all of two people: full credit (min(3, 2) = 2)
        (["cat", "dog"], 0.5),
        (["cat", "dog", "dog"], 1 / 3),  # from three answers on: min(1, matches / 3)
        (["cat", "cat", "cat", "dog"], 1.0),
        (["cat"] * 2 + ["dog"] * 7, 2 / 3),  # nine answers: no leave-one-out
        (["cat"] * 2 + ["dog"] * 8, 0.6),  # ten: the official leave-one-out mean, (2 * 1/3 + 8 * 2/3) / 10
        (["cat"] * 3 + ["dog"] * 7, 0.9),
    ],
)
def test_fewer_than_ten_answers_get_the_documented_credit(answers, expected):
    assert vqa_accuracy(["cat"], [answers])["accuracy"] == pytest.approx(expected, abs=1e-12)
    if len(answers) < 10:
        from hf_vlalign.metrics.vqa import answer_credit  # the rule's function

        assert answer_credit(answers.count("cat"), len(answers)) == pytest.approx(expected, abs=1e-12)


def test_fewer_than_ten_answers_are_normalised_on_both_sides():
    # a user's answers are not VQA's pre-normalised ones: "two" matches the prediction "Two" (-> "2")
    assert vqa_accuracy(["Two", "a cat", "yes"], [["two"], ["Cat"], ["Yes."]])["accuracy"] == 1.0
    # ten answers keep the official script's handling (the human answers are not normalised)
    assert vqa_accuracy(["two"], [["two"] * 10])["accuracy"] == 0.0


@pytest.mark.parametrize("answers", [["cat"], [[]], [["cat", 3]]])
def test_answers_must_be_lists_of_strings(answers):
    # a bare string would have been read as one answer per character ("cat" -> "c", "a", "t")
    with pytest.raises(ValueError, match=r"`answers\[0\]` must be a non-empty list of answer strings"):
        vqa_accuracy(["cat"], answers)
    with pytest.raises(ValueError, match=r"`predictions\[0\]` must be an answer string, got int: 2"):
        vqa_accuracy([2], [["2"]])  # an answer id, not its answer


def test_user_rows_training_scores_agree_with_vqa_accuracy():
    rows = datasets.Dataset.from_dict(
        {
            "answers": [["cat"], ["red"], ["coffee", "tea"], ["coffee", "coffee", "tea"]],
            "answer_type": ["", "", "", ""],
        }
    )
    vocab = answer_vocabulary(rows)
    assert vocab == {"coffee": 0, "tea": 1, "cat": 2, "red": 3}
    rows = with_soft_scores(rows, vocab)
    assert rows["scores"] == [[1.0], [1.0], [0.5, 0.5], pytest.approx([2 / 3, 1 / 3])]
    soft = np.zeros((len(rows), len(vocab)), dtype=np.float32)
    for i, (labels, scores) in enumerate(zip(rows["labels"], rows["scores"])):
        soft[i, labels] = scores
    predicted = np.array([vocab["cat"], vocab["cat"], vocab["coffee"], vocab["tea"]])
    metrics = answer_metrics(vocab, None, rows)(EvalPrediction(predictions=predicted, label_ids=soft))
    # right single answer 1, wrong one 0, one of two answers 0.5, one of three 1/3
    expected = (1 + 0 + 0.5 + 1 / 3) / 4
    assert metrics == {"accuracy": pytest.approx(expected, abs=1e-6), "vqa_accuracy": pytest.approx(expected)}


def test_the_task_card_states_the_rule_for_fewer_answers():
    text = " ".join(render("question_answering", "single_stream").text.split())
    assert "a question with n < 10 answers (user rows) scores min(1, #who gave it / min(3, n))" in text


def test_user_file_answers_are_normalised_as_vqa(photos, tmp_path):
    rows = [
        {"image": "photos/chelsea.png", "question": "how many cats ?", "answer": "One"},
        {"image": "photos/coffee.png", "question": "what is this ?", "answers": ["A cup.", "a cup", "Two cups"]},
    ]
    dataset = build_user_dataset(write_jsonl(tmp_path / "vqa.jsonl", rows), "vqa")
    assert dataset["answers"] == [["1"], ["cup", "cup", "2 cups"]]
    with pytest.raises(UserDataError, match=r"line 1: every answer must keep a word once normalised as VQA's"):
        build_user_dataset(write_jsonl(tmp_path / "bad.jsonl", [dict(rows[0], answer="the")]), "vqa")


# --------------------------------------------------------------------------------------------------------------------
# NLVR2, GQA, captions
# --------------------------------------------------------------------------------------------------------------------

SENTENCES = ["one image shows a cat .", "one image shows a cat .", "both images show a cup ."]


def test_nlvr2_consistency_over_sentence_texts():
    # sentence A: the second pair is wrong -> inconsistent; sentence B: right -> consistency 1/2, accuracy 2/3
    result = nlvr2_scores([True, True, False], [True, False, False], sentences=SENTENCES)
    assert result == {"accuracy": pytest.approx(2 / 3), "consistency": 0.5, "num_examples": 3, "num_sentences": 2}
    with pytest.raises(ValueError, match="give exactly one of `identifiers`"):
        nlvr2_scores([True], [True])
    with pytest.raises(ValueError, match="give exactly one of `identifiers`"):
        nlvr2_scores([True], [True], ["dev-1-0-0"], sentences=["a cat ."])
    with pytest.raises(ValueError, match=r"`sentences\[0\]` must be the example's sentence text"):
        nlvr2_scores([True], [True], sentences=[" "])


def test_nlvr2_user_file_identifiers_group_as_the_sentences(photos, tmp_path):
    pairs = [("chelsea", "coffee"), ("coffee", "chelsea"), ("chelsea", "chelsea")]
    rows = [
        {"left_image": f"photos/{left}.png", "right_image": f"photos/{right}.png", "sentence": sentence, "label": label}
        for (left, right), sentence, label in zip(pairs, SENTENCES, [True, False, False])
    ]
    dataset = build_user_dataset(write_jsonl(tmp_path / "nlvr2.jsonl", rows), "nlvr2")
    predictions = [True, True, False]
    by_identifier = nlvr2_scores(predictions, dataset["label"], dataset["identifier"])
    assert by_identifier == nlvr2_scores(predictions, dataset["label"], sentences=dataset["sentence"])
    assert by_identifier["consistency"] == 0.5


def test_gqa_records_holding_only_the_answer():
    questions = {"q1": {"answer": "yes"}, "q2": {"answer": "blue"}, "q3": {"answer": "no"}}
    scores = gqa_scores({"q1": "yes", "q2": "red", "q3": "no"}, questions)
    assert scores["accuracy"] == pytest.approx(2 / 3)
    assert (scores["binary"], scores["open"], scores["consistency"], scores["distribution"]) == (None, None, None, None)
    assert scores["accuracy_per_structural_type"] == {} and scores["questions_per_semantic_type"] == {}
    assert scores["computed"] == ["accuracy"]
    # typed and untyped records together: binary / open over the typed ones only
    questions["q3"]["types"] = {"structural": "verify", "semantic": "attr"}
    scores = gqa_scores({"q1": "yes", "q2": "red", "q3": "yes"}, questions)
    assert (scores["accuracy"], scores["binary"], scores["open"]) == (pytest.approx(1 / 3), 0.0, None)
    assert scores["questions_per_structural_type"] == {"verify": 1}
    with pytest.raises(ValueError, match=r"`questions\['q1'\]` must be a question record such as"):
        gqa_scores({"q1": "yes"}, {"q1": "yes"})


def test_captions_with_a_single_reference():
    from hf_vlalign.metrics import caption_scores

    predictions = ["a red cup of coffee", "a cat with green eyes"]
    references = [["a red cup of coffee"], ["a cat with green eyes"]]
    scores = caption_scores(predictions, references, metrics=("bleu", "rouge_l", "cider"), tokenizer="simple")
    # exact matches: BLEU and ROUGE-L 1; CIDEr-D 10 (x10 the cosine 1 of each n-gram order: every order keeps n-grams of
    # idf log(2) > 0, those of one image only; the shared "a" has idf 0)
    assert scores == {
        "bleu_1": pytest.approx(1.0),
        "bleu_2": pytest.approx(1.0),
        "bleu_3": pytest.approx(1.0),
        "bleu_4": pytest.approx(1.0),
        "rouge_l": pytest.approx(1.0),
        "cider": pytest.approx(10.0),
    }


# --------------------------------------------------------------------------------------------------------------------
# docs/own_data.md, "Metrics"
# --------------------------------------------------------------------------------------------------------------------

EXPECTED = re.compile(r"#\s*->\s*(.*)$")


def metrics_section_block():
    blocks = python_blocks((ROOT / "docs" / "own_data.md").read_text(), "docs/own_data.md")
    section = [block for block in blocks if block.heading == "Metrics"]
    assert len(section) == 1, "docs/own_data.md must hold one python block under its `## Metrics` heading"
    return section[0]


def test_own_data_metrics_section_prints_what_the_code_computes():
    block = metrics_section_block()
    expected = [match.group(1).strip() for line in block.source.splitlines() if (match := EXPECTED.search(line))]
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block.source, "docs/own_data.md, Metrics", "exec"), {"__name__": "own_data_metrics"})
    assert output.getvalue().splitlines() == expected
    assert len(expected) >= 9  # VQA (five), NLVR2, referring, phrase grounding, GQA
