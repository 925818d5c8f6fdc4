"""Localization heads (Kang et al., "Your Large Vision-Language Model Only Needs A Few Attention Heads For Visual
Grounding", CVPR 2025): a few attention heads of a decoder VLM, picked over a data set of (image, referring expression)
pairs by their attention on the image and the spatial entropy of their maps, ground an expression without training.

Sources (docs/vlms.md, "Localization heads"): the paper itself was not reachable here; its protocol is taken from
notes on the paper (abstract, secondary readings of §3-§6 and App. A-B) and the official code
(github.com/seilk/LocalizationHeads, `localization_heads_finder.py`; the later overhaul's `analyze.py`). Where paper and
code differ the paper's form is the default and the code's a named option.

Selection (`select_localization_heads`):
1. Query: the last input text token (the expression's last token), its attention row over the image tokens, in every
   layer and head (read from the model's eager attention, `image_attention_rows`: one layer's map at a time, only the
   rows kept).
2. S_img = the row's sum over the image tokens; its mean over the data set, sorted, gives tau at the elbow of the
   curve (the point farthest from the chord between its ends: the official code's "chord" method, on the data-set
   mean as the paper says); heads with mean S_img >= tau pass. The first two layers are left out (the paper).
3. Spatial entropy of each map on its view's grid: binarised at its mean (A > mean), 8-connected components,
   H = -sum P(C) log P(C) with P(C) the component's share of the binarised area (the paper); the official code's
   variants are options: `component_share="mass"` (each component's share of ReLU(A - mean)) and
   `threshold_factor=2.0` (the overhaul binarises at twice the mean). A map with nothing above its threshold has
   infinite entropy.
4. Per sample, the 10 lowest-entropy heads among those passing tau; each head's frequency is the number of samples
   putting it among them; the `num_heads` (3) most frequent heads are the model's localization heads (ties: lower mean
   entropy first).

Grounding (`ground_from_heads`): each selected head's map on each view's grid is smoothed with a 7 x 7 Gaussian of
sigma 1 (the paper's kernel 7 / sigma 1: a torch `conv2d` with that separable kernel and reflect padding, the same as
torchvision's `gaussian_blur(kernel_size=7, sigma=1.0)`; replicate padding on a grid of 3 or fewer cells a side), the
heads' maps are summed, binarised at their mean, and the largest 8-connected component's box is mapped to the
original image's pixels through the view's box. The paper keeps the "largest convex hull": a component's hull has the
component's box, so only which component is largest could differ (here: the most cells).

Several views (tiles and a thumbnail): a map is read on each view's own grid (the entropy: each view's entropy, their
mean weighted by the head's attention mass on each view; the grounding: each view smoothed on its grid), then the
views' maps are laid on one canvas over the original image, cells the size of the finest view's, each canvas cell
taking the attention *density* (mass per original pixel) of every view covering it, summed over the views. Why: a
thumbnail token covers many more pixels than a tile token, so raw weights are not comparable across views while mass
per pixel is; summing keeps every view's evidence (a box is seen by the thumbnail and by its tiles) and the canvas
integrates to S_img. With one view the canvas is that view's grid and the result is the paper's.

The image tokens as boxes are each example's `views.ImageTokenMap`, which the collator gives for every family.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..alignment.patches import covered_cells_target
from ..metrics.phrase_grounding import phrase_grounding_recall
from .data import PatchGroundingCollator, _image, grounded_caption_examples
from .families import PATCH_MODEL_TYPES, ViltFamily, forward_with_layout, patch_model_family
from .probe import eager_attention
from .views import ImageTokenMap

__all__ = [
    "COMPONENT_SHARES",
    "HeadSelection",
    "elbow_threshold",
    "find_localization_heads",
    "flickr30k_phrase_examples",
    "gaussian_smooth",
    "gold_box_rows",
    "ground_from_heads",
    "head_spatial_entropy",
    "image_attention_rows",
    "label_components",
    "largest_component_box",
    "localization_head_grounding",
    "plot_head_selection",
    "refcoco_file_examples",
    "select_localization_heads",
    "spatial_entropy",
]

COMPONENT_SHARES = ("area", "mass")
SELECTION_FORMAT = "hf_vlalign localization heads"
# the paper: 1,000 RefCOCO training pairs, the 10 lowest-entropy heads per sample, the 3 most frequent heads
DEFAULT_SELECTION_SAMPLES = 1000
DEFAULT_PER_SAMPLE_HEADS = 10
DEFAULT_NUM_HEADS = 3
DEFAULT_EXCLUDED_LAYERS = 2
GAUSSIAN_KERNEL_SIZE, GAUSSIAN_SIGMA = 7, 1.0
# the canvas of several views is at most this many cells a side (a 4,000-pixel photo at a 14-pixel finest cell: 286)
MAX_CANVAS_SIDE = 512


# ----------------------------------------------------------------------------------------------------------------
# Maps: components, entropy, smoothing, boxes
# ----------------------------------------------------------------------------------------------------------------


def label_components(mask: torch.Tensor) -> torch.Tensor:
    """(..., rows, columns) bool -> long labels of the 8-connected components of each map (0: background; labels
    are 1 + the row-major index of a component's last cell, so not consecutive). Vectorised over the leading
    dimensions: each cell takes the largest label of its 3 x 3 neighbourhood until nothing changes."""
    rows, columns = mask.shape[-2:]
    flat = mask.reshape(-1, 1, rows, columns)
    labels = torch.arange(1, rows * columns + 1, dtype=torch.float32).view(1, 1, rows, columns) * flat
    for _ in range(rows * columns):
        grown = F.max_pool2d(labels, 3, stride=1, padding=1) * flat
        if torch.equal(grown, labels):
            break
        labels = grown
    return labels.long().view(mask.shape)


def _component_sizes(labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(K, cells) labels and weights -> (K, cells + 1) the weights summed per label (column 0: background)."""
    sums = torch.zeros(labels.shape[0], labels.shape[1] + 1, dtype=torch.float64)
    return sums.scatter_add_(1, labels, weights.double())


def spatial_entropy(
    maps: torch.Tensor, threshold_factor: float = 1.0, component_share: str = "area"
) -> torch.Tensor:
    """Kang et al.'s spatial entropy of (..., rows, columns) attention maps -> (...) float64.

    Each map is binarised at `threshold_factor` x its mean (A > factor * mean), its 8-connected components found, and
    H = -sum_C P(C) log P(C) (natural log). `component_share`: "area" (the paper: P(C) = |C| / sum |C'|) or "mass"
    (the official code: P(C) = the component's share of ReLU(A - factor * mean)). A map with no cell above the
    threshold (e.g. a uniform one) has entropy +inf.
    """
    if component_share not in COMPONENT_SHARES:
        raise ValueError(f"`component_share` must be one of {COMPONENT_SHARES}, got {component_share!r}.")
    rows, columns = maps.shape[-2:]
    flat = maps.reshape(-1, rows * columns).float()
    excess = flat - threshold_factor * flat.mean(-1, keepdim=True)
    mask = excess > 0
    labels = label_components(mask.view(-1, rows, columns)).view(-1, rows * columns)
    weights = mask.double() if component_share == "area" else excess.clamp(min=0)
    sizes = _component_sizes(labels, weights)[:, 1:]
    shares = sizes / sizes.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
    entropy = -(shares * shares.clamp(min=1e-300).log()).sum(-1)
    entropy = entropy.masked_fill(~mask.any(-1), math.inf)
    return entropy.view(maps.shape[:-2])


def check_sigma(argument: str, sigma: object) -> None:
    """A Gaussian's sigma in grid cells: a finite number > 0 (0 would divide by zero)."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 < sigma < math.inf:
        raise ValueError(f"`{argument}` (the smoothing Gaussian's sigma, in grid cells) must be a number > 0, got {sigma!r}.")


def gaussian_smooth(
    maps: torch.Tensor, kernel_size: int = GAUSSIAN_KERNEL_SIZE, sigma: float = GAUSSIAN_SIGMA
) -> torch.Tensor:
    """(..., rows, columns) maps smoothed by a `kernel_size` x `kernel_size` Gaussian of `sigma` (cells), separable,
    reflect padding as torchvision's `gaussian_blur` (replicate where a side has no more cells than the half kernel)."""
    check_sigma("sigma", sigma)
    rows, columns = maps.shape[-2:]
    half = kernel_size // 2
    offsets = torch.arange(kernel_size, dtype=torch.float32) - half
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    flat = maps.reshape(-1, 1, rows, columns).float()
    mode = "reflect" if min(rows, columns) > half else "replicate"
    padded = F.pad(flat, (half, half, half, half), mode=mode)
    smoothed = F.conv2d(F.conv2d(padded, kernel.view(1, 1, 1, -1)), kernel.view(1, 1, -1, 1))
    return smoothed.view(maps.shape)


def largest_component_box(mask: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(rows, columns) bool -> the cell box (row0, column0, row1, column1), ends exclusive, of its largest
    8-connected component (the most cells; ties: the one whose last cell comes first), or None for an empty mask."""
    rows, columns = mask.shape
    labels = label_components(mask).view(1, -1)
    sizes = _component_sizes(labels, mask.reshape(1, -1).double())[0, 1:]
    if not bool(sizes.any()):
        return None
    cells = (labels[0] == int(sizes.argmax()) + 1).view(rows, columns).nonzero()
    (row0, column0), (row1, column1) = cells.amin(0).tolist(), cells.amax(0).tolist()
    return row0, column0, row1 + 1, column1 + 1


def elbow_threshold(values: torch.Tensor) -> float:
    """The elbow of the sorted (ascending) `values`: the value farthest from the chord between the curve's ends
    (the official code's `elbow_chord`; the distance to a line is proportional to the vertical gap, so the scales of
    the two axes do not matter). Fewer than 3 values: the smallest."""
    curve = torch.sort(values.double().flatten()).values
    if curve.numel() < 3:
        return float(curve[0])
    position = torch.linspace(0.0, 1.0, curve.numel(), dtype=torch.float64)
    chord = curve[0] + (curve[-1] - curve[0]) * position
    return float(curve[int(torch.argmax(chord - curve))])


# ----------------------------------------------------------------------------------------------------------------
# Views: image tokens as boxes
# ----------------------------------------------------------------------------------------------------------------


def _view_maps(rows: torch.Tensor, token_map: ImageTokenMap) -> list[torch.Tensor]:
    """(..., P) values over an image's tokens -> per view (..., rows, columns)."""
    return [rows[..., view.token_index].reshape(*rows.shape[:-1], *view.grid) for view in token_map.views]


def head_spatial_entropy(
    rows: torch.Tensor, token_map: ImageTokenMap, threshold_factor: float = 1.0, component_share: str = "area"
) -> torch.Tensor:
    """(..., P) attention rows over one image's tokens -> (...) spatial entropy: each view's map on its grid, the
    views' entropies averaged weighted by the attention mass on each view (one view: its entropy)."""
    maps = _view_maps(rows, token_map)
    entropies = torch.stack([spatial_entropy(m, threshold_factor, component_share) for m in maps])
    if len(maps) == 1:
        return entropies[0]
    masses = torch.stack([m.sum((-2, -1)).double() for m in maps])
    weights = masses / masses.sum(0).clamp(min=torch.finfo(torch.float64).tiny)
    return torch.where(weights > 0, entropies * weights, torch.zeros_like(entropies)).sum(0)


def _canvas(token_map: ImageTokenMap) -> tuple[tuple[float, float, float, float], tuple[int, int]]:
    """(box in original pixels, (rows, columns)) of the canvas the views are laid on: over the union of the views'
    boxes clipped to the image, cells as small as the finest view's (one view inside the image: its own grid)."""
    width, height = token_map.image_size
    boxes = [(max(v.box[0], 0), max(v.box[1], 0), min(v.box[2], width), min(v.box[3], height)) for v in token_map.views]
    x0, y0 = min(box[0] for box in boxes), min(box[1] for box in boxes)
    x1, y1 = max(box[2] for box in boxes), max(box[3] for box in boxes)
    cell_width = min((v.box[2] - v.box[0]) / v.grid[1] for v in token_map.views)
    cell_height = min((v.box[3] - v.box[1]) / v.grid[0] for v in token_map.views)
    columns = min(MAX_CANVAS_SIDE, max(1, round((x1 - x0) / cell_width)))
    rows = min(MAX_CANVAS_SIDE, max(1, round((y1 - y0) / cell_height)))
    return (x0, y0, x1, y1), (rows, columns)


def _on_canvas(maps: list[torch.Tensor], token_map: ImageTokenMap) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Per-view (rows, columns) maps -> (canvas density, canvas cells covered by a view, canvas box)."""
    box, (rows, columns) = _canvas(token_map)
    xs = box[0] + (torch.arange(columns, dtype=torch.float64) + 0.5) * (box[2] - box[0]) / columns
    ys = box[1] + (torch.arange(rows, dtype=torch.float64) + 0.5) * (box[3] - box[1]) / rows
    density = torch.zeros(rows, columns, dtype=torch.float64)
    covered = torch.zeros(rows, columns, dtype=torch.bool)
    for view, values in zip(token_map.views, maps):
        (view_rows, view_columns), (vx0, vy0, vx1, vy1) = view.grid, view.box
        column = torch.floor((xs - vx0) / (vx1 - vx0) * view_columns).long()
        row = torch.floor((ys - vy0) / (vy1 - vy0) * view_rows).long()
        inside = ((row >= 0) & (row < view_rows))[:, None] & ((column >= 0) & (column < view_columns))[None, :]
        cell_area = (vx1 - vx0) / view_columns * (vy1 - vy0) / view_rows
        picked = values.double()[row.clamp(0, view_rows - 1)][:, column.clamp(0, view_columns - 1)]
        density += torch.where(inside, picked / cell_area, 0.0)
        covered |= inside
    return density, covered, box


def ground_from_heads(
    rows: torch.Tensor,
    token_map: ImageTokenMap,
    kernel_size: int = GAUSSIAN_KERNEL_SIZE,
    sigma: float = GAUSSIAN_SIGMA,
) -> list[float] | None:
    """Training-free grounding from the selected heads' rows (K, P) over one image's tokens -> the box [x0, y0, x1,
    y1] in the original image's pixels (None when the combined map is flat): each head's map smoothed on its view's
    grid, summed, laid on the canvas (module docstring), binarised at its mean over the covered cells, the largest
    8-connected component's box."""
    maps = [gaussian_smooth(m, kernel_size, sigma).sum(0) for m in _view_maps(rows.float(), token_map)]
    density, covered, (x0, y0, x1, y1) = _on_canvas(maps, token_map)
    mask = covered & (density > density[covered].mean())
    cells = largest_component_box(mask)
    if cells is None:
        return None
    row0, column0, row1, column1 = cells
    rows_, columns = mask.shape
    cell_width, cell_height = (x1 - x0) / columns, (y1 - y0) / rows_
    return [x0 + column0 * cell_width, y0 + row0 * cell_height, x0 + column1 * cell_width, y0 + row1 * cell_height]


# ----------------------------------------------------------------------------------------------------------------
# Reading the last text token's attention over the image tokens
# ----------------------------------------------------------------------------------------------------------------


# every patch family but ViLT, whose image patches and words are one bidirectional sequence (no "last text token")
DECODER_MODEL_TYPES = tuple(model_type for model_type in PATCH_MODEL_TYPES if model_type != "vilt")


def _check_decoder(model: nn.Module) -> None:
    if isinstance(patch_model_family(model), ViltFamily):
        raise ValueError(
            f"`model` must be a decoder vision-language model (model type one of {DECODER_MODEL_TYPES}): localization "
            "heads read the last text token's attention over the image tokens before it (Kang et al.); ViLT is an "
            f"encoder, got a {type(model).__name__}."
        )


def _row_keeper(store: dict, layer: int, query_positions: torch.Tensor, image_positions: torch.Tensor):
    """A forward hook on one attention module: keeps its weights' rows at the batch's query positions over the image
    tokens, (B, H, P), and drops the (B, H, N, N) map (the decoder layer discards it anyway)."""

    def hook(_module, _inputs, output):
        weights = output[1]
        batch = torch.arange(weights.shape[0], device=weights.device)
        at_query = weights[batch, :, query_positions.to(weights.device)]  # (B, H, N)
        index = image_positions.to(weights.device)[:, None, :].expand(-1, weights.shape[1], -1)
        store[layer] = at_query.gather(-1, index).float().cpu()
        return output[0], None

    return hook


def image_attention_rows(
    model: nn.Module,
    processor,
    examples: Sequence[dict],
    batch_size: int = 8,
    prompt: str | None = None,
    max_text_length: int = 64,
) -> Iterator[tuple[torch.Tensor, ImageTokenMap]]:
    """Per example, (L, H, P) the attention of the expression's last token over the image's P tokens in every layer
    and head, and the image's `ImageTokenMap`.

    `examples`: dicts with `image` (PIL) or `image_path` and `expression`. The sequence is the collator's
    (`PatchGroundingCollator`: LLaVA `[BOS] <image> x P prompt expression`, PaliGemma `<image> x P [BOS] prompt \\n
    expression`), read with transformers' eager attention, one layer's map at a time: a hook on each attention module
    keeps only the query row (memory: L x B x H x P besides the forward itself).
    """
    _check_decoder(model)
    collator = PatchGroundingCollator(
        processor, model.config, prompt=prompt, max_text_length=max_text_length, with_labels=False, return_details=True
    )
    modules = patch_model_family(model).attention_modules(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with eager_attention(model), torch.no_grad():
            for start in range(0, len(examples), batch_size):
                chunk = list(examples[start : start + batch_size])
                images = [_image(example) for example in chunk]
                batch = collator([{"image": image, "caption": ex["expression"]} for image, ex in zip(images, chunk)])
                queries = torch.tensor([details["caption_end"] - 1 for details in batch["details"]])
                store: dict[int, torch.Tensor] = {}
                hooks = [
                    module.register_forward_hook(_row_keeper(store, layer, queries, batch["image_positions"]))
                    for layer, module in enumerate(modules)
                ]
                try:
                    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                    forward_with_layout(model, batch)
                finally:
                    for hook in hooks:
                        hook.remove()
                rows = torch.stack([store[layer] for layer in range(len(modules))], 1)  # (B, L, H, P)
                for i, details in enumerate(batch["details"]):
                    token_map = details["token_map"]
                    yield rows[i, ..., : token_map.num_tokens], token_map
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------------------------------------------
# Selection
# ----------------------------------------------------------------------------------------------------------------


def model_fingerprint(model_or_config) -> dict:
    """What a selection is valid for: the model type, its language model's layers and heads, and a hash of its config
    (without its name, version, dtype and attention implementation)."""
    config = getattr(model_or_config, "config", model_or_config)
    text = getattr(config, "text_config", config)
    digest = hashlib.sha256(json.dumps(_lasting(config.to_dict()), sort_keys=True, default=str).encode()).hexdigest()
    return {
        "model_type": config.model_type,
        "num_layers": text.num_hidden_layers,
        "num_heads": text.num_attention_heads,
        "config_sha256": digest[:16],
    }


def _lasting(values: dict) -> dict:
    """A config dict without what differs between copies of one model: private keys (`_name_or_path`, the attention
    implementation), the transformers version, the dtype and the architecture class."""
    volatile = ("transformers_version", "dtype", "torch_dtype", "architectures")
    return {
        key: _lasting(value) if isinstance(value, dict) else value
        for key, value in values.items()
        if not str(key).startswith("_") and key not in volatile
    }


@dataclass
class HeadSelection:
    """The localization heads of one model and the statistics they were picked by (per head, (L, H)).

    mean_attention_sum: the data-set mean of S_img (the last token's attention mass on the image tokens).
    mean_entropy: the mean spatial entropy over the samples where it is finite (NaN: never finite).
    frequency: samples putting the head among their `per_sample_heads` lowest-entropy passing heads.
    selected: the chosen (layer, head) pairs, most frequent first.
    tau: the elbow threshold on `mean_attention_sum`; `excluded_layers`: the first layers left out.
    """

    model: str
    fingerprint: dict
    mean_attention_sum: torch.Tensor
    mean_entropy: torch.Tensor
    frequency: torch.Tensor
    selected: list[tuple[int, int]]
    tau: float
    num_samples: int
    excluded_layers: int = DEFAULT_EXCLUDED_LAYERS
    per_sample_heads: int = DEFAULT_PER_SAMPLE_HEADS
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        layers, heads = self.mean_attention_sum.shape
        selected = set(self.selected)
        per_head = [
            {
                "layer": layer, "head": head,
                "mean_attention_sum": float(self.mean_attention_sum[layer, head]),
                "mean_entropy": None if math.isnan(float(self.mean_entropy[layer, head])) else float(self.mean_entropy[layer, head]),
                "frequency": int(self.frequency[layer, head]),
                "passes_tau": layer >= self.excluded_layers and float(self.mean_attention_sum[layer, head]) >= self.tau,
                "selected": (layer, head) in selected,
            }
            for layer in range(layers) for head in range(heads)
        ]  # fmt: skip
        return {
            "format": SELECTION_FORMAT, "model": self.model, "fingerprint": self.fingerprint,
            "selected_heads": [list(pair) for pair in self.selected], "tau": self.tau, "num_samples": self.num_samples,
            "excluded_layers": self.excluded_layers, "per_sample_heads": self.per_sample_heads, "options": self.options,
            "heads": per_head,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, value: dict, source: str = "`selection`") -> HeadSelection:
        if not isinstance(value, dict) or value.get("format") != SELECTION_FORMAT:
            raise ValueError(f"{source} must be a localization-head selection this library wrote, got another file.")
        try:
            heads = value["heads"]
            layers, per_layer = value["fingerprint"]["num_layers"], value["fingerprint"]["num_heads"]

            def grid(key: str, dtype) -> torch.Tensor:
                values = [math.nan if head[key] is None else head[key] for head in heads]
                return torch.tensor(values, dtype=dtype).view(layers, per_layer)

            return cls(
                value["model"], value["fingerprint"], grid("mean_attention_sum", torch.float64),
                grid("mean_entropy", torch.float64), grid("frequency", torch.long),
                [tuple(pair) for pair in value["selected_heads"]], value["tau"], value["num_samples"],
                value["excluded_layers"], value["per_sample_heads"], value.get("options", {}),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"{source} is a damaged localization-head selection ({type(error).__name__}: {error}).") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, model=None, model_name: str | None = None) -> HeadSelection:
        """The selection in `path`; with `model`, refused (naming both) unless it was made for the same config."""
        path = Path(path)
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"`selection_file` {path} must be a JSON selection this library wrote: {error}") from None
        selection = cls.from_dict(value, f"`selection_file` {path}")
        if model is not None:
            selection.check_model(model, model_name or getattr(model.config, "_name_or_path", "the model"), path)
        return selection

    def check_model(self, model, model_name: str, path: str | Path = "selection") -> None:
        fingerprint = model_fingerprint(model)
        if fingerprint != self.fingerprint:
            raise ValueError(
                f"`selection_file` {path} holds the localization heads of {self.model} ({_describe(self.fingerprint)}), "
                f"not of {model_name} ({_describe(fingerprint)}): select the heads of this model (drop the file)."
            )


def _describe(fingerprint: dict) -> str:
    return (
        f"{fingerprint['model_type']}, {fingerprint['num_layers']} layers x {fingerprint['num_heads']} heads, "
        f"config {fingerprint['config_sha256']}"
    )


def select_localization_heads(
    attention_sums: torch.Tensor,
    entropies: torch.Tensor,
    num_heads: int = DEFAULT_NUM_HEADS,
    per_sample_heads: int = DEFAULT_PER_SAMPLE_HEADS,
    excluded_layers: int = DEFAULT_EXCLUDED_LAYERS,
) -> dict:
    """Kang et al.'s selection from per-sample statistics: `attention_sums` and `entropies` (N, L, H) ->
    {"tau", "mean_attention_sum", "mean_entropy", "frequency", "selected"} (module docstring, steps 2-4)."""
    samples, layers, heads = attention_sums.shape
    if not 0 <= excluded_layers < layers:
        raise ValueError(f"`excluded_layers` must leave a layer of the model's {layers}, got {excluded_layers}.")
    mean_sum = attention_sums.double().mean(0)
    kept_layers = torch.arange(layers)[:, None] >= excluded_layers
    tau = elbow_threshold(mean_sum[excluded_layers:])
    passes = kept_layers & (mean_sum >= tau)
    finite = torch.isfinite(entropies)
    mean_entropy = torch.where(finite, entropies.double(), 0.0).sum(0) / finite.sum(0)
    candidates = torch.where(passes & finite, entropies.double(), math.inf).view(samples, -1)
    frequency = torch.zeros(layers * heads, dtype=torch.long)
    for sample in candidates:
        lowest = torch.sort(sample, stable=True).indices[:per_sample_heads]
        frequency[lowest[torch.isfinite(sample[lowest])]] += 1
    frequency = frequency.view(layers, heads)
    order = sorted(
        ((layer, head) for layer in range(layers) for head in range(heads) if frequency[layer, head] > 0),
        key=lambda pair: (-int(frequency[pair]), _or_inf(mean_entropy[pair]), -float(mean_sum[pair]), pair),
    )
    return {
        "tau": tau, "mean_attention_sum": mean_sum, "mean_entropy": mean_entropy, "frequency": frequency,
        "selected": order[:num_heads],
    }  # fmt: skip


def _or_inf(value: torch.Tensor) -> float:
    return math.inf if math.isnan(float(value)) else float(value)


def find_localization_heads(
    model: nn.Module,
    processor,
    examples: Sequence[dict],
    model_name: str = "model",
    num_heads: int = DEFAULT_NUM_HEADS,
    per_sample_heads: int = DEFAULT_PER_SAMPLE_HEADS,
    excluded_layers: int = DEFAULT_EXCLUDED_LAYERS,
    threshold_factor: float = 1.0,
    component_share: str = "area",
    batch_size: int = 8,
    prompt: str | None = None,
) -> HeadSelection:
    """The localization heads of `model` over `examples` (image, `expression`; the paper: 1,000 RefCOCO training
    pairs). `threshold_factor` / `component_share`: the entropy's binarisation (`spatial_entropy`)."""
    if not examples:
        raise ValueError("`examples` must hold at least one (image, expression) pair, got none.")
    if num_heads < 1 or per_sample_heads < 1:
        raise ValueError(f"`num_heads` and `per_sample_heads` must be >= 1, got {num_heads} and {per_sample_heads}.")
    if not threshold_factor > 0:
        raise ValueError(f"`threshold_factor` must be > 0 (a multiple of each map's mean), got {threshold_factor!r}.")
    if component_share not in COMPONENT_SHARES:
        raise ValueError(f"`component_share` must be one of {COMPONENT_SHARES}, got {component_share!r}.")
    sums, entropies = [], []
    for rows, token_map in image_attention_rows(model, processor, examples, batch_size, prompt):
        sums.append(rows.sum(-1))
        entropies.append(head_spatial_entropy(rows, token_map, threshold_factor, component_share))
    result = select_localization_heads(torch.stack(sums), torch.stack(entropies), num_heads, per_sample_heads, excluded_layers)
    return HeadSelection(
        model_name, model_fingerprint(model), result["mean_attention_sum"], result["mean_entropy"], result["frequency"],
        result["selected"], result["tau"], len(examples), excluded_layers, per_sample_heads,
        {"threshold_factor": threshold_factor, "component_share": component_share, "prompt": prompt},
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Grounding and its scores
# ----------------------------------------------------------------------------------------------------------------


def gold_box_rows(token_map: ImageTokenMap, boxes: Sequence[Sequence[float]], merge_gold_boxes: bool = True) -> torch.Tensor:
    """(1, P): attention uniform over the image tokens the gold `boxes` (pixels; their union box when
    `merge_gold_boxes`) cover, at least half of a token's box inside one (else the most covered token)."""
    boxes = torch.as_tensor(boxes, dtype=torch.float32).view(-1, 4)
    if merge_gold_boxes:
        boxes = torch.cat([boxes[:, :2].amin(0), boxes[:, 2:].amax(0)])[None]
    return covered_cells_target(token_map.coverage(boxes))[None]


def _centre_box(image_size: tuple[int, int], relative_size: tuple[float, float]) -> list[float]:
    width, height = image_size
    box_width, box_height = relative_size[0] * width, relative_size[1] * height
    return [(width - box_width) / 2, (height - box_height) / 2, (width + box_width) / 2, (height + box_height) / 2]


def localization_head_grounding(
    model: nn.Module,
    processor,
    examples: Sequence[dict],
    selection: HeadSelection,
    merge_gold_boxes: bool = True,
    batch_size: int = 8,
    prompt: str | None = None,
    smoothing_sigma: float = GAUSSIAN_SIGMA,
) -> dict:
    """Grounds each example's expression with the selected heads (`ground_from_heads`) and scores accuracy at IoU >=
    0.5 against its gold `boxes` (pixels; several boxes: their union when `merge_gold_boxes`, Plummer et al.'s
    protocol, else any one of them, MDETR's ANY-BOX), beside two baselines: a centred box of the mean gold box's size
    relative to its image (`centre_box_accuracy`) and the whole image (`whole_image_accuracy`); and the procedure's
    ceiling at the model's grid, `gold_map_accuracy`: the same grounding from a map uniform over the image tokens the
    gold boxes cover (`gold_box_rows`). Smoothing widens every map by a few cells, so where the gold boxes span few
    tokens this ceiling is low and no selection of heads can score above it.

    `smoothing_sigma` is the Gaussian's sigma in grid cells: the paper's 1 (7 x 7 kernel) on LLaVA-1.5's 24 x 24 grid,
    a 24th of the image side. On a coarser grid the same cells smooth a larger share of the image; sigma = grid side /
    24 keeps the paper's smoothing as a share of the image (a named reading, not the paper's default)."""
    if not selection.selected:
        raise ValueError(f"`selection` of {selection.model} holds no head (no head ever passed tau with a finite entropy).")
    check_sigma("smoothing_sigma", smoothing_sigma)
    heads = torch.tensor(selection.selected)
    predicted, gold, sizes, ceiling, flat = [], [], [], [], 0
    for (rows, token_map), example in zip(image_attention_rows(model, processor, examples, batch_size, prompt), examples):
        box = ground_from_heads(rows[heads[:, 0], heads[:, 1]], token_map, sigma=smoothing_sigma)
        if box is None:  # a flat map: no box, scored as a miss
            flat += 1
            box = [0.0, 0.0, 0.0, 0.0]
        gold_rows = gold_box_rows(token_map, example["boxes"], merge_gold_boxes)
        gold_box = ground_from_heads(gold_rows, token_map, sigma=smoothing_sigma)
        predicted.append([box])
        ceiling.append([gold_box or [0.0, 0.0, 0.0, 0.0]])
        gold.append(example["boxes"])
        sizes.append(token_map.image_size)
    recall = phrase_grounding_recall(predicted, gold, ks=(1,), merge_gold_boxes=merge_gold_boxes)
    relative = [
        ((max(b[2] for b in boxes) - min(b[0] for b in boxes)) / w, (max(b[3] for b in boxes) - min(b[1] for b in boxes)) / h)
        for boxes, (w, h) in zip(gold, sizes)
    ]  # fmt: skip
    mean_size = (sum(r[0] for r in relative) / len(relative), sum(r[1] for r in relative) / len(relative))
    centre = [[_centre_box(size, mean_size)] for size in sizes]
    whole = [[[0.0, 0.0, float(w), float(h)]] for w, h in sizes]
    score = lambda boxes: phrase_grounding_recall(boxes, gold, ks=(1,), merge_gold_boxes=merge_gold_boxes)["recall@1"]  # noqa: E731
    return {
        "accuracy": recall["recall@1"], "centre_box_accuracy": score(centre), "whole_image_accuracy": score(whole),
        "gold_map_accuracy": score(ceiling), "smoothing_sigma": smoothing_sigma,
        "num_examples": len(predicted), "flat_maps": flat, "iou_threshold": 0.5,
        "gold_boxes": "union" if merge_gold_boxes else "any", "centre_box_relative_size": list(mean_size),
        "selected_heads": [list(pair) for pair in selection.selected],
        "predicted_boxes": [boxes[0] for boxes in predicted],
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Data: RefCOCO-layout files and Flickr30k Entities phrases
# ----------------------------------------------------------------------------------------------------------------


def refcoco_file_examples(path: str | Path) -> list[dict]:
    """The (image_path, expression, boxes) examples of a user-format `refcoco` file (docs/own_data.md: JSON lines or
    CSV with `image`, `expression` and `box` [x1, y1, x2, y2] pixels), checked by the library's reader."""
    from ..data.builders.user_data import build_user_dataset, read_user_rows

    rows = build_user_dataset(path, "refcoco")
    paths = [row.images["image"] for row in read_user_rows(path, "refcoco")]
    return [
        {"image_path": str(image), "expression": row["expression"], "boxes": row["expression_phrase_boxes"][0]}
        for image, row in zip(paths, rows)
    ]


def flickr30k_phrase_examples(
    flickr30k_entities_dir: str | Path, images_dir: str | Path, split: str, max_images: int | None = None
) -> list[dict]:
    """Every boxed phrase of a Flickr30k Entities split as a referring expression: the phrase's text alone (as the
    paper's queries are bare expressions), its gold boxes (scored against their union by default)."""
    captions, _ = grounded_caption_examples(flickr30k_entities_dir, images_dir, split, max_images)
    return [
        {"image_path": caption["image_path"], "expression": caption["caption"][p["char_start"] : p["char_end"]], "boxes": p["boxes"]}
        for caption in captions for p in caption["phrases"]
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------------------------------------------


def plot_head_selection(selection: HeadSelection, path: str | Path) -> None:
    """Two panels: the sorted data-set-mean S_img of the heads considered with tau at its elbow, and each head's
    selection frequency against its mean S_img; the selected heads marked in both."""
    from ..utils.optional import require

    require("matplotlib", extra="plots")
    from matplotlib.figure import Figure

    layers, heads = selection.mean_attention_sum.shape
    considered = [(l, h) for l in range(selection.excluded_layers, layers) for h in range(heads)]  # noqa: E741
    sums = torch.tensor([float(selection.mean_attention_sum[pair]) for pair in considered])
    order = torch.argsort(sums).tolist()
    share = selection.frequency.double() / max(selection.num_samples, 1)
    figure = Figure(figsize=(11, 4.2))
    curve, scatter = figure.subplots(1, 2)
    curve.plot(range(len(order)), sums[order].tolist(), color="0.3", lw=1.2)
    curve.axhline(selection.tau, color="tab:red", ls="--", lw=1, label=f"tau = {selection.tau:.3f} (elbow)")
    for rank, index in enumerate(order):
        if considered[index] in selection.selected:
            curve.plot(rank, float(sums[index]), "o", color="tab:orange", ms=7)
    curve.set(xlabel=f"heads of layers >= {selection.excluded_layers}, sorted (rank)",
              ylabel="mean S_img (share of the last token's attention)", title="attention on the image tokens")  # fmt: skip
    curve.legend(loc="upper left", fontsize=8)
    for layer, head in considered:
        marked = (layer, head) in selection.selected
        scatter.plot(float(selection.mean_attention_sum[layer, head]), float(share[layer, head]), "o",
                     color="tab:orange" if marked else "0.6", ms=7 if marked else 3)  # fmt: skip
        if marked:  # the labels of heads with close values stack one under the other, in selection order
            rank = selection.selected.index((layer, head))
            scatter.annotate(f"L{layer}H{head}", (float(selection.mean_attention_sum[layer, head]), float(share[layer, head])),
                             textcoords="offset points", xytext=(4, 4 - 11 * rank), fontsize=8)  # fmt: skip
    scatter.axvline(selection.tau, color="tab:red", ls="--", lw=1)
    scatter.set(xlabel="mean S_img (share of attention)", ylabel=f"frequency (share of {selection.num_samples} samples)",
                title=f"among the {selection.per_sample_heads} lowest spatial entropies")  # fmt: skip
    figure.suptitle(f"localization heads of {selection.model}: selected {', '.join(f'L{l}H{h}' for l, h in selection.selected)}")
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
