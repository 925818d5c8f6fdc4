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
from transformers.trainer_utils import unwrap_peft_model

from ..alignment.patches import cell_boxes
from ..analysis.explorer import (
    MEAN_OVER_HEADS,
    ExplorerExample,
    GoldPhrase,
    probed_examples,
    write_attention_explorer,
)
from ..analysis.grounding_probe import GroundingProbeResult
from ..supervision.direct import normalise_rows
from .data import PatchGroundingCollator, _image, patch_batches
from .families import PatchLayout, patch_model_family
from .probe import _rows_at, _to_device, probe_patch_model, read_attention_rows

__all__ = [
    "EXPLORER_HEADS",
    "analyze_patch_model",
    "patch_explorer_examples",
    "processed_image",
    "write_patch_explorer",
]


def processed_image(pixel_values: torch.Tensor, image_processor) -> Image.Image:
    """(3, H, W) `pixel_values` -> the PIL image the model sees (the processor's normalisation undone)."""
    mean = torch.as_tensor(getattr(image_processor, "image_mean", None) or [0.0, 0.0, 0.0]).view(3, 1, 1)
    std = torch.as_tensor(getattr(image_processor, "image_std", None) or [1.0, 1.0, 1.0]).view(3, 1, 1)
    scale = getattr(image_processor, "rescale_factor", 1 / 255) if getattr(image_processor, "do_rescale", True) else 1
    pixels = (pixel_values.float().cpu() * std + mean) / scale
    return Image.fromarray(pixels.clamp(0, 255).round().byte().permute(1, 2, 0).numpy())


# heads an explorer page keeps besides each layer's mean over heads: a page of every head of a LLaVA-1.5-sized model
# (32 layers x 32 heads over 576 patches) is tens of MB per example (docs/vlms.md, "The explorer and the probe at real
# sizes")
EXPLORER_HEADS = 8


def _caption_positions(details: Sequence[dict], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) the sequence positions of each example's caption tokens, a shorter caption padded with its last one,
    and (B, T) which of them are its own."""
    lengths = [row["caption_end"] - row["caption_start"] for row in details]
    positions = [[row["caption_start"] + min(t, length - 1) for t in range(max(lengths))] for row, length in
                 zip(details, lengths)]  # fmt: skip
    real = [[t < length for t in range(max(lengths))] for length in lengths]
    return torch.tensor(positions, device=device), torch.tensor(real, device=device)


def _on_keys(rows: torch.Tensor, columns: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, Q, N) attention rows -> ((B, H, Q, C) rows at the (B, C) key `columns`, re-normalised over the real ones
    (`mask`), (B, H, Q) each row's mass on those real keys)."""
    index = columns.to(rows.device)[:, None, None, :].expand(*rows.shape[:-1], columns.shape[-1])
    picked = rows.gather(-1, index).float() * mask.to(rows.device)[:, None, None, :]
    return normalise_rows(picked), picked.sum(-1)


def _page_maps(heads: list[int] | None):
    """What a page keeps of a layer's (B, H, Q, K) re-normalised rows and their (B, H, Q) mass on the keys: the mean
    over heads and the rows of `heads` (None: only each head's mass on the keys averaged over the rows, to choose heads
    by)."""

    def keep(rows: torch.Tensor, share: torch.Tensor) -> dict:
        if heads is None:
            return {"share": share.mean(-1)}
        return {"mean": rows.mean(1), "heads": {head: rows[:, head] for head in heads}}

    return keep


