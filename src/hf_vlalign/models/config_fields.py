"""What every family's config shares about its fields: their types, unknown keys that look like typos of them, the
`config.json` they are read from, and which task-head fields a saved `config.json` keeps.

Types: every field is checked against its annotation whenever it is set (constructor, `from_dict`, `config.json`, a
later assignment), transformers' own fields (`output_hidden_states`, `id2label`, `dtype`, ...) included. A wrong type
raises [`ConfigFieldError`], a `ValueError` naming the field, the type it takes and what came (and the `config.json`
it was read from); a `config.json` that is not a JSON object is named the same way. As in `huggingface_hub`'s strict
dataclasses, a bool is not an int and an int is not a float (numeric fields that take both are `float | int`), so
`2.0` for a layer count is refused rather than silently truncated.

Typos: configs keep unknown keys (they are stored and saved), so a misspelt field would be silently ignored; an
unknown key one typo away from a field (an insertion, deletion, substitution or swap of two neighbours; two for keys of
12 characters or more) is warned about, naming the field meant.

Task-head fields:

One configuration class serves every model class of a family (like `BertConfig`), so it has the fields of every task
head: the VGP classifiers' sizes, the answer vocabulary of the QA head, the pre-training loss weights. A saved config
keeps the fields of the heads it was saved from (`config.architectures`) and drops those only other heads read while
they hold their default, so that a VGP checkpoint's `config.json` says nothing about answers. Nothing is lost: loading
any head from the folder gets the same defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import PreTrainedConfig
from transformers.utils import CONFIG_NAME

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


# ----------------------------------------------------------------------------------------------------------------
# Field types: every field of a family's config is checked against its annotation when it is set (constructor,
# `from_dict`, `config.json`, later assignment), with an error naming the field, what it takes and what came
# ----------------------------------------------------------------------------------------------------------------


class ConfigFieldError(ValueError):
    """A config field of the wrong type, or a `config.json` that is not a JSON object of fields. The message names the
    field (and the file, when the config was read from one); `field` and `file` hold them."""

    def __init__(self, message: str, field: str | None = None, file: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.file = file


@functools.cache
def field_types(config_class: type) -> dict[str, Any]:
    """Field name -> annotation of every dataclass field of `config_class`, transformers' own fields included (their
    annotations are strings, resolved here)."""
    hints = typing.get_type_hints(config_class, localns={"torch": torch, "Literal": Literal})
    return {field.name: hints[field.name] for field in dataclasses.fields(config_class) if field.name in hints}


def matches_type(value: Any, expected: Any) -> bool:
    """Whether `value` has the type `expected` as `huggingface_hub`'s strict dataclasses read it: a bool is not an int,
    an int is not a float (numeric fields that take both say `float | int`), lists and dicts are checked item by item."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if expected is None or expected is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(matches_type(value, arg) for arg in args)
    if origin is Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(matches_type(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            matches_type(key, args[0]) and matches_type(item, args[1]) for key, item in value.items()
        )
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, float)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True  # an annotation this check does not read is left to huggingface_hub's validator


