"""Synthetic questions with pointers (`synthetic/questions.py`): GQA files read back through the real GQA builder,
answers recomputed from the scene graphs, entailed questions (they follow from the entailing answers, and GQA's
consistency metric runs on them), determinism, answer balance, region features and the QA collator."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from hf_vlalign.alignment import box_iou
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import QuestionAnsweringCollator
from hf_vlalign.data.formats.flickr30k_entities import read_annotation
from hf_vlalign.metrics import gqa_scores
from hf_vlalign.synthetic import (
    COLOUR_NAMES,
    COLOUR_WORDS,
    SHAPE_NAMES,
    SHAPE_WORDS,
    SIZE_NAMES,
    SIZE_WORDS,
    SyntheticSceneConfig,
    SyntheticVGPPaths,
    generate_synthetic_scenes,
    load_or_generate_synthetic_vgp,
)
from hf_vlalign.synthetic.questions import (
    GENERIC_NOUNS,
    MAX_QUESTIONS,
    MIN_QUESTIONS,
    TEMPLATE_TYPES,
)

SMALL = SyntheticSceneConfig(num_train_images=30, num_val_images=10, feature_dim=32, seed=0)
SPLITS = ("train", "val")
GQA_FILES = [
    *(f"{split}_{kind}.json" for split in SPLITS for kind in ("balanced_questions", "all_questions", "sceneGraphs")),
    "trainval_ans2label.json",
    "trainval_label2ans.json",
]
TEXT_KEYS = {"question": "question", "answer": "answer", "full_answer": "fullAnswer"}


def _canonical(word: str, names: tuple[str, ...], synonyms: dict[str, tuple[str, ...]]) -> str | None:
    return next((name for name in names if word in synonyms.get(name, (name,))), None)


def _description(words: list[str]) -> dict[str, str | None]:
    """(kind or None for a generic noun, colour, size) of a noun phrase's content words."""
    described = {"kind": None, "colour": None, "size": None}
    for word in words:
        for key, names, synonyms in (
            ("kind", SHAPE_NAMES, SHAPE_WORDS),
            ("colour", COLOUR_NAMES, COLOUR_WORDS),
            ("size", SIZE_NAMES, SIZE_WORDS),
        ):
            found = _canonical(word, names, synonyms)
            if found is not None:
                described[key] = found
    return described


def _matches(obj: dict, described: dict[str, str | None]) -> bool:
    colour, size = obj["attributes"]
    return all(
        value is None or value == actual
        for value, actual in zip(described.values(), (obj["name"], colour, size))
    )


def _xyxy(obj: dict) -> list[float]:
    return [obj["x"], obj["y"], obj["x"] + obj["w"], obj["y"] + obj["h"]]


def _relation(first: dict, second: dict) -> str:
    """Where `first` lies relative to `second`, along the axis where their centres are furthest apart."""
    dx = (second["x"] + second["w"] / 2) - (first["x"] + first["w"] / 2)
    dy = (second["y"] + second["h"] / 2) - (first["y"] + first["h"] / 2)
    if abs(dx) >= abs(dy):
        return "to the left of" if dx > 0 else "to the right of"
    return "above" if dy > 0 else "below"


class _Generated:
    """The GQA files of a generated folder, read as JSON."""

    def __init__(self, paths: SyntheticVGPPaths) -> None:
        self.paths = paths
        gqa = self.paths.gqa_dir
        self.questions = {s: json.loads((gqa / f"{s}_balanced_questions.json").read_text()) for s in SPLITS}
        self.all_questions = {s: json.loads((gqa / f"{s}_all_questions.json").read_text()) for s in SPLITS}
        self.graphs = {s: json.loads((gqa / f"{s}_sceneGraphs.json").read_text()) for s in SPLITS}
        self.vocab = json.loads((gqa / "trainval_ans2label.json").read_text())
        self.answers = json.loads((gqa / "trainval_label2ans.json").read_text())

    def records(self, subset: str = "balanced"):
        """(split, question id, record, its image's scene graph) of the balanced or all questions."""
        questions = self.questions if subset == "balanced" else self.all_questions
        for split in SPLITS:
            for question_id, record in questions[split].items():
                yield split, question_id, record, self.graphs[split][record["imageId"]]

    def entailments(self):
        """(split, entailing record, entailed id, entailed record) of every balanced question's `entailed` id."""
        for split, _, record, _ in self.records():
            for entailed_id in record["entailed"]:
                yield split, record, entailed_id, self.all_questions[split].get(entailed_id)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def generated(cache_dir) -> _Generated:
    return _Generated(load_or_generate_synthetic_vgp(cache_dir, SMALL))  # the folder the builder reads


