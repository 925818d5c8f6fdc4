from .boxes import alignment_target, box_area, box_iou, gold_region_iou, normalize_boxes
from .soft_targets import (
    SoftAlignmentTargets,
    combine_criteria,
    normalise_over_objects,
    positional_criterion,
    semantic_criterion,
)
from .word_vectors import GloveWordVectors, SentenceEmbeddingWordVectors, read_vocabulary

__all__ = [
    "GloveWordVectors",
    "SentenceEmbeddingWordVectors",
    "SoftAlignmentTargets",
    "alignment_target",
    "box_area",
    "box_iou",
    "combine_criteria",
    "gold_region_iou",
    "normalise_over_objects",
    "normalize_boxes",
    "positional_criterion",
    "read_vocabulary",
    "semantic_criterion",
]
