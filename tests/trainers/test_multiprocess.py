"""Data parallelism and gradient accumulation train the same model as one process, attention supervision included.

Each family's main recipe runs three times with the same global batch of 8 examples: one process with batches of 8,
two CPU processes (gloo, real `accelerate launch`) with 4 each, and one process accumulating 2 batches of 4 (the
single-stream family's recipe is VGP with semi-direct supervision, whose rollout reads every layer; direct and
indirect supervision divide by the same counts, checked on split batches by `tests/models/test_loss_normalization.py`;
question answering runs with `--head_learning_rate`, whose optimizer groups every process builds alike). The
per-step losses (every logged component) and the final weights agree to 1e-5. What makes them comparable:
- dropout is off (`--dropout 0.0`): each process would otherwise draw its own masks;
- the optimizer is plain SGD, whose update is proportional to the gradient, so equal weights mean equal gradients.
  (Adam divides by sqrt(v): a parameter whose gradient is ~0 moves by about +-lr on float rounding noise alone, and
  shards padded to other lengths round differently);
- the Trainer's sampler is accelerate's `SeedableRandomSampler`, seeded by `--seed` in every process, so every run
  shuffles the same permutation; with `split_batches=False` process k takes the 4-example batches k, k + 2, ... of
  it, so step i of every run sees examples [8i, 8i + 8) of the permutation;
- every loss that is a mean over a variable number of items (grounded words and regions of attention supervision,
  the alignment decoder's grounded words, caption tokens, the A2 mask objective, ...) divides by the count over all
  processes and micro-batches of the step (`ComponentLossTrainer`, `global_item_counts`), so the shards' shares sum
  to the global mean whatever their sizes;
- the two-stream run switches LXMERT's random word / object masking and image swapping off: those draws are made per
  batch (an object may take the feature of another region of its batch), so a shard of 4 draws other masks than the
  same rows in a batch of 8. Their losses (masked words, masked objects) are normalised the same way as the others,
  which `tests/models/test_loss_normalization.py` checks on split batches without processes.

The recipes run on a tiny BERT checkpoint (random weights, the real MiniLM tokenizer), and each of the three launches
runs the four recipes in turn (`tests/examples_worker.py`), so that the whole matrix stays short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import free_port, save_tiny_bert
from safetensors.torch import load_file

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "examples_worker.py"
STEPS = 3
GLOBAL_BATCH = 8
TOLERANCE = 1e-5
SCENES = ["--synthetic_train_images", "12", "--synthetic_eval_images", "4"]
RECIPES = {
    "vgp_semi_direct": ("finetune_vgp.py", ["--supervision", "semi_direct", "--eval_strategy", "no", *SCENES]),
    "two_stream_alignment": (
        "pretrain_two_stream.py",
        ["--alignment_loss", "with", "--qa_start_epoch", "0", "--l_layers", "2", "--r_layers", "1", "--x_layers", "2",
         "--mlm_probability", "0", "--object_mask_probability", "0", "--mismatch_probability", "0", *SCENES],
    ),  # fmt: skip
    # the new parts (visual embeddings, answer head) at a rate of their own: the same optimizer groups in every process
    "vqa_head_learning_rate": (
        "finetune_vqa.py", ["--head_learning_rate", "0.2", "--eval_strategy", "no", "--image_use_examples", "4", *SCENES]
    ),
    "captioner_a2": (
        "train_captioning.py",
        ["--alignment", "gate", "--encoder_layers", "1", "--decoder_layers", "2", "--attention_heads", "2", *SCENES],
    ),
}
# where each example writes its model (the two-stream example trains into a folder per run)
MODEL_FOLDER = {"two_stream_alignment": "with_alignment"}


@pytest.fixture(scope="module")
def tiny_text_model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synthetic_cache")  # written by the first run to need each recipe's scenes, then read


def arguments(recipe: str, output_dir: Path, text_model: Path, batch: int, accumulation: int) -> list[str]:
    """The example's command-line arguments for one run of `recipe`."""
    return [
        "--model_name_or_path", str(text_model), "--output_dir", str(output_dir),
        "--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", str(accumulation),
        "--max_steps", str(STEPS), "--warmup_steps", "0", "--logging_steps", "1", "--dropout", "0.0",
        "--optim", "sgd", "--learning_rate", "0.05",
        "--save_strategy", "steps", "--save_steps", str(STEPS), "--save_only_model", "--report_to", "none",
        *RECIPES[recipe][1],
    ]  # fmt: skip


def start(run_dir: Path, cache: Path, text_model: Path, processes: int, batch: int, accumulation: int):
    """Launches one `accelerate launch` that runs every recipe in turn (`tests/examples_worker.py`: one start-up for
    the four); `finish` waits for it. The launches run side by side: each sets its own thread count (`--num_threads`
    default: the cores over its processes), so the load changes their time only. Returns the launch and the folder of
    each recipe's model."""
    name = f"{processes}x{batch}x{accumulation}"
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(cache), "ACCELERATE_USE_CPU": "1",
        "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    if processes == 1:
        launcher = ["--cpu", "--num_processes", "1"]
    else:  # `--cpu` alone starts one process whatever --num_processes says; multi-CPU goes through torchrun
        launcher = ["--multi_gpu", "--num_processes", str(processes), "--main_process_port", str(free_port())]
    runs, model_dirs = [], {}
    for recipe, (example, _) in RECIPES.items():
        output_dir = run_dir / f"{recipe}_{name}"
        output_dir.mkdir(parents=True)
        runs.append([str(ROOT / "examples" / example), arguments(recipe, output_dir, text_model, batch, accumulation)])
        model_dirs[recipe] = output_dir / MODEL_FOLDER.get(recipe, "")
    runs_file = run_dir / f"{name}.json"
    runs_file.write_text(json.dumps(runs))
    command = [
        sys.executable, "-m", "accelerate.commands.launch", *launcher,
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        str(WORKER), str(runs_file),
    ]  # fmt: skip
    log = open(run_dir / f"{name}.log", "w")  # noqa: SIM115 (closed by `finish`)
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    return process, log, model_dirs


