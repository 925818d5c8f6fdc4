"""PyTorch two-stream vision-and-language transformer (LXMERT style) with weakly supervised word-object alignment.

Kervadec et al. 2020, "Weak supervision helps emergence of word-object alignment": a language self-attention stack
(N_s<-s), an object self-attention stack (N_o<-o) and cross-modality layers (N_o<->s); pre-training with masked words,
masked objects, image-sentence matching, question answering and the object-word alignment decoder (sec. 5). Module
names follow transformers' `modeling_lxmert.py`, so its checkpoints convert exactly (`hf_vlalign.hub.convert_lxmert`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple

from ...supervision.alignment_decoder import AlignmentDecoder, alignment_kl_loss, grounded_word_count
from ...utils.item_counts import count_labeled, count_true, num_items, optional_cross_entropy
from ...utils.validation import default_and_check_inputs, regions_in_dtype
from ..attention_utils import key_padding_mask_4d
from ..bert_modules import (
    AttentionBlock,
    Intermediate,
    LayerOutput,
    Pooler,
    TextEmbeddings,
    TransformerLayer,
)
from ..dropout import make_dropout
from ..forward_kwargs import check_batch_not_empty, check_forward_kwargs, check_head_call, output_flag
from ..pretrained import (
    PhraseGroundingMixin,
    QuestionAnsweringMixin,
    ReferringExpressionMixin,
    VisionLanguagePreTrainedModel,
    VisualReasoningMixin,
)
from ..task_heads import (
    AnswerHead,
    LMPredictionHead,
    PredictionHeadTransform,
    answer_item_count,
    answer_loss,
    check_answer_labels,
    check_labels,
    check_pretraining_shapes,
    check_pretraining_targets,
    masked_feature_loss,
    masked_language_modelling,
)
from ..text_init import TEXT_CONFIG_FIELDS, copy_module_weights, copy_pooler_weights, load_text_model, text_config_fields
from ..visual_features import make_feature_normalization
from .configuration_two_stream import TwoStreamConfig


@dataclass
class TwoStreamModelOutput(ModelOutput):
    r"""
    language_output (`(batch, T, hidden_size)`) / vision_output (`(batch, R, hidden_size)`): last cross layer's states.
    pooler_output (`(batch, hidden_size)`): [CLS] language state through the pooler (BERT's name, as the single-stream
        model's; transformers' Lxmert calls it `pooled_output`).
    loss_attention_supervision (`torch.FloatTensor`, *optional*): attention-supervision loss over the cross layers.
    language_hidden_states / vision_hidden_states (`tuple(torch.FloatTensor)`, *optional*): outputs of every language
        (resp. object) layer followed by every cross layer, as transformers' Lxmert returns them.
    language_attentions / vision_attentions (`tuple(torch.FloatTensor)`, *optional*): self-attention probabilities of the
        single-modality stacks, (batch, heads, T, T) / (batch, heads, R, R).
    cross_encoder_attentions (`tuple(torch.FloatTensor)`, *optional*): per cross layer, language->vision attention
        (batch, heads, T, R) (the direction transformers' Lxmert returns).
    cross_encoder_vision_attentions (`tuple(torch.FloatTensor)`, *optional*): per cross layer, vision->language
        attention (batch, heads, R, T) (which transformers' Lxmert discards).
    Every attention map is a probability before dropout.
    """

    language_output: torch.FloatTensor | None = None
    vision_output: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    language_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    vision_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    language_attentions: tuple[torch.FloatTensor, ...] | None = None
    vision_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_vision_attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TwoStreamForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor`, *optional*): weighted sum of the enabled losses that were computed.
    loss_mlm / loss_object_class / loss_object_attr / loss_region_feature / loss_itm / loss_qa / loss_alignment /
        loss_attention_supervision: each component, unweighted (None when its head is disabled or its labels are
        absent), logged by the trainers under the same names; `loss_region_feature` is the masked objects' feature
        regression.
    prediction_logits (`(batch, T, vocab_size)`): masked language modelling scores (None in training mode when
        `labels` are given: only the masked positions are then scored, for the loss).
    cross_relationship_score (`(batch, 2)`): image-sentence matching scores (0 = mismatched, 1 = matched).
    question_answering_score (`(batch, num_qa_labels)`): answer scores from [CLS].
    alignment_scores (`(batch, T, R)`): scores A_ij of the alignment decoder (eq. 12), when `task_alignment`.
    The hidden states and attention maps are those of [`TwoStreamModelOutput`] (with `output_hidden_states` /
    `output_attentions`), as transformers' `LxmertForPreTrainingOutput` returns them.
    """

    loss: torch.FloatTensor | None = None
    loss_mlm: torch.FloatTensor | None = None
    loss_object_class: torch.FloatTensor | None = None
    loss_object_attr: torch.FloatTensor | None = None
    loss_region_feature: torch.FloatTensor | None = None
    loss_itm: torch.FloatTensor | None = None
    loss_qa: torch.FloatTensor | None = None
    loss_alignment: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    prediction_logits: torch.FloatTensor | None = None
    cross_relationship_score: torch.FloatTensor | None = None
    question_answering_score: torch.FloatTensor | None = None
    alignment_scores: torch.FloatTensor | None = None
    language_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    vision_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    language_attentions: tuple[torch.FloatTensor, ...] | None = None
    vision_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_vision_attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TwoStreamClassificationOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor`, *optional*): `loss_task + attention_supervision_weight * loss_attention_supervision`.
    loss_task / loss_attention_supervision: the components, unweighted.
    logits: answer scores `(batch, num_qa_labels)`, the NLVR2 score `(batch,)`, region scores `(batch, R)`
        (referring expressions) or phrase-region scores `(batch, P, R)` (phrase grounding).
    The hidden states and attention maps are those of [`TwoStreamModelOutput`] (with `output_hidden_states` /
    `output_attentions`); NLVR2's have twice the batch, the sentence with each image of the pair in turn.
    """

    loss: torch.FloatTensor | None = None
    loss_task: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    language_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    vision_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    language_attentions: tuple[torch.FloatTensor, ...] | None = None
    vision_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_encoder_vision_attentions: tuple[torch.FloatTensor, ...] | None = None


ATTENTION_OUTPUT_NAMES = (
    "language_attentions",
    "vision_attentions",
    "cross_encoder_attentions",
    "cross_encoder_vision_attentions",
)
# the per-layer outputs of the base model that every head passes on
LAYER_OUTPUT_NAMES = ("language_hidden_states", "vision_hidden_states", *ATTENTION_OUTPUT_NAMES)


class TwoStreamFeatureProjection(nn.Linear):
    """The object-feature projection. Its bias is initialised like its weights, not at zero: a masked object's all-zero
    feature would otherwise reach the LayerNorm as a constant vector, whose gradient scales with 1/sqrt(eps) = 1e6."""


class TwoStreamVisualEmbeddings(nn.Module):
    """Object embeddings, eq. (1): (LayerNorm(W_f f) + LayerNorm(W_b b)) / 2 from the features f and the box b (LXMERT's
    `visn_fc` / `box_fc`). With `config.visual_feature_normalization="standardize"` f is first standardised with the
    model's stored statistics (`feature_normalization`, see `hf_vlalign.models.visual_features`): the LayerNorm after
    W_f removes the scale of f, not the mean vector that low-dimensional features share."""

    def __init__(self, config: TwoStreamConfig):
        super().__init__()
        self.feature_normalization = make_feature_normalization(config)
        self.feature_projection = TwoStreamFeatureProjection(config.visual_feat_dim, config.hidden_size)
        self.feature_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.box_projection = nn.Linear(config.visual_pos_dim, config.hidden_size)
        self.box_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.hidden_dropout_prob)

    def forward(self, visual_feats: torch.Tensor, visual_boxes: torch.Tensor) -> torch.Tensor:
        if self.feature_normalization is not None:
            visual_feats = self.feature_normalization(visual_feats)
        features = self.feature_layer_norm(self.feature_projection(visual_feats))
        boxes = self.box_layer_norm(self.box_projection(visual_boxes))
        return self.dropout((features + boxes) / 2)


class TwoStreamLayer(TransformerLayer):
    """One single-modality layer (N_s<-s or N_o<-o): self-attention, then the feed-forward network. Its attention
    blocks (here and in the cross layers) are BERT's [`~hf_vlalign.models.bert_modules.AttentionBlock`], attention
    of `hidden_states` over `context`: self-attention, or cross-attention (eqs. 7 and 9)."""


class TwoStreamCrossLayer(GradientCheckpointingLayer):
    """One cross-modality layer (N_o<->s): cross-attention in both directions (eqs. 7, 9), both reading the layer's
    inputs, then each stream's self-attention (eqs. 8, 10), then each stream's feed-forward network. With
    `share_cross_attention` one module serves both directions (LXMERT); otherwise vision queries have their own."""

    def __init__(self, config: TwoStreamConfig):
        super().__init__()
        self.cross_attention = AttentionBlock(config)
        self.vision_cross_attention = None if config.share_cross_attention else AttentionBlock(config)
        self.language_self_attention = AttentionBlock(config)
        self.vision_self_attention = AttentionBlock(config)
        self.language_intermediate = Intermediate(config)
        self.language_output = LayerOutput(config)
        self.vision_intermediate = Intermediate(config)
        self.vision_output = LayerOutput(config)

    def forward(
        self,
        language_states: torch.Tensor,
        language_mask: torch.Tensor | None,
        vision_states: torch.Tensor,
        vision_mask: torch.Tensor | None,
        output_attentions: bool = False,
        return_query_key: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        vision_cross_attention = (
            self.cross_attention if self.vision_cross_attention is None else self.vision_cross_attention
        )
        sublayers = {}
        # eq. (7): words attend to objects; eq. (9): objects attend to words
        sublayers["language_to_vision"] = self.cross_attention(
            language_states, vision_states, vision_mask, output_attentions, return_query_key
        )
        sublayers["vision_to_language"] = vision_cross_attention(
            vision_states, language_states, language_mask, output_attentions, return_query_key
        )
        language_states, vision_states = sublayers["language_to_vision"][0], sublayers["vision_to_language"][0]
        # eqs. (8) and (10): each stream's self-attention
        sublayers["language_self"] = self.language_self_attention(
            language_states, language_states, language_mask, output_attentions, return_query_key
        )
        sublayers["vision_self"] = self.vision_self_attention(
            vision_states, vision_states, vision_mask, output_attentions, return_query_key
        )
        language_states, vision_states = sublayers["language_self"][0], sublayers["vision_self"][0]
        language_states = self.language_output(self.language_intermediate(language_states), language_states)
        vision_states = self.vision_output(self.vision_intermediate(vision_states), vision_states)
        attentions = {name: outputs[1] for name, outputs in sublayers.items()} if output_attentions else {}
        query_key = {name: outputs[2] for name, outputs in sublayers.items()} if return_query_key else {}
        return language_states, vision_states, attentions, query_key


class TwoStreamEncoder(nn.Module):
    def __init__(self, config: TwoStreamConfig):
        super().__init__()
        self.language_layers = nn.ModuleList([TwoStreamLayer(config) for _ in range(config.l_layers)])
        self.vision_layers = nn.ModuleList([TwoStreamLayer(config) for _ in range(config.r_layers)])
        self.cross_layers = nn.ModuleList([TwoStreamCrossLayer(config) for _ in range(config.x_layers)])

    def forward(
        self,
        language_states: torch.Tensor,
        language_mask: torch.Tensor | None,
        vision_states: torch.Tensor,
        vision_mask: torch.Tensor | None,
        output_attentions: bool = False,
        query_key_layers: set[int] = frozenset(),
    ) -> dict:
        outputs = {
            "language_hidden_states": (), "vision_hidden_states": (),
            "language_attentions": (), "vision_attentions": (),
            "cross_encoder_attentions": (), "cross_encoder_vision_attentions": (),
            "query_key_states": {},
        }  # fmt: skip
        for layer in self.language_layers:
            language_states, attn_weights, _ = layer(language_states, language_mask, output_attentions)
            outputs["language_hidden_states"] += (language_states,)
            outputs["language_attentions"] += (attn_weights,)
        for layer in self.vision_layers:
            vision_states, attn_weights, _ = layer(vision_states, vision_mask, output_attentions)
            outputs["vision_hidden_states"] += (vision_states,)
            outputs["vision_attentions"] += (attn_weights,)
        for index, layer in enumerate(self.cross_layers):
            language_states, vision_states, attentions, query_key = layer(
                language_states, language_mask, vision_states, vision_mask, output_attentions, index in query_key_layers
            )
            outputs["language_hidden_states"] += (language_states,)
            outputs["vision_hidden_states"] += (vision_states,)
            if output_attentions:
                outputs["cross_encoder_attentions"] += (attentions["language_to_vision"],)
                outputs["cross_encoder_vision_attentions"] += (attentions["vision_to_language"],)
            if query_key:
                outputs["query_key_states"][index] = query_key
        return outputs


class TwoStreamPreTrainedModel(VisionLanguagePreTrainedModel):
    config_class = TwoStreamConfig
    base_model_prefix = "two_stream"
    _no_split_modules = ["TwoStreamVisualEmbeddings", "TwoStreamLayer", "TwoStreamCrossLayer"]
    _layer_count_fields = {
        "encoder.language_layers": "l_layers", "encoder.vision_layers": "r_layers", "encoder.cross_layers": "x_layers"
    }
    _classification_output_class = TwoStreamClassificationOutput
    _layer_output_names = LAYER_OUTPUT_NAMES

    def _text_and_region_states(self, outputs, text_length, num_regions) -> tuple[torch.Tensor, torch.Tensor]:
        return outputs.language_output, outputs.vision_output

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, TwoStreamFeatureProjection):
            init.normal_(module.bias, mean=0.0, std=self.config.initializer_range)

    @classmethod
    def from_text_pretrained(
        cls, name_or_path: str | Path | None = None, **config_overrides
    ) -> TwoStreamPreTrainedModel:
        """Builds the model with the word embeddings, the first `l_layers` language layers and the pooler copied from
        a BERT-family checkpoint (default: the packaged MiniLM); objects, cross layers and heads are newly initialised.

        Args:
            name_or_path: Hub id or local folder of a BERT-family model.
            config_overrides: any other [`TwoStreamConfig`] field (`l_layers` may not exceed the checkpoint's layers).
        """
        name_or_path, text_model = load_text_model(name_or_path)
        fields = [field for field in TEXT_CONFIG_FIELDS if field != "num_hidden_layers"]
        fixed = text_config_fields(name_or_path, fields, config_overrides)
        config = cls.config_class(**{**fixed, **config_overrides})
        available = text_model.config.num_hidden_layers
        if config.l_layers > available:
            raise ValueError(
                f"`l_layers` ({config.l_layers}) must be <= the {available} layers of the text checkpoint {name_or_path!r}."
            )
        model = cls(config)
        model.base_model.copy_text_weights_from(text_model)
        return model


class TwoStreamModel(TwoStreamPreTrainedModel):
    # the heads of a `TwoStreamFor*` checkpoint, left out when only the encoder is loaded
    _keys_to_ignore_on_load_unexpected = [
        r"^(lm_head|matching_head|object_head|answer_head|alignment_decoder|reasoning_head|region_head|grounding_head)\."
    ]

    def __init__(self, config: TwoStreamConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = TextEmbeddings(config)
        self.visual_embeddings = TwoStreamVisualEmbeddings(config)
        self.encoder = TwoStreamEncoder(config)
        self.pooler = Pooler(config)
        self.init_attention_supervision()
        self.post_init()

    @property
    def num_supervisable_layers(self) -> int:
        return self.config.x_layers

    @torch.no_grad()
    def copy_text_weights_from(self, text_model: nn.Module) -> None:
        """Copies BERT's embeddings, its first `l_layers` layers into the language stack and its pooler."""
        copy_module_weights(self.embeddings, getattr(text_model, "embeddings", None), "embeddings")
        text_layers = getattr(getattr(text_model, "encoder", None), "layer", [])
        for index, layer in enumerate(self.encoder.language_layers):
            copy_module_weights(
                layer, text_layers[index] if index < len(text_layers) else None, f"encoder.layer.{index}"
            )
        copy_pooler_weights(self.pooler, text_model)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        word_region_alignment: torch.FloatTensor | None = None,
        phrase_masks: torch.BoolTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TwoStreamModelOutput:
        r"""
        visual_feats (`(batch, R, visual_feat_dim)`), visual_boxes (`(batch, R, 4)` x1, y1, x2, y2 in [0, 1]): the
        objects. visual_attention_mask (`(batch, R)`): 1 for real regions, 0 for padding; without it every region is
        attended (all-zero padding boxes are refused, all-zero features warn, padding with valid-looking boxes and
        features cannot be detected). word_region_alignment (`(batch, T, R)`): gold alignment for attention supervision
        of the cross layers. phrase_masks (`(batch, P, T)`): grounded phrases (indirect).
        global_item_counts (`dict[str, torch.Tensor]`, *optional*): the global counts of [`loss_item_counts`] that
        every loss divides by (data parallelism, gradient accumulation; `ComponentLossTrainer` passes them); default:
        this batch's own counts.
        output_attentions / output_hidden_states: collected here per stream (LXMERT's `language_*`, `vision_*` and
        `cross_encoder_*` fields have no counterpart among the `output_<key>` flags of `@capture_outputs`).
        validate_inputs (`bool`, *optional*): also check the values of the inputs (a host read on an accelerator);
        default: on the CPU in eager mode when `config.validate_inputs` is on. Shapes and dtypes are always checked.
        """
        check_forward_kwargs(self, kwargs)
        check_batch_not_empty(self, "input_ids", input_ids)
        output_attentions = output_flag("output_attentions", kwargs, self.config)
        output_hidden_states = output_flag("output_hidden_states", kwargs, self.config)
        visual_feats, visual_boxes = regions_in_dtype(self.dtype, visual_feats, visual_boxes)
        attention_mask, token_type_ids, visual_attention_mask = default_and_check_inputs(
            self.config, input_ids, attention_mask, token_type_ids, visual_feats, visual_boxes,
            visual_attention_mask, word_region_alignment, phrase_masks, kwargs.get("validate_inputs"),
        )  # fmt: skip

        language_states = self.embeddings(input_ids, token_type_ids)
        vision_states = self.visual_embeddings(visual_feats, visual_boxes)
        eager = output_attentions or self.config._attn_implementation == "eager"
        supervise = word_region_alignment is not None and self.config.attention_supervision != "none"
        encoded = self.encoder(
            language_states,
            key_padding_mask_4d(attention_mask, language_states.dtype, eager),
            vision_states,
            key_padding_mask_4d(visual_attention_mask, vision_states.dtype, eager),
            output_attentions=output_attentions,
            query_key_layers=self.layers_needing_query_key() if supervise else set(),
        )
        language_output, vision_output = encoded["language_hidden_states"][-1], encoded["vision_hidden_states"][-1]
        loss_attention_supervision = None
        if supervise:
            loss_attention_supervision = self.cross_modal_supervision_loss(
                query_key_states=encoded["query_key_states"],
                language_states=language_output,
                vision_states=vision_output,
                scaling=self.encoder.cross_layers[0].cross_attention.self.scaling,
                word_region_alignment=word_region_alignment,
                text_mask=attention_mask,
                region_mask=visual_attention_mask,
                phrase_masks=phrase_masks,
                global_item_counts=global_item_counts,
            )
        attentions = {name: encoded[name] if output_attentions else None for name in ATTENTION_OUTPUT_NAMES}
        return TwoStreamModelOutput(
            language_output=language_output,
            vision_output=vision_output,
            pooler_output=self.pooler(language_output),
            loss_attention_supervision=loss_attention_supervision,
            language_hidden_states=encoded["language_hidden_states"] if output_hidden_states else None,
            vision_hidden_states=encoded["vision_hidden_states"] if output_hidden_states else None,
            **attentions,
        )


# ----------------------------------------------------------------------------------------------------------------
# Heads
# ----------------------------------------------------------------------------------------------------------------


class TwoStreamObjectHead(nn.Module):
    """Masked-object prediction: detector class and attribute scores and the regressed feature of every object."""

    def __init__(self, config: TwoStreamConfig):
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.class_decoder = nn.Linear(config.hidden_size, config.num_object_labels)
        self.attribute_decoder = nn.Linear(config.hidden_size, config.num_attr_labels)
        self.feature_decoder = nn.Linear(config.hidden_size, config.visual_feat_dim)

    def forward(self, vision_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        states = self.transform(vision_output)
        return self.class_decoder(states), self.attribute_decoder(states), self.feature_decoder(states)


class TwoStreamForPreTraining(TwoStreamPreTrainedModel):
    """Two-stream pre-training (Kervadec et al. 2020, sec. 4-5, after LXMERT): masked language modelling, masked object
    prediction (detector class and attribute cross-entropy, feature regression), image-sentence matching, question
    answering from [CLS] and the object-word alignment decoder (eqs. 11-14), each switchable (`task_*`) and weighted.

    Readings: the feature regression is the L2 (mean squared) error the paper names (LXMERT's released code uses a
    smooth L1 under that name); question answering and alignment are computed on matched pairs only (the collator
    sets their labels to be ignored on mismatched ones), as in LXMERT.
    """

    _tied_weights_keys = {"lm_head.decoder.weight": "two_stream.embeddings.word_embeddings.weight"}

    def __init__(self, config: TwoStreamConfig):
        super().__init__(config)
        self.two_stream = TwoStreamModel(config)
        self.lm_head = LMPredictionHead(config)
        self.matching_head = nn.Linear(config.hidden_size, 2)
        self.object_head = TwoStreamObjectHead(config)
        self.answer_head = AnswerHead(config, config.hidden_size, config.num_qa_labels)
        self.alignment_decoder = AlignmentDecoder(config.hidden_size, config.layer_norm_eps, config.hidden_act)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        word_region_alignment: torch.FloatTensor | None = None,
        phrase_masks: torch.BoolTensor | None = None,
        labels: torch.LongTensor | None = None,
        object_labels: torch.LongTensor | None = None,
        attribute_labels: torch.LongTensor | None = None,
        feature_labels: torch.FloatTensor | None = None,
        masked_regions: torch.LongTensor | None = None,
        matched_labels: torch.LongTensor | None = None,
        answer_labels: torch.Tensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TwoStreamForPreTrainingOutput:
        r"""
        labels (`(batch, T)`): masked-word targets, -100 on unmasked tokens.
        object_labels / attribute_labels (`(batch, R)`): the detector's class / attribute of each masked object, -100
            elsewhere. feature_labels (`(batch, R, visual_feat_dim)`): original features; masked_regions (`(batch, R)`):
            1 for the masked objects whose feature is regressed.
        matched_labels (`(batch,)`): 1 when the sentence describes the image, 0 when the image was replaced.
        answer_labels (`(batch,)` answer ids with -100 ignored, or `(batch, num_qa_labels)` soft scores).
        word_region_alignment (`(batch, T, R)`): soft targets A* of the alignment decoder (eq. 18), also used by
            attention supervision when `attention_supervision` is not "none".
        """
        values = check_head_call(self, input_ids, kwargs)
        self._check_pretraining_labels(
            input_ids, visual_feats, labels, object_labels, attribute_labels, feature_labels, masked_regions,
            matched_labels, answer_labels, values
        )
        if values:
            check_pretraining_targets(
                labels, attention_mask, visual_attention_mask, masked_regions, feature_labels,
                {"object_labels": object_labels, "attribute_labels": attribute_labels},
            )  # fmt: skip
        outputs = self._base_outputs(
            input_ids, visual_feats, visual_boxes, attention_mask, token_type_ids, visual_attention_mask,
            word_region_alignment, phrase_masks, global_item_counts, **kwargs
        )
        config = self.config
        losses = {}
        prediction_logits = None
        counts = global_item_counts
        if config.task_mask_lm:
            prediction_logits, losses["loss_mlm"] = masked_language_modelling(
                self.lm_head, outputs.language_output, labels, self.training, num_items(counts, "mlm")
            )
        if config.task_obj_predict and masked_regions is not None:
            losses.update(
                self._masked_object_losses(
                    outputs.vision_output, object_labels, attribute_labels, feature_labels, masked_regions, counts
                )
            )
        matching_score = self.matching_head(outputs.pooler_output) if config.task_matched else None
        if matching_score is not None:
            losses["loss_itm"] = optional_cross_entropy(matching_score, matched_labels, counts, "itm")
        answer_score = self.answer_head(outputs.pooler_output) if config.task_qa else None
        if answer_score is not None and answer_labels is not None:
            losses["loss_qa"] = answer_loss(answer_score, answer_labels, num_items(counts, "qa"))
        alignment_scores = None
        if config.task_alignment:
            alignment_scores = self.alignment_decoder(outputs.language_output, outputs.vision_output)
            if word_region_alignment is not None:
                region_mask = (
                    torch.ones_like(visual_feats[..., 0]) if visual_attention_mask is None else visual_attention_mask
                )
                # eq. (14): KL(A*, A) over the grounded words, A the top-k softmax of the decoder scores (eq. 13)
                losses["loss_alignment"] = alignment_kl_loss(
                    alignment_scores, word_region_alignment, region_mask, attention_mask, k=config.alignment_top_k,
                    num_words=num_items(counts, "alignment"), outside_top_k=config.alignment_outside_top_k,
                )  # fmt: skip
        losses["loss_attention_supervision"] = outputs.loss_attention_supervision
        return TwoStreamForPreTrainingOutput(
            loss=self._weighted_loss(losses),
            **losses,
            prediction_logits=prediction_logits,
            cross_relationship_score=matching_score,
            question_answering_score=answer_score,
            alignment_scores=alignment_scores,
            **{name: getattr(outputs, name) for name in LAYER_OUTPUT_NAMES},
        )

    def _masked_object_losses(
        self, vision_output, object_labels, attribute_labels, feature_labels, masked_regions, counts
    ) -> dict:
        class_scores, attribute_scores, features = self.object_head(vision_output)
        losses = {}
        if self.config.visual_obj_loss and object_labels is not None:
            losses["loss_object_class"] = optional_cross_entropy(
                class_scores.flatten(0, 1), object_labels.flatten(), counts, "object_class"
            )
        if self.config.visual_attr_loss and attribute_labels is not None:
            losses["loss_object_attr"] = optional_cross_entropy(
                attribute_scores.flatten(0, 1), attribute_labels.flatten(), counts, "object_attr"
            )
        if self.config.visual_feat_loss and feature_labels is not None:
            # LXMERT's L2 feature regression
            losses["loss_region_feature"] = masked_feature_loss(
                features, feature_labels, masked_regions.bool(), num_items(counts, "region_feature")
            )
        return losses

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        masked = inputs.get("masked_regions")
        with_features = masked is not None and inputs.get("feature_labels") is not None
        target = inputs.get("word_region_alignment")
        return {
            "mlm": count_labeled(inputs.get("labels")),
            "object_class": count_labeled(inputs.get("object_labels")),
            "object_attr": count_labeled(inputs.get("attribute_labels")),
            "region_feature": count_true(masked) if with_features else count_true(None),
            "itm": count_labeled(inputs.get("matched_labels")),
            "qa": answer_item_count(inputs.get("answer_labels")),
            "alignment": grounded_word_count(target, inputs.get("attention_mask")) if target is not None else count_true(None),
            **super().loss_item_counts(inputs),
        }

    def _check_pretraining_labels(
        self, input_ids, visual_feats, labels, object_labels, attribute_labels, feature_labels, masked_regions,
        matched_labels, answer_labels, values: bool
    ) -> None:
        batch, num_regions = check_pretraining_shapes(
            input_ids, visual_feats, labels, masked_regions, feature_labels, self.config.vocab_size, values
        )
        check_labels("object_labels", object_labels, (batch, num_regions), self.config.num_object_labels, values)
        check_labels("attribute_labels", attribute_labels, (batch, num_regions), self.config.num_attr_labels, values)
        check_labels("matched_labels", matched_labels, (batch,), 2, values)
        region_targets = {"object_labels": object_labels, "attribute_labels": attribute_labels, "feature_labels": feature_labels}
        given = [name for name, targets in region_targets.items() if targets is not None]
        if masked_regions is None and given:
            raise ValueError(f"{given} are the targets of masked regions: they need `masked_regions` (batch, R), got None.")
        check_answer_labels(answer_labels, batch, self.config.num_qa_labels, values)


class TwoStreamForQuestionAnswering(QuestionAnsweringMixin, TwoStreamPreTrainedModel):
    """Answer classification from [CLS] with the answer head of LXMERT; it starts from a [`TwoStreamForPreTraining`]
    checkpoint, whose answer head is reused when the vocabularies agree."""

    _base_model_class = TwoStreamModel


class TwoStreamForVisualReasoning(VisualReasoningMixin, TwoStreamPreTrainedModel):
    """NLVR2 (Kervadec et al. sec. 6, after LXMERT): is the sentence true of the image pair?"""

    _base_model_class = TwoStreamModel


class TwoStreamForReferringExpression(ReferringExpressionMixin, TwoStreamPreTrainedModel):
    """Referring expressions (RefCOCO+): every object's final state (`vision_output`) is scored."""

    _base_model_class = TwoStreamModel


class TwoStreamForPhraseGrounding(PhraseGroundingMixin, TwoStreamPreTrainedModel):
    """Phrase grounding (Flickr30k Entities) with VisualBERT's head over the language and object states."""

    _base_model_class = TwoStreamModel


__all__ = [
    "TwoStreamClassificationOutput",
    "TwoStreamForPreTraining",
    "TwoStreamForPhraseGrounding",
    "TwoStreamForPreTrainingOutput",
    "TwoStreamForQuestionAnswering",
    "TwoStreamForReferringExpression",
    "TwoStreamForVisualReasoning",
    "TwoStreamModel",
    "TwoStreamModelOutput",
    "TwoStreamPreTrainedModel",
]
