"""The import architecture (DESIGN.md, "Rooms and doors"), read from the source with `ast` (importing nothing):

- `models/` imports none of `data/`, `trainers/`, `hub/`, `evaluation/`, `synthetic/`, `analysis/` (function-level
  imports included);
- `data/` imports nothing of `models/`; of `synthetic/` only the builders of the embedded default
  (`ALLOWED_DATA_TO_SYNTHETIC`) do, and `import hf_vlalign.data` does not import `hf_vlalign.synthetic`; the old paths
  `data/synthetic*.py` are compatibility shims that import nothing at import time;
- `synthetic/` imports, of hf_vlalign, only itself, `data.formats`, `data.region_extraction`, `alignment` and `utils`;
  its modules form a chain (`shapes` <- `questions`, `tasks` <- `scenes`) and import no underscore-private name of
  each other;
- the modules of the packages `data/collators/` and `recipes/` import one another in layers (`COLLATOR_LAYERS`,
  `RECIPE_LAYERS`): the helpers of one concern first, each task collator on them alone (no task module imports
  another), and none imports its own package's `__init__`;
- no module imports an underscore-private name from a module of another subpackage;
- the module import graph (explicit imports, function-level ones included) has no cycle but the known ones
  (`KNOWN_CYCLES`), and the import-time graph (module-level imports, each also importing the packages above its target)
  has none at all.

Then, with real calls: every deprecated alias works and issues a `FutureWarning`, and every old import path gives the
same object as the new one, without a warning.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "hf_vlalign"

# subpackages `models/` must not import
MODELS_FORBIDDEN = ("data", "trainers", "hub", "evaluation", "synthetic", "analysis")
# the modules of `data/` that import `synthetic/`: the reader side of the embedded default, `build_dataset(
# "synthetic_scenes")` (a builder loaded by name) and `load_vgp_data()` without files (inside the function)
ALLOWED_DATA_TO_SYNTHETIC = {"hf_vlalign.data.builders.synthetic_scenes", "hf_vlalign.data.builders.vgp"}
# the compatibility shims of the old paths: they name `hf_vlalign.synthetic` in strings, imported on first access
SYNTHETIC_SHIMS = {
    "hf_vlalign.data.synthetic": "hf_vlalign.synthetic.scenes",
    "hf_vlalign.data.synthetic_questions": "hf_vlalign.synthetic.questions",
    "hf_vlalign.data.synthetic_tasks": "hf_vlalign.synthetic.tasks",
}
# what `synthetic/` may import of hf_vlalign (a module or a package prefix)
SYNTHETIC_MAY_IMPORT = (
    "hf_vlalign.synthetic",
    "hf_vlalign.data.formats",
    "hf_vlalign.data.region_extraction",
    "hf_vlalign.alignment",
    "hf_vlalign.utils",
)
# synthetic module -> the synthetic modules it may import (a chain: no circle)
SYNTHETIC_LAYERS = {
    "hf_vlalign.synthetic.shapes": set(),
    "hf_vlalign.synthetic.questions": {"hf_vlalign.synthetic.shapes"},
    "hf_vlalign.synthetic.tasks": {"hf_vlalign.synthetic.shapes"},
    "hf_vlalign.synthetic.scenes": {
        "hf_vlalign.synthetic.shapes",
        "hf_vlalign.synthetic.questions",
        "hf_vlalign.synthetic.tasks",
    },
}
# data/collators/ module -> the modules of the package it may import: row checks, truncation, regions and masking import
# none; the shared collator (`base`) imports the first three; each task family imports `base` and the helpers it needs
_COLLATOR_HELPERS = {f"hf_vlalign.data.collators.{name}" for name in ("rows", "truncation", "regions", "masking")}
COLLATOR_LAYERS = {
    **{helper: set() for helper in _COLLATOR_HELPERS},
    "hf_vlalign.data.collators.base": _COLLATOR_HELPERS - {"hf_vlalign.data.collators.masking"},
    **{
        f"hf_vlalign.data.collators.{name}": {"hf_vlalign.data.collators.base", *_COLLATOR_HELPERS}
        for name in ("grounding", "vgp", "question_answering", "image_pair", "referring", "captioning", "pretraining")
    },
}
# recipes/ module -> the modules of the package it may import: the argument classes parse `--num_threads` (`threads`),
# model loading reads the argument classes, the run's outputs read the evaluation subset
RECIPE_LAYERS = {
    "hf_vlalign.recipes.threads": set(),
    "hf_vlalign.recipes.subsets": set(),
    "hf_vlalign.recipes.arguments": {"hf_vlalign.recipes.threads"},
    "hf_vlalign.recipes.models": {"hf_vlalign.recipes.arguments"},
    "hf_vlalign.recipes.outputs": {"hf_vlalign.recipes.subsets"},
}
# cycles of the explicit graph that are left, each with where it is (none: the explorer reads model_analysis's
# `gold_phrases`, model_analysis no longer imports the explorer)
KNOWN_CYCLES: set[frozenset[str]] = set()
# the compatibility modules of trainers/ (the evaluation runners and the recipes moved out): they import nothing of the
# package they point to at import time
TRAINERS_SHIMS = {
    f"hf_vlalign.trainers.{name}"
    for name in (
        "grounding_evaluation", "image_use", "model_analysis", "model_explorer", "recipes", "syntactic_analysis",
        "task_evaluation", "task_metrics",
    )
}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The import graph, from the source
# ----------------------------------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    modules = {_module_name(path): path for path in sorted((SRC / PACKAGE).rglob("*.py"))}
    assert len(modules) > 50 and "hf_vlalign.models.saving" in modules, f"no package sources under {SRC}"
    return modules


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_modules()[module].read_text(encoding="utf-8"), filename=str(_modules()[module]))


def _is_package(module: str) -> bool:
    return _modules()[module].name == "__init__.py"


def _top_level_nodes(tree: ast.Module) -> set[int]:
    """ids of the import statements run at import time (module level, in if / try blocks; not under TYPE_CHECKING)."""
    found: set[int] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for statement in statements:
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                found.add(id(statement))
            elif isinstance(statement, ast.If):
                if not (isinstance(statement.test, ast.Name) and statement.test.id == "TYPE_CHECKING"):
                    visit(statement.body)
                    visit(statement.orelse)
            elif isinstance(statement, ast.Try):
                for block in (
                    statement.body,
                    statement.orelse,
                    statement.finalbody,
                    *(h.body for h in statement.handlers),
                ):
                    visit(block)

    visit(tree.body)
    return found


@cache
def _imports(module: str) -> tuple[tuple[str, str | None, int, bool], ...]:
    """Every hf_vlalign import of `module`, anywhere in the file: (target module, imported name or None when the target
    is the module itself, line, at import time). `from package import submodule` targets the submodule."""
    tree, modules = _tree(module), _modules()
    top_level = _top_level_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.append((alias.name, None, node.lineno, id(node) in top_level))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if _is_package(module) else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    found.append((submodule, None, node.lineno, id(node) in top_level))
                else:
                    found.append((source, alias.name, node.lineno, id(node) in top_level))
    return tuple(found)


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:index]) for index in range(1, len(parts))}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(frozenset(component))
    return components


def _violations(importers: str, check) -> list[str]:
    """`module:line imports target[.name]` for each import of a module under `importers` that `check(module, target,
    name, at_import_time)` rejects."""
    found = []
    for module in _modules():
        if not _within(module, importers):
            continue
        for target, name, line, top_level in _imports(module):
            if check(module, target, name, top_level):
                found.append(f"{module}:{line} imports {target}{'.' + name if name else ''}")
    return found


# ----------------------------------------------------------------------------------------------------------------
# Rooms and doors
# ----------------------------------------------------------------------------------------------------------------


def test_models_import_no_data_trainers_hub_evaluation_synthetic_or_analysis():
    forbidden = [f"{PACKAGE}.{name}" for name in MODELS_FORBIDDEN]
    assert not _violations(
        "hf_vlalign.models", lambda module, target, name, top: any(_within(target, f) for f in forbidden)
    )


def test_trainers_import_no_evaluation_recipes_hub_or_cli():
    # trainers/ holds the Trainer subclasses; the runners above them (evaluation/, recipes, the CLI) import trainers/
    forbidden = ("hf_vlalign.evaluation", "hf_vlalign.recipes", "hf_vlalign.hub", "hf_vlalign.cli")
    assert not _violations(
        "hf_vlalign.trainers",
        lambda module, target, name, top: module not in TRAINERS_SHIMS and any(_within(target, f) for f in forbidden),
    )


def test_evaluation_imports_no_recipes_or_cli():
    forbidden = ("hf_vlalign.recipes", "hf_vlalign.cli")
    assert not _violations("hf_vlalign.evaluation", lambda module, target, name, top: any(_within(target, f) for f in forbidden))


def test_data_imports_no_models_and_synthetic_only_from_the_embedded_default_builders():
    assert not _violations("hf_vlalign.data", lambda module, target, name, top: _within(target, "hf_vlalign.models"))
    importers = {
        module
        for module in _modules()
        if _within(module, "hf_vlalign.data")
        and any(_within(target, "hf_vlalign.synthetic") for target, *_ in _imports(module))
    }
    assert importers <= ALLOWED_DATA_TO_SYNTHETIC, sorted(importers - ALLOWED_DATA_TO_SYNTHETIC)
    # load_vgp_data reaches the synthetic scenes inside the function only
    assert all(
        not top
        for target, _, _, top in _imports("hf_vlalign.data.builders.vgp")
        if _within(target, "hf_vlalign.synthetic")
    )
    # the builders package does not load the synthetic_scenes builder at import time (build_dataset imports it by name)
    for package in ("hf_vlalign.data", "hf_vlalign.data.builders"):
        assert all(target != "hf_vlalign.data.builders.synthetic_scenes" for target, *_ in _imports(package)), (
            f"{package} imports the synthetic_scenes builder"
        )


def test_the_compatibility_shims_import_nothing_of_the_package_they_point_to():
    for shim, target in SYNTHETIC_SHIMS.items():
        imported = {imported_module for imported_module, *_ in _imports(shim)}
        assert imported == {"hf_vlalign.utils.lazy_exports"}, (shim, imported)
        assert f'"{target}"' in _modules()[shim].read_text(), f"{shim} does not point to {target}"
    assert {imported_module for imported_module, *_ in _imports("hf_vlalign.analysis.plots")} == {
        "hf_vlalign.utils.lazy_exports"
    }


def test_importing_data_does_not_import_synthetic():
    code = (
        "import sys, hf_vlalign.data, hf_vlalign.data.builders, hf_vlalign.data.formats, hf_vlalign.data.synthetic, "
        "hf_vlalign.data.synthetic_questions, hf_vlalign.data.synthetic_tasks\n"
        "loaded = sorted(name for name in sys.modules if name.startswith('hf_vlalign.synthetic'))\n"
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_synthetic_imports_only_formats_region_extraction_alignment_and_utils():
    assert not _violations(
        "hf_vlalign.synthetic",
        lambda module, target, name, top: not any(_within(target, allowed) for allowed in SYNTHETIC_MAY_IMPORT),
    )


def test_synthetic_modules_form_a_chain_without_private_imports():
    modules = {module for module in _modules() if _within(module, "hf_vlalign.synthetic")}
    assert modules == {"hf_vlalign.synthetic", *SYNTHETIC_LAYERS}, sorted(modules)
    for module, allowed in SYNTHETIC_LAYERS.items():
        imported = {target for target, *_ in _imports(module) if _within(target, "hf_vlalign.synthetic")}
        assert imported <= allowed, (module, sorted(imported - allowed))
        private = [name for target, name, *_ in _imports(module) if name and name.startswith("_")]
        assert not private, (module, private)


@pytest.mark.parametrize("package, layers", [("hf_vlalign.data.collators", COLLATOR_LAYERS),
                                             ("hf_vlalign.recipes", RECIPE_LAYERS)])  # fmt: skip
def test_collator_and_recipe_modules_import_one_another_in_layers(package, layers):
    modules = {module for module in _modules() if _within(module, package)}
    assert modules == {package, *layers}, sorted(modules ^ {package, *layers})
    for module, allowed in layers.items():
        imported = {target for target, *_ in _imports(module) if _within(target, package)}
        assert imported <= allowed, (module, sorted(imported - allowed))  # the package itself is never allowed


def test_no_private_name_is_imported_from_another_subpackage():
    def private_from_elsewhere(module, target, name, top):
        return (
            bool(name)
            and name.startswith("_")
            and not name.startswith("__")
            and (_subpackage(target) != _subpackage(module))
        )

    assert not _violations(PACKAGE, private_from_elsewhere)


def test_the_module_import_graph_has_no_cycle_but_the_known_ones():
    modules = _modules()
    graph = {module: {target for target, *_ in _imports(module) if target in modules} for module in modules}
    cycles = set(_cycles(graph))
    assert cycles <= KNOWN_CYCLES, [sorted(cycle) for cycle in cycles - KNOWN_CYCLES]


def test_the_import_time_graph_has_no_cycle():
    """Module-level imports only, each also running the `__init__` of every package above its target (as Python
    does): a cycle here is a partially initialised module at import time."""
    modules = _modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module in modules:
        for target, _, _, top_level in _imports(module):
            if top_level and target in modules:
                graph[module] |= {target, *(_ancestors(target) - _ancestors(module) - {module})} & modules.keys()
    assert not _cycles(graph), [sorted(cycle) for cycle in _cycles(graph)]


def test_models_are_in_no_cycle_even_through_package_inits():
    """All imports (function-level too), each also running the `__init__` of the packages above its target: no cycle
    goes through the models (as `models/saving.py` -> `hub.push` -> `hub/__init__` -> the checkpoint converters ->
    the models did)."""
    modules = _modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module in modules:
        for target, *_ in _imports(module):
            if target in modules:
                graph[module] |= {target, *(_ancestors(target) - _ancestors(module) - {module})} & modules.keys()
    for cycle in _cycles(graph):
        assert not any(_within(module, "hf_vlalign.models") for module in cycle), sorted(cycle)


# ----------------------------------------------------------------------------------------------------------------
# Old paths and deprecated names, with real calls
# ----------------------------------------------------------------------------------------------------------------


def _no_warning(call):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call()


def test_old_synthetic_paths_give_the_new_objects_without_a_warning():
    import importlib

    import hf_vlalign.data as data
    from hf_vlalign import synthetic
    from hf_vlalign.synthetic import questions, scenes, shapes, tasks

    for old, new in SYNTHETIC_SHIMS.items():
        shim, module = importlib.import_module(old), importlib.import_module(new)
        for name in shim.__all__:
            assert _no_warning(lambda: getattr(shim, name)) is getattr(module, name), (old, name)
        assert set(shim.__all__) <= set(dir(shim))
    renamed = {"_Shape": shapes.Shape, "_relation": shapes.shape_relation}
    for name, value in {**renamed, "_valid_attribute_sets": shapes.identifying_attribute_sets}.items():
        for old in SYNTHETIC_SHIMS:
            assert getattr(importlib.import_module(old), name) is value
    from hf_vlalign.data.synthetic import CropEncoder, _wordings  # a re-exported name and an old private one
    from hf_vlalign.data.synthetic_questions import _Phrase
    from hf_vlalign.data.synthetic_tasks import _Description

    assert _wordings is shapes.phrase_wordings and _Phrase is questions._Phrase and _Description is tasks._Description
    assert CropEncoder is scenes.CropEncoder
    for name in (
        "SyntheticSceneConfig",
        "SyntheticVGPPaths",
        "generate_synthetic_vgp",
        "load_or_generate_synthetic_vgp",
    ):
        assert _no_warning(lambda: getattr(data, name)) is getattr(synthetic, name), name
        assert name in data.__all__ and name in dir(data)
    assert data.synthetic is importlib.import_module("hf_vlalign.data.synthetic")
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        data.synthetic.not_a_name


def test_generate_synthetic_vgp_is_a_deprecated_alias_of_generate_synthetic_scenes(tmp_path):
    import hf_vlalign.data
    import hf_vlalign.data.synthetic
    from hf_vlalign.synthetic import SyntheticSceneConfig, generate_synthetic_scenes, generate_synthetic_vgp

    assert hf_vlalign.data.generate_synthetic_vgp is generate_synthetic_vgp
    assert hf_vlalign.data.synthetic.generate_synthetic_vgp is generate_synthetic_vgp
    config = SyntheticSceneConfig(num_train_images=2, num_val_images=1, feature_dim=4, seed=5)
    new = _no_warning(lambda: generate_synthetic_scenes(tmp_path / "new", config))
    with pytest.warns(FutureWarning, match="generate_synthetic_vgp` is deprecated.*generate_synthetic_scenes"):
        old = generate_synthetic_vgp(tmp_path / "old", config)

    def files(root: Path) -> dict[str, bytes]:
        return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}

    assert len(files(new.root)) > 10 and files(old.root) == files(new.root)


def test_analysis_attention_rollout_is_a_deprecated_alias_of_layer_rollouts():
    from hf_vlalign import analysis
    from hf_vlalign.analysis import flow
    from hf_vlalign.supervision import attention_rollout as supervision_rollout

    assert analysis.attention_rollout is flow.attention_rollout and analysis.layer_rollouts is flow.layer_rollouts
    assert "layer_rollouts" in analysis.__all__ and "attention_rollout" in analysis.__all__
    maps = torch.softmax(torch.randn(3, 2, 5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)  # L, H, N, N
    expected = _no_warning(lambda: flow.layer_rollouts(list(maps)))
    with pytest.warns(FutureWarning, match="attention_rollout.*deprecated.*layer_rollouts"):
        old = analysis.attention_rollout(list(maps))
    assert all(torch.equal(a, b) for a, b in zip(old, expected, strict=True))
    batched = supervision_rollout([layer[None] for layer in maps])  # the supervision one is not deprecated
    assert all(torch.equal(a[0], b) for a, b in zip(batched, expected, strict=True))


def test_old_plots_path_gives_the_new_objects_without_a_warning():
    from hf_vlalign import analysis
    from hf_vlalign.analysis import attention_plots, figures, plots, probe_plots

    assert analysis.plots is plots
    for name in plots.__all__:
        module = probe_plots if "head_accuracy" in name else attention_plots
        assert _no_warning(lambda: getattr(plots, name)) is getattr(module, name), name
    old_private = {"_as_matrix": figures.as_matrix, "_as_array": figures.as_array, "_save": figures.save_png,
                   "_annotate": figures.annotate_cells, "_MAX_ANNOTATED_CELLS": figures.MAX_ANNOTATED_CELLS,
                   "_decile_norm": probe_plots._decile_norm, "_check_labels": attention_plots._check_labels}  # fmt: skip
    for name, value in old_private.items():
        assert getattr(plots, name) is value, name
    assert analysis.plot_head_accuracy is probe_plots.plot_head_accuracy


def test_hub_push_is_the_utils_module_under_its_public_path():
    import hf_vlalign.hub
    from hf_vlalign.hub import push
    from hf_vlalign.utils import hub_push

    for name in ("HubPushError", "push_folder_to_hub"):
        assert getattr(push, name) is getattr(hub_push, name) is getattr(hf_vlalign.hub, name)


def test_two_stream_pooler_output_and_the_deprecated_pooled_output():
    from test_two_stream import tiny_batch, tiny_config

    from hf_vlalign import TwoStreamModel

    torch.manual_seed(0)
    model = TwoStreamModel(tiny_config(attention_supervision="direct")).eval()
    with torch.no_grad():
        outputs = model(**tiny_batch(), output_attentions=True, output_hidden_states=True)
    fields = ["language_output", "vision_output", "pooler_output", "loss_attention", "language_hidden_states",
              "vision_hidden_states", "language_attentions", "vision_attentions", "cross_encoder_attentions",
              "cross_encoder_vision_attentions"]  # fmt: skip
    assert list(outputs.keys()) == fields  # the old order, `pooled_output` renamed in its place
    assert outputs.to_tuple()[2] is outputs.pooler_output and outputs[2] is outputs.pooler_output
    assert len(outputs.to_tuple()) == len(fields) and "pooled_output" not in outputs.keys()
    assert outputs.pooler_output.shape == (outputs.language_output.shape[0], model.config.hidden_size)
    for read in (lambda: outputs.pooled_output, lambda: outputs["pooled_output"], lambda: outputs.get("pooled_output")):
        with pytest.warns(FutureWarning, match="pooled_output` is deprecated; use `pooler_output"):
            assert read() is outputs.pooler_output
    with pytest.warns(FutureWarning):
        assert "pooled_output" in outputs


# ----------------------------------------------------------------------------------------------------------------
# The README's table of rooms
# ----------------------------------------------------------------------------------------------------------------


def _readme_rooms() -> dict[str, set[str]]:
    """room -> the rooms it may import, from the table of the README's Architecture section."""
    readme = (SRC.parent / "README.md").read_text()
    section = readme[readme.index("## Architecture\n") :]
    section = section[: section.index("\n## ", 1)]
    rooms = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        room = cells[0].strip("`").removesuffix("/").removesuffix(".py")
        rooms[room] = set(cells[2].split("`")[1::2])  # the backticked room names of the third column
    return rooms


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def test_the_readme_table_names_every_room_and_every_import_between_rooms():
    rooms = _readme_rooms()
    modules = _modules()
    assert set(rooms) == {_room(module) for module in modules} - {PACKAGE}
    crossing = sorted(
        f"{module}:{line} imports {target} ({_room(module)} -> {_room(target)})"
        for module in modules
        for target, _, line, _ in _imports(module)
        if _within(target, PACKAGE) and _room(module) not in (_room(target), PACKAGE)
        and _room(target) not in rooms[_room(module)]
    )  # fmt: skip
    assert not crossing, crossing
