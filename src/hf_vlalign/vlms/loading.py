"""Loading a transformers patch model and its processor from a local folder or a Hub id."""

from __future__ import annotations

import transformers
from transformers import AutoConfig, AutoModel, AutoProcessor

from ..utils.optional import require_processor_extras
from .families import PATCH_MODEL_TYPES

__all__ = ["is_patch_model", "load_patch_model"]


def is_patch_model(name_or_path: str) -> bool:
    """Whether the checkpoint's config names one of the supported patch models (its `model_type`); False when the
    config cannot be read (the caller's own checks then say why)."""
    try:
        config, _ = transformers.PretrainedConfig.get_config_dict(name_or_path)
    except (OSError, ValueError, TypeError):  # no such folder or id, a damaged or non-object config.json
        return False
    return isinstance(config, dict) and config.get("model_type") in PATCH_MODEL_TYPES


def load_patch_model(name_or_path: str, argument: str = "model", **kwargs):
    """(model in eval mode, processor): the class named first in the config's `architectures` (e.g.
    `LlavaForConditionalGeneration`, `ViltForQuestionAnswering`), else the family's base model (`AutoModel`), so that
    every family loads, ViLT too (no `AutoModelForImageTextToText` class); `kwargs` go to `from_pretrained` (`dtype`,
    `attn_implementation`). Any other model is refused before its weights load, naming `argument` and the families."""
    config = AutoConfig.from_pretrained(name_or_path)
    if config.model_type not in PATCH_MODEL_TYPES:
        architecture = (config.architectures or [type(config).__name__])[0]
        raise ValueError(
            f"`{argument}` {name_or_path} holds a {architecture} ({config.model_type}); hf_vlalign reads the "
            f"transformers vision-language models of the model types {', '.join(PATCH_MODEL_TYPES)} (docs/vlms.md)."
        )
    require_processor_extras(config.model_type)
    architecture = (config.architectures or [None])[0]
    model_class = getattr(transformers, architecture, None) if architecture else None
    model = (model_class or AutoModel).from_pretrained(name_or_path, **kwargs)
    return model.eval(), AutoProcessor.from_pretrained(name_or_path)
