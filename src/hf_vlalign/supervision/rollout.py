"""Semi-direct supervision: the direct loss applied to attention rollout (Abnar & Zuidema 2020) instead of raw heads."""

from __future__ import annotations

import torch

from .direct import normalise_rows, soft_cross_entropy


def attention_rollout(attention_probs: list[torch.Tensor], heads: list[int] | None = None) -> list[torch.Tensor]:
    """Rollout after each layer: A_l = rownorm(mean_h attn_l + I), R_l = A_l R_{l-1}, R_0 = I (Abnar & Zuidema, eq. 1).

    rownorm(A + I) equals their 0.5 A + 0.5 I for row-stochastic attention, the residual connection's share.

    Args:
        attention_probs: per layer, (B, H, N, N) attention probabilities (rows = queries).
        heads: heads averaged in each layer (default: all). Semi-direct supervision passes `supervised_heads` here:
            with a head subset, only those heads' flow is supervised (the rollout of Abnar & Zuidema uses all).
    Returns:
        per layer, (B, N, N) rollout up to and including that layer.
    """
    if not attention_probs:
        raise ValueError("`attention_probs` must hold at least one layer, got an empty list.")
    rollouts, rollout = [], None
    for probs in attention_probs:
        if probs.dim() != 4 or probs.shape[-1] != probs.shape[-2]:
            raise ValueError(f"`attention_probs` entries must have shape (B, H, N, N), got {tuple(probs.shape)}.")
        mixed = (probs if heads is None else probs[:, heads]).mean(dim=1)
        identity = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        layer_rollout = normalise_rows(mixed + identity)
        rollout = layer_rollout if rollout is None else layer_rollout @ rollout
        rollouts.append(rollout)
    return rollouts


def semi_direct_supervision_loss(
    rollouts: list[torch.Tensor],
    text_positions: slice,
    region_positions: slice,
    word_region_alignment: torch.Tensor,
    text_mask: torch.Tensor,
    region_mask: torch.Tensor,
) -> torch.Tensor:
    """Eqs. 6-8 on rollout: text->region rows re-normalised over regions and region->text rows re-normalised over
    words, cross-entropy with the gold alignment, averaged over the supervised layers, both directions summed."""
    region_target = normalise_rows(word_region_alignment.transpose(1, 2))
    losses = []
    for rollout in rollouts:
        text_to_region = rollout[:, text_positions, region_positions] * region_mask[:, None, :]
        region_to_text = rollout[:, region_positions, text_positions] * text_mask[:, None, :]
        log_t2r = torch.log(normalise_rows(text_to_region).clamp(min=1e-12))
        log_r2t = torch.log(normalise_rows(region_to_text).clamp(min=1e-12))
        losses.append(
            soft_cross_entropy(log_t2r, word_region_alignment) + soft_cross_entropy(log_r2t, region_target)
        )
    return torch.stack(losses).mean()
