"""Bad inputs and faults at the library's doors: a fixed set of cases, each run in a fresh folder by a child process,
each classified by how the library met it.

A door is where a user's input enters the library: the `hf-vlalign` verbs, the examples' arguments and `--config`
YAML files, the readers of the published formats and of the user-data files, the region store, the processor, the
pipeline, the collators, `from_pretrained` / `save_pretrained`, the patch models (`hf_vlalign.vlms`), resuming from
a checkpoint, and saving under a fault (a kill or a full disk in the middle of a write).

Outcomes:
- `clear`: refused with one line naming the case's expected words (the argument, file or field); for a fault, the
  previous complete output is intact (or replaced by a complete new one the library itself had written);
- `traceback`: refused with a traceback, or with a message (e.g. from a dependency) not naming them;
- `accepted`: the bad input went through (exit 0 / no exception), or a NaN came out;
- `lost`: a file that existed before (the user's file, a previous result, a model) is gone, truncated or replaced;
- `hang`: past the timeout, or out of memory under the address-space limit (a size bomb).

Faults: "full disk" is `RLIMIT_FSIZE` in the child (a write past the limit fails with EFBIG, as on a full disk; Python
ignores SIGXFSZ); "kill" is the same limit with SIGXFSZ's default action restored, so the kernel kills the child in
the middle of the write that crosses it (as a SIGKILL would, with no Python cleanup), plus one SIGKILL sent by this
harness when a training checkpoint starts to appear.

    python benchmarks/bad_inputs.py --tree /work/before --label before --out benchmarks/results/bad_inputs_before.json
    python benchmarks/bad_inputs.py --compare benchmarks/results/bad_inputs_before.json \
        benchmarks/results/bad_inputs_after.json

The cases were written before the change they measure (issue 52), from the docs and the `--help`s, not from tests/.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import fnmatch
import hashlib
import json
import os
import pickle
import re
import queue
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

OUTCOMES = ("clear", "traceback", "accepted", "lost", "hang")
ADDRESS_SPACE = 6 * 1024**3
TIMEOUT_S = 120
MESSAGE_CHARS = 300
MEMORY_SIGNS = ("MemoryError", "Unable to allocate", "out of memory", "std::bad_alloc", "Cannot allocate memory")
# the synthetic scenes every CLI case reads (the fixture model was trained on them: their cache is shared)
SYNTHETIC = ["--synthetic_train_images", "8", "--synthetic_eval_images", "6"]

# One zygote per worker: it imports torch, transformers and the library once, then forks one child per case (a
# fresh process each, with its own folder, limits and session), so a case pays for its own work, not for the imports.
# A fault ("full_disk" / "kill") arms RLIMIT_FSIZE at the child's first opening of a file for writing inside its case
# folder (an audit hook), so the limit hits the case's output, not a cache written earlier.
ZYGOTE = r"""
import json, os, resource, runpy, signal, sys, traceback, types
import numpy, torch, transformers, datasets  # noqa: F401
import hf_vlalign, hf_vlalign.data, hf_vlalign.models  # noqa: F401

PRELUDE, ADDRESS_SPACE = sys.argv[1], int(sys.argv[2])
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


def arm_fault(request):
    if request["fault"] == "kill":
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    marker = os.open("child.fault", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    root, limit, armed = request["cwd"] + os.sep, request["fault_bytes"], []

    def hook(event, args):
        if event != "open" or armed or isinstance(args[0], int) or args[0] is None:
            return
        mode, flags = args[1], args[2] or 0
        if not ((mode and any(c in mode for c in "wax+")) or flags & WRITE_FLAGS):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(root) and os.path.basename(path) != "child_result.json":
            armed.append(path)
            os.write(marker, path.encode())
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    if request["fault_at_start"]:
        hook("open", (os.path.join(root, "(start)"), "w", 0))
    else:
        sys.addaudithook(hook)


def child(request):
    os.setsid()
    os.chdir(request["cwd"])
    for fd, name in ((1, "child.stdout"), (2, "child.stderr")):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.environ.update(request["env"])
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if request["fault"] in ("full_disk", "kill"):
        arm_fault(request)
    argv, code = request["argv"], 0
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        if request["kind"] == "python":
            sys.argv = [PRELUDE, *argv]
            exec(compile(open(PRELUDE).read(), PRELUDE, "exec"), sys.modules["__main__"].__dict__)
        elif argv[0].endswith(".py"):
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        else:
            sys.argv = ["hf-vlalign", *argv[1:]]
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as error:
        if isinstance(error.code, int) or error.code is None:
            code = error.code or 0
        else:
            print(error.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(request)
        finally:
            os._exit(70)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""

# a Python case: the snippet runs in `__main__`'s namespace; its exception (or its success) is written as JSON
SNIPPET_PRELUDE = """
import json, math, os, sys, traceback, types
_RESULT = {"ok": True, "nan": False}

def accept(value=None):
    '''The snippet's output: a NaN in it makes the case `accepted` (a NaN produced).'''
    import torch
    def has_nan(v):
        if isinstance(v, torch.Tensor):
            return v.is_floating_point() and bool(torch.isnan(v).any())
        if isinstance(v, float):
            return math.isnan(v)
        if isinstance(v, dict) or hasattr(v, "keys"):
            return any(has_nan(v[k]) for k in v.keys())
        if isinstance(v, (list, tuple)):
            return any(has_nan(x) for x in v)
        return False
    _RESULT["nan"] = _RESULT["nan"] or has_nan(value)

_source = open(sys.argv[1], encoding="utf-8").read()
_main = types.ModuleType("__main__")  # the snippet's own module, so that its functions pickle by name
_main.accept = accept
sys.modules["__main__"] = _main
try:
    exec(compile(_source, "case_snippet.py", "exec"), _main.__dict__)
except BaseException as error:
    if isinstance(error, SystemExit) and error.code in (0, None):
        pass
    else:
        frames = traceback.extract_tb(error.__traceback__)
        _RESULT = {
            "ok": False,
            "exc_type": type(error).__name__,
            "mro": [cls.__name__ for cls in type(error).__mro__],
            "message": str(error),
            "raised_in": frames[-1].filename if frames else "",
        }
with open(os.environ["HARNESS_RESULT"], "w") as file:
    json.dump(_RESULT, file)
sys.exit(0 if _RESULT["ok"] else 1)
"""


# ------------------------------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    id: str
    door: str
    description: str
    expect: tuple[str, ...]  # words the refusal must name (case-insensitive; "a|b": either)
    build: Callable[[Ctx], None]


@dataclasses.dataclass
class Protected:
    path: Path
    owned: bool  # written by the library: a complete new version may replace it
    before: dict[str, str]  # relative file -> sha256


@dataclasses.dataclass
class Spec:
    kind: str = ""  # "cli" | "example" | "python"
    argv: list[str] = dataclasses.field(default_factory=list)
    fault: str | None = None  # "full_disk" | "kill" | "sigkill_when"
    fault_bytes: int = 0
    fault_glob: str = ""
    fault_at_start: bool = False  # arm the limit at once (a write from native code is not seen by the audit hook)
    ok_if_success: bool = False  # success is fine as long as nothing is lost
    timeout: int = TIMEOUT_S


class Ctx:
    """What a case's builder sees: its temp folder, the shared fixtures, and helpers that write inputs."""

    def __init__(self, tmp: Path, fixtures: Path, tree: Path):
        self.tmp, self.fx, self.tree = tmp, fixtures, tree
        self.spec = Spec()
        self.protected: list[Protected] = []
        self.forbidden: list[Path] = []

    # inputs -----------------------------------------------------------------------------------------------------
    def write(self, name: str, content: str | bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        return path

    def model(self, name: str = "vgp", *, real_copy: bool = False, checkpoints: bool = False) -> Path:
        """A copy of a fixture model in the case's folder (big files hard-linked unless `real_copy`)."""
        source, target = self.fx / name, self.tmp / name

        def copy(src, dst):
            if real_copy or os.path.getsize(src) < 1_000_000:
                return shutil.copy2(src, dst)
            return os.link(src, dst)

        ignore = None if checkpoints else shutil.ignore_patterns("checkpoint-*", "runs")
        shutil.copytree(source, target, copy_function=copy, ignore=ignore)
        return target

    def edit_json(self, path: Path, edit: Callable[[dict], None]) -> None:
        data = json.loads(path.read_text())
        edit(data)
        path.unlink()
        path.write_text(json.dumps(data))

    def truncate(self, path: Path, keep: float = 0.5) -> None:
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data[: int(len(data) * keep)])

    def user_file(self, name: str, rows: list[dict] | str, photos: bool = True) -> Path:
        if photos and not (self.tmp / "photos").exists():
            shutil.copytree(self.fx / "photos", self.tmp / "photos")
        text = rows if isinstance(rows, str) else "".join(json.dumps(row) + "\n" for row in rows)
        return self.write(name, text)

    def previous(self, name: str) -> Path:
        """A previous complete result the library wrote (copied from the fixtures), protected as the library's own."""
        source, target = self.fx / "previous" / name, self.tmp / name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
        self.protect(target, owned=True)
        return target

    def protect(self, path: Path, owned: bool = False) -> Path:
        self.protected.append(Protected(path, owned, hashes(path)))
        return path

    def forbid(self, name: str) -> None:
        self.forbidden.append(self.tmp / name)

    # commands ---------------------------------------------------------------------------------------------------
    def cli(self, *args: str, **spec) -> None:
        self.spec = Spec(kind="cli", argv=["hf_vlalign.cli", *map(str, args)], **spec)

    def example(self, script: str, *args: str, **spec) -> None:
        path = self.tree / "examples" / script
        self.spec = Spec(kind="example", argv=[str(path), *map(str, args)], **spec)

    def python(self, code: str, **spec) -> None:
        self.write("case_snippet.py", textwrap.dedent(code))
        self.spec = Spec(kind="python", argv=[str(self.tmp / "case_snippet.py")], **spec)


CASES: list[Case] = []


def case(id: str, door: str, description: str, expect: tuple[str, ...] | list[str] = ()):
    def register(build: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        CASES.append(Case(id, door, description, tuple(expect), build))
        return build

    return register


def caption_rows(n: int = 3) -> list[dict]:
    return [
        {
            "image": f"photos/{100000 + i}.png",
            "caption": "a shape near another shape .",
            "phrases": [{"text": "a shape", "boxes": [[0, 0, 64, 64]]}],
        }
        for i in range(n)
    ]


def tsv_line(img_id="1", h=128, w=128, num_boxes=2, dim=4, boxes=None, features=None, fields=None) -> str:
    import numpy as np

    def b64(array, dtype):
        return base64.b64encode(np.asarray(array, dtype=dtype).tobytes()).decode()

    boxes = np.tile([[0, 0, 10, 10]], (num_boxes, 1)) if boxes is None else boxes
    features = np.ones((num_boxes, dim)) if features is None else features
    row = {
        "img_id": img_id, "img_h": h, "img_w": w,
        "objects_id": b64(np.zeros(num_boxes), np.int64), "objects_conf": b64(np.ones(num_boxes), np.float32),
        "attrs_id": b64(np.zeros(num_boxes), np.int64), "attrs_conf": b64(np.ones(num_boxes), np.float32),
        "num_boxes": num_boxes, "boxes": b64(boxes, np.float32), "features": b64(features, np.float32),
    }  # fmt: skip
    row.update(fields or {})
    return "\t".join(str(value) for value in row.values()) + "\n"


def npy_bytes_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def write_npz_bomb(path: Path, shape: tuple[int, ...], real_bytes: int) -> None:
    """An .npz whose `feat` entry inflates to `real_bytes` of zeros (deflate: about 1000:1) under a header of
    `shape`, with a `bbox` of as many boxes."""
    import io

    import numpy as np

    boxes = io.BytesIO()
    np.save(boxes, np.tile(np.array([[0, 0, 4, 4]], np.float32), (shape[0], 1)))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bbox.npy", boxes.getvalue())
        with archive.open("feat.npy", "w", force_zip64=True) as entry:
            entry.write(npy_bytes_header(shape))
            chunk = bytes(1 << 24)
            left = real_bytes
            while left > 0:
                entry.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)


class Pwn:
    """A pickle that runs a shell command when loaded: a restricted unpickler must refuse it."""

    def __reduce__(self):
        return (os.system, ("touch PWNED",))


# ---- the CLI ------------------------------------------------------------------------------------------------------


@case("cli_unknown_verb", "cli", "a verb that does not exist", ["frobnicate"])
def _(c):
    c.cli("frobnicate", "--out", "x")


@case("cli_probe_missing_model", "cli", "probe of a model folder that does not exist", ["no_such_model"])
def _(c):
    c.cli("probe", c.tmp / "no_such_model", *SYNTHETIC)


@case("cli_probe_model_is_file", "cli", "probe of a model given as a file (its config.json)", ["config.json|model"])
def _(c):
    c.cli("probe", c.model() / "config.json", *SYNTHETIC)


@case("cli_probe_empty_folder", "cli", "probe of an empty folder", ["empty_model|config"])
def _(c):
    (c.tmp / "empty_model").mkdir()
    c.cli("probe", c.tmp / "empty_model", *SYNTHETIC)


@case("cli_probe_batch_size_zero", "cli", "probe --batch_size 0", ["batch_size"])
def _(c):
    c.cli("probe", c.model(), *SYNTHETIC, "--batch_size", "0")


@case("cli_probe_batch_size_negative", "cli", "probe --batch_size -3", ["batch_size"])
def _(c):
    c.cli("probe", c.model(), *SYNTHETIC, "--batch_size", "-3")


@case("cli_probe_batch_size_float", "cli", "probe --batch_size 2.5", ["batch_size"])
def _(c):
    c.cli("probe", c.model(), *SYNTHETIC, "--batch_size", "2.5")


@case("cli_probe_max_examples_negative", "cli", "probe --max_examples -1 (a count that could mean 'all')",
      ["max_examples"])  # fmt: skip
def _(c):
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "-1")


@case("cli_probe_max_examples_zero", "cli", "probe --max_examples 0", ["max_examples"])
def _(c):
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "0")


@case("cli_probe_json_is_folder", "cli", "probe --json names an existing folder", ["json"])
def _(c):
    (c.tmp / "results").mkdir()
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "4", "--json", c.tmp / "results")


@case("cli_probe_json_user_notes", "cli", "probe --json onto the user's notes file", ["json|notes.txt"])
def _(c):
    c.protect(c.write("notes.txt", "my notes, not a result\n"))
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "4", "--json", c.tmp / "notes.txt")


