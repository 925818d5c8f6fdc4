"""VGP classification accuracy (Samaran et al. 2021, eq. 4): overall and per class (per semantic type)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def vgp_accuracy(
    predictions: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str],
    per_class_key: str = "vgp_type",
    ignore_index: int = -100,
) -> dict[str, float | int]:
    """Accuracy of the VGP phrase-pair classifier over the labelled pairs, overall and per gold class.

    Args:
        predictions: (N,) predicted classes, or (N, C) logits (their argmax is taken).
        labels: (N,) gold classes in [0, C), or `ignore_index` for a pair without a label (with the type task: a pair
            that is not a VGP has no type); those pairs are left out and counted.
        class_names: the C class names, in label order (`SingleStreamConfig.vgp_class_names()`).
        per_class_key: the prefix of the per-class keys: "vgp_type" for the semantic types, "vgp_class" for the binary
            task's classes.

    Returns:
        `vgp_accuracy`, `vgp_labelled_pairs`, `vgp_unlabelled_pairs`, and per class `<per_class_key>_count/<name>` and,
        for the classes with gold pairs, `<per_class_key>_accuracy/<name>` (the class's recall).
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim == 2:
        predictions = predictions.argmax(-1)
    labelled = labels != ignore_index
    invalid = labelled & ((labels < 0) | (labels >= len(class_names)))
    if invalid.any():
        raise ValueError(
            f"`labels` must be in [0, {len(class_names) - 1}] or {ignore_index} (no label), got {labels[invalid][:5]}."
        )
    if not labelled.any():
        raise ValueError(f"`labels` hold no labelled pair (all {ignore_index}): the VGP accuracy is undefined.")
    correct = predictions == labels
    results: dict[str, float | int] = {
        "vgp_accuracy": float(correct[labelled].mean()),
        "vgp_labelled_pairs": int(labelled.sum()),
        "vgp_unlabelled_pairs": int((~labelled).sum()),
    }
    for label, name in enumerate(class_names):
        gold = labels == label
        results[f"{per_class_key}_count/{name}"] = int(gold.sum())
        if gold.any():
            results[f"{per_class_key}_accuracy/{name}"] = float(correct[gold].mean())
    return results


__all__ = ["vgp_accuracy"]
