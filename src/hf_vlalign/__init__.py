"""hf_vlalign: vision-and-language transformers whose attention is supervised to align words with image regions."""

from .models import (
    AutoModelForRegionCaptioning,
    AutoModelForVisualParaphrase,
    AutoModelForVisualReasoning,
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    RegionCaptionerModel,
    RegionCaptionerOutput,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    SingleStreamModelOutput,
    SingleStreamPreTrainedModel,
    TwoStreamClassificationOutput,
    TwoStreamConfig,
    TwoStreamForPreTraining,
    TwoStreamForPreTrainingOutput,
    TwoStreamForQuestionAnswering,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
    TwoStreamModelOutput,
    TwoStreamPreTrainedModel,
    VisualParaphraseOutput,
    default_text_model_path,
    register_auto_classes,
)
from .supervision import AttentionSupervisionMixin

__version__ = "0.1.0"

register_auto_classes()

__all__ = [
    "AttentionSupervisionMixin",
    "AutoModelForRegionCaptioning",
    "RegionCaptionerConfig",
    "RegionCaptionerForConditionalGeneration",
    "RegionCaptionerModel",
    "RegionCaptionerOutput",
    "AutoModelForVisualParaphrase",
    "AutoModelForVisualReasoning",
    "SingleStreamConfig",
    "SingleStreamForVisualParaphrase",
    "SingleStreamModel",
    "SingleStreamModelOutput",
    "SingleStreamPreTrainedModel",
    "TwoStreamClassificationOutput",
    "TwoStreamConfig",
    "TwoStreamForPreTraining",
    "TwoStreamForPreTrainingOutput",
    "TwoStreamForQuestionAnswering",
    "TwoStreamForVisualReasoning",
    "TwoStreamModel",
    "TwoStreamModelOutput",
    "TwoStreamPreTrainedModel",
    "VisualParaphraseOutput",
    "default_text_model_path",
    "register_auto_classes",
]