@case("cli_probe_json_hardlink_model_file", "cli", "probe --json is a hard link of the model's config.json", ["json"])
def _(c):
    model = c.model(real_copy=True)
    os.link(model / "config.json", c.tmp / "probe.json")
    c.protect(model / "config.json")
    c.cli("probe", model, *SYNTHETIC, "--max_examples", "4", "--json", c.tmp / "probe.json", ok_if_success=True)


@case("cli_probe_plot_user_photo", "cli", "probe --plot onto the user's photo", ["plot|holiday.png"])
def _(c):
    c.protect(c.write("holiday.png", (c.fx / "photos" / "100000.png").read_bytes()))
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "4", "--plot", c.tmp / "holiday.png")


@case("cli_probe_json_symlink_loop", "cli", "probe --json is a symlink loop", ["json|loop"])
def _(c):
    os.symlink(c.tmp / "b.json", c.tmp / "a.json")
    os.symlink(c.tmp / "a.json", c.tmp / "b.json")
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "4", "--json", c.tmp / "a.json")


@case("cli_probe_json_under_file", "cli", "probe --json inside a path whose parent is a file", ["json|notes.txt"])
def _(c):
    c.protect(c.write("notes.txt", "notes\n"))
    c.cli("probe", c.model(), *SYNTHETIC, "--max_examples", "4", "--json", c.tmp / "notes.txt" / "probe.json")


@case("cli_probe_unread_option", "cli", "probe --vgp_train_csv with the synthetic data (an option it does not read)",
      ["vgp_train_csv"])  # fmt: skip
def _(c):
    c.cli("probe", c.model(), *SYNTHETIC, "--vgp_train_csv", c.fx / "syn" / "vgp" / "train.csv")


@case("cli_probe_synthetic_zero", "cli", "probe --synthetic_eval_images 0", ["synthetic_eval_images"])
def _(c):
    c.cli("probe", c.model(), "--synthetic_train_images", "8", "--synthetic_eval_images", "0")


@case("cli_probe_synthetic_huge", "cli", "probe --synthetic_train_images 2000000000 (a size without bound)",
      ["synthetic_train_images"])  # fmt: skip
def _(c):
    c.cli("probe", c.model(), "--synthetic_train_images", "2000000000", "--synthetic_eval_images", "6", timeout=90)


@case("cli_probe_data_file_missing", "cli", "probe --data_file that does not exist", ["missing.jsonl"])
def _(c):
    c.cli("probe", c.model(), "--data_file", c.tmp / "missing.jsonl")


@case("cli_probe_data_file_bad_json", "cli", "probe --data_file with a broken JSON line", ["caps.jsonl", "2"])
def _(c):
    rows = caption_rows(2)
    c.user_file("caps.jsonl", json.dumps(rows[0]) + "\n" + '{"image": "photos/100001.png", "caption": \n')
    c.cli("probe", c.model(), "--data_file", c.tmp / "caps.jsonl")


@case("cli_probe_data_file_unknown_column", "cli", "probe --data_file with an unknown column", ["colour"])
def _(c):
    rows = caption_rows()
    rows[1]["colour"] = "red"
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_box_outside", "cli", "probe --data_file with a box outside the image", ["box"])
def _(c):
    rows = caption_rows()
    rows[0]["phrases"][0]["boxes"] = [[0, 0, 5000, 64]]
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_missing_image", "cli", "probe --data_file naming a missing image", ["nothere.png"])
def _(c):
    rows = caption_rows()
    rows[2]["image"] = "photos/nothere.png"
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_latin1", "cli", "probe --data_file in Latin-1 (not UTF-8)", ["caps.jsonl"])
def _(c):
    rows = caption_rows()
    rows[0]["caption"] = "a café shape near another shape ."
    rows[0]["phrases"][0]["text"] = "a café shape"
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    c.user_file("caps.jsonl", "")
    c.write("caps.jsonl", text.encode("latin-1"))
    c.cli("probe", c.model(), "--data_file", c.tmp / "caps.jsonl")


@case("cli_probe_data_file_empty", "cli", "probe --data_file that is empty", ["caps.jsonl|empty|no rows"])
def _(c):
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", ""))


@case("cli_probe_data_file_phrase_not_in_caption", "cli", "probe --data_file with a phrase not in its caption",
      ["a triangle"])  # fmt: skip
def _(c):
    rows = caption_rows()
    rows[1]["phrases"][0]["text"] = "a triangle"
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_image_escapes", "cli", "probe --data_file whose image path climbs out with ../../..",
      ["image|passwd"])  # fmt: skip
def _(c):
    rows = caption_rows()
    rows[0]["image"] = "../../../../../../etc/passwd"
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_image_is_text", "cli", "probe --data_file whose image is a text file named .png",
      ["fake.png"])  # fmt: skip
def _(c):
    rows = caption_rows()
    c.user_file("caps.jsonl", rows)
    c.write("photos/fake.png", "this is not an image\n")
    rows[0]["image"] = "photos/fake.png"
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_csv_nul", "cli", "probe --data_file CSV with a NUL byte in a cell", ["caps.csv"])
def _(c):
    c.user_file("caps.csv", "")
    phrases = b'"[{""text"": ""a sha\x00pe"", ""boxes"": [[0, 0, 9, 9]]}]"'
    c.write("caps.csv", b"image,caption,phrases\nphotos/100000.png,a sha\x00pe .," + phrases + b"\n")
    c.cli("probe", c.model(), "--data_file", c.tmp / "caps.csv")


@case("cli_probe_data_file_row_is_list", "cli", "probe --data_file whose line is a JSON list, not an object",
      ["caps.jsonl", "1"])  # fmt: skip
def _(c):
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", '["photos/100000.png", "a shape"]\n'))


@case("cli_probe_data_file_box_string", "cli", "probe --data_file whose box is a string", ["box"])
def _(c):
    rows = caption_rows()
    rows[0]["phrases"][0]["boxes"] = ["0 0 64 64"]
    c.cli("probe", c.model(), "--data_file", c.user_file("caps.jsonl", rows))


@case("cli_probe_data_file_nan_box", "cli", "probe --data_file whose box holds NaN", ["box"])
def _(c):
    rows = caption_rows()
    c.user_file("caps.jsonl", "")
    text = "".join(json.dumps(row) + "\n" for row in rows).replace("[[0, 0, 64, 64]]", "[[NaN, 0, 64, 64]]", 1)
    c.write("caps.jsonl", text)
    c.cli("probe", c.model(), "--data_file", c.tmp / "caps.jsonl")


@case("cli_probe_wrong_type_config", "cli", "probe of a model whose config.json num_hidden_layers is \"two\"",
      ["num_hidden_layers"])  # fmt: skip
def _(c):
    model = c.model()
    c.edit_json(model / "config.json", lambda config: config.update(num_hidden_layers="two"))
    c.cli("probe", model, *SYNTHETIC)


@case("cli_probe_truncated_weights", "cli", "probe of a model whose model.safetensors is truncated",
      ["model.safetensors"])  # fmt: skip
def _(c):
    model = c.model()
    c.truncate(model / "model.safetensors", 0.3)
    c.cli("probe", model, *SYNTHETIC)


@case("cli_probe_missing_weights", "cli", "probe of a model without its weights file", ["safetensors|weights"])
def _(c):
    model = c.model()
    (model / "model.safetensors").unlink()
    c.cli("probe", model, *SYNTHETIC)


@case("cli_probe_unsupported_vl_class", "cli", "probe of a transformers VL model the library does not support (CLIP)",
      ["clip"])  # fmt: skip
def _(c):
    c.cli("probe", c.model("clip"), *SYNTHETIC)


@case("cli_analyze_out_is_file", "cli", "analyze --out onto the user's notes file", ["out|notes.txt"])
def _(c):
    c.protect(c.write("notes.txt", "notes\n"))
    c.cli("analyze", c.model(), *SYNTHETIC, "--max_examples", "4", "--no_syntactic_grounding", "--out",
          c.tmp / "notes.txt")  # fmt: skip


@case("cli_analyze_clusters_zero", "cli", "analyze --num_spatial_clusters 0", ["num_spatial_clusters"])
def _(c):
    c.cli("analyze", c.model(), *SYNTHETIC, "--num_spatial_clusters", "0", "--out", c.tmp / "an")


@case("cli_analyze_spacy_missing", "cli", "analyze --spacy_model naming a folder that does not exist",
      ["spacy"])  # fmt: skip
def _(c):
    c.cli("analyze", c.model(), *SYNTHETIC, "--max_examples", "4", "--spacy_model", c.tmp / "no_spacy", "--out",
          c.tmp / "an")  # fmt: skip


@case("cli_analyze_best_head_bogus", "cli", "analyze --best_head_among everything", ["best_head_among"])
def _(c):
    c.cli("analyze", c.model(), "--best_head_among", "everything", "--out", c.tmp / "an")


@case("cli_explore_out_user_photo", "cli", "explore --out onto the user's photo", ["out|holiday"])
def _(c):
    c.protect(c.write("holiday.html", "<html>my own page</html>\n"))
    c.cli("explore", c.model(), *SYNTHETIC, "--num_examples", "1", "--probe_examples", "0", "--out",
          c.tmp / "holiday.html")  # fmt: skip


@case("cli_explore_out_is_folder", "cli", "explore --out names a folder", ["out"])
def _(c):
    (c.tmp / "pages").mkdir()
    c.cli("explore", c.model(), *SYNTHETIC, "--num_examples", "1", "--out", c.tmp / "pages")


@case("cli_explore_num_examples_negative", "cli", "explore --num_examples -2", ["num_examples"])
def _(c):
    c.cli("explore", c.model(), *SYNTHETIC, "--num_examples", "-2", "--out", c.tmp / "p.html")


@case("cli_explore_probe_examples_negative", "cli", "explore --probe_examples -1", ["probe_examples"])
def _(c):
    c.cli("explore", c.model(), *SYNTHETIC, "--probe_examples", "-1", "--out", c.tmp / "p.html")


@case("cli_explore_image_without_data_file", "cli", "explore --image without --data_file", ["image"])
def _(c):
    c.cli("explore", c.model(), *SYNTHETIC, "--image", c.fx / "photos" / "100000.png", "--out", c.tmp / "p.html")


@case("cli_explore_image_not_in_file", "cli", "explore --image of a photo no row names", ["image|100002"])
def _(c):
    data = c.user_file("caps.jsonl", caption_rows(2))
    c.cli("explore", c.model(), "--data_file", data, "--image", c.tmp / "photos" / "100002.png", "--out",
          c.tmp / "p.html")  # fmt: skip


@case("cli_explore_processor_feature_dim_huge", "cli",
      "explore --data_file of a model whose processor_config.json feature_dim is 1e9", ["feature_dim"])  # fmt: skip
def _(c):
    model = c.model()
    c.edit_json(model / "processor_config.json", lambda p: set_nested(p, "feature_dim", 10**9))
    c.cli("explore", model, "--data_file", c.user_file("caps.jsonl", caption_rows()), "--out", c.tmp / "p.html")


@case("cli_explore_processor_grid_huge", "cli",
      "explore --data_file of a model whose processor_config.json grid_size is 100000", ["grid_size"])  # fmt: skip
def _(c):
    model = c.model()
    c.edit_json(model / "processor_config.json", lambda p: set_nested(p, "grid_size", 100000))
    c.cli("explore", model, "--data_file", c.user_file("caps.jsonl", caption_rows()), "--out", c.tmp / "p.html")


@case("cli_evaluate_wrong_head", "cli", "evaluate --task vqa of a VGP model", ["vqa|task"])
def _(c):
    c.cli("evaluate", c.model(), "--task", "vqa", *SYNTHETIC)


@case("cli_evaluate_captioning_of_vgp", "cli", "evaluate --task captioning of a VGP model", ["captioning|task"])
def _(c):
    c.cli("evaluate", c.model(), "--task", "captioning", *SYNTHETIC)


@case("cli_evaluate_out_user_file", "cli", "evaluate --out onto the user's own JSON file", ["out|mine.json"])
def _(c):
    c.protect(c.write("mine.json", '{"my": "data"}\n'))
    c.cli("evaluate", c.model(), "--task", "vgp", *SYNTHETIC, "--max_examples", "4", "--out", c.tmp / "mine.json")


@case("cli_evaluate_max_text_length_zero", "cli", "evaluate --task vgp --max_text_length 0", ["max_text_length"])
def _(c):
    c.cli("evaluate", c.model(), "--task", "vgp", *SYNTHETIC, "--max_text_length", "0")


@case("cli_evaluate_max_text_length_huge", "cli", "evaluate --task refcoco --max_text_length 100000",
      ["max_text_length"])  # fmt: skip
def _(c):
    c.cli("evaluate", c.model(), "--task", "refcoco", *SYNTHETIC, "--max_text_length", "100000")


@case("cli_evaluate_vqa_file_without_vocab", "cli", "evaluate --task vqa --data_file with a model without answer_vocab",
      ["answer_vocab|vqa"])  # fmt: skip
def _(c):
    rows = [{"image": "photos/100000.png", "question": "what is this ?", "answer": "shape"}]
    c.cli("evaluate", c.model(), "--task", "vqa", "--data_file", c.user_file("q.jsonl", rows))


@case("cli_evaluate_vgp_file_bad_label", "cli", "evaluate --task vgp --data_file with label 'c3'", ["label"])
def _(c):
    rows = [{"image": "photos/100000.png", "caption1": "a shape .", "caption2": "a form .", "phrase1": "a shape",
             "phrase2": "a form", "label": "c3"}]  # fmt: skip
    c.cli("evaluate", c.model(), "--task", "vgp", "--data_file", c.user_file("p.jsonl", rows))


@case("cli_fisher_out_user_file", "cli", "fisher --out onto the user's file", ["out|weights.safetensors"])
def _(c):
    c.protect(c.write("weights.safetensors", b"user bytes, not a fisher file"))
    c.cli("fisher", c.model(), *SYNTHETIC, "--num_batches", "1", "--out", c.tmp / "weights.safetensors")


@case("cli_fisher_num_batches_zero", "cli", "fisher --num_batches 0", ["num_batches"])
def _(c):
    c.cli("fisher", c.model(), *SYNTHETIC, "--num_batches", "0", "--out", c.tmp / "f.safetensors")


@case("cli_fisher_batch_size_huge", "cli", "fisher --batch_size 10**12", ["batch_size"])
def _(c):
    c.cli("fisher", c.model(), *SYNTHETIC, "--batch_size", str(10**12), "--out", c.tmp / "f.safetensors")


@case("cli_synthesize_negative", "cli", "synthesize --train_images -5", ["train_images"])
def _(c):
    c.cli("synthesize", "--out", c.tmp / "s", "--train_images", "-5")


