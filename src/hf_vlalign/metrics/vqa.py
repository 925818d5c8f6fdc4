"""VQA accuracy (Antol et al. 2015; Goyal et al. 2017) as the official evaluation script computes it
(`PythonEvaluationTools/vqaEvaluation/vqaEval.py` of GT-Vision-Lab/VQA) for questions with ten human answers, and a
documented rule for questions with fewer (a user's own rows, often one `answer`):

    >>> vqa_accuracy(["Two"], [["2", "2", "3", "2", "2", "2", "2", "2", "2", "2"]])
    {'accuracy': 1.0, 'num_questions': 1}
    >>> vqa_accuracy(["cat", "red"], [["cat"], ["red"]])
    {'accuracy': 1.0, 'num_questions': 2}

Ten (or more) human answers, the official metric: the predicted answer is normalised (`normalize_vqa_answer`:
punctuation, number words, articles, contractions); the human answers only go through `process_punctuation`, and only
when they are not all identical, as in the script (`normalize_references=True` normalises them fully). A question's
accuracy is the mean over the leave-one-out subsets of nine human answers of min(1, #matches / 3) (Antol et al.'s
"an answer is 100% accurate if at least 3 humans gave it", averaged over the 10 choose 9 subsets).

Fewer than ten answers (`answer_credit`): min(1, #matches / min(3, n)) over the n answers, with no leave-one-out, and
both sides fully normalised. Why: leave-one-out over n < 10 answers leaves subsets too small to reach three matches
(one answer leaves an empty subset: a correct single answer would score 0, two identical answers 1/3), and the
answers are the user's own, not the VQA pipeline's already normalised ones ("two" must match "2"). So a correct
single answer scores 1, an answer all of n <= 3 humans gave scores 1, one of two answers 0.5, and from three answers on
the official saturation min(1, #matches / 3) holds. The same credit is each answer's training score
(`data.builders.user_data.with_soft_scores`), so a model's soft-score accuracy and this metric agree on such rows.

Unlike the script, accuracies are fractions in [0, 1], and per-question-type accuracy is left out (`answer_types`
gives the per-answer-type split).
"""

from __future__ import annotations

import re

from .local_modules import MODULES_DIR, load_local_metric

VQA_METRIC_PATH = MODULES_DIR / "vqa_accuracy"

# vqaEval.py's tables, copied as they are (including their quirks: keys with capitals such as "Im" never match the
# lower-cased words, and "somebody'd" maps to "somebodyd")
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't", "dont": "don't",
    "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't", "havent": "haven't",
    "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd", "howll": "how'll",
    "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd",
    "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't",
    "mustve": "must've", "neednt": "needn't", "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've",
    "she'dve": "she'd've", "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've", "somebody'dve": "somebody'd've", "somebodyll": "somebody'll",
    "somebodys": "somebody's", "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd", "somethingd've": "something'd've",
    "something'dve": "something'd've", "somethingll": "something'll", "thats": "that's", "thered": "there'd",
    "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've",
    "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't",
    "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd",
    "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're", "youve": "you've",
}  # fmt: skip
NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
ARTICLES = ("a", "an", "the")
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
# vqaEval.py's periodStrip: "(?!<=\d)" is a look-*ahead* (a typo for a look-behind), so every "." not followed by a
# digit is removed ("yes." -> "yes", "3.5" kept, but "5." -> "5")
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(\,)(\d)")
# vqaEval.py calls `periodStrip.sub("", outText, re.UNICODE)`: re.UNICODE (= 32) lands in `count`, so at most 32
# periods are removed
_PERIOD_STRIP_COUNT = int(re.UNICODE)
# the number of human answers per question in VQA v1 / v2, and the "3 humans agree" saturation of Antol et al. eq. (1)
NUM_HUMAN_ANSWERS = 10
_AGREEMENT = 3


