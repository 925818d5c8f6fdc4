"""Registration with transformers' Auto classes, so `AutoModel.from_pretrained(dir)` works without trust_remote_code."""

from collections import OrderedDict

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForVisualQuestionAnswering,
)
from transformers.models.auto.auto_factory import _BaseAutoModelClass, _LazyAutoMapping

from .captioning import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration, RegionCaptionerModel
from .single_stream import SingleStreamConfig, SingleStreamForVisualParaphrase, SingleStreamModel
from .two_stream import (
    TwoStreamConfig,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
)


class AutoModelForVisualParaphrase(_BaseAutoModelClass):
    """Auto class for visually-grounded-paraphrase heads (`SingleStreamForVisualParaphrase`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


class AutoModelForVisualReasoning(_BaseAutoModelClass):
    """Auto class for image-pair reasoning heads such as NLVR2 (`TwoStreamForVisualReasoning`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


class AutoModelForRegionCaptioning(_BaseAutoModelClass):
    """Auto class for captioners over region features (`RegionCaptionerForConditionalGeneration`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


def register_auto_classes() -> None:
    """Registers every hf_vlalign config with AutoConfig and its models with the matching Auto classes (idempotent)."""
    AutoConfig.register(SingleStreamConfig.model_type, SingleStreamConfig, exist_ok=True)
    AutoModel.register(SingleStreamConfig, SingleStreamModel, exist_ok=True)
    AutoModelForVisualParaphrase.register(SingleStreamConfig, SingleStreamForVisualParaphrase, exist_ok=True)
    AutoConfig.register(TwoStreamConfig.model_type, TwoStreamConfig, exist_ok=True)
    AutoModel.register(TwoStreamConfig, TwoStreamModel, exist_ok=True)
    AutoModelForPreTraining.register(TwoStreamConfig, TwoStreamForPreTraining, exist_ok=True)
    AutoModelForVisualQuestionAnswering.register(TwoStreamConfig, TwoStreamForQuestionAnswering, exist_ok=True)
    AutoModelForVisualReasoning.register(TwoStreamConfig, TwoStreamForVisualReasoning, exist_ok=True)
    AutoConfig.register(RegionCaptionerConfig.model_type, RegionCaptionerConfig, exist_ok=True)
    AutoModel.register(RegionCaptionerConfig, RegionCaptionerModel, exist_ok=True)
    AutoModelForRegionCaptioning.register(RegionCaptionerConfig, RegionCaptionerForConditionalGeneration, exist_ok=True)
