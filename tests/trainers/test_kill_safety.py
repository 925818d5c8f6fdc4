"""Nothing saved is lost: a kill at any instant of `save_pretrained` or of `convert_features(..., overwrite=True)` leaves
the old model (store) or the new one in place and loadable, never a mix nor nothing; the staging folders of killed
writers are removed by the next write; a store with a repeated image id is refused before it replaces anything.

Kills are real: a fork server (`tests/kill_safety_worker.py`) forks one child per save, which the test SIGKILLs at
random instants, or which ends itself (`os._exit`, no cleanup) just before its K-th file system operation, for every K
until the save completes: every step boundary. Both folder swaps are covered, the atomic exchange (Linux) and the
two-rename fallback (restored from its backup by the next load).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_single_stream import tiny_config

from hf_vlalign import SingleStreamForVisualParaphrase
from hf_vlalign.data import RegionFeatureStore, convert_features, extract_region_features
from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[1] / "kill_safety_worker.py"
KILLED = 86  # the worker's exit code for an injected kill
RANDOM_KILLS = 20  # real SIGKILLs per kind
MAX_HUNG_CHILDREN = 2  # forked children stuck on a library thread's lock (see the worker), rerun; more fail the test
USER_FILES = {"eval_results.json": '{"accuracy": 0.5}\n', "notes/readme.txt": "kept\n"}


class ForkServer:
    """The worker process; `run(command)` forks a child for it and returns its pid, `status()` how it ended."""

    def __init__(self, workdir: Path, step_deadline: float = 60.0):
        self.workdir = workdir
        self.hung_children = 0
        self.log = open(workdir / "worker.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(workdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "TQDM_DISABLE": "1",
                "KILL_SAFETY_STEP_DEADLINE": str(step_deadline),
            },
        )
        assert self.read() == "ready", (workdir / "worker.log").read_text()

    def read(self) -> str:
        line = self.process.stdout.readline().strip()
        assert line, f"the worker ended: {(self.workdir / 'worker.log').read_text()[-3000:]}"
        return line

    def start(self, *command) -> int:
        self.process.stdin.write(" ".join(map(str, command)) + "\n")
        self.process.stdin.flush()
        return int(self.read())

    def status(self) -> str:
        return self.read()

    def run(self, *command) -> str:
        self.start(*command)
        return self.status()

    def step(self, invariant, step: int, version: str, fallback: bool = False) -> str:
        """Saves `version` once, killed before its `step`-th operation (0: never); a hung child is checked, rerun."""
        command = ("step", invariant.kind, step, version, "fallback" if fallback else "")
        while (status := self.run(*command)) == "hung":
            self.hung_children += 1
            log = (self.workdir / "worker.log").read_text()[-6000:]
            assert self.hung_children <= MAX_HUNG_CHILDREN, f"saves hang, not a stray fork deadlock:\n{log}"
            print(f"rerun of a hung child ({' '.join(map(str, command))}):\n{log}")
            if invariant.target.exists() or fallback:
                invariant.check(fallback)  # the deadline's SIGKILL is one more kill at an arbitrary instant
        return status

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ForkServer(tmp_path_factory.mktemp("kills"))
    yield server
    server.close()


def files_of(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() or path.is_symlink()}


def staging_siblings(target: Path) -> list[Path]:
    return sorted(
        path for path in target.parent.iterdir() if path.name.startswith((f".{target.name}.", f"{target.name}."))
    )


class ModelInvariant:
    """After any kill: the target holds version a or version b of the model, whole, plus the user's files."""

    def __init__(self, workdir: Path):
        self.kind, self.target = "save", workdir / "model"
        self.references = {
            version: SingleStreamForVisualParaphrase.from_pretrained(workdir / f"ref_{version}").state_dict()
            for version in "ab"
        }
        self.expected_files = files_of(workdir / "ref_a") | set(USER_FILES) | {"latest"}
        self.restored = 0  # kills between the two renames of the fallback swap (the target was missing)
        self.left_behind = 0  # kills that left a staging (or old) folder beside the target

    def check(self, fallback: bool = False) -> str:
        self.left_behind += bool(staging_siblings(self.target))
        if not self.target.is_dir():
            # only possible between the two renames of the fallback; the next load restores the backup
            assert fallback and any(path.name.endswith(".old") for path in staging_siblings(self.target))
            self.restored += 1
        model = SingleStreamForVisualParaphrase.from_pretrained(self.target)  # the exchange: plain transformers'
        version = "a" if model.config.hidden_size == 32 else "b"
        loaded = model.state_dict()
        assert loaded.keys() == self.references[version].keys()
        for key, tensor in self.references[version].items():
            assert torch.equal(loaded[key], tensor), key
        assert files_of(self.target) == self.expected_files
        for name, text in USER_FILES.items():
            assert (self.target / name).read_text() == text
        assert os.readlink(self.target / "latest") == "notes"
        return version


