"""docs/reliability.md's size-limit table is the code's: `hf_vlalign.utils.size_limits`' constants."""

from pathlib import Path

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
