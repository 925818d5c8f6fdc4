"""The alignment decoder of Kervadec et al. (ECAI 2020, "Weak supervision helps emergence of word-object alignment"),
section 5: the final word states S' and object states O' are projected to a joint space, scored by a scaled dot
product (eqs. 11-12), turned into a top-k softmax over objects per word (eq. 13) and trained with a KL divergence to
soft alignment targets A* (eq. 14; the targets are built by `hf_vlalign.alignment.soft_targets`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.activations import ACT2FN

from ..utils.item_counts import item_count, mean_over_items

# how eq. (14)'s KL treats target mass on regions outside eq. (13)'s top-k (see `alignment_kl_loss`)
OUTSIDE_TOP_K = ("renormalise_target", "floor", "target_support")


class AlignmentProjection(nn.Module):
    """proj(x) = LayerNorm(x + W2 act(W1 x)): feed-forward with a residual connection and LayerNorm (eqs. 11-12)."""

    def __init__(self, hidden_size: int, layer_norm_eps: float = 1e-12, hidden_act: str = "gelu"):
        super().__init__()
        self.dense_in = nn.Linear(hidden_size, hidden_size)
        self.activation = ACT2FN[hidden_act]
        self.dense_out = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(hidden_states + self.dense_out(self.activation(self.dense_in(hidden_states))))


class AlignmentDecoder(nn.Module):
    """Word-object alignment scores A_ij = s_i . o_j / sqrt(d) with s = proj_L(S'), o = proj_V(O') (eqs. 11-12).

    The language and vision projections have separate parameters. The scores are logits: eq. (13)'s top-k softmax
    is applied by `top_k_log_softmax` (and inside `alignment_kl_loss`), not here.
    """

    def __init__(self, hidden_size: int, layer_norm_eps: float = 1e-12, hidden_act: str = "gelu"):
        super().__init__()
        self.hidden_size = hidden_size
        self.language_projection = AlignmentProjection(hidden_size, layer_norm_eps, hidden_act)
        self.vision_projection = AlignmentProjection(hidden_size, layer_norm_eps, hidden_act)

    def forward(self, language_states: torch.Tensor, vision_states: torch.Tensor) -> torch.Tensor:
        """(B, T, D) word states and (B, R, D) object states -> (B, T, R) alignment scores (eqs. 11-12)."""
        words = self.language_projection(language_states)
        objects = self.vision_projection(vision_states)
        return torch.matmul(words, objects.transpose(-1, -2)) / math.sqrt(self.hidden_size)


def _region_mask_or_all(scores: torch.Tensor, region_mask: torch.Tensor | None) -> torch.Tensor:
    """The (B, R) region mask as bool, all True when None."""
    if region_mask is None:
        return torch.ones(scores.shape[0], scores.shape[-1], dtype=torch.bool, device=scores.device)
    return region_mask.bool()


def top_k_mask(scores: torch.Tensor, k: int, region_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, R) bool mask of each word's k highest-scoring real regions (eq. 13's top-k set).

    An example with fewer than k real regions (or regions at all) keeps all of its real regions and no padded one.
    """
    region_mask = _region_mask_or_all(scores, region_mask)
    masked_scores = scores.detach().masked_fill(~region_mask[:, None, :], float("-inf"))
    top_indices = masked_scores.topk(min(k, scores.shape[-1]), dim=-1).indices
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top_indices, True)
    return keep & region_mask[:, None, :]


def top_k_log_softmax(
    scores: torch.Tensor,
    k: int,
    region_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    always_keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """log A with A = softmax over each word's top-k real regions only (eq. 13), as (B, T, R) log-probabilities.

    Entries outside the top-k (and padded regions) have probability 0 in A; they read `log(eps)` here so that a loss
    reading them stays finite. Their gradient is zero: only the kept scores are trained. `always_keep` (B, T, R)
    adds entries to the kept set (the loss's "target_support" reading passes the target's support).
    """
    keep = top_k_mask(scores, k, region_mask)
    if always_keep is not None:
        real_regions = _region_mask_or_all(scores, region_mask)
        keep = keep | (always_keep.bool() & real_regions[:, None, :])
    logits = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    log_probs = torch.log_softmax(logits, dim=-1)
    return torch.where(keep, log_probs, torch.full_like(log_probs, math.log(eps)))


def _grounded_rows(target: torch.Tensor, text_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T) bool: rows that carry target mass and belong to a real token."""
    grounded = target.sum(-1) > 0.5
    if text_mask is None:
        return grounded
    return grounded & text_mask.bool()


def grounded_word_count(target: torch.Tensor, text_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The number of words [`alignment_kl_loss`] averages over: real tokens whose target row carries mass."""
    return _grounded_rows(target, text_mask).sum()


def alignment_kl_loss(
    scores: torch.Tensor,
    target: torch.Tensor,
    region_mask: torch.Tensor | None = None,
    text_mask: torch.Tensor | None = None,
    k: int = 3,
    eps: float = 1e-6,
    num_words: torch.Tensor | None = None,
    outside_top_k: str = "renormalise_target",
) -> torch.Tensor:
    """L_align = KL(A* || A) = sum_j A*_j (log A*_j - log A_j), averaged over the grounded words (eq. 14).

    A is eq. (13)'s softmax over each word's k highest-scoring real regions only (the others get no gradient). Target
    mass outside the top-k, where the KL is infinite, is handled by `outside_top_k` (docs/experiments.md):
    "renormalise_target" (default) restricts A* to the top-k and renormalises it there (a word with no mass there adds
    0 but still counts); "floor" reads A as max(A, eps); "target_support" keeps the top-k and the target's support, an
    exact KL. k >= 2 is needed for a training signal. Ungrounded rows and rows where `text_mask` is 0 are ignored; with
    no grounded word the loss is a zero connected to the graph of `scores`. No tensor value is read on the host.

    Args:
        scores: (B, T, R) alignment scores from `AlignmentDecoder`.
        target: (B, T, R) soft targets A* (`word_region_alignment`), each row a distribution or all zeros.
        region_mask: (B, R) 1 for real regions; text_mask: (B, T) 1 for real tokens.
        k: the top-k of eq. (13) (config field `alignment_top_k`), >= 1.
        eps: the probability read outside the kept set, in (0, 1) ("floor").
        num_words: the number of grounded words to divide by (global under data parallelism); default: this batch's.
        outside_top_k: one of `OUTSIDE_TOP_K` (config field `alignment_outside_top_k`).
    """
    region_mask = _region_mask_or_all(scores, region_mask)
    grounded = _grounded_rows(target, text_mask)  # from the full target: the divisor does not depend on the scores
    always_keep = target > 0 if outside_top_k == "target_support" else None
    log_probs = top_k_log_softmax(scores, k, region_mask, eps, always_keep=always_keep)
    target = target.to(log_probs.dtype)
    if outside_top_k == "renormalise_target":
        kept_target = target * top_k_mask(scores, k, region_mask).to(target.dtype)
        kept_mass = kept_target.sum(-1, keepdim=True)
        # a row with no target mass in its top-k is divided by 1 and stays all zeros (loss 0, no NaN)
        target = kept_target / torch.where(kept_mass > 0, kept_mass, torch.ones_like(kept_mass))
    per_word = (torch.xlogy(target, target) - target * log_probs).sum(-1)
    # where(): a batch without grounded word gives a zero connected to the graph of `scores`
    total = torch.where(grounded, per_word, torch.zeros_like(per_word)).sum()
    return mean_over_items(total, item_count(grounded.sum(), num_words))
