"""The processor of hf_vlalign's models (tokenizer + region features) and the "word-region-attention" pipeline.

- `RegionFeatureExtractor`: images -> regions (given boxes, a transformers detector, or a grid) and their features
  (the pixel encoder or a transformers vision backbone); the keyword arguments of `extract_region_features`.
- `VLAlignProcessor`: the tokenizer and the extractor; `processor(images=..., text=...)` -> the model's inputs.
- `WordRegionAttentionPipeline`: `pipeline("word-region-attention", model=DIR)` -> each word's region weights.

`register_processing()` registers them with `AutoImageProcessor`, `AutoProcessor` (for the three families' configs)
and transformers' pipeline registry; it runs when hf_vlalign's models are registered (`import hf_vlalign`, then any
transformers Auto class).
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
