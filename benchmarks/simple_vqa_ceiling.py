#!/usr/bin/env python
"""Does `examples/finetune_vqa.py` learn a simple VQA set to its ceiling? Learning curves (evaluation accuracy per
answer type vs optimizer step) of named training settings, each on its fixture, with the same seed.

    python benchmarks/simple_vqa_ceiling.py --settings one_shape_old_defaults one_shape_encoder_5e-5_head_1e-3
    python benchmarks/simple_vqa_ceiling.py --processes 12 --max_train_seconds 380 --settings ...   # side by side
    python benchmarks/simple_vqa_ceiling.py --collect     # results JSON, table and plot of OUT_DIR/runs only
    python benchmarks/simple_vqa_ceiling.py --docs        # docs/training.md's table from the results JSON only

Data: the fixtures of `FIXTURES`, made by `benchmarks/simple_vqa_fixture.py` into `OUT_DIR/fixtures` (one or 1-3
coloured shapes per image, 17 boxes, 192-dim raw 0..255 pooled-colour features in an LXMERT TSV converted to a store,
VQA v2 question / annotation files). Every answer is determined by the image, so a set's ceiling is an accuracy of
1.0. Each setting is the example's own `main()` with the flags of `SETTINGS` (written out in full, so that a setting
means the same whatever the example's defaults become); the example's evaluation (`vqa_accuracy` overall and per
answer type) runs every `--eval_every` steps (default: the fixture's) and at the end. Beside them: the prior of each
answer type (its most frequent training answer's accuracy on the evaluation questions: a model that ignores the image
reaches it) and the example's own-image vs shuffled-image gap. `--processes N` runs the settings in N processes of
this script side by side (on a GPU they share it); `--max_train_seconds` stops each training at a deadline.

Each run writes `OUT_DIR/runs/<setting>.json` at every evaluation (a run stopped early keeps its curve so far, marked
`"complete": false`) with its fixture, priors, machine and base model; the script then writes `--json` (default
`benchmarks/results/simple_vqa_ceiling.json`), the markdown table beside it (`.md`) and a plot (`.png`) from every
run found in `OUT_DIR/runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))

from example_scripts import load_example  # noqa: E402  (benchmarks/example_scripts.py)
import simple_vqa_fixture  # noqa: E402  (benchmarks/simple_vqa_fixture.py)
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)

from hf_vlalign.data.builders import vqa_v2  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "finetune_vqa.py"
RESULTS = ROOT / "benchmarks" / "results" / "simple_vqa_ceiling.json"
ANSWER_TYPES = {"yes_no": "yes/no", "other": "other", "number": "number"}
# the fixtures of `benchmarks/simple_vqa_fixture.py` (fixture seed 0) and how often their runs are evaluated
FIXTURES = {
    "three_shapes_200": {"train_images": 200, "val_images": 60, "max_shapes": 3, "eval_every": 44},
    "one_shape_600": {"train_images": 600, "val_images": 100, "max_shapes": 1, "eval_every": 28},
    "one_shape_2000": {"train_images": 2000, "val_images": 300, "max_shapes": 1, "eval_every": 188},
    "three_shapes_2000": {"train_images": 2000, "val_images": 300, "max_shapes": 3, "eval_every": 219},
}
DOCS_BEGIN = "<!-- benchmarks/simple_vqa_ceiling.py table: begin -->"
DOCS_END = "<!-- benchmarks/simple_vqa_ceiling.py table: end -->"
# each setting's fixture and flags, in full (so that a setting means the same whatever the example's defaults become)


def flags(
    epochs: int,
    learning_rate: str = "2e-4",
    head_learning_rate: str | None = None,
    *extra: str,
    warmup_steps: str = "20",
) -> list[str]:
    """The flags of a setting: batch 16, `learning_rate` for the copied text encoder and `head_learning_rate`
    (default: the same) for the newly initialised visual embeddings and answer head."""
    return ["--learning_rate", learning_rate, "--head_learning_rate", head_learning_rate or learning_rate,
            "--num_train_epochs", str(epochs), "--warmup_steps", warmup_steps, "--per_device_train_batch_size", "16",
            *extra]  # fmt: skip


OLD_DEFAULTS = flags(1)  # one rate of 2e-4 for every parameter, 1 epoch
TWO_STREAM = ("--model_family", "two_stream")
SETTINGS = {
    "old_defaults": ("three_shapes_200", OLD_DEFAULTS),
    "old_defaults_4_epochs": ("three_shapes_200", flags(4)),
    "head_lr_4_epochs": ("three_shapes_200", flags(4, "2e-4", "1e-3")),
    "old_defaults_10_epochs": ("three_shapes_200", flags(10)),
    "head_lr_10_epochs": ("three_shapes_200", flags(10, "2e-4", "1e-3")),
    "old_defaults_50_epochs": ("three_shapes_200", flags(50)),
    "encoder_5e-5_head_1e-3_50_epochs": ("three_shapes_200", flags(50, "5e-5", "1e-3")),
    "one_shape_600_old_defaults": ("one_shape_600", OLD_DEFAULTS),
    "one_shape_600_encoder_5e-5_head_1e-3": ("one_shape_600", flags(1, "5e-5", "1e-3")),
    "one_shape_600_encoder_5e-5_head_1e-3_10_epochs": ("one_shape_600", flags(10, "5e-5", "1e-3")),
    "one_shape_old_defaults": ("one_shape_2000", OLD_DEFAULTS),
    "one_shape_encoder_5e-5_head_1e-3": ("one_shape_2000", flags(1, "5e-5", "1e-3")),
    "one_shape_10_epochs": ("one_shape_2000", flags(10)),
    "one_shape_10_epochs_lr_5e-5": ("one_shape_2000", flags(10, "5e-5")),
    "one_shape_10_epochs_encoder_5e-5_head_1e-3": ("one_shape_2000", flags(10, "5e-5", "1e-3")),
    "one_shape_10_epochs_warmup_10pct": ("one_shape_2000", flags(10, warmup_steps="0.1")),
    "one_shape_10_epochs_two_stream": ("one_shape_2000", flags(10, "2e-4", None, *TWO_STREAM)),
    "one_shape_10_epochs_two_stream_encoder_5e-5_head_1e-3": (
        "one_shape_2000", flags(10, "5e-5", "1e-3", *TWO_STREAM)
    ),
    "three_shapes_old_defaults": ("three_shapes_2000", OLD_DEFAULTS),
    "three_shapes_10_epochs": ("three_shapes_2000", flags(10)),
    "three_shapes_10_epochs_encoder_5e-5_head_1e-3": ("three_shapes_2000", flags(10, "5e-5", "1e-3")),
    "three_shapes_10_epochs_two_stream": ("three_shapes_2000", flags(10, "2e-4", None, *TWO_STREAM)),
    "three_shapes_10_epochs_two_stream_encoder_5e-5_head_1e-3": (
        "three_shapes_2000", flags(10, "5e-5", "1e-3", *TWO_STREAM)
    ),
    # a default run (issue 53): no flag, the example's own evaluation cadence and stopping rule
    "one_shape_600_defaults": ("one_shape_600", []),
}
# the settings run as a user's default run is: without the script's `--eval_every` (the example's own cadence)
DEFAULT_RUNS = {"one_shape_600_defaults"}


def answer_type_priors(data_dir: Path) -> dict[str, float | None]:
    """Per answer type: the share of evaluation questions whose answer is that type's most frequent training answer
    (None for a type the fixture does not ask)."""
    train = json.loads((data_dir / vqa_v2.ANNOTATIONS_FILE["train"]).read_text())["annotations"]
    evaluation = json.loads((data_dir / vqa_v2.ANNOTATIONS_FILE["val"]).read_text())["annotations"]
    priors = {}
    for key, answer_type in ANSWER_TYPES.items():
        majority = Counter(a["multiple_choice_answer"] for a in train if a["answer_type"] == answer_type).most_common(1)
        answers = [a["multiple_choice_answer"] for a in evaluation if a["answer_type"] == answer_type]
        priors[key] = sum(answer == majority[0][0] for answer in answers) / len(answers) if answers else None
    return priors


def type_accuracies(metrics: dict, prefix: str) -> dict[str, float | None]:
    """`vqa_accuracy` overall and per answer type from the example's metrics (None for a type not asked)."""
    keys = {"vqa_accuracy": f"{prefix}vqa_accuracy", **{key: f"{prefix}vqa_accuracy_{key}" for key in ANSWER_TYPES}}
    return {name: None if metrics.get(key) is None else float(metrics[key]) for name, key in keys.items()}


