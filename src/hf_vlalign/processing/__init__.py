"""The processor of hf_vlalign's models (tokenizer + region features) and the "word-region-attention" pipeline.

`register_processing()` registers `RegionFeatureExtractor`, `VLAlignProcessor` and `WordRegionAttentionPipeline` with
`AutoImageProcessor`, `AutoProcessor` and transformers' pipeline registry when hf_vlalign's models are registered.
"""

from transformers import AutoImageProcessor, AutoProcessor

from ..models.family import FAMILIES
from .feature_extraction import RegionFeatureExtractor, RegionFeatureExtractorKwargs
from .pipeline import WORD_REGION_ATTENTION_TASK, WordRegionAttentionPipeline, register_pipeline
from .processor import VLAlignProcessor

__all__ = [
    "WORD_REGION_ATTENTION_TASK",
    "RegionFeatureExtractor",
    "RegionFeatureExtractorKwargs",
    "VLAlignProcessor",
    "WordRegionAttentionPipeline",
    "register_processing",
]


def register_processing() -> None:
    """Registers the extractor and the processor for every family's config, and the pipeline task (idempotent)."""
    for spec in FAMILIES.values():
        config_class = spec.config_class_object()
        AutoImageProcessor.register(config_class, image_processor_classes={"pil": RegionFeatureExtractor}, exist_ok=True)
        AutoProcessor.register(config_class, VLAlignProcessor, exist_ok=True)
    register_pipeline()


register_processing()
