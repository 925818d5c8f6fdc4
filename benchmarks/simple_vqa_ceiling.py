#!/usr/bin/env python
"""Does `examples/finetune_vqa.py` learn a simple VQA set to its ceiling? Learning curves (evaluation accuracy per
answer type vs optimizer step) of named training settings on the same fixture, seed and evaluation questions.

    python benchmarks/simple_vqa_ceiling.py                                   # old defaults and the small-data recipe
    python benchmarks/simple_vqa_ceiling.py --settings old_defaults --out_dir outputs/ceiling   # one setting
    python benchmarks/simple_vqa_ceiling.py --out_dir outputs/ceiling --collect  # results JSON, table and plot only

Data: `benchmarks/simple_vqa_fixture.py` (1-3 coloured shapes per image, 17 boxes, 192-dim raw 0..255 pooled-colour
features in an LXMERT TSV converted to a store, VQA v2 question / annotation files), generated into `--out_dir`.
Every answer is determined by the image, so the set's ceiling is an accuracy of 1.0. Each setting is the example's
own `main()` with the flags of `SETTINGS` (written out in full, so that a setting means the same whatever the
example's defaults become); the example's evaluation (`vqa_accuracy` overall and per answer type) runs every
`--eval_every` steps and at the end. Beside them: the prior of each answer type (its most frequent training answer's
accuracy on the evaluation questions: a model that ignores the image reaches it) and the example's own-image vs
shuffled-image gap.

Each run writes `OUT_DIR/runs/<setting>.json` at every evaluation (a run stopped early keeps its curve so far, marked
`"complete": false`; `--from_log` reads one from the log a run printed); the script then writes `--json` (default
`benchmarks/results/simple_vqa_ceiling.json`), the markdown table beside it (`.md`) and a plot (`.png`) from every
run found in `OUT_DIR/runs`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))

from example_scripts import load_example  # noqa: E402  (benchmarks/example_scripts.py)
import simple_vqa_fixture  # noqa: E402  (benchmarks/simple_vqa_fixture.py)
from docs_blocks import write_results  # noqa: E402  (benchmarks/docs_blocks.py)

from hf_vlalign.data.builders import vqa_v2  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "finetune_vqa.py"
RESULTS = ROOT / "benchmarks" / "results" / "simple_vqa_ceiling.json"
ANSWER_TYPES = {"yes_no": "yes/no", "other": "other", "number": "number"}
# each setting's flags, in full; `old_defaults` are the example's defaults before the small-data recipe
OLD_DEFAULTS = ["--learning_rate", "2e-4", "--num_train_epochs", "1", "--warmup_steps", "20",
                "--per_device_train_batch_size", "16"]  # fmt: skip
SETTINGS = {
    "old_defaults": OLD_DEFAULTS,
    "old_defaults_4_epochs": [*OLD_DEFAULTS[:2], "--num_train_epochs", "4", *OLD_DEFAULTS[4:]],
    "head_lr_4_epochs": [*OLD_DEFAULTS[:2], "--num_train_epochs", "4", *OLD_DEFAULTS[4:], "--head_learning_rate", "1e-3"],
    "old_defaults_10_epochs": [*OLD_DEFAULTS[:2], "--num_train_epochs", "10", *OLD_DEFAULTS[4:]],
    "head_lr_10_epochs": [*OLD_DEFAULTS[:2], "--num_train_epochs", "10", *OLD_DEFAULTS[4:], "--head_learning_rate", "1e-3"],
}


def answer_type_priors(data_dir: Path) -> dict[str, float]:
    """Per answer type: the share of evaluation questions whose answer is that type's most frequent training answer."""
    train = json.loads((data_dir / vqa_v2.ANNOTATIONS_FILE["train"]).read_text())["annotations"]
    evaluation = json.loads((data_dir / vqa_v2.ANNOTATIONS_FILE["val"]).read_text())["annotations"]
    priors = {}
    for key, answer_type in ANSWER_TYPES.items():
        majority = Counter(a["multiple_choice_answer"] for a in train if a["answer_type"] == answer_type).most_common(1)
        answers = [a["multiple_choice_answer"] for a in evaluation if a["answer_type"] == answer_type]
        priors[key] = sum(answer == majority[0][0] for answer in answers) / len(answers)
    return priors


def curve_point(entry: dict, step: int) -> dict:
    """One evaluation of a run (the metrics of `trainer.evaluate()`, prefixed `eval_`) as a point of its curve."""
    return {
        "step": step,
        "epoch": float(entry["epoch"]),
        "vqa_accuracy": float(entry["eval_vqa_accuracy"]),
        **{key: float(entry[f"eval_vqa_accuracy_{key}"]) for key in ANSWER_TYPES},
    }


