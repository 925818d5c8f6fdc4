"""Builders of the text-side datasets: Flickr30k Entities, NLVR2, RefCOCO+ and COCO Karpathy captions.

Flickr30k Entities and NLVR2 run on the real published samples in ../shared/data, their counts checked against counts
taken here straight from the raw files (regexes, xml.etree, json). RefCOCO+ and dataset_coco.json have no real sample,
so their fixtures are written here in the published layouts; the COCO fixture's val / test images are real Karpathy
val / test ids, and the builder's split membership is checked against the real Karpathy image lists.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import shutil
import struct
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from shared_samples import DATA
from shared_samples import real_sample as _real

from hf_vlalign.data.builders import build_dataset, coco_captions, flickr30k_entities, nlvr2, refcoco
from hf_vlalign.data.feature_store import RegionFeatureStore


def _store(tmp_path: Path, images: dict[str, list[list[float]]]) -> RegionFeatureStore:
    records = [
        {"image_id": image_id, "image_size": None, "boxes": np.asarray(boxes, dtype=np.float32), "features": np.ones((len(boxes), 3), np.float32)}
        for image_id, boxes in images.items()
    ]
    return RegionFeatureStore.write(records, tmp_path / "store")


# ----------------------------------------------------------------------------------------------------------------
# Flickr30k Entities (real sample)
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flickr_root() -> Path:
    return _real("flickr30k_entities")


@pytest.fixture(scope="module")
def flickr_val(flickr_root):
    return flickr30k_entities.build(flickr_root, "val", on_missing_image="skip")  # the sample has 150 of 1000 images


def _raw_flickr_counts(root: Path, split: str) -> dict:
    """Counts straight from the raw files: captions, '[/EN#' phrases, boxes and no-box flags of those phrases."""
    listed = (root / f"{split}.txt").read_text().split()
    present = [i for i in listed if (root / "Sentences" / f"{i}.txt").is_file() and (root / "Annotations" / f"{i}.xml").is_file()]
    counts = Counter(listed=len(listed), present=len(present))
    for image_id in present:
        boxes, no_box = Counter(), set()
        for element in ET.parse(root / "Annotations" / f"{image_id}.xml").getroot().iter("object"):
            names = [name.text for name in element.findall("name")]
            if element.find("bndbox") is not None:
                boxes.update(names)
            elif element.findtext("nobndbox", "0").strip() == "1":
                no_box.update(names)
        for line in (root / "Sentences" / f"{image_id}.txt").read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            ids = re.findall(r"\[/EN#(\d+)/", line)
            assert len(ids) == line.count("[/EN#")
            counts["captions"] += 1
            counts["phrases"] += len(ids)
            counts["boxes"] += sum(boxes[i] for i in ids)
            counts["no_box"] += sum(i in no_box for i in ids)
    return counts


def test_flickr_counts_match_raw_files(flickr_root, caplog):
    raw = _raw_flickr_counts(flickr_root, "val")
    with caplog.at_level(logging.WARNING):
        dataset = flickr30k_entities.build(flickr_root, "val", on_missing_image="skip")

    assert raw["present"] == 150 and raw["listed"] == 1000  # the sample holds the first 150 ids of val.txt
    assert len(dataset) == raw["captions"]
    assert len(set(dataset["image_id"])) == raw["present"]
    assert sum(map(len, dataset["sentence_phrase_spans"])) == raw["phrases"]
    assert sum(len(boxes) for row in dataset["sentence_phrase_boxes"] for boxes in row) == raw["boxes"]
    assert sum(map(sum, dataset["phrase_nobndbox"])) == raw["no_box"]
    # the images without files are reported, with their count, never skipped silently
    assert (
        f"Flickr30k Entities val: {raw['listed'] - raw['present']} of {raw['listed']} images listed in val.txt skipped "
        f"(on_missing_image='skip'): image not in Sentences/ and Annotations/ of {flickr_root}." in caplog.text
    )
    # by default (the same in every builder) the first listed image without its files stops the build
    first_missing = next(i for i in (flickr_root / "val.txt").read_text().split() if not (flickr_root / "Sentences" / f"{i}.txt").is_file())
    line = (flickr_root / "val.txt").read_text().split().index(first_missing) + 1
    with pytest.raises(ValueError, match=re.escape(f"val.txt, line {line}: image '{first_missing}' is not in Sentences/ and Annotations/")):
        flickr30k_entities.build(flickr_root, "val")


def test_flickr_columns_are_parallel_and_consistent(flickr_val):
    for row in flickr_val:
        words = row["sentence"].split(" ")
        lists = ("sentence_phrase_boxes", "sentence_phrase_token_spans", "phrase_ids", "phrase_types", "phrase_nobndbox", "phrase_scene")
        assert all(len(row[name]) == len(row["sentence_phrase_spans"]) for name in lists)
        for (start, end), (first, last) in zip(row["sentence_phrase_spans"], row["sentence_phrase_token_spans"]):
            assert row["sentence"][start:end] == " ".join(words[first:last])
        height, width = row["image_size"]
        for boxes in row["sentence_phrase_boxes"]:
            for x1, y1, x2, y2 in boxes:  # published 1-based pixels: inside [1, width] x [1, height]
                assert 1 <= x1 <= x2 <= width and 1 <= y1 <= y2 <= height


def test_flickr_spot_values(flickr_root):
    dataset = flickr30k_entities.build(flickr_root, "train", on_missing_image="skip")  # a sample of train.txt
    rows = dataset.filter(lambda image_id: image_id == "1000092795", input_columns="image_id")

    assert len(rows) == 5 and rows["sentence_index"] == [0, 1, 2, 3, 4]
    first = rows[0]
    assert first["sentence"] == "Two young guys with shaggy hair look at their hands while hanging out in the yard ."
    assert first["image_size"] == [500, 333]  # <height>500</height>, <width>333</width>
    assert first["phrase_ids"] == ["1", "2", "3", "8"]
    assert first["phrase_types"] == [["people"], ["bodyparts"], ["bodyparts"], ["scene"]]
    start, end = first["sentence_phrase_spans"][3]
    assert first["sentence"][start:end] == "the yard" and first["sentence_phrase_token_spans"][3] == [14, 16]
    # entity 1 has its own box and shares one with entity 6; boxes stay 1-based as in the XML
    assert first["sentence_phrase_boxes"][0] == [[159.0, 125.0, 219.0, 335.0], [197.0, 110.0, 261.0, 373.0]]
    assert first["sentence_phrase_boxes"][3] == [] and first["phrase_scene"] == [False, False, False, True]
    last = rows[4]  # "[/EN#10/other time]": <nobndbox>1</nobndbox>
    assert last["phrase_ids"] == ["1", "10"] and last["phrase_nobndbox"] == [False, True]
    assert last["sentence_phrase_boxes"][1] == []


def test_flickr_max_images_and_build_dataset(flickr_root):
    dataset = build_dataset("flickr30k_entities", flickr_root, "val", max_images=3)

    first_ids = (flickr_root / "val.txt").read_text().split()[:3]
    assert list(dict.fromkeys(dataset["image_id"])) == first_ids
    assert build_dataset("flickr30k_entities", flickr_root, "validation", max_images=3)["sentence"] == dataset["sentence"]
    with pytest.raises(ValueError, match="max_images"):
        flickr30k_entities.build(flickr_root, "val", max_images=0)


def test_flickr_bad_input(flickr_root, tmp_path):
    with pytest.raises(ValueError, match="`split` of Flickr30k Entities must be one of"):
        flickr30k_entities.build(flickr_root, "dev")
    with pytest.raises(ValueError, match="Sentences/ and Annotations/"):
        flickr30k_entities.build(tmp_path, "val")
    image_id = "1000092795"
    for folder in ("Sentences", "Annotations"):
        (tmp_path / folder).mkdir()
    shutil.copy(flickr_root / "Annotations" / f"{image_id}.xml", tmp_path / "Annotations")
    lines = (flickr_root / "Sentences" / f"{image_id}.txt").read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2].replace("]", "", 1)  # first phrase of the third caption never closed
    (tmp_path / "Sentences" / f"{image_id}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "val.txt").write_text(f"{image_id}\n")
    with pytest.raises(ValueError, match=re.escape(f"{image_id}.txt, line 3: malformed markup")):
        flickr30k_entities.build(tmp_path, "val")
    (tmp_path / "val.txt").write_text("12345\n")
    with pytest.raises(ValueError, match=r"val\.txt, line 1: image '12345' is not in Sentences/ and Annotations/"):
        flickr30k_entities.build(tmp_path, "val")
    with pytest.raises(ValueError, match="none of the 1 images of val.txt"):
        flickr30k_entities.build(tmp_path, "val", on_missing_image="skip")


# ----------------------------------------------------------------------------------------------------------------
# NLVR2 (real sample)
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nlvr2_dir() -> Path:
    _real("nlvr2", "dev.json")
    return DATA / "nlvr2"


def test_nlvr2_counts_and_labels_match_raw_file(nlvr2_dir):
    text = (nlvr2_dir / "dev.json").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    dataset = build_dataset("nlvr2", nlvr2_dir, "dev")

    assert len(dataset) == len(lines) == 500
    assert build_dataset("nlvr2", nlvr2_dir, "validation")["identifier"] == dataset["identifier"]  # NLVR2's "dev"
    assert sum(dataset["label"]) == text.count('"label": "True"') == 260
    assert len(dataset) - sum(dataset["label"]) == text.count('"label": "False"')
    assert dataset["identifier"] == [json.loads(line)["identifier"] for line in lines]
    assert dataset["image_id"] == dataset["left_image_id"]
    assert all(size is None for size in dataset["image_size"])


def test_nlvr2_spot_values(nlvr2_dir):
    first = nlvr2.build(nlvr2_dir, "dev")[0]

    assert first["identifier"] == "dev-850-0-0"
    assert first["sentence"] == "The right image shows a curving walkway of dark glass circles embedded in dirt and flanked by foliage."
    assert first["label"] == 0  # "False"
    assert (first["left_image_id"], first["right_image_id"]) == ("dev-850-0-img0", "dev-850-0-img1")
    assert first["synset"] == "beer bottle" and first["right_url"].endswith("beer-bottles-949793_960_720.jpg")


def _subset_layout(root: Path, lines: list[str], files: dict[str, slice]) -> Path:
    """lil-lab/nlvr's nlvr2/data layout in `root`, each subset file ("balanced/balanced_dev.json", ...) holding real
    dev.json lines."""
    for name, rows in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(lines[rows]), encoding="utf-8")
    return root


def test_nlvr2_subsets_read_the_published_layout(nlvr2_dir, tmp_path):
    lines = (nlvr2_dir / "dev.json").read_text(encoding="utf-8").splitlines(keepends=True)
    # the sample holds dev lines only: they stand in for test1's (the builder reads lines, whatever their split)
    data_dir = _subset_layout(
        tmp_path / "nlvr2" / "data", lines,
        {"dev.json": slice(0, 20), "balanced/balanced_dev.json": slice(0, 7), "unbalanced/unbalanced_dev.json": slice(7, 12),
         "balanced/balanced_test1.json": slice(12, 14), "unbalanced/unbalanced_test1.json": slice(14, 17)},
    )  # fmt: skip
    identifiers = [json.loads(line)["identifier"] for line in lines]
    expected = {("balanced", "dev"): (0, 7), ("unbalanced", "dev"): (7, 12), ("balanced", "test1"): (12, 14),
                ("unbalanced", "test1"): (14, 17)}  # fmt: skip
    for (subset, split), (start, end) in expected.items():
        assert nlvr2.split_file(data_dir, split, subset) == data_dir / subset / f"{subset}_{split}.json"
        assert build_dataset("nlvr2", data_dir, split, subset=subset)["identifier"] == identifiers[start:end]
    assert len(nlvr2.build(data_dir, "dev")) == 20  # the full split beside them


def test_nlvr2_subset_errors_name_the_expected_file(nlvr2_dir, tmp_path):
    lines = (nlvr2_dir / "dev.json").read_text(encoding="utf-8").splitlines(keepends=True)
    # both subsets under balanced/ is not the published layout
    data_dir = _subset_layout(tmp_path, lines, {"balanced/balanced_dev.json": slice(0, 3), "balanced/unbalanced_dev.json": slice(3, 6)})
    with pytest.raises(ValueError, match=re.escape(f"NLVR2 subset file unbalanced/unbalanced_dev.json, but '{data_dir / 'unbalanced' / 'unbalanced_dev.json'}' is not a file")):
        nlvr2.build(data_dir, "dev", subset="unbalanced")
    with pytest.raises(ValueError, match=re.escape("balanced/balanced_test1.json")):
        nlvr2.build(data_dir, "test1", subset="balanced")  # a split with subsets, whose file is absent
    for split in ("train", "test2"):
        with pytest.raises(ValueError, match=re.escape("exists only for the splits ['dev', 'test1'] (unbalanced/unbalanced_dev.json, unbalanced/unbalanced_test1.json)")):
            nlvr2.build(data_dir, split, subset="unbalanced")
    with pytest.raises(ValueError, match="`subset` must be None or one of"):
        nlvr2.build(data_dir, "dev", subset="hard")


def test_nlvr2_bad_input(nlvr2_dir, tmp_path):
    lines = (nlvr2_dir / "dev.json").read_text(encoding="utf-8").splitlines(keepends=True)
    with pytest.raises(ValueError, match="`split` of NLVR2 must be one of"):
        nlvr2.build(nlvr2_dir, "val")
    with pytest.raises(ValueError, match="train.json"):
        nlvr2.build(nlvr2_dir, "train")  # not in the sample
    (tmp_path / "dev.json").write_text(lines[0] + lines[1] + lines[2][:40] + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("dev.json, line 3: not valid JSON")):
        nlvr2.build(tmp_path, "dev")
    (tmp_path / "dev.json").write_text(lines[0] + lines[1].replace('"label": "True"', '"label": "maybe"'), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("dev.json, line 2: `label` must be one of ['False', 'True']")):
        nlvr2.build(tmp_path, "dev")
    (tmp_path / "dev.json").write_text(lines[0].replace("dev-850-0-0", "dev-850"), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("line 1: `identifier` must look like")):
        nlvr2.build(tmp_path, "dev")


def test_nlvr2_attach_pair_features(nlvr2_dir, tmp_path, caplog):
    dataset = nlvr2.build(nlvr2_dir, "dev").select(range(4))
    images = sorted(set(dataset["left_image_id"]) | set(dataset["right_image_id"]))
    missing = dataset[1]["right_image_id"]
    store = _store(tmp_path, {image_id: [[0, 0, 10, 10]] for image_id in images if image_id != missing})
    expected_dropped = sum(missing in (left, right) for left, right in zip(dataset["left_image_id"], dataset["right_image_id"]))

    with pytest.raises(ValueError, match=re.escape(f"NLVR2: row 1: image '{missing}' is not in the region-feature store")):
        nlvr2.attach_pair_features(dataset, store)
    with caplog.at_level(logging.WARNING):
        joined = nlvr2.attach_pair_features(dataset, store, on_missing_image="skip")
    assert len(joined) == len(dataset) - expected_dropped
    assert f"NLVR2: {expected_dropped} of 4 examples skipped (on_missing_image='skip'): image not in" in caplog.text
    for row in joined:
        assert store.dataset[row["left_feature_row"]]["image_id"] == row["left_image_id"]
        assert store.dataset[row["right_feature_row"]]["image_id"] == row["right_image_id"]
    with pytest.raises(ValueError, match="on_missing_image"):
        nlvr2.attach_pair_features(dataset, store, on_missing_image="drop")


# ----------------------------------------------------------------------------------------------------------------
# RefCOCO+ (fixture in the published layout)
# ----------------------------------------------------------------------------------------------------------------


def _ref(ref_id, ann_id, image_id, split, category_id, sentences):
    return {
        "sent_ids": [sent_id for sent_id, _ in sentences],
        "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg",
        "ann_id": ann_id,
        "ref_id": ref_id,
        "image_id": image_id,
        "split": split,
        "sentences": [{"tokens": sent.split(), "raw": sent.upper(), "sent_id": sent_id, "sent": sent} for sent_id, sent in sentences],
        "category_id": category_id,
    }


REFS = [
    _ref(0, 1001, 581857, "train", 1, [(0, "woman in red"), (1, "lady with umbrella")]),
    _ref(1, 1002, 581857, "testA", 1, [(2, "man on left")]),
    _ref(2, 1003, 581857, "testB", 18, [(3, "brown dog"), (4, "dog lying down"), (5, "café dog")]),
    _ref(3, 2001, 9, "val", 18, [(6, "dog")]),
]
INSTANCES = {
    "images": [
        {"id": 581857, "width": 640, "height": 427, "file_name": "COCO_train2014_000000581857.jpg"},
        {"id": 9, "width": 640, "height": 480, "file_name": "COCO_train2014_000000000009.jpg"},
    ],
    "annotations": [
        {"id": 1001, "image_id": 581857, "bbox": [103.93, 299.99, 134.22, 177.37], "category_id": 1, "area": 1.0, "iscrowd": 0},
        {"id": 1002, "image_id": 581857, "bbox": [10.0, 20.0, 30.0, 40.0], "category_id": 1, "area": 1.0, "iscrowd": 0},
        {"id": 1003, "image_id": 581857, "bbox": [300.0, 200.0, 100.0, 50.0], "category_id": 18, "area": 1.0, "iscrowd": 0},
        {"id": 2001, "image_id": 9, "bbox": [0.0, 0.0, 640.0, 480.0], "category_id": 18, "area": 1.0, "iscrowd": 0},
        {"id": 2002, "image_id": 9, "bbox": [5.0, 5.0, 5.0, 5.0], "category_id": 1, "area": 1.0, "iscrowd": 0},
    ],
    "categories": [{"supercategory": "person", "id": 1, "name": "person"}, {"supercategory": "animal", "id": 18, "name": "dog"}],
}


def _python2_pickle(value) -> bytes:
    """What Python 2's cPickle.dump(value, f, 2) writes: `str` as byte strings (SHORT_BINSTRING / BINSTRING)."""

    def body(value) -> bytes:
        if isinstance(value, dict):
            return b"}(" + b"".join(body(k) + body(v) for k, v in value.items()) + b"u"
        if isinstance(value, list):
            return b"](" + b"".join(map(body, value)) + b"e"
        if isinstance(value, int):
            return b"J" + struct.pack("<i", value)
        raw = value.encode("utf-8")
        return (b"U" + bytes([len(raw)]) if len(raw) < 256 else b"T" + struct.pack("<I", len(raw))) + raw

    return b"\x80\x02" + body(value) + b"."


