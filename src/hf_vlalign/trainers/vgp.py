"""`VGPTrainer`: fine-tuning on visually grounded paraphrases (Samaran et al. 2021), logging L_id, L_vgp and L_att."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from transformers import EvalPrediction

from ..data.collators import PROBE_KEYS
from .base import ComponentLossTrainer, ComponentLossTrainingArguments


def vgp_classification_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Accuracy of image-description identification and of VGP classification."""
    id_logits, vgp_logits = prediction.predictions[:2]
    id_labels, vgp_labels = prediction.label_ids
    return {
        "image_description_accuracy": float((np.argmax(id_logits, -1) == id_labels).mean()),
        "vgp_accuracy": float((np.argmax(vgp_logits, -1) == vgp_labels).mean()),
    }


@dataclass
class VGPTrainingArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] of [`VGPTrainer`] (distillation and EWC are what Samaran et al. propose against
    the forgetting their attention-supervised model shows).
    """


class VGPTrainer(ComponentLossTrainer):
    """Trainer for `SingleStreamForVisualParaphrase`: logs `loss_id`, `loss_vgp` and `loss_attention_supervision`
    (train and eval) and, by default, the identification and VGP accuracies at evaluation. Its settings are [`VGPTrainingArguments`]."""

    args_class = VGPTrainingArguments
    loss_component_keys = ("loss_id", "loss_vgp", "loss_attention_supervision")
    non_model_keys = PROBE_KEYS

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("compute_metrics", vgp_classification_metrics)
        super().__init__(*args, **kwargs)
        self.label_names = ["id_labels", "vgp_labels"]