def partial_run(setting: str, curve: list[dict], planned_steps: int | None) -> dict:
    """A run stopped before its end: its evaluations so far, `final` being the last of them."""
    return {
        "setting": setting,
        "flags": " ".join(SETTINGS[setting]),
        "steps": curve[-1]["step"] if curve else 0,
        "planned_steps": planned_steps,
        "complete": False,
        "curve": curve,
        "final": {key: value for key, value in curve[-1].items() if key not in ("step", "epoch")} if curve else None,
        "image_use_accuracy_gap": None,
        "seconds": None,
    }


def curve_from_log(log: str, eval_every: int) -> list[dict]:
    """The evaluations a run printed (the Trainer's logged dicts, one a line) before it was stopped."""
    evaluations = [ast.literal_eval(line) for line in log.splitlines() if line.startswith("{'eval_loss'")]
    return [curve_point(entry, eval_every * (index + 1)) for index, entry in enumerate(evaluations)]


def run(example, fixture, setting: str, out_dir: Path, seed: int, eval_every: int) -> dict:
    """One setting through the example's `main()`; its evaluations during training are read from the trainer, and
    written to `OUT_DIR/runs/<setting>.json` as they come (a run stopped early keeps its curve so far)."""
    histories = []
    path = out_dir / "runs" / f"{setting}.json"

    class PartialCurve(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            curve = [curve_point({**metrics, "epoch": state.epoch}, state.global_step)] if metrics else []
            previous = json.loads(path.read_text())["curve"] if path.exists() else []
            path.write_text(json.dumps(partial_run(setting, previous + curve, state.max_steps), indent=1))

    # the example's own trainer, not the recording subclass of an earlier setting (whose callback would record too)
    base = example.__dict__.setdefault("_example_task_trainer", example.TaskTrainer)

    class RecordingTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(PartialCurve())

        def train(self, *args, **kwargs):
            output = super().train(*args, **kwargs)
            histories.append(list(self.state.log_history))
            return output

    example.TaskTrainer = RecordingTrainer
    path.unlink(missing_ok=True)
    argv = [
        "--dataset", "vqa_v2", "--data_dir", str(fixture.data_dir), "--features", str(fixture.store_dir),
        "--output_dir", str(out_dir / "models" / setting), "--report_to", "none", "--save_strategy", "no",
        "--disable_tqdm", "true", "--seed", str(seed), "--eval_strategy", "steps", "--eval_steps", str(eval_every),
        "--logging_steps", str(eval_every), *SETTINGS[setting],
    ]  # fmt: skip
    start = time.perf_counter()
    results = example.main(argv)
    seconds = time.perf_counter() - start
    curve = [curve_point(entry, entry["step"]) for entry in histories[0] if "eval_vqa_accuracy" in entry]
    return {
        "setting": setting,
        "flags": " ".join(SETTINGS[setting]),
        "steps": histories[0][-1]["step"],
        "planned_steps": histories[0][-1]["step"],
        "complete": True,
        "curve": curve,
        "final": {"vqa_accuracy": results["vqa_accuracy"], **{k: results.get(f"vqa_accuracy_{k}") for k in ANSWER_TYPES}},
        "image_use_accuracy_gap": results["image_use"]["image_use_accuracy_gap"],
        "seconds": seconds,
    }


def table(report: dict) -> str:
    priors = report["priors"]
    caption = (
        f"{report['settings']['train_images']} train / {report['settings']['val_images']} eval images "
        f"({report['settings']['eval_questions']} eval questions), seed {report['settings']['seed']}; "
        f"{report['settings']['machine']}, torch {report['settings']['torch']}; "
        "`python benchmarks/simple_vqa_ceiling.py`. Ceiling: 1.0 for every answer type. Prior (most frequent training "
        f"answer of the type): yes/no {priors['yes_no']:.3f}, other {priors['other']:.3f}, number {priors['number']:.3f}."
    )
    lines = [
        caption,
        "",
        "| setting | flags | step | epoch | VQA acc | yes/no | other | number |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["runs"]:
        for point in entry["curve"]:
            lines.append(
                f"| {entry['setting']} | `{entry['flags']}` | {point['step']} | {point['epoch']:.2f} | "
                f"{point['vqa_accuracy']:.3f} | " + " | ".join(f"{point[k]:.3f}" for k in ANSWER_TYPES) + " |"
            )
    lines += ["", "| setting | steps trained / planned | last VQA acc | yes/no | other | number | image-use gap | time |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for entry in report["runs"]:
        final = entry["final"]
        if final is None:
            continue
        stopped = "" if entry["complete"] else " (stopped)"
        gap = "-" if entry["image_use_accuracy_gap"] is None else f"{entry['image_use_accuracy_gap']:+.3f}"
        seconds = "-" if entry["seconds"] is None else f"{entry['seconds']:.0f} s"
        lines.append(
            f"| {entry['setting']} | {entry['steps']} / {entry['planned_steps']}{stopped} | {final['vqa_accuracy']:.3f} | "
            + " | ".join(f"{final[k]:.3f}" for k in ANSWER_TYPES)
            + f" | {gap} | {seconds} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 4, figsize=(16, 4), sharey=True)
    for axis, key in zip(axes, ["vqa_accuracy", *ANSWER_TYPES]):
        for entry in report["runs"]:
            axis.plot([p["step"] for p in entry["curve"]], [p[key] for p in entry["curve"]], marker="o", label=entry["setting"])
        axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ceiling (1.0)")
        if key in report["priors"]:
            axis.axhline(report["priors"][key], color="grey", linestyle=":", linewidth=1, label="prior (no image)")
        axis.set_title({"vqa_accuracy": "all questions", "yes_no": "yes/no", "other": "other (colour, shape)",
                        "number": "number"}[key])  # fmt: skip
        axis.set_xlabel("optimizer step (batches)")
        axis.set_ylim(0, 1.05)
    axes[0].set_ylabel("evaluation VQA accuracy (0-1)")
    axes[-1].legend(fontsize=8, loc="lower right")
    figure.suptitle("examples/finetune_vqa.py on the simple-shapes VQA v2 fixture: accuracy vs step, per answer type")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def collect(out_dir: Path, json_path: Path, settings: dict) -> dict:
    runs = [json.loads(path.read_text()) for path in sorted((out_dir / "runs").glob("*.json"))]
    order = list(SETTINGS)
    runs.sort(key=lambda entry: order.index(entry["setting"]) if entry["setting"] in order else len(order))
    report = {**settings, "runs": runs}
    write_results(json_path, report)
    json_path.with_suffix(".md").write_text(table(report))
    plot(report, json_path.with_suffix(".png"))
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", default="outputs/simple_vqa_ceiling")
    parser.add_argument("--train_images", type=int, default=200)
    parser.add_argument("--val_images", type=int, default=60)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval_every", type=int, default=22, help="evaluate every N optimizer steps")
    parser.add_argument("--json", default=str(RESULTS))
    parser.add_argument(
        "--from_log", nargs=3, metavar=("SETTING", "LOG", "PLANNED_STEPS"), action="append", default=[],
        help="a run of SETTING stopped before its end: read its evaluations so far from its printed log",
    )  # fmt: skip
    parser.add_argument("--collect", action="store_true", help="run nothing: write the results of OUT_DIR/runs")
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    fixture_dir = out_dir / "fixture"
    if (fixture_dir / "store").is_dir():  # settings run one by one (or side by side) read the same fixture
        fixture = simple_vqa_fixture.SimpleVQAFixture(
            fixture_dir, fixture_dir / "vqa", fixture_dir / "store", fixture_dir / "features.tsv",
            args.train_images, args.val_images,
        )  # fmt: skip
    else:
        fixture = simple_vqa_fixture.generate(fixture_dir, num_train_images=args.train_images, num_val_images=args.val_images)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    for setting, log, planned_steps in args.from_log:
        curve = curve_from_log(Path(log).read_text(), args.eval_every)
        (out_dir / "runs" / f"{setting}.json").write_text(json.dumps(partial_run(setting, curve, int(planned_steps)), indent=1))
    example = load_example(EXAMPLE)
    for setting in [] if args.collect or args.from_log else args.settings:
        entry = run(example, fixture, setting, out_dir, args.seed, args.eval_every)
        (out_dir / "runs" / f"{setting}.json").write_text(json.dumps(entry, indent=1))
        print(json.dumps({k: v for k, v in entry.items() if k != "curve"}), flush=True)
    evaluation = json.loads((fixture.data_dir / vqa_v2.ANNOTATIONS_FILE["val"]).read_text())["annotations"]
    settings = {
        "settings": {
            "train_images": args.train_images,
            "val_images": args.val_images,
            "eval_questions": len(evaluation),
            "seed": args.seed,
            "eval_every": args.eval_every,
            "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        },
        "priors": answer_type_priors(fixture.data_dir),
    }
    return collect(out_dir, Path(args.json), settings)


if __name__ == "__main__":
    main()
