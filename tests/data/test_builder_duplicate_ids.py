"""Repeated ids (issue 32): every builder refuses an id its files give twice, the way the VQA builder does, with a
`ValueError` naming the file, the id and both places. The files are the real samples of `../shared/data` where the
builder reads a published layout we have a sample of (one record duplicated), hand-made files in the published layout
otherwise (RefCOCO+, COCO Karpathy, LXMERT)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest

from hf_vlalign.data.builders import (
    build_dataset,
    build_vgp_dataset,
    coco_captions,
    flickr30k_entities,
    gqa,
    lxmert_pretraining,
    nlvr2,
    refcoco,
    visual_genome,
    vqa_v2,
)
from shared_samples import real_sample


def twice(where_first: str, where_second: str) -> str:
    return rf"appears twice, at {re.escape(where_first)} and at {re.escape(where_second)}; ids must be unique"


def read(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------------------------------------------
# Real samples
# ----------------------------------------------------------------------------------------------------------------


def test_vqa_question_id_twice_in_the_questions_file(tmp_path):
    name = "v2_OpenEnded_mscoco_val2014_questions.json"
    content = read(real_sample("vqa_v2", "official_val2014_questions_head", name))
    repeated = content["questions"][3]
    content["questions"].append(dict(repeated))
    (tmp_path / name).write_text(json.dumps(content))
    last = len(content["questions"]) - 1
    match = rf"`questions_file` {re.escape(str(tmp_path / name))}: question id {repeated['question_id']} " + twice(
        "questions[3]", f"questions[{last}]"
    )
    with pytest.raises(ValueError, match=match):
        vqa_v2.build(tmp_path, "val")


def test_vqa_question_id_twice_in_the_annotations_file(tmp_path):
    fixture = real_sample("vqa_v2", "allennlp_fixture")
    annotations = read(fixture / "annotations.json")
    annotations["annotations"].insert(0, dict(annotations["annotations"][1]))
    (tmp_path / "annotations.json").write_text(json.dumps(annotations))
    question_id = annotations["annotations"][0]["question_id"]
    match = rf"`annotations_file` .*annotations.json: question id {question_id} " + twice("annotations[0]", "annotations[2]")
    with pytest.raises(ValueError, match=match):
        vqa_v2.build(
            fixture, "train", questions_file=fixture / "questions.json", annotations_file=tmp_path / "annotations.json",
            answer_vocab={"yes": 0},
        )  # fmt: skip


def test_gqa_question_id_in_two_shards_names_both(tmp_path):
    shards = real_sample("gqa", "allennlp_fixture", "question_dir")
    folder = tmp_path / "question_dir"
    shutil.copytree(shards, folder)
    first = read(folder / "questions0.json")
    question_id, record = next(iter(first.items()))
    second = read(folder / "questions1.json")
    second[question_id] = record
    (folder / "questions1.json").write_text(json.dumps(second))
    match = rf"`questions_file`: question id '{question_id}' " + twice(str(folder / "questions0.json"), str(folder / "questions1.json"))
    with pytest.raises(ValueError, match=match):
        gqa.build(tmp_path, "val", questions_file="question_dir")


def test_nlvr2_identifier_on_two_lines(tmp_path):
    lines = real_sample("nlvr2", "dev.json").read_text(encoding="utf-8").splitlines()
    (tmp_path / "dev.json").write_text("\n".join([*lines[:5], lines[1], *lines[5:8]]) + "\n")
    identifier = json.loads(lines[1])["identifier"]
    match = rf"{re.escape(str(tmp_path / 'dev.json'))}: identifier '{identifier}' " + twice("line 2", "line 6")
    with pytest.raises(ValueError, match=match):
        nlvr2.build(tmp_path, "dev")
    with pytest.raises(ValueError, match=match):
        build_dataset("nlvr2", tmp_path, "validation")


def test_flickr30k_entities_image_listed_twice_in_the_split_file(tmp_path):
    corpus = real_sample("flickr30k_entities")
    for folder in ("Sentences", "Annotations"):
        (tmp_path / folder).symlink_to(corpus / folder)
    present = sorted(path.stem for path in (corpus / "Annotations").glob("*.xml"))[:3]
    (tmp_path / "val.txt").write_text("\n".join([present[0], present[1], present[2], present[1]]) + "\n")
    match = rf"`data_dir` {re.escape(str(tmp_path / 'val.txt'))}: image id '{present[1]}' " + twice("line 2", "line 4")
    with pytest.raises(ValueError, match=match):
        flickr30k_entities.build(tmp_path, "val")


@pytest.mark.parametrize("file_name", ["image_data.json", "objects.json"])
def test_visual_genome_image_twice(file_name, tmp_path):
    corpus = real_sample("visual_genome")
    for path in corpus.iterdir():
        (tmp_path / path.name).symlink_to(path)
    entries = read(corpus / file_name)
    entries.append(dict(entries[0]))
    (tmp_path / file_name).unlink()
    (tmp_path / file_name).write_text(json.dumps(entries))
    image_id = entries[0]["image_id"]
    match = rf"`data_dir` {re.escape(str(tmp_path / file_name))}: image id '{image_id}' " + twice(
        "entry #0", f"entry #{len(entries) - 1}"
    )
    with pytest.raises(ValueError, match=match):
        visual_genome.build(tmp_path, "all")


# ----------------------------------------------------------------------------------------------------------------
# Hand-made files in the published layouts
# ----------------------------------------------------------------------------------------------------------------


def _ref(ref_id: int, ann_id: int, split: str, sent_ids: list[int]) -> dict:
    sentences = [{"sent_id": s, "sent": f"thing {s}", "tokens": ["thing", str(s)], "raw": f"thing {s}"} for s in sent_ids]
    return {"ref_id": ref_id, "ann_id": ann_id, "image_id": 9, "category_id": 1, "split": split, "sentences": sentences,
            "sent_ids": sent_ids, "file_name": "COCO_train2014_000000000009_1.jpg"}  # fmt: skip


INSTANCES = {
    "images": [{"id": 9, "width": 640, "height": 480, "file_name": "COCO_train2014_000000000009.jpg"}],
    "annotations": [
        {"id": 1001, "image_id": 9, "bbox": [10.0, 20.0, 30.0, 40.0], "category_id": 1},
        {"id": 1002, "image_id": 9, "bbox": [100.0, 20.0, 30.0, 40.0], "category_id": 1},
    ],
    "categories": [{"supercategory": "person", "id": 1, "name": "person"}],
}


def _refcoco_dir(tmp_path: Path, refs: list[dict], instances: dict = INSTANCES) -> Path:
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    return tmp_path


def test_refcoco_good_files_build(tmp_path):
    folder = _refcoco_dir(tmp_path, [_ref(0, 1001, "train", [0, 1]), _ref(1, 1002, "train", [2])])
    assert refcoco.build(folder, "train", refs_file="refs.json")["sent_id"] == [0, 1, 2]


@pytest.mark.parametrize(
    "refs, instances, match",
    [
        ([_ref(0, 1001, "train", [0]), _ref(0, 1002, "train", [1])], INSTANCES, r"refs.json: ref_id 0 " + twice("ref #0", "ref #1")),
        ([_ref(0, 1001, "train", [0, 1]), _ref(1, 1002, "train", [1])], INSTANCES,
         r"refs.json: sent_id 1 " + twice("ref #0 (ref_id 0), sentence #1", "ref #1 (ref_id 1), sentence #0")),
        ([_ref(0, 1001, "train", [0])], {**INSTANCES, "images": INSTANCES["images"] * 2},
         r"instances.json: image id 9 " + twice("images[0]", "images[1]")),
        ([_ref(0, 1001, "train", [0])], {**INSTANCES, "annotations": INSTANCES["annotations"] + INSTANCES["annotations"][:1]},
         r"instances.json: annotation id 1001 " + twice("annotations[0]", "annotations[2]")),
    ],
    ids=["ref_id", "sent_id", "instances image id", "instances annotation id"],
)  # fmt: skip
def test_refcoco_repeated_ids(refs, instances, match, tmp_path):
    folder = _refcoco_dir(tmp_path, refs, instances)
    with pytest.raises(ValueError, match=match):
        refcoco.build(folder, "train", refs_file="refs.json")


def _coco_image(cocoid: int, sentids: list[int]) -> dict:
    sentences = [{"raw": f"caption {s}", "tokens": ["caption", str(s)], "sentid": s, "imgid": cocoid} for s in sentids]
    return {"filepath": "val2014", "filename": f"COCO_val2014_{cocoid:012d}.jpg", "cocoid": cocoid, "split": "val",
            "sentences": sentences, "sentids": sentids, "imgid": cocoid}  # fmt: skip


@pytest.mark.parametrize(
    "images, match",
    [
        ([_coco_image(42, [0, 1]), _coco_image(7, [2]), _coco_image(42, [3])], r"cocoid 42 " + twice("images[0]", "images[2]")),
        ([_coco_image(42, [0, 1]), _coco_image(7, [1])], r"sentid 1 " + twice("images[0].sentences[1]", "images[1].sentences[0]")),
    ],
    ids=["cocoid", "sentid"],
)  # fmt: skip
def test_coco_karpathy_repeated_ids(images, match, tmp_path):
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    with pytest.raises(ValueError, match=rf"`data_dir` {re.escape(str(tmp_path / 'dataset_coco.json'))}: {match}"):
        coco_captions.build(tmp_path, "val")
    good = [_coco_image(42, [0, 1]), _coco_image(7, [2])]
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": good, "dataset": "coco"}))
    assert coco_captions.build(tmp_path, "val")["sent_id"] == [0, 1, 2]


def test_lxmert_img_id_twice_over_the_files_read(tmp_path):
    def record(img_id: str) -> dict:
        return {"img_id": img_id, "sentf": {"mscoco": ["a dog on a mat"]}, "labelf": {}}

    (tmp_path / "mscoco_train.json").write_text(json.dumps([record("COCO_train2014_000000000009"), record("COCO_train2014_000000000025")]))
    (tmp_path / "mscoco_nominival.json").write_text(json.dumps([record("COCO_val2014_000000000042"), record("COCO_train2014_000000000025")]))
    match = r"`data_dir`: img_id 'COCO_train2014_000000000025' " + twice(
        f"{tmp_path / 'mscoco_train.json'}, record #1", f"{tmp_path / 'mscoco_nominival.json'}, record #1"
    )
    assert len(lxmert_pretraining.build(tmp_path, "mscoco_train")) == 2
    with pytest.raises(ValueError, match=match):
        lxmert_pretraining.build(tmp_path, "mscoco_train,mscoco_nominival")


def test_vgp_row_repeated_in_every_field_is_kept_and_warned_about(tmp_path, caplog):
    # the VGP csvs have no pair id, and the published ones give the same phrase pair twice with different labels
    # (VGP-Typology train_data.csv lines 315-316): a repeat is kept and said, never refused
    lines = real_sample("vgp", "VGP-Typology", "val_data.csv").read_text(encoding="utf-8-sig").splitlines()
    csv = tmp_path / "val_data.csv"
    csv.write_text("\n".join([*lines[:40], lines[3], lines[7]]) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        dataset = build_vgp_dataset(real_sample("flickr30k_entities"), csv, replace_caption_prob=0.0)
    assert re.search(r"VGP val_data\.csv: 2 row\(s\) repeat an earlier row .*line 41 = line 4, line 42 = line 8", caplog.text)
    assert len(dataset) > 0  # built: the repeat is not refused
