"""The evaluation's reported losses are means over its examples: the same whatever the batch size, a short last batch
included, and `eval_loss` is the weighted sum of its components (`ComponentLossTrainer.evaluation_loop`). The same
under several processes and gradient accumulation: `tests/trainers/test_multiprocess_reported_losses.py`."""

from __future__ import annotations

import pytest
import torch
from reported_losses_worker import TOKEN_WEIGHT, collate, tiny_trainer


def test_eval_losses_are_means_over_the_examples_with_a_short_last_batch(tmp_path):
    trainer = tiny_trainer(tmp_path, eval_batch=2)  # 7 examples: batches of 2, 2, 2 and 1
    metrics = trainer.evaluate()

    examples = list(trainer.eval_dataset)
    model = trainer.model.eval()
    with torch.no_grad():
        whole = model(**collate(examples))
        batches = [model(**collate(examples[start : start + 2])) for start in range(0, len(examples), 2)]
    rows = [min(2, len(examples) - start) for start in range(0, len(examples), 2)]
    # the task loss, a mean over examples, is the whole set's; the token loss the examples' mean of their batch's mean
    assert metrics["eval_loss_task"] == pytest.approx(whole.loss_task.item(), abs=1e-6)
    tokens = sum(count * batch.loss_tokens.item() for count, batch in zip(rows, batches)) / len(examples)
    assert metrics["eval_loss_tokens"] == pytest.approx(tokens, abs=1e-6)
    total = metrics["eval_loss_task"] + TOKEN_WEIGHT * metrics["eval_loss_tokens"]
    assert metrics["eval_loss"] == pytest.approx(total, abs=1e-6)

    # one batch of the whole set reports the same task loss
    assert tiny_trainer(tmp_path, eval_batch=7).evaluate()["eval_loss_task"] == pytest.approx(metrics["eval_loss_task"], abs=1e-6)
