"""A fork server for `tests/trainers/test_kill_safety.py`: imports torch and hf_vlalign once, then forks one child per command
that saves a model (or converts features) into the same folder, so that the test can kill it at any point cheaply.

    python tests/kill_safety_worker.py WORKDIR

Startup writes two versions of each kind under WORKDIR (`ref_a`, `ref_b`: two models of other sizes, saved into
WORKDIR/model; `a.tsv`, `b.tsv`: two feature sources, converted into WORKDIR/store) and prints `ready`. Then one command
per stdin line (KIND is `save` or `convert`), each answered with the child's pid, then its exit status (`exit N`, or
`signal N`):

- `loop KIND V`: the child saves (converts) version V, then the other, alternately, forever (the test SIGKILLs it);
- `step KIND K V [fallback]`: the child saves version V once, ending itself with `os._exit(KILLED)` just before its
  K-th file system operation (K = 0: never); with `fallback`, folders are swapped by two renames, not one exchange;
  with `stall`, the child sleeps instead (a hung child, for the test of the deadline below);
- `time KIND V`: the mean duration of a save (conversion) of version V, in this process, printed as seconds.

A `step` child still running after `STEP_DEADLINE` seconds (a save takes milliseconds) is answered `hung`: its Python
stacks go to the log (faulthandler, SIGUSR1), then it is SIGKILLed. Forking a process that has library threads (torch,
pyarrow's jemalloc) can leave a child stuck on a lock one of them held, rarely; the test reruns such a step, counts it
and fails if it recurs, so a save that really hangs is reported with its stack and never stalls the suite.
"""

from __future__ import annotations

import builtins
import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path

import datasets
import torch
import transformers.modeling_utils
from tqdm.auto import tqdm
from tqdm.std import tqdm as tqdm_std

sys.path.insert(0, str(Path(__file__).resolve().parent / "models" / "single_stream"))
from test_single_stream import tiny_config  # noqa: E402

from hf_vlalign import SingleStreamForVisualParaphrase  # noqa: E402
from hf_vlalign.data import convert_features  # noqa: E402
from hf_vlalign.data import feature_store as feature_store_module  # noqa: E402
from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv  # noqa: E402
from hf_vlalign.utils import atomic_folders  # noqa: E402

KILLED = 86
STEP_DEADLINE = float(os.environ.get("KILL_SAFETY_STEP_DEADLINE", "60"))
# the file system operations an injected kill lands before (every one a save or a conversion makes from Python)
OS_STEPS = ("rename", "replace", "link", "symlink", "unlink", "remove", "rmdir", "mkdir", "fsync", "chmod")


def store_record(index: int, prefix: str, num_boxes: int = 3, feature_dim: int = 8) -> dict:
    generator = torch.Generator().manual_seed(index)
    corners = torch.rand(num_boxes, 2, generator=generator) * 30
    return {
        "image_id": f"{prefix}{index}",
        "image_size": (60, 90),
        "boxes": torch.cat([corners, corners + 20], dim=1).numpy(),
        "features": torch.randn(num_boxes, feature_dim, generator=generator).numpy(),
        "object_ids": torch.arange(num_boxes).numpy(),
        "object_conf": torch.ones(num_boxes).numpy(),
        "attr_ids": torch.arange(num_boxes).numpy(),
        "attr_conf": torch.ones(num_boxes).numpy(),
    }


def setup(workdir: Path) -> dict:
    """Writes the two versions of each kind; returns `{kind: write(version)}`, which saves (converts) one."""
    models = {}
    for version, sizes in (("a", {}), ("b", {"hidden_size": 64, "intermediate_size": 128})):
        torch.manual_seed(ord(version))
        models[version] = SingleStreamForVisualParaphrase(tiny_config(**sizes)).eval()
        models[version].save_pretrained(workdir / f"ref_{version}")
    for version, count in (("a", 30), ("b", 20)):
        write_lxmert_tsv(workdir / f"{version}.tsv", [store_record(i, version) for i in range(count)])
    return {
        "save": lambda version: models[version].save_pretrained(workdir / "model"),
        "convert": lambda version: convert_features(
            workdir / f"{version}.tsv", "lxmert_tsv", workdir / "store", overwrite=True
        ),
    }


