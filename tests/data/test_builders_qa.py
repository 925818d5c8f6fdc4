"""GQA, Visual Genome and VQA v2 builders on the real published samples in ../shared/data.

Counts are checked against counts taken here straight from the JSON files, not through the builders. Files the
samples lack (GQA scene graphs, full VQA v2 annotations) are written in the published layouts for the real records.
"""

from __future__ import annotations

import json
import logging
import shutil
import string
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from shared_samples import real_sample as _real

from hf_vlalign.data.builders import build_dataset, gqa, visual_genome, vqa_v2
from hf_vlalign.data.feature_store import RegionFeatureStore


def _read(path: Path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _write(path: Path, content) -> Path:
    path.write_text(json.dumps(content))
    return path


def _store(records: dict[str, tuple[list[int], list[list[float]]]], directory: Path) -> RegionFeatureStore:
    """A tiny real store: image id -> ((height, width), boxes), with random 8-d features."""
    rng = np.random.default_rng(0)
    return RegionFeatureStore.write(
        (
            {"image_id": image_id, "image_size": size, "boxes": np.array(boxes, dtype=np.float32),
             "features": rng.random((len(boxes), 8), dtype=np.float32)}
            for image_id, (size, boxes) in records.items()
        ),
        directory,
    )  # fmt: skip


# ================================================================================================================
# GQA
# ================================================================================================================

GQA_FIELDS = {"question": "question", "answer": "answer", "full_answer": "fullAnswer"}


@pytest.fixture(scope="module")
def gqa_dir() -> Path:
    return _real("gqa", "allennlp_fixture")


@pytest.fixture(scope="module")
def gqa_vocab_file() -> Path:
    return _real("gqa", "trainval_ans2label.json")


def _gqa_records(gqa_dir: Path) -> dict[str, dict]:
    records = {}
    for shard in sorted((gqa_dir / "question_dir").glob("*.json")):
        records.update(_read(shard))
    return records


def _token_slice(key: str) -> tuple[int, int]:
    start, _, end = key.partition(":")
    return int(start), int(end) if end else int(start) + 1


def _scene_graphs(tmp_path: Path, drop: str | None = None) -> Path:
    """val_sceneGraphs.json in the published layout for the two images of the real question records."""
    graphs = {
        "n578564": {
            "width": 500, "height": 375, "location": "classroom", "weather": "none",
            "objects": {
                "0": {"name": "chalkboard", "x": 40, "y": 150, "w": 300, "h": 160, "attributes": ["black"],
                      "relations": [{"name": "below", "object": "12"}]},
                "12": {"name": "picture", "x": 120, "y": 20, "w": 150, "h": 100, "attributes": ["framed", "small"],
                       "relations": [{"name": "hanging above", "object": "0"}]},
                "3": {"name": "wall", "x": 0, "y": 0, "w": 500, "h": 375, "attributes": [], "relations": []},
            },
        },
        "n166008": {
            "width": 640, "height": 480,
            "objects": {
                "11": {"name": "table", "x": 100, "y": 250, "w": 400, "h": 200, "attributes": ["wooden", "round"],
                       "relations": [{"name": "below", "object": "4"}]},
                "4": {"name": "water", "x": 230, "y": 180, "w": 60, "h": 90, "attributes": ["clear"],
                      "relations": [{"name": "above", "object": "11"}]},
            },
        },
    }  # fmt: skip
    if drop is not None:
        for graph in graphs.values():
            graph["objects"].pop(drop, None)
    return _write(tmp_path / "val_sceneGraphs.json", graphs)


def test_gqa_real_questions_counts_pointers_and_labels(gqa_dir, gqa_vocab_file):
    dataset = gqa.build(gqa_dir, "val", questions_file="question_dir", answer_vocab=gqa_vocab_file)
    records, vocab = _gqa_records(gqa_dir), _read(gqa_vocab_file)

    assert len(dataset) == len(records) == 2
    assert sorted(dataset["question_id"]) == sorted(records)
    assert dataset.features["label"].dtype == "int32"
    for row in dataset:
        record = records[row["question_id"]]
        assert (row["image_id"], row["question"], row["answer"], row["full_answer"]) == (
            record["imageId"],
            record["question"],
            record["answer"],
            record["fullAnswer"],
        )
        assert row["label"] == vocab[record["answer"]]
        assert row["image_size"] is None and row["object_ids"] == []  # no scene graphs given
        for column, key in GQA_FIELDS.items():
            pointers = record["annotations"][key]
            assert len(row[f"{column}_phrase_spans"]) == len(pointers)
            assert row[f"{column}_phrase_boxes"] == [[] for _ in pointers]
            # each pointer's span is the whitespace token(s) it indexes, edge punctuation trimmed
            tokens = record[key].split()
            expected = sorted(
                (_token_slice(k), " ".join(tokens[slice(*_token_slice(k))]).strip(string.punctuation), v)
                for k, v in pointers.items()
            )
            got = [
                (row[column][s:e], ids)
                for (s, e), ids in zip(row[f"{column}_phrase_spans"], row[f"{column}_pointer_object_ids"])
            ]
            assert got == [(text, [object_id]) for _, text, object_id in expected]
    total_pointers = sum(len(r["annotations"][key]) for r in records.values() for key in GQA_FIELDS.values())
    assert (
        total_pointers
        == sum(len(dataset[f"{c}_phrase_spans"][i]) for c in GQA_FIELDS for i in range(len(dataset)))
        == 6
    )


def test_gqa_spot_checks_on_a_real_record(gqa_dir):
    row = next(r for r in gqa.build(gqa_dir, "val", questions_file="question_dir") if r["question_id"] == "20240871")
    assert row["question"] == "Does the table below the water look wooden and round?"
    spans = [row["question"][s:e] for s, e in row["question_phrase_spans"]]
    assert spans == ["table", "water"] and row["question_pointer_object_ids"] == [["11"], ["4"]]
    # "Yes," is token 0, so token 2 is "table" (a punctuation-splitting tokenizer would give "the")
    assert [row["full_answer"][s:e] for s, e in row["full_answer_phrase_spans"]] == ["table"]
    assert "label" not in row  # no answer vocabulary given


def test_gqa_vocab_size_and_out_of_vocab_warning(gqa_dir, gqa_vocab_file, caplog):
    assert len(vqa_v2.read_answer_vocab(gqa_vocab_file)) == 1842
    with caplog.at_level(logging.WARNING, logger="hf_vlalign.data.builders.gqa"):
        dataset = gqa.build(gqa_dir, "val", questions_file="question_dir", answer_vocab={"picture": 0})
    assert dict(zip(dataset["answer"], dataset["label"])) == {"picture": 0, "yes": -1}
    assert "1 of 2 answers are not in the 1-answer vocabulary" in caplog.text


def test_gqa_scene_graphs_give_boxes_sizes_and_objects(gqa_dir, tmp_path):
    dataset = gqa.build(gqa_dir, "val", questions_file="question_dir", scene_graphs=_scene_graphs(tmp_path))
    row = next(r for r in dataset if r["question_id"] == "202218649")
    assert row["image_size"] == [375, 500]
    # fullAnswer "The picture is hanging above the chalkboard." points "1" -> 12 and "6" -> 0
    assert [row["full_answer"][s:e] for s, e in row["full_answer_phrase_spans"]] == ["picture", "chalkboard"]
    assert row["full_answer_phrase_boxes"] == [[[120.0, 20.0, 270.0, 120.0]], [[40.0, 150.0, 340.0, 310.0]]]
    assert row["answer_phrase_boxes"] == [[[120.0, 20.0, 270.0, 120.0]]] and row["question_phrase_boxes"] == []
    assert row["object_ids"] == ["0", "12", "3"]
    assert row["object_names"] == ["chalkboard", "picture", "wall"]
    assert row["object_attributes"] == [["black"], ["framed", "small"], []]
    assert row["object_boxes"][2] == [0.0, 0.0, 500.0, 375.0]


def test_gqa_bad_input_is_a_clear_value_error(gqa_dir, tmp_path):
    with pytest.raises(ValueError, match=r"question '20240871' points to object '4'"):
        gqa.build(gqa_dir, "val", questions_file="question_dir", scene_graphs=_scene_graphs(tmp_path, drop="4"))
    with pytest.raises(ValueError, match=r"`split` of GQA must be one of"):
        gqa.build(gqa_dir, "validation")
    with pytest.raises(ValueError, match=r"no GQA questions for split 'val'"):
        gqa.build(gqa_dir, "val")  # the fixture has no val_balanced_questions.json
    with pytest.raises(ValueError, match=r"not a file"):
        gqa.build(gqa_dir, "val", questions_file="question_dir", scene_graphs=tmp_path / "absent.json")
    with pytest.raises(ValueError, match=r"pointer '7' is outside the text's 3 whitespace tokens"):
        gqa.text_pointers("What is it?", {"7": "1"}, "question 'q'")
    with pytest.raises(ValueError, match=r"neither a token index"):
        gqa.text_pointers("What is it?", {"a-b": "1"}, "question 'q'")


def test_gqa_through_build_dataset_with_official_names_and_features(gqa_dir, gqa_vocab_file, tmp_path):
    shutil.copy(gqa_dir / "questions.json", tmp_path / "val_balanced_questions.json")
    (tmp_path / "train_all_questions").mkdir()
    for shard in (gqa_dir / "question_dir").glob("*.json"):
        shutil.copy(shard, tmp_path / "train_all_questions" / shard.name)
    assert len(build_dataset("gqa", tmp_path, "train", subset="all")) == 2

    scene_graphs = _scene_graphs(tmp_path)
    store = _store({"n578564": ([375, 500], [[120, 20, 270, 120], [0, 0, 10, 10]])}, tmp_path / "store")
    dataset = build_dataset(
        "gqa", tmp_path, "val", region_features=store, scene_graphs=scene_graphs.name, answer_vocab=gqa_vocab_file
    )
    row = dataset[0]
    assert (row["question_id"], row["feature_row"], row["label"]) == ("202218649", 0, 472)
    options = {"scene_graphs": scene_graphs.name, "answer_vocab": gqa_vocab_file}
    assert build_dataset("gqa", tmp_path, "validation", **options)["question_id"] == dataset["question_id"]
    # the picture's gold box is region 0 exactly, the chalkboard overlaps no region: its best one gets it all
    assert row["full_answer_phrase_regions"][0] == [1.0, 0.0]


# ================================================================================================================
# Visual Genome
# ================================================================================================================


@pytest.fixture(scope="module")
def vg_dir() -> Path:
    return _real("visual_genome")


def _vg_regions(vg_dir: Path) -> dict[str, dict]:
    return {str(r["region_id"]): r for image in _read(vg_dir / "region_descriptions.json") for r in image["regions"]}


def test_visual_genome_sentences_pointers_and_boxes(vg_dir):
    dataset = visual_genome.build(vg_dir, "all")
    regions, images = _vg_regions(vg_dir), _read(vg_dir / "region_descriptions.json")

    assert len(dataset) == sum(bool(image["regions"]) for image in images) == 5
    assert sorted(dataset["image_id"], key=int) == [str(image["id"]) for image in images]
    for row in dataset:
        ids = row["sentence_region_ids"]
        assert 1 <= len(ids) <= 3 and len(set(ids)) == len(ids)
        assert len(row["sentence_phrase_spans"]) == len(row["sentence_phrase_boxes"]) == len(ids)
        texts = [row["sentence"][s:e] for s, e in row["sentence_phrase_spans"]]
        assert row["sentence"] == " and ".join(texts)
        for text, boxes, region_id in zip(texts, row["sentence_phrase_boxes"], ids):
            region = regions[region_id]
            assert str(region["image_id"]) == row["image_id"]
            assert text == " ".join(region["phrase"].split()).rstrip(".").rstrip()
            x, y, w, h = region["x"], region["y"], region["width"], region["height"]
            assert boxes == [[float(x), float(y), float(x + w), float(y + h)]]


def test_visual_genome_objects_attributes_and_sizes(vg_dir):
    dataset = visual_genome.build(vg_dir, "all")
    objects = {str(image["image_id"]): image["objects"] for image in _read(vg_dir / "objects.json")}
    attributes = {
        o["object_id"]: o.get("attributes", [])
        for image in _read(vg_dir / "attributes.json")
        for o in image["attributes"]
    }
    sizes = {str(image["image_id"]): [image["height"], image["width"]] for image in _read(vg_dir / "image_data.json")}

    assert sum(len(ids) for ids in dataset["object_ids"]) == sum(len(o) for o in objects.values()) == 177
    for row in dataset:
        image_objects = objects[row["image_id"]]
        assert row["image_size"] == sizes[row["image_id"]]
        assert row["object_ids"] == [str(o["object_id"]) for o in image_objects]
        assert row["object_names"] == [o["names"][0] for o in image_objects]
        assert row["object_attributes"] == [[a.strip() for a in attributes[o["object_id"]]] for o in image_objects]
    first = next(row for row in dataset if row["image_id"] == "1")
    clock = first["object_ids"].index("1058498")  # clock: x=421, y=91, w=79, h=339, attributes green, tall
    assert (first["object_names"][clock], first["object_attributes"][clock]) == ("clock", ["green", "tall"])
    assert first["object_boxes"][clock] == [421.0, 91.0, 500.0, 430.0]
    assert next(row for row in dataset if row["image_id"] == "3")["image_size"] == [480, 640]


def test_visual_genome_seeded_draws_and_options(vg_dir):
    first, again = visual_genome.build(vg_dir, "all", seed=0), visual_genome.build(vg_dir, "all", seed=0)
    assert first["sentence"] == again["sentence"]
    assert first["sentence"] != visual_genome.build(vg_dir, "all", seed=1)["sentence"]
    single = visual_genome.build(vg_dir, "all", num_pointers=(1,), sentences_per_image=2)
    assert len(single) == 10 and all(len(spans) == 1 for spans in single["sentence_phrase_spans"])
    three = visual_genome.build(vg_dir, "all", num_pointers=(3,))
    assert all(len(spans) == 3 for spans in three["sentence_phrase_spans"])


def test_visual_genome_splits_partition_the_images(vg_dir):
    all_ids = set(visual_genome.build(vg_dir, "all")["image_id"])
    train = set(visual_genome.build(vg_dir, "train", val_fraction=0.5)["image_id"])
    val = set(visual_genome.build(vg_dir, "val", val_fraction=0.5)["image_id"])
    assert train | val == all_ids and not train & val and train and val
    assert val == {i for i in all_ids if visual_genome.is_validation_image(i, 0.5, seed=0)}
    assert set(visual_genome.build(vg_dir, "train", val_fraction=0.0)["image_id"]) == all_ids
    with pytest.raises(ValueError, match=r"split 'val' .* is empty"):
        visual_genome.build(vg_dir, "val", val_fraction=0.0)


def test_visual_genome_bad_input_is_a_clear_value_error(vg_dir, tmp_path):
    with pytest.raises(ValueError, match=r"`split` of Visual Genome must be one of"):
        visual_genome.build(vg_dir, "test")
    with pytest.raises(ValueError, match=r"image_data.json' is not a file"):
        visual_genome.build(tmp_path, "all")
    with pytest.raises(ValueError, match=r"`val_fraction` must be in \[0, 1\]"):
        visual_genome.build(vg_dir, "train", val_fraction=1.5)
    with pytest.raises(ValueError, match=r"`num_pointers` must be"):
        visual_genome.build(vg_dir, "all", num_pointers=(0,))


def test_visual_genome_through_build_dataset(vg_dir):
    dataset = build_dataset("visual_genome", vg_dir, "all", seed=0)
    assert dataset["sentence"] == visual_genome.build(vg_dir, "all")["sentence"]
    validation = build_dataset("visual_genome", vg_dir, "validation", seed=0)
    assert len(validation) and validation["sentence"] == visual_genome.build(vg_dir, "val", seed=0)["sentence"]
    assert set(dataset.features) >= {"image_id", "image_size", "sentence_phrase_spans", "sentence_phrase_boxes"}


# ================================================================================================================
# VQA v2
# ================================================================================================================

HEAD = ("vqa_v2", "official_val2014_questions_head")
VAL_QUESTIONS = "v2_OpenEnded_mscoco_val2014_questions.json"
# hand-made answers for two real val questions; the normalised answers are written out by hand
BEDS = ["2", "two", "Two.", "2", "1", "one", "2", "3", "2 beds", "two"]  # "How many beds?" (262162001)
BEDS_NORMALISED = ["2", "2", "2", "2", "1", "1", "2", "3", "2 beds", "2"]
WHITE = ["yes", "yes", "Yes", "yes!", "no", "no", "white", "not sure", "maybe", "off-white"]  # "Is the bed white?"
WHITE_NORMALISED = ["yes", "yes", "yes", "yes", "no", "no", "white", "not sure", "maybe", "off white"]


@pytest.fixture(scope="module")
def vqa_vocab_file() -> Path:
    return _real("vqa_v2", "trainval_ans2label.json")


def _annotation(question: dict, answers: list[str], answer_type: str) -> dict:
    """One annotation in the official v2_mscoco_*_annotations.json layout."""
    return {
        "question_type": " ".join(question["question"].lower().split()[:2]),
        "multiple_choice_answer": Counter(answers).most_common(1)[0][0],
        "answer_type": answer_type,
        "image_id": question["image_id"],
        "question_id": question["question_id"],
        "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1} for i, a in enumerate(answers)],
    }


@pytest.fixture()
def val_annotations(tmp_path) -> Path:
    """Full-field annotations for the 65 real questions of the official val2014 head."""
    questions = _read(_real(*HEAD, VAL_QUESTIONS))["questions"]
    annotations = []
    for question in questions:
        answers = {262162001: BEDS, 262162012: WHITE}.get(question["question_id"], ["yes"] * 10)
        annotations.append(_annotation(question, answers, "number" if answers is BEDS else "yes/no"))
    content = {"info": {}, "license": {}, "data_subtype": "val2014", "annotations": annotations}
    return _write(tmp_path / "v2_mscoco_val2014_annotations.json", content)


def test_vqa_normalisation():
    cases = {
        "Two": "2", "two.": "2", "The net": "net", "dont know": "don't know", "yes!": "yes", "2.5": "2.5",
        "1,000": "1000", "red-white": "red white", "red - white": "red white", "None": "0", "mr. smith": "mr smith",
        "  A\tdog\n": "dog",
    }  # fmt: skip
    assert {answer: vqa_v2.normalize_answer(answer) for answer in cases} == cases
    assert [vqa_v2.normalize_answer(a) for a in BEDS + WHITE] == BEDS_NORMALISED + WHITE_NORMALISED


def test_vqa_soft_scores_hand_made():
    answers = ["yes"] * 4 + ["no"] * 2 + ["2", "two", "Two.", "3"]
    labels, scores = vqa_v2.soft_targets([vqa_v2.normalize_answer(a) for a in answers], {"yes": 0, "no": 1, "2": 2})
    assert labels == [0, 1, 2]
    assert scores == pytest.approx([1.0, 2 / 3, 1.0])  # "3" is not in the vocabulary
    assert [vqa_v2.answer_score(c) for c in range(5)] == pytest.approx([0, 1 / 3, 2 / 3, 1, 1])


def test_vqa_real_vocab_and_frequency_rule(vqa_vocab_file, tmp_path):
    vocab = vqa_v2.read_answer_vocab(vqa_vocab_file)
    assert len(vocab) == 3129
    assert all(vqa_v2.normalize_answer(answer) == answer for answer in vocab)  # the published answers are normal
    # multiple_choice_answer per question: "yes" x 10, "2" x 4 + "Two" x 5 (= "2" x 9), "no" x 8, "red" x 1
    chosen = ["yes"] * 10 + ["2"] * 4 + ["Two"] * 5 + ["no"] * 8 + ["red"]
    questions = [{"question_id": i, "image_id": 1, "question": "?"} for i in range(len(chosen))]
    content = {"annotations": [_annotation(q, [answer] * 10, "other") for q, answer in zip(questions, chosen)]}
    path = _write(tmp_path / "v2_mscoco_train2014_annotations.json", content)
    assert vqa_v2.build_answer_vocab(path) == {"yes": 0, "2": 1}
    assert vqa_v2.build_answer_vocab(path, min_count=8) == {"yes": 0, "2": 1, "no": 2}
    assert vqa_v2.build_answer_vocab([path, path]) == {"yes": 0, "2": 1}  # counts questions, not files
    with pytest.raises(ValueError, match=r"no answer .* answers 11 or more questions"):
        vqa_v2.build_answer_vocab(path, min_count=11)


def test_vqa_real_trimmed_fixture_counts(vqa_vocab_file):
    fixture = _real("vqa_v2", "allennlp_fixture")
    dataset = vqa_v2.build(
        fixture,
        "train",
        questions_file="questions.json",
        annotations_file="annotations.json",
        answer_vocab=vqa_vocab_file,
    )
    questions, annotations = (
        _read(fixture / "questions.json")["questions"],
        _read(fixture / "annotations.json")["annotations"],
    )
    vocab = _read(vqa_vocab_file)

    assert len(dataset) == len(questions) == 3
    assert sum(len(a) for a in dataset["answers"]) == sum(len(a["answers"]) for a in annotations) == 30
    for row, annotation in zip(dataset, annotations):
        raw = [a["answer"] for a in annotation["answers"]]
        assert all(a.isalpha() and a.islower() for a in raw)  # already normal: counted here without normalising
        counts = Counter(raw)
        assert row["answers"] == raw
        assert row["labels"] == [vocab[a] for a in counts if a in vocab]
        assert row["scores"] == pytest.approx([min(c / 3, 1) for a, c in counts.items() if a in vocab])
        assert (row["coco_split"], row["question_type"], row["multiple_choice_answer"]) == ("train2014", None, None)
    first = dataset[0]
    assert first["question"] == "What is this photo taken looking through?" and first["image_id"] == "458752"
    assert dict(zip(first["labels"], first["scores"])) == pytest.approx(
        {vocab["net"]: 1.0, vocab["pitcher"]: 1 / 3, vocab["orange"]: 1 / 3}
    )


def test_vqa_official_val_head_with_full_annotations(vqa_vocab_file, val_annotations):
    head = _real(*HEAD)
    dataset = vqa_v2.build(head, "val", annotations_file=val_annotations, answer_vocab=vqa_vocab_file)
    questions, vocab = _read(head / VAL_QUESTIONS)["questions"], _read(vqa_vocab_file)

    assert len(dataset) == len(questions) == 65
    assert dataset["question_id"] == [q["question_id"] for q in questions]
    assert dataset["image_id"] == [str(q["image_id"]) for q in questions]
    assert set(dataset["coco_split"]) == {"val2014"}
    row = dataset[dataset["question_id"].index(393225000)]
    assert row["question"] == "What website copyrighted the picture?"
    beds = dataset[dataset["question_id"].index(262162001)]
    assert (beds["answers"], beds["answer_type"], beds["multiple_choice_answer"]) == (BEDS_NORMALISED, "number", "2")
    assert dict(zip(beds["labels"], beds["scores"])) == pytest.approx(
        {vocab["2"]: 1.0, vocab["1"]: 2 / 3, vocab["3"]: 1 / 3}
    )
    white = dataset[dataset["question_id"].index(262162012)]
    expected = {vocab[a]: min(c / 3, 1) for a, c in Counter(WHITE_NORMALISED).items() if a in vocab}
    assert dict(zip(white["labels"], white["scores"])) == pytest.approx(expected)
    assert len(white["labels"]) == 4  # yes, no, white, not sure; "maybe" and "off white" are not in the 3,129


def test_vqa_vocab_from_train_annotations_and_test_split(tmp_path):
    head = _real(*HEAD, VAL_QUESTIONS)
    content = _read(head)
    content["data_subtype"] = "train2014"
    _write(tmp_path / "v2_OpenEnded_mscoco_train2014_questions.json", content)
    annotations = [
        _annotation(q, ["yes"] * 10 if i % 2 else ["no"] * 9 + ["red"], "yes/no")
        for i, q in enumerate(content["questions"])
    ]
    _write(tmp_path / "v2_mscoco_train2014_annotations.json", {"annotations": annotations})
    dataset = vqa_v2.build(tmp_path, "train", min_answer_count=30)  # 32 "yes", 33 "no": both kept, "no" first
    assert dict(zip(dataset["multiple_choice_answer"][:2], dataset["labels"][:2])) == {"no": [0], "yes": [1]}

    content["data_subtype"] = "test-dev2015"
    _write(tmp_path / "v2_OpenEnded_mscoco_test-dev2015_questions.json", content)
    test_dev = vqa_v2.build(tmp_path, "test-dev")
    assert len(test_dev) == 65 and set(test_dev["coco_split"]) == {"test2015"}
    assert test_dev["answers"] == test_dev["labels"] == [[]] * 65


def test_vqa_bad_input_is_a_clear_value_error(vqa_vocab_file, val_annotations, tmp_path):
    head = _real(*HEAD)
    with pytest.raises(ValueError, match=r"`split` of VQA v2 must be one of"):
        vqa_v2.build(head, "minival")
    with pytest.raises(ValueError, match=r"v2_OpenEnded_mscoco_train2014_questions.json' is not a file"):
        vqa_v2.build(head, "train")
    with pytest.raises(ValueError, match=r"holds data_subtype 'val2014', but split 'train'"):
        vqa_v2.build(
            head, "train", questions_file=VAL_QUESTIONS, annotations_file=val_annotations, answer_vocab=vqa_vocab_file
        )
    with pytest.raises(ValueError, match=r"built from the train annotations"):
        vqa_v2.build(head, "val", annotations_file=val_annotations)
    trimmed = _read(val_annotations)
    trimmed["annotations"] = trimmed["annotations"][1:]
    with pytest.raises(ValueError, match=r"no annotation for 1 of 65 questions \(e.g. question id 262148000\)"):
        vqa_v2.build(
            head, "val", annotations_file=_write(tmp_path / "trimmed.json", trimmed), answer_vocab=vqa_vocab_file
        )
    with pytest.raises(ValueError, match=r"labels must be 0..1"):
        vqa_v2.read_answer_vocab({"yes": 0, "no": 2})
    with pytest.raises(ValueError, match=r"`image_id_template` may only use"):
        vqa_v2.store_image_ids(image_id_template="{image}")


def test_vqa_store_image_ids():
    candidates, columns = vqa_v2.store_image_ids()
    assert columns == ("image_id", "coco_split")
    assert candidates({"image_id": "393225", "coco_split": "val2014"}) == ["393225", "COCO_val2014_000000393225"]
    templated, _ = vqa_v2.store_image_ids(image_id_template="{split}/{id:06d}")
    assert templated({"image_id": "42", "coco_split": "val2014"}) == ["val2014/000042"]


def test_vqa_through_build_dataset_with_region_features(vqa_vocab_file, val_annotations, tmp_path, caplog):
    head = _real(*HEAD)
    store = _store(
        {
            "COCO_val2014_000000262162": ([480, 640], [[0, 0, 100, 100], [50, 50, 300, 200]]),
            "COCO_val2014_000000000042": ([480, 640], [[10, 10, 20, 20]]),
        },
        tmp_path / "s",
    )
    options = {"annotations_file": val_annotations, "answer_vocab": vqa_vocab_file}
    with pytest.raises(
        ValueError, match=r"image '262148' \(tried \['262148', 'COCO_val2014_000000262148'\]\) is not in"
    ):
        build_dataset("vqa_v2", head, "val", region_features=store, **options)

    with caplog.at_level(logging.WARNING):
        dataset = build_dataset("vqa_v2", head, "val", region_features=store, on_missing_image="skip", **options)
    questions = _read(head / VAL_QUESTIONS)["questions"]
    kept = [q for q in questions if q["image_id"] in (262162, 42)]
    assert len(dataset) == len(kept) == 33
    assert build_dataset("vqa_v2", head, "validation", **options)["question_id"] == [q["question_id"] for q in questions]
    assert dataset["question_id"] == [q["question_id"] for q in kept]
    expected_rows = [store.row_of(f"COCO_val2014_{q['image_id']:012d}") for q in kept]
    assert dataset["feature_row"] == expected_rows and set(expected_rows) == {0, 1}
    assert (
        f"vqa_v2 val: {65 - 33} of 65 rows skipped (on_missing_image='skip'): image not in the region-feature store "
        f"{store.directory}." in caplog.messages
    )

    plain = build_dataset("vqa_v2", head, "val", **options)
    assert len(plain) == 65 and "feature_row" not in plain.column_names
