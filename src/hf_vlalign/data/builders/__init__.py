"""Dataset builders: published annotation files -> Arrow-backed `datasets.Dataset`, one module per dataset.

`build_dataset(name, data_dir, split, region_features=None, **options)` is the one-liner. Each builder module has
`build(data_dir, split, **options) -> datasets.Dataset` and may have `store_image_ids(**options) -> (candidates,
id_columns)` when its image ids differ from the feature files' ids (see `_common.attach_region_features`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import datasets

from ..feature_store import RegionFeatureStore
from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    MISSING_IMAGE_CHOICES,
    VALIDATION_SPLITS,
    attach_region_features,
    check_on_missing_image,
    resolve_split,
)
from .user_data import USER_TASKS, UserData, UserDataError, build_user_dataset, load_user_data
from .vgp import ID_LABELS, VGPData, build_vgp_dataset, count_vgp_types, load_vgp_data

# dataset name -> its builder module
BUILDERS = {name: "refcoco" if name == "refcoco+" else name for name in VALIDATION_SPLITS}


def build_dataset(
    name: str,
    data_dir: str | Path | None,
    split: str,
    region_features: RegionFeatureStore | str | Path | None = None,
    *,
    iou_threshold: float = 0.5,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
    **options,
) -> datasets.Dataset:
    """Reads one split of a published dataset from its files as published (docs/datasets.md).

    Args:
        name: one of `BUILDERS`.
        data_dir: the folder holding the dataset's files (ignored by "synthetic_scenes", which generates them).
        split: the split in the dataset's own names; "validation" is its validation split (`VALIDATION_SPLITS`).
        region_features: a `RegionFeatureStore` (or its directory): rows then get `feature_row` and
            `<text>_phrase_regions` (`attach_region_features`, with `iou_threshold`).
        on_missing_image: for every image a row needs, in the annotation files and in `region_features`: "raise"
            or "skip".
        options: the builder's own options (see each `builders/<name>.py`).
    """
    if name not in BUILDERS:
        raise ValueError(f"`name` must be one of {sorted(BUILDERS)}, got {name!r}.")
    split = resolve_split(name, split)
    check_on_missing_image(on_missing_image)
    builder = importlib.import_module(f".{BUILDERS[name]}", __name__)
    policy = {"on_missing_image": on_missing_image} if name != "nlvr2" else {}
    dataset = builder.build(data_dir, split, **policy, **options)
    if region_features is None:
        return dataset
    store = region_features if isinstance(region_features, RegionFeatureStore) else RegionFeatureStore.load(region_features)
    if hasattr(builder, "attach_pair_features") and "right_image_id" in dataset.column_names:  # NLVR2: two images
        return builder.attach_pair_features(dataset, store, on_missing_image=on_missing_image)
    candidates, id_columns = (None, ("image_id",))
    if hasattr(builder, "store_image_ids"):
        candidates, id_columns = builder.store_image_ids(**options)
    return attach_region_features(
        dataset,
        store,
        store_image_ids=candidates,
        id_columns=id_columns,
        iou_threshold=iou_threshold,
        on_missing_image=on_missing_image,
        source=f"{name} {split}",
    )


__all__ = [
    "BUILDERS",
    "DEFAULT_ON_MISSING_IMAGE",
    "ID_LABELS",
    "MISSING_IMAGE_CHOICES",
    "USER_TASKS",
    "UserData",
    "UserDataError",
    "VALIDATION_SPLITS",
    "VGPData",
    "attach_region_features",
    "build_dataset",
    "build_user_dataset",
    "build_vgp_dataset",
    "count_vgp_types",
    "load_user_data",
    "load_vgp_data",
    "resolve_split",
]
