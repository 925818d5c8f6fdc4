"""The import architecture (DESIGN.md, "Rooms and doors"), read from the source with `ast` (importing nothing):

- `models/` imports none of `data/`, `trainers/`, `hub/`, `evaluation/`, `synthetic/`, `analysis/` (function-level
  imports included);
- `data/` imports nothing of `models/`; of `synthetic/` only the builders of the embedded default
  (`ALLOWED_DATA_TO_SYNTHETIC`) do, and `import hf_vlalign.data` does not import `hf_vlalign.synthetic`;
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
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "hf_vlalign"

# subpackages `models/` must not import
MODELS_FORBIDDEN = ("data", "trainers", "hub", "evaluation", "synthetic", "analysis")
# the modules of `data/` that import `synthetic/`: the reader side of the embedded default, `build_dataset(
# "synthetic_scenes")` (a builder loaded by name) and `load_vgp_data()` without files (inside the function)
ALLOWED_DATA_TO_SYNTHETIC = {"hf_vlalign.data.builders.synthetic_scenes", "hf_vlalign.data.builders.vgp"}
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
# data/collators/ module -> the modules of the package it may import: row checks, regions and masking import none,
# truncation the row checks (its tokenizer door); the shared collator (`base`) imports the first three and truncation;
# each task family imports `base` and the helpers it needs
_COLLATOR_HELPERS = {f"hf_vlalign.data.collators.{name}" for name in ("rows", "truncation", "regions", "masking")}
COLLATOR_LAYERS = {
    **{helper: set() for helper in _COLLATOR_HELPERS},
    "hf_vlalign.data.collators.truncation": {"hf_vlalign.data.collators.rows"},
    "hf_vlalign.data.collators.base": _COLLATOR_HELPERS - {"hf_vlalign.data.collators.masking"},
    **{
        f"hf_vlalign.data.collators.{name}": {"hf_vlalign.data.collators.base", *_COLLATOR_HELPERS}
        for name in ("grounding", "vgp", "question_answering", "image_pair", "referring", "captioning", "pretraining")
    },
}
# recipes/ module -> the modules of the package it may import: the argument classes parse `--num_threads` (`threads`),
# model loading reads the argument classes, the run's outputs read the evaluation subset and the stopping rule
RECIPE_LAYERS = {
    "hf_vlalign.recipes.threads": set(),
    "hf_vlalign.recipes.subsets": set(),
    "hf_vlalign.recipes.schedule": set(),
    "hf_vlalign.recipes.arguments": {"hf_vlalign.recipes.threads", "hf_vlalign.recipes.schedule"},
    "hf_vlalign.recipes.models": {"hf_vlalign.recipes.arguments"},
    "hf_vlalign.recipes.outputs": {"hf_vlalign.recipes.subsets", "hf_vlalign.recipes.schedule"},
    "hf_vlalign.recipes.user_data": {"hf_vlalign.recipes.arguments"},
}
# cycles of the explicit graph that are allowed, each with where it is (none: the explorer reads model_analysis's
# `gold_phrases`, model_analysis does not import the explorer)
KNOWN_CYCLES: set[frozenset[str]] = set()


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
        lambda module, target, name, top: any(_within(target, f) for f in forbidden),
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


@pytest.mark.slow
def test_importing_data_does_not_import_synthetic():
    code = (
        "import sys, hf_vlalign.data, hf_vlalign.data.builders, hf_vlalign.data.formats\n"
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
    goes through the models (e.g. `models/saving.py` -> `hub/__init__` -> the checkpoint converters -> the models:
    the models reach the push through `utils.hub_push`)."""
    modules = _modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module in modules:
        for target, *_ in _imports(module):
            if target in modules:
                graph[module] |= {target, *(_ancestors(target) - _ancestors(module) - {module})} & modules.keys()
    for cycle in _cycles(graph):
        assert not any(_within(module, "hf_vlalign.models") for module in cycle), sorted(cycle)


# ----------------------------------------------------------------------------------------------------------------
# Output names, with a real call
# ----------------------------------------------------------------------------------------------------------------


def test_two_stream_pooler_output_is_bert_s_name_in_lxmert_s_place():
    from test_two_stream import tiny_batch, tiny_config

    from hf_vlalign import TwoStreamModel

    torch.manual_seed(0)
    model = TwoStreamModel(tiny_config(attention_supervision="direct")).eval()
    with torch.no_grad():
        outputs = model(**tiny_batch(), output_attentions=True, output_hidden_states=True)
    fields = ["language_output", "vision_output", "pooler_output", "loss_attention_supervision", "language_hidden_states",
              "vision_hidden_states", "language_attentions", "vision_attentions", "cross_encoder_attentions",
              "cross_encoder_vision_attentions"]  # fmt: skip
    assert list(outputs.keys()) == fields  # transformers' Lxmert order, with BERT's `pooler_output`
    assert outputs.to_tuple()[2] is outputs.pooler_output and outputs[2] is outputs.pooler_output
    assert len(outputs.to_tuple()) == len(fields) and "pooled_output" not in outputs.keys()
    assert outputs.pooler_output.shape == (outputs.language_output.shape[0], model.config.hidden_size)


# ----------------------------------------------------------------------------------------------------------------
# The table of rooms of docs/architecture.md
# ----------------------------------------------------------------------------------------------------------------


def _documented_rooms() -> dict[str, set[str]]:
    """room -> the rooms it may import, from the table of docs/architecture.md."""
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    rooms = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        room = cells[0].strip("`").removesuffix("/").removesuffix(".py")
        rooms[room] = set(cells[2].split("`")[1::2])  # the backticked room names of the third column
    return rooms


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def test_the_architecture_page_names_every_room_and_every_import_between_rooms():
    rooms = _documented_rooms()
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
