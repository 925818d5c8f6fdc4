"""Short runs are short and long runs stop when they stop improving: every example takes `--max_eval_samples`
(transformers' `run_*.py` flag), a fractional `--eval_steps` leaves at least as many training rows between two
evaluations as one evaluation reads (`evaluation_interval`), and `--early_stopping_patience` stops a run on its
validation score, the learning curve written to `learning_curve.json`."""

from __future__ import annotations

import json

import pytest
import torch
from script_modules import ROOT, load_script
from transformers import Trainer, TrainingArguments

from hf_vlalign.recipes import (
    LEARNING_CURVE_FILE,
    evaluation_count,
    evaluation_interval,
    training_callbacks,
)

SMALL_SCENES = ["--synthetic_train_images", "4", "--synthetic_eval_images", "6"]


def _example(name: str):
    return load_script(f"short_runs_{name}", ROOT / "examples" / f"{name}.py")


# example -> the evaluation rows its data loading returns for the parsed arguments (None: the example truncates in
# `main`, after dropping rows it cannot train; only its flag is checked here)
EVALUATION_ROWS = {
    "finetune_vgp": lambda module, parsed: module.load_data(*parsed)[0].eval,
    "finetune_vqa": lambda module, parsed: module.load_question_data(*parsed[1:]).eval,
    "finetune_nlvr2": lambda module, parsed: module.load_pair_data(*parsed[1:]).eval,
    "pretrain_single_stream": lambda module, parsed: module.load_caption_data(*parsed[1:]).eval,
    "pretrain_two_stream": lambda module, parsed: module.load_data(*parsed).eval,
    "train_captioning": lambda module, parsed: module.load_data(*parsed).images,
    "finetune_patch_vlm": lambda module, parsed: module.load_examples(parsed[0])[1],
    "finetune_refcoco": None,
    "finetune_flickr_grounding": None,
}


@pytest.mark.usefixtures("synthetic_scene_cache")
@pytest.mark.parametrize("name", list(EVALUATION_ROWS))
def test_every_example_takes_max_eval_samples(name, tmp_path):
    module = _example(name)
    parsed = module.parse_args(["--output_dir", str(tmp_path), "--max_eval_samples", "3", *SMALL_SCENES])
    assert any(getattr(args, "max_eval_samples", None) == 3 for args in parsed)
    if EVALUATION_ROWS[name] is not None:
        assert len(EVALUATION_ROWS[name](module, parsed)) == 3


def test_evaluation_interval_bounds_the_evaluations_of_a_short_run():
    # the default fraction 0.2 and NLVR2's test1 (6,967 rows) at batch 32: an evaluation reads 218 steps' rows
    for max_steps, interval, count in ((5, 5, 1), (200, 200, 1), (500, 218, 3), (5000, 1000, 5), (36_000, 7200, 5)):
        assert evaluation_interval(max_steps, 0.2, eval_rows=6967, rows_per_step=32) == interval, max_steps
        assert evaluation_count(max_steps, interval) == count, max_steps
    assert evaluation_interval(5, 0.2) == 1  # no evaluation rows given: transformers' own reading, ceil(0.2 * 5)
    assert evaluation_interval(5, 7, 6967, 32) == 7 and evaluation_interval(5000, 7, 6967, 32) == 7  # N is kept


class TinyRegressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, labels=None):
        logits = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(logits, labels), "logits": logits}


def _train(tmp_path, patience: int = 0, **arguments) -> Trainer:
    rows = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i % 3))} for i in range(12)]
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, eval_strategy="steps", logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, **arguments,
    )  # fmt: skip
    trainer = Trainer(
        model=TinyRegressor(), args=args, train_dataset=rows[:8], eval_dataset=rows,
        compute_metrics=lambda prediction: {"accuracy": 0.5},  # never improves after the first evaluation
        callbacks=training_callbacks(args, len(rows), patience),
    )  # fmt: skip
    trainer.train()
    return trainer


def _evaluated_steps(trainer: Trainer) -> list[int]:
    return [log["step"] for log in trainer.state.log_history if "eval_loss" in log]


def test_a_five_step_run_evaluates_once_after_its_last_step(tmp_path):
    # 12 evaluation rows, 2 training rows per step: at least 6 steps apart (transformers alone: every step)
    assert _evaluated_steps(_train(tmp_path, max_steps=5, eval_steps=0.2)) == [5]
    assert _evaluated_steps(_train(tmp_path, max_steps=20, eval_steps=0.2)) == [6, 12, 18, 20]


def test_early_stopping_stops_on_the_validation_score_and_writes_the_learning_curve(tmp_path):
    trainer = _train(tmp_path, patience=2, max_steps=40, eval_steps=2, metric_for_best_model="accuracy")
    assert _evaluated_steps(trainer) == [2, 4, 6]  # a best at step 2, then 2 evaluations without a better one
    curve = json.loads((tmp_path / LEARNING_CURVE_FILE).read_text())
    assert curve["stopped_early"] is True and (curve["global_step"], curve["max_steps"]) == (6, 40)
    assert "has not improved for 2 evaluations" in curve["stopping_rule"]
    assert [point["step"] for point in curve["points"]] == [2, 4, 6]
    assert all(point["eval_accuracy"] == 0.5 and point["train_loss"] > 0 for point in curve["points"])
    assert curve["points"][1]["epoch"] == pytest.approx(1.0)  # step 4: 4 batches of 2 rows make an epoch


def test_early_stopping_needs_a_metric_but_not_a_run_that_never_evaluates(tmp_path):
    with pytest.raises(ValueError, match="`--early_stopping_patience` 2 stops on the validation score: it needs"):
        training_callbacks(TrainingArguments(output_dir=str(tmp_path), eval_strategy="epoch", report_to="none"), 8, 2)
    quiet = TrainingArguments(output_dir=str(tmp_path), eval_strategy="no", report_to="none")
    assert len(training_callbacks(quiet, 8, 2)) == 2  # no EarlyStoppingCallback: the run trains all its steps


def test_the_default_run_stops_early_and_a_length_one_asks_for_is_trained_in_full(tmp_path):
    parse_args = _example("finetune_vqa").parse_args
    patience = lambda *argv: parse_args(["--output_dir", str(tmp_path), *argv])[1].early_stopping_patience  # noqa: E731
    assert patience() == 2 and parse_args(["--output_dir", str(tmp_path)])[-1].metric_for_best_model == "accuracy"
    assert patience("--num_train_epochs", "3") == 0 and patience("--max_steps", "40") == 0
    assert patience("--num_train_epochs", "3", "--early_stopping_patience", "4") == 4


def test_finetune_vqa_help_states_how_long_it_trains_and_how_often_it_evaluates(capsys):
    with pytest.raises(SystemExit):
        _example("finetune_vqa").parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "at least as many training rows between two evaluations as one evaluation reads" in text  # --eval_steps
    assert "has not improved for N evaluations in a row" in text and "(default: 2)" in text  # --early_stopping_patience
