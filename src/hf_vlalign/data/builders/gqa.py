"""GQA (Hudson & Manning 2019): question files as published -> one row per question, with its object pointers.

Pointers: `annotations[<text>]` maps whitespace-token positions ("i", or "i:j" an exclusive slice, punctuation attached
to its token) to object ids, as checked on published records (question 20240871: "Yes," is one token; question
08801129: "2:4" is "brown animal"). A pointer's character span trims the punctuation at its edges.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Mapping
from pathlib import Path

import datasets

from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    UniqueIds,
    check_split,
    grounding_features,
    missing_image_error,
    read_json,
    report_missing_images,
    resolve_path,
    xywh_to_xyxy,
)
from .vqa_v2 import read_answer_vocab

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "testdev", "test", "challenge", "submission")
SUBSETS = ("balanced", "all")
# text column -> its key in a question record and in the record's `annotations`
TEXT_FIELDS = {"question": "question", "answer": "answer", "full_answer": "fullAnswer"}
_TOKEN = re.compile(r"\S+")
_POINTER_KEY = re.compile(r"(\d+)(?::(\d+))?")

BOX = datasets.List(datasets.Value("float32"), length=4)


def gqa_features(with_label: bool) -> datasets.Features:
    """The columns of a GQA dataset (`label` only when an answer vocabulary is given)."""
    features = {
        "question_id": datasets.Value("string"),
        "image_id": datasets.Value("string"),
        "image_size": IMAGE_SIZE,
        **{text: datasets.Value("string") for text in TEXT_FIELDS},
    }
    if with_label:
        features["label"] = datasets.Value("int32")
    for text in TEXT_FIELDS:
        features.update(grounding_features(text))
        features[f"{text}_pointer_object_ids"] = datasets.List(datasets.List(datasets.Value("string")))
    features.update(
        {
            "object_ids": datasets.List(datasets.Value("string")),
            "object_names": datasets.List(datasets.Value("string")),
            "object_attributes": datasets.List(datasets.List(datasets.Value("string"))),
            "object_boxes": datasets.List(BOX),
        }
    )
    return datasets.Features(features)


def parse_pointer_key(key: str, num_tokens: int, where: str) -> tuple[int, int]:
    """A GQA annotation key ("i" or "i:j") -> the token slice [i, j); a ValueError naming `where` when invalid."""
    match = _POINTER_KEY.fullmatch(str(key).strip())
    if match is None:
        raise ValueError(f"{where}: pointer key {key!r} is neither a token index 'i' nor a range 'i:j'.")
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) is not None else start + 1
    if not 0 <= start < end <= num_tokens:
        raise ValueError(f"{where}: pointer {key!r} is outside the text's {num_tokens} whitespace tokens.")
    return start, end


def pointer_char_span(text: str, tokens: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """Character span of tokens [start, end) of `text`, edge punctuation trimmed (kept when it is all punctuation)."""
    first, last = tokens[start][0], tokens[end - 1][1]
    trimmed_first, trimmed_last = first, last
    while trimmed_first < trimmed_last and text[trimmed_first] in string.punctuation:
        trimmed_first += 1
    while trimmed_last > trimmed_first and text[trimmed_last - 1] in string.punctuation:
        trimmed_last -= 1
    return (trimmed_first, trimmed_last) if trimmed_first < trimmed_last else (first, last)


def text_pointers(
    text: str | None, pointers: Mapping[str, str] | None, where: str
) -> list[tuple[tuple[int, int], str]]:
    """[(char span, object id)] of a text's pointers, in token order."""
    if not pointers:
        return []
    if text is None:
        raise ValueError(f"{where}: has pointers {dict(pointers)} but no text.")
    tokens = [match.span() for match in _TOKEN.finditer(text)]
    slices = sorted((parse_pointer_key(key, len(tokens), where), str(object_id)) for key, object_id in pointers.items())
    return [(pointer_char_span(text, tokens, start, end), object_id) for (start, end), object_id in slices]


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def question_files(data_dir: Path | None, split: str, subset: str, questions_file: str | Path | None) -> list[Path]:
    """The question file(s) of `split`: `questions_file` (a file or a folder of shards) or the official names."""
    if questions_file is not None:
        candidates = [resolve_path(data_dir, questions_file)]
    elif data_dir is None:
        raise ValueError("`data_dir` is None: pass `questions_file` (a GQA questions JSON file or folder of shards).")
    else:
        candidates = [data_dir / f"{split}_{subset}_questions.json", data_dir / f"{split}_{subset}_questions"]
    for path in candidates:
        if path.is_file():
            return [path]
        if path.is_dir():
            shards = sorted(path.glob("*questions*.json"), key=_natural_key)
            if not shards:
                raise ValueError(f"`questions_file` folder {path} holds no `*questions*.json` shard.")
            return shards
    names = [str(path) for path in candidates]
    raise ValueError(f"no GQA questions for split {split!r} (subset {subset!r}): none of {names} is a file or folder.")


