"""`VGPTrainer`: fine-tuning on visually grounded paraphrases (Samaran et al. 2021), logging L_id, L_vgp and L_att."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
from transformers import EvalPrediction

from ..data.collators import PROBE_KEYS
from ..metrics.vgp import vgp_accuracy
from .head_learning_rate import HeadLearningRateArguments, HeadLearningRateTrainer


def vgp_classification_metrics(
    prediction: EvalPrediction, class_names: Sequence[str], vgp_task: str = "type"
) -> dict[str, float]:
    """Accuracy of image-description identification (`image_description_accuracy`) and of VGP classification (eq. 4),
    overall and per class (`vgp_accuracy` of `hf_vlalign.metrics`: `vgp_type_accuracy/<type>` or
    `vgp_class_accuracy/<class>`, the unlabelled pairs counted in `vgp_unlabelled_pairs`)."""
    id_logits, vgp_logits = prediction.predictions[:2]
    id_labels, vgp_labels = prediction.label_ids
    per_class_key = "vgp_type" if vgp_task == "type" else "vgp_class"
    return {
        "image_description_accuracy": float((np.argmax(id_logits, -1) == id_labels).mean()),
        **vgp_accuracy(vgp_logits, vgp_labels, class_names, per_class_key=per_class_key),
    }


@dataclass
class VGPTrainingArguments(HeadLearningRateArguments):
    r"""[`HeadLearningRateArguments`] of [`VGPTrainer`] (distillation and EWC are what Samaran et al. propose against
    the forgetting their attention-supervised model shows)."""


class VGPTrainer(HeadLearningRateTrainer):
    """Trainer for `SingleStreamForVisualParaphrase`: logs `loss_id`, `loss_vgp` and `loss_attention_supervision` and,
    by default, `vgp_classification_metrics` at evaluation."""

    args_class = VGPTrainingArguments
    loss_component_keys = ("loss_id", "loss_vgp", "loss_attention_supervision")
    non_model_keys = PROBE_KEYS
    # what a text checkpoint lacks: the visual embeddings, the identification and VGP heads, indirect supervision's head
    new_modules = ("visual_embeddings", "id_classifier", "vgp_dense", "vgp_classifier", "indirect_grounding_head")

    def __init__(self, model=None, *args, **kwargs):
        if "compute_metrics" not in kwargs and hasattr(getattr(model, "config", None), "vgp_class_names"):
            config = model.config
            kwargs["compute_metrics"] = partial(
                vgp_classification_metrics, class_names=config.vgp_class_names(), vgp_task=config.vgp_task
            )
        super().__init__(model, *args, **kwargs)
        self.label_names = ["id_labels", "vgp_labels"]
