"""The strict state-dict load shared by the checkpoint converters: every source tensor finds its place, every target
tensor is set (except those the source never stores), shapes agree; otherwise one error names them all. And the check
of a conversion's output folder, run before the source is read."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel
from transformers.utils import CONFIG_NAME

from ..utils.output_paths import refuse_foreign_folder, refuse_output_overlapping_inputs


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


def is_library_model_folder(folder: Path) -> bool:
    """Whether `folder` holds a checkpoint of an hf_vlalign family: a `config.json` whose `model_type` is one of the
    families' (what `hf-vlalign convert` and `save_pretrained` write)."""
    from ..models.family import FAMILIES

    try:
        config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    model_types = {spec.model_type for spec in FAMILIES.values()}
    return isinstance(config, dict) and config.get("model_type") in model_types


def check_conversion_output(
    out: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None], *, overwrite: bool, output_argument: str = "out"
) -> None:
    """Before a conversion reads anything: `out` is none of `inputs` (the source checkpoint, the tokenizer; Hub ids
    pass), nor inside or around one; an existing non-empty `out` is replaced only with `overwrite` and only when it
    holds an hf_vlalign checkpoint (`save_pretrained` keeps the other files of that folder)."""
    refuse_output_overlapping_inputs(out, inputs, output_argument=output_argument)
    path = Path(os.path.expanduser(os.fspath(out)))
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(
            f"`{output_argument}` {os.fspath(out)} already holds files; pass --overwrite (overwrite=True) to replace the "
            "checkpoint there."
        )
    refuse_foreign_folder(path, output_argument, description="an hf_vlalign checkpoint", is_own=is_library_model_folder)
