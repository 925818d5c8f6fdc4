from .base import ComponentLossTrainer
from .vgp import VGPTrainer, vgp_classification_metrics

__all__ = ["ComponentLossTrainer", "VGPTrainer", "vgp_classification_metrics"]
