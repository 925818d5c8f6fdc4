"""Reading the few published pickles (BUTD/BAN `*_imgid2idx.pkl`, RefCOCO+ `refs(unc).p`) without running their code.

`pickle.load` can import and call anything a file names. The restricted unpickler here refuses every global
(`find_class` always raises), so only the pickle opcodes for built-in containers and scalars can build objects, and
the result is then checked to hold nothing but dicts, lists, ints and strings (tuples are read as lists). A container
that contains itself, nesting deeper than `MAX_DEPTH` and a tree that shared references make far larger than the file
(`MAX_NODES_PER_BYTE`) are refused before anything walks the tree, in time and memory linear in the file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

# published pickles nest 4-5 levels; deeper is refused before anything recurses over it
MAX_DEPTH = 100
# a pickle may reference one container from many places (its memo), so the tree it stands for can be exponentially
# larger than the file; the tree may hold at most this many nodes per byte of the file (plus a constant)
MAX_NODES_PER_BYTE = 16


class _NoGlobalsUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (its memo is a dict: the C one allocates a list as long as the largest memo index a
    file names, 32 GB for one `LONG_BINPUT 0xFFFFFFFF`), with every global refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(
            f"refused to load the global {module}.{name}: only dicts, lists, ints and strings are admitted"
        )


def _tree_size(value: object, sizes: dict[int, int], open_ids: set[int], depth: int, where: str) -> int:
    """Nodes of the tree `value` stands for, each shared container counted once per reference (memoised by id, so
    linear in the pickle); a ValueError for a container that contains itself or nesting deeper than MAX_DEPTH."""
    if not isinstance(value, (list, tuple, dict)):
        return 1
    key = id(value)
    if key in sizes:
        return sizes[key]
    if key in open_ids:
        raise ValueError(f"{where}: a {type(value).__name__} of the pickle contains itself; expected plain nested data.")
    if depth >= MAX_DEPTH:
        raise ValueError(f"{where}: the pickle nests deeper than {MAX_DEPTH} levels; expected plain nested data.")
    open_ids.add(key)
    items = [item for pair in value.items() for item in pair] if isinstance(value, dict) else value
    size = 1 + sum(_tree_size(item, sizes, open_ids, depth + 1, where) for item in items)
    open_ids.discard(key)
    sizes[key] = size
    return size


def _checked(value: object, where: str) -> object:
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected only dicts, lists, ints and strings, got a bool.")
    if isinstance(value, (int, str)):
        return value
    if isinstance(value, bytes):  # Python 2 `str` read with encoding="bytes"; never produced with utf-8 decoding
        raise ValueError(f"{where}: expected only dicts, lists, ints and strings, got bytes.")
    if isinstance(value, (list, tuple)):
        return [_checked(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        return {_checked(key, f"{where} key"): _checked(item, f"{where}[{key!r}]") for key, item in value.items()}
    raise ValueError(f"{where}: expected only dicts, lists, ints and strings, got {type(value).__name__}.")


def load_restricted_pickle(path: str | Path) -> object:
    """Loads a pickle of dicts, lists, ints and strings (Python 2 pickles included); anything else is a ValueError.

    Python 2 byte strings are decoded as UTF-8, as the published files were written from UTF-8 text.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`path` must be an existing pickle file, got {str(path)!r}.")
    data = path.read_bytes()
    try:
        value = _NoGlobalsUnpickler(io.BytesIO(data), encoding="utf-8").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as error:
        # KeyError: a memo index never stored; AttributeError: an opcode applied to the wrong type (APPEND to an int)
        raise ValueError(f"{path}: not a pickle of plain dicts, lists, ints and strings ({error!r}).") from None
    size = _tree_size(value, {}, set(), 0, str(path))
    limit = MAX_NODES_PER_BYTE * len(data) + 10_000
    if size > limit:
        raise ValueError(
            f"{path}: the pickle reuses its containers so often that it stands for {size} values, more than "
            f"{limit} for a file of {len(data)} bytes (a memo-reference bomb); expected plain nested data."
        )
    return _checked(value, str(path))
