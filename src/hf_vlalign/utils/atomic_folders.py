"""Replacing a whole folder or file so that a kill, a full disk or an error at any instant leaves the old or the new one.

`atomic_file` writes beside the target and renames over it (a hard link is replaced, not written through);
`replace_folder` exchanges two folders in one `renameat2(RENAME_EXCHANGE)` on Linux, elsewhere it goes through a backup
that `recover_folder` restores after a kill. Staging and backup names carry the writer's host and pid, so
`remove_stale_siblings` removes those of writers no longer running.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

BACKUP_SUFFIX = ".old"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
# bytes of a target's name kept in the names derived from it: with a marker, a host name (<= 64 bytes), a pid and
# suffixes, a derived name stays below the 255 bytes (NAME_MAX) of common file systems.
MAX_DERIVED_STEM_BYTES = 100
DERIVED_HASH_CHARACTERS = 16


def derived_stem(name: str) -> str:
    """The start of the names derived from the folder name `name`: `name` itself when it has at most
    `MAX_DERIVED_STEM_BYTES` bytes, else its first characters, "~" and the first 16 hex digits of its sha256 (the same
    for the same name, so a later cleanup recognises the folders)."""
    encoded = os.fsencode(name)
    if len(encoded) <= MAX_DERIVED_STEM_BYTES:
        return name
    digest = hashlib.sha256(encoded).hexdigest()[:DERIVED_HASH_CHARACTERS]
    kept = name
    while len(os.fsencode(kept)) > MAX_DERIVED_STEM_BYTES - DERIVED_HASH_CHARACTERS - 1:
        kept = kept[:-1]  # character by character: never cuts a multi-byte character in two
    return f"{kept}~{digest}"


def writer_tag() -> str:
    """`<host>-<pid>` of this process: what the names of its staging and backup folders contain."""
    return f"{socket.gethostname()}-{os.getpid()}"


def exchange_folders(first: str | os.PathLike, second: str | os.PathLike) -> bool:
    """Atomically exchanges two existing folders (Linux `renameat2(RENAME_EXCHANGE)`); False where not supported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a libc without renameat2 (glibc < 2.28, musl)
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):  # a file system without exchange
        return False
    raise OSError(error, f"Cannot exchange {first} and {second}: {os.strerror(error)}")


def fsync_path(path: str | os.PathLike) -> None:
    """Flushes a file or folder to disk (so a power loss after the swap cannot leave empty files)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError:  # folders cannot be fsync'ed on some platforms
        pass
    finally:
        os.close(descriptor)


def replace_folder(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Puts the complete folder `new` in place of `target` (see the module docstring) and removes the old folder.
    `target` may not exist; `new` is consumed."""
    new, target = Path(new), Path(target)
    fsync_path(new)
    if not target.exists():
        os.rename(new, target)
    elif exchange_folders(new, target):
        shutil.rmtree(new)  # now the old folder
    else:
        backup = new.with_name(new.name + BACKUP_SUFFIX)
        os.rename(target, backup)
        os.rename(new, target)
        shutil.rmtree(backup)
    fsync_path(target.parent)


PARTIAL_FILE_MARKER = ".partial-"


@contextmanager
def atomic_file(target: str | os.PathLike) -> Iterator[Path]:
    """Yields the temporary path to write `target`'s new content to (beside it, so the final rename stays on one file
    system); then puts it in place of `target` (see the module docstring). Parent folders are created."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(target, PARTIAL_FILE_MARKER)
    partial = target.with_name(f".{derived_stem(target.name)}{PARTIAL_FILE_MARKER}{writer_tag()}")
    try:
        yield partial
        fsync_path(partial)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    fsync_path(target.parent)


def _process_is_running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is not writing it now (it calls the cleanup before it writes)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def stale_siblings(target: Path, marker: str) -> list[Path]:
    """The folders `<parent>/<prefix><derived_stem(target name)><marker><host>-<pid>[suffix]` (prefix "" or ".") of
    writers on this host that are no longer running."""
    if not target.parent.is_dir():
        return []
    pattern = re.compile(rf"\.?{re.escape(derived_stem(target.name))}{re.escape(marker)}{re.escape(socket.gethostname())}-(\d+)(\D.*)?")
    stale = []
    for candidate in target.parent.iterdir():
        match = pattern.fullmatch(candidate.name)
        if match and not _process_is_running(int(match[1])):
            stale.append(candidate)
    return sorted(stale)


def recover_folder(target: str | os.PathLike, marker: str) -> Path | None:
    """When `target` is missing and a dead writer left its backup (a kill between the two renames of the fallback
    swap), renames the backup back to `target` and returns it."""
    target = Path(target)
    if target.exists():
        return None
    for candidate in stale_siblings(target, marker):
        if candidate.name.endswith(BACKUP_SUFFIX) and candidate.is_dir():
            os.rename(candidate, target)
            logger.warning("Restored %s from %s, left by a writer killed while replacing it.", target, candidate)
            return candidate
    return None


def remove_stale_siblings(target: str | os.PathLike, marker: str) -> list[Path]:
    """Recovers `target` (see `recover_folder`), then removes the staging and backup folders of dead writers."""
    target = Path(target)
    recover_folder(target, marker)
    removed = stale_siblings(target, marker)
    for candidate in removed:
        if candidate.is_dir():
            shutil.rmtree(candidate, ignore_errors=True)
        else:
            candidate.unlink(missing_ok=True)
    if removed:
        logger.warning("Removed %d folder(s) of interrupted writes to %s: %s", len(removed), target, [str(p) for p in removed])
    return removed
