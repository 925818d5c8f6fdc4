"""transformers' own patch vision-language models (ViLT, LLaVA, PaliGemma): patches as regions, the grounding
probe, and Samaran et al.'s attention supervision through the models' attention interface or hooks."""

from .data import PatchGroundingCollator, grounded_caption_examples, patch_batches
from .families import PATCH_MODEL_TYPES, PatchLayout, forward_with_layout, patch_model_family
from .probe import eager_attention, probe_patch_model
from .recording import AttentionRecorder
from .supervision import PATCH_SUPERVISION_METHODS, grounded_token_count, patch_attention_loss

__all__ = [
    "PATCH_MODEL_TYPES",
    "PATCH_SUPERVISION_METHODS",
    "AttentionRecorder",
    "PatchGroundingCollator",
    "PatchLayout",
    "eager_attention",
    "forward_with_layout",
    "grounded_caption_examples",
    "grounded_token_count",
    "patch_batches",
    "patch_attention_loss",
    "patch_model_family",
    "probe_patch_model",
]
