"""LXMERT's pre-training data (Tan & Bansal 2019), as its pre-training reads it: one row per sentence of each image.

`data_dir` holds `FILES` (`<name>.json`), lists of {"img_id", "sentf": {source: [sentence]}, "labelf": {source:
[{answer: score}]}}. Answers go through LXMERT's `AnswerTable.convert_ans`. Word -> object pointers (Kervadec et al.
2020, sec. 5) where the annotations give them: "vg" sentences that are one of their image's region descriptions, "gqa"
questions found in GQA's files; other sentences have no pointer.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import datasets

from . import gqa
from ._common import DEFAULT_ON_MISSING_IMAGE, IMAGE_SIZE, UniqueIds, grounding_features, read_json, xywh_to_xyxy
from .visual_genome import clean_description
from .vqa_v2 import read_answer_vocab

logger = logging.getLogger(__name__)

FILES = ("mscoco_train", "mscoco_nominival", "mscoco_minival", "vgnococo")
VALIDATION_FILE = "mscoco_minival"  # LXMERT's --valid
CAPTION_SOURCES = ("mscoco", "vg")
QUESTION_SOURCES = ("vqa", "gqa", "visual7w")
SOURCES = CAPTION_SOURCES + QUESTION_SOURCES
_COCO_ID = re.compile(r"COCO_(?:train|val|test)\d{4}_0*(\d+)")

# LXMERT's `AnswerTable.ANS_CONVERT` (src/pretrain/qa_answer_table.py)
ANSWER_CONVERSIONS = {
    "a man": "man", "the man": "man", "a woman": "woman", "the woman": "woman", "one": "1", "two": "2",
    "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
    "grey": "gray",
}  # fmt: skip

LXMERT_FEATURES = datasets.Features(
    {
        "sentence_id": datasets.Value("string"),
        "image_id": datasets.Value("string"),
        "image_size": IMAGE_SIZE,
        "source": datasets.Value("string"),
        "sentence": datasets.Value("string"),
        "answer": datasets.Value("string"),  # the highest-scored answer (in `answer_vocab` when given)
        "label": datasets.Value("int32"),  # its id in `answer_vocab`; -1 for captions and unanswered questions
        "answer_ids": datasets.List(datasets.Value("int32")),
        "answer_scores": datasets.List(datasets.Value("float32")),
        **grounding_features("sentence"),
    }
)


def read_answer_table(answer_vocab: str | Path | Mapping[str, int]) -> dict[str, int]:
    """The {answer: id} of an ans2label JSON (or dict), or of LXMERT's `all_ans.json` (a list of {"ans": answer,
    "dsets": [...]}: ids in list order, as LXMERT's `AnswerTable`)."""
    if isinstance(answer_vocab, Mapping):
        return read_answer_vocab(answer_vocab)
    content = read_json(answer_vocab, "answer_vocab", "an ans2label JSON or LXMERT's all_ans.json")
    if isinstance(content, list):
        if not all(isinstance(entry, dict) and isinstance(entry.get("ans"), str) for entry in content):
            raise ValueError(
                f"`answer_vocab` {answer_vocab}: a list must be LXMERT's all_ans.json, records with an `ans` string."
            )
        table = {entry["ans"]: index for index, entry in enumerate(content)}
        if len(table) != len(content):
            raise ValueError(f"`answer_vocab` {answer_vocab}: all_ans.json lists an answer twice.")
        return table
    return read_answer_vocab(content)


def convert_answer(answer: str) -> str:
    """LXMERT's `AnswerTable.convert_ans`: lower case, one trailing period and a leading "a " / "an " / "the "
    removed, then `ANSWER_CONVERSIONS`."""
    if not answer:
        return ""
    answer = answer.lower()
    if answer[-1] == ".":
        answer = answer[:-1].strip()
    for article in ("a ", "an ", "the "):
        if answer.startswith(article):
            answer = answer[len(article) :].strip()
    return ANSWER_CONVERSIONS.get(answer, answer)


