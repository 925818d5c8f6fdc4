#!/usr/bin/env python
"""Time to result: the CLI's start-up, `hf-vlalign analyze` on the main job's model and the main job's training
steps, each with one CPU thread and with every core, measured in the same run.

    python benchmarks/time_to_result.py --json benchmarks/results/time_to_result.json   # ~10 min on 2 cores
    python benchmarks/time_to_result.py --model_dir outputs/vgp_direct --repeats 3 --train_steps 30
    python benchmarks/time_to_result.py --docs benchmarks/results/time_to_result.json  # only rewrite the docs' blocks

- start-up: wall time of a fresh process running `python -c pass`, `python -c "import torch"`,
  `python -c "import hf_vlalign"` and `hf-vlalign --help` (one untimed run of each first, then the median of
  `--startup_repeats`);
- analyze: `hf-vlalign analyze MODEL_DIR --out DIR` (the command of docs/analysis.md; MODEL_DIR is a model trained by
  `examples/finetune_vgp.py`) with OMP_NUM_THREADS=1 and OMP_NUM_THREADS=<cores>, the two alternating, median of
  `--repeats` each; the `analysis.json` of both thread counts must be equal;
- training: `--train_steps` optimizer steps of `examples/finetune_vgp.py` with its defaults (MiniLM, the synthetic
  scenes, batch 32, direct supervision), built by the example's own functions in this process, each run from the same
  initial weights, with `torch.set_num_threads(1)` and `(<cores>)`, alternating, median of `--repeats`; the time is the
  Trainer's `train_runtime`.

Compare the ratios (time with 1 thread / time with every core); the absolute times depend on the machine and on what
else runs on it (the load average before and after is recorded). The blocks of docs/analysis.md and docs/results.md are
generated from the committed `benchmarks/results/time_to_result.json` (a test checks they agree).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from example_scripts import load_example  # noqa: E402  (benchmarks/example_scripts.py)
from machine_info import cpu_model, versions  # noqa: E402  (benchmarks/machine_info.py)
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "finetune_vgp.py"
RESULTS = ROOT / "benchmarks" / "results" / "time_to_result.json"
ANALYZE_BEGIN = "<!-- benchmarks/time_to_result.py analyze: begin -->"
ANALYZE_END = "<!-- benchmarks/time_to_result.py analyze: end -->"
TRAINING_BEGIN = "<!-- benchmarks/time_to_result.py training: begin -->"
TRAINING_END = "<!-- benchmarks/time_to_result.py training: end -->"


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cli_command() -> list[str]:
    """The `hf-vlalign` console script, or the module when the script is not on PATH."""
    script = shutil.which("hf-vlalign")
    return [script] if script else [sys.executable, "-m", "hf_vlalign.cli"]


def wall_time(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr[-3000:]}")
    return seconds


def measure_startup(repeats: int, env: dict[str, str]) -> list[dict]:
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        'python -c "import hf_vlalign"': [sys.executable, "-c", "import hf_vlalign"],
        "hf-vlalign --help": [*cli_command(), "--help"],
    }
    for command in commands.values():  # untimed: fills the OS file cache
        wall_time(command, env)
    runs = {name: [] for name in commands}
    for _ in range(repeats):  # interleaved, so that a busy moment hits every command alike
        for name, command in commands.items():
            runs[name].append(wall_time(command, env))
    return [{"command": name, "seconds": statistics.median(times), "runs": times} for name, times in runs.items()]


def _shown(path: Path) -> str:
    """`path` relative to the repository when it lies inside it (as the docs write it)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def measure_analyze(model_dir: Path, thread_counts: list[int], repeats: int, env: dict[str, str]) -> dict:
    runs = {str(threads): [] for threads in thread_counts}
    outputs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(repeats):
            for threads in thread_counts:
                out = Path(scratch) / f"analysis_{threads}_{repeat}"
                command = [*cli_command(), "analyze", str(model_dir), "--out", str(out)]
                runs[str(threads)].append(wall_time(command, {**env, "OMP_NUM_THREADS": str(threads)}))
                outputs[threads] = json.loads((out / "analysis.json").read_text().replace(str(out), "<out>"))
                print(f"analyze, {threads} thread(s): {runs[str(threads)][-1]:.1f} s", flush=True)
    medians = {threads: statistics.median(times) for threads, times in runs.items()}
    first, last = str(thread_counts[0]), str(thread_counts[-1])
    return {
        "command": f"hf-vlalign analyze {_shown(model_dir)} --out DIR",
        "num_examples": outputs[thread_counts[0]]["num_examples"],
        "data": outputs[thread_counts[0]]["data"],
        "runs": runs,
        "median_seconds": medians,
        "speedup": medians[first] / medians[last],
        "same_analysis_json": all(output == outputs[thread_counts[0]] for output in outputs.values()),
    }


