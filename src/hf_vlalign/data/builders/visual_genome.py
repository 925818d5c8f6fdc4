"""Visual Genome v1.2 (Krishna et al. 2017): region descriptions joined into grounded sentences, with the objects.

Sentences (Kervadec et al. 2020: VG sentences carry one, two or three pointers): each joins k (drawn from
`num_pointers`) distinct region descriptions, cleaned as bottom-up-attention's `setup_vg.py` does, with " and "; each
description points to its region's box. The join word is the paper's example (sec. 6.1: "the cat playing near the
tree" and "the yellow bird" become "the cat playing near the tree and the yellow bird"); the uniform draws of k and of
the descriptions are our reading (the paper does not say how they are drawn); `num_pointers=(1,)` is LXMERT's use of
VG. VG has no splits: "train" / "val" hold out images by a seeded hash of their id (`is_validation_image`).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Sequence
from pathlib import Path

import datasets

from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    UniqueIds,
    check_split,
    grounding_features,
    missing_image_error,
    read_json,
    report_missing_images,
    xywh_to_xyxy,
)

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "all")
FILES = {
    "region_descriptions": "region_descriptions.json",
    "objects": "objects.json",
    "attributes": "attributes.json",
    "image_data": "image_data.json",
}
JOIN = " and "

VG_FEATURES = datasets.Features(
    {
        "image_id": datasets.Value("string"),
        "image_size": IMAGE_SIZE,
        "sentence": datasets.Value("string"),
        **grounding_features("sentence"),
        "sentence_region_ids": datasets.List(datasets.Value("string")),
        "object_ids": datasets.List(datasets.Value("string")),
        "object_names": datasets.List(datasets.Value("string")),
        "object_attributes": datasets.List(datasets.List(datasets.Value("string"))),
        "object_boxes": datasets.List(datasets.List(datasets.Value("float32"), length=4)),
    }
)


def is_validation_image(image_id: str, val_fraction: float, seed: int = 0) -> bool:
    """Whether `image_id` is held out for validation: blake2b(f"{seed}:{image_id}") / 2**64 < `val_fraction`."""
    digest = hashlib.blake2b(f"{seed}:{image_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def clean_description(phrase: str) -> str:
    """A region description as it goes into a sentence: white space collapsed, trailing periods removed."""
    return " ".join(phrase.split()).rstrip(".").rstrip()


def join_descriptions(descriptions: Sequence[str]) -> tuple[str, list[list[int]]]:
    """("A and B and C", the character span of each description in it)."""
    spans, start = [], 0
    for description in descriptions:
        spans.append([start, start + len(description)])
        start += len(description) + len(JOIN)
    return JOIN.join(descriptions), spans


def draw_sentences(
    image_id: str, regions: list[dict], num_pointers: Sequence[int], sentences_per_image: int, seed: int
) -> list[dict]:
    """The grounded sentences of one image from its usable regions (each with a cleaned `phrase`), drawn from
    `random.Random(f"{seed}:{image_id}")`: independent of the other images read."""
    rng = random.Random(f"{seed}:{image_id}")
    sentences = []
    for _ in range(sentences_per_image):
        k = min(rng.choice(list(num_pointers)), len(regions))
        chosen = rng.sample(regions, k)
        sentence, spans = join_descriptions([region["phrase"] for region in chosen])
        sentences.append(
            {
                "sentence": sentence,
                "sentence_phrase_spans": spans,
                "sentence_phrase_boxes": [
                    [xywh_to_xyxy([region["x"], region["y"], region["width"], region["height"]])] for region in chosen
                ],
                "sentence_region_ids": [str(region["region_id"]) for region in chosen],
            }
        )
    return sentences


def _image_key(entry: dict, path: Path) -> str:
    """The image id of a per-image entry (v1.2 files say `image_id`, region_descriptions.json says `id`)."""
    image_id = entry.get("image_id", entry.get("id")) if isinstance(entry, dict) else None
    if image_id is None:
        raise ValueError(f"{path}: an entry has neither `image_id` nor `id`: {str(entry)[:120]}.")
    return str(image_id)


def read_image_sizes(path: Path) -> dict[str, tuple[dict, list[int]]]:
    """image id -> (its image_data.json entry, [height, width])."""
    entries = read_json(path, "data_dir", "Visual Genome image_data.json", list)
    sizes, image_ids = {}, UniqueIds(f"`data_dir` {path}", "image id")
    for index, entry in enumerate(entries):
        key = _image_key(entry, path)
        image_ids.add(key, f"entry #{index}")
        for side in ("height", "width"):
            if type(entry.get(side)) is not int or entry[side] <= 0:
                raise ValueError(
                    f"`data_dir` {path}, entry #{index} (image {key}): {side!r} must be a positive integer, "
                    f"got {entry.get(side)!r}."
                )
        sizes[key] = (entry, [entry["height"], entry["width"]])
    return sizes


def read_objects(objects_path: Path, attributes_path: Path) -> dict[str, dict[str, list]]:
    """image id -> object columns (ids, names, attributes, boxes), attributes joined by object id."""
    attributes_of: dict[int, list[str]] = {}
    for entry in read_json(attributes_path, "data_dir", "Visual Genome attributes.json", list):
        for obj in entry.get("attributes", []):
            attributes_of[obj["object_id"]] = [attribute.strip() for attribute in obj.get("attributes") or []]
    objects_by_image, seen = {}, set()
    image_ids = UniqueIds(f"`data_dir` {objects_path}", "image id")
    for index, entry in enumerate(read_json(objects_path, "data_dir", "Visual Genome objects.json", list)):
        image_ids.add(_image_key(entry, objects_path), f"entry #{index}")
        objects = entry.get("objects", [])
        seen.update(obj["object_id"] for obj in objects)
        objects_by_image[_image_key(entry, objects_path)] = {
            "object_ids": [str(obj["object_id"]) for obj in objects],
            "object_names": [_object_name(obj, objects_path) for obj in objects],
            "object_attributes": [attributes_of.get(obj["object_id"], []) for obj in objects],
            "object_boxes": [xywh_to_xyxy([obj["x"], obj["y"], obj["w"], obj["h"]]) for obj in objects],
        }
    unmatched = len(attributes_of.keys() - seen)
    if unmatched:
        logger.warning(
            "%s: attributes of %d object(s) not in %s are not used.", attributes_path, unmatched, objects_path
        )
    return objects_by_image


def _object_name(obj: dict, path: Path) -> str:
    names = obj.get("names") or ([obj["name"]] if "name" in obj else [])
    if not names:
        raise ValueError(f"{path}: object {obj.get('object_id')} has no name.")
    return names[0].strip()


def build(
    data_dir: str | Path,
    split: str,
    *,
    seed: int = 0,
    val_fraction: float = 0.1,
    num_pointers: Sequence[int] = (1, 2, 3),
    sentences_per_image: int = 1,
    exclude_coco_images: bool = False,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """`build_dataset("visual_genome", data_dir, split)`: grounded sentences per image (see the module docstring).

    Args:
        seed: seeds both the train / val assignment and the sentence draws.
        val_fraction: the fraction of images held out as "val" (in [0, 1]).
        num_pointers: the numbers of region descriptions a sentence may join, drawn uniformly.
        exclude_coco_images: drop the images that have a `coco_id` (counted in a log message).
        on_missing_image: for the images of `region_descriptions.json` that `image_data.json` does not list.
    """
    check_split(split, SPLITS, "Visual Genome")
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"`val_fraction` must be in [0, 1], got {val_fraction}.")
    if not num_pointers or any(type(k) is not int or k < 1 for k in num_pointers):
        raise ValueError(f"`num_pointers` must be a non-empty sequence of positive ints, got {num_pointers!r}.")
    if type(sentences_per_image) is not int or sentences_per_image < 1:
        raise ValueError(f"`sentences_per_image` must be a positive int, got {sentences_per_image!r}.")
    if data_dir is None:
        raise ValueError("`data_dir` must be the folder holding the Visual Genome JSON files, got None.")
    paths = {name: Path(data_dir) / file for name, file in FILES.items()}
    images = read_image_sizes(paths["image_data"])
    objects = read_objects(paths["objects"], paths["attributes"])
    counts = {"without regions": 0, "without objects": 0, "COCO": 0, "empty descriptions": 0}
    entries = read_json(paths["region_descriptions"], "data_dir", "Visual Genome region_descriptions.json", list)
    rows, missing = [], 0
    for index, entry in enumerate(entries):
        image_id = _image_key(entry, paths["region_descriptions"])
        if image_id not in images:
            if on_missing_image == "raise":
                item = f"{paths['region_descriptions']}, entry {index}"
                raise missing_image_error(f"Visual Genome {split}", item, image_id, str(paths["image_data"]), "images")
            missing += 1
            continue
        if split != "all" and is_validation_image(image_id, val_fraction, seed) != (split == "val"):
            continue
        if exclude_coco_images and images[image_id][0].get("coco_id") is not None:
            counts["COCO"] += 1
            continue
        rows.extend(
            _image_rows(image_id, entry, images[image_id][1], objects, counts, num_pointers, sentences_per_image, seed)
        )
    _report(counts, split, exclude_coco_images)
    report_missing_images(
        f"Visual Genome {split}", missing, len(entries), "images of region_descriptions.json", str(paths["image_data"])
    )
    if not rows:
        raise ValueError(
            f"Visual Genome split {split!r} of {data_dir} is empty (val_fraction={val_fraction}, seed={seed}); "
            "read more images or change `val_fraction`."
        )
    return datasets.Dataset.from_list(rows, features=VG_FEATURES)


def _image_rows(image_id, entry, image_size, objects, counts, num_pointers, sentences_per_image, seed) -> list[dict]:
    regions = []
    for region in entry.get("regions", []):
        phrase = clean_description(region.get("phrase") or "")
        if phrase:
            regions.append({**region, "phrase": phrase})
        else:
            counts["empty descriptions"] += 1
    if not regions:
        counts["without regions"] += 1
        return []
    if image_id not in objects:
        counts["without objects"] += 1
    image_objects = objects.get(
        image_id, {name: [] for name in ("object_ids", "object_names", "object_attributes", "object_boxes")}
    )
    return [
        {"image_id": image_id, "image_size": image_size, **sentence, **image_objects}
        for sentence in draw_sentences(image_id, regions, num_pointers, sentences_per_image, seed)
    ]


def _report(counts: dict[str, int], split: str, exclude_coco_images: bool) -> None:
    messages = {
        "empty descriptions": "%d empty region descriptions not used.",
        "without regions": "%d image(s) without a region description give no sentence.",
        "without objects": "%d image(s) absent from objects.json have no object columns.",
    }
    for key, message in messages.items():
        if counts[key]:
            logger.warning("Visual Genome %s: " + message, split, counts[key])
    if exclude_coco_images:
        logger.info(
            "Visual Genome %s: %d image(s) also in COCO dropped (exclude_coco_images=True).", split, counts["COCO"]
        )
