"""Evaluation runners: the grounding probe, task evaluation of a saved checkpoint, the model analysis and explorer, the
image-use gap, the mechanism diagnostics and the task metrics of the examples; every batched pass goes through `inference.inference_batches`."""

from .grounding import (
    CrossAttentionEvaluation,
    WordRegionAttention,
    cross_attention_rows,
    entity_grounding_metrics,
    evaluate_cross_attention,
    evaluate_decoder_grounding,
    evaluate_grounding,
    probe_attention_blocks,
    word_region_attention,
)
from .diagnostics import mechanism_diagnostics
from .image_use import RegionShuffleCollator, image_use_gap, shuffled_rows, task_scores
from .inference import NON_MODEL_KEYS, InferenceBatch, inference_batches, split_batch

__all__ = [
    "NON_MODEL_KEYS",
    "CrossAttentionEvaluation",
    "InferenceBatch",
    "RegionShuffleCollator",
    "WordRegionAttention",
    "cross_attention_rows",
    "entity_grounding_metrics",
    "evaluate_cross_attention",
    "evaluate_decoder_grounding",
    "evaluate_grounding",
    "image_use_gap",
    "inference_batches",
    "mechanism_diagnostics",
    "probe_attention_blocks",
    "shuffled_rows",
    "split_batch",
    "task_scores",
    "word_region_attention",
]
