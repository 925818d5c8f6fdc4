"""What every family's config adds to transformers' strict dataclass configs (`@strict` checks each field against its
annotation, the `validate_*` class validators ranges and consistency): the errors as one-line [`ConfigFieldError`]s
naming the `config.json` read, the fields transformers annotates as strings checked too, a warning for an unknown key
one typo away from a field, and a saved `config.json` without the default-valued fields of other task heads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.dataclasses import type_validator
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig
from transformers.utils import CONFIG_NAME

from .dropout import DROPOUT_IMPLEMENTATIONS
from .visual_features import NORMALIZATION_FIELD, VISUAL_FEATURE_NORMALIZATIONS

logger = logging.getLogger(__name__)


def drop_other_head_fields(
    config: PreTrainedConfig, config_dict: dict, head_fields: dict[str, tuple[str, ...]]
) -> dict:
    """`config_dict` (what `config.json` gets) without the fields that only model classes other than
    `config.architectures` read, where they hold the class default. `head_fields` maps each model class of the family
    to the fields only it reads; a config of another architecture, or of none (a config saved on its own), keeps every
    field."""
    architectures = config.architectures or []
    if not architectures or any(name not in head_fields for name in architectures):
        return config_dict
    used = {name for architecture in architectures for name in head_fields[architecture]}
    unused = {name for fields in head_fields.values() for name in fields} - used
    return {
        key: value
        for key, value in config_dict.items()
        if key not in unused or value != getattr(type(config), key)
    }


class ConfigFieldError(ValueError):
    """A config field of the wrong type or value, or a `config.json` that is not a JSON object of fields; `file` names
    the `config.json` it was read from, if any."""

    def __init__(self, message: str, file: str | None = None) -> None:
        super().__init__(message)
        self.file = file


def value_errors(config_class: type) -> type:
    """Class decorator (above `@strict`): huggingface_hub's validation errors, of a field assignment or of a class
    validator, are raised as one-line [`ConfigFieldError`]s naming the field."""
    strict_setattr, strict_validate = config_class.__setattr__, config_class.validate

    def __setattr__(self, name: str, value: Any) -> None:
        try:  # a generic name of the attribute map is checked as the field it stands for
            strict_setattr(self, self.attribute_map.get(name, name), value)
        except StrictDataclassError as error:
            raise ConfigFieldError(f"{type(self).__name__}: {error.__cause__}.") from None

    def validate(self) -> None:
        try:
            strict_validate(self)
        except StrictDataclassError as error:
            raise ConfigFieldError(str(error.__cause__)) from None

    validate.__is_defined_by_strict_decorator__ = True
    config_class.__setattr__, config_class.validate = __setattr__, validate
    return config_class


def check_extra_keys(config: PreTrainedConfig, kwargs: dict) -> None:
    """Run first in a family config's `__post_init__`: the fields `@strict` leaves unchecked are type-checked, a dtype
    name that torch does not know is refused (transformers' `__post_init__` would look it up), and a key one typo away
    from a field is warned about."""
    for name, annotation in _string_annotated_fields(type(config)).items():
        try:
            type_validator(name, getattr(config, name), annotation)
        except TypeError as error:
            raise ConfigFieldError(f"{type(config).__name__}: {error}.") from None
    for name, value in (("dtype", config.dtype), ("torch_dtype", kwargs.get("torch_dtype"))):
        if isinstance(value, str) and not isinstance(getattr(torch, value, None), torch.dtype):
            raise ConfigFieldError(
                f"`{name}` of {type(config).__name__} must be a torch dtype name such as 'float32', got {value!r}."
            )
    fields = {field.name for field in dataclasses.fields(config)} | set(config.attribute_map)
    for name in kwargs:
        meant = close_field(name, fields)
        if meant is not None:
            logger.warning(
                "%s got the unknown key %r, which no model reads (it is only stored): did you mean %r?",
                type(config).__name__,
                name,
                meant,
            )


@functools.cache
def _string_annotated_fields(config_class: type) -> dict[str, Any]:
    """The fields whose annotation is a string (`PreTrainedConfig`'s own, its module using postponed annotations),
    which `@strict` skips, with the annotation resolved."""
    hints = typing.get_type_hints(config_class, localns={"torch": torch})
    return {field.name: hints[field.name] for field in dataclasses.fields(config_class) if isinstance(field.type, str)}


def close_field(name: str, fields: Iterable[str]) -> str | None:
    """The field `name` is one typo away from (two for names of 12 characters or more), or None."""
    if name.startswith("_") or name in fields:
        return None
    allowed = 2 if len(name) >= 12 else 1
    distance, field = min((typo_distance(name, field), field) for field in fields)
    return field if distance <= allowed else None


def typo_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps of two neighbours, one each."""
    previous2, previous = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[len(b)]


class ConfigFileMixin:
    """Mixed into each family's config (before `PreTrainedConfig`): the extra keys are checked (`check_extra_keys`), a
    refusal of a config read from a file names the file, a `config.json` that is not a JSON object is refused, and a
    saved `config.json` keeps the task fields of the other model classes of `_head_fields` only where not at the
    default (`drop_other_head_fields`)."""

    _head_fields: dict[str, tuple[str, ...]] = {}  # model class -> the fields only it reads

    def __post_init__(self, **kwargs):
        check_extra_keys(self, kwargs)
        super().__post_init__(**kwargs)

    def to_diff_dict(self) -> dict:
        return drop_other_head_fields(self, super().to_diff_dict(), self._head_fields)

    @classmethod
    def _dict_from_json_file(cls, json_file: str | os.PathLike) -> dict:
        config_dict = super()._dict_from_json_file(json_file)
        if not isinstance(config_dict, dict):
            raise ConfigFieldError(
                f"{json_file}: a config.json must hold a JSON object of fields ({{\"hidden_size\": ..., ...}}), got a "
                f"JSON {'null' if config_dict is None else type(config_dict).__name__}.",
                file=str(json_file),
            )
        return config_dict

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        # `AutoConfig` / `AutoModel.from_pretrained` come here with the folder as `name_or_path`
        source = kwargs.get("name_or_path")
        if not isinstance(source, (str, os.PathLike)) or not str(source):
            return super().from_dict(config_dict, **kwargs)
        with naming_config_file(config_file_of(source)):
            return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike):
        with naming_config_file(json_file):
            return super().from_json_file(json_file)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        with naming_config_file(config_file_of(pretrained_model_name_or_path, kwargs.get("subfolder") or "")):
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


def config_file_of(pretrained_model_name_or_path: str | os.PathLike, subfolder: str = "") -> str:
    """The `config.json` a `from_pretrained(pretrained_model_name_or_path)` reads, for error messages."""
    path = Path(pretrained_model_name_or_path)
    if path.is_file():
        return str(path)
    if path.is_dir():
        return str(path / subfolder / CONFIG_NAME)
    return f"{pretrained_model_name_or_path}/{subfolder + '/' if subfolder else ''}{CONFIG_NAME}"


@contextlib.contextmanager
def naming_config_file(file: str | os.PathLike):
    """Adds `file` to a [`ConfigFieldError`] raised inside that does not name a file yet."""
    try:
        yield
    except ConfigFieldError as error:
        if error.file is not None:
            raise
        raise ConfigFieldError(f"{file}: {error}", file=str(file)) from None


def require_choice(config: PreTrainedConfig, name: str, choices: tuple[str, ...]) -> None:
    """Class-validator helper: refuses a field whose value is not one of `choices`."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


def require_family_choices(config: PreTrainedConfig) -> None:
    """Class-validator helper: the choices every family's config has (`dropout_implementation`,
    `visual_feature_normalization`)."""
    require_choice(config, "dropout_implementation", DROPOUT_IMPLEMENTATIONS)
    require_choice(config, NORMALIZATION_FIELD, VISUAL_FEATURE_NORMALIZATIONS)


def require_at_least(config: PreTrainedConfig, minimum: int, *names: str) -> None:
    """Class-validator helper: refuses a count field below `minimum`."""
    for name in names:
        if getattr(config, name) < minimum:
            raise ValueError(f"`{name}` must be >= {minimum}, got {getattr(config, name)}.")


def require_heads_divide(config: PreTrainedConfig, size_name: str, *heads_names: str) -> None:
    """Class-validator helper: each attention-head count is >= 1 and divides the hidden size `size_name`."""
    size = getattr(config, size_name)
    for heads_name in heads_names:
        heads = getattr(config, heads_name)
        if heads < 1 or size % heads != 0:
            raise ValueError(f"`{size_name}` ({size}) must be a multiple of `{heads_name}` ({heads}).")


def require_iou_threshold(config: PreTrainedConfig) -> None:
    """Class-validator helper: `referring_iou_threshold` is in (0, 1]."""
    if not 0 < config.referring_iou_threshold <= 1:
        raise ValueError(f"`referring_iou_threshold` must be in (0, 1], got {config.referring_iou_threshold}.")
