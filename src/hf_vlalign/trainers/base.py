"""Trainer plumbing shared by every recipe: each loss component is averaged over the logging window and logged
under its own key, in training and evaluation (the way trl's trainers keep a `_metrics` dict and flush it in `log()`)."""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers import Trainer

# attention maps and hidden states of every model family
ATTENTION_KEYS = (
    "hidden_states",
    "attentions",
    "language_hidden_states",
    "vision_hidden_states",
    "language_attentions",
    "vision_attentions",
    "cross_encoder_attentions",
    "cross_encoder_vision_attentions",
)


class ComponentLossTrainer(Trainer):
    """A `Trainer` whose model output carries loss components (`loss_component_keys`), each logged separately."""

    loss_component_keys: tuple[str, ...] = ()
    # batch entries used by evaluation tools but not taken by the model's forward
    non_model_keys: tuple[str, ...] = ()
    # model outputs that are not predictions (large per-token tensors); never gathered at evaluation
    non_prediction_keys: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        model_inputs = {k: v for k, v in inputs.items() if k not in self.non_model_keys}
        outputs = model(**model_inputs)
        mode = "train" if model.training else "eval"
        for key in self.loss_component_keys:
            value = outputs.get(key)
            if value is not None:
                self._metrics[mode][key].append(self.accelerator.gather(value.detach().reshape(1)).mean().item())
        loss = outputs.get("loss")
        if loss is None:
            raise ValueError(f"The model returned no loss: the batch must carry the labels {self.label_names}.")
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # predictions are the task logits only: loss components and attention maps are not gathered
        ignore_keys = list(ignore_keys or []) + [*self.loss_component_keys, *self.non_prediction_keys, *ATTENTION_KEYS]
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if "loss" in logs or not any(key.startswith("eval_") for key in logs) else "eval"
        prefix = "eval_" if mode == "eval" else ""
        for key, values in self._metrics[mode].items():
            if values:
                logs[f"{prefix}{key}"] = float(torch.tensor(values).mean())
        self._metrics[mode].clear()
        super().log(logs, start_time)
