from .auto import AutoModelForVisualParaphrase, AutoModelForVisualReasoning, register_auto_classes
from .single_stream import *  # noqa: F403
from .single_stream import __all__ as _single_stream_all
from .two_stream import *  # noqa: F403
from .two_stream import __all__ as _two_stream_all

__all__ = [  # noqa: PLE0604
    "AutoModelForVisualParaphrase",
    "AutoModelForVisualReasoning",
    "register_auto_classes",
    *_single_stream_all,
    *_two_stream_all,
]
