"""A few VGP training steps of `SingleStreamForVisualParaphrase`, sharded with torch's FSDP2 (`fully_shard`) over the
CPU processes of `torchrun` (gloo), or unsharded in one plain process; for `tests/trainers/test_fsdp.py`.

    python tests/fsdp_worker.py TEXT_MODEL OUTPUT_DIR [--supervision none ...]                 # one process, no FSDP
    torchrun --nproc_per_node 2 tests/fsdp_worker.py TEXT_MODEL OUTPUT_DIR [--supervision none ...]   # FSDP2, 2 shards

Why not `accelerate launch --config_file <FSDP config> examples/finetune_vgp.py`: accelerate 1.15 turns FSDP on only
for accelerator devices. `AcceleratorState.__init__` (accelerate/state.py) sets `DistributedType.FSDP` only when the
process's distributed type is one of MULTI_GPU / MLU / SDAA / MUSA / NPU / XPU / HPU / NEURON; CPU processes are
MULTI_CPU, so an FSDP config run with `ACCELERATE_USE_CPU=1` is silently DDP (no `fsdp_plugin`), and one without it, on
a machine with no accelerator, is DistributedType.NO: every process trains alone. torch itself shards on CPU, which is
what this worker does, the way accelerate's FSDP2 path and the Trainer would:

- one `fully_shard` unit per class of the model's `_no_split_modules` (accelerate's TRANSFORMER_BASED_WRAP), then the
  root; AdamW built on the sharded parameters;
- step i reads the rows [8i, 8i + 8) of the training split in order; process k of n takes its 8 / n of them (the
  global batch is 8 whatever n);
- every loss is normalised by the global count, as `ComponentLossTrainer` does it: the processes' `loss_item_counts`
  are summed (all-reduce) and passed as `global_item_counts`, each process's loss is its share of the global mean,
  multiplied by n because the gradients are averaged over the processes; the logged loss is the sum of the shares;
- the full state dict is gathered from every process (`get_model_state_dict(full_state_dict=True)`, what accelerate's
  FULL_STATE_DICT does) and rank 0 writes it with `save_pretrained(state_dict=...)`, as `Trainer.save_model` does.

One training per `--supervision` value, one after the other (one start-up for all), each into OUTPUT_DIR/<supervision>:
`initial/` (the weights before training, unsharded), `model/` (the trained weights, config and
tokenizer), `losses.json` (one {"loss", "loss_id", "loss_vgp", ...} per step) and `sharding.json` (the process count
and, under FSDP, the number of parameters each process holds). Synthetic scenes are read from (or
generated in) `$HF_VLALIGN_CACHE`; dropout is off so that the process count changes nothing but the sharding.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoTokenizer, set_seed

from hf_vlalign import SingleStreamForVisualParaphrase
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.synthetic import SyntheticSceneConfig

SCENES = SyntheticSceneConfig(num_train_images=12, num_val_images=6)
GLOBAL_BATCH = 8
STEPS = 3
LEARNING_RATE = 2e-4  # finetune_vgp.py's
LOGGED = ("loss", "loss_id", "loss_vgp", "loss_attention_supervision")  # the loss components written to losses.json, where present


def shard_units(model: torch.nn.Module, units: list[torch.nn.Module]) -> dict:
    """FSDP2 over every process: one unit per module of `units`, then the root. Returns what each process holds:
    {"world_size", "fsdp_units", "full_numel", "local_numel" (one entry per process)}."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    full_numel = sum(parameter.numel() for parameter in model.parameters())
    for module in units:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = torch.tensor([sum(parameter.to_local().numel() for parameter in model.parameters())])
    every = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(every, local)
    return {
        "world_size": dist.get_world_size(),
        "fsdp_units": len(units) + 1,
        "full_numel": full_numel,
        "local_numel": [int(value) for value in every],
    }


def shard(model: torch.nn.Module) -> dict:
    """FSDP2: one unit per `_no_split_modules` layer, then the root (`shard_units`)."""
    layer_classes = set(model._no_split_modules)
    units = [module for module in model.modules() if type(module).__name__ in layer_classes]
    if not units:
        raise ValueError(f"no module of the classes {sorted(layer_classes)} in {type(model).__name__}")
    return shard_units(model, units)


def global_counts(counts: dict[str, torch.Tensor], distributed: bool) -> dict[str, torch.Tensor]:
    """The batch's `loss_item_counts` summed over the processes."""
    keys = sorted(counts)
    totals = torch.stack([torch.as_tensor(counts[key]).long() for key in keys])
    if distributed:
        dist.all_reduce(totals)
    return dict(zip(keys, totals))


def train(text_model: str, output_dir: Path, supervision: str, rank: int, world: int) -> None:
    """One run: a fresh model with `supervision`, STEPS steps of the global batch, its outputs in `output_dir`."""
    distributed = world > 1
    set_seed(0)
    data = load_vgp_data(synthetic_config=SCENES)
    tokenizer = AutoTokenizer.from_pretrained(text_model)
    model = SingleStreamForVisualParaphrase.from_text_pretrained(
        text_model, visual_feat_dim=data.region_features.feature_dim, attention_supervision=supervision
    )
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if rank == 0:
        model.save_pretrained(output_dir / "initial")
    collator = VGPCollator(tokenizer, data.region_features)

    sharding = shard(model) if distributed else {"world_size": 1}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    model.train()
    losses = []
    per_process = GLOBAL_BATCH // world
    for step in range(STEPS):
        start = step * GLOBAL_BATCH + rank * per_process
        batch = collator([data.train[i] for i in range(start, start + per_process)])
        outputs = model(**batch, global_item_counts=global_counts(model.loss_item_counts(batch), distributed))
        (outputs.loss * world).backward()  # FSDP2 reduce-scatters the gradients, averaged over the processes
        optimizer.step()
        optimizer.zero_grad()
        names = [name for name in LOGGED if getattr(outputs, name, None) is not None]
        logged = torch.stack([getattr(outputs, name).detach().float() for name in names])
        if distributed:
            dist.all_reduce(logged)  # the shares sum to the global batch's loss
        losses.append(dict(zip(names, logged.tolist())))

    if distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # a collective: every process takes part, rank 0 receives the full tensors
        state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        state_dict = model.state_dict()
    if rank == 0:
        model.save_pretrained(output_dir / "model", state_dict=state_dict)
        tokenizer.save_pretrained(output_dir / "model")
        (output_dir / "losses.json").write_text(json.dumps(losses, indent=2) + "\n")
        (output_dir / "sharding.json").write_text(json.dumps(sharding, indent=2) + "\n")
    if distributed:
        dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("text_model")
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--supervision", nargs="+", default=["none"])
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if GLOBAL_BATCH % world:
        raise ValueError(f"the global batch {GLOBAL_BATCH} must split evenly over {world} processes")
    torch.set_num_threads(1)
    for supervision in args.supervision:
        train(args.text_model, args.output_dir / supervision, supervision, rank, world)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
