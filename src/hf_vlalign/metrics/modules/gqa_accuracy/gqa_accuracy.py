"""GQA metrics (accuracy, binary, open, consistency, validity, plausibility, distribution, accuracy per type) as the
official GQA evaluation script computes them, as an evaluate module.

Loaded from this folder with no Hub access (`hf_vlalign.metrics.gqa.load_gqa_metric()`); the arithmetic is
`hf_vlalign.metrics.gqa.gqa_scores`.
"""

from collections import Counter

import datasets
import evaluate

from hf_vlalign.metrics.gqa import gqa_scores
from hf_vlalign.metrics.local_modules import local_metric_info

_CITATION = """\
@inproceedings{hudson2019gqa, title={GQA: A New Dataset for Real-World Visual Reasoning and Compositional Question
  Answering}, author={Hudson, Drew A. and Manning, Christopher D.}, booktitle={CVPR}, year={2019}}
"""

_DESCRIPTION = """\
The GQA evaluation (eval.py of the GQA download): exact-match accuracy over the balanced questions, split into binary
(structural type other than "query") and open questions, consistency over the entailed questions of the correctly
answered ones, validity and plausibility from the choices file, the distribution score (chi-square between gold and
predicted answer counts per global question group, / 100, lower is better) and accuracy per structural / semantic type.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted answer strings.
    question_ids: list of the GQA question ids they answer (strings, as in the questions file).
    questions: the GQA questions file as published, a dict question id -> question record.
    choices: optional, the choices file, a dict question id -> {"valid": [...], "plausible": [...]}.
    consistency: None (automatic), True (required) or False (skipped); see `gqa_scores`.
Returns:
    `hf_vlalign.metrics.gqa.gqa_scores`'s dict: accuracy, binary, open, consistency, validity, plausibility,
    distribution, accuracy_per_structural_type, accuracy_per_semantic_type, questions_per_structural_type,
    questions_per_semantic_type, num_questions, computed.
Examples:
    >>> metric = evaluate.load("hf_vlalign/metrics/modules/gqa_accuracy")  # doctest: +SKIP
    >>> metric.compute(predictions=["yes"], question_ids=["1"], questions=questions)  # doctest: +SKIP
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class GqaAccuracy(evaluate.Metric):
    def _info(self):
        features = {
            "predictions": datasets.Value("string"),
            "question_ids": datasets.Value("string"),
        }
        return local_metric_info(
            globals(),
            features,
            codebase_urls=(),
            reference_urls=["https://cs.stanford.edu/people/dorarad/gqa/evaluate.html"],
        )

    def _compute(self, predictions, question_ids, questions=None, choices=None, consistency=None):
        if questions is None:
            raise ValueError("`questions` must be given: the GQA questions dict (question id -> question record).")
        duplicates = sorted(qid for qid, count in Counter(question_ids).items() if count > 1)
        if duplicates:
            raise ValueError(
                f"`question_ids` must be unique (one prediction per question), got duplicates: {duplicates[:5]}."
            )
        return gqa_scores(dict(zip(question_ids, predictions)), questions, choices, consistency=consistency)