def describe_type(expected: Any) -> str:
    """`expected` in words: "an int", "None or a list of ints", "a number (float or int)"."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is None or expected is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        kinds = [arg for arg in args if arg is not type(None)]
        words = "a number (float or int)" if set(kinds) == {float, int} else " or ".join(map(describe_type, kinds))
        return f"None or {words}" if len(kinds) < len(args) else words
    if origin is Literal:
        return f"one of {list(args)}"
    if origin is list:
        return f"a list of {_plural(args[0])}"
    if origin is dict:
        return f"a dict of {_plural(args[0])} to {_plural(args[1])}"
    return {int: "an int", float: "a float", bool: "a bool (true or false)", str: "a string"}.get(
        expected, f"a {getattr(expected, '__name__', expected)}"
    )


def _plural(expected: Any) -> str:
    return {int: "ints", float: "floats", bool: "bools", str: "strings"}.get(expected, describe_type(expected))


def describe_value(value: Any) -> str:
    """What came, in words: its type and (shortened) value."""
    if value is None:
        return "None (JSON null)"
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def wrong_type_error(config_class: type, name: str, value: Any, expected: Any) -> ConfigFieldError:
    """The [`ConfigFieldError`] of a field `name` given `value` where it takes `expected`."""
    hint = ""
    if expected is int and isinstance(value, float) and value.is_integer():
        hint = f" (write {int(value)}, without a decimal point)"
    elif expected is float and isinstance(value, int) and not isinstance(value, bool):
        hint = f" (write {float(value)})"
    elif isinstance(value, str) and {int, float, bool} & {expected, *typing.get_args(expected)}:
        hint = " (a value in quotes is a string)"
    elif isinstance(value, list):
        item_type = next((typing.get_args(arg)[0] for arg in (expected, *typing.get_args(expected))
                          if typing.get_origin(arg) is list), None)  # fmt: skip
        bad = [i for i, item in enumerate(value) if item_type is not None and not matches_type(item, item_type)]
        if bad:
            hint = f" (item {bad[0]} is {describe_value(value[bad[0]])})"
    return ConfigFieldError(
        f"`{name}` of {config_class.__name__} must be {describe_type(expected)}, got {describe_value(value)}{hint}.",
        field=name,
    )


def check_field_types(config_class: type) -> type:
    """Class decorator (above `@strict`): every assignment of a field is checked against its annotation first, and a
    wrong type raises [`ConfigFieldError`] naming the field, the type it takes and what came. `huggingface_hub`'s
    own validator stays behind it; its errors (not `ValueError`s) are re-raised as `ConfigFieldError` too."""
    strict_setattr = config_class.__setattr__

    def __setattr__(self, name: str, value: Any) -> None:
        name = self.attribute_map.get(name, name)
        expected = field_types(type(self)).get(name)
        if expected is not None and not matches_type(value, expected):
            raise wrong_type_error(type(self), name, value, expected)
        try:
            strict_setattr(self, name, value)
        except StrictDataclassFieldValidationError as error:
            raise ConfigFieldError(f"`{name}` of {type(self).__name__}: {error.__cause__ or error}", field=name) from None

    config_class.__setattr__ = __setattr__
    return config_class


# ----------------------------------------------------------------------------------------------------------------
# Unknown keys one typo away from a field: stored (configs keep unknown keys) but read by nothing, so they are warned about
# ----------------------------------------------------------------------------------------------------------------


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


def close_field(name: str, fields: typing.Iterable[str]) -> str | None:
    """The field `name` is one typo away from (two for names of 12 characters or more), or None."""
    if name.startswith("_"):
        return None
    allowed = 2 if len(name) >= 12 else 1
    distances = sorted((typo_distance(name, field), field) for field in fields if field != name)
    return distances[0][1] if distances and distances[0][0] <= allowed else None


def warn_about_typos(config_class: type, unknown: typing.Iterable[str]) -> list[str]:
    """Warns, for every unknown key that is one typo away from a field of `config_class`, that nothing reads it and
    which field was probably meant; returns those keys."""
    fields = set(field_types(config_class)) | set(config_class.attribute_map)
    typos = []
    for name in unknown:
        if name in fields:
            continue
        field = close_field(name, fields)
        if field is not None:
            logger.warning(
                "%s got the unknown key %r, which no model reads (it is only stored): did you mean %r?",
                config_class.__name__,
                name,
                field,
            )
            typos.append(name)
    return typos


def check_transformers_kwargs(config_class: type, kwargs: dict) -> None:
    """The keys transformers' `PreTrainedConfig.__post_init__` reads from the extra keyword arguments, checked before it
    reads them: `torch_dtype` / a string `dtype` must name a torch dtype."""
    value = kwargs.get("torch_dtype")
    if value is not None and not _is_dtype_name(value):
        raise ConfigFieldError(
            f"`torch_dtype` of {config_class.__name__} must be a torch dtype name such as 'float32', got "
            f"{describe_value(value)}.",
            field="torch_dtype",
        )


def check_dtype_field(config: PreTrainedConfig) -> None:
    if isinstance(config.dtype, str) and not _is_dtype_name(config.dtype):
        raise ConfigFieldError(
            f"`dtype` of {type(config).__name__} must be a torch dtype name such as 'float32', got "
            f"{describe_value(config.dtype)}.",
            field="dtype",
        )


def _is_dtype_name(value: Any) -> bool:
    return isinstance(value, torch.dtype) or (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype))


def check_config_kwargs(config: PreTrainedConfig, kwargs: dict) -> None:
    """Run first in a family config's `__post_init__`: the extra keys transformers reads are checked, and unknown keys
    one typo away from a field are warned about."""
    check_transformers_kwargs(type(config), kwargs)
    check_dtype_field(config)
    warn_about_typos(type(config), kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Reading config.json: a file that is not a JSON object, or a field of the wrong type, is named
# ----------------------------------------------------------------------------------------------------------------


class ConfigFileMixin:
    """Mixed into each family's config (before `PreTrainedConfig`): a `config.json` that is not a JSON object raises
    [`ConfigFieldError`] naming the file, and a field of the wrong type read from one names the field and the file."""

    @classmethod
    def _dict_from_json_file(cls, json_file: str | os.PathLike) -> dict:
        config_dict = super()._dict_from_json_file(json_file)
        if not isinstance(config_dict, dict):
            kind = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
                type(config_dict), "null"
            )
            raise ConfigFieldError(
                f"{json_file}: a config.json must hold a JSON object of fields ({{\"hidden_size\": ..., ...}}), got a "
                f"JSON {kind}.",
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
        raise ConfigFieldError(f"{file}: {error}", field=error.field, file=str(file)) from None
