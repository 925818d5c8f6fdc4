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

Without `--model_name_or_path` the model is a tiny randomly initialised `--tiny_family` model
(`hf_vlalign.vlms.tiny`); with it, any local folder or Hub id of a supported class and its processor. The data are
the synthetic scenes' Flickr30k Entities files and rendered images, or Flickr30k Entities (`--flickr30k_entities_dir`,
`--images_dir`).

`--use_peft` trains a LoRA adapter on the language model's layers (`hf_vlalign.lora`, flags as trl's: `--lora_r`,
`--lora_alpha`, `--lora_dropout`, `--lora_target_modules`, and `--lora_preset`); `--activation_checkpointing` works
with it. docs/scaling.md has the recipe for a 7 B model.

Writes to --output_dir: the model (with `--use_peft`: the adapter) and its processor, `eval_results.json` (losses on
the evaluation split, `grounding_probe`: per-head accuracy, best head among the actively attending ones, centre
baseline; `image_use`: the caption loss with another example's image; `diagnostics`: the mechanism diagnostics) and
`training_args.json`. Every transformers `TrainingArguments` flag works too, and those of
`PatchSupervisionTrainingArguments`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field

from transformers import AutoModelForImageTextToText, AutoProcessor, set_seed
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_vlalign.alignment.patches import DEFAULT_COVERAGE_THRESHOLD
from hf_vlalign.evaluation.diagnostics import mechanism_diagnostics
from hf_vlalign.evaluation.image_use import shuffled_rows
from hf_vlalign.lora import LORA_PRESETS, lora_config
from hf_vlalign.recipes import (
    SubsetArguments,
    final_evaluation,
    parse_recipe_args,
    SYNTHETIC_WORLD_HELP,
    synthetic_scene_config,
    training_callbacks,
    write_results,
)
from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
from hf_vlalign.trainers.patch_supervision import PatchSupervisionTrainer, PatchSupervisionTrainingArguments
from hf_vlalign.utils.user_errors import run_command
from hf_vlalign.vlms import PatchGroundingCollator, grounded_caption_examples, patch_batches, probe_patch_model
from hf_vlalign.vlms.tiny import MAX_IMAGE_SIZE, TINY_FAMILIES, tiny_patch_model, word_level_tokenizer

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
        default="llava", metadata={"help": f"without a model: a tiny random one of {TINY_FAMILIES}."}
    )
    tiny_image_size: int = field(default=128)
    tiny_patch_size: int = field(default=16)
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
    processor = AutoProcessor.from_pretrained(args.model_name_or_path)
    model = AutoModelForImageTextToText.from_pretrained(
        args.model_name_or_path, dtype=args.dtype, attn_implementation=args.attn_implementation
    )
    return model, processor


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


def load_examples(args: PatchVLMArguments) -> tuple[list[dict], list[dict], dict, str]:
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
    # `--max_train_samples` / `--max_eval_samples`: the first N grounded captions of the images read
    train, evaluation = train[: args.max_train_samples], evaluation[: args.max_eval_samples]
    train_counts["captions_used"], eval_counts["captions_used"] = len(train), len(evaluation)
    return train, evaluation, {"train": train_counts, "eval": eval_counts}, source


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


def main(argv: list[str] | None = None) -> dict:
    args, training_args = parse_args(sys.argv[1:] if argv is None else argv)
    set_seed(training_args.seed)
    train, evaluation, counts, source = load_examples(args)
    model, processor = load_model(args, training_args.seed, train)
    model = with_lora(args, model)
    collator = PatchGroundingCollator(processor, model.config, args.prompt, args.coverage_threshold)
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
    trainer.save_model(training_args.output_dir)
    results["image_use"] = caption_image_use(trainer, evaluation, results, training_args.seed)
    # minus the caption loss with the own / another image; the supervision loss at the start and end of training
    results["diagnostics"] = mechanism_diagnostics(
        results["image_use"], {"caption": "loss"}, trainer.state.log_history, attention_loss_key="loss_attention"
    )
    if trainer.accelerator.is_main_process:
        results["grounding_probe"] = probe_results(
            trainer, collator, evaluation, training_args.per_device_eval_batch_size
        )
        results["data"] = {"source": source, **counts, "phrases_cut_by_max_text_length": collator.truncated_phrases}
        write_results(
            training_args.output_dir, results, None, push_to_hub=False, training_args=training_args, commit_message=""
        )
        logger.info(json.dumps(results["grounding_probe"], indent=2)[:2000])
    return results


if __name__ == "__main__":
    run_command("finetune_patch_vlm.py", main)