def split_files(split: str) -> list[str]:
    """The file names of `split`: one of `FILES`, several joined by commas, or "val" (`VALIDATION_FILE`)."""
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"`split` of LXMERT pre-training must name files of {list(FILES)}, got {split!r}.")
    names = [VALIDATION_FILE if name.strip() == "val" else name.strip() for name in split.split(",")]
    unknown = [name for name in names if name not in FILES]
    if unknown:
        raise ValueError(
            f"`split` of LXMERT pre-training must be one of {list(FILES)} (or several joined by commas, or 'val'), "
            f"got {unknown[0]!r} in {split!r}."
        )
    return list(dict.fromkeys(names))


def check_record(record: object, where: str) -> None:
    """A ValueError naming `where` unless `record` is {img_id: str, sentf: {source: [str]}, labelf: {source:
    [{answer: score}]}} with one answer dict per sentence of each labelled source."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object with img_id, sentf and labelf, got {type(record).__name__}.")
    missing = [key for key in ("img_id", "sentf", "labelf") if key not in record]
    if missing:
        raise ValueError(f"{where}: the record lacks {missing} (LXMERT records have img_id, sentf and labelf).")
    if not isinstance(record["img_id"], str) or not record["img_id"]:
        raise ValueError(f"{where}: `img_id` must be a non-empty string (the feature TSV's id), got {record['img_id']!r}.")
    sentf, labelf = record["sentf"], record["labelf"]
    if not isinstance(sentf, dict) or not isinstance(labelf, dict):
        raise ValueError(f"{where}: `sentf` and `labelf` must be JSON objects source -> list, got {sentf!r}, {labelf!r}.")
    for source, sentences in sentf.items():
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise ValueError(f"{where}: `sentf[{source!r}]` must be a list of sentences (strings), got {sentences!r}.")
    for source, labels in labelf.items():
        if source not in sentf:
            raise ValueError(f"{where}: `labelf[{source!r}]` has no sentences in `sentf` (sources {sorted(sentf)}).")
        if not isinstance(labels, list) or len(labels) != len(sentf[source]):
            raise ValueError(
                f"{where}: `labelf[{source!r}]` must be a list of one answer dict per sentence "
                f"({len(sentf[source])}), got {labels!r}."
            )
        for index, label in enumerate(labels):
            if not isinstance(label, dict) or not all(
                isinstance(answer, str) and type(score) in (int, float) and score >= 0 for answer, score in label.items()
            ):
                raise ValueError(
                    f"{where}: `labelf[{source!r}][{index}]` must map answers to non-negative scores, got {label!r}."
                )


def read_records(data_dir: Path, names: list[str]) -> list[tuple[str, dict]]:
    """(file name, record) of every record of the files, each checked."""
    records, image_ids = [], UniqueIds("`data_dir`", "img_id")
    for name in names:
        path = data_dir / f"{name}.json"
        content = read_json(path, "data_dir", f"LXMERT's pre-training file {name}.json of image records", list)
        for index, record in enumerate(content):
            check_record(record, f"`data_dir` {path}, record #{index}")
            image_ids.add(record["img_id"], f"{path}, record #{index}")
            records.append((name, record))
    return records


def _sentence_key(text: str) -> str:
    return clean_description(text).lower()


def region_description_boxes(visual_genome_dir: str | Path) -> tuple[dict[tuple[str, str], list[float]], dict[str, str]]:
    """((VG image id, cleaned lower-cased description) -> the region's x1, y1, x2, y2 box (the first region with that
    description), COCO id -> VG image id) from Visual Genome's `region_descriptions.json` and `image_data.json`."""
    folder = Path(visual_genome_dir)
    entries = read_json(folder / "region_descriptions.json", "visual_genome_dir", "Visual Genome region_descriptions.json", list)
    images = read_json(folder / "image_data.json", "visual_genome_dir", "Visual Genome image_data.json", list)
    boxes = {}
    for entry in entries:
        image_id = entry.get("id", entry.get("image_id")) if isinstance(entry, dict) else None
        if image_id is None or not isinstance(entry.get("regions"), list):
            raise ValueError(f"`visual_genome_dir` {folder}/region_descriptions.json: an entry lacks id or regions.")
        for region in entry["regions"]:
            missing = [key for key in ("phrase", "x", "y", "width", "height") if key not in region]
            if missing:
                raise ValueError(
                    f"`visual_genome_dir` {folder}/region_descriptions.json: a region of image {image_id} lacks {missing}."
                )
            key = (str(image_id), _sentence_key(region["phrase"]))
            boxes.setdefault(key, xywh_to_xyxy([region["x"], region["y"], region["width"], region["height"]]))
    coco_to_vg = {
        str(image["coco_id"]): str(image["image_id"]) for image in images if image.get("coco_id") is not None
    }
    return boxes, coco_to_vg


