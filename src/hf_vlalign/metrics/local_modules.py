"""The package's `evaluate` metric modules, loaded from their local folders (no Hub access), and their shared info."""

from __future__ import annotations

from pathlib import Path

from ..utils.optional import require

# one folder per module holding a script named after it, modules/<name>/<name>.py, as `evaluate.load` expects
MODULES_DIR = Path(__file__).resolve().parent / "modules"


def load_local_metric(name: str, **kwargs):
    """`evaluate.load` of the module `modules/<name>/<name>.py` of this package."""
    evaluate = require("evaluate", extra="evaluate")

    script = MODULES_DIR / name / f"{name}.py"
    if not script.is_file():
        raise FileNotFoundError(f"The metric module script {name!r} is missing: expected {script}.")
    return evaluate.load(str(script.parent), **kwargs)


def local_metric_info(module_globals: dict, features: dict, codebase_urls=(), reference_urls=()):
    """`evaluate.MetricInfo` from a module's `_DESCRIPTION`, `_CITATION`, `_KWARGS_DESCRIPTION` and its features."""
    import datasets
    import evaluate

    return evaluate.MetricInfo(
        description=module_globals["_DESCRIPTION"],
        citation=module_globals["_CITATION"],
        inputs_description=module_globals["_KWARGS_DESCRIPTION"],
        features=datasets.Features(features),
        codebase_urls=list(codebase_urls),
        reference_urls=list(reference_urls),
    )


__all__ = ["MODULES_DIR", "load_local_metric", "local_metric_info"]
