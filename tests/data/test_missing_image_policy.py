"""One `on_missing_image` everywhere: same name, same choices ("raise", "skip"), same default ("raise"), same error and
same counted warning, in every builder, `build_dataset`, `attach_region_features` and `load_vgp_data`.

Each builder is run on real published files (../shared/data) from which one image is missing where that builder looks
for it: Flickr30k Entities Sentences/Annotations (a real test-split id listed in val.txt), a VGP csv row on a Flickr30k
test image (the published VGP-Typology train csv has nine), GQA scene graphs, Visual Genome image_data.json, COCO
instances.json of RefCOCO+ (hand-written in the published layouts where the sample has no such file).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from hf_vlalign.data.builders import (
    BUILDERS,
    DEFAULT_ON_MISSING_IMAGE,
    MISSING_IMAGE_CHOICES,
    attach_region_features,
    build_vgp_dataset,
    build_dataset,
    load_vgp_data,
)
from hf_vlalign.data.builders.vgp import rows_with_features
from hf_vlalign.data.feature_store import RegionFeatureStore

from shared_samples import real_sample

WARNING = re.compile(
    r"(?P<source>[^:]+): (?P<skipped>\d+) of (?P<total>\d+) (?P<unit>.+?) skipped \(on_missing_image='skip'\): "
    r"image not in (?P<where>.+)\."
)
ERROR = re.compile(
    r"(?P<source>[^:]+): (?P<item>.+): image '(?P<image>[^']+)'(?: \(tried [^)]*\))? is not in (?P<where>.+); "
    r"pass on_missing_image='skip' to drop such (?P<unit>\w+) \(they are counted in a warning\)\."
)
SPLITS = {"flickr30k_entities": "val", "vgp": "train", "gqa": "val", "visual_genome": "all", "vqa_v2": "val",
          "nlvr2": "dev", "refcoco+": "train", "coco_captions": "test", "synthetic_scenes": "train",
          "lxmert_pretraining": "mscoco_train"}  # fmt: skip


def test_one_name_one_default_one_set_of_choices():
    assert MISSING_IMAGE_CHOICES == ("raise", "skip") and DEFAULT_ON_MISSING_IMAGE == "raise"
    for name, module_name in BUILDERS.items():
        module = importlib.import_module(f"hf_vlalign.data.builders.{module_name}")
        # NLVR2's files name no image that could be missing; its store join takes the option
        function = module.attach_pair_features if name == "nlvr2" else module.build
        assert inspect.signature(function).parameters["on_missing_image"].default == "raise", name
    for function in (build_dataset, attach_region_features, build_vgp_dataset, load_vgp_data, rows_with_features):
        assert inspect.signature(function).parameters["on_missing_image"].default == "raise", function.__name__


def test_an_unknown_choice_is_refused_before_any_file_is_read(tmp_path):
    refused = r"`on_missing_image` must be one of \('raise', 'skip'\), got 'drop'"
    with pytest.raises(ValueError, match=refused):
        build_dataset("gqa", tmp_path / "nowhere", SPLITS["gqa"], on_missing_image="drop")


# ----------------------------------------------------------------------------------------------------------------
# One image missing from the annotation files, builder by builder
# ----------------------------------------------------------------------------------------------------------------

FLICKR = real_sample("flickr30k_entities")
TEST_IMAGE = "1016887272"  # the first id of test.txt: the sample holds no test image's files


def _flickr(tmp_path: Path) -> tuple:
    root = tmp_path / "flickr30k_entities"
    root.mkdir()
    for folder in ("Sentences", "Annotations"):
        (root / folder).symlink_to(FLICKR / folder)
    (root / "val.txt").write_text(f"1000092795\n{TEST_IMAGE}\n10002456\n")
    expected = ("Flickr30k Entities val", "val.txt, line 2", TEST_IMAGE, "images", 1, 3, "images listed in val.txt")
    return root, "val", {}, expected


def _vgp(tmp_path: Path) -> tuple:
    options = {"vgp_csv": real_sample("vgp", "VGP-Typology", "train_data.csv"), "flickr30k_entities_dir": FLICKR}
    expected = ("VGP train_data.csv", "line 303", "777288299", "rows", 9, 323, "rows")
    return None, "train", options, expected


def _gqa(tmp_path: Path) -> tuple:
    graphs = {
        "n578564": {
            "width": 500,
            "height": 375,
            "objects": {
                "0": {"name": "chalkboard", "x": 40, "y": 150, "w": 300, "h": 160, "attributes": [], "relations": []},
                "12": {"name": "picture", "x": 120, "y": 20, "w": 150, "h": 100, "attributes": [], "relations": []},
            },
        }
    }  # fmt: skip  (question 20240871 is on image n166008, which this scene graph file lacks)
    (tmp_path / "val_sceneGraphs.json").write_text(json.dumps(graphs))
    options = {
        "questions_file": real_sample("gqa", "allennlp_fixture", "question_dir"),
        "scene_graphs": tmp_path / "val_sceneGraphs.json",
    }
    expected = ("GQA val", "question '20240871'", "n166008", "questions", 1, 2, "questions")
    return tmp_path, "val", options, expected


def _visual_genome(tmp_path: Path) -> tuple:
    real = real_sample("visual_genome")
    for name in ("region_descriptions.json", "objects.json", "attributes.json"):
        (tmp_path / name).symlink_to(real / name)
    images = [image for image in json.loads((real / "image_data.json").read_text()) if image["image_id"] != 3]
    (tmp_path / "image_data.json").write_text(json.dumps(images))
    expected = (
        "Visual Genome all",
        "region_descriptions.json, entry 2",
        "3",
        "images",
        1,
        5,
        "images of region_descriptions.json",
    )
    return tmp_path, "all", {}, expected


def _refcoco(tmp_path: Path) -> tuple:
    def ref(ref_id, ann_id, image_id, sentence):
        return {"ref_id": ref_id, "ann_id": ann_id, "image_id": image_id, "split": "train", "category_id": 18,
                "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg", "sent_ids": [ref_id],
                "sentences": [{"sent_id": ref_id, "sent": sentence, "raw": sentence, "tokens": sentence.split()}]}  # fmt: skip

    (tmp_path / "refs.json").write_text(
        json.dumps([ref(0, 2001, 9, "brown dog"), ref(1, 1003, 581857, "dog lying down")])
    )
    instances = {
        "images": [{"id": 9, "width": 640, "height": 480, "file_name": "COCO_train2014_000000000009.jpg"}],
        "annotations": [{"id": 2001, "image_id": 9, "bbox": [1.0, 2.0, 30.0, 40.0], "category_id": 18}],
        "categories": [{"id": 18, "name": "dog"}],
    }  # image 581857 and its annotation are not in this instances.json
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    expected = ("RefCOCO+ train", r"ref #1 \(ref_id 1\)", "581857", "refs", 1, 2, "refs of 'train'")
    return tmp_path, "train", {"refs_file": "refs.json"}, expected


CASES = {"flickr30k_entities": _flickr, "vgp": _vgp, "gqa": _gqa, "visual_genome": _visual_genome, "refcoco+": _refcoco}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_image_missing_from_the_annotations_raises_or_is_skipped_and_counted(name, tmp_path, caplog):
    data_dir, split, options, expected = CASES[name](tmp_path)
    source, item, image, unit, skipped, total, skipped_unit = expected

    with pytest.raises(ValueError) as raised:
        build_dataset(name, data_dir, split, **options)
    error = ERROR.fullmatch(str(raised.value))
    assert error is not None, str(raised.value)
    assert (error["source"], error["image"], error["unit"]) == (source, image, unit)
    assert re.search(item, error["item"]), error["item"]

    with caplog.at_level(logging.WARNING):
        rows = build_dataset(name, data_dir, split, on_missing_image="skip", **options)
    warnings = [WARNING.fullmatch(message) for message in caplog.messages if "on_missing_image" in message]
    assert len(warnings) == 1 and warnings[0] is not None, caplog.messages
    assert (warnings[0]["source"], int(warnings[0]["skipped"]), int(warnings[0]["total"]), warnings[0]["unit"]) == (
        source, skipped, total, skipped_unit,
    )  # fmt: skip
    assert warnings[0]["where"] == error["where"].split(" (tried")[0]
    assert len(rows) and image not in rows["image_id"]


# ----------------------------------------------------------------------------------------------------------------
# One image missing from the region-feature store: the same policy, the same words
# ----------------------------------------------------------------------------------------------------------------


def test_both_levels_follow_the_one_option_of_build_dataset(tmp_path, caplog):
    root, split, _, _ = _flickr(tmp_path)
    store = RegionFeatureStore.write(
        [
            {
                "image_id": "1000092795",
                "image_size": None,
                "boxes": np.array([[1, 1, 50, 50]], np.float32),
                "features": np.ones((1, 4), np.float32),
            }
        ],
        tmp_path / "store",
    )  # fmt: skip  (10002456 has its annotation files but no features)
    with pytest.raises(ValueError) as raised:  # the first missing image stops the build: in the annotation files
        build_dataset("flickr30k_entities", root, split, region_features=store)
    assert ERROR.fullmatch(str(raised.value))["image"] == TEST_IMAGE

    with caplog.at_level(logging.WARNING):
        rows = build_dataset("flickr30k_entities", root, split, region_features=store, on_missing_image="skip")
    matches = [WARNING.fullmatch(message) for message in caplog.messages if "on_missing_image" in message]
    warnings = [(m["source"], int(m["skipped"]), int(m["total"]), m["unit"]) for m in matches]
    assert warnings == [
        ("Flickr30k Entities val", 1, 3, "images listed in val.txt"),
        ("flickr30k_entities val", 5, 10, "rows"),
    ]
    assert set(rows["image_id"]) == {"1000092795"} and rows["feature_row"] == [0] * 5

    (root / "val.txt").write_text("1000092795\n10002456\n")  # every image has its files, one has no features
    with pytest.raises(ValueError) as raised:
        build_dataset("flickr30k_entities", root, split, region_features=store)
    error = ERROR.fullmatch(str(raised.value))
    assert (error["source"], error["item"], error["image"]) == ("flickr30k_entities val", "row 5", "10002456")
    assert error["where"].startswith(f"the region-feature store {store.directory}")