@pytest.fixture
def refcoco_dir(tmp_path) -> Path:
    folder = tmp_path / "refcoco+"
    folder.mkdir()
    (folder / "instances.json").write_text(json.dumps(INSTANCES))
    with open(folder / "refs(unc).p", "wb") as handle:
        pickle.dump(REFS, handle, protocol=2)
    return folder


def test_refcoco_rows(refcoco_dir):
    dataset = refcoco.build(refcoco_dir, "testB")

    assert dataset["sent_id"] == [3, 4, 5]
    row = dataset[2]
    assert (row["ref_id"], row["ann_id"], row["image_id"], row["image_size"]) == (2, 1003, "581857", [427, 640])
    assert row["expression"] == "café dog" and row["tokens"] == ["café", "dog"]
    assert row["expression_phrase_spans"] == [[0, len("café dog")]]
    assert row["expression_phrase_boxes"] == [[[300.0, 200.0, 400.0, 250.0]]]  # [x, y, w, h] -> x1 y1 x2 y2
    assert (row["category_id"], row["category_name"]) == (18, "dog")
    assert row["file_name"] == "COCO_train2014_000000581857.jpg"
    assert row["candidate_ann_ids"] == [1001, 1002, 1003] and row["target_index"] == 2
    assert np.allclose(row["candidate_boxes"][0], [103.93, 299.99, 238.15, 477.36])
    counts = {split: len(refcoco.build(refcoco_dir, split)) for split in refcoco.SPLITS}
    assert counts == {"train": 2, "val": 1, "testA": 1, "testB": 3}  # one row per sentence of the split's refs


