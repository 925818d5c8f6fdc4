"""Conversion of transformers' VisualBERT checkpoints (e.g. `uclanlp/visualbert-vqa-coco-pre`) into the single-stream
model without box embeddings or [END] token (VisualBERT reads `[text tokens] [regions]`).

Every tensor is renamed, none re-initialised: VisualBERT's `visual_projection` is our `feature_projection`; the visual
token type row 1 and position row 0 it adds to every region by default sum to our `segment_embedding`; its one
LayerNorm acts on each position alone, so it is copied into our text and visual LayerNorms. A head model's base
`.visual_bert` is converted, not its heads; calls with other `visual_token_type_ids` or an `image_text_alignment` have
no counterpart here.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import PreTrainedModel, VisualBertConfig, VisualBertModel, VisualBertPreTrainedModel
from transformers.configuration_utils import PreTrainedConfig
from transformers.utils import logging

from ..models.single_stream import SingleStreamConfig, SingleStreamModel
from ..models.text_init import TEXT_CONFIG_FIELDS
from .conversion import load_converted_state

logger = logging.get_logger(__name__)

# VisualBERT base-model name -> single-stream names (applied to names relative to the base model); VisualBERT's one
# shared embedding LayerNorm becomes two equal LayerNorms, one for the text and one for the regions.
RENAMES = (
    (r"^embeddings\.(word|position|token_type)_embeddings\.", (r"embeddings.\1_embeddings.",)),
    (r"^embeddings\.LayerNorm\.", ("embeddings.LayerNorm.", "visual_embeddings.LayerNorm.")),
    (r"^embeddings\.visual_projection\.", ("visual_embeddings.feature_projection.",)),
    (r"^encoder\.layer\.", ("encoder.layer.",)),
    (r"^pooler\.", ("pooler.",)),
)
# the two tables whose rows VisualBERT adds to every region by default, summed into `segment_embedding`
VISUAL_TOKEN_TYPE_KEY = "embeddings.visual_token_type_embeddings.weight"
VISUAL_POSITION_KEY = "embeddings.visual_position_embeddings.weight"
SEGMENT_KEY = "visual_embeddings.segment_embedding"
VISUAL_TOKEN_TYPE = 1  # VisualBertEmbeddings: `visual_token_type_ids` default to ones
VISUAL_POSITION = 0  # VisualBertEmbeddings: visual position ids are zeros without `image_text_alignment`
# single-stream tensors VisualBERT has no counterpart for and that a config override may add: newly initialised heads
NEW_KEY_PATTERN = re.compile(r"^indirect_grounding_head\.")


def single_stream_config_from_visualbert(config: VisualBertConfig, **overrides) -> SingleStreamConfig:
    """The [`SingleStreamConfig`] of the same architecture: BERT's fields copied, `visual_feat_dim` =
    `visual_embedding_dim`, no box embeddings, no [END] token and raw features (`visual_feature_normalization="none"`).

    Args:
        config: the `VisualBertConfig` of the source model.
        overrides: further [`SingleStreamConfig`] fields (e.g. `attention_supervision`).
    """
    check_visualbert_config(config)
    fields = {name: getattr(config, name) for name in TEXT_CONFIG_FIELDS}
    fields.update(
        visual_feat_dim=config.visual_embedding_dim,
        use_box_embeddings=False,
        use_end_token=False,
        visual_feature_normalization="none",
    )
    return SingleStreamConfig(**{**fields, **overrides})


def check_visualbert_config(config: VisualBertConfig) -> None:
    """Raises `ValueError` for VisualBERT variants the single-stream model cannot reproduce."""
    if not isinstance(config, VisualBertConfig):
        raise ValueError(f"`config` must be a VisualBertConfig, got {type(config).__name__}.")
    if config.bypass_transformer:
        raise ValueError(
            "`config.bypass_transformer` must be False: a VisualBERT that runs the text alone through the encoder and "
            "adds the regions in one extra layer has no single-stream counterpart, got True."
        )
    if config.type_vocab_size <= VISUAL_TOKEN_TYPE:
        raise ValueError(
            f"`config.type_vocab_size` must be >= {VISUAL_TOKEN_TYPE + 1} (regions have token type "
            f"{VISUAL_TOKEN_TYPE}), got {config.type_vocab_size}."
        )


def rename_visualbert_key(key: str) -> tuple[str, ...]:
    """The single-stream names of one VisualBERT base-model tensor (two for the shared embedding LayerNorm); raises
    `ValueError` for a name without a place (the visual token type / position tables are folded by
    `convert_visualbert_state_dict`)."""
    for pattern, replacements in RENAMES:
        if re.match(pattern, key):
            return tuple(re.sub(pattern, replacement, key) for replacement in replacements)
    raise ValueError(f"VisualBERT tensor {key!r} has no place in the single-stream model.")


def convert_visualbert_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A VisualBERT base-model state dict (names relative to `VisualBertModel`) -> single-stream tensors.

    Raises `ValueError` naming every tensor that has no place, and the visual tables if one is missing.
    """
    missing = [key for key in (VISUAL_TOKEN_TYPE_KEY, VISUAL_POSITION_KEY) if key not in state_dict]
    if missing:
        raise ValueError(f"`state_dict` must hold VisualBERT's visual embedding tables, got none for {missing}.")
    segment = state_dict[VISUAL_TOKEN_TYPE_KEY][VISUAL_TOKEN_TYPE] + state_dict[VISUAL_POSITION_KEY][VISUAL_POSITION]
    converted = {SEGMENT_KEY: segment}
    unplaced = []
    for key, tensor in state_dict.items():
        if key in (VISUAL_TOKEN_TYPE_KEY, VISUAL_POSITION_KEY):
            continue
        try:
            names = rename_visualbert_key(key)
        except ValueError:
            unplaced.append(key)
            continue
        converted.update({name: tensor.clone() for name in names})
    if unplaced:
        raise ValueError(f"VisualBERT tensors without a place in the single-stream model: {sorted(unplaced)}.")
    return converted