@pytest.fixture(scope="module")
def store(cache_dir, generated):
    return synthetic_region_features(cache_dir, SMALL)


# ----------------------------------------------------------------------------------------------------------------
# Files and records
# ----------------------------------------------------------------------------------------------------------------


def test_layout_record_fields_and_scene_graphs(generated):
    assert sorted(path.name for path in generated.paths.gqa_dir.iterdir()) == sorted(GQA_FILES)
    sizes = {"train": SMALL.num_train_images, "val": SMALL.num_val_images}
    for split in SPLITS:
        graphs = generated.graphs[split]
        assert len(graphs) == sizes[split]
        images = Counter(record["imageId"] for record in generated.questions[split].values())
        assert set(images) == set(graphs)
        assert all(MIN_QUESTIONS <= count <= MAX_QUESTIONS for count in images.values())
        for image_id, graph in graphs.items():
            # the shapes of the Flickr30k Entities annotation, same ids, same boxes (published 1-based inclusive)
            annotation = read_annotation(generated.paths.flickr30k_entities / "Annotations" / f"{image_id}.xml")
            assert (graph["width"], graph["height"]) == (SMALL.image_size, SMALL.image_size)
            assert set(graph["objects"]) == set(annotation.boxes)
            for object_id, obj in graph["objects"].items():
                assert isinstance(object_id, str) and obj["name"] in SHAPE_NAMES
                assert obj["attributes"][0] in COLOUR_NAMES and obj["attributes"][1] in SIZE_NAMES
                (x1, y1, x2, y2), = annotation.boxes[object_id]
                assert _xyxy(obj) == [x1 - 1, y1 - 1, x2, y2]
                others = {relation["object"]: relation["name"] for relation in obj["relations"]}
                assert set(others) == set(graph["objects"]) - {object_id}
                assert all(name == _relation(obj, graph["objects"][o]) for o, name in others.items())
    for _, question_id, record, _ in generated.records():
        assert question_id.isdigit() and question_id.startswith(record["imageId"])
        assert record["isBalanced"] is True and set(record["annotations"]) == set(TEXT_KEYS.values())
        assert question_id in record["equivalent"] and isinstance(record["entailed"], list)
        structural, semantic = TEMPLATE_TYPES[record["types"]["detailed"]]
        detailed = record["types"]["detailed"]
        assert record["types"] == {"structural": structural, "semantic": semantic, "detailed": detailed}
        assert record["question"].endswith("?") and record["fullAnswer"].endswith(".")
        assert record["semanticStr"].startswith("select: ") and len(record["semantic"]) >= 2
    assert {record["types"]["detailed"] for *_, record, _ in generated.records()} == set(TEMPLATE_TYPES)


def test_same_seed_gives_identical_gqa_files_and_another_seed_differs(generated, tmp_path):
    again = generate_synthetic_scenes(tmp_path / "again", SMALL)
    other = generate_synthetic_scenes(tmp_path / "other", SyntheticSceneConfig(**{**vars(SMALL), "seed": 1}))
    for name in GQA_FILES:
        assert (again.gqa_dir / name).read_bytes() == (generated.paths.gqa_dir / name).read_bytes(), name
    assert (other.gqa_dir / GQA_FILES[0]).read_bytes() != (generated.paths.gqa_dir / GQA_FILES[0]).read_bytes()


# ----------------------------------------------------------------------------------------------------------------
# Pointers, noun phrases and answers
# ----------------------------------------------------------------------------------------------------------------


def _pointed_phrases(text: str, pointers: dict[str, str]):
    """(content words without punctuation, object id) per pointer, read as GQA defines the keys."""
    tokens = text.split()
    for key, object_id in pointers.items():
        start, _, end = key.partition(":")
        start, end = int(start), int(end) if end else int(start) + 1
        yield [token.strip("?.,").lower() for token in tokens[start:end]], object_id


