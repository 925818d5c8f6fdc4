from .configuration_captioning import ALIGNMENT_FUSIONS, RegionCaptionerConfig
from .modeling_captioning import *  # noqa: F403
from .modeling_captioning import __all__ as _modeling_all

__all__ = ["ALIGNMENT_FUSIONS", "RegionCaptionerConfig", *_modeling_all]  # noqa: PLE0604
