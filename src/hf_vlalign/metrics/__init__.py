"""Task metrics, each a plain function and an `evaluate` module loadable from its local path (no Hub access), and the
one grounding rule (`region_hits`) every grounding accuracy and baseline of the library applies."""

from .captioning import caption_scores, load_caption_metric
from .gqa import gqa_scores, load_gqa_metric
from .grounding import largest_region_accuracy, largest_region_recall, region_hits
from .nlvr2 import load_nlvr2_metric, nlvr2_scores
from .phrase_grounding import load_phrase_grounding_metric, phrase_grounding_recall
from .referring import load_referring_metric, referring_expression_accuracy
from .vgp import vgp_accuracy
from .vqa import load_vqa_metric, normalize_vqa_answer, vqa_accuracy

__all__ = [
    "caption_scores",
    "gqa_scores",
    "largest_region_accuracy",
    "largest_region_recall",
    "load_caption_metric",
    "load_gqa_metric",
    "load_nlvr2_metric",
    "load_phrase_grounding_metric",
    "load_referring_metric",
    "load_vqa_metric",
    "nlvr2_scores",
    "normalize_vqa_answer",
    "phrase_grounding_recall",
    "referring_expression_accuracy",
    "region_hits",
    "vgp_accuracy",
    "vqa_accuracy",
]
