"""Registration of hf_vlalign's models with transformers' Auto classes, deferred until transformers' auto module loads,
so that `import hf_vlalign` stays light yet `AutoModel.from_pretrained(folder)` finds every hf_vlalign model type.
transformers loads its auto module in the middle of its own imports, so the import of the models waits until the
outermost import of a transformers or hf_vlalign module has finished.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

AUTO_MODULE = "transformers.models.auto"
MODELS_MODULE = "hf_vlalign.models"
WATCHED_PACKAGES = ("transformers", "hf_vlalign")
PROCESSING_MODULE = "hf_vlalign.processing"


def import_models() -> None:
    """Imports `hf_vlalign.models` (which registers the Auto classes), then `hf_vlalign.processing` (which registers
    the processor with AutoProcessor and the "word-region-attention" pipeline), unless imported or being imported."""
    if MODELS_MODULE not in sys.modules:
        importlib.import_module(MODELS_MODULE)
    if PROCESSING_MODULE not in sys.modules:
        importlib.import_module(PROCESSING_MODULE)


class AutoRegistrationFinder(importlib.abc.MetaPathFinder):
    """Finds transformers and hf_vlalign modules with the other finders and counts the imports in progress; when the
    outermost one finishes with transformers' auto module loaded, leaves `sys.meta_path` and imports the models."""

    def __init__(self):
        self.depth = 0  # transformers / hf_vlalign modules being executed

    def find_spec(self, fullname, path, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in WATCHED_PACKAGES:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = None if finder is self or find_spec is None else find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader.exec_module = self.counted(spec.loader.exec_module)
        return spec

    def counted(self, exec_module):
        def exec_then_register(module) -> None:
            self.depth += 1
            try:
                exec_module(module)
            finally:
                self.depth -= 1
            if self.depth == 0 and AUTO_MODULE in sys.modules and self in sys.meta_path:
                sys.meta_path.remove(self)
                import_models()

        return exec_then_register


def register_when_transformers_auto_loads() -> None:
    """Registers the Auto classes now if transformers' auto module is loaded, else once it has loaded."""
    if AUTO_MODULE in sys.modules:
        import_models()
    elif not any(isinstance(finder, AutoRegistrationFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AutoRegistrationFinder())