def convert_visualbert(model_or_path: PreTrainedModel | str | Path, **config_overrides) -> SingleStreamModel:
    """Maps transformers' VisualBERT weights into a [`SingleStreamModel`] without box embeddings or [END] token, which
    gives the same `last_hidden_state` and `pooler_output` for the same inputs (`visual_feats` being VisualBERT's
    `visual_embeds`, `visual_boxes` optional) with VisualBERT's default visual inputs.

    Args:
        model_or_path: a `VisualBertModel` or a VisualBERT head model (whose base model `.visual_bert` is converted), or
            a Hub id / local folder of either (only the base model's weights are read).
        config_overrides: further [`SingleStreamConfig`] fields (e.g. `attention_supervision="direct"`); the
            architecture fields come from the VisualBERT config.
    Returns:
        `SingleStreamModel` in eval mode.
    """
    source = _load_visualbert(model_or_path)
    if source.pooler is None:
        raise ValueError(
            "`model_or_path` is a VisualBertModel without pooler (add_pooling_layer=False); the single-stream model "
            "has one, which would be left newly initialised."
        )
    target = SingleStreamModel(single_stream_config_from_visualbert(source.config, **config_overrides))
    converted = convert_visualbert_state_dict(source.state_dict())
    return load_converted_state(target, converted, "VisualBERT", "single-stream", NEW_KEY_PATTERN.match)


def _load_visualbert(model_or_path) -> VisualBertModel:
    """The VisualBERT base model of an instance, or of a Hub id / local folder (every base tensor must be there)."""
    if isinstance(model_or_path, PreTrainedModel):
        return _base_model(model_or_path)
    if not isinstance(model_or_path, (str, Path)):
        raise ValueError(
            "`model_or_path` must be a VisualBERT model, a Hub id or a local folder, got "
            f"{type(model_or_path).__name__}."
        )
    config_dict, _ = PreTrainedConfig.get_config_dict(model_or_path)
    model_type = config_dict.get("model_type")
    if model_type != VisualBertConfig.model_type:
        raise ValueError(
            f"`model_or_path` {str(model_or_path)!r} must hold a VisualBERT checkpoint (model_type "
            f"{VisualBertConfig.model_type!r}), got model_type {model_type!r}."
        )
    check_visualbert_config(VisualBertConfig.from_pretrained(model_or_path))
    model, info = VisualBertModel.from_pretrained(model_or_path, output_loading_info=True)
    incomplete = sorted(info.get("missing_keys", ())) + sorted(str(key) for key in info.get("mismatched_keys", ()))
    if incomplete:
        raise ValueError(
            f"`model_or_path` {str(model_or_path)!r} lacks (or mis-shapes) VisualBERT base-model tensors {incomplete}; "
            "they would be newly initialised."
        )
    skipped = sorted(info.get("unexpected_keys", ()))
    if skipped:
        logger.info(f"VisualBERT head tensors not converted (the single-stream model has no such head): {skipped}.")
    return model


def _base_model(model: PreTrainedModel) -> VisualBertModel:
    if isinstance(model, VisualBertModel):
        return model
    base = getattr(model, "visual_bert", None)
    if isinstance(model, VisualBertPreTrainedModel) and isinstance(base, VisualBertModel):
        logger.info(f"Converting the base model of {type(model).__name__}; its heads are not converted.")
        return base
    raise ValueError(
        f"`model_or_path` must be a VisualBertModel or a VisualBERT head model with a `.visual_bert` base model, got "
        f"{type(model).__name__}."
    )


__all__ = [
    "convert_visualbert",
    "convert_visualbert_state_dict",
    "rename_visualbert_key",
    "single_stream_config_from_visualbert",
]
