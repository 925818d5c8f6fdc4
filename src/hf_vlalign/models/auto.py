"""Registration with transformers' Auto classes, so `AutoModel.from_pretrained(dir)` works without trust_remote_code."""

from collections import OrderedDict

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForSeq2SeqLM,
    AutoModelForVisualQuestionAnswering,
)
from transformers.models.auto.auto_factory import _BaseAutoModelClass, _LazyAutoMapping

from .captioning import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration, RegionCaptionerModel
from .single_stream import (
    SingleStreamConfig,
    SingleStreamForPhraseGrounding,
    SingleStreamForPreTraining,
    SingleStreamForQuestionAnswering,
    SingleStreamForReferringExpression,
    SingleStreamForVisualParaphrase,
    SingleStreamForVisualReasoning,
    SingleStreamModel,
)
from .two_stream import (
    TwoStreamConfig,
    TwoStreamForPhraseGrounding,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamForReferringExpression,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
)


class AutoModelForVisualParaphrase(_BaseAutoModelClass):
    """Auto class for visually-grounded-paraphrase heads (`SingleStreamForVisualParaphrase`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


class AutoModelForVisualReasoning(_BaseAutoModelClass):
    """Auto class for image-pair reasoning heads such as NLVR2 (`TwoStreamForVisualReasoning`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


class AutoModelForReferringExpression(_BaseAutoModelClass):
    """Auto class for region-scoring heads of referring expressions (RefCOCO+; `SingleStreamForReferringExpression`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


class AutoModelForPhraseGrounding(_BaseAutoModelClass):
    """Auto class for phrase grounding heads (Flickr30k Entities; `SingleStreamForPhraseGrounding`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


class AutoModelForRegionCaptioning(_BaseAutoModelClass):
    """Auto class for captioners over region features (`RegionCaptionerForConditionalGeneration`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


def register_auto_classes() -> None:
    """Registers every hf_vlalign config with AutoConfig and its models with the matching Auto classes (idempotent)."""
    AutoConfig.register(SingleStreamConfig.model_type, SingleStreamConfig, exist_ok=True)
    AutoModel.register(SingleStreamConfig, SingleStreamModel, exist_ok=True)
    AutoModelForVisualParaphrase.register(SingleStreamConfig, SingleStreamForVisualParaphrase, exist_ok=True)
    AutoModelForPreTraining.register(SingleStreamConfig, SingleStreamForPreTraining, exist_ok=True)
    AutoModelForVisualQuestionAnswering.register(SingleStreamConfig, SingleStreamForQuestionAnswering, exist_ok=True)
    AutoModelForVisualReasoning.register(SingleStreamConfig, SingleStreamForVisualReasoning, exist_ok=True)
    AutoModelForReferringExpression.register(SingleStreamConfig, SingleStreamForReferringExpression, exist_ok=True)
    AutoModelForPhraseGrounding.register(SingleStreamConfig, SingleStreamForPhraseGrounding, exist_ok=True)
    AutoConfig.register(TwoStreamConfig.model_type, TwoStreamConfig, exist_ok=True)
    AutoModel.register(TwoStreamConfig, TwoStreamModel, exist_ok=True)
    AutoModelForPreTraining.register(TwoStreamConfig, TwoStreamForPreTraining, exist_ok=True)
    AutoModelForVisualQuestionAnswering.register(TwoStreamConfig, TwoStreamForQuestionAnswering, exist_ok=True)
    AutoModelForVisualReasoning.register(TwoStreamConfig, TwoStreamForVisualReasoning, exist_ok=True)
    AutoModelForReferringExpression.register(TwoStreamConfig, TwoStreamForReferringExpression, exist_ok=True)
    AutoModelForPhraseGrounding.register(TwoStreamConfig, TwoStreamForPhraseGrounding, exist_ok=True)
    AutoConfig.register(RegionCaptionerConfig.model_type, RegionCaptionerConfig, exist_ok=True)
    AutoModel.register(RegionCaptionerConfig, RegionCaptionerModel, exist_ok=True)
    AutoModelForRegionCaptioning.register(RegionCaptionerConfig, RegionCaptionerForConditionalGeneration, exist_ok=True)
    # as its remote code: an encoder-decoder generating text, like BART (`AutoModelForSeq2SeqLM` + `generate`)
    AutoModelForSeq2SeqLM.register(RegionCaptionerConfig, RegionCaptionerForConditionalGeneration, exist_ok=True)
