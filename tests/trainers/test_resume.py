"""A damaged checkpoint file is named when resuming from it. Interrupted training resumes exactly: a run SIGKILLed after its checkpoint-2 and resumed from it ends with the
weights (and, for the A2 captioner, the mask networks' Adam state) of an uninterrupted run with the same seed.

Every interrupted or resumed run is a subprocess of `tests/resume_worker.py`, and the uninterrupted runs are its
trainers run in the test's process (6 steps, 3 batches per epoch, a checkpoint every 2 steps): the captioner with the A2
gate fusion and a mask step every other step, the two-stream pre-training with its answer loss starting at epoch 1
(step 4, after the resume), and VGP fine-tuning. The interrupted run pauses after writing
checkpoint-2; the test kills it there, so the resumed run starts mid-epoch and crosses an epoch boundary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import resume_worker
import torch
from safetensors.torch import load_file
from test_trainer_arguments import TinyRegression
from transformers import TrainingArguments

from hf_vlalign.trainers import ComponentLossTrainer

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "resume_worker.py"
RECIPES = ("captioning", "pretraining", "vgp")
TOLERANCE = 1e-6
TIMEOUT_S = 300


def checkpoint_written(checkpoint: Path) -> bool:
    """`trainer_state.json` is the last file `Trainer._save_checkpoint` writes; complete once it parses."""
    try:
        return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == int(checkpoint.name[11:])
    except (OSError, ValueError, KeyError):
        return False


def start(recipe: str, output_dir: Path, env: dict[str, str], log_name: str, *extra: str) -> subprocess.Popen:
    """Starts a worker; its output goes to a log file beside `output_dir` (an unread pipe would block it once full)."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = output_dir.parent / f"{log_name}.log"
    with open(log_path, "w") as log:
        command = [sys.executable, str(WORKER), recipe, str(output_dir), *extra]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    process.log_path = log_path
    return process


def finish(process: subprocess.Popen) -> str:
    process.wait(timeout=TIMEOUT_S)
    output = process.log_path.read_text()
    assert process.returncode == 0, output[-4000:]
    return output


def train_in_this_process(recipe: str, output_dir: Path, cache: str) -> None:
    """The worker's run of `recipe`, in the test's process, with the workers' one thread (OMP_NUM_THREADS=1): the same
    sums in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HF_VLALIGN_CACHE", cache)
            resume_worker.BUILDERS[recipe](str(output_dir)).train()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """For each recipe, concurrently: an uninterrupted run, and a run killed after checkpoint-2 then resumed."""
    root = tmp_path_factory.mktemp("resume")
    env = {**os.environ, "HF_VLALIGN_CACHE": str(root / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with pytest.MonkeyPatch.context() as patch:  # the scenes are generated once, before any worker reads them
        patch.setenv("HF_VLALIGN_CACHE", env["HF_VLALIGN_CACHE"])
        resume_worker.prepare_data()
    results = {recipe: {"full": root / recipe / "full", "resumed": root / recipe / "interrupted"} for recipe in RECIPES}
    started: list[subprocess.Popen] = []
    try:
        # the interrupted runs sleep in `on_save` after checkpoint-2, far longer than the test waits: killed there
        interrupted = {
            recipe: start(recipe, results[recipe]["resumed"], env, "interrupted", "--pause_after_save", "600")
            for recipe in RECIPES
        }
        started += interrupted.values()
        # meanwhile the uninterrupted runs, here: nothing kills them, so they need no process of their own
        for recipe in RECIPES:
            train_in_this_process(recipe, results[recipe]["full"], env["HF_VLALIGN_CACHE"])
        resumed: dict[str, subprocess.Popen] = {}
        deadline = time.monotonic() + TIMEOUT_S
        while len(resumed) < len(RECIPES):
            assert time.monotonic() < deadline, "no checkpoint-2 appeared in time"
            for recipe, process in interrupted.items():
                checkpoint = results[recipe]["resumed"] / "checkpoint-2"
                if recipe in resumed:
                    continue
                if not checkpoint_written(checkpoint):
                    assert process.poll() is None, process.log_path.read_text()[-4000:]
                    continue
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=TIMEOUT_S)
                results[recipe]["killed_with"] = process.returncode
                results[recipe]["checkpoints_at_kill"] = sorted(p.name for p in checkpoint.parent.glob("checkpoint-*"))
                resumed[recipe] = start(
                    recipe, results[recipe]["resumed"], env, "resumed", "--resume_from_checkpoint", str(checkpoint)
                )
                started.append(resumed[recipe])
            time.sleep(0.1)
        for recipe in RECIPES:
            results[recipe]["resumed_output"] = finish(resumed[recipe])
    finally:
        for process in started:  # a failed test leaves no worker behind
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def max_abs_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    return max(float((first[k].double() - second[k].double()).abs().max()) if first[k].numel() else 0.0 for k in first)


def optimizer_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The per-parameter state tensors of a saved optimiser (`exp_avg`, `exp_avg_sq`, `step`), flattened by name."""
    state = torch.load(path, weights_only=True)["state"]
    return {f"{index}.{name}": value for index, entry in state.items() for name, value in entry.items()}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_interrupted_run_resumes_to_the_uninterrupted_weights(runs, recipe):
    run = runs[recipe]
    assert run["killed_with"] == -signal.SIGKILL
    assert run["checkpoints_at_kill"] == ["checkpoint-2"]
    assert "first_step=2" in run["resumed_output"]  # the resumed run trained steps 3-6 only
    full, resumed = run["full"] / "checkpoint-6", run["resumed"] / "checkpoint-6"
    weights = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    difference = max_abs_difference(*weights)
    print(f"{recipe}: max abs weight difference {difference:.3g}")
    assert difference <= TOLERANCE
    assert max_abs_difference(optimizer_tensors(full / "optimizer.pt"), optimizer_tensors(resumed / "optimizer.pt")) <= TOLERANCE
    full_state = json.loads((full / "trainer_state.json").read_text())
    resumed_state = json.loads((resumed / "trainer_state.json").read_text())
    assert resumed_state["global_step"] == full_state["global_step"] == 6
    assert resumed_state["epoch"] == full_state["epoch"] == 2.0


