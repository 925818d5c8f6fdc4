"""Rewrites a generated block of README.md: the text between a begin and an end marker (both kept), so that tables
come from committed result files through their script, never typed by hand; and writes those result files."""

from __future__ import annotations

import json
from pathlib import Path


def replace_readme_block(readme: Path, begin: str, end: str, block: str) -> None:
    """Replaces `begin ... end` in `readme` with `block` (which starts with `begin` and ends with `end`)."""
    text = readme.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{readme} must hold the markers {begin!r} and {end!r}; add them where the block goes.")
    start, stop = text.index(begin), text.index(end) + len(end)
    readme.write_text(text[:start] + block + text[stop:])


def write_results(path: str | Path, report: dict) -> None:
    """Writes a benchmark's results JSON (the file its README block is rendered from), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
