"""A few supervised training steps of a tiny LLaVA with a LoRA adapter and gradient checkpointing, sharded with torch's
FSDP2 (`fully_shard`) or DeepSpeed ZeRO-3 over the CPU processes of `torchrun` (gloo), or unsharded in one plain
process; for `tests/trainers/test_fsdp_patch.py`.

    python tests/fsdp_patch_worker.py MODEL_DIR OUTPUT_DIR [--supervision direct semi_direct]        # 1 process
    torchrun --nproc_per_node 2 tests/fsdp_patch_worker.py MODEL_DIR OUTPUT_DIR [--supervision ...]  # FSDP2
    torchrun --nproc_per_node 2 tests/fsdp_patch_worker.py MODEL_DIR OUTPUT_DIR --engine deepspeed   # ZeRO-3

MODEL_DIR holds a saved `LlavaForConditionalGeneration` and its processor. Torch drives FSDP2 by hand, as in
`tests/fsdp_worker.py` (accelerate 1.15 turns FSDP on only for accelerator devices, see its docstring), the way
accelerate's FSDP2 path and `PatchSupervisionTrainer` would:

- a peft LoRA adapter on the language model's attention projections (the vision tower and the projector frozen),
  gradient checkpointing (non-reentrant), dropout off;
- one `fully_shard` unit per decoder layer (`LlamaDecoderLayer`), then the root; SGD on the adapter's parameters;
- step i reads the examples [8i, 8i + 8) in order; process k of n takes its 8 / n of them (global batch 8);
- the loss is `PatchSupervisionTrainer.compute_loss`'s: the caption's language-model loss over the global label-token
  count, plus the attention loss (`AttentionRecorder`, `forward_with_layout`, `patch_attention_loss`) over the global
  grounded-row counts, the counts of `PatchSupervisionTrainer.batch_item_counts` summed over the processes; each
  process's loss is its share of the global mean, multiplied by n since FSDP averages the gradients;
- the full state dict is gathered from every process, and rank 0 writes the adapter with peft's
  `save_pretrained(state_dict=...)`, as `Trainer.save_model` does under FSDP.

`--engine deepspeed` shards with DeepSpeed ZeRO-3 instead (`deepspeed.initialize`, its CPU accelerator over gloo;
setup.cfg's `deepspeed` extra, in the `test` extra), the test's third launch.

One training per `--supervision` value, one after the other (one start-up for all), each into
OUTPUT_DIR/<supervision>: `losses.json` (one {"loss_task", "loss_attention"} per step), `gradients.safetensors` (the
adapter's full gradients, "<step>/<name>"), `initial.safetensors` / `final.safetensors` (the whole model's full state
dict before and after), `adapter/` (peft's saved adapter) and `sharding.json` (the process count, when sharded the
parameters each process holds, and the calls of each decoder layer's attention: forward and recompute).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoProcessor, LlavaForConditionalGeneration, set_seed

from fsdp_worker import shard_units  # tests/, the script's folder

from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from hf_vlalign.utils.item_counts import count_labeled
from hf_vlalign.vlms import (
    AttentionRecorder,
    PatchGroundingCollator,
    forward_with_layout,
    grounded_caption_examples,
    grounded_token_count,
    patch_attention_loss,
)
from hf_vlalign.vlms.supervision import grounded_cell_count

SCENES = SyntheticSceneConfig(num_train_images=12, num_val_images=6)
GLOBAL_BATCH = 8
STEPS = 3
LEARNING_RATE = 0.5  # SGD: the adapter moves by about 1e-2 in 3 steps
SUPERVISED_LAYERS = [1]  # the last of the tiny model's 2 language-model layers; semi-direct rolls out layers 0 and 1
# the language model's attention projections (the vision tower's are named alike)
LORA_TARGETS = r"model\.language_model\.layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)"


def adapted_model(model_dir: str) -> torch.nn.Module:
    """The saved LLaVA with dropout off, non-reentrant gradient checkpointing and a seeded LoRA adapter."""
    model = LlavaForConditionalGeneration.from_pretrained(model_dir)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    # transformers 5.24's name of `gradient_checkpointing_enable` (deprecated there)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    set_seed(0)  # the adapter's A matrices: the same draw in every process
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS)
    return get_peft_model(model, config)


def shard(model: torch.nn.Module) -> dict:
    """FSDP2: one unit per decoder layer of the language model, then the root (`fsdp_worker.shard_units`)."""
    return shard_units(model, list(model.get_base_model().model.language_model.layers))


def global_item_counts(batch: dict, distributed: bool) -> dict[str, torch.Tensor]:
    """`PatchSupervisionTrainer.batch_item_counts` of a LLaVA batch, summed over the processes."""
    alignment = batch["word_cell_alignment"]
    counts = torch.stack(
        [count_labeled(batch["labels"][:, 1:]), grounded_token_count(alignment), grounded_cell_count(alignment)]
    )
    if distributed:
        dist.all_reduce(counts)
    return dict(zip(("label_tokens", "grounded_words", "grounded_cells"), counts))


def full_state_dict(model: torch.nn.Module, distributed: bool) -> dict[str, torch.Tensor]:
    """Every parameter unsharded (a collective under FSDP: every process takes part)."""
    if not distributed:
        return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_gradients(model: torch.nn.Module, distributed: bool) -> dict[str, torch.Tensor]:
    """The adapter's gradients, gathered to full tensors under FSDP (a collective)."""
    gradients = {}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            gradient = parameter.grad.full_tensor() if distributed else parameter.grad
            gradients[name] = gradient.detach().clone()
    return gradients


