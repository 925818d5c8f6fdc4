#!/usr/bin/env python
"""Fine-tune a single-stream model on visually grounded paraphrases with attention supervision (Samaran et al. 2021).

    accelerate launch examples/finetune_vgp.py                       # offline: synthetic scenes, MiniLM, direct supervision
    accelerate launch examples/finetune_vgp.py --supervision semi_direct --output_dir outputs/vgp_semi
    accelerate launch examples/finetune_vgp.py --flickr30k_entities_dir F30K --vgp_train_csv train.csv \
        --vgp_eval_csv val.csv --features STORE_DIR    # real data (hf-vlalign convert-features makes STORE_DIR)
    accelerate launch examples/finetune_vgp.py --train_file train.jsonl --validation_file val.jsonl
        # your own photos: `vgp` rows of the user-data format (caption1, caption2, phrase1, phrase2, label, type)

Writes to --output_dir: safetensors weights, config, tokenizer, README.md (model card with the results),
eval_results.json and attention_heatmap.png (one example's word x region attention in the best head).
The VGP classifier (eq. 4) predicts each pair's semantic type (--vgp_task type, the default: the 5 types of the VGP
typology, from the csvs' `type_label`; pairs that are not VGPs have no type and are left out of that loss, counted
under `vgp_untyped_rows`); --vgp_task binary classifies paraphrase vs not instead. eval_results.json has
`vgp_accuracy` and, per type, `vgp_type_accuracy/<type>` (with --vgp_task binary: `vgp_class_accuracy/<class>`).
The paper's settings: --config examples/configs/samaran_vgp.yaml.
Caption pairs longer than --max_text_length word pieces are truncated; rows whose phrase pair is cut are dropped
before training (`VGPCollator.drop_overlong_rows`) and the counts are reported under `truncation` in eval_results.json.
Every transformers `TrainingArguments` flag works too (--seed, --per_device_train_batch_size, --push_to_hub, ...),
and those of `VGPTrainingArguments` (--distill_from, --ewc_weight, --ewc_fisher, ...).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import set_seed
from transformers.utils import logging

from hf_vlalign import SingleStreamForVisualParaphrase
from hf_vlalign.analysis.attention_plots import plot_word_region_heatmap
from hf_vlalign.analysis.probe_plots import plot_head_accuracy
from hf_vlalign.data.builders import count_vgp_types, load_vgp_data
from hf_vlalign.data.builders.vgp import VGPData
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.data.formats.vgp import TYPOLOGY_LABELS
from hf_vlalign.evaluation.baselines import compare_with_baselines, grounding_probe_baselines, vgp_baselines
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.grounding import evaluate_grounding, word_region_attention
from hf_vlalign.hub.model_card import render_model_card
from hf_vlalign.recipes import (
    DEFAULT_BASE_MODEL,
    IMAGE_USE_EXAMPLES,
    MixedPrecisionArguments,
    EarlyStoppingArguments,
    SubsetArguments,
    build_processor,
    UserDataArguments,
    check_visual_feat_dim,
    final_evaluation,
    first_rows,
    from_checkpoint_or_text,
    image_use_results,
    load_tokenizer,
    load_user_splits,
    parse_recipe_args,
    save_model,
    set_dropout,
    supervision_settings,
    SYNTHETIC_WORLD_HELP,
    synthetic_scene_config,
    take_push_to_hub,
    training_callbacks,
    training_summary,
    truncation_results,
    write_json,
    write_results,
)
from hf_vlalign.trainers import VGPTrainer, VGPTrainingArguments
from hf_vlalign.utils.user_errors import run_command

logger = logging.get_logger(__name__)


@dataclass
class VGPArguments(UserDataArguments, SubsetArguments, EarlyStoppingArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "BERT-family text checkpoint or an hf_vlalign checkpoint (default: MiniLM)."}
    )
    supervision: str = field(default="direct", metadata={"help": "none | direct | semi_direct | indirect"})
    vgp_task: str = field(
        default="type",
        metadata={
            "help": "type (the paper's eq. 4: the pair's semantic type, 5 classes, from the csvs' type_label; pairs "
            "without a type are left out of that loss) | binary (paraphrase vs not)."
        },
    )
    supervision_weight: float = field(default=1.0, metadata={"help": "lambda of eq. (9)."})
    supervised_layers: str | None = field(default=None, metadata={"help": "comma-separated layer indices (default all)."})
    supervised_heads: str | None = field(default=None, metadata={"help": "comma-separated head indices (default all)."})
    flickr30k_entities_dir: str | None = field(default=None, metadata={"help": "Sentences/, Annotations/ folder."})
    vgp_train_csv: str | None = field(default=None)
    vgp_eval_csv: str | None = field(default=None)
    features: str | None = field(
        default=None, metadata={"help": "RegionFeatureStore folder of the images (hf-vlalign convert-features)."}
    )
    negatives: str = field(
        default="random",
        metadata={"help": "identification negatives: random | hard (the VGP paper's; the README table used random)."},
    )
    synthetic_seed: int = field(default=0, metadata={"help": "seed of the synthetic scenes (default data)."})
    synthetic_train_images: int = field(default=800)
    synthetic_distractors: bool = field(
        default=False,
        metadata={"help": "each synthetic scene's first shape gets a same-kind and a same-colour distractor."},
    )
    synthetic_world: str = field(default="v1", metadata={"help": SYNTHETIC_WORLD_HELP})
    synthetic_eval_images: int = field(default=150)
    max_text_length: int = field(default=64)
    image_use_examples: int | None = field(
        default=IMAGE_USE_EXAMPLES,
        metadata={"help": "evaluation rows of the own-image vs shuffled-image check (`image_use` in eval_results.json)."},
    )
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "if set, every dropout probability of the model (hidden, attention, classifier); default: the "
            "checkpoint's. 0.0 makes training deterministic across process counts (tests/trainers/test_multiprocess.py)."
        },
    )
    hub_model_id_for_card: str | None = field(default=None, metadata={"help": "model id shown in the card."})


def parse_args(argv: list[str]) -> tuple[VGPArguments, VGPTrainingArguments]:
    args, _, training_args = parse_recipe_args(
        argv,
        (VGPArguments, MixedPrecisionArguments),
        VGPTrainingArguments,
        # the published files and how their negatives are drawn: refused with --train_file (its rows hold the labels)
        data_source_flags=("flickr30k_entities_dir", "vgp_train_csv", "vgp_eval_csv", "negatives"),
        output_dir="outputs/vgp",
        num_train_epochs=2,
        learning_rate=2e-4,  # new visual embeddings and supervised heads learn slowly at BERT's usual 5e-5
        warmup_steps=50,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        eval_strategy="epoch",
        save_strategy="no",
    )
    return args, training_args


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


def vgp_task_settings(vgp_task: str) -> dict:
    """The config fields of `--vgp_task`: the 5 semantic types of the csvs' `type_label` (named as in their
    `original_label` column), or paraphrase vs not."""
    if vgp_task == "type":
        names = [TYPOLOGY_LABELS[label] for label in sorted(TYPOLOGY_LABELS)]
        return {"vgp_task": "type", "num_vgp_labels": len(names), "vgp_label_names": names}
    if vgp_task == "binary":
        return {"vgp_task": "binary", "num_vgp_labels": 2, "vgp_label_names": None}
    raise ValueError(f"`--vgp_task` must be 'type' or 'binary', got {vgp_task!r}.")


def load_model(args: VGPArguments, visual_feat_dim: int) -> SingleStreamForVisualParaphrase:
    """From a text checkpoint (new visual embeddings and heads) or a VGP checkpoint, with the supervision and
    --vgp_task flags."""
    model = from_checkpoint_or_text(
        SingleStreamForVisualParaphrase, args.model_name_or_path,
        {**supervision_settings(args), **vgp_task_settings(args.vgp_task)}, {"visual_feat_dim": visual_feat_dim},
    )  # fmt: skip
    check_visual_feat_dim(model, args.model_name_or_path, visual_feat_dim)
    if args.dropout is not None:
        set_dropout(model, args.dropout)
    return model


def load_data(args: VGPArguments, training_args: VGPTrainingArguments) -> tuple[VGPData, dict | None]:
    """(the VGP rows and their region features, the `extract_region_features` options of features made from the
    images): the `vgp` rows of `--train_file` / `--validation_file`, the published files, or the synthetic scenes; the
    first `--max_train_samples` / `--max_eval_samples` rows of each split."""
    region_options = None
    if args.train_file is not None:
        user = load_user_splits(args, "vgp", training_args)
        data, region_options = VGPData(user.train, user.eval, user.store, user.source), user.region_options
    else:
        with training_args.main_process_first(desc="loading the data"):  # the synthetic scenes are generated once
            data = load_vgp_data(
                args.flickr30k_entities_dir, args.vgp_train_csv, args.vgp_eval_csv, args.features,
                synthetic_scene_config(args), negatives=args.negatives,
            )  # fmt: skip
    data.train, data.eval = first_rows(data.train, args.max_train_samples), first_rows(data.eval, args.max_eval_samples)
    return data, region_options


# ----------------------------------------------------------------------------------------------------------------
# Evaluation and report
# ----------------------------------------------------------------------------------------------------------------


def probe_grounding(model, training_args, eval_dataset, collator, tokenizer) -> tuple:
    """Li et al.'s grounding probe over the evaluation split and the word x region attention of the heatmap's example
    in the best head: (probe result, drawn attention). Forward passes of the trained model, so every process runs them
    (under FSDP or DeepSpeed ZeRO-3 a forward pass gathers the sharded weights from every process)."""
    collator.return_probe_targets = True
    probe = evaluate_grounding(model, eval_dataset, collator, training_args.per_device_eval_batch_size)
    for example in (i for i in range(len(eval_dataset)) if eval_dataset[i]["caption1_phrase_spans"]):
        batch = collator([eval_dataset[example]])
        if bool(batch["word_region_alignment"].any()):  # a phrase left whole by the truncation
            return probe, word_region_attention(model, batch, tokenizer, probe.best_layer, probe.best_head)
    raise ValueError(
        f"no evaluation example keeps a grounded phrase of its first caption within --max_text_length "
        f"{collator.max_text_length}; raise --max_text_length."
    )


def vgp_class_results(metrics: dict, config) -> dict:
    """`vgp_type_accuracy/<type>` (or `vgp_class_accuracy/<class>` with --vgp_task binary) for every class, None for
    a class without evaluation pairs, and the count of each class's evaluation pairs."""
    key = "vgp_type" if config.vgp_task == "type" else "vgp_class"
    results = {}
    for name in config.vgp_class_names():
        results[f"{key}_accuracy/{name}"] = metrics.get(f"eval_{key}_accuracy/{name}")
        results[f"{key}_count/{name}"] = metrics[f"eval_{key}_count/{name}"]
    return results


