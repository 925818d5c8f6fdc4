"""Synthetic world v2 (docs/synthetic_world.md): each property measured on generated files, read back with the
library's readers; world v1 stays byte-identical."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw
from test_distractors import _files_hash

from hf_vlalign.analysis.syntactic_grounding import dependency_pairs, parse_with_spacy
from hf_vlalign.cli import build_parser, synthetic_config
from hf_vlalign.cli.common import SYNTHETIC_WORLDS
from hf_vlalign.data.formats import iter_lxmert_tsv_records
from hf_vlalign.data.formats.flickr30k_entities import read_annotation, read_sentences
from hf_vlalign.data.region_extraction import CropEncoder
from hf_vlalign.synthetic import SHAPE_NAMES, SyntheticSceneConfig, SyntheticVGPPaths, generate_synthetic_scenes, world_statistics
from hf_vlalign.synthetic.scenes import V2_MAX_REGION_IOU, WORLDS
from hf_vlalign.synthetic.shapes import THEME_OF_KIND, THEMATIC_GROUPS

# `_files_hash` of world v1 (12 train and 4 val images), computed on the code before world v2 existed (c5e00a4)
V1_FILES_HASHES = {"default": "ac4e9f94a462be9b", "distractors": "bebd826f8f24d15c", "seed 5, 7 shapes": "4b0164a42042ed68"}
V1_HASHED_CONFIGS = {"default": {}, "distractors": {"distractors": True}, "seed 5, 7 shapes": {"seed": 5, "max_shapes": 7, "num_regions": 14}}
NUM_TRAIN, NUM_VAL = 40, 12
RELATION_MARGIN = 0.05  # of the canvas, the margin the docs state
WORDS_OF_KINDS = {"circle": "circle", "disc": "circle", "square": "square", "box": "square"}
WORDS_OF_KINDS.update({kind: kind for kind in SHAPE_NAMES})
LINKING_RELATIONS = ("nsubj", "dobj", "pobj")  # Li et al. Table 2 relations that reach beyond the phrase


def _generate(root: Path, **options) -> Path:
    generate_synthetic_scenes(root, SyntheticSceneConfig(num_train_images=NUM_TRAIN, num_val_images=NUM_VAL, **options))
    return root


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[str, Path]:
    return {world: _generate(tmp_path_factory.mktemp(world), world=world) for world in WORLDS}


def _image_ids(root: Path) -> list[str]:
    return [path.stem for path in sorted((root / "images").glob("*.png"))]


def _gold_boxes(root: Path, image_id: str) -> dict[str, np.ndarray]:
    """Phrase id -> 0-based pixel box (x2, y2 exclusive) of the Flickr30k Entities annotation."""
    annotation = read_annotation(root / "flickr30k_entities" / "Annotations" / f"{image_id}.xml")
    return {phrase_id: np.array(boxes[0]) - np.array([1, 1, 0, 0]) for phrase_id, boxes in annotation.boxes.items()}


def _captions(root: Path, image_id: str):
    return read_sentences(root / "flickr30k_entities" / "Sentences" / f"{image_id}.txt")


def _kind_of(phrase_text: str) -> str:
    return WORDS_OF_KINDS[phrase_text.split()[-1].lower()]


def _pairwise_iou(boxes: np.ndarray) -> np.ndarray:
    low, high = np.maximum(boxes[:, None, :2], boxes[None, :, :2]), np.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=-1)
    area = np.prod(boxes[:, 2:] - boxes[:, :2], axis=-1)
    return inter / (area[:, None] + area[None, :] - inter)


@pytest.mark.parametrize("name", list(V1_HASHED_CONFIGS))
def test_world_v1_files_are_byte_identical(tmp_path, name):
    config = SyntheticSceneConfig(num_train_images=12, num_val_images=4, **V1_HASHED_CONFIGS[name])
    assert _files_hash(generate_synthetic_scenes(tmp_path, config).root) == V1_FILES_HASHES[name]


def _canvas(box: tuple[int, int, int, int]) -> Image.Image:
    image = Image.new("RGB", (128, 128), (220, 220, 220))
    ImageDraw.Draw(image).ellipse((box[0] + 2, box[1] + 2, box[2] - 3, box[3] - 3), fill=(220, 40, 40))
    return image


def test_v2_region_features_do_not_change_with_the_box_position():
    here, there = (10, 12, 40, 42), (80, 70, 110, 100)  # the same pixels at two positions
    appearance, full = CropEncoder(64, seed=0, geometry=False), CropEncoder(64, seed=0)
    encode = lambda encoder, box: encoder.encode(_canvas(box), np.array([box], dtype=np.float32))  # noqa: E731
    np.testing.assert_array_equal(encode(appearance, here), encode(appearance, there))
    assert not np.allclose(encode(full, here), encode(full, there))  # v1 writes the box into the features


def test_v2_region_features_are_appearance_only(worlds):
    root = worlds["v2"]
    encoder = CropEncoder(256, seed=0, geometry=False)
    for record in list(iter_lxmert_tsv_records(root / "features" / "features.tsv"))[:5]:
        image = Image.open(root / "images" / f"{record['image_id']}.png").convert("RGB")
        np.testing.assert_allclose(record["features"], encoder.encode(image, record["boxes"]), rtol=1e-5, atol=1e-6)
    assert world_statistics(SyntheticVGPPaths.from_root(worlds["v1"]))["centre_probe_r2"] > 0.9  # v1's hold the box
    # v2: the centre is not in the features, the probe predicts it no better than the mean
    assert world_statistics(SyntheticVGPPaths.from_root(root))["centre_probe_r2"] < 0.05


def test_v2_regions_have_no_near_duplicates(worlds, tmp_path):
    v1 = world_statistics(SyntheticVGPPaths.from_root(worlds["v1"]))
    assert v1["max_region_iou"] > 0.5 and v1["close_duplicate_share"] > 0.3
    for root in (worlds["v2"], _generate(tmp_path, world="v2", distractors=True, seed=1)):
        v2 = world_statistics(SyntheticVGPPaths.from_root(root))
        assert v2["max_region_iou"] <= V2_MAX_REGION_IOU and v2["close_duplicate_share"] == 0.0
        for image_id in _image_ids(root):  # the objects themselves never overlap, distractor shapes included
            gold = np.stack(list(_gold_boxes(root, image_id).values())).astype(np.float64)
            assert (_pairwise_iou(gold)[np.triu_indices(len(gold), k=1)] == 0).all()


# world v2's relation clauses, read with the phrases as {i} slots: (subject slot, relation, object slot)
RELATION = r"(to the left of|to the right of|above|below)"
PRONOUNS = {"to its left": "to the left of", "to its right": "to the right of", "above it": "above", "below it": "below"}


def _relations(template: str) -> list[tuple[int, str, int]]:
    """(a, relation, b): slot a is `relation` slot b, as a v2 caption template states it."""
    if match := re.fullmatch(r"\{0\} (?:is|sits|lies) " + RELATION + r" \{1\} and " + RELATION + r" \{2\} \.", template):
        return [(0, match[1], 1), (0, match[2], 2)]
    if match := re.fullmatch(r"\{0\} (?:is|sits) " + RELATION + r" \{1\} \.", template):
        return [(0, match[1], 1)]
    if match := re.fullmatch(r"\{0\} has \{1\} (to its left|to its right|above it|below it) \.", template):
        return [(1, PRONOUNS[match[1]], 0)]
    raise AssertionError(f"not a v2 relation caption: {template!r}")


def _template(sentence) -> str:
    words = sentence.text.split()
    for slot, phrase in reversed(list(enumerate(sentence.phrases))):
        start = phrase.first_word_index
        words[start : start + len(phrase.text.split())] = [f"{{{slot}}}"]
    return " ".join(words)


def _holds(relation: str, a: np.ndarray, b: np.ndarray, margin: float) -> bool:
    return {
        "to the left of": a[2] + margin <= b[0],
        "to the right of": b[2] + margin <= a[0],
        "above": a[3] + margin <= b[1],
        "below": b[3] + margin <= a[1],
    }[relation]


def test_v2_captions_state_spatial_relations_that_need_the_boxes(worlds):
    relations_of_kinds: dict[tuple[str, str], Counter] = {}
    num_relations = 0
    for image_id in _image_ids(worlds["v2"]):
        gold = _gold_boxes(worlds["v2"], image_id)
        for sentence in _captions(worlds["v2"], image_id):
            for a, relation, b in _relations(_template(sentence)):
                first, second = sentence.phrases[a], sentence.phrases[b]
                assert _holds(relation, gold[first.phrase_id], gold[second.phrase_id], RELATION_MARGIN * 128)
                kinds = (_kind_of(first.text), _kind_of(second.text))
                relations_of_kinds.setdefault(kinds, Counter())[relation] += 1
                num_relations += 1
    assert num_relations >= 5 * (NUM_TRAIN + NUM_VAL)  # every caption relates shapes
    # the words do not give the relation away: for a pair of kinds, the most frequent relation is a minority
    frequent = {kinds: counts for kinds, counts in relations_of_kinds.items() if sum(counts.values()) >= 20}
    assert len(frequent) >= 6
    majority = sum(max(counts.values()) for counts in frequent.values()) / sum(sum(c.values()) for c in frequent.values())
    assert majority < 0.45
    assert all({"to the left of", "to the right of"} <= set(counts) for counts in frequent.values())


def test_v2_kinds_cooccur_in_themes_that_are_not_spatial_clusters(worlds):
    v1, v2 = (world_statistics(SyntheticVGPPaths.from_root(worlds[world])) for world in WORLDS)
    assert v1["theme_lift_within"] < 1.5 * v1["theme_lift_between"]  # v1: kinds drawn independently
    assert v2["theme_lift_within"] > 2 * v2["theme_lift_between"] and v2["theme_lift_within"] > 1.5
    assert 0.85 < v2["theme_distance_ratio"] < 1.15  # a theme's objects are spread over the image like any others


def _phrase_of_words(sentence) -> list[int | None]:
    """The grounded phrase (index) of each word of the caption, None outside every phrase."""
    owner: list[int | None] = [None] * len(sentence.text.split())
    for index, phrase in enumerate(sentence.phrases):
        for position in range(phrase.first_word_index, phrase.first_word_index + len(phrase.text.split())):
            owner[position] = index
    return owner


def _links_two_phrases(parse: list[dict], owner: list[int | None]) -> bool:
    """Whether a word outside every grounded phrase heads, through LINKING_RELATIONS arcs from entity words
    (`dependency_pairs`), words of two different grounded phrases, directly or through prepositions and conjuncts
    that are outside every phrase too."""
    heads = {word["id"] - 1: word["head"] - 1 for word in parse}
    pairs = dependency_pairs(parse, [phrase is not None for phrase in owner])
    linked: dict[int, set[int]] = {}
    for w1, w2, relation in pairs:
        if relation in LINKING_RELATIONS and owner[w2] is None and heads[w1] == w2:
            top = w2  # climb out of prepositions / conjuncts to the clause's verb, all outside the phrases
            while heads[top] >= 0 and owner[heads[top]] is None:
                top = heads[top]
            linked.setdefault(top, set()).add(owner[w1])
    return any(len(phrases) >= 2 for phrases in linked.values())


def _linking_statistics(root: Path) -> dict[str, float]:
    """The share of captions in which two grounded phrases are linked (`_links_two_phrases`), and the share with a
    dobj arc from a grounded word to a verb outside its phrase."""
    sentences = [sentence for image_id in _image_ids(root)[:30] for sentence in _captions(root, image_id)]
    parses = parse_with_spacy([sentence.text for sentence in sentences])
    linking, dobj = [], []
    for sentence, parse in zip(sentences, parses, strict=True):
        assert [word["form"] for word in parse] == sentence.text.split()
        owner = _phrase_of_words(sentence)
        linking.append(_links_two_phrases(parse, owner))
        pairs = dependency_pairs(parse, [phrase is not None for phrase in owner])
        dobj.append(any(relation == "dobj" and owner[w2] is None for _, w2, relation in pairs))
    return {"linking": float(np.mean(linking)), "dobj": float(np.mean(dobj))}


def test_v2_syntactic_relations_link_grounded_phrases(worlds):
    v1, v2 = _linking_statistics(worlds["v1"]), _linking_statistics(worlds["v2"])
    assert v1["linking"] < 0.7 and v1["dobj"] == 0.0  # v1: locations and lists of shapes, no transitive verb
    assert v2["linking"] >= 0.9 and v2["dobj"] >= 0.15


def test_v2_annotations_record_each_objects_kind_and_theme(worlds):
    root, agree, true_regions = worlds["v2"], 0, 0
    records = {record["image_id"]: record for record in iter_lxmert_tsv_records(root / "features" / "features.tsv")}
    for image_id in _image_ids(root):
        gold = _gold_boxes(root, image_id)
        kinds = {}
        for sentence in _captions(root, image_id):
            for phrase in sentence.phrases:  # a phrase's Flickr30k Entities type is its object's theme
                assert phrase.phrase_types == [THEME_OF_KIND[_kind_of(phrase.text)]]
                kinds[phrase.phrase_id] = _kind_of(phrase.text)
        record = records[image_id]
        for phrase_id, box in gold.items():  # the region on an object: its class id names the object's kind
            iou = _pairwise_iou(np.concatenate([box[None], record["boxes"]]).astype(np.float64))[0, 1:]
            true_regions += 1
            agree += SHAPE_NAMES[int(record["object_ids"][iou.argmax()])] == kinds[phrase_id]
    assert set(THEME_OF_KIND.values()) == set(THEMATIC_GROUPS)
    assert agree / true_regions > 0.8  # the detector's class noise (CLASS_NOISE) aside


def test_v2_generation_costs_at_most_twice_v1(tmp_path):
    seconds = {}
    for world in WORLDS:
        start = time.process_time()
        generate_synthetic_scenes(tmp_path / world, SyntheticSceneConfig(num_train_images=12, num_val_images=4, world=world))
        seconds[world] = time.process_time() - start
    assert seconds["v2"] < 2 * seconds["v1"], seconds


def test_the_cli_offers_every_world(tmp_path):
    assert SYNTHETIC_WORLDS == WORLDS
    args = build_parser().parse_args(["synthesize", "--out", str(tmp_path / "scenes"), "--world", "v2"])
    assert args.world == "v2"
    args = build_parser().parse_args(["probe", "--synthetic_world", "v2", str(tmp_path / "model")])
    assert synthetic_config(args).world == "v2"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["synthesize", "--out", str(tmp_path / "scenes"), "--world", "v3"])


def test_v2_reads_back_through_the_real_builders_of_every_task(tmp_path):
    from hf_vlalign.data import build_dataset
    from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features

    config = SyntheticSceneConfig(num_train_images=6, num_val_images=3, feature_dim=32, world="v2")
    store = synthetic_region_features(tmp_path, config)
    for task in ("vgp", "captions", "questions", "nlvr2", "refcoco"):
        assert len(build_dataset("synthetic_scenes", tmp_path, "train", task=task, config=config)) > 0, task
    joined = build_dataset("synthetic_scenes", tmp_path, "train", store, task="captions", config=config)
    assert len(joined) == 5 * config.num_train_images
    assert all(sum(target) == pytest.approx(1.0) for row in joined for target in row["sentence_phrase_regions"])
