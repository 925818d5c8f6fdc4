"""docs/reliability.md's tables are the code's: the size limits are `hf_vlalign.utils.size_limits`' constants, and the
test counts are what pytest collects from each file."""

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hf_vlalign.utils import size_limits

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"


def table_after(marker: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule left out) of the markdown table that follows `marker` in the doc."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(index for index, line in enumerate(lines) if marker in line)
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[2:]


def test_size_limit_table_matches_the_constants():
    rows = table_after("<!-- size-limits:")
    documented = {row[0].strip("`"): int(row[1]) for row in rows}
    constants = {name: value for name, value in vars(size_limits).items() if name.startswith("MAX_")}
    assert documented == constants


@pytest.mark.slow
def test_counts_table_matches_the_collected_tests():
    rows = table_after("<!-- reliability-counts:")
    documented = {row[0].strip("`"): int(row[2]) for row in rows if row[0] != "all"}
    total = next(int(row[2]) for row in rows if row[0] == "all")
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *documented],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    counts = Counter(re.match(r"([^:]+)::", line).group(1) for line in collected.stdout.splitlines() if "::" in line)
    assert dict(counts) == documented
    assert total == sum(documented.values())


def test_readme_states_the_documented_total():
    total = next(row[2] for row in table_after("<!-- reliability-counts:") if row[0] == "all")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("\n## Reliability\n") :]
    assert f"{total} tests of bad input" in section[: section.index("\n## ", 1)]
