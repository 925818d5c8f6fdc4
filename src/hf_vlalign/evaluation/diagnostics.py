"""Mechanism diagnostics: does the mechanism a study tests act in a run? The `diagnostics` entry of a run's
`eval_results.json`, from what the run already measured:

- supervision: the attention-supervision loss at the start and at the end of training (the first and the last value
  the trainer logged under the loss's name, e.g. `loss_attention_supervision`), `attention_loss_start` /
  `attention_loss_end`;
- each task's `image_score` (its metric with each example's own image) and `text_only_score` (with another image's
  regions: the shuffled-images pass of [`image_use_gap`], a model reading the text alone scores the same); for a task
  scored by its loss, minus the loss, so that higher is better in both;
- geometry: the loss with boxes shuffled among each image's regions, and with the geometry zeroed (every box the
  whole image, so that no box says anything), the features kept, minus the loss with the true boxes
  (`geometry.loss_change_boxes_shuffled` / `geometry.loss_change_boxes_zeroed`, from [`image_use_gap`] with
  `perturb_boxes`): about 0 when the model gets nothing from the boxes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# a task scored by its (teacher-forced) loss rather than a metric in [0, 1]: its scores are minus the loss
LOSS_METRIC = "loss"


def attention_loss_trajectory(log_history: Iterable[Mapping[str, Any]], loss_key: str) -> dict[str, float]:
    """`attention_loss_start` / `attention_loss_end`: the first and the last training log of `loss_key` in a Trainer's
    `state.log_history` (evaluation logs name theirs `eval_<loss_key>` and are left out). Empty when the run logged
    none (no supervision)."""
    if not isinstance(loss_key, str) or not loss_key:
        raise ValueError(f"`loss_key` must be the logged name of a loss (e.g. 'loss_attention'), got {loss_key!r}.")
    values = [float(log[loss_key]) for log in log_history if loss_key in log]
    if not values:
        return {}
    return {"attention_loss_start": values[0], "attention_loss_end": values[-1]}


def task_image_scores(image_use: Mapping[str, Any], metric: str) -> dict[str, float]:
    """`image_score` / `text_only_score` of one task from an [`image_use_gap`] result: its `metric` (e.g.
    "accuracy", VGP's "id_accuracy") with the own images and with shuffled images; for `metric` "loss", minus the task
    loss of each pass (higher = better, as for a metric)."""
    if metric == LOSS_METRIC:
        own, other = "own_image_loss", "shuffled_image_loss"
        sign = -1.0
    else:
        own, other = f"own_image_{metric}", f"shuffled_image_{metric}"
        sign = 1.0
    if own not in image_use or other not in image_use:
        scored = sorted(key.removeprefix("own_image_") for key in image_use if key.startswith("own_image_"))
        raise ValueError(f"`metric` {metric!r} is not scored in `image_use` (it scores {scored}).")
    return {"image_score": sign * image_use[own], "text_only_score": sign * image_use[other]}


def geometry_loss_changes(image_use: Mapping[str, Any]) -> dict[str, float]:
    """`loss_change_boxes_shuffled` / `loss_change_boxes_zeroed` from an [`image_use_gap`] result with
    `perturb_boxes` (the loss with perturbed boxes minus the loss with the true ones)."""
    if "box_shuffle_loss_gap" not in image_use or "box_zero_loss_gap" not in image_use:
        raise ValueError("`image_use` has no geometry check: compute it with `image_use_gap(..., perturb_boxes=True)`.")
    return {
        "loss_change_boxes_shuffled": image_use["box_shuffle_loss_gap"],
        "loss_change_boxes_zeroed": image_use["box_zero_loss_gap"],
    }


def mechanism_diagnostics(
    image_use: Mapping[str, Any],
    tasks: Mapping[str, str],
    log_history: Iterable[Mapping[str, Any]] = (),
    attention_loss_key: str | None = None,
) -> dict[str, Any]:
    """The `diagnostics` entry of a run's results: `{task: task_image_scores(image_use, metric)}` for each
    `tasks` entry (task name -> the image-use metric that scores it, "loss" for minus the loss), the attention loss's
    start and end with `attention_loss_key` (the trainer's log key of the supervision loss; nothing when the run
    logged none), and `geometry` when `image_use` holds the geometry check."""
    for name, value in (("image_use", image_use), ("tasks", tasks)):
        if not isinstance(value, Mapping):
            raise ValueError(
                f"`{name}` must be a mapping (image_use: an image_use_gap result; tasks: task -> metric), got "
                f"{type(value).__name__}."
            )
    diagnostics: dict[str, Any] = {task: task_image_scores(image_use, metric) for task, metric in tasks.items()}
    if attention_loss_key is not None:
        diagnostics |= attention_loss_trajectory(log_history, attention_loss_key)
    if "box_shuffle_loss_gap" in image_use:
        diagnostics["geometry"] = geometry_loss_changes(image_use)
    return diagnostics


__all__ = ["attention_loss_trajectory", "geometry_loss_changes", "mechanism_diagnostics", "task_image_scores"]
