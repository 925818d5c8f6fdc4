#!/usr/bin/env python
"""Train a region captioner with geometry-aware encoder attention and A2 attention alignment (Ilinykh; Fei), on the
COCO Karpathy splits with region features, or offline on the synthetic scenes.

    accelerate launch examples/train_captioning.py                          # offline: synthetic captions, A2 "gate"
    accelerate launch examples/train_captioning.py --alignment none --no-geometry --output_dir outputs/cap_ablation
    accelerate launch examples/train_captioning.py --scst_start_epoch 3 --num_train_epochs 4   # + self-critical
    # the headline experiments: Karpathy's dataset_coco.json + a RegionFeatureStore (hf-vlalign convert-features of
    # the BUTD hdf5 or M2 coco_detections.hdf5 features)
    accelerate launch examples/train_captioning.py --config examples/configs/ilinykh.yaml \
        --karpathy_json dataset_coco.json --features STORE --output_dir outputs/ilinykh
    accelerate launch examples/train_captioning.py --config examples/configs/fei_a2.yaml \
        --karpathy_json dataset_coco.json --features STORE --a2_fusions none,max,moving_average,exp_decay,gate
    # your own photos: `caption` rows of the user-data format (the rows of one image are its references)
    accelerate launch examples/train_captioning.py --train_file captions.jsonl --validation_file val.jsonl

Writes to --output_dir: safetensors weights, config, tokenizer, eval_results.json (`bleu_4`, `cider`, `meteor`,
`rouge_l` on the test split (Karpathy "test" by default); on the synthetic scenes (and your own captions whose
evaluation rows give `phrases`) also `alignment`: Li et al.'s grounding accuracy of the decoder's cross-attention
teacher-forced on the test captions, last decoder layer, heads summed (COCO captions carry no phrase boxes);
`test_loss` and `test_loss_other_images`: the caption loss per token with
each caption's own image and with another image, whose gap is how much the captioner uses the image, also under
`image_use` with every example's keys), paper_results.json (the papers' tables under their names: "BLEU-1".."BLEU-4",
"METEOR", "ROUGE-L", "CIDEr" (CIDEr-D, as the COCO server), "SPICE" where it can run (else "SPICE_skipped" says why); "attention_entropy_per_layer": Ilinykh's
Analysis III, the mean normalised entropy of each layer of the encoder self-attention ("region_to_region"), decoder
self-attention ("word_to_word") and cross-attention ("decoder_cross"), teacher-forced on test captions;
"attention_vs_distance": Analysis II, the encoder's region->region attention per layer in bins of box-centre distance,
with its Pearson correlation per layer; "within_cluster_attention": Analysis I, the share of the encoder's
region->region attention that stays within the query region's spatial cluster of boxes, per layer; Ilinykh's effect
sizes per layer with their last - first layer `depth_change`: "attention_distance_effect" (attention-weighted minus
uniform mean box distance), "attention_entropy_depth_change", "within_theme_attention" (Analysis I: the share within
the thematic group of the object kinds minus chance, synthetic scenes) and "grounded_word_attention" (Analysis IV: a
grounded word's decoder cross-attention share on its object's regions minus chance);
"attention_importance_kendall_tau": Fei's Figure 2, per decoder layer the mean Kendall tau between the cross-attention
the decoder used and the gradient importance of the regions for each caption word, whose mean over layers is
eval_results.json's `attention_importance_kendall_tau`); with an A2 fusion, eval_results.json's `diagnostics.a2`
(whether A2 acts: `hf_vlalign.supervision.perturbation.A2Diagnostics`),
attention_entropy.png, attention_vs_distance.png, within_cluster_attention.png and within_theme_attention.png (those
analyses),
samples.json (generated captions with their references), attention_alignment.png (the top-1 attended region of every
generated word before and after alignment, the A2 paper's Figure 1) and README.md (the model card).

`--a2_fusions none,max,...` trains one captioner per A2 fusion (each in `<output_dir>/<fusion>`, the data read once) and
writes a2_comparison.json and a2_comparison.md: the caption metrics of every fusion side by side (Fei, Table 2).

Every transformers `TrainingArguments` flag works too (--seed, --push_to_hub, --lr_scheduler_type inverse_sqrt, ...),
and those of `CaptioningTrainingArguments` (--encoder_learning_rate, --mask_update_every, --scst_start_epoch,
--scst_learning_rate, --scst_max_new_tokens, ...).
"""

from __future__ import annotations

import copy
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, set_seed

from hf_vlalign import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration
from hf_vlalign.analysis.adapters import attention_blocks
from hf_vlalign.analysis.attention_plots import plot_word_region_heatmaps
from hf_vlalign.analysis.entropy import AttentionEntropy, plot_entropy
from hf_vlalign.analysis.geometry import (
    AttentionDistance,
    GroundedWordAttention,
    WithinClusterAttention,
    depth_change,
    plot_attention_vs_distance,
    plot_within_cluster,
    region_clusters,
    thematic_clusters,
)
from hf_vlalign.analysis.importance import captioner_attention_importance
from hf_vlalign.data import CaptioningCollator, RegionFeatureStore, build_dataset, group_captions_by_image
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators.regions import store_image_id
from hf_vlalign.evaluation import evaluate_decoder_grounding
from hf_vlalign.evaluation.baselines import compare_with_baselines, grounding_probe_baselines
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.inference import inference_batches
from hf_vlalign.evaluation.tasks import generate_captions
from hf_vlalign.hub.model_card import metrics_from_eval_results, render_model_card
from hf_vlalign.metrics.captioning import caption_scores, spice_unavailable_reason
from hf_vlalign.models.captioning.configuration_captioning import ALIGNMENT_FUSIONS
from hf_vlalign.recipes import (
    DEFAULT_BASE_MODEL,
    IMAGE_USE_EXAMPLES,
    MixedPrecisionArguments,
    UserDataArguments,
    build_processor,
    evaluation_subset,
    first_rows,
    from_checkpoint_or_text,
    image_use_results,
    load_tokenizer,
    load_user_splits,
    parse_indices,
    parse_recipe_args,
    save_model,
    SYNTHETIC_WORLD_HELP,
    synthetic_scene_config,
    take_push_to_hub,
    trained_amount,
    truncation_results,
    write_json,
    write_results,
)
from hf_vlalign.supervision.perturbation import A2Diagnostics
from hf_vlalign.synthetic.shapes import SHAPE_NAMES, THEME_OF_KIND, THEMATIC_GROUPS
from hf_vlalign.trainers import CaptioningTrainer, CaptioningTrainingArguments
from hf_vlalign.trainers.captioning import CAPTION_NON_MODEL_KEYS
from hf_vlalign.utils.size_limits import MAX_NEW_TOKENS, MAX_NUM_BEAMS, check_size
from hf_vlalign.utils.user_errors import run_command

