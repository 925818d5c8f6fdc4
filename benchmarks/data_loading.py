#!/usr/bin/env python
"""Data loading against training: for each example's default job, the batches per second its training data loader
delivers and the optimizer steps per second its Trainer makes, measured in the same run on this machine.

    python benchmarks/data_loading.py --json benchmarks/results/data_loading.json   # every example, a few minutes
    python benchmarks/data_loading.py --examples finetune_vgp finetune_vqa          # some of them
    python benchmarks/data_loading.py --docs benchmarks/results/data_loading.json   # only rewrite the docs' block

Each example's own `main()` builds its default job (argument defaults, synthetic scenes, MiniLM text weights) up to
its `trainer.train()` call, where the benchmark takes the Trainer (`transformers.Trainer.train` is replaced for that
call only); the flags added to every example (`--output_dir <tmp> --max_steps N --eval_strategy no --save_strategy no
--report_to none --disable_tqdm true`) change neither the data, the collator nor the model. Then:
- loader rate: batches per second of `trainer.get_train_dataloader()`, the loader the training loop reads (the
  example's dataset, collator, batch size and `dataloader_num_workers`, 0 by default: rows are fetched and collated
  in the training process), one batch untimed, then the mean over the next `--batches`;
- step rate: optimizer steps per second of `trainer.train()` (the library's, with `max_steps`), each step timed from
  `on_step_begin` to `on_step_end`, when its batches are already fetched, so loading is not part of it; the first
  step untimed;
- ratio = loader rate / (step rate x gradient accumulation steps): how many times faster the data comes than the
  training loop consumes it. The load average before and after is recorded (other work may share the cores);
- CPU-time ratio: the same from CPU time (`time.process_time`), which other work on the machine hardly changes when
  one thread computes: the Trainer then makes `--reference_steps` more steps with `torch.set_num_threads(1)`, and a
  step's CPU seconds there divided by the threads of the example's run (the least wall time a step takes on an idle
  machine, with perfect scaling over the threads) is set against a batch's CPU seconds (what the loader,
  single-threaded Python, needs alone). On a busy machine a multi-threaded step slows down far more than the loader
  (its threads wait for one another, spinning), which inflates the wall-clock ratio, and its CPU time too; this one is
  a conservative estimate of the ratio on an idle machine.

The block of docs/performance.md is rendered from the committed results file
(tests/project/test_readme_benchmark_tables.py checks it and that every ratio is at least `MIN_RATIO`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from example_scripts import load_example  # noqa: E402  (benchmarks/example_scripts.py)
from machine_info import cpu_model  # noqa: E402  (benchmarks/machine_info.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "data_loading.json"
DOCS_BEGIN = "<!-- benchmarks/data_loading.py table: begin -->"
DOCS_END = "<!-- benchmarks/data_loading.py table: end -->"
MIN_RATIO = 5.0  # the claim: the data comes at least this many times faster than training consumes it


@dataclass(frozen=True)
class Job:
    """An example's default job: the script, and flags that pick one of its default runs (none for most)."""

    name: str
    script: str
    flags: tuple[str, ...] = ()
    description: str = "its default run"


JOBS = [
    Job("finetune_vgp", "finetune_vgp.py", description="the main job: VGP, direct supervision"),
    Job("finetune_vqa", "finetune_vqa.py"),
    Job("finetune_nlvr2", "finetune_nlvr2.py"),
    Job("finetune_refcoco", "finetune_refcoco.py"),
    Job("finetune_flickr_grounding", "finetune_flickr_grounding.py"),
    Job("pretrain_single_stream", "pretrain_single_stream.py"),
    Job("pretrain_two_stream", "pretrain_two_stream.py", description="its first run: with the alignment loss"),
    Job("pretrain_two_stream_without", "pretrain_two_stream.py", ("--alignment_loss", "without"),
        "its second run: without the alignment loss"),
    Job("train_captioning", "train_captioning.py", description="one run, A2 gate"),
]  # fmt: skip


class TrainerTaken(Exception):
    """Raised by the replaced `Trainer.train` once it holds the example's Trainer."""


