"""Caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, optional SPICE) through pycocoevalcap, as an evaluate module.

Loaded from this folder with no Hub access (`hf_vlalign.metrics.captioning.load_caption_metric()`); the arithmetic is
`hf_vlalign.metrics.captioning.caption_scores`.
"""

import datasets
import evaluate

from hf_vlalign.metrics.captioning import DEFAULT_METRICS, caption_scores
from hf_vlalign.metrics.local_modules import local_metric_info

_CITATION = """\
@inproceedings{papineni2002bleu, title={BLEU: a Method for Automatic Evaluation of Machine Translation},
  author={Papineni, Kishore and Roukos, Salim and Ward, Todd and Zhu, Wei-Jing}, booktitle={ACL}, year={2002}}
@inproceedings{denkowski2014meteor, title={Meteor Universal: Language Specific Translation Evaluation for Any Target
  Language}, author={Denkowski, Michael and Lavie, Alon}, booktitle={WMT}, year={2014}}
@inproceedings{lin2004rouge, title={ROUGE: A Package for Automatic Evaluation of Summaries}, author={Lin, Chin-Yew},
  booktitle={Text Summarization Branches Out}, year={2004}}
@inproceedings{vedantam2015cider, title={CIDEr: Consensus-based Image Description Evaluation},
  author={Vedantam, Ramakrishna and Zitnick, C. Lawrence and Parikh, Devi}, booktitle={CVPR}, year={2015}}
@article{chen2015microsoft, title={Microsoft COCO Captions: Data Collection and Evaluation Server},
  author={Chen, Xinlei and Fang, Hao and Lin, Tsung-Yi and Vedantam, Ramakrishna and Gupta, Saurabh and
  Doll{\'a}r, Piotr and Zitnick, C. Lawrence}, journal={arXiv:1504.00325}, year={2015}}
"""

_DESCRIPTION = """\
The COCO caption evaluation (pycocoevalcap): corpus BLEU-1..4, METEOR 1.5, ROUGE-L and CIDEr-D (sigma 6, clipped),
after the PTB tokenisation with punctuation removed. METEOR and the PTB tokenizer run Java (`java` on PATH); SPICE is
computed only when asked for and only where Stanford CoreNLP 3.6.0's jars are in pycocoevalcap's spice/lib.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of generated captions, one per image.
    references: list of lists of reference captions (at least one per image).
    metrics: names from ("bleu", "meteor", "rouge_l", "cider", "spice"); default all but "spice".
    tokenizer: "ptb" (default, the COCO evaluation's Java PTB tokenizer), "simple" (pure Python) or "none".
Returns:
    dict with bleu_1, bleu_2, bleu_3, bleu_4, meteor, rouge_l, cider (and spice) for the metrics asked for.
Examples:
    >>> metric = evaluate.load("hf_vlalign/metrics/modules/caption_scores")  # doctest: +SKIP
    >>> metric.compute(predictions=["a cat"], references=[["a cat", "the cat"]], metrics=["bleu"])  # doctest: +SKIP
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CaptionScores(evaluate.Metric):
    def _info(self):
        features = {
            "predictions": datasets.Value("string"),
            "references": datasets.Sequence(datasets.Value("string")),
        }
        return local_metric_info(
            globals(),
            features,
            codebase_urls=["https://github.com/salaniz/pycocoevalcap"],
            reference_urls=["https://github.com/tylin/coco-caption"],
        )

    def _compute(self, predictions, references, metrics=DEFAULT_METRICS, tokenizer="ptb"):
        return caption_scores(predictions, references, metrics=metrics, tokenizer=tokenizer)
