"""A learning rate of its own for the parts of a model that a text checkpoint lacks: the visual embeddings and the
heads start from random weights, the encoder from pre-trained ones (the usual practice of fine-tuning with a new head,
e.g. LXMERT's and VL-BERT's task heads)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import ComponentLossTrainer, ComponentLossTrainingArguments, check_bounds


@dataclass
class HeadLearningRateArguments(ComponentLossTrainingArguments):
    r"""
    [`ComponentLossTrainingArguments`] with a learning rate for the new parts of the model.

    Parameters:
        head_learning_rate (`float`, *optional*):
            Learning rate of the parts of the model a text checkpoint lacks (the trainer's `new_modules`: the visual
            embeddings and the heads); default: `learning_rate`, like every other parameter.
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
        any step, so no optimizer state exists yet; the scheduler, made afterwards, scales every group alike). Every
        process builds the same groups from the same parameter names, so it holds under DDP too."""
        optimizer = super().create_optimizer(model)
        if self.args.head_learning_rate is None:
            return optimizer
        names = {id(parameter): name for name, parameter in (model or self.model).named_parameters()}
        for group in list(optimizer.param_groups):
            new = [p for p in group["params"] if self._is_new(names.get(id(p), ""))]
            if new:
                group["params"] = [p for p in group["params"] if all(p is not q for q in new)]
                optimizer.add_param_group({**group, "params": new, "lr": self.args.head_learning_rate})
        return optimizer

    def _is_new(self, parameter_name: str) -> bool:
        return any(module in parameter_name.split(".")[:-1] for module in self.new_modules)
