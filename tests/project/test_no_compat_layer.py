"""The library is 0.x and keeps no compatibility layer: one import path per object, one name per loss.

- importing every module of the package (and reading every name of its `__all__`) raises no `FutureWarning` or
  `DeprecationWarning` from hf_vlalign code (checked in a fresh process, where every import really runs);
- no module issues a `FutureWarning` or re-exports lazily (`lazy_exports`), and no alias module or alias name exists;
- each loss has one name `<name>`: every `<name>_weight` field of a family's configuration weighs the output field
  `loss_<name>` of the family's outputs, which the trainers log under the same key, and every `loss_<name>` field of
  an output or log key of a trainer has that weight (or is a main loss without one).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hf_vlalign
from hf_vlalign.models.family import FAMILIES
from hf_vlalign.trainers.base import ComponentLossTrainer

SRC = Path(hf_vlalign.__file__).resolve().parent

# the alias modules that are gone, with the one path of what they re-exported
REMOVED_MODULES = {
    "hf_vlalign.trainers.grounding_evaluation": "hf_vlalign.evaluation.grounding",
    "hf_vlalign.trainers.image_use": "hf_vlalign.evaluation.image_use",
    "hf_vlalign.trainers.model_analysis": "hf_vlalign.evaluation.model_analysis",
    "hf_vlalign.trainers.model_explorer": "hf_vlalign.evaluation.model_explorer",
    "hf_vlalign.trainers.recipes": "hf_vlalign.recipes",
    "hf_vlalign.trainers.syntactic_analysis": "hf_vlalign.evaluation.syntactic_analysis",
    "hf_vlalign.trainers.task_evaluation": "hf_vlalign.evaluation.tasks",
    "hf_vlalign.trainers.task_metrics": "hf_vlalign.evaluation.task_metrics",
    "hf_vlalign.data.synthetic": "hf_vlalign.synthetic.scenes",
    "hf_vlalign.data.synthetic_questions": "hf_vlalign.synthetic.questions",
    "hf_vlalign.data.synthetic_tasks": "hf_vlalign.synthetic.tasks",
    "hf_vlalign.analysis.plots": "hf_vlalign.analysis.attention_plots",
    "hf_vlalign.hub.push": "hf_vlalign.hub",
    "hf_vlalign.utils.lazy_exports": None,
    "hf_vlalign.models.renamed_fields": None,
}
# alias names that are gone from modules that stay: (module, name)
REMOVED_NAMES = [
    ("hf_vlalign.trainers", "evaluate_grounding"),
    ("hf_vlalign.trainers", "image_use_gap"),
    ("hf_vlalign.data", "SyntheticSceneConfig"),
    ("hf_vlalign.data", "load_or_generate_synthetic_vgp"),
    ("hf_vlalign.data", "generate_synthetic_vgp"),
    ("hf_vlalign.synthetic", "generate_synthetic_vgp"),
    ("hf_vlalign.analysis", "attention_rollout"),
    ("hf_vlalign.trainers.base", "LOSS_LOG_KEY_FIELDS"),
]
# losses without a config weight: each is the main loss of its model (weight 1)
MAIN_LOSSES = {"loss_task", "loss_caption"}
# losses the trainers compute themselves, weighted by a trainer setting rather than a model config field
TRAINER_LOSSES = {"loss_distill", "loss_ewc", "loss_scst"}

IMPORT_EVERYTHING = r"""
import importlib, json, pkgutil, sys, warnings

src = sys.argv[1]
raised = []
original_warn = warnings.warn


def warn(message, category=None, stacklevel=1, source=None, **kwargs):
    # the code calling `warnings.warn`, whatever `stacklevel` attributes the warning to (an alias warns its caller)
    category = category or (type(message) if isinstance(message, Warning) else UserWarning)
    caller = sys._getframe(1)
    if issubclass(category, (DeprecationWarning, FutureWarning)) and caller.f_code.co_filename.startswith(src):
        raised.append(f"{caller.f_code.co_filename}:{caller.f_lineno}: {category.__name__}: {message}")
    return original_warn(message, category, stacklevel + 1, source, **kwargs)


warnings.warn = warn
# a deprecation attributed to hf_vlalign code (it calls a deprecated API of a dependency) is an error too
for category in (DeprecationWarning, FutureWarning):
    warnings.filterwarnings("error", category=category, module=r"hf_vlalign(\.|$)")

import hf_vlalign

modules = []
for info in pkgutil.walk_packages(hf_vlalign.__path__, "hf_vlalign."):
    module = importlib.import_module(info.name)
    modules.append(info.name)
    for name in getattr(module, "__all__", ()):
        getattr(module, name)
