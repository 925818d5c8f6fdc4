"""Attention helpers shared by the model families: the eager path that returns pre-dropout probabilities, the choice
of attention function, and the key-padding mask in the form each attention implementation expects."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .dropout import apply_dropout


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

    `attention_mask` is additive (float) or a keep-mask (bool), both broadcastable to (B, H, N_query, N_key).

    transformers' BERT eager function returns them after dropout, which differs in training mode.
    """
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attention_mask, torch.finfo(logits.dtype).min)
    elif attention_mask is not None:
        logits = logits + attention_mask
    probs = nn.functional.softmax(logits, dim=-1)
    attn_output = torch.matmul(apply_dropout(module.config, probs, dropout, module.training), value)
    return attn_output.transpose(1, 2).contiguous(), probs


def key_padding_mask_4d(keep: torch.Tensor, dtype: torch.dtype, eager: bool) -> torch.Tensor:
    """(B, N) keep-mask of the keys -> additive float mask (eager) or boolean mask (sdpa), shaped (B, 1, 1, N).

    The sdpa path always passes the mask, even when it keeps every key: dropping it then (what transformers'
    `sdpa_mask` does for causal masks) would need to read the mask on the host, a device synchronisation per layer
    call, for a faster kernel only on batches without padding.
    """
    keep = keep.bool()[:, None, None, :]
    if not eager:
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


def run_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    output_attentions: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention through the model's implementation (`sdpa` by default), or eager when the probabilities are asked
    for, and when training with attention dropout on CPU (CPU `sdpa` then runs its math kernel anyway, with torch's
    Bernoulli sampler; the eager path uses the cheaper mask of `models/dropout.py`, unless
    `dropout_implementation="torch"`). Returns the output (B, N_query, H, d) and the pre-dropout probabilities
    (B, H, N_query, N_key) or None."""
    attention_interface = eager_attention_forward
    if not (output_attentions or _eager_dropout_is_faster(module, query, dropout)):
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    attn_output, attn_weights = attention_interface(
        module, query, key, value, attention_mask, dropout=dropout if module.training else 0.0, scaling=module.scaling
    )
    return attn_output, attn_weights if output_attentions else None


def _eager_dropout_is_faster(module: nn.Module, query: torch.Tensor, dropout: float) -> bool:
    return (
        module.training
        and dropout > 0.0
        and query.device.type == "cpu"
        and getattr(module.config, "dropout_implementation", "auto") == "auto"
    )
