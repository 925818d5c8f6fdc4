"""`final_evaluation` (what the examples report after training) reuses the Trainer's evaluation of the final weights
instead of a second pass over the evaluation split, and evaluates when there is none to reuse."""

import pytest
from tiny_vgp import tiny_vgp_trainer
from transformers import TrainerCallback

from hf_vlalign.recipes import final_evaluation
from hf_vlalign.trainers import VGPTrainer, VGPTrainingArguments

# the timing entries of an evaluation differ between two passes; every other number must not
TIMING_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second")


class CountEvaluations(TrainerCallback):
    def __init__(self):
        self.count = 0

    def on_evaluate(self, args, state, control, **kwargs):
        self.count += 1


def trained(data, tmp_path, eval_strategy: str) -> tuple[VGPTrainer, CountEvaluations]:
    args = VGPTrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=1, per_device_train_batch_size=16, per_device_eval_batch_size=16,
        eval_strategy=eval_strategy, report_to="none", remove_unused_columns=False, save_strategy="no", use_cpu=True,
        seed=0, disable_tqdm=True,
    )  # fmt: skip
    counter = CountEvaluations()
    trainer = tiny_vgp_trainer(data, args, num_hidden_layers=1, callbacks=[counter])
    trainer.train()
    return trainer, counter


def _numbers(metrics: dict) -> dict:
    return {key: v for key, v in metrics.items() if key.startswith("eval_") and not key.endswith(TIMING_SUFFIXES)}


def test_the_last_epochs_evaluation_is_reused(vgp_data, tmp_path):
    trainer, counter = trained(vgp_data, tmp_path, "epoch")
    assert counter.count == 1  # the end of the only epoch
    metrics = final_evaluation(trainer)
    assert counter.count == 1  # no second pass
    again = trainer.evaluate()  # the same weights evaluated anew: the same numbers
    assert _numbers(metrics) == pytest.approx(_numbers(again), abs=1e-6) and "eval_vgp_accuracy" in metrics


def test_without_an_evaluation_after_the_last_step_it_evaluates(vgp_data, tmp_path):
    trainer, counter = trained(vgp_data, tmp_path, "no")
    metrics = final_evaluation(trainer)
    assert counter.count == 1 and "eval_image_description_accuracy" in metrics
