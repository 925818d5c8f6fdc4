"""The transformers-5 keyword arguments of every forward (`**kwargs: Unpack[TransformersKwargs]`, as in
modeling_bert.py): which of them the models act on, and a clear error for any other name, so that a misspelt argument
is not silently ignored."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from torch import nn

# the output flags every family reads; `return_dict` is taken by `@can_return_tuple` / `@capture_outputs` before
OUTPUT_FLAGS = frozenset({"output_attentions", "output_hidden_states"})


def check_forward_kwargs(
    model: nn.Module, kwargs: Mapping[str, Any], supported: Collection[str] = OUTPUT_FLAGS
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