class StoreInvariant:
    """After any kill: the target holds the store of source a or of source b, whole (sha256 verified)."""

    def __init__(self, workdir: Path):
        self.kind, self.target = "convert", workdir / "store"
        self.restored = 0
        self.left_behind = 0

    def check(self, fallback: bool = False) -> str:
        self.left_behind += bool(staging_siblings(self.target))
        if not self.target.is_dir():
            assert fallback and any(path.name.endswith(".old") for path in staging_siblings(self.target))
            self.restored += 1
        store = RegionFeatureStore.load(self.target, verify=True)
        version = store.image_ids[0][0]
        assert store.image_ids == [f"{version}{i}" for i in range({"a": 30, "b": 20}[version])]
        return version


def kill_at_every_step(server: ForkServer, invariant, fallback: bool) -> tuple[int, str]:
    """Kills a save before its 1st, 2nd, ... file system operation until one completes; checks after each."""
    version = invariant.check()
    step = 0
    while True:
        step += 1
        other = "b" if version == "a" else "a"
        status = server.step(invariant, step, other, fallback)
        if status == "exit 0":
            assert invariant.check(fallback) == other
            return step - 1, other
        assert status == f"exit {KILLED}", status
        version = invariant.check(fallback)
        assert step < 500, "a save that never completes"


def kill_at_random_instants(server: ForkServer, invariant, seed: int = 0) -> dict[str, int]:
    """Real SIGKILLs of a child saving a, b, a, b... at random instants within about two saves."""
    server.process.stdin.write(f"time {invariant.kind} a\n")
    server.process.stdin.flush()
    duration = float(server.read())  # the mean duration of a save in the worker; also leaves version a in place
    rng = random.Random(seed)
    seen = {"a": 0, "b": 0}
    for _ in range(RANDOM_KILLS):
        pid = server.start("loop", invariant.kind, rng.choice("ab"))
        time.sleep(rng.uniform(0, 2.5 * duration))
        os.kill(pid, signal.SIGKILL)
        assert server.status() == f"signal {signal.SIGKILL}"
        seen[invariant.check()] += 1
    return seen


def assert_a_kill_can_leave_a_staging_folder(server: ForkServer, invariant) -> None:
    """Kills saves of version b at steps 1, 2, ... until one leaves a staging folder behind."""
    for step in range(1, 500):
        assert server.step(invariant, step, "b") == f"exit {KILLED}"
        if staging_siblings(invariant.target):
            return
    raise AssertionError("no kill left a staging folder")


def test_a_killed_save_leaves_the_old_or_the_new_model(server):
    invariant = ModelInvariant(server.workdir)
    target = invariant.target
    assert server.step(invariant, 0, "a") == "exit 0"
    for name, text in USER_FILES.items():
        (target / name).parent.mkdir(exist_ok=True)
        (target / name).write_text(text)
    os.symlink("notes", target / "latest")
    steps, _ = kill_at_every_step(server, invariant, fallback=False)
    assert steps >= 10  # each of them a kill point checked
    fallback_steps, _ = kill_at_every_step(server, invariant, fallback=True)
    assert invariant.restored >= 1  # the fallback's window (target missing) was hit and restored on load
    seen = kill_at_random_instants(server, invariant)
    assert sum(seen.values()) == RANDOM_KILLS
    print(f"save: {steps} exchange steps, {fallback_steps} fallback steps, random kills {seen}")

    assert invariant.left_behind >= 1  # killed saves left staging folders...
    assert_a_kill_can_leave_a_staging_folder(server, invariant)
    assert server.step(invariant, 0, "b") == "exit 0"
    assert staging_siblings(target) == []  # ...which the next save removes
    assert invariant.check() == "b"


def test_a_killed_conversion_leaves_the_old_or_the_new_store(server):
    invariant = StoreInvariant(server.workdir)
    target = invariant.target
    assert server.step(invariant, 0, "a") == "exit 0"
    steps, _ = kill_at_every_step(server, invariant, fallback=False)
    assert steps >= 5
    fallback_steps, _ = kill_at_every_step(server, invariant, fallback=True)
    assert invariant.restored >= 1
    seen = kill_at_random_instants(server, invariant)
    print(f"convert: {steps} exchange steps, {fallback_steps} fallback steps, random kills {seen}")

    assert invariant.left_behind >= 1
    assert_a_kill_can_leave_a_staging_folder(server, invariant)
    assert server.step(invariant, 0, "b") == "exit 0"
    assert staging_siblings(target) == []
    assert invariant.check() == "b"


