#!/usr/bin/env python
"""Reproduce the result tables of the docs over several seeds: one JSON per run under `results/`, an aggregate with
mean, standard deviation and paired comparisons, and the docs' tables (docs/results.md, docs/training.md) rewritten
from them.

    python benchmarks/reproduce.py                                   # every experiment, 3 seeds, reduced budget
    python benchmarks/reproduce.py --experiments two_stream_alignment --seeds 42 43 44 45 --jobs 2
    python benchmarks/reproduce.py --budget default                  # the examples' own defaults (hours on 2 cores)
    python benchmarks/reproduce.py --budget smoke --seeds 1 2 --results_dir /tmp/results   # CI's smoke mode
    python benchmarks/reproduce.py --aggregate_only --docs           # aggregate committed runs, rewrite the docs

Each run is one example script in its own process (`python examples/<script>.py <setting> <budget> --seed S`), with
`--num_threads` = the machine's cores divided by `--jobs`; its `eval_results.json` is read back and written, with the
command, seed, versions, machine, thread count, git commit and wall time, to
`<results_dir>/<budget>/<experiment>/<setting>/seed<S>.json`. Runs whose file exists are skipped (the harness resumes),
`--overwrite` reruns them. The seed is the examples' `--seed` (weight initialisation, masking, batch order); the
synthetic scenes stay those of `--synthetic_seed 0`, so every seed trains and evaluates on the same data and a
difference between two settings of one seed is paired: same data, same batches, same initial weights where the
settings share them.

`<results_dir>/<budget>/aggregate.json` holds, per setting and metric, n, mean, sd (n - 1 in the denominator) and the
values by seed; per comparison ("setting A - setting B on a metric"), the per-seed differences, their mean and sd, the
paired t statistic and in how many seeds the difference has the sign of the mean. The docs blocks between
`<!-- benchmarks/reproduce.py <experiment>: begin -->` and `... end -->` are rendered from the aggregate
(`docs_block`); tests/project/test_readme_results.py fails when they differ from what the committed results give.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import cpu_model  # noqa: E402  (benchmarks/machine_info.py)
from docs_blocks import docs_pages, replace_docs_block  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "results"
DEFAULT_SEEDS = (42, 43, 44)  # 42: the examples' own default
COMMON_ARGS = ["--report_to", "none", "--disable_tqdm", "true"]


@dataclass(frozen=True)
class Setting:
    """One row of a table: an example script, its flags and the results file it writes (relative to --output_dir)."""

    script: str
    args: tuple[str, ...] = ()
    results_file: str = "eval_results.json"


@dataclass(frozen=True)
class Metric:
    key: str  # a (dotted) key of the run's eval_results.json
    label: str


@dataclass(frozen=True)
class Comparison:
    """`a - b`, per seed: (setting, metric key) on each side; the same setting on both sides compares two metrics of
    one run (e.g. accuracy - baseline)."""

    a: tuple[str, str]
    b: tuple[str, str]

    @property
    def name(self) -> str:
        (setting_a, key_a), (setting_b, key_b) = self.a, self.b
        if key_a == key_b:
            return f"{setting_a} - {setting_b}: {key_a}"
        return (
            f"{setting_a}: {key_a} - {key_b}"
            if setting_a == setting_b
            else f"{setting_a}.{key_a} - {setting_b}.{key_b}"
        )


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    settings: dict[str, Setting]
    metrics: tuple[Metric, ...]
    comparisons: tuple[Comparison, ...] = ()
    budgets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # extra flags per budget, for every setting


IMAGE_USE = Metric("image_use.image_use_loss_gap", "image-use gap (loss with another image - own)")
SMALL_SCENES = ("--synthetic_train_images", "240", "--synthetic_eval_images", "100")
# the training of the committed `reduced` VGP results (2 epochs at 2e-4), written out so that the table of
# docs/results.md keeps its meaning whatever the example's defaults are
VGP_TABLE_TRAINING = ("--num_train_epochs", "2", "--learning_rate", "2e-4")
SMOKE_SCENES = ("--synthetic_train_images", "12", "--synthetic_eval_images", "6", "--image_use_examples", "8")
SMOKE_STEPS = ("--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1")
SMOKE_TWO_STREAM = ("--l_layers", "1", "--r_layers", "1", "--x_layers", "1")


def _compare_to(reference: str, settings: list[str], keys: list[str]) -> tuple[Comparison, ...]:
    return tuple(Comparison((setting, key), (reference, key)) for setting in settings for key in keys)


EXPERIMENTS: dict[str, Experiment] = {
    experiment.name: experiment
    for experiment in (
        Experiment(
            name="vgp_supervision",
            title="VGP fine-tuning (single-stream) with each attention supervision",
            settings={
                name: Setting("finetune_vgp.py", ("--supervision", name))
                for name in ("none", "direct", "semi_direct", "indirect")
            },
            metrics=(
                Metric("image_description_accuracy", "identification acc."),
                Metric("vgp_accuracy", "VGP acc."),
                Metric("grounding_accuracy_best_head", "grounding, best head"),
                Metric("grounding_accuracy_mean_head", "grounding, mean head"),
                Metric("grounding_baseline_accuracy", "confidence baseline"),
                IMAGE_USE,
            ),
            comparisons=(
                *_compare_to(
                    "none",
                    ["direct", "semi_direct", "indirect"],
                    ["grounding_accuracy_best_head", "grounding_accuracy_mean_head", "vgp_accuracy"],
                ),
                Comparison(("direct", "grounding_accuracy_best_head"), ("semi_direct", "grounding_accuracy_best_head")),
                Comparison(("indirect", "grounding_accuracy_best_head"), ("indirect", "grounding_baseline_accuracy")),
            ),
            budgets={"reduced": (*SMALL_SCENES, *VGP_TABLE_TRAINING), "smoke": (*SMOKE_SCENES, *SMOKE_STEPS)},
        ),
        Experiment(
            name="two_stream_alignment",
            title="two-stream pre-training with and without the object-word alignment loss",
            settings={
                "with": Setting(
                    "pretrain_two_stream.py", ("--alignment_loss", "with"), "with_alignment/eval_results.json"
                ),
                "without": Setting(
                    "pretrain_two_stream.py", ("--alignment_loss", "without"), "without_alignment/eval_results.json"
                ),
            },
            metrics=(
                Metric("vqa_accuracy", "VQA acc."),
                Metric("cross_attention_grounding_accuracy", "cross-attention grounding (penultimate, heads summed)"),
                Metric("best_head_grounding_accuracy", "best cross-attention head"),
                Metric("alignment_decoder_grounding_accuracy", "alignment decoder grounding"),
                Metric("grounding_baseline_accuracy", "confidence baseline"),
                IMAGE_USE,
            ),
            comparisons=(
                *_compare_to(
                    "without",
                    ["with"],
                    ["cross_attention_grounding_accuracy", "best_head_grounding_accuracy", "vqa_accuracy"],
                ),
                Comparison(("with", "alignment_decoder_grounding_accuracy"), ("with", "grounding_baseline_accuracy")),
            ),
            budgets={"reduced": SMALL_SCENES, "smoke": (*SMOKE_SCENES, *SMOKE_STEPS, *SMOKE_TWO_STREAM)},
        ),
        Experiment(
            name="captioning_alignment",
            title="captioner: A2 attention-alignment fusions and the geometry ablation",
            settings={
                **{
                    name: Setting("train_captioning.py", ("--alignment", name))
                    for name in ("none", "max", "moving_average", "exp_decay", "gate")
                },
                "gate_no_geometry": Setting("train_captioning.py", ("--alignment", "gate", "--no_geometry")),
            },
            metrics=(
                Metric("bleu_4", "BLEU-4"),
                Metric("cider", "CIDEr-D"),
                Metric("meteor", "METEOR"),
                Metric("rouge_l", "ROUGE-L"),
                Metric("alignment", "grounding (last layer, heads summed)"),
                Metric("grounding_baseline_accuracy", "confidence baseline"),
                IMAGE_USE,
            ),
            comparisons=(
                *_compare_to("none", ["max", "moving_average", "exp_decay", "gate"], ["alignment", "cider"]),
                *_compare_to("gate", ["gate_no_geometry"], ["cider", "bleu_4"]),
            ),
            budgets={
                "reduced": SMALL_SCENES,
                "smoke": (*SMOKE_SCENES, *SMOKE_STEPS, "--encoder_layers", "1", "--decoder_layers", "1"),
            },
        ),
        Experiment(
            name="downstream",
            title="downstream tasks (single-stream, the examples' data) against their baselines",
            settings={
                "vqa": Setting("finetune_vqa.py"),
                "nlvr2": Setting("finetune_nlvr2.py"),
                "refcoco": Setting("finetune_refcoco.py"),
                "flickr_grounding": Setting("finetune_flickr_grounding.py"),
            },
            metrics=(
                Metric("accuracy", "accuracy (VQA, NLVR2, RefCOCO+)"),
                Metric("majority_baseline_accuracy", "majority baseline"),
                Metric("baseline_confidence_accuracy", "confidence baseline"),
                Metric("recall@1_merged_boxes", "Recall@1 (Flickr30k)"),
                Metric("baseline_confidence_recall@1_merged_boxes", "confidence baseline R@1"),
                IMAGE_USE,
            ),
            comparisons=(
                Comparison(("vqa", "accuracy"), ("vqa", "majority_baseline_accuracy")),
                Comparison(("nlvr2", "accuracy"), ("nlvr2", "majority_baseline_accuracy")),
                Comparison(("refcoco", "accuracy"), ("refcoco", "baseline_confidence_accuracy")),
                Comparison(
                    ("flickr_grounding", "recall@1_merged_boxes"),
                    ("flickr_grounding", "baseline_confidence_recall@1_merged_boxes"),
                ),
            ),
            budgets={"reduced": (), "smoke": (*SMOKE_SCENES[:4], *SMOKE_STEPS, "--eval_steps", "2")},
        ),
        Experiment(
            name="single_stream_pretraining",
            title="single-stream pre-training (VisualBERT), the example's defaults",
            settings={"default": Setting("pretrain_single_stream.py")},
            metrics=(
                Metric("mlm_accuracy", "masked-word accuracy"),
                Metric("sentence_image_accuracy", "sentence-image accuracy (chance 0.5)"),
            ),
            budgets={"reduced": (), "smoke": (*SMOKE_SCENES[:4], *SMOKE_STEPS, "--eval_steps", "2")},
        ),
    )
}
BUDGETS = ("reduced", "default", "smoke")


def budget_args(experiment: Experiment, budget: str) -> tuple[str, ...]:
    if budget not in BUDGETS:
        raise ValueError(f"`--budget` must be one of {list(BUDGETS)}, got {budget!r}.")
    return () if budget == "default" else experiment.budgets.get(budget, ())


def run_command(
    experiment: Experiment, setting: str, budget: str, seed: int, output_dir: Path, threads: int
) -> list[str]:
    """The example's command line of one run (what a user types after `python`)."""
    spec = experiment.settings[setting]
    if output_dir.is_absolute() and output_dir.is_relative_to(ROOT):
        output_dir = output_dir.relative_to(ROOT)  # the runs start in the repository root
    return [
        f"examples/{spec.script}",
        *spec.args,
        *budget_args(experiment, budget),
        "--seed", str(seed), "--output_dir", str(output_dir), "--num_threads", str(threads), *COMMON_ARGS,
    ]  # fmt: skip