def test_refcoco_json_and_python2_pickle_read_alike(refcoco_dir):
    (refcoco_dir / "refs.json").write_text(json.dumps(REFS))
    (refcoco_dir / "refs_py2.p").write_bytes(_python2_pickle(REFS))
    from_pickle = refcoco.build(refcoco_dir, "train")

    assert refcoco.build(refcoco_dir, "train", refs_file="refs.json").to_list() == from_pickle.to_list()
    assert refcoco.build(refcoco_dir, "testB", refs_file=refcoco_dir / "refs_py2.p")[2]["expression"] == "café dog"


def test_refcoco_rejects_unsafe_pickle_and_bad_input(refcoco_dir, tmp_path):
    unsafe = [dict(REFS[0], ann_id=np.array([1001]))]
    with open(refcoco_dir / "unsafe.p", "wb") as handle:
        pickle.dump(unsafe, handle, protocol=2)
    with pytest.raises(ValueError, match="refused to load the global numpy"):
        refcoco.build(refcoco_dir, "train", refs_file="unsafe.p")
    with pytest.raises(ValueError, match="`split` of RefCOCO\\+ must be one of"):
        refcoco.build(refcoco_dir, "test")
    with pytest.raises(ValueError, match=re.escape("`data_dir` must point to")):
        refcoco.build(tmp_path / "nowhere", "train")
    (refcoco_dir / "bad.json").write_text(json.dumps([dict(REFS[0], ann_id=999)]))
    with pytest.raises(ValueError, match="ref #0 \\(ref_id 0\\): its annotation 999 is not in"):
        refcoco.build(refcoco_dir, "train", refs_file="bad.json")
    (refcoco_dir / "bad.json").write_text(json.dumps([{k: v for k, v in REFS[0].items() if k != "split"}]))
    with pytest.raises(ValueError, match="bad.json, ref #0: missing the field 'split'"):
        refcoco.build(refcoco_dir, "train", refs_file="bad.json")


