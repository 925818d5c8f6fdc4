"""VQA v2 (Goyal et al. 2017): official question and annotation files -> one row per question, with soft answer scores.

Soft scores: answers are normalised as the official evaluation does (`normalize_answer`) and an answer given by `c`
annotators scores `min(c / 3, 1)`, the VQA accuracy itself (bottom-up-attention-vqa's `compute_softscore.get_score`,
which LXMERT inherits, steps 0.3 / 0.6 / 0.9 / 1 and counts raw answers). Without `answer_vocab` the vocabulary is
built from the train annotations by `compute_softscore.filter_answers`' rule (`build_answer_vocab`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import datasets

from ...metrics.vqa import normalize_vqa_answer
from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    UniqueIds,
    check_image_id_template,
    check_split,
    read_json,
    resolve_path,
)


logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test", "test-dev")
QUESTIONS_FILE = {
    "train": "v2_OpenEnded_mscoco_train2014_questions.json",
    "val": "v2_OpenEnded_mscoco_val2014_questions.json",
    "test": "v2_OpenEnded_mscoco_test2015_questions.json",
    "test-dev": "v2_OpenEnded_mscoco_test-dev2015_questions.json",
}
ANNOTATIONS_FILE = {"train": "v2_mscoco_train2014_annotations.json", "val": "v2_mscoco_val2014_annotations.json"}
# the questions file's `data_subtype`, and the COCO image folder of its images
DATA_SUBTYPE = {"train": "train2014", "val": "val2014", "test": "test2015", "test-dev": "test-dev2015"}
COCO_SPLIT = {"train": "train2014", "val": "val2014", "test": "test2015", "test-dev": "test2015"}
STORE_ID_COLUMNS = ("image_id", "coco_split")
TSV_ID = "COCO_{split}_{id:012d}"  # LXMERT's feature id of a COCO image

VQA_FEATURES = datasets.Features(
    {
        "question_id": datasets.Value("int64"),
        "image_id": datasets.Value("string"),
        "coco_split": datasets.Value("string"),
        "image_size": IMAGE_SIZE,
        "question": datasets.Value("string"),
        "question_type": datasets.Value("string"),
        "answer_type": datasets.Value("string"),
        "multiple_choice_answer": datasets.Value("string"),
        "answers": datasets.List(datasets.Value("string")),
        "labels": datasets.List(datasets.Value("int32")),
        "scores": datasets.List(datasets.Value("float32")),
    }
)


def normalize_answer(answer: str) -> str:
    """The official VQA evaluation's answer normalisation (`normalize_vqa_answer`: punctuation, number words ->
    digits, articles dropped, contractions restored), then commas dropped, as bottom-up-attention-vqa's
    `preprocess_answer` makes the answer vocabularies."""
    if not isinstance(answer, str):
        raise ValueError(f"`answer` must be a string, got {type(answer).__name__}: {answer!r}.")
    return normalize_vqa_answer(answer).replace(",", "")


def answer_score(count: int) -> float:
    """Soft score of an answer given by `count` of the annotators: min(count / 3, 1) (the VQA accuracy)."""
    return min(count / 3.0, 1.0)


def soft_targets(answers: Sequence[str], answer_vocab: Mapping[str, int]) -> tuple[list[int], list[float]]:
    """(labels, scores) of already normalised `answers`: one entry per distinct answer that is in `answer_vocab`."""
    counts = {answer: count for answer, count in Counter(answers).items() if answer in answer_vocab}
    return [answer_vocab[answer] for answer in counts], [answer_score(count) for count in counts.values()]


def read_answer_vocab(
    answer_vocab: str | Path | Mapping[str, int], argument: str = "answer_vocab", data_dir: Path | None = None
) -> dict[str, int]:
    """An ans2label mapping ({answer: label}, labels 0..n-1 each once) from a dict or a JSON file (a relative path is
    read from `data_dir`), checked."""
    vocab = answer_vocab
    if not isinstance(vocab, Mapping):
        vocab = read_json(resolve_path(data_dir, answer_vocab), argument, "an ans2label JSON file")
    if not isinstance(vocab, Mapping) or not vocab:
        raise ValueError(
            f"`{argument}` must be a non-empty {{answer: label}} mapping (ans2label), got {type(vocab).__name__}."
        )
    bad = [(answer, label) for answer, label in vocab.items() if not isinstance(answer, str) or type(label) is not int]
    if bad:
        raise ValueError(f"`{argument}` must map answer strings to int labels, got e.g. {bad[0]!r}.")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(
            f"`{argument}` labels must be 0..{len(vocab) - 1}, each used once (an ans2label file, not label2ans)."
        )
    return dict(vocab)


def build_answer_vocab(annotations_file: str | Path | Sequence[str | Path], min_count: int = 9) -> dict[str, int]:
    """The answer vocabulary of `compute_softscore.filter_answers`: every normalised `multiple_choice_answer` that
    answers at least `min_count` distinct questions of the annotation file(s) (train, or train and val for the
    published trainval one); labels by decreasing number of questions, ties alphabetical."""
    if type(min_count) is not int or min_count < 1:
        raise ValueError(f"`min_count` must be a positive int, got {min_count!r}.")
    files = [annotations_file] if isinstance(annotations_file, (str, Path)) else list(annotations_file)
    questions_of: dict[str, set[int]] = {}
    for path in files:
        for index, annotation in enumerate(_read_annotations(path, "annotations_file")):
            if "multiple_choice_answer" not in annotation:
                raise ValueError(
                    f"`annotations_file` {path}: annotation {index} (question {annotation.get('question_id')}) has no "
                    "`multiple_choice_answer`; the vocabulary needs the official, untrimmed annotation file."
                )
            answer = normalize_answer(annotation["multiple_choice_answer"])
            questions_of.setdefault(answer, set()).add(annotation["question_id"])
    kept = sorted(
        (answer for answer, ids in questions_of.items() if len(ids) >= min_count),
        key=lambda a: (-len(questions_of[a]), a),
    )
    if not kept:
        raise ValueError(
            f"no answer of {[str(f) for f in files]} answers {min_count} or more questions; lower `min_count`."
        )
    return {answer: label for label, answer in enumerate(kept)}


def _read_questions(path: Path, split: str) -> list[dict]:
    content = read_json(path, "questions_file", "a VQA v2 questions JSON file ({'questions': [...]})")
    if not isinstance(content, dict) or not isinstance(content.get("questions"), list):
        raise ValueError(f"`questions_file` {path}: expected a JSON object with a 'questions' list (VQA v2 layout).")
    subtype = content.get("data_subtype")
    if subtype is not None and subtype != DATA_SUBTYPE[split]:
        raise ValueError(
            f"`questions_file` {path} holds data_subtype {subtype!r}, but split {split!r} is {DATA_SUBTYPE[split]!r}."
        )
    questions, seen = content["questions"], UniqueIds(f"`questions_file` {path}", "question id")
    for index, question in enumerate(questions):
        missing = [key for key in ("image_id", "question", "question_id") if key not in question]
        if missing:
            raise ValueError(f"`questions_file` {path}: question {index} lacks {missing}.")
        seen.add(question["question_id"], f"questions[{index}]")
    if not questions:
        raise ValueError(f"`questions_file` {path} holds no question.")
    return questions


def _read_annotations(path: str | Path, argument: str) -> list[dict]:
    content = read_json(path, argument, "a VQA v2 annotations JSON file ({'annotations': [...]})")
    if not isinstance(content, dict) or not isinstance(content.get("annotations"), list):
        raise ValueError(f"`{argument}` {path}: expected a JSON object with an 'annotations' list (VQA v2 layout).")
    seen = UniqueIds(f"`{argument}` {path}", "question id")
    for index, annotation in enumerate(content["annotations"]):
        if not isinstance(annotation, dict) or "question_id" not in annotation or not isinstance(annotation.get("answers"), list):
            raise ValueError(f"`{argument}` {path}: annotation {index} lacks `question_id` or its `answers` list.")
        seen.add(annotation["question_id"], f"annotations[{index}]")
    return content["annotations"]


def _annotations_by_question(path: Path, questions: list[dict]) -> dict[int, dict]:
    by_question = {annotation["question_id"]: annotation for annotation in _read_annotations(path, "annotations_file")}
    unanswered = [q["question_id"] for q in questions if q["question_id"] not in by_question]
    if unanswered:
        raise ValueError(
            f"`annotations_file` {path} has no annotation for {len(unanswered)} of {len(questions)} questions "
            f"(e.g. question id {unanswered[0]}); are the questions and annotations of the same split?"
        )
    for question in questions:
        image_id = by_question[question["question_id"]].get("image_id")
        if image_id is not None and image_id != question["image_id"]:
            raise ValueError(
                f"question {question['question_id']}: image {question['image_id']} in the questions file but "
                f"{image_id} in `annotations_file` {path}."
            )
    extra = len(by_question) - len(questions)
    if extra > 0:
        logger.warning("%s: %d annotation(s) of questions not in the questions file are not used.", path, extra)
    return by_question


def _resolve(data_dir: Path | None, path: str | Path | None, default: str | None, argument: str) -> Path | None:
    """`path` (relative paths are read from `data_dir`), or `data_dir / default`."""
    if path is not None:
        return resolve_path(data_dir, path)
    if default is None:
        return None
    if data_dir is None:
        raise ValueError(f"`data_dir` is None: pass `{argument}` (the file {default!r}).")
    return data_dir / default


def build(
    data_dir: str | Path | None,
    split: str,
    *,
    questions_file: str | Path | None = None,
    annotations_file: str | Path | None = None,
    answer_vocab: str | Path | Mapping[str, int] | None = None,
    min_answer_count: int = 9,
    image_id_template: str | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """`build_dataset("vqa_v2", data_dir, split)`: one row per question (see the module docstring for the columns).

    Args:
        questions_file, annotations_file: replace the official file names (relative paths are read from `data_dir`).
            Test splits have no annotations; an annotation file for them is used when given.
        answer_vocab: ans2label JSON path or dict; None builds it from the train annotations
            (`data_dir/v2_mscoco_train2014_annotations.json`, or `annotations_file` for split "train") with
            `build_answer_vocab(..., min_count=min_answer_count)`.
        image_id_template: read by `store_image_ids` (`build_dataset` passes both the same options).
        on_missing_image: applies to the region-feature store alone (the files name images by id only).
    """
    check_split(split, SPLITS, "VQA v2")
    check_image_id_template(image_id_template, TSV_ID, id=1, split="val2014")
    data_dir = Path(data_dir) if data_dir is not None else None
    questions = _read_questions(_resolve(data_dir, questions_file, QUESTIONS_FILE[split], "questions_file"), split)
    annotations_path = _resolve(data_dir, annotations_file, ANNOTATIONS_FILE.get(split), "annotations_file")
    annotations = _annotations_by_question(annotations_path, questions) if annotations_path is not None else {}
    vocab = _answer_vocab(data_dir, split, answer_vocab, annotations_path, min_answer_count, needed=bool(annotations))
    rows = [
        _row(question, annotations.get(question["question_id"]), COCO_SPLIT[split], vocab) for question in questions
    ]
    if annotations:
        unlabelled = sum(not row["labels"] for row in rows)
        if unlabelled:
            logger.warning(
                "VQA v2 %s: %d of %d questions have none of their answers in the %d-answer vocabulary "
                "(empty `labels`; they score 0 whatever the model answers).",
                split, unlabelled, len(rows), len(vocab),
            )  # fmt: skip
    return datasets.Dataset.from_list(rows, features=VQA_FEATURES)


def _answer_vocab(data_dir, split, answer_vocab, annotations_path, min_count, needed: bool) -> dict[str, int]:
    if answer_vocab is not None:
        return read_answer_vocab(answer_vocab, data_dir=data_dir)
    if not needed:  # questions without annotations: nothing to label
        return {}
    train_annotations = (
        annotations_path if split == "train" else _resolve(data_dir, None, ANNOTATIONS_FILE["train"], "answer_vocab")
    )
    if not train_annotations.is_file():
        raise ValueError(
            f"`answer_vocab` is None, so the vocabulary is built from the train annotations, but {train_annotations} "
            "is not a file; pass `answer_vocab=` (an ans2label JSON, e.g. LXMERT's trainval_ans2label.json)."
        )
    return build_answer_vocab(train_annotations, min_count=min_count)


def _row(question: dict, annotation: dict | None, coco_split: str, vocab: Mapping[str, int]) -> dict:
    annotation = annotation or {}
    answers = [normalize_answer(answer["answer"]) for answer in annotation.get("answers", [])]
    labels, scores = soft_targets(answers, vocab)
    return {
        "question_id": question["question_id"],
        "image_id": str(question["image_id"]),
        "coco_split": coco_split,
        "image_size": None,
        "question": question["question"],
        "question_type": annotation.get("question_type"),
        "answer_type": annotation.get("answer_type"),
        "multiple_choice_answer": annotation.get("multiple_choice_answer"),
        "answers": answers,
        "labels": labels,
        "scores": scores,
    }


def store_image_ids(image_id_template: str | None = None, **_) -> tuple[Callable[[dict], list[str]], tuple[str, ...]]:
    """(candidates, id_columns): a row's store ids, `image_id_template.format(id=<int COCO id>, split=<coco_split>)`
    alone, or the plain id ("393225") then LXMERT's TSV id ("COCO_val2014_000000393225")."""
    check_image_id_template(image_id_template, TSV_ID, id=1, split="val2014")

    def candidates(row: dict) -> list[str]:
        fields = {"id": int(row["image_id"]), "split": row["coco_split"]}
        if image_id_template is not None:
            return [image_id_template.format(**fields)]
        return [row["image_id"], TSV_ID.format(**fields)]

    return candidates, STORE_ID_COLUMNS
