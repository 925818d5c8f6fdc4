"""PyTorch region captioner: a geometry-aware transformer encoder over detected objects (Ilinykh, after Herdade et al.'s
Object Relation Transformer: attention = softmax(log(Omega_G) + QK^T / sqrt(d)), Omega_G = ReLU(Emb(lambda) W_G) from
the relative box geometry lambda) and a caption decoder whose cross-attention can be aligned by Fei's A2 learnable mask
perturbation (`supervision/perturbation.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.bart.modeling_bart import shift_tokens_right  # [start] + labels[:-1], -100 read as padding
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple

from ...supervision.perturbation import AttentionPerturbation, PerturbationLinear, mask_objective
from ...utils.item_counts import count_labeled, mean_cross_entropy, num_items
from ...utils.size_limits import check_generation_sizes
from ...utils.validation import (
    check_binary_mask,
    check_in_range,
    check_integer,
    check_no_target_on_padding,
    check_rank,
    check_region_shapes,
    check_region_values,
    checks_values,
    regions_in_dtype,
    require,
)
from ..attention_utils import key_padding_mask_4d, run_attention
from ..dropout import apply_dropout, make_dropout
from ..forward_kwargs import check_batch_not_empty, check_forward_kwargs, output_flag
from ..saving import SaveLoadMixin
from ..text_init import load_text_model
from ..visual_features import VisualFeatureStatisticsMixin, init_feature_normalization, make_feature_normalization
from .configuration_captioning import RegionCaptionerConfig

@dataclass
class RegionCaptionerModelOutput(ModelOutput):
    r"""
    last_hidden_state (`(batch, T, d_model)`): the decoder's last layer.
    alignment_masks (`tuple(torch.FloatTensor)`, *optional*): per aligned decoder layer, A2's mask m (batch, heads, T,
        R). The other fields are those of [`RegionCaptionerOutput`].
    """

    last_hidden_state: torch.FloatTensor | None = None
    cache: Cache | None = None
    decoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_last_hidden_state: torch.FloatTensor | None = None
    encoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    decoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    aligned_cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    alignment_masks: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class RegionCaptionerOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor`, *optional*): `loss_caption`, or `loss_mask` when `alignment_mode="perturb"`.
    loss_caption (`torch.FloatTensor`, *optional*): token cross-entropy of the caption (L_IC).
    loss_mask (`torch.FloatTensor`, *optional*): the mask objective of A2 (eq. 4), in "perturb" mode.
    mask_mean (`torch.FloatTensor`, *optional*): mean of the perturbation masks m over the aligned layers.
    logits (`(batch, T, vocab_size)`): next-token scores.
    cache (`EncoderDecoderCache`, *optional*): the decoder's self- and cross-attention cache.
    encoder_last_hidden_state (`(batch, R, d_model)`): the encoded regions.
    encoder_attentions / decoder_attentions / cross_attentions (`tuple(torch.FloatTensor)`, *optional*): per layer,
        encoder self-attention (batch, heads, R, R), decoder self-attention (batch, heads, T, T_total) and decoder
        cross-attention (batch, heads, T, R), probabilities before dropout and, for cross-attention, before alignment.
    aligned_cross_attentions (`tuple(torch.FloatTensor)`, *optional*): per decoder layer, the cross-attention actually
        used (after A2's alignment or perturbation in the aligned layers, the same as `cross_attentions` elsewhere).
    alignment_masks (`tuple(torch.FloatTensor)`, *optional*): with `output_attentions`, per aligned decoder layer, A2's
        mask m (batch, heads, T, R) of eq. 2 (what `hf_vlalign.supervision.perturbation.a2_diagnostics` reads).
    decoder_hidden_states / encoder_hidden_states (`tuple(torch.FloatTensor)`, *optional*): with
        `output_hidden_states`, the embeddings and the output of every layer, (batch, T, d_model) / (batch, R,
        d_model), as BART returns them (with `normalize_before` the last one is after the final LayerNorm, as mBART's).
    """

    loss: torch.FloatTensor | None = None
    loss_caption: torch.FloatTensor | None = None
    loss_mask: torch.FloatTensor | None = None
    mask_mean: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    cache: Cache | None = None
    decoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_last_hidden_state: torch.FloatTensor | None = None
    encoder_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    decoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    aligned_cross_attentions: tuple[torch.FloatTensor, ...] | None = None
    alignment_masks: tuple[torch.FloatTensor, ...] | None = None


# ----------------------------------------------------------------------------------------------------------------
# Geometry
# ----------------------------------------------------------------------------------------------------------------


