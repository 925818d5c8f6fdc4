"""The image-token layout of every patch-model family, measured on its tiny model (`hf_vlalign.vlms.tiny`: 64-px views
of 16-px patches, multi-view settings on): for a landscape (96 x 48) and a portrait (40 x 112) image, the views the
model sees (`hf_vlalign.vlms.image_token_geometry`), their token grids and the image tokens in `input_ids`. Writes
benchmarks/results/vlm_token_layouts.json; `--docs` also rewrites the table of docs/vlms.md ("What works for each
family") between `DOCS_BEGIN` and `DOCS_END`.

    python benchmarks/vlm_token_layouts.py --docs
"""

from __future__ import annotations

import argparse
import sys
from itertools import groupby
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import ROOT, replace_docs_block, write_results  # noqa: E402

from hf_vlalign.vlms.families import FAMILIES, patch_model_family  # noqa: E402
from hf_vlalign.vlms.image_token_geometry import (  # noqa: E402
    REFUSED_MODEL_TYPES,
    image_placeholder,
    image_token_map,
    processor_call_kwargs,
    single_grid_token_map,
)
from hf_vlalign.vlms.localization_heads import DECODER_MODEL_TYPES  # noqa: E402
from hf_vlalign.vlms.recording import BIDIRECTIONAL_FAMILIES  # noqa: E402
from hf_vlalign.vlms.tiny import MULTIVIEW_FAMILIES, TINY_FAMILIES, tiny_patch_model, word_level_tokenizer  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "vlm_token_layouts.json"
DOCS_BEGIN = "<!-- benchmarks/vlm_token_layouts.py: begin -->"
DOCS_END = "<!-- benchmarks/vlm_token_layouts.py: end -->"
SIZES = ((96, 48), (40, 112))  # (width, height)
# what each family's image tokens are (the geometry of transformers 5.24, `image_token_geometry`)
LAYOUTS = {
    "vilt": "`ViltModel` and heads: patches of the padded image after the text (ViLT samples their order: read from its `visual_embed`)",
    "llava": "`LlavaForConditionalGeneration`: CLIP's centre crop, row-major; CLIP's [CLS] (\"full\") is no token box",
    "paligemma": "`PaliGemmaForConditionalGeneration`: SigLIP's squashed image, row-major, under the prefix-LM mask",
    "qwen2_vl": "`Qwen2VLForConditionalGeneration`: the image squashed to a dynamic resolution (`image_grid_thw`), 2 x 2 patches merged",
    "qwen2_5_vl": "`Qwen2_5_VLForConditionalGeneration`: as Qwen2-VL (window attention restores the raster order)",
    "qwen3_vl": "`Qwen3VLForConditionalGeneration`: as Qwen2-VL (deepstack features at the same positions)",
    "llava_next": "`LlavaNextForConditionalGeneration`: base view (squashed), then the best-resolution tiles' grid unpadded, a newline token (no box) after each row",
    "llava_onevision": "`LlavaOnevisionForConditionalGeneration`: as LLaVA-NeXT, the tiles' grid downsampled past 9 tiles (\"anyres_max_9\"); one image per example",
    "idefics3": "`Idefics3ForConditionalGeneration`: tiles of the resized image (row-major, `<row_i_col_j>` before each), then the global view; pixel shuffle 2 x 2",
    "smolvlm": "`SmolVLMForConditionalGeneration`: as Idefics3",
    "gemma3": "`Gemma3ForConditionalGeneration`: the whole image, then its pan-and-scan crops (the image processor's settings), each pooled to `mm_tokens_per_image`",
    "internvl": "`InternVLForConditionalGeneration`: tiles of the squashed image (row-major), then the thumbnail; pixel shuffle 0.5",
    "mistral3": "`Mistral3ForConditionalGeneration`: the image at its native resolution (`image_sizes`), 2 x 2 merged, row breaks (`[IMG_BREAK]`, `[IMG_END]`) are no image tokens",
}


def planted_image(size: tuple[int, int]) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def token_map_of(model_type: str, model, processor, size: tuple[int, int]):
    """The tiny model's `ImageTokenMap` of a `size` image."""
    image = planted_image(size)
    if model_type in MULTIVIEW_FAMILIES:
        text = f"{image_placeholder(model_type)} a dog"
        call_kwargs = processor_call_kwargs(model_type, processor.image_processor)
        inputs = processor(images=[[image]], text=[text], return_tensors="pt", **call_kwargs)
        count = int((inputs["input_ids"][0] == model.config.image_token_id).sum())
        return image_token_map(processor, model.config, size, inputs, 0, count)
    pixel_values = processor.image_processor(image, return_tensors="pt")["pixel_values"]
    grid = patch_model_family(model).grid(model.config, pixel_values)
    processed = (pixel_values.shape[-1], pixel_values.shape[-2])
    return single_grid_token_map(processor.image_processor, size, processed, grid)


