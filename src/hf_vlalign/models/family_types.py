"""The types of the family registry (`FamilySpec`, `ModelSpec`, `ModelCardSpec`) and the constants they use; the
registry itself, `FAMILIES` and `family_spec`, is `hf_vlalign.models.family`. The families' specs import this
module, the registry imports the specs: the imports run one way."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["LIBRARY_AUTO_CLASSES", "SUPERVISION_FIELDS", "FamilySpec", "ModelCardSpec", "ModelSpec"]

# the Auto classes hf_vlalign defines itself (`hf_vlalign.models.auto`); every other Auto class a spec names is
# transformers' own
LIBRARY_AUTO_CLASSES = (
    "AutoModelForPhraseGrounding",
    "AutoModelForReferringExpression",
    "AutoModelForRegionCaptioning",
    "AutoModelForVisualParaphrase",
    "AutoModelForVisualReasoning",
)
# the attention-supervision fields of the configurations that have attention supervision (single- and two-stream)
SUPERVISION_FIELDS = ("attention_supervision", "supervised_layers", "supervised_heads", "attention_supervision_weight")


@dataclass(frozen=True)
class ModelSpec:
    """One model class of a family: its name, the Auto classes it is registered with, the tasks `hf-vlalign evaluate`
    evaluates it on, and its task-head modules (trained in full and saved with a LoRA adapter)."""

    class_name: str
    auto_classes: tuple[str, ...]  # registered with each, in order; the first is the one the model cards show
    tasks: tuple[str, ...] = ()  # `hf-vlalign evaluate --task` values this class is evaluated on
    head_modules: tuple[str, ...] = ()  # the task heads, new on the task (`lora.HEAD_MODULES`)

    @property
    def auto_class(self) -> str:
        """The Auto class that loads this model class (the first registered)."""
        return self.auto_classes[0]

    @property
    def transformers_auto_class(self) -> str | None:
        """The first of `auto_classes` that transformers defines (the one remote code publishes), None if none."""
        return next((name for name in self.auto_classes if name not in LIBRARY_AUTO_CLASSES), None)


@dataclass(frozen=True)
class ModelCardSpec:
    """What the family's Hub model card (`model_cards/<template>.md`, `render_model_card`) says about it."""

    template: str  # `model_cards/<template>.md`
    task_type: str  # the `model-index` task of the family card
    task_name: str
    tags: tuple[str, ...]  # the family card's tags (before the family name and "hf_vlalign")
    settings: tuple[str, ...]  # config fields shown in the card's settings table
    default_name: str  # the model name without a model id; formatted with `supervision`, `alignment` and `fusion`
    # its tags in the task cards (`model_cards/task.md`, `render_task_model_card`); None: the family has no task cards
    task_card_tags: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FamilySpec:
    """One model family: its names, configuration and model classes (with their Auto classes), the input keys and
    attention shape the analyses read, its model card and its LoRA target modules."""

    name: str  # short name: "single_stream", "two_stream", "captioner"
    model_type: str  # the configuration's `model_type`
    config_module: str  # module of the configuration class (also the remote-code file `<last name>.py`)
    config_class: str
    modeling_module: str  # module of the model classes (also the remote-code file `<last name>.py`)
    models: Mapping[str, ModelSpec]  # model kind ("base", "question_answering", ...) -> model class; "base" first
    text_mask_key: str  # the batch key of the text tokens' mask that the attention rows are read over
    region_mask_key: str  # the batch key of the regions' mask
    probe_layers_field: str  # config field: the layers of the text->region attention the grounding probe reads
    probe_heads_field: str  # config field: the heads of each of those layers
    layer_fields: tuple[str, ...]  # config fields counting the layers of each stack
    attention_supervision: bool  # whether the configuration has the attention-supervision fields
    card: ModelCardSpec
    lora_attention: tuple[str, ...]  # LoRA preset "attention": the attention projections (peft name suffixes)
    lora_ffn: tuple[str, ...]  # added by the preset "attention_ffn": the feed-forward layers

    def __post_init__(self):
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))  # read-only, as the rest of the spec

    @property
    def base_model(self) -> ModelSpec:
        """The family's base model (no task head), published as `AutoModel`."""
        return self.models["base"]

    @property
    def tasks(self) -> tuple[str, ...]:
        """The `hf-vlalign evaluate` tasks of the family's model classes, in their order."""
        return tuple(dict.fromkeys(task for model in self.models.values() for task in model.tasks))

    def model(self, kind: str) -> ModelSpec:
        """The model class of `kind` ("base", "question_answering", ...)."""
        if kind not in self.models:
            raise ValueError(
                f"`kind` must be one of the {self.name} family's models {tuple(self.models)}, got {kind!r}."
            )
        return self.models[kind]

    def probe_shape(self, model_or_config: Any) -> tuple[int, int]:
        """(layers, heads) of the text->region attention the grounding probe reads, from a config or a model."""
        config = getattr(model_or_config, "config", model_or_config)
        return getattr(config, self.probe_layers_field), getattr(config, self.probe_heads_field)

    def config_class_object(self) -> type:
        """The configuration class (imports the family's configuration module)."""
        return getattr(importlib.import_module(self.config_module), self.config_class)

    def model_class_object(self, kind: str = "base") -> type:
        """The model class of `kind` (imports the family's modeling module)."""
        return getattr(importlib.import_module(self.modeling_module), self.model(kind).class_name)
