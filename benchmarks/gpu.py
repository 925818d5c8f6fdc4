#!/usr/bin/env python
"""Training throughput of every model family at its papers' base size on a GPU: tokens and examples per second, MFU
against the device's bf16 peak, peak memory, the SDPA kernel in use, and what attention supervision costs.

    python benchmarks/gpu.py --out benchmarks/results/gpu.json        # the README's run (a GPU; planned < 6 min)
    python benchmarks/gpu.py --docs benchmarks/results/gpu.json       # only rewrite the README's block from it
    python benchmarks/gpu.py --tiny --out /tmp/gpu.json               # tiny configs, 2 steps: runs on a CPU (tests)
    python benchmarks/gpu.py --peak_tflops 400 --out out.json         # a device missing from PEAK_BF16_TFLOPS

Settings (each family at the size its papers' configs give, examples/configs/):
- single_stream: `SingleStreamForVisualParaphrase` (Samaran; VL-BERT base = BERT base: 12 layers, hidden 768,
  12 heads), supervision = direct on every layer and head (finetune_vgp.py's default);
- two_stream: `TwoStreamForPreTraining` (Kervadec; LXMERT's 9 language / 5 object / 5 cross layers, hidden 768) with
  every LXMERT pre-training head, supervision = the alignment decoder's loss (eq. 14, top-3);
- captioning_a2: `RegionCaptionerForConditionalGeneration` (Fei; the meshed-memory transformer's 3 + 3 layers,
  d_model 512, 8 heads, FFN 2048), supervision = A2 with the learnable gate: each step is the mask networks' step
  (perturbed attention, eq. 4, their own Adam) then the captioner's, as `CaptioningTrainer` runs them;
- captioning_geometry: the same class as Ilinykh's config (6 + 6 layers, geometry-aware encoder), no supervision.

Every run trains in fp32 weights under `torch.autocast(bfloat16)`: forward, backward and an AdamW step per timed step,
after warm-up steps, with `torch.cuda.synchronize()` around the timed loop. Batches are random but shaped like real
ones: text lengths drawn between half and all of the text length (padding after), every region real, about half the
words grounded. Each (family, supervision, attention implementation) is built and timed alone, one after the other
in this process, so its peak memory (`torch.cuda.max_memory_allocated`: weights, gradients, optimizer state and
activations) is its own; supervision overhead = step time with / without, from the same run.

Tokens per example: text tokens + regions (the captioner: caption tokens + regions), padding included. FLOPs per step
are counted once per setting with `torch.utils.flop_counter.FlopCounterMode` (the matmuls and attention of forward
and backward, recomputation and the A2 mask step included; the optimizer's elementwise work is not counted); MFU =
(FLOPs per step / step time) / the device's dense bf16 peak. The SDPA kernels are the fused attention ops the step
dispatched (`aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`); `sdpa` calls that ran none of them took
the math path; the eager rows call no `sdpa`, nor do CPU training steps with dropout (`models/attention_utils.py`).
Host syncs per step: the synchronizing CUDA calls (device-to-host copies, stream synchronisations) of one more
training step under `torch.cuda.set_sync_debug_mode("warn")`, with the file and line of each (CUDA only).
`--profile` adds one profiled step per setting (`torch.profiler`): the device's busy time, the kernels launched and
the top operators by their own time, to tell a launch-bound step (busy time well under the step time) from a slow
kernel.

The README's block is rendered from a results file of a GPU run (tests/project/test_readme_benchmark_tables.py checks
it); without one it says the benchmark has not been run and gives the command.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import transformers
from torch.autograd import DeviceType
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    TwoStreamConfig,
    TwoStreamForPreTraining,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from machine_info import cpu_model  # noqa: E402  (benchmarks/machine_info.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu.json"
COMMAND = f"python benchmarks/gpu.py --out {RESULTS.relative_to(ROOT)}"
DOCS_BEGIN = "<!-- benchmarks/gpu.py table: begin -->"
DOCS_END = "<!-- benchmarks/gpu.py table: end -->"

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from NVIDIA's datasheets (their figures "with sparsity" are
# twice these): H100 / H200 datasheets (H100 SXM 989, H100 PCIe 756, H100 NVL 835; H200 SXM 989, H200 NVL 835),
# GH200 datasheet (989), A100 datasheet (312, SXM and PCIe), A10 datasheet (125), L4 datasheet (121), L40 datasheet
# (181), L40S datasheet (362). Matched against `torch.cuda.get_device_name()` in this order (first match wins).
PEAK_BF16_TFLOPS: list[tuple[str, str, float]] = [
    (r"GH200", "GH200", 989.0),
    (r"H200 NVL", "H200 NVL", 835.0),
    (r"H200", "H200 SXM", 989.0),
    (r"H100 PCIe", "H100 PCIe", 756.0),
    (r"H100 NVL", "H100 NVL", 835.0),
    (r"H100", "H100 SXM", 989.0),
    (r"A100", "A100", 312.0),
    (r"L40S", "L40S", 362.0),
    (r"L40\b", "L40", 181.0),
    (r"\bL4\b", "L4", 121.0),
    (r"\bA10\b", "A10", 125.0),
]
COMPILED = "sdpa + compile"
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "mem-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_fused_attention_overrideable": "fused (overrideable)",
}


# ---------------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setup:
    """One family at one size: how to build its config and a batch, and what its supervision is."""

    family: str
    source: str  # the paper and config the size comes from
    supervision: str  # what "supervision on" means for this family; "" when the family has none
    batch: int
    text: int  # text tokens (caption tokens for the captioner)
    regions: int
    features: int
    config: Callable[[bool], object]  # supervised -> config


def single_stream_config(tiny: bool) -> Callable[[bool], SingleStreamConfig]:
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=1000,
                 visual_feat_dim=16) if tiny else dict(visual_feat_dim=2048)  # SingleStreamConfig's defaults: BERT base
    return lambda supervised: SingleStreamConfig(**sizes, attention_supervision="direct" if supervised else "none")


def two_stream_config(tiny: bool) -> Callable[[bool], TwoStreamConfig]:
    sizes = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=1000, l_layers=1, r_layers=1,
                 x_layers=1, visual_feat_dim=16, num_object_labels=20, num_attr_labels=10,
                 num_qa_labels=30) if tiny else \
        dict(l_layers=9, r_layers=5, x_layers=5, visual_feat_dim=2048)  # LXMERT's layers, BERT base, its label counts
    return lambda supervised: TwoStreamConfig(**sizes, task_alignment=supervised)


def captioner_config(tiny: bool, layers: int, geometry: bool) -> Callable[[bool], RegionCaptionerConfig]:
    sizes = dict(d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                 decoder_ffn_dim=64, vocab_size=1000, visual_feat_dim=16, encoder_layers=1, decoder_layers=1,
                 geometry_dim=8) if tiny else \
        dict(d_model=512, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
             decoder_ffn_dim=2048, visual_feat_dim=2048, encoder_layers=layers, decoder_layers=layers)  # fmt: skip
    return lambda supervised: RegionCaptionerConfig(
        **sizes, use_geometry=geometry, attention_alignment="gate" if supervised else "none"
    )


def setups(tiny: bool) -> list[Setup]:
    """The four settings, at base size (or tiny: 2 examples, 6 tokens, 4 regions)."""
    batch, regions, features = (2, 4, 16) if tiny else (64, 36, 2048)
    text = {"single_stream": 6, "two_stream": 6, "captioning": 6} if tiny else \
        {"single_stream": 64, "two_stream": 32, "captioning": 24}  # fmt: skip
    return [
        Setup("single_stream", "Samaran VGP: VL-BERT base, 12 layers, 768 hidden", "direct", batch,
              text["single_stream"], regions, features, single_stream_config(tiny)),
        Setup("two_stream", "Kervadec: LXMERT 9 / 5 / 5 layers, 768 hidden", "alignment decoder", batch,
              text["two_stream"], regions, features, two_stream_config(tiny)),
        Setup("captioning_a2", "Fei A2: M2 3 + 3 layers, d_model 512", "A2 gate", batch, text["captioning"],
              regions, features, captioner_config(tiny, 3, geometry=False)),
        Setup("captioning_geometry", "Ilinykh: ORT 6 + 6 layers, d_model 512, geometry", "", batch,
              text["captioning"], regions, features, captioner_config(tiny, 6, geometry=True)),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ batches


def region_inputs(setup: Setup, generator: torch.Generator) -> dict[str, torch.Tensor]:
    corners = torch.rand(setup.batch, setup.regions, 2, generator=generator) * 0.5
    extent = 0.1 + torch.rand(setup.batch, setup.regions, 2, generator=generator) * 0.4
    return {
        "visual_feats": torch.randn(setup.batch, setup.regions, setup.features, generator=generator),
        "visual_boxes": torch.cat([corners, corners + extent], dim=-1),
        "visual_attention_mask": torch.ones(setup.batch, setup.regions, dtype=torch.long),
    }


def text_lengths(setup: Setup, generator: torch.Generator) -> torch.Tensor:
    """Lengths between half and all of `setup.text`, the longest one full (a padded batch)."""
    lengths = torch.randint(setup.text // 2, setup.text + 1, (setup.batch,), generator=generator)
    lengths[0] = setup.text
    return lengths


def grounding(setup: Setup, attention_mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(B, T, R) targets: about half the real words grounded, each to one or two regions."""
    shape = (setup.batch, setup.text)
    alignment = torch.zeros(*shape, setup.regions)
    for _ in range(2):
        regions = torch.randint(0, setup.regions, shape, generator=generator)
        alignment.scatter_add_(2, regions.unsqueeze(-1), torch.full((*shape, 1), 0.5))
    grounded = (torch.rand(*shape, generator=generator) < 0.5) & attention_mask.bool()
    grounded[:, 1] = True  # every example has a grounded word
    return alignment * grounded.unsqueeze(-1)