def test_noun_phrases_name_their_object_and_identify_it_uniquely(generated):
    checked = 0
    for _, question_id, record, graph in generated.records("all"):
        for key in TEXT_KEYS.values():
            for words, object_id in _pointed_phrases(record[key], record["annotations"][key]):
                obj, described = graph["objects"][object_id], _description(words)
                if words[-1] in GENERIC_NOUNS:  # "What shape is the blue object?": the shape is what is asked
                    assert record["types"]["detailed"] == "queryShape" and key != "answer", question_id
                else:
                    assert described["kind"] == obj["name"], (question_id, words)
                if key == "answer" or words == [record["answer"]]:
                    continue  # the answer naming its object ("is a diamond") is not what identifies it
                matching = [o for o, candidate in graph["objects"].items() if _matches(candidate, described)]
                assert matching == [object_id], (question_id, words, matching)
                checked += 1
    assert checked > 1.5 * len(list(generated.records("all")))


def test_answers_follow_from_the_scene_graph(generated):
    """Every question of the all files, the entailed ones too, is answered as its scene graph says."""
    for _, question_id, record, graph in generated.records("all"):
        template, objects, answer = record["types"]["detailed"], graph["objects"], record["answer"]
        pointed = list(record["annotations"]["question"].values())
        question_words = [token.strip("?").lower() for token in record["question"].split()]
        where = (question_id, record["question"], answer)
        if template == "queryColor":
            assert answer == objects[pointed[0]]["attributes"][0], where
        elif template == "queryShape":
            assert answer == objects[pointed[0]]["name"], where
            assert record["annotations"]["answer"] == {"0": pointed[0]}
        elif template == "chooseSize":
            assert answer == objects[pointed[0]]["attributes"][1] and answer in question_words, where
            assert set(SIZE_NAMES) <= set(question_words)
        elif template == "verifyColor":
            asked = _canonical(question_words[-1], COLOUR_NAMES, COLOUR_WORDS)
            assert answer == ("yes" if asked == objects[pointed[0]]["attributes"][0] else "no"), where
        elif template == "exist":
            described = _description(question_words[3:])
            matching = [o for o, obj in objects.items() if _matches(obj, described)]
            assert answer == ("yes" if matching else "no"), where
            assert pointed == matching  # pointers only to what exists, and then to the one object named
        elif template == "relS":
            relation = record["question"][len("What is ") : record["question"].rindex(" the ")]
            (other,) = record["annotations"]["answer"].values()
            reference = objects[pointed[0]]
            related = [o for o, obj in objects.items() if o != pointed[0] and _relation(obj, reference) == relation]
            assert related == [other] and answer == objects[other]["name"], where
        else:
            raise AssertionError(f"unknown template {template!r}")


def test_answers_are_balanced_and_in_the_vocabulary(generated):
    assert generated.answers == sorted(generated.vocab, key=generated.vocab.get)
    answers = [record["answer"] for *_, record, _ in generated.records()]
    assert set(answers) == set(generated.vocab)
    for split in SPLITS:
        counts = Counter(record["answer"] for record in generated.questions[split].values())
        assert counts.most_common(1)[0][1] / sum(counts.values()) < 0.4, counts
    for template in ("verifyColor", "exist"):  # GQA balances yes / no within a question type
        records = [record for *_, record, _ in generated.records() if record["types"]["detailed"] == template]
        counts = Counter(record["answer"] for record in records)
        assert set(counts) == {"yes", "no"} and 0.3 < counts["yes"] / sum(counts.values()) < 0.7, (template, counts)


# ----------------------------------------------------------------------------------------------------------------
# Entailed questions and GQA's consistency
# ----------------------------------------------------------------------------------------------------------------


def test_all_files_hold_the_balanced_questions_and_the_questions_they_entail(generated):
    for split in SPLITS:
        balanced, every = generated.questions[split], generated.all_questions[split]
        assert {question_id: every[question_id] for question_id in balanced} == balanced
        added = {question_id for question_id in every if question_id not in balanced}
        assert added and all(every[question_id]["isBalanced"] is False for question_id in added)
        assert added <= {entailed for record in balanced.values() for entailed in record["entailed"]}
        for question_id, record in every.items():
            assert question_id not in record["entailed"] and len(set(record["entailed"])) == len(record["entailed"])
            assert all(every[entailed]["imageId"] == record["imageId"] for entailed in record["entailed"])
            # GQA's `equivalent`: itself and the image's questions with its program, hence its answer
            assert question_id in record["equivalent"]
            for other in map(every.get, record["equivalent"]):
                assert (other["semanticStr"], other["answer"]) == (record["semanticStr"], record["answer"])
    for _, question_id, record, _ in generated.records():  # only an absent shape's exist question entails nothing
        assert bool(record["entailed"]) or record["types"]["detailed"] == "exist", question_id
    assert all(entailed is not None for *_, entailed in generated.entailments())