def curve_point(entry: dict, step: int) -> dict:
    """One evaluation of a run (the metrics of `trainer.evaluate()`, prefixed `eval_`) as a point of its curve."""
    return {"step": step, "epoch": float(entry["epoch"]), **type_accuracies(entry, "eval_")}


def fixture_for(setting: str, out_dir: Path) -> simple_vqa_fixture.SimpleVQAFixture:
    """The setting's fixture under `OUT_DIR/fixtures/<name>`, generated once (settings run side by side share it)."""
    name = SETTINGS[setting][0]
    spec = FIXTURES[name]
    root = out_dir / "fixtures" / name
    if (root / "store").is_dir():
        return simple_vqa_fixture.SimpleVQAFixture(
            root, root / "vqa", root / "store", root / "features.tsv", spec["train_images"], spec["val_images"]
        )
    return simple_vqa_fixture.generate(
        root, num_train_images=spec["train_images"], num_val_images=spec["val_images"], max_shapes=spec["max_shapes"]
    )


def machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores"
    return f"{platform.machine()}, {os.cpu_count()} cores, no GPU"


def run_record(setting: str, fixture, seed: int, eval_every: int, base_model: str | None) -> dict:
    """What a run's results say about how it was made (its curve and final numbers are added to it)."""
    evaluation = json.loads((fixture.data_dir / vqa_v2.ANNOTATIONS_FILE["val"]).read_text())["annotations"]
    return {
        "setting": setting,
        "fixture": SETTINGS[setting][0],
        "flags": " ".join(SETTINGS[setting][1]),
        "eval_questions": len(evaluation),
        "priors": answer_type_priors(fixture.data_dir),
        "seed": seed,
        "eval_every": eval_every,
        "base_model": base_model or "the embedded MiniLM",
        "machine": machine(),
        "torch": torch.__version__,
    }


