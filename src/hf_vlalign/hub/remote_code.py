"""Publishing a model as transformers *remote code*, loadable without hf_vlalign installed.

transformers' remote code copies the files a class's file imports with same-folder relative imports only. So
[`save_with_remote_code`] writes a *flat* copy of every hf_vlalign module the family's configuration and modeling modules
import (transitively, function-level imports included) under its last name, its hf_vlalign imports rewritten to
`from .<name> import ...` (a name imported from a package `__init__` resolved to its submodule), and sets `auto_map` in
`config.json`; weights and every other config field are those of the model's own `save_pretrained`.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

import transformers
from transformers import PreTrainedModel
from transformers.models.auto.auto_factory import _BaseAutoModelClass

from ..models.family import FAMILIES, FamilySpec
from ..utils.output_paths import refuse_output_overlapping_inputs

PACKAGE = "hf_vlalign"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RemoteCodeFamily:
    """One model family publishable as remote code: its modules, its base model class (published as `AutoModel`) and
    each model class with the transformers Auto class it is published under by default (None: none)."""

    configuration_module: str
    config_class: str
    modeling_module: str
    base_model_class: str
    model_classes: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: FamilySpec) -> RemoteCodeFamily:
        """The remote-code view of a family's `FamilySpec`."""
        return cls(
            configuration_module=spec.config_module,
            config_class=spec.config_class,
            modeling_module=spec.modeling_module,
            base_model_class=spec.base_model.class_name,
            model_classes={model.class_name: model.transformers_auto_class for model in spec.models.values()},
        )


# family short name (`hf_vlalign.models.family.FAMILIES`) -> its remote-code view
REMOTE_CODE_FAMILIES: dict[str, RemoteCodeFamily] = {
    name: RemoteCodeFamily.from_spec(spec) for name, spec in FAMILIES.items()
}


class RemoteCodeError(ValueError):
    """A module of the family cannot be flattened into a standalone remote-code folder."""


