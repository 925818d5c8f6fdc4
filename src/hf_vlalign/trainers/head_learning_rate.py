"""A learning rate of its own for the parts of a model that a text checkpoint lacks: the visual embeddings and the
heads start from random weights, the encoder from pre-trained ones (the usual practice of fine-tuning with a new head,
e.g. LXMERT's and VL-BERT's task heads)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .base import ComponentLossTrainer, ComponentLossTrainingArguments, check_bounds


@dataclass
class HeadLearningRateArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] with a learning rate for the parts of the model a text checkpoint lacks (the
    trainer's `new_modules`).
    """

    head_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the visual embeddings and the heads, which a text checkpoint lacks "
            "(default: --learning_rate)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_bounds(self, head_learning_rate=(">", 0))


class HeadLearningRateTrainer(ComponentLossTrainer):
    """[`ComponentLossTrainer`] whose `new_modules` (module names a text checkpoint lacks) train at
    `args.head_learning_rate` when it is set ([`HeadLearningRateArguments`])."""

    args_class = HeadLearningRateArguments
    new_modules: tuple[str, ...] = ()

    def create_optimizer(self, model=None):
        """Trainer's optimizer, with the parameters of `new_modules` moved to groups at `head_learning_rate` (before
        any step; the scheduler, made afterwards, scales every group alike). Every process builds the same groups."""
        optimizer = super().create_optimizer(model)
        if self.args.head_learning_rate is not None:
            parameters = (model or self.model).named_parameters()
            new = [p for name, p in parameters if any(module in name.split(".")[:-1] for module in self.new_modules)]
            separate_parameter_groups(optimizer, new, self.args.head_learning_rate)
        return optimizer


def separate_parameter_groups(optimizer: torch.optim.Optimizer, parameters: list, learning_rate: float) -> None:
    """Moves `parameters` into groups of their own with `learning_rate` (each keeps its group's other settings, e.g.
    its weight decay). Runs once, before any step: a second call finds them already moved."""
    moving = {id(p) for p in parameters}
    new_groups = []
    for group in optimizer.param_groups:
        if group.get("separated"):
            return
        moved = [p for p in group["params"] if id(p) in moving]
        if moved:
            group["params"] = [p for p in group["params"] if id(p) not in moving]
            settings = {key: value for key, value in group.items() if key != "params"}
            new_groups.append({**settings, "params": moved, "lr": learning_rate, "separated": True})
    for group in new_groups:
        optimizer.add_param_group(group)
