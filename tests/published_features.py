"""Region features for the real annotation samples' image ids, written in the published feature formats, so that a
recipe's end-to-end test reads real annotations through the same readers as a full run.

The values are random (seeded per image id); the layouts are the published ones: LXMERT's TSV (`write_lxmert_tsv`),
bottom-up-attention-vqa's fixed-boxes HDF5 + `imgid2idx` map and the meshed-memory transformer's
`coco_detections.hdf5`. Class and attribute ids index the bottom-up-attention vocabularies (1600 objects, 400
attributes)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv

NUM_OBJECT_CLASSES, NUM_ATTRIBUTES = 1600, 400


def region_record(image_id: str, num_boxes: int = 10, feature_dim: int = 16, size: tuple[int, int] = (375, 500)) -> dict:
    """One image's store record (pixel boxes inside `size` = (height, width)), seeded by the image id."""
    rng = np.random.default_rng(zlib.crc32(str(image_id).encode()))
    height, width = size
    corners = rng.uniform(0, [width * 0.6, height * 0.6], size=(num_boxes, 2))
    extents = rng.uniform(8, [width * 0.4, height * 0.4], size=(num_boxes, 2))
    return {
        "image_id": str(image_id),
        "image_size": [height, width],
        "boxes": np.concatenate([corners, corners + extents], axis=1).astype(np.float32),
        "features": rng.standard_normal((num_boxes, feature_dim)).astype(np.float32),
        "object_ids": rng.integers(0, NUM_OBJECT_CLASSES, num_boxes).astype(np.int64),
        "object_conf": rng.uniform(0.2, 0.95, num_boxes).astype(np.float32),
        "attr_ids": rng.integers(0, NUM_ATTRIBUTES, num_boxes).astype(np.int64),
        "attr_conf": rng.uniform(0.1, 0.9, num_boxes).astype(np.float32),
    }


def write_lxmert_tsv_features(path: Path, image_ids, **options) -> Path:
    """LXMERT's `*_obj36.tsv` layout (one line per image)."""
    write_lxmert_tsv(path, (region_record(image_id, **options) for image_id in image_ids))
    return Path(path)


def write_butd_h5_features(path: Path, image_ids, **options) -> tuple[Path, Path]:
    """bottom-up-attention-vqa's `train36.hdf5` (fixed boxes per image) and its id map (as JSON: `{id: index}`);
    image ids must be integers, as the converters' are."""
    import h5py

    records = [region_record(image_id, **options) for image_id in image_ids]
    num_boxes, dim = records[0]["features"].shape
    with h5py.File(path, "w") as handle:
        features = handle.create_dataset("image_features", (len(records), num_boxes, dim), "f")
        boxes = handle.create_dataset("image_bb", (len(records), num_boxes, 4), "f")
        spatial = handle.create_dataset("spatial_features", (len(records), num_boxes, 6), "f")
        for index, record in enumerate(records):
            features[index], boxes[index] = record["features"], record["boxes"]
            spatial[index] = spatial_features(record)
    id_map = Path(path).with_name(Path(path).stem + "_imgid2idx.json")
    id_map.write_text(json.dumps({str(image_id): index for index, image_id in enumerate(image_ids)}))
    return Path(path), id_map


def spatial_features(record: dict) -> np.ndarray:
    """The converters' `spatial_features` from the TSV's boxes and the float image size."""
    boxes, (height, width) = record["boxes"], map(float, record["image_size"])
    x, y = boxes[:, 0] / width, boxes[:, 1] / height
    box_width, box_height = (boxes[:, 2] - boxes[:, 0]) / width, (boxes[:, 3] - boxes[:, 1]) / height
    return np.stack([x, y, x + box_width, y + box_height, box_width, box_height], axis=1)


def write_m2_hdf5_features(path: Path, image_ids, **options) -> tuple[Path, dict[str, tuple[int, int]]]:
    """The meshed-memory transformer's `coco_detections.hdf5` (`<id>_features`, `<id>_boxes`, `<id>_cls_prob`) and
    the image sizes the file does not store (pass them as the reader's `image_sizes`)."""
    import h5py

    sizes = {}
    with h5py.File(path, "w") as handle:
        for image_id in image_ids:
            record = region_record(image_id, **options)
            scores = np.full((len(record["boxes"]), NUM_OBJECT_CLASSES + 1), 1e-4, np.float32)
            scores[np.arange(len(scores)), record["object_ids"] + 1] = record["object_conf"]
            handle.create_dataset(f"{image_id}_features", data=record["features"])
            handle.create_dataset(f"{image_id}_boxes", data=record["boxes"])
            handle.create_dataset(f"{image_id}_cls_prob", data=scores)
            sizes[str(image_id)] = tuple(record["image_size"])
    return Path(path), sizes
