"""Every reported loss of `ComponentLossTrainer` is the same under 2 processes and gradient accumulation as in one
process with the same global batch (8 training examples a step, 6 evaluation examples a batch): `train_loss` with and
without an intermediate log, the training components logged with it, `eval_loss` and each evaluation component.

The model is `tests/reported_losses_worker.py`'s tiny one (two losses over different item counts, no dropout, SGD), so
the launch is the whole cost. Its 7 evaluation examples make a short last batch: under 2 processes of 3 examples,
accelerate completes it with repeats (process 0 holds 1 real example, process 1 none), which no loss may count.
The one-process references run in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import free_port
from reported_losses_worker import reported_losses, tiny_trainer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "reported_losses_worker.py"
TOLERANCE = 1e-5
# per process: 4 x 2 processes, or 2 x 2 micro-batches x 2 processes, the global batch of the reference's 8
TWO_PROCESS_RUNS = [
    {"name": "two", "batch": 4, "accumulation": 1, "eval_batch": 3, "logging_steps": 100},
    {"name": "two_accumulated", "batch": 2, "accumulation": 2, "eval_batch": 3, "logging_steps": 2},
]


def launch_two_processes(output_dir: Path) -> dict[str, dict[str, float]]:
    runs_file = output_dir / "runs.json"
    runs_file.write_text(json.dumps(TWO_PROCESS_RUNS))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--main_process_port", str(free_port()), "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", str(WORKER), str(output_dir), str(runs_file),
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return {run["name"]: json.loads((output_dir / f"{run['name']}.json").read_text()) for run in TWO_PROCESS_RUNS}


def test_reported_losses_equal_one_process(tmp_path):
    two_processes = launch_two_processes(tmp_path)
    one = reported_losses(tiny_trainer(tmp_path / "one", batch=8, eval_batch=6, logging_steps=100))
    # an intermediate log at step 2 of 3: the components logged with `train_loss` are the last step's
    one_accumulated = reported_losses(tiny_trainer(tmp_path / "acc", batch=4, accumulation=2, eval_batch=6, logging_steps=2))
    assert set(one) == {"train_loss", "loss_task", "loss_tokens", "eval_loss", "eval_loss_task", "eval_loss_tokens"}, one
    pairs = [("two", one), ("two_accumulated", one_accumulated)]
    for name, reference in pairs:
        reported = two_processes[name]
        assert set(reported) == set(reference), (name, reported)
        for key, value in reference.items():
            assert reported[key] == pytest.approx(value, abs=TOLERANCE), (name, key, reported, reference)
    for key in ("train_loss", "eval_loss", "eval_loss_task", "eval_loss_tokens"):
        assert one_accumulated[key] == pytest.approx(one[key], abs=TOLERANCE), (key, one_accumulated, one)
