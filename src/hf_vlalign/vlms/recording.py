"""Records the query / key projections of chosen attention layers of a transformers patch model during its forward,
so that the supervision can compute the logits it needs while every layer keeps the attention implementation the
model was loaded with (`eager`, `sdpa`, flash attention, `flex_attention`, a kernel registered in `AttentionInterface`).

LLaVA / PaliGemma: a layer's attention module looks its function up at each call with
`ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)`, a mapping whose own
(instance) entries come before the registered ones, "eager" included. Inside the recorder, the entry of the language
model's implementation name in that instance (the one its modeling file uses) is shadowed by a wrapper that runs the
same function (for "eager", the attention module's modeling file's `eager_attention_forward`) and keeps the query, key
(after RoPE, before `repeat_kv`) and mask of the recorded layers; on exit, also on an exception, the entry is restored.
Why not a wrapper registered under a name of its own: switching `_attn_implementation` to it would change what
transformers picks by that name (the mask function of `AttentionMaskInterface`, its "flash" checks), and a
gradient-checkpointing recomputation, run in backward after the switch is undone, would run another code path than the
forward. Here the config is never changed: the model builds the masks its implementation expects, and the other
layers, the vision tower and the recomputation run the user's kernel unchanged (the recomputation, outside the
recorder, records nothing). While inside, every model of the process under that name goes through the wrapper, which
records only the recorders' own layers.

The recorded masks are what the supervision reads (`supervision._allowed`): None, bool or additive (B, 1, N, N). A
flash-style padding mask (None or 2-D, the kernel being causal) is recorded as None: the supervision then applies the
causal pattern over the batch's `attention_mask`. A `flex_attention` `BlockMask` is recorded as its dense bool mask.
`check_recordable` refuses, with the implementation's name, what cannot give the mask the model applied: a name with no
mask function registered in `AttentionMaskInterface` (its layers get no mask at all), and a flash-style one on
PaliGemma (it drops the prefix-LM bidirectional attention over image and prefix).

ViLT (eager, inline attention): forward hooks on each recorded `ViltSelfAttention.query` / `.key`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from contextvars import ContextVar

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_mask
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .families import ViltFamily, patch_model_family

__all__ = ["AttentionRecorder", "check_recordable"]

_active_recorders: ContextVar[tuple[AttentionRecorder, ...]] = ContextVar("hf_vlalign_active_recorders", default=())
# (id(interface), name) -> [interface, its own entry of `name` before (None: none), recorders inside]
_installed: dict[tuple[int, str], list] = {}


@functools.cache
def _from_modeling_file(module_class: type, name: str):
    """`name` in the modeling file of the attention module's class (FSDP2 wraps a module in a subclass of its own)."""
    for cls in module_class.__mro__:
        value = getattr(sys.modules[cls.__module__], name, None)
        if value is not None:
            return value
    return None


def _attention_interface(module: nn.Module):
    """The `AttentionInterface` instance the module's modeling file looks its attention function up in."""
    return _from_modeling_file(type(module), "ALL_ATTENTION_FUNCTIONS") or ALL_ATTENTION_FUNCTIONS


def _eager_function(module: nn.Module):
    """transformers' eager attention of the module's own modeling file (the default of its `get_interface` call)."""
    function = _from_modeling_file(type(module), "eager_attention_forward")
    if function is None:
        raise ValueError(
            f"{type(module).__name__} runs `eager` attention, but its modeling file {type(module).__module__} has no "
            "`eager_attention_forward` for the recorder to run."
        )
    return function


class _RecordingAttention:
    """The attention function registered under one name, wrapped: offers each call's query, key and mask to the
    active recorders (each keeps its own layers), then runs the function itself."""

    def __init__(self, function) -> None:
        self.function = function  # None for "eager": each module's own modeling file's function

    def __call__(self, module: nn.Module, query, key, value, attention_mask, **kwargs):
        for recorder in _active_recorders.get():
            recorder.record(module, query, key, attention_mask, kwargs.get("scaling"))
        function = self.function if self.function is not None else _eager_function(module)
        return function(module, query, key, value, attention_mask, **kwargs)


def _install(interface, name: str) -> None:
    slot = (id(interface), name)
    if slot not in _installed:
        own_entry = interface._local_mapping.get(name)
        original = None if name == "eager" else interface.get_interface(name, None)
        _installed[slot] = [interface, own_entry, 0]
        interface[name] = _RecordingAttention(original)
    _installed[slot][2] += 1


def _uninstall(interface, name: str) -> None:
    slot = (id(interface), name)
    _installed[slot][2] -= 1
    if _installed[slot][2] == 0:
        _, own_entry, _ = _installed.pop(slot)
        if own_entry is None:
            del interface[name]
        else:
            interface[name] = own_entry


# the families whose language model attends bidirectionally somewhere (the mask a padding-only kernel cannot apply)
BIDIRECTIONAL_FAMILIES = {
    "paligemma": "PaliGemma's bidirectional attention over the image and prefix",
    "gemma3": "Gemma 3's bidirectional attention inside each image (`token_type_ids`)",
}


