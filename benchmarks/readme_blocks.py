"""Rewrites a generated block of README.md: the text between a begin and an end marker (both kept), so that tables
come from committed result files through their script, never typed by hand."""

from __future__ import annotations

from pathlib import Path


def replace_readme_block(readme: Path, begin: str, end: str, block: str) -> None:
    """Replaces `begin ... end` in `readme` with `block` (which starts with `begin` and ends with `end`)."""
    text = readme.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{readme} must hold the markers {begin!r} and {end!r}; add them where the block goes.")
    start, stop = text.index(begin), text.index(end) + len(end)
    readme.write_text(text[:start] + block + text[stop:])
