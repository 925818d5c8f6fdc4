"""Imports a script of examples/ (not a package) as a module, for the benchmarks that call its `main()` or functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_example(path: Path) -> ModuleType:
    """`path` executed as the module named by its stem (registered in sys.modules, so dataclasses find it)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
