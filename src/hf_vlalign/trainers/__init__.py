"""`Trainer` subclasses, one per training recipe, each logging every loss component. The evaluation runners that
lived here moved to `hf_vlalign.evaluation` (their old names still import from here, with a FutureWarning)."""

from ..utils.deprecation import moved_names
from .base import ComponentLossTrainer
from .captioning import CaptioningTrainer
from .pretraining import AlignmentPretrainingTrainer
from .task import PhraseGroundingTrainer, ReferringExpressionTrainer, SingleStreamPretrainingTrainer, TaskTrainer
from .vgp import VGPTrainer, vgp_classification_metrics

_MOVED_TO_EVALUATION = (
    "CrossAttentionEvaluation",
    "WordRegionAttention",
    "cross_attention_rows",
    "evaluate_cross_attention",
    "evaluate_decoder_grounding",
    "evaluate_grounding",
    "word_region_attention",
    "image_use_gap",
    "shuffled_rows",
    "task_scores",
)
__getattr__ = moved_names(__name__, lambda name: "hf_vlalign.evaluation" if name in _MOVED_TO_EVALUATION else None)

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
