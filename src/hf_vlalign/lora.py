"""LoRA (or any PEFT method on Linear layers) for the three model families and for transformers' patch models (LLaVA,
PaliGemma, ViLT): `lora_config` builds a `peft.LoraConfig` from the model.

The library's families: target modules are the family's `FamilySpec.lora_attention` (plus `lora_ffn` for the
"attention_ffn" preset), `modules_to_save` the model class's task heads and the supervision modules its config switches
on. Patch models: the language model's layers only (ViLT: its encoder's), never the vision tower or the projector,
whose projections bear the same names (`q_proj`, ...), so the target is a regex over the full module names built from
the model (`patch_lora_target_modules`); no `modules_to_save`.

The projections are plain `nn.Linear`s, so the rest of peft works as for any transformers model; leave `task_type`
unset, and give the A2 mask optimiser only the `mask_parameters()` with `requires_grad` (peft keeps a frozen original
of the `modules_to_save`). See docs/training.md.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel

from .models.family import FAMILIES
from .utils.optional import require
from .vlms.families import PATCH_MODEL_TYPES, patch_model_family

if TYPE_CHECKING:
    from peft import LoraConfig

# model_type -> family key of the tables below (the families' `FamilySpec`s, `hf_vlalign.models.family`)
MODEL_TYPE_TO_FAMILY = {spec.model_type: name for name, spec in FAMILIES.items()}

# family -> preset -> target modules: each family's `FamilySpec.lora_attention` (+ `lora_ffn` for "attention_ffn")
LORA_TARGET_MODULES: dict[str, dict[str, list[str]]] = {
    name: {"attention": list(spec.lora_attention), "attention_ffn": [*spec.lora_attention, *spec.lora_ffn]}
    for name, spec in FAMILIES.items()
}

# model class -> its task heads, newly trained on the task: trained in full and saved with the adapter
# (`ModelSpec.head_modules` of every family's model classes)
HEAD_MODULES: dict[str, list[str]] = {
    model.class_name: list(model.head_modules) for spec in FAMILIES.values() for model in spec.models.values()
}

# supervision modules that exist only when the config switches them on, trained in full and saved with the adapter
SUPERVISION_MODULES: dict[str, list[str]] = {
    "indirect": ["indirect_grounding_head"],  # `attention_supervision="indirect"` (single- and two-stream)
    "a2": ["perturbation.mask_network"],  # `attention_alignment` != "none"
    "a2_regions": ["perturbation.region_network"],  # and `alignment_mask_input="query_and_regions"`
    "a2_gate": ["perturbation.gate"],  # `attention_alignment="gate"`
}

LORA_PRESETS = ("attention", "attention_ffn")


def patch_lora_target_modules(model: PreTrainedModel, preset: str = "attention") -> str:
    """A peft `target_modules` regex (matched in full against each module name) of a transformers patch model: in every
    layer of the language model (ViLT: of the encoder), the `nn.Linear`s of the attention block ("attention": LLaVA's
    and PaliGemma's `self_attn.{q,k,v,o}_proj`, ViLT's `attention.attention.{query,key,value}` and
    `attention.output.dense`), plus the layer's other `nn.Linear`s for "attention_ffn" (the MLP). The vision tower and
    the projector are not matched."""
    if preset not in LORA_PRESETS:
        raise ValueError(f"`preset` must be one of {list(LORA_PRESETS)}, got {preset!r}.")
    family = patch_model_family(model)
    names = {module: name for name, module in model.named_modules()}
    # e.g. "model.language_model.layers.0.self_attn" or "encoder.layer.0.attention.attention": the stack of layers,
    # the layer's index, then the layer's child holding the attention
    parts = names[family.attention_modules(model)[0]].split(".")
    index = next(position for position, part in enumerate(parts) if part.isdigit())
    stack, block = ".".join(parts[:index]), parts[index + 1]
    layer = model.get_submodule(".".join(parts[: index + 1]))
    linear = [name for name, module in layer.named_modules() if isinstance(module, torch.nn.Linear)]
    targets = [name for name in linear if name.startswith(f"{block}.") or preset == "attention_ffn"]
    return rf"{re.escape(stack)}\.\d+\.({'|'.join(re.escape(name) for name in targets)})"


def _modules_to_save(model: PreTrainedModel, model_class: str) -> list[str]:
    config = model.config
    modules = list(HEAD_MODULES[model_class])
    if getattr(config, "attention_supervision", "none") == "indirect":
        modules += SUPERVISION_MODULES["indirect"]
    alignment = getattr(config, "attention_alignment", "none")
    if alignment != "none":
        modules += SUPERVISION_MODULES["a2"]
        if getattr(config, "alignment_mask_input", "query") == "query_and_regions":
            modules += SUPERVISION_MODULES["a2_regions"]
        if alignment == "gate":
            modules += SUPERVISION_MODULES["a2_gate"]
    return modules


def lora_config(
    model: PreTrainedModel,
    r: int = 8,
    alpha: int = 16,
    dropout: float = 0.0,
    preset: str = "attention",
    **kwargs: Any,
) -> LoraConfig:
    """A `peft.LoraConfig` for `model`: the `LORA_TARGET_MODULES[family][preset]` as `target_modules` and the model's
    task heads and enabled supervision modules as `modules_to_save`; for a transformers patch model,
    `patch_lora_target_modules(model, preset)` and no `modules_to_save` (see the module docstring).

    Args:
        model: a model of this library or a transformers LLaVA / PaliGemma / ViLT model (the base model, before
            `get_peft_model`); the family comes from `model.config.model_type`, the heads from its class (or the
            nearest library class it subclasses).
        r: LoRA rank.
        alpha: LoRA scaling numerator (`lora_alpha`; the update is scaled by alpha / r).
        dropout: dropout on the LoRA input (`lora_dropout`).
        preset: "attention" (query/key/value/output projections) or "attention_ffn" (also the feed-forward layers);
            of a patch model, the language model's only.
        kwargs: any other `LoraConfig` field; `target_modules` or `modules_to_save` given here replace the defaults.

    Returns:
        a `LoraConfig` to pass to `peft.get_peft_model(model, config)`.
    """
    peft = require("peft", extra="peft")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in PATCH_MODEL_TYPES:
        kwargs.setdefault("target_modules", patch_lora_target_modules(model, preset))
        return peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, **kwargs)
    if model_type not in MODEL_TYPE_TO_FAMILY:
        raise ValueError(
            f"`model` must be a model of hf_vlalign with config.model_type in {sorted(MODEL_TYPE_TO_FAMILY)} or one "
            f"of transformers' patch models ({', '.join(PATCH_MODEL_TYPES)}), got {type(model).__name__} with "
            f"model_type {model_type!r}."
        )
    family = MODEL_TYPE_TO_FAMILY[model_type]
    if preset not in LORA_TARGET_MODULES[family]:
        raise ValueError(f"`preset` must be one of {sorted(LORA_TARGET_MODULES[family])}, got {preset!r}.")
    model_class = next((cls.__name__ for cls in type(model).__mro__ if cls.__name__ in HEAD_MODULES), None)
    if model_class is None:
        raise ValueError(
            f"`model` must be one of (or subclass) {sorted(HEAD_MODULES)}, got {type(model).__name__}; pass "
            "`modules_to_save` for its new heads and build the `LoraConfig` yourself."
        )
    kwargs.setdefault("target_modules", list(LORA_TARGET_MODULES[family][preset]))
    kwargs.setdefault("modules_to_save", _modules_to_save(model, model_class) or None)
    return peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, **kwargs)


__all__ = [
    "HEAD_MODULES",
    "LORA_PRESETS",
    "LORA_TARGET_MODULES",
    "MODEL_TYPE_TO_FAMILY",
    "SUPERVISION_MODULES",
    "lora_config",
    "patch_lora_target_modules",
]
