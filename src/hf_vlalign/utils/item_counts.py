"""Losses that are means over a variable number of items, normalised by the global count: `None` is the batch's own
count; given (a model's `global_item_counts`, summed over micro-batches and processes as transformers'
`num_items_in_batch`), the shards' losses sum to the loss of the global batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def count_labeled(labels: torch.Tensor | None, ignore_index: int = -100) -> torch.Tensor:
    """Number of entries of `labels` that are not `ignore_index` (0 when `labels` is None)."""
    if labels is None:
        return torch.zeros((), dtype=torch.long)
    return (labels != ignore_index).sum()


def count_true(mask: torch.Tensor | None) -> torch.Tensor:
    """Number of non-zero entries of `mask` (0 when `mask` is None)."""
    if mask is None:
        return torch.zeros((), dtype=torch.long)
    return mask.bool().sum()


def item_count(local_count: torch.Tensor | int, num_items: torch.Tensor | int | None) -> torch.Tensor | int:
    """The count a loss divides by: the global `num_items` when given, else the batch's own `local_count`."""
    return local_count if num_items is None else num_items


def mean_over_items(total: torch.Tensor, count: torch.Tensor | int) -> torch.Tensor:
    """`total / count`, and `total` itself (a zero that keeps the graph) when there is no item."""
    if isinstance(count, torch.Tensor):
        return total / count.to(device=total.device, dtype=total.dtype).clamp(min=1)
    return total / max(count, 1)


def num_items(counts: Mapping[str, torch.Tensor] | None, key: str) -> torch.Tensor | None:
    """`counts[key]` of a model's `global_item_counts`, or None (the batch's own count) when no counts are given."""
    if counts is None:
        return None
    if key not in counts:
        raise ValueError(
            f"`global_item_counts` must hold a count for {key!r} (the keys of the model's `loss_item_counts`), got "
            f"the keys {sorted(counts)}."
        )
    return counts[key]


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, num_items: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy summed over the labels that are not -100 and divided by their number, or by the global
    `num_items` when given; 0 (in the graph) when no label counts. Integer labels of any width (int32, uint8) are
    read as int64, the class indices `cross_entropy` takes."""
    total = nn.functional.cross_entropy(logits, labels.long(), reduction="sum")
    return mean_over_items(total, item_count(count_labeled(labels), num_items))


def optional_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor | None, counts: Mapping[str, torch.Tensor] | None, key: str
) -> torch.Tensor | None:
    """[`mean_cross_entropy`] of `labels` with the count under `key` of `counts` (the model's `global_item_counts`);
    None without labels, 0 (in the graph) when no label counts: whether one does is not read on the host, so every
    step of a run, and every process, returns the same components."""
    if labels is None:
        return None
    return mean_cross_entropy(logits, labels, num_items(counts, key))


__all__ = [
    "count_labeled",
    "count_true",
    "item_count",
    "mean_cross_entropy",
    "mean_over_items",
    "num_items",
    "optional_cross_entropy",
]