def measure_training(thread_counts: list[int], steps: int, repeats: int) -> dict:
    """`steps` optimizer steps of the VGP example's defaults per run, the Trainer built as the example builds it."""
    import torch
    from transformers import AutoTokenizer, set_seed

    from hf_vlalign import default_text_model_path
    from hf_vlalign.data.builders import load_vgp_data
    from hf_vlalign.data.collators import VGPCollator
    from hf_vlalign.synthetic import SyntheticSceneConfig
    from hf_vlalign.trainers import VGPTrainer

    example = load_example(EXAMPLE)
    runs = {str(threads): [] for threads in thread_counts}
    with tempfile.TemporaryDirectory() as scratch:
        args, training_args = example.parse_args(
            ["--output_dir", scratch, "--max_steps", str(steps), "--eval_strategy", "no", "--save_strategy", "no",
             "--report_to", "none", "--disable_tqdm", "true", "--logging_steps", str(steps)]
        )  # fmt: skip
        sizes = (args.synthetic_train_images, args.synthetic_eval_images)
        synthetic = SyntheticSceneConfig(*sizes, seed=args.synthetic_seed)
        data = load_vgp_data(synthetic_config=synthetic, negatives=args.negatives)
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path or default_text_model_path())
        collator = VGPCollator(tokenizer, data.region_features, max_text_length=args.max_text_length)
        train_dataset, _ = collator.drop_overlong_rows(data.train, "VGP train")
        for _ in range(repeats):
            for threads in thread_counts:
                torch.set_num_threads(threads)
                set_seed(training_args.seed)  # the same initial weights and batches in every run
                model = example.load_model(args, visual_feat_dim=data.region_features.feature_dim)
                trainer = VGPTrainer(
                    model=model, args=training_args, train_dataset=train_dataset, data_collator=collator,
                    processing_class=tokenizer,
                )  # fmt: skip
                runs[str(threads)].append(trainer.train().metrics["train_runtime"])
                print(f"training, {threads} thread(s): {runs[str(threads)][-1]:.1f} s for {steps} steps", flush=True)
    medians = {threads: statistics.median(times) for threads, times in runs.items()}
    first, last = str(thread_counts[0]), str(thread_counts[-1])
    return {
        "example": f"examples/{EXAMPLE.name} (its defaults: supervision {args.supervision}, batch "
        f"{training_args.per_device_train_batch_size}, max_text_length {args.max_text_length})",
        "steps": steps,
        "batch_size": training_args.per_device_train_batch_size,
        "train_examples": len(train_dataset),
        "runs": runs,
        "median_seconds": medians,
        "median_seconds_per_step": {threads: seconds / steps for threads, seconds in medians.items()},
        "speedup": medians[first] / medians[last],
    }


def _threads_label(threads: str, cores: int) -> str:
    if threads == "1":
        return "1 thread"
    return f"{threads} threads" + (" (every core)" if int(threads) == cores else "")


def _caption(report: dict) -> str:
    machine, settings = report["machine"], report["settings"]
    load = ", ".join(f"{value:.1f}" for value in machine["load_average_before"])
    return (
        f"{machine['cpu']}, {machine['cores']} cores, torch {report['versions']['torch']}; load average before the "
        f"run {load}; `python benchmarks/time_to_result.py --json {RESULTS.relative_to(ROOT)}` (median of "
        f"{settings['repeats']} alternating runs per thread count)"
    )


