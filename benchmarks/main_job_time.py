#!/usr/bin/env python
"""Time to the first result: the main job (the README's first command) with its defaults and with those it had before
issue 34, side by side in one run: wall time and the best head's grounding accuracy of each.

    python benchmarks/main_job_time.py --json benchmarks/results/main_job_time.json   # ~40 min on 2 quiet cores
    python benchmarks/main_job_time.py --seeds 42 --out_dir /tmp/main_job_time         # one seed of each
    python benchmarks/main_job_time.py --settings defaults --seeds 42 --json benchmarks/results/main_job_time.json
                                                        # the README's statement: the main job alone, ~10 min
    python benchmarks/main_job_time.py --docs benchmarks/results/main_job_time.json    # only rewrite the docs' block

Each run is a fresh process of the README's command, `accelerate launch --config_file
examples/accelerate_configs/single_process.yaml examples/finetune_vgp.py --seed S --output_dir DIR`, with the flags of
its setting: `previous` passes the defaults the example had before issue 34 (`PREVIOUS_DEFAULTS`, written out so that
the comparison means the same whatever the defaults become), `defaults` passes none (the example's current defaults).
The two settings alternate (seed by seed, the first of each pair switching), so that other work on the machine hits
both alike; the load average before and after each run is recorded. The synthetic scenes are generated once, before
the timed runs, into a cache of `--out_dir` that every run reads (a newcomer's first run also generates them: that time
is recorded apart, `scene_generation_seconds`). A run's wall time is the launch command's, start to exit; its numbers
are those of its `eval_results.json`; its settings are those of its `training_args.json`. `OUT_DIR/runs.json` holds the
runs finished so far.

Writes `--json` and the markdown table beside it (`.md`); `--docs` rewrites the block between `DOCS_BEGIN` and
`DOCS_END` (on whichever page of README.md and docs/ holds it) from a results JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from machine_info import cpu_model, versions  # noqa: E402  (benchmarks/machine_info.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "main_job_time.json"
LAUNCH = ("accelerate", "launch", "--config_file", "examples/accelerate_configs/single_process.yaml")
EXAMPLE = "examples/finetune_vgp.py"
# the example's training defaults before issue 34 (per_device_train_batch_size 32, per_device_eval_batch_size 64,
# warmup_steps 50 and max_text_length 64 are unchanged)
PREVIOUS_DEFAULTS = ("--num_train_epochs", "2", "--learning_rate", "2e-4", "--eval_strategy", "epoch")
SETTINGS = {"previous": PREVIOUS_DEFAULTS, "defaults": ()}
# what each run's training_args.json says of the settings that differ
SETTING_FIELDS = ("num_train_epochs", "learning_rate", "eval_strategy", "per_device_train_batch_size", "warmup_steps")
METRICS = {
    "grounding_accuracy_best_head": "grounding, best head",
    "grounding_accuracy_mean_head": "grounding, mean head",
    "image_description_accuracy": "identification acc.",
    "vgp_accuracy": "VGP acc.",
    "image_use_loss_gap": "image-use gap (loss)",
}
DOCS_BEGIN = "<!-- benchmarks/main_job_time.py table: begin -->"
DOCS_END = "<!-- benchmarks/main_job_time.py table: end -->"


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def generate_scenes(env: dict[str, str]) -> float:
    """Seconds to generate (or read, when cached) the main job's synthetic scenes, in a fresh process."""
    code = (
        "from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp\n"
        "load_or_generate_synthetic_vgp(config=SyntheticSceneConfig())"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def run_command(setting: str, seed: int, output_dir: Path) -> list[str]:
    return [*LAUNCH, EXAMPLE, "--seed", str(seed), "--output_dir", str(output_dir), *SETTINGS[setting]]


def run_once(setting: str, seed: int, out_dir: Path, env: dict[str, str]) -> dict:
    """One timed launch of the main job; its wall time, load averages, settings and reported numbers."""
    output_dir = out_dir / setting / f"seed{seed}"
    command = run_command(setting, seed, output_dir)
    load_before = load_average()
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr[-3000:]}")
    results = json.loads((output_dir / "eval_results.json").read_text())
    training_args = json.loads((output_dir / "training_args.json").read_text())
    return {
        "setting": setting,
        "seed": seed,
        "command": " ".join(command).replace(str(output_dir), "DIR"),
        "wall_seconds": seconds,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "settings": {name: training_args[name] for name in SETTING_FIELDS},
        **{key: results[key] for key in METRICS if key in results},
        "image_use_loss_gap": results["image_use"]["image_use_loss_gap"],
        "num_grounded_phrases": results["num_grounded_phrases"],
    }


def summarize(runs: list[dict], settings: list[str]) -> dict:
    """Per setting: the median wall time and the numbers of every seed; with both settings, the ratio of the medians
    (defaults / previous) and of each seed's pair."""
    summary = {}
    for setting in settings:
        own = [run for run in runs if run["setting"] == setting]
        summary[setting] = {
            "median_wall_seconds": statistics.median(run["wall_seconds"] for run in own),
            "min_best_head": min(run["grounding_accuracy_best_head"] for run in own),
            **{f"mean_{key}": statistics.mean(run[key] for run in own) for key in METRICS},
        }
    if len(settings) == 1:
        return {"settings": summary}
    by_seed = {(run["setting"], run["seed"]): run for run in runs}
    seeds = sorted({run["seed"] for run in runs})
    return {
        "settings": summary,
        "wall_time_ratio": summary["defaults"]["median_wall_seconds"] / summary["previous"]["median_wall_seconds"],
        "wall_time_ratio_per_seed": {
            str(seed): by_seed["defaults", seed]["wall_seconds"] / by_seed["previous", seed]["wall_seconds"]
            for seed in seeds
        },
    }


