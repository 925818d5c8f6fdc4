#!/usr/bin/env python
"""Train a region captioner with geometry-aware encoder attention and A2 attention alignment (Ilinykh; Fei).

    accelerate launch examples/train_captioning.py                          # offline: synthetic captions, A2 "gate"
    accelerate launch examples/train_captioning.py --alignment none --no-geometry --output_dir outputs/cap_ablation
    accelerate launch examples/train_captioning.py --scst_start_epoch 3 --num_train_epochs 4   # + self-critical

Writes to --output_dir: safetensors weights, config, tokenizer, eval_results.json (`bleu_4`, `cider`, `meteor`,
`rouge_l` on the synthetic test split, and `alignment`: Li et al.'s grounding accuracy of the decoder's cross-attention
teacher-forced on the test captions, last decoder layer, heads summed; `test_loss` and `test_loss_other_images`: the
caption loss per token with each caption's own image and with another image, whose gap is how much the captioner uses
the image, also under `image_use` with every example's keys), samples.json (generated captions with their
references) and attention_alignment.png (the top-1 attended region of every generated word before and after alignment,
the A2 paper's Figure 1) and README.md (the model card). Every transformers `TrainingArguments` flag works too
(--seed, --push_to_hub, ...), and those of `CaptioningTrainingArguments` (--encoder_learning_rate, --mask_update_every,
--scst_start_epoch, --scst_max_new_tokens, ...).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, set_seed

from hf_vlalign import RegionCaptionerForConditionalGeneration
from hf_vlalign.analysis.attention_plots import plot_word_region_heatmaps
from hf_vlalign.data import CaptioningCollator, build_dataset, group_captions_by_image
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.evaluation import evaluate_decoder_grounding
from hf_vlalign.evaluation.tasks import generate_captions
from hf_vlalign.hub.model_card import metrics_from_eval_results, render_model_card
from hf_vlalign.metrics.captioning import caption_scores
from hf_vlalign.recipes import (
    DEFAULT_BASE_MODEL,
    IMAGE_USE_EXAMPLES,
    MixedPrecisionArguments,
    from_checkpoint_or_text,
    image_use_results,
    load_tokenizer,
    parse_indices,
    parse_recipe_args,
    save_model,
    synthetic_scene_config,
    take_push_to_hub,
    truncation_results,
    write_json,
    write_results,
)
from hf_vlalign.trainers import CaptioningTrainer, CaptioningTrainingArguments


@dataclass
class CaptioningArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "BERT-family checkpoint for the word embeddings, or a captioner checkpoint."}
    )
    alignment: str = field(default="gate", metadata={"help": "none | max | moving_average | exp_decay | gate (A2)."})
    geometry: bool = field(default=True, metadata={"help": "geometry-aware encoder attention (--no_geometry: ablation)."})
    aligned_layers: str | None = field(default=None, metadata={"help": "comma-separated decoder layers (default all)."})
    encoder_layers: int = field(default=3)
    decoder_layers: int = field(default=3)
    attention_heads: int = field(default=8)
    normalize_before: bool = field(default=False, metadata={"help": "pre-norm layers instead of post-norm."})
    mask_weight: float = field(default=0.1, metadata={"help": "lambda of the mask objective (eq. 4)."})
    alignment_temperature: float = field(default=200.0, metadata={"help": "T_P of the exponential decay (in steps)."})
    max_new_tokens: int = field(default=20, metadata={"help": "length of the captions generated for the evaluation."})
    num_beams: int = field(default=1)
    synthetic_seed: int = field(default=0)
    synthetic_train_images: int = field(default=800)
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
    return args, training_args


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_data(args: CaptioningArguments):
    """(train captions with their image's references, test captions, test images with their references, store)."""
    config = synthetic_scene_config(args)
    store = synthetic_region_features(config=config)
    train = build_dataset("synthetic_scenes", None, "train", task="captions", config=config)
    test = build_dataset("synthetic_scenes", None, "val", task="captions", config=config)
    train_references = group_captions_by_image(train)  # the CIDEr-D rewards of self-critical training read them
    train = train.map(lambda row: {"references": train_references[row["image_id"]]})
    images = [{"image_id": image_id, "references": captions} for image_id, captions in group_captions_by_image(test).items()]
    return train, test, images, store


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


def load_model(
    args: CaptioningArguments, visual_feat_dim: int, scst_max_new_tokens: int | None = None
) -> RegionCaptionerForConditionalGeneration:
    """From a BERT-family checkpoint (its word embeddings; encoder and decoder sized here) or a captioner
    checkpoint, with the alignment and geometry flags; its positions cover the captions of the evaluation and, given
    `scst_max_new_tokens`, those self-critical training samples."""
    generated = max(args.max_new_tokens, scst_max_new_tokens or 0)
    settings = {
        "attention_alignment": args.alignment,
        "use_geometry": args.geometry,
        "aligned_layers": parse_indices(args.aligned_layers, "--aligned_layers"),
        "mask_weight": args.mask_weight,
        "alignment_temperature": args.alignment_temperature,
        "normalize_before": args.normalize_before,
    }
    if args.dropout is not None:  # config fields, read when the modules are built
        settings.update(dropout=args.dropout, attention_dropout=args.dropout)

    def text_settings(path: str) -> dict:
        tokenizer = AutoTokenizer.from_pretrained(path)
        ffn = 4 * AutoConfig.from_pretrained(path).hidden_size
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

    return from_checkpoint_or_text(RegionCaptionerForConditionalGeneration, args.model_name_or_path, settings, text_settings)


@torch.no_grad()
# ----------------------------------------------------------------------------------------------------------------
# Evaluation and report
# ----------------------------------------------------------------------------------------------------------------


def alignment_panels(model, image, store, tokenizer, caption: str) -> tuple[list, list[str], list[str]]:
    """A2 Figure 1: for every generated word, the attention of the last decoder layer over the regions (heads
    averaged) before alignment (the raw cross-attention) and after it (the attention the decoder used); returns
    (panels, words, region labels) for `plot_word_region_heatmaps`. A forward pass of the trained model, so every
    process runs it (under FSDP or DeepSpeed ZeRO-3 a forward pass gathers the sharded weights from every process)."""
    collator = CaptioningCollator(tokenizer, store, text_columns=("caption",))
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


def write_report(
    args, training_args, model, images, captions, grounding, image_use, truncation, figure, push_to_hub
) -> dict:
    """samples.json, attention_alignment.png, eval_results.json and the model card in --output_dir, the headline
    scores printed, then the push (main process only)."""
    output_dir = Path(training_args.output_dir)
    per_head, summed = grounding
    scores = caption_scores(captions, [image["references"] for image in images])
    results = {
        "bleu_4": scores["bleu_4"],
        "cider": scores["cider"],
        "meteor": scores["meteor"],
        "rouge_l": scores["rouge_l"],
        "alignment": float(summed.accuracy[-1, 0]),
        **{key: scores[key] for key in ("bleu_1", "bleu_2", "bleu_3")},
        "test_loss": image_use["own_image_loss"],
        "test_loss_other_images": image_use["shuffled_image_loss"],
        "alignment_per_layer": summed.accuracy[:, 0].tolist(),
        "alignment_best_head": per_head.best_head_accuracy,
        "grounding_baseline_accuracy": per_head.baseline_accuracy,
        "attention_alignment": args.alignment,
        "geometry": args.geometry,
        "num_test_images": len(images),
        "num_grounded_words": per_head.num_phrases,
        "truncation": truncation,
        "image_use": image_use,
    }
    samples = [
        {"image_id": image["image_id"], "generated": caption, "references": image["references"]}
        for image, caption in zip(images[:20], captions)
    ]
    write_json(output_dir / "samples.json", samples)
    panels, words, region_labels = figure
    plot_word_region_heatmaps(panels, words, region_labels, output_dir / "attention_alignment.png")
    card = render_model_card(
        "captioner",
        model_id=training_args.hub_model_id,
        base_model=args.model_name_or_path or DEFAULT_BASE_MODEL,  # its word embeddings
        results=metrics_from_eval_results(results),
        training={
            "data": "synthetic captioned scenes",
            "epochs": training_args.num_train_epochs,
            "max_steps": training_args.max_steps,
            "learning_rate": training_args.learning_rate,
            "encoder_learning_rate": training_args.encoder_learning_rate,
            "batch_size": training_args.per_device_train_batch_size,
            "scst_start_epoch": training_args.scst_start_epoch,
            "seed": training_args.seed,
        },
        config=model.config,
    )
    headline = ("bleu_4", "cider", "meteor", "rouge_l", "alignment")
    print(json.dumps({key: results[key] for key in headline}, indent=2))  # before the push, which may fail
    write_results(
        output_dir, results, card, push_to_hub=push_to_hub, training_args=training_args,
        commit_message="hf_vlalign captioning",
    )  # fmt: skip
    return results


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    set_seed(training_args.seed)
    train, test, images, store = load_data(args)
    tokenizer = load_tokenizer(args.model_name_or_path)
    scst_max_new_tokens = training_args.scst_max_new_tokens if training_args.scst_start_epoch is not None else None
    model = load_model(args, store.feature_dim, scst_max_new_tokens)
    collator = CaptioningCollator(
        tokenizer, store, text_columns=("sentence",), max_text_length=args.max_text_length, reference_column="references"
    )
    # captions longer than max_text_length are truncated (the targets end at the cut): counted, reported
    train, train_truncation = collator.drop_overlong_rows(train, "captioning train")
    push_to_hub = take_push_to_hub(training_args)  # pushed once, with the results, below
    trainer = CaptioningTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    output_dir = Path(training_args.output_dir)
    # every process saves and runs the trained model (collectives under FSDP / DeepSpeed); only the main process writes
    save_model(trainer, output_dir)
    model = trainer.model.eval()
    captions = generate_captions(
        model, tokenizer, store, [image["image_id"] for image in images], training_args.per_device_eval_batch_size,
        args.max_new_tokens, args.num_beams,
    )
    grounding_collator = CaptioningCollator(
        tokenizer, store, text_columns=("sentence",), max_text_length=args.max_text_length, return_probe_targets=True
    )
    test, test_truncation = grounding_collator.drop_overlong_rows(test, "captioning test")
    # Li et al.'s grounding accuracy of the decoder's cross-attention, teacher-forced: (per head, heads summed)
    grounding = evaluate_decoder_grounding(model, test, grounding_collator, training_args.per_device_eval_batch_size)
    image_use = image_use_results(  # teacher-forced caption loss with the own image vs another image's regions
        model, test, grounding_collator, training_args.per_device_eval_batch_size, training_args.seed,
        args.image_use_examples,
    )  # fmt: skip
    figure = alignment_panels(model, images[0], store, tokenizer, captions[0])
    results = {}
    if trainer.is_world_process_zero():
        truncation = truncation_results(
            args.max_text_length, {"train": train_truncation, "test": test_truncation}, [collator, grounding_collator]
        )
        results = write_report(
            args, training_args, model, images, captions, grounding, image_use, truncation, figure, push_to_hub
        )
    return results

if __name__ == "__main__":
    main()
