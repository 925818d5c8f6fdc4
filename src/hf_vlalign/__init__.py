"""hf_vlalign: vision-and-language transformers whose attention is supervised to align words with image regions."""

from .models import *  # noqa: F403
from .models import __all__ as _models_all
from .models import register_auto_classes
from .supervision import AttentionSupervisionMixin

__version__ = "0.1.0"

register_auto_classes()

__all__ = ["AttentionSupervisionMixin", *_models_all]  # noqa: PLE0604
