"""Per-dimension mean and standard deviation of region features, for the models' feature standardisation
(`config.visual_feature_normalization="standardize"`):

    model.set_visual_feature_statistics(*region_feature_statistics(store, train_rows))

Exact over every region of the chosen images, accumulated in float64 chunk by chunk (Chan et al.'s pairwise update).
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import torch

from .feature_store import RegionFeatureStore

# columns that `build_dataset(..., region_features=store)` joins: a row's store row, or both rows of an NLVR2 pair
ROW_COLUMNS = ("feature_row", "left_feature_row", "right_feature_row")
CHUNK_IMAGES = 256
# a dimension whose std is below this fraction of the largest std is constant: it keeps std 1 (x - mean is 0 anyway)
CONSTANT_DIMENSION = 1e-6


def store_rows_of(store: RegionFeatureStore, images: datasets.Dataset | Sequence[str | int] | None) -> list[int]:
    """The distinct store rows of `images`: None (every image of the store), a dataset joined to the store (its
    `feature_row` / `left_feature_row` / `right_feature_row` columns, else its `image_id` column), or a sequence of
    store image ids or store rows."""
    if images is None:
        return list(range(len(store)))
    if isinstance(images, datasets.Dataset):
        columns = [column for column in ROW_COLUMNS if column in images.column_names]
        if columns:
            values = [value for column in columns for value in images[column]]
        elif "image_id" in images.column_names:
            values = list(images["image_id"])
        else:
            raise ValueError(
                f"`images` must be joined to the store (a `feature_row` column: build_dataset(..., region_features=store)) or "
                f"have an `image_id` column, got the columns {images.column_names}."
            )
    elif isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
        raise ValueError(f"`images` must be a datasets.Dataset, a sequence of image ids or store rows, or None; got {type(images).__name__}.")
    else:
        values = list(images)
    rows = set()
    for value in values:
        if value is None:
            raise ValueError("`images` holds a row without a store row (None); join the dataset to this store first.")
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if not 0 <= int(value) < len(store):
                raise ValueError(f"`images`: store row {value} is outside the store's {len(store)} rows.")
            rows.add(int(value))
        elif isinstance(value, str):
            if value not in store:
                raise ValueError(f"`images`: image {value!r} is not in the region-feature store {store.directory}.")
            rows.add(store.row_of(value))
        else:
            raise ValueError(f"`images` must hold store image ids (str) or store rows (int), got {type(value).__name__}.")
    if not rows:
        raise ValueError("`images` is empty; the feature statistics need at least one image.")
    return sorted(rows)


def region_feature_statistics(
    store: RegionFeatureStore,
    images: datasets.Dataset | Sequence[str | int] | None = None,
    *,
    max_images: int | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(mean, std, num_regions): float32 (D,) tensors over every region of `images` (see `store_rows_of`) and how many
    regions they come from. `max_images` keeps a seeded random subset of that many images (None: all)."""
    if not isinstance(store, RegionFeatureStore):
        raise ValueError(f"`store` must be a RegionFeatureStore, got {type(store).__name__}.")
    rows = store_rows_of(store, images)
    if max_images is not None:
        if not isinstance(max_images, int) or isinstance(max_images, bool) or max_images < 1:
            raise ValueError(f"`max_images` must be None or an int >= 1, got {max_images!r}.")
        if max_images < len(rows):
            rows = sorted(np.random.default_rng(seed).choice(rows, size=max_images, replace=False).tolist())
    count, mean, m2 = 0, np.zeros(store.feature_dim), np.zeros(store.feature_dim)
    for start in range(0, len(rows), CHUNK_IMAGES):
        chunk = [store.image_at(row, without=("boxes", "object_ids", "object_conf", "attr_ids", "attr_conf"))["features"] for row in rows[start : start + CHUNK_IMAGES]]
        values = torch.cat(chunk).numpy().astype(np.float64)  # a store's image has at least one region
        chunk_count, chunk_mean = len(values), values.mean(0)
        chunk_m2 = ((values - chunk_mean) ** 2).sum(0)
        delta, total = chunk_mean - mean, count + chunk_count
        mean = mean + delta * chunk_count / total
        m2 = m2 + chunk_m2 + delta**2 * count * chunk_count / total
        count = total
    std = np.sqrt(m2 / count)
    std = np.where(std > CONSTANT_DIMENSION * max(float(std.max()), 1e-30), std, 1.0)
    return torch.from_numpy(mean.astype(np.float32)), torch.from_numpy(std.astype(np.float32)), int(count)


__all__ = ["region_feature_statistics", "store_rows_of"]