def module_file(module: str) -> Path:
    """The source file of an hf_vlalign module (`hf_vlalign.models.dropout` -> `.../models/dropout.py`; a package ->
    its `__init__.py`)."""
    base = PACKAGE_ROOT.joinpath(*module.split(".")[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def is_package(module: str) -> bool:
    return module_file(module).name == "__init__.py"


def resolve_import(importer: str, node: ast.ImportFrom) -> str | None:
    """The absolute module named by `from ... import` in `importer`; None for an import from outside hf_vlalign."""
    if node.level == 0:
        name = node.module or ""
        return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None
    package = importer if is_package(importer) else importer.rpartition(".")[0]
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def parse_module(module: str) -> tuple[str, ast.Module]:
    source = module_file(module).read_text(encoding="utf-8")
    return source, ast.parse(source, filename=str(module_file(module)))


def package_export_source(package: str, name: str) -> str:
    """The submodule a package `__init__` re-exports `name` from (`from .mixin import X` in `supervision/__init__.py`
    -> `hf_vlalign.supervision.mixin`)."""
    _, tree = parse_module(package)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(alias.name == name and not alias.asname for alias in node.names):
            return resolve_import(package, node)
    raise RemoteCodeError(f"Cannot flatten `from {package} import {name}`: it is not re-exported from a submodule.")


def hf_vlalign_imports(module: str, tree: ast.Module) -> list[tuple[ast.ImportFrom, dict[str, list[str]]]]:
    """Every `from ... import` of `module` (anywhere in the file) that points into hf_vlalign, with the module each
    imported name comes from: `{source module: ["name", "name as alias", ...]}`."""
    found = []
    for node in ast.walk(tree):
        target = resolve_import(module, node) if isinstance(node, ast.ImportFrom) else None
        if target is None:
            continue
        sources: dict[str, list[str]] = {}
        for alias in node.names:
            source = package_export_source(target, alias.name) if is_package(target) else target
            spelled = alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
            sources.setdefault(source, []).append(spelled)
        found.append((node, sources))
    return found


def module_closure(roots: list[str]) -> list[str]:
    """The hf_vlalign modules `roots` import, transitively (the roots first)."""
    ordered, pending = [], list(roots)
    while pending:
        module = pending.pop(0)
        if module in ordered:
            continue
        ordered.append(module)
        _, tree = parse_module(module)
        for _, sources in hf_vlalign_imports(module, tree):
            pending.extend(source for source in sources if source not in ordered)
    return ordered


def flatten_module(module: str) -> str:
    """The source of `module` with every hf_vlalign import rewritten to a same-folder relative import of the module's
    last name."""
    source, tree = parse_module(module)
    lines = source.splitlines(keepends=True)
    imports = sorted(hf_vlalign_imports(module, tree), key=lambda item: item[0].lineno, reverse=True)
    for node, sources in imports:
        indent = lines[node.lineno - 1][: node.col_offset]
        lines[node.lineno - 1 : node.end_lineno] = [
            f"{indent}from .{src.rpartition('.')[2]} import {', '.join(spelled)}\n" for src, spelled in sources.items()
        ]
    header = f"# Generated by hf_vlalign.hub.remote_code from {module} (hf_vlalign {_version()}): do not edit.\n"
    return header + "".join(lines)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hf_vlalign")
    except PackageNotFoundError:
        return "unknown"


def write_flat_code(family: RemoteCodeFamily, folder: str | os.PathLike) -> list[Path]:
    """Writes the flattened modules of `family` into `folder`, each under its last name; returns the written files."""
    modules = module_closure([family.configuration_module, family.modeling_module])
    names = [module.rpartition(".")[2] for module in modules]
    if len(set(names)) < len(names):
        raise RemoteCodeError(f"Cannot flatten {modules}: two modules have the same last name.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for module, name in zip(modules, names):
        path = folder / f"{name}.py"
        path.write_text(flatten_module(module), encoding="utf-8")
        written.append(path)
    return written


def family_of(model: PreTrainedModel) -> RemoteCodeFamily:
    """The remote-code family of `model`'s class; ValueError for any other class (subclasses included)."""
    cls = type(model)
    for family in REMOTE_CODE_FAMILIES.values():
        if cls.__module__ == family.modeling_module and cls.__name__ in family.model_classes:
            return family
    supported = sorted(name for family in REMOTE_CODE_FAMILIES.values() for name in family.model_classes)
    raise ValueError(
        f"`model` must be an instance of one of {supported} (defined in hf_vlalign) to be saved as remote code, got "
        f"{cls.__module__}.{cls.__qualname__}."
    )


def check_auto_class(auto_class: str) -> str:
    """`auto_class` must name a transformers `AutoModel*` class (e.g. "AutoModelForSequenceClassification")."""
    candidate = getattr(transformers, auto_class, None) if isinstance(auto_class, str) else None
    if not (isinstance(candidate, type) and issubclass(candidate, _BaseAutoModelClass)):
        raise ValueError(
            f"`auto_class` must be the name of a transformers AutoModel class (e.g. 'AutoModel', "
            f"'AutoModelForSequenceClassification'), got {auto_class!r}."
        )
    return auto_class


def remote_auto_map(model: PreTrainedModel, auto_class: str | None = None) -> dict[str, str]:
    """The `auto_map` of `model`'s remote-code folder: `AutoConfig`, `AutoModel` (the family's base model) and, for a
    task model, `auto_class` (default: the family's Auto class for it, if any) -> the model's own class."""
    family = family_of(model)
    modeling = family.modeling_module.rpartition(".")[2]
    configuration = family.configuration_module.rpartition(".")[2]
    auto_map = {
        "AutoConfig": f"{configuration}.{family.config_class}",
        "AutoModel": f"{modeling}.{family.base_model_class}",
    }
    own_class = type(model).__name__
    auto_class = family.model_classes[own_class] if auto_class is None else check_auto_class(auto_class)
    if auto_class is not None:
        auto_map[auto_class] = f"{modeling}.{own_class}"
    return auto_map


def save_with_remote_code(
    model: PreTrainedModel, folder: str | os.PathLike, *, auto_class: str | None = None, **save_kwargs
) -> Path:
    """Saves `model` with `save_pretrained` into `folder`, plus a flat standalone copy of its family's code and an
    `auto_map` in `config.json`, so that `AutoModel.from_pretrained(folder, trust_remote_code=True)` (and
    `auto_class`'s `from_pretrained`) works where hf_vlalign is not installed.

    Args:
        model: a model of a family in `REMOTE_CODE_FAMILIES` (single-stream, two-stream, captioner).
        folder: the output folder (created if missing); not inside the hf_vlalign package, nor holding it (the flat
            modules have the names of the family's own source files).
        auto_class: the transformers Auto class the model's own class is published under (e.g.
            "AutoModelForSequenceClassification"); default: the family's one for that class, if any (else only
            `AutoConfig` / `AutoModel` are mapped).
        save_kwargs: passed to `model.save_pretrained` (not `push_to_hub`: push the folder afterwards).

    Returns:
        the folder, resolved.
    """
    if save_kwargs.get("push_to_hub"):
        raise ValueError("`push_to_hub` is not supported here, got True: push the saved folder afterwards.")
    family = family_of(model)
    auto_map = remote_auto_map(model, auto_class)
    folder = Path(folder).resolve()
    if folder.is_file():
        raise NotADirectoryError(f"`folder` must be a folder, got the file {folder}.")
    # the flat modules are named like the family's own source files: never write them over (or into) the library
    refuse_output_overlapping_inputs(folder, {"the hf_vlalign source folder": PACKAGE_ROOT}, output_argument="folder")
    write_flat_code(family, folder)
    config = model.config
    had_auto_map, previous = hasattr(config, "auto_map"), getattr(config, "auto_map", None)
    config.auto_map = auto_map
    try:
        model.save_pretrained(folder, **save_kwargs)
    finally:
        if had_auto_map:
            config.auto_map = previous
        else:
            del config.auto_map
    return folder
