"""Conversion of transformers' LXMERT checkpoints (e.g. `unc-nlp/lxmert-base-uncased`) into the two-stream model, with
`share_cross_attention=True` (LXMERT shares one cross-attention module between the two directions). Every tensor is
renamed, none re-initialised: a key left over on either side is an error naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

from transformers import LxmertConfig, LxmertForPreTraining, LxmertForQuestionAnswering, LxmertModel, PreTrainedModel

from ..models.two_stream import TwoStreamConfig, TwoStreamForPreTraining, TwoStreamForQuestionAnswering, TwoStreamModel
from .conversion import load_converted_state

# LXMERT parameter name -> two-stream parameter name (applied in order, on names relative to the base model)
BASE_RENAMES = (
    (r"^encoder\.visn_fc\.visn_fc\.", "visual_embeddings.feature_projection."),
    (r"^encoder\.visn_fc\.visn_layer_norm\.", "visual_embeddings.feature_layer_norm."),
    (r"^encoder\.visn_fc\.box_fc\.", "visual_embeddings.box_projection."),
    (r"^encoder\.visn_fc\.box_layer_norm\.", "visual_embeddings.box_layer_norm."),
    (r"^encoder\.layer\.", "encoder.language_layers."),
    (r"^encoder\.r_layers\.", "encoder.vision_layers."),
    (r"^encoder\.x_layers\.(\d+)\.visual_attention\.att\.", r"encoder.cross_layers.\1.cross_attention.self."),
    (r"^encoder\.x_layers\.(\d+)\.visual_attention\.output\.", r"encoder.cross_layers.\1.cross_attention.output."),
    (r"^encoder\.x_layers\.(\d+)\.lang_self_att\.", r"encoder.cross_layers.\1.language_self_attention."),
    (r"^encoder\.x_layers\.(\d+)\.visn_self_att\.", r"encoder.cross_layers.\1.vision_self_attention."),
    (r"^encoder\.x_layers\.(\d+)\.lang_inter\.", r"encoder.cross_layers.\1.language_intermediate."),
    (r"^encoder\.x_layers\.(\d+)\.lang_output\.", r"encoder.cross_layers.\1.language_output."),
    (r"^encoder\.x_layers\.(\d+)\.visn_inter\.", r"encoder.cross_layers.\1.vision_intermediate."),
    (r"^encoder\.x_layers\.(\d+)\.visn_output\.", r"encoder.cross_layers.\1.vision_output."),
)
HEAD_RENAMES = (
    (r"^lxmert\.", "two_stream."),
    (r"^cls\.predictions\.", "lm_head."),
    (r"^cls\.seq_relationship\.", "matching_head."),
    (r"^obj_predict_head\.transform\.", "object_head.transform."),
    (r"^obj_predict_head\.decoder_dict\.obj\.", "object_head.class_decoder."),
    (r"^obj_predict_head\.decoder_dict\.attr\.", "object_head.attribute_decoder."),
    (r"^obj_predict_head\.decoder_dict\.feat\.", "object_head.feature_decoder."),
    (r"^answer_head\.logit_fc\.0\.", "answer_head.dense."),
    (r"^answer_head\.logit_fc\.2\.", "answer_head.LayerNorm."),
    (r"^answer_head\.logit_fc\.3\.", "answer_head.classifier."),
)
SHARED_CONFIG_FIELDS = (
    "vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size", "initializer_range", "l_layers",
    "r_layers", "x_layers", "visual_feat_dim", "visual_pos_dim", "num_object_labels", "num_attr_labels",
    "num_qa_labels", "task_mask_lm", "task_obj_predict", "task_matched", "task_qa", "visual_obj_loss",
    "visual_attr_loss", "visual_feat_loss",
)  # fmt: skip
TARGET_CLASSES = {
    LxmertModel: TwoStreamModel,
    LxmertForPreTraining: TwoStreamForPreTraining,
    LxmertForQuestionAnswering: TwoStreamForQuestionAnswering,
}


def two_stream_config_from_lxmert(config: LxmertConfig, **overrides) -> TwoStreamConfig:
    """The [`TwoStreamConfig`] of the same architecture (LXMERT's LayerNorm epsilon is 1e-12, its cross-attention shared)."""
    fields = {name: getattr(config, name) for name in SHARED_CONFIG_FIELDS}
    if config.num_qa_labels < 1:
        fields["num_qa_labels"] = 1  # LxmertModel checkpoints may leave the answer vocabulary empty
    # LXMERT's `visn_fc` projects raw detector features: no standardisation (and no statistics to convert)
    settings = {"layer_norm_eps": 1e-12, "share_cross_attention": True, "visual_feature_normalization": "none"}
    return TwoStreamConfig(**fields, **{**settings, **overrides})


def rename_lxmert_key(key: str) -> str:
    """One LXMERT parameter name -> its two-stream name (base-model names and head names alike)."""
    for pattern, replacement in HEAD_RENAMES:
        key = re.sub(pattern, replacement, key)
    prefix = "two_stream." if key.startswith("two_stream.") else ""
    base_key = key[len(prefix) :]
    for pattern, replacement in BASE_RENAMES:
        base_key = re.sub(pattern, replacement, base_key)
    return prefix + base_key


def convert_lxmert(model_or_path: PreTrainedModel | str | Path, **config_overrides) -> PreTrainedModel:
    """Maps transformers' Lxmert weights into the two-stream model with shared cross-attention.

    Args:
        model_or_path: an `LxmertModel`, `LxmertForPreTraining` or `LxmertForQuestionAnswering`, or a Hub id / local
            folder of one (loaded with the class its config names).
        config_overrides: further [`TwoStreamConfig`] fields (e.g. `attention_supervision`, `task_alignment`).
    Returns:
        `TwoStreamModel`, `TwoStreamForPreTraining` or `TwoStreamForQuestionAnswering`, in eval mode.
    """
    source = _load_lxmert(model_or_path)
    target_class = next((target for cls, target in TARGET_CLASSES.items() if isinstance(source, cls)), None)
    if target_class is None:
        raise ValueError(
            f"`model_or_path` must be one of {[cls.__name__ for cls in TARGET_CLASSES]}, got {type(source).__name__}."
        )
    target = target_class(two_stream_config_from_lxmert(source.config, **config_overrides))
    renamed = {rename_lxmert_key(key): tensor for key, tensor in source.state_dict().items()}
    return load_converted_state(target, renamed, "LXMERT", "two-stream", _is_tied_or_new)


def _load_lxmert(model_or_path) -> PreTrainedModel:
    if isinstance(model_or_path, PreTrainedModel):
        return model_or_path
    config = LxmertConfig.from_pretrained(model_or_path)
    architecture = (config.architectures or ["LxmertModel"])[0]
    classes = {cls.__name__: cls for cls in TARGET_CLASSES}
    if architecture not in classes:
        raise ValueError(
            f"`model_or_path` {str(model_or_path)!r} holds a {architecture}, not one of {sorted(classes)}."
        )
    return classes[architecture].from_pretrained(model_or_path)


def _is_tied_or_new(key: str) -> bool:
    """Keys LXMERT does not store: the tied decoder and, in the pre-training model, the alignment decoder (new)."""
    return key == "lm_head.decoder.weight" or key.startswith("alignment_decoder.")


__all__ = ["convert_lxmert", "rename_lxmert_key", "two_stream_config_from_lxmert"]
