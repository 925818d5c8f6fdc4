"""Synthetic NLVR2 and RefCOCO+ data (`synthetic/tasks.py`): the published files read back through the real
builders, NLVR2 labels recomputed from the GQA scene graphs, pair features and the pair / referring-expression
collators, determinism, and tiny splits."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.alignment import box_iou
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import ImagePairCollator, ReferringExpressionCollator
from hf_vlalign.data.formats.safe_pickle import load_restricted_pickle
from hf_vlalign.synthetic import (
    COLOUR_NAMES,
    COLOUR_WORDS,
    SHAPE_NAMES,
    SHAPE_WORDS,
    SIZE_NAMES,
    SIZE_WORDS,
    Shape,
    SyntheticSceneConfig,
    generate_synthetic_scenes,
    load_or_generate_synthetic_vgp,
)
from hf_vlalign.synthetic.tasks import (
    STATEMENT_TEMPLATES,
    _Description,
    relation_truth,
    sample_set_sentences,
)

SMALL = SyntheticSceneConfig(num_train_images=48, num_val_images=16, feature_dim=32, seed=0)
NLVR2_FIELDS = {
    "validation", "sentence", "left_url", "writer", "label", "right_url", "synset", "query", "identifier",
    "extra_validations",
}  # fmt: skip
NUMBERS = {word: n for n, word in enumerate(("zero", "one", "two", "three", "four", "five", "six", "seven", "eight"))}
SIDES = {"left": 0, "right": 1}
RELATION = r"(?P<rel>to the left of|to the right of|above|below)"
LOCATION_WORDS = {"left", "right", "top", "bottom", "above", "below", "middle", "between"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synthetic_tasks")


@pytest.fixture(scope="module")
def paths(cache):
    return load_or_generate_synthetic_vgp(cache, SMALL)


@pytest.fixture(scope="module")
def graphs(paths) -> dict[str, dict]:
    """Every image's GQA scene graph (both splits), by image id."""
    return {
        image_id: graph
        for split in ("train", "val")
        for image_id, graph in json.loads((paths.gqa_dir / f"{split}_sceneGraphs.json").read_text()).items()
    }


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


# ----------------------------------------------------------------------------------------------------------------
# An independent reading of the sentences: noun phrases and templates evaluated on the scene graphs
# ----------------------------------------------------------------------------------------------------------------


def _word_forms() -> dict[str, tuple[str, str]]:
    """word (singular or plural) -> (attribute, value); generic nouns -> ("kind", None)."""
    forms = {}
    for attribute, names, synonyms in (
        ("kind", SHAPE_NAMES, SHAPE_WORDS),
        ("colour", COLOUR_NAMES, COLOUR_WORDS),
        ("size", SIZE_NAMES, SIZE_WORDS),
    ):
        for name in names:
            for word in synonyms.get(name, (name,)):
                forms[word] = (attribute, name)
                if attribute == "kind":
                    forms[word + ("es" if word.endswith(("s", "x")) else "s")] = (attribute, name)
    for generic in ("shape", "shapes", "object", "objects", "one", "thing"):
        forms[generic] = ("kind", None)
    return forms


FORMS = _word_forms()


def _phrase(text: str) -> dict[str, str | None]:
    """(kind, colour, size) a noun phrase names; words other than attributes and nouns ("the", "in") are skipped."""
    named = {"kind": None, "colour": None, "size": None}
    for word in text.split():
        if word in FORMS:
            attribute, value = FORMS[word]
            named[attribute] = value
    return named


def _matches(obj: dict, named: dict[str, str | None]) -> bool:
    colour, size = obj["attributes"]
    return all(value is None or value == actual for value, actual in zip(named.values(), (obj["name"], colour, size)))


def _count(graph: dict, text: str) -> int:
    return sum(_matches(obj, _phrase(text)) for obj in graph["objects"].values())


def _centre(obj: dict) -> tuple[float, float]:
    return obj["x"] + obj["w"] / 2, obj["y"] + obj["h"] / 2


def _related(graph: dict, first: str, relation: str, second: str) -> bool | None:
    """From the graph's relations: some `first` object is `relation` another, `second` object; None when not, but
    such a pair lies in the relation's direction along its axis (the generator must never write those)."""
    axis, sign = {"to the left of": (0, -1), "to the right of": (0, 1), "above": (1, -1), "below": (1, 1)}[relation]
    objects, leaning = graph["objects"], False
    for object_id, obj in objects.items():
        if not _matches(obj, _phrase(first)):
            continue
        for edge in obj["relations"]:
            other = objects[edge["object"]]
            if _matches(other, _phrase(second)):
                if edge["name"] == relation:
                    return True
                leaning |= (_centre(obj)[axis] - _centre(other)[axis]) * sign > 0
    return None if leaning else False