@case("cli_synthesize_huge", "cli", "synthesize --val_images 10**10 (a size without bound)", ["val_images"])
def _(c):
    c.cli("synthesize", "--out", c.tmp / "s", "--train_images", "2", "--val_images", str(10**10), timeout=90)


@case("cli_synthesize_out_is_file", "cli", "synthesize --out onto the user's file", ["out|notes.txt"])
def _(c):
    c.protect(c.write("notes.txt", "notes\n"))
    c.cli("synthesize", "--out", c.tmp / "notes.txt", "--train_images", "2", "--val_images", "2")


@case("cli_synthesize_seed_negative", "cli", "synthesize --seed -1", ["seed"])
def _(c):
    c.cli("synthesize", "--out", c.tmp / "s", "--train_images", "2", "--val_images", "2", "--seed", "-1")


@case("cli_convert_missing_src", "cli", "convert --from visualbert of a folder that does not exist", ["no_ckpt"])
def _(c):
    c.cli("convert", c.tmp / "no_ckpt", "--from", "visualbert", "--out", c.tmp / "conv")


@case("cli_convert_wrong_family", "cli", "convert --from lxmert of an hf_vlalign VGP model", ["lxmert"])
def _(c):
    c.cli("convert", c.model(), "--from", "lxmert", "--out", c.tmp / "conv")


@case("cli_results_table_no_results", "cli", "results-table of a folder without eval_results.json",
      ["eval_results.json|run1"])  # fmt: skip
def _(c):
    (c.tmp / "run1").mkdir()
    c.cli("results-table", c.tmp / "run1")


@case("cli_results_table_truncated", "cli", "results-table of a run whose eval_results.json is truncated",
      ["eval_results.json"])  # fmt: skip
def _(c):
    c.write("run1/eval_results.json", '{"eval_accuracy": 0.5, "eval_')
    c.cli("results-table", c.tmp / "run1")


@case("cli_results_table_nan", "cli", "results-table of a run whose accuracy is the string 'NaN'",
      ["eval_results.json|accuracy"])  # fmt: skip
def _(c):
    c.write("run1/eval_results.json", '{"eval_accuracy": NaN, "eval_loss": "x"}')
    c.cli("results-table", c.tmp / "run1")


# ---- region features: convert-features / extract-features (published formats through the CLI) --------------------


@case("feat_convert_missing_src", "formats", "convert-features of a file that does not exist", ["nothere.tsv"])
def _(c):
    c.cli("convert-features", c.tmp / "nothere.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_truncated_base64", "formats", "LXMERT TSV whose features field is cut", ["features"])
def _(c):
    line = tsv_line().rstrip("\n")
    c.write("f.tsv", line[:-9] + "\n")
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_num_boxes_huge", "formats", "LXMERT TSV with num_boxes 10**9", ["num_boxes"])
def _(c):
    c.write("f.tsv", tsv_line(fields={"num_boxes": 10**9}))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_num_boxes_negative", "formats", "LXMERT TSV with num_boxes -2", ["num_boxes"])
def _(c):
    c.write("f.tsv", tsv_line(fields={"num_boxes": -2}))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_field_count", "formats", "LXMERT TSV row with 7 fields", ["field"])
def _(c):
    c.write("f.tsv", "\t".join(tsv_line().split("\t")[:7]) + "\n")
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_nan_features", "formats", "LXMERT TSV with NaN region features", ["features|nan"])
def _(c):
    import numpy as np

    c.write("f.tsv", tsv_line(features=np.full((2, 4), np.nan)))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_inverted_box", "formats", "LXMERT TSV with a box x2 < x1", ["box"])
def _(c):
    import numpy as np

    c.write("f.tsv", tsv_line(boxes=np.array([[50, 0, 10, 10], [0, 0, 5, 5]])))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_image_size_text", "formats", "LXMERT TSV with img_h 'tall'", ["img_h"])
def _(c):
    c.write("f.tsv", tsv_line(fields={"img_h": "tall"}))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_duplicate_ids", "formats", "LXMERT TSV with one image id twice", ["7|duplicate"])
def _(c):
    c.write("f.tsv", tsv_line(img_id="7") + tsv_line(img_id="7"))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_lxmert_dims_differ", "formats", "LXMERT TSV whose two images have features of 4 and 6 dims",
      ["feature|dim"])  # fmt: skip
def _(c):
    c.write("f.tsv", tsv_line(img_id="1") + tsv_line(img_id="2", dim=6))
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store")


@case("feat_out_user_folder", "formats", "convert-features --out onto a folder of the user's files (no --overwrite)",
      ["out|mine"])  # fmt: skip
def _(c):
    c.protect(c.write("mine/thesis.txt", "chapter 1\n"))
    c.cli("convert-features", c.fx / "syn" / "features" / "features.tsv", "--format", "lxmert_tsv", "--out",
          c.tmp / "mine")  # fmt: skip


@case("feat_overwrite_user_folder", "formats", "convert-features --overwrite onto a folder of the user's files",
      ["out|mine|store"])  # fmt: skip
def _(c):
    c.protect(c.write("mine/thesis.txt", "chapter 1\n"))
    c.cli("convert-features", c.fx / "syn" / "features" / "features.tsv", "--format", "lxmert_tsv", "--out",
          c.tmp / "mine", "--overwrite")  # fmt: skip


@case("feat_overwrite_bad_src_keeps_store", "formats",
      "convert-features --overwrite of an existing store from a broken TSV", ["features|field|f.tsv"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "store", c.tmp / "store")
    c.protect(c.tmp / "store", owned=True)
    c.write("f.tsv", tsv_line(img_id="1") + "garbage\tline\n")
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "lxmert_tsv", "--out", c.tmp / "store", "--overwrite")