def test_a_hung_child_is_reported_with_its_stack_and_killed_never_waited_for(tmp_path):
    server = ForkServer(tmp_path, step_deadline=2.0)
    try:
        pid = server.start("step", "save", 0, "a", "stall")
        assert server.status() == "hung"
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        log = (tmp_path / "worker.log").read_text()
        assert f"hung: step save 0 a stall (pid {pid})" in log
        assert "in run_child" in log  # the stall's Python stack, dumped before the kill
        assert server.run("step", "save", 0, "a") == "exit 0"  # the worker goes on
    finally:
        server.close()


def test_a_save_keeps_the_folder_permissions_and_user_subfolders(tmp_path, monkeypatch):
    target = tmp_path / "model"
    target.mkdir(mode=0o750)
    os.chmod(target, 0o750)
    (target / "tokenizer").mkdir()
    (target / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    model = SingleStreamForVisualParaphrase(tiny_config())
    model.save_pretrained(target)
    model.save_pretrained(target)
    assert oct(target.stat().st_mode & 0o777) == oct(0o750)
    monkeypatch.chdir(target / "tokenizer")  # a save into the working folder (or its parent) keeps it usable
    model.save_pretrained("..")
    assert Path("vocab.txt").read_text() == "a\nb\n" and Path(os.getcwd()) == target / "tokenizer"
    assert (target / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


# --- a store that load would refuse is refused before it replaces anything -------------------------------------


def store_record(index: int, image_id: str) -> dict:
    rng = np.random.default_rng(index)
    corners = rng.uniform(0, 30, size=(3, 2)).astype(np.float32)
    return {
        "image_id": image_id,
        "image_size": (60, 90),
        "boxes": np.concatenate([corners, corners + 20], axis=1),
        "features": rng.standard_normal((3, 8), dtype=np.float32),
        "object_ids": rng.integers(0, 1600, 3),
        "object_conf": rng.random(3, dtype=np.float32),
        "attr_ids": rng.integers(0, 400, 3),
        "attr_conf": rng.random(3, dtype=np.float32),
    }


@pytest.fixture
def old_store(tmp_path) -> Path:
    out = tmp_path / "store"
    RegionFeatureStore.write([store_record(i, f"old{i}") for i in range(4)], out)
    return out


def assert_untouched(store: Path) -> None:
    assert RegionFeatureStore.load(store).image_ids == [f"old{i}" for i in range(4)]
    assert staging_siblings(store) == []


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_repeated_image_id_is_refused_naming_it_and_both_lines(old_store, tmp_path, on_error):
    source = tmp_path / "feats.tsv"
    ids = ["img0", "img1", "img2", "img3", "img1", "img5"]
    write_lxmert_tsv(source, [store_record(i, image_id) for i, image_id in enumerate(ids)])
    repeated = r"feats\.tsv, line 5, field 'image_id': the image id 'img1' repeats \(first at .*feats\.tsv, line 2\)"
    with pytest.raises(ValueError, match=repeated):
        convert_features(source, "lxmert_tsv", old_store, overwrite=True, on_error=on_error)
    assert_untouched(old_store)


def test_write_refuses_a_repeated_image_id_naming_it_and_both_records(old_store):
    records = [store_record(i, image_id) for i, image_id in enumerate(["x", "y", "x"])]
    with pytest.raises(ValueError, match=r"`records`: the image id 'x' of record 3 repeats record 1"):
        RegionFeatureStore.write(records, old_store, overwrite=True)
    assert_untouched(old_store)


def test_extraction_over_an_existing_store_refuses_a_repeated_id_and_keeps_it(old_store, tmp_path):
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        Image.new("RGB", (32, 24), color=(10, 20, 30)).save(tmp_path / folder / "same.png")
    images = [tmp_path / "one" / "same.png", tmp_path / "two" / "same.png"]
    with pytest.raises(ValueError, match=r"share the image id 'same'"):
        extract_region_features(images, old_store, grid_size=1, feature_dim=8, overwrite=True)
    assert_untouched(old_store)
    store = extract_region_features(images[:1], old_store, grid_size=1, feature_dim=8, overwrite=True)
    assert store.image_ids == ["same"] and staging_siblings(old_store) == []
    assert json.loads((old_store / "store.json").read_text())["num_images"] == 1
