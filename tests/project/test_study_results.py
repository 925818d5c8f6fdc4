"""The studies (docs/studies.md, the README's claims table): each study's plan was committed before its runs, its
committed aggregate is what its run files give, its tables and verdicts in the docs are what `benchmarks/reproduce.py`
renders from them, and every setting shown has at least five seeds. After new runs:
`python benchmarks/reproduce.py --budget miniature --aggregate_only --docs`."""

from __future__ import annotations

import json
import subprocess

import pytest
from script_modules import ROOT, load_script

reproduce = load_script("reproduce_benchmark", ROOT / "benchmarks" / "reproduce.py")
docs_blocks = load_script("docs_blocks", ROOT / "benchmarks" / "docs_blocks.py")
DOCS = "\n".join(page.read_text() for page in docs_blocks.docs_pages(ROOT))  # README.md and docs/*.md
STUDIES = [e for e in reproduce.EXPERIMENTS.values() if reproduce.is_study(e)]
RESULTS = ROOT / "results"


def _aggregate_path(study) -> object:
    return reproduce.experiment_dir(RESULTS, reproduce.MINIATURE, study.name) / "aggregate.json"


def _run_files(study) -> list:
    return sorted(reproduce.experiment_dir(RESULTS, reproduce.MINIATURE, study.name).glob("*/seed*.json"))


@pytest.mark.parametrize("study", STUDIES, ids=[s.name for s in STUDIES])
def test_each_run_was_made_after_its_study_plan_was_committed(study):
    plan = reproduce.plan_file(study)  # results/<study>/PLAN.md; PLAN_v2.md for results/<study>/v2/...
    for path in _run_files(study):
        commit = json.loads(path.read_text())["git_commit"].removesuffix("+uncommitted")
        found = subprocess.run(["git", "cat-file", "-e", f"{commit}:{plan}"], cwd=ROOT, capture_output=True)
        assert found.returncode == 0, f"{path.relative_to(ROOT)} ran at {commit[:12]}, which has no {plan}"


@pytest.mark.parametrize("study", STUDIES, ids=[s.name for s in STUDIES])
def test_the_committed_aggregate_is_what_the_run_files_give(study):
    if not _run_files(study):
        assert not _aggregate_path(study).exists()
        return
    committed = json.loads(_aggregate_path(study).read_text())
    rebuilt = reproduce.aggregate(RESULTS, reproduce.MINIATURE, [study.name])
    assert json.loads(json.dumps(rebuilt)) == committed


@pytest.mark.parametrize("study", STUDIES, ids=[s.name for s in STUDIES])
def test_a_study_in_the_docs_shows_its_generated_block_and_verdicts_only_at_five_seeds(study):
    if reproduce.docs_markers(study.name)[0] not in DOCS:
        assert not _aggregate_path(study).exists(), f"{study.name} has results but no block on a docs page"
        return
    if not _aggregate_path(study).exists():  # planned, not run yet: its plan named, or bare markers awaiting the runs
        begin, end = reproduce.docs_markers(study.name)
        assert reproduce.planned_block(study.name) in DOCS or f"{begin}\n{end}" in DOCS
        return
    report = json.loads(_aggregate_path(study).read_text())
    summary = report["experiments"][study.name]
    assert reproduce.docs_block(study.name, report) in DOCS
    complete = all(
        len(summary["settings"].get(setting, {}).get("seeds", [])) >= reproduce.STUDY_SEEDS
        for setting in study.planned_settings()
    )
    table = reproduce.claims_block(RESULTS)
    for claim in summary["claims"]:
        row = next(line for line in table.splitlines() if f"| {study.name} | {claim['statement']} |" in line)
        assert (f"**{claim['verdict']}**" in row) == complete and ("runs under way" in row) == (not complete), row


def test_the_claims_table_is_generated_from_the_committed_aggregates():
    for block in (reproduce.studies_block, reproduce.claims_block):
        assert block(RESULTS) in DOCS, "run `python benchmarks/reproduce.py --budget miniature --docs`"
