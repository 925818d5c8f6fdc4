"""Docs tables that come from committed benchmark results are exactly what the benchmark script renders from them
(never typed by hand): `python benchmarks/image_use.py --docs benchmarks/results/image_use.json` rewrites the block
of docs/datasets.md (`benchmarks/word_vectors.py --docs benchmarks/results/word_vectors.json` the word-vectors table
of docs/results.md, `benchmarks/time_to_result.py --docs benchmarks/results/time_to_result.json` the times of analyze
and training in docs/analysis.md and docs/results.md, `benchmarks/feature_store.py --docs
benchmarks/results/feature_store.json` the feature store's in docs/datasets.md, `benchmarks/simple_vqa_ceiling.py --docs`
the simple-VQA runs in docs/training.md, `benchmarks/gpu.py --docs benchmarks/results/gpu.json` the GPU table of the
README, or its statement that no GPU run was made; `benchmarks/data_loading.py --docs
benchmarks/results/data_loading.json` the loader against training in docs/performance.md), and the claims the docs
make of them hold in those results."""

from __future__ import annotations

import json
import math

import pytest
from script_modules import ROOT, load_script

DOCS = ROOT / "docs"


def test_image_use_table_is_generated_from_the_committed_results():
    benchmark = load_script("image_use_benchmark", ROOT / "benchmarks" / "image_use.py")
    report = json.loads(benchmark.RESULTS.read_text())
    assert benchmark.docs_block(report) in (DOCS / "datasets.md").read_text()
    # the claim docs/datasets.md makes of it: without the standardisation the model ignores the image, with it it does not
    runs = {(run["family"], run["setting"]): run for run in report["runs"]}
    for family in ("single_stream", "two_stream"):
        before, after = runs[family, "before"], runs[family, "after"]
        assert before["visual_feature_normalization"] == "none" and after["visual_feature_normalization"] == "standardize"
        assert after["image_use_accuracy_gap"] > before["image_use_accuracy_gap"]
        assert after["image_use_accuracy_gap"] > 0.02 and after["image_use_loss_gap"] > 0.05


def test_word_vectors_table_is_generated_from_the_committed_results():
    benchmark = load_script("word_vectors_benchmark", ROOT / "benchmarks" / "word_vectors.py")
    report = json.loads(benchmark.RESULTS.read_text())
    assert benchmark.docs_block(report) in (DOCS / "results.md").read_text()
    runs = {run["source"]: run for run in report["runs"]}
    assert runs["glove"]["word_vectors"].startswith("GloveWordVectors('glove_6B_50d_emb.npy'")
    assert runs["minilm"]["word_vectors"].startswith("SentenceEmbeddingWordVectors(")
    assert runs["glove"]["num_grounded_phrases"] == runs["minilm"]["num_grounded_phrases"]  # the same phrases
    # the claims docs/results.md makes of it: the difference is well within one standard error of the evaluation sample,
    # and the targets of both sources ground every phrase and nearly always pick the same object
    for key in ("alignment_decoder_grounding_accuracy", "cross_attention_grounding_accuracy"):
        error = math.hypot(*(benchmark.standard_error(run[key], run["num_grounded_phrases"]) for run in runs.values()))
        assert abs(runs["glove"][key] - runs["minilm"][key]) < 0.5 * error, key
    targets = report["targets"]
    assert targets["same_highest_object"] > 0.95
    assert min(targets["minilm_targets_grounding_accuracy"], targets["glove_targets_grounding_accuracy"]) > 0.99


def test_time_to_result_blocks_are_generated_from_the_committed_results():
    benchmark = load_script("time_to_result_benchmark", ROOT / "benchmarks" / "time_to_result.py")
    report = json.loads(benchmark.RESULTS.read_text())
    assert benchmark.analyze_block(report) in (DOCS / "analysis.md").read_text()
    assert benchmark.training_block(report) in (DOCS / "results.md").read_text()
    # what the blocks say: one thread against every core of the machine, and the same analysis.json from both
    assert report["settings"]["thread_counts"] == [1, report["machine"]["cores"]]
    assert report["analyze"]["same_analysis_json"] is True
    assert report["analyze"]["num_examples"] == 1262  # the 1,262 evaluation pairs of the main job the docs name


