"""Optional dependencies: each is imported through `require` by the function that needs it, so that the library imports
without them and a missing one fails with the pip command that installs it. Each entry of `EXTRAS` is an extra of
setup.cfg (`pip install "hf-vlalign[<extra>]"`) and the one package it adds.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MODEL_TYPE_EXTRAS", "MissingDependencyError", "require", "require_processor_extras"]

# extra -> (the package it installs, which is also its import name; what needs it)
EXTRAS = {
    "plots": ("matplotlib", "Plotting (the PNG figures and the attention explorer's colour scale)"),
    "hdf5": ("h5py", "Reading HDF5 region features (the butd_h5 and m2_hdf5 formats)"),
    "caption-metrics": ("pycocoevalcap", "The COCO caption metrics (BLEU, METEOR, ROUGE-L, CIDEr-D, SPICE)"),
    "peft": ("peft", "LoRA (hf_vlalign.lora)"),
    "evaluate": ("evaluate", "The `evaluate` metric modules (load_*_metric)"),
    "vlms": (
        "torchvision",
        "The processors of qwen2_vl, qwen2_5_vl, qwen3_vl, llava_onevision, internvl, smolvlm and mistral3",
    ),
    "smolvlm": ("num2words", "SmolVLM's processor"),
}
# model_type -> the extras its processor needs
MODEL_TYPE_EXTRAS = {
    **dict.fromkeys(("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_onevision", "internvl", "mistral3"), ("vlms",)),
    "smolvlm": ("vlms", "smolvlm"),
}


class MissingDependencyError(ModuleNotFoundError):
    """An optional package a feature needs is not installed; the message names the feature and the pip command."""


def require(module: str, extra: str) -> ModuleType:
    """Imports `module` (a package of `extra`, or one of its submodules) and returns it.

    Raises:
        MissingDependencyError: when the package is not installed, with the message
            `<feature> needs <package>, which is not installed: pip install "hf-vlalign[<extra>]" (or pip install
            <package>)`.
        ValueError: when `extra` is not one of `EXTRAS` or `module` is not in its package.
    """
    if extra not in EXTRAS:
        raise ValueError(f"extra must be one of {sorted(EXTRAS)}, got {extra!r}.")
    package, feature = EXTRAS[extra]
    if module.partition(".")[0] != package:
        raise ValueError(f"module must be {package!r} or one of its submodules for extra {extra!r}, got {module!r}.")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        # a package the optional one itself needs is a broken install, not a missing extra: its own error says which
        if error.name is None or error.name.partition(".")[0] != package:
            raise
        install = f'pip install "hf-vlalign[{extra}]" (or pip install {package})'
        message = f"{feature} needs {package}, which is not installed: {install}"
        raise MissingDependencyError(message, name=package) from error


def require_processor_extras(model_type: str) -> None:
    """Imports what the processor of a `model_type` needs (`MODEL_TYPE_EXTRAS`), so that a missing package fails with
    its pip command before transformers builds the processor."""
    for extra in MODEL_TYPE_EXTRAS.get(model_type, ()):
        require(EXTRAS[extra][0], extra)
