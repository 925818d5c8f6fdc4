"""Registration with transformers' Auto classes, so `AutoModel.from_pretrained(dir)` works without trust_remote_code."""

from collections import OrderedDict

from transformers import AutoConfig, AutoModel
from transformers.models.auto.auto_factory import _BaseAutoModelClass, _LazyAutoMapping

from .single_stream import SingleStreamConfig, SingleStreamForVisualParaphrase, SingleStreamModel


class AutoModelForVisualParaphrase(_BaseAutoModelClass):
    """Auto class for visually-grounded-paraphrase heads (`SingleStreamForVisualParaphrase`, ...)."""

    _model_mapping = _LazyAutoMapping(OrderedDict(), OrderedDict())


def register_auto_classes() -> None:
    """Registers every hf_vlalign config with AutoConfig and its models with the matching Auto classes (idempotent)."""
    AutoConfig.register(SingleStreamConfig.model_type, SingleStreamConfig, exist_ok=True)
    AutoModel.register(SingleStreamConfig, SingleStreamModel, exist_ok=True)
    AutoModelForVisualParaphrase.register(SingleStreamConfig, SingleStreamForVisualParaphrase, exist_ok=True)
