from .base import ComponentLossTrainer
from .captioning import CaptioningTrainer
from .grounding_evaluation import (
    CrossAttentionEvaluation,
    WordRegionAttention,
    cross_attention_rows,
    evaluate_cross_attention,
    evaluate_decoder_grounding,
    evaluate_grounding,
    word_region_attention,
)
from .image_use import image_use_gap, shuffled_rows, task_scores
from .pretraining import AlignmentPretrainingTrainer
from .task import SingleStreamPretrainingTrainer, TaskTrainer
from .vgp import VGPTrainer, vgp_classification_metrics

__all__ = [
    "AlignmentPretrainingTrainer",
    "CaptioningTrainer",
    "ComponentLossTrainer",
    "SingleStreamPretrainingTrainer",
    "TaskTrainer",
    "CrossAttentionEvaluation",
    "VGPTrainer",
    "WordRegionAttention",
    "cross_attention_rows",
    "evaluate_cross_attention",
    "evaluate_decoder_grounding",
    "evaluate_grounding",
    "image_use_gap",
    "shuffled_rows",
    "task_scores",
    "vgp_classification_metrics",
    "word_region_attention",
]
