"""`AlignmentPretrainingTrainer`: two-stream pre-training (Kervadec et al. 2020, after LXMERT) logging every loss."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.collators import PROBE_KEYS
from .base import ComponentLossTrainer, ComponentLossTrainingArguments

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


@dataclass
class AlignmentPretrainingTrainingArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] of [`AlignmentPretrainingTrainer`].

    Parameters:
        qa_start_epoch (`float`, *optional*, defaults to `0.0`):
            First (fractional) epoch whose training steps include the question-answering loss (Kervadec et al. add it
            at epoch 10 of 20).
    """

    qa_start_epoch: float = field(
        default=0.0, metadata={"help": "Epoch from which the question-answering loss is on (the paper: 10 of 20)."}
    )

    def __post_init__(self):
        super().__post_init__()
        if not self.qa_start_epoch >= 0:
            raise ValueError(f"`qa_start_epoch` must be >= 0, got {self.qa_start_epoch!r}.")
        self.qa_start_epoch = float(self.qa_start_epoch)


class AlignmentPretrainingTrainer(ComponentLossTrainer):
    """Trainer for `TwoStreamForPreTraining`: sums the enabled losses with their config weights (the model does),
    logs each of `loss_mlm`, `loss_object_class`, `loss_object_attr`, `loss_region_feature`, `loss_itm`, `loss_qa`,
    `loss_alignment` and `loss_attention_supervision`, and starts the question-answering loss only from epoch
    `args.qa_start_epoch` ([`AlignmentPretrainingTrainingArguments`]): before that, training batches are stripped of
    their `answer_labels`.
    """

    args_class = AlignmentPretrainingTrainingArguments
    loss_component_keys = PRETRAINING_LOSS_KEYS
    non_model_keys = PROBE_KEYS
    non_prediction_keys = ("prediction_logits", "alignment_scores")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.label_names = ["answer_labels"]

    @property
    def qa_loss_enabled(self) -> bool:
        return (self.state.epoch or 0.0) >= self.args.qa_start_epoch

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            enabled = self.qa_loss_enabled
            self._metrics["train"]["qa_loss_enabled"].append(float(enabled))  # logged with the step's losses
            if not enabled:
                inputs = {key: value for key, value in inputs.items() if key != "answer_labels"}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
