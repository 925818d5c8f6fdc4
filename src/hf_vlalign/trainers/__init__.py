"""`Trainer` subclasses, one per training recipe, each logging every loss component."""

from .base import ComponentLossTrainer
from .captioning import CaptioningTrainer
from .pretraining import AlignmentPretrainingTrainer
from .task import PhraseGroundingTrainer, ReferringExpressionTrainer, SingleStreamPretrainingTrainer, TaskTrainer
from .vgp import VGPTrainer, vgp_classification_metrics

__all__ = [
    "AlignmentPretrainingTrainer",
    "CaptioningTrainer",
    "ComponentLossTrainer",
    "PhraseGroundingTrainer",
    "ReferringExpressionTrainer",
    "SingleStreamPretrainingTrainer",
    "TaskTrainer",
    "VGPTrainer",
    "vgp_classification_metrics",
]
