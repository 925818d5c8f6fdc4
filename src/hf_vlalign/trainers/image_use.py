"""Moved to `hf_vlalign.evaluation.image_use`: this path still imports, with a FutureWarning."""

from ..utils.lazy_exports import lazy_exports, moved_warning

__getattr__, __dir__ = lazy_exports(__name__, default="hf_vlalign.evaluation.image_use", deprecation=moved_warning(__name__, "hf_vlalign.evaluation.image_use"))
