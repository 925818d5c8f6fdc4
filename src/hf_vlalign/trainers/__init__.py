from .base import ComponentLossTrainer
from .pretraining import AlignmentPretrainingTrainer
from .grounding_evaluation import WordRegionAttention, evaluate_grounding, word_region_attention
from .vgp import VGPTrainer, vgp_classification_metrics

__all__ = [
    "AlignmentPretrainingTrainer",
    "ComponentLossTrainer",
    "VGPTrainer",
    "WordRegionAttention",
    "evaluate_grounding",
    "vgp_classification_metrics",
    "word_region_attention",
]