def check_recordable(model: nn.Module) -> None:
    """Raises a ValueError naming the language model's attention implementation when the recorder cannot give the
    supervision the mask that implementation applies (see the module docstring); ViLT is always recordable."""
    family = patch_model_family(model)
    if isinstance(family, ViltFamily):
        return
    implementation = family.language_model(model).config._attn_implementation
    # transformers gives a layer no mask for a name without a mask function (`masking_utils._preprocess_mask_arguments`)
    if implementation not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        raise ValueError(
            f"The attention implementation {implementation!r} of the {family.name} language model has no mask "
            "function registered in transformers' `AttentionMaskInterface`: its layers get no attention mask, so the "
            "supervision cannot know which keys each query saw. Register the mask your kernel applies, e.g. "
            f"`AttentionMaskInterface.register({implementation!r}, sdpa_mask)`."
        )
    if family.name in BIDIRECTIONAL_FAMILIES and ALL_MASK_ATTENTION_FUNCTIONS[implementation] is flash_attention_mask:
        raise ValueError(
            f"The attention implementation {implementation!r} takes flash attention's padding-only mask, which drops "
            f"{BIDIRECTIONAL_FAMILIES[family.name]}: load the model with `eager`, `sdpa`, `flex_attention` or a kernel "
            "taking a 4-D mask."
        )


def _recorded_mask(mask, query: torch.Tensor) -> torch.Tensor | None:
    """The mask a layer was given, in a form the supervision reads: None, bool or additive (B, 1, N, N)."""
    if isinstance(mask, BlockMask):
        query_length, key_length = mask.seq_lengths
        return create_mask(mask.mask_mod, query.shape[0], 1, query_length, key_length, device=query.device)
    if mask is not None and mask.dim() == 2:  # flash attention's padding mask: a causal kernel over the real keys
        return None
    return mask


class AttentionRecorder:
    """Context manager: inside it, forwards of `model` record `queries[layer]` (B, H, N, d), `keys[layer]`
    (B, H_kv, N, d), `masks[layer]` (the attention mask the layer was given, None for a plain causal / full one) and
    `scaling` for every layer of `layers` (default: all), every layer running the model's own attention
    implementation. Under gradient checkpointing, run the backward after leaving the context (as the trainer does):
    the recomputation then runs the same function and records nothing. Reentrant checkpointing runs the forward
    without gradients, so what it records carries none (`PatchSupervisionTrainingArguments` refuses it).

    Example:
        ```python
        with AttentionRecorder(model, layers=[2, 3]) as recorder:
            outputs = model(**inputs)
        logits = recorder.queries[3] @ recorder.keys[3].transpose(-1, -2) * recorder.scaling
        ```
    """

    def __init__(self, model: nn.Module, layers: Sequence[int] | None = None) -> None:
        check_recordable(model)
        self.family = patch_model_family(model)
        modules = self.family.attention_modules(model)
        if layers is None:
            layers = range(len(modules))
        self.model = model
        self._first_attention = modules[0]
        self.layers = sorted(set(layers))
        self._layer_of = {modules[layer]: layer for layer in self.layers}
        self.queries: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}
        self.masks: dict[int, torch.Tensor | None] = {}
        self.scaling: float | None = None
        self._hooks: list = []
        self._token = None
        self._installed: tuple | None = None

    def clear(self) -> None:
        self.queries, self.keys, self.masks = {}, {}, {}

    def record(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, mask, scaling: float | None) -> None:
        layer = self._layer_of.get(module)
        if layer is None:
            return
        self.queries[layer], self.keys[layer] = query, key
        self.masks[layer] = _recorded_mask(mask, query)
        self.scaling = scaling if scaling is not None else query.shape[-1] ** -0.5

    def _vilt_hook(self, module: nn.Module, layer: int, kind: str):
        heads = module.num_attention_heads

        def hook(_linear, _inputs, output):
            batch, length, _ = output.shape
            projected = output.view(batch, length, heads, -1).transpose(1, 2)
            (self.queries if kind == "query" else self.keys)[layer] = projected
            self.masks[layer] = None
            self.scaling = projected.shape[-1] ** -0.5

        return hook

    def __enter__(self) -> AttentionRecorder:
        self.clear()
        if isinstance(self.family, ViltFamily):
            for module, layer in self._layer_of.items():
                self._hooks.append(module.query.register_forward_hook(self._vilt_hook(module, layer, "query")))
                self._hooks.append(module.key.register_forward_hook(self._vilt_hook(module, layer, "key")))
        else:
            module = self._first_attention
            self._installed = (_attention_interface(module), module.config._attn_implementation)
            _install(*self._installed)
            self._token = _active_recorders.set((*_active_recorders.get(), self))
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._token is not None:
            _active_recorders.reset(self._token)
            self._token = None
            _uninstall(*self._installed)
            self._installed = None
