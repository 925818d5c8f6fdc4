"""VQA accuracy (the official vqaEval.py computation, answer normalisation included) as an evaluate module.

Loaded from this folder with no Hub access (`hf_vlalign.metrics.vqa.load_vqa_metric()`); the arithmetic is
`hf_vlalign.metrics.vqa.vqa_accuracy`.
"""

import datasets
import evaluate

from hf_vlalign.metrics.local_modules import local_metric_info
from hf_vlalign.metrics.vqa import vqa_accuracy

_CITATION = """\
@inproceedings{antol2015vqa, title={VQA: Visual Question Answering}, author={Antol, Stanislaw and Agrawal, Aishwarya
  and Lu, Jiasen and Mitchell, Margaret and Batra, Dhruv and Zitnick, C. Lawrence and Parikh, Devi}, booktitle={ICCV},
  year={2015}}
@inproceedings{goyal2017making, title={Making the V in VQA Matter: Elevating the Role of Image Understanding in Visual
  Question Answering}, author={Goyal, Yash and Khot, Tejas and Summers-Stay, Douglas and Batra, Dhruv and Parikh, Devi},
  booktitle={CVPR}, year={2017}}
"""

_DESCRIPTION = """\
VQA accuracy. A question with ten human answers (VQA v1 / v2) gets the official score: the mean over the ten
leave-one-out subsets of nine human answers of min(1, #humans in the subset who gave the predicted answer / 3), after
the official answer normalisation (punctuation, number words to digits, articles removed, contractions). A question
with n < 10 answers (a user's own rows) gets min(1, #matches / min(3, n)), both sides normalised, no leave-one-out: a
correct single answer scores 1. A fraction in [0, 1].
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted answers, one per question.
    references: list of lists of human answers (ten per question in VQA v1 / v2; at least one).
    answer_types: optional list of answer types ("yes/no", "number", "other"), one per question, for the
        per-answer-type split; passed to `compute` as a whole (not accumulated by `add_batch`).
    normalize_references: also apply the full normalisation to the ten human answers (default False, as vqaEval.py;
        fewer answers are always normalised).
Returns:
    dict with accuracy, num_questions (and per_answer_type when answer_types is given).
Examples:
    >>> metric = evaluate.load("hf_vlalign/metrics/modules/vqa_accuracy")  # doctest: +SKIP
    >>> metric.compute(predictions=["yes"], references=[["yes"] * 10])  # doctest: +SKIP
    {'accuracy': 1.0, 'num_questions': 1}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class VqaAccuracy(evaluate.Metric):
    def _info(self):
        features = {
            "predictions": datasets.Value("string"),
            "references": datasets.Sequence(datasets.Value("string")),
        }
        return local_metric_info(
            globals(),
            features,
            codebase_urls=["https://github.com/GT-Vision-Lab/VQA"],
            reference_urls=["https://visualqa.org/evaluation.html"],
        )

    def _compute(self, predictions, references, answer_types=None, normalize_references=False):
        return vqa_accuracy(
            list(predictions),
            [list(answers) for answers in references],
            answer_types=answer_types,
            normalize_references=normalize_references,
        )
