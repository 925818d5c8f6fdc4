"""Registration with transformers' Auto classes, so `AutoModel.from_pretrained(dir)` works without trust_remote_code."""

from collections import OrderedDict

import transformers
from transformers import AutoConfig
from transformers.models.auto.auto_factory import _BaseAutoModelClass, _LazyAutoMapping

from .family import FAMILIES, LIBRARY_AUTO_CLASSES


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
    """Registers every hf_vlalign config with AutoConfig and its models with the Auto classes their family's
    `FamilySpec` names (`hf_vlalign.models.family.FAMILIES`; idempotent)."""
    for spec in FAMILIES.values():
        config_class = spec.config_class_object()
        AutoConfig.register(spec.model_type, config_class, exist_ok=True)
        for kind, model in spec.models.items():
            model_class = spec.model_class_object(kind)
            for auto_class in model.auto_classes:
                # one of this module's Auto classes (`LIBRARY_AUTO_CLASSES`), else transformers'
                auto = globals()[auto_class] if auto_class in LIBRARY_AUTO_CLASSES else getattr(transformers, auto_class)
                auto.register(config_class, model_class, exist_ok=True)