def _read_page_maps(model, batch: dict, heads_of: dict[int, list[int]] | None) -> tuple[PatchLayout, dict]:
    """One batch: its layout and, per layer, what `_page_maps` keeps of "word_to_region" (the caption tokens' rows
    over the real image tokens) and, where image tokens attend to the text (ViLT), "region_to_word" (the image tokens'
    rows over the caption). Decoders, whose layout the batch holds, keep it layer by layer as each map is read."""
    captions, caption_mask = _caption_positions(batch["details"], batch["input_ids"].device)
    num_layers = len(patch_model_family(model).attention_modules(model))
    keeps = [_page_maps(None if heads_of is None else heads_of.get(layer, [])) for layer in range(num_layers)]

    def word_to_region(layer, rows, layout_positions, patch_mask):
        return keeps[layer](*_on_keys(rows, layout_positions, patch_mask))

    if "image_positions" in batch:  # the layout is known before the forward: only the caption rows are read
        positions, mask = batch["image_positions"], batch["patch_mask"].bool()
        _, layout, kept = read_attention_rows(
            model, batch, captions, lambda layer, rows: word_to_region(layer, rows, positions, mask)
        )
        return layout, {"word_to_region": kept}
    _, layout, maps = read_attention_rows(model, batch, None)  # ViLT: small maps, its patch order drawn in the forward
    views = {
        "word_to_region": [
            word_to_region(layer, _rows_at(attention, captions), layout.image_positions, layout.patch_mask)
            for layer, attention in enumerate(maps)
        ],
        "region_to_word": [
            keeps[layer](*_on_keys(_rows_at(attention, layout.image_positions), captions, caption_mask))
            for layer, attention in enumerate(maps)
        ],
    }
    return layout, views


def _heads_by_image_share(model, collator, examples, batch_size: int, count: int) -> list[tuple[int, int]]:
    """The `count` heads whose caption tokens put the largest mean share of their attention on the image (Li et
    al.'s "actively attending"), over `examples`: the heads a page keeps when no probe ranks them."""
    total = None
    for batch in patch_batches(collator, examples, batch_size):
        batch = _to_device(batch, next(model.parameters()).device)
        _, views = _read_page_maps(model, batch, None)
        share = torch.stack([kept["share"].sum(0) for kept in views["word_to_region"]])  # (L, H) summed over examples
        total = share if total is None else total + share
    order = torch.argsort(total.flatten().cpu(), descending=True, stable=True)[:count]
    return sorted(divmod(int(index), total.shape[1]) for index in order)


def _pick(kept: dict, head: int) -> torch.Tensor:
    return kept["mean"] if head == MEAN_OVER_HEADS else kept["heads"][head]


@torch.no_grad()
def patch_explorer_examples(
    model: nn.Module,
    collator: PatchGroundingCollator,
    examples: Sequence[dict],
    heads: Sequence[tuple[int, int]] | None = None,
    num_heads: int = EXPLORER_HEADS,
    batch_size: int = 16,
) -> list[ExplorerExample]:
    """One `ExplorerExample` per example: its caption tokens, its real patches as region boxes (normalised to the
    processed image), its phrases' gold boxes, the processed image, and the attention a page shows: per layer the mean
    over heads and the maps of `heads` ((layer, head) pairs; None: the `num_heads` heads putting the most attention on
    the image, `_heads_by_image_share`) of "word_to_region" (each caption token's row over the real patches,
    re-normalised) and, for ViLT, whose patches attend to the text, "region_to_word".

    Memory: each layer's map is read and dropped as the layer runs (`read_attention_rows`): the batch holds the
    kept rows, (L + kept heads) x B x caption tokens x patches, not every layer's (B, H, N, N) map."""
    if not collator.return_details:
        raise ValueError("`collator` must be built with return_details=True (the explorer needs the caption's tokens).")
    model = unwrap_peft_model(model)
    family = patch_model_family(model)
    num_layers, heads_per_layer = len(family.attention_modules(model)), family.num_heads(model)
    if heads is not None and any(not (0 <= layer < num_layers and 0 <= head < heads_per_layer) for layer, head in heads):
        raise ValueError(
            f"`heads` must be (layer, head) pairs of the model's {num_layers} layers x {heads_per_layer} heads, got "
            f"{list(heads)}."
        )
    was_training = model.training
    model.eval()
    try:
        if heads is None:
            count = min(num_heads, num_layers * heads_per_layer)
            heads = _heads_by_image_share(model, collator, examples, batch_size, count)
        kept_heads = [(layer, MEAN_OVER_HEADS) for layer in range(num_layers)] + sorted(
            (int(layer), int(head)) for layer, head in heads
        )
        heads_of: dict[int, list[int]] = {}
        for layer, head in heads:
            heads_of.setdefault(int(layer), []).append(int(head))
        result = []
        for start in range(0, len(examples), batch_size):
            shown = list(examples[start : start + batch_size])
            batch = collator(shown)
            layout, views = _read_page_maps(model, _to_device(batch, next(model.parameters()).device), heads_of)
            model_shape = (num_layers, heads_per_layer)
            result.extend(_batch_examples(collator, shown, batch, layout, views, kept_heads, model_shape))
    finally:
        model.train(was_training)
    return result


