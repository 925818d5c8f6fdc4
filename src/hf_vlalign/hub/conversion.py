"""The strict state-dict load shared by the checkpoint converters: every source tensor finds its place, every target
tensor is set (except those the source never stores), shapes agree; otherwise one error names them all."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel


def load_converted_state(
    target: PreTrainedModel,
    converted: dict[str, torch.Tensor],
    source_name: str,
    target_name: str,
    is_not_stored: Callable[[str], bool],
) -> PreTrainedModel:
    """Loads `converted` (already renamed to the target's keys) into `target`, in eval mode.

    Args:
        source_name / target_name: how the error names the two sides (e.g. "LXMERT", "two-stream").
        is_not_stored: target keys the source has no tensor for (tied or newly initialised ones).
    """
    own = target.state_dict()
    unexpected = sorted(set(converted) - set(own))
    missing = sorted(key for key in set(own) - set(converted) if not is_not_stored(key))
    shapes = {
        key: (tuple(converted[key].shape), tuple(own[key].shape))
        for key in converted
        if key in own and converted[key].shape != own[key].shape
    }
    if unexpected or missing or shapes:
        raise ValueError(
            f"Cannot convert the {source_name} checkpoint: {source_name} tensors without a place {unexpected}, "
            f"{target_name} tensors left unset {missing}, shape mismatches ({source_name}, {target_name}) {shapes}."
        )
    with torch.no_grad():
        target.load_state_dict(converted, strict=False)
    return target.eval()
