"""Samaran et al.'s direct and semi-direct attention supervision on transformers patch models, from recorded
query / key projections (`AttentionRecorder`).

- Direct (eqs. 6-8): each supervised head's text->image logits, re-normalised over the real image tokens (the model
  keeps its own attention kernel, which need return no map), are trained by cross-entropy against each grounded
  word's target, the uniform distribution over the patches its gold box covers. Eq. (7)'s image->text direction exists only where image tokens attend to the text (ViLT).
- Semi-direct (samaran2021_attending_self_attention.txt, "Semi-direct attention supervision": eqs. 6-8 with the raw
  attention replaced by its rollout): the same cross-entropy on attention rollout (Abnar & Zuidema 2020, eq. 1) up to
  each supervised layer, the maps recomputed from the recorded projections with the model's mask.

Both read only the rows the loss has a target for: the grounded tokens (the collator's `grounded_token_positions`; eq.
6) and, where image tokens attend to the text (ViLT, eq. 7), the image tokens. On LLaVA / PaliGemma the memory thus
grows linearly with the number of image tokens (grounded rows x image tokens), not with its square.

Every mean over grounded words divides by `num_rows` when given (the global count, `hf_vlalign.utils.item_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from ..supervision.direct import (
    additive_key_bias,
    normalise_rows,
    query_key_direction_loss,
    select_heads,
    soft_cross_entropy,
)
from ..supervision.rollout import attention_rollout
from .families import PatchLayout
from .recording import AttentionRecorder

__all__ = [
    "PATCH_SUPERVISION_METHODS",
    "SEMI_DIRECT_ROLLOUTS",
    "grounded_cell_count",
    "grounded_token_count",
    "patch_attention_loss",
    "sequence_masks",
    "token_alignment",
]

PATCH_SUPERVISION_METHODS = ("direct", "semi_direct")
# how semi-direct supervision computes its rollout (`patch_attention_loss`'s `semi_direct_rollout`)
SEMI_DIRECT_ROLLOUTS = ("supervised_rows", "full")
# query rows of one layer's attention map computed at once by the "supervised_rows" rollout: (batch x heads x this x
# sequence) logits live at a time
ROLLOUT_CHUNK_ROWS = 256


def token_alignment(word_cell_alignment: torch.Tensor, layout: PatchLayout) -> torch.Tensor:
    """(B, G, C) alignment of the grounded tokens with grid cells -> (B, G, P) with the image tokens, each grounded row
    re-normalised over the real image tokens (padding rows stay zero)."""
    return normalise_rows(layout.to_tokens(word_cell_alignment))


def grounded_token_count(word_cell_alignment: torch.Tensor) -> torch.Tensor:
    """Grounded token rows of a batch's (B, G, C) `word_cell_alignment` (its padding rows are zero): the count the
    losses average over."""
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


def _text_positions(layout: PatchLayout, sequence_length: int) -> torch.Tensor:
    """(B, T) the sequence positions that are no image token, in order (T = sequence_length - P: every example holds
    its P image tokens), found without reading a tensor on the host."""
    positions = layout.image_positions
    is_image = torch.zeros(positions.shape[0], sequence_length, dtype=torch.int8, device=positions.device)
    is_image.scatter_(1, positions, 1)
    return torch.argsort(is_image, dim=1, stable=True)[:, : sequence_length - positions.shape[1]]


def _gather_rows(tensor: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, N, ...) -> (B, K, ...) at the (B, K) positions."""
    index = positions.to(tensor.device).view(*positions.shape, *(1,) * (tensor.dim() - 2))
    return tensor.gather(1, index.expand(-1, -1, *tensor.shape[2:]))


@dataclass
class _SupervisedRows:
    """What the losses read of a batch: the grounded tokens' rows (eq. 6) and, where image tokens attend to the text
    (ViLT, eq. 7), the image tokens' rows over the text positions.

    grounded: (B, G) sequence positions of the grounded tokens (padding: position 0, whose target row is zero).
    target: (B, G, P) each grounded token's distribution over the image tokens.
    counts: (num_rows, num_image_rows) of `patch_attention_loss`.
    text: (B, T) the text positions (eq. 7's columns), or None without eq. 7.
    text_mask: (B, T) which of them are real text tokens.
    image_target: (B, P, T) each image token's alignment column re-normalised over the text.
    """

    grounded: torch.Tensor
    target: torch.Tensor
    counts: tuple[torch.Tensor | None, torch.Tensor | None]
    text: torch.Tensor | None = None
    text_mask: torch.Tensor | None = None
    image_target: torch.Tensor | None = None

    def positions(self, layout: PatchLayout) -> torch.Tensor:
        """(B, K) the rows the loss reads: the grounded tokens', then (eq. 7) the image tokens'."""
        if self.text is None:
            return self.grounded
        return torch.cat([self.grounded, layout.image_positions.to(self.grounded.device)], 1)


