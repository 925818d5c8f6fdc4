"""The result tables of the docs (docs/results.md, docs/training.md) are what `benchmarks/reproduce.py` renders from
the committed run files under `results/` (never typed by hand), the committed aggregate is what those run files give,
and each claim the docs' prose makes of a table holds in the committed results. After new runs:
`python benchmarks/reproduce.py --aggregate_only --docs`."""

from __future__ import annotations

import json
import math

import pytest
from script_modules import ROOT, load_script

BUDGET = "reduced"



reproduce = load_script("reproduce_benchmark", ROOT / "benchmarks" / "reproduce.py")
REPORT = json.loads((ROOT / "results" / BUDGET / "aggregate.json").read_text())
docs_blocks = load_script("docs_blocks", ROOT / "benchmarks" / "docs_blocks.py")
DOCS = "\n".join(page.read_text() for page in docs_blocks.docs_pages(ROOT))  # README.md and docs/*.md


def _comparison(experiment: str, name: str) -> dict:
    return next(c for c in REPORT["experiments"][experiment]["comparisons"] if c["name"] == name)


def _mean(experiment: str, setting: str, key: str) -> float:
    return REPORT["experiments"][experiment]["settings"][setting]["metrics"][key]["mean"]


def test_the_committed_aggregate_is_what_the_run_files_give():
    assert json.loads(json.dumps(reproduce.aggregate(ROOT / "results", BUDGET))) == REPORT


def test_every_experiment_in_the_docs_has_every_setting_at_three_seeds_or_more():
    in_docs = [
        name
        for name, experiment in reproduce.EXPERIMENTS.items()
        if reproduce.supports(experiment, BUDGET) and reproduce.docs_markers(name)[0] in DOCS
    ]  # the studies' blocks: tests/project/test_study_results.py
    assert set(in_docs) == set(REPORT["experiments"])
    for name, summary in REPORT["experiments"].items():
        assert set(summary["settings"]) == set(reproduce.EXPERIMENTS[name].settings), name
        for setting, row in summary["settings"].items():
            assert len(row["seeds"]) >= 3, (name, setting)


@pytest.mark.parametrize("name", ["summary", *REPORT["experiments"]])
def test_the_docs_block_is_generated_from_the_committed_results(name):
    block = reproduce.summary_block(REPORT) if name == "summary" else reproduce.docs_block(name, REPORT)
    assert block in DOCS, f"run `python benchmarks/reproduce.py --aggregate_only --docs` ({name})"


def test_the_determinism_the_docs_state():
    (check,) = [c for c in REPORT["determinism"] if c["experiment"] == "two_stream_alignment"]
    assert check["differing_metrics"] == [] and check["same_weights"] is True and check["same_machine"]


def _holds_in_every_seed(result: dict, sign: int) -> bool:
    return result["n"] >= 3 and result["seeds_with_sign_of_mean"] == result["n"] and result["mean"] * sign > 0


def _within_seed_spread(result: dict) -> bool:
    spread = result["paired_t"] is not None and abs(result["paired_t"]) < 2.0
    return result["seeds_with_sign_of_mean"] < result["n"] or spread


def test_the_two_stream_claims():
    """docs: the decoder learns the alignment in every seed; the summed cross-attention grounds fewer phrases with the
    loss in every seed; the best head and the answer accuracy do not differ beyond the seed-to-seed spread."""
    name = "two_stream_alignment"
    decoder = _comparison(name, "with: alignment_decoder_grounding_accuracy - grounding_baseline_accuracy")
    assert _holds_in_every_seed(decoder, +1)
    assert _holds_in_every_seed(_comparison(name, "with - without: cross_attention_grounding_accuracy"), -1)
    assert _within_seed_spread(_comparison(name, "with - without: best_head_grounding_accuracy"))
    assert _within_seed_spread(_comparison(name, "with - without: vqa_accuracy"))