def flatten_numbers(results: dict, prefix: str = "") -> dict[str, float]:
    """Every finite number of an eval_results.json, under dotted keys (lists and strings left out)."""
    flat = {}
    for key, value in results.items():
        if isinstance(value, dict):
            flat.update(flatten_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[f"{prefix}{key}"] = value
    return flat


def machine() -> dict:
    from hf_vlalign.recipes import available_cores

    return {"cpu": cpu_model(), "cores": available_cores(), "platform": platform.platform()}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    packages = ("torch", "transformers", "accelerate", "datasets", "hf_vlalign")
    return {"python": platform.python_version(), **{name: version(name) for name in packages}}


def git_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src", "examples"], cwd=ROOT, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def run_file(results_dir: Path, budget: str, experiment: str, setting: str, seed: int) -> Path:
    return results_dir / budget / experiment / setting / f"seed{seed}.json"


def run_one(
    experiment: Experiment, setting: str, budget: str, seed: int, results_dir: Path, outputs_dir: Path, threads: int
) -> dict:
    """Runs one example process and writes its result file; raises with the run's last output lines on failure."""
    output_dir = outputs_dir / budget / experiment.name / setting / f"seed{seed}"
    command = run_command(experiment, setting, budget, seed, output_dir, threads)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    start = time.perf_counter()
    process = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        tail = "\n".join((process.stdout + process.stderr).splitlines()[-30:])
        raise RuntimeError(f"{experiment.name}/{setting} seed {seed} failed ({' '.join(command)}):\n{tail}")
    eval_results = json.loads((output_dir / experiment.settings[setting].results_file).read_text())
    record = {
        "experiment": experiment.name,
        "setting": setting,
        "budget": budget,
        "seed": seed,
        "command": "python " + " ".join(command),
        "threads": threads,
        "wall_seconds": seconds,
        "machine": machine(),
        "versions": versions(),
        "git_commit": git_commit(),
        "metrics": flatten_numbers(eval_results),
    }
    path = run_file(results_dir, budget, experiment.name, setting, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def summarise(values_by_seed: dict[int, float]) -> dict:
    values = list(values_by_seed.values())
    mean, sd = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None  # sd: n - 1
    return {"n": len(values_by_seed), "mean": mean, "sd": sd, "by_seed": {str(s): v for s, v in values_by_seed.items()}}


def compare(runs: dict[str, dict[int, dict]], comparison: Comparison) -> dict | None:
    """Per-seed differences a - b over the seeds both sides have; None when no seed has both."""
    (setting_a, key_a), (setting_b, key_b) = comparison.a, comparison.b
    seeds = sorted(
        seed
        for seed in set(runs.get(setting_a, {})) & set(runs.get(setting_b, {}))
        if key_a in runs[setting_a][seed]["metrics"] and key_b in runs[setting_b][seed]["metrics"]
    )
    if not seeds:
        return None
    differences = {
        seed: runs[setting_a][seed]["metrics"][key_a] - runs[setting_b][seed]["metrics"][key_b] for seed in seeds
    }
    summary = summarise(differences)
    mean, sd = summary["mean"], summary["sd"]
    same_sign = sum((value > 0) == (mean > 0) and value != 0 for value in differences.values())
    t = mean / (sd / math.sqrt(len(seeds))) if sd else None
    return {"name": comparison.name, **summary, "paired_t": t, "seeds_with_sign_of_mean": same_sign}


def load_runs(results_dir: Path, budget: str, experiment: Experiment) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for setting in experiment.settings:
        for path in sorted((results_dir / budget / experiment.name / setting).glob("seed*.json")):
            record = json.loads(path.read_text())
            runs.setdefault(setting, {})[record["seed"]] = record
    return runs


def aggregate_experiment(results_dir: Path, budget: str, experiment: Experiment) -> dict | None:
    runs = load_runs(results_dir, budget, experiment)
    if not runs:
        return None
    settings = {}
    for setting, by_seed in runs.items():
        metrics = {
            metric.key: summarise({seed: run["metrics"][metric.key] for seed, run in sorted(by_seed.items())})
            for metric in experiment.metrics
            if all(metric.key in run["metrics"] for run in by_seed.values())
        }
        first = by_seed[min(by_seed)]
        settings[setting] = {
            "command": first["command"]
            .replace(f"--seed {first['seed']}", "--seed S")
            .replace(f"/seed{first['seed']} ", "/seedS "),
            "seeds": sorted(by_seed),
            "metrics": metrics,
            "wall_seconds": summarise({seed: run["wall_seconds"] for seed, run in sorted(by_seed.items())}),
            "threads": sorted({run["threads"] for run in by_seed.values()}),
        }
    records = [run for by_seed in runs.values() for run in by_seed.values()]
    comparisons = [result for c in experiment.comparisons if (result := compare(runs, c)) is not None]
    return {
        "title": experiment.title,
        "settings": settings,
        "comparisons": comparisons,
        "machines": sorted({f"{r['machine']['cpu']}, {r['machine']['cores']} cores" for r in records}),
        "versions": sorted({", ".join(f"{k} {v}" for k, v in sorted(r["versions"].items())) for r in records}),
        "git_commits": sorted({str(r["git_commit"]) for r in records}),
    }


def aggregate(results_dir: Path, budget: str) -> dict:
    experiments = {name: aggregate_experiment(results_dir, budget, e) for name, e in EXPERIMENTS.items()}
    checks = results_dir / budget / "determinism.json"
    return {
        "budget": budget,
        "experiments": {name: value for name, value in experiments.items() if value},
        "determinism": json.loads(checks.read_text()) if checks.exists() else [],
    }


def _cell(summary: dict | None) -> str:
    if summary is None:
        return "-"
    if summary["sd"] is None:
        return f"{summary['mean']:.3f}"
    return f"{summary['mean']:.3f} ± {summary['sd']:.3f}"


def _minutes(seconds: float) -> str:
    total = round(seconds)
    return f"{total // 60}:{total % 60:02d}"


def comparison_line(result: dict) -> str:
    n, agree = result["n"], result["seeds_with_sign_of_mean"]
    spread = "" if result["sd"] is None else f" ± {result['sd']:.3f}"
    t = "" if result["paired_t"] is None else f", paired t = {result['paired_t']:.1f}"
    verdict = "every seed" if agree == n else f"{agree} of {n} seeds"
    return f"- {result['name']}: {result['mean']:+.3f}{spread} over {n} seed(s){t}; the sign of the mean in {verdict}"


def ordered_settings(summary: dict, experiment: Experiment) -> list[tuple[str, dict]]:
    """The summary's settings in the experiment's order (a results file read back has its keys sorted)."""
    return [
        (setting, summary["settings"][setting]) for setting in experiment.settings if setting in summary["settings"]
    ]


def table(summary: dict, experiment: Experiment) -> str:
    metrics = [m for m in experiment.metrics if any(m.key in s["metrics"] for s in summary["settings"].values())]
    header = "| setting | " + " | ".join(m.label for m in metrics) + " | seeds | wall time per run (min-max) |"
    lines = [header, "|" + "---|" * (len(metrics) + 3)]
    for setting, row in ordered_settings(summary, experiment):
        cells = [_cell(row["metrics"].get(m.key)) for m in metrics]
        times = list(row["wall_seconds"]["by_seed"].values())
        seeds = ", ".join(str(seed) for seed in row["seeds"])
        lines.append(
            f"| {setting} | " + " | ".join(cells) + f" | {seeds} | {_minutes(min(times))}-{_minutes(max(times))} |"
        )
    return "\n".join(lines)


def docs_markers(name: str) -> tuple[str, str]:
    return f"<!-- benchmarks/reproduce.py {name}: begin -->", f"<!-- benchmarks/reproduce.py {name}: end -->"


def docs_block(name: str, report: dict) -> str:
    """The docs block of one experiment: its commands, table (mean ± sd over seeds) and paired comparisons."""
    experiment, summary = EXPERIMENTS[name], report["experiments"][name]
    begin, end = docs_markers(name)
    commands = "\n".join(f"- {s}: `{row['command']}`" for s, row in ordered_settings(summary, experiment))
    threads = sorted({t for row in summary["settings"].values() for t in row["threads"]})
    caption = (
        f"{summary['title']}; budget `{report['budget']}` of `benchmarks/reproduce.py`; mean ± sd over seeds "
        f"(sd with n - 1); {'; '.join(summary['machines'])}, {', '.join(map(str, threads))} thread(s) per run, "
        f"{'; '.join(summary['versions'])}; commit {', '.join(c[:12] for c in summary['git_commits'])}. "
        f"Commands (S = the seed):\n\n{commands}"
    )
    comparisons = "\n".join(comparison_line(result) for result in summary["comparisons"])
    paired = f"\n\nPaired differences (same seed, same data):\n\n{comparisons}" if comparisons else ""
    return f"{begin}\n{caption}\n\n{table(summary, experiment)}{paired}\n{end}"


def determinism_line(check: dict) -> str:
    same = check["num_metrics"] - len(check["differing_metrics"])
    weights = {True: "identical", False: "different", None: "not compared"}[check["same_weights"]]
    return (
        f"- {check['experiment']}/{check['setting']}, seed {check['seed']}, {check['threads']} thread(s), run again in "
        f"a new process: {same} of {check['num_metrics']} numbers of eval_results.json equal, saved weights {weights}"
    )


def summary_block(report: dict) -> str:
    """The docs' overview of the committed results: runs, seeds, total wall time and the determinism checks."""
    begin, end = docs_markers("summary")
    rows = [row for summary in report["experiments"].values() for row in summary["settings"].values()]
    seconds = sum(sum(row["wall_seconds"]["by_seed"].values()) for row in rows)
    runs = sum(row["wall_seconds"]["n"] for row in rows)
    seeds = sorted({seed for row in rows for seed in row["seeds"]})
    lines = [
        f"Budget `{report['budget']}`: {len(report['experiments'])} experiments, {len(rows)} settings, {runs} runs "
        f"(seeds {', '.join(map(str, seeds))}), {seconds / 3600:.1f} hours of run wall time in all (the sum over runs; "
        f"two ran side by side), `results/{report['budget']}/`.",
    ]
    if report["determinism"]:
        lines += ["", "Determinism checks (`--check_determinism`):", ""]
        lines += [determinism_line(check) for check in report["determinism"]]
    return f"{begin}\n" + "\n".join(lines) + f"\n{end}"


def write_docs(report: dict, root: Path = ROOT) -> list[str]:
    """Rewrites the summary block and each experiment's block on the page of README.md / docs/ that holds its markers;
    returns what it wrote, as `<block> -> <page>`."""
    text = "\n".join(page.read_text() for page in docs_pages(root))
    blocks = {"summary": summary_block(report)} | {name: docs_block(name, report) for name in report["experiments"]}
    written = []
    for name, block in blocks.items():
        begin, end = docs_markers(name)
        if begin in text:
            page = replace_docs_block(begin, end, block, root)
            written.append(f"{name} -> {page.relative_to(root)}")
    return written


def check_determinism(
    experiment: Experiment, setting: str, budget: str, seed: int, results_dir: Path, outputs_dir: Path
) -> dict:
    """Reruns one committed run (same command, seed and thread count, on this machine) and compares its metrics and
    saved weights with the first run's; what the docs' determinism statement rests on."""
    first = json.loads(run_file(results_dir, budget, experiment.name, setting, seed).read_text())
    scratch = outputs_dir / "determinism"
    again = run_one(experiment, setting, budget, seed, scratch / "results", scratch / "outputs", first["threads"])
    weights = Path(experiment.settings[setting].results_file).parent / "model.safetensors"
    folders = [root / budget / experiment.name / setting / f"seed{seed}" for root in (outputs_dir, scratch / "outputs")]
    same_weights = None
    if all((folder / weights).exists() for folder in folders):
        same_weights = (folders[0] / weights).read_bytes() == (folders[1] / weights).read_bytes()
    differing = sorted(
        key
        for key in first["metrics"].keys() | again["metrics"].keys()
        if first["metrics"].get(key) != again["metrics"].get(key)
    )
    return {
        "experiment": experiment.name,
        "setting": setting,
        "seed": seed,
        "threads": first["threads"],
        "same_machine": first["machine"] == again["machine"],
        "same_versions": first["versions"] == again["versions"],
        "num_metrics": len(first["metrics"]),
        "differing_metrics": differing,
        "same_weights": same_weights,
        "wall_seconds": [first["wall_seconds"], again["wall_seconds"]],
    }


def planned_runs(experiments: list[str], seeds: list[int]) -> list[tuple[Experiment, str, int]]:
    """Seed-major order: every setting of seed 1 before seed 2, so an interrupted harness leaves paired runs."""
    return [
        (EXPERIMENTS[name], setting, seed)
        for name in experiments
        for seed in seeds
        for setting in EXPERIMENTS[name].settings
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: --num_seeds seeds from 42")
    parser.add_argument("--num_seeds", type=int, default=len(DEFAULT_SEEDS), help="S: seeds 42 .. 42 + S - 1")
    parser.add_argument(
        "--budget",
        default="reduced",
        choices=BUDGETS,
        help="reduced: 240 training / 100 evaluation "
        "scenes (downstream: the examples' defaults); default: the examples' own; smoke: a few steps",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side (threads per run: cores / jobs)")
    parser.add_argument("--results_dir", default=str(RESULTS_DIR))
    parser.add_argument("--outputs_dir", default="outputs/reproduce", help="the runs' model folders (not results)")
    parser.add_argument("--overwrite", action="store_true", help="rerun runs whose result file exists")
    parser.add_argument(
        "--check_determinism",
        action="store_true",
        help="afterwards, rerun each chosen experiment's first setting at "
        "the first seed and record whether metrics and weights are identical (<budget>/determinism.json)",
    )
    parser.add_argument("--aggregate_only", action="store_true", help="no runs: aggregate the result files")
    parser.add_argument(
        "--docs", action="store_true", help="rewrite the blocks of README.md and docs/*.md from the aggregate"
    )
    args = parser.parse_args(argv)
    if args.num_seeds < 1 or args.jobs < 1:
        parser.error(f"--num_seeds and --jobs must be >= 1, got {args.num_seeds} and {args.jobs}")
    args.seeds = args.seeds or [DEFAULT_SEEDS[0] + i for i in range(args.num_seeds)]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results_dir, outputs_dir = Path(args.results_dir), Path(args.outputs_dir).resolve()
    if not args.aggregate_only:
        threads = max(machine()["cores"] // args.jobs, 1)
        todo = [
            (experiment, setting, seed)
            for experiment, setting, seed in planned_runs(args.experiments, args.seeds)
            if args.overwrite or not run_file(results_dir, args.budget, experiment.name, setting, seed).exists()
        ]
        print(f"{len(todo)} run(s), {args.jobs} at a time, {threads} thread(s) each", flush=True)

        def one(task: tuple[Experiment, str, int]) -> None:
            experiment, setting, seed = task
            record = run_one(experiment, setting, args.budget, seed, results_dir, outputs_dir, threads)
            print(f"{experiment.name}/{setting} seed {seed}: {record['wall_seconds']:.0f} s", flush=True)

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(one, todo))
    if args.check_determinism:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            checks = list(
                pool.map(
                    lambda name: check_determinism(
                        EXPERIMENTS[name], next(iter(EXPERIMENTS[name].settings)), args.budget, args.seeds[0],
                        results_dir, outputs_dir,
                    ),
                    args.experiments,
                )
            )  # fmt: skip
        path = results_dir / args.budget / "determinism.json"
        path.write_text(json.dumps(checks, indent=2, sort_keys=True) + "\n")
        print(json.dumps(checks, indent=2), flush=True)
    report = aggregate(results_dir, args.budget)
    path = results_dir / args.budget / "aggregate.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    for name in report["experiments"]:
        print(docs_block(name, report), flush=True)
    if args.docs:
        print("docs blocks rewritten:", write_docs(report))
    return report


if __name__ == "__main__":
    main()