def finish(launch) -> dict[str, dict]:
    """Waits for a launch of `start`; returns each recipe's per-step training logs and final weights."""
    process, log, model_dirs = launch
    try:
        returncode = process.wait(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
    assert returncode == 0, Path(log.name).read_text()[-4000:]
    results = {}
    for recipe, model_dir in model_dirs.items():
        state = json.loads((model_dir / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
        logs = [entry for entry in state["log_history"] if "loss" in entry]
        assert [entry["step"] for entry in logs] == list(range(1, STEPS + 1)), (recipe, logs)
        results[recipe] = {"logs": logs, "weights": load_file(model_dir / "model.safetensors")}
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache, tiny_text_model) -> dict[str, dict[str, dict]]:
    """Every recipe run three times: {"one", "two", "accumulated"} -> recipe -> its logs and weights."""
    run_dir = tmp_path_factory.mktemp("multiprocess")
    # side by side: the first to need a recipe's synthetic scenes writes them to the cache, atomically, and the
    # others read them (`load_or_generate_synthetic_vgp`)
    launches = [
        start(run_dir, cache, tiny_text_model, processes=1, batch=GLOBAL_BATCH, accumulation=1),
        start(run_dir, cache, tiny_text_model, processes=2, batch=GLOBAL_BATCH // 2, accumulation=1),
        start(run_dir, cache, tiny_text_model, processes=1, batch=GLOBAL_BATCH // 2, accumulation=2),
    ]
    try:
        one, two, accumulated = [finish(launch) for launch in launches]
    finally:  # a failed launch leaves no other behind
        for process, _, _ in launches:
            if process.poll() is None:
                process.kill()
    return {"one": one, "two": two, "accumulated": accumulated}


def loss_differences(reference: list[dict], other: list[dict]) -> dict[tuple[int, str], float]:
    keys = [key for key in reference[0] if key == "loss" or key.startswith("loss_")]
    assert all(key in entry for entry in other for key in keys), (keys, other)
    return {(a["step"], key): abs(a[key] - b[key]) for a, b in zip(reference, other) for key in keys}


def weight_difference(reference: dict, other: dict) -> float:
    assert reference.keys() == other.keys()
    return max(float((reference[name] - other[name]).abs().max()) for name in reference)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_two_processes_and_accumulation_train_as_one_process(recipe, runs):
    one, two, accumulated = (runs[name][recipe] for name in ("one", "two", "accumulated"))
    # the same fraction of the epoch at every step: the global batch is 8 in both runs (two processes started)
    assert [entry["epoch"] for entry in two["logs"]] == [entry["epoch"] for entry in one["logs"]]
    components = {key for key in one["logs"][0] if key.startswith("loss_")}
    expected = {
        "vgp_semi_direct": {"loss_id", "loss_vgp", "loss_attention_supervision"},
        "two_stream_alignment": {"loss_itm", "loss_qa", "loss_alignment"},
        "vqa_head_learning_rate": {"loss_task"},
        "captioner_a2": {"loss_caption", "loss_mask"},
    }[recipe]
    assert expected <= components, components
    for name, run in (("two processes", two), ("accumulation", accumulated)):
        differences = loss_differences(one["logs"], run["logs"])
        weights = weight_difference(one["weights"], run["weights"])
        print(f"{recipe}, {name}: losses {max(differences.values()):.2g} apart, weights {weights:.2g}")
        assert max(differences.values()) <= TOLERANCE, (name, {k: v for k, v in differences.items() if v > TOLERANCE})
        assert weights <= TOLERANCE, name
    # the runs did train: equality is not that of frozen models
    assert abs(one["logs"][-1]["loss"] - one["logs"][0]["loss"]) > 100 * TOLERANCE


def test_a_multi_process_launch_without_a_backend_is_refused(tmp_path, cache, tiny_text_model):
    """Without `ACCELERATE_USE_CPU=1`, `accelerate launch --multi_gpu` on a machine with no GPU starts processes that
    accelerate leaves undistributed: each would train alone into the same folder. The examples refuse to start."""
    env = {key: value for key, value in os.environ.items() if key != "ACCELERATE_USE_CPU"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, as on the project's machines, wherever the test runs
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--main_process_port", str(free_port()), "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", str(ROOT / "examples" / "finetune_vgp.py"),
        "--model_name_or_path", str(tiny_text_model), "--output_dir", str(tmp_path / "out"), *SCENES,
    ]  # fmt: skip
    completed = subprocess.run(
        command, env={**env, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(cache)}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode != 0
    assert "2 processes were launched (WORLD_SIZE=2) but no distributed backend was set up" in completed.stderr
    assert "ACCELERATE_USE_CPU=1" in completed.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()