@case("feat_npz_bomb", "formats", "npz_dir: a 1 MB .npz whose feat inflates to 2 GB", ["feat|size|npz|1.npz"])
def _(c):
    (c.tmp / "att").mkdir()
    write_npz_bomb(c.tmp / "att" / "1.npz", (2**29 // 4 * 4 // 2048, 2048), 2**31)
    c.cli("convert-features", c.tmp / "att", "--format", "npz_dir", "--out", c.tmp / "store")


@case("feat_npz_header_lies", "formats", "npz_dir: a tiny .npz whose header claims a 40 GB array",
      ["feat|size|npz|1.npz"])  # fmt: skip
def _(c):
    (c.tmp / "att").mkdir()
    with zipfile.ZipFile(c.tmp / "att" / "1.npz", "w") as archive:
        archive.writestr("feat.npy", npy_bytes_header((10**6, 10**4)) + bytes(64))
    c.cli("convert-features", c.tmp / "att", "--format", "npz_dir", "--out", c.tmp / "store")


@case("feat_npz_pickled_object", "formats", "npz_dir: feat is a pickled object array", ["feat|pickle|1.npz"])
def _(c):
    import numpy as np

    (c.tmp / "att").mkdir()
    np.savez(c.tmp / "att" / "1.npz", feat=np.array([{"a": 1}, None], dtype=object))
    c.cli("convert-features", c.tmp / "att", "--format", "npz_dir", "--out", c.tmp / "store")


@case("feat_npz_not_zip", "formats", "npz_dir: a .npz that is a text file", ["1.npz"])
def _(c):
    c.write("att/1.npz", "hello\n")
    c.cli("convert-features", c.tmp / "att", "--format", "npz_dir", "--out", c.tmp / "store")


@case("feat_npz_box_rows_differ", "formats", "npz_dir: 3 feature rows, a box file of 5 boxes",
      ["box|1.npy|bbox"])  # fmt: skip
def _(c):
    import numpy as np

    (c.tmp / "att").mkdir()
    (c.tmp / "box").mkdir()
    np.savez_compressed(c.tmp / "att" / "1.npz", feat=np.ones((3, 8), np.float32))
    np.save(c.tmp / "box" / "1.npy", np.tile(np.array([[0, 0, 4, 4]], np.float32), (5, 1)))
    c.cli("convert-features", c.tmp / "att", "--format", "npz_dir", "--box_dir", c.tmp / "box", "--out",
          c.tmp / "store")  # fmt: skip


@case("feat_butd_tsv_swapped_size", "formats", "BUTD TSV with a negative image_w", ["image_w"])
def _(c):
    import numpy as np

    def b64(a):
        return base64.b64encode(np.asarray(a, np.float32).tobytes()).decode()

    c.write("f.tsv", "\t".join(["1", "-128", "128", "2", b64([[0, 0, 4, 4]] * 2), b64(np.ones((2, 4)))]) + "\n")
    c.cli("convert-features", c.tmp / "f.tsv", "--format", "butd_tsv", "--out", c.tmp / "store")


@case("feat_butd_h5_not_hdf5", "formats", "butd_h5: a text file as the HDF5 features", ["feats.h5"])
def _(c):
    c.write("feats.h5", "not hdf5\n")
    c.write("ids.json", '{"1": 0}')
    c.cli("convert-features", c.tmp / "feats.h5", "--format", "butd_h5", "--id_map", c.tmp / "ids.json", "--out",
          c.tmp / "store")  # fmt: skip


@case("feat_butd_h5_id_map_out_of_range", "formats", "butd_h5: the id map points past the file's rows",
      ["id_map|index|ids.json"])  # fmt: skip
def _(c):
    import h5py
    import numpy as np

    with h5py.File(c.tmp / "feats.h5", "w") as f:
        f["image_features"] = np.ones((1, 2, 4), np.float32)
        f["image_bb"] = np.tile(np.array([[0, 0, 4, 4]], np.float32), (1, 2, 1))
        f["spatial_features"] = np.zeros((1, 2, 6), np.float32)
    c.write("ids.json", '{"1": 0, "2": 5}')
    c.cli("convert-features", c.tmp / "feats.h5", "--format", "butd_h5", "--id_map", c.tmp / "ids.json", "--out",
          c.tmp / "store")  # fmt: skip


@case("feat_m2_truncated", "formats", "m2_hdf5: a truncated HDF5 file", ["m2.hdf5"])
def _(c):
    import h5py
    import numpy as np

    with h5py.File(c.tmp / "m2.hdf5", "w") as f:
        f["1_features"] = np.ones((2, 4), np.float32)
        f["1_boxes"] = np.tile(np.array([[0, 0, 4, 4]], np.float32), (2, 1))
    c.truncate(c.tmp / "m2.hdf5", 0.4)
    c.cli("convert-features", c.tmp / "m2.hdf5", "--format", "m2_hdf5", "--out", c.tmp / "store")


@case("feat_vlbert_json_broken", "formats", "vlbert_json: a broken JSON file", ["1.json"])
def _(c):
    c.write("vl/1.json", '{"image_id": 1, "boxes": ')
    c.cli("convert-features", c.tmp / "vl", "--format", "vlbert_json", "--out", c.tmp / "store")


@case("feat_unread_option", "formats", "convert-features --format lxmert_tsv --box_dir (an option it does not read)",
      ["box_dir"])  # fmt: skip
def _(c):
    c.cli("convert-features", c.fx / "syn" / "features" / "features.tsv", "--format", "lxmert_tsv", "--box_dir",
          c.tmp, "--out", c.tmp / "store")  # fmt: skip


@case("extract_grid_huge", "cli", "extract-features --grid_size 100000 (a size without bound)", ["grid_size"])
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.cli("extract-features", c.tmp / "photos", "--grid_size", "100000", "--out", c.tmp / "store")


@case("extract_grid_zero", "cli", "extract-features --grid_size 0", ["grid_size"])
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.cli("extract-features", c.tmp / "photos", "--grid_size", "0", "--out", c.tmp / "store")


@case("extract_boxes_inverted", "cli", "extract-features --boxes with x2 < x1", ["boxes|100000"])
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.write("boxes.json", json.dumps({"100000.png": [[60, 0, 10, 10]]}))
    c.cli("extract-features", c.tmp / "photos", "--boxes", c.tmp / "boxes.json", "--out", c.tmp / "store")


@case("extract_boxes_not_json", "cli", "extract-features --boxes that is not JSON", ["boxes.json"])
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.write("boxes.json", "100000.png: 0 0 10 10\n")
    c.cli("extract-features", c.tmp / "photos", "--boxes", c.tmp / "boxes.json", "--out", c.tmp / "store")


@case("extract_empty_folder", "cli", "extract-features of a folder without images", ["images|empty"])
def _(c):
    (c.tmp / "empty").mkdir()
    c.cli("extract-features", c.tmp / "empty", "--grid_size", "2", "--out", c.tmp / "store")


@case("extract_corrupt_png", "cli", "extract-features of a folder holding a truncated PNG", ["broken.png"])
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    data = (c.tmp / "photos" / "100000.png").read_bytes()
    c.write("photos/broken.png", data[: len(data) // 3])
    c.cli("extract-features", c.tmp / "photos", "--grid_size", "2", "--out", c.tmp / "store")


@case("extract_max_regions_without_detector", "cli", "extract-features --max_regions -1 without --detector",
      ["max_regions"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.cli("extract-features", c.tmp / "photos", "--grid_size", "2", "--max_regions", "-1", "--out", c.tmp / "store")


@case("extract_encoder_missing", "cli", "extract-features --encoder naming a folder that does not exist",
      ["encoder|no_encoder"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.cli("extract-features", c.tmp / "photos", "--grid_size", "2", "--encoder", c.tmp / "no_encoder", "--out",
          c.tmp / "store")  # fmt: skip


@case("extract_threshold_above_one", "cli", "extract-features --detector_threshold 7", ["detector_threshold"])
def _(c):
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.cli("extract-features", c.tmp / "photos", "--grid_size", "2", "--detector_threshold", "7", "--out",
          c.tmp / "store")  # fmt: skip


# ---- the examples and their --config files --------------------------------------------------------------------------

TRAIN_ONE_STEP = [*SYNTHETIC, "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_threads", "1",
                  "--report_to", "none"]  # fmt: skip
VGP_RUN = [*TRAIN_ONE_STEP, "--image_use_examples", "2"]
USER_RUN = [*TRAIN_ONE_STEP[len(SYNTHETIC) :], "--image_use_examples", "2"]  # with --train_file: no synthetic flags


def samaran_files(c: Ctx) -> list:
    """Good user files of the three stages of samaran_table1.py (VGP, VQA, RefCOCO+), train and validation."""
    vgp = [{"image": f"photos/{100000 + i}.png", "caption1": "a shape .", "caption2": "a form .", "phrase1": "a shape",
            "phrase2": "a form", "label": "both"} for i in range(3)]  # fmt: skip
    vqa = [{"image": f"photos/{100000 + i}.png", "question": "what is it ?", "answer": "shape"} for i in range(3)]
    ref = [{"image": f"photos/{100000 + i}.png", "expression": "the shape", "box": [0, 0, 64, 64]} for i in range(3)]
    files = []
    stages = (("train_file", "vgp", vgp), ("vqa_train_file", "vqa", vqa), ("refcoco_train_file", "ref", ref))
    for flag, name, rows in stages:
        path = c.user_file(f"{name}.jsonl", rows)
        files += [f"--{flag}", path, f"--{flag.replace('train', 'validation')}", path]
    return files


@case("ex_epochs_text", "examples", "finetune_vgp.py --num_train_epochs abc", ["num_train_epochs"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", "--num_train_epochs", "abc")


@case("ex_batch_size_float", "examples", "finetune_vgp.py --per_device_train_batch_size 2.5",
      ["per_device_train_batch_size"])  # fmt: skip
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", "--per_device_train_batch_size", "2.5")


@case("ex_lr_dict_in_config", "config", "finetune_vgp.py --config with learning_rate: {a: 1}", ["learning_rate"])
def _(c):
    c.write("c.yaml", "learning_rate:\n  a: 1\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_epochs_list_in_config", "config", "finetune_vgp.py --config with num_train_epochs: [1, 2]",
      ["num_train_epochs"])  # fmt: skip
def _(c):
    c.write("c.yaml", "num_train_epochs: [1, 2]\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_batch_size_float_in_config", "config", "finetune_vgp.py --config with per_device_train_batch_size: 2.5",
      ["per_device_train_batch_size"])  # fmt: skip
def _(c):
    c.write("c.yaml", "per_device_train_batch_size: 2.5\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", "--max_steps", "1")


@case("ex_config_latin1", "config", "finetune_vgp.py --config in Latin-1", ["c.yaml"])
def _(c):
    c.write("c.yaml", "# réglages\nlearning_rate: 0.001\n".encode("latin-1"))
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_config_alias_bomb", "config", "finetune_vgp.py --config holding a YAML alias bomb", ["c.yaml|alias"])
def _(c):
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    c.write("c.yaml", "\n".join(lines) + "\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN, timeout=90)


@case("ex_config_duplicate_key", "config", "finetune_vgp.py --config with learning_rate twice", ["learning_rate"])
def _(c):
    c.write("c.yaml", "learning_rate: 0.001\nlearning_rate: 10.0\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_config_twice", "config", "finetune_vgp.py given --config twice", ["config"])
def _(c):
    c.write("a.yaml", "learning_rate: 0.001\n")
    c.write("b.yaml", "learning_rate: 0.002\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "a.yaml", "--config", c.tmp / "b.yaml", "--output_dir",
              c.tmp / "run", *VGP_RUN)  # fmt: skip


@case("ex_config_unknown_key", "config", "finetune_vgp.py --config with a misspelt key", ["learnig_rate"])
def _(c):
    c.write("c.yaml", "learnig_rate: 0.001\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_config_top_level_list", "config", "finetune_vgp.py --config whose document is a list", ["c.yaml"])
def _(c):
    c.write("c.yaml", "- learning_rate\n- 0.001\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_config_missing", "config", "finetune_vgp.py --config of a file that does not exist", ["nothere.yaml"])
def _(c):
    c.example("finetune_vgp.py", "--config", c.tmp / "nothere.yaml", "--output_dir", c.tmp / "run")


@case("ex_config_python_tag", "config", "finetune_vgp.py --config with a !!python/object tag",
      ["c.yaml|python|tag"])  # fmt: skip
def _(c):
    c.write("c.yaml", "learning_rate: !!python/object/apply:os.system ['touch PWNED']\n")
    c.forbid("PWNED")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_config_other_examples_key", "config", "finetune_vgp.py --config holding train_captioning's num_beams",
      ["num_beams"])  # fmt: skip
def _(c):
    c.write("c.yaml", "num_beams: 3\n")
    c.example("finetune_vgp.py", "--config", c.tmp / "c.yaml", "--output_dir", c.tmp / "run", *VGP_RUN)


@case("ex_supervised_layer_out_of_range", "examples", "finetune_vgp.py --supervised_layers 99", ["supervised_layers"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *VGP_RUN, "--supervised_layers", "99")


@case("ex_supervised_head_negative", "examples", "finetune_vgp.py --supervised_heads -1", ["supervised_heads"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *VGP_RUN, "--supervised_heads", "-1")


@case("ex_supervision_bogus", "examples", "finetune_vgp.py --supervision sideways", ["supervision"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", "--supervision", "sideways")


@case("ex_max_text_length_zero", "examples", "finetune_vgp.py --max_text_length 0", ["max_text_length"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *VGP_RUN, "--max_text_length", "0")


@case("ex_output_dir_is_file", "examples", "finetune_vgp.py --output_dir onto the user's file",
      ["output_dir|notes.txt"])  # fmt: skip
def _(c):
    c.protect(c.write("notes.txt", "notes\n"))
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "notes.txt", *VGP_RUN)


@case("ex_train_file_missing", "examples", "finetune_vgp.py --train_file that does not exist", ["nothere.jsonl"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", "--train_file", c.tmp / "nothere.jsonl", *USER_RUN)


@case("ex_train_file_wrong_task", "examples", "finetune_vgp.py --train_file of caption rows (not vgp)",
      ["caption1|column|caps.jsonl"])  # fmt: skip
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", "--train_file",
              c.user_file("caps.jsonl", caption_rows()), *USER_RUN)  # fmt: skip


@case("ex_vqa_min_answer_count_negative", "examples", "finetune_vqa.py --min_answer_count -1", ["min_answer_count"])
def _(c):
    c.example("finetune_vqa.py", "--output_dir", c.tmp / "run", "--min_answer_count", "-1", *VGP_RUN)


@case("ex_vqa_train_file_answers_number", "examples", "finetune_vqa.py --train_file whose answer is a number",
      ["answer"])  # fmt: skip
def _(c):
    rows = [{"image": f"photos/{100000 + i}.png", "question": "how many ?", "answer": 3} for i in range(3)]
    c.example("finetune_vqa.py", "--output_dir", c.tmp / "run", "--train_file", c.user_file("q.jsonl", rows),
              *USER_RUN)  # fmt: skip


@case("ex_nlvr2_label_maybe", "examples", "finetune_nlvr2.py --train_file with label 'maybe'", ["label"])
def _(c):
    rows = [{"left_image": "photos/100000.png", "right_image": "photos/100001.png", "sentence": "two shapes .",
             "label": "maybe"}] * 2  # fmt: skip
    c.example("finetune_nlvr2.py", "--output_dir", c.tmp / "run", "--train_file", c.user_file("n.jsonl", rows),
              *USER_RUN)  # fmt: skip


@case("ex_refcoco_refs_malicious_pickle", "examples", "finetune_refcoco.py --refs_file that runs a command",
      ["refs|pickle|refs.p"])  # fmt: skip
def _(c):
    c.write("refs.p", pickle.dumps([Pwn()]))
    c.forbid("PWNED")
    c.example("finetune_refcoco.py", "--output_dir", c.tmp / "run", "--dataset", "refcoco+", "--data_dir",
              c.fx / "syn" / "refcoco+", "--refs_file", c.tmp / "refs.p", "--features", c.fx / "store",
              *USER_RUN)  # fmt: skip


@case("ex_refcoco_box_outside", "examples", "finetune_refcoco.py --train_file with a box beyond the image", ["box"])
def _(c):
    rows = [{"image": f"photos/{100000 + i}.png", "expression": "the shape", "box": [0, 0, 900, 900]} for i in range(3)]
    c.example("finetune_refcoco.py", "--output_dir", c.tmp / "run", "--train_file", c.user_file("r.jsonl", rows),
              *USER_RUN)  # fmt: skip


@case("ex_patch_tiny_image_huge", "examples", "finetune_patch_vlm.py --tiny_image_size 100000 (a size without bound)",
      ["tiny_image_size"])  # fmt: skip
def _(c):
    c.example("finetune_patch_vlm.py", "--output_dir", c.tmp / "run", "--tiny_image_size", "100000", *TRAIN_ONE_STEP,
              timeout=90)  # fmt: skip


@case("ex_patch_tiny_patch_zero", "examples", "finetune_patch_vlm.py --tiny_patch_size 0", ["tiny_patch_size"])
def _(c):
    c.example("finetune_patch_vlm.py", "--output_dir", c.tmp / "run", "--tiny_patch_size", "0", *TRAIN_ONE_STEP)


@case("ex_patch_tiny_family_bogus", "examples", "finetune_patch_vlm.py --tiny_family blip", ["tiny_family"])
def _(c):
    c.example("finetune_patch_vlm.py", "--output_dir", c.tmp / "run", "--tiny_family", "blip", *TRAIN_ONE_STEP)


@case("ex_patch_model_not_patch_vlm", "examples", "finetune_patch_vlm.py --model_name_or_path of a VGP model",
      ["model_name_or_path|single"])  # fmt: skip
def _(c):
    c.example("finetune_patch_vlm.py", "--output_dir", c.tmp / "run", "--model_name_or_path", c.model(),
              *TRAIN_ONE_STEP)  # fmt: skip


@case("ex_patch_supervised_layer_beyond", "examples", "finetune_patch_vlm.py --supervised_layers 7 on a 2-layer model",
      ["supervised_layers"])  # fmt: skip
def _(c):
    c.example("finetune_patch_vlm.py", "--output_dir", c.tmp / "run", "--attention_supervision", "direct",
              "--supervised_layers", "7", *TRAIN_ONE_STEP)  # fmt: skip


@case("ex_patch_coverage_threshold", "examples", "finetune_patch_vlm.py --coverage_threshold 1.5",
      ["coverage_threshold"])  # fmt: skip
def _(c):
    c.example("finetune_patch_vlm.py", "--output_dir", c.tmp / "run", "--coverage_threshold", "1.5", *TRAIN_ONE_STEP)


@case("ex_captioning_beams_zero", "examples", "train_captioning.py --num_beams 0", ["num_beams"])
def _(c):
    c.example("train_captioning.py", "--output_dir", c.tmp / "run", "--num_beams", "0", *VGP_RUN)


@case("ex_captioning_max_new_tokens_negative", "examples", "train_captioning.py --max_new_tokens -1",
      ["max_new_tokens"])  # fmt: skip
def _(c):
    c.example("train_captioning.py", "--output_dir", c.tmp / "run", "--max_new_tokens", "-1", *VGP_RUN)


@case("ex_captioning_heads_not_dividing", "examples", "train_captioning.py --d_model 30 --attention_heads 4",
      ["d_model|attention_heads"])  # fmt: skip
def _(c):
    c.example("train_captioning.py", "--output_dir", c.tmp / "run", "--d_model", "30", "--attention_heads", "4",
              *VGP_RUN)  # fmt: skip


@case("ex_two_stream_top_k_zero", "examples", "pretrain_two_stream.py --alignment_top_k 0", ["alignment_top_k"])
def _(c):
    c.example("pretrain_two_stream.py", "--output_dir", c.tmp / "run", "--alignment_top_k", "0", *VGP_RUN)


@case("ex_two_stream_mlm_above_one", "examples", "pretrain_two_stream.py --mlm_probability 1.5", ["mlm_probability"])
def _(c):
    c.example("pretrain_two_stream.py", "--output_dir", c.tmp / "run", "--mlm_probability", "1.5", *VGP_RUN)


@case("ex_single_stream_region_mask_negative", "examples", "pretrain_single_stream.py --region_mask_probability -0.1",
      ["region_mask_probability"])  # fmt: skip
def _(c):
    c.example("pretrain_single_stream.py", "--output_dir", c.tmp / "run", "--region_mask_probability", "-0.1",
              *VGP_RUN)  # fmt: skip


@case("ex_samaran_supervisions_bogus", "examples", "samaran_table1.py --supervisions none,diagonal",
      ["supervisions|diagonal"])  # fmt: skip
def _(c):
    c.example("samaran_table1.py", "--output_dir", c.tmp / "run", "--supervisions", "none,diagonal",
              *samaran_files(c))  # fmt: skip


@case("ex_samaran_seeds_text", "examples", "samaran_table1.py --seeds one", ["seeds"])
def _(c):
    c.example("samaran_table1.py", "--output_dir", c.tmp / "run", "--seeds", "one", *samaran_files(c))


@case("ex_image_use_examples_zero", "examples", "finetune_vgp.py --image_use_examples 0", ["image_use_examples"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *TRAIN_ONE_STEP, "--image_use_examples", "0")


@case("ex_warmup_negative", "examples", "finetune_vgp.py --warmup_steps -5", ["warmup_steps"])
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *VGP_RUN, "--warmup_steps", "-5")


@case("ex_ewc_fisher_garbage", "examples", "finetune_vgp.py --ewc_fisher of a file that is not safetensors",
      ["ewc_fisher|fisher.safetensors"])  # fmt: skip
def _(c):
    c.write("fisher.safetensors", b"\x00" * 64)
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *VGP_RUN, "--ewc_weight", "1.0", "--ewc_fisher",
              c.tmp / "fisher.safetensors")  # fmt: skip


# ---- resume ---------------------------------------------------------------------------------------------------------


def resume_run(c: Ctx, damage: Callable[[Path], None], **spec) -> None:
    run = c.tmp / "run"
    run.mkdir()
    shutil.copytree(c.fx / "vgp" / "checkpoint-1", run / "checkpoint-1", copy_function=link_big_files)
    damage(run / "checkpoint-1")
    c.example("finetune_vgp.py", "--output_dir", run, *SYNTHETIC,
              "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_threads", "1", "--report_to", "none",
              "--image_use_examples", "2", "--resume_from_checkpoint", run / "checkpoint-1", **spec)  # fmt: skip


def link_big_files(source: str, target: str) -> None:
    """Hard-links files over 1 MB (a case replaces, never edits, the files it damages), copies the others."""
    if os.path.getsize(source) > 1_000_000:
        os.link(source, target)
    else:
        shutil.copy2(source, target)


def replace_file(path: Path, content: bytes | None) -> None:
    path.unlink()
    if content is not None:
        path.write_bytes(content)


@case("resume_trainer_state_truncated", "resume", "resume from a checkpoint whose trainer_state.json is cut",
      ["trainer_state.json"])  # fmt: skip
def _(c):
    resume_run(c, lambda ck: c.truncate(ck / "trainer_state.json", 0.5))


@case("resume_scheduler_garbage", "resume", "resume from a checkpoint whose scheduler.pt is garbage", ["scheduler.pt"])
def _(c):
    resume_run(c, lambda ck: replace_file(ck / "scheduler.pt", b"garbage" * 50))


@case("resume_weights_truncated", "resume", "resume from a checkpoint whose model.safetensors is cut",
      ["model.safetensors"])  # fmt: skip
def _(c):
    resume_run(c, lambda ck: c.truncate(ck / "model.safetensors", 0.5))


@case("resume_optimizer_missing", "resume", "resume from a checkpoint without optimizer.pt", ["optimizer"])
def _(c):
    resume_run(c, lambda ck: replace_file(ck / "optimizer.pt", None))


@case("resume_missing_checkpoint", "resume", "resume from a checkpoint folder that does not exist",
      ["resume_from_checkpoint|checkpoint-9"])  # fmt: skip
def _(c):
    c.example("finetune_vgp.py", "--output_dir", c.tmp / "run", *VGP_RUN, "--resume_from_checkpoint",
              c.tmp / "run" / "checkpoint-9")  # fmt: skip


@case("resume_config_of_other_model", "resume", "resume from a checkpoint whose config.json is another architecture",
      ["config|hidden_size|architecture|shape"])  # fmt: skip
def _(c):
    resume_run(c, lambda ck: c.edit_json(ck / "config.json", lambda cfg: cfg.update(hidden_size=64)))


@case("resume_rng_state_garbage", "resume", "resume from a checkpoint whose rng_state.pth is garbage",
      ["rng_state.pth"])  # fmt: skip
def _(c):
    resume_run(c, lambda ck: replace_file(ck / "rng_state.pth", b"\x80\x02garbage"))


# ---- the region store -----------------------------------------------------------------------------------------------

STORE_LOAD = """
from hf_vlalign.data import RegionFeatureStore
store = RegionFeatureStore.load("store")
accept(store[store.image_ids[0]]["features"])
"""


def store_copy(c: Ctx) -> Path:
    shutil.copytree(c.fx / "store", c.tmp / "store")
    return c.tmp / "store"


@case("store_missing_folder", "store", "RegionFeatureStore.load of a folder that does not exist", ["store"])
def _(c):
    c.python(STORE_LOAD)


@case("store_metadata_truncated", "store", "RegionFeatureStore.load with a cut store.json", ["store.json"])
def _(c):
    c.truncate(store_copy(c) / "store.json", 0.5)
    c.python(STORE_LOAD)


@case("store_arrow_truncated", "store", "RegionFeatureStore.load with a cut Arrow file", ["region_features.arrow"])
def _(c):
    c.truncate(store_copy(c) / "region_features.arrow", 0.5)
    c.python(STORE_LOAD)


@case("store_arrow_replaced", "store", "RegionFeatureStore.load whose Arrow file is another store's",
      ["region_features.arrow|sha256|checksum"])  # fmt: skip
def _(c):
    store = store_copy(c)
    data = bytearray((store / "region_features.arrow").read_bytes())
    data[-200] ^= 0xFF
    replace_file(store / "region_features.arrow", bytes(data))
    c.python(STORE_LOAD)


@case("store_unknown_image", "store", "store[image id it does not hold]", ["no-such-image"])
def _(c):
    store_copy(c)
    c.python("""
        from hf_vlalign.data import RegionFeatureStore
        RegionFeatureStore.load("store")["no-such-image"]
    """)


@case("store_image_id_int", "store", "store[100000] with an int id", ["100000|image_id"])
def _(c):
    store_copy(c)
    c.python("""
        from hf_vlalign.data import RegionFeatureStore
        accept(RegionFeatureStore.load("store")[100000]["features"])
    """)


@case("store_version_future", "store", "RegionFeatureStore.load of a store.json of format version 99",
      ["version|store.json"])  # fmt: skip
def _(c):
    store = store_copy(c)
    c.edit_json(store / "store.json", lambda m: m.update({k: 99 for k in m if "version" in k} or {"version": 99}))
    c.python(STORE_LOAD)


@case("store_padded_unknown_column", "store", "store.padded(ids, name='colours')", ["colours"])
def _(c):
    store_copy(c)
    c.python("""
        from hf_vlalign.data import RegionFeatureStore
        store = RegionFeatureStore.load("store")
        store.padded(store.image_ids[:2], name="colours")
    """)


@case("store_write_bad_record", "store", "RegionFeatureStore.write of a record whose boxes have 3 columns",
      ["boxes"])  # fmt: skip
def _(c):
    c.python("""
        import numpy as np
        from hf_vlalign.data import RegionFeatureStore
        RegionFeatureStore.write([{"image_id": "1", "features": np.ones((2, 4), np.float32),
                                   "boxes": np.ones((2, 3), np.float32)}], "out")
    """)


# ---- published-format readers in Python --------------------------------------------------------------------------


@case("flickr_sentence_unbalanced", "formats", "Flickr30k Entities sentence with an unclosed bracket",
      ["sentence|bracket|[/EN#2"])  # fmt: skip
def _(c):
    c.python("""
        from hf_vlalign.data.formats.flickr30k_entities import parse_sentence
        parse_sentence("[/EN#1/people A man in [/EN#2/clothing a red shirt .")
    """)


@case("flickr_sentences_latin1", "formats", "Flickr30k Entities Sentences file in Latin-1", ["1.txt"])
def _(c):
    c.write("1.txt", "[/EN#1/people A café owner] smiles .\n".encode("latin-1"))
    c.python("""
        from hf_vlalign.data.formats.flickr30k_entities import read_sentences
        read_sentences("1.txt")
    """)


@case("flickr_annotation_malformed_xml", "formats", "Flickr30k Entities annotation that is not XML", ["1.xml"])
def _(c):
    c.write("1.xml", "<annotation><object><name>1</name>\n")
    c.python("""
        from hf_vlalign.data.formats.flickr30k_entities import read_annotation
        read_annotation("1.xml")
    """)


@case("flickr_annotation_billion_laughs", "formats", "Flickr30k Entities annotation with an entity expansion bomb",
      ["1.xml|entit"])  # fmt: skip
def _(c):
    entities = ['<!ENTITY l0 "lol">'] + [f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10)]
    c.write("1.xml", f'<?xml version="1.0"?>\n<!DOCTYPE a [{"".join(entities)}]>\n<annotation><filename>&l9;'
                     "</filename></annotation>\n")  # fmt: skip
    c.python("""
        from hf_vlalign.data.formats.flickr30k_entities import read_annotation
        read_annotation("1.xml")
    """, timeout=90)


@case("flickr_annotation_inverted_box", "formats", "Flickr30k Entities annotation box with xmin > xmax",
      ["1.xml|xmin|box"])  # fmt: skip
def _(c):
    c.write("1.xml", "<annotation><filename>1.jpg</filename><size><width>100</width><height>100</height>"
                     "<depth>3</depth></size><object><name>1</name><bndbox><xmin>80</xmin><ymin>0</ymin>"
                     "<xmax>10</xmax><ymax>10</ymax></bndbox></object></annotation>\n")  # fmt: skip
    c.python("""
        from hf_vlalign.data.formats.flickr30k_entities import read_annotation
        read_annotation("1.xml")
    """)


@case("flickr_builder_split_lists_missing_image", "formats",
      "build_dataset('flickr30k_entities') whose split lists an image without files", ["999999"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "syn" / "flickr30k_entities", c.tmp / "f30k")
    with open(c.tmp / "f30k" / "val.txt", "a") as f:
        f.write("999999\n")
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("flickr30k_entities", "f30k", "val")
    """)


@case("vgp_csv_missing_column", "formats", "VGP csv without its phrase column", ["v.csv"])
def _(c):
    c.write("v.csv", "image,caption1,caption2\n1,a,b\n")
    c.python("""
        from hf_vlalign.data.formats.vgp import read_vgp_csv
        read_vgp_csv("v.csv")
    """)


@case("vgp_csv_bom_and_crlf_garbage", "formats", "VGP csv that is a binary file", ["v.csv"])
def _(c):
    c.write("v.csv", bytes(range(256)) * 4)
    c.python("""
        from hf_vlalign.data.formats.vgp import read_vgp_csv
        read_vgp_csv("v.csv")
    """)


@case("vgp_csv_truncated_row", "formats", "the synthetic VGP csv with its last row cut mid-field", ["v.csv"])
def _(c):
    text = (c.fx / "syn" / "vgp" / "train.csv").read_text()
    c.write("v.csv", text[: len(text) - 40])
    c.python("""
        from hf_vlalign.data.formats.vgp import read_vgp_csv
        read_vgp_csv("v.csv")
    """)


@case("lxmert_reader_base64_garbage", "formats", "iter_lxmert_tsv_records of a row whose boxes are not base64",
      ["boxes"])  # fmt: skip
def _(c):
    c.write("f.tsv", tsv_line(fields={"boxes": "!!!not base64!!!"}))
    c.python("""
        from hf_vlalign.data.formats.lxmert_tsv import iter_lxmert_tsv_records
        list(iter_lxmert_tsv_records("f.tsv"))
    """)


@case("gqa_questions_truncated", "formats", "build_dataset('gqa') with a cut questions file",
      ["train_balanced_questions.json"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "syn" / "gqa", c.tmp / "gqa")
    c.truncate(c.tmp / "gqa" / "train_balanced_questions.json", 0.5)
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("gqa", "gqa", "train")
    """)


@case("gqa_pointer_out_of_range", "formats", "build_dataset('gqa') with an annotation pointer past the question",
      ["99|pointer|annotations"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "syn" / "gqa", c.tmp / "gqa")
    path = c.tmp / "gqa" / "train_balanced_questions.json"

    def edit(questions):
        first = next(iter(questions.values()))
        first.setdefault("annotations", {}).setdefault("question", {})["99:120"] = "1"

    c.edit_json(path, edit)
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("gqa", "gqa", "train")
    """)


@case("gqa_question_is_list", "formats", "build_dataset('gqa') whose questions file is a JSON list",
      ["train_balanced_questions.json"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "syn" / "gqa", c.tmp / "gqa")
    replace_file(c.tmp / "gqa" / "train_balanced_questions.json", b"[1, 2, 3]")
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("gqa", "gqa", "train")
    """)


@case("nlvr2_label_maybe", "formats", "build_dataset('nlvr2') with label 'maybe'", ["label"])
def _(c):
    shutil.copytree(c.fx / "syn" / "nlvr2", c.tmp / "nlvr2")
    lines = (c.tmp / "nlvr2" / "train.json").read_text().splitlines()
    row = json.loads(lines[0])
    row["label"] = "maybe"
    lines[0] = json.dumps(row)
    replace_file(c.tmp / "nlvr2" / "train.json", ("\n".join(lines) + "\n").encode())
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("nlvr2", "nlvr2", "train")
    """)


@case("nlvr2_missing_identifier", "formats", "build_dataset('nlvr2') with a line missing 'identifier'",
      ["identifier"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "syn" / "nlvr2", c.tmp / "nlvr2")
    lines = (c.tmp / "nlvr2" / "train.json").read_text().splitlines()
    row = json.loads(lines[0])
    row.pop("identifier", None)
    lines[0] = json.dumps(row)
    replace_file(c.tmp / "nlvr2" / "train.json", ("\n".join(lines) + "\n").encode())
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("nlvr2", "nlvr2", "train")
    """)


@case("refcoco_malicious_pickle", "formats", "read_refs of a pickle that runs a command", ["refs|pickle|refs.p"])
def _(c):
    c.write("refs.p", pickle.dumps([Pwn()]))
    c.forbid("PWNED")
    c.python("""
        from hf_vlalign.data.builders.refcoco import read_refs
        read_refs("refs.p")
    """)


@case("refcoco_refs_wrong_shape", "formats", "read_refs of a pickle holding a list of ints", ["refs"])
def _(c):
    c.write("refs.p", pickle.dumps([1, 2, 3]))
    c.python("""
        from hf_vlalign.data.builders.refcoco import read_refs
        read_refs("refs.p")
    """)


@case("vqa_questions_missing_id", "formats", "build_dataset('vqa_v2') whose question lacks question_id",
      ["question_id"])  # fmt: skip
def _(c):
    c.write("vqa/v2_OpenEnded_mscoco_train2014_questions.json",
            json.dumps({"questions": [{"image_id": 1, "question": "what ?"}]}))  # fmt: skip
    c.write("vqa/v2_mscoco_train2014_annotations.json", json.dumps({"annotations": []}))
    c.python("""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("vqa_v2", "vqa", "train")
    """)


@case("build_dataset_bad_split", "formats", "build_dataset('nlvr2', split='testA')", ["split|testA"])
def _(c):
    c.python(f"""
        from hf_vlalign.data.builders import build_dataset
        build_dataset("nlvr2", {str(c.fx / "syn" / "nlvr2")!r}, "testA")
    """)


# ---- user-data files in Python ------------------------------------------------------------------------------------


@case("user_task_bogus", "user_data", "load_user_data(task='captions')", ["task|captions"])
def _(c):
    c.user_file("caps.jsonl", caption_rows())
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("caps.jsonl", "captions")
    """)


@case("user_regions_on_some_rows", "user_data", "load_user_data with regions on one row only", ["regions"])
def _(c):
    rows = caption_rows()
    rows[0]["regions"] = [[0, 0, 10, 10]]
    c.user_file("caps.jsonl", rows)
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("caps.jsonl", "caption")
    """)


@case("user_same_stem_two_folders", "user_data", "load_user_data of two images with one stem in two folders",
      ["100000|stem"])  # fmt: skip
def _(c):
    rows = caption_rows(2)
    c.user_file("caps.jsonl", rows)
    shutil.copy(c.tmp / "photos" / "100001.png", c.write("other/100000.png", b""))
    rows[1]["image"] = "other/100000.png"
    c.user_file("caps.jsonl", rows)
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("caps.jsonl", "caption")
    """)


@case("user_region_options_grid_huge", "user_data", "load_user_data(region_options={'grid_size': 100000})",
      ["grid_size"])  # fmt: skip
def _(c):
    c.user_file("caps.jsonl", caption_rows())
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("caps.jsonl", "caption", region_options={"grid_size": 100000})
    """)


@case("user_vqa_answers_empty", "user_data", "load_user_data(vqa) with answers []", ["answers"])
def _(c):
    c.user_file("q.jsonl", [{"image": "photos/100000.png", "question": "what ?", "answers": []}])
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("q.jsonl", "vqa")
    """)


@case("user_caption_empty_text", "user_data", "load_user_data(caption) with an empty caption", ["caption"])
def _(c):
    c.user_file("caps.jsonl", [{"image": "photos/100000.png", "caption": ""}])
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("caps.jsonl", "caption")
    """)


@case("user_phrase_start_wrong", "user_data", "load_user_data with a phrase start offset past the caption",
      ["start"])  # fmt: skip
def _(c):
    rows = caption_rows()
    rows[0]["phrases"][0]["start"] = 500
    c.user_file("caps.jsonl", rows)
    c.python("""
        from hf_vlalign.data.builders.user_data import load_user_data
        load_user_data("caps.jsonl", "caption")
    """)


@case("user_cache_race", "user_data", "two processes fill one user-feature cache at once, then a third reads it",
      ["(good input: any refusal is a failure)"])  # fmt: skip
def _(c):
    c.user_file("caps.jsonl", caption_rows())
    c.python("""
        import multiprocessing as mp, os
        os.environ["HF_VLALIGN_CACHE"] = os.path.abspath("race_cache")
        def load(_):
            from hf_vlalign.data.builders.user_data import load_user_data
            data = load_user_data("caps.jsonl", "caption")
            return data.store.feature_dim, len(data.train)
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                results = pool.map(load, [0, 1])
            results.append(load(2))
            if len(set(results)) != 1:
                raise RuntimeError(f"the cache gave different data: {results}")
    """, ok_if_success=True)


# ---- the processor ------------------------------------------------------------------------------------------------

PROCESSOR = """
import hf_vlalign
from transformers import AutoProcessor
processor = AutoProcessor.from_pretrained("vgp")
"""


def processor_case(c: Ctx, call: str, edit: Callable[[dict], None] | None = None) -> None:
    model = c.model()
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    if edit is not None:
        c.edit_json(model / "processor_config.json", edit)
    c.python(PROCESSOR + textwrap.dedent(call))


def set_nested(config: dict, key: str, value) -> None:
    """Sets `key` wherever it appears in a (nested) JSON object; at top level when it appears nowhere."""
    found = False
    for name, item in list(config.items()):
        if name == key:
            config[name] = value
            found = True
        elif isinstance(item, dict):
            found = set_nested_found(item, key, value) or found
    if not found:
        config[key] = value


def set_nested_found(config: dict, key: str, value) -> bool:
    found = False
    for name, item in list(config.items()):
        if name == key:
            config[name] = value
            found = True
        elif isinstance(item, dict):
            found = set_nested_found(item, key, value) or found
    return found


@case("proc_image_missing", "processor", "processor(images='photos/nothere.png')", ["nothere.png"])
def _(c):
    processor_case(c, "processor(images='photos/nothere.png', text='a shape')")


@case("proc_counts_differ", "processor", "processor with 2 images and 1 text", ["text|images"])
def _(c):
    processor_case(c, "processor(images=['photos/100000.png', 'photos/100001.png'], text=['a shape'])")


@case("proc_box_inverted", "processor", "processor(boxes=[[60, 60, 10, 10]])", ["box"])
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a', boxes=[[60, 60, 10, 10]]))")


@case("proc_box_nan", "processor", "processor(boxes=[[nan, 0, 10, 10]])", ["box"])
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a', boxes=[[float('nan'), 0, 10, 10]]))")


@case("proc_box_outside", "processor", "processor(boxes=[[0, 0, 5000, 5000]]) on a 128 px image", ["box"])
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a', boxes=[[0, 0, 5000, 5000]]))")


@case("proc_image_seven_channels", "processor", "processor(images=np.zeros((32, 32, 7)))", ["image|channel"])
def _(c):
    processor_case(c, "import numpy as np\naccept(processor(images=np.zeros((32, 32, 7), np.uint8), text='a'))")


@case("proc_image_empty", "processor", "processor(images=a 0 x 5 PIL image)", ["image|size|empty"])
def _(c):
    processor_case(c, "from PIL import Image\naccept(processor(images=Image.new('RGB', (0, 5)), text='a'))")


@case("proc_text_int", "processor", "processor(text=123)", ["text"])
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text=123))")


@case("proc_return_tensors_np", "processor", "processor(return_tensors='np')", ["return_tensors"])
def _(c):
    processor_case(c, "processor(images='photos/100000.png', text='a', return_tensors='np')")


@case("proc_feature_dim_huge", "processor", "AutoProcessor of a processor_config.json with feature_dim 1e9",
      ["feature_dim"])  # fmt: skip
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a'))",
                   lambda p: set_nested(p, "feature_dim", 10**9))  # fmt: skip


@case("proc_grid_size_text", "processor", "AutoProcessor of a processor_config.json with grid_size 'four'",
      ["grid_size"])  # fmt: skip
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a'))",
                   lambda p: set_nested(p, "grid_size", "four"))  # fmt: skip


@case("proc_config_missing", "processor", "AutoProcessor of a folder without processor_config.json",
      ["processor_config.json|processor"])  # fmt: skip
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a'))")
    (c.tmp / "vgp" / "processor_config.json").unlink()


@case("proc_encoder_unknown", "processor", "AutoProcessor of a processor_config.json naming an encoder 'magic'",
      ["encoder|magic"])  # fmt: skip
def _(c):
    processor_case(c, "accept(processor(images='photos/100000.png', text='a'))",
                   lambda p: set_nested(p, "encoder", "magic"))  # fmt: skip


@case("proc_image_decompression_bomb", "processor", "processor(images=a 30000 x 30000 PNG of 1 MB)",
      ["bomb.png|images"])  # fmt: skip
def _(c):
    from PIL import Image

    model = c.model()
    del model
    Image.new("1", (30000, 30000)).save(c.tmp / "bomb.png")
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.python(PROCESSOR + "accept(processor(images='bomb.png', text='a'))", timeout=90)


# ---- the pipeline ----------------------------------------------------------------------------------------------------

PIPELINE = """
import hf_vlalign
from transformers import pipeline
grounder = pipeline("word-region-attention", model="vgp")
"""


def pipeline_case(c: Ctx, call: str) -> None:
    c.model()
    shutil.copytree(c.fx / "photos", c.tmp / "photos")
    c.python(PIPELINE + textwrap.dedent(call))


@case("pipe_top_k_zero", "pipeline", "pipeline(..., top_k=0)", ["top_k"])
def _(c):
    pipeline_case(c, "accept(grounder('photos/100000.png', text='a shape', top_k=0))")


@case("pipe_batch_size_float", "pipeline", "pipeline(..., batch_size=2.5)", ["batch_size"])
def _(c):
    pipeline_case(c, "accept(grounder(['photos/100000.png'] * 2, text=['a shape'] * 2, batch_size=2.5))")


@case("pipe_layer_out_of_range", "pipeline", "pipeline(..., layer=40)", ["layer"])
def _(c):
    pipeline_case(c, "accept(grounder('photos/100000.png', text='a shape', layer=40))")


@case("pipe_image_missing", "pipeline", "pipeline('photos/nothere.png')", ["nothere.png"])
def _(c):
    pipeline_case(c, "grounder('photos/nothere.png', text='a shape')")


@case("pipe_no_text", "pipeline", "pipeline(image) without text", ["text"])
def _(c):
    pipeline_case(c, "accept(grounder('photos/100000.png'))")


@case("pipe_explorer_user_file", "pipeline", "pipeline(..., explorer='notes.html') onto the user's page",
      ["explorer|notes.html"])  # fmt: skip
def _(c):
    c.protect(c.write("notes.html", "<html>mine</html>\n"))
    pipeline_case(c, "accept(grounder('photos/100000.png', text='a shape', explorer='notes.html'))")


@case("pipe_empty_text", "pipeline", "pipeline(image, text='')", ["text"])
def _(c):
    pipeline_case(c, "accept(grounder('photos/100000.png', text=''))")


# ---- the collators -------------------------------------------------------------------------------------------------

COLLATOR = """
from transformers import AutoTokenizer
from hf_vlalign.data import RegionFeatureStore
tokenizer = AutoTokenizer.from_pretrained("vgp")
store = RegionFeatureStore.load("store")
image = store.image_ids[0]
"""


def collator_case(c: Ctx, code: str) -> None:
    c.model()
    store_copy(c)
    c.python(COLLATOR + textwrap.dedent(code))


@case("coll_row_missing_caption", "collators", "GroundedCaptionCollator of a row without its caption", ["caption"])
def _(c):
    collator_case(c, """
        from hf_vlalign.data import GroundedCaptionCollator
        accept(GroundedCaptionCollator(tokenizer, store, text_columns=("caption",))([{"image_id": image}]))
    """)


@case("coll_unknown_image", "collators", "GroundedCaptionCollator of a row whose image the store lacks",
      ["no-such-image"])  # fmt: skip
def _(c):
    collator_case(c, """
        from hf_vlalign.data import GroundedCaptionCollator
        GroundedCaptionCollator(tokenizer, store, text_columns=("caption",))([{"image_id": "no-such-image",
                                                                                 "caption": "a shape"}])
    """)


@case("coll_empty_batch", "collators", "VGPCollator([])", ["batch|empty|features"])
def _(c):
    collator_case(c, """
        from hf_vlalign.data import VGPCollator
        accept(VGPCollator(tokenizer, store)([]))
    """)


@case("coll_num_answers_zero", "collators", "QuestionAnsweringCollator(num_answers=0)", ["num_answers"])
def _(c):
    collator_case(c, """
        from hf_vlalign.data import QuestionAnsweringCollator
        accept(QuestionAnsweringCollator(tokenizer, store, num_answers=0)([{"image_id": image, "question": "what ?",
                                                                           "labels": [0], "scores": [1.0]}]))
    """)


@case("coll_label_out_of_vocab", "collators", "QuestionAnsweringCollator row whose label 7 is past num_answers=3",
      ["labels|7"])  # fmt: skip
def _(c):
    collator_case(c, """
        from hf_vlalign.data import QuestionAnsweringCollator
        accept(QuestionAnsweringCollator(tokenizer, store, num_answers=3)([{"image_id": image, "question": "what ?",
                                                                           "labels": [7], "scores": [1.0]}]))
    """)


@case("coll_max_text_length_negative", "collators", "VGPCollator(max_text_length=-4)", ["max_text_length"])
def _(c):
    collator_case(c, """
        from hf_vlalign.data import VGPCollator
        VGPCollator(tokenizer, store, max_text_length=-4)
    """)


@case("coll_caption_is_list", "collators", "GroundedCaptionCollator of a row whose caption is a list",
      ["caption"])  # fmt: skip
def _(c):
    collator_case(c, """
        from hf_vlalign.data import GroundedCaptionCollator
        accept(GroundedCaptionCollator(tokenizer, store, text_columns=("caption",))([{"image_id": image,
                                                                                        "caption": ["a", "b"]}]))
    """)


# ---- from_pretrained / save_pretrained -------------------------------------------------------------------------

LOAD = """
import hf_vlalign
from transformers import AutoModel
model = AutoModel.from_pretrained("vgp")
"""
BOXES = "torch.tensor([[[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]]])"
FORWARD = """
import torch
accept(model(input_ids=torch.tensor({input_ids}), visual_feats={feats}, visual_boxes={boxes}).last_hidden_state)
"""


def load_case(c: Ctx, damage: Callable[[Path], None], extra: str = "") -> None:
    damage(c.model())
    c.python(LOAD + textwrap.dedent(extra))


@case("load_hidden_size_text", "from_pretrained", "config.json hidden_size 'big'", ["hidden_size"])
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(hidden_size="big")))


@case("load_heads_not_dividing", "from_pretrained", "config.json num_attention_heads 5 with hidden_size 384",
      ["num_attention_heads|hidden_size"])  # fmt: skip
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(num_attention_heads=5)))


@case("load_config_truncated", "from_pretrained", "config.json cut in the middle", ["config.json"])
def _(c):
    load_case(c, lambda m: c.truncate(m / "config.json", 0.5))


@case("load_model_type_unknown", "from_pretrained", "config.json model_type 'vlbert-9000'", ["vlbert-9000"])
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(model_type="vlbert-9000")))