def test_refcoco_store_join_through_build_dataset(refcoco_dir, tmp_path):
    # testA holds ref 1 only: ann 1002, bbox [10, 20, 30, 40] -> [10, 20, 40, 60]
    store = _store(tmp_path, {"COCO_train2014_000000581857": [[200, 200, 300, 300], [10, 20, 40, 60]]})
    dataset = build_dataset("refcoco+", refcoco_dir, "testA", region_features=store)

    assert dataset["feature_row"] == [0]
    assert dataset[0]["expression_phrase_regions"] == [[0.0, 1.0]]
    assert build_dataset("refcoco+", refcoco_dir, "validation")["expression"] == ["dog"]  # ref 3, the "val" one
    candidates, columns = refcoco.store_image_ids(image_id_template="train2014/{image_id}")
    assert candidates({"image_id": "9"}) == ["train2014/9"] and columns == ("image_id",)
    assert refcoco.store_image_ids()[0]({"image_id": "9"}) == ["9", "COCO_train2014_000000000009"]
    with pytest.raises(ValueError, match="image_id_template"):
        refcoco.store_image_ids(image_id_template="{cocoid}")


# ----------------------------------------------------------------------------------------------------------------
# COCO Karpathy captions (fixture in the published layout, split membership checked on the real image lists)
# ----------------------------------------------------------------------------------------------------------------


