"""`Trainer` subclasses, one per training recipe, each logging every loss component. The evaluation runners that
lived here moved to `hf_vlalign.evaluation` (their old names still import from here, with a FutureWarning)."""

from ..utils.lazy_exports import lazy_exports, moved_warning
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
__getattr__, __dir__ = lazy_exports(
    __name__,
    names={name: ("hf_vlalign.evaluation", name) for name in _MOVED_TO_EVALUATION},
    deprecation=moved_warning(__name__, "hf_vlalign.evaluation"),
)

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
