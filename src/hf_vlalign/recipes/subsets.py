"""The rows of a split that a run reads: the first N (`--max_train_samples`, `--max_eval_samples`), or a seeded sample
(`--eval_subset_size`)."""

from __future__ import annotations

import datasets
import numpy as np
from transformers.utils import logging

logger = logging.get_logger(__name__)


def first_rows(dataset: datasets.Dataset, count: int | None) -> datasets.Dataset:
    """The first `count` rows (`--max_train_samples` / `--max_eval_samples`); all of them for None. A `count` larger
    than the split is said in a warning (the run reads the whole split)."""
    if count is not None and count > len(dataset):
        logger.warning(
            f"`--max_train_samples` / `--max_eval_samples` {count} is more than the {len(dataset)} rows of the split: "
            f"using {len(dataset)}."
        )
    return dataset if count is None else dataset.select(range(min(count, len(dataset))))


def evaluation_subset(
    dataset: datasets.Dataset | list, size: int | None, seed: int, argument: str = "--eval_subset_size"
) -> datasets.Dataset | list:
    """The rows the evaluations during training read (`--eval_subset_size`): a sample of `size` rows drawn with
    `seed` and kept in their original order, or every row when `size` is None or not smaller than the split."""
    if size is None or size >= len(dataset):
        return dataset
    if size < 1:
        raise ValueError(f"`{argument}` must be a number of rows >= 1, got {size}.")
    rows = sorted(np.random.default_rng(seed).choice(len(dataset), size=size, replace=False).tolist())
    return dataset.select(rows) if isinstance(dataset, datasets.Dataset) else [dataset[i] for i in rows]