# Ilinykh's Analysis I: the thematic group of each shape kind (the synthetic detector's classes index SHAPE_NAMES)
SHAPE_THEMES = [sorted(THEMATIC_GROUPS).index(THEME_OF_KIND[kind]) for kind in SHAPE_NAMES]

# the papers' names of the caption metrics (the COCO caption evaluation's), keyed by `caption_scores`' names
PAPER_METRIC_NAMES = {
    "bleu_1": "BLEU-1", "bleu_2": "BLEU-2", "bleu_3": "BLEU-3", "bleu_4": "BLEU-4", "meteor": "METEOR",
    "rouge_l": "ROUGE-L", "cider": "CIDEr", "spice": "SPICE",
}  # fmt: skip


@dataclass
class CaptioningArguments(UserDataArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "BERT-family checkpoint for the word embeddings, or a captioner checkpoint."}
    )
    karpathy_json: str | None = field(
        default=None,
        metadata={"help": "Karpathy's dataset_coco.json (or its folder): train and evaluate on the COCO Karpathy "
                  "splits (default: the synthetic scenes). Needs --features."},
    )  # fmt: skip
    features: str | None = field(
        default=None,
        metadata={"help": "RegionFeatureStore folder of the COCO images (hf-vlalign convert-features of the BUTD hdf5 "
                  "or M2 coco_detections.hdf5 features)."},
    )  # fmt: skip
    train_split: str = field(default="train", metadata={"help": "Karpathy split to train on (train = train + restval)."})
    eval_split: str = field(default="test", metadata={"help": "Karpathy split of the final evaluation (val | test)."})
    restval_in_train: bool = field(default=True, metadata={"help": "the 'train' split includes 'restval' (113,287 images)."})
    on_missing_image: str = field(
        default="raise", metadata={"help": "a caption whose image is not in --features: raise | skip (counted, warned)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "keep the first N training captions."})
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "keep the first N evaluation images (a captioner is scored per image, on its references)."},
    )
    alignment: str = field(default="gate", metadata={"help": f"A2 fusion: {' | '.join(ALIGNMENT_FUSIONS)}."})
    a2_fusions: str | None = field(
        default=None,
        metadata={"help": "comma-separated A2 fusions (e.g. none,max,moving_average,exp_decay,gate): one run each in "
                  "<output_dir>/<fusion>, then a2_comparison.json / .md (overrides --alignment)."},
    )  # fmt: skip
    alignment_eta: float | None = field(default=None, metadata={"help": "eta of the moving-average fusion (eq. 7)."})
    # A2's readings, the captioner config's fields of the same names (default: the config's, the printed forms)
    alignment_moving_average: str | None = field(
        default=None, metadata={"help": "eq. 7: additive (printed: a + eta a_m) | convex ((1 - eta) a + eta a_m)."}
    )
    alignment_mask_input: str | None = field(
        default=None, metadata={"help": "eq. 2: query (printed: sigmoid(W_m h_t + b_m)) | query_and_regions."}
    )
    alignment_mask_regions: int | None = field(
        default=None, metadata={"help": "region slots N of the 'query' mask network (at least the most regions an image has)."}
    )
    geometry: bool = field(default=True, metadata={"help": "geometry-aware encoder attention (--no_geometry: ablation)."})
    aligned_layers: str | None = field(default=None, metadata={"help": "comma-separated decoder layers (default all)."})
    d_model: int | None = field(
        default=None,
        metadata={"help": "hidden size; when set, the word embeddings are learnt from scratch over the tokenizer's "
                  "vocabulary (as the Object Relation Transformer does) instead of copied from the text checkpoint."},
    )  # fmt: skip
    ffn_dim: int | None = field(default=None, metadata={"help": "feed-forward size (default 4 * d_model)."})
    encoder_layers: int = field(default=3)
    decoder_layers: int = field(default=3)
    attention_heads: int = field(default=8)
    normalize_before: bool = field(default=False, metadata={"help": "pre-norm layers instead of post-norm."})
    mask_weight: float = field(default=0.1, metadata={"help": "lambda of the mask objective (eq. 4)."})
    alignment_temperature: float | None = field(
        default=None,
        metadata={"help": "T_P of the exponential decay (eq. 8, in steps); default: the config's 1000 (the paper gives "
                  "no value)."},
    )  # fmt: skip
    max_new_tokens: int = field(default=20, metadata={"help": "length of the captions generated for the evaluation."})
    num_beams: int = field(default=1)
    spice: bool | None = field(
        default=None,
        metadata={"help": "SPICE too (needs java and Stanford CoreNLP 3.6.0 in pycocoevalcap): default where it can run "
                  "(else paper_results.json says why not), --spice true requires it, --spice false skips it."},
    )  # fmt: skip
    analysis_examples: int | None = field(
        default=1000,
        metadata={"help": "test captions (a seeded sample) of the entropy and attention-vs-distance analyses (None: all)."},
    )
    distance_bins: int = field(default=10, metadata={"help": "bins of box-centre distance over [0, sqrt(2)]."})
    importance_examples: int | None = field(
        default=200,
        metadata={"help": "test captions (a seeded sample) of the attention vs gradient-importance Kendall tau (A2, "
                  "Figure 2; one backward pass per caption position and batch) (None: all)."},
    )  # fmt: skip
    synthetic_seed: int = field(default=0)
    synthetic_train_images: int = field(default=800)
    synthetic_distractors: bool = field(
        default=False,
        metadata={"help": "each synthetic scene's first shape gets a same-kind and a same-colour distractor."},
    )
    synthetic_world: str = field(default="v1", metadata={"help": SYNTHETIC_WORLD_HELP})
    synthetic_eval_images: int = field(default=150)
    max_text_length: int = field(default=24)
    image_use_examples: int | None = field(
        default=IMAGE_USE_EXAMPLES,
        metadata={"help": "test captions of the own-image vs shuffled-image check (`image_use` in eval_results.json)."},
    )
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "if set, every dropout probability of the model (hidden and attention); default: the checkpoint's "
            "(0.1 from a text checkpoint). 0.0 makes training deterministic across process counts."
        },
    )


