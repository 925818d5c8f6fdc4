"""The trainers' steps read no tensor value on the host: the main job's `VGPTrainer` (training steps with gradient
accumulation, the global item counts, evaluation steps) and the captioner's A2 steps (the mask networks' gradients
and the captioning loss). Collation is not counted: it works on host data, where the value checks of the data
belong. Optimizer updates are not counted either: torch's AdamW keeps its step count on the host (reading it waits
for no device). The logged losses are read once per logging window, in `log`, outside the steps. The steps run on a
CUDA device when one is there (then CUDA's synchronisations are counted too), else on the CPU."""

from __future__ import annotations

import pytest
import torch
from test_captioning_training import captions, make_trainer  # noqa: F401 (a fixture)
from tiny_vgp import tiny_vgp_trainer

from hf_vlalign.trainers import VGPTrainingArguments
from hf_vlalign.utils.host_reads import count_host_reads

USE_CPU = not torch.cuda.is_available()


def count_reads_in(trainer, method_names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Wraps the trainer's `method_names` so that every read inside them is recorded; returns the (live) record."""
    events = []

    def counted(method):
        def run(*args, **kwargs):
            with count_host_reads() as reads:
                result = method(*args, **kwargs)
            events.extend((f"{method.__name__}: {operation}", where) for operation, where in reads.events)
            return result

        return run

    for name in method_names:
        setattr(trainer, name, counted(getattr(trainer, name)))
    return events


def test_vgp_training_and_evaluation_steps_read_nothing_on_the_host(vgp_data, tmp_path):
    args = VGPTrainingArguments(
        output_dir=str(tmp_path), max_steps=3, logging_steps=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, per_device_eval_batch_size=8, report_to="none", remove_unused_columns=False,
        save_strategy="no", use_cpu=USE_CPU, seed=0,
    )  # fmt: skip
    trainer = tiny_vgp_trainer(vgp_data, args, num_hidden_layers=2)
    events = count_reads_in(trainer, ("training_step", "global_item_counts", "prediction_step"))
    trainer.train()
    metrics = trainer.evaluate()
    assert events == []
    # the losses still reach the logs, read once per window
    logged = [log for log in trainer.state.log_history if "loss" in log]
    assert len(logged) == 3 and all({"loss_id", "loss_vgp", "loss_attention_supervision"} <= set(log) for log in logged)
    assert {"eval_loss_id", "eval_loss_vgp", "eval_loss_attention_supervision"} <= set(metrics)


@pytest.mark.parametrize("alignment", ["gate", "exp_decay"])
def test_a2_mask_and_captioning_steps_read_nothing_on_the_host(captions, tmp_path, alignment):  # noqa: F811
    trainer = make_trainer(captions, tmp_path, alignment=alignment, max_steps=2, use_cpu=USE_CPU)
    # the mask optimizer's update is left out, as the Trainer's own is: torch's AdamW keeps its step count on the host
    events = count_reads_in(trainer, ("compute_loss", "_mask_gradients", "global_item_counts"))
    trainer.train()
    assert events == []
    assert all("loss_mask" in log for log in trainer.state.log_history if "loss" in log)