# template -> (patterns, truth of (left graph, right graph, match))
TEMPLATES = {
    "relate": (
        [rf"^In the (?P<side>left|right) image, an? (?P<a>.+) is {RELATION} an? (?P<b>.+)\.$",
         rf"^The (?P<side>left|right) image shows an? (?P<a>.+) {RELATION} an? (?P<b>.+)\.$"],
        lambda g, m: _related(g[SIDES[m["side"]]], m["a"], m["rel"], m["b"]),
    ),
    "existSide": (
        [r"^The (?P<side>left|right) image (?:contains|shows) an? (?P<np>.+)\.$",
         r"^There is an? (?P<np>.+) in the (?P<side>left|right) image\.$"],
        lambda g, m: _count(g[SIDES[m["side"]]], m["np"]) >= 1,
    ),
    "existBoth": (
        [r"^Both images contain an? (?P<np>.+)\.$", r"^There is an? (?P<np>.+) in both images\.$"],
        lambda g, m: _count(g[0], m["np"]) >= 1 and _count(g[1], m["np"]) >= 1,
    ),
    "existOne": (
        [r"^Exactly one image contains an? (?P<np>.+)\.$", r"^Only one of the two images has an? (?P<np>.+)\.$"],
        lambda g, m: (_count(g[0], m["np"]) >= 1) != (_count(g[1], m["np"]) >= 1),
    ),
    "countSide": (
        [r"^The (?P<side>left|right) image has exactly (?P<n>\w+) (?P<np>.+)\.$",
         r"^There (?:is|are) exactly (?P<n>\w+) (?P<np>.+) in the (?P<side>left|right) image\.$"],
        lambda g, m: _count(g[SIDES[m["side"]]], m["np"]) == NUMBERS[m["n"]],
    ),
    "countTotal": (
        [r"^There (?:is|are) exactly (?P<n>\w+) (?P<np>.+) in total\.$",
         r"^The two images contain exactly (?P<n>\w+) (?P<np>.+) in total\.$"],
        lambda g, m: _count(g[0], m["np"]) + _count(g[1], m["np"]) == NUMBERS[m["n"]],
    ),
    "compare": (
        [r"^The (?P<side>left|right) image has more (?P<np>.+) than the (?:left|right) image\.$",
         r"^There are more (?P<np>.+) in the (?P<side>left|right) image than in the (?:left|right) image\.$"],
        lambda g, m: _count(g[SIDES[m["side"]]], m["np"]) > _count(g[1 - SIDES[m["side"]]], m["np"]),
    ),
}  # fmt: skip


def _recompute(sentence: str, left: dict, right: dict) -> tuple[str, bool | None]:
    for template, (patterns, truth) in TEMPLATES.items():
        for pattern in patterns:
            match = re.match(pattern, sentence)
            if match:
                return template, truth((left, right), match.groupdict())
    raise AssertionError(f"no template reads {sentence!r}")


def _image_of(url: str) -> str:
    match = re.fullmatch(r"images/(\d+)\.png", url)
    assert match, url
    return match[1]


def _xyxy(obj: dict) -> list[float]:
    return [obj["x"], obj["y"], obj["x"] + obj["w"], obj["y"] + obj["h"]]


# ----------------------------------------------------------------------------------------------------------------
# NLVR2
# ----------------------------------------------------------------------------------------------------------------