def parse_args(argv: list[str]) -> tuple[CaptioningArguments, CaptioningTrainingArguments]:
    args, _, training_args = parse_recipe_args(
        argv,
        (CaptioningArguments, MixedPrecisionArguments),
        CaptioningTrainingArguments,
        data_source_flags=("karpathy_json", "restval_in_train", "on_missing_image"),  # refused with --train_file
        output_dir="outputs/captioning",
        # at the decoder's rate the region encoder's outputs collapse (CaptioningTrainingArguments.encoder_learning_rate)
        encoder_learning_rate=1.5e-4,
        num_train_epochs=2,
        learning_rate=5e-4,
        warmup_steps=50,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        eval_strategy="no",
        save_strategy="no",
        logging_steps=50,
    )
    check_args(args)
    return args, training_args


def check_args(args: CaptioningArguments) -> None:
    if (args.karpathy_json is None) != (args.features is None):
        raise ValueError(
            "`--karpathy_json` and `--features` go together (the captions and their images' regions), got "
            f"--karpathy_json {args.karpathy_json!r} and --features {args.features!r}."
        )
    if args.alignment not in ALIGNMENT_FUSIONS:
        raise ValueError(f"`--alignment` must be one of {ALIGNMENT_FUSIONS}, got {args.alignment!r}.")
    for fusion in fusions(args):
        if fusion not in ALIGNMENT_FUSIONS:
            raise ValueError(f"`--a2_fusions` must name fusions from {ALIGNMENT_FUSIONS}, got {fusion!r}.")
    check_size("--num_beams", args.num_beams, MAX_NUM_BEAMS, limit_name="MAX_NUM_BEAMS")  # before training starts
    check_size("--max_new_tokens", args.max_new_tokens, MAX_NEW_TOKENS, limit_name="MAX_NEW_TOKENS")


def fusions(args: CaptioningArguments) -> list[str]:
    """The fusions of `--a2_fusions`, in order, or [] for a single run (unset or "", e.g. `--a2_fusions ""` over a
    config file that sets it)."""
    if not args.a2_fusions:
        return []
    names = [name.strip() for name in args.a2_fusions.split(",") if name.strip()]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`--a2_fusions` must be a comma-separated list of distinct fusions, got {args.a2_fusions!r}.")
    return names


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CaptionData:
    train: object  # one row per training caption, with its image's `references`
    test: object  # one row per test caption (teacher-forced analyses, image-use check)
    images: list[dict]  # per test image: {"image_id": its store id, "references": its captions}
    store: RegionFeatureStore
    text_column: str  # the caption column of `train` and `test`
    description: str  # what the data is, for the model card
    grounded: bool = False  # the test captions give phrase boxes (the decoder's grounding accuracy is measured)
    region_options: dict | None = None  # `--train_file`: the `extract_region_features` options of its features


def load_data(args: CaptioningArguments, training_args: CaptioningTrainingArguments | None = None) -> CaptionData:
    """The training captions (each with its image's references, which self-critical training's CIDEr-D rewards read),
    the test captions and test images, from your own `--train_file` (which needs `training_args`), the COCO Karpathy
    splits or the synthetic scenes."""
    if args.train_file is not None:
        return load_user_captions(args, training_args)
    if args.karpathy_json is not None:
        return load_karpathy(args)
    config = synthetic_scene_config(args)
    store = synthetic_region_features(config=config)
    train = build_dataset("synthetic_scenes", None, "train", task="captions", config=config)
    test = build_dataset("synthetic_scenes", None, "val", task="captions", config=config)
    train = with_references(first_rows(train, args.max_train_samples), "sentence")
    test, images = first_test_images(test, "sentence", args.max_eval_samples)
    return CaptionData(train, test, images, store, "sentence", "synthetic captioned scenes", grounded=True)


def first_test_images(test, text_column: str, count: int | None) -> tuple[object, list[dict]]:
    """(the caption rows of the first `count` test images, those images with their references) for
    `--max_eval_samples` (all for None)."""
    grouped = list(group_captions_by_image(test, text_column).items())[:count]
    kept = {image_id for image_id, _ in grouped}
    if len(kept) < len(set(test["image_id"])):
        test = test.filter(lambda row: row["image_id"] in kept)
    return test, [{"image_id": image_id, "references": captions} for image_id, captions in grouped]