@pytest.mark.slow
def test_resumed_captioner_restores_the_mask_optimizer(runs):
    run = runs["captioning"]
    for step in (2, 4, 6):
        assert (run["resumed"] / f"checkpoint-{step}" / "mask_optimizer.pt").is_file()
    full = optimizer_tensors(run["full"] / "checkpoint-6" / "mask_optimizer.pt")
    resumed = optimizer_tensors(run["resumed"] / "checkpoint-6" / "mask_optimizer.pt")
    # mask steps at global steps 0, 2 and 4: Adam counts 3 steps in both runs
    assert {float(value) for name, value in full.items() if name.endswith(".step")} == {3.0}
    assert max_abs_difference(full, resumed) <= TOLERANCE
    weights = load_file(run["resumed"] / "checkpoint-6" / "model.safetensors")
    assert int(weights["model.alignment_step"]) == 5  # s of eq. (8) at the last step, as in the uninterrupted run


@pytest.mark.slow
def test_resumed_pretraining_starts_the_answer_loss_at_its_epoch(runs):
    run = runs["pretraining"]
    for directory in (run["full"], run["resumed"]):
        history = json.loads((directory / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
        steps = {log["step"]: log for log in history if "loss" in log}
        assert sorted(steps) == [1, 2, 3, 4, 5, 6]
        assert [steps[step]["qa_loss_enabled"] for step in range(1, 7)] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
        assert all(("loss_qa" in steps[step]) == (step >= 4) for step in range(1, 7))
    full_losses = json.loads((run["full"] / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    resumed_losses = json.loads((run["resumed"] / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    assert [log.get("loss_qa") for log in full_losses] == [log.get("loss_qa") for log in resumed_losses]


def regression_trainer(output_dir: Path, max_steps: int) -> ComponentLossTrainer:
    torch.manual_seed(0)
    rows = [{"x": torch.randn(2), "target": torch.randn(())} for _ in range(8)]
    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=max_steps, save_steps=1, per_device_train_batch_size=4, report_to="none",
        use_cpu=True, remove_unused_columns=False, seed=0,
    )  # fmt: skip
    return ComponentLossTrainer(model=TinyRegression(), args=args, train_dataset=rows)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("regression")
    regression_trainer(output_dir, max_steps=1).train()
    return output_dir / "checkpoint-1"


def scheduler_of_three_groups(data: bytes, path: Path) -> bytes:
    """A readable scheduler state that does not fit the run: one learning-rate rule per group of three groups."""
    state = torch.load(path, weights_only=True)
    torch.save({**state, "lr_lambdas": [None, {}, {}]}, path)
    return path.read_bytes()


DAMAGE = {  # case -> (file, damage of its bytes, the files named, the error named)
    "truncated_trainer_state": ("trainer_state.json", lambda data, path: data[: len(data) // 2], ["trainer_state.json"], "JSONDecodeError"),
    "truncated_weights": ("model.safetensors", lambda data, path: data[:-10], ["model.safetensors"], "SafetensorError"),
    "garbage_scheduler": ("scheduler.pt", lambda data, path: bytes(range(256)) * 8, ["scheduler.pt"], "UnpicklingError"),
    "empty_rng_state": ("rng_state.pth", lambda data, path: b"", ["rng_state.pth"], "EOFError"),
    "text_rng_state": ("rng_state.pth", lambda data, path: b"not a torch file\n", ["rng_state.pth"], r"\w+"),
    "truncated_optimizer": ("optimizer.pt", lambda data, path: data[: len(data) // 2], ["optimizer.pt"], r"\w+"),
    "scheduler_of_another_run": ("scheduler.pt", scheduler_of_three_groups, ["optimizer.pt", "scheduler.pt"], "IndexError"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DAMAGE))
def test_resume_names_the_damaged_file(case, checkpoint, tmp_path):
    damaged = tmp_path / "checkpoint-1"
    shutil.copytree(checkpoint, damaged)
    name, damage, named, error = DAMAGE[case]
    (damaged / name).write_bytes(damage((damaged / name).read_bytes(), damaged / name))
    files = " / ".join(str(damaged / file) for file in named)
    with pytest.raises(ValueError, match=rf"^`resume_from_checkpoint` {damaged}: cannot load {files} \({error}: "):
        regression_trainer(tmp_path / "resumed", max_steps=2).train(resume_from_checkpoint=str(damaged))


def test_a_healthy_checkpoint_resumes_with_its_random_state(checkpoint, tmp_path):
    trainer = regression_trainer(tmp_path / "resumed", max_steps=2)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 2
