"""`TaskTrainer`: downstream fine-tuning (VQA / GQA, NLVR2, RefCOCO+, phrase grounding) of either family, logging the
task loss and the attention-supervision loss separately; `ReferringExpressionTrainer` and `PhraseGroundingTrainer`,
whose evaluation predictions are what their metrics (`evaluation.task_metrics`) read."""

from __future__ import annotations

from dataclasses import dataclass

from ..data.collators import PROBE_KEYS
from .head_learning_rate import HeadLearningRateArguments, HeadLearningRateTrainer


@dataclass
class TaskTrainingArguments(HeadLearningRateArguments):
    r"""[`HeadLearningRateArguments`] of [`TaskTrainer`] and [`ReferringExpressionTrainer`]."""


class TaskTrainer(HeadLearningRateTrainer):
    """Trainer for the `*For{QuestionAnswering,VisualReasoning,ReferringExpression,PhraseGrounding}` heads: logs
    `loss_task` and `loss_attention_supervision`; list in `args.label_names` the batch entries `compute_metrics` needs
    (they reach it as `label_ids`)."""

    args_class = TaskTrainingArguments
    loss_component_keys = ("loss_task", "loss_attention_supervision")
    non_model_keys = PROBE_KEYS
    # the modules a text checkpoint lacks in both families: the visual embeddings and every task head
    new_modules = ("visual_embeddings", "answer_head", "reasoning_head", "region_head", "grounding_head")


class ReferringExpressionTrainer(TaskTrainer):
    """`TaskTrainer` whose evaluation predictions are, per expression, the IoU of its top-scored region with the
    referred box, and whose labels are the best IoU of any region of its image (both (B,), whatever the images' region
    counts). Pass `label_names=["target_region_iou"]` and `compute_metrics=accuracy_from_region_iou`."""

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        step = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        loss, logits, target_region_iou = step
        if logits is None or target_region_iou is None:
            return loss, logits, target_region_iou
        top1_iou = target_region_iou.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)
        return loss, top1_iou, target_region_iou.max(-1).values


@dataclass
class PhraseGroundingTrainingArguments(TaskTrainingArguments):
    r"""[`TaskTrainingArguments`] of [`PhraseGroundingTrainer`]."""


class PhraseGroundingTrainer(TaskTrainer):
    """`TaskTrainer` whose evaluation predictions are, per phrase, the IoU of its top-scored region with the gold
    boxes and whose labels are the phrases' token index (both (B, P), whatever the images' region counts). Pass
    `label_names=["phrase_region_iou", "phrase_token_index"]` and `compute_metrics=recall_at_1_any_box`."""

    args_class = PhraseGroundingTrainingArguments

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if logits is None or labels is None:
            return loss, logits, labels
        region_iou, token_index = labels
        top1_iou = region_iou.gather(-1, logits.argmax(-1, keepdim=True)).squeeze(-1)
        return loss, top1_iou, token_index
