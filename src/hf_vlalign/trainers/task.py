"""`TaskTrainer`: downstream fine-tuning (VQA / GQA, NLVR2, RefCOCO+, phrase grounding) of either family, logging the
task loss and the attention-supervision loss separately."""

from __future__ import annotations

from ..data.collators import PROBE_KEYS
from .base import ComponentLossTrainer


class TaskTrainer(ComponentLossTrainer):
    """Trainer for the `*For{QuestionAnswering,VisualReasoning,ReferringExpression,PhraseGrounding}` heads: logs
    `loss_task` and `loss_att` (train and eval). The probe targets of a batch (`PROBE_KEYS`) stay out of the model's
    inputs; list in `label_names` the batch entries `compute_metrics` needs (they reach it as `label_ids`)."""

    loss_component_keys = ("loss_task", "loss_att")
    non_model_keys = PROBE_KEYS

    def __init__(self, *args, label_names: list[str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if label_names is not None:
            self.label_names = list(label_names)


class SingleStreamPretrainingTrainer(ComponentLossTrainer):
    """Trainer for `SingleStreamForPreTraining`: logs `loss_mlm`, `loss_sentence_image`, `loss_region_feat`,
    `loss_region_class` and `loss_att`."""

    loss_component_keys = ("loss_mlm", "loss_sentence_image", "loss_region_feat", "loss_region_class", "loss_att")
    non_model_keys = PROBE_KEYS