def _stated_facts(record: dict) -> dict[str, dict[str, str | None]]:
    """What a question and its answer state about each object they point at, read from the text alone: the
    attributes its question phrase names ("kind", "colour", "size"; None: not named), the one the answer gives, and
    for a verifyColor "no" the colour it is not ("not_colour")."""
    facts = {
        object_id: _description(words)
        for words, object_id in _pointed_phrases(record["question"], record["annotations"]["question"])
    }
    template, answer = record["types"]["detailed"], record["answer"]
    if template == "relS":
        facts[record["annotations"]["answer"]["0"]] = {"kind": answer, "colour": None, "size": None}
    elif facts and template != "exist":
        (subject,) = facts.values()
        if template == "verifyColor":
            asked = _canonical(record["question"].split()[-1].strip("?").lower(), COLOUR_NAMES, COLOUR_WORDS)
            subject["colour" if answer == "yes" else "not_colour"] = asked
        else:
            subject[{"queryColor": "colour", "queryShape": "kind", "chooseSize": "size"}[template]] = answer
    return facts


def _follows(facts: dict[str, dict[str, str | None]], entailed: dict) -> bool:
    """Whether the answer of `entailed` is fixed by `facts` (`_stated_facts` of the entailing question)."""
    template, answer = entailed["types"]["detailed"], entailed["answer"]
    pointed = list(_pointed_phrases(entailed["question"], entailed["annotations"]["question"]))
    if template == "exist" and answer == "no":  # a shape the entailing phrase names only, with another colour
        described = _description([token.strip("?").lower() for token in entailed["question"].split()[3:]])
        return not pointed and any(
            stated.get("not_colour") == described["colour"]
            and stated["kind"] == described["kind"]
            and stated["size"] == described["size"]
            for stated in facts.values()
        )
    if len(pointed) != 1:
        return False
    ((words, object_id),) = pointed
    stated = facts.get(object_id, {})
    if template == "exist":  # yes: it names no more than is stated about the object
        return all(value is None or stated.get(key) == value for key, value in _description(words).items())
    if template == "verifyColor":
        asked = _canonical(entailed["question"].split()[-1].strip("?").lower(), COLOUR_NAMES, COLOUR_WORDS)
        return stated.get("colour") is not None and answer == ("yes" if asked == stated["colour"] else "no")
    return template == "queryColor" and answer == stated.get("colour")


def test_entailed_answers_follow_from_the_entailing_answers(generated):
    """Read from the texts alone (no scene graph): every entailed answer is fixed by what the entailing question and
    its answer state about the same shapes (the answers themselves are checked against the scene graphs above)."""
    pairs = set()
    for _, record, _, entailed in generated.entailments():
        assert _follows(_stated_facts(record), entailed), (record["question"], record["answer"], entailed["question"])
        pairs.add((record["types"]["detailed"], entailed["types"]["detailed"], entailed["answer"] in ("yes", "no")))
    assert pairs == {
        *((template, "exist", True) for template in TEMPLATE_TYPES),
        ("queryColor", "verifyColor", True),
        ("verifyColor", "queryColor", False),
    }


def _contradiction(answer: str) -> str:
    return {"yes": "no", "no": "yes"}.get(answer, "none")


def test_gqa_consistency_is_one_for_the_gold_answers_and_below_for_a_contradicting_answerer(generated):
    for split in SPLITS:
        questions = generated.all_questions[split]
        gold = {question_id: record["answer"] for question_id, record in questions.items()}
        oracle = gqa_scores(gold, questions)
        assert oracle["consistency"] == 1.0 and oracle["accuracy"] == 1.0
        assert oracle["num_questions"] == len(generated.questions[split])  # GQA scores the balanced questions only
        # right on every balanced question, wrong on every question that is only entailed
        contradicting = {
            question_id: answer if questions[question_id]["isBalanced"] else _contradiction(answer)
            for question_id, answer in gold.items()
        }
        scores = gqa_scores(contradicting, questions)
        assert scores["accuracy"] == 1.0 and scores["consistency"] < 0.5
        # the balanced file alone lacks the entailed questions, as GQA's does
        balanced = generated.questions[split]
        assert gqa_scores({question_id: gold[question_id] for question_id in balanced}, balanced)["consistency"] is None


