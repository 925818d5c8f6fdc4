#!/usr/bin/env python
"""Estimated GPU memory of a supervised training step of LLaVA-1.5-7B (`llava-hf/llava-1.5-7b-hf`), from the model's
shapes: one GPU with a LoRA adapter, and 8 GPUs with FSDP2 full fine-tuning; the table of docs/scaling.md
("Supervising a 7 B vision-language model").

    python benchmarks/memory_estimate.py              # benchmarks/results/memory_estimate_7b.json + the docs block
    python benchmarks/memory_estimate.py --docs_only benchmarks/results/memory_estimate_7b.json

Nothing is measured: parameters are counted exactly on a model built from the config on the meta device (no memory
used), the LoRA parameters from the library's own preset (`hf_vlalign.lora.lora_config`), and every other row is a
formula of the shapes (`estimate` and the functions it calls; docs/scaling.md states each). The config: the numbers of
llava-hf/llava-1.5-7b-hf's config.json (`CONFIG_SOURCE`); what it leaves out are `LlamaConfig`'s defaults, Vicuna-7B
v1.5's (= Llama-2-7B's) shape, written out in `llava_15_7b_config` so that no default of another transformers
version changes them. tests/project/test_memory_estimate.py checks the committed results against this script, the
docs block against the committed results, and the parameter counts against a meta-device model of its own.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

from hf_vlalign.vlms.supervision import ROLLOUT_CHUNK_ROWS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "memory_estimate_7b.json"
DOCS_BEGIN = "<!-- benchmarks/memory_estimate.py: begin -->"
DOCS_END = "<!-- benchmarks/memory_estimate.py: end -->"

MODEL = "llava-hf/llava-1.5-7b-hf"
CONFIG_SOURCE = (
    "https://huggingface.co/mohitsha/llava-1.5-7b-hf/blob/main/config.json (a copy of llava-hf/llava-1.5-7b-hf's "
    "config.json, its `_name_or_path`): text_config vocab_size 32064, max_position_embeddings 4096, rms_norm_eps "
    "1e-05 (LlamaConfig's defaults for the rest: hidden 4096, intermediate 11008, 32 layers, 32 heads); vision_config "
    "hidden 1024, intermediate 4096, 24 layers, 16 heads, image 336, patch 14; vision_feature_layer -2, "
    "vision_feature_select_strategy default, image_token_index 32000, pad_token_id 32001, tie_word_embeddings false"
)
BF16, FP32 = 2, 4
# one view: CLIP ViT-L/14 at 336 px, 24 x 24 patches (+ its [CLS] inside the vision tower, dropped by "default")
VIEW_TOKENS = 576
# 576: LLaVA-1.5's one view; 2,880: the token count of LLaVA-NeXT's five views of 576 (LLaVA-NeXT itself: issue 50)
IMAGE_TOKENS = (576, 2880)
SETTINGS = {
    "text_tokens": 64,  # per example: the chat prompt around <image> and a grounded caption (batch 1)
    "batch_size": 1,
    "lora_r": 16,  # examples/finetune_patch_vlm.py's default (trl's)
    "lora_preset": "attention",
    "gpus": 8,
    "direct_supervised_layers": 1,  # the trainer's default: the last layer, every head
    "semi_direct_recorded_layers": 32,  # rollout up to the last layer: every layer recorded
    "semi_direct_rows": 64,  # the rollout's rows: the grounded tokens', counted as every text position (an upper bound)
    "semi_direct_chunk": ROLLOUT_CHUNK_ROWS,  # rows of one layer's attention computed at a time
}


def llava_15_7b_config() -> LlavaConfig:
    """LLaVA-1.5-7B's config (`CONFIG_SOURCE`), every shape written out."""
    text = LlamaConfig(
        vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5, pad_token_id=32001,
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, image_size=336,
        patch_size=14, projection_dim=768,
    )  # fmt: skip
    return LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=32000, projector_hidden_act="gelu",
        vision_feature_layer=-2, vision_feature_select_strategy="default", tie_word_embeddings=False,
        image_seq_length=VIEW_TOKENS,
    )  # fmt: skip


def meta_model(config: LlavaConfig) -> LlavaForConditionalGeneration:
    with torch.device("meta"):
        return LlavaForConditionalGeneration(config)


