"""Fine-tuning of transformers' own patch vision-language models (ViLT, LLaVA, PaliGemma) with Samaran et al.'s
attention supervision on chosen layers and heads (`hf_vlalign.vlms`), the model's code untouched."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.trainer_utils import unwrap_peft_model

from ..utils.item_counts import count_labeled
from ..vlms.families import NON_MODEL_KEYS, forward_with_layout, patch_model_family
from ..vlms.recording import AttentionRecorder, check_recordable
from ..vlms.supervision import (
    PATCH_SUPERVISION_METHODS,
    SEMI_DIRECT_ROLLOUTS,
    grounded_cell_count,
    grounded_token_count,
    patch_attention_loss,
)
from .base import ComponentLossTrainer, ComponentLossTrainingArguments, check_bounds

__all__ = ["PatchSupervisionTrainer", "PatchSupervisionTrainingArguments"]


@dataclass
class PatchSupervisionTrainingArguments(ComponentLossTrainingArguments):
    r"""
    [`TrainingArguments`] of [`PatchSupervisionTrainer`]: Samaran et al.'s supervision (`hf_vlalign.vlms.supervision`)
    of chosen layers of the language model (ViLT: of the encoder; default: the last) and heads (default: all).
    `remove_unused_columns` must stay False: `PatchGroundingCollator` reads the examples' image, caption and phrases.
    """

    attention_supervision: str | None = field(
        default=None, metadata={"help": "Attention supervision: direct, semi_direct or None (task loss only)."}
    )
    supervised_layers: list[int] | None = field(
        default=None, metadata={"help": "Supervised layers of the language model / encoder (default: the last)."}
    )
    supervised_heads: list[int] | None = field(default=None, metadata={"help": "Supervised heads (default: all)."})
    attention_supervision_weight: float = field(default=1.0, metadata={"help": "Weight (>= 0) of loss_attention."})
    semi_direct_rollout: str = field(
        default="supervised_rows",
        metadata={
            "help": "How semi-direct supervision computes attention rollout: 'supervised_rows' (default: only the rows "
            "the loss reads, memory linear in the sequence) or 'full' (every layer's N x N maps and rollout); the same "
            "loss and gradients (`hf_vlalign.vlms.supervision.patch_attention_loss`)."
        },
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Must stay False: the collator reads the examples' image, caption and phrases."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.remove_unused_columns:
            raise ValueError(
                "`remove_unused_columns` must be False for PatchSupervisionTrainer, got True: the collator reads the "
                "examples' image, caption and phrases, which are no arguments of the model's forward."
            )
        if self.attention_supervision is not None and self.attention_supervision not in PATCH_SUPERVISION_METHODS:
            raise ValueError(
                f"`attention_supervision` must be one of {PATCH_SUPERVISION_METHODS} or None, got "
                f"{self.attention_supervision!r}."
            )
        if self.semi_direct_rollout not in SEMI_DIRECT_ROLLOUTS:
            raise ValueError(
                f"`semi_direct_rollout` must be one of {SEMI_DIRECT_ROLLOUTS}, got {self.semi_direct_rollout!r}."
            )
        check_bounds(self, attention_supervision_weight=(">=", 0))
        reentrant = (self.activation_checkpointing_kwargs or {}).get("use_reentrant", False)
        if self.attention_supervision is not None and self.activation_checkpointing and reentrant:
            # a reentrant checkpoint runs the layers' forward without autograd: the recorded query / key would carry
            # no gradient, and the supervision would train nothing, silently
            raise ValueError(
                "`activation_checkpointing_kwargs` must not set `use_reentrant: True` with `attention_supervision`, "
                f"got {self.activation_checkpointing_kwargs}: the recorded attention would carry no gradient. Leave "
                "it unset (transformers' default is non-reentrant checkpointing)."
            )
        for name in ("supervised_layers", "supervised_heads"):
            value = getattr(self, name)
            if value is not None and (not value or min(value) < 0):
                raise ValueError(f"`{name}` must be a non-empty list of indices >= 0 or None, got {value!r}.")


class PatchSupervisionTrainer(ComponentLossTrainer):
    """`Trainer` of a transformers patch model on `PatchGroundingCollator` batches: the model's own task loss
    (`loss_task`: LLaVA's / PaliGemma's language-model loss on the caption, or a ViLT head's loss) plus
    `attention_supervision_weight * loss_attention`, the attention recorded by an `AttentionRecorder` (LLaVA and
    PaliGemma keep the attention implementation they were loaded with, docs/vlms.md). Both are normalised by global
    counts (caption label tokens, grounded tokens).
    """

    args_class = PatchSupervisionTrainingArguments
    loss_component_keys = ("loss_task", "loss_attention")
    non_model_keys = NON_MODEL_KEYS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        model = self._plain_model()
        self.family = patch_model_family(model)
        if self.args.attention_supervision is not None:
            check_recordable(model)
        num_layers = len(self.family.attention_modules(model))
        num_heads = self.family.num_heads(model)
        layers = self.args.supervised_layers or [num_layers - 1]
        for name, values, limit in (
            ("supervised_layers", layers, num_layers),
            ("supervised_heads", self.args.supervised_heads, num_heads),
        ):
            if values is not None and max(values) >= limit:
                raise ValueError(f"`{name}` must hold indices below {limit} for this model, got {values}.")
        self.supervised_layers = sorted(set(layers))
        recorded = self.supervised_layers if self.args.attention_supervision == "direct" else range(max(layers) + 1)
        self.recorded_layers = list(recorded)

    def _plain_model(self):
        return unwrap_peft_model(self.accelerator.unwrap_model(self.model))

    def batch_item_counts(self, inputs) -> dict[str, torch.Tensor]:
        labels = inputs.get("labels")
        # causal language models predict token t + 1 from t: the first label is never a target
        label_tokens = (
            count_labeled(labels[:, 1:]) if labels is not None and self.family.name != "vilt" else count_labeled(labels)
        )
        alignment = inputs["word_cell_alignment"]
        return {
            "label_tokens": label_tokens,
            "grounded_words": grounded_token_count(alignment),
            "grounded_cells": grounded_cell_count(alignment),
        }

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        counts = self._step_item_counts if model.training else self.evaluation_item_counts(inputs)
        supervised = self.args.attention_supervision is not None
        task_kwargs = {}
        if inputs.get("labels") is not None and self.family.name != "vilt":
            task_kwargs["num_items_in_batch"] = counts["label_tokens"]
        if supervised:
            with AttentionRecorder(self._plain_model(), self.recorded_layers) as recorder:
                outputs, layout = forward_with_layout(model, inputs, plain_model=self._plain_model(), **task_kwargs)
            loss_attention = patch_attention_loss(
                recorder,
                inputs,
                layout,
                self.args.attention_supervision,
                self.supervised_layers,
                self.args.supervised_heads,
                num_rows=counts["grounded_words"],
                num_image_rows=counts["grounded_cells"],
                semi_direct_rollout=self.args.semi_direct_rollout,
            )
            recorder.clear()
        else:
            outputs, layout = forward_with_layout(model, inputs, plain_model=self._plain_model(), **task_kwargs)
            loss_attention = None
        components = {"loss_task": outputs.get("loss"), "loss_attention": loss_attention}
        loss = sum(
            value * (self.args.attention_supervision_weight if key == "loss_attention" else 1.0)
            for key, value in components.items()
            if value is not None
        )
        loss = self._scale_to_global("train" if model.training else "eval", loss, components, True)
        if not model.training:
            self._record_evaluation_loss(loss, True)
        return (loss, outputs) if return_outputs else loss
