"""Module attributes that live in other modules, imported on first access (PEP 562 module `__getattr__`).

Used by the old import paths kept for compatibility (`hf_vlalign.data.synthetic`, `hf_vlalign.analysis.plots`, ...)
and by package `__init__` files that re-export names without importing their modules at import time:

    __getattr__, __dir__ = lazy_exports(__name__, default="hf_vlalign.synthetic.scenes",
                                        names={"_Shape": ("hf_vlalign.synthetic.shapes", "Shape")})

The value is cached in the importing module after the first access, so later accesses are plain attribute reads.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def lazy_exports(
    importer: str,
    *,
    default: str | None = None,
    names: Mapping[str, tuple[str, str | None]] | None = None,
    deprecation: str | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for module `importer`.

    Args:
        importer: the `__name__` of the module the functions are installed in.
        default: the module whose attribute of the same name is returned for any name that `names` does not list (a
            dunder name is never looked up there); None: only `names`.
        names: attribute -> (module, name in that module), for the names that are found elsewhere or renamed; with
            None for the name, the attribute is the module itself (a submodule imported on first access).
        deprecation: when given, a `FutureWarning` with this text (`{name}` replaced by the attribute's name) is issued
            at each access of a name; `moved_warning` writes the usual one.
    """
    names = dict(names or {})

    def __getattr__(name: str) -> object:
        if name in names:
            module_name, target = names[name]
        elif default is not None and not (name.startswith("__") and name.endswith("__")):
            module_name, target = default, name
        else:
            raise AttributeError(f"module {importer!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(module_name)
            value = module if target is None else getattr(module, target)
        except AttributeError:
            raise AttributeError(f"module {importer!r} has no attribute {name!r}") from None
        if deprecation is not None:
            warnings.warn(deprecation.replace("{name}", name), FutureWarning, stacklevel=2)
        else:  # cached: the next access is a plain attribute read (a deprecated name is not cached: it warns each time)
            vars(importlib.import_module(importer))[name] = value
        return value

    def __dir__() -> list[str]:
        listed = set(vars(importlib.import_module(importer))) | set(names)
        if default is not None:
            listed |= {name for name in dir(importlib.import_module(default)) if not name.startswith("__")}
        return sorted(listed)

    return __getattr__, __dir__


def moved_warning(old: str, new: str) -> str:
    """The `deprecation` text of a name that moved from module `old` to module `new`."""
    return f"`{old}.{{name}}` moved to `{new}.{{name}}`; the old path will be removed in a future release."


__all__ = ["lazy_exports", "moved_warning"]