def _batch_examples(collator, shown, batch, layout, views, kept_heads, model_shape) -> list[ExplorerExample]:
    # one grid: cell boxes over the processed image; multi-view: every token's box over the original image
    boxes = cell_boxes(layout.grid) if layout.grid is not None else None
    result = []
    for index, details in enumerate(batch["details"]):
        length = details["caption_end"] - details["caption_start"]
        real = layout.patch_mask[index].bool().cpu()
        maps = {
            view: np.stack([_pick(kept[layer], head)[index].float().cpu().numpy() for layer, head in kept_heads])
            for view, kept in views.items()
        }
        attention = {"word_to_region": maps["word_to_region"][:, :length][..., real.numpy()]}
        if "region_to_word" in maps:
            attention["region_to_word"] = maps["region_to_word"][:, real.numpy()][..., :length]
        caption = details["caption_start"]
        gold = [
            GoldPhrase([token - caption for token in phrase["tokens"]], phrase["boxes"], phrase["text"])
            for phrase in details["phrases"]
        ]
        tokens = batch["input_ids"][index, caption : caption + length].tolist()
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
                    if boxes is not None
                    else _image(shown[index])
                ),
                title=shown[index]["caption"],
                heads=kept_heads,
                model_shape=model_shape,
            )
        )
    return result


def _probe_heads(result: GroundingProbeResult, count: int) -> list[tuple[int, int]]:
    """The probe's best head (Li et al.: the best actively attending one) and the next best by accuracy, `count` in
    all."""
    best = (result.best_layer, result.best_head)
    order = np.argsort(-np.asarray(result.accuracy).flatten(), kind="stable")
    ranked = [divmod(int(index), result.accuracy.shape[1]) for index in order]
    return [best] + [pair for pair in ranked if pair != best][: count - 1]


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
    num_heads: int = EXPLORER_HEADS,
) -> Path:
    """The explorer page of the first `num_examples` examples, with the grounding probe of the first
    `probe_examples` (0: none) as its per-head grid. The page keeps each layer's mean over heads and `num_heads`
    heads: the probe's best and next best (without a probe, those putting the most attention on the image), and colours
    a word's weights relative to its own largest ("row_max"; the page offers the other `COLOUR_SCALES`)."""
    if not examples:
        raise ValueError("`examples` must hold at least one grounded caption, got none.")
    if num_heads < 1:
        raise ValueError(f"`num_heads` must be at least 1 (the heads the page keeps), got {num_heads}.")
    collator = PatchGroundingCollator(processor, model.config, return_details=True, with_labels=False)
    probe, heads = None, None
    if probe_examples:
        probe = probe_patch_model(
            model, patch_batches(collator, examples[:probe_examples], batch_size), collator.coverage_threshold
        )
        heads = _probe_heads(probe, num_heads)
    shown = patch_explorer_examples(model, collator, examples[:num_examples], heads, num_heads, batch_size)
    source = patch_model_family(model).name
    rule = f"a patch at least {collator.coverage_threshold:g} inside a gold box of the phrase"
    return write_attention_explorer(
        shown, path, probe=probe, title=title, subtitle=subtitle, source=source, probe_rule=rule,
        probe_examples=probed_examples(min(probe_examples, len(examples)), len(examples), "captions"),
        colour_scale="row_max",
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
    example = patch_explorer_examples(model, collator, examples[:1], heads=[(result.best_layer, result.best_head)])[0]
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
    rows = example.head_map("word_to_region", result.best_layer, result.best_head)  # (T, P)
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
