"""transformers' own patch vision-language models (ViLT, LLaVA, PaliGemma, and the multi-view Qwen-VL, LLaVA-NeXT /
OneVision, Idefics3 / SmolVLM, Gemma 3, InternVL and Mistral 3): image tokens as boxes over any number of views, the
grounding probe, and Samaran et al.'s attention supervision through the models' attention interface or hooks."""

from .data import PatchGroundingCollator, grounded_caption_examples, patch_batches
from .families import PATCH_MODEL_TYPES, PatchLayout, forward_with_layout, patch_model_family
from .image_token_geometry import image_token_map
from .probe import eager_attention, probe_patch_model
from .recording import AttentionRecorder
from .supervision import PATCH_SUPERVISION_METHODS, grounded_token_count, patch_attention_loss
from .views import ImageTokenMap, TokenView

__all__ = [
    "PATCH_MODEL_TYPES",
    "PATCH_SUPERVISION_METHODS",
    "AttentionRecorder",
    "ImageTokenMap",
    "PatchGroundingCollator",
    "PatchLayout",
    "TokenView",
    "eager_attention",
    "forward_with_layout",
    "grounded_caption_examples",
    "grounded_token_count",
    "image_token_map",
    "patch_batches",
    "patch_attention_loss",
    "patch_model_family",
    "probe_patch_model",
]
