"""Renamed fields of model outputs, still readable under their former names with a `FutureWarning`.

transformers keeps a renamed output key readable the same way (`ModelOutput` maps `past_key_values` to `cache` in
`__getitem__`, `get` and `__contains__`, with a property for attribute access): the former name is no field, so
`keys()`, `to_tuple()` and the tuple positions hold the new name only, in the old one's place.
"""

from __future__ import annotations

import warnings
from typing import ClassVar


class RenamedFieldsMixin:
    """Mixed into a `ModelOutput` dataclass (before `ModelOutput` in its bases): each former field name of
    `_renamed_fields` (`{"old": "new"}`) reads the new field, as `outputs.old`, `outputs["old"]`,
    `outputs.get("old")` and `"old" in outputs`, with a `FutureWarning` naming the new one."""

    _renamed_fields: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in cls._renamed_fields.items():
            setattr(cls, old, _former_name_property(old, new))

    def _current_field_name(self, key):
        """The field a (possibly former) key names; a `FutureWarning` for a former one."""
        new = self._renamed_fields.get(key) if isinstance(key, str) else None
        if new is None:
            return key
        warnings.warn(f"`{type(self).__name__}.{key}` is deprecated; use `{new}`.", FutureWarning, stacklevel=3)
        return new

    def __getitem__(self, key):
        return super().__getitem__(self._current_field_name(key))

    def __contains__(self, key) -> bool:
        return super().__contains__(self._current_field_name(key))

    def get(self, key, default=None):
        return super().get(self._current_field_name(key), default)


def _former_name_property(old: str, new: str) -> property:
    def read(self):
        return getattr(self, self._current_field_name(old))

    return property(read, doc=f"Deprecated name of `{new}` (a `FutureWarning`).")