def _image_to_text_target(
    target: torch.Tensor, grounded: torch.Tensor, text: torch.Tensor, length: int
) -> torch.Tensor:
    """Eq. (7)'s target: (B, G, P) on the `grounded` positions -> (B, P, T) on the (B, T) `text` positions of a
    sequence of `length`, each image token's alignment column re-normalised (zeros on the ungrounded text tokens; a
    padding row adds zeros)."""
    batch_size, text_length = text.shape
    column_of = torch.zeros(batch_size, length, dtype=torch.long, device=text.device)
    column_of.scatter_(1, text, torch.arange(text_length, device=text.device).expand(batch_size, -1))
    columns = column_of.gather(1, grounded)[..., None].expand_as(target)
    on_text = target.new_zeros(batch_size, text_length, target.shape[-1]).scatter_add_(1, columns, target)
    return normalise_rows(on_text.transpose(1, 2))


def _direct_loss(recorder, layers, layout, rows: _SupervisedRows, heads) -> torch.Tensor:
    """Eqs. (6)-(8) from the grounded rows' queries (B, H, G, d) on the image tokens' keys (and, eq. 7, the image
    tokens' queries on the text tokens' keys): (B, H, G, P) logits, linear in the image tokens."""
    num_rows, num_image_rows = rows.counts
    queries = [recorder.queries[layer] for layer in layers]
    heads_of, dtype = queries[0].shape[1], queries[0].dtype
    image_keys = additive_key_bias(layout.patch_mask.to(rows.target.device)[:, None, None, :], dtype)
    # keys are gathered before grouped-query keys are repeated: P (or T) rows copied, not N
    image_keys_of = [_full_heads(_gather_positions(recorder.keys[layer], layout.image_positions), heads_of) for layer in layers]
    pairs = [(_gather_positions(query, rows.grounded), keys) for query, keys in zip(queries, image_keys_of)]
    loss = query_key_direction_loss(pairs, heads, recorder.scaling, rows.target.unsqueeze(1), image_keys, num_rows)
    if rows.text is not None:
        # eq. (7): image tokens' rows over the text tokens, target = the token's alignment column re-normalised
        text_keys = additive_key_bias(rows.text_mask[:, None, None, :], dtype)
        text_keys_of = [_full_heads(_gather_positions(recorder.keys[layer], rows.text), heads_of) for layer in layers]
        pairs = [(_gather_positions(query, layout.image_positions), keys) for query, keys in zip(queries, text_keys_of)]
        image_target = rows.image_target.unsqueeze(1)
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


def _rollout_losses(rollout_rows: torch.Tensor, layout: PatchLayout, rows: _SupervisedRows) -> torch.Tensor:
    """Eqs. (6)-(8) on the rollout of one layer: `rollout_rows` (B, G (+ P), N) holds its rows at `rows.positions`
    (the grounded tokens', then, with eq. 7, the image tokens')."""
    (num_rows, num_image_rows), grounded = rows.counts, rows.grounded.shape[1]
    positions = layout.image_positions.to(rows.target.device)
    text_to_image = rollout_rows[:, :grounded].gather(-1, positions[:, None, :].expand(-1, grounded, -1))
    text_to_image = text_to_image * layout.patch_mask.to(rows.target.device)[:, None, :]
    log_probs = torch.log(normalise_rows(text_to_image).clamp(min=1e-12))
    loss = soft_cross_entropy(log_probs, rows.target, num_rows)
    if rows.text is not None:  # eq. (7) on rollout: image rows over the text columns
        image_rows = rollout_rows[:, grounded:]
        image_to_text = image_rows.gather(-1, rows.text[:, None, :].expand(-1, image_rows.shape[1], -1))
        log_probs = torch.log(normalise_rows(image_to_text * rows.text_mask[:, None, :]).clamp(min=1e-12))
        loss = loss + soft_cross_entropy(log_probs, rows.image_target, num_image_rows)
    return loss


def _semi_direct_full(recorder, layers, layout, rows: _SupervisedRows, heads, key_mask, causal) -> torch.Tensor:
    """Every layer's (B, H, N, N) map and the (B, N, N) rollout, then the supervised rows."""
    probabilities = [_layer_probabilities(recorder, layer, key_mask, causal) for layer in range(max(layers) + 1)]
    rollouts = attention_rollout(probabilities, heads)
    positions = rows.positions(layout)
    losses = [_rollout_losses(_gather_rows(rollouts[layer], positions), layout, rows) for layer in layers]
    return torch.stack(losses).mean()


