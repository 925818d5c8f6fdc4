"""NLVR2 accuracy and consistency (Suhr et al. 2019) as the official script computes them (`nlvr2/eval/metrics.py` of
lil-lab/nlvr): accuracy over the examples, and consistency, the share of unique sentences (the identifier
"split-setId-pairId-sentenceId" with the image-pair id blanked) whose examples are all predicted correctly.

    >>> nlvr2_scores([True, False], ["True", "True"], ["dev-850-0-0", "dev-850-1-0"])
    {'accuracy': 0.5, 'consistency': 0.0, 'num_examples': 2, 'num_sentences': 1}

Rows of one's own (no published identifiers) give their `sentences` instead: the examples of one sentence text (one
statement judged against several image pairs) make one sentence, as the published identifiers group them:

    >>> nlvr2_scores([True, True], [True, False], sentences=["one image shows a cat .", "one image shows a cat ."])
    {'accuracy': 0.5, 'consistency': 0.0, 'num_examples': 2, 'num_sentences': 1}
"""

from __future__ import annotations

from collections import Counter


from .local_modules import MODULES_DIR, load_local_metric

NLVR2_METRIC_PATH = MODULES_DIR / "nlvr2_scores"

_TRUE_STRINGS = ("true", "1")
_FALSE_STRINGS = ("false", "0")
_NUM_IDENTIFIER_FIELDS = 4  # split-setId-pairId-sentenceId
_PAIR_FIELD = 2  # metrics.py: anon_label[2] = ''


def to_truth_value(value, name: str = "label") -> bool:
    """True / False, 1 / 0 (also numpy / torch scalars) or "True" / "False" / "1" / "0" (any case) -> bool."""
    if not isinstance(value, (str, bool, int)) and hasattr(value, "item"):
        try:
            value = value.item()  # numpy / torch scalars
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS + _FALSE_STRINGS:
        return value.strip().lower() in _TRUE_STRINGS
    raise ValueError(
        f"`{name}` must be a truth value (True / False, 0 / 1 or the strings 'True' / 'False'), "
        f"got {type(value).__name__}: {value!r}."
    )


def sentence_key(identifier: str, name: str = "identifier") -> str:
    """The sentence an example belongs to: "dev-850-1-0" -> "dev-850--0" (the image-pair id blanked, as metrics.py)."""
    fields = identifier.split("-") if isinstance(identifier, str) else []
    if len(fields) != _NUM_IDENTIFIER_FIELDS or not all(fields):
        raise ValueError(
            f"`{name}` must be an NLVR2 identifier 'split-setId-pairId-sentenceId' such as 'dev-850-1-0', "
            f"got {identifier!r}."
        )
    fields[_PAIR_FIELD] = ""
    return "-".join(fields)


def _sentence_keys(identifiers, sentences) -> tuple[str, list[str]]:
    """The name of the grouping given (`identifiers` or `sentences`, exactly one) and each example's sentence key."""
    if (identifiers is None) == (sentences is None):
        given = "both" if sentences is not None else "neither"
        raise ValueError(
            "give exactly one of `identifiers` (NLVR2's 'split-setId-pairId-sentenceId') and `sentences` (each "
            f"example's sentence text, for rows without such identifiers), got {given}."
        )
    if sentences is None:
        repeated = [identifier for identifier, count in Counter(identifiers).items() if count > 1]
        if repeated:
            raise ValueError(
                f"`identifiers` must be unique (one prediction per example), got {repeated[0]!r} more than once."
            )
        keys = [sentence_key(identifier, f"identifiers[{i}]") for i, identifier in enumerate(identifiers)]
        return "identifiers", keys
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str) or not sentence.strip():
            raise ValueError(f"`sentences[{i}]` must be the example's sentence text, got {sentence!r}.")
    return "sentences", list(sentences)


def _check_inputs(predictions, labels, identifiers, sentences) -> tuple[list[bool], list[bool], list[str]]:
    """Checked truth values and the sentence key of every example."""
    name, keys = _sentence_keys(identifiers, sentences)
    if len(predictions) == 0 or len(labels) != len(predictions) or len(keys) != len(predictions):
        raise ValueError(
            f"`predictions`, `labels` and `{name}` must have the same length (at least one example), got "
            f"{len(predictions)}, {len(labels)} and {len(keys)}."
        )
    predicted = [to_truth_value(value, f"predictions[{i}]") for i, value in enumerate(predictions)]
    gold = [to_truth_value(value, f"labels[{i}]") for i, value in enumerate(labels)]
    return predicted, gold, keys


def nlvr2_scores(predictions, labels, identifiers=None, *, sentences=None) -> dict:
    """Accuracy and consistency of NLVR2 truth-value predictions, in [0, 1].

    Args:
        predictions: predicted truth value per example.
        labels: gold truth value per example (the "label" field of the NLVR2 json lines).
        identifiers: "split-setId-pairId-sentenceId" per example (the "identifier" field); all examples of a sentence
            share split, setId and sentenceId.
        sentences: instead of `identifiers` (rows without them): the sentence text of each example; the examples of
            one text make one sentence.

    Returns {"accuracy", "consistency", "num_examples", "num_sentences"}.
    """
    predicted, gold, keys = _check_inputs(predictions, labels, identifiers, sentences)
    consistent: dict[str, bool] = {}
    num_correct = 0
    for prediction, label, key in zip(predicted, gold, keys):
        correct = prediction == label
        num_correct += correct
        # metrics.py: consistency_dict[anon_label] = False as soon as one example of the sentence is wrong
        consistent[key] = consistent.get(key, True) and correct
    return {
        # metrics.py: precision = num_correct / total_num
        "accuracy": num_correct / len(gold),
        # metrics.py: consistency = num_consistent / unique_sentence
        "consistency": sum(consistent.values()) / len(consistent),
        "num_examples": len(gold),
        "num_sentences": len(consistent),
    }


def load_nlvr2_metric(**kwargs):
    """`evaluate.load` of this package's NLVR2 module from its local folder (no Hub access):
    `load_nlvr2_metric().compute(predictions=[...], references=[...], identifiers=[...])` returns `nlvr2_scores`'s
    dict (references are the labels)."""
    return load_local_metric("nlvr2_scores", **kwargs)


__all__ = ["NLVR2_METRIC_PATH", "load_nlvr2_metric", "nlvr2_scores", "sentence_key", "to_truth_value"]