def test_feature_store_tables_are_generated_from_the_committed_results():
    benchmark = load_script("feature_store_benchmark", ROOT / "benchmarks" / "feature_store.py")
    report = json.loads(benchmark.RESULTS.read_text())
    assert benchmark.docs_block(report) in (DOCS / "datasets.md").read_text()
    # what docs/datasets.md says of it: the store reads random batches faster than seeking in the TSV and keeps far less
    # private memory than LXMERT's whole-file load
    assert report["store_batches_per_second"] > 10 * report["tsv_batches_per_second"]
    assert report["store_private_mib"] < 0.25 * report["in_memory_private_mib"]


def _ceiling_runs() -> tuple:
    benchmark = load_script("simple_vqa_ceiling_benchmark", ROOT / "benchmarks" / "simple_vqa_ceiling.py")
    report = json.loads(benchmark.RESULTS.read_text())
    on_gpu = {id(run): run["machine"].startswith("NVIDIA") for run in report["runs"]}
    runs = {(run["fixture"], benchmark.describe(run["flags"]), on_gpu[id(run)]): run for run in report["runs"]}
    return benchmark, report, runs


def test_simple_vqa_ceiling_table_is_generated_from_the_committed_results():
    benchmark, report, runs = _ceiling_runs()
    assert benchmark.docs_block(report) in (DOCS / "training.md").read_text()
    # what docs/training.md says of it: one rate of 2e-4 leaves yes/no at its prior however long it trains, while
    # colour / shape / number answers rise; the encoder at 5e-5 reaches the ceiling of both 2,000-image fixtures
    for fixture in ("one_shape_2000", "three_shapes_2000"):
        slow = runs[fixture, "encoder 2e-4, new parts 2e-4, 10 epoch(s)", True]
        assert abs(slow["final"]["yes_no"] - slow["priors"]["yes_no"]) < 0.05
        assert slow["final"]["other"] > slow["priors"]["other"] + 0.4
        recipe = runs[fixture, "encoder 5e-5, new parts 1e-3, 10 epoch(s)", True]
        assert recipe["final"]["vqa_accuracy"] > 0.97 and recipe["final"]["yes_no"] > 0.95
    # at the example's default budget (1 epoch) on this CPU the new rates already lift yes/no off its prior
    one_epoch = runs["one_shape_2000", "encoder 5e-5, new parts 1e-3, 1 epoch(s)", False]
    assert one_epoch["complete"] and one_epoch["final"]["yes_no"] > one_epoch["priors"]["yes_no"] + 0.15
    old = runs["one_shape_2000", "encoder 2e-4, new parts 2e-4, 1 epoch(s)", True]
    assert abs(old["final"]["yes_no"] - old["priors"]["yes_no"]) < 0.05
    # 600 images: one epoch leaves yes/no at its prior at either rate; the small-data recipe (10 epochs) reaches 0.95
    for rates in ("encoder 2e-4, new parts 2e-4", "encoder 5e-5, new parts 1e-3"):
        short = runs["one_shape_600", f"{rates}, 1 epoch(s)", False]
        assert abs(short["final"]["yes_no"] - short["priors"]["yes_no"]) < 0.05
    # the two-stream family at the new rates: the ceiling with one shape, yes/no at its prior with 1-3 shapes
    two_stream = "encoder 5e-5, new parts 1e-3, 10 epoch(s), two-stream"
    assert runs["one_shape_2000", two_stream, True]["final"]["vqa_accuracy"] > 0.95
    binding = runs["three_shapes_2000", two_stream, True]
    assert abs(binding["final"]["yes_no"] - binding["priors"]["yes_no"]) < 0.05
    recipe = runs["one_shape_600", "encoder 5e-5, new parts 1e-3, 10 epoch(s)", False]
    assert recipe["complete"] and recipe["final"]["vqa_accuracy"] >= 0.95 and recipe["final"]["yes_no"] > 0.9


