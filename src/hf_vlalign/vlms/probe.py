"""Li et al.'s grounding probe on transformers patch models: every head of every layer as a phrase-grounding
classifier over the image patches. A head is right when the patch the phrase's last token attends to most is covered
by a gold box (coverage >= `coverage_threshold`); the baseline is the centre patch (patches have no detection
confidence).

The maps are read with transformers' eager attention (switched on while reading, restored afterwards), layer by layer:
a forward hook on each layer's attention module takes the rows of the query positions it needs out of the (B, H, N, N)
map the layer returns, and the map is freed with the layer, so memory holds one layer's map and the kept rows, never
every layer's maps (`output_attentions=True` keeps L of them: docs/vlms.md, "The explorer and the probe at real
sizes"). A forward hook registered on a layer's attention module before the reading sees (and may replace) that
layer's map first, as the planted-attention tests do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers.trainer_utils import unwrap_peft_model

from ..alignment.patches import DEFAULT_COVERAGE_THRESHOLD
from ..analysis.grounding_probe import GroundingProbe, GroundingProbeResult
from .families import PatchLayout, ViltFamily, forward_with_layout, patch_model_family

__all__ = ["eager_attention", "patch_attention_rows", "probe_patch_model", "read_attention_rows"]


@contextmanager
def eager_attention(model: nn.Module):
    """transformers' eager attention in the model's language part while inside (so that it returns its maps)."""
    family = patch_model_family(model)
    if isinstance(family, ViltFamily):
        yield
        return
    language_model = family.language_model(model)
    previous = language_model.config._attn_implementation
    language_model.set_attn_implementation("eager")
    try:
        yield
    finally:
        language_model.set_attn_implementation(previous)


def patch_attention_rows(attentions: tuple[torch.Tensor, ...], image_positions: torch.Tensor) -> torch.Tensor:
    """Per layer (B, H, Q, N) attention rows -> (L, B, H, Q, P): each row's attention on the image tokens (not
    re-normalised: its mass is the share on the image)."""
    maps = torch.stack(attentions)
    index = image_positions.to(maps.device)[None, :, None, None, :].expand(*maps.shape[:-1], image_positions.shape[-1])
    return maps.gather(-1, index)


def _rows_at(attention: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """(B, H, N, N) -> (B, H, Q, N): the rows at the (B, Q) query positions (None: every row)."""
    if positions is None:
        return attention
    index = positions.to(attention.device)[:, None, :, None].expand(-1, attention.shape[1], -1, attention.shape[-1])
    return attention.gather(2, index)


@torch.no_grad()
def read_attention_rows(
    model: nn.Module,
    batch: dict,
    query_positions: torch.Tensor | None,
    keep: Callable[[int, torch.Tensor], object] | None = None,
) -> tuple[object, PatchLayout, list]:
    """Runs `model` (unwrapped, in eval mode) once on a `PatchGroundingCollator` batch under eager attention and
    reads each layer's attention rows at `query_positions` (B, Q) (None: every row), as the layer returns them.

    Returns the outputs, the batch's `PatchLayout` and, per layer, `keep(layer, rows)` of its (B, H, Q, N) rows
    (default: the rows themselves). Memory holds one layer's (B, H, N, N) map at a time (freed with the layer) and what
    `keep` returns; ViLT, whose attention returns its map only with `output_attentions=True`, keeps its (small) maps
    in its outputs too."""
    family = patch_model_family(model)
    modules = family.attention_modules(model)
    keep = keep or (lambda layer, rows: rows)
    kept: list = [None] * len(modules)

    def reader(layer: int):
        def hook(module, args, output):
            if not isinstance(output, tuple) or len(output) < 2 or output[1] is None:
                raise ValueError(f"Layer {layer}'s attention ({type(module).__name__}) returned no attention map.")
            kept[layer] = keep(layer, _rows_at(output[1], query_positions))

        return hook

    handles = [module.register_forward_hook(reader(layer)) for layer, module in enumerate(modules)]
    kwargs = {"output_attentions": True} if isinstance(family, ViltFamily) else {}
    try:
        with eager_attention(model):
            outputs, layout = forward_with_layout(model, batch, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return outputs, layout, kept


def _to_device(batch: dict, device: torch.device) -> dict:
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


@torch.no_grad()
def probe_patch_model(
    model: nn.Module,
    batches: Iterable[dict],
    coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD,
    active_threshold: float = 0.2,
    active_heads_only: bool = True,
) -> GroundingProbeResult:
    """Runs the probe over `batches` of a `PatchGroundingCollator` (built with the same coverage threshold); `model`
    may be wrapped by peft (its adapters stay on). Only the phrases' last tokens' rows over the image tokens are kept
    of each layer: (L, B, H, phrases, P) per batch."""
    model = unwrap_peft_model(model)
    family = patch_model_family(model)
    modules = family.attention_modules(model)
    probe = GroundingProbe(
        len(modules), family.num_heads(model), coverage_threshold, active_threshold, active_heads_only, "centre_patch"
    )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for batch in tqdm(batches, desc="Grounding probe"):
            batch = _to_device(batch, device)
            # each phrase slot's row: its last token (padding slots read position 0 and are not scored)
            phrase_index = batch["phrase_token_index"]
            _, layout, rows = read_attention_rows(model, batch, phrase_index.clamp(min=0))
            rows = patch_attention_rows(rows, layout.image_positions)  # (L, B, H, K, P)
            slots = torch.arange(phrase_index.shape[1], device=phrase_index.device).expand_as(phrase_index)
            coverage = layout.to_tokens(batch["phrase_cell_coverage"])
            probe.update_from_text_to_region(
                rows, slots.masked_fill(phrase_index < 0, -1), coverage, layout.patch_mask,
                layout.centre_scores(),
            )  # fmt: skip
    finally:
        model.train(was_training)
    return probe.compute()