def check_vgp_types(vgp_task: str, datasets_by_split: dict) -> dict[str, dict[str, int]]:
    """The rows with and without a semantic type in each split (`count_vgp_types`); with --vgp_task type, the rows
    without one (not VGPs) are left out of the type loss and reported in a warning, and a split without any typed row
    is refused."""
    counts = {split: count_vgp_types(dataset) for split, dataset in datasets_by_split.items()}
    if vgp_task != "type":
        return counts
    for split, count in counts.items():
        if count["typed"] == 0:
            raise ValueError(
                f"--vgp_task type: the VGP {split} rows have no semantic type (`type_label` empty or -1 in every row "
                f"kept); pass --vgp_task binary to train paraphrase vs not on them."
            )
        if count["untyped"]:
            logger.warning(
                f"VGP {split}: {count['untyped']} of {count['typed'] + count['untyped']} rows have no semantic type "
                "(pairs that are not VGPs); the type loss leaves them out (they still train identification and the "
                "attention)."
            )
    return counts


def write_report(
    trainer, metrics, probe, drawn, data_source, args, training_args, eval_dataset, truncation, image_use, push_to_hub,
    type_counts,
) -> dict:
    """grounding_probe.json, the heatmaps, eval_results.json and the model card in --output_dir, the results printed,
    then the push (main process only)."""
    output_dir = Path(training_args.output_dir)
    results = {
        "image_description_accuracy": metrics["eval_image_description_accuracy"],
        "vgp_task": args.vgp_task,
        "vgp_accuracy": metrics["eval_vgp_accuracy"],
        **vgp_class_results(metrics, trainer.model.config),
        "vgp_untyped_rows": {split: count["untyped"] for split, count in type_counts.items()},
        "grounding_accuracy_best_head": probe.best_head_accuracy,
        "grounding_accuracy_mean_head": probe.mean_head_accuracy,
        "grounding_baseline_accuracy": probe.baseline_accuracy,
        "supervision": args.supervision,
        "data": data_source,
        "best_head": [probe.best_layer, probe.best_head],
        "best_head_among": probe.best_among,
        "num_grounded_phrases": probe.num_phrases,
        "eval_loss": metrics["eval_loss"],
        **{
            key: metrics[f"eval_{key}"]
            for key in ("loss_id", "loss_vgp", "loss_attention_supervision")
            if f"eval_{key}" in metrics
        },
        "truncation": truncation,
        "image_use": image_use,
        # the mechanism acts: the supervision loss falls; identification and type need the image
        "diagnostics": mechanism_diagnostics(
            image_use, {"vgp_identification": "id_accuracy", f"vgp_{args.vgp_task}": "vgp_accuracy"},
            trainer.state.log_history, attention_loss_key="loss_attention_supervision",
        ),  # fmt: skip
    }
    grounding_keys = ("grounding_accuracy_best_head", "grounding_accuracy_mean_head")
    baselines = vgp_baselines(trainer.train_dataset, eval_dataset, args.vgp_task)
    results["baselines"] = compare_with_baselines(
        results, baselines | grounding_probe_baselines(probe, grounding_keys)
    )
    write_json(output_dir / "grounding_probe.json", probe.to_dict())
    plot_word_region_heatmap(
        drawn.attention,
        drawn.words,
        drawn.region_labels,
        output_dir / "attention_heatmap.png",
        title=f"layer {probe.best_layer}, head {probe.best_head} ({args.supervision} supervision)",
    )
    plot_head_accuracy(probe.accuracy, output_dir / "grounding_accuracy_per_head.png", title="grounding accuracy per head")
    card = render_model_card(
        "single_stream",
        model_id=args.hub_model_id_for_card or training_args.hub_model_id,
        base_model=args.model_name_or_path or DEFAULT_BASE_MODEL,
        supervision=args.supervision,
        results={k: v for k, v in results.items() if isinstance(v, float)},
        baselines=results["baselines"],
        training=training_summary(trainer, data_source, len(eval_dataset)),
    )
    print(json.dumps(results, indent=2))  # before the push: a failed push leaves them on the console too
    write_results(
        output_dir, results, card, push_to_hub=push_to_hub, training_args=training_args,
        commit_message="hf_vlalign VGP fine-tuning",
    )  # fmt: skip
    return results


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    set_seed(training_args.seed)
    data, region_options = load_data(args, training_args)
    train_dataset, eval_dataset, region_features = data.train, data.eval, data.region_features
    tokenizer = load_tokenizer(args.model_name_or_path)
    model = load_model(args, visual_feat_dim=region_features.feature_dim)
    collator = VGPCollator(tokenizer, region_features, max_text_length=args.max_text_length, vgp_task=args.vgp_task)
    # rows whose phrase pair does not fit in max_text_length cannot be trained: dropped, counted, reported
    train_dataset, train_truncation = collator.drop_overlong_rows(train_dataset, "VGP train")
    eval_dataset, eval_truncation = collator.drop_overlong_rows(eval_dataset, "VGP eval")
    type_counts = check_vgp_types(args.vgp_task, {"train": train_dataset, "eval": eval_dataset})
    push_to_hub = take_push_to_hub(training_args)  # pushed once, with the card, below
    trainer = VGPTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        # the processor is saved with the model and in every checkpoint-N
        processing_class=build_processor(tokenizer, model, region_features, region_options),
        # bounded evaluations, early stopping with --early_stopping_patience, learning_curve.json
        callbacks=training_callbacks(training_args, len(eval_dataset), args.early_stopping_patience),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # every process saves and evaluates (collectives under FSDP / DeepSpeed); only the main process writes the report
    save_model(trainer, training_args.output_dir)
    metrics = final_evaluation(trainer)  # the Trainer's evaluation after the last step (eval_strategy epoch), reused
    probe, drawn = probe_grounding(trainer.model, training_args, eval_dataset, collator, tokenizer)
    image_use = image_use_results(  # own image vs another image's regions: ~0 means the image is not read
        trainer.model, eval_dataset, collator, training_args.per_device_eval_batch_size, training_args.seed,
        args.image_use_examples,
    )  # fmt: skip
    results = {}
    if trainer.is_world_process_zero():
        truncation = truncation_results(
            args.max_text_length, {"train": train_truncation, "eval": eval_truncation}, [collator]
        )
        results = write_report(
            trainer, metrics, probe, drawn, data.source, args, training_args, eval_dataset, truncation, image_use,
            push_to_hub, type_counts,
        )  # fmt: skip
    return results


if __name__ == "__main__":
    run_command("finetune_vgp.py", main)
