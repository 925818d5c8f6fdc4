from .auto import (
    AutoModelForPhraseGrounding,
    AutoModelForReferringExpression,
    AutoModelForRegionCaptioning,
    AutoModelForVisualParaphrase,
    AutoModelForVisualReasoning,
    register_auto_classes,
)
from .captioning import *  # noqa: F403
from .captioning import __all__ as _captioning_all
from .single_stream import *  # noqa: F403
from .single_stream import __all__ as _single_stream_all
from .two_stream import *  # noqa: F403
from .two_stream import __all__ as _two_stream_all

__all__ = [  # noqa: PLE0604
    "AutoModelForPhraseGrounding",
    "AutoModelForReferringExpression",
    "AutoModelForRegionCaptioning",
    "AutoModelForVisualParaphrase",
    "AutoModelForVisualReasoning",
    "register_auto_classes",
    *_captioning_all,
    *_single_stream_all,
    *_two_stream_all,
]

register_auto_classes()  # importing the models registers them with transformers' Auto classes