def _karpathy_list(split: str) -> dict[int, str]:
    """cocoid -> COCO folder, from the real `karpathy_<split>_images.txt` ("val2014/COCO_val2014_....jpg <cocoid>")."""
    lines = _real("coco_karpathy", f"karpathy_{split}_images.txt").read_text().splitlines()
    return {int(cocoid): path.split("/")[0] for path, cocoid in (line.split() for line in lines)}


def _coco_image(cocoid: int, folder: str, split: str, captions: list[str], first_sentid: int) -> dict:
    sentences = [
        {"tokens": re.findall(r"\w+", raw.lower()), "raw": raw, "imgid": 0, "sentid": first_sentid + i} for i, raw in enumerate(captions)
    ]
    return {
        "filepath": folder,
        "sentids": [s["sentid"] for s in sentences],
        "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
        "imgid": 0,
        "split": split,
        "sentences": sentences,
        "cocoid": cocoid,
    }


@pytest.fixture(scope="module")
def coco_dir(tmp_path_factory) -> Path:
    val, test = list(_karpathy_list("val")), list(_karpathy_list("test"))
    restval = 74  # a val2014 id in neither real list
    assert restval not in val and restval not in test
    images = [
        _coco_image(391895, "val2014", "test", ["A man with a red helmet on a small moped on a dirt road. ", "Man riding a motor bike."], 770337),
        *[_coco_image(cocoid, "val2014", "val", [f"val caption {i}", "another one"], 10 * i) for i, cocoid in enumerate(val[:3])],
        *[_coco_image(cocoid, "val2014", "test", [f"test caption {i}"], 100 + i) for i, cocoid in enumerate(test[:2])],
        _coco_image(9, "train2014", "train", ["a train caption", "two", "three"], 200),
        _coco_image(25, "train2014", "train", ["giraffe"], 210),
        _coco_image(restval, "val2014", "restval", ["a restval caption"], 220),
    ]
    folder = tmp_path_factory.mktemp("coco")
    (folder / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    return folder


def test_coco_split_membership_agrees_with_real_karpathy_lists(coco_dir):
    real = {"val": _karpathy_list("val"), "test": _karpathy_list("test")}
    built = {split: coco_captions.build(coco_dir, split, per_image=True) for split in ("train", "val", "test")}

    assert len(real["val"]) == len(real["test"]) == 5000
    for split in ("val", "test"):
        ids = [int(i) for i in built[split]["image_id"]]
        assert ids and set(ids) <= set(real[split])
        assert built[split]["coco_split"] == [real[split][i] for i in ids]  # the real list's folder, val2014
    train_ids = {int(i) for i in built["train"]["image_id"]}
    assert not train_ids & (set(real["val"]) | set(real["test"]))
    assert 391895 in {int(i) for i in built["test"]["image_id"]}


def test_coco_rows_and_options(coco_dir):
    captions = coco_captions.build(coco_dir, "test")
    first = captions[0]
    assert (first["image_id"], first["file_name"], first["coco_split"]) == ("391895", "COCO_val2014_000000391895.jpg", "val2014")
    assert first["caption"] == "A man with a red helmet on a small moped on a dirt road."  # raw, stripped
    assert first["tokens"][:3] == ["a", "man", "with"] and first["sent_id"] == 770337
    assert len(captions) == 2 + 2  # one row per caption

    per_image = coco_captions.build(coco_dir, "val", per_image=True)
    assert len(per_image) == 3 and all(len(c) == 2 for c in per_image["captions"])
    assert per_image[0]["sent_ids"] == [0, 1]

    assert sorted(coco_captions.build(coco_dir, "train")["karpathy_split"]) == ["restval"] + ["train"] * 4
    assert len(coco_captions.build(coco_dir, "train", restval_in_train=False)) == 4
    assert coco_captions.build(coco_dir, "restval")["image_id"] == ["74"]


def test_coco_store_ids_and_build_dataset(coco_dir, tmp_path):
    store = _store(tmp_path, {"COCO_val2014_000000391895": [[0, 0, 5, 5]], "9": [[0, 0, 5, 5]]})
    joined = build_dataset("coco_captions", coco_dir, "test", region_features=store, on_missing_image="skip")
    assert joined["image_id"] == ["391895", "391895"] and joined["feature_row"] == [0, 0]
    assert build_dataset("coco_captions", coco_dir, "validation")["caption"] == coco_captions.build(coco_dir, "val")["caption"]

    candidates, columns = coco_captions.store_image_ids()
    assert columns == ("image_id", "coco_split")
    assert candidates({"image_id": "9", "coco_split": "train2014"}) == ["9", "COCO_train2014_000000000009"]
    candidates, _ = coco_captions.store_image_ids(image_id_template="{coco_split}/{image_id}")
    assert candidates({"image_id": "9", "coco_split": "train2014"}) == ["train2014/9"]


def test_coco_bad_input(coco_dir, tmp_path):
    with pytest.raises(ValueError, match="`split` of COCO Karpathy captions must be one of"):
        coco_captions.build(coco_dir, "validation")
    with pytest.raises(ValueError, match=re.escape("dataset_coco.json' is not a file")):
        coco_captions.build(tmp_path, "val")
    with pytest.raises(ValueError, match="image_id_template"):
        coco_captions.build(coco_dir, "val", image_id_template="{id}")
    data = json.loads((coco_dir / "dataset_coco.json").read_text())
    data["images"][2]["split"] = "dev"
    (tmp_path / "dataset_coco.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape("dataset_coco.json, images[2]: `split` must be one of")):
        coco_captions.build(tmp_path, "val")
    (tmp_path / "dataset_coco.json").write_text('{"images": [')
    with pytest.raises(ValueError, match="not valid JSON"):
        coco_captions.build(tmp_path / "dataset_coco.json", "val")