def _numel(module: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def parameter_counts(config: LlavaConfig, lora_r: int, lora_preset: str) -> dict[str, int]:
    """Exact counts of a meta-device model: the parts, one decoder layer (the largest FSDP unit), the FSDP root unit
    (what no decoder or CLIP encoder layer holds) and the LoRA parameters of `lora_config(model, r, preset=...)`."""
    from hf_vlalign.lora import lora_config

    model = meta_model(config)
    base = model.model
    vision_layers = base.vision_tower.encoder.layers
    decoder_layers = base.language_model.layers
    lora = lora_config(model, r=lora_r, preset=lora_preset)
    adapted = [
        module for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and re.fullmatch(lora.target_modules, name)
    ]  # fmt: skip
    total = _numel(model)
    return {
        "total": total,
        "vision_tower": _numel(base.vision_tower),
        "projector": _numel(base.multi_modal_projector),
        "language_model": _numel(base.language_model),
        "lm_head": _numel(model.lm_head),
        "decoder_layer": _numel(decoder_layers[0]),
        "vision_layer": _numel(vision_layers[0]),
        "fsdp_root": total - _numel(decoder_layers) - _numel(vision_layers),
        "lora": sum(lora_r * (module.in_features + module.out_features) for module in adapted),
        "lora_modules": len(adapted),
    }


# ---------------------------------------------------------------------------------------------------------------------
# the formulas (bytes); S: sequence length (image + text tokens), batch 1


def layer_recompute_bytes(tokens: int, hidden: int, intermediate: int, heads: int, ffn_tensors: int) -> int:
    """One transformer layer recomputed in the backward under checkpointing: the tensors it saves for backward (10 of
    S x hidden: two norms' inputs and outputs, q, k, v, rotated q and k, the attention output; `ffn_tensors` of S x
    intermediate: Llama's gate, up, act(gate), act(gate) * up, CLIP's fc1 and gelu outputs), bf16; plus the attention
    kernel's working set (flash / memory-efficient sdpa: the fp32 log-sum-exp per head and row, and dQ, dK, dV)."""
    saved = tokens * (10 * hidden + ffn_tensors * intermediate) * BF16
    kernel = heads * tokens * FP32 + 3 * tokens * hidden * BF16
    return saved + kernel


def checkpoint_bytes(layers: int, tokens: int, hidden: int) -> int:
    """Each checkpointed layer's input hidden states, bf16."""
    return layers * tokens * hidden * BF16


def logits_bytes(tokens: int, vocab: int) -> int:
    """The language-model head's logits at every position: bf16, their fp32 copy for the loss, its gradient (fp32)."""
    return tokens * vocab * (BF16 + FP32 + FP32)


def recorded_query_key_bytes(layers: int, tokens: int, hidden: int, key_value_hidden: int) -> int:
    """The queries and keys the recorder keeps of each recorded layer until the loss is computed, bf16."""
    return layers * tokens * (hidden + key_value_hidden) * BF16


def direct_supervision_bytes(layers: int, heads: int, text_tokens: int, image_tokens: int) -> int:
    """Direct supervision: per supervised layer and head, the text rows x image tokens logits (bf16), their fp32
    log-probabilities kept for the backward and its gradient (fp32)."""
    return layers * heads * text_tokens * image_tokens * (BF16 + FP32 + FP32)


def semi_direct_rows_only_bytes(layers: int, heads: int, rows: int, chunk: int, tokens: int) -> int:
    """Semi-direct supervision computed from the supervised rows only (`semi_direct_rollout="supervised_rows"`, the
    rollout's k text rows, hf_vlalign.vlms.supervision): per recorded layer, the k rows of the rollout over the S tokens (fp32), plus one chunk of
    `chunk` rows of one layer's attention probabilities for every head alive at a time (fp32): O((k + chunk) x S) per
    layer, linear in the tokens."""
    return layers * rows * tokens * FP32 + heads * chunk * tokens * FP32


def semi_direct_full_rollout_bytes(layers: int, heads: int, tokens: int) -> int:
    """Semi-direct supervision from full maps (for comparison): per recorded layer, every head's S x S probabilities and
    the S x S rollout, fp32: quadratic in the tokens."""
    return layers * (heads + 1) * tokens * tokens * FP32


def activation_rows(config: LlavaConfig, image_tokens: int, text_tokens: int) -> dict[str, int]:
    """The activations of one example (batch 1) with activation checkpointing, per GPU."""
    text, vision = config.text_config, config.vision_config
    tokens = image_tokens + text_tokens
    views = image_tokens // VIEW_TOKENS
    view_tokens = (vision.image_size // vision.patch_size) ** 2 + 1  # + CLIP's [CLS]
    vision_tokens = views * view_tokens
    return {
        "language model: checkpointed layer inputs": checkpoint_bytes(text.num_hidden_layers, tokens, text.hidden_size),
        "language model: one layer recomputed + attention kernel": layer_recompute_bytes(
            tokens, text.hidden_size, text.intermediate_size, text.num_attention_heads, ffn_tensors=4
        ),
        "vision tower: checkpointed inputs + one layer recomputed": checkpoint_bytes(
            vision.num_hidden_layers, vision_tokens, vision.hidden_size
        )
        + layer_recompute_bytes(
            vision_tokens, vision.hidden_size, vision.intermediate_size, vision.num_attention_heads, ffn_tensors=2
        ),
        "language-model head logits": logits_bytes(tokens, text.vocab_size),
    }


def supervision_rows(config: LlavaConfig, image_tokens: int, settings: dict) -> dict[str, int]:
    text = config.text_config
    tokens, heads = image_tokens + settings["text_tokens"], text.num_attention_heads
    key_value = text.num_key_value_heads * text.hidden_size // heads
    direct_layers, recorded = settings["direct_supervised_layers"], settings["semi_direct_recorded_layers"]
    return {
        "supervision, direct": direct_supervision_bytes(direct_layers, heads, settings["text_tokens"], image_tokens)
        + recorded_query_key_bytes(direct_layers, tokens, text.hidden_size, key_value),
        "supervision, semi-direct (rows only)": semi_direct_rows_only_bytes(
            recorded, heads, settings["semi_direct_rows"], settings["semi_direct_chunk"], tokens
        )
        + recorded_query_key_bytes(recorded, tokens, text.hidden_size, key_value),
        "supervision, semi-direct (full maps)": semi_direct_full_rollout_bytes(recorded, heads, tokens)
        + recorded_query_key_bytes(recorded, tokens, text.hidden_size, key_value),
    }


def state_rows(counts: dict[str, int], setting: str, gpus: int) -> dict[str, int]:
    """Weights, trained parameters, gradients and optimizer states per GPU."""
    if setting == "one_gpu_lora":
        return {
            "weights (bf16, frozen)": counts["total"] * BF16,
            # fp32 adapter (peft upcasts it), its gradient, AdamW's two moments
            "LoRA adapter (fp32) + gradients + AdamW states": counts["lora"] * 4 * FP32,
        }
    # FSDP2 full fine-tuning: fp32 sharded parameters and gradients, AdamW's two fp32 moments, all sharded by `gpus`;
    # bf16 copies of the root unit (kept gathered) and of two decoder layers (the one computing, the one prefetched),
    # and one decoder layer's unsharded bf16 gradient before its reduce-scatter (accelerate's FSDP2 policy for
    # mixed_precision bf16: param_dtype and reduce_dtype bf16, accelerate/utils/dataclasses.py)
    return {
        "weights (fp32 master, sharded)": counts["total"] * FP32 // gpus,
        "gradients (fp32, sharded)": counts["total"] * FP32 // gpus,
        "AdamW states (fp32, sharded)": counts["total"] * 2 * FP32 // gpus,
        "gathered units (bf16 root + 2 layers, 1 layer's gradient)": (counts["fsdp_root"] + 3 * counts["decoder_layer"])
        * BF16,
    }  # fmt: skip


STATE_ROWS = (
    "weights (bf16, frozen)",
    "LoRA adapter (fp32) + gradients + AdamW states",
    "weights (fp32 master, sharded)",
    "gradients (fp32, sharded)",
    "AdamW states (fp32, sharded)",
    "gathered units (bf16 root + 2 layers, 1 layer's gradient)",
)
SETTING_NAMES = {"one_gpu_lora": "1 GPU, LoRA", "eight_gpus_fsdp2_full": "8 GPUs, FSDP2 full fine-tuning"}
# rows left out of the totals: an alternative shown for comparison
NOT_IN_TOTALS = ("supervision, semi-direct (full maps)",)


def estimate(settings: dict = SETTINGS) -> dict:
    """The results file's content: config, parameter counts, settings and, per setting and image-token count, each
    row and the totals with direct and with rows-only semi-direct supervision (bytes per GPU)."""
    config = llava_15_7b_config()
    counts = parameter_counts(config, settings["lora_r"], settings["lora_preset"])
    estimates = {}
    for setting in SETTING_NAMES:
        for image_tokens in IMAGE_TOKENS:
            rows = {
                **state_rows(counts, setting, settings["gpus"]),
                **activation_rows(config, image_tokens, settings["text_tokens"]),
                **supervision_rows(config, image_tokens, settings),
            }
            common = sum(value for name, value in rows.items() if not name.startswith("supervision"))
            rows["total, direct supervision"] = common + rows["supervision, direct"]
            rows["total, semi-direct (rows only)"] = common + rows["supervision, semi-direct (rows only)"]
            estimates[f"{setting}/{image_tokens}"] = rows
    return {
        "model": MODEL,
        "config_source": CONFIG_SOURCE,
        "config": {"text": _shape(config.text_config), "vision": _shape(config.vision_config)},
        "parameters": counts,
        "settings": settings,
        "image_tokens": list(IMAGE_TOKENS),
        "bytes_per_gpu": estimates,
    }


def _shape(config) -> dict:
    names = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "image_size", "patch_size")  # fmt: skip
    return {name: getattr(config, name) for name in names if hasattr(config, name)}


# ---------------------------------------------------------------------------------------------------------------------
# the docs block


def _gib(value: int) -> str:
    return f"{value / 2**30:,.2f}"


def table(report: dict) -> str:
    columns = [(setting, tokens) for setting in SETTING_NAMES for tokens in report["image_tokens"]]
    header = " | ".join(f"{SETTING_NAMES[setting]}, {tokens:,} image tokens" for setting, tokens in columns)
    lines = [f"| GiB per GPU | {header} |", "|---" + "|---:" * len(columns) + "|"]
    every = list(dict.fromkeys(name for rows in report["bytes_per_gpu"].values() for name in rows))
    # the weights and optimizer rows of every setting, then activations and supervision, then the totals
    states = [name for name in every if name in STATE_ROWS]
    names = states + [n for n in every if n not in states and not n.startswith("total")] + [
        n for n in every if n.startswith("total")
    ]
    for name in names:
        cells = [report["bytes_per_gpu"][f"{s}/{t}"].get(name) for s, t in columns]
        label = f"**{name}**" if name.startswith("total") else name
        label += " (not in the totals)" if name in NOT_IN_TOTALS else ""
        lines.append(f"| {label} | " + " | ".join("-" if cell is None else _gib(cell) for cell in cells) + " |")
    counts, settings = report["parameters"], report["settings"]
    lines += [
        "",
        f"Parameters (counted on a meta-device `LlavaForConditionalGeneration` of {report['model']}'s config): "
        f"{counts['total']:,} in all: vision tower {counts['vision_tower']:,}, projector {counts['projector']:,}, "
        f"language model {counts['language_model']:,}, head {counts['lm_head']:,}; one decoder layer "
        f"{counts['decoder_layer']:,}; LoRA r = {settings['lora_r']} on the \"{settings['lora_preset']}\" preset: "
        f"{counts['lora']:,} in {counts['lora_modules']} modules. Batch 1, {settings['text_tokens']} text tokens; "
        f"semi-direct: {settings['semi_direct_recorded_layers']} recorded layers, k = {settings['semi_direct_rows']} "
        f"rows, chunks of {settings['semi_direct_chunk']}.",
    ]
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    return f"{DOCS_BEGIN}\n{table(report)}\n{DOCS_END}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results JSON (default: %(default)s)")
    parser.add_argument("--docs_only", type=Path, default=None, metavar="RESULTS",
                        help="only rewrite the docs block from this results JSON")  # fmt: skip
    args = parser.parse_args(argv)
    if args.docs_only is not None:
        report = json.loads(args.docs_only.read_text())
    else:
        report = estimate()
        write_results(args.out, report)
    print(f"rewrote {replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))}")
    return report


if __name__ == "__main__":
    main()
