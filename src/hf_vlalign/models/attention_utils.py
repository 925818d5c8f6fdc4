"""Attention helpers shared by the model families: the eager path that returns pre-dropout probabilities, and the
key-padding mask in the form each attention implementation expects."""

from __future__ import annotations

import torch
from torch import nn


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(QK^T * scaling + mask) V, returning the probabilities *before* dropout (what analyses should read).

    transformers' BERT eager function returns them after dropout, which differs in training mode.
    """
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        logits = logits + attention_mask
    probs = nn.functional.softmax(logits, dim=-1)
    attn_output = torch.matmul(nn.functional.dropout(probs, p=dropout, training=module.training), value)
    return attn_output.transpose(1, 2).contiguous(), probs


def key_padding_mask_4d(keep: torch.Tensor, dtype: torch.dtype, eager: bool) -> torch.Tensor | None:
    """(B, N) keep-mask of the keys -> additive float mask (eager) or boolean mask (sdpa), shaped (B, 1, 1, N).

    Returns None when nothing is masked on the sdpa path, which lets sdpa use its fastest kernel.
    """
    if not eager and bool(keep.all()):
        return None
    keep = keep.bool()[:, None, None, :]
    if not eager:
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)
