from .configuration_captioning import ALIGNMENT_FUSIONS, RegionCaptionerConfig
from .modeling_captioning import (
    RegionCaptionerForConditionalGeneration,
    RegionCaptionerModel,
    RegionCaptionerModelOutput,
    RegionCaptionerOutput,
    RegionCaptionerPreTrainedModel,
    box_geometry,
    shift_tokens_right,
    sinusoidal_geometry_embedding,
)

__all__ = [
    "ALIGNMENT_FUSIONS",
    "RegionCaptionerConfig",
    "RegionCaptionerForConditionalGeneration",
    "RegionCaptionerModel",
    "RegionCaptionerModelOutput",
    "RegionCaptionerOutput",
    "RegionCaptionerPreTrainedModel",
    "box_geometry",
    "shift_tokens_right",
    "sinusoidal_geometry_embedding",
]