def visual_genome_id(img_id: str, coco_to_vg: Mapping[str, str]) -> str | None:
    """The Visual Genome id of an LXMERT `img_id`: the id itself for VG images, through `coco_id` for COCO ones."""
    if img_id.isdigit():
        return img_id
    match = _COCO_ID.fullmatch(img_id)
    return coco_to_vg.get(str(int(match.group(1)))) if match else None


def gqa_question_pointers(
    questions: str | Path | Sequence[str | Path], scene_graphs: str | Path | Sequence[str | Path]
) -> dict[tuple[str, str], tuple[list[list[int]], list[list[list[float]]]]]:
    """(image id, question text) -> (pointer spans, pointer boxes) of every GQA question with pointers, from question
    files (each a file or folder of shards; e.g. train and val) and the scene graphs of their images (e.g. train and
    val: GQA's splits are by image, and LXMERT's files mix the images of both)."""
    paths = [questions] if isinstance(questions, (str, Path)) else list(questions)
    records = {}
    for path in paths:
        records.update(gqa.read_questions(gqa.question_files(None, "train", "balanced", path)))
    graphs = {}
    for path in [scene_graphs] if isinstance(scene_graphs, (str, Path)) else list(scene_graphs):
        graphs.update(gqa.read_scene_graphs(Path(path)))
    pointers = {}
    for question_id, record in records.items():
        graph = graphs.get(str(record["imageId"]))
        annotations = (record.get("annotations") or {}).get("question")
        if graph is None or not annotations:
            continue
        found = gqa.text_pointers(record["question"], annotations, f"GQA question {question_id!r}")
        spans = [list(span) for span, _ in found]
        boxes = [gqa._pointer_boxes(question_id, object_id, graph) for _, object_id in found]
        pointers[(str(record["imageId"]), record["question"].strip())] = (spans, boxes)
    return pointers


