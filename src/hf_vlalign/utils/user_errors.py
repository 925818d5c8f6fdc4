"""The one line a command prints for a user's mistake: `hf-vlalign` and every example end with it instead of a
traceback (argparse's convention: `<program>: error: <message>` on stderr, exit status 2)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .optional import MissingDependencyError

INTERRUPTED_EXIT_STATUS = 130  # a shell's status for a program ended by Ctrl-C (128 + SIGINT)


def one_line(message: str) -> str:
    """`message` on one line: its lines joined (a dependency's message may span several)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def user_error_message(error: BaseException) -> str | None:
    """The one line printed for `error`, or None when `error` is a bug (`TypeError`, `KeyError`, ..., raised on input
    that passed the checks: its traceback is shown). The library's `ValueError`s name the argument, file or field; a
    system `OSError` is said as `<reason>: <path>` (`-> <second path>` of a rename or link)."""
    if isinstance(error, MissingDependencyError):
        return str(error)
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text: the byte {error.object[error.start:error.start + 1]!r} at position {error.start} ({error.reason})"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    if isinstance(error, ValueError):
        return str(error) or type(error).__name__
    if isinstance(error, OSError) and (error.strerror is None or error.filename is None):
        return str(error) or type(error).__name__  # the library's own carry their message
    if isinstance(error, OSError):
        return f"{error.strerror}: {' -> '.join(str(path) for path in (error.filename, error.filename2) if path is not None)}"
    if isinstance(error, MemoryError):
        return f"out of memory ({str(error) or 'MemoryError'}): ask for fewer examples, regions or a smaller batch"
    return None


def fail(program: str, message: str, status: int = 2) -> NoReturn:
    """One line on stderr and the exit status argparse uses for a user mistake."""
    sys.stderr.write(f"{program}: error: {one_line(message)}\n")
    raise SystemExit(status)


def run_command(program: str, run: Callable[[], Any]) -> Any:
    """`run()`, ending with one line (`fail`) on a user mistake or Ctrl-C; a bug keeps its traceback."""
    try:
        return run()
    except KeyboardInterrupt:
        fail(program, "interrupted", status=INTERRUPTED_EXIT_STATUS)
    except Exception as error:
        message = user_error_message(error)
        if message is None:
            raise
        fail(program, message)
