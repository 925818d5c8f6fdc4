"""Li et al.'s grounding probe on transformers patch models: every head of every layer as a phrase-grounding
classifier over the image patches. A head is right when the patch the phrase's last token attends to most is covered
by a gold box (coverage >= `coverage_threshold`); the baseline is the centre patch (patches have no detection
confidence). The maps are read with transformers' eager attention, switched on for the probe and restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers.trainer_utils import unwrap_peft_model

from ..alignment.patches import DEFAULT_COVERAGE_THRESHOLD
from ..analysis.grounding_probe import GroundingProbe, GroundingProbeResult
from .families import ViltFamily, forward_with_layout, patch_model_family

__all__ = ["eager_attention", "patch_attention_rows", "probe_patch_model"]


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
    """Per layer (B, H, N, N) maps -> (L, B, H, N, P): every position's attention on the image tokens (not
    re-normalised: its mass is the share on the image)."""
    maps = torch.stack(attentions)
    index = image_positions.to(maps.device)[None, :, None, None, :].expand(*maps.shape[:-1], image_positions.shape[-1])
    return maps.gather(-1, index)


@torch.no_grad()
def probe_patch_model(
    model: nn.Module,
    batches: Iterable[dict],
    coverage_threshold: float = DEFAULT_COVERAGE_THRESHOLD,
    active_threshold: float = 0.2,
    active_heads_only: bool = True,
) -> GroundingProbeResult:
    """Runs the probe over `batches` of a `PatchGroundingCollator` (built with the same coverage threshold); `model`
    may be wrapped by peft (its adapters stay on)."""
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
        with eager_attention(model):
            for batch in tqdm(batches, desc="Grounding probe"):
                batch = {
                    key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()
                }
                outputs, layout = forward_with_layout(model, batch, output_attentions=True)
                rows = patch_attention_rows(outputs.attentions, layout.image_positions)
                coverage = layout.to_tokens(batch["phrase_cell_coverage"])
                probe.update_from_text_to_region(
                    rows, batch["phrase_token_index"], coverage, layout.patch_mask, layout.centre_scores()
                )
    finally:
        model.train(was_training)
    return probe.compute()
