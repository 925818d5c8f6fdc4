"""Collators: builder rows + a `RegionFeatureStore` -> the DESIGN.md tensors of a batch, one per task family.

| collator | rows from | text | extra outputs |
|---|---|---|---|
| `GroundedCaptionCollator` | flickr30k_entities, visual_genome, coco_captions, synthetic_scenes | one caption | `labels` if a label column is named |
| `PhraseGroundingCollator` | flickr30k_entities, synthetic_scenes (captions) | one caption | `phrase_labels` (B, P, R) |
| `VGPCollator` | vgp | caption pair | `phrase1_mask`, `phrase2_mask`, `id_labels`, `vgp_labels` |
| `QuestionAnsweringCollator` | vqa_v2 (soft scores), gqa (one answer) | question | `labels` (B, num_answers) soft or (B,) |
| `ImagePairCollator` | nlvr2 | sentence | visual tensors with a pair axis: (B, 2, R, ...); `labels` |
| `ReferringExpressionCollator` | refcoco+ | expression | `labels` (best-IoU region), `target_region_iou` (B, R) |
| `CaptioningCollator` | coco_captions | caption as target | `labels` (B, T) with -100 padding, `decoder_attention_mask` |
| `TwoStreamPretrainingCollator` | gqa, synthetic_scenes (questions), captions | one text | masked words / objects, `matched_labels`, `answer_labels`, soft A* |
| `SingleStreamPretrainingCollator` | flickr30k_entities, coco_captions, synthetic_scenes (captions) | caption pair (or one) | masked words / regions, `sentence_image_labels` |

Regions are padded to the batch's longest image (`visual_attention_mask`). Texts longer than `max_text_length` are
truncated as the tokenizer does, never refused; a grounded phrase that loses a word piece loses its alignment, and
`truncation_stats` counts it (docs/datasets.md). A malformed row is refused with a ValueError naming the batch row and
the column; a gold box that overlaps no region gets no target (never region 0), counted in `unmatched_phrases`.
"""

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
