"""Samaran et al.'s direct and semi-direct attention supervision on transformers patch models, from recorded
query / key projections (`AttentionRecorder`).

- Direct (eqs. 6-8): each supervised head's text->image logits, re-normalised over the real image tokens (so the model
  keeps `sdpa`), are trained by cross-entropy against each grounded word's target, the uniform distribution over the
  patches its gold box covers. Eq. (7)'s image->text direction exists only where image tokens attend to the text (ViLT).
- Semi-direct: the same cross-entropy on attention rollout (Abnar & Zuidema 2020) up to each supervised layer, the
  maps recomputed from the recorded projections with the model's mask.

Every mean over grounded words divides by `num_rows` when given (the global count, `hf_vlalign.utils.item_counts`).
"""

from __future__ import annotations

import torch

from ..supervision.direct import additive_key_bias, normalise_rows, query_key_direction_loss, soft_cross_entropy
from ..supervision.rollout import attention_rollout
from .families import PatchLayout
from .recording import AttentionRecorder

__all__ = [
    "PATCH_SUPERVISION_METHODS",
    "grounded_cell_count",
    "grounded_token_count",
    "patch_attention_loss",
    "sequence_masks",
    "token_alignment",
]

PATCH_SUPERVISION_METHODS = ("direct", "semi_direct")


def token_alignment(word_cell_alignment: torch.Tensor, layout: PatchLayout) -> torch.Tensor:
    """(B, N, C) alignment of sequence positions with grid cells -> (B, N, P) with the image tokens, each grounded row
    re-normalised over the real image tokens."""
    return normalise_rows(layout.to_tokens(word_cell_alignment))


def grounded_token_count(word_cell_alignment: torch.Tensor) -> torch.Tensor:
    """Grounded token rows of a batch: the count the losses average over."""
    return (word_cell_alignment.sum(-1) > 0).sum()


def grounded_cell_count(word_cell_alignment: torch.Tensor) -> torch.Tensor:
    """Grid cells that some grounded token's target covers: the image rows the image->text direction averages over."""
    return (word_cell_alignment.sum(-2) > 0).sum()


