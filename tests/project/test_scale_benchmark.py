"""The growth table of docs/datasets.md is what `python benchmarks/scale.py --docs benchmarks/results/scale.json`
renders from the committed results, and the claims of its plan (benchmarks/results/scale_plan.md) hold in them."""

from __future__ import annotations

import json

from script_modules import ROOT, load_script

GROWTH_SLACK = 1.5  # linear: a ratio of at most 1.5 x the ratio of the numbers of images


def _report() -> tuple:
    benchmark = load_script("scale_benchmark", ROOT / "benchmarks" / "scale.py")
    return benchmark, json.loads(benchmark.RESULTS.read_text())


def test_scale_table_is_generated_from_the_committed_results():
    benchmark, report = _report()
    assert benchmark.docs_block(report) in (ROOT / "docs" / "datasets.md").read_text()
    assert report["settings"]["sizes"] == [1000, 10_000, 30_000]
    runs = {(run["task"], run["num_images"]): run for run in report["runs"]}
    assert set(runs) == {(task, size) for task in benchmark.TASKS for size in report["settings"]["sizes"]}
    for size in report["settings"]["sizes"]:  # both VGP builds read the same csv rows
        assert runs["vgp_hard", size]["rows"] == runs["vgp_random", size]["rows"] > 4 * size
        assert runs["flickr30k_entities", size]["rows"] == 5 * size  # five captions per image
        assert runs["convert_features", size]["rows"] == runs["store_read", size]["rows"] == size


def test_scale_claims_hold_in_the_committed_results():
    benchmark, report = _report()
    runs = {(run["task"], run["num_images"]): run for run in report["runs"]}
    growth = report["growth"]
    for task in benchmark.TASKS:  # claim 1: memory above the imports grows linearly
        assert growth[task]["size_ratio"] == 30
        assert growth[task]["work_memory_ratio"] <= GROWTH_SLACK * growth[task]["size_ratio"], task
    assert runs["vgp_hard", 30_000]["peak_mib"] < 2048  # claim 2: the Flickr30k-size VGP build fits in 2 GB
    for task in ("vgp_random", "flickr30k_entities", "convert_features", "store_read"):  # claim 3
        assert growth[task]["time_ratio"] <= GROWTH_SLACK * growth[task]["size_ratio"], task