def inject_kill_at(step: int) -> None:
    """Makes this process end itself (`os._exit`, no cleanup: as a SIGKILL) just before its `step`-th operation."""
    count = 0

    def counted(function):
        def wrapper(*args, **kwargs):
            nonlocal count
            count += 1
            if count == step:
                os._exit(KILLED)
            return function(*args, **kwargs)

        return wrapper

    for name in OS_STEPS:
        setattr(os, name, counted(getattr(os, name)))
    real_open = builtins.open
    counted_open = counted(real_open)
    builtins.open = lambda file, mode="r", *args, **kwargs: (counted_open if set(mode) & set("wax+") else real_open)(
        file, mode, *args, **kwargs
    )
    atomic_folders.exchange_folders = counted(atomic_folders.exchange_folders)
    transformers.modeling_utils.safe_save_file = counted(transformers.modeling_utils.safe_save_file)
    feature_store_module._HashingFile.write = counted(feature_store_module._HashingFile.write)


def run_child(command: list[str], write) -> None:
    """In the forked child: runs one command, never returns."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    # a progress-bar lock of the child's own: tqdm's default lock holds a semaphore shared by every forked process,
    # which a sibling killed while holding it (a kill point inside a progress bar) leaves taken for good
    for progress_bar in {tqdm, tqdm_std}:
        progress_bar.set_lock(threading.RLock())
    try:
        if command[0] == "loop":
            version = command[2]
            while True:
                write(version)
                version = "b" if version == "a" else "a"
        _, _, step, version, *options = command
        if "fallback" in options:
            atomic_folders.exchange_folders = lambda first, second: False
        if "stall" in options:
            time.sleep(3600)
        if int(step):
            inject_kill_at(int(step))
        write(version)
        os._exit(0)
    except BaseException as error:  # noqa: BLE001 - reported to the test as an exit status
        print(f"child error: {error!r}", file=sys.stderr, flush=True)
        os._exit(1)


def wait_for(pid: int, deadline: float | None) -> int | None:
    """The child's wait status; None if it was still running after `deadline` seconds (its stacks dumped, killed)."""
    if deadline is None:
        return os.waitpid(pid, 0)[1]
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            return status
        time.sleep(0.002)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def main() -> None:
    workdir = Path(sys.argv[1])
    # stdout carries the protocol only; what libraries print (DeepSpeed's accelerator notice when a save imports it)
    # goes to the log
    protocol, sys.stdout = sys.stdout, sys.stderr
    # no thread may hold a lock when forking: no OpenMP pool, no progress bar (nor tqdm's monitor thread)
    torch.set_num_threads(1)
    tqdm.monitor_interval = 0
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    writers = setup(workdir)
    print("ready", file=protocol, flush=True)
    for line in sys.stdin:
        command = line.split()
        write = writers[command[1]]
        if command[0] == "time":
            start = time.perf_counter()
            for _ in range(3):
                write(command[2])
            print((time.perf_counter() - start) / 3, file=protocol, flush=True)
            continue
        protocol.flush()
        pid = os.fork()
        if pid == 0:
            run_child(command, write)
        print(pid, file=protocol, flush=True)
        status = wait_for(pid, STEP_DEADLINE if command[0] == "step" else None)
        if status is None:
            print(f"hung: {line.strip()} (pid {pid}); its stacks are in the log", file=sys.stderr, flush=True)
            print("hung", file=protocol, flush=True)
        elif os.WIFSIGNALED(status):
            print(f"signal {os.WTERMSIG(status)}", file=protocol, flush=True)
        else:
            print(f"exit {os.WEXITSTATUS(status)}", file=protocol, flush=True)
    os._exit(0)  # stdin closed: done (skips the interpreter's exit handlers, which may wait on library threads)


if __name__ == "__main__":
    main()