def encoder_text(setup: Setup, vocab_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    lengths = text_lengths(setup, generator)
    attention_mask = (torch.arange(setup.text)[None] < lengths[:, None]).long()
    first_word = 1000 if vocab_size > 2000 else 5  # past BERT's special and unused tokens
    input_ids = torch.randint(first_word, vocab_size, (setup.batch, setup.text), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, setup.text // 2 :] = 1
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def single_stream_batch(setup: Setup, config, generator: torch.Generator) -> dict[str, torch.Tensor]:
    text = encoder_text(setup, config.vocab_size, generator)
    phrase1, phrase2 = torch.zeros_like(text["input_ids"]), torch.zeros_like(text["input_ids"])
    phrase1[:, 1:3] = 1
    phrase2[:, setup.text // 2 : setup.text // 2 + 2] = 1
    batch = {**text, **region_inputs(setup, generator), "phrase1_mask": phrase1, "phrase2_mask": phrase2,
             "id_labels": torch.randint(0, config.num_id_labels, (setup.batch,), generator=generator),
             "vgp_labels": torch.randint(0, config.num_vgp_labels, (setup.batch,), generator=generator)}  # fmt: skip
    if config.attention_supervision != "none":
        batch["word_region_alignment"] = grounding(setup, text["attention_mask"], generator)
    return batch


def two_stream_batch(setup: Setup, config, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """LXMERT's pre-training batch: 15 % of the words and objects masked, half the pairs mismatched."""
    text, regions = encoder_text(setup, config.vocab_size, generator), region_inputs(setup, generator)
    real = text["attention_mask"].bool()
    masked_words = (torch.rand(setup.batch, setup.text, generator=generator) < 0.15) & real
    masked_words[:, 1] = True
    masked_regions = torch.rand(setup.batch, setup.regions, generator=generator) < 0.15
    masked_regions[:, 0] = True
    matched = torch.randint(0, 2, (setup.batch,), generator=generator)
    answers = torch.randint(0, config.num_qa_labels, (setup.batch,), generator=generator)
    answers = answers.masked_fill(matched == 0, -100)  # questions are answered on matched pairs only
    batch = {
        **text, **regions,
        "labels": text["input_ids"].masked_fill(~masked_words, -100),
        "masked_regions": masked_regions.long(),
        "feature_labels": regions["visual_feats"].clone(),
        "object_labels": torch.randint(0, config.num_object_labels, masked_regions.shape, generator=generator)
        .masked_fill(~masked_regions, -100),
        "attribute_labels": torch.randint(0, config.num_attr_labels, masked_regions.shape, generator=generator)
        .masked_fill(~masked_regions, -100),
        "matched_labels": matched,
        "answer_labels": answers,
    }  # fmt: skip
    if config.task_alignment:
        batch["word_region_alignment"] = grounding(setup, text["attention_mask"], generator) * matched[:, None, None]
    return batch


def captioner_batch(setup: Setup, config, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Captions ending with [SEP] at their length, -100 after it."""
    lengths = text_lengths(setup, generator)
    labels = torch.randint(5 if config.vocab_size < 2000 else 1000, config.vocab_size, (setup.batch, setup.text),
                           generator=generator)  # fmt: skip
    positions = torch.arange(setup.text)[None]
    labels = labels.masked_fill(positions == lengths[:, None] - 1, config.eos_token_id)
    labels = labels.masked_fill(positions >= lengths[:, None], -100)
    return {**region_inputs(setup, generator), "labels": labels}


FAMILIES = ("single_stream", "two_stream", "captioning_a2", "captioning_geometry")
BATCHES = {"single_stream": single_stream_batch, "two_stream": two_stream_batch, "captioning_a2": captioner_batch,
           "captioning_geometry": captioner_batch}  # fmt: skip


def tokens_per_example(setup: Setup) -> int:
    return setup.text + setup.regions


# --------------------------------------------------------------------------------------------------------- training


class Trainee:
    """A model with its optimizers and one training step: forward under bf16 autocast, backward, AdamW step. An A2
    captioner first runs the mask networks' step (eq. 4) with their own Adam, as `CaptioningTrainer` does."""

    def __init__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device):
        self.model, self.batch, self.device = model.train(), batch, device
        mask_parameters = model.mask_parameters() if hasattr(model, "mask_parameters") else []
        masks = {id(parameter) for parameter in mask_parameters}
        self.mask_parameters = mask_parameters
        captioner_parameters = [p for p in model.parameters() if id(p) not in masks]
        self.optimizer = torch.optim.AdamW(captioner_parameters, lr=1e-5, fused=device.type == "cuda")
        self.mask_optimizer = torch.optim.Adam(mask_parameters, lr=1e-5) if mask_parameters else None

    def autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def mask_step(self) -> None:
        with self.autocast():
            loss_mask = self.model(**self.batch, alignment_mode="perturb").loss_mask
        for parameter, gradient in zip(self.mask_parameters, torch.autograd.grad(loss_mask, self.mask_parameters)):
            parameter.grad = gradient
        self.mask_optimizer.step()
        self.mask_optimizer.zero_grad(set_to_none=True)

    def step(self) -> torch.Tensor:
        if self.mask_optimizer is not None:
            self.mask_step()
        with self.autocast():
            loss = self.model(**self.batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SdpaCalls(TorchFunctionMode):
    """Counts `torch.nn.functional.scaled_dot_product_attention` calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


class FusedAttentionOps(TorchDispatchMode):
    """Counts the fused attention kernels dispatched (forward ops only)."""

    def __init__(self):
        super().__init__()
        self.kernels: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SDPA_KERNELS:
            self.kernels[SDPA_KERNELS[name]] += 1
        return func(*args, **(kwargs or {}))


def counted_step(trainee: Trainee) -> tuple[int, dict[str, int]]:
    """One training step under FlopCounterMode and the attention counters: (FLOPs, {kernel: calls})."""
    sdpa, fused = SdpaCalls(), FusedAttentionOps()
    flops = FlopCounterMode(display=False)
    with sdpa, flops, fused:
        trainee.step()
    kernels = dict(fused.kernels)
    if sdpa.calls > sum(kernels.values()):
        kernels["math"] = sdpa.calls - sum(kernels.values())
    return flops.get_total_flops(), kernels


def synchronizing_calls(trainee: Trainee) -> dict[str, int]:
    """{call site: count} of the synchronizing CUDA calls in one training step, as CUDA's sync debug mode reports them
    (a device-to-host copy, a stream synchronisation: what `.item()`, `bool(tensor)`, `nonzero` or copying a Python
    list to the GPU cause). A call site is the innermost frame in hf_vlalign (or this script) and the frame that made
    the call."""
    sites: Counter[str] = Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        # CUDA's message; not the mode's own warning that it "does not yet detect all synchronizing operations"
        if "called a synchronizing CUDA operation" in str(message):
            stack = [frame for frame in traceback.extract_stack()[:-1] if frame.filename != warnings.__file__]
            sites[call_site(stack)] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainee.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return dict(sites)


def call_site(stack: list[traceback.FrameSummary]) -> str:
    def where(frame: traceback.FrameSummary) -> str:
        parts = Path(frame.filename).parts
        return f"{'/'.join(parts[-3:])}:{frame.lineno} ({frame.name})"

    ours = [frame for frame in stack if "hf_vlalign" in frame.filename or frame.filename == __file__]
    caller = where(stack[-1])
    return caller if not ours or ours[-1] is stack[-1] else f"{where(ours[-1])} via {caller}"


def profiled_step(trainee: Trainee, device: torch.device, top: int = 12) -> dict:
    """One training step under `torch.profiler`: the time the device was busy, the kernels launched, and the `top`
    operators by their own device time (CPU time on a CPU)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        trainee.step()
        synchronize(device)
    events = profiler.key_averages()
    own_time = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    ranked = sorted(events, key=lambda event: getattr(event, own_time), reverse=True)[:top]
    busy_ms = sum(event.self_device_time_total for event in events if event.device_type == DeviceType.CUDA) / 1e3
    return {
        "device_busy_ms": busy_ms if device.type == "cuda" else None,
        "kernel_launches": sum(event.count for event in events if "LaunchKernel" in event.key),
        "top_ops": [{"op": event.key, "calls": event.count, "own_ms": getattr(event, own_time) / 1e3,
                     "cpu_ms": event.cpu_time_total / 1e3} for event in ranked],
    }  # fmt: skip


def measure(setup: Setup, supervised: bool, implementation: str, device: torch.device, steps: int, warmup: int,
            peak_tflops: float | None, profiled: bool = False, flops: int | None = None,
            compile_backend: str = "inductor") -> dict:  # fmt: skip
    """Builds the model on `device` and times `steps` training steps after `warmup` steps (see the module docstring).

    implementation: "sdpa", "eager", or "sdpa + compile" (the model under `torch.compile`; its FLOPs are those of the
    same setting's sdpa run, `flops`, since the counters cannot see inside a compiled graph).
    """
    torch.manual_seed(0)
    config = setup.config(supervised)
    compiled = implementation == COMPILED
    config._attn_implementation = "sdpa" if compiled else implementation
    with device:
        model = {"single_stream": SingleStreamForVisualParaphrase, "two_stream": TwoStreamForPreTraining}.get(
            setup.family, RegionCaptionerForConditionalGeneration
        )(config)
    batch = BATCHES[setup.family](setup, config, torch.Generator().manual_seed(0))
    features = batch["visual_feats"].flatten(0, 1)  # the statistics the trainers fit before training
    model.set_visual_feature_statistics(features.mean(0).to(device), features.std(0).to(device), features.shape[0])
    trainee = Trainee(torch.compile(model, backend=compile_backend) if compiled else model,
                      {name: tensor.to(device) for name, tensor in batch.items()}, device)  # fmt: skip
    start = time.perf_counter()
    trainee.step()
    synchronize(device)
    first_step = time.perf_counter() - start  # compiling, for a compiled model
    for _ in range(warmup - 1):
        trainee.step()
    flops, kernels = (flops, None) if compiled else counted_step(trainee)
    sync_sites = synchronizing_calls(trainee) if device.type == "cuda" else None
    step_profile = profiled_step(trainee, device) if profiled else None
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    losses = [trainee.step() for _ in range(steps)]
    synchronize(device)
    seconds = (time.perf_counter() - start) / steps
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    achieved = flops / seconds / 1e12
    run = {
        "family": setup.family, "source": setup.source,
        "supervision": setup.supervision if supervised else "none",
        "attn_implementation": implementation,
        "batch": setup.batch, "text_tokens": setup.text, "regions": setup.regions,
        "tokens_per_example": tokens_per_example(setup),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "first_step_seconds": first_step,
        "step_seconds": seconds,
        "examples_per_second": setup.batch / seconds,
        "tokens_per_second": setup.batch * tokens_per_example(setup) / seconds,
        "flops_per_step": flops,
        "achieved_tflops": achieved,
        "mfu": achieved / peak_tflops if peak_tflops else None,
        "peak_memory_gib": peak_gib,
        "sdpa_kernels": kernels,
        "host_syncs": None if sync_sites is None else sum(sync_sites.values()),
        "host_sync_sites": sync_sites,
        "profile": step_profile,
        "final_loss": float(torch.stack(losses)[-1].float()),
    }  # fmt: skip
    del trainee, model, batch
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return run


# ----------------------------------------------------------------------------------------------------------- device


def device_peak(name: str, peak_tflops: float | None) -> tuple[float | None, str]:
    """(dense bf16 peak in TFLOP/s, where it comes from) for a device name."""
    if peak_tflops is not None:
        return peak_tflops, "--peak_tflops"
    for pattern, label, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, name):
            return tflops, f"{label} datasheet (dense bf16)"
    return None, "unknown device: MFU left empty (give --peak_tflops)"


def device_info(device: torch.device, peak_tflops: float | None) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak, source = device_peak(name, peak_tflops)
        memory = torch.cuda.get_device_properties(device).total_memory / 2**30
        return {"kind": "cuda", "name": name, "memory_gib": memory, "bf16_peak_tflops": peak, "peak_source": source,
                "cuda": torch.version.cuda}  # fmt: skip
    no_peak = (None, "CPU: no peak, MFU not computed")
    peak, source = (peak_tflops, "--peak_tflops") if peak_tflops is not None else no_peak
    return {"kind": "cpu", "name": cpu_model(), "memory_gib": None, "bf16_peak_tflops": peak, "peak_source": source,
            "cuda": None}  # fmt: skip


def ratios(runs: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """Supervision overhead (step time on / off) per family and implementation; sdpa speed-up (eager / sdpa);
    compile speed-up (sdpa / sdpa + compile)."""
    by_key = {(run["family"], run["supervision"] != "none", run["attn_implementation"]): run for run in runs}
    overheads, speedups, compile_speedups = [], [], []
    for (family, supervised, implementation), run in by_key.items():
        if supervised:
            off = by_key[family, False, implementation]
            overheads.append({"family": family, "attn_implementation": implementation,
                              "supervision": run["supervision"],
                              "overhead": run["step_seconds"] / off["step_seconds"]})  # fmt: skip
        if implementation == "sdpa" and (family, supervised, "eager") in by_key:
            eager = by_key[family, supervised, "eager"]
            speedups.append({"family": family, "supervision": run["supervision"],
                             "speedup": eager["step_seconds"] / run["step_seconds"]})  # fmt: skip
        if implementation == COMPILED:
            plain = by_key[family, supervised, "sdpa"]
            compile_speedups.append({"family": family, "supervision": run["supervision"],
                                     "speedup": plain["step_seconds"] / run["step_seconds"],
                                     "compile_seconds": run["first_step_seconds"]})  # fmt: skip
    return overheads, speedups, compile_speedups


def benchmark(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    info = device_info(device, args.peak_tflops)
    runs = []
    for setup in (setup for setup in setups(args.tiny) if setup.family in args.families):
        for supervised in (False, True) if setup.supervision else (False,):
            implementations = ("sdpa", "eager", COMPILED) if setup.family in args.compile else ("sdpa", "eager")
            for implementation in implementations:
                peak = info["bf16_peak_tflops"]
                sdpa_flops = runs[-2]["flops_per_step"] if implementation == COMPILED else None
                run = measure(setup, supervised, implementation, device, args.steps, args.warmup, peak, args.profile,
                              sdpa_flops, args.compile_backend)  # fmt: skip
                runs.append(run)
                print(f"{run['family']:>20} {run['supervision']:>18} {implementation:>5}: "
                      f"{run['step_seconds'] * 1e3:8.1f} ms/step, {run['tokens_per_second']:10.0f} tokens/s, "
                      f"kernels {run['sdpa_kernels']}, host syncs {run['host_sync_sites']}", flush=True)  # fmt: skip
                if run["profile"] is not None:
                    print(json.dumps(run["profile"], indent=1), flush=True)
    overheads, speedups, compile_speedups = ratios(runs)
    return {
        "settings": {"command": " ".join(["python", "benchmarks/gpu.py", *args.argv]), "tiny": args.tiny,
                     "steps": args.steps, "warmup": args.warmup, "profile": args.profile,
                     "families": args.families, "compile": args.compile, "compile_backend": args.compile_backend,
                     "precision": "fp32 weights, bf16 autocast",
                     "optimizer": "AdamW (fused on CUDA)",
                     "flops": "torch.utils.flop_counter.FlopCounterMode, one training step per setting"},
        "device": info,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "runs": runs,
        "supervision_overhead": overheads,
        "sdpa_speedup_vs_eager": speedups,
        "compile_speedup": compile_speedups,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------------------- docs


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def busy_fraction(run: dict) -> float | None:
    """The share of a step the GPU spent running kernels (the profiled step's kernel time / the mean step time)."""
    profile = run.get("profile")
    if profile is None or profile["device_busy_ms"] is None:
        return None
    return profile["device_busy_ms"] / (run["step_seconds"] * 1e3)


def table(report: dict) -> str:
    """The results as markdown: one row per run, then the ratios."""
    device, settings = report["device"], report["settings"]
    peak = device["bf16_peak_tflops"]
    lines = [
        f"{device['name']} (bf16 peak {_number(peak, '.0f')} TFLOP/s: {device['peak_source']}), torch "
        f"{report['versions']['torch']}; {settings['precision']}, {settings['optimizer']}, mean of {settings['steps']} "
        f"steps after {settings['warmup']}; FLOPs counted by FlopCounterMode; `{settings['command']}`",
        "",
        "| family | supervision | attention | batch x tokens | ms/step | examples/s | tokens/s | TFLOP/s | MFU | "
        "peak memory GiB | SDPA kernels | host syncs per step | GPU busy |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for run in report["runs"]:
        kernels = "in the compiled graph" if run["sdpa_kernels"] is None else \
            ", ".join(f"{name} x{count}" for name, count in run["sdpa_kernels"].items()) or "no sdpa call"  # fmt: skip
        lines.append(
            f"| {run['family']} | {run['supervision']} | {run['attn_implementation']} | {run['batch']} x "
            f"{run['tokens_per_example']} | {run['step_seconds'] * 1e3:.1f} | {run['examples_per_second']:.0f} | "
            f"{run['tokens_per_second']:.0f} | {run['achieved_tflops']:.1f} | {_number(run['mfu'], '.1%')} | "
            f"{_number(run['peak_memory_gib'], '.1f')} | {kernels} | {_number(run['host_syncs'], 'd')} | "
            f"{_number(busy_fraction(run), '.0%')} |"
        )
    lines += ["", "| family | supervision | attention | step time on / off |", "|---|---|---|---:|"]
    lines += [f"| {row['family']} | {row['supervision']} | {row['attn_implementation']} | {row['overhead']:.3f} |"
              for row in report["supervision_overhead"]]  # fmt: skip
    lines += ["", "| family | supervision | eager / sdpa step time |", "|---|---|---:|"]
    lines += [f"| {row['family']} | {row['supervision']} | {row['speedup']:.3f} |"
              for row in report["sdpa_speedup_vs_eager"]]  # fmt: skip
    if report.get("compile_speedup"):
        lines += ["", "| family | supervision | sdpa / sdpa + compile step time | compile seconds (first step) |",
                  "|---|---|---:|---:|"]  # fmt: skip
        lines += [f"| {row['family']} | {row['supervision']} | {row['speedup']:.3f} | {row['compile_seconds']:.0f} |"
                  for row in report["compile_speedup"]]  # fmt: skip
    return "\n".join(lines)


def findings(report: dict) -> str:
    """What the table says, in sentences computed from it: host syncs, how busy the GPU was, what compiling did."""
    runs = report["runs"]
    syncs = sum(run["host_syncs"] or 0 for run in runs)
    lines = [f"- Host synchronisations counted by CUDA's sync debug mode in one training step of every row: {syncs}."]
    busy = [fraction for fraction in map(busy_fraction, runs) if fraction is not None]
    if busy:
        lines.append(
            f"- The GPU ran kernels for {min(busy):.0%}-{max(busy):.0%} of a step (profiled step): at these sizes a "
            "step is bound by the host launching kernels, not by the GPU, so absolute times follow the host CPU; "
            "compare rows of one run."
        )
    overhead = {(row["family"], row["attn_implementation"]): row["overhead"] for row in report["supervision_overhead"]}
    for row in report.get("compile_speedup", []):
        supervised = row["supervision"] != "none"
        supervision = f"with {row['supervision']} supervision" if supervised else "without supervision"
        sentence = f"- `torch.compile` made the {row['family']} step {supervision} {row['speedup']:.2f}x as fast " \
                   f"(compiling took {row['compile_seconds']:.0f} s)"  # fmt: skip
        if supervised and (row["family"], COMPILED) in overhead:
            sentence += (f"; supervision's step-time overhead fell from {overhead[row['family'], 'sdpa']:.2f}x to "
                         f"{overhead[row['family'], COMPILED]:.2f}x")  # fmt: skip
        lines.append(sentence + ".")
    return "\n".join(lines)


def is_gpu_result(report: dict | None) -> bool:
    return report is not None and report["device"]["kind"] == "cuda" and not report["settings"]["tiny"]


def docs_block(report: dict | None) -> str:
    """The README's block: the table of a GPU run, or the statement that none was made and the command to make it."""
    if report is None:
        body = (
            "**Not run yet**: no GPU was available to the sessions that wrote this benchmark. On a GPU machine,\n"
            f"`{COMMAND}`, then `python benchmarks/gpu.py --docs {RESULTS.relative_to(ROOT)}`, puts its figures here."
        )
    elif not is_gpu_result(report):
        raise ValueError(
            f"the README's table needs a GPU run at base size (`{COMMAND}`), got a run on {report['device']['name']} "
            f"({report['device']['kind']}, tiny={report['settings']['tiny']})."
        )
    else:
        body = table(report) + "\n\n" + findings(report)
    return f"{DOCS_BEGIN}\n{body}\n{DOCS_END}"


def committed_report(path: Path = RESULTS) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (the README's: "
                        f"{RESULTS.relative_to(ROOT)}); a Markdown table is written beside it (.md)")  # fmt: skip
    parser.add_argument("--docs", type=Path, default=None, help="only rewrite the README's block from this results "
                        "JSON (a missing file: the block says the benchmark has not been run)")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="tiny configs, batch 2 (runs on a CPU; the test's run)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per setting (default 30, tiny 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first, >= 1 (default 3, tiny 1)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES, metavar="FAMILY",
                        help=f"the families to time (default: all of {FAMILIES})")  # fmt: skip
    parser.add_argument("--compile", nargs="*", default=[], choices=FAMILIES, metavar="FAMILY", help="also time "
                        f"these families under torch.compile (sdpa), one of {FAMILIES}")  # fmt: skip
    parser.add_argument("--compile_backend", default="inductor", help="torch.compile's backend for --compile "
                        "(default inductor; the test's CPU run: aot_eager)")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="profile one more step per setting (torch.profiler): "
                        "device busy time, kernel launches, the top operators")  # fmt: skip
    parser.add_argument("--peak_tflops", type=float, default=None, help="the device's dense bf16 peak, when it is "
                        "not in PEAK_BF16_TFLOPS (or to override it)")  # fmt: skip
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.docs is not None:
        report = committed_report(args.docs)
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))
        return report
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device: CUDA is not available, got {args.device!r}; use --device cpu --tiny")
    args.steps = args.steps if args.steps is not None else 2 if args.tiny else 30
    args.warmup = args.warmup if args.warmup is not None else 1 if args.tiny else 3
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps and --warmup must be >= 1, got {args.steps} and {args.warmup}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        parser.error(f"--peak_tflops must be > 0 TFLOP/s, got {args.peak_tflops}")
    report = benchmark(args)
    print(table(report))
    if args.out is not None:
        write_results(args.out, report)
        args.out.with_suffix(".md").write_text(table(report) + "\n")
    return report


if __name__ == "__main__":
    main()
