"""Reading text, JSON and CSV files so that every failure names the file and the line.

Python's own errors name neither (a byte offset for bad UTF-8, a bare `RecursionError` for deep JSON, an unterminated
CSV quote read to the end of the file): the readers here raise `FileFormatError` "<file>, line <n>: <what is wrong>".
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

_LONG_DIGITS = re.compile(r"\d{4301,}")  # more digits than int() converts by default (sys.get_int_max_str_digits)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_OPENING, _CLOSING = np.frombuffer(b"[{", dtype=np.uint8), np.frombuffer(b"]}", dtype=np.uint8)


def short_repr(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters, for the "got ..." of a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class FileFormatError(ValueError):
    """A file that cannot be read as the format it should have; the message names the file and the line/record."""


def line_of_offset(text: str | bytes, offset: int) -> int:
    """The 1-based line number of character (or byte) `offset` of `text`."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return text.count(newline, 0, max(offset, 0)) + 1


def decode_utf8(data: bytes, path: str | Path, encoding: str = "utf-8", first_line: int = 1) -> str:
    """`data` (the text of `path` from line `first_line` on) decoded as UTF-8 ("utf-8-sig" drops a BOM); a
    FileFormatError naming the line of the first byte that is not UTF-8."""
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line = first_line - 1 + line_of_offset(data, error.start)
        bad = data[error.start : error.start + 1].hex()
        raise FileFormatError(f"{path}, line {line}: not UTF-8 text (the byte 0x{bad}).") from None


def read_text(path: str | Path, encoding: str = "utf-8") -> str:
    """The text of `path` (UTF-8); non-UTF-8 bytes are a FileFormatError naming the file and the line."""
    return decode_utf8(Path(path).read_bytes(), path, encoding)


def _deepest_point(text: str) -> tuple[int, int]:
    """(deepest nesting, its line) of JSON `text` (brackets inside strings are skipped); only run on a failure."""
    codes = np.frombuffer(_JSON_STRING.sub('""', text).encode(), dtype=np.uint8)  # JSON strings hold no line break
    depth = np.cumsum(np.isin(codes, _OPENING).astype(np.int64) - np.isin(codes, _CLOSING))
    if not len(depth) or depth.max() <= 0:
        return 0, 1
    deepest = int(depth.argmax())
    return int(depth[deepest]), int(np.count_nonzero(codes[:deepest] == ord("\n"))) + 1


def parse_json(text: str, path: str | Path, record: str | None = None) -> object:
    """`text` parsed as JSON; every failure is a FileFormatError naming `path` and the line (or `record`, e.g.
    "line 7" of a JSON-lines file, when `text` is one record of it)."""
    where = f"{path}, {record}" if record is not None else str(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        at = "" if record is not None else f", line {error.lineno}"
        raise FileFormatError(f"{where}{at}: not valid JSON ({error.msg}, column {error.colno}).") from None
    except RecursionError:
        depth, line = _deepest_point(text)
        at = "" if record is not None else f", line {line}"
        raise FileFormatError(f"{where}{at}: JSON nested too deeply to read ({depth} levels).") from None
    except ValueError as error:  # an integer of more than 4300 digits
        long_number = _LONG_DIGITS.search(text)
        at = f", line {line_of_offset(text, long_number.start())}" if long_number and record is None else ""
        raise FileFormatError(f"{where}{at}: not readable as JSON ({error}).") from None


def read_json_file(path: str | Path) -> object:
    """The JSON value of file `path`; FileFormatError naming the file and line for non-UTF-8 bytes, syntax errors,
    nesting too deep for `json` and integers too long to convert."""
    return parse_json(read_text(path), path)


def iter_csv_rows(
    path: str | Path, text: str | Iterable[str], kind: str = "CSV", **format_parameters
) -> Iterator[tuple[int, list[str]]]:
    """(first line, cells) of each record of CSV `text` (or of its lines, streamed) read from `path`, with `strict`
    quoting: an unterminated quote is a FileFormatError naming the line where its record opens, a malformed field
    the line it is on."""
    lines = io.StringIO(text, newline="") if isinstance(text, str) else text
    reader = csv.reader(lines, strict=True, **format_parameters)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            if "end of data" in str(error):
                raise FileFormatError(f"{path}, line {start}: a quoted field opened on this line is never closed.") from None
            raise FileFormatError(f"{path}, line {reader.line_num}: malformed {kind} ({error}).") from None
        yield start, row
        start = reader.line_num + 1
