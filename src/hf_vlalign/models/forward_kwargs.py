"""What every forward checks first, before any other validation: the keyword arguments of its `**kwargs` it acts on
(transformers-5's output flags, as in modeling_bert.py, and `validate_inputs`), with a clear error for any other name
so that a misspelt argument is not silently ignored, and a batch of at least one example. Both are checks of names and
shapes: they read no tensor value."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn

from ..utils.validation import checks_values

# the keyword arguments every family reads; `return_dict` is taken by `@can_return_tuple` / `@capture_outputs` before.
# `validate_inputs` (bool, optional): True checks the values of the inputs wherever they are (on an accelerator, a
# host read), False skips those checks; None checks them on the CPU in eager mode only (`utils.validation.checks_values`)
FORWARD_KWARGS = frozenset({"output_attentions", "output_hidden_states", "validate_inputs"})


def check_forward_kwargs(
    model: nn.Module, kwargs: Mapping[str, Any], supported: Collection[str] = FORWARD_KWARGS
) -> None:
    """Raises a TypeError naming every keyword argument of `model.forward`'s `**kwargs` that it does not act on."""
    unexpected = sorted(set(kwargs) - set(supported))
    if unexpected:
        raise TypeError(
            f"{type(model).__name__}.forward() got unexpected keyword argument(s) {unexpected}: besides its named "
            f"arguments it takes {sorted(supported)} and `return_dict`."
        )


def output_flag(name: str, kwargs: Mapping[str, Any], config: Any) -> bool:
    """`kwargs[name]` when given (not None), else the config's default, the precedence of transformers' models."""
    value = kwargs.get(name)
    return bool(value if value is not None else getattr(config, name, False))


def check_batch_not_empty(model: nn.Module, name: str, tensor: torch.Tensor | None) -> None:
    """Raises a ValueError naming the argument `name` when `tensor` holds no example (batch size 0): its losses would
    be averages over nothing, and transformers' own models fail on it deep inside attention, naming no argument."""
    if isinstance(tensor, torch.Tensor) and tensor.ndim > 0 and tensor.shape[0] == 0:
        raise ValueError(
            f"`{name}` has batch size 0 (shape {tuple(tensor.shape)}): {type(model).__name__} needs at least one "
            "example; leave empty batches out before calling the model."
        )


def check_head_call(model: nn.Module, input_ids: torch.Tensor, kwargs: Mapping[str, Any]) -> bool:
    """The first checks of a task head's forward (its keyword arguments, a non-empty batch); returns whether it checks
    the values of its inputs ([`~hf_vlalign.utils.validation.checks_values`])."""
    check_forward_kwargs(model, kwargs)
    check_batch_not_empty(model, "input_ids", input_ids)
    return checks_values(model.config, input_ids, kwargs.get("validate_inputs"))
