#!/usr/bin/env python
"""How the memory and time of attention supervision grow with the number of image tokens on a transformers LLaVA
(`hf_vlalign.vlms`): the extra peak memory and step time of direct and semi-direct supervision against no supervision
at 1,024, 4,096 and 16,384 image tokens.

    python benchmarks/vlm_supervision_scaling.py                      # CPU, 1 thread: benchmarks/results/..._cpu.json
    python benchmarks/vlm_supervision_scaling.py --docs               # the same, and docs/vlms.md's block
    python benchmarks/vlm_supervision_scaling.py --image_tokens 64 256 --steps 1 --out /tmp/scaling.json
    python benchmarks/vlm_supervision_scaling.py --docs_only benchmarks/results/vlm_supervision_scaling_cpu.json

The model: `hf_vlalign.vlms.tiny.tiny_patch_model("llava")`, random weights, hidden 64, 2 language-model layers of 4
heads, 1 CLIP layer, square images cut into 8 px patches (256, 512 and 1,024 px sides: 32 x 32, 64 x 64 and 128 x
128 patches), batch 1: one grounded caption of the synthetic scenes, a word-level vocabulary of its words; supervised
layer 1 (the last), all heads. Settings (`PatchSupervisionTrainingArguments`):
- `none`: the caption's language-model loss alone;
- `direct`: + Samaran et al.'s direct supervision (eqs. 6-8) of the supervised layer;
- `semi_direct_full`: + semi-direct supervision with `semi_direct_rollout="full"`: every layer's (B, H, N, N) maps
  and their (B, N, N) rollout;
- `semi_direct_supervised_rows`: the same loss with `semi_direct_rollout="supervised_rows"` (the default): only the
  grounded tokens' rows of the rollout, each layer's map computed in chunks of query rows, recomputed in the backward.

Each (size, setting) runs in its own fresh Python process (one at a time), so that one setting's allocations never
hide another's peak. A step is what `PatchSupervisionTrainer`'s loop runs (`training_step`: recorder, forward,
supervision loss, backward; then an AdamW step and `zero_grad`; vlm_supervision_cost.py's `Trainee`). In each process:
one warm-up step, `--steps` timed steps (the median is reported), then one more step that measures
- step peak: the process's resident-set high-water mark is reset (Linux: `5` written to /proc/self/clear_refs) after
  the warm-up and timed steps, the resident set read, one step run, and the high-water mark (`ru_maxrss`) read: how
  far the step raised the process's memory above where it started; the process runs with glibc's mmap threshold
  fixed at 64 KiB (`MALLOC_ENVIRONMENT`), so every larger tensor is returned to the system when freed and this is the
  step's peak of live tensors, up to the small blocks' slack;
- saved for backward: the exact bytes of the tensors autograd saves during that step (each storage once, parameters
  excluded; vlm_supervision_cost.py's `saved_for_backward`).
Extra = the setting's value minus `none`'s at the same size. The growth of an extra from one size to the next (4 times
the image tokens) is ~4 when it is linear in the image tokens and ~16 when quadratic.

A setting at a size is not run when its time or extra peak, extrapolated from the two sizes before (the growth
between them continued), exceeds `--max_seconds` or `--max_extra_gib`; the result file then records the estimates and
why. No timing is asserted anywhere (tests/project/test_vlm_supervision_scaling.py checks the structure, the docs
block and the growth claims docs/vlms.md makes of the committed results).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from machine_info import cpu_model, versions  # noqa: E402  (benchmarks/machine_info.py)
from vlm_supervision_cost import Sizes, Trainee, grounded_examples, saved_for_backward, tokenizer_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
SETTINGS = ("none", "direct", "semi_direct_full", "semi_direct_supervised_rows")
IMAGE_TOKENS = (1024, 4096, 16384)
PATCH_SIZE = 8
# glibc: blocks from 64 KiB up are mapped on their own and unmapped when freed (a fixed threshold: by default it
# grows with the blocks freed, which then stay in the heap), so the resident set follows the live tensors
MALLOC_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
DOCS_BEGIN = "<!-- benchmarks/vlm_supervision_scaling.py: begin -->"
DOCS_END = "<!-- benchmarks/vlm_supervision_scaling.py: end -->"


def sizes_of(image_tokens: int, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4) -> Sizes:
    """A square image of `image_tokens` patches of `PATCH_SIZE` pixels; batch 1, the last layer supervised."""
    side = math.isqrt(image_tokens)
    if side * side != image_tokens:
        raise ValueError(f"`image_tokens` must be a square number (a square grid of patches), got {image_tokens}")
    return Sizes(image_size=side * PATCH_SIZE, patch_size=PATCH_SIZE, hidden_size=hidden_size, num_layers=num_layers,
                 num_heads=num_heads, vision_layers=1, batch=1, supervised_layer=num_layers - 1)  # fmt: skip


def training_arguments(setting: str) -> tuple[str, dict]:
    """(the supervision, more `PatchSupervisionTrainingArguments` fields) of a setting."""
    if setting not in SETTINGS:
        raise ValueError(f"`setting` must be one of {SETTINGS}, got {setting!r}")
    if setting.startswith("semi_direct_"):
        return "semi_direct", {"semi_direct_rollout": setting.removeprefix("semi_direct_")}
    return setting, {}


# ----------------------------------------------------------------------------------------------- one process: a run


def _resident_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def _reset_high_water_mark() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def step_peak_and_saved_bytes(trainee: Trainee, batch: dict) -> tuple[int, int, int, int]:
    """One step: (resident bytes when it began, how far it raised the high-water mark above them, the bytes and
    storages autograd saved for its backward: vlm_supervision_cost.py's `saved_for_backward`)."""
    _reset_high_water_mark()
    before = _resident_kib()
    saved_bytes, saved_storages = saved_for_backward(trainee, batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux; reset with the high-water mark
    return 1024 * before, 1024 * (peak - before), saved_bytes, saved_storages


def measure(setting: str, image_tokens: int, steps: int, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
            num_heads: int = 4, examples: list[dict] | None = None) -> dict:  # fmt: skip
    """One setting at one size, in this process: step times, the step peak and the bytes saved for backward;
    `examples`: the batch's grounded captions (default: one of the synthetic scenes)."""
    sizes = sizes_of(image_tokens, hidden_size, num_layers, num_heads)
    supervision, arguments = training_arguments(setting)
    examples = grounded_examples(1) if examples is None else examples
    with tempfile.TemporaryDirectory() as output_dir:
        trainee = Trainee("llava", supervision, sizes, torch.device("cpu"), seed, output_dir,
                          tokenizer_of("data", examples), **arguments)  # fmt: skip
        batch = trainee.collator(examples)
        started = time.perf_counter()
        trainee.step(batch)  # warm-up: the optimizer's states, the allocator's first blocks
        warmup_seconds = time.perf_counter() - started
        times, loss = [], None
        for _ in range(steps):
            started = time.perf_counter()
            loss = trainee.step(batch)
            times.append(time.perf_counter() - started)
        resident, step_peak, saved_bytes, saved_storages = step_peak_and_saved_bytes(trainee, batch)
        return {
            "run": True,
            "sequence_length": int(batch["input_ids"].shape[1]),
            "image_tokens": int(batch["image_positions"].shape[1]),
            "parameters": sum(parameter.numel() for parameter in trainee.model.parameters()),
            "attn_implementation": trainee.attn_implementation(),
            "warmup_seconds": warmup_seconds,
            "step_seconds": statistics.median(times),
            "step_seconds_all": times,
            "resident_bytes_before_step": resident,
            "step_peak_bytes": step_peak,
            "saved_for_backward_bytes": saved_bytes,
            "saved_for_backward_storages": saved_storages,
            "final_loss": float(loss),
        }


# ----------------------------------------------------------------------------------------- the parent: every run


def run_in_subprocess(setting: str, image_tokens: int, args: argparse.Namespace) -> dict:
    """`measure` in a fresh Python process (OMP / MKL threads as `--threads`); its JSON result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", setting, "--image_tokens", str(image_tokens),
               "--steps", str(args.steps), "--seed", str(args.seed), "--threads", str(args.threads)]  # fmt: skip
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                   **MALLOC_ENVIRONMENT}  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{setting} at {image_tokens} image tokens failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - started
    return result


def extrapolated(previous: dict | None, last: dict | None, image_tokens: int, key: str) -> float | None:
    """`key` at `image_tokens` from the two runs of the sizes before, their growth continued as a power of the image
    tokens; None without two such runs."""
    if not previous or not last or not previous.get("run") or not last.get("run"):
        return None
    low, high = previous[key], last[key]
    if low <= 0 or high <= 0:
        return None
    exponent = math.log(high / low) / math.log(last["image_tokens"] / previous["image_tokens"])
    return high * (image_tokens / last["image_tokens"]) ** exponent


def with_extras(runs: dict[str, dict]) -> dict[str, dict]:
    """Each run's extra step time, step peak and saved bytes over `none`'s at the same size."""
    base = runs["none"]
    for run in runs.values():
        if run.get("run"):
            run["extra_step_seconds"] = run["step_seconds"] - base["step_seconds"]
            run["extra_step_peak_bytes"] = run["step_peak_bytes"] - base["step_peak_bytes"]
            run["extra_saved_for_backward_bytes"] = run["saved_for_backward_bytes"] - base["saved_for_backward_bytes"]
    return runs


def growth(sizes: list[dict]) -> dict[str, dict]:
    """Per setting but `none`, per pair of consecutive sizes ("4096/1024"), the ratio of the extras."""
    ratios: dict[str, dict] = {}
    for setting in SETTINGS[1:]:
        ratios[setting] = {}
        for low, high in zip(sizes, sizes[1:]):
            a, b = low["settings"][setting], high["settings"][setting]
            pair = f"{high['image_tokens']}/{low['image_tokens']}"
            ratios[setting][pair] = {
                key: (b[key] / a[key] if a.get("run") and b.get("run") and a[key] > 0 else None)
                for key in ("extra_step_peak_bytes", "extra_saved_for_backward_bytes", "extra_step_seconds")
            }
    return ratios


def skipped(setting: str, sizes: list[dict], image_tokens: int, args: argparse.Namespace, runs: dict) -> dict | None:
    """The record of a run not made (its estimates and why), or None when it fits the limits."""
    earlier = [size["settings"][setting] for size in sizes[-2:]]
    earlier_none = [size["settings"]["none"] for size in sizes[-2:]]
    if len(earlier) < 2:
        return None
    seconds = extrapolated(*earlier, image_tokens, "process_seconds")
    extra_peak = extrapolated(*earlier, image_tokens, "extra_step_peak_bytes")
    base_peak = runs["none"]["step_peak_bytes"] if runs.get("none", {}).get("run") else extrapolated(
        *earlier_none, image_tokens, "step_peak_bytes"
    )  # fmt: skip
    reasons = []
    if seconds is not None and seconds > args.max_seconds:
        reasons.append(f"its estimated process time {seconds / 60:.0f} min exceeds {args.max_seconds / 60:.0f} min")
    if extra_peak is not None and extra_peak > args.max_extra_gib * 2**30:
        reasons.append(f"its estimated extra step peak {extra_peak / 2**30:.1f} GiB exceeds {args.max_extra_gib:g} GiB")
    if not reasons:
        return None
    return {
        "run": False,
        "image_tokens": image_tokens,
        "reason": "; ".join(reasons) + " (extrapolated from the two sizes before, their growth continued)",
        "estimated_process_seconds": seconds,
        "estimated_extra_step_peak_bytes": extra_peak,
        "estimated_step_peak_bytes": None if extra_peak is None or base_peak is None else base_peak + extra_peak,
    }


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        "device": "cpu",
    }


def benchmark(args: argparse.Namespace) -> dict:
    load_before = list(os.getloadavg())
    sizes: list[dict] = []
    for image_tokens in args.image_tokens:
        runs: dict[str, dict] = {}
        for setting in SETTINGS:
            record = skipped(setting, sizes, image_tokens, args, runs)
            if record is None:
                record = run_in_subprocess(setting, image_tokens, args)
            runs[setting] = record
            done = f"{record['process_seconds']:.0f} s" if record["run"] else f"not run: {record['reason']}"
            print(f"{image_tokens} image tokens, {setting}: {done}", flush=True)
        sequence = runs["none"]["sequence_length"]
        sizes.append({"image_tokens": image_tokens, "sequence_length": sequence, "settings": with_extras(runs)})
    info = machine()
    info["load_average_before"], info["load_average_after"] = load_before, list(os.getloadavg())
    first = sizes[0]["settings"]["none"]
    return {
        "settings": {
            "command": " ".join(["python", "benchmarks/vlm_supervision_scaling.py", *args.argv]),
            "family": "llava",
            "sizes": {key: value for key, value in vars(sizes_of(args.image_tokens[0])).items() if key != "image_size"},
            "image_tokens": list(args.image_tokens),
            "steps": args.steps,
            "seed": args.seed,
            "threads": args.threads,
            "max_seconds": args.max_seconds,
            "max_extra_gib": args.max_extra_gib,
            "vocabulary": "data",
            "precision": "fp32",
            "attn_implementation": first["attn_implementation"],
            "step": (
                "PatchSupervisionTrainer.training_step (forward, supervision loss, backward) + AdamW step + zero_grad; "
                "each (size, setting) in a fresh process: 1 warm-up step, median of `steps` timed steps"
            ),
            "memory": (
                "step peak: ru_maxrss after one step minus the resident set before it, the high-water mark reset "
                "(/proc/self/clear_refs) before the step; saved for backward: saved_tensors_hooks, each storage once, "
                "parameters excluded; extra = minus `none` at the same size"
            ),
        },
        "machine": info,
        "versions": versions(),
        "sizes": sizes,
        "growth": growth(sizes),
    }


# ------------------------------------------------------------------------------------------------------------ report


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def caption(report: dict) -> str:
    machine_, settings, sizes = report["machine"], report["settings"], report["settings"]["sizes"]
    threads = machine_["torch_threads"]
    return (
        f"CPU ({machine_['cpu']}), {threads} thread{'s' if threads != 1 else ''}, {machine_['memory_gib']:.0f} GiB, "
        f"torch {report['versions']['torch']}; a tiny LLaVA (hidden {sizes['hidden_size']}, {sizes['num_layers']} "
        f"layers of {sizes['num_heads']} heads, {sizes['vision_layers']} CLIP layer, {settings['attn_implementation']})"
        f", batch {sizes['batch']}, one caption, {sizes['patch_size']} px patches, supervised layer "
        f"{sizes['supervised_layer']}; each run in its own process, median of {settings['steps']} steps after 1 "
        "warm-up step. Extra = minus `none` at the same size."
    )


def table(report: dict) -> str:
    """The caption, the table of every run and the table of the growth of the extras."""
    lines = [
        caption(report),
        "",
        "| image tokens | sequence | setting | step (s) | extra step (s) | step peak (MiB) | extra peak (MiB) "
        "| saved for backward (MiB) | extra saved (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in report["sizes"]:
        for setting, run in size["settings"].items():
            head = f"| {size['image_tokens']:,} | {size['sequence_length']:,} | {setting} |"
            if not run["run"]:
                estimate = run["estimated_extra_step_peak_bytes"]
                lines.append(f"{head} not run | | | ~{_mib(estimate)} (estimate) | | |")
                continue
            lines.append(
                f"{head} {_seconds(run['step_seconds'])} | {_seconds(run['extra_step_seconds'])} | "
                f"{_mib(run['step_peak_bytes'])} | {_mib(run['extra_step_peak_bytes'])} | "
                f"{_mib(run['saved_for_backward_bytes'])} | {_mib(run['extra_saved_for_backward_bytes'])} |"
            )
    pairs = list(next(iter(report["growth"].values())))
    lines += [
        "",
        "Growth of the extras from one size to the next (4 x the image tokens: ~4 linear, ~16 quadratic):",
        "",
        "| setting | " + " | ".join(f"extra peak {pair}" for pair in pairs) + " | "
        + " | ".join(f"extra saved {pair}" for pair in pairs) + " | "
        + " | ".join(f"extra time {pair}" for pair in pairs) + " |",
        "|---|" + "---|" * (3 * len(pairs)),
    ]  # fmt: skip
    for setting, ratios in report["growth"].items():
        cells = [
            _ratio(ratios[pair][key])
            for key in ("extra_step_peak_bytes", "extra_saved_for_backward_bytes", "extra_step_seconds")
            for pair in pairs
        ]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    for size in report["sizes"]:
        for setting, run in size["settings"].items():
            if not run["run"]:
                lines += ["", f"Not run: {setting} at {size['image_tokens']:,} image tokens: {run['reason']}."]
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    """The block of docs/vlms.md ("What supervision costs"), markers included, from a results file of this script."""
    return f"{DOCS_BEGIN}\n{table(report)}\n{DOCS_END}"


def write_docs(report: dict) -> Path:
    return replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image_tokens", type=int, nargs="+", default=list(IMAGE_TOKENS),
                        help="image token counts, square numbers (default 1024 4096 16384)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run after 1 warm-up step (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_seconds", type=float, default=600, help="longest estimated run made (default 600 s)")
    parser.add_argument("--max_extra_gib", type=float, default=10, help="largest estimated extra peak (default 10)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default benchmarks/results/vlm_supervision_scaling_cpu.json)")
    parser.add_argument("--docs", action="store_true", help="also rewrite docs/vlms.md's block from the new results")
    parser.add_argument("--docs_only", type=Path, default=None, metavar="RESULTS",
                        help="only rewrite docs/vlms.md's block from this results JSON (no measuring)")
    parser.add_argument("--worker", choices=SETTINGS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.docs_only is not None:
        report = json.loads(args.docs_only.read_text())
        print(f"rewrote {write_docs(report)}")
        return report
    if args.steps < 1 or args.threads < 1:
        parser.error(f"need --steps >= 1 and --threads >= 1, got {args.steps} and {args.threads}")
    for image_tokens in args.image_tokens:
        if image_tokens < 1 or math.isqrt(image_tokens) ** 2 != image_tokens:
            parser.error(f"--image_tokens must be square numbers (a square grid of patches), got {image_tokens}")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    logging.getLogger("hf_vlalign").setLevel(logging.ERROR)
    if args.worker is not None:
        print(json.dumps(measure(args.worker, args.image_tokens[0], args.steps, args.seed)), flush=True)
        return None
    report = benchmark(args)
    print(table(report))
    out = args.out or RESULTS_DIR / "vlm_supervision_scaling_cpu.json"
    write_results(out, report)
    print(f"wrote {out}")
    if args.docs:
        print(f"rewrote {write_docs(report)}")
    return report


if __name__ == "__main__":
    main()