def box_geometry(boxes: torch.Tensor, floor: float = 1e-3) -> torch.Tensor:
    """Relative geometry lambda(m, n) of every pair of boxes (Ilinykh's slides, after the Object Relation Transformer):
    (log(|x_m - x_n| / w_m), log(|y_m - y_n| / h_m), log(w_n / w_m), log(h_n / h_m)) from box centres and sizes.

    Args:
        boxes: (B, R, 4) x1, y1, x2, y2 with x2 > x1 and y2 > y1.
        floor: |dx| / w and |dy| / h are clamped to at least `floor` before the log, so identical centres give
            log(floor) instead of -inf (the Object Relation Transformer's code uses 1e-3).
    Returns:
        (B, R, R, 4): entry [b, m, n] is lambda(m, n).
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    width, height = (x2 - x1), (y2 - y1)
    centre_x, centre_y = (x1 + x2) / 2, (y1 + y2) / 2
    dx = (centre_x[:, :, None] - centre_x[:, None, :]).abs() / width[:, :, None]
    dy = (centre_y[:, :, None] - centre_y[:, None, :]).abs() / height[:, :, None]
    dw = width[:, None, :] / width[:, :, None]
    dh = height[:, None, :] / height[:, :, None]
    return torch.stack([dx.clamp(min=floor).log(), dy.clamp(min=floor).log(), dw.log(), dh.log()], dim=-1)


def sinusoidal_geometry_embedding(geometry: torch.Tensor, dim: int, wave_length: float = 1000.0) -> torch.Tensor:
    """E = Emb(lambda): each of the 4 values through dim / 8 sine and dim / 8 cosine frequencies (the Object Relation
    Transformer's embedding, with its scale of 100): (..., 4) -> (..., dim)."""
    frequencies = wave_length ** -(torch.arange(dim // 8, dtype=geometry.dtype, device=geometry.device) / (dim // 8))
    angles = 100.0 * geometry.unsqueeze(-1) * frequencies  # (..., 4, dim / 8)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)


# ----------------------------------------------------------------------------------------------------------------
# Encoder
# ----------------------------------------------------------------------------------------------------------------


class RegionCaptionerRegionEmbeddings(nn.Module):
    """Region features -> d_model: Linear, ReLU, dropout, LayerNorm (the meshed-memory / ORT region embedding). With
    `config.visual_feature_normalization="standardize"` the features are first standardised with the model's stored
    statistics (`feature_normalization`, see `hf_vlalign.models.visual_features`)."""

    def __init__(self, config: RegionCaptionerConfig):
        super().__init__()
        self.feature_normalization = make_feature_normalization(config)
        self.projection = nn.Linear(config.visual_feat_dim, config.d_model)
        self.dropout = make_dropout(config, config.dropout)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, visual_feats: torch.Tensor) -> torch.Tensor:
        if self.feature_normalization is not None:
            visual_feats = self.feature_normalization(visual_feats)
        return self.layer_norm(self.dropout(torch.relu(self.projection(visual_feats))))


class RegionCaptionerAttention(nn.Module):
    """Multi-head attention through `ALL_ATTENTION_FUNCTIONS`; with `key_value_states` it is cross-attention. The
    decoder's attentions read and write an `EncoderDecoderCache` (cross-attention keys are computed once)."""

    def __init__(self, config: RegionCaptionerConfig, num_heads: int, is_causal: bool = False, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def project_key_value(self, hidden_states, key_value_states, cache) -> tuple[torch.Tensor, torch.Tensor]:
        is_cross = key_value_states is not None
        layer_cache = None
        if cache is not None:
            layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
            if is_cross and cache.is_updated.get(self.layer_idx):
                layer = layer_cache.layers[self.layer_idx]
                return layer.keys, layer.values
        source = key_value_states if is_cross else hidden_states
        shape = (*source.shape[:-1], -1, self.head_dim)
        key = self.k_proj(source).view(shape).transpose(1, 2)
        value = self.v_proj(source).view(shape).transpose(1, 2)
        if layer_cache is not None:
            key, value = layer_cache.update(key, value, self.layer_idx)
            if is_cross:
                cache.is_updated[self.layer_idx] = True
        return key, value

    def query(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.q_proj(hidden_states).view(*hidden_states.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        key_value_states: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query = self.query(hidden_states)
        key, value = self.project_key_value(hidden_states, key_value_states, cache)
        attn_output, attn_weights = run_attention(self, query, key, value, attention_mask, self.dropout, output_attentions)
        return self.out_proj(attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()), attn_weights


class GeometryAwareSelfAttention(RegionCaptionerAttention):
    """Encoder self-attention = softmax(log(Omega_G) + QK^T / sqrt(d)), Omega_G = ReLU(E W_G) per head (Ilinykh;
    Herdade et al. eq. 6); the geometry term is passed to the attention function as an additive mask, so `sdpa` runs."""

    def __init__(self, config: RegionCaptionerConfig):
        super().__init__(config, config.encoder_attention_heads)
        self.geometry_projection = nn.Linear(config.geometry_dim, config.encoder_attention_heads) if config.use_geometry else None

    def geometry_bias(self, geometry_embedding: torch.Tensor) -> torch.Tensor:
        """log(max(ReLU(E W_G), 1e-6)): (B, R, R, geometry_dim) -> (B, H, R, R)."""
        omega = torch.relu(self.geometry_projection(geometry_embedding)).permute(0, 3, 1, 2)
        return omega.clamp(min=1e-6).log()


class RegionCaptionerFeedForward(nn.Module):
    def __init__(self, config: RegionCaptionerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation = ACT2FN[config.activation_function]
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.dropout = make_dropout(config, config.dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(self.activation(self.fc1(hidden_states)))))


def residual(hidden_states: torch.Tensor, update: torch.Tensor, layer_norm: nn.LayerNorm, pre_norm: bool) -> torch.Tensor:
    """Post-norm: LayerNorm(x + f(x)); pre-norm: x + f(LayerNorm(x)) (the sub-layer already read the normalised x)."""
    return hidden_states + update if pre_norm else layer_norm(hidden_states + update)


class RegionCaptionerEncoderLayer(GradientCheckpointingLayer):
    """Geometry-aware self-attention and feed-forward network, each with residual and LayerNorm (post-norm, or
    pre-norm with `normalize_before`)."""

    def __init__(self, config: RegionCaptionerConfig):
        super().__init__()
        self.pre_norm = config.normalize_before
        self.self_attn = GeometryAwareSelfAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = RegionCaptionerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.dropout)

    def forward(self, hidden_states, attention_mask, output_attentions=False):
        attn_output, attn_weights = self.self_attn(
            self.self_attn_layer_norm(hidden_states) if self.pre_norm else hidden_states,
            attention_mask,
            output_attentions=output_attentions,
        )
        hidden_states = residual(hidden_states, self.dropout(attn_output), self.self_attn_layer_norm, self.pre_norm)
        update = self.feed_forward(self.final_layer_norm(hidden_states) if self.pre_norm else hidden_states)
        return residual(hidden_states, update, self.final_layer_norm, self.pre_norm), attn_weights


class RegionCaptionerEncoder(nn.Module):
    """Encodes the regions; returns a `BaseModelOutput` (what `generate()` caches as `encoder_outputs`)."""

    def __init__(self, config: RegionCaptionerConfig):
        super().__init__()
        self.config = config
        self.embeddings = RegionCaptionerRegionEmbeddings(config)
        self.layers = nn.ModuleList([RegionCaptionerEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None

    def forward(
        self,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor,
        visual_attention_mask: torch.LongTensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
        validate_inputs: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        check_region_count(self.config, visual_feats)  # first: the geometry below is O(R^2) in memory
        visual_feats, visual_boxes = regions_in_dtype(self.embeddings.projection.weight.dtype, visual_feats, visual_boxes)
        check_region_shapes(self.config, visual_feats, visual_boxes, visual_attention_mask)
        if checks_values(self.config, visual_feats, validate_inputs):
            check_region_values(visual_feats, visual_boxes, visual_attention_mask)
        if visual_attention_mask is None:
            visual_attention_mask = visual_feats.new_ones(visual_feats.shape[:2], dtype=torch.long)
        eager = output_attentions or self.config._attn_implementation == "eager"
        attention_mask = key_padding_mask_4d(visual_attention_mask, visual_feats.dtype, eager=True)
        if self.config.use_geometry:
            # Omega_G depends on the layer (W_G is per layer), E = Emb(lambda) is shared
            geometry = sinusoidal_geometry_embedding(
                box_geometry(padded_boxes(visual_boxes, visual_attention_mask), self.config.geometry_floor),
                self.config.geometry_dim,
            )
        hidden_states = self.embeddings(visual_feats)
        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            layer_mask = attention_mask
            if self.config.use_geometry:
                layer_mask = attention_mask + layer.self_attn.geometry_bias(geometry)
            elif not eager:
                layer_mask = key_padding_mask_4d(visual_attention_mask, visual_feats.dtype, eager=False)
            hidden_states, attn_weights = layer(hidden_states, layer_mask, output_attentions)
            if output_attentions:
                all_attentions += (attn_weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions)


def check_caption_batch_not_empty(model, visual_feats, encoder_outputs, decoder_input_ids) -> None:
    """The captioner's batch is that of the regions (`visual_feats`, or the `encoder_outputs` computed from them) and of
    the caption prefix; none may be empty (see [`~hf_vlalign.models.forward_kwargs.check_batch_not_empty`])."""
    check_batch_not_empty(model, "visual_feats", visual_feats)
    if encoder_outputs is not None:
        check_batch_not_empty(model, "encoder_outputs", encoder_outputs[0])
    check_batch_not_empty(model, "decoder_input_ids", decoder_input_ids)


def padded_boxes(visual_boxes: torch.Tensor, visual_attention_mask: torch.Tensor) -> torch.Tensor:
    """Padding regions get the whole-image box, so the geometry of real regions never reads a degenerate box."""
    # filled on the device: a constant copied from a Python list would synchronise with the host on a GPU
    whole_image = torch.cat([visual_boxes.new_zeros(2), visual_boxes.new_ones(2)])
    return torch.where(visual_attention_mask.bool()[..., None], visual_boxes, whole_image)


def check_region_count(config, visual_feats) -> None:
    """At most `config.max_regions` regions: the geometry-aware encoder builds (batch, R, R, geometry_dim) tensors, so
    a region count far above any detector's output is refused before they are allocated."""
    check_rank("visual_feats", visual_feats, 3, "(batch, num_regions, visual_feat_dim)")
    if visual_feats.shape[1] > config.max_regions:
        raise ValueError(
            f"`visual_feats` has {visual_feats.shape[1]} regions, more than `max_regions` ({config.max_regions}) of the "
            "config: the encoder's relative geometry is O(R^2) in memory. Keep the detector's top regions, or raise "
            "`max_regions` in the config."
        )


# ----------------------------------------------------------------------------------------------------------------
# Decoder
# ----------------------------------------------------------------------------------------------------------------


class AlignedCrossAttention(RegionCaptionerAttention):
    """Decoder cross-attention. In an aligned layer (A2) the probabilities a are computed explicitly and replaced by
    the fused aligned attention (eqs. 5-10, mask m fixed) or, in "perturb" mode, by the perturbed attention (eq. 3)."""

    def __init__(self, config: RegionCaptionerConfig, layer_idx: int, aligned: bool):
        super().__init__(config, config.decoder_attention_heads, layer_idx=layer_idx)
        self.perturbation = None
        if aligned:
            self.perturbation = AttentionPerturbation(
                config.d_model,
                config.decoder_attention_heads,
                config.attention_alignment,
                eta=float(config.alignment_eta),
                temperature=float(config.alignment_temperature),
                mask_input=config.alignment_mask_input,
                num_region_slots=config.alignment_mask_regions,
                moving_average=config.alignment_moving_average,
            )

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        key_value_states: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
        region_mask: torch.Tensor | None = None,
        alignment_mode: str = "align",
        alignment_step: int | torch.Tensor = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if self.perturbation is None:
            attn_output, attn_weights = super().forward(
                hidden_states, attention_mask, key_value_states, cache, output_attentions
            )
            return attn_output, attn_weights, attn_weights, None
        query = self.query(hidden_states)
        key, value = self.project_key_value(hidden_states, key_value_states, cache)
        logits = query @ key.transpose(-1, -2) * self.scaling
        probs = torch.softmax(logits + attention_mask if attention_mask is not None else logits, dim=-1)
        # eq. (2), one value per head, step and region (a per-step mask would be undone by the re-normalisation)
        mask = self.perturbation.mask(hidden_states, key_value_states, region_mask)
        if alignment_mode == "perturb":
            used = self.perturbation.perturb(probs, mask)  # eq. (3)
        else:
            queries = query.transpose(1, 2).flatten(2)  # q_t of eq. (10): (B, T, D), the heads' queries concatenated
            used = self.perturbation.align(
                probs, mask.detach(), queries=queries, step=alignment_step, region_mask=region_mask
            )  # eqs. (5-10)
        dropped = apply_dropout(self.config, used, self.dropout, self.training)
        attn_output = (dropped @ value).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.out_proj(attn_output), probs, used, mask


class RegionCaptionerDecoderLayer(GradientCheckpointingLayer):
    """Masked self-attention, cross-attention to the encoded regions, feed-forward network (post-norm)."""

    def __init__(self, config: RegionCaptionerConfig, layer_idx: int, aligned: bool):
        super().__init__()
        self.pre_norm = config.normalize_before
        self.self_attn = RegionCaptionerAttention(config, config.decoder_attention_heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = AlignedCrossAttention(config, layer_idx, aligned)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = RegionCaptionerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.dropout)

    def forward(
        self,
        hidden_states,
        self_attention_mask,
        encoder_hidden_states,
        cross_attention_mask,
        region_mask,
        cache=None,
        output_attentions=False,
        alignment_mode="align",
        alignment_step=0,
    ):
        normed = self.self_attn_layer_norm(hidden_states) if self.pre_norm else hidden_states
        attn_output, self_weights = self.self_attn(
            normed, self_attention_mask, cache=cache, output_attentions=output_attentions
        )
        hidden_states = residual(hidden_states, self.dropout(attn_output), self.self_attn_layer_norm, self.pre_norm)
        attn_output, cross_weights, used_weights, mask = self.encoder_attn(
            self.encoder_attn_layer_norm(hidden_states) if self.pre_norm else hidden_states,
            cross_attention_mask,
            key_value_states=encoder_hidden_states,
            cache=cache,
            output_attentions=output_attentions,
            region_mask=region_mask,
            alignment_mode=alignment_mode,
            alignment_step=alignment_step,
        )
        hidden_states = residual(hidden_states, self.dropout(attn_output), self.encoder_attn_layer_norm, self.pre_norm)
        update = self.feed_forward(self.final_layer_norm(hidden_states) if self.pre_norm else hidden_states)
        return residual(hidden_states, update, self.final_layer_norm, self.pre_norm), self_weights, cross_weights, used_weights, mask


class RegionCaptionerDecoder(nn.Module):
    def __init__(self, config: RegionCaptionerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.dropout)
        aligned = aligned_layer_indices(config)
        self.layers = nn.ModuleList(
            [RegionCaptionerDecoderLayer(config, index, index in aligned) for index in range(config.decoder_layers)]
        )
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None

    def forward(
        self,
        input_ids: torch.LongTensor,
        encoder_hidden_states: torch.Tensor,
        region_mask: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
        alignment_mode: str = "align",
        alignment_step: int | torch.Tensor = 0,
        output_hidden_states: bool = False,
    ) -> dict:
        past_length = cache.get_seq_length() if cache is not None else 0
        batch, length = input_ids.shape
        if past_length + length > self.config.max_position_embeddings:
            raise ValueError(
                f"`decoder_input_ids` (captions) are limited to `max_position_embeddings` "
                f"({self.config.max_position_embeddings}) tokens, got {past_length + length}; lower `max_new_tokens` or "
                "the caption length."
            )
        positions = torch.arange(past_length, past_length + length, device=input_ids.device)
        hidden_states = self.dropout(self.layernorm_embedding(self.embed_tokens(input_ids) + self.embed_positions(positions)))
        self_mask = causal_mask(attention_mask, batch, length, past_length, hidden_states.dtype, input_ids.device)
        cross_mask = key_padding_mask_4d(region_mask, hidden_states.dtype, eager=True)  # additive: every path reads it
        outputs = {
            "hidden_states": (), "decoder_attentions": (), "cross_attentions": (), "aligned_cross_attentions": (),
            "masks": [],
        }  # fmt: skip
        for layer in self.layers:
            if output_hidden_states:
                outputs["hidden_states"] += (hidden_states,)
            hidden_states, self_weights, cross_weights, used_weights, mask = layer(
                hidden_states, self_mask, encoder_hidden_states, cross_mask, region_mask,
                cache, output_attentions, alignment_mode, alignment_step,
            )  # fmt: skip
            if output_attentions:
                outputs["decoder_attentions"] += (self_weights,)
                outputs["cross_attentions"] += (cross_weights,)
                outputs["aligned_cross_attentions"] += (used_weights,)
            if mask is not None:
                outputs["masks"].append(mask)
        outputs["last_hidden_state"] = hidden_states if self.layer_norm is None else self.layer_norm(hidden_states)
        if output_hidden_states:
            outputs["hidden_states"] += (outputs["last_hidden_state"],)
        return outputs


def aligned_layer_indices(config: RegionCaptionerConfig) -> set[int]:
    if config.attention_alignment == "none":
        return set()
    return set(range(config.decoder_layers)) if config.aligned_layers is None else set(config.aligned_layers)


def causal_mask(attention_mask, batch, length, past_length, dtype, device) -> torch.Tensor:
    """Additive (B, 1, T, past + T) mask: query i sees keys up to its own position and no padded key."""
    total = past_length + length
    query_positions = torch.arange(past_length, total, device=device)[:, None]
    keep = torch.arange(total, device=device)[None, :] <= query_positions
    keep = keep[None, None].expand(batch, 1, length, total)
    if attention_mask is not None:
        keep = keep & attention_mask[:, None, None, -total:].bool()
    return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, torch.finfo(dtype).min)


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


class RegionCaptionerPreTrainedModel(SaveLoadMixin, VisualFeatureStatisticsMixin, PreTrainedModel):
    config_class = RegionCaptionerConfig
    base_model_prefix = "model"
    main_input_name = "visual_feats"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["RegionCaptionerEncoderLayer", "RegionCaptionerDecoderLayer"]
    _layer_count_fields = {"encoder.layers": "encoder_layers", "decoder.layers": "decoder_layers"}
    # the losses divide by the caption-token count of `loss_item_counts` (a dict, passed by `CaptioningTrainer`), not by
    # the tensor transformers' Trainer would pass through `**kwargs`
    accepts_loss_kwargs = False

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, PerturbationLinear):
            module.init_parameters()  # A2's own initialisation: m starts near 1 (no perturbation), not at sigmoid(0)
            return
        super()._init_weights(module)
        init_feature_normalization(module)
        if isinstance(module, RegionCaptionerModel):
            init.zeros_(module.alignment_step)  # a persistent buffer: a model built on the meta device gets it here


class RegionCaptionerModel(RegionCaptionerPreTrainedModel):
    """Encoder over regions + caption decoder (without the language-modelling head)."""

    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]

    def __init__(self, config: RegionCaptionerConfig):
        super().__init__(config)
        self.encoder = RegionCaptionerEncoder(config)
        self.decoder = RegionCaptionerDecoder(config)
        self.register_buffer("alignment_step", torch.zeros((), dtype=torch.long), persistent=True)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.decoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache")
    def forward(
        self,
        visual_feats: torch.FloatTensor | None = None,
        visual_boxes: torch.FloatTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.LongTensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        alignment_mode: str = "align",
        **kwargs: Unpack[TransformersKwargs],
    ) -> RegionCaptionerModelOutput:
        r"""
        Encodes the regions (unless `encoder_outputs` are given) and decodes `decoder_input_ids`. alignment_mode:
        "align" (aligned cross-attention, A2's masks fixed) or "perturb" (perturbed cross-attention, eq. 3).
        """
        if alignment_mode not in ("align", "perturb"):
            raise ValueError(f"`alignment_mode` must be 'align' or 'perturb', got {alignment_mode!r}.")
        check_forward_kwargs(self, kwargs)
        check_caption_batch_not_empty(self, visual_feats, encoder_outputs, decoder_input_ids)
        output_attentions = output_flag("output_attentions", kwargs, self.config)
        output_hidden_states = output_flag("output_hidden_states", kwargs, self.config)
        if encoder_outputs is None:
            if visual_feats is None or visual_boxes is None:
                raise ValueError("`visual_feats` and `visual_boxes` are required when `encoder_outputs` is not given.")
            encoder_outputs = self.encoder(
                visual_feats,
                visual_boxes,
                visual_attention_mask,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                validate_inputs=kwargs.get("validate_inputs"),
            )
        elif isinstance(encoder_outputs, tuple):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        encoder_states = encoder_outputs.last_hidden_state
        if visual_attention_mask is None:
            visual_attention_mask = encoder_states.new_ones(encoder_states.shape[:2], dtype=torch.long)
        if decoder_input_ids is None:
            raise ValueError("`decoder_input_ids` (or `labels`) are required to run the decoder.")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        decoded = self.decoder(
            decoder_input_ids,
            encoder_states,
            visual_attention_mask,
            attention_mask=decoder_attention_mask,
            cache=cache if use_cache else None,
            output_attentions=output_attentions,
            alignment_mode=alignment_mode,
            # the training step s of A2's exponential-decay fusion (eq. 8), a 0-d tensor that stays on the device (the
            # fusion's weight is computed from it there); the other fusions do not use it
            alignment_step=self.alignment_step if self.config.attention_alignment == "exp_decay" else 0,
            output_hidden_states=output_hidden_states,
        )
        return RegionCaptionerModelOutput(
            last_hidden_state=decoded["last_hidden_state"],
            cache=cache if use_cache else None,
            decoder_hidden_states=decoded["hidden_states"] or None,
            encoder_last_hidden_state=encoder_states,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            decoder_attentions=decoded["decoder_attentions"] or None,
            cross_attentions=decoded["cross_attentions"] or None,
            aligned_cross_attentions=decoded["aligned_cross_attentions"] or None,
            alignment_masks=tuple(decoded["masks"]) or None,
        )


class RegionCaptionerForConditionalGeneration(RegionCaptionerPreTrainedModel, GenerationMixin):
    """Region captioner with a language-modelling head tied to the word embeddings; `generate()` gives greedy or beam
    search with a KV cache (`max_new_tokens`, `num_beams`, `length_penalty`, ...).

    With `attention_alignment` set, training alternates two steps (`CaptioningTrainer`): the mask networks minimise
    the mask objective (eq. 4) on the perturbed attention (`alignment_mode="perturb"`, gradient taken w.r.t. the mask
    parameters only), then the captioner minimises the caption loss on the aligned attention (masks fixed).
    """

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}

    def __init__(self, config: RegionCaptionerConfig):
        super().__init__(config)
        self.model = RegionCaptionerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def mask_parameters(self) -> list[nn.Parameter]:
        """The A2 mask networks' parameters (updated by the mask objective only)."""
        return [p for module in self.modules() if isinstance(module, AttentionPerturbation) for p in module.mask_parameters()]

    @classmethod
    def from_text_pretrained(cls, name_or_path: str | Path | None = None, **config_overrides):
        """A captioner whose word embeddings (and tied output layer) are copied from a BERT-family checkpoint (default:
        the packaged MiniLM); `d_model` and `vocab_size` follow the checkpoint, everything else is newly initialised."""
        name_or_path, text_model = load_text_model(name_or_path)
        embeddings = text_model.get_input_embeddings().weight
        fixed = {"vocab_size": embeddings.shape[0], "d_model": embeddings.shape[1]}
        clashing = {k: v for k, v in config_overrides.items() if k in fixed and v != fixed[k]}
        if clashing:
            raise ValueError(f"`config_overrides` may not change {sorted(clashing)}: the checkpoint {name_or_path!r} has {fixed}.")
        model = cls(cls.config_class(**{**config_overrides, **fixed}))
        with torch.no_grad():
            model.model.decoder.embed_tokens.weight.copy_(embeddings)
        return model

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache")
    def forward(
        self,
        visual_feats: torch.FloatTensor | None = None,
        visual_boxes: torch.FloatTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        alignment_mode: str = "align",
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> RegionCaptionerOutput:
        r"""
        visual_feats (`(batch, R, visual_feat_dim)`), visual_boxes (`(batch, R, 4)` x1, y1, x2, y2 in [0, 1]): the
        regions. visual_attention_mask (`(batch, R)`): 1 for real regions, 0 for padding; without it every region is
        attended (all-zero padding boxes are refused, all-zero features warn, padding with valid-looking boxes and
        features cannot be detected). labels (`(batch, T)`): caption tokens ending with [SEP], -100 on padding; the
        decoder reads them shifted right after `decoder_start_token_id`.
        alignment_mode: "align" (the captioner's forward, aligned attention with the masks fixed) or "perturb" (the
        mask networks' step: perturbed attention, `loss` is the mask objective).
        global_item_counts (`dict[str, torch.Tensor]`, *optional*): `{"caption": n}`, the global number of caption
        tokens that the caption loss and the mask objective divide by (data parallelism, gradient accumulation;
        `CaptioningTrainer` passes it); default: this batch's.
        validate_inputs (`bool`, *optional*): also check the values of the inputs (a host read on an accelerator);
        default: on the CPU in eager mode when `config.validate_inputs` is on. Shapes and dtypes are always checked.
        """
        check_forward_kwargs(self, kwargs)
        check_caption_batch_not_empty(self, visual_feats, encoder_outputs, decoder_input_ids)
        check_batch_not_empty(self, "labels", labels)
        tokens = labels if labels is not None else decoder_input_ids
        values = tokens is not None and checks_values(self.config, tokens, kwargs.get("validate_inputs"))
        self._check_decoder_inputs(labels, decoder_input_ids, decoder_attention_mask, cache, values)
        if labels is not None:
            if decoder_input_ids is None:
                decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
            if decoder_attention_mask is not None and decoder_attention_mask.shape == labels.shape:
                decoder_attention_mask = torch.cat(
                    [decoder_attention_mask.new_ones(labels.shape[0], 1), decoder_attention_mask[:, :-1]], dim=1
                )
        if decoder_input_ids is not None:
            self._check_tokens(decoder_input_ids, labels, values)
        outputs = self.model(
            visual_feats,
            visual_boxes,
            visual_attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            use_cache=use_cache,
            alignment_mode=alignment_mode,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss_caption = loss_mask = mask_mean = None
        caption_tokens = num_items(global_item_counts, "caption")
        if labels is not None:
            loss_caption = mean_cross_entropy(logits.flatten(0, 1), labels.flatten(), caption_tokens)
        masks = outputs.alignment_masks or ()
        if masks:
            mask_mean = torch.stack([mask.detach().mean() for mask in masks]).mean()
        if alignment_mode == "perturb" and loss_caption is not None:
            if not masks:
                raise ValueError("`alignment_mode='perturb'` needs aligned layers: set `attention_alignment` in the config.")
            valid = (labels != -100)
            # eq. (4): the mask networks maximise the caption loss under the smallest perturbation
            loss_mask = mask_objective(loss_caption, masks, float(self.config.mask_weight), valid, caption_tokens)
        return RegionCaptionerOutput(
            loss=loss_mask if alignment_mode == "perturb" else loss_caption,
            loss_caption=loss_caption,
            loss_mask=loss_mask,
            mask_mean=mask_mean,
            logits=logits,
            alignment_masks=(outputs.alignment_masks if kwargs.get("output_attentions", self.config.output_attentions) else None),
            **{name: value for name, value in outputs.items() if name not in ("last_hidden_state", "alignment_masks")},
        )

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The caption tokens (labels that are not -100) the caption loss and the mask objective average over, as
        `global_item_counts` reads them; see [`~hf_vlalign.utils.item_counts`]."""
        return {"caption": count_labeled(inputs.get("labels"))}

    def _check_decoder_inputs(self, labels, decoder_input_ids, decoder_attention_mask, cache, values: bool) -> None:
        """Before the labels are shifted: (B, T) integer `labels`, and a `decoder_attention_mask` of the labels' shape
        (or, without labels, of the cached plus new `decoder_input_ids`); with `values`, 0/1 and keeping every target."""
        if labels is not None:
            check_rank("labels", labels, 2, "(batch, caption_length)")
            check_integer("labels", labels)
        if decoder_attention_mask is None:
            return
        check_rank("decoder_attention_mask", decoder_attention_mask, 2, "(batch, caption_length)")
        if labels is not None:
            expected, source = tuple(labels.shape), "`labels`"
        elif decoder_input_ids is not None:
            past = cache.get_seq_length() if cache is not None else 0
            expected, source = (decoder_input_ids.shape[0], past + decoder_input_ids.shape[1]), "cached + `decoder_input_ids`"
        else:
            return
        if tuple(decoder_attention_mask.shape) != expected:
            raise ValueError(
                f"`decoder_attention_mask` must have the shape of {source} {expected}, got {tuple(decoder_attention_mask.shape)}."
            )
        if not values:
            return
        check_binary_mask("decoder_attention_mask", decoder_attention_mask)
        if labels is not None:
            check_no_target_on_padding("labels", labels, decoder_attention_mask, "decoder_attention_mask")

    def _check_tokens(self, decoder_input_ids: torch.Tensor, labels: torch.Tensor | None, values: bool) -> None:
        check_rank("decoder_input_ids", decoder_input_ids, 2, "(batch, caption_length)")
        check_integer("decoder_input_ids", decoder_input_ids)
        if not values:
            return
        if labels is not None:  # first: `decoder_input_ids` are often the labels shifted right
            require(
                (labels != -100).any(),
                "`labels` must hold at least one caption token (not -100)",
                lambda: f"got none in shape {tuple(labels.shape)}; the caption loss of an empty batch is undefined",
            )
            check_in_range("labels", labels, self.config.vocab_size, "(vocab_size)", ignore_index=-100, what="token ids")
        check_in_range("decoder_input_ids", decoder_input_ids, self.config.vocab_size, "(vocab_size)")

    def generate(
        self,
        visual_feats: torch.FloatTensor | None = None,
        visual_boxes: torch.FloatTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        **kwargs,
    ) -> torch.LongTensor:
        r"""`GenerationMixin.generate` over the regions (greedy or beam search), after checking what it would otherwise
        fail on deep inside: `visual_feats` and `visual_boxes` (unless `encoder_outputs` are given), a batch of at
        least one example, `num_beams` >= 1 (argument or generation config), `num_beams` and `max_new_tokens` within
        `MAX_NUM_BEAMS` / `MAX_NEW_TOKENS` (`hf_vlalign.utils.size_limits`), and a `decoder_attention_mask` of the
        prompt's shape, (batch, 1) without `decoder_input_ids`. Every other model keyword argument reaches each
        decoding step's forward (transformers' `prepare_inputs_for_generation`); `output_hidden_states=True` with
        `return_dict_in_generate=True` returns the encoder's and each step's decoder hidden states, as BART's."""
        if kwargs.get("encoder_outputs") is None:
            for name, tensor in (("visual_feats", visual_feats), ("visual_boxes", visual_boxes)):
                if tensor is None:
                    raise ValueError(f"`generate()` needs `{name}` (or `encoder_outputs`), got None.")
        check_caption_batch_not_empty(self, visual_feats, kwargs.get("encoder_outputs"), kwargs.get("decoder_input_ids"))
        generation_config = kwargs.get("generation_config") or self.generation_config
        num_beams = kwargs.get("num_beams")
        num_beams = (generation_config.num_beams or 1) if num_beams is None else num_beams
        if not isinstance(num_beams, int) or isinstance(num_beams, bool) or num_beams < 1:
            raise ValueError(f"`num_beams` must be an integer >= 1 (1: greedy search), got {num_beams!r}.")
        max_new_tokens = kwargs.get("max_new_tokens", generation_config.max_new_tokens)
        check_generation_sizes(num_beams, max_new_tokens)  # before any cache is allocated
        decoder_attention_mask = kwargs.get("decoder_attention_mask")
        if decoder_attention_mask is not None:
            prompt = kwargs.get("decoder_input_ids")
            batch = (visual_feats if visual_feats is not None else kwargs["encoder_outputs"][0]).shape[0]
            expected = tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else (batch, 1)
            if not isinstance(decoder_attention_mask, torch.Tensor) or tuple(decoder_attention_mask.shape) != expected:
                got = tuple(decoder_attention_mask.shape) if isinstance(decoder_attention_mask, torch.Tensor) else decoder_attention_mask
                raise ValueError(
                    f"`decoder_attention_mask` must have the shape of the decoder prompt (`decoder_input_ids`, or the "
                    f"start token) {expected}, got {got}."
                )
            if checks_values(self.config, decoder_attention_mask, kwargs.get("validate_inputs")):
                check_binary_mask("decoder_attention_mask", decoder_attention_mask)
        return super().generate(
            visual_feats=visual_feats, visual_boxes=visual_boxes, visual_attention_mask=visual_attention_mask, **kwargs
        )


__all__ = [
    "RegionCaptionerForConditionalGeneration",
    "RegionCaptionerModel",
    "RegionCaptionerModelOutput",
    "RegionCaptionerOutput",
    "RegionCaptionerPreTrainedModel",
    "box_geometry",
    "shift_tokens_right",
    "sinusoidal_geometry_embedding",
]
