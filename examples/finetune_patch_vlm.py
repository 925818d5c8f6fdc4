#!/usr/bin/env python
"""Fine-tune one of transformers' own patch vision-language models (LLaVA, PaliGemma, ViLT) on grounded captions,
with or without Samaran et al.'s attention supervision, then run Li et al.'s grounding probe with patches as regions.

LLaVA and PaliGemma learn to caption (their language-model loss on the caption); `--attention_supervision direct`
(or `semi_direct`) adds the supervision of the chosen layers' and heads' text->image attention towards the patches
each grounded phrase's gold box covers (`hf_vlalign.vlms`). The model's code is not copied: its attention is
recorded through transformers' attention interface (LLaVA, PaliGemma) or hooks (ViLT).

    accelerate launch examples/finetune_patch_vlm.py                       # offline: a tiny random LLaVA, scenes
    accelerate launch examples/finetune_patch_vlm.py --attention_supervision direct --supervised_layers 2
    accelerate launch examples/finetune_patch_vlm.py --model_name_or_path llava-hf/llava-1.5-7b-hf \
        --flickr30k_entities_dir flickr30k_entities --images_dir flickr30k-images --attention_supervision direct
    accelerate launch examples/finetune_patch_vlm.py --train_file train.jsonl --validation_file val.jsonl

Without `--model_name_or_path` the model is a tiny randomly initialised `--tiny_family` model
(`hf_vlalign.vlms.tiny`); with it, any local folder or Hub id of a supported family (`hf_vlalign.vlms.families`), loaded
with the class its config names (`hf_vlalign.vlms.loading.load_patch_model`), and its processor. The data are the
synthetic scenes' Flickr30k Entities files and rendered images, Flickr30k Entities (`--flickr30k_entities_dir`,
`--images_dir`), or your own file (`--train_file`, `--validation_file`: the user-data format of docs/own_data.md, a
`caption` file of captions with boxed phrases or, with `--user_data_task refcoco`, a file of referring expressions
and their boxes).

`--use_peft` trains a LoRA adapter on the language model's layers (`hf_vlalign.lora`, flags as trl's: `--lora_r`,
`--lora_alpha`, `--lora_dropout`, `--lora_target_modules`, and `--lora_preset`); `--activation_checkpointing` works
with it. docs/scaling.md has the recipe for a 7 B model.

Writes to --output_dir: the model (with `--use_peft`: the adapter) and its processor, `eval_results.json` (losses on
the evaluation split, `grounding_probe`: per-head accuracy, best head among the actively attending ones, centre
baseline; `image_use`: the caption loss with another example's image; `diagnostics`: the mechanism diagnostics; the
grounding summary `hf-vlalign results-table` reads), the model card (README.md) and `training_args.json`. Every
transformers `TrainingArguments` flag works too, and those of `PatchSupervisionTrainingArguments`; `--push_to_hub`
pushes the complete folder last (a failed push leaves it whole and says how to push it again).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import set_seed
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_vlalign.alignment.patches import DEFAULT_COVERAGE_THRESHOLD
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.image_use import shuffled_rows
from hf_vlalign.hub.patch_model_card import render_patch_model_card
from hf_vlalign.lora import LORA_PRESETS, lora_config
from hf_vlalign.recipes import (
    SubsetArguments,
    final_evaluation,
    parse_recipe_args,
    patch_user_splits,
    save_model,
    SYNTHETIC_WORLD_HELP,
    synthetic_scene_config,
    take_push_to_hub,
    trained_amount,
    training_callbacks,
    write_results,
)
from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
from hf_vlalign.trainers.patch_supervision import PatchSupervisionTrainer, PatchSupervisionTrainingArguments
from hf_vlalign.utils.user_errors import run_command
from hf_vlalign.vlms import (
    PatchGroundingCollator,
    grounded_caption_examples,
    patch_batches,
    patch_model_family,
    probe_patch_model,
)
from hf_vlalign.vlms.loading import load_patch_model
from hf_vlalign.vlms.tiny import (
    MAX_IMAGE_SIZE,
    MULTIVIEW_FAMILIES,
    TINY_FAMILIES,
    tiny_patch_model,
    word_level_tokenizer,
)
from hf_vlalign.vlms.user_data import PATCH_USER_TASKS

logger = logging.getLogger(__name__)

TINY_VOCABULARIES = ("data", "default_text_model")
DTYPES = ("auto", "bfloat16", "float16", "float32")
# a kernel on the Hub, optionally with its function: "kernels-community/flash-attn", "org/repo:function"
HUB_KERNEL = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]+)?")


@dataclass
class PatchVLMArguments(SubsetArguments):
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "local folder or Hub id of a LLaVA / PaliGemma / ViLT model and its processor."}
    )
    dtype: str = field(
        default="auto",
        metadata={"help": f"dtype of a loaded model's weights: one of {DTYPES} (auto: the checkpoint's)."},
    )
    tiny_family: str = field(
        default="llava",
        metadata={"help": f"without a model: a tiny random one of {TINY_FAMILIES}, or of a multi-view family given by "
                          f"its model_type: {MULTIVIEW_FAMILIES}."},
    )
    tiny_image_size: int = field(
        default=128,
        metadata={"help": "the side of a one-grid model's square image; of a multi-view family's view (a tile, a crop; "
                          "Qwen-VL's dynamic resolution keeps each image's own size and aspect up to four such views' "
                          "pixels, rounded to its 2 x 2 merged patches)."},
    )
    tiny_patch_size: int = field(
        default=16,
        metadata={"help": "the vision encoder's patch side (multi-view families: an even number per view, for their "
                          "2 x 2 merges)."},
    )
    tiny_hidden_size: int = field(default=64)
    tiny_layers: int = field(default=4)
    tiny_heads: int = field(default=4)
    tiny_vision_layers: int = field(default=2)
    tiny_vocabulary: str = field(
        default="data",
        metadata={
            "help": "a tiny model's tokenizer: 'data' (the training captions' words: a small language-model head) "
            "or 'default_text_model' (the embedded default's WordPiece, 30,522 words)"
        },
    )
    flickr30k_entities_dir: str | None = field(
        default=None, metadata={"help": "Flickr30k Entities folder (default: synthetic scenes)."}
    )
    images_dir: str | None = field(
        default=None, metadata={"help": "the images of --flickr30k_entities_dir (<id>.jpg)."}
    )
    train_file: str | None = field(
        default=None,
        metadata={"help": "your own data: a JSON lines (.jsonl) or CSV file in the user-data format (docs/own_data.md; "
                          "image paths relative to the file), of --user_data_task. Replaces the synthetic scenes."},
    )
    validation_file: str | None = field(
        default=None,
        metadata={"help": "the evaluation rows, in --train_file's format (default: the rows of a seeded 10%% of the "
                          "training file's images, at least 2, are held out for evaluation)."},
    )
    user_data_task: str = field(
        default="caption",
        metadata={"help": f"the user-data task of --train_file: one of {tuple(PATCH_USER_TASKS)} (captions with boxed "
                          "phrases, or referring expressions with the box they refer to)."},
    )
    train_split: str = field(default="train")
    eval_split: str = field(default="val")
    max_train_images: int | None = field(default=None, metadata={"help": "read the first N training images."})
    max_eval_images: int | None = field(default=None, metadata={"help": "read the first N evaluation images."})
    synthetic_seed: int = field(default=0, metadata={"help": "seed of the synthetic scenes (default data)."})
    synthetic_train_images: int = field(default=800)
    synthetic_eval_images: int = field(default=150)
    synthetic_distractors: bool = field(default=False, metadata={"help": "scenes whose target has distractors."})
    synthetic_world: str = field(default="v1", metadata={"help": SYNTHETIC_WORLD_HELP})
    coverage_threshold: float = field(
        default=DEFAULT_COVERAGE_THRESHOLD,
        metadata={"help": "share of a patch inside a gold box for it to count as covered."},
    )
    prompt: str | None = field(
        default=None, metadata={"help": "text between image and caption (PaliGemma: 'caption en')."}
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "the model's attention: eager, sdpa, flex_attention, a registered name or a Hub kernel id "
        "(default: the model's); the supervision records the layers it supervises under that kernel."},
    )
    # LoRA, named as trl's `ModelConfig` names it (+ `lora_preset`, hf_vlalign.lora's presets)
    use_peft: bool = field(default=False, metadata={"help": "train a LoRA adapter (peft) instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (updates scaled by alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "dropout on the LoRA input."})
    lora_preset: str = field(
        default="attention",
        metadata={"help": f"the language model's layers to adapt: one of {LORA_PRESETS} (hf_vlalign.lora)."},
    )
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "peft `target_modules` replacing --lora_preset: module names, each matched as a suffix "
                          "(in the vision tower too)."},
    )

    def __post_init__(self):
        if self.tiny_family not in (*TINY_FAMILIES, *MULTIVIEW_FAMILIES):
            raise ValueError(
                f"`--tiny_family` must be one of {(*TINY_FAMILIES, *MULTIVIEW_FAMILIES)}, got {self.tiny_family!r}."
            )
        if self.user_data_task not in PATCH_USER_TASKS:
            raise ValueError(
                f"`--user_data_task` must be one of {tuple(PATCH_USER_TASKS)}, got {self.user_data_task!r}."
            )
        if self.validation_file is not None and self.train_file is None:
            raise ValueError("`--validation_file` applies only to your own data: pass `--train_file` with it.")
        if self.train_file is not None and self.flickr30k_entities_dir is not None:
            raise ValueError(
                f"`--flickr30k_entities_dir` names another data source than `--train_file` {self.train_file}: drop one."
            )
        if self.tiny_image_size > MAX_IMAGE_SIZE:
            raise ValueError(f"`--tiny_image_size` must be at most {MAX_IMAGE_SIZE} pixels, got {self.tiny_image_size}.")
        implementations = ("eager", *ALL_ATTENTION_FUNCTIONS.valid_keys())
        name = self.attn_implementation
        # a Hub kernel ("kernels-community/flash-attn") is registered by `from_pretrained` through the `kernels` package
        if name is not None and name not in implementations and not HUB_KERNEL.fullmatch(name):
            raise ValueError(
                f"`--attn_implementation` must be one of {implementations} (transformers' `AttentionInterface`) or a "
                f"Hub kernel id such as 'kernels-community/flash-attn', got {name!r}."
            )


def parse_args(argv: list[str]) -> tuple[PatchVLMArguments, PatchSupervisionTrainingArguments]:
    return parse_recipe_args(
        argv,
        (PatchVLMArguments,),
        PatchSupervisionTrainingArguments,
        output_dir="outputs/patch_vlm",
        num_train_epochs=2,
        learning_rate=1e-3,  # a tiny randomly initialised model; fine-tuning a released model wants ~2e-5
        warmup_steps=20,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
    )


def load_model(args: PatchVLMArguments, seed: int, train: list[dict]):
    if args.model_name_or_path is None:
        if args.tiny_vocabulary not in TINY_VOCABULARIES:
            raise ValueError(f"`--tiny_vocabulary` must be one of {TINY_VOCABULARIES}, got {args.tiny_vocabulary!r}.")
        sizes = dict(
            image_size=args.tiny_image_size,
            patch_size=args.tiny_patch_size,
            hidden_size=args.tiny_hidden_size,
            num_layers=args.tiny_layers,
            num_heads=args.tiny_heads,
            vision_layers=args.tiny_vision_layers,
            attn_implementation=args.attn_implementation,
        )
        tokenizer = word_level_tokenizer(row["caption"] for row in train) if args.tiny_vocabulary == "data" else None
        return tiny_patch_model(args.tiny_family, seed=seed, tokenizer=tokenizer, **sizes)
    if args.dtype not in DTYPES:
        raise ValueError(f"`--dtype` must be one of {DTYPES}, got {args.dtype!r}.")
    # the class the config names (AutoModelForImageTextToText has no ViLT), after a refusal naming the families
    return load_patch_model(
        args.model_name_or_path, "--model_name_or_path", dtype=args.dtype, attn_implementation=args.attn_implementation
    )


def with_lora(args: PatchVLMArguments, model):
    """`model` wrapped by peft with a LoRA adapter on the language model (`--use_peft`), or `model` itself."""
    if not args.use_peft:
        return model
    if args.lora_preset not in LORA_PRESETS:
        raise ValueError(f"`--lora_preset` must be one of {LORA_PRESETS}, got {args.lora_preset!r}.")
    if args.lora_r <= 0:
        raise ValueError(f"`--lora_r` must be a positive rank, got {args.lora_r}.")
    from peft import get_peft_model

    target_modules = {"target_modules": args.lora_target_modules} if args.lora_target_modules else {}
    config = lora_config(model, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_preset, **target_modules)
    return get_peft_model(model, config)


def load_examples(args: PatchVLMArguments, seed: int = 42) -> tuple[list[dict], list[dict], dict, str]:
    """(training examples, evaluation examples, counts, source): `--train_file`, Flickr30k Entities or the synthetic
    scenes; `seed` draws the evaluation images held out of a `--train_file` without `--validation_file`."""
    if args.train_file is not None:
        train, evaluation, counts, source = patch_user_splits(
            args.train_file, args.validation_file, args.user_data_task, seed
        )
        return _first_samples(args, train, evaluation, counts) + (source,)
    if args.flickr30k_entities_dir is None:
        if args.images_dir is not None:
            raise ValueError("`--images_dir` goes with `--flickr30k_entities_dir`, got no --flickr30k_entities_dir.")
        paths = load_or_generate_synthetic_vgp(config=synthetic_scene_config(args))
        root, images, source = paths.flickr30k_entities, paths.images, "synthetic scenes"
    elif args.images_dir is None:
        raise ValueError("`--flickr30k_entities_dir` needs `--images_dir` (the Flickr30k images), got none.")
    else:
        root, images, source = (
            args.flickr30k_entities_dir,
            args.images_dir,
            f"Flickr30k Entities ({args.flickr30k_entities_dir})",
        )
    train, train_counts = grounded_caption_examples(root, images, args.train_split, args.max_train_images)
    evaluation, eval_counts = grounded_caption_examples(root, images, args.eval_split, args.max_eval_images)
    return _first_samples(args, train, evaluation, {"train": train_counts, "eval": eval_counts}) + (source,)


def _first_samples(args: PatchVLMArguments, train: list[dict], evaluation: list[dict], counts: dict) -> tuple:
    """`--max_train_samples` / `--max_eval_samples`: the first N grounded captions of the examples read."""
    train, evaluation = train[: args.max_train_samples], evaluation[: args.max_eval_samples]
    counts["train"]["captions_used"], counts["eval"]["captions_used"] = len(train), len(evaluation)
    return train, evaluation, counts


def probe_results(trainer, collator, examples: list[dict], batch_size: int) -> dict:
    result = probe_patch_model(
        trainer.model, patch_batches(collator, examples, batch_size), collator.coverage_threshold
    )
    report = result.to_dict()
    report["best_head_of_layer"] = [float(row.max()) for row in result.accuracy]
    return report


def caption_image_use(trainer, evaluation: list[dict], own: dict, seed: int) -> dict:
    """The caption loss with each example's own image (`own`: the final evaluation) and with another example's image
    (`shuffled_rows`: each image replaced by the next of a seeded cycle), and their gap; every process evaluates."""
    shuffled = trainer.evaluate(shuffled_rows(evaluation, seed), metric_key_prefix="eval_shuffled_image")
    own_loss, shuffled_loss = own["eval_loss_task"], shuffled["eval_shuffled_image_loss_task"]
    gap = shuffled_loss - own_loss
    return {"own_image_loss": own_loss, "shuffled_image_loss": shuffled_loss, "image_use_loss_gap": gap}


def grounding_summary(probe: dict) -> dict:
    """The probe's flat results (`hf-vlalign results-table`, the model card) and the centre patch as their baseline."""
    baseline = {"baseline": probe["baseline_accuracy"], "kind": "centre_patch"}
    return {
        "grounding_accuracy_best_head": probe["best_head_accuracy"],
        "grounding_accuracy_mean_head": probe["mean_head_accuracy"],
        "grounding_baseline_accuracy": probe["baseline_accuracy"],
        "baselines": {
            key: {**baseline, "beats": probe[name] > probe["baseline_accuracy"]}
            for key, name in (("grounding_accuracy_best_head", "best_head_accuracy"),
                              ("grounding_accuracy_mean_head", "mean_head_accuracy"))
        },
    }  # fmt: skip


