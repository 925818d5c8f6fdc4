#!/usr/bin/env python
"""Every performance ratio of hf_vlalign, measured pair by pair in one run.

    python benchmarks/run.py --quick                      # MiniLM-sized: 6 layers, 384 hidden, 12 heads; < 5 min on 2 cores
    python benchmarks/run.py                              # the papers' base sizes: 12 layers, 768 hidden
    python benchmarks/run.py --quick --json out.json --threads 2 --device cpu --dtype float32
    python benchmarks/run.py --smoke --json out.json      # tiny dimensions, one repetition (the test suite's run)

Method. The two sides of each ratio are timed in the same run, interleaved (one call of each per repetition, after a
warm-up), and the median of the repetitions is kept; `torch.set_num_threads` is fixed (`--threads`). Every ratio is
written so that > 1 means hf_vlalign is better, except the two overhead ratios (`supervision_overhead_direct`,
`supervision_memory_ratio_direct`), where <= 1.10 is the target.

Peak memory on CPU: the training step runs under `torch.profiler` with `profile_memory=True`; every allocation and
free of the c10 CPU allocator is then a `[memory]` event carrying its signed size, so the running sum of those events
in time order is the memory the step holds beyond what it started with, and its maximum is the step's peak (weights
and live inputs, identical for both sides, are excluded; gradients are freed between steps, so they count). On CUDA
`torch.cuda.max_memory_allocated` over `memory_allocated` at the start gives the same quantity.

Model FLOPs (for `mfu_vs_matmul`) are counted analytically, the usual MFU convention: the matmuls of the embeddings'
projections, every layer's Q/K/V/output projections, feed-forward, QK^T and attention x V, and the pooler; a training
step is 3x the forward FLOPs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import feature_store  # noqa: E402  (benchmarks/feature_store.py)
from transformers import BertConfig, BertModel, LxmertConfig, LxmertModel, VisualBertConfig, VisualBertModel  # noqa: E402

from hf_vlalign import (  # noqa: E402
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamModel,
)
from hf_vlalign.data.feature_store import RegionFeatureStore, convert_features  # noqa: E402
from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv  # noqa: E402

LOSS_TOLERANCE = 1e-5
TARGETS = {
    "supervision_overhead_direct": ("<=", 1.10),
    "supervision_speedup_vs_naive": (">=", 1.25),
    "supervision_memory_ratio_direct": ("<=", 1.10),
    "single_stream_speedup_vs_visualbert": (">=", 1.15),
    "two_stream_speedup_vs_lxmert": (">=", 1.10),
    "feature_store_speedup_vs_tsv": (">=", 20.0),
    "kv_cache_speedup": (">=", 3.0),
    "mfu_vs_matmul": (">=", 0.6),
}


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    regions: int
    words: int  # text tokens in all (two captions of words / 2)
    batch: int
    features: int
    vocab: int
    l_layers: int
    r_layers: int
    x_layers: int
    caption_layers: int
    matmul: int
    store_images: int
    store_batch: int
    store_batches: int
    repeats: int
    warmup: int


SIZES = {
    "smoke": Size(hidden=32, layers=2, heads=4, intermediate=64, regions=6, words=8, batch=2, features=16, vocab=1000,
                  l_layers=1, r_layers=1, x_layers=1, caption_layers=1, matmul=128, store_images=16, store_batch=4,
                  store_batches=2, repeats=1, warmup=1),
    "quick": Size(hidden=384, layers=6, heads=12, intermediate=1536, regions=36, words=40, batch=16, features=2048,
                  vocab=30522, l_layers=3, r_layers=2, x_layers=2, caption_layers=3, matmul=2048, store_images=256,
                  store_batch=64, store_batches=8, repeats=9, warmup=2),
    "full": Size(hidden=768, layers=12, heads=12, intermediate=3072, regions=36, words=40, batch=16, features=2048,
                 vocab=30522, l_layers=9, r_layers=5, x_layers=5, caption_layers=6, matmul=4096, store_images=1024,
                 store_batch=64, store_batches=30, repeats=10, warmup=2),
}  # fmt: skip


@dataclass(frozen=True)
class Env:
    device: torch.device
    dtype: torch.dtype

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# ----------------------------------------------------------------------------------------------------- timing helpers


def interleaved_median(fns: dict[str, Callable[[], object]], repeats: int, warmup: int, sync=lambda: None) -> dict[str, float]:
    """Median seconds of each function, calling them in turn (one call of each per repetition) after `warmup` rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for repetition in range(warmup + repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if repetition >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def training_step(model: torch.nn.Module, inputs: dict, scalar: Callable) -> float:
    """Forward, scalar loss, backward; gradients freed (set to None) so every step allocates them alike."""
    loss = scalar(model(**inputs))
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def peak_step_bytes(fn: Callable[[], object], env: Env) -> int:
    """Peak memory a call holds beyond what it started with (see the module docstring for the method)."""
    if env.device.type == "cuda":
        env.sync()
        torch.cuda.reset_peak_memory_stats(env.device)
        start = torch.cuda.memory_allocated(env.device)
        fn()
        env.sync()
        return torch.cuda.max_memory_allocated(env.device) - start
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and str(event.device_type()).endswith("CPU")
    )
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


