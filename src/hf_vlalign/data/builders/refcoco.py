"""RefCOCO+ (Yu et al., 2016, UNC splits): referring expressions, each naming one COCO object. One row per expression.

`data_dir` is the unzipped `refcoco+` folder of https://github.com/lichengunc/refer: `refs(unc).p` (read by
`formats.safe_pickle.load_restricted_pickle`, which imports nothing; `refs_file=` names another `.p` / `.pkl` / `.json`
of the same refs) and `instances.json` (COCO images, annotations, categories). Accuracy is `argmax == target_index`
over the ground-truth candidates (MAttNet's setting). `store_image_ids` tries "<id>" then "COCO_train2014_<id:012d>"
(or `image_id_template`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import datasets

from ..formats.paths import check_relative_path
from ..formats.safe_pickle import load_restricted_pickle
from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    UniqueIds,
    check_image_id_template,
    check_keys,
    check_split,
    grounding_features,
    missing_image_error,
    read_json,
    report_missing_images,
    require_file,
    xywh_to_xyxy,
)

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "testA", "testB")
DEFAULT_REFS_FILE = "refs(unc).p"
INSTANCES_FILE = "instances.json"
COCO_TRAIN2014_ID = "COCO_train2014_{image_id:012d}"

FEATURES = datasets.Features(
    {
        "ref_id": datasets.Value("int64"),
        "sent_id": datasets.Value("int64"),
        "ann_id": datasets.Value("int64"),
        "image_id": datasets.Value("string"),  # the COCO image id, e.g. "581857"
        "image_size": IMAGE_SIZE,  # from `instances.json`
        "file_name": datasets.Value("string"),  # the image's file in COCO train2014
        "expression": datasets.Value("string"),  # the processed sentence (`sent`), the text published results use
        "tokens": datasets.List(datasets.Value("string")),
        **grounding_features("expression"),  # one phrase, the whole expression, with the referred object's box
        "category_id": datasets.Value("int64"),
        "category_name": datasets.Value("string"),
        "candidate_ann_ids": datasets.List(datasets.Value("int64")),  # every COCO object of the image, in file order
        "candidate_boxes": datasets.List(datasets.List(datasets.Value("float32"), length=4)),
        "target_index": datasets.Value("int32"),  # the referred object's position among the candidates
    }
)


def build(
    data_dir: str | Path,
    split: str,
    *,
    refs_file: str | Path | None = None,
    image_id_template: str | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """One RefCOCO+ split, one row per expression (`FEATURES`).

    Args:
        data_dir: the `refcoco+` folder (with `refs(unc).p` and `instances.json`).
        refs_file: a pickle or `.json` of the refs to read instead of `data_dir/refs(unc).p` (relative to `data_dir`).
        image_id_template: read by `store_image_ids` (`build_dataset` passes both the same options).
        on_missing_image: for the refs whose image `instances.json` does not list.
    """
    check_split(split, SPLITS, "RefCOCO+")
    if data_dir is None:
        raise ValueError("`data_dir` must be the refcoco+ folder of lichengunc/refer (refs(unc).p, instances.json), got None.")
    check_image_id_template(image_id_template, COCO_TRAIN2014_ID, image_id=1)
    data_dir = Path(data_dir)
    if refs_file is None:
        refs = read_refs(data_dir / DEFAULT_REFS_FILE, argument="data_dir")
    else:
        refs = read_refs(data_dir / refs_file)
    instances = _CocoInstances(data_dir / INSTANCES_FILE)
    rows, empty, in_split, missing = [], 0, 0, 0
    for index, ref in enumerate(refs):
        if ref["split"] != split:
            continue
        in_split += 1
        if ref["image_id"] not in instances.images:
            if on_missing_image == "raise":
                item = f"ref #{index} (ref_id {ref['ref_id']})"
                raise missing_image_error(f"RefCOCO+ {split}", item, str(ref["image_id"]), str(instances.path), "refs")
            missing += 1
            continue
        for row in _ref_rows(ref, instances, f"ref #{index} (ref_id {ref['ref_id']})"):
            if row["expression"]:
                rows.append(row)
            else:
                empty += 1
    if empty:
        logger.warning("RefCOCO+ %s: %d empty expression(s) skipped.", split, empty)
    report_missing_images(f"RefCOCO+ {split}", missing, in_split, f"refs of {split!r}", str(instances.path))
    if not rows:
        raise ValueError(f"no ref of {split!r} in {len(refs)} refs; their splits are {sorted({r['split'] for r in refs})}.")
    return datasets.Dataset.from_list(rows, features=FEATURES)


def read_refs(path: str | Path, argument: str = "refs_file") -> list[dict]:
    """The list of ref dicts of a `refs(<splitBy>).p` pickle (restricted unpickling) or of its JSON equivalent."""
    path = require_file(path, argument, "a RefCOCO+ refs file (refs(unc).p or a .json of the same list)")
    if path.suffix.lower() == ".json":
        refs = read_json(path, argument, "a JSON list of RefCOCO+ ref dicts")
    else:
        refs = load_restricted_pickle(path)
    if not isinstance(refs, list) or not refs:
        raise ValueError(f"`{argument}` {path}: expected a non-empty list of ref dicts, got {type(refs).__name__}.")
    ref_ids, sent_ids = UniqueIds(f"`{argument}` {path}", "ref_id"), UniqueIds(f"`{argument}` {path}", "sent_id")
    for index, ref in enumerate(refs):
        check_keys(ref, _REF_KEYS, f"`{argument}` {path}, ref #{index}")
        for number, sentence in enumerate(ref["sentences"]):
            where = f"ref #{index} (ref_id {ref['ref_id']}), sentence #{number}"
            check_keys(sentence, _SENTENCE_KEYS, f"`{argument}` {path}, {where}")
            sent_ids.add(sentence["sent_id"], where)
        ref_ids.add(ref["ref_id"], f"ref #{index}")
    return refs


_REF_KEYS = {"ref_id": int, "ann_id": int, "image_id": int, "category_id": int, "split": str, "sentences": list}
_SENTENCE_KEYS = {"sent_id": int, "sent": str, "tokens": list}


class _CocoInstances:
    """`instances.json` indexed the way `refer.REFER.createIndex` does: images, annotations and per-image objects."""

    def __init__(self, path: Path) -> None:
        what = 'a COCO instances file {"images": [...], "annotations": [...], "categories": [...]}'
        data = read_json(path, "data_dir", what)
        if not isinstance(data, dict) or any(not isinstance(data.get(key), list) for key in ("images", "annotations", "categories")):
            raise ValueError(f"`data_dir` {path}: expected {what}.")
        self.path = path
        try:
            self.images = _by_unique_id(data["images"], f"`data_dir` {path}", "images")
            self.annotations = _by_unique_id(data["annotations"], f"`data_dir` {path}", "annotations")
            self.categories = {category["id"]: category["name"] for category in data["categories"]}
        except (KeyError, TypeError) as error:
            raise ValueError(f"`data_dir` {path}: an image, annotation or category lacks {error}; expected {what}.") from None
        for image in data["images"]:  # `file_name` is joined onto the COCO train2014 folder by whoever loads the pixels
            if image.get("file_name") is not None:
                check_relative_path(image["file_name"], f"`data_dir` {path}, image {image['id']}: `file_name`")
        self.image_annotations: dict[int, list[dict]] = {}
        for annotation in data["annotations"]:
            self.image_annotations.setdefault(annotation["image_id"], []).append(annotation)

    def box(self, annotation: dict) -> list[float]:
        box = annotation.get("bbox")
        if not isinstance(box, list) or len(box) != 4:
            raise ValueError(f"{self.path}: annotation {annotation.get('id')} must have bbox [x, y, w, h], got {box!r}.")
        return xywh_to_xyxy(box)


def _by_unique_id(entries: list[dict], source: str, key: str) -> dict:
    """id -> entry of a COCO list ("images", "annotations"); an id listed twice is refused, naming both positions."""
    ids, by_id = UniqueIds(source, f"{key[:-1]} id"), {}
    for index, entry in enumerate(entries):
        ids.add(entry["id"], f"{key}[{index}]")
        by_id[entry["id"]] = entry
    return by_id


def _ref_rows(ref: dict, instances: _CocoInstances, where: str) -> list[dict]:
    image = instances.images[ref["image_id"]]  # refs without their image were left out by `build`
    target = instances.annotations.get(ref["ann_id"])
    if target is None:
        raise ValueError(f"{where}: its annotation {ref['ann_id']} is not in {instances.path}.")
    if target["image_id"] != ref["image_id"]:
        raise ValueError(f"{where}: its annotation {ref['ann_id']} belongs to image {target['image_id']}, not {ref['image_id']}.")
    if ref["category_id"] not in instances.categories:
        raise ValueError(f"{where}: category {ref['category_id']} is not in the categories of {instances.path}.")
    candidates = instances.image_annotations[ref["image_id"]]
    shared = {
        "ref_id": ref["ref_id"],
        "ann_id": ref["ann_id"],
        "image_id": str(ref["image_id"]),
        "image_size": [image["height"], image["width"]],
        "file_name": image.get("file_name"),
        "category_id": ref["category_id"],
        "category_name": instances.categories[ref["category_id"]],
        "candidate_ann_ids": [annotation["id"] for annotation in candidates],
        "candidate_boxes": [instances.box(annotation) for annotation in candidates],
        "target_index": [annotation["id"] for annotation in candidates].index(ref["ann_id"]),
    }
    target_box = instances.box(target)
    return [
        {
            **shared,
            "sent_id": sentence["sent_id"],
            "expression": sentence["sent"],
            "tokens": sentence["tokens"],
            "expression_phrase_spans": [[0, len(sentence["sent"])]],
            "expression_phrase_boxes": [[target_box]],
        }
        for sentence in ref["sentences"]
    ]


def store_image_ids(image_id_template: str | None = None, **_) -> tuple[Callable[[dict], list[str]], tuple[str, ...]]:
    """Candidate store ids of a row: "<id>" then "COCO_train2014_<id:012d>", or only the id `image_id_template` (a
    `str.format` template of the int `image_id`) formats."""
    check_image_id_template(image_id_template, COCO_TRAIN2014_ID, image_id=1)
    if image_id_template is not None:
        return (lambda row: [image_id_template.format(image_id=int(row["image_id"]))]), ("image_id",)
    return (lambda row: [row["image_id"], COCO_TRAIN2014_ID.format(image_id=int(row["image_id"]))]), ("image_id",)
