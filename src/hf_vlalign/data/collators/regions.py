"""The region tensors of a batch, read from a `RegionFeatureStore`: padding to the longest image, normalised boxes,
and the store's name of each row's image."""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence

import torch

from ...alignment.boxes import normalize_boxes
from ..feature_store import RegionFeatureStore


def pad_regions(store: RegionFeatureStore, image_ids: Sequence[str]) -> dict[str, torch.Tensor]:
    """Region tensors of `image_ids`, padded to the longest: `visual_feats`, `visual_boxes` (normalised),
    `visual_attention_mask`, plus `region_boxes_pixels`, `region_confidence` (1 where the store has none) and the
    detector's `region_object_ids` / `region_attr_ids` (-1 where the store has none, and on padding)."""
    images = store.batch(image_ids, without=("features",))
    num_regions, batch_size = max(len(image["boxes"]) for image in images), len(images)
    feats = store.padded(image_ids, "features")  # one copy from the mapped buffers, the bulk of the bytes
    boxes = torch.tensor([0.0, 0.0, 1.0, 1.0]).repeat(batch_size, num_regions, 1)  # padding: a valid dummy box
    pixels = torch.zeros(batch_size, num_regions, 4)
    mask = torch.zeros(batch_size, num_regions, dtype=torch.long)
    confidence = torch.zeros(batch_size, num_regions)
    ids = {name: torch.full((batch_size, num_regions), -1, dtype=torch.long) for name in ("object_ids", "attr_ids")}
    for i, image in enumerate(images):
        if image["image_size"] is None:
            raise ValueError(
                f"image {image['image_id']!r} has no image size in the region-feature store {store.directory}; "
                "convert its features again with the image sizes (e.g. `image_sizes=`) so that boxes can be normalised."
            )
        count = len(image["boxes"])
        height, width = image["image_size"].tolist()
        boxes[i, :count] = normalize_boxes(image["boxes"], width, height)
        pixels[i, :count] = image["boxes"]
        mask[i, :count] = 1
        confidence[i, :count] = image["object_conf"] if image["object_conf"] is not None else 1.0
        for name, column in ids.items():
            if image[name] is not None:
                column[i, :count] = torch.as_tensor(image[name]).reshape(count, -1)[:, 0]
    return {
        "visual_feats": feats,
        "visual_boxes": boxes,
        "visual_attention_mask": mask,
        "region_boxes_pixels": pixels,
        "region_confidence": confidence,
        "region_object_ids": ids["object_ids"],
        "region_attr_ids": ids["attr_ids"],
    }


def store_image_id(
    store: RegionFeatureStore, example: dict, id_column: str = "image_id", row_column: str = "feature_row"
) -> str:
    """The row's image as the store names it: its `image_id` when the store has it, else the store row
    `build_dataset(..., region_features=store)` matched it to (`feature_row`; e.g. COCO id "581857" stored as
    "COCO_train2014_000000581857")."""
    image_id, row = example[id_column], example.get(row_column)
    if image_id in store or row is None:
        return image_id  # a missing image without a row fails in `pad_regions`, naming it
    if isinstance(row, bool) or not isinstance(row, numbers.Integral) or not 0 <= row < len(store):
        raise ValueError(
            f"`{row_column}` of image {image_id!r} must be a row of the region-feature store (0 to "
            f"{len(store) - 1}), got {row!r}; were the rows joined with another store?"
        )
    store_id = store.image_id_at(int(row))
    if not _names_same_image(str(image_id), store_id):
        raise ValueError(
            f"`image_id` {image_id!r} is not in the region-feature store, and its `{row_column}` {row} is the image "
            f"{store_id!r}, not the same id in another naming; were the rows joined with another store?"
        )
    return store_id


def _names_same_image(image_id: str, store_id: str) -> bool:
    """Whether a store id names a dataset's image in another convention: COCO's "581857" and
    "COCO_train2014_000000581857" (the same number, zero-padded), or an id inside a template such as "581857.jpg"."""
    if image_id.isdigit():
        trailing = re.search(r"(\d+)\D*$", store_id)
        return trailing is not None and int(trailing.group(1)) == int(image_id)
    return image_id in store_id
