"""COCO captions in the Karpathy split (Karpathy & Fei-Fei, 2015): one row per caption, or per image for evaluation.

File: Karpathy's `dataset_coco.json` (`data_dir` is its folder or the file). Splits: "train", "val", "test",
"restval"; with `restval_in_train=True` (the default, as NeuralTalk2 / bottom-up-attention / Oscar) "train" is train +
restval (113,287 images). `store_image_ids` tries "<cocoid>" then "COCO_<coco_split>_<cocoid:012d>" (or
`image_id_template`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import datasets

from ..formats.paths import check_relative_path
from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    UniqueIds,
    check_image_id_template,
    check_keys,
    check_split,
    read_json,
)

SPLITS = ("train", "val", "test", "restval")
DATASET_FILE = "dataset_coco.json"
COCO_FOLDERS = ("train2014", "val2014")
COCO_FILE_ID = "COCO_{coco_split}_{image_id:012d}"
_IMAGE_KEYS = {"filepath": str, "filename": str, "cocoid": int, "split": str, "sentences": list}
_SENTENCE_KEYS = {"raw": str, "tokens": list, "sentid": int}

_IMAGE_FEATURES = {
    "image_id": datasets.Value("string"),  # str(cocoid), e.g. "391895"
    "image_size": IMAGE_SIZE,  # None: the file does not give image sizes
    "file_name": datasets.Value("string"),  # e.g. "COCO_val2014_000000391895.jpg"
    "coco_split": datasets.Value("string"),  # the image's COCO folder (`filepath`), "train2014" or "val2014"
    "karpathy_split": datasets.Value("string"),  # the image's own split ("restval" stays visible inside "train")
}
CAPTION_FEATURES = datasets.Features(
    {
        **_IMAGE_FEATURES,
        "sent_id": datasets.Value("int64"),  # `sentid`
        "caption": datasets.Value("string"),  # `raw`, stripped
        "tokens": datasets.List(datasets.Value("string")),
    }
)
IMAGE_FEATURES = datasets.Features(  # `per_image=True`: the lists of the above, one row per image
    {
        **_IMAGE_FEATURES,
        "sent_ids": datasets.List(datasets.Value("int64")),
        "captions": datasets.List(datasets.Value("string")),
        "caption_tokens": datasets.List(datasets.List(datasets.Value("string"))),
    }
)


def build(
    data_dir: str | Path,
    split: str,
    *,
    per_image: bool = False,
    restval_in_train: bool = True,
    image_id_template: str | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """One Karpathy split of COCO captions (`CAPTION_FEATURES`, or `IMAGE_FEATURES` with `per_image`).

    Args:
        data_dir: the folder holding `dataset_coco.json`, or that file.
        per_image: one row per image with all its captions (for evaluation) instead of one row per caption.
        restval_in_train: whether "train" also holds the "restval" images (the usual practice).
        image_id_template: read by `store_image_ids` (`build_dataset` passes both the same options).
        on_missing_image: applies to the region-feature store alone (`dataset_coco.json` describes every image).
    """
    check_split(split, SPLITS, "COCO Karpathy captions")
    for name, value in (("per_image", per_image), ("restval_in_train", restval_in_train)):
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be a bool, got {value!r}.")
    check_image_id_template(image_id_template, COCO_FILE_ID, image_id=1, coco_split="train2014")
    if data_dir is None:
        raise ValueError(f"`data_dir` must be the folder holding {DATASET_FILE} (or the file), got None.")
    path = Path(data_dir) if Path(data_dir).is_file() else Path(data_dir) / DATASET_FILE
    wanted = {split, "restval"} if split == "train" and restval_in_train else {split}
    rows, image_ids, sentence_ids = [], UniqueIds(f"`data_dir` {path}", "cocoid"), UniqueIds(f"`data_dir` {path}", "sentid")
    for index, image in enumerate(_images(path)):
        where = f"{path}, images[{index}]"
        check_keys(image, _IMAGE_KEYS, where)
        if image["split"] not in SPLITS:
            raise ValueError(f"{where}: `split` must be one of {list(SPLITS)}, got {image['split']!r}.")
        if image["filepath"] not in COCO_FOLDERS:
            raise ValueError(f"{where}: `filepath` must be one of {list(COCO_FOLDERS)}, got {image['filepath']!r}.")
        # `filepath/filename` is joined onto the COCO image folder by whoever loads the pixels: it must stay inside it
        check_relative_path(image["filename"], f"{where}: `filename`")
        image_ids.add(image["cocoid"], f"images[{index}]")
        for number, sentence in enumerate(image["sentences"]):
            check_keys(sentence, _SENTENCE_KEYS, f"{where}.sentences[{number}]")
            sentence_ids.add(sentence["sentid"], f"images[{index}].sentences[{number}]")
        if image["split"] in wanted:
            rows.extend(_image_rows(image, where, per_image))
    if not rows:
        raise ValueError(f"`data_dir` {path}: no image of the Karpathy split {split!r}.")
    return datasets.Dataset.from_list(rows, features=IMAGE_FEATURES if per_image else CAPTION_FEATURES)


def _images(path: Path) -> list:
    what = 'Karpathy\'s dataset_coco.json {"images": [...], "dataset": "coco"}'
    data = read_json(path, "data_dir", what)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"`data_dir` {path}: expected {what}.")
    return data["images"]


def _image_rows(image: dict, where: str, per_image: bool) -> list[dict]:
    shared = {
        "image_id": str(image["cocoid"]),
        "image_size": None,
        "file_name": image["filename"],
        "coco_split": image["filepath"],
        "karpathy_split": image["split"],
    }
    sentences = image["sentences"]
    if not sentences:
        raise ValueError(f"{where}: image {image['cocoid']} has no sentences.")
    if per_image:
        return [
            {
                **shared,
                "sent_ids": [sentence["sentid"] for sentence in sentences],
                "captions": [sentence["raw"].strip() for sentence in sentences],
                "caption_tokens": [sentence["tokens"] for sentence in sentences],
            }
        ]
    return [
        {**shared, "sent_id": sentence["sentid"], "caption": sentence["raw"].strip(), "tokens": sentence["tokens"]}
        for sentence in sentences
    ]


def store_image_ids(image_id_template: str | None = None, **_) -> tuple[Callable[[dict], list[str]], tuple[str, ...]]:
    """Candidate store ids of a row: "<cocoid>" then "COCO_<coco_split>_<cocoid:012d>", or only the id
    `image_id_template` (a `str.format` template of the int `image_id` and the str `coco_split`) formats."""
    check_image_id_template(image_id_template, COCO_FILE_ID, image_id=1, coco_split="train2014")

    def candidates(row: dict) -> list[str]:
        fields = {"image_id": int(row["image_id"]), "coco_split": row["coco_split"]}
        if image_id_template is not None:
            return [image_id_template.format(**fields)]
        return [row["image_id"], COCO_FILE_ID.format(**fields)]

    return candidates, ("image_id", "coco_split")
