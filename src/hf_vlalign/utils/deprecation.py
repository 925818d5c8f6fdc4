"""Old import paths kept working after a move: a module's `__getattr__` that forwards each name to its new home and
warns (`FutureWarning`, shown to users by default) naming the new path."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable


def moved_names(old: str, new_module_of: Callable[[str], str | None]) -> Callable[[str], object]:
    """A module `__getattr__` for `old`: a name `new_module_of(name)` places elsewhere is imported from there, with a
    `FutureWarning`; any other name raises the usual AttributeError."""

    def __getattr__(name: str) -> object:
        new = new_module_of(name)
        if new is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name)
        warnings.warn(
            f"`{old}.{name}` moved to `{new}.{name}`; the old path will be removed in a future release.",
            FutureWarning,
            stacklevel=2,
        )
        return value

    return __getattr__


def moved_module(old: str, new: str) -> Callable[[str], object]:
    """A module `__getattr__` for a whole module `old` that moved to `new`."""
    return moved_names(old, lambda name: None if name.startswith("__") else new)