@case("load_weights_truncated", "from_pretrained", "model.safetensors cut in the middle", ["model.safetensors"])
def _(c):
    load_case(c, lambda m: c.truncate(m / "model.safetensors", 0.5))


@case("load_weights_missing", "from_pretrained", "no weights file", ["safetensors|weights|vgp"])
def _(c):
    load_case(c, lambda m: (m / "model.safetensors").unlink())


@case("load_weights_nan", "from_pretrained", "model.safetensors holding NaN weights: forward on good inputs",
      ["nan|weight"])  # fmt: skip
def _(c):
    def damage(model: Path) -> None:
        from safetensors.torch import load_file, save_file

        weights = load_file(model / "model.safetensors")
        for name in weights:
            if "query.weight" in name:
                weights[name].fill_(float("nan"))
        replace_file(model / "model.safetensors", None)
        save_file(weights, model / "model.safetensors", metadata={"format": "pt"})

    damage(c.model(real_copy=True))
    c.python(LOAD + FORWARD.format(input_ids="[[101, 2000, 102]]", boxes=BOXES,
                                   feats="torch.zeros(1, 2, model.config.visual_feat_dim)"))  # fmt: skip


@case("load_weights_wrong_shape", "from_pretrained", "model.safetensors with one tensor of the wrong shape",
      ["shape|size"])  # fmt: skip
