"""What every example must write under `image_use` in eval_results.json (issue 18.7): the own-image vs shuffled-image
check of `hf_vlalign.evaluation.image_use_gap`, and its shuffled-regions control, consistent with themselves."""

from __future__ import annotations

import math


def assert_image_use_reported(results: dict, metric: str | None) -> dict:
    """`results["image_use"]` holds the loss gap and, for a task with `metric` (e.g. "accuracy"), the own and shuffled
    scores and their gap over the same items in every pass, `image_use_gap` naming which one is headline; the same for
    the shuffled-regions control (`region_shuffle_*`). Returns the entry."""
    image_use = results["image_use"]
    assert image_use["image_use_examples"] >= 2 and image_use["image_use_images"] >= 2, image_use
    for key in ("own_image_loss", "shuffled_image_loss", "image_use_loss_gap"):
        assert math.isfinite(image_use[key]), (key, image_use)
    assert math.isclose(
        image_use["image_use_loss_gap"], image_use["shuffled_image_loss"] - image_use["own_image_loss"], abs_tol=1e-9
    )
    assert math.isclose(
        image_use["region_shuffle_loss_gap"], image_use["shuffled_regions_loss"] - image_use["own_image_loss"],
        abs_tol=1e-9,
    )  # fmt: skip
    assert 0 <= image_use["region_shuffle_rows_unshuffled"] <= image_use["image_use_examples"], image_use
    if metric is None:
        assert image_use["image_use_gap_metric"] == "loss"
        assert image_use["image_use_gap"] == image_use["image_use_loss_gap"]
        assert image_use["region_shuffle_gap"] == image_use["region_shuffle_loss_gap"]
        return image_use
    own, shuffled = image_use[f"own_image_{metric}"], image_use[f"shuffled_image_{metric}"]
    regions = image_use[f"shuffled_regions_{metric}"]
    assert 0.0 <= own <= 1.0 and 0.0 <= shuffled <= 1.0 and 0.0 <= regions <= 1.0, image_use
    assert math.isclose(image_use[f"image_use_{metric}_gap"], own - shuffled, abs_tol=1e-9)
    assert math.isclose(image_use[f"region_shuffle_{metric}_gap"], own - regions, abs_tol=1e-9)
    assert image_use["image_use_gap_metric"] == metric
    # every pass scores the same items (e.g. phrases whose gold box overlaps no region of another image: misses)
    items = image_use[f"own_image_{metric}_items"]
    assert items == image_use[f"shuffled_image_{metric}_items"] == image_use[f"shuffled_regions_{metric}_items"] > 0
    assert image_use["image_use_gap"] == image_use[f"image_use_{metric}_gap"]
    assert image_use["region_shuffle_gap"] == image_use[f"region_shuffle_{metric}_gap"]
    return image_use


def assert_diagnostics_reported(results: dict, tasks: dict[str, str], supervised: bool) -> dict:
    """`results["diagnostics"]` (hf_vlalign.evaluation.diagnostics): each of `tasks` (task -> its image-use metric,
    "loss" for minus the loss) with its own-image and shuffled-image scores as `image_use` has them, and the
    attention loss's first and last training logs exactly when the run was `supervised`. Returns the entry."""
    diagnostics, image_use = results["diagnostics"], results["image_use"]
    for task, metric in tasks.items():
        sign, own, other = (-1, "own_image_loss", "shuffled_image_loss") if metric == "loss" else (
            1, f"own_image_{metric}", f"shuffled_image_{metric}"
        )
        assert diagnostics[task] == {"image_score": sign * image_use[own], "text_only_score": sign * image_use[other]}
    trajectory = {"attention_loss_start", "attention_loss_end"} & set(diagnostics)
    assert bool(trajectory) == supervised, diagnostics
    if supervised:
        assert len(trajectory) == 2 and all(math.isfinite(diagnostics[key]) for key in trajectory), diagnostics
    return diagnostics
