"""Collators: builder rows + a `RegionFeatureStore` -> the DESIGN.md tensors of a batch, one per task family.

Modules: `base` (`RegionTextCollator`, which every collator extends), `rows` (row checks), `truncation`, `regions`,
`masking`, then one module per task family: `grounding`, `vgp`, `question_answering`, `image_pair`, `referring`,
`captioning`, `pretraining`.

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

Regions are padded to the longest image of the batch, flagged by `visual_attention_mask`; boxes are normalised once,
by `alignment.boxes.normalize_boxes`, with the store's image size. Grounded phrases (`<text>_phrase_spans` with
`<text>_phrase_regions` from `build_dataset(..., region_features=store)`, or `<text>_phrase_boxes` matched here by IoU) give
`word_region_alignment` (B, T, R) and `phrase_masks` (B, P, T).

Truncation (`max_text_length`): one long row never stops a run. Texts are truncated the way the tokenizer does
(`truncation=True`: a caption pair loses word pieces from the longer caption first). A grounded phrase with a word
piece beyond the truncation (partly or wholly cut) loses its alignment: no `word_region_alignment` rows, no
`phrase_masks` / `phrase_labels` entry. A span a row cannot be trained without (`required_spans`: the VGP phrase pair)
is kept as far as it survives, or replaced by its caption's remaining tokens when wholly cut; such rows should be
removed before training with `drop_overlong_rows` (or `collator.drop_overlong_rows(dataset)`), which counts and warns.
Every collator counts what truncation cost in `truncation_stats` (`TruncationStats`: rows collated, rows truncated,
phrases cut, rows whose required span was cut) and warns once, with the counts, the first time it truncates.

Malformed rows (a missing column, a text that is not a string, a label that is not an int, a span outside its text,
`_phrase_boxes` not one per span, a NaN box, references given as one string) are refused with a `ValueError` naming the
batch row, the column, what was expected and what came (`check_row`). A gold box that overlaps no region of its image
gets no target (never region 0): its `phrase_labels` and `word_region_alignment` rows are zero (it stays in
`phrase_masks` and the probe targets, a miss for Recall@k), counted in `unmatched_phrases` and warned about once; a
referring expression whose box overlaps no region gets `labels` -100.
"""

from .base import PROBE_KEYS, RegionTextCollator, span_token_mask
from .captioning import CaptioningCollator
from .grounding import GroundedCaptionCollator, PhraseGroundingCollator
from .image_pair import ImagePairCollator
from .masking import mask_regions, mask_words, word_masker
from .pretraining import SingleStreamPretrainingCollator, TwoStreamPretrainingCollator, group_captions_by_image
from .question_answering import QuestionAnsweringCollator
from .referring import ReferringExpressionCollator
from .regions import pad_regions, store_image_id
from .truncation import TruncationStats, check_max_text_length, cut_word_pieces, drop_overlong_rows, span_is_cut
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
    "check_max_text_length",
    "cut_word_pieces",
    "drop_overlong_rows",
    "group_captions_by_image",
    "mask_regions",
    "mask_words",
    "pad_regions",
    "span_is_cut",
    "span_token_mask",
    "store_image_id",
    "word_masker",
]
