"""Records the query / key projections of chosen attention layers of a transformers patch model during its forward,
so that the supervision can compute the logits it needs while the model keeps `sdpa` (which returns no attention).

LLaVA / PaliGemma: the recorder registers `hf_vlalign_sdpa` in transformers' `AttentionInterface`, which runs
transformers' own `sdpa_attention_forward` and keeps the query, key (after RoPE, before `repeat_kv`) and mask of the
recorded layers; the language model's `_attn_implementation` is restored afterwards. ViLT (eager, inline attention):
forward hooks on each recorded `ViltSelfAttention.query` / `.key`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .families import ViltFamily, patch_model_family

__all__ = ["RECORDING_ATTENTION", "AttentionRecorder"]

RECORDING_ATTENTION = "hf_vlalign_sdpa"

_active_recorder: ContextVar[AttentionRecorder | None] = ContextVar("hf_vlalign_active_recorder", default=None)


def _recording_sdpa(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention; the active recorder keeps `query`, `key` and the mask of its layers."""
    recorder = _active_recorder.get()
    if recorder is not None:
        recorder.record(module, query, key, attention_mask, kwargs.get("scaling"))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


class AttentionRecorder:
    """Context manager: inside it, forwards of `model` record `queries[layer]` (B, H, N, d), `keys[layer]`
    (B, H_kv, N, d), `masks[layer]` (the attention mask the layer was given, None for a plain causal / full one) and
    `scaling` for every layer of `layers` (default: all).

    Example:
        ```python
        with AttentionRecorder(model, layers=[2, 3]) as recorder:
            outputs = model(**inputs)
        logits = recorder.queries[3] @ recorder.keys[3].transpose(-1, -2) * recorder.scaling
        ```
    """

    def __init__(self, model: nn.Module, layers: Sequence[int] | None = None) -> None:
        self.family = patch_model_family(model)
        modules = self.family.attention_modules(model)
        if layers is None:
            layers = range(len(modules))
        self.model = model
        self.layers = sorted(set(layers))
        self._layer_of = {modules[layer]: layer for layer in self.layers}
        self.queries: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}
        self.masks: dict[int, torch.Tensor | None] = {}
        self.scaling: float | None = None
        self._hooks: list = []
        self._token = None
        self._previous_implementation: str | None = None

    def clear(self) -> None:
        self.queries, self.keys, self.masks = {}, {}, {}

    def record(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, mask, scaling: float | None) -> None:
        layer = self._layer_of.get(module)
        if layer is None:
            return
        self.queries[layer], self.keys[layer], self.masks[layer] = query, key, mask
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
            if RECORDING_ATTENTION not in AttentionInterface._global_mapping:
                AttentionInterface.register(RECORDING_ATTENTION, _recording_sdpa)
                AttentionMaskInterface.register(RECORDING_ATTENTION, sdpa_mask)
            language_model = self.family.language_model(self.model)
            self._previous_implementation = language_model.config._attn_implementation
            language_model.set_attn_implementation(RECORDING_ATTENTION)
            self._token = _active_recorder.set(self)
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._token is not None:
            _active_recorder.reset(self._token)
            self._token = None
            self.family.language_model(self.model).set_attn_implementation(self._previous_implementation)
