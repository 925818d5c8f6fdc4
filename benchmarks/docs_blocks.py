"""Rewrites a generated block of the documentation (README.md or a page of docs/): the text between a begin and an
end marker (both kept), so that tables come from committed result files through their script, never typed by hand;
and writes those result files.

Each begin marker occurs on exactly one page; `replace_docs_block` finds that page, so a block can move between pages
without its script changing."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def docs_pages(root: Path = ROOT) -> list[Path]:
    """README.md and every page of docs/ (sorted by name): the pages whose code and generated blocks are checked."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def page_with_marker(marker: str, root: Path = ROOT) -> Path:
    """The one page of `docs_pages(root)` holding `marker`; `ValueError` when none or several do."""
    pages = [page for page in docs_pages(root) if marker in page.read_text()]
    if len(pages) != 1:
        found = ", ".join(str(page.relative_to(root)) for page in pages) or "none"
        raise ValueError(f"exactly one page of README.md and docs/*.md must hold the marker {marker!r}; found: {found}")
    return pages[0]


def replace_docs_block(begin: str, end: str, block: str, root: Path = ROOT) -> Path:
    """Replaces `begin ... end` with `block` (which starts with `begin` and ends with `end`) on the page holding
    `begin`; returns that page."""
    page = page_with_marker(begin, root)
    text = page.read_text()
    if end not in text[text.index(begin) :]:
        raise ValueError(f"{page} holds {begin!r} but not {end!r} after it; add the end marker where the block ends.")
    start = text.index(begin)
    stop = text.index(end, start) + len(end)
    page.write_text(text[:start] + block + text[stop:])
    return page


def write_results(path: str | Path, report: dict) -> None:
    """Writes a benchmark's results JSON (the file its docs block is rendered from), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