def load_user_captions(args: CaptioningArguments, training_args: CaptioningTrainingArguments) -> CaptionData:
    """The `caption` rows of `--train_file` / `--validation_file`: the rows of one image are its references."""
    user = load_user_splits(args, "caption", training_args)
    train = first_rows(user.train, args.max_train_samples)
    test, images = first_test_images(user.eval, "caption", args.max_eval_samples)
    grounded = any(spans for spans in test["caption_phrase_spans"])
    return CaptionData(
        with_references(train, "caption"), test, images, user.store, "caption", user.source, grounded,
        user.region_options,
    )  # fmt: skip


def load_karpathy(args: CaptioningArguments) -> CaptionData:
    """Karpathy's dataset_coco.json joined to the region features of `--features` (`build_dataset("coco_captions")`)."""
    store = RegionFeatureStore.load(args.features)
    options = {"restval_in_train": args.restval_in_train, "on_missing_image": args.on_missing_image}
    train = build_dataset("coco_captions", args.karpathy_json, args.train_split, store, **options)
    if args.max_train_samples is not None and args.max_train_samples < len(train):
        train = train.select(range(args.max_train_samples))
    train = with_references(train, "caption")
    per_image = build_dataset("coco_captions", args.karpathy_json, args.eval_split, store, per_image=True, **options)
    if args.max_eval_samples is not None and args.max_eval_samples < len(per_image):
        per_image = per_image.select(range(args.max_eval_samples))
    test = build_dataset("coco_captions", args.karpathy_json, args.eval_split, store, **options)
    kept = set(per_image["image_id"])
    test = test.filter(lambda row: row["image_id"] in kept)
    # each image under the id the store names it by (a COCO id may be stored as "COCO_val2014_<id:012d>")
    images = [{"image_id": store_image_id(store, row), "references": row["captions"]} for row in per_image]
    description = f"COCO captions, Karpathy splits ({args.train_split} -> {args.eval_split}), features {args.features}"
    return CaptionData(train, test, images, store, "caption", description)


def with_references(dataset, text_column: str):
    """`dataset` with a `references` column: every caption of the row's image."""
    references: dict[str, list[str]] = {}
    for image_id, caption in zip(dataset["image_id"], dataset[text_column]):
        references.setdefault(image_id, []).append(caption)
    return dataset.map(lambda row: {"references": references[row["image_id"]]})


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


def load_model(
    args: CaptioningArguments, visual_feat_dim: int, scst_max_new_tokens: int | None = None, tokenizer=None
) -> RegionCaptionerForConditionalGeneration:
    """From a BERT-family checkpoint (its word embeddings; encoder and decoder sized here), a captioner checkpoint,
    or, with `--d_model`, from scratch over `tokenizer`'s vocabulary; with the alignment and geometry flags; its
    positions cover the captions of the evaluation and, given `scst_max_new_tokens`, those self-critical training
    samples."""
    generated = max(args.max_new_tokens, scst_max_new_tokens or 0)
    settings = {
        "attention_alignment": args.alignment,
        "use_geometry": args.geometry,
        "aligned_layers": parse_indices(args.aligned_layers, "--aligned_layers"),
        "mask_weight": args.mask_weight,
        "normalize_before": args.normalize_before,
    }
    readings = ("alignment_eta", "alignment_temperature", "alignment_moving_average", "alignment_mask_input")
    for name in (*readings, "alignment_mask_regions"):
        if getattr(args, name) is not None:  # the config checks the value
            settings[name] = getattr(args, name)
    if args.dropout is not None:  # config fields, read when the modules are built
        settings.update(dropout=args.dropout, attention_dropout=args.dropout)

    def sizes(tokenizer, hidden_size: int) -> dict:
        ffn = args.ffn_dim or 4 * hidden_size
        return {
            "visual_feat_dim": visual_feat_dim,
            "encoder_layers": args.encoder_layers,
            "decoder_layers": args.decoder_layers,
            "encoder_attention_heads": args.attention_heads,
            "decoder_attention_heads": args.attention_heads,
            "encoder_ffn_dim": ffn,
            "decoder_ffn_dim": ffn,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id,
            "decoder_start_token_id": tokenizer.cls_token_id,
            "max_position_embeddings": max(args.max_text_length, generated + 1),
        }

    def text_settings(path: str) -> dict:
        return sizes(AutoTokenizer.from_pretrained(path), AutoConfig.from_pretrained(path).hidden_size)

    if args.d_model is not None:
        checkpoint = args.model_name_or_path
        if checkpoint is not None and AutoConfig.from_pretrained(checkpoint).model_type == RegionCaptionerConfig.model_type:
            raise ValueError(f"`--d_model` sizes a new captioner; `--model_name_or_path` {checkpoint} is a captioner already.")
        if tokenizer is None:
            raise ValueError("`tokenizer` is needed to build a captioner from scratch (`--d_model`).")
        config = RegionCaptionerConfig(vocab_size=len(tokenizer), d_model=args.d_model, **sizes(tokenizer, args.d_model), **settings)
        return RegionCaptionerForConditionalGeneration(config)
    return from_checkpoint_or_text(RegionCaptionerForConditionalGeneration, args.model_name_or_path, settings, text_settings)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation and report
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def alignment_panels(model, image, store, tokenizer, caption: str) -> tuple[list, list[str], list[str]]:
    """A2 Figure 1: for every generated word, the attention of the last decoder layer over the regions (heads
    averaged) before alignment (the raw cross-attention) and after it (the attention the decoder used); returns
    (panels, words, region labels) for `plot_word_region_heatmaps`. A forward pass of the trained model, so every
    process runs it (under FSDP or DeepSpeed ZeRO-3 a forward pass gathers the sharded weights from every process)."""
    # a generated caption re-tokenised can be longer than it was generated (word pieces decoded into words): cut to
    # the decoder's positions
    limit = model.config.max_position_embeddings
    collator = CaptioningCollator(tokenizer, store, text_columns=("caption",), max_text_length=limit)
    batch = collator([{"image_id": image["image_id"], "caption": caption or "."}])
    device = next(model.parameters()).device
    inputs = {
        k: v.to(device) for k, v in batch.items() if k.startswith("visual_") or k in ("labels", "decoder_attention_mask")
    }
    outputs = model(**inputs, output_attentions=True)
    keep = batch["decoder_attention_mask"][0].bool()
    words = tokenizer.convert_ids_to_tokens(batch["labels"][0][keep].tolist())
    regions = batch["visual_attention_mask"][0].bool()
    labels = [f"r{r}" for r in regions.nonzero().flatten().tolist()]

    def rows(attention):
        return attention[-1][0].mean(0).float().cpu()[keep][:, regions].numpy()

    panels = [
        (rows(outputs.cross_attentions), "before alignment"),
        (rows(outputs.aligned_cross_attentions), "after alignment"),
    ]
    return panels, words, labels