def _(c):
    def damage(model: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        weights = load_file(model / "model.safetensors")
        name = next(n for n in weights if n.endswith("query.weight"))
        weights[name] = torch.zeros(3, 3)
        replace_file(model / "model.safetensors", None)
        save_file(weights, model / "model.safetensors", metadata={"format": "pt"})

    load_case(c, damage)


@case("load_visual_feat_dim_zero", "from_pretrained", "config.json visual_feat_dim 0", ["visual_feat_dim"])
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(visual_feat_dim=0)))


@case("load_supervised_layers_beyond", "from_pretrained", "config.json supervised_layers [99]",
      ["supervised_layers"])  # fmt: skip
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(supervised_layers=[99])))


@case("load_max_positions_huge", "from_pretrained", "config.json max_position_embeddings 10**11 (a size bomb)",
      ["max_position_embeddings"])  # fmt: skip
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(max_position_embeddings=10**11)))


@case("load_config_not_object", "from_pretrained", "config.json holding a JSON list", ["config.json"])
def _(c):
    load_case(c, lambda m: replace_file(m / "config.json", b"[1, 2]"))


@case("load_attention_supervision_bogus", "from_pretrained", "config.json attention_supervision 'sideways'",
      ["attention_supervision"])  # fmt: skip
def _(c):
    load_case(c, lambda m: c.edit_json(m / "config.json", lambda cfg: cfg.update(attention_supervision="sideways")))


@case("forward_input_ids_past_vocab", "from_pretrained", "model(input_ids=[[10**6]]) past the vocabulary",
      ["input_ids"])  # fmt: skip