def _map_rows(rows, query, key, mask, key_mask, positions, causal, heads, scaling) -> torch.Tensor:
    """`rows` (B, K, C) times the rows at `positions` (B, C) of a layer's rollout factor rownorm(mean_h A + I) (Abnar &
    Zuidema, eq. 1; the attention A recomputed from `query` (B, H, C, d) and `key` under the layer's mask): (B, K, N);
    `rows` None: those factor rows themselves, (B, C, N)."""
    key = select_heads(_full_heads(key, query.shape[1]), heads)
    logits = (select_heads(query, heads) @ key.transpose(-1, -2) * scaling).float()
    length = key.shape[2]
    if mask is not None:
        allowed = mask.gather(2, positions[:, None, :, None].expand(-1, mask.shape[1], -1, mask.shape[-1]))
        allowed = allowed if allowed.dtype == torch.bool else allowed > torch.finfo(allowed.dtype).min / 2
        allowed = allowed[..., :length]
    else:
        allowed = key_mask.bool()[:, None, None, :]
        if causal:
            allowed = allowed & (torch.arange(length, device=positions.device) <= positions[..., None])[:, None]
    mixed = torch.softmax(logits.masked_fill(~allowed, torch.finfo(logits.dtype).min), dim=-1).mean(dim=1)
    identity = torch.nn.functional.one_hot(positions, length).to(mixed.dtype)
    factor_rows = normalise_rows(mixed + identity)
    return factor_rows if rows is None else rows @ factor_rows


def _times_layer(rows, recorder, layer, positions, key_mask, causal, heads) -> torch.Tensor:
    """`rows` (B, K, N) times the layer's rollout factor, or (`rows` None) that factor's rows at `positions` (B, K),
    the factor computed `ROLLOUT_CHUNK_ROWS` query rows at a time, each chunk recomputed in the backward
    (`torch.utils.checkpoint`): only the query, key and rows are kept."""
    query, key, mask = recorder.queries[layer], recorder.keys[layer], recorder.masks[layer]
    chunks, product = [], None
    for start in range(0, query.shape[2] if positions is None else positions.shape[1], ROLLOUT_CHUNK_ROWS):
        if positions is None:
            stop = min(start + ROLLOUT_CHUNK_ROWS, query.shape[2])
            chunk_positions = torch.arange(start, stop, device=query.device).expand(query.shape[0], -1)
            chunk_rows, chunk_query = rows[..., start:stop], query[:, :, start:stop]
        else:
            chunk_positions = positions[:, start : start + ROLLOUT_CHUNK_ROWS]
            chunk_rows, chunk_query = None, _gather_positions(query, chunk_positions)
        chunk = checkpoint(
            _map_rows, chunk_rows, chunk_query, key, mask, key_mask, chunk_positions, causal, heads, recorder.scaling,
            use_reentrant=False, preserve_rng_state=False,
        )  # fmt: skip
        if positions is not None:
            chunks.append(chunk)
        else:  # a running sum: one (B, K, N) product at a time (an add saves nothing for the backward)
            product = chunk if product is None else product + chunk
    return torch.cat(chunks, dim=1) if positions is not None else product


def _semi_direct_supervised_rows(recorder, layers, layout, rows: _SupervisedRows, heads, key_mask, causal):
    """The rollout's supervised rows only: e^T R_l = e^T A~_l ... A~_0, multiplied left to right (Abnar & Zuidema's
    R_l = A~_l R_{l-1}, R_{-1} = I), each factor chunked and recomputed in the backward: per layer O((K + chunk) x N)
    memory and O(N^2 x (K + heads x head_dim)) time for K supervised rows, where the full rollout keeps O(N^2) and
    takes O(N^3)."""
    positions, losses = rows.positions(layout), []
    for layer in layers:
        rollout_rows = _times_layer(None, recorder, layer, positions, key_mask, causal, heads)
        for earlier in range(layer - 1, -1, -1):
            rollout_rows = _times_layer(rollout_rows, recorder, earlier, None, key_mask, causal, heads)
        losses.append(_rollout_losses(rollout_rows, layout, rows))
    return torch.stack(losses).mean()