def read_questions(paths: list[Path]) -> dict[str, dict]:
    """question id -> record, over all shards; a ValueError on a malformed record or a repeated id."""
    questions: dict[str, dict] = {}
    shards = UniqueIds("`questions_file`", "question id")
    for path in paths:
        content = read_json(path, "questions_file", "a GQA questions JSON file, question id -> record", dict)
        for question_id, record in content.items():
            shards.add(question_id, str(path))
            missing = [key for key in ("imageId", "question") if not isinstance(record, dict) or key not in record]
            if missing:
                raise ValueError(f"`questions_file` {path}: question {question_id!r} lacks {missing}.")
            questions[question_id] = record
    if not questions:
        raise ValueError(f"`questions_file` {[str(p) for p in paths]} holds no question.")
    return questions


def read_scene_graphs(path: Path) -> dict[str, dict]:
    """image id -> scene graph, each checked for width, height and objects with x, y, w, h."""
    graphs = read_json(path, "scene_graphs", "a GQA scene graphs JSON file, image id -> {width, height, objects}", dict)
    for image_id, graph in graphs.items():
        if not isinstance(graph, dict) or not {"width", "height", "objects"} <= graph.keys():
            raise ValueError(f"`scene_graphs` {path}: image {image_id!r} lacks width, height or objects.")
        for side in ("width", "height"):
            if type(graph[side]) is not int or graph[side] <= 0:
                raise ValueError(
                    f"`scene_graphs` {path}: image {image_id!r} must have a positive integer {side}, got {graph[side]!r}."
                )
        if not isinstance(graph["objects"], dict):
            raise ValueError(f"`scene_graphs` {path}: image {image_id!r}: objects must be a JSON object, got {graph['objects']!r}.")
        for object_id, obj in graph["objects"].items():
            if not {"name", "x", "y", "w", "h"} <= obj.keys():
                raise ValueError(
                    f"`scene_graphs` {path}: object {object_id!r} of image {image_id!r} lacks name, x, y, w or h."
                )
    return graphs


