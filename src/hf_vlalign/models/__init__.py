from .auto import AutoModelForVisualParaphrase, register_auto_classes
from .single_stream import *  # noqa: F403
from .single_stream import __all__ as _single_stream_all

__all__ = ["AutoModelForVisualParaphrase", "register_auto_classes", *_single_stream_all]
