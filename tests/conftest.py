"""Shared fixtures: one real end-to-end run of the VGP example, reused by the tests that read its output, and a
local fake of the Hub's HTTP side; the `slow` marker of the tests that launch processes.

A test that starts a Python process (an example, the CLI, `accelerate launch`, `torchrun`) or a browser is marked
`slow`: `python -m pytest -m "not slow"` is the quick development run, the README's test command runs everything. An
unmarked test that starts one fails, naming the program, and a test that reads the `finetuned` run is marked `slow`
where it is collected.
"""

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi

ROOT = Path(__file__).resolve().parents[1]
# the test modules import helpers from one another (e.g. `from test_two_stream import tiny_config`), each folder of
# the suite (models per family, data, trainers, analysis, cli, examples, hub, project) is on sys.path
for _folder in sorted({path.parent for path in (ROOT / "tests").rglob("test_*.py")}):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
# DeepSpeed (the `test` extra) prints an accelerator notice on stdout when first imported, which accelerate does inside
# the first `save_pretrained` of a process: imported here, to stderr, so that no test's captured stdout holds it
if importlib.util.find_spec("deepspeed") is not None:
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: F401
# programs whose launch makes a test slow (a Python interpreter is matched by name too)
SLOW_PROGRAMS = ("accelerate", "torchrun", "hf-vlalign", "chromedriver", "chromium")
# fixtures that launch a process for the tests that use them
SLOW_FIXTURES = ("finetuned",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SLOW_FIXTURES):
            item.add_marker(pytest.mark.slow)


def _launched_program(args) -> str:
    """The name of the program a `subprocess.Popen` call starts (a shell command line: its first word)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        first = os.fsdecode(args).split()[0] if os.fsdecode(args).split() else ""
    else:
        first = os.fsdecode(list(args)[0]) if list(args) else ""
    return Path(first).name


def _is_slow_program(program: str) -> bool:
    return program == Path(sys.executable).name or program.startswith("python") or program in SLOW_PROGRAMS


@pytest.fixture(autouse=True)
def _process_launches_are_marked_slow(request, monkeypatch):
    """Fails an unmarked test that starts a Python process or a browser (see the module docstring)."""
    if request.node.get_closest_marker("slow") is not None:
        return
    launch = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        program = _launched_program(args)
        if _is_slow_program(program):
            raise AssertionError(f"{request.node.nodeid} launches `{program}`: mark it `@pytest.mark.slow`.")
        launch(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


@pytest.fixture(scope="session")
def finetuned(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("vgp")
    # the CPU (no visible GPU) under the shipped single-process config, as `accelerate launch` runs the README's main
    # job where that config is the machine's default; its stderr is kept for the test that it prints no notices
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(output_dir / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "examples" / "accelerate_configs" / "single_process.yaml"),
        str(ROOT / "examples" / "finetune_vgp.py"),
        "--output_dir", str(output_dir / "model"),
        "--synthetic_train_images", "12", "--synthetic_eval_images", "6",
        "--num_train_epochs", "1", "--per_device_train_batch_size", "16", "--supervision", "semi_direct",
    ]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    (output_dir / "launch_stderr.txt").write_text(completed.stderr)
    return output_dir


@pytest.fixture
def fake_hub(tmp_path, monkeypatch) -> Path:
    """`HfApi.create_repo` / `HfApi.upload_folder` writing into `tmp_path / "hub" / <repo_id>`."""
    remote = tmp_path / "hub"

    def create_repo(self, repo_id, *, exist_ok=False, private=None, **kwargs):
        folder = remote / repo_id
        if folder.exists() and not exist_ok:
            raise FileExistsError(f"{repo_id} exists")
        folder.mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, create_pr=False, **kwargs):
        assert (remote / repo_id).is_dir(), "upload_folder before create_repo"
        shutil.copytree(folder_path, remote / repo_id, dirs_exist_ok=True)
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123456789abcdef")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return remote


@pytest.fixture(scope="module")
def synthetic_scene_cache(tmp_path_factory):
    """A module's synthetic scenes are generated into a temporary cache, not the user's (`usefixtures` it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_VLALIGN_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded default's real MiniLM tokenizer (a module may define its own `tokenizer` fixture instead)."""
    from transformers import AutoTokenizer

    from hf_vlalign import default_text_model_path

    return AutoTokenizer.from_pretrained(default_text_model_path())
