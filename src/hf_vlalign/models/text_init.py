"""Initialising a vision-and-language model's text side from a BERT-family checkpoint (shared by the families)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers.utils import logging

from ..utils.text_model import default_text_model_path

logger = logging.get_logger(__name__)

# the BERT fields a text checkpoint fixes when it initialises the text side
TEXT_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)


def text_config_fields(name_or_path: str, fields: Sequence[str], config_overrides: dict) -> dict:
    """The `fields` of a BERT-family checkpoint's config; raises when it lacks one or an override contradicts it."""
    text_config = AutoConfig.from_pretrained(name_or_path)
    missing = [field for field in fields if not hasattr(text_config, field)]
    if missing:
        raise ValueError(
            f"`name_or_path` must be a BERT-family checkpoint; {name_or_path!r} (model_type "
            f"{text_config.model_type!r}) lacks the config fields {missing}."
        )
    fixed = {field: getattr(text_config, field) for field in fields}
    clashing = {k: v for k, v in config_overrides.items() if k in fixed and v != fixed[k]}
    if clashing:
        raise ValueError(
            f"`config_overrides` may not change the text architecture of {name_or_path!r}: got {clashing}, "
            f"the checkpoint has { {k: fixed[k] for k in clashing} }."
        )
    return fixed


def load_text_model(name_or_path: str | None) -> tuple[str, PreTrainedModel]:
    """(resolved path, the BERT-family encoder) for `name_or_path` (default: the packaged MiniLM)."""
    name_or_path = str(name_or_path or default_text_model_path())
    return name_or_path, AutoModel.from_pretrained(name_or_path)


def copy_module_weights(target: nn.Module, source: nn.Module | None, name: str) -> None:
    """Loads `source`'s tensors into `target`; raises naming every missing or mis-shaped tensor."""
    if source is None:
        raise ValueError(f"The text checkpoint has no `{name}` module to copy.")
    own, theirs = target.state_dict(), source.state_dict()
    missing = sorted(set(own) - set(theirs))
    shapes = {
        k: (tuple(own[k].shape), tuple(theirs[k].shape)) for k in own if k in theirs and own[k].shape != theirs[k].shape
    }
    if missing or shapes:
        raise ValueError(
            f"Cannot copy `{name}` from the text checkpoint: missing {missing}, shape mismatches {shapes}."
        )
    target.load_state_dict({k: theirs[k] for k in own})


def copy_pooler_weights(target: nn.Module, text_model: nn.Module) -> None:
    """Copies the BERT pooler when the checkpoint has one (sentence-embedding exports may not)."""
    if getattr(text_model, "pooler", None) is None:
        logger.warning("The text checkpoint has no pooler; `pooler` stays newly initialised.")
        return
    copy_module_weights(target, text_model.pooler, "pooler")
