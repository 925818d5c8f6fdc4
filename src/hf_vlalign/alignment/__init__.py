from .boxes import alignment_target, box_area, box_iou, gold_region_iou, normalize_boxes
from .soft_targets import (
    SoftAlignmentTargets,
    combine_criteria,
    normalise_over_objects,
    positional_criterion,
    semantic_criterion,
)
from .word_vectors import (
    GloveWordVectors,
    SentenceEmbeddingWordVectors,
    default_word_vectors,
    glove_package_path,
    load_word_vectors,
    read_vocabulary,
)

__all__ = [
    "GloveWordVectors",
    "SentenceEmbeddingWordVectors",
    "SoftAlignmentTargets",
    "alignment_target",
    "box_area",
    "box_iou",
    "combine_criteria",
    "default_word_vectors",
    "glove_package_path",
    "gold_region_iou",
    "load_word_vectors",
    "normalise_over_objects",
    "normalize_boxes",
    "positional_criterion",
    "read_vocabulary",
    "semantic_criterion",
]
