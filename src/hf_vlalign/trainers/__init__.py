"""`Trainer` subclasses, one per training recipe, each logging every loss component."""

from .base import ComponentLossTrainer, ComponentLossTrainingArguments
from .captioning import CaptioningTrainer, CaptioningTrainingArguments
from .pretraining import (
    SingleStreamPretrainingTrainer,
    SingleStreamPretrainingTrainingArguments,
    TwoStreamPretrainingTrainer,
    TwoStreamPretrainingTrainingArguments,
)
from .task import (
    PhraseGroundingTrainer,
    PhraseGroundingTrainingArguments,
    ReferringExpressionTrainer,
    TaskTrainer,
    TaskTrainingArguments,
)
from .vgp import VGPTrainer, VGPTrainingArguments, vgp_classification_metrics

__all__ = [
    "CaptioningTrainer",
    "CaptioningTrainingArguments",
    "ComponentLossTrainer",
    "ComponentLossTrainingArguments",
    "PhraseGroundingTrainer",
    "PhraseGroundingTrainingArguments",
    "ReferringExpressionTrainer",
    "SingleStreamPretrainingTrainer",
    "SingleStreamPretrainingTrainingArguments",
    "TaskTrainer",
    "TaskTrainingArguments",
    "TwoStreamPretrainingTrainer",
    "TwoStreamPretrainingTrainingArguments",
    "VGPTrainer",
    "VGPTrainingArguments",
    "vgp_classification_metrics",
]
