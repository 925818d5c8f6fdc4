"""Indirect supervision (Samaran et al. 2021, eq. 5): a binary phrase-region classifier on the final states."""

from __future__ import annotations

import torch
from torch import nn

from ..utils.item_counts import item_count, mean_over_items


def max_pool_phrases(hidden_states: torch.Tensor, phrase_masks: torch.Tensor) -> torch.Tensor:
    """Max-pool token states over each phrase: (B, T, D), (B, P, T) -> (B, P, D); empty (padding) phrases give 0."""
    masked = hidden_states.unsqueeze(1).masked_fill(~phrase_masks.bool().unsqueeze(-1), torch.finfo(hidden_states.dtype).min)
    pooled = masked.amax(dim=2)
    has_tokens = phrase_masks.bool().any(-1, keepdim=True)
    return torch.where(has_tokens, pooled, torch.zeros_like(pooled))


class IndirectGroundingHead(nn.Module):
    """p(phrase grounded in region) = sigmoid(MLP([phrase embedding; region state])) (eq. 5)."""

    def __init__(self, hidden_size: int, dropout: float = 0.1):
        super().__init__()
        self.dense = nn.Linear(2 * hidden_size, hidden_size)
        self.activation = nn.GELU()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, 1)

    def forward(self, phrase_embeddings: torch.Tensor, region_states: torch.Tensor) -> torch.Tensor:
        """(B, P, D), (B, R, D) -> (B, P, R) logits for every phrase-region pair."""
        num_phrases, num_regions = phrase_embeddings.shape[1], region_states.shape[1]
        pairs = torch.cat(
            [
                phrase_embeddings.unsqueeze(2).expand(-1, -1, num_regions, -1),
                region_states.unsqueeze(1).expand(-1, num_phrases, -1, -1),
            ],
            dim=-1,
        )
        return self.classifier(self.dropout(self.activation(self.dense(pairs)))).squeeze(-1)


def indirect_supervision_loss(
    pair_logits: torch.Tensor,
    phrase_region_targets: torch.Tensor,
    phrase_valid: torch.Tensor,
    region_mask: torch.Tensor,
    num_phrases: torch.Tensor | None = None,
) -> torch.Tensor:
    """Binary cross-entropy per phrase-region pair, averaged over the real regions, then over the real phrases (eq. 5).

    pair_logits / phrase_region_targets: (B, P, R); phrase_valid: (B, P); region_mask: (B, R); num_phrases: the
    number of real phrases to divide by (global under data parallelism); default: this batch's. With no real phrase
    the loss is a zero connected to the graph.
    """
    pair_loss = nn.functional.binary_cross_entropy_with_logits(pair_logits, phrase_region_targets, reduction="none")
    region_mask = region_mask[:, None, :].to(pair_loss.dtype)
    per_phrase = (pair_loss * region_mask).sum(-1) / region_mask.sum(-1).clamp(min=1)
    valid = phrase_valid.bool()
    total = torch.where(valid, per_phrase, torch.zeros_like(per_phrase)).sum()
    return mean_over_items(total, item_count(valid.sum(), num_phrases))
