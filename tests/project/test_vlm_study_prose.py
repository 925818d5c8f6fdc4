"""What docs/vlms.md says of the patch-model mechanism check holds in the study's committed aggregate
(results/vlm_patch_supervision/aggregate.json; the table itself is checked by tests/project/test_study_results.py)."""

from __future__ import annotations

import json

from script_modules import ROOT

AGGREGATE = ROOT / "results" / "vlm_patch_supervision" / "aggregate.json"
PAGE = (ROOT / "docs" / "vlms.md").read_text()


def _mean(settings: dict, setting: str, key: str) -> float:
    return settings[setting]["metrics"][key]["mean"]


def test_the_stated_numbers_are_the_aggregates():
    study = json.loads(AGGREGATE.read_text())["experiments"]["vlm_patch_supervision"]
    settings, best = study["settings"], "grounding_probe.best_head_accuracy"
    stated = {
        "grounds 0.18 of the phrases": _mean(settings, "direct", best),
        "0.05 for\nthe unsupervised model's best head": _mean(settings, "none", best),
        "0.04 for the centre baseline": _mean(settings, "direct", "grounding_probe.baseline_accuracy"),
        "grounds 0.21": _mean(settings, "semi_direct", best),
        "1.36 with direct supervision": _mean(settings, "direct", "eval_loss_task"),
        "1.33 without": _mean(settings, "none", "eval_loss_task"),
    }
    for text, value in stated.items():
        assert text in PAGE, text
        number = next(word for word in text.split() if word[0].isdigit())
        assert f"{value:.2f}" == number, (text, value)
    assert all(claim["verdict"] == "holds" for claim in study["claims"]) and "Both claims hold" in PAGE
    # "in every seed": direct beats none and the baseline for each seed
    by_seed = {setting: settings[setting]["metrics"][best]["by_seed"] for setting in ("none", "direct")}
    baseline = settings["direct"]["metrics"]["grounding_probe.baseline_accuracy"]["by_seed"]
    assert all(by_seed["direct"][seed] > max(by_seed["none"][seed], baseline[seed]) for seed in by_seed["direct"])
    # "at the level of the centre baseline": the unsupervised best head within 0.02 of it
    assert abs(_mean(settings, "none", best) - _mean(settings, "none", "grounding_probe.baseline_accuracy")) < 0.02
