"""Phrase grounding Recall@k (Flickr30k Entities) as an evaluate module.

Loaded from this folder with no Hub access (`hf_vlalign.metrics.phrase_grounding.load_phrase_grounding_metric()`);
the arithmetic is `hf_vlalign.metrics.phrase_grounding.phrase_grounding_recall`.
"""

import datasets
import evaluate

from hf_vlalign.metrics.local_modules import local_metric_info
from hf_vlalign.metrics.phrase_grounding import DEFAULT_KS, phrase_grounding_recall

_CITATION = """\
@inproceedings{plummer2015flickr30k, title={Flickr30k Entities: Collecting Region-to-Phrase Correspondences for Richer
  Image-to-Sentence Models}, author={Plummer, Bryan A. and Wang, Liwei and Cervantes, Chris M. and Caicedo, Juan C. and
  Hockenmaier, Julia and Lazebnik, Svetlana}, booktitle={ICCV}, year={2015}}
@inproceedings{kamath2021mdetr, title={MDETR - Modulated Detection for End-to-End Multi-Modal Understanding},
  author={Kamath, Aishwarya and Singh, Mannat and LeCun, Yann and Synnaeve, Gabriel and Misra, Ishan and Carion,
  Nicolas}, booktitle={ICCV}, year={2021}}
"""

_DESCRIPTION = """\
Phrase grounding Recall@k: the share of phrases for which one of the k highest-ranked predicted boxes has IoU >= 0.5
with the ground truth, by default the union box of the phrase's gold boxes (Plummer et al.; MDETR's MERGED-BOXES),
or any one gold box with merge_gold_boxes=False (MDETR's ANY-BOX).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: per phrase, the ranked predicted boxes [[x1, y1, x2, y2], ...], best first.
    references: per phrase, its gold boxes [[x1, y1, x2, y2], ...].
    ks: the k of each Recall@k, default (1, 5, 10).
    iou_threshold: default 0.5.
    merge_gold_boxes: default True (union box); False: any gold box.
Returns:
    dict with recall@k for each k and num_phrases.
Examples:
    >>> metric = evaluate.load("hf_vlalign/metrics/modules/phrase_grounding_recall")  # doctest: +SKIP
    >>> metric.compute(predictions=[[[0, 0, 4, 4]]], references=[[[0, 0, 4, 4]]], ks=[1])  # doctest: +SKIP
    {'recall@1': 1.0, 'num_phrases': 1}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PhraseGroundingRecall(evaluate.Metric):
    def _info(self):
        features = {
            "predictions": datasets.Sequence(datasets.Sequence(datasets.Value("float64"))),
            "references": datasets.Sequence(datasets.Sequence(datasets.Value("float64"))),
        }
        return local_metric_info(
            globals(),
            features,
            codebase_urls=["https://github.com/BryanPlummer/flickr30k_entities", "https://github.com/ashkamath/mdetr"],
            reference_urls=["https://bryanplummer.com/Flickr30kEntities/"],
        )

    def _compute(self, predictions, references, ks=DEFAULT_KS, iou_threshold=0.5, merge_gold_boxes=True):
        return phrase_grounding_recall(
            [[list(box) for box in boxes] for boxes in predictions],
            [[list(box) for box in boxes] for boxes in references],
            ks=tuple(ks),
            iou_threshold=iou_threshold,
            merge_gold_boxes=merge_gold_boxes,
        )