# ----------------------------------------------------------------------------------------------------------------
# Through the GQA builder, the region features and the collator
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("subset", ["balanced", "all"])
def test_every_pointer_resolves_through_the_gqa_builder_to_its_object_box(generated, cache_dir, subset):
    for split in SPLITS:
        dataset = build_dataset("synthetic_scenes", cache_dir, split, task="questions", config=SMALL, subset=subset)
        questions = generated.questions if subset == "balanced" else generated.all_questions
        records, graphs = questions[split], generated.graphs[split]
        assert len(dataset) == len(records) and list(dataset["question_id"]) == list(records)
        # the vocabulary is that of the balanced answers: an entailed question may have another (-1)
        for label, answer in zip(dataset["label"], dataset["answer"]):
            assert generated.answers[label] == answer if answer in generated.vocab else label == -1
        for row in dataset:
            record, graph = records[row["question_id"]], graphs[row["image_id"]]
            assert row["image_size"] == [SMALL.image_size, SMALL.image_size]
            assert row["object_ids"] == list(graph["objects"])
            for column, key in TEXT_KEYS.items():
                assert len(row[f"{column}_phrase_spans"]) == len(record["annotations"][key])
                for (start, end), (object_id,), boxes in zip(
                    row[f"{column}_phrase_spans"], row[f"{column}_pointer_object_ids"], row[f"{column}_phrase_boxes"]
                ):
                    obj = graph["objects"][object_id]
                    assert boxes == [_xyxy(obj)]
                    words = row[column][start:end].lower().split()
                    assert words[-1] in SHAPE_WORDS.get(obj["name"], (obj["name"],)) or words[-1] in GENERIC_NOUNS


def test_joined_region_features_give_targets_on_the_pointed_objects(cache_dir, store):
    dataset = build_dataset("synthetic_scenes", cache_dir, "train", store, task="questions", config=SMALL)
    assert set(dataset["image_id"]) <= set(store.image_ids)
    hits = []
    for row in dataset:
        regions = store.image_at(row["feature_row"])["boxes"]
        for column in TEXT_KEYS:
            for target, boxes in zip(row[f"{column}_phrase_regions"], row[f"{column}_phrase_boxes"]):
                target = torch.tensor(target)
                assert float(target.sum()) == pytest.approx(1.0) and len(target) == len(regions)
                iou = box_iou(torch.tensor(boxes), regions)[0]
                hits.append(bool((iou[target > 0] >= 0.5).all()))
    assert len(hits) > 2 * len(dataset) and sum(hits) / len(hits) >= 0.95


def test_question_answering_collator_grounds_question_words_and_gives_labels(generated, cache_dir, store):
    from transformers import AutoTokenizer

    from hf_vlalign.utils.text_model import default_text_model_path

    dataset = build_dataset("synthetic_scenes", cache_dir, "val", store, task="questions", config=SMALL)
    rows = [dataset[i] for i in range(8)]
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    batch = QuestionAnsweringCollator(tokenizer, store, num_answers=len(generated.vocab))(rows)
    assert batch["labels"].tolist() == [row["label"] for row in rows] and bool((batch["labels"] >= 0).all())
    alignment = batch["word_region_alignment"]
    assert alignment.shape == (8, batch["input_ids"].shape[1], SMALL.num_regions)
    grounded = alignment.sum(dim=-1)
    assert bool(((grounded == 0) | torch.isclose(grounded, torch.ones(()))).all())
    for i, row in enumerate(rows):  # one grounded sub-word at least per question pointer
        assert int((grounded[i] > 0).sum()) >= len(row["question_phrase_spans"])
    assert int((grounded > 0).sum()) > 0


def test_unknown_task_names_the_choices(cache_dir):
    with pytest.raises(ValueError, match=r"`task` of synthetic_scenes must be one of .*'questions'"):
        build_dataset("synthetic_scenes", cache_dir, "train", task="qa", config=SMALL)
