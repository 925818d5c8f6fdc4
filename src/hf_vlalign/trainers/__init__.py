"""`Trainer` subclasses, one per training recipe, each logging every loss component."""

from .base import ComponentLossTrainer, ComponentLossTrainingArguments
from .captioning import CaptioningTrainer, CaptioningTrainingArguments
from .pretraining import AlignmentPretrainingTrainer, AlignmentPretrainingTrainingArguments
from .task import (
    PhraseGroundingTrainer,
    PhraseGroundingTrainingArguments,
    ReferringExpressionTrainer,
    SingleStreamPretrainingTrainer,
    SingleStreamPretrainingTrainingArguments,
    TaskTrainer,
    TaskTrainingArguments,
)
from .vgp import VGPTrainer, VGPTrainingArguments, vgp_classification_metrics

__all__ = [
    "AlignmentPretrainingTrainer",
    "AlignmentPretrainingTrainingArguments",
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
    "VGPTrainer",
    "VGPTrainingArguments",
    "vgp_classification_metrics",
]