@torch.no_grad()
def attention_analyses(
    model, test, collator, batch_size: int, seed: int, max_examples: int | None, num_bins: int,
    class_themes: list[int] | None = None,
) -> dict:
    """Ilinykh's analyses of the trained captioner, teacher-forced on a seeded sample of test captions: attention
    entropy per block, layer and head (Analysis III, `AttentionEntropy`), the encoder's region->region attention
    by box-centre distance (Analysis II, `AttentionDistance`), within spatial clusters of boxes (`WithinClusterAttention`:
    k-means on box centres, `region_clusters(source="spatial")`), within thematic clusters (Analysis I, given
    `class_themes`, the theme of each detector class: `thematic_clusters` of the store's `object_ids`; a region shows
    an object when a grounded phrase of one of its image's sampled captions is aligned with it, `object_regions`, the
    others are left out) and the share of a grounded word's decoder cross-attention on its object's regions
    (Analysis IV, `GroundedWordAttention`). Every process runs it (forward passes)."""
    rows = evaluation_subset(test, max_examples, seed, argument="--analysis_examples")
    entropy, distance, within_cluster = AttentionEntropy(), AttentionDistance(num_bins), WithinClusterAttention()
    # thematic clusters: attention to other objects' regions only (no self, no region that shows no object)
    within_theme = WithinClusterAttention(include_self=False, clustered_keys_only=True)
    grounded_words = GroundedWordAttention()
    objects = object_regions(rows, collator, batch_size) if class_themes is not None else None
    model.eval()
    for batch in inference_batches(model, rows, collator, batch_size, exclude=CAPTION_NON_MODEL_KEYS, description="analyses"):
        outputs = model(**batch.inputs, output_attentions=True)
        masks = {"text_mask": batch.batch["decoder_attention_mask"], "region_mask": batch.batch["visual_attention_mask"]}
        blocks = attention_blocks(outputs, **masks, source="captioner")
        entropy.update(blocks)
        distance.update(blocks, batch.batch["visual_boxes"])
        clusters, _ = region_clusters(batch.batch["visual_boxes"], batch.batch["visual_attention_mask"], source="spatial")
        within_cluster.update(blocks, clusters)
        alignment = batch.batch["word_region_alignment"]
        grounded_words.update(blocks, alignment)
        if objects is not None:
            kinds = region_kinds(collator.region_features, batch.rows, alignment.shape[-1])
            shown = torch.zeros_like(kinds, dtype=torch.bool)
            for i, row in enumerate(batch.rows):
                shown[i, : len(objects[row["image_id"]])] = objects[row["image_id"]]
            within_theme.update(blocks, thematic_clusters(kinds, shown, class_themes))
    return {
        "entropy": entropy.compute(),
        "distance": distance.compute(),
        "distance_effects": distance.effects(),
        "within_cluster": within_cluster.compute(),
        "within_theme": within_theme.compute() if class_themes is not None else None,
        "grounded_words": grounded_words.compute(),
        "num_captions": len(rows),
    }


def object_regions(rows, collator, batch_size: int) -> dict[str, torch.Tensor]:
    """Per image of `rows`, (R,) bool over its regions: those a grounded phrase of one of its captions in `rows` is
    aligned with (`word_region_alignment`: the regions that show an object the captions name). Collated by a copy of
    `collator`, so that its truncation counts stay those of the evaluation."""
    collator, shown = replace(collator), {}
    for start in range(0, len(rows), batch_size):
        chunk = [rows[index] for index in range(start, min(start + batch_size, len(rows)))]
        batch = collator(chunk)
        aligned = (batch["word_region_alignment"] > 0).any(1)  # (B, R)
        for row, regions, real in zip(chunk, aligned, batch["visual_attention_mask"].bool()):
            regions = regions[: int(real.sum())]  # an image's real regions come first
            previous = shown.get(row["image_id"])
            shown[row["image_id"]] = regions if previous is None else previous | regions
    return shown


def region_kinds(store: RegionFeatureStore, rows: list[dict], num_regions: int) -> torch.Tensor:
    """(B, R) the detector class (object kind) of each region of the rows' images, the store's `object_ids`; -1 on
    padding and where the store has none."""
    kinds = torch.full((len(rows), num_regions), -1, dtype=torch.long)
    images = store.batch([store_image_id(store, row) for row in rows], without=("features",))
    for i, image in enumerate(images):
        if image["object_ids"] is not None:
            column = image["object_ids"].reshape(len(image["object_ids"]), -1)[:, 0]
            kinds[i, : len(column)] = column
    return kinds


