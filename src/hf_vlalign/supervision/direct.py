"""Direct attention supervision (Samaran et al. 2021, eqs. 6-8): every supervised head is a classifier over the
other modality, trained with cross-entropy against the gold word-region alignment.

The re-normalised text->region attention of eq. (6), p(r | t) = a_tr / sum_r' a_tr', equals a softmax of the attention
*logits* restricted to the region keys, so the loss is computed from the (pre-dropout) query/key projections of the
supervised rows only, recomputed in the backward pass, and the model's main path keeps `sdpa`.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from ..utils.item_counts import item_count, mean_over_items


def masked_log_softmax(logits: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """log-softmax over the last dim restricted to keys where `key_mask` (broadcastable) is True."""
    logits = logits.masked_fill(~key_mask.bool(), torch.finfo(logits.dtype).min)
    return torch.log_softmax(logits, dim=-1)


def supervised_row_counts(word_region_alignment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(text rows, region rows) the direct and semi-direct losses average over: the tokens whose alignment row carries
    mass (eq. 6) and the regions aligned to some token (eq. 7)."""
    return (word_region_alignment.sum(-1) > 0).sum(), (word_region_alignment.sum(-2) > 0).sum()


def _replicas(scores: torch.Tensor, target: torch.Tensor) -> int:
    """How many score rows each target row is broadcast to (the heads of a (B, H, N, K) score against a (B, 1, N, K)
    target)."""
    return math.prod(scores.shape[:-1]) // math.prod(target.shape[:-1])


