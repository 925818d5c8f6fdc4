"""Numbers derived from a run's mechanism diagnostics, for the v2 studies' `Diagnostic` thresholds (one key each):

- `diagnostics.<task>.image_gap`: image_score - text_only_score (the task's metric with each example's own image
  minus with another image's regions; for a task scored by its loss, minus the loss on both sides);
- `diagnostics.attention_loss_relative_drop`: (start - end) / start of the supervision loss of training;
- `<prefix>.best_head_upper_layers` / `.best_head_lower_layers` of a per-(layer, head) accuracy table flattened as
  `<prefix>.<layer>.<head>`: the best head of the upper and of the lower half of the layers (an odd middle layer
  counts as upper).
"""

from __future__ import annotations

from collections.abc import Callable

DIAGNOSTICS = "diagnostics."


def image_gaps(metrics: dict[str, float]) -> dict[str, float]:
    gaps = {}
    for key, image_score in metrics.items():
        if key.startswith(DIAGNOSTICS) and key.endswith(".image_score"):
            task = key.removesuffix(".image_score")
            if f"{task}.text_only_score" in metrics:
                gaps[f"{task}.image_gap"] = image_score - metrics[f"{task}.text_only_score"]
    return gaps


def supervision_drop(metrics: dict[str, float]) -> dict[str, float]:
    start, end = metrics.get("diagnostics.attention_loss_start"), metrics.get("diagnostics.attention_loss_end")
    if start is None or end is None or start <= 0:
        return {}
    return {"diagnostics.attention_loss_relative_drop": (start - end) / start}


def layer_halves(prefix: str) -> Callable[[dict[str, float]], dict[str, float]]:
    """The best head of the upper and of the lower layers of the table `<prefix>.<layer>.<head>`."""

    def halves(metrics: dict[str, float]) -> dict[str, float]:
        best_of_layer: dict[int, float] = {}
        for key, value in metrics.items():
            layer_head = key.removeprefix(f"{prefix}.").split(".")
            if key.startswith(f"{prefix}.") and len(layer_head) == 2 and all(part.isdigit() for part in layer_head):
                layer = int(layer_head[0])
                best_of_layer[layer] = max(best_of_layer.get(layer, value), value)
        if len(best_of_layer) < 2:
            return {}
        middle = len(best_of_layer) // 2
        return {
            f"{prefix}.best_head_lower_layers": max(v for layer, v in best_of_layer.items() if layer < middle),
            f"{prefix}.best_head_upper_layers": max(v for layer, v in best_of_layer.items() if layer >= middle),
        }

    return halves


def mechanism_checks(metrics: dict[str, float]) -> dict[str, float]:
    """`image_gaps` and `supervision_drop` of one run (a `Setting.derive`)."""
    return image_gaps(metrics) | supervision_drop(metrics)