def attention_importance(model, test, collator, batch_size: int, seed: int, max_examples: int | None) -> dict:
    """Fei's Figure 2 (A2), teacher-forced on a seeded sample of test captions: per decoder layer, Kendall's tau-b
    between the head-averaged cross-attention the decoder used (`aligned_cross_attentions`, the raw softmax in layers
    without alignment) over an image's real regions and each region's gradient importance ||d p(y_t) / d h_i|| for the
    caption word y_t, averaged over words (`captioner_attention_importance`; words whose attention or importance is
    constant have no tau and are counted in `num_undefined`). A high tau: the attention ranks the regions as they
    matter to the word. One backward pass per caption position and batch; every process runs it, as the forward
    passes of `attention_analyses`."""
    rows = evaluation_subset(test, max_examples, seed, argument="--importance_examples")
    num_layers = model.config.decoder_layers
    tau_sums, num_words, num_undefined = [0.0] * num_layers, [0] * num_layers, [0] * num_layers
    batches = inference_batches(
        model, rows, collator, batch_size, exclude=CAPTION_NON_MODEL_KEYS, description="attention vs importance"
    )
    for batch in batches:
        for row in captioner_attention_importance(model, batch.inputs):
            layer = row["layer"]
            if row["num_words"] > 0:  # else the batch's tau is NaN and weighs nothing
                tau_sums[layer] += row["kendall_tau"] * row["num_words"]
            num_words[layer] += row["num_words"]
            num_undefined[layer] += row["num_undefined"]
    per_layer = [
        {
            "layer": layer,
            "kendall_tau": tau_sums[layer] / num_words[layer] if num_words[layer] else math.nan,
            "num_words": num_words[layer],
            "num_undefined": num_undefined[layer],
        }
        for layer in range(num_layers)
    ]
    defined = [row["kendall_tau"] for row in per_layer if row["num_words"] > 0]
    mean = sum(defined) / len(defined) if defined else None  # None: no word had a defined tau in any layer
    return {"per_layer": per_layer, "mean_over_layers": mean, "num_captions": len(rows)}


def a2_diagnostics(model, test, collator, batch_size: int, seed: int, max_examples: int | None) -> dict:
    """Whether A2 acts (`A2Diagnostics`: the mask's mean and spread across regions, eq. 4, aligned vs raw attention,
    the caption loss under m = 0, head diversity), teacher-forced on the seeded sample of `attention_analyses`;
    eval_results.json's `diagnostics.a2`."""
    rows = evaluation_subset(test, max_examples, seed, argument="--analysis_examples")
    diagnostics = A2Diagnostics()
    model.eval()
    for batch in inference_batches(model, rows, collator, batch_size, exclude=CAPTION_NON_MODEL_KEYS, description="A2"):
        diagnostics.update(model, batch.inputs)
    return {**diagnostics.compute(), "num_captions": len(rows)}


def entropy_per_layer(rows: list[dict]) -> dict[str, list[dict]]:
    """Per block, one entry per layer: the head-averaged entropy and normalised entropy (the `head == "mean"` rows)."""
    table: dict[str, list[dict]] = {}
    for row in rows:
        if row["head"] == "mean":
            entry = {"layer": row["layer"], "entropy": row["entropy"], "normalised_entropy": row["normalised_entropy"]}
            table.setdefault(row["block"], []).append(entry)
    return {block: sorted(layers, key=lambda entry: entry["layer"]) for block, layers in table.items()}


def distance_correlation(rows: list[dict]) -> list[dict]:
    """Per layer, the Pearson correlation between a bin's centre distance and its mean attention over the non-empty
    bins (negative: nearer regions get more attention), weighted by the pairs in each bin; None with < 2 bins."""
    layers: dict[int, list[dict]] = {}
    for row in rows:
        if row["num_pairs"] > 0:
            layers.setdefault(row["layer"], []).append(row)
    result = []
    for layer in sorted({row["layer"] for row in rows}):
        bins = layers.get(layer, [])
        correlation = None
        if len(bins) >= 2:
            weights = torch.tensor([float(b["num_pairs"]) for b in bins], dtype=torch.float64)
            x = torch.tensor([(b["distance_bin_low"] + b["distance_bin_high"]) / 2 for b in bins], dtype=torch.float64)
            y = torch.tensor([b["mean_attention"] for b in bins], dtype=torch.float64)
            weights = weights / weights.sum()
            dx, dy = x - (weights * x).sum(), y - (weights * y).sum()
            denominator = math.sqrt(float((weights * dx * dx).sum() * (weights * dy * dy).sum()))
            correlation = float((weights * dx * dy).sum()) / denominator if denominator > 0 else None
        result.append({"layer": layer, "pearson_distance_attention": correlation, "num_bins": len(bins)})
    return result


def ilinykh_effects(analyses: dict) -> dict:
    """paper_results' effect sizes of Ilinykh's analyses, each per layer and as its last - first layer change
    (`depth_change`): the attention-weighted minus the uniform mean box distance (Analysis II), the normalised entropy
    of each block (Analysis III), the within-theme share minus its chance level (Analysis I; skipped, saying why,
    without object kinds) and a grounded word's cross-attention share on its object minus chance (Analysis IV)."""
    entropy = entropy_per_layer(analyses["entropy"])
    within_theme = analyses["within_theme"]
    return {
        "attention_distance_effect": {
            "per_layer": analyses["distance_effects"],
            "depth_change": depth_change(analyses["distance_effects"], "effect"),
        },
        "attention_entropy_depth_change": {
            block: depth_change(layers, "normalised_entropy") for block, layers in entropy.items()
        },
        "within_theme_attention": {
            "cluster_source": "the thematic group of each region's object kind (the store's object_ids)",
            "excluded": "regions no grounded phrase of the image's analysed captions is aligned with (boxes that show "
            "no named object), as queries and as keys; a region's attention to itself; themes with one region in the "
            "image",
            "per_layer": within_theme,
            "depth_change": depth_change(within_theme, "effect"),
        }
        if within_theme is not None
        else {"skipped": "the data's object kinds have no thematic groups (synthetic scenes only)"},
        "grounded_word_attention": {
            "block": "decoder_cross",
            "per_layer": analyses["grounded_words"],
            "depth_change": depth_change(analyses["grounded_words"], "effect"),
        },
    }


