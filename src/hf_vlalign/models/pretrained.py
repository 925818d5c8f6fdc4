"""The `PreTrainedModel` base of the single- and two-stream families and the task models both build the same way:
what they share above BERT's blocks (the initialisation of the shared blocks and heads, where the word embeddings are,
the call of the base model that every task head makes, the weighted total loss) and the `forward` of question
answering, NLVR2, referring expressions and phrase grounding. Each family's `XPreTrainedModel` subclasses the base and
adds its config class, its own modules' initialisation, `from_text_pretrained` and where a task head finds the text
and region states; each family's `XForY` mixes in the task's forward and builds its modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs
from transformers.utils.generic import can_return_tuple

from ..supervision import AttentionSupervisionMixin
from ..utils.item_counts import count_true, num_items
from .bert_modules import TextEmbeddings
from .forward_kwargs import check_head_call
from .saving import SaveLoadMixin
from .task_heads import (
    AnswerHead,
    LMPredictionHead,
    RegionScoringHead,
    RegionToPhraseAttention,
    answer_item_count,
    answer_loss,
    check_answer_labels,
    check_image_pair,
    check_labels,
    check_phrase_labels,
    check_referring_inputs,
    mean_pool_phrases,
    pair_flatten,
    pair_repeat,
    phrase_grounding_loss,
    reasoning_loss,
    referring_expression_loss,
    region_mask_or_ones,
    weighted_total,
)
from .visual_features import VisualFeatureStatisticsMixin, init_feature_normalization


class VisionLanguagePreTrainedModel(SaveLoadMixin, AttentionSupervisionMixin, VisualFeatureStatisticsMixin, PreTrainedModel):
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # transformers' `get_input_embeddings` / `set_input_embeddings` find them at `embeddings.word_embeddings` (the
    # base model) or through `base_model` (a task head)
    _input_embed_layer = "word_embeddings"
    # the losses divide by the per-loss counts of `loss_item_counts` (a dict, passed by `ComponentLossTrainer`), not by
    # the one token count transformers' Trainer would pass through `**kwargs`
    accepts_loss_kwargs = False
    # set by each family: the output class of its classification heads and the per-layer fields they pass on
    _classification_output_class: type[ModelOutput]
    # set by each family's task models: the class of their base model (`base_model_prefix`)
    _base_model_class: type[PreTrainedModel]
    _layer_output_names: tuple[str, ...] = ()

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        init_feature_normalization(module)
        if isinstance(module, TextEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, LMPredictionHead):
            init.zeros_(module.bias)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> torch.nn.Embedding:
        """`PreTrainedModel.resize_token_embeddings`, also resizing the output bias of every masked-word head
        ([`~hf_vlalign.models.task_heads.LMPredictionHead`], whose decoder is tied to the word embeddings): kept
        entries keep their values, new ones start at zero (transformers resizes a bias only when it is the decoder's own
        `nn.Linear` bias, which ours is not, so the next forward would add a bias of the old size)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        for module in self.modules():
            if isinstance(module, LMPredictionHead):
                module.resize_bias(embeddings.weight.shape[0])
        return embeddings

    def _base_outputs(
        self,
        input_ids: torch.Tensor,
        visual_feats: torch.Tensor,
        visual_boxes: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        visual_attention_mask: torch.Tensor | None,
        word_region_alignment: torch.Tensor | None = None,
        phrase_masks: torch.Tensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs,
    ) -> ModelOutput:
        """A task head's call of its base model with the shared input names (in the order of the base model's
        `forward`), returning a `ModelOutput` whatever `config.return_dict` says."""
        return self.base_model(
            input_ids,
            visual_feats,
            visual_boxes,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            visual_attention_mask=visual_attention_mask,
            word_region_alignment=word_region_alignment,
            phrase_masks=phrase_masks,
            return_dict=True,
            global_item_counts=global_item_counts,
            **kwargs,
        )

    def _text_and_region_states(
        self, outputs: ModelOutput, text_length: int, num_regions: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The final states of the text tokens (B, T, D) and of the regions (B, R, D) in the base model's output."""
        raise NotImplementedError

    def _weighted_loss(self, losses: Mapping[str, torch.Tensor | None]) -> torch.Tensor | None:
        """The total loss: each computed `loss_<name>` times its config weight `<name>_weight`, in the order given."""
        config = self.config
        return weighted_total([(getattr(config, f"{name.removeprefix('loss_')}_weight"), loss) for name, loss in losses.items()])

    def _classification_output(self, loss_task: torch.Tensor | None, outputs: ModelOutput, logits: torch.Tensor):
        """A task head's output: `loss_task + attention_supervision_weight * loss_attention_supervision`, its
        components, `logits` and the base model's per-layer outputs."""
        supervision = outputs.loss_attention_supervision
        return self._classification_output_class(
            loss=weighted_total([(1.0, loss_task), (self.config.attention_supervision_weight, supervision)]),
            loss_task=loss_task,
            loss_attention_supervision=supervision,
            logits=logits,
            **{name: getattr(outputs, name) for name in self._layer_output_names},
        )


class QuestionAnsweringMixin:
    """The `forward` of `XForQuestionAnswering`: answer scores of `answer_head` from the pooled [CLS] state; GQA's
    single answer id is trained with cross-entropy, VQA's soft scores with binary cross-entropy summed over answers
    (BUTD / LXMERT)."""

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self._base_model_class(config))
        self.answer_head = AnswerHead(config, config.hidden_size, config.num_qa_labels)
        self.post_init()

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
        labels: torch.Tensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ModelOutput:
        r"""labels: `(batch,)` answer ids (-100 ignored) or `(batch, num_qa_labels)` soft scores in [0, 1]."""
        values = check_head_call(self, input_ids, kwargs)
        check_answer_labels(labels, input_ids.shape[0], self.config.num_qa_labels, values, name="labels")
        outputs = self._base_outputs(
            input_ids, visual_feats, visual_boxes, attention_mask, token_type_ids, visual_attention_mask,
            word_region_alignment, phrase_masks, global_item_counts, **kwargs
        )
        logits = self.answer_head(outputs.pooler_output)
        loss_task = answer_loss(logits, labels, num_items(global_item_counts, "task")) if labels is not None else None
        return self._classification_output(loss_task, outputs, logits)

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return {"task": answer_item_count(inputs.get("labels")), **super().loss_item_counts(inputs)}