def sequence_masks(batch: dict, layout: PatchLayout, sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_mask, text_mask), each (B, `sequence_length`) over the model's whole sequence: ViLT appends its image
    [CLS] and patches after the text, so the collator's text-only mask is extended (the [CLS] is real, patches follow
    `patch_mask`); LLaVA and PaliGemma hold the image in `input_ids`."""
    attention_mask = batch["attention_mask"].bool()
    text_length = attention_mask.shape[1]
    if sequence_length == text_length:
        is_image = torch.zeros_like(attention_mask).scatter(1, layout.image_positions.to(attention_mask.device), True)
        return attention_mask, attention_mask & ~is_image
    image_cls = torch.ones_like(attention_mask[:, :1])
    key_mask = torch.cat([attention_mask, image_cls, layout.patch_mask.to(attention_mask.device)], dim=1)
    text_mask = torch.cat([attention_mask, torch.zeros_like(key_mask[:, text_length:])], dim=1)
    return key_mask, text_mask


def _supervised_rows(
    recorder: AttentionRecorder, batch: dict, layout: PatchLayout, text_mask: torch.Tensor, counts: tuple
) -> _SupervisedRows:
    """The batch's grounded rows and targets (and, where image tokens attend to the text, eq. 7's text columns)."""
    target = token_alignment(batch["word_cell_alignment"], layout)
    grounded = batch["grounded_token_positions"].to(target.device)
    if not recorder.family.image_attends_to_text:
        return _SupervisedRows(grounded, target, counts)
    text = _text_positions(layout, text_mask.shape[1]).to(target.device)
    image_target = _image_to_text_target(target, grounded, text, text_mask.shape[1])
    text_mask = _gather_rows(text_mask, text).to(target.device)
    return _SupervisedRows(grounded, target, counts, text, text_mask, image_target)


def patch_attention_loss(
    recorder: AttentionRecorder,
    batch: dict,
    layout: PatchLayout,
    method: str = "direct",
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    num_rows: torch.Tensor | None = None,
    num_image_rows: torch.Tensor | None = None,
    semi_direct_rollout: str = "supervised_rows",
) -> torch.Tensor:
    """The supervision loss of one batch, averaged over the supervised layers (and heads, for "direct").

    Args:
        recorder: the recorder the forward ran in; it recorded `layers` (semi-direct: every layer up to the deepest).
        batch: the `PatchGroundingCollator` batch of the forward: its `attention_mask`, `grounded_token_positions`
            (B, G) and `word_cell_alignment` (B, G, C): per grounded token a distribution over the grid cells (zero
            rows pad the batch).
        layout: where the image tokens are (`forward_with_layout`).
        method: "direct" or "semi_direct".
        layers: supervised layers (default: the recorder's).
        heads: supervised heads (default: all; semi-direct averages them in the rollout).
        num_rows: the number of grounded rows to divide by (global under data parallelism); default: this batch's.
        num_image_rows: the same for the image->text direction (ViLT): the grid cells some grounded word's target
            covers (`grounded_cell_count`); default: this batch's.
        semi_direct_rollout: how semi-direct supervision computes the rollout, one of `SEMI_DIRECT_ROLLOUTS`; both give
            the same loss and gradients (tests/vlms/test_patch_models.py).
            - "supervised_rows" (default): only the rollout rows the loss reads (the grounded tokens', and on ViLT
              the image tokens'), e^T R_l = e^T A~_l ... A~_0 multiplied left to right, each layer's attention
              recomputed from the recorded query / key in chunks of `ROLLOUT_CHUNK_ROWS` query rows under
              `torch.utils.checkpoint`: memory linear in the sequence length N for LLaVA / PaliGemma, whose supervised
              rows are the grounded caption tokens' (ViLT's eq. 7 supervises the image rows too).
            - "full": every layer's (B, H, N, N) maps and their (B, N, N) rollout (`supervision.rollout.
              attention_rollout`), kept for the backward: O(N^2) memory and O(N^3) time, the literal rollout.
    """
    if semi_direct_rollout not in SEMI_DIRECT_ROLLOUTS:
        raise ValueError(f"`semi_direct_rollout` must be one of {SEMI_DIRECT_ROLLOUTS}, got {semi_direct_rollout!r}.")
    layers = recorder.layers if layers is None else list(layers)
    sequence_length = recorder.queries[layers[0]].shape[2]
    key_mask, text_mask = sequence_masks(batch, layout, sequence_length)
    # the loss reads only the grounded tokens' rows (every other row's target is zero): (B, G, P), linear in P
    rows = _supervised_rows(recorder, batch, layout, text_mask, (num_rows, num_image_rows))
    if method == "direct":
        return _direct_loss(recorder, layers, layout, rows, heads)
    semi_direct = _semi_direct_full if semi_direct_rollout == "full" else _semi_direct_supervised_rows
    # without image->text attention (LLaVA, PaliGemma) the language model's mask is causal
    causal = not recorder.family.image_attends_to_text
    return semi_direct(recorder, layers, layout, rows, heads, key_mask.to(rows.target.device), causal)
