"""The shape of the documentation: a README a newcomer reads first (300 lines at most, a features table of one line per
row pointing at the docs pages), every page of docs/ listed in docs/index.md, every relative link and image pointing at
a file (and heading) that exists, every generated block one a script renders (its test compares it with the committed
results), and the shell blocks naming scripts, verbs and options that exist.

The Python blocks of every page run in tests/project/test_readme.py; the generated blocks are compared with what their script
renders in tests/project/test_readme_results.py, tests/project/test_readme_benchmark_tables.py and tests/analysis/test_syntactic_grounding.py;
the Architecture table is checked against the import graph in tests/project/test_architecture_imports.py."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import pytest
from script_modules import ROOT, load_script
from transformers import TrainingArguments

from hf_vlalign.cli import build_parser
from hf_vlalign.recipes import ThreadArguments

docs_blocks = load_script("docs_blocks", ROOT / "benchmarks" / "docs_blocks.py")
PAGES = docs_blocks.docs_pages(ROOT)
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 300
MAX_FEATURE_ROW = 120
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(text: str) -> str:
    """`text` without its fenced blocks and inline code (links inside them are not links)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(INLINE_CODE.sub("", line))
    return "\n".join(kept)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the headings of `page` (lower case, punctuation dropped, spaces to hyphens, repeats -1...)."""
    anchors: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.*)", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchor, repeat = slug, 0
            while anchor in anchors:
                repeat += 1
                anchor = f"{slug}-{repeat}"
            anchors.add(anchor)
    return anchors


def _relative_links(page: Path) -> list[str]:
    return [
        target
        for _, target in LINK.findall(_prose(page.read_text()))
        if not re.match(r"[a-z]+:", target)  # http(s), mailto: not checked here
    ]


def _shell_commands(page: Path) -> list[str]:
    """The commands of the ```bash blocks of `page`, continuation lines joined, comments removed."""
    commands, fenced, pending = [], None, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = None if fenced else line
            continue
        if fenced != "```bash":
            continue
        line = pending + line.split(" #")[0].strip() if not line.lstrip().startswith("#") else pending
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        commands += [part.strip() for part in re.split(r"&&|;", line) if part.strip()]
    return commands


# ---------------------------------------------------------------------------------------------------------------------
# the README and the index


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move sections to docs/ pages"


def test_readme_features_table_has_one_line_rows_each_linking_its_docs_page():
    text = README.read_text()
    section = text[text.index("\n## Features\n") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| feature |")]
    assert len(rows) >= 10
    for row in rows:
        assert len(row) <= MAX_FEATURE_ROW, f"features row of {len(row)} characters: {row}"
        assert re.search(r"\]\(docs/[a-z_]+\.md(#[a-z0-9-]+)?\) \|$", row), f"features row without its docs page: {row}"


def test_readme_links_the_index_and_every_page_is_in_the_index():
    assert "docs/index.md" in _relative_links(README)
    listed = {Path(target.split("#")[0]).name for target in _relative_links(DOCS / "index.md")}
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= listed, f"pages missing from docs/index.md: {sorted(pages - listed)}"
    expected = {"models", "datasets", "training", "analysis", "results", "scaling", "hub", "performance",
                "reliability", "architecture", "development"}  # fmt: skip
    assert {page.removesuffix(".md") for page in pages} >= expected


# ---------------------------------------------------------------------------------------------------------------------
# links


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page):
    broken = []
    for target in _relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{_name(page)}: {broken}"


def test_links_are_found_in_every_form():
    page = "see [a](docs/a.md#x), ![img](images/b.png), [two\nlines](c.md), `[code](not_a_link.md)`, [web](https://x.y)"
    assert [target for _, target in LINK.findall(_prose(page))] == ["docs/a.md#x", "images/b.png", "c.md", "https://x.y"]


# ---------------------------------------------------------------------------------------------------------------------
# generated blocks


def _rendered_markers() -> set[str]:
    """The begin markers of every block a script renders from committed results."""
    reproduce = load_script("reproduce_layout", ROOT / "benchmarks" / "reproduce.py")
    markers = {reproduce.docs_markers(name)[0] for name in ["summary", "studies", "claims", *reproduce.EXPERIMENTS]}
    time_to_result = load_script("time_to_result_layout", ROOT / "benchmarks" / "time_to_result.py")
    markers |= {time_to_result.ANALYZE_BEGIN, time_to_result.TRAINING_BEGIN}
    for script in ("benchmarks/image_use.py", "benchmarks/word_vectors.py", "benchmarks/feature_store.py",
                   "benchmarks/simple_vqa_ceiling.py", "benchmarks/scale.py", "benchmarks/gpu.py",
                   "benchmarks/data_loading.py", "benchmarks/vlm_supervision_cost.py", "benchmarks/vlm_supervision_scaling.py",
                   "docs/syntactic_grounding_table.py", "benchmarks/bad_inputs.py", "benchmarks/main_job_time.py",
                   "benchmarks/data_counts.py", "benchmarks/text_only_ceilings.py",
                   "benchmarks/memory_estimate.py", "benchmarks/explorer_memory.py",
                   "benchmarks/vlm_token_layouts.py"):  # fmt: skip
        markers.add(load_script(Path(script).stem + "_layout", ROOT / script).DOCS_BEGIN)
    return markers