def test_every_simple_vqa_ceiling_setting_is_a_valid_command_of_the_example():
    benchmark, _, _ = _ceiling_runs()
    example = load_script("finetune_vqa_for_ceiling", ROOT / "examples" / "finetune_vqa.py")
    for name, (fixture, flags) in benchmark.SETTINGS.items():
        assert fixture in benchmark.FIXTURES, name
        _, _, _, training_args = example.parse_args(["--output_dir", "unused", *flags])
        values = benchmark.effective_flags(" ".join(flags))
        assert training_args.learning_rate == float(values["--learning_rate"]), name
        assert training_args.head_learning_rate == float(values["--head_learning_rate"]), name
        assert training_args.num_train_epochs == float(values["--num_train_epochs"]), name


def test_gpu_block_is_generated_from_the_committed_results_or_says_it_has_not_been_run():
    benchmark = load_script("gpu_benchmark_tables", ROOT / "benchmarks" / "gpu.py")
    report = benchmark.committed_report()
    block = benchmark.docs_block(report)
    assert block in (ROOT / "README.md").read_text()
    if report is None:  # not run yet: the README says so and gives the command
        assert "Not run yet" in block and benchmark.COMMAND in block
    else:  # a committed result comes from a GPU at base size, and the README names the device
        assert benchmark.is_gpu_result(report) and report["device"]["name"] in block


def test_data_loading_table_is_generated_from_the_committed_results():
    benchmark = load_script("data_loading_benchmark", ROOT / "benchmarks" / "data_loading.py")
    report = json.loads(benchmark.RESULTS.read_text())
    assert benchmark.docs_block(report) in (DOCS / "performance.md").read_text()
    # every example's default job, measured in the same run
    assert [run["name"] for run in report["runs"]] == [job.name for job in benchmark.JOBS]
    assert all((ROOT / "examples" / job.script).is_file() for job in benchmark.JOBS)
    # the claim docs/performance.md makes of it: the loader is at least 5x faster than training, for every example,
    # by wall-clock time and by CPU time (a one-thread step's CPU seconds over the run's threads against a batch's)
    for run in report["runs"]:
        accumulation = run["gradient_accumulation_steps"]
        wall_ratio = run["loader_batches_per_second"] / run["optimizer_steps_per_second"] / accumulation
        assert run["ratio"] == pytest.approx(wall_ratio)
        least_step_seconds = run["one_thread_step_cpu_seconds"] / run["threads"] / accumulation
        assert run["cpu_ratio"] == pytest.approx(least_step_seconds / run["loader_cpu_seconds_per_batch"])
        assert min(run["ratio"], run["cpu_ratio"]) >= benchmark.MIN_RATIO == 5.0, run["name"]


def test_bad_inputs_table_is_generated_from_the_committed_results():
    benchmark = load_script("bad_inputs_benchmark", ROOT / "benchmarks" / "bad_inputs.py")
    before, after = (json.loads((benchmark.RESULTS_DIR / f"bad_inputs_{label}.json").read_text()) for label in ("before", "after"))
    assert benchmark.docs_block(before, after) in (DOCS / "reliability.md").read_text()
    # what the docs say of it: the same cases before and after, more refused clearly, fewer files lost
    assert before["cases_total"] == after["cases_total"] == 255
    assert after["counts"]["clear"] > before["counts"]["clear"]
    assert after["counts"].get("lost", 0) < before["counts"]["lost"]


def test_main_job_time_in_the_readme_and_docs_is_generated_from_the_committed_results():
    benchmark = load_script("main_job_time_benchmark", ROOT / "benchmarks" / "main_job_time.py")
    example = load_script("finetune_vgp_for_the_readme", ROOT / "examples" / "finetune_vgp.py")
    report = json.loads(benchmark.RESULTS.read_text())
    assert benchmark.docs_block(report) in (DOCS / "performance.md").read_text()
    (run,) = report["runs"]
    minutes, seconds = divmod(round(run["wall_seconds"]), 60)
    best = run["grounding_accuracy_best_head"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"takes {minutes} min {seconds} s, and its best head grounds {best:.3f} of the phrases" in readme
    # what the README says of it: the main job as it is today (its own defaults), on a quiet machine, grounding
    defaults = example.parse_args(["--output_dir", "unused"])[1].to_dict()
    assert report["settings"] == ["defaults"]
    for run in report["runs"]:
        assert run["settings"] == {name: defaults[name] for name in benchmark.SETTING_FIELDS}
        assert max(run["load_average_before"][0], run["load_average_after"][0]) < 2.5
        assert run["grounding_accuracy_best_head"] >= 0.8
