"""Referring expression comprehension accuracy (IoU >= 0.5 with the gold box) as an evaluate module.

Loaded from this folder with no Hub access (`hf_vlalign.metrics.referring.load_referring_metric()`); the arithmetic is
`hf_vlalign.metrics.referring.referring_expression_accuracy`.
"""

import datasets
import evaluate

from hf_vlalign.metrics.local_modules import local_metric_info
from hf_vlalign.metrics.referring import referring_expression_accuracy

_CITATION = """\
@inproceedings{yu2016modeling, title={Modeling Context in Referring Expressions}, author={Yu, Licheng and Poirson,
  Patrick and Yang, Shan and Berg, Alexander C. and Berg, Tamara L.}, booktitle={ECCV}, year={2016}}
@inproceedings{yu2018mattnet, title={MAttNet: Modular Attention Network for Referring Expression Comprehension},
  author={Yu, Licheng and Lin, Zhe and Shen, Xiaohui and Yang, Jimei and Lu, Xin and Bansal, Mohit and Berg, Tamara L.},
  booktitle={CVPR}, year={2018}}
"""

_DESCRIPTION = """\
Referring expression comprehension accuracy (RefCOCO, RefCOCO+, RefCOCOg): the share of expressions whose predicted
box has IoU >= 0.5 (iou_threshold) with the gold box. Boxes are x1, y1, x2, y2.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: one predicted box [x1, y1, x2, y2] per expression.
    references: the gold box [x1, y1, x2, y2] of each expression.
    iou_threshold: default 0.5; an IoU equal to the threshold counts as correct.
Returns:
    dict with accuracy, num_expressions.
Examples:
    >>> metric = evaluate.load("hf_vlalign/metrics/modules/referring_accuracy")  # doctest: +SKIP
    >>> metric.compute(predictions=[[0, 0, 2, 1]], references=[[0, 0, 1, 1]])  # doctest: +SKIP
    {'accuracy': 1.0, 'num_expressions': 1}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ReferringAccuracy(evaluate.Metric):
    def _info(self):
        features = {
            "predictions": datasets.Sequence(datasets.Value("float64")),
            "references": datasets.Sequence(datasets.Value("float64")),
        }
        return local_metric_info(
            globals(),
            features,
            codebase_urls=["https://github.com/lichengunc/MAttNet"],
            reference_urls=["https://github.com/lichengunc/refer"],
        )

    def _compute(self, predictions, references, iou_threshold=0.5):
        return referring_expression_accuracy(
            [list(box) for box in predictions], [list(box) for box in references], iou_threshold=iou_threshold
        )