def analyze_block(report: dict) -> str:
    """The docs block of the analysis page: analyze's wall time per thread count and the start-up times."""
    analyze, cores = report["analyze"], report["machine"]["cores"]
    counts = list(analyze["median_seconds"])
    header = "| `" + analyze["command"] + f"` ({analyze['num_examples']:,} examples) | " + " | ".join(
        _threads_label(threads, cores) for threads in counts
    ) + " | speed-up (1-thread time / every-core time) |"
    row = "| wall time, start to end | " + " | ".join(f"{analyze['median_seconds'][t]:.1f} s" for t in counts)
    row += f" | {analyze['speedup']:.2f} |"
    same = "equal" if analyze["same_analysis_json"] else "NOT equal"
    startup = ", ".join(f"`{entry['command']}` {entry['seconds']:.2f} s" for entry in report["startup"])
    lines = [
        ANALYZE_BEGIN,
        header,
        "|---|" + "---|" * (len(counts) + 1),
        row,
        "",
        f"The `analysis.json` written with 1 thread and with every core are {same}. Start-up of a fresh process "
        f"(median of {report['settings']['startup_repeats']}): {startup}.",
        "",
        _caption(report) + ".",
        ANALYZE_END,
    ]
    return "\n".join(lines)


def training_block(report: dict) -> str:
    """The docs block of the VGP results: seconds per optimizer step of the main job per thread count."""
    training, cores = report["training"], report["machine"]["cores"]
    counts = list(training["median_seconds"])
    header = f"| {training['example']} | " + " | ".join(_threads_label(t, cores) for t in counts)
    header += " | speed-up (1-thread time / every-core time) |"
    row = f"| seconds per optimizer step (mean of {training['steps']} steps) | " + " | ".join(
        f"{training['median_seconds_per_step'][t]:.2f} s" for t in counts
    ) + f" | {training['speedup']:.2f} |"
    separator = "|---|" + "---|" * (len(counts) + 1)
    return "\n".join([TRAINING_BEGIN, header, separator, row, "", _caption(report) + ".", TRAINING_END])


def write_docs(results: Path) -> None:
    report = json.loads(results.read_text())
    replace_docs_block(ANALYZE_BEGIN, ANALYZE_END, analyze_block(report))
    replace_docs_block(TRAINING_BEGIN, TRAINING_END, training_block(report))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", default=str(ROOT / "outputs" / "vgp"), help="a model of finetune_vgp.py")
    parser.add_argument("--repeats", type=int, default=2, help="runs per thread count of analyze and of training")
    parser.add_argument("--startup_repeats", type=int, default=5)
    parser.add_argument("--train_steps", type=int, default=20)
    parser.add_argument("--skip", nargs="*", default=[], choices=["startup", "analyze", "training"])
    parser.add_argument("--json", default=None, help=f"write the results here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' blocks from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(Path(args.docs))
        return {}
    for name in ("repeats", "startup_repeats", "train_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"`--{name}` must be >= 1, got {getattr(args, name)}.")
    model_dir = Path(args.model_dir)
    if "analyze" not in args.skip and not (model_dir / "config.json").is_file():
        raise ValueError(f"`--model_dir` must be a model folder of finetune_vgp.py, got {model_dir} (no config.json).")
    cores = available_cores()
    thread_counts = [1, cores] if cores > 1 else [1]
    if os.getloadavg()[0] > 0.5:
        print(f"note: load average {os.getloadavg()[0]:.1f}: other work shares the cores, and the runs with every core "
              "suffer most (a preempted thread stalls the others)", flush=True)  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    report = {
        "settings": {"model_dir": str(model_dir), "repeats": args.repeats, "startup_repeats": args.startup_repeats,
                     "train_steps": args.train_steps, "thread_counts": thread_counts},
        "machine": {"cpu": cpu_model(), "platform": platform.platform(), "cores": cores,
                    "load_average_before": list(os.getloadavg())},
        "versions": versions(),
    }  # fmt: skip
    if "startup" not in args.skip:
        report["startup"] = measure_startup(args.startup_repeats, env)
        for entry in report["startup"]:
            print(f"{entry['command']}: {entry['seconds']:.2f} s", flush=True)
    if "analyze" not in args.skip:
        report["analyze"] = measure_analyze(model_dir, thread_counts, args.repeats, env)
    if "training" not in args.skip:
        report["training"] = measure_training(thread_counts, args.train_steps, args.repeats)
    report["machine"]["load_average_after"] = list(os.getloadavg())
    if {"startup", "analyze"}.isdisjoint(args.skip):
        print(analyze_block(report))
    if "training" not in args.skip:
        print(training_block(report))
    if args.json:
        write_results(args.json, report)
    return report


if __name__ == "__main__":
    main()