def _(c):
    load_case(c, lambda m: None, FORWARD.format(input_ids="[[101, 10**6, 102]]", boxes=BOXES,
                                                feats="torch.zeros(1, 2, model.config.visual_feat_dim)"))  # fmt: skip


@case("forward_boxes_nan", "from_pretrained", "model(visual_boxes=NaN) on the CPU", ["visual_boxes"])
def _(c):
    load_case(c, lambda m: None, FORWARD.format(input_ids="[[101, 2000, 102]]",
                                                boxes="torch.full((1, 2, 4), float('nan'))",
                                                feats="torch.zeros(1, 2, model.config.visual_feat_dim)"))  # fmt: skip


@case("forward_feats_wrong_dim", "from_pretrained", "model(visual_feats of 7 dims)", ["visual_feats|visual_feat_dim"])
def _(c):
    load_case(c, lambda m: None, FORWARD.format(input_ids="[[101, 2000, 102]]", boxes=BOXES,
                                                feats="torch.zeros(1, 2, 7)"))  # fmt: skip


@case("save_onto_file", "save", "model.save_pretrained onto the user's file", ["notes.txt|save_directory"])
def _(c):
    c.protect(c.write("notes.txt", "notes\n"))
    load_case(c, lambda m: None, "model.save_pretrained('notes.txt')")


@case("save_into_model_symlink_loop", "save", "model.save_pretrained into a symlink loop", ["loop|out"])
def _(c):
    os.symlink(c.tmp / "out2", c.tmp / "out")
    os.symlink(c.tmp / "out", c.tmp / "out2")
    load_case(c, lambda m: None, "model.save_pretrained('out')")


# ---- the patch models ------------------------------------------------------------------------------------------


@case("patch_probe_batch_zero", "patch_models", "probe of a tiny ViLT with --batch_size 0", ["batch_size"])
def _(c):
    c.cli("probe", c.model("vilt"), *SYNTHETIC, "--batch_size", "0")


@case("patch_llava_wrong_type_config", "patch_models", "probe of a tiny LLaVA whose text_config.hidden_size is 'x'",
      ["hidden_size"])  # fmt: skip
def _(c):
    model = c.model("llava")
    c.edit_json(model / "config.json", lambda cfg: set_nested(cfg, "hidden_size", "x"))
    c.cli("probe", model, *SYNTHETIC)


@case("patch_paligemma_no_processor", "patch_models", "explore of a tiny PaliGemma without its processor files",
      ["processor|preprocessor_config.json"])  # fmt: skip
def _(c):
    model = c.model("paligemma")
    for name in ("processor_config.json", "preprocessor_config.json"):
        if (model / name).exists():
            (model / name).unlink()
    c.cli("explore", model, *SYNTHETIC, "--num_examples", "1", "--probe_examples", "0", "--out", c.tmp / "p.html")


@case("patch_llava_patch_size_zero", "patch_models", "load a tiny LLaVA whose vision patch_size is 0", ["patch_size"])
def _(c):
    model = c.model("llava")
    c.edit_json(model / "config.json", lambda cfg: set_nested(cfg, "patch_size", 0))
    c.python("""
        from hf_vlalign.vlms.loading import load_patch_model
        load_patch_model("llava")
    """)


@case("patch_tiny_image_size_huge", "patch_models", "tiny_patch_model('vilt', image_size=160000)", ["image_size"])
def _(c):
    c.python("""
        from hf_vlalign.vlms.tiny import tiny_patch_model
        tiny_patch_model("vilt", image_size=160000, patch_size=16)
    """, timeout=90)


@case("patch_tiny_heads_not_dividing", "patch_models", "tiny_patch_model('llava', hidden_size=30, num_heads=4)",
      ["hidden_size|num_heads"])  # fmt: skip
def _(c):
    c.python("""
        from hf_vlalign.vlms.tiny import tiny_patch_model
        tiny_patch_model("llava", hidden_size=30, num_heads=4)
    """)


@case("patch_vilt_weights_truncated", "patch_models", "analyze of a tiny ViLT whose model.safetensors is cut",
      ["model.safetensors"])  # fmt: skip
def _(c):
    model = c.model("vilt", real_copy=True)
    c.truncate(model / "model.safetensors", 0.5)
    c.cli("analyze", model, *SYNTHETIC, "--max_examples", "2", "--out", c.tmp / "an")


@case("patch_probe_box_beyond_image", "patch_models",
      "probe of a tiny LLaVA on Flickr30k Entities whose annotation box lies beyond the image",
      ["xmax|box|xml"])  # fmt: skip
def _(c):
    shutil.copytree(c.fx / "syn" / "flickr30k_entities", c.tmp / "f30k")
    for path in sorted((c.tmp / "f30k" / "Annotations").glob("*.xml")):
        text = path.read_text()
        path.unlink()
        path.write_text(re.sub(r"<xmax>\d+</xmax>", "<xmax>5000</xmax>", text, count=1))
    c.cli("probe", c.model("llava"), "--data", "flickr30k_entities", "--flickr30k_entities_dir", c.tmp / "f30k",
          "--images_dir", c.fx / "syn" / "images", "--split", "val")  # fmt: skip


@case("patch_vilt_unsupported_head", "patch_models", "probe of a ViLT whose architectures names no class",
      ["architectures|vilt|Vilt"])  # fmt: skip
def _(c):
    model = c.model("vilt")
    c.edit_json(model / "config.json", lambda cfg: cfg.update(architectures=["ViltForTokenClassification9"]))
    c.cli("probe", model, *SYNTHETIC)


# ---- faults while saving: full disk (EFBIG) and kills ------------------------------------------------------------


@case("fault_probe_json_full_disk", "faults", "probe --json over a previous result, disk full mid-write", [])
def _(c):
    c.previous("probe.json")
    c.cli("probe", c.model(), *SYNTHETIC, "--json", c.tmp / "probe.json", fault="full_disk", fault_bytes=256)


@case("fault_probe_json_kill", "faults", "probe --json over a previous result, killed mid-write", [])
def _(c):
    c.previous("probe.json")
    c.cli("probe", c.model(), *SYNTHETIC, "--json", c.tmp / "probe.json", fault="kill", fault_bytes=256)


@case("fault_probe_plot_full_disk", "faults", "probe --plot over a previous heatmap, disk full mid-write", [])
def _(c):
    c.previous("probe.png")
    c.cli("probe", c.model(), *SYNTHETIC, "--plot", c.tmp / "probe.png", fault="full_disk", fault_bytes=2048)


@case("fault_evaluate_out_full_disk", "faults", "evaluate --out over a previous result, disk full mid-write", [])
def _(c):
    c.previous("eval.json")
    c.cli("evaluate", c.model(), "--task", "vgp", *SYNTHETIC, "--out", c.tmp / "eval.json", fault="full_disk",
          fault_bytes=64)  # fmt: skip


@case("fault_evaluate_out_kill", "faults", "evaluate --out over a previous result, killed mid-write", [])
def _(c):
    c.previous("eval.json")
    c.cli("evaluate", c.model(), "--task", "vgp", *SYNTHETIC, "--out", c.tmp / "eval.json", fault="kill",
          fault_bytes=64)  # fmt: skip


@case("fault_explore_out_full_disk", "faults", "explore --out over a previous page, disk full mid-write", [])
def _(c):
    c.previous("explore.html")
    c.cli("explore", c.model(), *SYNTHETIC, "--num_examples", "1", "--probe_examples", "0", "--out",
          c.tmp / "explore.html", fault="full_disk", fault_bytes=4096)  # fmt: skip


@case("fault_explore_out_kill", "faults", "explore --out over a previous page, killed mid-write", [])
def _(c):
    c.previous("explore.html")
    c.cli("explore", c.model(), *SYNTHETIC, "--num_examples", "1", "--probe_examples", "0", "--out",
          c.tmp / "explore.html", fault="kill", fault_bytes=4096)  # fmt: skip


@case("fault_fisher_out_kill", "faults", "fisher --out over a previous Fisher file, killed mid-write", [])
def _(c):
    c.previous("fisher.safetensors")
    c.cli("fisher", c.model(), *SYNTHETIC, "--num_batches", "1", "--out", c.tmp / "fisher.safetensors",
          fault="kill", fault_bytes=1 << 20, fault_at_start=True)  # fmt: skip


@case("fault_analyze_out_full_disk", "faults", "analyze --out over a previous analysis, disk full mid-write", [])
def _(c):
    c.previous("analysis")
    c.cli("analyze", c.model(), *SYNTHETIC, "--max_examples", "4", "--no_syntactic_grounding", "--out",
          c.tmp / "analysis", fault="full_disk", fault_bytes=1024)  # fmt: skip


@case("fault_convert_features_kill", "faults", "convert-features --overwrite over a previous store, killed mid-write",
      [])  # fmt: skip
def _(c):
    c.previous("store")
    c.cli("convert-features", c.fx / "syn" / "features" / "features.tsv", "--format", "lxmert_tsv", "--out",
          c.tmp / "store", "--overwrite", fault="kill", fault_bytes=4096)  # fmt: skip


@case("fault_save_pretrained_full_disk", "faults", "save_pretrained over a previous save, disk full mid-write", [])
def _(c):
    model = c.model(real_copy=True)
    c.protect(model, owned=True)
    c.python(LOAD + "model.save_pretrained('vgp')", fault="full_disk", fault_bytes=1 << 20)


@case("fault_save_pretrained_kill", "faults", "save_pretrained over a previous save, killed mid-write", [])
def _(c):
    model = c.model(real_copy=True)
    c.protect(model, owned=True)
    c.python(LOAD + "model.save_pretrained('vgp')", fault="kill", fault_bytes=1 << 20)


@case("fault_store_write_full_disk", "faults", "RegionFeatureStore.write over a previous store, disk full", [])
def _(c):
    c.previous("store")
    c.python("""
        from hf_vlalign.data import RegionFeatureStore
        old = RegionFeatureStore.load("store")
        records = [{k: v.numpy() if hasattr(v, "numpy") else v for k, v in r.items()} for r in old]
        RegionFeatureStore.write(records, "store", overwrite=True)
    """, fault="full_disk", fault_bytes=4096)


@case("fault_training_sigkill_at_checkpoint", "faults",
      "finetune_vgp.py resumed from checkpoint-1, SIGKILL as checkpoint-2 starts to appear", [])  # fmt: skip
def _(c):
    run = c.tmp / "run"
    run.mkdir()
    shutil.copytree(c.fx / "vgp" / "checkpoint-1", run / "checkpoint-1")
    c.protect(run / "checkpoint-1", owned=True)
    c.example("finetune_vgp.py", "--output_dir", run, *SYNTHETIC, "--max_steps", "2", "--per_device_train_batch_size",
              "4", "--num_threads", "1", "--report_to", "none", "--image_use_examples", "2", "--save_strategy",
              "steps", "--save_steps", "1", "--resume_from_checkpoint", run / "checkpoint-1", fault="sigkill_when",
              fault_glob="run/checkpoint-2*/*")  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# Protection checks
# ------------------------------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hashes(path: Path) -> dict[str, str]:
    if path.is_dir():
        return {str(p.relative_to(path)): sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": sha256(path)} if path.is_file() else {}


def complete(path: Path) -> bool:
    """Whether a file the library wrote is complete (parses as its kind)."""
    try:
        data = path.read_bytes()
        suffix = path.suffix
        if suffix == ".json":
            json.loads(data)
        elif suffix == ".png":
            return data.startswith(b"\x89PNG") and data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")
        elif suffix == ".html":
            return b"</html>" in data[-200:].lower()
        elif suffix == ".safetensors":
            (size,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + size])
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            return len(data) == 8 + size + end
        elif suffix == ".arrow":
            import pyarrow

            pyarrow.ipc.open_stream(data).read_all()
        return True
    except Exception:
        return False


def lost_files(protected: list[Protected]) -> list[str]:
    lost = []
    for item in protected:
        root = item.path
        for relative, digest in item.before.items():
            path = root / relative if relative else root
            if not path.is_file():
                lost.append(f"{path.name}: gone")
            elif sha256(path) != digest and not (item.owned and complete(path)):
                lost.append(f"{path.name}: {'truncated or damaged' if item.owned else 'replaced'}")
    return lost


# ------------------------------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------------------------------


def last_line(text: str) -> str:
    lines = [line.strip() for chunk in text.splitlines() for line in chunk.split("\r") if line.strip()]
    return lines[-1] if lines else ""


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b")


