"""A tiny model with two loss components of different item counts, trained and evaluated by `ComponentLossTrainer`;
for `tests/trainers/test_reported_losses.py` (in-process) and `tests/trainers/test_multiprocess_reported_losses.py`.

    accelerate launch ... tests/reported_losses_worker.py OUTPUT_DIR RUNS_JSON

runs each run of RUNS_JSON (a list of {"name", "batch", "accumulation", "eval_batch", "logging_steps"}) in turn and
writes OUTPUT_DIR/<name>.json (`reported_losses`) from the main process.

The model: each example has 1 to 4 tokens of 4 features; `loss_task` is the cross-entropy of a class predicted from
the mean token (a mean over the examples: count `task`), `loss_tokens` the squared error of a value predicted per
token (a mean over the real tokens: count `tokens`); `loss = loss_task + TOKEN_WEIGHT * loss_tokens`. No dropout and
plain SGD: the process count changes nothing but the sharding.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import TrainingArguments
from transformers.utils import ModelOutput

from hf_vlalign.trainers.base import ComponentLossTrainer
from hf_vlalign.utils.item_counts import count_labeled, count_true, item_count, mean_over_items, num_items

FEATURES = 4
CLASSES = 3
TOKEN_WEIGHT = 0.5
MAX_STEPS = 3


@dataclass
class TinyOutput(ModelOutput):
    loss: torch.Tensor | None = None
    loss_task: torch.Tensor | None = None
    loss_tokens: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class TinyComponentModel(nn.Module):
    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.classifier = nn.Linear(FEATURES, CLASSES)
            self.regressor = nn.Linear(FEATURES, 1)

    def loss_item_counts(self, inputs) -> dict[str, torch.Tensor]:
        return {"task": count_labeled(inputs.get("labels")), "tokens": count_true(inputs["token_mask"])}

    def forward(self, features, token_mask, token_targets, labels=None, global_item_counts=None) -> TinyOutput:
        mask = token_mask.float()
        pooled = (features * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        logits = self.classifier(pooled)
        if labels is None:
            return TinyOutput(logits=logits)
        task_sum = nn.functional.cross_entropy(logits, labels, reduction="sum")
        loss_task = mean_over_items(task_sum, item_count(count_labeled(labels), num_items(global_item_counts, "task")))
        token_sum = (((self.regressor(features).squeeze(-1) - token_targets) ** 2) * mask).sum()
        loss_tokens = mean_over_items(token_sum, item_count(count_true(token_mask), num_items(global_item_counts, "tokens")))
        loss = loss_task + TOKEN_WEIGHT * loss_tokens
        return TinyOutput(loss=loss, loss_task=loss_task, loss_tokens=loss_tokens, logits=logits)


class TinyTrainer(ComponentLossTrainer):
    loss_component_keys = ("loss_task", "loss_tokens")


def tiny_examples(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """`count` examples of 1 to 4 tokens each, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(count):
        length = int(torch.randint(1, 5, (), generator=generator))
        examples.append({
            "features": torch.randn(length, FEATURES, generator=generator),
            "token_targets": torch.randn(length, generator=generator),
            "labels": torch.randint(0, CLASSES, (), generator=generator),
        })  # fmt: skip
    return examples


def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pads the tokens of `examples` to the longest."""
    length = max(example["features"].shape[0] for example in examples)
    batch = {
        "features": torch.zeros(len(examples), length, FEATURES),
        "token_mask": torch.zeros(len(examples), length, dtype=torch.long),
        "token_targets": torch.zeros(len(examples), length),
        "labels": torch.stack([example["labels"] for example in examples]),
    }
    for row, example in enumerate(examples):
        tokens = example["features"].shape[0]
        batch["features"][row, :tokens] = example["features"]
        batch["token_targets"][row, :tokens] = example["token_targets"]
        batch["token_mask"][row, :tokens] = 1
    return batch


def tiny_trainer(output_dir: str | Path, batch: int = 8, accumulation: int = 1, eval_batch: int = 8, **settings) -> TinyTrainer:
    """A `TinyTrainer` of a fresh model on 24 training examples (3 steps of 8) and 7 evaluation examples."""
    args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        per_device_eval_batch_size=eval_batch, max_steps=MAX_STEPS, optim="sgd", learning_rate=0.5, warmup_steps=0,
        lr_scheduler_type="constant", save_strategy="no", eval_strategy="no", report_to="none", use_cpu=True,
        remove_unused_columns=False, dataloader_num_workers=0, seed=0, **settings,
    )  # fmt: skip
    return TinyTrainer(
        model=TinyComponentModel(), args=args, data_collator=collate, train_dataset=tiny_examples(24, seed=1),
        eval_dataset=tiny_examples(7, seed=2),
    )  # fmt: skip


def reported_losses(trainer: TinyTrainer) -> dict[str, float]:
    """Trains and evaluates: `train_loss` and the components logged with it, and the evaluation's losses."""
    trainer.train()
    final = trainer.state.log_history[-1]
    reported = {key: value for key, value in final.items() if key == "train_loss" or key.startswith("loss_")}
    reported.update({key: value for key, value in trainer.evaluate().items() if key.startswith("eval_loss")})
    return reported


def main() -> None:
    output_dir, runs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(1)
    for run in runs:
        name = run.pop("name")
        trainer = tiny_trainer(output_dir / name, **run)
        reported = reported_losses(trainer)
        if trainer.accelerator.is_main_process:
            (output_dir / f"{name}.json").write_text(json.dumps(reported, indent=2) + "\n")
        trainer.accelerator.wait_for_everyone()
    # the DDP model's reducer holds the process group: free it while every process is still in the group (freed
    # after the group is destroyed, its gloo destructor can wait forever for a process that has already exited)
    accelerator = trainer.accelerator
    del trainer
    accelerator.free_memory()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