def json_ready(value):
    """NaN (an empty distance bin) becomes null, so the JSON files stay valid."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def write_report(
    args, training_args, model, data: CaptionData, captions, grounding, image_use, truncation, figure, analyses,
    push_to_hub, trained: str,
) -> dict:
    """samples.json, the plots, eval_results.json, paper_results.json and the model card in --output_dir, the headline
    scores printed, then the push (main process only)."""
    output_dir = Path(training_args.output_dir)
    images = data.images
    spice_skipped = None if args.spice is not False else "--spice false"
    if args.spice is None:
        spice_skipped = spice_unavailable_reason()
    metrics = ("bleu", "meteor", "rouge_l", "cider", *(() if spice_skipped else ("spice",)))
    scores = caption_scores(captions, [image["references"] for image in images], metrics=metrics)
    results = {
        "bleu_4": scores["bleu_4"],
        "cider": scores["cider"],
        "meteor": scores["meteor"],
        "rouge_l": scores["rouge_l"],
        **({"spice": scores["spice"]} if "spice" in scores else {}),
        **{key: scores[key] for key in ("bleu_1", "bleu_2", "bleu_3")},
        "test_loss": image_use["own_image_loss"],
        "test_loss_other_images": image_use["shuffled_image_loss"],
        "attention_alignment": args.alignment,
        "geometry": args.geometry,
        "data": data.description,
        "num_test_images": len(images),
        "truncation": truncation,
        "image_use": image_use,
        "diagnostics": mechanism_diagnostics(image_use, {"caption": "loss"}),  # minus the caption loss; geometry
        "attention_importance_kendall_tau": analyses["importance"]["mean_over_layers"],
    }
    if analyses["a2"] is not None:
        results["diagnostics"]["a2"] = analyses["a2"]
    if grounding is not None:  # only test captions with phrase boxes
        per_head, summed = grounding
        results.update(
            alignment=float(summed.accuracy[-1, 0]),
            alignment_per_layer=summed.accuracy[:, 0].tolist(),
            alignment_best_head=per_head.best_head_accuracy,
            grounding_baseline_accuracy=per_head.baseline_accuracy,
            num_grounded_words=per_head.num_phrases,
        )
        baselines = grounding_probe_baselines(per_head, ("alignment", "alignment_best_head"))
        results["baselines"] = compare_with_baselines(results, baselines)
    distance_rows = analyses["distance"]
    paper = {
        "data": data.description,
        "split": args.eval_split if args.karpathy_json else "validation" if args.train_file else "synthetic val",
        "num_test_images": len(images),
        "attention_alignment": args.alignment,
        "geometry": args.geometry,
        **{PAPER_METRIC_NAMES[key]: value for key, value in scores.items() if key in PAPER_METRIC_NAMES},
        **({"SPICE_skipped": spice_skipped} if spice_skipped else {}),
        "attention_entropy_per_layer": entropy_per_layer(analyses["entropy"]),
        "attention_vs_distance": {"per_layer": distance_correlation(distance_rows), "bins": distance_rows},
        "within_cluster_attention": {"cluster_source": "spatial", "per_layer": analyses["within_cluster"]},
        **ilinykh_effects(analyses),
        "attention_entropy": analyses["entropy"],
        "num_analysis_captions": analyses["num_captions"],
        "attention_importance_kendall_tau": analyses["importance"]["per_layer"],
        "num_importance_captions": analyses["importance"]["num_captions"],
    }
    samples = [
        {"image_id": image["image_id"], "generated": caption, "references": image["references"]}
        for image, caption in zip(images[:20], captions)
    ]
    write_json(output_dir / "samples.json", samples)
    write_json(output_dir / "paper_results.json", json_ready(paper))
    panels, words, region_labels = figure
    plot_word_region_heatmaps(panels, words, region_labels, output_dir / "attention_alignment.png")
    title = f"captioner ({args.alignment})"
    plot_entropy(analyses["entropy"], output_dir / "attention_entropy.png", title=title)
    plot_attention_vs_distance(distance_rows, output_dir / "attention_vs_distance.png", title=title)
    plot_within_cluster(
        analyses["within_cluster"],
        output_dir / "within_cluster_attention.png",
        title=f"{title}: encoder attention within spatial clusters of boxes",
    )
    if analyses["within_theme"] is not None:
        plot_within_cluster(
            analyses["within_theme"], output_dir / "within_theme_attention.png",
            title=f"{title}: encoder attention within the thematic groups of object kinds",
        )  # fmt: skip
    card = render_model_card(
        "captioner",
        model_id=training_args.hub_model_id,
        base_model=args.model_name_or_path or DEFAULT_BASE_MODEL,  # its word embeddings
        results=metrics_from_eval_results(results),
        baselines=results.get("baselines"),
        training={
            "data": data.description,
            "trained": trained,
            "learning_rate": training_args.learning_rate,
            "encoder_learning_rate": training_args.encoder_learning_rate,
            "batch_size": training_args.per_device_train_batch_size,
            "scst_start_epoch": training_args.scst_start_epoch,
            "seed": training_args.seed,
        },
        config=model.config,
    )
    headline = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr", *(("SPICE",) if "spice" in scores else ()))
    print(json.dumps({key: paper[key] for key in headline}, indent=2))  # before the push, which may fail
    write_results(
        output_dir, results, card, push_to_hub=push_to_hub, training_args=training_args,
        commit_message="hf_vlalign captioning",
    )  # fmt: skip
    return results


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def train_and_evaluate(args: CaptioningArguments, training_args: CaptioningTrainingArguments, data: CaptionData) -> dict:
    """One captioner trained on `data.train` and evaluated on the test images; returns eval_results.json's content
    (empty on processes other than the main one)."""
    set_seed(training_args.seed)
    store = data.store
    tokenizer = load_tokenizer(args.model_name_or_path)
    scst_max_new_tokens = training_args.scst_max_new_tokens if training_args.scst_start_epoch is not None else None
    model = load_model(args, store.feature_dim, scst_max_new_tokens, tokenizer)
    text = (data.text_column,)
    collator = CaptioningCollator(
        tokenizer, store, text_columns=text, max_text_length=args.max_text_length, reference_column="references"
    )
    # captions longer than max_text_length are truncated (the targets end at the cut): counted, reported
    train, train_truncation = collator.drop_overlong_rows(data.train, "captioning train")
    push_to_hub = take_push_to_hub(training_args)  # pushed once, with the results, below
    trainer = CaptioningTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, store, data.region_options),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    output_dir = Path(training_args.output_dir)
    # every process saves and runs the trained model (collectives under FSDP / DeepSpeed); only the main process writes
    save_model(trainer, output_dir)
    trainer.save_state()  # trainer_state.json: the log history (every loss component, SCST reward)
    model = trainer.model.eval()
    images = data.images
    captions = generate_captions(
        model, tokenizer, store, [image["image_id"] for image in images], training_args.per_device_eval_batch_size,
        args.max_new_tokens, args.num_beams,
    )
    grounding = None
    test_collator = CaptioningCollator(tokenizer, store, text_columns=text, max_text_length=args.max_text_length)
    test, test_truncation = test_collator.drop_overlong_rows(data.test, "captioning test")
    if data.grounded:  # Li et al.'s grounding accuracy of the cross-attention: phrase boxes needed
        grounding_collator = CaptioningCollator(
            tokenizer, store, text_columns=text, max_text_length=args.max_text_length, return_probe_targets=True
        )
        grounding = evaluate_decoder_grounding(model, test, grounding_collator, training_args.per_device_eval_batch_size)
    image_use = image_use_results(  # teacher-forced caption loss with the own image vs another image's regions
        model, test, test_collator, training_args.per_device_eval_batch_size, training_args.seed, args.image_use_examples,
        perturb_boxes=True,  # and with boxes shuffled / blanked (the geometry diagnostics)
    )  # fmt: skip
    synthetic = args.karpathy_json is None and args.train_file is None  # shape kinds with thematic groups
    analyses = attention_analyses(
        model, test, test_collator, training_args.per_device_eval_batch_size, training_args.seed,
        args.analysis_examples, args.distance_bins, SHAPE_THEMES if synthetic else None,
    )  # fmt: skip
    analyses["importance"] = attention_importance(
        model, test, test_collator, training_args.per_device_eval_batch_size, training_args.seed,
        args.importance_examples,
    )  # fmt: skip
    analyses["a2"] = None
    if args.alignment != "none":
        analyses["a2"] = a2_diagnostics(
            model, test, test_collator, training_args.per_device_eval_batch_size, training_args.seed,
            args.analysis_examples,
        )  # fmt: skip
    figure = alignment_panels(model, images[0], store, tokenizer, captions[0])
    results = {}
    if trainer.is_world_process_zero():
        truncation = truncation_results(
            args.max_text_length, {"train": train_truncation, "test": test_truncation}, [collator, test_collator]
        )
        results = write_report(
            args, training_args, model, data, captions, grounding, image_use, truncation, figure, analyses, push_to_hub,
            trained_amount(trainer),
        )
    return results


def compare_fusions(args: CaptioningArguments, training_args: CaptioningTrainingArguments, data: CaptionData) -> dict:
    """Fei's comparison of the A2 fusions: one run per fusion of `--a2_fusions` in `<output_dir>/<fusion>`, then
    a2_comparison.json ({fusion: paper_results' metrics}) and a2_comparison.md (one table) in --output_dir."""
    root = Path(training_args.output_dir)
    runs = {}
    for fusion in fusions(args):
        run_args = replace(args, alignment=fusion, a2_fusions=None)
        run_training_args = copy.deepcopy(training_args)
        run_training_args.output_dir = str(root / fusion)
        if getattr(run_training_args, "logging_dir", None):
            run_training_args.logging_dir = str(root / fusion / "runs")
        runs[fusion] = train_and_evaluate(run_args, run_training_args, data)
    comparison = {}
    if runs and all(runs.values()):  # the main process
        names = list(PAPER_METRIC_NAMES.values())
        for fusion in runs:
            paper = json.loads((root / fusion / "paper_results.json").read_text())
            comparison[fusion] = {name: paper[name] for name in names if name in paper}
        columns = [name for name in names if all(name in row for row in comparison.values())]
        lines = ["| fusion | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
        lines += [f"| {fusion} | " + " | ".join(f"{row[name]:.4f}" for name in columns) + " |" for fusion, row in comparison.items()]
        write_json(root / "a2_comparison.json", comparison)
        (root / "a2_comparison.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    return comparison


def main(argv: list[str] | None = None) -> dict:
    """One run (eval_results.json's content), or with `--a2_fusions` the comparison ({fusion: paper metrics})."""
    args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
        data = load_data(args, training_args)
    if fusions(args):
        return compare_fusions(args, training_args, data)
    return train_and_evaluate(args, training_args, data)


if __name__ == "__main__":
    run_command("train_captioning.py", main)