def exception_line(stderr: str) -> str:
    """The line naming the exception of the last traceback in `stderr` (its last line when none does)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if EXCEPTION_LINE.match(line):
            return line
    return last_line(stderr)


def names_expected(message: str, expect: tuple[str, ...]) -> bool:
    lowered = message.lower()
    return all(any(word.lower() in lowered for word in group.split("|")) for group in expect)


def classify(result: dict, expect: tuple[str, ...]) -> tuple[str, str]:
    """(outcome, message) of one child's result.

    `result`: kind ("cli" | "example" | "python"), fault (None | "full_disk" | "kill" | "sigkill_when"), rc,
    timed_out, stderr, stdout, python (the snippet's JSON: ok / nan / exc_type / message), lost (list of files),
    forbidden (files that appeared though they must not), ok_if_success.
    """
    if result.get("lost"):
        return "lost", "; ".join(result["lost"])[:MESSAGE_CHARS]
    if result.get("forbidden"):
        return "accepted", ("ran the input's command: " + "; ".join(result["forbidden"]))[:MESSAGE_CHARS]
    stderr = result.get("stderr", "")
    python = result.get("python") or {}
    if python and not python.get("ok"):
        message = f"{python.get('exc_type')}: {python.get('message', '')}"
    elif "Traceback (most recent call last)" in stderr:
        message = exception_line(stderr)
    else:
        message = last_line(stderr) or last_line(result.get("stdout", ""))
    if result.get("timed_out"):
        return "hang", f"timeout after {result.get('seconds', 0):.0f} s"
    if any(sign in message for sign in MEMORY_SIGNS):  # a size bomb stopped by the address-space limit
        return "hang", last_line(message)[:MESSAGE_CHARS]
    if result.get("fault"):
        # nothing lost (checked above): intact, or replaced by a complete new output of the library
        where = os.path.basename(result.get("fault_at", "")) or f"nothing: fault not reached ({last_line(message)})"
        if result["fault"] == "full_disk" and result.get("rc") not in (0, None) and "Traceback" in stderr:
            return "traceback", f"full disk at {where}: {last_line(message)}"[:MESSAGE_CHARS]
        how = {"kill": "killed mid-write", "sigkill_when": "SIGKILL"}.get(result["fault"], "full disk")
        if result["fault"] == "sigkill_when":
            where = "the new checkpoint" if result.get("harness_killed") else "never reached: the run ended first"
        return "clear", f"{how} (armed at {where}, exit {result.get('rc')}); previous output intact"[:MESSAGE_CHARS]
    refused = result.get("rc") != 0
    if result.get("kind") == "python":
        if python.get("ok"):
            if python.get("nan"):
                return "accepted", "NaN in the output"
            return ("clear" if result.get("ok_if_success") else "accepted"), "no exception"
        if not python:  # the child died before writing its result
            return "traceback", last_line(stderr)[:MESSAGE_CHARS] or f"exit status {result.get('rc')}"
        one_line = "\n" not in python.get("message", "").strip()
        outcome = "clear" if one_line and names_expected(message, expect) else "traceback"
        return outcome, (message if one_line else message.strip().splitlines()[0] + " [...]")[:MESSAGE_CHARS]
    if not refused:
        return ("clear" if result.get("ok_if_success") else "accepted"), "exit 0"
    line = message[:MESSAGE_CHARS]
    if "Traceback (most recent call last)" in stderr:
        return "traceback", line
    return ("clear" if names_expected(line, expect) else "traceback"), line


# ------------------------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------------------------


def child_env(tree: Path, fixtures: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(tree / "src"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_VLALIGN_CACHE=str(fixtures / "cache"),
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        MPLBACKEND="Agg",
    )
    return env


class Zygote:
    """A process that imported the library once and forks one child per case (see ZYGOTE)."""

    def __init__(self, tree: Path, fixtures: Path, scratch: Path):
        (scratch / "zygote").mkdir(exist_ok=True)
        prelude = scratch / "zygote" / "prelude.py"
        prelude.write_text(SNIPPET_PRELUDE)
        self.log = open(scratch / "zygote" / f"zygote-{id(self)}.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(prelude), str(ADDRESS_SPACE)], env=child_env(tree, fixtures),
            cwd=scratch, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
        )  # fmt: skip
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._reply(600)  # ready

    def _read(self) -> None:
        for line in self.process.stdout:
            self.replies.put(json.loads(line))
        self.replies.put(None)

    def _reply(self, timeout: float) -> dict:
        reply = self.replies.get(timeout=timeout)
        if reply is None:
            raise RuntimeError("the zygote died")
        return reply

    def run(self, request: dict, spec: Spec, cwd: Path) -> dict:
        start = time.monotonic()
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = self._reply(60)["pid"]
        timed_out = killed = False
        reply = None
        while reply is None:
            try:
                reply = self.replies.get(timeout=0.05 if spec.fault == "sigkill_when" else 0.5)
            except queue.Empty:
                if time.monotonic() - start > spec.timeout:
                    timed_out = True
                elif spec.fault == "sigkill_when" and any(
                    fnmatch.fnmatch(str(p.relative_to(cwd)), spec.fault_glob) for p in cwd.rglob("*")
                ):
                    killed = True
                if timed_out or killed:
                    kill_group(pid)
                    reply = self._reply(60)
                continue
            if reply is None:
                raise RuntimeError("the zygote died")
        kill_group(pid)  # the case's leftovers (e.g. a pool's workers)

        def read(name: str) -> str:
            return (cwd / name).read_bytes().decode("utf-8", "replace") if (cwd / name).exists() else ""

        return {
            "rc": reply["rc"], "timed_out": timed_out, "harness_killed": killed, "stdout": read("child.stdout"),
            "stderr": read("child.stderr"), "fault_at": read("child.fault"), "seconds": time.monotonic() - start,
        }  # fmt: skip

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def short_paths(text: str, case_dir: Path, fixtures: Path) -> str:
    """`text` with the case's folder written CASE and the fixtures' FIXTURES: a message names a file by its own
    name, never through the folder (whose name holds the case's id) the harness made."""
    return text.replace(str(case_dir), "CASE").replace(str(fixtures), "FIXTURES")


def run_case(case_: Case, tree: Path, fixtures: Path, scratch: Path, zygote: Zygote) -> dict:
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f"{case_.id}-", dir=scratch))
    ctx = Ctx(tmp, fixtures, tree)
    try:
        case_.build(ctx)
    except Exception as error:  # a harness bug: reported, never counted as the library's outcome
        return {"id": case_.id, "door": case_.door, "description": case_.description, "outcome": "harness_error",
                "message": f"{type(error).__name__}: {error}"[:MESSAGE_CHARS], "seconds": 0.0}  # fmt: skip
    spec = ctx.spec
    result_file = tmp / "child_result.json"
    request = {
        "kind": spec.kind, "argv": spec.argv, "cwd": str(tmp), "env": {"HARNESS_RESULT": str(result_file)},
        "fault": spec.fault, "fault_bytes": spec.fault_bytes, "fault_at_start": spec.fault_at_start,
    }  # fmt: skip
    child = zygote.run(request, spec, tmp)
    python = json.loads(result_file.read_text()) if result_file.exists() and result_file.stat().st_size else None
    for key in ("stdout", "stderr", "fault_at"):
        child[key] = short_paths(child[key], tmp, fixtures)
    if python and "message" in python:
        python["message"] = short_paths(python["message"], tmp, fixtures)
    child.update(
        kind=spec.kind, fault=spec.fault, python=python, ok_if_success=spec.ok_if_success,
        lost=lost_files(ctx.protected), forbidden=[p.name for p in ctx.forbidden if p.exists()],
    )  # fmt: skip
    outcome, message = classify(child, case_.expect)
    record = {
        "id": case_.id, "door": case_.door, "description": case_.description, "outcome": outcome,
        "message": message, "seconds": round(time.monotonic() - start, 1), "rc": child["rc"],
        "names_expected": bool(case_.expect) and names_expected(message, case_.expect),
    }  # fmt: skip
    if outcome != "clear" or os.environ.get("HARNESS_KEEP"):
        (scratch / "logs").mkdir(exist_ok=True)
        (scratch / "logs" / f"{case_.id}.stderr").write_text(child["stderr"][-20000:])
    shutil.rmtree(tmp, ignore_errors=True)
    return record


# ------------------------------------------------------------------------------------------------------------------
# Fixtures: built once per work_dir
# ------------------------------------------------------------------------------------------------------------------

FIXTURE_MODELS = """
import sys
from pathlib import Path
from transformers import CLIPConfig, CLIPModel
from hf_vlalign.vlms.tiny import tiny_patch_model
root = Path(sys.argv[1])
for family in ("llava", "vilt", "paligemma"):
    model, processor = tiny_patch_model(family, image_size=64, patch_size=16)
    model.save_pretrained(root / family)
    processor.save_pretrained(root / family)
clip = CLIPConfig(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
                  vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     image_size=32, patch_size=16), projection_dim=16)
CLIPModel(clip).save_pretrained(root / "clip")
"""


def build_fixtures(tree: Path, fixtures: Path) -> None:
    stamp = fixtures / "fixtures.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("tree") == str(tree):
        return
    if stamp.exists():  # another tree's fixtures: its models and results are rebuilt by this tree's code
        shutil.rmtree(fixtures)
    fixtures.mkdir(parents=True, exist_ok=True)
    env = child_env(tree, fixtures)

    def run(*argv: str) -> None:
        print("fixture:", " ".join(argv[:6]), flush=True)
        done = subprocess.run([sys.executable, *argv], cwd=fixtures, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"fixture failed: {argv}\n{done.stderr[-4000:]}")

    cli = ["-m", "hf_vlalign.cli"]
    if not (fixtures / "syn").exists():
        run(*cli, "synthesize", "--out", "syn", "--train_images", "6", "--val_images", "4")
    if not (fixtures / "vgp" / "model.safetensors").exists():
        shutil.rmtree(fixtures / "vgp", ignore_errors=True)
        run(str(tree / "examples" / "finetune_vgp.py"), "--output_dir", "vgp", *SYNTHETIC, "--max_steps", "2",
            "--per_device_train_batch_size", "4", "--num_threads", "1", "--report_to", "none",
            "--image_use_examples", "2", "--save_strategy", "steps", "--save_steps", "1")  # fmt: skip
    if not (fixtures / "store").exists():
        run(*cli, "convert-features", "syn/features/features.tsv", "--format", "lxmert_tsv", "--out", "store")
    if not (fixtures / "clip").exists():
        run("-c", FIXTURE_MODELS, str(fixtures))
    photos = fixtures / "photos"
    if not photos.exists():
        photos.mkdir()
        for i in range(3):
            shutil.copy(fixtures / "syn" / "images" / f"{100000 + i}.png", photos / f"{100000 + i}.png")
    previous = fixtures / "previous"
    if not (previous / "done").exists():
        shutil.rmtree(previous, ignore_errors=True)
        previous.mkdir()
        run(*cli, "probe", "vgp", *SYNTHETIC, "--json", "previous/probe.json", "--plot", "previous/probe.png")
        run(*cli, "evaluate", "vgp", "--task", "vgp", *SYNTHETIC, "--out", "previous/eval.json")
        run(*cli, "explore", "vgp", *SYNTHETIC, "--num_examples", "1", "--probe_examples", "0", "--out",
            "previous/explore.html")  # fmt: skip
        run(*cli, "fisher", "vgp", *SYNTHETIC, "--num_batches", "1", "--out", "previous/fisher.safetensors")
        run(*cli, "analyze", "vgp", *SYNTHETIC, "--max_examples", "4", "--no_syntactic_grounding", "--out",
            "previous/analysis")  # fmt: skip
        shutil.copytree(fixtures / "store", previous / "store")
        (previous / "done").write_text("")
    stamp.write_text(json.dumps({"tree": str(tree)}))


# ------------------------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------------------------


def counts(records: list[dict]) -> dict[str, int]:
    counted = Counter(record["outcome"] for record in records)
    return {outcome: counted.get(outcome, 0) for outcome in (*OUTCOMES, "harness_error") if counted.get(outcome)}


def compare(before_path: str, after_path: str) -> None:
    before = {r["id"]: r for r in json.loads(Path(before_path).read_text())["cases"]}
    after = {r["id"]: r for r in json.loads(Path(after_path).read_text())["cases"]}
    print(f"| case | door | before | after | after's message |\n|---|---|---|---|---|")
    for case_id in sorted(set(before) | set(after)):
        old, new = before.get(case_id, {}), after.get(case_id, {})
        if old.get("outcome") != new.get("outcome"):
            message = new.get("message", "").replace("|", "\\|")[:120]
            print(f"| {case_id} | {new.get('door', old.get('door'))} | {old.get('outcome', '-')} | "
                  f"{new.get('outcome', '-')} | {message} |")  # fmt: skip
    print()
    for label, records in (("before", before), ("after", after)):
        print(f"{label}: {len(records)} cases, {counts(list(records.values()))}")


DOCS_BEGIN = "<!-- benchmarks/bad_inputs.py: begin -->"
DOCS_END = "<!-- benchmarks/bad_inputs.py: end -->"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def docs_block(before: dict, after: dict) -> str:
    """The docs' table of outcomes per door, before and after, from two results files."""
    doors = sorted(set(before["counts_per_door"]) | set(after["counts_per_door"]))
    header = "| door | cases | " + " | ".join(f"{outcome} (before / after)" for outcome in OUTCOMES) + " |"
    rows = [header, "|---|---|" + "---|" * len(OUTCOMES)]
    for door in [*doors, "all"]:
        old = before["counts"] if door == "all" else before["counts_per_door"].get(door, {})
        new = after["counts"] if door == "all" else after["counts_per_door"].get(door, {})
        cells = " | ".join(f"{old.get(outcome, 0)} / {new.get(outcome, 0)}" for outcome in OUTCOMES)
        name = "**all**" if door == "all" else door
        rows.append(f"| {name} | {sum(new.values())} | {cells} |")
    return "\n".join([DOCS_BEGIN, *rows, DOCS_END])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="checkout whose src/ and examples/ are measured")
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cases", default="*", help="fnmatch patterns of case ids, comma-separated")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "bad_inputs_work")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--docs", action="store_true", help="rewrite the docs' block from results/bad_inputs_{before,after}.json")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.docs:
        from docs_blocks import replace_docs_block

        before, after = (json.loads((RESULTS_DIR / f"bad_inputs_{label}.json").read_text()) for label in ("before", "after"))
        print(replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(before, after)))
        return
    selected = [c for c in CASES if any(fnmatch.fnmatch(c.id, pattern) for pattern in args.cases.split(","))]
    if args.list:
        for c in selected:
            print(f"{c.door:16} {c.id:45} {c.description}")
        print(f"{len(selected)} cases, doors: {dict(Counter(c.door for c in selected))}")
        return
    if args.tree is None or args.out is None:
        parser.error("--tree and --out are required (or --compare / --list)")
    tree = args.tree.resolve()
    fixtures = (args.work_dir / "fixtures").resolve()
    start = time.monotonic()
    build_fixtures(tree, fixtures)
    fixture_seconds = time.monotonic() - start
    scratch = (args.work_dir / f"cases-{args.label}").resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    records: list[dict] = []
    local, zygotes = threading.local(), []

    def one(case_: Case) -> dict:
        if getattr(local, "zygote", None) is None or local.zygote.process.poll() is not None:
            local.zygote = Zygote(tree, fixtures, scratch)
            zygotes.append(local.zygote)
        record = run_case(case_, tree, fixtures, scratch, local.zygote)
        print(f"[{len(records) + 1:3}/{len(selected)}] {record['outcome']:10} {record['seconds']:6.1f}s "
              f"{case_.id}: {record['message'][:110]}", flush=True)  # fmt: skip
        records.append(record)
        return record

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, selected))
    for zygote in zygotes:
        zygote.close()
    order = {c.id: i for i, c in enumerate(CASES)}
    records.sort(key=lambda r: order[r["id"]])
    report = {
        "label": args.label, "tree": str(tree), "cases_total": len(records), "counts": counts(records),
        "tracebacks_naming_the_argument": sum(r["outcome"] == "traceback" and r["names_expected"] for r in records),
        "counts_per_door": {door: counts([r for r in records if r["door"] == door])
                            for door in dict.fromkeys(r["door"] for r in records)},
        "fixture_seconds": round(fixture_seconds, 1), "total_seconds": round(time.monotonic() - start, 1),
        "jobs": args.jobs,
        "full_disk": "RLIMIT_FSIZE armed at the child's first write in its folder (EFBIG), not a tmpfs",
        "kill": "RLIMIT_FSIZE with SIGXFSZ's default action (killed mid-write); one SIGKILL when a checkpoint appears",
        "cases": records,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("cases_total", "counts", "total_seconds")}))


if __name__ == "__main__":
    main()