def test_the_vgp_supervision_claims():
    """docs: direct and semi-direct supervision ground phrases in every seed, direct more sharply; indirect leaves the
    attention close to the baseline; direct / semi-direct lower the VGP accuracy, indirect raises it in every seed;
    identification is the same in every run."""
    name = "vgp_supervision"
    for setting in ("direct", "semi_direct"):
        for key in ("grounding_accuracy_best_head", "grounding_accuracy_mean_head"):
            assert _holds_in_every_seed(_comparison(name, f"{setting} - none: {key}"), +1)
        assert _holds_in_every_seed(_comparison(name, f"{setting} - none: vgp_accuracy"), -1)
    assert _holds_in_every_seed(_comparison(name, "direct - semi_direct: grounding_accuracy_best_head"), +1)
    baseline = _mean(name, "indirect", "grounding_baseline_accuracy")
    assert abs(_mean(name, "indirect", "grounding_accuracy_best_head") - baseline) < 0.1
    assert _mean(name, "direct", "grounding_accuracy_best_head") > baseline + 0.3
    indirect = _comparison(name, "indirect - none: vgp_accuracy")
    assert _holds_in_every_seed(indirect, +1)
    assert indirect["paired_t"] < 2.0
    assert max(_mean(name, s, "vgp_accuracy") for s in ("none", "direct", "semi_direct")) < _mean(
        name, "indirect", "vgp_accuracy"
    )
    identification = [
        value
        for row in REPORT["experiments"][name]["settings"].values()
        for value in row["metrics"]["image_description_accuracy"]["by_seed"].values()
    ]
    assert len(set(identification)) == 1 and len(identification) >= 12
    assert all(
        abs(row["metrics"]["image_use.image_use_loss_gap"]["mean"]) < 0.05
        for row in REPORT["experiments"][name]["settings"].values()
    )


def test_the_downstream_claims():
    """docs: every task above its baseline in every seed; VQA, RefCOCO+ and Flickr30k far above; RefCOCO+ varies by a
    factor of two over seeds; NLVR2 above the majority baseline by less than one standard error at chance on average
    and less than two in every seed."""
    name = "downstream"
    comparisons = {c["name"].split(":")[0]: c for c in REPORT["experiments"][name]["comparisons"]}
    assert set(comparisons) == {"vqa", "nlvr2", "refcoco", "flickr_grounding"}
    for task, result in comparisons.items():
        assert _holds_in_every_seed(result, +1), task
    for task in ("vqa", "refcoco", "flickr_grounding"):
        assert comparisons[task]["mean"] > 0.15, task
    refcoco = REPORT["experiments"][name]["settings"]["refcoco"]["metrics"]["accuracy"]["by_seed"].values()
    assert max(refcoco) > 2 * min(refcoco)
    runs = reproduce.load_runs(ROOT / "results", BUDGET, reproduce.EXPERIMENTS[name])["nlvr2"]
    differences = [run["metrics"]["accuracy"] - run["metrics"]["majority_baseline_accuracy"] for run in runs.values()]
    standard_error = math.sqrt(0.25 / next(iter(runs.values()))["metrics"]["eval_examples"])
    assert 0 < sum(differences) / len(differences) < standard_error and max(differences) < 2 * standard_error
    vqa = reproduce.load_runs(ROOT / "results", BUDGET, reproduce.EXPERIMENTS[name])["vqa"]
    assert all(abs(run["metrics"]["gqa_binary"] - 0.5) < 0.06 for run in vqa.values())  # yes/no near chance


def test_the_captioning_claims():
    """docs: no fusion and not the geometry ablation differs from its reference beyond the seed-to-seed spread; every
    run reads the image and grounds words above the confidence baseline."""
    name = "captioning_alignment"
    comparisons = REPORT["experiments"][name]["comparisons"]
    assert len(comparisons) == 10
    for result in comparisons:
        assert _within_seed_spread(result), result["name"]
    runs = reproduce.load_runs(ROOT / "results", BUDGET, reproduce.EXPERIMENTS[name])
    for by_seed in runs.values():
        for run in by_seed.values():
            assert run["metrics"]["image_use.image_use_loss_gap"] > 0
            assert run["metrics"]["alignment"] > run["metrics"]["grounding_baseline_accuracy"]
    cider = [row["metrics"]["cider"] for row in REPORT["experiments"][name]["settings"].values()]
    spread = min(metric["sd"] for metric in cider)
    assert max(metric["mean"] for metric in cider) - min(metric["mean"] for metric in cider) < spread