def measure(seeds: list[int], settings: list[str], out_dir: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VLALIGN_CACHE": str(out_dir / "cache")}
    generation = generate_scenes(env)
    print(f"scenes generated in {generation:.1f} s", flush=True)
    runs = []
    for index, seed in enumerate(seeds):
        order = settings if index % 2 == 0 else settings[::-1]
        for setting in order:
            runs.append(run_once(setting, seed, out_dir, env))
            (out_dir / "runs.json").write_text(json.dumps(runs, indent=2))  # kept if the measurement stops early
            run = runs[-1]
            best_head = run["grounding_accuracy_best_head"]
            print(f"{setting}, seed {seed}: {run['wall_seconds']:.0f} s, best head {best_head:.3f}", flush=True)
    return {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "versions": versions(),
        "seeds": seeds,
        "settings": settings,
        "previous_defaults": list(PREVIOUS_DEFAULTS),
        "scene_generation_seconds": generation,
        "runs": runs,
        "summary": summarize(runs, settings),
    }


# ----------------------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------------------


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{round(seconds % 60):02d}"


def _setting_label(report: dict, setting: str) -> str:
    settings = next(run["settings"] for run in report["runs"] if run["setting"] == setting)
    name = "previous defaults" if setting == "previous" else "defaults"
    learning_rate = f"{settings['learning_rate']:.0e}".replace("e-0", "e-")
    return (
        f"{name}: {settings['num_train_epochs']:g} epoch(s), learning rate {learning_rate}, "
        f"eval_strategy {settings['eval_strategy']}"
    )


def table(report: dict) -> str:
    """One row per setting: wall time per seed and its median, the best head per seed, the other numbers' means."""
    seeds, summary = report["seeds"], report["summary"]
    runs = {(run["setting"], run["seed"]): run for run in report["runs"]}
    header = (
        "| `finetune_vgp.py` | wall time, min:s (seeds " + ", ".join(map(str, seeds)) + ") | median | grounding, best head "
        "(per seed) | mean head | identification acc. | VGP acc. | image-use gap (loss) |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for setting in report["settings"]:
        own = summary["settings"][setting]
        walls = ", ".join(_minutes(runs[setting, seed]["wall_seconds"]) for seed in seeds)
        heads = ", ".join(f"{runs[setting, seed]['grounding_accuracy_best_head']:.3f}" for seed in seeds)
        lines.append(
            f"| {_setting_label(report, setting)} | {walls} | {_minutes(own['median_wall_seconds'])} | {heads} | "
            f"{own['mean_grounding_accuracy_mean_head']:.3f} | {own['mean_image_description_accuracy']:.3f} | "
            f"{own['mean_vgp_accuracy']:.3f} | {own['mean_image_use_loss_gap']:.3f} |"
        )
    return "\n".join(lines)


def caption(report: dict) -> str:
    summary, machine = report["summary"], report["machine"]
    loads = [value for run in report["runs"] for value in (run["load_average_before"][0], run["load_average_after"][0])]
    ratio = ""
    if "wall_time_ratio" in summary:
        per_seed = ", ".join(f"{value:.2f}" for value in summary["wall_time_ratio_per_seed"].values())
        ratio = (
            f"Wall time ratio (defaults / previous defaults, medians): {summary['wall_time_ratio']:.2f} (per seed "
            f"{per_seed}); the settings alternated. "
        )
    flags = f"--settings {' '.join(report['settings'])} --seeds {' '.join(map(str, report['seeds']))}"
    return (
        f"{ratio}The other numbers are means over the seeds. Each run is a fresh `accelerate launch` of the README's "
        f"command with `--seed S`, nothing else running; the scenes were cached before the runs (generating them, a "
        f"newcomer's first run only, took {report['scene_generation_seconds']:.0f} s more). "
        f"{machine['cpu']}, {machine['cores']} cores, torch {report['versions']['torch']}; 1-minute load average "
        f"{min(loads):.1f}-{max(loads):.1f} before and after the runs; "
        f"`python benchmarks/main_job_time.py {flags} --json {RESULTS.relative_to(ROOT)}`."
    )


def docs_block(report: dict) -> str:
    return "\n".join([DOCS_BEGIN, table(report), "", caption(report), DOCS_END])


def write_markdown(report: dict, path: Path) -> None:
    path.write_text(f"# The main job's wall time\n\n{table(report)}\n\n{caption(report)}\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out_dir", default="outputs/main_job_time", help="the runs' output folders and scene cache")
    parser.add_argument("--json", default=None, help=f"write the results here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' block from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(json.loads(Path(args.docs).read_text())))
        return {}
    for name in ("seeds", "settings"):
        if len(set(getattr(args, name))) != len(getattr(args, name)):
            raise ValueError(f"`--{name}` must be distinct, got {getattr(args, name)}.")
    report = measure(args.seeds, args.settings, Path(args.out_dir).resolve())
    if args.json:
        write_results(args.json, report)
        write_markdown(report, Path(args.json).with_suffix(".md"))
    print(table(report) + "\n\n" + caption(report))
    return report


if __name__ == "__main__":
    main()
