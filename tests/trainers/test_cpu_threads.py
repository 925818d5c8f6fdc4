"""CPU threads of the examples: `accelerate launch` with no config hands its process OMP_NUM_THREADS=1, which the
examples read as "not chosen" and replace by the available cores (divided by the processes of the machine); a user's
own OMP_NUM_THREADS and `--num_threads` are kept. The runs are one step of `examples/finetune_vgp.py` on a tiny BERT,
real `accelerate launch` runs where the launcher's environment is the subject; each prints the count torch uses once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch_helpers import save_tiny_bert
from script_modules import load_script

from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.recipes import ModelArguments, available_cores, default_cpu_threads, parse_recipe_args
from hf_vlalign.synthetic import SyntheticSceneConfig

ROOT = Path(__file__).resolve().parents[2]
finetune_vgp = load_script("finetune_vgp", ROOT / "examples" / "finetune_vgp.py")
LAUNCHED = {"OMP_NUM_THREADS": "1", "ACCELERATE_DYNAMO_BACKEND": "NO"}  # what `accelerate launch` sets by default


def test_default_threads_fill_the_cores_unless_the_user_chose():
    assert default_cpu_threads({}, cores=8, local_processes=1) == 8
    assert default_cpu_threads(LAUNCHED, cores=8, local_processes=1) == 8  # accelerate's 1 is not a choice
    assert default_cpu_threads(LAUNCHED, cores=8, local_processes=2) == 4  # cores / processes of this machine
    assert default_cpu_threads(LAUNCHED, cores=3, local_processes=2) == 1
    assert default_cpu_threads(LAUNCHED, cores=1, local_processes=4) == 1
    # the user's own value (outside accelerate, or any value but accelerate's 1) is kept
    assert default_cpu_threads({"OMP_NUM_THREADS": "1"}, cores=8, local_processes=1) == 1
    assert default_cpu_threads({**LAUNCHED, "OMP_NUM_THREADS": "3"}, cores=8, local_processes=1) == 3
    assert default_cpu_threads({"OMP_NUM_THREADS": "12"}, cores=8, local_processes=2) == 12
    assert default_cpu_threads({"OMP_NUM_THREADS": "4,2"}, cores=8, local_processes=1) == 4  # OpenMP's nested list


def test_a_malformed_omp_num_threads_is_named():
    with pytest.raises(ValueError, match="`OMP_NUM_THREADS` must be a positive integer .*got 'two'"):
        default_cpu_threads({"OMP_NUM_THREADS": "two"}, cores=8, local_processes=1)


def test_num_threads_must_be_a_positive_integer(tmp_path):
    with pytest.raises(ValueError, match=r"^`--num_threads` must be an integer >= 1, got 0.$"):
        parse_recipe_args(["--num_threads", "0", "--output_dir", str(tmp_path)], (ModelArguments,))


@pytest.fixture(scope="module")
def tiny_text_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The example's scenes, written once here: the launches read them side by side."""
    cache = tmp_path_factory.mktemp("synthetic_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_VLALIGN_CACHE", str(cache))
        load_vgp_data(synthetic_config=SyntheticSceneConfig(num_train_images=12, num_val_images=6))
    return cache


def example_arguments(output_dir: Path, text_model: Path, extra: list[str]) -> list[str]:
    """`examples/finetune_vgp.py`'s arguments for one step of the tiny BERT."""
    return [
        "--model_name_or_path", str(text_model), "--output_dir", str(output_dir),
        "--synthetic_train_images", "12", "--synthetic_eval_images", "6", "--max_steps", "1", "--eval_strategy", "no",
        "--per_device_train_batch_size", "4", "--image_use_examples", "4", "--report_to", "none", *extra,
    ]  # fmt: skip


def launch(tmp_path: Path, cache: Path, text_model: Path, env: dict, extra: list[str]) -> subprocess.Popen:
    """Starts `accelerate launch examples/finetune_vgp.py` (no accelerate config, one CPU process) for one step."""
    env = {**env, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(cache), "CUDA_VISIBLE_DEVICES": ""}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "examples" / "finetune_vgp.py"),
        *example_arguments(tmp_path / "run", text_model, extra),
    ]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def printed_threads(process: subprocess.Popen) -> int:
    """The thread count a launched run printed (once)."""
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-4000:]
    return threads_in(stdout)


def threads_in(stdout: str) -> int:
    """The thread count a run printed (once)."""
    printed = re.findall(r"^hf_vlalign: (\d+) CPU thread\(s\) per process, 1 process\(es\)", stdout, re.M)
    assert len(printed) == 1, stdout[-2000:]  # logged once
    return int(printed[0])


@pytest.mark.slow
def test_accelerate_launch_uses_the_available_cores_by_default(tmp_path, cache, tiny_text_model):
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    assert printed_threads(launch(tmp_path, cache, tiny_text_model, env, [])) == available_cores()


@pytest.mark.slow
def test_num_threads_and_the_users_omp_num_threads_override_the_default(tmp_path, cache, tiny_text_model, capsys):
    chosen = available_cores() + 1  # neither the default nor accelerate's 1
    # the user's own value, passed on by a real launch
    by_environment = launch(tmp_path, cache, tiny_text_model, {**os.environ, "OMP_NUM_THREADS": str(chosen)}, [])
    # `--num_threads` over the environment a launch without config hands its process, in this process meanwhile
    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HF_VLALIGN_CACHE", str(cache))
            for key, value in LAUNCHED.items():
                patch.setenv(key, value)
            argv = example_arguments(tmp_path / "by_argument", tiny_text_model, ["--num_threads", str(chosen)])
            finetune_vgp.main(argv)
    finally:
        torch.set_num_threads(threads)
    assert threads_in(capsys.readouterr().out) == chosen
    assert printed_threads(by_environment) == chosen
