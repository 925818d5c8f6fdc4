"""The model families of the library, declared once: `FamilySpec`, the registry `FAMILIES` and `family_spec`. Each
family declares its spec beside its code (`<family>/family.py`); the Auto classes, model cards, remote code, LoRA presets
and the CLI read them here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .captioning.family import CAPTIONER
from .family_types import LIBRARY_AUTO_CLASSES, SUPERVISION_FIELDS, FamilySpec, ModelCardSpec, ModelSpec
from .single_stream.family import SINGLE_STREAM
from .two_stream.family import TWO_STREAM

__all__ = [
    "FAMILIES",
    "LIBRARY_AUTO_CLASSES",
    "SUPERVISION_FIELDS",
    "FamilySpec",
    "ModelCardSpec",
    "ModelSpec",
    "family_spec",
]


FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in (SINGLE_STREAM, TWO_STREAM, CAPTIONER)}


def family_spec(family: Any, argument: str = "family") -> FamilySpec:
    """The `FamilySpec` of `family`: a short name ("single_stream"), a model_type ("vlalign_single_stream"), a
    configuration (or its dict) or a model. `argument` names the caller's argument in the error message.

    Raises:
        ValueError: naming `argument`, the known families and what was given, for anything else.
    """
    if isinstance(family, str):
        model_type = family
        if family in FAMILIES:
            return FAMILIES[family]
    else:
        config = getattr(family, "config", family)
        model_type = config.get("model_type") if isinstance(config, Mapping) else getattr(config, "model_type", None)
    for spec in FAMILIES.values():
        if spec.model_type == model_type:
            return spec
    known = ", ".join(f"{spec.name} ({spec.model_type})" for spec in FAMILIES.values())
    given = repr(family) if isinstance(family, str) else f"{type(family).__name__} with model_type {model_type!r}"
    raise ValueError(
        f"`{argument}` must name an hf_vlalign model family (short name or model_type) or be one of its "
        f"configurations or models; the known families are {known}; got {given}."
    )
