"""How long an example trains and how often it evaluates: the bounded evaluation count of short runs
(`evaluation_interval`), early stopping on the validation score (`EarlyStoppingArguments`) and the learning curve
written beside the model (`learning_curve.json`). `training_callbacks` gives a Trainer all three."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from transformers import EarlyStoppingCallback, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import IntervalStrategy

# evaluations during a run by default, evenly spaced whatever the data set's size (`--eval_steps` below 1 is a
# fraction of the run's steps in transformers); an explicit `--eval_steps N` evaluates every N steps instead
EVALUATIONS_PER_RUN = 5
EVALUATION_RULE = (
    f"a fraction of the run's optimizer steps (default 1/{EVALUATIONS_PER_RUN}: {EVALUATIONS_PER_RUN} evaluations), "
    "but with at least as many training rows between two evaluations as one evaluation reads, so that evaluating "
    "stays a small part of the run: a run shorter than that (e.g. --max_steps 5 with a large evaluation split) "
    "evaluates once, after its last step; an integer N evaluates every N steps"
)
LEARNING_CURVE_FILE = "learning_curve.json"
# evaluation entries that time the evaluation rather than score the model
SPEED_METRICS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


def evaluation_interval(max_steps: int, eval_steps: float, eval_rows: int = 0, rows_per_step: int = 1) -> int:
    """The optimizer steps between evaluations of a run of `max_steps` steps with `--eval_steps eval_steps`: an
    integer is kept; a fraction gives ceil(eval_steps * max_steps) (transformers' reading), raised to the steps that
    train on as many rows as one evaluation reads (ceil(eval_rows / rows_per_step)) and capped at `max_steps` (one
    evaluation, after the last step)."""
    if eval_steps >= 1:
        return int(eval_steps)
    interval = max(math.ceil(eval_steps * max_steps), math.ceil(eval_rows / rows_per_step))
    return max(1, min(interval, max_steps))


def evaluation_count(max_steps: int, interval: int) -> int:
    """How many times a run of `max_steps` steps evaluates during training every `interval` steps (the Trainer adds
    one after the last step when it is not a multiple of `interval`)."""
    return max_steps // interval + (max_steps % interval != 0)


class EvaluationScheduleCallback(TrainerCallback):
    """Applies `evaluation_interval` to a fractional `--eval_steps` once the run's length is known, for an evaluation
    split of `eval_rows` rows."""

    def __init__(self, eval_rows: int):
        self.eval_rows = eval_rows

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if args.eval_strategy == IntervalStrategy.STEPS and args.eval_steps is not None and args.eval_steps < 1:
            rows_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            state.eval_steps = evaluation_interval(state.max_steps, args.eval_steps, self.eval_rows, rows_per_step)


@dataclass
class EarlyStoppingArguments:
    """`--early_stopping_patience`: stop when the validation score stops improving."""

    early_stopping_patience: int = field(
        default=0,
        metadata={
            "help": "stop training once `--metric_for_best_model` has not improved for N evaluations in a row "
            "(transformers' EarlyStoppingCallback; the model of the last step is kept, every evaluation is in "
            f"{LEARNING_CURVE_FILE}); `--num_train_epochs` / `--max_steps` is then the most it trains. 0 (or "
            "`--eval_strategy no`): train for all of them. A default patience applies to the default length only: a "
            "`--num_train_epochs` or `--max_steps` you give is trained in full unless you give this flag too."
        },
    )
    counts_from_zero: ClassVar[tuple[str, ...]] = ("early_stopping_patience",)  # `check_counts`: 0 is off


def keep_asked_length(parsed: list[Any], given: set[str]) -> None:
    """Switches a default `--early_stopping_patience` off when the run's length was given (`--num_train_epochs`,
    `--max_steps`, on the command line or in `--config`): a length one asks for is trained in full."""
    if "early_stopping_patience" in given or not given & {"num_train_epochs", "max_steps"}:
        return
    for arguments in parsed:
        if isinstance(arguments, EarlyStoppingArguments):
            arguments.early_stopping_patience = 0


def stops_early(training_args: TrainingArguments, early_stopping_patience: int) -> bool:
    """Whether early stopping applies: a patience and evaluations during training (a run with `--eval_strategy no`
    trains all its steps). A patience without `--metric_for_best_model` is refused."""
    if not early_stopping_patience or training_args.eval_strategy == IntervalStrategy.NO:
        return False
    if training_args.metric_for_best_model is None:
        raise ValueError(
            f"`--early_stopping_patience` {early_stopping_patience} stops on the validation score: it needs "
            "`--metric_for_best_model` (e.g. accuracy), got None."
        )
    return True


def stopping_rule(training_args: TrainingArguments, early_stopping_patience: int) -> str | None:
    """The early-stopping rule in words (model card, learning curve), or None when the run has none."""
    if not stops_early(training_args, early_stopping_patience):
        return None
    strategy = IntervalStrategy(training_args.eval_strategy)
    cadence = "epoch" if strategy == IntervalStrategy.EPOCH else f"--eval_steps {training_args.eval_steps:g}"
    return (
        f"stops once eval `{training_args.metric_for_best_model}` has not improved for {early_stopping_patience} "
        f"evaluation{'s' if early_stopping_patience != 1 else ''} in a row (evaluated every {cadence})"
    )


class LearningCurveCallback(TrainerCallback):
    """Writes `learning_curve.json` in `--output_dir` at every evaluation during training: for each, the step, epoch,
    latest logged training loss and the evaluation metrics; then whether the run stopped before its planned steps and
    by which rule. Main process only."""

    def __init__(self, rule: str | None = None):
        self.rule = rule
        self.points: list[dict[str, Any]] = []
        self.training = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.training, self.points = True, []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self.training or metrics is None:
            return  # an evaluation after training (e.g. of the whole split) is not a point of the curve
        losses = [log for log in state.log_history if "loss" in log and log["step"] <= state.global_step]
        self.points.append(
            {
                "step": state.global_step,
                "epoch": state.epoch,
                # the latest training loss logged (every --logging_steps), and its step; None before the first log
                "train_loss": losses[-1]["loss"] if losses else None,
                "train_loss_step": losses[-1]["step"] if losses else None,
                **{key: value for key, value in metrics.items() if key not in SPEED_METRICS and key != "epoch"},
            }
        )
        self.write(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False
        self.write(args, state)

    def write(self, args: TrainingArguments, state: TrainerState) -> None:
        if not state.is_world_process_zero or args.output_dir is None:
            return
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        curve = {
            "metric_for_best_model": args.metric_for_best_model,
            "stopping_rule": self.rule,
            "max_steps": state.max_steps,
            "global_step": state.global_step,
            "stopped_early": state.global_step < state.max_steps,
            "points": self.points,
        }
        (Path(args.output_dir) / LEARNING_CURVE_FILE).write_text(json.dumps(curve, indent=2) + "\n")


def training_callbacks(
    training_args: TrainingArguments, eval_rows: int, early_stopping_patience: int = 0
) -> list[TrainerCallback]:
    """The callbacks of an example's Trainer evaluating `eval_rows` rows during training: the bounded evaluation count
    (`EvaluationScheduleCallback`), the learning curve (`LearningCurveCallback`) and, when `stops_early`,
    transformers' `EarlyStoppingCallback` on `--metric_for_best_model`."""
    rule = stopping_rule(training_args, early_stopping_patience)
    callbacks = [EvaluationScheduleCallback(eval_rows), LearningCurveCallback(rule)]
    if rule is not None:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience))
    return callbacks


def early_stopping_summary(trainer) -> str | None:
    """The model card's line on how the run's length was decided, when early stopping was on: the rule, and whether
    it stopped the run."""
    curve = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, LearningCurveCallback)), None)
    if curve is None or curve.rule is None:
        return None
    state = trainer.state
    outcome = "it stopped the run" if state.global_step < state.max_steps else "the run trained all its planned steps"
    return f"{curve.rule}: {outcome} ({LEARNING_CURVE_FILE})"
