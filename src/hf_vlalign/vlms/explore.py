"""The word-patch attention explorer and analysis of a transformers patch model: the image as the model sees it (its
processed pixels), under the grid of its patches, each patch a region of `hf_vlalign.analysis.explorer`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..alignment.patches import cell_boxes
from ..analysis.explorer import ExplorerExample, GoldPhrase, probed_examples, write_attention_explorer
from ..analysis.grounding_probe import GroundingProbeResult
from ..supervision.direct import normalise_rows
from .data import PatchGroundingCollator, _image, patch_batches
from .families import ViltFamily, forward_with_layout, patch_model_family
from .probe import eager_attention, patch_attention_rows, probe_patch_model

__all__ = ["analyze_patch_model", "patch_explorer_examples", "processed_image", "write_patch_explorer"]


def processed_image(pixel_values: torch.Tensor, image_processor) -> Image.Image:
    """(3, H, W) `pixel_values` -> the PIL image the model sees (the processor's normalisation undone)."""
    mean = torch.as_tensor(getattr(image_processor, "image_mean", None) or [0.0, 0.0, 0.0]).view(3, 1, 1)
    std = torch.as_tensor(getattr(image_processor, "image_std", None) or [1.0, 1.0, 1.0]).view(3, 1, 1)
    scale = getattr(image_processor, "rescale_factor", 1 / 255) if getattr(image_processor, "do_rescale", True) else 1
    pixels = (pixel_values.float().cpu() * std + mean) / scale
    return Image.fromarray(pixels.clamp(0, 255).round().byte().permute(1, 2, 0).numpy())


def _renormalised(rows: torch.Tensor) -> np.ndarray:
    return normalise_rows(rows).float().cpu().numpy()


@torch.no_grad()
def patch_explorer_examples(
    model: nn.Module, collator: PatchGroundingCollator, examples: Sequence[dict]
) -> list[ExplorerExample]:
    """One `ExplorerExample` per example: its caption tokens, its real patches as region boxes (normalised to the
    processed image), "word_to_region" attention per layer and head (and "region_to_word" for ViLT, whose patches
    attend to the text), its phrases' gold boxes and the processed image."""
    if not collator.return_details:
        raise ValueError("`collator` must be built with return_details=True (the explorer needs the caption's tokens).")
    family = patch_model_family(model)
    batch = collator(list(examples))
    device = next(model.parameters()).device
    inputs = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
    model.eval()
    with eager_attention(model):
        outputs, layout = forward_with_layout(model, inputs, output_attentions=True)
    maps = torch.stack(outputs.attentions)  # (L, B, H, N, N)
    to_image = patch_attention_rows(outputs.attentions, layout.image_positions)  # (L, B, H, N, P)
    # one grid: cell boxes over the processed image; multi-view: every token's box over the original image
    boxes = cell_boxes(layout.grid) if layout.grid is not None else None
    result = []
    for index, details in enumerate(batch["details"]):
        caption = slice(details["caption_start"], details["caption_end"])
        real = layout.patch_mask[index].bool().cpu()
        tokens = batch["input_ids"][index, caption].tolist()
        attention = {"word_to_region": _renormalised(to_image[:, index, :, caption][..., real])}
        if isinstance(family, ViltFamily):
            image_rows = layout.image_positions[index][real].to(maps.device)
            text_columns = torch.arange(caption.start, caption.stop, device=maps.device)
            rows = maps[:, index].index_select(2, image_rows).index_select(3, text_columns)
            attention["region_to_word"] = _renormalised(rows)
        gold = [
            GoldPhrase([token - caption.start for token in phrase["tokens"]], phrase["boxes"], phrase["text"])
            for phrase in details["phrases"]
        ]
        result.append(
            ExplorerExample(
                words=collator.tokenizer.convert_ids_to_tokens(tokens),
                region_boxes=(
                    boxes[layout.cell_index[index].cpu()[real]]
                    if boxes is not None
                    else layout.token_boxes[index].cpu()[real]
                ).numpy(),
                attention=attention,
                gold=gold,
                image=(
                    processed_image(batch["pixel_values"][index], collator.image_processor)
                    if boxes is not None else _image(examples[index])
                ),
                title=examples[index]["caption"],
            )
        )
    return result


def write_patch_explorer(
    model: nn.Module,
    processor,
    examples: Sequence[dict],
    path: str | os.PathLike,
    num_examples: int = 4,
    probe_examples: int = 128,
    batch_size: int = 16,
    title: str = "Word-patch attention explorer",
    subtitle: str = "",
) -> Path:
    """The explorer page of the first `num_examples` examples, with the grounding probe of the first
    `probe_examples` (0: none) as its per-head grid."""
    if not examples:
        raise ValueError("`examples` must hold at least one grounded caption, got none.")
    collator = PatchGroundingCollator(processor, model.config, return_details=True, with_labels=False)
    shown = patch_explorer_examples(model, collator, examples[:num_examples])
    probe = None
    if probe_examples:
        probe = probe_patch_model(
            model, patch_batches(collator, examples[:probe_examples], batch_size), collator.coverage_threshold
        )
    source = patch_model_family(model).name
    rule = f"a patch at least {collator.coverage_threshold:g} inside a gold box of the phrase"
    return write_attention_explorer(
        shown, path, probe=probe, title=title, subtitle=subtitle, source=source, probe_rule=rule,
        probe_examples=probed_examples(min(probe_examples, len(examples)), len(examples), "captions"),
    )  # fmt: skip


def analyze_patch_model(
    model: nn.Module,
    processor,
    examples: Sequence[dict],
    out_dir: str | os.PathLike,
    batch_size: int = 16,
    description: str = "",
) -> dict:
    """The grounding probe of every example (patches as regions) into `out_dir`: `analysis.json` (per-head accuracy,
    best head, centre baseline, best head per layer), `grounding_probe.png` (the layer x head heatmap) and
    `best_head_attention.png` (the best head's attention of each phrase of the first example on the image, under the
    patch grid, gold boxes dashed)."""
    from ..analysis.probe_plots import plot_head_accuracy

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    collator = PatchGroundingCollator(processor, model.config, return_details=True, with_labels=False)
    result = probe_patch_model(model, patch_batches(collator, examples, batch_size), collator.coverage_threshold)
    family = patch_model_family(model).name
    report = {
        "model_family": family,
        "data": description,
        "num_examples": len(examples),
        "coverage_threshold": collator.coverage_threshold,
        "grounding_probe": {**result.to_dict(), "best_head_of_layer": [float(row.max()) for row in result.accuracy]},
    }
    plot_head_accuracy(
        result.accuracy, out_dir / "grounding_probe.png", title=f"grounding accuracy per head ({family}, patches)",
        baseline=result.baseline_accuracy, num_phrases=result.num_phrases, active_share=result.active_share,
        active_threshold=result.active_threshold, baseline_name=result.baseline_name,
    )  # fmt: skip
    example = patch_explorer_examples(model, collator, examples[:1])[0]
    plot_best_head_attention(example, result, out_dir / "best_head_attention.png")
    (out_dir / "analysis.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def plot_best_head_attention(example: ExplorerExample, result: GroundingProbeResult, path: Path) -> Path:
    """One panel per phrase: the best head's word->patch attention of the phrase's last token over the image (one
    colour scale for every panel), the patch grid, the most attended patch outlined and the gold box dashed."""
    from ..analysis.figures import save_png
    from ..utils.optional import require

    require("matplotlib", extra="plots")
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    phrases = example.gold or [GoldPhrase([len(example.words) - 1], [], example.words[-1])]
    rows = example.attention["word_to_region"][result.best_layer, result.best_head]  # (T, P)
    figure = Figure(figsize=(3.6 * len(phrases), 4.2))
    axes = figure.subplots(1, len(phrases), squeeze=False)
    colour = colormaps["magma"]
    width, height = example.image.size
    peak = max(float(rows[phrase.tokens[-1]].max()) for phrase in phrases) or 1.0
    for axis, phrase in zip(axes[0], phrases):
        weights = rows[phrase.tokens[-1]]
        axis.imshow(example.image, extent=(0, 1, 1, 0))
        for (x1, y1, x2, y2), weight in zip(example.region_boxes, weights):
            axis.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, facecolor=colour(weight / peak), alpha=0.55,
                                     edgecolor="white", linewidth=0.3))  # fmt: skip
        top = example.region_boxes[int(np.argmax(weights))]
        axis.add_patch(
            Rectangle(top[:2], top[2] - top[0], top[3] - top[1], fill=False, edgecolor="magenta", linewidth=2)
        )
        for x1, y1, x2, y2 in phrase.boxes:
            axis.add_patch(
                Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="#00e676", linestyle="--", linewidth=2)
            )
        axis.set_title(f'"{phrase.text}"', fontsize=9)
        axis.set_xlim(0, 1)
        axis.set_ylim(1, 0)
        axis.set_xticks([])
        axis.set_yticks([])
    scale = ScalarMappable(cmap=colour, norm=Normalize(0, peak))
    figure.colorbar(scale, ax=axes[0].tolist(), fraction=0.03, label="attention on the patch (share of the row)")
    figure.suptitle(
        f"best head (layer {result.best_layer}, head {result.best_head}): last token of each phrase -> patches "
        f"({width} x {height} px); gold box dashed green, most attended patch magenta",
        fontsize=9,
    )
    return save_png(figure, path)
