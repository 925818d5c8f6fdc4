from .base import ComponentLossTrainer
from .pretraining import AlignmentPretrainingTrainer
from .grounding_evaluation import (
    CrossAttentionEvaluation,
    WordRegionAttention,
    cross_attention_rows,
    evaluate_cross_attention,
    evaluate_grounding,
    word_region_attention,
)
from .vgp import VGPTrainer, vgp_classification_metrics

__all__ = [
    "AlignmentPretrainingTrainer",
    "ComponentLossTrainer",
    "CrossAttentionEvaluation",
    "VGPTrainer",
    "WordRegionAttention",
    "cross_attention_rows",
    "evaluate_cross_attention",
    "evaluate_grounding",
    "vgp_classification_metrics",
    "word_region_attention",
]
