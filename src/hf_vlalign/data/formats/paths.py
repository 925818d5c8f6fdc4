"""Joining a path taken from annotation text (an image file name, an image id) onto a data folder, safely.

Annotation files name images by relative paths or ids (`filename` in Karpathy's `dataset_coco.json`, `file_name` in
COCO instances, Flickr30k / VGP image ids, ...). A file crafted to hold `../../etc/passwd` or `/etc/passwd` must not
make a builder or reader look outside its data folder, so every such join goes through `safe_join`, and every such
name that is only stored (for the caller to join later) through `check_relative_path`. Both raise a ValueError naming
the entry, what was expected and what it holds.

The check is lexical (like `os.path.normpath`): it refuses absolute paths, drive or UNC prefixes and `..` steps that
leave the folder, whatever exists on disk. It does not follow symbolic links, so a data folder whose sub-folders are
links to another disk (a common layout, chosen by whoever set the folder up, not by the annotation text) keeps working.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

_SEPARATORS = re.compile(r"[\\/]")


def check_relative_path(relative: str | os.PathLike, argument: str, root: str | os.PathLike | None = None) -> str:
    """Returns `relative` (as a str) when it is a relative path that stays inside the folder it is joined to.

    Args:
        relative: the path or name read from an annotation file.
        argument: what it is, for the error message (e.g. "`data_dir` dataset_coco.json, images[3].filename").
        root: the folder it is meant to stay in, only named in the error message.

    Raises:
        ValueError: for a non-string, an empty string, a NUL byte, an absolute path (POSIX or Windows, with a drive or
            a UNC prefix) or `..` steps that climb out of the folder; the message names `argument` and the value.
    """
    inside = f" inside {root}" if root is not None else ""
    if isinstance(relative, os.PathLike):
        relative = os.fspath(relative)
    if not isinstance(relative, str):
        raise ValueError(f"{argument}: expected a relative path (str){inside}, got {type(relative).__name__} {relative!r}.")
    if not relative or "\x00" in relative:
        raise ValueError(f"{argument}: expected a non-empty relative path without NUL bytes{inside}, got {relative!r}.")
    windows = PureWindowsPath(relative)
    if PurePosixPath(relative).is_absolute() or windows.is_absolute() or windows.drive or relative[0] in "/\\":
        raise ValueError(f"{argument}: expected a relative path{inside}, got the absolute path {relative!r}.")
    depth = 0
    for part in _SEPARATORS.split(relative):
        if part == "..":
            depth -= 1
        elif part not in ("", "."):
            depth += 1
        if depth < 0:
            raise ValueError(f"{argument}: expected a relative path{inside}, got {relative!r}, whose '..' climbs out of it.")
    return relative


def safe_join(root: str | os.PathLike, relative: str | os.PathLike, argument: str) -> Path:
    """`root / relative`, refused (ValueError naming `argument`) when `relative` is absolute or escapes `root` (see
    `check_relative_path`)."""
    return Path(root) / check_relative_path(relative, argument, root)