def dataset_name(args: PatchVLMArguments) -> str | None:
    """The training data's name on the model card; None: the synthetic scenes."""
    if args.train_file is not None:
        return f"user data ({Path(args.train_file).name})"
    return None if args.flickr30k_entities_dir is None else "Flickr30k Entities"


def model_card(args: PatchVLMArguments, trainer, results: dict, source: str):
    card_keys = ("eval_loss_task", "eval_loss_attention", "grounding_accuracy_best_head", "grounding_accuracy_mean_head")
    card_results = {key: results[key] for key in card_keys if key in results}
    training = {
        "data": source,
        "trained": trained_amount(trainer),
        "learning_rate": trainer.args.learning_rate,
        "batch_size": trainer.args.per_device_train_batch_size,
        "seed": trainer.args.seed,
        "train_examples": len(trainer.train_dataset),
        "eval_examples": len(trainer.eval_dataset),
        "lora": f"r={args.lora_r}, alpha={args.lora_alpha}, {args.lora_preset}" if args.use_peft else "no",
    }
    return render_patch_model_card(
        trainer.model, model_id=trainer.args.hub_model_id, base_model=args.model_name_or_path,
        supervision=trainer.args.attention_supervision, results=card_results, training=training,
        baselines={key: results["baselines"][key] for key in card_results if key in results["baselines"]},
        dataset_name=dataset_name(args),
    )  # fmt: skip


