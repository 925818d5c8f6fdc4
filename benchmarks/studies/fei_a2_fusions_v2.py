"""Fei et al. (A2) in the second synthetic world, with A2 seen to act: each fusion against none, the claims as the
paper's text states them, each with the A2 diagnostics its verdict needs (results/fei_a2_fusions/PLAN_v2.md; the
pilots that chose the A2 flags: results/fei_a2_fusions/PILOTS_v2.md).

    python benchmarks/reproduce.py --budget miniature --experiments fei_a2_fusions_v2
"""

from __future__ import annotations

from study_types import (
    MINIATURE,
    SMOKE_STEPS,
    TINY,
    WORLD_V2,
    Claim,
    Comparison,
    Diagnostic,
    Experiment,
    Metric,
    Setting,
    scenes_with_distractors,
)

FUSIONS = ("max", "moving_average", "exp_decay", "gate")
# the v1 study's captioner (PLAN.md), 800 training / 150 test scenes with distractors, on world v2, trained 8 epochs
# (PLAN_v2.md amendment 5: A2 acts at 8 epochs in world v2, pilot P9; at 4 it did not, P7)
CAPTIONER = (
    *TINY, "--d_model", "128", "--attention_heads", "4", "--encoder_layers", "3", "--decoder_layers", "3",
    *scenes_with_distractors(800), *WORLD_V2, "--learning_rate", "1e-3", "--encoder_learning_rate", "5e-4",
    "--num_train_epochs", "8",
)  # fmt: skip
# the A2 flags of every fusion, chosen by the pilots (PLAN_v2.md amendment 3, PILOTS_v2.md: P7): a mask that scores
# regions by content, learning at 0.05, and lambda = 0 (a deviation from eq. 4: any penalty tried, 0.001 to 0.1, kept
# m at 1 on every caption step)
A2_FLAGS = ("--alignment_mask_input", "query_and_regions", "--mask_weight", "0", "--mask_learning_rate", "0.05")
# PLAN_v2.md: A2 acts when the mask tells regions apart and the most attended region changes
MASK_STD_THRESHOLD = 0.1
ARGMAX_CHANGE_THRESHOLD = 0.05


def captioner(alignment: str) -> Setting:
    flags = () if alignment == "none" else A2_FLAGS
    args = (*CAPTIONER, "--alignment", alignment, *flags)
    return Setting("train_captioning.py", args, extra_results=("paper_results.json",))


def a2_acts(setting: str) -> tuple[Diagnostic, ...]:
    """The plan's two A2 diagnostics of `setting`."""
    return (
        Diagnostic(setting, "diagnostics.a2.mask_std_across_regions", "mask std across regions", MASK_STD_THRESHOLD),
        Diagnostic(setting, "diagnostics.a2.argmax_change_share", "most attended region changed", ARGMAX_CHANGE_THRESHOLD),
    )


EXPERIMENT = Experiment(
    name="fei_a2_fusions_v2",
    title="Fei et al. in the second world: each A2 fusion against none, with A2 seen to act",
    settings={name: captioner(name) for name in ("none", *FUSIONS)},
    metrics=(
        Metric("cider", "CIDEr-D"),
        Metric("alignment", "grounding (last layer, heads summed)"),
        Metric("attention_importance_kendall_tau", "Kendall tau, attention vs importance"),
        Metric("diagnostics.a2.mask_std_across_regions", "A2 mask std across regions"),
        Metric("diagnostics.a2.argmax_change_share", "A2: most attended region changed"),
        Metric("diagnostics.a2.attention_change_l1", "A2: aligned vs raw attention (L1)"),
        Metric("diagnostics.a2.caption_loss_change_zero_mask", "A2: caption loss change under m = 0"),
        Metric("diagnostics.a2.head_diversity", "A2: head diversity"),
    ),
    comparisons=tuple(Comparison((name, "cider"), ("none", "cider")) for name in FUSIONS),
    claims=(
        *(
            Claim(
                f"the {name} fusion gives a higher CIDEr-D than no alignment (abstract)",
                Comparison((name, "cider"), ("none", "cider")),
                min_effect=0.01,
                diagnostics=a2_acts(name),
            )
            for name in FUSIONS
        ),
        Claim(
            "with the gate, words attend their region more often than without alignment (abstract; grounding)",
            Comparison(("gate", "alignment"), ("none", "alignment")),
            min_effect=0.02,
            diagnostics=a2_acts("gate"),
        ),
        Claim(
            "library's hypothesis (Figure 2): the gate's attention ranks regions by importance better than none's",
            Comparison(("gate", "attention_importance_kendall_tau"), ("none", "attention_importance_kendall_tau")),
            min_effect=0.02,
            diagnostics=a2_acts("gate"),
        ),
    ),
    budgets={
        MINIATURE: (),
        "smoke": (
            *scenes_with_distractors(12, 6), "--image_use_examples", "8", *SMOKE_STEPS, "--encoder_layers", "1",
            "--decoder_layers", "1",
        ),
    },  # fmt: skip
    results_subdir="fei_a2_fusions/v2",
)
