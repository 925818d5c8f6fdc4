"""Count the places where code reads a tensor's values on the host.

On an accelerator each such read (`.item()`, `bool(tensor)`, `.tolist()`, a boolean-mask index, an output whose size
depends on the values such as `nonzero`) waits for every queued kernel: a device synchronisation per call, and a
graph break under `torch.compile`. On the CPU they cost little, which is why they go unnoticed until a model runs on
a GPU; counting them on the CPU finds them all the same:

```python
from hf_vlalign.utils.host_reads import count_host_reads

with count_host_reads() as reads:
    loss = model(**batch).loss
    loss.backward()
assert reads.count == 0, reads.events
```

Two layers count: a `TorchFunctionMode` sees the Python-level tensor methods and functions (`item`, `__bool__`,
`tolist`, indexing with a bool mask, ...), a `TorchDispatchMode` the reads that happen inside other operators
(`aten._local_scalar_dense`, `aten.nonzero`, ...), each read counted once. `torch._assert_async`, the form of a value
check that does not synchronise on an accelerator, is not a host read.

On a CUDA device a third layer counts what the first two cannot see: every other synchronizing CUDA call that CUDA's
sync debug mode reports (`torch.cuda.set_sync_debug_mode("warn")`), such as a blocking copy of host data to the
device (`tensor.new_tensor([...])`), as one "cuda synchronization" event.
"""

from __future__ import annotations

import contextlib
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# tensor methods and torch functions whose result is a host value, or a tensor whose size depends on the values
_READING_FUNCTIONS = {
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__", "__format__",
    "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "equal", "allclose",
    "is_nonzero", "nonzero_static",
}  # fmt: skip
# operators that read values on the host when another operator calls them (e.g. a bool mask index -> nonzero)
_READING_OPERATORS = {"_local_scalar_dense", "nonzero", "equal", "masked_select", "_unique2", "unique_dim", "bincount"}
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}


@dataclass
class HostReads:
    """What `count_host_reads` saw: `count` reads, each an event `(operation, "file:line")` of the caller."""

    events: list[tuple[str, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.events)

    def record(self, operation: str) -> None:
        self.events.append((operation, _caller()))


def _caller() -> str:
    """The innermost frame outside torch, this module and `warnings`: where the read was written."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and frame.filename not in (__file__, warnings.__file__):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _is_mask(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.bool, torch.uint8)


def _indexes_with_a_mask(args: tuple) -> bool:
    """Indexing `tensor[mask]` (or `tensor[..., mask]`) with a bool mask: its result size depends on the values."""
    index = args[1] if len(args) > 1 else None
    indices = index if isinstance(index, (tuple, list)) else (index,)
    return any(_is_mask(item) for item in indices)


def _reads_values(name: str, args: tuple, kwargs: dict) -> bool:
    if name in _READING_FUNCTIONS:
        return True
    if name in _INDEXING:
        return _indexes_with_a_mask(args)
    if name == "where":  # torch.where(condition) alone is nonzero
        return len(args) + len(kwargs) == 1
    if name == "repeat_interleave":  # the output size is the sum of tensor repeats unless given
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads
        self.inside_a_read = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.inside_a_read or not _reads_values(name, args, kwargs):
            return func(*args, **kwargs)
        self.reads.record(name)
        self.inside_a_read = True  # the operators it calls are the same read
        try:
            return func(*args, **kwargs)
        finally:
            self.inside_a_read = False


class _OperatorCounter(TorchDispatchMode):
    def __init__(self, reads: HostReads, functions: _FunctionCounter):
        super().__init__()
        self.reads = reads
        self.functions = functions

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.functions.inside_a_read or func.__name__.split(".")[0] not in _READING_OPERATORS:
            return func(*args, **(kwargs or {}))
        self.reads.record(f"aten.{func.__name__}")
        self.functions.inside_a_read = True  # its own synchronisation is the same read
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.functions.inside_a_read = False


_SYNC_WARNING = "called a synchronizing CUDA operation"


@contextlib.contextmanager
def _cuda_synchronizations(reads: HostReads, functions: _FunctionCounter) -> Iterator[None]:
    """Records the synchronizing CUDA calls that are not already a counted read (CUDA only; nothing elsewhere)."""
    if not torch.cuda.is_available():
        yield
        return
    previous_mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")  # warns that the mode is a prototype: not recorded
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=_SYNC_WARNING)
        show = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if _SYNC_WARNING not in str(message):
                show(message, category, filename, lineno, file, line)
            elif not functions.inside_a_read:
                reads.record("cuda synchronization")

        warnings.showwarning = record
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """Counts every read of tensor values on the host inside the block (forward and backward alike), and on a CUDA
    device every other synchronisation with it; the counted operations still run. For tests and debugging: the
    modes slow every operator down."""
    reads = HostReads()
    functions = _FunctionCounter(reads)
    with _cuda_synchronizations(reads, functions), functions, _OperatorCounter(reads, functions):
        yield reads