def build(
    data_dir: str | Path | None,
    split: str,
    *,
    subset: str = "balanced",
    questions_file: str | Path | None = None,
    scene_graphs: str | Path | None = None,
    answer_vocab: str | Path | Mapping[str, int] | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """`build_dataset("gqa", data_dir, split)`: one row per question (`gqa_features`).

    Args:
        subset: "balanced" or "all" (which official question file to read; ignored with `questions_file`).
        questions_file: a questions JSON file or a folder of shards replacing the official name.
        scene_graphs: `{split}_sceneGraphs.json`: the pointers' boxes, the rows' image size and objects.
        answer_vocab: ans2label JSON path or dict; adds the `label` column.
        on_missing_image: for the questions whose image `scene_graphs` does not list.
    """
    check_split(split, SPLITS, "GQA")
    if subset not in SUBSETS:
        raise ValueError(f"`subset` of GQA must be one of {list(SUBSETS)}, got {subset!r}.")
    data_dir = Path(data_dir) if data_dir is not None else None
    questions = read_questions(question_files(data_dir, split, subset, questions_file))
    graphs = None
    if scene_graphs is not None:
        graphs_path = resolve_path(data_dir, scene_graphs)
        graphs = read_scene_graphs(graphs_path)
        questions = _questions_with_graphs(questions, graphs, graphs_path, split, on_missing_image)
    vocab = read_answer_vocab(answer_vocab, data_dir=data_dir) if answer_vocab is not None else None
    rows = [_row(question_id, record, graphs, vocab) for question_id, record in questions.items()]
    unanswered = sum(row["answer"] is None for row in rows)
    outside = sum(vocab is not None and row["label"] == -1 and row["answer"] is not None for row in rows)
    if outside:
        logger.warning(
            "GQA %s: %d of %d answers are not in the %d-answer vocabulary; their `label` is -1.",
            split, outside, len(rows) - unanswered, len(vocab),
        )  # fmt: skip
    if vocab is not None and unanswered:
        logger.info(
            "GQA %s: %d of %d questions have no published answer; their `label` is -1.", split, unanswered, len(rows)
        )
    return datasets.Dataset.from_list(rows, features=gqa_features(with_label=vocab is not None))


def _questions_with_graphs(
    questions: dict[str, dict], graphs: dict[str, dict], path: Path, split: str, on_missing_image: str
) -> dict[str, dict]:
    """The questions whose image has a scene graph; the others raise or are counted, following `on_missing_image`."""
    kept, where = {}, f"the `scene_graphs` file {path}"
    for question_id, record in questions.items():
        image_id = str(record["imageId"])
        if image_id in graphs:
            kept[question_id] = record
        elif on_missing_image == "raise":
            raise missing_image_error(f"GQA {split}", f"question {question_id!r}", image_id, where, "questions")
    report_missing_images(f"GQA {split}", len(questions) - len(kept), len(questions), "questions", where)
    if not kept:
        raise ValueError(f"`scene_graphs` {path}: none of the {len(questions)} questions of {split!r} has its image.")
    return kept


def _row(question_id: str, record: dict, graphs: dict | None, vocab: Mapping[str, int] | None) -> dict:
    image_id = str(record["imageId"])
    graph = graphs[image_id] if graphs is not None else None  # questions without a graph were left out
    row = {
        "question_id": question_id,
        "image_id": image_id,
        "image_size": [int(graph["height"]), int(graph["width"])] if graph is not None else None,
        **{text: record.get(key) for text, key in TEXT_FIELDS.items()},
    }
    if vocab is not None:
        row["label"] = vocab.get(row["answer"], -1) if row["answer"] is not None else -1
    annotations = record.get("annotations") or {}
    for text, key in TEXT_FIELDS.items():
        pointers = text_pointers(row[text], annotations.get(key), f"question {question_id!r}, annotations[{key!r}]")
        row[f"{text}_phrase_spans"] = [list(span) for span, _ in pointers]
        row[f"{text}_pointer_object_ids"] = [[object_id] for _, object_id in pointers]
        row[f"{text}_phrase_boxes"] = [_pointer_boxes(question_id, object_id, graph) for _, object_id in pointers]
    row.update(_object_columns(graph))
    return row


def _pointer_boxes(question_id: str, object_id: str, graph: dict | None) -> list[list[float]]:
    if graph is None:
        return []
    obj = graph["objects"].get(object_id)
    if obj is None:
        raise ValueError(
            f"question {question_id!r} points to object {object_id!r}, which the scene graph of its image does not "
            f"list ({len(graph['objects'])} objects); are the questions and scene graphs of the same split and release?"
        )
    return [_box(obj)]


def _box(obj: dict) -> list[float]:
    return xywh_to_xyxy([obj["x"], obj["y"], obj["w"], obj["h"]])


def _object_columns(graph: dict | None) -> dict[str, list]:
    objects = graph["objects"] if graph is not None else {}
    return {
        "object_ids": list(objects),
        "object_names": [obj["name"] for obj in objects.values()],
        "object_attributes": [list(obj.get("attributes") or []) for obj in objects.values()],
        "object_boxes": [_box(obj) for obj in objects.values()],
    }
