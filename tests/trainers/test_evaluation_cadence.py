"""The examples evaluate a fixed number of times per run whatever the data set's size (`--eval_steps` 0.2 by
default, transformers' fraction-of-the-run form, at least 50 steps apart: a short run evaluates once), and the
evaluations during training can read a seeded sample of the evaluation split (`--eval_subset_size`) while the final
evaluation reads all of it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import datasets
import pytest
from transformers import TrainerState, TrainingArguments

from hf_vlalign.recipes import EVALUATIONS_PER_RUN, evaluation_count, evaluation_interval, evaluation_subset

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("finetune_vqa", "finetune_nlvr2", "finetune_refcoco", "finetune_flickr_grounding", "pretrain_single_stream")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"cadence_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_evaluate_five_times_per_long_run_and_once_per_short_run(name, tmp_path):
    parse_args = load_example(name).parse_args
    training_args = parse_args(["--output_dir", str(tmp_path)])[-1]
    # finetune_vqa: once per epoch of its 10-epoch cap, which early stopping usually cuts short
    fraction = 1 / 10 if name == "finetune_vqa" else 1 / EVALUATIONS_PER_RUN
    assert training_args.eval_strategy == "steps" and training_args.eval_steps == fraction
    # what the examples make of it (`EvaluationScheduleCallback`): every ceil(fraction * max_steps) steps, on any data
    # set size, but with at least as many training rows between evaluations as one reads (here 800 rows, batch 16)
    for max_steps, expected in ((5, 1), (120, 3), (1200, round(1 / fraction)), (36_000, round(1 / fraction))):
        interval = evaluation_interval(max_steps, fraction, eval_rows=800, rows_per_step=16)
        assert evaluation_count(max_steps, interval) == expected, max_steps
    assert parse_args(["--output_dir", str(tmp_path), "--eval_steps", "7"])[-1].eval_steps == 7


def test_evaluation_subset_is_a_seeded_ordered_sample():
    rows = datasets.Dataset.from_dict({"id": list(range(100))})
    subset = evaluation_subset(rows, 10, seed=3)
    assert len(subset) == 10 and subset["id"] == sorted(subset["id"]) and len(set(subset["id"])) == 10
    assert evaluation_subset(rows, 10, seed=3)["id"] == subset["id"]
    assert evaluation_subset(rows, 10, seed=4)["id"] != subset["id"]
    assert evaluation_subset(rows, None, seed=3) is rows and evaluation_subset(rows, 100, seed=3) is rows
    with pytest.raises(ValueError, match="`--eval_subset_size` must be a number of rows >= 1, got 0"):
        evaluation_subset(rows, 0, seed=3)


def test_the_training_arguments_fraction_is_transformers_own():
    args = TrainingArguments(output_dir="unused", eval_strategy="steps", eval_steps=0.2, report_to="none")
    state = TrainerState()
    state.compute_steps(args, 37)
    assert state.eval_steps == 8  # ceil(0.2 * 37)