def build(
    data_dir: str | Path,
    split: str,
    *,
    answer_vocab: str | Path | Mapping[str, int] | None = None,
    visual_genome_dir: str | Path | None = None,
    gqa_questions: str | Path | Sequence[str | Path] | None = None,
    gqa_scene_graphs: str | Path | Sequence[str | Path] | None = None,
    sources: tuple[str, ...] | list[str] | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """`build_dataset("lxmert_pretraining", data_dir, split)`: one row per sentence (see the module docstring).

    Args:
        split: a file of `FILES`, several joined by commas, or "val" (`mscoco_minival`).
        answer_vocab: ans2label JSON path or dict (LXMERT's VQA `trainval_ans2label.json`), or LXMERT's
            `all_ans.json`; without it every `label` is -1 and no row has `answer_ids`.
        visual_genome_dir: Visual Genome's folder: the "vg" sentences' pointers to their regions.
        gqa_questions, gqa_scene_graphs: GQA question files (each a file or a folder of shards) and scene graphs, one
            path or several (e.g. train and val): the "gqa" questions' pointers (both or neither).
        sources: the text sources kept (default: all of `SOURCES` found); LXMERT's `--qaSets` restricts the QA ones.
        on_missing_image: applies to the region-feature store alone (the records name their images themselves).
    """
    if data_dir is None:
        raise ValueError("`data_dir` must be the folder holding LXMERT's pre-training json files (data/lxmert), got None.")
    if (gqa_questions is None) != (gqa_scene_graphs is None):
        raise ValueError(
            "`gqa_questions` and `gqa_scene_graphs` go together (the pointers and their boxes), got "
            f"gqa_questions={gqa_questions!r}, gqa_scene_graphs={gqa_scene_graphs!r}."
        )
    if sources is not None:
        unknown = [source for source in sources if source not in SOURCES]
        if unknown or not sources:
            raise ValueError(f"`sources` must be a non-empty subset of {list(SOURCES)}, got {list(sources)!r}.")
    data_dir = Path(data_dir)
    records = read_records(data_dir, split_files(split))
    vocab = None
    if answer_vocab is not None:
        vocab = read_answer_table(answer_vocab if isinstance(answer_vocab, Mapping) else _resolve(data_dir, answer_vocab))
    region_boxes, coco_to_vg = (
        region_description_boxes(_resolve(data_dir, visual_genome_dir)) if visual_genome_dir is not None else ({}, {})
    )
    question_pointers = (
        gqa_question_pointers(_resolved(data_dir, gqa_questions), _resolved(data_dir, gqa_scene_graphs))
        if gqa_questions is not None
        else {}
    )
    rows, counts = [], Counter()
    for _, record in records:
        img_id = record["img_id"]
        for source, sentences in record["sentf"].items():
            if sources is not None and source not in sources:
                continue
            labels = record["labelf"].get(source)
            for index, sentence in enumerate(sentences):
                spans, boxes = _pointers(source, img_id, sentence, region_boxes, coco_to_vg, question_pointers)
                answers = _answers(labels[index] if labels is not None else None, vocab)
                answer = max(answers, key=answers.get) if answers else None  # the first of the highest scores
                label = vocab[answer] if answer is not None and vocab is not None else -1
                counts[(source, "rows")] += 1
                counts[(source, "pointed")] += bool(spans)
                counts[(source, "unanswered")] += labels is not None and label < 0
                rows.append(
                    {
                        "sentence_id": f"{img_id}_{source}_{index:03d}",
                        "image_id": img_id,
                        "image_size": None,
                        "source": source,
                        "sentence": sentence,
                        "answer": answer,
                        "label": label,
                        "answer_ids": [vocab[a] for a in answers] if vocab is not None else [],
                        "answer_scores": list(answers.values()) if vocab is not None else [],
                        "sentence_phrase_spans": spans,
                        "sentence_phrase_boxes": boxes,
                    }
                )
    if not rows:
        raise ValueError(f"`data_dir` {data_dir}: split {split!r} holds no sentence (sources {sources}).")
    _report(counts, split, vocab)
    return datasets.Dataset.from_list(rows, features=LXMERT_FEATURES)


def _resolved(data_dir: Path, paths: str | Path | Sequence[str | Path]) -> list[Path]:
    return [_resolve(data_dir, path) for path in ([paths] if isinstance(paths, (str, Path)) else paths)]


def _resolve(data_dir: Path, path: str | Path) -> Path:
    path = Path(path)
    return data_dir / path if not path.is_absolute() and not path.exists() else path


def _pointers(source, img_id, sentence, region_boxes, coco_to_vg, question_pointers) -> tuple[list, list]:
    if source == "vg" and region_boxes:
        vg_id = visual_genome_id(img_id, coco_to_vg)
        box = region_boxes.get((vg_id, _sentence_key(sentence))) if vg_id is not None else None
        if box is not None:
            end = len(sentence.rstrip().rstrip(".").rstrip())  # the description, its trailing periods left out
            return [[0, end]], [[box]]
    if source == "gqa" and question_pointers:
        found = question_pointers.get((img_id, sentence.strip()))
        if found is not None:
            return found
    return [], []


def _answers(label: dict | None, vocab: Mapping[str, int] | None) -> dict[str, float]:
    """{answer after `convert_answer`: score} of one question, in file order, those outside `vocab` dropped (LXMERT
    renames an answer to its converted form, so a later answer converted to the same form keeps the later score)."""
    scores = {}
    for answer, score in (label or {}).items():
        answer = convert_answer(answer)
        if vocab is None or answer in vocab:
            scores[answer] = float(score)
    return scores


def _report(counts: Counter, split: str, vocab) -> None:
    for source in sorted({source for source, _ in counts}):
        logger.info(
            "LXMERT %s, %s: %d sentences, %d with word->object pointers.",
            split, source, counts[(source, "rows")], counts[(source, "pointed")],
        )  # fmt: skip
        if vocab is not None and counts[(source, "unanswered")]:
            logger.warning(
                "LXMERT %s, %s: %d of %d questions have no answer in the %d-answer vocabulary; their `label` is -1.",
                split, source, counts[(source, "unanswered")], counts[(source, "rows")], len(vocab),
            )  # fmt: skip
