"""What a study declares (benchmarks/reproduce.py runs it): its settings (runs), metrics, paired comparisons and the
paper's claims, each claim with the mechanism diagnostics its verdict needs; and the flags the studies share.

A study of the second synthetic world is one file `benchmarks/studies/<study>_v2.py` defining `EXPERIMENT`
(reproduce.py loads every such file); its runs go to `results/<results_subdir>/`, beside its PLAN_v2.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    """One row of a table: an example script (or, with `verb`, an `hf-vlalign` verb run on another setting's model),
    its flags and the results file it writes (relative to --output_dir).

    `start_from` chains runs: the setting of the same experiment and seed whose model (`<its output_dir>/
    <start_from_subfolder>`) this one starts from, as `--model_name_or_path` of an example or the model argument of
    a verb. `extra_results` are further files of the output folder whose numbers (lists too) are kept, under
    `<file stem>.<key>`; with `keep`, only the numbers whose key starts with one of its prefixes are kept."""

    script: str = ""
    args: tuple[str, ...] = ()
    results_file: str = "eval_results.json"
    verb: str | None = None
    start_from: str | None = None
    start_from_subfolder: str = ""
    extra_results: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    derive: Callable[[dict[str, float]], dict[str, float]] | None = None  # more numbers, computed from those kept


@dataclass(frozen=True)
class Metric:
    key: str  # a (dotted) key of the run's eval_results.json
    label: str


@dataclass(frozen=True)
class Comparison:
    """`a - b`, per seed: (setting, metric key) on each side; the same setting on both sides compares two metrics of
    one run (e.g. accuracy - baseline). With `minus`, (a - b) - (minus.a - minus.b): whether a difference changes
    from one budget to another (e.g. gate - none at 8 epochs minus gate - none at 2)."""

    a: tuple[str, str]
    b: tuple[str, str]
    minus: Comparison | None = None

    @property
    def name(self) -> str:
        (setting_a, key_a), (setting_b, key_b) = self.a, self.b
        if key_a == key_b:
            name = f"{setting_a} - {setting_b}: {key_a}"
        elif setting_a == setting_b:
            name = f"{setting_a}: {key_a} - {key_b}"
        else:
            name = f"{setting_a}.{key_a} - {setting_b}.{key_b}"
        return name if self.minus is None else f"({name}) - ({self.minus.name})"

    def differences(self, runs: dict[str, dict[int, dict]]) -> dict[int, float]:
        """Per seed, over the seeds where every side has its metric."""
        values = {}
        for seed in set(runs.get(self.a[0], {})) & set(runs.get(self.b[0], {})):
            metrics_a, metrics_b = runs[self.a[0]][seed]["metrics"], runs[self.b[0]][seed]["metrics"]
            if self.a[1] in metrics_a and self.b[1] in metrics_b:
                values[seed] = metrics_a[self.a[1]] - metrics_b[self.b[1]]
        if self.minus is not None:
            other = self.minus.differences(runs)
            values = {seed: value - other[seed] for seed, value in values.items() if seed in other}
        return dict(sorted(values.items()))


@dataclass(frozen=True)
class Diagnostic:
    """A mechanism check of a claim: the mean over seeds of `key` in `setting`'s runs must be at least `threshold`
    (`above`) or at most it (not `above`) for the claim to be testable; the threshold is the study plan's."""

    setting: str
    key: str
    label: str
    threshold: float
    above: bool = True


@dataclass(frozen=True)
class Claim:
    """A paper's claim as a paired comparison whose mean should have `sign` (+1: a > b, -1: a < b); `min_effect` is
    the smallest difference (in the metric's units) that would count as the effect (see `claim_verdict`)."""

    statement: str
    comparison: Comparison
    sign: int = 1
    min_effect: float = 0.0
    # the mechanism the claim tests, seen to act: otherwise the verdict is "not testable here" (`claim_verdict`)
    diagnostics: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    settings: dict[str, Setting]
    metrics: tuple[Metric, ...]
    comparisons: tuple[Comparison, ...] = ()
    budgets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # extra flags per budget, for every setting
    claims: tuple[Claim, ...] = ()
    verb_budgets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the same, for the verb settings
    # settings of an earlier plan of a study, stopped when a new plan replaced it: their runs are kept and shown, and
    # neither run again nor counted in the current plan's seeds
    earlier_plan: tuple[str, ...] = ()
    # where the runs go under results/ at the miniature budget (default: the name), e.g. "fei_a2_fusions/v2"
    results_subdir: str | None = None

    def planned_settings(self) -> list[str]:
        return [setting for setting in self.settings if setting not in self.earlier_plan]


SMOKE_STEPS = ("--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1")

MINIATURE = "miniature"  # the studies' own budget: results in `results/<study>/`, beside the study's PLAN.md
# the tiny text checkpoint the studies' models start from (benchmarks/studies/tiny_text_model.py), made on first use
TINY_TEXT_MODEL = "{tiny_text_model}"
TINY_TEXT_MODEL_DIR = Path("outputs/studies/tiny_text_model")
TINY = ("--model_name_or_path", TINY_TEXT_MODEL)


def scenes_with_distractors(train_images: int, eval_images: int = 150) -> tuple[str, ...]:
    """Synthetic scenes whose every image holds a target with a same-kind and a same-colour distractor."""
    return (
        "--synthetic_distractors", "--synthetic_train_images", str(train_images), "--synthetic_eval_images",
        str(eval_images),
    )  # fmt: skip


WORLD_V2 = ("--synthetic_world", "v2")


def patch_vlm_claims(
    best: str, baseline: str, above_none: tuple[Diagnostic, ...] = (), above_baseline: tuple[Diagnostic, ...] = ()
) -> tuple[Claim, Claim]:
    """The mechanism checks' claims on a patch VLM (issue 50): with direct supervision the best head (`best`, a probe
    key of the `direct` and `none` runs) grounds far above the unsupervised model's and far above `baseline`, each
    with the diagnostics its verdict needs."""
    return (
        Claim(
            "direct supervision: the best head grounds phrases far above the unsupervised model's best head",
            Comparison(("direct", best), ("none", best)),
            min_effect=0.1,
            diagnostics=above_none,
        ),
        Claim(
            "direct supervision: the best head grounds phrases far above the centre baseline",
            Comparison(("direct", best), ("direct", baseline)),
            min_effect=0.1,
            diagnostics=above_baseline,
        ),
    )
