"""Joining a path taken from annotation text (an image file name, an image id) onto a data folder, safely.

The check is lexical (like `os.path.normpath`): absolute paths, drive or UNC prefixes and `..` steps that leave the
folder are refused whatever exists on disk. Symbolic links are not followed, so a data folder whose sub-folders link to
another disk keeps working.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

_SEPARATORS = re.compile(r"[\\/]")


def check_relative_path(relative: str | os.PathLike, argument: str, root: str | os.PathLike | None = None) -> str:
    """Returns `relative` (a path read from an annotation file) as a str when it is a relative path that stays inside
    the folder it is joined to; else a ValueError naming `argument` (e.g. "`data_dir` dataset_coco.json,
    images[3].filename"), the folder `root` and the value."""
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