def take_trainer(job: Job, output_dir: str, max_steps: int):
    """The Trainer the example's `main()` builds for its default job, taken at its `train()` call."""
    import transformers

    example = load_example(ROOT / "examples" / job.script)
    argv = [*job.flags, "--output_dir", output_dir, "--max_steps", str(max_steps), "--eval_strategy", "no",
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true"]  # fmt: skip
    taken = {}
    original = transformers.Trainer.train

    def take(self, *args, **kwargs):
        taken["trainer"] = self
        raise TrainerTaken

    transformers.Trainer.train = take
    try:
        example.main(argv)
    except TrainerTaken:
        pass
    finally:
        transformers.Trainer.train = original
    if "trainer" not in taken:
        raise RuntimeError(f"examples/{job.script} returned without calling `trainer.train()`.")
    return taken["trainer"]


def loader_rate(trainer, batches: int) -> tuple[float, float, int]:
    """(batches per second, CPU seconds per batch, batches timed) of the Trainer's training loader: one batch untimed,
    then `batches`."""
    iterator = iter(trainer.get_train_dataloader())
    next(iterator)
    timed, start, cpu_start = 0, time.perf_counter(), time.process_time()
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:
            break
        timed += 1
    if timed == 0:
        raise ValueError(f"the training loader of {type(trainer).__name__} holds a single batch: nothing to time.")
    return timed / (time.perf_counter() - start), (time.process_time() - cpu_start) / timed, timed


def step_rate(trainer, steps: int) -> tuple[float, float, list[float]]:
    """(optimizer steps per second, CPU seconds per step, every step's seconds) of `trainer.train()` for `steps`
    steps, its first step left out of the rates."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self.cpu_seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.start)
            self.cpu_seconds.append(time.process_time() - self.cpu_start)

    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.args.max_steps = steps
    trainer.train()
    trainer.remove_callback(timer)
    if len(timer.seconds) < 2:
        raise ValueError(f"`--steps` must give at least 2 optimizer steps, got {len(timer.seconds)}.")
    return 1.0 / statistics.mean(timer.seconds[1:]), statistics.mean(timer.cpu_seconds[1:]), timer.seconds


def measure(job: Job, batches: int, steps: int, reference_steps: int) -> dict:
    """Loader rate and step rate of one example's default job (see the module docstring)."""
    import torch

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = take_trainer(job, output_dir, steps)
        args = trainer.args
        loader, loader_cpu, timed_batches = loader_rate(trainer, batches)
        threads = torch.get_num_threads()
        steps_per_second, _, step_seconds = step_rate(trainer, steps)
        torch.set_num_threads(1)  # the reference: a step's work, measured where waiting threads cannot inflate it
        _, step_cpu, _ = step_rate(trainer, reference_steps)
        torch.set_num_threads(threads)
    accumulation = args.gradient_accumulation_steps
    result = {
        "example": f"examples/{job.script}", "name": job.name, "run": job.description, "flags": list(job.flags),
        "model": type(trainer.model).__name__, "collator": type(trainer.data_collator).__name__,
        "batch_size": args.per_device_train_batch_size, "gradient_accumulation_steps": accumulation,
        "dataloader_num_workers": args.dataloader_num_workers, "train_rows": len(trainer.train_dataset),
        "threads": threads,
        "loader_batches_per_second": loader, "loader_batches_timed": timed_batches,
        "optimizer_steps_per_second": steps_per_second, "step_seconds": step_seconds,
        "ratio": loader / (steps_per_second * accumulation),
        "loader_cpu_seconds_per_batch": loader_cpu, "one_thread_step_cpu_seconds": step_cpu,
        "cpu_ratio": step_cpu / threads / (loader_cpu * accumulation),
        "wall_seconds": time.perf_counter() - started,
    }  # fmt: skip
    print(f"{job.name}: loader {loader:.1f} batches/s, training {steps_per_second:.2f} steps/s, "
          f"ratio {result['ratio']:.1f}, CPU-time ratio {result['cpu_ratio']:.1f}", flush=True)  # fmt: skip
    return result


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def table(report: dict) -> str:
    machine, settings = report["machine"], report["settings"]
    load, load_after = (", ".join(f"{value:.1f}" for value in machine[key])
                        for key in ("load_average_before", "load_average_after"))  # fmt: skip
    lines = [
        "| example (default job) | batch | loader batches/s | optimizer steps/s | loader / training | "
        "CPU s per batch | 1-thread step CPU s / threads | CPU-time ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        lines.append(
            f"| `{run['example']}`{' ' + ' '.join(run['flags']) if run['flags'] else ''} ({run['run']}) | "
            f"{run['batch_size']} | {run['loader_batches_per_second']:.1f} | {run['optimizer_steps_per_second']:.2f} | "
            f"{run['ratio']:.0f}x | {run['loader_cpu_seconds_per_batch']:.3f} | "
            f"{run['one_thread_step_cpu_seconds'] / run['threads']:.2f} | {run['cpu_ratio']:.1f}x |"
        )
    lines += [
        "",
        f"{machine['cpu']}, {machine['cores']} cores, torch {report['versions']['torch']}; load average before the run "
        f"{load}, after {load_after}; loader: 1 + {settings['batches']} batches, `dataloader_num_workers` "
        f"{sorted({run['dataloader_num_workers'] for run in report['runs']})}; training: {settings['steps']} steps, "
        f"then {settings['reference_steps']} with one thread, the first of each untimed; "
        f"`python benchmarks/data_loading.py --json {RESULTS.relative_to(ROOT)}`",
    ]
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    return f"{DOCS_BEGIN}\n{table(report)}\n{DOCS_END}"


def main(argv: list[str] | None = None) -> dict:
    names = [job.name for job in JOBS]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", nargs="+", choices=names, default=names, help="the jobs to measure (default all)")
    parser.add_argument("--batches", type=int, default=20, help="loader batches timed after one untimed")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps of each Trainer (the first untimed)")
    parser.add_argument("--reference_steps", type=int, default=3,
                        help="then steps with one thread, for the CPU-time ratio (the first untimed)")  # fmt: skip
    parser.add_argument("--json", default=None, help=f"write the results here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' block from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        report = json.loads(Path(args.docs).read_text())
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))
        return report
    if args.batches < 1 or min(args.steps, args.reference_steps) < 2:
        parser.error(f"--batches must be >= 1, --steps and --reference_steps >= 2, got {args.batches}, {args.steps} "
                     f"and {args.reference_steps}")  # fmt: skip
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = {
        "settings": {"examples": args.examples, "batches": args.batches, "steps": args.steps,
                     "reference_steps": args.reference_steps, "min_ratio": MIN_RATIO},
        "machine": {"cpu": cpu_model(), "platform": platform.platform(), "cores": len(os.sched_getaffinity(0)),
                    "load_average_before": list(os.getloadavg())},
        "versions": versions(),
        "runs": [measure(job, args.batches, args.steps, args.reference_steps)
                 for job in JOBS if job.name in args.examples],
    }  # fmt: skip
    report["machine"]["load_average_after"] = list(os.getloadavg())
    print(table(report))
    if args.json:
        write_results(args.json, report)
        Path(args.json).with_suffix(".md").write_text(table(report) + "\n")
    return report


if __name__ == "__main__":
    main()
