from .configuration_two_stream import TwoStreamConfig
from .modeling_two_stream import *  # noqa: F403
from .modeling_two_stream import __all__ as _modeling_all

__all__ = ["TwoStreamConfig", *_modeling_all]  # noqa: PLE0604
