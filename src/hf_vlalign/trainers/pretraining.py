"""`AlignmentPretrainingTrainer`: two-stream pre-training (Kervadec et al. 2020, after LXMERT) logging every loss."""

from __future__ import annotations

from ..data.collators import PROBE_KEYS
from .base import ComponentLossTrainer

PRETRAINING_LOSS_KEYS = (
    "loss_mlm",
    "loss_object_class",
    "loss_object_attr",
    "loss_region_feature",
    "loss_itm",
    "loss_qa",
    "loss_alignment",
    "loss_attention_supervision",
)


class AlignmentPretrainingTrainer(ComponentLossTrainer):
    """Trainer for `TwoStreamForPreTraining`: sums the enabled losses with their config weights (the model does),
    logs each of `loss_mlm`, `loss_object_class`, `loss_object_attr`, `loss_region_feature`, `loss_itm`, `loss_qa`,
    `loss_alignment` and `loss_attention_supervision`, and starts the question-answering loss only from epoch
    `vqa_start_epoch` (the paper adds it at epoch 10 of 20): before that, training batches are stripped of their
    `answer_labels`.

    Args:
        vqa_start_epoch (`float`): first (fractional) epoch whose training steps include the answer loss.
    """

    loss_component_keys = PRETRAINING_LOSS_KEYS
    non_model_keys = PROBE_KEYS
    non_prediction_keys = ("prediction_logits", "alignment_scores")

    def __init__(self, *args, vqa_start_epoch: float = 0.0, **kwargs):
        if not vqa_start_epoch >= 0:
            raise ValueError(f"`vqa_start_epoch` must be >= 0, got {vqa_start_epoch!r}.")
        super().__init__(*args, **kwargs)
        self.vqa_start_epoch = float(vqa_start_epoch)
        self.label_names = ["answer_labels"]

    @property
    def qa_loss_enabled(self) -> bool:
        return (self.state.epoch or 0.0) >= self.vqa_start_epoch

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            enabled = self.qa_loss_enabled
            self._metrics["train"]["qa_loss_enabled"].append(float(enabled))  # logged with the step's losses
            if not enabled:
                inputs = {key: value for key, value in inputs.items() if key != "answer_labels"}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