def measure() -> dict:
    """Every family's views of the two images, on its tiny model."""
    torch.manual_seed(0)
    tokenizer = word_level_tokenizer(["a dog"])
    families = []
    for model_type in (*TINY_FAMILIES, *MULTIVIEW_FAMILIES):
        model, processor = tiny_patch_model(model_type, tokenizer=tokenizer)
        images = []
        for size in SIZES:
            token_map = token_map_of(model_type, model, processor, size)
            without_box = int(torch.isnan(token_map.token_boxes()[:, 0]).sum())
            width, height = size
            views = [
                {"name": view.name, "grid": list(view.grid), "box": [round(value / side, 4) for value, side in zip(view.box, (width, height) * 2)]}
                for view in token_map.views
            ]
            images.append({"size": list(size), "image_tokens": token_map.num_tokens, "tokens_without_box": without_box,
                           "views": views})  # fmt: skip
        families.append({"model_type": model_type, "images": images})
    settings = {"image_size": 64, "patch_size": 16, "sizes": [list(size) for size in SIZES]}
    return {"settings": settings, "families": families}


def views_text(image: dict) -> str:
    """e.g. "1 x 2 tiles of 2 x 2 + global 2 x 2 = 12": consecutive views of one name and grid grouped, tiles by the
    rows and columns their boxes form."""
    parts = []
    for (name, grid), group in groupby(image["views"], key=lambda view: (view["name"], tuple(view["grid"]))):
        group = list(group)
        if len(group) == 1:
            parts.append(f"{name} {grid[0]} x {grid[1]}")
            continue
        rows, columns = (len({view["box"][axis] for view in group}) for axis in (1, 0))
        arrangement = f"{rows} x {columns}" if rows * columns == len(group) else str(len(group))
        parts.append(f"{arrangement} {name}s of {grid[0]} x {grid[1]}")
    if image["tokens_without_box"]:
        parts.append(f"{image['tokens_without_box']} newlines")
    return " + ".join(parts) + f" = {image['image_tokens']}"


def supervision_text(model_type: str) -> str:
    """The attention direct / semi-direct supervision trains (ViLT's image tokens attend to the words: eq. 7 too)."""
    (family,) = (family for family in FAMILIES if model_type in family.model_types)
    if family.image_attends_to_text:
        return "words -> patches and patches -> words (eq. 7)"
    return "words -> image tokens, over the mask the model's kernel applies"


def refusals_text(model_type: str) -> str:
    """What the library refuses for a family it reads, and why (the facts `localization_heads` and `recording`
    hold)."""
    refused = []
    if model_type not in DECODER_MODEL_TYPES:
        refused.append("localization heads: an encoder, no last text token attends over the image tokens before it")
    if model_type in BIDIRECTIONAL_FAMILIES:
        refused.append(f"supervision under a padding-only (flash-style) kernel: it drops {BIDIRECTIONAL_FAMILIES[model_type]}")
    return "; ".join(refused) or "-"


def table(report: dict) -> str:
    (w1, h1), (w2, h2) = report["settings"]["sizes"]
    lines = [
        f"| model_type | image tokens | views of a {w1} x {h1} image (tiny model) | views of a {w2} x {h2} image | "
        "probe, explorer, analyze | supervision (direct, semi-direct) | localization heads | refused, and why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in report["families"]:
        first, second = (views_text(image) for image in family["images"])
        model_type = family["model_type"]
        heads = "yes" if model_type in DECODER_MODEL_TYPES else "no"
        lines.append(
            f"| `{model_type}` | {LAYOUTS[model_type]} | {first} | {second} | yes | {supervision_text(model_type)} | "
            f"{heads} | {refusals_text(model_type)} |"
        )
    for model_type, reason in REFUSED_MODEL_TYPES.items():
        lines.append(f"| `{model_type}` | refused by name: {reason} | - | - | no | no | no | everything: {reason.split(':')[0]} |")
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    return f"{DOCS_BEGIN}\n{table(report)}\n{DOCS_END}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", action="store_true", help="also rewrite the table of docs/vlms.md")
    args = parser.parse_args(argv)
    report = measure()
    write_results(RESULTS, report)
    if args.docs:
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))
    return report


if __name__ == "__main__":
    main()
