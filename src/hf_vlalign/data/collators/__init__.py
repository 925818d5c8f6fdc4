"""Collators: builder rows + a `RegionFeatureStore` -> the DESIGN.md tensors of a batch, one per task family
(docs/datasets.md lists them). Regions are padded to the batch's longest image; texts longer than `max_text_length`
are truncated, never refused (`truncation_stats`); a malformed row is refused naming the batch row and the column."""

from .base import PROBE_KEYS, RegionTextCollator, span_token_mask
from .captioning import CaptioningCollator
from .grounding import GroundedCaptionCollator, PhraseGroundingCollator
from .image_pair import ImagePairCollator
from .pretraining import SingleStreamPretrainingCollator, TwoStreamPretrainingCollator, group_captions_by_image
from .question_answering import QuestionAnsweringCollator
from .referring import ReferringExpressionCollator
from .regions import pad_regions, store_image_id
from .truncation import TruncationStats, cut_word_pieces, drop_overlong_rows, span_is_cut
from .vgp import VGPCollator

__all__ = [
    "PROBE_KEYS",
    "CaptioningCollator",
    "GroundedCaptionCollator",
    "ImagePairCollator",
    "PhraseGroundingCollator",
    "QuestionAnsweringCollator",
    "ReferringExpressionCollator",
    "RegionTextCollator",
    "SingleStreamPretrainingCollator",
    "TruncationStats",
    "TwoStreamPretrainingCollator",
    "VGPCollator",
    "cut_word_pieces",
    "drop_overlong_rows",
    "group_captions_by_image",
    "pad_regions",
    "span_is_cut",
    "span_token_mask",
    "store_image_id",
]
