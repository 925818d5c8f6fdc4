from .configuration_single_stream import SingleStreamConfig
from .modeling_single_stream import *  # noqa: F403
from .modeling_single_stream import __all__ as _modeling_all

__all__ = ["SingleStreamConfig", *_modeling_all]  # noqa: PLE0604