# ------------------------------------------------------------------------------------------------------------ inputs


def make_inputs(size: Size, env: Env, generator: torch.Generator, regions: int | None = None, words: int | None = None) -> dict:
    """A batch of the shared tensor names, every token and region real; about half the tokens grounded, each to a
    distribution over one or two regions."""
    regions, words, batch = regions or size.regions, words or size.words, size.batch
    corners = torch.rand(batch, regions, 2, generator=generator) * 0.5
    extent = 0.1 + torch.rand(batch, regions, 2, generator=generator) * 0.4
    alignment = torch.zeros(batch, words, regions)
    first = torch.randint(0, regions, (batch, words), generator=generator)
    second = torch.randint(0, regions, (batch, words), generator=generator)
    alignment.scatter_add_(2, first.unsqueeze(-1), torch.full((batch, words, 1), 0.5))
    alignment.scatter_add_(2, second.unsqueeze(-1), torch.full((batch, words, 1), 0.5))
    alignment *= (torch.rand(batch, words, 1, generator=generator) < 0.5).float()
    token_type_ids = torch.zeros(batch, words, dtype=torch.long)
    token_type_ids[:, words // 2 :] = 1
    tensors = {
        "input_ids": torch.randint(min(1000, size.vocab // 2), size.vocab, (batch, words), generator=generator),
        "attention_mask": torch.ones(batch, words, dtype=torch.long),
        "token_type_ids": token_type_ids,
        "visual_feats": torch.randn(batch, regions, size.features, generator=generator),
        "visual_boxes": torch.cat([corners, corners + extent], dim=-1),
        "visual_attention_mask": torch.ones(batch, regions, dtype=torch.long),
        "word_region_alignment": alignment,
    }
    return {name: on_env(tensor, env) for name, tensor in tensors.items()}


def on_env(tensor: torch.Tensor, env: Env) -> torch.Tensor:
    tensor = tensor.to(env.device)
    return tensor.to(env.dtype) if tensor.is_floating_point() and tensor.dim() == 3 and env.dtype != torch.float32 else tensor


def without(inputs: dict, *names: str) -> dict:
    return {name: tensor for name, tensor in inputs.items() if name not in names}


def on_model(model: torch.nn.Module, env: Env) -> torch.nn.Module:
    return model.to(device=env.device, dtype=env.dtype).train()


def single_stream_config(size: Size, **overrides) -> SingleStreamConfig:
    fields = dict(
        vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers, num_attention_heads=size.heads,
        intermediate_size=size.intermediate, visual_feat_dim=size.features,
    )  # fmt: skip
    return SingleStreamConfig(**{**fields, **overrides})


def task_loss(outputs) -> torch.Tensor:
    return outputs.last_hidden_state.float().square().mean()


# ------------------------------------------------------------------------------------------- attention supervision


def naive_direct_loss(attentions, layers: list[int], heads: list[int], words: int, regions: int, alignment) -> torch.Tensor:
    """Direct supervision bolted on the usual way (the VGP authors' code): every supervised layer's full attention map
    stacked into one (L, B, H, N, N) tensor, each row re-normalised over its supervised block (text rows over the
    regions, region rows over the words), and the soft cross-entropy taken against a full (B, N, N) target holding the
    alignment in the text->region block and its re-normalised columns in the region->text block (eqs. 6-8); each
    direction averaged over the rows that carry a target."""
    maps = torch.stack([attentions[layer] for layer in layers])[:, :, heads].float()
    batch, length = alignment.shape[0], maps.shape[-1]
    text, region = slice(0, words), slice(words, words + regions)
    column_sums = alignment.transpose(1, 2).sum(-1, keepdim=True)
    target = alignment.new_zeros(batch, length, length)
    target[:, text, region] = alignment
    target[:, region, text] = torch.where(column_sums > 0, alignment.transpose(1, 2) / column_sums.clamp(min=1e-12), 0.0)
    block = torch.zeros(length, length, dtype=torch.bool, device=maps.device)
    block[text, region] = block[region, text] = True
    block_mass = (maps * block).sum(-1, keepdim=True)
    log_renormalised = torch.log(maps.clamp(min=1e-30)) - torch.log(block_mass.clamp(min=1e-30))
    per_row = -(target[None, :, None] * log_renormalised).sum(-1)  # (L, B, H, N)
    has_target = (target.sum(-1) > 0)[None, :, None].float()
    losses = [
        (per_row[..., rows] * has_target[..., rows]).sum() / has_target[..., rows].sum().clamp(min=1) / len(heads)
        for rows in (text, region)
    ]  # fmt: skip
    return (losses[0] + losses[1]) / len(layers)


def supervision_models(size: Size, env: Env) -> dict[str, SingleStreamModel]:
    """The same weights three times: ours (direct supervision from the query/key projections, hf_vlalign's dropout),
    the naive one (eager attention, torch's dropout, loss from the returned maps), and the naive one with
    hf_vlalign's dropout (which splits the speed-up between the supervision path and the dropout)."""
    torch.manual_seed(0)
    ours = SingleStreamModel(single_stream_config(size, attention_supervision="direct"))
    models = {"ours": ours}
    for name, dropout in (("naive", "torch"), ("naive_fast_dropout", "auto")):
        config = single_stream_config(size, attention_supervision="none", dropout_implementation=dropout)
        config._attn_implementation = "eager"
        models[name] = SingleStreamModel(config)
        models[name].load_state_dict(ours.state_dict())
    return models


def naive_scalar(model: SingleStreamModel, inputs: dict, with_task: bool = True) -> Callable:
    layers, heads = model.supervised_layer_indices, model.supervised_head_indices
    words, regions = inputs["input_ids"].shape[1], inputs["visual_feats"].shape[1]
    alignment = inputs["word_region_alignment"]

    def scalar(outputs):
        loss = naive_direct_loss(outputs.attentions, layers, heads, words, regions, alignment)
        return loss + task_loss(outputs) if with_task else loss

    return scalar


def check_supervision_losses(ours, naive, inputs: dict) -> tuple[float, float]:
    """Both losses in float32, dropout off: they must agree to LOSS_TOLERANCE."""
    ours32, naive32 = ours.float().eval(), naive.float().eval()
    inputs32 = {name: tensor.float() if tensor.is_floating_point() else tensor for name, tensor in inputs.items()}
    with torch.no_grad():
        fast = float(ours32(**inputs32).loss_attention_supervision)
        slow = float(naive_scalar(naive32, inputs32, with_task=False)(naive32(**without(inputs32, "word_region_alignment"), output_attentions=True)))
    assert abs(fast - slow) <= LOSS_TOLERANCE * max(1.0, abs(fast)), f"naive {slow} != fast {fast}"
    return fast, slow


def measure_supervision(size: Size, env: Env, generator: torch.Generator) -> dict:
    """Training step: ours without supervision, ours with direct supervision, the naive implementation (and the naive
    one with hf_vlalign's dropout, reported alongside)."""
    models = supervision_models(size, env)
    inputs = make_inputs(size, env, generator)
    loss_fast, loss_naive = check_supervision_losses(models["ours"], models["naive"], inputs)
    ours, naive, naive_fast = (on_model(models[name], env) for name in ("ours", "naive", "naive_fast_dropout"))
    plain_inputs = without(inputs, "word_region_alignment")
    naive_inputs = {**plain_inputs, "output_attentions": True}
    steps = {
        "none": lambda: training_step(ours, plain_inputs, task_loss),
        "direct": lambda: training_step(ours, inputs, lambda out: task_loss(out) + out.loss_attention_supervision),
        "naive": lambda: training_step(naive, naive_inputs, naive_scalar(naive, inputs)),
        "naive_fast_dropout": lambda: training_step(naive_fast, naive_inputs, naive_scalar(naive_fast, inputs)),
    }
    seconds = interleaved_median(steps, size.repeats, size.warmup, env.sync)
    memory = {name: peak_step_bytes(steps[name], env) for name in ("none", "direct", "naive")}
    return {
        "seconds": seconds, "peak_bytes": memory, "loss_fast": loss_fast, "loss_naive": loss_naive,
        "overhead": seconds["direct"] / seconds["none"], "speedup_vs_naive": seconds["naive"] / seconds["direct"],
        "memory_ratio": memory["direct"] / memory["none"],
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ reference models


def measure_vs_visualbert(size: Size, env: Env, generator: torch.Generator) -> dict:
    """Forward + backward of transformers.VisualBertModel / SingleStreamModel, same dimensions and inputs."""
    torch.manual_seed(0)
    ours = on_model(SingleStreamModel(single_stream_config(size)), env)
    reference = on_model(VisualBertModel(VisualBertConfig(
        vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers, num_attention_heads=size.heads,
        intermediate_size=size.intermediate, visual_embedding_dim=size.features,
    )), env)  # fmt: skip
    inputs = without(make_inputs(size, env, generator), "word_region_alignment")
    reference_inputs = {
        "input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
        "token_type_ids": inputs["token_type_ids"], "visual_embeds": inputs["visual_feats"],
        "visual_attention_mask": inputs["visual_attention_mask"],
        "visual_token_type_ids": torch.ones_like(inputs["visual_attention_mask"]),
    }  # fmt: skip
    seconds = interleaved_median(
        {"ours": lambda: training_step(ours, inputs, task_loss),
         "visualbert": lambda: training_step(reference, reference_inputs, task_loss)},
        size.repeats, size.warmup, env.sync,
    )  # fmt: skip
    return {"seconds": seconds, "speedup": seconds["visualbert"] / seconds["ours"]}


def measure_bert_sdpa_vs_eager(size: Size, env: Env, generator: torch.Generator) -> dict:
    """Context for the reference ratios: transformers' BertModel training step with `eager` / with `sdpa` attention,
    same dimensions and number of tokens (what `sdpa` alone buys on this machine)."""
    config = dict(vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers,
                  num_attention_heads=size.heads, intermediate_size=size.intermediate)  # fmt: skip
    models = {}
    for implementation in ("eager", "sdpa"):
        torch.manual_seed(0)
        models[implementation] = on_model(BertModel(BertConfig(**config, attn_implementation=implementation)), env)
    tokens = torch.randint(min(1000, size.vocab // 2), size.vocab, (size.batch, size.words + size.regions), generator=generator)
    tokens = tokens.to(env.device)
    seconds = interleaved_median(
        {name: (lambda model=model: training_step(model, {"input_ids": tokens}, task_loss)) for name, model in models.items()},
        size.repeats, size.warmup, env.sync,
    )  # fmt: skip
    return {"seconds": seconds, "speedup": seconds["eager"] / seconds["sdpa"]}


def measure_vs_lxmert(size: Size, env: Env, generator: torch.Generator) -> dict:
    """Forward + backward of transformers.LxmertModel / TwoStreamModel, same dimensions and inputs."""
    layers = dict(l_layers=size.l_layers, r_layers=size.r_layers, x_layers=size.x_layers)
    common = dict(vocab_size=size.vocab, hidden_size=size.hidden, num_attention_heads=size.heads,
                  intermediate_size=size.intermediate, visual_feat_dim=size.features, **layers)  # fmt: skip
    torch.manual_seed(0)
    ours = on_model(TwoStreamModel(TwoStreamConfig(**common)), env)
    reference = on_model(LxmertModel(LxmertConfig(visual_pos_dim=4, **common)), env)
    inputs = without(make_inputs(size, env, generator), "word_region_alignment")
    reference_inputs = {
        "input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
        "token_type_ids": inputs["token_type_ids"], "visual_feats": inputs["visual_feats"],
        "visual_pos": inputs["visual_boxes"], "visual_attention_mask": inputs["visual_attention_mask"],
    }  # fmt: skip

    def scalar(outputs):
        return outputs.language_output.float().square().mean() + outputs.vision_output.float().square().mean()

    seconds = interleaved_median(
        {"ours": lambda: training_step(ours, inputs, scalar),
         "lxmert": lambda: training_step(reference, reference_inputs, scalar)},
        size.repeats, size.warmup, env.sync,
    )  # fmt: skip
    return {"seconds": seconds, "speedup": seconds["lxmert"] / seconds["ours"]}


# ---------------------------------------------------------------------------------------------------- feature store


def measure_feature_store(size: Size) -> dict:
    """Random batches from a RegionFeatureStore vs seeking into and parsing the LXMERT TSV (benchmarks/feature_store.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        tsv = Path(tmp) / "features.tsv"
        write_lxmert_tsv(tsv, feature_store.synthetic_records(size.store_images, size.regions, size.features))
        convert_features(tsv, "lxmert_tsv", Path(tmp) / "store")
        store = RegionFeatureStore.load(Path(tmp) / "store")
        offsets = feature_store.line_offsets(tsv)
        rng = np.random.default_rng(0)
        ids = store.image_ids
        batches = [[ids[i] for i in rng.choice(len(ids), size.store_batch, replace=False)] for _ in range(size.store_batches)]
        assert torch.equal(feature_store.store_batch(store, batches[0]), feature_store.tsv_batch(tsv, offsets, batches[0]))
        seconds = interleaved_median(
            {"store": lambda: [feature_store.store_batch(store, b) for b in batches],
             "tsv": lambda: [feature_store.tsv_batch(tsv, offsets, b) for b in batches]},
            max(size.repeats, 3), 1,
        )  # fmt: skip
    per_batch = {name: value / len(batches) for name, value in seconds.items()}
    return {"seconds_per_batch": per_batch, "speedup": per_batch["tsv"] / per_batch["store"]}


# ------------------------------------------------------------------------------------------------------ generation


def measure_kv_cache(size: Size, env: Env, generator: torch.Generator, new_tokens: int = 20) -> dict:
    """Greedy generation of `new_tokens` tokens by the captioner, without / with the decoder's key-value cache."""
    torch.manual_seed(0)
    config = RegionCaptionerConfig(
        d_model=size.hidden, encoder_layers=size.caption_layers, decoder_layers=size.caption_layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads, encoder_ffn_dim=size.intermediate,
        decoder_ffn_dim=size.intermediate, visual_feat_dim=size.features, vocab_size=size.vocab,
    )  # fmt: skip
    model = RegionCaptionerForConditionalGeneration(config).to(device=env.device, dtype=env.dtype).eval()
    inputs = make_inputs(size, env, generator)
    regions = {"visual_feats": inputs["visual_feats"], "visual_boxes": inputs["visual_boxes"]}
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1)

    def generate(use_cache: bool):
        with torch.no_grad():
            return model.generate(**regions, use_cache=use_cache, **settings)

    assert torch.equal(generate(True), generate(False)), "cached and uncached greedy generation differ"
    seconds = interleaved_median(
        {"no_cache": lambda: generate(False), "cache": lambda: generate(True)}, size.repeats, size.warmup, env.sync
    )
    return {"seconds": seconds, "speedup": seconds["no_cache"] / seconds["cache"]}


# ------------------------------------------------------------------------------------------------------------- MFU


def single_stream_step_flops(size: Size, regions: int, words: int) -> float:
    """Model FLOPs of one training step (3x forward) of SingleStreamModel; see the module docstring."""
    tokens, hidden = words + regions + 1, size.hidden
    per_layer = 2 * tokens * (4 * hidden * hidden + 2 * hidden * size.intermediate) + 4 * tokens * tokens * hidden
    forward = size.batch * (
        size.layers * per_layer + 2 * regions * (size.features + 5) * hidden + 2 * hidden * hidden
    )
    return 3.0 * forward


def matmul_flops_per_second(size: Size, env: Env) -> float:
    n = size.matmul
    left = torch.randn(n, n, device=env.device, dtype=env.dtype)
    right = torch.randn(n, n, device=env.device, dtype=env.dtype)
    seconds = interleaved_median({"matmul": lambda: left @ right}, max(size.repeats, 3), 1, env.sync)["matmul"]
    return 2.0 * n**3 / seconds


def measure_mfu(size: Size, env: Env, generator: torch.Generator, top_ops: int = 12) -> dict:
    """Achieved model FLOP/s of a single-stream training step / FLOP/s of a large matmul; the step's top ops."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = on_model(SingleStreamModel(single_stream_config(size)), env)
    inputs = without(make_inputs(size, env, generator), "word_region_alignment")
    step = lambda: training_step(model, inputs, task_loss)  # noqa: E731
    step_seconds = interleaved_median({"step": step}, size.repeats, size.warmup, env.sync)["step"]
    achieved = single_stream_step_flops(size, size.regions, size.words) / step_seconds
    peak = matmul_flops_per_second(size, env)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    averages = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in averages) or 1.0
    ranked = sorted(averages, key=lambda event: event.self_cpu_time_total, reverse=True)[:top_ops]
    top = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1000,
            "share": e.self_cpu_time_total / total} for e in ranked]  # fmt: skip
    return {
        "step_seconds": step_seconds, "model_flops_per_second": achieved, "matmul_flops_per_second": peak,
        "ratio": achieved / peak, "top_ops": top,
        "profile_table": averages.table(sort_by="self_cpu_time_total", row_limit=top_ops),
    }  # fmt: skip


# -------------------------------------------------------------------------------------------------------- scaling


def fitted_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x (NaN when some y is not positive)."""
    if len(xs) < 2 or any(y <= 0 for y in ys):
        return float("nan")
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def measure_scaling(size: Size, env: Env, generator: torch.Generator) -> dict:
    """Step time without / with direct supervision for 1x, 2x, 4x regions and 0.5x, 1x, 2x words."""
    torch.manual_seed(0)
    model = on_model(SingleStreamModel(single_stream_config(size, attention_supervision="direct")), env)
    points: dict[tuple[int, int], dict[str, float]] = {}

    def point(regions: int, words: int) -> dict[str, float]:
        if (regions, words) not in points:
            inputs = make_inputs(size, env, generator, regions=regions, words=words)
            plain = without(inputs, "word_region_alignment")
            points[(regions, words)] = interleaved_median(
                {"none": lambda: training_step(model, plain, task_loss),
                 "direct": lambda: training_step(
                     model, inputs, lambda out: task_loss(out) + out.loss_attention_supervision
                 )},
                max(1, size.repeats // 2 + 1), size.warmup, env.sync,
            )  # fmt: skip
        return points[(regions, words)]

    region_counts = [size.regions, 2 * size.regions, 4 * size.regions]
    word_counts = [max(2, size.words // 2), size.words, 2 * size.words]
    by_regions = {r: point(r, size.words) for r in region_counts}
    by_words = {w: point(size.regions, w) for w in word_counts}
    costs = [by_regions[r]["direct"] - by_regions[r]["none"] for r in region_counts]
    return {
        "regions": {str(r): by_regions[r] for r in region_counts},
        "words": {str(w): by_words[w] for w in word_counts},
        "supervision_cost_seconds_by_regions": dict(zip(map(str, region_counts), costs)),
        "supervision_cost_exponent_regions": fitted_exponent(region_counts, costs),
        "step_exponent_regions": fitted_exponent(region_counts, [by_regions[r]["direct"] for r in region_counts]),
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------- report


def verdict(key: str, value: float) -> str:
    if key not in TARGETS:
        return "-"
    op, target = TARGETS[key]
    met = value <= target if op == "<=" else value >= target
    return f"{op} {target:g}: {'met' if met else 'MISSED'}"


def print_report(size_name: str, size: Size, env: Env, threads: int, results: dict, details: dict) -> None:
    ms = lambda seconds: f"{1000 * seconds:.1f}"  # noqa: E731
    sup, vb, lx, bert = details["supervision"], details["visualbert"], details["lxmert"], details["bert_attention"]
    fs, kv, mfu, sc = details["feature_store"], details["kv_cache"], details["mfu"], details["scaling"]
    print(f"\n{size_name}: {size.layers} layers, {size.hidden} hidden, {size.heads} heads, batch {size.batch}, "
          f"{size.words} words, {size.regions} regions x {size.features}; {env.device.type} {str(env.dtype)[6:]}, "
          f"{threads} thread(s), median of {size.repeats} after {size.warmup} warm-up\n")
    rows = [
        ("supervision_overhead_direct", f"step direct {ms(sup['seconds']['direct'])} ms / none {ms(sup['seconds']['none'])} ms"),
        ("supervision_speedup_vs_naive", f"naive {ms(sup['seconds']['naive'])} ms / direct {ms(sup['seconds']['direct'])} ms "
                                         f"(naive with hf_vlalign's dropout {ms(sup['seconds']['naive_fast_dropout'])} ms); "
                                         f"loss {sup['loss_fast']:.6f} vs {sup['loss_naive']:.6f}"),
        ("supervision_memory_ratio_direct", f"peak direct {sup['peak_bytes']['direct'] / 2**20:.1f} MiB / none "
                                            f"{sup['peak_bytes']['none'] / 2**20:.1f} MiB (naive {sup['peak_bytes']['naive'] / 2**20:.1f})"),
        ("single_stream_speedup_vs_visualbert", f"VisualBert {ms(vb['seconds']['visualbert'])} ms / ours {ms(vb['seconds']['ours'])} ms"),
        ("two_stream_speedup_vs_lxmert", f"Lxmert {ms(lx['seconds']['lxmert'])} ms / ours {ms(lx['seconds']['ours'])} ms"),
        ("bert_sdpa_speedup_vs_eager", f"context: transformers BertModel eager {ms(bert['seconds']['eager'])} ms / sdpa "
                                       f"{ms(bert['seconds']['sdpa'])} ms"),
        ("feature_store_speedup_vs_tsv", f"TSV {ms(fs['seconds_per_batch']['tsv'])} ms / store "
                                         f"{ms(fs['seconds_per_batch']['store'])} ms per batch of {size.store_batch}"),
        ("kv_cache_speedup", f"no cache {ms(kv['seconds']['no_cache'])} ms / cache {ms(kv['seconds']['cache'])} ms (20 tokens)"),
        ("mfu_vs_matmul", f"{mfu['model_flops_per_second'] / 1e9:.1f} / {mfu['matmul_flops_per_second'] / 1e9:.1f} GFLOP/s "
                          f"(step {ms(mfu['step_seconds'])} ms)"),
    ]  # fmt: skip
    print("| measurement | ratio | target | detail |")
    print("|---|---:|---|---|")
    for key, detail in rows:
        print(f"| {key} | {results[key]:.3f} | {verdict(key, results[key])} | {detail} |")
    print("\n| scaling | step, none (ms) | step, direct (ms) | supervision cost (ms) |")
    print("|---|---:|---:|---:|")
    for axis in ("regions", "words"):
        for count, times in sc[axis].items():
            print(f"| {axis} {count} | {ms(times['none'])} | {ms(times['direct'])} | {ms(times['direct'] - times['none'])} |")
    print(f"\nfitted exponent of the supervision cost in the number of regions: "
          f"{sc['supervision_cost_exponent_regions']:.2f} (whole step: {sc['step_exponent_regions']:.2f})")
    print(f"\ntop ops of a single-stream training step (torch.profiler, self CPU time):\n{mfu['profile_table']}")


def run(size_name: str, env: Env, threads: int) -> tuple[dict, dict]:
    size = SIZES[size_name]
    generator = torch.Generator().manual_seed(0)
    sections = {
        "supervision": lambda: measure_supervision(size, env, generator),
        "visualbert": lambda: measure_vs_visualbert(size, env, generator),
        "lxmert": lambda: measure_vs_lxmert(size, env, generator),
        "bert_attention": lambda: measure_bert_sdpa_vs_eager(size, env, generator),
        "feature_store": lambda: measure_feature_store(size),
        "kv_cache": lambda: measure_kv_cache(size, env, generator),
        "mfu": lambda: measure_mfu(size, env, generator),
        "scaling": lambda: measure_scaling(size, env, generator),
    }
    details = {}
    for name, measure in sections.items():
        started = time.perf_counter()
        details[name] = measure()
        # a long (full-size) run shows each section's headline as it lands, on stderr
        headline = {key: value for key, value in details[name].items() if isinstance(value, float)}
        print(f"[{name}: {time.perf_counter() - started:.0f} s] {headline}", file=sys.stderr, flush=True)
    results = {
        "supervision_overhead_direct": details["supervision"]["overhead"],
        "supervision_speedup_vs_naive": details["supervision"]["speedup_vs_naive"],
        "supervision_memory_ratio_direct": details["supervision"]["memory_ratio"],
        "single_stream_speedup_vs_visualbert": details["visualbert"]["speedup"],
        "two_stream_speedup_vs_lxmert": details["lxmert"]["speedup"],
        "feature_store_speedup_vs_tsv": details["feature_store"]["speedup"],
        "kv_cache_speedup": details["kv_cache"]["speedup"],
        "mfu_vs_matmul": details["mfu"]["ratio"],
        "bert_sdpa_speedup_vs_eager": details["bert_attention"]["speedup"],
        "scaling": details["scaling"],
        "supervision_loss_fast": details["supervision"]["loss_fast"],
        "supervision_loss_naive": details["supervision"]["loss_naive"],
    }
    return results, details


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="MiniLM-sized config (6 layers, 384 hidden, 12 heads)")
    mode.add_argument("--smoke", action="store_true", help="tiny dimensions, one repetition (tests)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", type=Path, default=None, help="write the ratios (and details) here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    torch.set_num_threads(args.threads)
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    env = Env(torch.device(args.device), getattr(torch, args.dtype))
    started = time.perf_counter()
    results, details = run(size_name, env, args.threads)
    print_report(size_name, SIZES[size_name], env, args.threads, results, details)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        details["mfu"].pop("profile_table")
        payload = {**results, "config": {"size": size_name, "device": args.device, "dtype": args.dtype,
                                         "threads": args.threads, **SIZES[size_name].__dict__},
                   "details": details}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=2))
    return results


if __name__ == "__main__":
    main()
