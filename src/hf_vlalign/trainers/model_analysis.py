"""Moved to `hf_vlalign.evaluation.model_analysis`: this path still imports, with a FutureWarning."""

from ..utils.deprecation import moved_module

__getattr__ = moved_module(__name__, "hf_vlalign.evaluation.model_analysis")
