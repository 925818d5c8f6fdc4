"""Semi-direct supervision: the direct loss applied to attention rollout (Abnar & Zuidema 2020) instead of raw heads."""

from __future__ import annotations

import torch

from .direct import normalise_rows, select_heads, soft_cross_entropy


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
    rollouts, rollout = [], None
    for probs in attention_probs:
        mixed = select_heads(probs, heads).mean(dim=1)
        identity = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        layer_rollout = normalise_rows(mixed + identity)
        rollout = layer_rollout if rollout is None else layer_rollout @ rollout
        rollouts.append(rollout)
    return rollouts


def cross_modal_rollout(cross_layer_probs: list[dict[str, torch.Tensor]], heads: list[int] | None = None) -> list[torch.Tensor]:
    """Rollout through two-stream cross-modality layers over the joint sequence [words; regions] (N = T + R).

    Each cross layer has two residual sub-layers, rolled out in order (Abnar & Zuidema, eq. 1, per sub-layer):
    the cross-attention C = [[0, A_l->v], [A_v->l, 0]] (both directions read the layer's inputs) and the
    self-attention S = blockdiag(A_l->l, A_v->v); the layer's rollout is rownorm(S + I) rownorm(C + I).
    Our reading for the two-stream model: the rollout starts at the input of the cross-modality encoder (R_0 = I),
    because the single-modality stacks mix nothing across modalities.

    Args:
        cross_layer_probs: per cross layer, the probabilities "language_to_vision" (B, H, T, R), "vision_to_language"
            (B, H, R, T), "language_self" (B, H, T, T) and "vision_self" (B, H, R, R).
        heads: heads averaged in each sub-layer (default: all).
    Returns:
        per cross layer, (B, N, N) rollout up to and including that layer.
    """
    rollouts, rollout = [], None
    for probs in cross_layer_probs:
        mixed = {name: select_heads(p, heads).mean(dim=1) for name, p in probs.items()}
        text_length = mixed["language_self"].shape[-1]
        self_block = _block_diagonal(mixed["language_self"], mixed["vision_self"])
        cross = torch.zeros_like(self_block)
        cross[:, :text_length, text_length:] = mixed["language_to_vision"]
        cross[:, text_length:, :text_length] = mixed["vision_to_language"]
        identity = torch.eye(cross.shape[-1], dtype=cross.dtype, device=cross.device)
        layer_rollout = normalise_rows(self_block + identity) @ normalise_rows(cross + identity)
        rollout = layer_rollout if rollout is None else layer_rollout @ rollout
        rollouts.append(rollout)
    return rollouts


def _block_diagonal(top_left: torch.Tensor, bottom_right: torch.Tensor) -> torch.Tensor:
    """(B, T, T), (B, R, R) -> (B, T + R, T + R) with zeros off the diagonal blocks."""
    text_length, num_regions = top_left.shape[-1], bottom_right.shape[-1]
    joint = top_left.new_zeros(top_left.shape[0], text_length + num_regions, text_length + num_regions)
    joint[:, :text_length, :text_length] = top_left
    joint[:, text_length:, text_length:] = bottom_right
    return joint


def semi_direct_supervision_loss(
    rollouts: list[torch.Tensor],
    text_positions: slice,
    region_positions: slice,
    word_region_alignment: torch.Tensor,
    text_mask: torch.Tensor,
    region_mask: torch.Tensor,
    num_text_rows: torch.Tensor | None = None,
    num_region_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eqs. 6-8 on rollout: text->region rows re-normalised over regions and region->text rows re-normalised over
    words, cross-entropy with the gold alignment, averaged over the supervised layers, both directions summed.
    `num_text_rows` / `num_region_rows`: the counts to divide by (`direct.supervised_row_counts`, global under data
    parallelism); default: this batch's."""
    region_target = normalise_rows(word_region_alignment.transpose(1, 2))
    losses = []
    for rollout in rollouts:
        text_to_region = rollout[:, text_positions, region_positions] * region_mask[:, None, :]
        region_to_text = rollout[:, region_positions, text_positions] * text_mask[:, None, :]
        log_t2r = torch.log(normalise_rows(text_to_region).clamp(min=1e-12))
        log_r2t = torch.log(normalise_rows(region_to_text).clamp(min=1e-12))
        losses.append(
            soft_cross_entropy(log_t2r, word_region_alignment, num_text_rows)
            + soft_cross_entropy(log_r2t, region_target, num_region_rows)
        )
    return torch.stack(losses).mean()
