"""hf_vlalign: vision-and-language transformers whose attention is supervised to align words with image regions.

The public names are imported on first use (transformers-style lazy module), so that `import hf_vlalign` and the
`hf-vlalign` command start without importing torch. The Auto classes are registered as soon as transformers' auto
module loads (`utils/auto_registration.py`): `import hf_vlalign` then `AutoModel.from_pretrained(folder)` works.
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING

from .utils.auto_registration import register_when_transformers_auto_loads

__version__ = "0.1.0"

# the submodule of every public name (the same names as `hf_vlalign.models.__all__`, checked by tests/cli/test_cli.py)
_import_structure = {
    "models": [
        "AutoModelForPhraseGrounding", "AutoModelForReferringExpression", "AutoModelForRegionCaptioning",
        "AutoModelForVisualParaphrase", "AutoModelForVisualReasoning", "register_auto_classes", "ALIGNMENT_FUSIONS",
        "RegionCaptionerConfig", "RegionCaptionerForConditionalGeneration", "RegionCaptionerModel",
        "RegionCaptionerModelOutput", "RegionCaptionerOutput", "RegionCaptionerPreTrainedModel", "box_geometry",
        "shift_tokens_right", "sinusoidal_geometry_embedding", "SingleStreamConfig", "SingleStreamClassificationOutput",
        "SingleStreamForPhraseGrounding", "SingleStreamForPreTraining", "SingleStreamForPreTrainingOutput",
        "SingleStreamForQuestionAnswering", "SingleStreamForReferringExpression", "SingleStreamForVisualParaphrase",
        "SingleStreamForVisualReasoning", "SingleStreamModel", "SingleStreamModelOutput", "SingleStreamPreTrainedModel",
        "VisualParaphraseOutput", "default_text_model_path", "TwoStreamConfig", "TwoStreamClassificationOutput",
        "TwoStreamForPreTraining", "TwoStreamForPhraseGrounding", "TwoStreamForPreTrainingOutput",
        "TwoStreamForQuestionAnswering", "TwoStreamForReferringExpression", "TwoStreamForVisualReasoning",
        "TwoStreamModel", "TwoStreamModelOutput", "TwoStreamPreTrainedModel",
    ],
    "processing": ["RegionFeatureExtractor", "VLAlignProcessor", "WordRegionAttentionPipeline"],
    "supervision": ["AttentionSupervisionMixin"],
}  # fmt: skip
_module_of = {name: module for module, names in _import_structure.items() for name in names}

__all__ = ["AttentionSupervisionMixin", *_import_structure["models"], *_import_structure["processing"]]

if TYPE_CHECKING:
    from .models import *  # noqa: F403
    from .processing import RegionFeatureExtractor, VLAlignProcessor, WordRegionAttentionPipeline
    from .supervision import AttentionSupervisionMixin


def __getattr__(name: str):
    """A public name, or a subpackage (`hf_vlalign.data`, ...), imported on first access."""
    if name in _module_of:
        value = getattr(importlib.import_module(f".{_module_of[name]}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


register_when_transformers_auto_loads()