def count_attention_calls(plain_model: torch.nn.Module) -> list[int]:
    """The calls of each decoder layer's attention, counted by forward hooks from now on: gradient checkpointing runs
    each twice per step (the forward, then the recompute in the backward)."""
    layers = plain_model.model.language_model.layers
    calls = [0] * len(layers)

    def counter(index: int):
        def hook(*_):
            calls[index] += 1

        return hook

    for index, layer in enumerate(layers):
        layer.self_attn.register_forward_hook(counter(index))
    return calls


def zero3(model: torch.nn.Module, optimizer: torch.optim.Optimizer, per_process: int):
    """DeepSpeed ZeRO-3 over every process (parameters, gradients and optimizer states partitioned), fp32. Returns the
    engine, its optimizer and {"world_size", "full_numel", "local_numel" (per process)}."""
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": per_process,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    local = torch.tensor([sum(parameter.ds_tensor.numel() for parameter in model.parameters())])
    every = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(every, local)
    full_numel = sum(parameter.ds_numel for parameter in model.parameters())
    sharding = {"world_size": dist.get_world_size(), "full_numel": full_numel, "local_numel": [int(v) for v in every]}
    return engine, optimizer, sharding


def zero3_full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's full gradients under ZeRO-3 (a collective)."""
    from deepspeed.utils import safe_get_full_grad

    return {
        name: safe_get_full_grad(parameter).detach().clone()
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }


def train(
    model_dir: str, examples: list[dict], output_dir: Path, supervision: str, rank: int, world: int, engine: str
) -> None:
    """One run: a fresh adapter, STEPS steps of the global batch with `supervision`, its outputs in `output_dir`;
    `engine`: "fsdp" (torch's FSDP2) or "deepspeed" (ZeRO-3) when there are several processes."""
    distributed = world > 1
    deepspeed = distributed and engine == "deepspeed"
    model = adapted_model(model_dir)
    plain_model = model.get_base_model()
    collator = PatchGroundingCollator(AutoProcessor.from_pretrained(model_dir), plain_model.config)
    initial = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    attention_calls = count_attention_calls(plain_model)
    per_process = GLOBAL_BATCH // world
    if deepspeed:
        # SGD with torch's own optimizer, as FSDP's run
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
        wrapped, optimizer, sharding = zero3(model, optimizer, per_process)
    else:
        sharding = shard(model) if distributed else {"world_size": 1}
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
        wrapped = model
    model.train()
    losses, gradients = [], {}
    for step in range(STEPS):
        start = step * GLOBAL_BATCH + rank * per_process
        batch = collator(examples[start : start + per_process])
        counts = global_item_counts(batch, distributed)
        with AttentionRecorder(plain_model, range(max(SUPERVISED_LAYERS) + 1)) as recorder:
            outputs, layout = forward_with_layout(
                wrapped, batch, plain_model=plain_model, num_items_in_batch=counts["label_tokens"]
            )
        loss_attention = patch_attention_loss(
            recorder, batch, layout, supervision, SUPERVISED_LAYERS,
            num_rows=counts["grounded_words"], num_image_rows=counts["grounded_cells"],
        )  # fmt: skip
        recorder.clear()
        # each process's loss is its share of the global mean; FSDP and DeepSpeed average the gradients
        loss = (outputs.loss + loss_attention) * world
        if deepspeed:
            wrapped.backward(loss)
        else:
            loss.backward()
        step_gradients = zero3_full_gradients(model) if deepspeed else full_gradients(model, distributed)
        gradients.update({f"{step}/{name}": value for name, value in step_gradients.items()})
        if deepspeed:
            wrapped.step()  # and zeroes the gradients
        else:
            optimizer.step()
            optimizer.zero_grad()
        logged = torch.stack([outputs.loss.detach(), loss_attention.detach()])
        if distributed:
            dist.all_reduce(logged)  # the shares sum to the global batch's loss
        losses.append(dict(zip(("loss_task", "loss_attention"), logged.tolist())))

    final = wrapped._zero3_consolidated_16bit_state_dict() if deepspeed else full_state_dict(model, distributed)
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        save_file({name: tensor.contiguous() for name, tensor in initial.items()}, output_dir / "initial.safetensors")
        save_file({name: tensor.contiguous() for name, tensor in final.items()}, output_dir / "final.safetensors")
        save_file(gradients, output_dir / "gradients.safetensors")
        model.save_pretrained(output_dir / "adapter", state_dict=final)  # peft keeps the adapter's entries
        (output_dir / "losses.json").write_text(json.dumps(losses, indent=2) + "\n")
        (output_dir / "sharding.json").write_text(json.dumps({**sharding, "attention_calls": attention_calls}) + "\n")
    if distributed:
        dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--supervision", nargs="+", default=["direct", "semi_direct"])
    parser.add_argument("--engine", choices=["fsdp", "deepspeed"], default="fsdp", help="the sharding of 2+ processes")
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and args.engine == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    elif distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if GLOBAL_BATCH % world:
        raise ValueError(f"the global batch {GLOBAL_BATCH} must split evenly over {world} processes")
    torch.set_num_threads(1)
    scenes = load_or_generate_synthetic_vgp(config=SCENES)
    examples, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "train")
    for supervision in args.supervision:
        train(args.model_dir, examples, args.output_dir / supervision, supervision, rank, world, args.engine)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
