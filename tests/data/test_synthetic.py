"""Synthetic grounded scenes: determinism, published formats read back by the real readers, VGP pairs, regions,
region features and the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from hf_vlalign.alignment import box_iou
from hf_vlalign.data.formats.flickr30k_entities import EntitySentence, read_annotation, read_sentences, read_split
from hf_vlalign.data.formats.lxmert_tsv import iter_lxmert_tsv_records
from hf_vlalign.data.formats.vgp import TYPOLOGY_LABELS, read_vgp_csv
from hf_vlalign.data.region_extraction import CropEncoder
from hf_vlalign.synthetic import (
    COLOUR_NAMES,
    COLOUR_WORDS,
    SHAPE_NAMES,
    SHAPE_WORDS,
    SyntheticSceneConfig,
    generate_synthetic_scenes,
    load_or_generate_synthetic_vgp,
)

TINY = SyntheticSceneConfig(num_train_images=6, num_val_images=3, feature_dim=32, seed=0)
RELATIONS = {"to the left of": (0, -1), "to the right of": (0, 1), "above": (1, -1), "below": (1, 1)}


def _files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


class _Dataset:
    """A generated folder read back through the real readers."""

    def __init__(self, root: Path, config: SyntheticSceneConfig, cache_dir: Path) -> None:
        self.paths = generate_synthetic_scenes(root, config)
        entities = self.paths.flickr30k_entities
        self.splits = {split: read_split(entities / f"{split}.txt") for split in ("train", "val")}
        self.image_ids = self.splits["train"] + self.splits["val"]
        self.sentences = {i: read_sentences(entities / "Sentences" / f"{i}.txt") for i in self.image_ids}
        self.annotations = {i: read_annotation(entities / "Annotations" / f"{i}.xml") for i in self.image_ids}
        self.pairs = {split: read_vgp_csv(path) for split, path in self.paths.vgp_csv.items()}
        self.features = {
            row["image_id"]: row for row in iter_lxmert_tsv_records(self.paths.features_tsv)
        }

    def phrases(self):
        """(image_id, phrase, gold boxes (G, 4) as published) for every phrase of every caption."""
        for image_id in self.image_ids:
            boxes = self.annotations[image_id].boxes
            for sentence in self.sentences[image_id]:
                for phrase in sentence.phrases:
                    yield image_id, phrase, torch.tensor(boxes[phrase.phrase_id], dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> _Dataset:
    return _Dataset(tmp_path_factory.mktemp("tiny"), TINY, tmp_path_factory.mktemp("hf_cache"))


@pytest.fixture(scope="module")
def default_sample(tmp_path_factory) -> _Dataset:
    """Default scene settings (canvas, shapes, regions, features), fewer images."""
    config = SyntheticSceneConfig(num_train_images=60, num_val_images=10, seed=3)
    return _Dataset(tmp_path_factory.mktemp("default"), config, tmp_path_factory.mktemp("hf_cache"))


# ----------------------------------------------------------------------------------------------------------------
# Determinism and formats
# ----------------------------------------------------------------------------------------------------------------


def test_same_seed_gives_identical_files_and_another_seed_differs(tiny, tmp_path):
    again = generate_synthetic_scenes(tmp_path / "again", TINY)
    assert _files(again.root) == _files(tiny.paths.root)

    other = generate_synthetic_scenes(tmp_path / "other", SyntheticSceneConfig(**{**vars(TINY), "seed": 1}))
    reference, changed = _files(tiny.paths.root), _files(other.root)
    assert reference.keys() == changed.keys()
    for name in ("features/features.tsv", "vgp/train.csv", "flickr30k_entities/Sentences/100000.txt"):
        assert reference[name] != changed[name], name


def test_layout_and_ids_are_consistent_across_files(tiny):
    assert tiny.paths.vgp_csv == {split: tiny.paths.root / "vgp" / f"{split}.csv" for split in ("train", "val")}
    assert [len(tiny.splits["train"]), len(tiny.splits["val"])] == [TINY.num_train_images, TINY.num_val_images]
    assert all(image_id.isdigit() for image_id in tiny.image_ids) and len(set(tiny.image_ids)) == len(tiny.image_ids)
    assert sorted(tiny.features) == sorted(tiny.image_ids)

    seen_phrase_ids: set[str] = set()
    for image_id in tiny.image_ids:
        annotation = tiny.annotations[image_id]
        size = (annotation.width, annotation.height)
        assert size == (TINY.image_size, TINY.image_size) and annotation.depth == 3
        with Image.open(tiny.paths.images / f"{image_id}.png") as image:
            assert image.size == size
        # one entity per shape: ids unique over the data set, each with one box inside the image
        assert not seen_phrase_ids & annotation.boxes.keys()
        seen_phrase_ids |= annotation.boxes.keys()
        assert TINY.min_shapes <= len(annotation.boxes) <= TINY.max_shapes
        for (box,) in annotation.boxes.values():
            assert 1 <= box[0] < box[2] <= annotation.width and 1 <= box[1] < box[3] <= annotation.height

        sentences = tiny.sentences[image_id]
        assert len(sentences) == 5
        for sentence in sentences:
            assert 1 <= len(sentence.phrases) <= 3 and len(sentence.text.split()) <= 16
            for phrase in sentence.phrases:
                assert phrase.phrase_types == ["other"] and phrase.phrase_id in annotation.boxes

        row = tiny.features[image_id]
        assert row["image_size"] == [TINY.image_size, TINY.image_size]
        assert len(row["boxes"]) == TINY.num_regions
        assert np.asarray(row["features"]).shape == (TINY.num_regions, TINY.feature_dim)
        assert all(0 <= i < len(SHAPE_NAMES) for i in row["object_ids"])
        for confidences in (row["object_conf"], row["attr_conf"]):
            assert all(0.0 < c < 1.0 for c in confidences)
    for split, pairs in tiny.pairs.items():
        assert pairs and {pair.image_id for pair in pairs} <= set(tiny.splits[split])


# ----------------------------------------------------------------------------------------------------------------
# Captions and VGP pairs
# ----------------------------------------------------------------------------------------------------------------


def _centres(annotation) -> dict[str, np.ndarray]:
    return {pid: (np.array(box[:2]) + np.array(box[2:])) / 2 for pid, (box,) in annotation.boxes.items()}


def test_every_shape_is_described_twice_with_different_wordings_and_relations_hold(default_sample):
    for image_id in default_sample.image_ids:
        annotation = default_sample.annotations[image_id]
        texts: dict[str, set[str]] = {pid: set() for pid in annotation.boxes}
        captions: dict[str, set[int]] = {pid: set() for pid in annotation.boxes}
        entity_of_text: dict[str, str] = {}
        for index, sentence in enumerate(default_sample.sentences[image_id]):
            for phrase in sentence.phrases:
                texts[phrase.phrase_id].add(phrase.text.lower())
                captions[phrase.phrase_id].add(index)
                # a phrase text names one shape of the image only
                assert entity_of_text.setdefault(phrase.text.lower(), phrase.phrase_id) == phrase.phrase_id
        assert all(len(captions[pid]) >= 2 and len(texts[pid]) >= 2 for pid in annotation.boxes), image_id

        centres = _centres(annotation)
        for sentence in default_sample.sentences[image_id]:
            if len(sentence.phrases) != 2:
                continue
            first, second = sentence.phrases
            relation = sentence.text[first.char_end : second.char_start].split(maxsplit=1)[1].strip()
            axis, sign = RELATIONS[relation]
            assert sign * (centres[first.phrase_id][axis] - centres[second.phrase_id][axis]) > 0, sentence.text


def _find_caption(sentences: list[EntitySentence], text: str, skip: int | None = None):
    """What a builder does: the first caption (other than `skip`) with a phrase equal to `text`, case-insensitive."""
    for index, sentence in enumerate(sentences):
        for phrase in sentence.phrases:
            if index != skip and phrase.text.lower() == text.lower():
                return index, phrase
    raise AssertionError(f"no caption has the phrase {text!r}")


def test_vgp_phrases_are_locatable_and_labels_match_their_entities(default_sample):
    for split, pairs in default_sample.pairs.items():
        positives = [pair for pair in pairs if pair.is_paraphrase]
        assert 0.4 <= len(positives) / len(pairs) <= 0.6, split
        assert {pair.type_label for pair in positives} <= {1, 2, 3, 4}
        assert len({pair.type_label for pair in positives}) >= 3, "the typology should vary"
        for pair in pairs:
            sentences = default_sample.sentences[pair.image_id]
            caption1, phrase1 = _find_caption(sentences, pair.original_phrase1)
            caption2, phrase2 = _find_caption(sentences, pair.original_phrase2, skip=caption1)
            assert caption1 != caption2
            assert (phrase1.text, phrase2.text) == (pair.original_phrase1, pair.original_phrase2)  # as written
            if pair.is_paraphrase:
                assert phrase1.phrase_id == phrase2.phrase_id, pair
                assert phrase1.text.lower() != phrase2.text.lower()
                assert pair.original_label == TYPOLOGY_LABELS[pair.type_label]
            else:
                assert phrase1.phrase_id != phrase2.phrase_id, pair
                assert (pair.type_label, pair.original_label) == (-1, "")
                # hard negative: the same shape category or the same colour
                colour1, colour2 = _colour_of(phrase1.text), _colour_of(phrase2.text)
                assert _shape_of(phrase1.text) == _shape_of(phrase2.text) or colour1 == colour2 is not None, pair


def _shape_of(text: str) -> str:
    word = text.lower().split()[-1]
    return next((shape for shape, synonyms in SHAPE_WORDS.items() if word in synonyms), word)


def _colour_of(text: str) -> str | None:
    words = text.lower().split()
    return next((name for name in COLOUR_NAMES for word in words if word in COLOUR_WORDS.get(name, (name,))), None)


# ----------------------------------------------------------------------------------------------------------------
# Regions and confidences
# ----------------------------------------------------------------------------------------------------------------


def test_every_shape_has_a_region_of_iou_at_least_half(tiny):
    for image_id in tiny.image_ids:
        regions = torch.tensor(tiny.features[image_id]["boxes"], dtype=torch.float32)
        assert regions.shape == (TINY.num_regions, 4)
        assert bool((regions[:, 2:] > regions[:, :2]).all())
        assert 0 <= float(regions.min()) and float(regions.max()) <= TINY.image_size
        gold = torch.tensor([boxes[0] for boxes in tiny.annotations[image_id].boxes.values()], dtype=torch.float32)
        assert bool((box_iou(gold, regions).amax(dim=1) >= 0.5).all()), image_id


def test_detection_confidence_baseline_is_imperfect(default_sample):
    hits, class_hits, hit_conf, miss_conf = [], [], [], []
    for image_id, phrase, gold in default_sample.phrases():
        row = default_sample.features[image_id]
        regions = torch.tensor(row["boxes"], dtype=torch.float32)
        confidence = torch.tensor(row["object_conf"])
        is_hit = box_iou(gold, regions).amax(dim=0) >= 0.5
        hits.append(bool(is_hit[confidence.argmax()]))
        # a stronger variant: the most confident region among those of the phrase's class
        same_class = torch.tensor(row["object_ids"]) == SHAPE_NAMES.index(_shape_of(phrase.text))
        pick = torch.where(same_class, confidence, torch.full_like(confidence, -1.0)).argmax()
        class_hits.append(bool(is_hit[pick]))
        hit_conf += confidence[is_hit].tolist()
        miss_conf += confidence[~is_hit].tolist()
    assert 0.05 < np.mean(hits) < 0.9
    assert 0.1 < np.mean(class_hits) < 0.9
    assert np.mean(hit_conf) > np.mean(miss_conf)  # true regions mostly more confident, not always
    assert np.mean(np.array(miss_conf)[:, None] > np.array(hit_conf)[None, :]) > 0.1


# ----------------------------------------------------------------------------------------------------------------
# CropEncoder
# ----------------------------------------------------------------------------------------------------------------


def _canvas(shape: str, colour: tuple[int, int, int], box=(20, 20, 52, 52)) -> Image.Image:
    image = Image.new("RGB", (64, 64), (220, 220, 220))
    draw = ImageDraw.Draw(image)
    inclusive = (box[0], box[1], box[2] - 1, box[3] - 1)
    if shape == "circle":
        draw.ellipse(inclusive, fill=colour)
    elif shape == "square":
        draw.rectangle(inclusive, fill=colour)
    else:
        draw.polygon([((box[0] + box[2]) / 2, box[1]), (box[2] - 1, box[3] - 1), (box[0], box[3] - 1)], fill=colour)
    return image


def test_crop_encoder_is_deterministic_and_sees_colour_and_shape():
    box = np.array([[18.0, 18.0, 54.0, 54.0]])
    red_circle = CropEncoder(64, seed=0).encode(_canvas("circle", (220, 40, 40)), box)
    assert red_circle.shape == (1, 64) and red_circle.dtype == np.float32
    np.testing.assert_array_equal(red_circle, CropEncoder(64, seed=0).encode(_canvas("circle", (220, 40, 40)), box))
    assert not np.array_equal(red_circle, CropEncoder(64, seed=1).encode(_canvas("circle", (220, 40, 40)), box))

    encoder = CropEncoder(64, seed=0)
    nearby = encoder.encode(_canvas("circle", (225, 45, 40), box=(21, 20, 53, 52)), box)
    others = [_canvas("circle", (40, 60, 220)), _canvas("square", (220, 40, 40)), _canvas("triangle", (220, 40, 40))]
    for other in others:
        distance = np.linalg.norm(encoder.encode(other, box) - red_circle)
        assert distance > 2 * np.linalg.norm(nearby - red_circle)

    small = CropEncoder(8, seed=0).encode(_canvas("circle", (220, 40, 40)), np.concatenate([box, box + 2]))
    assert small.shape == (2, 8) and np.isfinite(small).all()


def test_crop_encoder_rejects_bad_arguments():
    for kwargs, name in [({"feature_dim": 0}, "feature_dim"), ({"seed": -1}, "seed"), ({"feature_dim": 2.5}, "feature_dim")]:
        with pytest.raises(ValueError, match=name):
            CropEncoder(**kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Cache and configuration
# ----------------------------------------------------------------------------------------------------------------


def test_cache_is_reused_and_regenerated_when_the_config_changes(tmp_path):
    first = load_or_generate_synthetic_vgp(tmp_path, TINY)
    manifest = first.root / "manifest.json"
    assert SyntheticSceneConfig(**json.loads(manifest.read_text())["config"]) == TINY
    stamps = {path: path.stat().st_mtime_ns for path in first.root.rglob("*")}

    second = load_or_generate_synthetic_vgp(tmp_path, TINY)
    assert second == first
    assert {path: path.stat().st_mtime_ns for path in first.root.rglob("*")} == stamps

    changed_config = SyntheticSceneConfig(**{**vars(TINY), "num_val_images": 2})
    changed = load_or_generate_synthetic_vgp(tmp_path, changed_config)
    assert changed.root != first.root
    assert len(read_split(changed.flickr30k_entities / "val.txt")) == 2
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no staging left over

    manifest.write_text("{}")  # a damaged cache is regenerated
    assert load_or_generate_synthetic_vgp(tmp_path, TINY) == first
    assert SyntheticSceneConfig(**json.loads(manifest.read_text())["config"]) == TINY


def test_a_copy_another_process_finished_first_is_kept_for_its_readers(tmp_path, monkeypatch):
    """Two runs generating the same scenes at once: the later one must not delete the copy the first one placed (and
    is reading) when it finishes."""
    from hf_vlalign.synthetic import scenes

    generate = scenes.generate_synthetic_scenes

    def generate_while_another_run_finishes(staging, config):
        monkeypatch.setattr(scenes, "generate_synthetic_scenes", generate)
        first = load_or_generate_synthetic_vgp(tmp_path, config)  # the other run places its copy meanwhile
        (first.root / "being_read").write_text("")
        generate(staging, config)

    monkeypatch.setattr(scenes, "generate_synthetic_scenes", generate_while_another_run_finishes)
    paths = load_or_generate_synthetic_vgp(tmp_path, TINY)
    assert (paths.root / "being_read").exists() and paths.features_tsv.is_file()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no staging left over


def test_cache_dir_defaults_to_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "env_cache"))
    paths = load_or_generate_synthetic_vgp(config=TINY)
    assert paths.root.parent == tmp_path / "env_cache" and paths.features_tsv.is_file()


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"min_shapes": 5, "max_shapes": 3}, "min_shapes"),  # two fields that disagree
        ({"num_train_images": 0}, "num_train_images"),  # a count below its bound
        ({"image_size": 128.0}, "image_size"),  # a wrong type
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        SyntheticSceneConfig(**overrides)


def test_generate_rejects_a_wrong_config_type(tmp_path):
    with pytest.raises(ValueError, match="config"):
        generate_synthetic_scenes(tmp_path, config={"seed": 0})


def test_build_dataset_synthetic_scenes_reads_back_through_the_real_builders(tmp_path):
    from hf_vlalign.data import GroundedCaptionCollator, build_dataset
    from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features

    vgp = build_dataset("synthetic_scenes", tmp_path, "val", config=TINY)
    captions = build_dataset("synthetic_scenes", tmp_path, "train", task="captions", config=TINY)
    store = synthetic_region_features(tmp_path, TINY)
    assert len(store) == TINY.num_train_images + TINY.num_val_images and store.feature_dim == TINY.feature_dim
    assert set(vgp["image_id"]) <= set(store.image_ids) and len(captions) == 5 * TINY.num_train_images
    joined = build_dataset("synthetic_scenes", tmp_path, "train", store, task="captions", config=TINY)
    assert all(sum(target) == pytest.approx(1.0) for row in joined for target in row["sentence_phrase_regions"])
    from transformers import AutoTokenizer

    from hf_vlalign import default_text_model_path

    batch = GroundedCaptionCollator(AutoTokenizer.from_pretrained(default_text_model_path()), store)([joined[0], joined[1]])
    assert batch["visual_feats"].shape == (2, TINY.num_regions, TINY.feature_dim)
    with pytest.raises(ValueError, match=r"`task` of synthetic_scenes must be one of \('vgp', 'captions', 'questions', 'nlvr2', 'refcoco'\)"):
        build_dataset("synthetic_scenes", tmp_path, "train", task="qa", config=TINY)