def soft_cross_entropy(log_probs: torch.Tensor, target: torch.Tensor, num_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the rows that carry target mass of -sum_k target_k log p_k (eq. 8); zero when no row does.

    log_probs: (..., N, K); target: (N, K)-shaped rows broadcast over the leading dims, each a distribution or zeros.
    num_rows: the number of target rows with mass to divide by (the global count under data parallelism, see
    `utils/item_counts.py`); default: those of `target`.
    """
    replicas = _replicas(log_probs, target)
    local_rows = (target.sum(-1) > 0).sum()
    target = target.expand_as(log_probs)
    # where(): finite even though masked keys sit at log 0 = -inf; a batch without grounded row gives a zero in the graph
    per_row = -torch.where(target > 0, target * log_probs, torch.zeros_like(log_probs)).sum(-1)
    return mean_over_items(per_row.sum(), item_count(local_rows, num_rows) * replicas)


def additive_key_bias(key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Keep-mask -> additive bias: 0 on real keys, the dtype's most negative value on padding (an add is far cheaper
    than a broadcast `masked_fill` on CPU)."""
    return torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill(~key_mask.bool(), torch.finfo(dtype).min)


def soft_cross_entropy_from_logits(
    logits: torch.Tensor, target: torch.Tensor, key_bias: torch.Tensor, num_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """[`soft_cross_entropy`] of `masked_log_softmax(logits, key_mask)`, without materialising the log-probabilities:
    -sum_k t_k log p_k = (sum_k t_k) logsumexp_k(s) - sum_k t_k s_k over the unmasked keys (eq. 8).

    logits: (B, H, N, K); target: (B, 1, N, K) rows, each a distribution over unmasked keys or zeros;
    key_bias: [`additive_key_bias`] of the keys, broadcastable to logits; num_rows: as in [`soft_cross_entropy`].
    """
    target_mass = target.sum(-1)
    # rows without target mass contribute exactly 0 (logsumexp stays finite: padding keys sit at finfo.min)
    per_row = target_mass * torch.logsumexp(logits + key_bias, dim=-1) - (target * logits).sum(-1)
    local_rows = (target_mass > 0).sum()
    return mean_over_items(per_row.sum(), item_count(local_rows, num_rows) * _replicas(logits, target))


def select_heads(tensor: torch.Tensor, heads: list[int] | None) -> torch.Tensor:
    """`tensor[:, heads]` of a (B, H, ...) tensor without synchronising with the host: a run of consecutive heads is a
    slice, any other list an index copied to the device without waiting (indexing with a Python list makes a
    blocking copy). None: every head."""
    if heads is None:
        return tensor
    if list(heads) == list(range(heads[0], heads[0] + len(heads))):
        return tensor[:, heads[0] : heads[0] + len(heads)]
    index = torch.tensor(heads, dtype=torch.long).to(tensor.device, non_blocking=True)
    return tensor.index_select(1, index)


def normalise_rows(matrix: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sum; all-zero rows stay zero."""
    sums = matrix.sum(-1, keepdim=True)
    return torch.where(sums > 0, matrix / sums.clamp(min=1e-12), torch.zeros_like(matrix))


def direct_supervision_loss(
    text_to_region_logits: list[torch.Tensor],
    region_to_text_logits: list[torch.Tensor],
    word_region_alignment: torch.Tensor,
    text_mask: torch.Tensor,
    region_mask: torch.Tensor,
) -> torch.Tensor:
    """Direct supervision averaged over supervised layers and heads, both directions summed (eqs. 6-8).

    Reading of eq. (8): each direction is the cross-entropy averaged over the rows that carry a target (grounded
    tokens for text->region, regions aligned to some word for region->text), so padding and ungrounded tokens
    neither add loss nor dilute it.

    Args:
        text_to_region_logits: per supervised layer, (B, H, T, R) attention logits of text queries on region keys.
        region_to_text_logits: per supervised layer, (B, H, R, T) attention logits of region queries on text keys.
        word_region_alignment: (B, T, R) gold alignment, each grounded token's row a distribution over regions.
        text_mask / region_mask: (B, T) / (B, R) 1 for real tokens / regions.
    """
    # eq. (6): text -> region re-normalised over regions, target = the token's alignment row
    text_target = word_region_alignment.unsqueeze(1)
    region_keys = region_mask[:, None, None, :]
    # eq. (7): region -> text re-normalised over words, target = the region's alignment column re-normalised
    region_target = normalise_rows(word_region_alignment.transpose(1, 2)).unsqueeze(1)
    text_keys = text_mask[:, None, None, :]
    losses = [
        soft_cross_entropy(masked_log_softmax(t2r, region_keys), text_target)
        + soft_cross_entropy(masked_log_softmax(r2t, text_keys), region_target)
        for t2r, r2t in zip(text_to_region_logits, region_to_text_logits)
    ]
    return torch.stack(losses).mean()


def direct_supervision_loss_from_query_key(
    text_to_region: list[tuple[torch.Tensor, torch.Tensor]],
    region_to_text: list[tuple[torch.Tensor, torch.Tensor]],
    scaling: float,
    word_region_alignment: torch.Tensor,
    text_mask: torch.Tensor,
    region_mask: torch.Tensor,
    heads: list[int] | None = None,
    num_text_rows: torch.Tensor | None = None,
    num_region_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """[`direct_supervision_loss`] from the pre-dropout query/key projections, logits recomputed in the backward pass.

    The supervised layers are stacked and each direction is computed once for all of them (a handful of kernels
    instead of a handful per layer: on a GPU the step is bound by kernel launches). The mean over rows, heads and
    layers equals the mean over layers of each layer's loss, since every layer has the same rows.

    Args:
        text_to_region: per supervised layer, (text queries (B, H, T, d), region keys (B, H, R, d)).
        region_to_text: per supervised layer, (region queries (B, H, R, d), text keys (B, H, T, d)).
        scaling: the attention's 1/sqrt(d).
        heads: supervised heads (None: all of them, and nothing is copied).
        num_text_rows / num_region_rows: the counts of [`supervised_row_counts`] to divide by (global under data
            parallelism); default: this batch's.
    """
    text_target = word_region_alignment.unsqueeze(1)
    region_target = normalise_rows(word_region_alignment.transpose(1, 2)).unsqueeze(1)
    dtype = text_to_region[0][0].dtype
    region_keys = additive_key_bias(region_mask[:, None, None, :], dtype)
    text_keys = additive_key_bias(text_mask[:, None, None, :], dtype)
    t2r = query_key_direction_loss(text_to_region, heads, scaling, text_target, region_keys, num_text_rows)
    r2t = query_key_direction_loss(region_to_text, heads, scaling, region_target, text_keys, num_region_rows)
    return t2r + r2t


def query_key_direction_loss(
    query_key_pairs: list[tuple[torch.Tensor, torch.Tensor]],
    heads: list[int] | None,
    scaling: float,
    target: torch.Tensor,
    key_bias: torch.Tensor,
    num_rows: torch.Tensor | None,
) -> torch.Tensor:
    """One direction of eqs. (6)/(7) over every supervised layer from (queries (B, H, N, d), keys (B, H, K, d)) pairs,
    logits recomputed in the backward pass (`torch.utils.checkpoint`). `target` (B, 1, N, K), `key_bias`
    [`additive_key_bias`] of the keys, `num_rows` as in [`soft_cross_entropy`]."""
    queries, keys = zip(*query_key_pairs)
    layers = len(queries)
    return checkpoint(_direction_loss, heads, scaling, target, key_bias, num_rows, layers, *queries, *keys,
                      use_reentrant=False, preserve_rng_state=False)  # fmt: skip


def _direction_loss(heads, scaling, target, key_bias, num_rows, layers, *queries_and_keys) -> torch.Tensor:
    # eqs. (6)/(7): attention logits of the supervised heads' rows on the other modality's keys, (L, B, H, N, K)
    query = torch.stack([select_heads(query, heads) for query in queries_and_keys[:layers]])
    key = torch.stack([select_heads(key, heads) for key in queries_and_keys[layers:]])
    return soft_cross_entropy_from_logits(query @ key.transpose(-1, -2) * scaling, target, key_bias, num_rows)
