"""Issue 50's mechanism check, second plan (results/vlm_qwen2vl_mechanism/PLAN_v2.md): a tiny Qwen2-VL-style model
trained to caption the scenes on canvases of five sizes and aspects (dynamic resolution acts), four to six shapes per
scene, six epochs; direct supervision vs none, the probe, and Kang et al.'s localization heads with the paper's
smoothing kept as a share of the image. Each claim's verdict needs its mechanism seen to act (`Diagnostic`s).

    python benchmarks/reproduce.py --budget miniature --experiments vlm_qwen2vl_mechanism_v2
"""

from __future__ import annotations

from studies.mechanism_checks import mechanism_checks  # benchmarks/studies/mechanism_checks.py
from study_types import SMOKE_STEPS, Claim, Comparison, Diagnostic, Experiment, Metric, Setting, patch_vlm_claims

SYNTHETIC_CANVASES = "{synthetic_canvases}"  # benchmarks/studies/synthetic_canvases.py, made on first use
MODEL = ("--tiny_family", "qwen2_vl", "--tiny_patch_size", "8")
DATA = (
    "--train_file", f"{SYNTHETIC_CANVASES}/train.jsonl", "--validation_file", f"{SYNTHETIC_CANVASES}/val.jsonl",
    "--user_data_task", "caption",
)  # fmt: skip
TRAINING = ("--num_train_epochs", "6", "--learning_rate", "1e-3", "--eval_strategy", "no")
SUPERVISED_LAYER = "2"
# the paper's sigma of 1 cell on LLaVA-1.5's 24 x 24 grid is a 24th of the image side: a third of a 16-pixel token of
# the 128-pixel scene (PLAN_v2.md)
HEADS = (
    "--data_file", f"{SYNTHETIC_CANVASES}/refcoco_val.jsonl", "--selection_data_file",
    f"{SYNTHETIC_CANVASES}/refcoco_train.jsonl", "--selection_samples", "1000", "--batch_size", "16",
    "--smoothing_sigma", "0.3333",
)  # fmt: skip
HEADS_SCORES = ("accuracy", "centre_box_accuracy", "whole_image_accuracy", "gold_map_accuracy", "flat_maps", "num_examples")
PROBE = "grounding_probe"
BEST = f"{PROBE}.best_head_accuracy"
# PLAN_v2.md thresholds
SUPERVISION_DROP = 0.25  # relative drop of the direct loss over training
IMAGE_GAP = 0.02  # caption loss with another image minus with the own one (nats)
GOLD_MAP_CEILING = 0.30  # the grounding procedure's accuracy from the gold boxes' own tokens


def captioner(supervision: str) -> Setting:
    flags = () if supervision == "none" else ("--attention_supervision", supervision, "--supervised_layers", SUPERVISED_LAYER)
    return Setting("finetune_patch_vlm.py", (*MODEL, *DATA, *TRAINING, *flags), derive=mechanism_checks)


def localization_heads(model: str) -> Setting:
    return Setting(
        verb="localization-heads", args=HEADS, results_file="grounding_scores.json", start_from=model, keep=HEADS_SCORES
    )


SUPERVISION_ACTS = Diagnostic("direct", "diagnostics.attention_loss_relative_drop", "direct loss, relative drop", SUPERVISION_DROP)
READS_THE_IMAGE = tuple(
    Diagnostic(name, "diagnostics.caption.image_gap", f"{name}: caption loss, other - own image", IMAGE_GAP)
    for name in ("none", "direct")
)
CEILING = Diagnostic("direct_heads", "gold_map_accuracy", "grounding from the gold boxes' tokens", GOLD_MAP_CEILING)

EXPERIMENT = Experiment(
    name="vlm_qwen2vl_mechanism_v2",
    title="A tiny Qwen2-VL-style model on canvases of five sizes: direct supervision vs none, probe and localization "
    "heads (second plan)",
    settings={
        "none": captioner("none"),
        "direct": captioner("direct"),
        "none_heads": localization_heads("none"),
        "direct_heads": localization_heads("direct"),
    },
    metrics=(
        Metric(BEST, "probe: best active head"),
        Metric(f"{PROBE}.mean_head_accuracy", "probe: mean head"),
        Metric(f"{PROBE}.baseline_accuracy", "probe: centre baseline"),
        *(Metric(f"{PROBE}.best_head_of_layer.{layer}", f"best head of layer {layer}") for layer in range(4)),
        Metric("diagnostics.caption.image_gap", "caption loss, other - own image"),
        Metric("diagnostics.attention_loss_relative_drop", "direct loss, relative drop"),
        Metric("accuracy", "localization heads: acc. at IoU 0.5"),
        Metric("gold_map_accuracy", "from the gold boxes' tokens"),
        Metric("centre_box_accuracy", "centre box"),
        Metric("whole_image_accuracy", "whole image"),
    ),
    claims=(
        *patch_vlm_claims(
            BEST, f"{PROBE}.baseline_accuracy", above_none=(SUPERVISION_ACTS, *READS_THE_IMAGE),
            above_baseline=(SUPERVISION_ACTS, READS_THE_IMAGE[1]),
        ),  # fmt: skip
        Claim(
            "the supervised model's localization heads ground referring expressions above the unsupervised model's",
            Comparison(("direct_heads", "accuracy"), ("none_heads", "accuracy")),
            min_effect=0.05,
            diagnostics=(SUPERVISION_ACTS, CEILING),
        ),
    ),
    budgets={"miniature": (), "smoke": (*SMOKE_STEPS, "--tiny_layers", "3", "--max_train_samples", "16", "--max_eval_samples", "8")},
    verb_budgets={"smoke": ("--selection_samples", "8")},
    results_subdir="vlm_qwen2vl_mechanism/v2",
)
