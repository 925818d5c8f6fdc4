"""FSDP2 really runs the library's model on CPU: `SingleStreamForVisualParaphrase` sharded with torch's `fully_shard`
over two gloo processes (`tests/fsdp_worker.py` under torchrun) trains like one unsharded process with the same global
batch, and its gathered full state dict saves and reloads with `from_pretrained`.

This is torch's FSDP2 driven by hand, not `accelerate launch --config_file <FSDP config> examples/finetune_vgp.py`:
accelerate 1.15 enables FSDP only for accelerator devices (`AcceleratorState.__init__` in accelerate/state.py sets
`DistributedType.FSDP` only from MULTI_GPU / MLU / SDAA / MUSA / NPU / XPU / HPU / NEURON), so on CPU an FSDP config
runs as DDP (with ACCELERATE_USE_CPU=1) or as independent unsharded processes (without it); see the worker's docstring
and docs/scaling.md. The worker does what accelerate's FSDP2 path and `Trainer.save_model` do: one shard unit per
`_no_split_modules` layer, gradients reduce-scattered, the full state dict gathered by every process and written by
rank 0 with `save_pretrained(state_dict=...)`.

The model is a tiny BERT (2 layers, hidden 32) with the real MiniLM tokenizer; dropout is off, and every loss is
normalised by the count over both processes (`global_item_counts`), so that the sharded runs are the same computation
as one process, attention supervision included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fsdp_worker
import pytest
import torch
from launch_helpers import free_port, save_tiny_bert
from safetensors.torch import load_file

from hf_vlalign import SingleStreamForVisualParaphrase
from hf_vlalign.data.builders import load_vgp_data

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "fsdp_worker.py"
LOSS_TOLERANCE = 1e-5  # measured: 1.2e-7 without supervision, 4.8e-7 with it
WEIGHT_TOLERANCE = 1e-5  # measured: 1e-8 without supervision, 5e-6 with it (AdamW), against updates of up to 6e-4
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """A tiny BERT text checkpoint with the MiniLM tokenizer, and the synthetic scenes generated once, before any
    worker reads them."""
    root = tmp_path_factory.mktemp("fsdp")
    save_tiny_bert(root / "tiny_bert")
    env = {**os.environ, "HF_VLALIGN_CACHE": str(root / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_VLALIGN_CACHE", env["HF_VLALIGN_CACHE"])
        load_vgp_data(synthetic_config=fsdp_worker.SCENES)
    return {"root": root, "text_model": root / "tiny_bert", "env": env}


SUPERVISIONS = ("none", "direct")
LAUNCHES = {"one_process": 1, "fsdp_two_processes": 2}  # name: processes; each trains once per supervision


@pytest.fixture(scope="module")
def runs(setup) -> dict[tuple[str, str], Path]:
    """Every launch of LAUNCHES, started together (each is mostly start-up time); the output folder of each
    (launch, supervision)."""
    started = {}
    for name, processes in LAUNCHES.items():
        output_dir = setup["root"] / name
        launcher = []
        if processes > 1:
            port = str(free_port())
            launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port", port]
        command = [
            sys.executable, *launcher, str(WORKER), str(setup["text_model"]), str(output_dir),
            "--supervision", *SUPERVISIONS,
        ]  # fmt: skip
        log = open(setup["root"] / f"{name}.log", "w")  # an unread pipe would block a worker once full
        process = subprocess.Popen(command, env=setup["env"], stdout=log, stderr=subprocess.STDOUT)
        started[name] = (process, log, output_dir)
    try:
        for name, (process, log, _) in started.items():
            process.wait(timeout=TIMEOUT_S)
            log.close()
            assert process.returncode == 0, (name, Path(log.name).read_text()[-4000:])
    finally:
        for process, log, _ in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    return {
        (name, supervision): output_dir / supervision
        for name, (_, _, output_dir) in started.items()
        for supervision in SUPERVISIONS
    }


def _check_saved_model(output_dir: Path, supervision: str) -> dict[str, torch.Tensor]:
    """The saved folder loads with `from_pretrained`, with every parameter of the class and nothing else, all finite,
    and differs from the initial weights; returns the saved tensors."""
    model, info = SingleStreamForVisualParaphrase.from_pretrained(output_dir / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.config.attention_supervision == supervision
    assert json.loads((output_dir / "model" / "config.json").read_text())["architectures"] == [
        "SingleStreamForVisualParaphrase"
    ]  # not the FSDP2 wrapper class
    saved = load_file(output_dir / "model" / "model.safetensors")
    initial = load_file(output_dir / "initial" / "model.safetensors")
    assert set(saved) == set(model.state_dict()) == set(initial)
    for name, tensor in saved.items():
        assert torch.isfinite(tensor).all(), name
        assert torch.equal(tensor, model.state_dict()[name]), name  # what from_pretrained loaded is what was written
    changed = {name for name in saved if not torch.equal(saved[name], initial[name])}
    # trained: the weights of every layer (each its own shard unit), of the visual embeddings and of both heads
    layers = {name.split(".layer.")[1].split(".")[0] for name in changed if ".layer." in name}
    assert layers == {str(i) for i in range(model.config.num_hidden_layers)}, sorted(changed)
    trained = {
        "single_stream.visual_embeddings.feature_projection.weight", "id_classifier.weight", "vgp_classifier.weight"
    }
    assert trained <= changed, sorted(changed)
    return saved


def _check_sharded(output_dir: Path) -> None:
    """Two processes did share the parameters: each held about half of them."""
    sharding = json.loads((output_dir / "sharding.json").read_text())
    assert sharding["world_size"] == 2 and sharding["fsdp_units"] >= 3, sharding
    assert all(local < 0.75 * sharding["full_numel"] for local in sharding["local_numel"]), sharding
    assert sum(sharding["local_numel"]) >= sharding["full_numel"], sharding


@pytest.mark.parametrize("supervision", SUPERVISIONS)
def test_fsdp2_on_two_cpu_processes_trains_like_one_process_and_saves_a_full_model(runs, supervision):
    """Direct supervision computes the supervised rows from the query / key projections inside each sharded layer,
    and its loss, a mean over the grounded rows of both shards, matches one process's."""
    single, sharded = runs["one_process", supervision], runs["fsdp_two_processes", supervision]
    _check_sharded(sharded)
    assert json.loads((single / "sharding.json").read_text()) == {"world_size": 1}

    one = json.loads((single / "losses.json").read_text())
    two = json.loads((sharded / "losses.json").read_text())
    assert len(one) == len(two) == fsdp_worker.STEPS
    keys = ("loss", "loss_id", "loss_vgp") + (("loss_attention_supervision",) if supervision != "none" else ())
    differences = {(step, key): abs(a[key] - b[key]) for step, (a, b) in enumerate(zip(one, two)) for key in keys}
    assert max(differences.values()) <= LOSS_TOLERANCE, differences
    assert abs(one[-1]["loss"] - one[0]["loss"]) > 100 * LOSS_TOLERANCE  # the weights moved between steps

    fsdp_weights = _check_saved_model(sharded, supervision)
    single_weights = _check_saved_model(single, supervision)
    worst = max((fsdp_weights[name] - single_weights[name]).abs().max().item() for name in single_weights)
    print(f"FSDP2, supervision {supervision}: losses {max(differences.values()):.2g} apart, weights {worst:.2g}")
    assert worst <= WEIGHT_TOLERANCE, worst
