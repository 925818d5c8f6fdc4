"""Docs tables that come from committed benchmark results are exactly what the benchmark script renders from them
(never typed by hand): `python benchmarks/image_use.py --docs benchmarks/results/image_use.json` rewrites the block
of docs/datasets.md (`benchmarks/word_vectors.py --docs benchmarks/results/word_vectors.json` the word-vectors table
of docs/results.md, `benchmarks/time_to_result.py --docs benchmarks/results/time_to_result.json` the times of analyze
and training in docs/analysis.md and docs/results.md, `benchmarks/feature_store.py --docs
benchmarks/results/feature_store.json` the feature store's in docs/datasets.md)."""

from __future__ import annotations

import json
import math

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