def has_caption_labels(collator: PatchGroundingCollator, example: dict) -> bool:
    """Whether the collator's batches carry caption `labels` (an encoder's, such as ViLT's, carry none)."""
    truncated = collator.truncated_phrases
    has_labels = "labels" in collator([example])
    collator.truncated_phrases = truncated  # this look is no part of the run's counts
    return has_labels


def main(argv: list[str] | None = None) -> dict:
    args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    set_seed(training_args.seed)
    push_to_hub = take_push_to_hub(training_args)  # pushed last, with the card: a failed push loses nothing
    train, evaluation, counts, source = load_examples(args, training_args.seed)
    model, processor = load_model(args, training_args.seed, train)
    model = with_lora(args, model)
    collator = PatchGroundingCollator(processor, model.config, args.prompt, args.coverage_threshold)
    if training_args.attention_supervision is None and not has_caption_labels(collator, train[0]):
        raise ValueError(
            f"`--attention_supervision` is needed for a {type(model).__name__}: its batches carry no caption labels "
            "(an encoder such as ViLT has no caption loss), so without supervision there is no loss to train; pass "
            "`--attention_supervision direct` or `semi_direct`."
        )
    trainer = PatchSupervisionTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=collator,
        processing_class=processor,
        callbacks=training_callbacks(training_args, len(evaluation)),  # bounded evaluations, learning_curve.json
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    results = final_evaluation(trainer)
    save_model(trainer, training_args.output_dir)  # the processor too, the arguments as JSON
    # ViLT has no caption loss (an encoder): its image use is not measured by one
    has_caption_loss = "eval_loss_task" in results
    if has_caption_loss:
        results["image_use"] = caption_image_use(trainer, evaluation, results, training_args.seed)
    # minus the caption loss with the own / another image; the supervision loss at the start and end of training
    results["diagnostics"] = mechanism_diagnostics(
        results.get("image_use", {}), {"caption": "loss"} if has_caption_loss else {}, trainer.state.log_history,
        attention_loss_key="loss_attention",
    )  # fmt: skip
    if trainer.accelerator.is_main_process:
        results["grounding_probe"] = probe_results(
            trainer, collator, evaluation, training_args.per_device_eval_batch_size
        )
        results.update(grounding_summary(results["grounding_probe"]))
        results["supervision"] = training_args.attention_supervision or "none"
        results["model_family"] = patch_model_family(trainer.model.config).name
        results["data"] = {"source": source, **counts, "phrases_cut_by_max_text_length": collator.truncated_phrases}
        write_results(
            training_args.output_dir, results, model_card(args, trainer, results, source), push_to_hub=push_to_hub,
            training_args=training_args, commit_message="finetune_patch_vlm.py: model, eval_results.json, model card",
        )  # fmt: skip
        logger.info(json.dumps(results["grounding_probe"], indent=2)[:2000])
    return results


if __name__ == "__main__":
    run_command("finetune_patch_vlm.py", main)