def _studies() -> list[str]:
    reproduce = load_script("reproduce_layout", ROOT / "benchmarks" / "reproduce.py")
    return [name for name, experiment in reproduce.EXPERIMENTS.items() if reproduce.is_study(experiment)]


def test_every_generated_block_is_rendered_by_a_script_and_on_exactly_one_page():
    rendered = _rendered_markers()
    found: dict[str, list[str]] = {}
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if begin := re.fullmatch(r"<!-- (.+): begin -->", line):
                found.setdefault(line, []).append(_name(page))
                end = f"<!-- {begin.group(1)}: end -->"
                assert end in lines[number + 1 :], f"{_name(page)}: {line} without its end marker"
    assert all(len(pages) == 1 for pages in found.values()), {m: p for m, p in found.items() if len(p) > 1}
    assert set(found) <= rendered, f"blocks no script renders: {sorted(set(found) - rendered)}"
    # every block a script renders is on a page, except experiments and studies without committed results
    without_results = ["single_stream_pretraining"] + [
        name for name in _studies() if not (ROOT / "results" / name / "aggregate.json").exists()
    ]
    missing = {m for m in rendered - set(found) if not any(f" {name}: " in m for name in without_results)}
    assert not missing, f"blocks no page holds: {sorted(missing)}"
    assert docs_blocks.page_with_marker("<!-- benchmarks/reproduce.py vgp_supervision: begin -->") == DOCS / "results.md"


def test_replace_docs_block_rewrites_the_page_holding_the_markers(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# title\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("before\n<!-- x: begin -->\nold\n<!-- x: end -->\nafter\n")
    assert docs_blocks.replace_docs_block("<!-- x: begin -->", "<!-- x: end -->", "<!-- x: begin -->\nnew\n<!-- x: end -->", tmp_path) == page
    assert page.read_text() == "before\n<!-- x: begin -->\nnew\n<!-- x: end -->\nafter\n"
    with pytest.raises(ValueError, match="exactly one page .* found: none"):
        docs_blocks.replace_docs_block("<!-- y: begin -->", "<!-- y: end -->", "", tmp_path)
    (tmp_path / "README.md").write_text("<!-- x: begin -->\n<!-- x: end -->\n")
    with pytest.raises(ValueError, match="found: README.md, docs/page.md"):
        docs_blocks.replace_docs_block("<!-- x: begin -->", "<!-- x: end -->", "", tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# shell blocks: not run (they launch training), but what they name exists


def _cli_options() -> dict[str, set[str]]:
    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {verb: set(parser._option_string_actions) for verb, parser in verbs.items()}


def _field_names() -> set[str]:
    """Every dataclass field an example may parse: TrainingArguments', the thread count and those declared in the
    package or the examples (`    name: type = field(...)`)."""
    names = {f.name for f in dataclasses.fields(TrainingArguments)} | {f.name for f in dataclasses.fields(ThreadArguments)}
    for source in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("examples").glob("*.py")]:
        names |= set(re.findall(r"^    (\w+): [^=\n]+= field\(", source.read_text(), re.M))
    return names


def _flags(tokens: list[str]) -> list[str]:
    return [token.strip("[]").split("=")[0] for token in tokens if token.strip("[]").startswith("--")]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_shell_blocks_name_scripts_verbs_and_options_that_exist(page):
    cli, fields, problems = _cli_options(), _field_names(), []
    for command in _shell_commands(page):
        tokens = [token for token in shlex.split(command) if token != "..." and "=" not in token.split("--")[0]]
        scripts = [token for token in tokens if re.fullmatch(r"(examples|benchmarks|docs)/[\w/]+\.(py|yaml)", token)]
        problems += [f"{command}: no file {script}" for script in scripts if not (ROOT / script).is_file()]
        if tokens and tokens[0] == "hf-vlalign":
            verb = tokens[1]
            if verb not in cli:
                problems.append(f"{command}: no verb {verb}")
                continue
            problems += [f"{command}: {verb} has no {flag}" for flag in _flags(tokens[2:]) if flag not in cli[verb]]
        elif tokens[:1] == ["python"] and scripts and scripts[0].startswith(("benchmarks/", "docs/")):
            source = (ROOT / scripts[0]).read_text()
            after = tokens[tokens.index(scripts[0]) + 1 :]
            problems += [f"{command}: {scripts[0]} has no {flag}" for flag in _flags(after) if f'"{flag}"' not in source]
        elif "launch" in tokens and any(script.startswith("examples/") and script.endswith(".py") for script in scripts):
            example = next(script for script in scripts if script.startswith("examples/") and script.endswith(".py"))
            for flag in _flags(tokens[tokens.index(example) + 1 :]):
                # `--config` is every recipe's (parse_recipe_args); `--vqa.learning_rate`: a sub-run's flag
                name = flag.removeprefix("--").replace("-", "_").split(".")[-1]
                if name != "config" and name not in fields and name.removeprefix("no_") not in fields:
                    problems.append(f"{command}: {example} has no {flag}")
    assert not problems, f"{_name(page)}: {problems}"


def test_shell_commands_are_split_as_written():
    assert _flags(["--a", "[--b", "x]", "--c=1", "d"]) == ["--a", "--b", "--c"]