class VisualReasoningMixin:
    """The `forward` of `XForVisualReasoning` (NLVR2): the sentence is encoded with each image of its pair, the two
    pooled [CLS] states are concatenated and `reasoning_head` gives one score, trained with binary cross-entropy.
    Region tensors have a pair axis: `visual_feats` (B, 2, R, Dv), `visual_boxes` (B, 2, R, 4),
    `visual_attention_mask` (B, 2, R)."""

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self._base_model_class(config))
        self.reasoning_head = AnswerHead(config, 2 * config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ModelOutput:
        r"""labels (`(batch,)`): 1 when the sentence is true of the image pair, else 0. Returns `logits` (batch,); the
        hidden states and attention maps have twice the batch, the sentence with each image of the pair in turn."""
        values = check_head_call(self, input_ids, kwargs)
        batch = input_ids.shape[0]
        check_image_pair(visual_feats, batch)
        check_labels("labels", labels, (batch,), 2, values)
        outputs = self._base_outputs(
            pair_repeat(input_ids), pair_flatten(visual_feats), pair_flatten(visual_boxes), pair_repeat(attention_mask),
            pair_repeat(token_type_ids), pair_flatten(visual_attention_mask), global_item_counts=global_item_counts,
            **kwargs,
        )
        logits = self.reasoning_head(outputs.pooler_output.reshape(batch, -1)).squeeze(-1)
        loss_task = reasoning_loss(logits, labels, num_items(global_item_counts, "task")) if labels is not None else None
        return self._classification_output(loss_task, outputs, logits)

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        # no attention supervision: the sentence has no regions of its own
        labels = inputs.get("labels")
        return {"task": torch.full((), labels.numel(), device=labels.device) if labels is not None else count_true(None)}


class ReferringExpressionMixin:
    """The `forward` of `XForReferringExpression` (RefCOCO+): every region's final state is scored by `region_head`
    (a [`~hf_vlalign.models.task_heads.RegionScoringHead`]) and the referred region is the argmax; each region is
    trained with binary cross-entropy against "IoU with the referred box >= `referring_iou_threshold`" (VL-BERT,
    ViLBERT). Attention supervision aligns the expression with the referred box when `word_region_alignment` is given."""

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self._base_model_class(config))
        self.region_head = RegionScoringHead(config)
        self.post_init()

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
        target_region_iou: torch.FloatTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ModelOutput:
        r"""
        labels (`(batch,)`): the referred region (best IoU with the referred box). target_region_iou (`(batch, R)`):
        every region's IoU with the referred box; when given, the loss uses it (positives at IoU >= threshold).
        Returns `logits` (batch, R), padding regions at the dtype's minimum.
        """
        values = check_head_call(self, input_ids, kwargs)
        check_referring_inputs(
            labels, target_region_iou, input_ids.shape[0], visual_feats.shape[1], visual_attention_mask, values
        )
        outputs = self._base_outputs(
            input_ids, visual_feats, visual_boxes, attention_mask, token_type_ids, visual_attention_mask,
            word_region_alignment, phrase_masks, global_item_counts, **kwargs
        )
        region_mask = region_mask_or_ones(visual_attention_mask, visual_feats)
        _, region_states = self._text_and_region_states(outputs, input_ids.shape[1], visual_feats.shape[1])
        logits = self.region_head(region_states)
        loss_task = referring_expression_loss(
            logits, region_mask, target_region_iou, labels, self.config.referring_iou_threshold,
            num_items(global_item_counts, "task"),
        )  # fmt: skip
        logits = logits.masked_fill(~region_mask.bool(), torch.finfo(logits.dtype).min)
        return self._classification_output(loss_task, outputs, logits)

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        # the real regions, when the batch has targets
        has_targets = inputs.get("target_region_iou") is not None or inputs.get("labels") is not None
        region_mask = region_mask_or_ones(inputs.get("visual_attention_mask"), inputs["visual_feats"])
        return {"task": count_true(region_mask if has_targets else None), **super().loss_item_counts(inputs)}


