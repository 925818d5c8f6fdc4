"""NLVR2 accuracy and consistency (the official nlvr2/eval/metrics.py computation) as an evaluate module.

Loaded from this folder with no Hub access (`hf_vlalign.metrics.nlvr2.load_nlvr2_metric()`); the arithmetic is
`hf_vlalign.metrics.nlvr2.nlvr2_scores`.
"""

import datasets
import evaluate

from hf_vlalign.metrics.local_modules import local_metric_info
from hf_vlalign.metrics.nlvr2 import nlvr2_scores, to_truth_value

_CITATION = """\
@inproceedings{suhr2019corpus, title={A Corpus for Reasoning about Natural Language Grounded in Photographs},
  author={Suhr, Alane and Zhou, Stephanie and Zhang, Ally and Zhang, Iris and Bai, Huajun and Artzi, Yoav},
  booktitle={ACL}, year={2019}}
"""

_DESCRIPTION = """\
NLVR2 accuracy (share of examples whose truth value is predicted correctly) and consistency (share of unique
sentences, split-setId-sentenceId of the identifier, whose examples are all predicted correctly).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted truth values (True / False, 0 / 1 or "True" / "False"; stored as "True" / "False").
    references: gold labels, same forms (the "label" field of the NLVR2 json lines).
    identifiers: the "identifier" field of each example, "split-setId-pairId-sentenceId".
Returns:
    dict with accuracy, consistency, num_examples, num_sentences.
Examples:
    >>> metric = evaluate.load("hf_vlalign/metrics/modules/nlvr2_scores")  # doctest: +SKIP
    >>> metric.compute(predictions=["True"], references=["True"], identifiers=["dev-850-0-0"])  # doctest: +SKIP
    {'accuracy': 1.0, 'consistency': 1.0, 'num_examples': 1, 'num_sentences': 1}
"""


def _as_strings(name: str, values):
    """Truth values as the strings "True" / "False" (the stored feature), refusing anything else by name."""
    if values is None or isinstance(values, str) or not hasattr(values, "__len__"):
        return values  # left to nlvr2_scores' own checks
    return [str(to_truth_value(value, f"{name}[{i}]")) for i, value in enumerate(values)]


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Nlvr2Scores(evaluate.Metric):
    def _info(self):
        features = {
            "predictions": datasets.Value("string"),
            "references": datasets.Value("string"),
            "identifiers": datasets.Value("string"),
        }
        return local_metric_info(
            globals(),
            features,
            codebase_urls=["https://github.com/lil-lab/nlvr/tree/master/nlvr2"],
            reference_urls=["https://lil.nlp.cornell.edu/nlvr/"],
        )

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch of examples; booleans and 0 / 1 become "True" / "False" to fit the string features."""
        predictions, references = _as_strings("predictions", predictions), _as_strings("references", references)
        return super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one example; a boolean or 0 / 1 becomes "True" / "False" to fit the string features."""
        prediction = None if prediction is None else str(to_truth_value(prediction, "prediction"))
        reference = None if reference is None else str(to_truth_value(reference, "reference"))
        return super().add(prediction=prediction, reference=reference, **kwargs)

    def _compute(self, predictions, references, identifiers):
        return nlvr2_scores(list(predictions), list(references), list(identifiers))