print(json.dumps({"modules": modules, "raised": raised}))
"""


@pytest.mark.slow
def test_importing_every_module_raises_no_deprecation_from_the_library():
    path = os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING, str(SRC)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report["modules"]) > 100 and "hf_vlalign.models.saving" in report["modules"], report["modules"]
    assert not report["raised"], report["raised"]


def test_no_module_issues_future_warnings_or_re_exports_lazily():
    sources = sorted(SRC.rglob("*.py"))
    assert len(sources) > 100
    for path in sources:
        text = path.read_text(encoding="utf-8")
        assert "FutureWarning" not in text, path
        assert "lazy_exports" not in text, path


@pytest.mark.parametrize("old", sorted(REMOVED_MODULES))
def test_alias_modules_do_not_exist(old):
    assert not (SRC.parent / Path(*old.split("."))).with_suffix(".py").exists(), old
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    if REMOVED_MODULES[old] is not None:
        importlib.import_module(REMOVED_MODULES[old])  # the one path of what it re-exported


@pytest.mark.parametrize("module, name", REMOVED_NAMES)
def test_alias_names_do_not_exist(module, name):
    imported = importlib.import_module(module)
    assert not hasattr(imported, name), f"{module}.{name}"
    assert name not in getattr(imported, "__all__", ())


def test_no_builder_takes_features_for_the_region_feature_store():
    # `features` is a dataset's column schema in `datasets`; the store is `region_features=` only
    from hf_vlalign.data import builders

    for name in builders.__all__:
        value = getattr(builders, name)
        if callable(value) and not inspect.isclass(value):
            assert "features" not in inspect.signature(value).parameters, name


# ----------------------------------------------------------------------------------------------------------------
# One name per loss
# ----------------------------------------------------------------------------------------------------------------


def _config_fields(spec) -> set[str]:
    config_class = spec.config_class_object()
    if dataclasses.is_dataclass(config_class):
        return {field.name for field in dataclasses.fields(config_class)}
    return set(config_class().to_dict())


def _output_classes(spec) -> list[type]:
    from transformers.utils import ModelOutput

    module = importlib.import_module(spec.modeling_module)
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, ModelOutput) and value.__module__ == module.__name__
    ]


def _loss_fields(output_class: type) -> set[str]:
    return {field.name for field in dataclasses.fields(output_class) if field.name.startswith("loss_")}


def _trainers() -> list[type]:
    import hf_vlalign.trainers as trainers

    found = [getattr(trainers, name) for name in trainers.__all__]
    return [value for value in found if inspect.isclass(value) and issubclass(value, ComponentLossTrainer)]


def _weights(spec) -> dict[str, str]:
    """`loss_<name>` -> `<name>_weight`, for every config field named `<name>_weight`."""
    return {f"loss_{field.removesuffix('_weight')}": field for field in _config_fields(spec) if field.endswith("_weight")}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_loss_weight_names_an_output_field_and_a_log_key(family):
    spec = FAMILIES[family]
    weights = _weights(spec)
    assert weights, f"{family}: no `<name>_weight` field"
    outputs = set().union(*(_loss_fields(output_class) for output_class in _output_classes(spec)))
    log_keys = set().union(*(trainer.loss_component_keys for trainer in _trainers()))
    for loss, weight in weights.items():
        assert loss in outputs, f"{family}: config field `{weight}` weighs no output field `{loss}` ({sorted(outputs)})"
        assert loss in log_keys, f"{family}: no trainer logs `{loss}` (the output field `{weight}` weighs)"
    for loss in outputs - MAIN_LOSSES:
        assert loss in weights, f"{family}: output field `{loss}` has no config weight `{loss[5:]}_weight`"


def test_every_trainer_log_key_is_an_output_field_of_its_name():
    outputs = set()
    for spec in FAMILIES.values():
        for output_class in _output_classes(spec):
            outputs |= _loss_fields(output_class)
    weighted = set().union(*(_weights(spec) for spec in FAMILIES.values()))
    for trainer in _trainers():
        assert not hasattr(trainer, "loss_component_fields"), trainer.__name__  # the log key is the field's name
        for key in trainer.loss_component_keys:
            assert key in outputs | TRAINER_LOSSES, f"{trainer.__name__} logs `{key}`, which no model outputs"
            assert key in weighted | MAIN_LOSSES | TRAINER_LOSSES, f"{trainer.__name__}: `{key}` has no weight"
