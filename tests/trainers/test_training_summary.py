"""The model card's training summary states the steps and epochs a run actually trained (`trainer.state`), not the
epochs it was asked for: a run stopped by `--max_steps` within its first epoch says so."""

from __future__ import annotations

import datasets
import torch
from transformers import Trainer, TrainingArguments

from hf_vlalign.hub.model_card import render_task_model_card
from hf_vlalign.recipes import trained_amount, training_summary


class TinyRegressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


def trained_trainer(tmp_path, rows: int, **arguments) -> Trainer:
    data = datasets.Dataset.from_dict({"x": [[float(i), 1.0] for i in range(rows)], "labels": list(map(float, range(rows)))})
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, report_to="none", save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, **arguments,
    )  # fmt: skip
    args.mixed_precision = "no"  # set by the examples' argument parsing
    trainer = Trainer(model=TinyRegressor(), args=args, train_dataset=data.with_format("torch"))
    trainer.train()
    return trainer


def test_a_run_stopped_by_max_steps_within_its_first_epoch(tmp_path):
    # 40 rows in batches of 2: 20 steps an epoch; --max_steps 6 stops after 0.3 of it (the default 3 epochs unread)
    trainer = trained_trainer(tmp_path, 40, max_steps=6)
    assert trained_amount(trainer) == "6 optimizer steps (0.3 of an epoch; planned: 6 steps (--max_steps))"
    summary = training_summary(trainer, "hand-made rows", eval_examples=5)
    assert summary["trained"] == trained_amount(trainer)
    assert "epochs" not in summary and "max_steps" not in summary  # the arguments' plan is not shown as the result
    card = render_task_model_card(
        "visual_reasoning", model_family="single_stream", model_id=None, base_model=None, results={"accuracy": 0.5},
        training=summary,
    )  # fmt: skip
    assert "| trained | 6 optimizer steps (0.3 of an epoch; planned: 6 steps (--max_steps)) |" in card.text
    assert "| epochs |" not in card.text


def test_a_run_of_whole_epochs(tmp_path):
    trainer = trained_trainer(tmp_path, 4, num_train_epochs=2)  # 2 steps an epoch
    assert trained_amount(trainer) == "4 optimizer steps (2 epochs; planned: 2 epochs)"
    trainer = trained_trainer(tmp_path / "one", 3, num_train_epochs=1)  # 2 steps, the last with one row
    assert trained_amount(trainer) == "2 optimizer steps (1 epoch; planned: 1 epoch)"


def test_a_fraction_of_epochs_planned(tmp_path):
    trainer = trained_trainer(tmp_path, 8, num_train_epochs=1.5)  # 4 steps an epoch: 6 steps
    assert trained_amount(trainer) == "6 optimizer steps (1.5 epochs; planned: 1.5 epochs)"
