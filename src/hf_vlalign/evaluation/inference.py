"""The one batched inference loop of the library: every evaluation runner, the task metrics of the examples and the
analyses walk a dataset through `inference_batches`, which owns the batching (the rows a `DataLoader` with a sequential
sampler would give, in order), the device placement and the keys that never reach a model's `forward`."""

from __future__ import annotations

import inspect
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..data.collators import PROBE_KEYS
from ..trainers.base import collate_with_seed
from ..utils.size_limits import MAX_ANALYSIS_EXAMPLES, check_size

logger = logging.get_logger(__name__)

# what collators add for evaluation only: the grounding probe's targets and a captioner's reference captions
NON_MODEL_KEYS = (*PROBE_KEYS, "references")


@dataclass
class InferenceBatch:
    """One batch of an inference pass: its rows, the collated batch, and the model's inputs and probe targets on the
    model's device."""

    index: int
    rows: list[Any]
    batch: dict[str, Any]
    inputs: dict[str, Any]
    targets: dict[str, torch.Tensor]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (where its inputs go)."""
    return next(model.parameters()).device


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def split_batch(
    batch: Mapping[str, Any],
    device: torch.device,
    exclude: Collection[str] = (),
    accepted: Collection[str] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(forward's inputs, probe targets) of a collated batch, on `device`: the inputs leave out `NON_MODEL_KEYS`,
    `exclude` and, when given, every key not in `accepted` (the names `forward` takes)."""
    inputs = {
        key: _to(value, device)
        for key, value in batch.items()
        if key not in NON_MODEL_KEYS and key not in exclude and (accepted is None or key in accepted)
    }
    targets = {key: batch[key].to(device) for key in PROBE_KEYS if key in batch}
    return inputs, targets


def first_examples(rows: Sequence[Any], max_examples: int | None, description: str, argument: str = "max_examples"):
    """The first `max_examples` of `rows` (a `datasets.Dataset` or a list; None: all); a count larger than `rows` is
    said in a warning, so the caller reports `len()` of the result as the count used."""
    if max_examples is None:
        return rows
    check_size(argument, max_examples, MAX_ANALYSIS_EXAMPLES, limit_name="MAX_ANALYSIS_EXAMPLES")
    if max_examples > len(rows):
        logger.warning(f"`{argument}` {max_examples} is more than the {len(rows)} examples of {description}: using {len(rows)}.")
        return rows
    return rows.select(range(max_examples)) if hasattr(rows, "select") else rows[:max_examples]


def _rows(dataset: Sequence[Any], indices: list[int]) -> list[Any]:
    """The rows at `indices`, fetched as torch's `DataLoader` fetches a batch (`__getitems__` where a dataset has it)."""
    getitems = getattr(dataset, "__getitems__", None)
    return getitems(indices) if getitems else [dataset[index] for index in indices]


def inference_batches(
    model: torch.nn.Module,
    dataset: Sequence[Any],
    collator: Callable[[list[Any]], Mapping[str, Any]],
    batch_size: int,
    *,
    exclude: Collection[str] = (),
    forward_arguments_only: bool = False,
    seed: int | None = None,
    description: str = "inference",
    progress: bool = False,
) -> Iterator[InferenceBatch]:
    """Walks `dataset` in order, `batch_size` rows at a time, collated by `collator` and split by `split_batch` onto
    the model's device. With `seed`, each batch is collated under random states seeded from (seed, batch index), so a
    random collator (pre-training masks) gives the same batch in every pass. `forward_arguments_only` keeps the keys
    `model.forward` names. The caller owns `torch.no_grad()` and the model's train/eval mode."""
    accepted = set(inspect.signature(model.forward).parameters) if forward_arguments_only else None
    device = model_device(model)
    starts = range(0, len(dataset), batch_size)
    for index, start in enumerate(tqdm(starts, desc=description, disable=not progress)):
        rows = _rows(dataset, list(range(start, min(start + batch_size, len(dataset)))))
        batch = collator(rows) if seed is None else collate_with_seed(collator, rows, (seed, index))
        inputs, targets = split_batch(batch, device, exclude, accepted)
        yield InferenceBatch(index=index, rows=rows, batch=batch, inputs=inputs, targets=targets)