def test_nlvr2_files_read_by_the_real_builder_with_balanced_labels(paths):
    for split, nlvr2_split in (("train", "train"), ("val", "dev")):
        rows = build_dataset("synthetic_scenes", paths.root.parent, split, task="nlvr2", config=SMALL)
        assert len(rows) >= 4 * (SMALL.num_val_images // 8)
        assert all(identifier.startswith(f"{nlvr2_split}-") for identifier in rows["identifier"])
        assert sum(rows["label"]) * 2 == len(rows)  # every sentence keeps as many True as False pairs
        assert [row["left_image_id"].rsplit("-", 1)[0] for row in rows] == [i.rsplit("-", 1)[0] for i in rows["identifier"]]
        records = [json.loads(line) for line in (paths.nlvr2_dir / f"{nlvr2_split}.json").read_text().splitlines()]
        assert all(set(record) == NLVR2_FIELDS for record in records)
        assert len({record["identifier"] for record in records}) == len(records)
        # each sentence of a set is judged against several pairs, with both labels
        by_sentence = Counter((r["identifier"].split("-")[1], r["identifier"].split("-")[3], r["label"]) for r in records)
        assert {label for *_, label in by_sentence} == {"True", "False"}
        for (set_id, sentence_id, label), count in by_sentence.items():
            assert by_sentence[(set_id, sentence_id, "True" if label == "False" else "False")] == count
    dev = build_dataset("synthetic_scenes", paths.root.parent, "dev", task="nlvr2", config=SMALL)
    assert dev["identifier"] == build_dataset("synthetic_scenes", paths.root.parent, "val", task="nlvr2", config=SMALL)["identifier"]
    validation = build_dataset("synthetic_scenes", paths.root.parent, "validation", task="nlvr2", config=SMALL)
    assert validation["identifier"] == dev["identifier"]


def test_nlvr2_labels_match_a_recomputation_from_the_scene_graphs(paths, graphs):
    templates = Counter()
    for split in ("train", "dev"):
        for line in (paths.nlvr2_dir / f"{split}.json").read_text().splitlines():
            record = json.loads(line)
            left, right = (graphs[_image_of(record[key])] for key in ("left_url", "right_url"))
            template, truth = _recompute(record["sentence"], left, right)
            assert truth is not None, f"ambiguous: {record['sentence']!r} ({record['identifier']})"
            assert truth == (record["label"] == "True"), (record["identifier"], record["sentence"], template)
            templates[template, record["label"]] += 1
    assert {template for template, _ in templates} == set(STATEMENT_TEMPLATES)
    for template in STATEMENT_TEMPLATES:
        assert templates[template, "True"] == templates[template, "False"] > 0, template


def test_nlvr2_pair_features_attach_and_collate(paths, tokenizer):
    store = synthetic_region_features(paths.root.parent, SMALL, task="nlvr2")
    images = synthetic_region_features(paths.root.parent, SMALL)
    rows = build_dataset("synthetic_scenes", paths.root.parent, "val", task="nlvr2", config=SMALL, region_features=store)
    assert {"left_feature_row", "right_feature_row"} <= set(rows.column_names)
    row = rows[0]
    assert store.image_at(row["left_feature_row"])["image_id"] == row["left_image_id"]
    for column, url in (("left_image_id", "left_url"), ("right_image_id", "right_url")):
        pair_image, image = store[row[column]], images[_image_of(row[url])]
        torch.testing.assert_close(pair_image["features"], image["features"])
        torch.testing.assert_close(pair_image["boxes"], image["boxes"])

    batch = ImagePairCollator(tokenizer, store)([rows[i] for i in range(4)])
    num_regions = batch["visual_feats"].shape[2]
    assert batch["visual_feats"].shape == (4, 2, num_regions, SMALL.feature_dim)
    assert batch["visual_attention_mask"].shape == (4, 2, num_regions)
    assert batch["labels"].tolist() == rows["label"][:4]
    with pytest.raises(ValueError, match="not in the region-feature store"):  # the image store has no NLVR2 ids
        build_dataset("synthetic_scenes", paths.root.parent, "val", task="nlvr2", config=SMALL, region_features=images)


def test_nlvr2_statement_truth_rules():
    def shape(kind, colour, box):
        return Shape(kind, colour, "small", box, "1")

    circle, square = shape("circle", "red", (10, 10, 20, 20)), shape("square", "blue", (40, 15, 50, 25))
    red_circle, blue_square = _Description("circle", "red", None), _Description("square", None, None)
    # the circle is left of the square (dx = 30) and a little higher (dy = 5)
    assert relation_truth([circle, square], red_circle, "to the left of", blue_square) is True
    assert relation_truth([circle, square], red_circle, "above", blue_square) is None  # leans that way: ambiguous
    assert relation_truth([circle, square], red_circle, "below", blue_square) is False
    assert relation_truth([circle], red_circle, "above", red_circle) is False  # a shape is not related to itself

    # identical pairs: no sentence tells them apart, so one True and one False sentence about pair 0
    sentences = sample_set_sentences([([circle, square], [circle, square])] * 4, np.random.default_rng(0))
    assert [labels for _, labels in sentences] == [{0: True}, {0: False}]


def test_tiny_splits_are_still_balanced_and_readable(tmp_path):
    config = SyntheticSceneConfig(num_train_images=3, num_val_images=1, feature_dim=8, seed=0)
    rows = build_dataset("synthetic_scenes", tmp_path, "val", task="nlvr2", config=config)
    assert sorted(rows["label"]) == [0, 1] and rows["left_url"] == rows["right_url"]
    train = build_dataset("synthetic_scenes", tmp_path, "train", task="nlvr2", config=config)
    assert sum(train["label"]) * 2 == len(train) > 0
    assert len(build_dataset("synthetic_scenes", tmp_path, "val", task="refcoco", config=config)) >= 1


# ----------------------------------------------------------------------------------------------------------------
# RefCOCO+
# ----------------------------------------------------------------------------------------------------------------


def test_refcoco_refs_name_one_shape_each_by_appearance(paths, graphs):
    refs = load_restricted_pickle(paths.refcoco_dir / "refs(unc).p")
    instances = json.loads((paths.refcoco_dir / "instances.json").read_text())
    assert len(refs) == sum(len(graph["objects"]) for graph in graphs.values())  # one ref per shape
    assert {ref["split"] for ref in refs} == {"train", "val"}
    assert [category["name"] for category in instances["categories"]] == list(SHAPE_NAMES)
    assert len(instances["images"]) == len(graphs)
    sent_ids = [sentence["sent_id"] for ref in refs for sentence in ref["sentences"]]
    assert len(set(sent_ids)) == len(sent_ids) and len({ref["ref_id"] for ref in refs}) == len(refs)
    for ref in refs:
        objects = graphs[str(ref["image_id"])]["objects"]
        target = objects[str(ref["ann_id"])]
        assert SHAPE_NAMES[ref["category_id"] - 1] == target["name"]
        texts = [sentence["sent"] for sentence in ref["sentences"]]
        assert 1 <= len(texts) == len(set(texts)) <= 3 and ref["sent_ids"] == [s["sent_id"] for s in ref["sentences"]]
        for sentence in ref["sentences"]:
            assert sentence["tokens"] == sentence["sent"].split() and not LOCATION_WORDS & set(sentence["tokens"])
            matching = [object_id for object_id, obj in objects.items() if _matches(obj, _phrase(sentence["sent"]))]
            assert matching == [str(ref["ann_id"])], (ref["image_id"], sentence["sent"])


def test_refcoco_rows_boxes_and_collator_labels(paths, graphs, tokenizer):
    store = synthetic_region_features(paths.root.parent, SMALL)
    collator = ReferringExpressionCollator(tokenizer, store)
    hits = []
    for split in ("train", "val"):
        rows = build_dataset("synthetic_scenes", paths.root.parent, split, task="refcoco", config=SMALL, region_features=store)
        assert "expression_phrase_regions" in rows.column_names
        for row in rows:
            graph = graphs[row["image_id"]]
            assert row["expression_phrase_boxes"] == [[_xyxy(graph["objects"][str(row["ann_id"])])]]
            assert row["image_size"] == [graph["height"], graph["width"]]
            assert len(row["candidate_boxes"]) == len(graph["objects"])
            assert row["candidate_ann_ids"][row["target_index"]] == row["ann_id"]
        for start in range(0, len(rows), 32):
            examples = [rows[i] for i in range(start, min(start + 32, len(rows)))]
            labels = collator(examples)["labels"]
            for example, label in zip(examples, labels.tolist()):
                chosen = store[example["image_id"]]["boxes"][label]
                gold = torch.tensor(example["expression_phrase_boxes"][0][0])
                hits.append(float(box_iou(chosen[None], gold[None])[0, 0]) >= 0.5)
    assert np.mean(hits) >= 0.95, np.mean(hits)  # every shape has a detected region of IoU >= 0.6


def test_refcoco_split_names_and_bad_input(paths):
    with pytest.raises(ValueError, match="`split` of synthetic_scenes \\(task 'refcoco'\\) must be one of"):
        build_dataset("synthetic_scenes", paths.root.parent, "testA", task="refcoco", config=SMALL)
    with pytest.raises(ValueError, match="`split` of synthetic_scenes \\(task 'nlvr2'\\) must be one of"):
        build_dataset("synthetic_scenes", paths.root.parent, "test1", task="nlvr2", config=SMALL)
    with pytest.raises(ValueError, match="`split` of synthetic_scenes \\(task 'vgp'\\) must be one of"):
        build_dataset("synthetic_scenes", paths.root.parent, "dev", task="vgp", config=SMALL)
    with pytest.raises(ValueError, match="`task` of synthetic_scenes must be one of"):
        synthetic_region_features(paths.root.parent, SMALL, task="pairs")


# ----------------------------------------------------------------------------------------------------------------
# Determinism
# ----------------------------------------------------------------------------------------------------------------


def _task_files(root: Path) -> dict[str, bytes]:
    files = [*sorted((root / "nlvr2").iterdir()), *sorted((root / "refcoco+").iterdir())]
    return {str(p.relative_to(root)): p.read_bytes() for p in [*files, root / "features" / "nlvr2_features.tsv"]}


def test_generation_is_deterministic_and_seeded(tmp_path):
    config = SyntheticSceneConfig(num_train_images=10, num_val_images=4, feature_dim=8, seed=2)
    first = _task_files(generate_synthetic_scenes(tmp_path / "a", config).root)
    assert set(first) == {
        "nlvr2/train.json", "nlvr2/dev.json", "refcoco+/refs(unc).p", "refcoco+/instances.json",
        "features/nlvr2_features.tsv",
    }  # fmt: skip
    assert _task_files(generate_synthetic_scenes(tmp_path / "b", config).root) == first
    other = _task_files(generate_synthetic_scenes(tmp_path / "c", SyntheticSceneConfig(**{**vars(config), "seed": 3})).root)
    assert all(other[name] != first[name] for name in first)