class StopAtDeadline(TrainerCallback):
    """Stops training once `seconds` have passed (the run then ends as usual: final evaluation, image-use check)."""

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.perf_counter() + seconds

    def on_step_end(self, args, state, control, **kwargs):
        if self.deadline is not None and time.perf_counter() > self.deadline:
            control.should_training_stop = True


def run(example, setting: str, out_dir: Path, seed: int, eval_every: int | None, max_train_seconds: float | None,
        base_model: str | None) -> dict:  # fmt: skip
    """One setting through the example's `main()`; its evaluations during training are read from the trainer, and
    written to `OUT_DIR/runs/<setting>.json` as they come (a run stopped early keeps its curve so far)."""
    fixture = fixture_for(setting, out_dir)
    own_cadence = setting in DEFAULT_RUNS
    eval_every = None if own_cadence else eval_every or FIXTURES[SETTINGS[setting][0]]["eval_every"]
    record = run_record(setting, fixture, seed, eval_every, base_model)
    path = out_dir / "runs" / f"{setting}.json"
    histories = []

    class PartialCurve(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            curve = [curve_point({**metrics, "epoch": state.epoch}, state.global_step)] if metrics else []
            previous = json.loads(path.read_text())["curve"] if path.exists() else []
            curve = previous + curve
            final = {key: value for key, value in curve[-1].items() if key not in ("step", "epoch")} if curve else None
            partial = {**record, "steps": state.global_step, "planned_steps": state.max_steps, "complete": False,
                       "curve": curve, "final": final, "image_use_accuracy_gap": None, "seconds": None}  # fmt: skip
            path.write_text(json.dumps(partial, indent=1))

    # the example's own trainer, not the recording subclass of an earlier setting (whose callback would record too)
    base = example.__dict__.setdefault("_example_task_trainer", example.TaskTrainer)

    class RecordingTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(PartialCurve())
            self.add_callback(StopAtDeadline(max_train_seconds))

        def train(self, *args, **kwargs):
            output = super().train(*args, **kwargs)
            histories.append((list(self.state.log_history), self.state.max_steps))
            return output

    example.TaskTrainer = RecordingTrainer
    path.unlink(missing_ok=True)
    argv = [
        "--dataset", "vqa_v2", "--data_dir", str(fixture.data_dir), "--features", str(fixture.store_dir),
        "--output_dir", str(out_dir / "models" / setting), "--report_to", "none", "--save_strategy", "no",
        "--disable_tqdm", "true", "--seed", str(seed),
        *([] if own_cadence else ["--eval_strategy", "steps", "--eval_steps", str(eval_every), "--logging_steps", str(eval_every)]),
        *SETTINGS[setting][1],
        *(["--model_name_or_path", base_model] if base_model else []),
    ]  # fmt: skip
    start = time.perf_counter()
    results = example.main(argv)
    seconds = time.perf_counter() - start
    history, planned_steps = histories[0]
    steps = max(entry["step"] for entry in history)
    curve = [curve_point(entry, entry["step"]) for entry in history if "eval_vqa_accuracy" in entry]
    return {
        **record,
        "steps": steps,
        "planned_steps": planned_steps,
        # a run ends complete at its planned steps or where its early-stopping rule stopped it (not at a deadline)
        "complete": steps >= planned_steps or stopped_early(out_dir / "models" / setting),
        "curve": curve,
        "final": type_accuracies(results, ""),
        "image_use_accuracy_gap": results["image_use"]["image_use_accuracy_gap"],
        "seconds": seconds,
    }


def stopped_early(output_dir: Path) -> bool:
    """Whether the run in `output_dir` ended by its early-stopping rule (its `learning_curve.json`)."""
    curve = output_dir / "learning_curve.json"
    return curve.is_file() and bool(json.loads(curve.read_text()).get("stopped_early"))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def shapes_per_image(spec: dict) -> str:
    return "one shape per image" if spec["max_shapes"] == 1 else f"1-{spec['max_shapes']} shapes per image"


def table(report: dict) -> str:
    """Per fixture: its priors, every run's curve, then each run's last evaluation."""
    lines = [
        "`python benchmarks/simple_vqa_ceiling.py` (fixtures of `benchmarks/simple_vqa_fixture.py`, fixture seed 0). "
        "Ceiling: 1.0 for every answer type. Prior: the accuracy of the type's most frequent training answer "
        "(a model that ignores the image). \"-\": the fixture asks no question of that type.",
    ]
    for name, spec in FIXTURES.items():
        runs = [entry for entry in report["runs"] if entry["fixture"] == name]
        if not runs:
            continue
        priors = runs[0]["priors"]
        lines += [
            "",
            f"### {name}: {spec['train_images']} train / {spec['val_images']} eval images, {shapes_per_image(spec)}, "
            f"{runs[0]['eval_questions']} eval questions",
            "",
            "Prior: " + ", ".join(f"{label} {_number(priors[key])}" for key, label in ANSWER_TYPES.items()) + ".",
            "",
            "| setting | step | epoch | VQA acc | yes/no | other | number |",
            "|---|---|---|---|---|---|---|",
        ]
        for entry in runs:
            for point in entry["curve"]:
                lines.append(
                    f"| {entry['setting']} | {point['step']} | {point['epoch']:.2f} | "
                    + " | ".join(_number(point[key]) for key in ["vqa_accuracy", *ANSWER_TYPES])
                    + " |"
                )
        lines += ["", "| setting | flags | machine | steps trained / planned | VQA acc | yes/no | other | number | "
                  "image-use gap | time |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for entry in runs:
            final = entry["final"]
            if final is None:
                continue
            stopped = "" if entry["complete"] else " (stopped)"
            gap = "-" if entry["image_use_accuracy_gap"] is None else f"{entry['image_use_accuracy_gap']:+.3f}"
            seconds = "-" if entry["seconds"] is None else f"{entry['seconds']:.0f} s"
            lines.append(
                f"| {entry['setting']} | `{entry['flags']}` | {entry['machine']} | {entry['steps']} / "
                f"{entry['planned_steps']}{stopped} | "
                + " | ".join(_number(final[key]) for key in ["vqa_accuracy", *ANSWER_TYPES])
                + f" | {gap} | {seconds} |"
            )
    return "\n".join(lines) + "\n"


PANEL_TITLES = {
    "vqa_accuracy": "all questions", "yes_no": "yes/no", "other": "other (colour, shape)", "number": "number"
}  # fmt: skip


EPOCH_MARKERS = {1: "o", 4: "s", 10: ".", 50: "^"}


def epoch_count(flags: str) -> int:
    return int(effective_flags(flags)["--num_train_epochs"])


# what a default run (`DEFAULT_RUNS`, no flag) trains with: the example's defaults of issue 53, up to 10 epochs with
# its stopping rule
EXAMPLE_DEFAULT_FLAGS = "--learning_rate 5e-5 --head_learning_rate 1e-3 --num_train_epochs 10 --warmup_steps 20"


def effective_flags(flags: str) -> dict[str, str]:
    """What a run's recorded flags set (a later flag overrides an earlier one; no `--head_learning_rate`: one rate
    for every parameter, the example's default when those runs were made; no flag: `EXAMPLE_DEFAULT_FLAGS`)."""
    words = (flags or EXAMPLE_DEFAULT_FLAGS).split()
    values = {words[index]: words[index + 1] for index in range(0, len(words), 2)}
    values.setdefault("--head_learning_rate", values["--learning_rate"])
    return values


def describe(flags: str) -> str:
    """A run's settings in words, e.g. "encoder 5e-05, new parts 0.001, 10 epochs"."""
    values = effective_flags(flags)
    words = [f"encoder {values['--learning_rate']}", f"new parts {values['--head_learning_rate']}",
             f"{values['--num_train_epochs']} epoch(s)"]  # fmt: skip
    if values.get("--warmup_steps", "20") != "20":
        words.append(f"warmup {values['--warmup_steps']}")
    if "--model_family" in values:
        words.append(values["--model_family"].replace("_", "-"))
    if not flags:
        words.append("the example's defaults: stops once accuracy has not improved for 2 epochs")
    return ", ".join(words)


def variant(flags: str) -> str:
    """A run's settings without its epoch count: runs of one variant share a colour in every panel."""
    return ", ".join(word for word in describe(flags).split(", ") if "epoch" not in word)


def plot(report: dict, path: Path) -> None:
    """One row of panels per fixture (accuracy vs optimizer step per answer type), one shared 0-1 scale; a variant of
    the flags has one colour throughout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixtures = [name for name in FIXTURES if any(entry["fixture"] == name for entry in report["runs"])]
    variants = list(dict.fromkeys(variant(entry["flags"]) for entry in report["runs"]))
    colours = {name: plt.get_cmap("tab10")(index % 10) for index, name in enumerate(variants)}
    figure, axes = plt.subplots(len(fixtures), 5, figsize=(22, 4.2 * len(fixtures)), sharey=True, squeeze=False)
    for row, name in zip(axes, fixtures):
        row, legend_axis = row[:4], row[4]  # the fifth column holds the row's legend
        runs = [entry for entry in report["runs"] if entry["fixture"] == name]
        for axis, key in zip(row, ["vqa_accuracy", *ANSWER_TYPES]):
            axis.set_title(f"{name}: {PANEL_TITLES[key]}", fontsize=10)
            axis.set_ylim(0, 1.05)
            if runs[0]["priors"].get(key, 0.0) is None:
                axis.text(0.5, 0.5, "no questions of this type", ha="center", transform=axis.transAxes, color="grey")
                axis.set_xticks([])
                continue
            for entry in runs:
                points = [point for point in entry["curve"] if point[key] is not None]
                label = entry["setting"] + ("" if entry["complete"] else " (stopped)")
                marker = EPOCH_MARKERS.get(epoch_count(entry["flags"]), ".")
                colour = colours[variant(entry["flags"])]
                style = "--" if entry["setting"] in DEFAULT_RUNS else "-"  # a default run: the same flags, dashed
                axis.plot([p["step"] for p in points], [p[key] for p in points], marker=marker, markersize=4,
                          color=colour, linestyle=style, label=label)  # fmt: skip
            axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ceiling (1.0)")
            if key in runs[0]["priors"]:
                prior = runs[0]["priors"][key]
                axis.axhline(prior, color="grey", linestyle=":", linewidth=1.5, label="prior (no image)")
            axis.set_xlabel("optimizer step (batches of 16)")
        row[0].set_ylabel("evaluation VQA accuracy (0-1)")
        handles, labels = row[1].get_legend_handles_labels()  # yes/no: every run, the ceiling and the prior
        legend_axis.axis("off")
        legend_axis.legend(handles, labels, fontsize=8, loc="center left", title=name, title_fontsize=9)
    figure.suptitle(
        "examples/finetune_vqa.py on the simple-shapes VQA v2 fixtures: evaluation accuracy vs step per answer type "
        "(seed 42; colour: the flags, marker: the epochs planned, dashed: a default run of the example)"
    )
    figure.tight_layout(rect=(0, 0, 1, 0.97))  # room for the title above the first row
    figure.savefig(path, dpi=80)
    plt.close(figure)


def docs_block(report: dict) -> str:
    """docs/training.md's table: every run's settings and its last evaluation beside each type's prior."""
    lines = [
        DOCS_BEGIN,
        "Seed 42, fixture seed 0; the learning curves are in `benchmarks/results/simple_vqa_ceiling.md` / `.png`; "
        "`python benchmarks/simple_vqa_ceiling.py --docs` rewrites this table from "
        f"`{RESULTS.relative_to(ROOT)}`. Ceiling 1.0 for every type; prior in brackets; \"-\": no such questions.",
        "",
        "| fixture | settings | machine | steps trained / planned | VQA acc | yes/no (prior) | other (prior) | "
        "number (prior) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["runs"]:
        final, priors = entry["final"], entry["priors"]
        cells = [_number(final["vqa_accuracy"])]
        for key in ANSWER_TYPES:
            cells.append("-" if priors[key] is None else f"{_number(final[key])} ({_number(priors[key])})")
        stopped = "" if entry["complete"] else " (stopped)"
        lines.append(
            f"| {entry['fixture']} | {describe(entry['flags'])} | {entry['machine']} | "
            f"{entry['steps']} / {entry['planned_steps']}{stopped} | " + " | ".join(cells) + " |"
        )
    return "\n".join([*lines, DOCS_END])


def collect(out_dir: Path, json_path: Path) -> dict:
    """The results JSON, its markdown table and plot, from every run in `OUT_DIR/runs`."""
    runs = [json.loads(path.read_text()) for path in sorted((out_dir / "runs").glob("*.json"))]
    order = list(SETTINGS)
    runs.sort(key=lambda entry: order.index(entry["setting"]) if entry["setting"] in order else len(order))
    report = {"runs": runs}
    write_results(json_path, report)
    json_path.with_suffix(".md").write_text(table(report))
    plot(report, json_path.with_suffix(".png"))
    return report


def run_side_by_side(settings: list[str], argv: list[str], processes: int, out_dir: Path) -> None:
    """Each setting in its own process of this script, `processes` at a time, sharing the CPU cores (and the GPU)."""
    for setting in settings:  # generate each fixture once, before the processes read it
        fixture_for(setting, out_dir)
    threads = str(max(1, (os.cpu_count() or 1) // processes))
    environment = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)

    def run_setting(setting: str) -> None:
        command = [sys.executable, __file__, *argv, "--settings", setting, "--no_collect"]
        with open(out_dir / "logs" / f"{setting}.log", "w") as log:
            completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
        print(f"{setting}: exit {completed.returncode}", flush=True)

    with ThreadPoolExecutor(processes) as pool:
        list(pool.map(run_setting, settings))


def setting_process_arguments(args: argparse.Namespace) -> list[str]:
    """The flags of each setting's own process: those of this one, less the settings and the process count."""
    argv = ["--out_dir", args.out_dir, "--seed", str(args.seed)]
    for flag in ("eval_every", "max_train_seconds", "model_name_or_path"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag}", str(getattr(args, flag))]
    return argv


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", default="outputs/simple_vqa_ceiling")
    parser.add_argument("--settings", nargs="*", default=[], choices=list(SETTINGS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--eval_every", type=int, default=None, help="evaluate every N optimizer steps (default: the fixture's)"
    )
    parser.add_argument("--max_train_seconds", type=float, default=None, help="stop each training after N seconds")
    parser.add_argument("--model_name_or_path", default=None, help="the base model (default: the example's, MiniLM)")
    parser.add_argument("--processes", type=int, default=1, help="settings run side by side, each in its own process")
    parser.add_argument("--json", default=str(RESULTS))
    parser.add_argument("--no_collect", action="store_true", help="run the settings, write no results file")
    parser.add_argument("--collect", action="store_true", help="run nothing: write the results of OUT_DIR/runs")
    parser.add_argument("--docs", action="store_true", help="run nothing: rewrite docs/training.md's table from --json")
    args = parser.parse_args(argv)
    if args.docs:
        report = json.loads(Path(args.json).read_text())
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))
        return report
    out_dir = Path(args.out_dir)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    settings = [] if args.collect else args.settings
    if args.processes > 1 and len(settings) > 1:
        run_side_by_side(settings, setting_process_arguments(args), args.processes, out_dir)
        settings = []
    example = load_example(EXAMPLE) if settings else None
    for setting in settings:
        entry = run(
            example, setting, out_dir, args.seed, args.eval_every, args.max_train_seconds, args.model_name_or_path
        )
        (out_dir / "runs" / f"{setting}.json").write_text(json.dumps(entry, indent=1))
        print(json.dumps({k: v for k, v in entry.items() if k != "curve"}), flush=True)
    return None if args.no_collect else collect(out_dir, Path(args.json))


if __name__ == "__main__":
    main()
