"""Ilinykh's Analyses I-IV as the slides state them, on the captioner in world v2 (results/ilinykh_captioner_attention/
PLAN_v2.md): effect sizes computed by the library (the captioner's paper_results.json), each claim with the mechanism
diagnostics its verdict needs."""

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

SETTING = "geometry"
LAYERS = 3  # encoder and decoder layers: "first" is layer 0, "last" layer 2
CAPTIONER = (
    *TINY, "--d_model", "128", "--attention_heads", "4", "--encoder_layers", str(LAYERS), "--decoder_layers",
    str(LAYERS), *scenes_with_distractors(800), "--learning_rate", "1e-3", "--encoder_learning_rate", "5e-4",
    "--num_train_epochs", "4", "--alignment", "none", *WORLD_V2,
)  # fmt: skip

THEME = "paper_results.within_theme_attention.per_layer"
DISTANCE = "paper_results.attention_distance_effect.per_layer"
ENTROPY = "paper_results.attention_entropy_per_layer.region_to_region"
GROUNDED = "paper_results.grounded_word_attention.per_layer"
IMAGE_GAIN = "diagnostics.caption.image_gain"
LAST = LAYERS - 1


def caption_image_gain(metrics: dict[str, float]) -> dict[str, float]:
    """The captioner's image use: its score with the own image - with another image's regions (minus losses)."""
    image, text_only = "diagnostics.caption.image_score", "diagnostics.caption.text_only_score"
    return {IMAGE_GAIN: metrics[image] - metrics[text_only]} if image in metrics and text_only in metrics else {}


def in_layers(key: str, field: str, label: str) -> tuple[Metric, ...]:
    return tuple(Metric(f"{key}.{layer}.{field}", f"{label}, layer {layer}") for layer in range(LAYERS))


def depth(key: str, field: str) -> Comparison:
    """Last - first layer of a per-layer value, per seed."""
    return Comparison((SETTING, f"{key}.{LAST}.{field}"), (SETTING, f"{key}.0.{field}"))


USES_IMAGE = Diagnostic(SETTING, IMAGE_GAIN, "caption image gain (own - other image, nats/token)", 0.1)
USES_BOXES = Diagnostic(
    SETTING, "diagnostics.geometry.loss_change_boxes_shuffled", "caption loss change, boxes shuffled (nats/token)", 0.02
)
THEMATIC_ROWS = Diagnostic(SETTING, f"{THEME}.0.num_rows", "thematic query rows (layer 0)", 1000)
GROUNDED_WORDS = Diagnostic(SETTING, f"{GROUNDED}.0.num_words", "grounded words", 500)

EXPERIMENT = Experiment(
    name="ilinykh_captioner_attention_v2",
    title="Ilinykh in miniature, world v2: Analyses I-IV of the captioner's attention by layer, as the slides state them",
    settings={
        SETTING: Setting(
            "train_captioning.py", CAPTIONER, extra_results=("paper_results.json",), derive=caption_image_gain
        ),
    },
    metrics=(
        Metric("cider", "CIDEr-D"),
        Metric("bleu_4", "BLEU-4"),
        *in_layers(THEME, "effect", "within-theme share - chance"),
        *in_layers(DISTANCE, "effect", "attention-weighted - uniform box distance"),
        *in_layers(ENTROPY, "normalised_entropy", "normalised entropy"),
        *in_layers(GROUNDED, "effect", "grounded word's share on its object - chance (decoder)"),
        Metric(IMAGE_GAIN, "caption image gain (nats/token)"),
        Metric("diagnostics.geometry.loss_change_boxes_shuffled", "loss change, boxes shuffled"),
        Metric("diagnostics.geometry.loss_change_boxes_zeroed", "loss change, boxes zeroed"),
    ),
    claims=(
        Claim(
            "I.a earlier layers attend within thematic categories: layer 0 within-theme share above chance",
            Comparison((SETTING, f"{THEME}.0.within"), (SETTING, f"{THEME}.0.uniform_within")),
            min_effect=0.02,
            diagnostics=(USES_IMAGE, THEMATIC_ROWS),
        ),
        Claim(
            "I.b deeper layers look beyond thematic categories: within-theme share - chance, last - first layer",
            depth(THEME, "effect"),
            sign=-1,
            min_effect=0.02,
            diagnostics=(USES_IMAGE, THEMATIC_ROWS),
        ),
        Claim(
            "II.a local relations are captured in the first layer: its attention-weighted box distance below uniform",
            Comparison((SETTING, f"{DISTANCE}.0.attention_weighted_distance"), (SETTING, f"{DISTANCE}.0.uniform_distance")),
            sign=-1,
            min_effect=0.01,
            diagnostics=(USES_IMAGE, USES_BOXES),
        ),
        Claim(
            "II.b deeper layers attend between more distant objects: attention-weighted distance, last - first layer",
            depth(DISTANCE, "attention_weighted_distance"),
            min_effect=0.01,
            diagnostics=(USES_IMAGE, USES_BOXES),
        ),
        Claim(
            "III attention converges to fewer objects in deeper layers: normalised entropy, last - first layer",
            depth(ENTROPY, "normalised_entropy"),
            sign=-1,
            min_effect=0.02,
            diagnostics=(USES_IMAGE,),
        ),
        Claim(
            "IV deeper layers mirror noun-phrase / object pairings: a grounded word's cross-attention share on its "
            "object - chance, last - first decoder layer",
            depth(GROUNDED, "effect"),
            min_effect=0.02,
            diagnostics=(USES_IMAGE, GROUNDED_WORDS),
        ),
    ),
    budgets={
        MINIATURE: (),
        "smoke": (*scenes_with_distractors(12, 6), "--image_use_examples", "8", *SMOKE_STEPS),
    },
    results_subdir="ilinykh_captioner_attention/v2",
)
