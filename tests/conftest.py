"""Shared fixtures: one real end-to-end run of the VGP example, reused by the tests that read its output."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def finetuned(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("vgp")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(output_dir / "cache")}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu",
        str(ROOT / "examples" / "finetune_vgp.py"),
        "--output_dir", str(output_dir / "model"),
        "--synthetic_train_images", "12", "--synthetic_eval_images", "6",
        "--num_train_epochs", "1", "--per_device_train_batch_size", "16", "--supervision", "semi_direct",
    ]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return output_dir