def _gather_positions(tensor: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) -> (B, H, P, d) at the (B, P) sequence positions."""
    index = positions.to(tensor.device)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[-1])
    return tensor.gather(2, index)


def _full_heads(key: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Grouped-query keys (B, H_kv, N, d) repeated to the H query heads (transformers' `repeat_kv`)."""
    return key if key.shape[1] == num_heads else key.repeat_interleave(num_heads // key.shape[1], dim=1)


def _direct_loss(recorder, layers, layout, target, heads, num_rows, num_image_rows, text_mask, image_to_text):
    queries = [recorder.queries[layer] for layer in layers]
    heads_of = queries[0].shape[1]
    image_keys = additive_key_bias(layout.patch_mask.to(target.device)[:, None, None, :], queries[0].dtype)
    # the image tokens' keys are gathered before grouped-query keys are repeated: P rows copied, not N
    pairs = [
        (query, _full_heads(_gather_positions(recorder.keys[layer], layout.image_positions), heads_of))
        for layer, query in zip(layers, queries)
    ]
    loss = query_key_direction_loss(pairs, heads, recorder.scaling, target.unsqueeze(1), image_keys, num_rows)
    if image_to_text:
        # eq. (7): image tokens' rows over the text tokens, target = the token's alignment column re-normalised
        image_target = normalise_rows(target.transpose(1, 2)).unsqueeze(1)
        text_keys = additive_key_bias(text_mask.to(target.device)[:, None, None, :], queries[0].dtype)
        pairs = [
            (_gather_positions(query, layout.image_positions), _full_heads(recorder.keys[layer], heads_of))
            for layer, query in zip(layers, queries)
        ]
        loss = loss + query_key_direction_loss(pairs, heads, recorder.scaling, image_target, text_keys, num_image_rows)
    return loss


def _allowed(mask: torch.Tensor | None, key_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, 1, N, N) bool: which keys each query sees, from the mask the layer was given (bool or additive) or, when
    it got none, the causal / full pattern over the real keys."""
    length = key_mask.shape[-1]
    if mask is not None:
        return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    allowed = key_mask.bool()[:, None, None, :].expand(-1, 1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=key_mask.device).tril()
    return allowed


def _layer_probabilities(recorder, layer: int, key_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, H, N, N) attention probabilities of a recorded layer, under the mask the model applied."""
    query = recorder.queries[layer]
    key = _full_heads(recorder.keys[layer], query.shape[1])
    logits = (query @ key.transpose(-1, -2) * recorder.scaling).float()
    allowed = _allowed(recorder.masks[layer], key_mask.to(query.device), causal)[..., : key.shape[2]]
    return torch.softmax(logits.masked_fill(~allowed, torch.finfo(logits.dtype).min), dim=-1)


def _semi_direct_loss(recorder, layers, layout, target, heads, counts, masks, causal, image_to_text) -> torch.Tensor:
    (num_rows, num_image_rows), (key_mask, text_mask) = counts, masks
    probabilities = [_layer_probabilities(recorder, layer, key_mask, causal) for layer in range(max(layers) + 1)]
    rollouts = attention_rollout(probabilities, heads)
    positions = layout.image_positions.to(target.device)
    patch_mask = layout.patch_mask.to(target.device)
    image_target = normalise_rows(target.transpose(1, 2))
    losses = []
    for layer in layers:
        rollout = rollouts[layer]  # (B, N, N)
        text_to_image = rollout.gather(-1, positions[:, None, :].expand(-1, rollout.shape[1], -1))
        log_probs = torch.log(normalise_rows(text_to_image * patch_mask[:, None, :]).clamp(min=1e-12))
        loss = soft_cross_entropy(log_probs, target, num_rows)
        if image_to_text:  # eq. (7) on rollout: image rows over the text columns
            image_to_all = rollout.gather(1, positions[:, :, None].expand(-1, -1, rollout.shape[-1]))
            log_probs = torch.log(normalise_rows(image_to_all * text_mask[:, None, :]).clamp(min=1e-12))
            loss = loss + soft_cross_entropy(log_probs, image_target, num_image_rows)
        losses.append(loss)
    return torch.stack(losses).mean()


def sequence_masks(
    batch: dict, layout: PatchLayout, sequence_length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(key_mask, text_mask, word_cell_alignment), each over the model's whole sequence of `sequence_length`
    positions: ViLT appends its image [CLS] and patches after the text, so the collator's text-only tensors are
    extended (the [CLS] is real, patches follow `patch_mask`); LLaVA and PaliGemma hold the image in `input_ids`."""
    attention_mask = batch["attention_mask"].bool()
    alignment = batch["word_cell_alignment"]
    text_length = attention_mask.shape[1]
    if sequence_length == text_length:
        is_image = torch.zeros_like(attention_mask).scatter(1, layout.image_positions.to(attention_mask.device), True)
        return attention_mask, attention_mask & ~is_image, alignment
    image_cls = torch.ones_like(attention_mask[:, :1])
    key_mask = torch.cat([attention_mask, image_cls, layout.patch_mask.to(attention_mask.device)], dim=1)
    text_mask = torch.cat([attention_mask, torch.zeros_like(key_mask[:, text_length:])], dim=1)
    alignment = torch.nn.functional.pad(alignment, (0, 0, 0, sequence_length - text_length))
    return key_mask, text_mask, alignment


def patch_attention_loss(
    recorder: AttentionRecorder,
    batch: dict,
    layout: PatchLayout,
    method: str = "direct",
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    num_rows: torch.Tensor | None = None,
    num_image_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The supervision loss of one batch, averaged over the supervised layers (and heads, for "direct").

    Args:
        recorder: the recorder the forward ran in; it recorded `layers` (semi-direct: every layer up to the deepest).
        batch: the `PatchGroundingCollator` batch of the forward (its `attention_mask` and `word_cell_alignment`:
            per text position a distribution over the grid cells, zeros for ungrounded positions).
        layout: where the image tokens are (`forward_with_layout`).
        method: "direct" or "semi_direct".
        layers: supervised layers (default: the recorder's).
        heads: supervised heads (default: all; semi-direct averages them in the rollout).
        num_rows: the number of grounded rows to divide by (global under data parallelism); default: this batch's.
        num_image_rows: the same for the image->text direction (ViLT): the grid cells some grounded word's target
            covers (`grounded_cell_count`); default: this batch's.
    """
    layers = recorder.layers if layers is None else list(layers)
    key_mask, text_mask, alignment = sequence_masks(batch, layout, recorder.queries[layers[0]].shape[2])
    target = token_alignment(alignment, layout)
    image_to_text = recorder.family.image_attends_to_text
    if method == "direct":
        return _direct_loss(recorder, layers, layout, target, heads, num_rows, num_image_rows, text_mask, image_to_text)
    counts, masks = (num_rows, num_image_rows), (key_mask, text_mask.to(target.device))
    # without image->text attention (LLaVA, PaliGemma) the language model's mask is causal
    return _semi_direct_loss(recorder, layers, layout, target, heads, counts, masks, not image_to_text, image_to_text)