class PhraseGroundingMixin:
    """The `forward` of `XForPhraseGrounding` (Flickr30k Entities) with VisualBERT's head (Li et al. 2019, sec. 4.4):
    each phrase's mean token state queries every region's final state through one attention head (`grounding_head`, a
    [`~hf_vlalign.models.task_heads.RegionToPhraseAttention`]); the scores are the phrase's region logits, trained
    with KL divergence to the gold distribution over regions. VisualBERT scores one token per phrase; the mean over
    the phrase's sub-words gives multi-word phrases one query."""

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self._base_model_class(config))
        self.grounding_head = RegionToPhraseAttention(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor,
        visual_feats: torch.FloatTensor,
        visual_boxes: torch.FloatTensor | None = None,
        phrase_masks: torch.BoolTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        visual_attention_mask: torch.LongTensor | None = None,
        word_region_alignment: torch.FloatTensor | None = None,
        phrase_labels: torch.FloatTensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ModelOutput:
        r"""
        phrase_masks (`(batch, P, T)`, required): the tokens of each phrase (all-zero rows are padding).
        phrase_labels (`(batch, P, R)`): each phrase's gold distribution over regions (zero rows: not grounded).
        Returns `logits` (batch, P, R), padding regions at the dtype's minimum.
        """
        values = check_head_call(self, input_ids, kwargs)
        if phrase_masks is None:
            raise ValueError(f"`phrase_masks` (batch, P, text_length) is required by {type(self).__name__}, got None.")
        check_phrase_labels(phrase_labels, phrase_masks, visual_feats.shape[1], visual_attention_mask, values)
        outputs = self._base_outputs(
            input_ids, visual_feats, visual_boxes, attention_mask, token_type_ids, visual_attention_mask,
            word_region_alignment, phrase_masks, global_item_counts, **kwargs
        )
        text_states, region_states = self._text_and_region_states(outputs, input_ids.shape[1], visual_feats.shape[1])
        region_mask = region_mask_or_ones(visual_attention_mask, visual_feats)
        logits = self.grounding_head(mean_pool_phrases(text_states, phrase_masks), region_states, region_mask)
        loss_task = None
        if phrase_labels is not None:
            loss_task = phrase_grounding_loss(logits, phrase_labels, num_items(global_item_counts, "task"))
        return self._classification_output(loss_task, outputs, logits)

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        # the grounded phrases (rows of `phrase_labels` with mass)
        phrase_labels = inputs.get("phrase_labels")
        grounded = phrase_labels.sum(-1) > 0 if phrase_labels is not None else None
        return {"task": count_true(grounded), **super().loss_item_counts(inputs)}


__all__ = [
    "PhraseGroundingMixin",
    "QuestionAnsweringMixin",
    "ReferringExpressionMixin",
    "VisionLanguagePreTrainedModel",
    "VisualReasoningMixin",
]