def process_punctuation(text: str) -> str:
    """vqaEval.py `processPunctuation`: each punctuation mark is deleted when it touches a space somewhere in the text
    (or the text holds a digit-comma-digit, "1,000"), else replaced by a space; then periods not before a digit go."""
    out = text
    for mark in PUNCTUATION:
        # the test reads the *original* text, as in the script
        if (mark + " " in text or " " + mark in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD_STRIP.sub("", out, count=_PERIOD_STRIP_COUNT)


def process_digit_article(text: str) -> str:
    """vqaEval.py `processDigitArticle`: lower-case, number words -> digits, articles dropped, contractions fixed."""
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    words = [word for word in words if word not in ARTICLES]
    return " ".join(CONTRACTIONS.get(word, word) for word in words)


def normalize_vqa_answer(answer: str) -> str:
    """The official normalisation of a predicted answer: "Two dogs." -> "2 dogs", "a dog" -> "dog",
    "dont" -> "don't"."""
    # vqaEval.py evaluate(): resAns.replace('\n', ' ').replace('\t', ' ').strip()
    text = answer.replace("\n", " ").replace("\t", " ").strip()
    return process_digit_article(process_punctuation(text))


def _check_inputs(predictions, answers, answer_types) -> tuple[list[str], list[list[str]], list[str] | None]:
    """One list of human answers (and one type, when given) per prediction, at least one prediction."""
    if len(predictions) == 0 or len(answers) != len(predictions):
        raise ValueError(
            f"`answers` must hold one list of human answers per prediction (at least one), got {len(answers)} lists "
            f"for {len(predictions)} predictions."
        )
    if answer_types is not None and len(answer_types) != len(predictions):
        raise ValueError(
            f"`answer_types` must hold one type per prediction, got {len(answer_types)} types for "
            f"{len(predictions)} predictions."
        )
    for i, prediction in enumerate(predictions):
        if not isinstance(prediction, str):
            kind = type(prediction).__name__
            raise ValueError(f"`predictions[{i}]` must be an answer string, got {kind}: {prediction!r}.")
    for i, human in enumerate(answers):
        # a bare string would be read as one answer per character
        if isinstance(human, str) or len(human) == 0 or not all(isinstance(answer, str) for answer in human):
            raise ValueError(
                f"`answers[{i}]` must be a non-empty list of answer strings (e.g. ['cat'] for a single answer), got "
                f"{human!r}."
            )
    return list(predictions), [list(human) for human in answers], answer_types and list(answer_types)


def _reference_answers(human: list[str], normalize_references: bool) -> list[str]:
    if normalize_references:
        return [normalize_vqa_answer(answer) for answer in human]
    # vqaEval.py: `if len(set(gtAnswers)) > 1: ansDic['answer'] = self.processPunctuation(ansDic['answer'])`
    if len(set(human)) > 1:
        return [process_punctuation(answer) for answer in human]
    return list(human)


def answer_credit(matches: int, num_answers: int) -> float:
    """The credit of an answer that `matches` of `num_answers` humans gave, without leave-one-out:
    min(1, matches / min(3, num_answers)). From three answers on, Antol et al.'s min(1, #humans / 3) (VQA's soft score);
    with one or two answers, agreeing with all of them is full credit (one answer: 1 if it matches, else 0)."""
    return min(1.0, matches / min(_AGREEMENT, num_answers))


def vqa_question_accuracy(prediction: str, human_answers: list[str], normalize_references: bool = False) -> float:
    """Accuracy of one answer against the human answers, in [0, 1]: the official leave-one-out mean with ten (or more)
    answers, `answer_credit` over both sides normalised with fewer (the module docstring says why)."""
    predicted = normalize_vqa_answer(prediction)
    if len(human_answers) < NUM_HUMAN_ANSWERS:
        matches = sum(normalize_vqa_answer(answer) == predicted for answer in human_answers)
        return answer_credit(matches, len(human_answers))
    references = _reference_answers(list(human_answers), normalize_references)
    scores = []
    for left_out in range(len(references)):
        others = references[:left_out] + references[left_out + 1 :]
        matches = sum(answer == predicted for answer in others)
        # vqaEval.py: acc = min(1, float(len(matchingAns)) / 3)  (Antol et al. eq. (1), averaged over the 10 subsets)
        scores.append(min(1.0, matches / _AGREEMENT))
    # vqaEval.py: avgGTAcc = float(sum(gtAcc)) / len(gtAcc)
    return sum(scores) / len(scores)


def vqa_accuracy(
    predictions: list[str],
    answers: list[list[str]],
    answer_types: list[str] | None = None,
    normalize_references: bool = False,
) -> dict:
    """VQA accuracy of `predictions` (one answer string per question) against `answers` (the human answers of each
    question, at least one), in [0, 1]: the official leave-one-out accuracy for questions with ten answers (VQA v1 /
    v2), `answer_credit` of both sides normalised for questions with fewer (a correct single answer scores 1).
    `normalize_references` applies to questions of ten answers (the others are always normalised).

    Returns {"accuracy", "num_questions"} and, when `answer_types` (one per question) is given, "per_answer_type":
    the mean accuracy of the questions of each type, in first-seen order.
    """
    predictions, answers, answer_types = _check_inputs(predictions, answers, answer_types)
    per_question = [
        vqa_question_accuracy(prediction, human, normalize_references)
        for prediction, human in zip(predictions, answers)
    ]
    result = {"accuracy": sum(per_question) / len(per_question)}
    if answer_types is not None:
        by_type: dict[str, list[float]] = {}
        for answer_type, score in zip(answer_types, per_question):
            by_type.setdefault(answer_type, []).append(score)
        result["per_answer_type"] = {answer_type: sum(s) / len(s) for answer_type, s in by_type.items()}
    result["num_questions"] = len(per_question)
    return result


def load_vqa_metric(**kwargs):
    """`evaluate.load` of this package's VQA accuracy module from its local folder (no Hub access):
    `load_vqa_metric().compute(predictions=[...], references=[[...], ...], answer_types=...)` returns
    `vqa_accuracy`'s dict."""
    return load_local_metric("vqa_accuracy", **kwargs)


__all__ = [
    "ARTICLES",
    "CONTRACTIONS",
    "NUMBER_WORDS",
    "NUM_HUMAN_ANSWERS",
    "PUNCTUATION",
    "VQA_METRIC_PATH",
    "answer_credit",
    "load_vqa_metric",
    "normalize_vqa_answer",
    "process_digit_article",
    "process_punctuation",
    "vqa_accuracy",
    "vqa_question_accuracy",
]
