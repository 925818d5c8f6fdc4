"""The pre-training trainers, each logging every loss: `TwoStreamPretrainingTrainer` (Kervadec et al. 2020, after
LXMERT) and `SingleStreamPretrainingTrainer` (VisualBERT, Li et al. 2019)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.collators import PROBE_KEYS
from .base import ComponentLossTrainer, ComponentLossTrainingArguments, check_bounds

TWO_STREAM_PRETRAINING_LOSS_KEYS = (
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
class TwoStreamPretrainingTrainingArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] of [`TwoStreamPretrainingTrainer`]: `qa_start_epoch`, the first (fractional)
    epoch whose training steps include the question-answering loss (Kervadec et al. add it at epoch 10 of 20).
    """

    qa_start_epoch: float = field(
        default=0.0, metadata={"help": "Epoch from which the question-answering loss is on (the paper: 10 of 20)."}
    )

    def __post_init__(self):
        super().__post_init__()
        check_bounds(self, qa_start_epoch=(">=", 0))


class TwoStreamPretrainingTrainer(ComponentLossTrainer):
    """Trainer for `TwoStreamForPreTraining`: logs each of `TWO_STREAM_PRETRAINING_LOSS_KEYS` and starts the
    question-answering loss at epoch `args.qa_start_epoch` (before it, training batches lose their `answer_labels`)."""

    args_class = TwoStreamPretrainingTrainingArguments
    loss_component_keys = TWO_STREAM_PRETRAINING_LOSS_KEYS
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
            self._record("train", "qa_loss_enabled", float(enabled))  # logged with the step's losses
            if not enabled:
                inputs = {key: value for key, value in inputs.items() if key != "answer_labels"}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


@dataclass
class SingleStreamPretrainingTrainingArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] of [`SingleStreamPretrainingTrainer`].
    """


class SingleStreamPretrainingTrainer(ComponentLossTrainer):
    """Trainer for `SingleStreamForPreTraining`: logs `loss_mlm`, `loss_sentence_image`, `loss_region_feature`,
    `loss_region_class` and `loss_attention_supervision`. Its settings are [`SingleStreamPretrainingTrainingArguments`].
    `eval_data_collator` (default: `data_collator`) collates the evaluation batches, e.g. one seeded so that every
    evaluation masks the same words; an object, so a constructor argument rather than a field of `args`.
    """

    args_class = SingleStreamPretrainingTrainingArguments
    loss_component_keys = (
        "loss_mlm",
        "loss_sentence_image",
        "loss_region_feature",
        "loss_region_class",
        "loss_attention_supervision",
    )
    non_model_keys = PROBE_KEYS

    def __init__(self, *args, eval_data_collator=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_data_collator = eval_data_collator

    def get_eval_dataloader(self, eval_dataset=None):
        if self.eval_data_collator is None:
            return super().get_eval_dataloader(eval_dataset)
        training_collator, self.data_collator = self.data_collator, self.eval_data_collator
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.data_collator = training_collator
