"""An interactive word-region attention explorer: one self-contained HTML file (plain HTML, JS and SVG, the data
embedded as JSON; no server, no network) to look at what every head attends to, per example, direction ("view"),
layer and head (or the mean over heads, or the attention rollout of joint maps), with the grounding probe's per-head
accuracy grid (Li et al.) as a clickable heatmap; docs/analysis.md shows the page.

Views, each a stack of (L, H, queries, keys) maps with rows renormalised over the real keys: "word_to_region"
(language -> vision; for the captioner its cross-attention before A2's alignment), "region_to_word" (vision ->
language) and "aligned_word_to_region" (the captioner's cross-attention after A2's alignment).
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..utils.optional import require
from ..utils.output_paths import refuse_foreign_file
from .adapters import _JOINT_EXTRA, _field, attention_blocks, infer_source
from .attention_blocks import AttentionBlocks
from .figures import rgb_image
from .flow import layer_rollouts
from .grounding_probe import BEST_AMONG_ALL, best_active_head

__all__ = [
    "COLOUR_SCALES",
    "GOLD_BOX_STYLE",
    "MEAN_OVER_HEADS",
    "SCALE",
    "TOP_BOX_STYLE",
    "VIEWS",
    "ExplorerExample",
    "GoldPhrase",
    "explorer_examples",
    "read_explorer_payload",
    "stored_maps",
    "write_attention_explorer",
]

# view name -> (query modality, label shown in the page)
VIEWS = {
    "word_to_region": ("word", "language \u2192 vision (word \u2192 region)"),
    "region_to_word": ("region", "vision \u2192 language (region \u2192 word)"),
    "aligned_word_to_region": ("word", "cross-attention after A2 alignment (word \u2192 region)"),
}
_CAPTIONER_LABEL = "cross-attention before A2 alignment (word \u2192 region)"
# normalised boxes may leave [0, 1] by rounding only
_TOLERANCE = 1e-3
# the longest side of an embedded image, in pixels (a user's photo is scaled down; boxes are normalised)
_MAX_IMAGE_SIDE = 800
# the shared colour scale of attention weights and probe accuracies (0..1): matplotlib's YlOrRd from its yellow on,
# so that a low weight is a colour (yellow) rather than the near-white that vanishes on a photo
_COLORMAP = "YlOrRd"
_COLORMAP_RANGE = (0.2, 1.0)
# how a box shows its weight w over the photo: fill opacity and outline width grow with sqrt(w) from the first value
# (any w > 0) to the second (w = 1), so that low weights get most of the range (0.1: opacity 0.30, 0.3: 0.49, a
# uniform weight over 36 boxes: 0.18); the photo is dimmed under the boxes by `dim_photo` (the opacity of a black
# layer) while a word's weights are shown
SCALE = {"fill_opacity": (0.05, 0.85), "outline_width": (1.0, 4.5), "dim_photo": 0.45}
# the two outlines a word draws, different in colour and in line style (SVG's stroke-dasharray; "": solid), neither
# colour on the weights' scale: its most attended box and its phrase's gold box(es)
# how a page colours a word's weights over the boxes (selectable in the page; `write_attention_explorer` picks the
# first): the name -> what the page says the colour is. "row_max": each weight divided by the largest weight of the
# word's row (where a word looks, however spread its weights: attention of 0.002 per patch over 576 patches is
# invisible on the absolute scale); "uniform": log(w x K) / log(K) for K boxes, 0 at or below uniform attention 1/K,
# 1 when all of the row is on one box (comparable across words and heads); "absolute": the weight itself, 0 to 1
COLOUR_SCALES = {
    "absolute": "attention weight (0 to 1)",
    "row_max": "weight / the selected word's (or box's) largest weight",
    "uniform": "weight relative to uniform attention 1/K (log scale)",
}
# the head index of a stored map that is the mean over the layer's heads (`ExplorerExample.heads`)
MEAN_OVER_HEADS = -1
TOP_BOX_STYLE = {"colour": "#ff2bd6", "dasharray": "", "name": "most attended box (solid magenta)"}
GOLD_BOX_STYLE = {"colour": "#00e676", "dasharray": "8 5", "name": "gold box, the annotation (dashed green)"}


@dataclass
class GoldPhrase:
    """A grounded phrase: its word positions (indices into the example's `words`) and gold boxes (x1, y1, x2, y2
    normalised to [0, 1])."""

    tokens: list[int]
    boxes: list[list[float]]
    text: str = ""


@dataclass
class ExplorerExample:
    """One example of the explorer.

    Attributes:
        words: the T real text tokens (the queries of "word_to_region", the keys of "region_to_word").
        region_boxes: (R, 4) boxes of the real regions, x1, y1, x2, y2 normalised to [0, 1].
        attention: view name (see `VIEWS`) -> (L, H, Q, K) attention, rows = queries.
        rollout: view name -> (L, Q, K) attention rollout up to each layer (joint maps only).
        gold: the grounded phrases with their gold boxes.
        image: the image the boxes lie on (None: a grey canvas).
        title: shown in the example selector.
        heads: None (every layer and head is in `attention`), or the (layer, head) pairs kept of a model of
            `model_shape` (L, H): each `attention` view is then (S, Q, K), the map of each pair, head
            `MEAN_OVER_HEADS` being the mean over the layer's heads; the page offers those maps only (every head of a
            32 x 32-head model over 576 patches is tens of MB per example). No rollout with `heads`.
        model_shape: (L, H) of the model, with `heads`.
    """

    words: list[str]
    region_boxes: np.ndarray
    attention: dict[str, np.ndarray]
    rollout: dict[str, np.ndarray] = field(default_factory=dict)
    gold: list[GoldPhrase] = field(default_factory=list)
    image: Image.Image | None = None
    title: str = ""
    heads: list[tuple[int, int]] | None = None
    model_shape: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.words = [str(word) for word in self.words]
        self.region_boxes = _check_boxes("region_boxes", self.region_boxes)
        self.attention = {view: _as_numpy(maps) for view, maps in self.attention.items()}
        self.rollout = {view: _as_numpy(maps) for view, maps in self.rollout.items()}
        self.gold = [_as_gold(phrase, len(self.words), f"gold[{index}]") for index, phrase in enumerate(self.gold)]
        if self.heads is not None:
            self.heads, self.model_shape = _check_heads(self.heads, self.model_shape, self.attention, self.rollout)

    def head_map(self, view: str, layer: int, head: int) -> np.ndarray:
        """The (Q, K) map of `view` at `layer` and `head` (`MEAN_OVER_HEADS`: the mean over the layer's heads)."""
        maps = self.attention[view]
        if self.heads is None:
            return maps[layer].mean(0) if head == MEAN_OVER_HEADS else maps[layer, head]
        return maps[self.heads.index((layer, head))]


def _check_heads(heads, model_shape, attention: dict, rollout: dict) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """`ExplorerExample.heads` and `model_shape` checked against each other and the (S, Q, K) maps."""
    if model_shape is None or len(model_shape) != 2:
        raise ValueError(
            f"`model_shape` must be the model's (layers, heads) when `heads` is given, got {model_shape!r}."
        )
    layers, num_heads = int(model_shape[0]), int(model_shape[1])
    pairs = [(int(layer), int(head)) for layer, head in heads]
    if len(set(pairs)) != len(pairs) or any(
        not 0 <= layer < layers or not MEAN_OVER_HEADS <= head < num_heads for layer, head in pairs
    ):
        raise ValueError(
            f"`heads` must be distinct (layer, head) pairs with layer in [0, {layers - 1}] and head in "
            f"[{MEAN_OVER_HEADS}, {num_heads - 1}] ({MEAN_OVER_HEADS}: the mean over heads), got {heads!r}."
        )
    shapes = {view: maps.shape for view, maps in attention.items()}
    if rollout or any(len(shape) != 3 or shape[0] != len(pairs) for shape in shapes.values()):
        raise ValueError(
            f"With `heads`, each `attention` view must be (S, Q, K) with S = {len(pairs)} maps and no rollout, got "
            f"{shapes} and rollout {sorted(rollout)}."
        )
    return pairs, (layers, num_heads)


def _as_numpy(values: object) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def _check_boxes(name: str, boxes: object) -> np.ndarray:
    """(n, 4) finite boxes x1, y1, x2, y2 in [0, 1] with x1 <= x2, y1 <= y2."""
    array = _as_numpy(boxes)
    if array.ndim != 2 or array.shape[-1] != 4:
        raise ValueError(f"`{name}` must be (n, 4) boxes x1, y1, x2, y2 normalised to [0, 1], got shape {array.shape}.")
    if not np.isfinite(array).all() or array.min(initial=0) < -_TOLERANCE or array.max(initial=0) > 1 + _TOLERANCE:
        raise ValueError(
            f"`{name}` must be normalised to [0, 1] (divide pixels by the image size), got {array.tolist()}."
        )
    if (array[:, 2] < array[:, 0]).any() or (array[:, 3] < array[:, 1]).any():
        raise ValueError(f"`{name}` must be x1, y1, x2, y2 with x1 <= x2 and y1 <= y2, got {array.tolist()}.")
    return array.clip(0.0, 1.0)


def _as_gold(phrase: object, num_words: int, name: str) -> GoldPhrase:
    """A `GoldPhrase` (or a dict with "tokens", "boxes" and optionally "text"), checked against the words."""
    if isinstance(phrase, Mapping):
        missing = {"tokens", "boxes"} - set(phrase)
        if missing:
            raise ValueError(f"`{name}` must have the keys 'tokens' and 'boxes', got {sorted(phrase)}.")
        phrase = GoldPhrase(list(phrase["tokens"]), phrase["boxes"], str(phrase.get("text", "")))
    tokens = [int(token) for token in phrase.tokens]
    if not tokens or min(tokens) < 0 or max(tokens) >= num_words:
        raise ValueError(f"`{name}.tokens` must be word positions in [0, {num_words - 1}], got {phrase.tokens!r}.")
    boxes = _as_numpy(phrase.boxes)
    if not boxes.size or boxes.size % 4:
        raise ValueError(f"`{name}.boxes` must hold one or more gold boxes x1, y1, x2, y2, got {phrase.boxes!r}.")
    boxes = _check_boxes(f"{name}.boxes", boxes.reshape(-1, 4))
    return GoldPhrase(sorted(set(tokens)), boxes.tolist(), phrase.text)


def _row_normalised(attention: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """(B, ..., Q, K) with padded keys zeroed and each row renormalised over the real keys (empty rows stay 0)."""
    masked = attention.float() * key_mask.reshape(len(key_mask), *[1] * (attention.dim() - 2), -1).float()
    total = masked.sum(-1, keepdim=True)
    return torch.where(total > 0, masked / total.clamp(min=1e-12), masked)


def _stacked_views(outputs: object, blocks: AttentionBlocks) -> dict[str, torch.Tensor]:
    """View name -> (B, L, H, Q, K) renormalised attention of every view `outputs` / `blocks` hold."""
    views = {}
    for name in ("word_to_region", "region_to_word"):
        rows = blocks.row_normalised(name)
        if rows is not None:
            views[name] = torch.stack(rows, dim=1).float()
    aligned = _field(outputs, "aligned_cross_attentions") if blocks.source == "captioner" else None
    if aligned:
        views["aligned_word_to_region"] = torch.stack([_row_normalised(a, blocks.region_mask) for a in aligned], dim=1)
    return views


def _rollout_views(outputs: object, blocks: AttentionBlocks) -> dict[str, torch.Tensor]:
    """View name -> (B, L, Q, K) rollout of a joint map (Abnar & Zuidema, all heads averaged), sliced like the blocks
    and renormalised over the real keys; empty for separate maps (two-stream, captioner: no joint sequence)."""
    if blocks.source not in _JOINT_EXTRA or isinstance(outputs, AttentionBlocks):
        return {}
    rollouts = torch.stack(layer_rollouts([a.float() for a in _field(outputs, "attentions")]), dim=1)  # (B, L, N, N)
    num_text, num_regions = blocks.text_mask.shape[1], blocks.region_mask.shape[1]
    text, regions = slice(0, num_text), slice(num_text, num_text + num_regions)
    return {
        "word_to_region": _row_normalised(rollouts[..., text, regions], blocks.region_mask),
        "region_to_word": _row_normalised(rollouts[..., regions, text], blocks.text_mask),
    }


def _image(image: object, index: int) -> Image.Image | None:
    """A PIL image from a path or an image, scaled down to `_MAX_IMAGE_SIDE`."""
    if image is None:
        return None
    image = rgb_image(image, f"images[{index}]")
    image.thumbnail((_MAX_IMAGE_SIDE, _MAX_IMAGE_SIDE))
    return image


def _real_part(maps: torch.Tensor, view: str, text: torch.Tensor, regions: torch.Tensor) -> np.ndarray:
    """One example's (..., Q, K) maps of `view` restricted to its real queries and keys."""
    query, key = (text, regions) if VIEWS[view][0] == "word" else (regions, text)
    return maps.cpu()[..., query, :][..., key].numpy()


def _per_example(name: str, values: Sequence | None, batch: int) -> list:
    if values is None:
        return [None] * batch
    if len(values) != batch:
        raise ValueError(f"`{name}` must hold one entry per example (B = {batch}), got {len(values)}.")
    return list(values)


@torch.no_grad()
def explorer_examples(
    outputs: object,
    *,
    words: Sequence[Sequence[str]],
    region_boxes: torch.Tensor | np.ndarray,
    text_mask: torch.Tensor | None = None,
    region_mask: torch.Tensor | None = None,
    gold: Sequence[Sequence[GoldPhrase | dict]] | None = None,
    images: Sequence | None = None,
    titles: Sequence[str] | None = None,
    source: str | None = None,
    end_token: bool | None = None,
) -> list[ExplorerExample]:
    """The explorer's examples from one batch of model outputs (any family, or transformers' VisualBert / Lxmert,
    called with `output_attentions=True`) or from `AttentionBlocks`.

    Args:
        outputs: model outputs (read through `analysis.adapters.attention_blocks`) or `AttentionBlocks` (whose own
            masks are used; `text_mask`, `region_mask`, `source` and `end_token` are then ignored); the
            captioner's `aligned_cross_attentions` become the "aligned_word_to_region" view, and joint maps
            (single-stream, VisualBert) also give the attention rollout.
        words: per example, the tokens of its real text positions (`text_mask` == 1), in order; for the captioner, the
            generated word of each decoder position (its `labels`).
        region_boxes: (B, R, 4) boxes x1, y1, x2, y2 normalised to [0, 1] (`visual_boxes`).
        text_mask: (B, T) 1 for real text positions (default: all B x len(words[0]) real).
        region_mask: (B, R) 1 for real regions (default: all real).
        gold: per example, its grounded phrases (`GoldPhrase` or {"tokens", "boxes", "text"}); tokens index `words`.
        images: per example, an image path, a PIL image or None.
        titles: per example, a title (default: the words joined).
        source, end_token: passed to `attention_blocks` (inferred when None).
    """
    boxes = _as_numpy(region_boxes)
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"`region_boxes` must be (B, R, 4) boxes normalised to [0, 1], got shape {boxes.shape}.")
    batch, num_regions = boxes.shape[:2]
    words = _per_example("words", words, batch)
    if isinstance(outputs, AttentionBlocks):
        blocks = outputs
    else:
        if text_mask is None:
            lengths = {len(example_words) for example_words in words}
            if len(lengths) != 1:
                raise ValueError(
                    f"`text_mask` is needed when the examples have different numbers of words, got {sorted(lengths)}."
                )
            text_mask = torch.ones(batch, lengths.pop(), dtype=torch.long)
        if region_mask is None:
            region_mask = torch.ones(batch, num_regions, dtype=torch.long)
        blocks = attention_blocks(
            outputs,
            text_mask=text_mask,
            region_mask=region_mask,
            source=source or infer_source(outputs),
            end_token=end_token,
        )
    if tuple(blocks.region_mask.shape) != (batch, num_regions):
        raise ValueError(
            f"`region_mask` must be (B, R) = {(batch, num_regions)} like `region_boxes`, got {tuple(blocks.region_mask.shape)}."
        )
    views, rollouts = _stacked_views(outputs, blocks), _rollout_views(outputs, blocks)
    if not views:
        raise ValueError(f"`outputs` ({type(outputs).__name__}) hold no word->region or region->word attention.")
    gold = _per_example("gold", gold, batch)
    images = _per_example("images", images, batch)
    titles = _per_example("titles", titles, batch)
    examples = []
    for index in range(batch):
        text = blocks.text_mask[index].bool().cpu()
        regions = blocks.region_mask[index].bool().cpu()
        if len(words[index]) != int(text.sum()):
            raise ValueError(
                f"`words[{index}]` must hold one token per real text position ({int(text.sum())}), got {len(words[index])}."
            )

        examples.append(
            ExplorerExample(
                words=list(words[index]),
                region_boxes=boxes[index][regions.numpy()],
                attention={view: _real_part(maps[index], view, text, regions) for view, maps in views.items()},
                rollout={view: _real_part(maps[index], view, text, regions) for view, maps in rollouts.items()},
                gold=list(gold[index] or []),
                image=_image(images[index], index),
                title=titles[index] or " ".join(words[index]),
            )
        )
    return examples


def _rounded(array: np.ndarray, precision: int) -> list:
    return np.round(array.astype(np.float64), precision).tolist()


def _data_uri(image: Image.Image | None) -> str | None:
    if image is None:
        return None
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def probed_examples(count: int, total: int, noun: str = "examples") -> str:
    """Which examples a probe grid read, as the page says it: all of them, or the first `count` of `total`."""
    return f"all {total:,} {noun}" if count == total else f"the first {count:,} of the {total:,} {noun}"


# what the probe counts as a hit, for region models (Li et al.)
REGION_PROBE_RULE = "a box with IoU \u2265 0.5 with the gold box"


def _probe_payload(probe: object, views: dict, rule: str = REGION_PROBE_RULE, examples: str = "") -> dict | None:
    """The probe's (L, H) accuracy grid (a `GroundingProbeResult` or an array) for the "word_to_region" view, its best
    head of the heads it chose among and the best of all heads, which heads are actively attending, its baseline by
    the name of its kind; `rule`: what a hit is, `examples`: which examples it read, as the page words them."""
    if probe is None:
        return None
    result = probe if hasattr(probe, "accuracy") else None
    accuracy = _as_numpy(result.accuracy if result is not None else probe)
    if "word_to_region" not in views:
        raise ValueError(
            "`probe` needs examples with a 'word_to_region' view (the attention the probe reads), got none."
        )
    expected = tuple(views["word_to_region"]["shape"])
    if accuracy.shape != expected or not np.isfinite(accuracy).all() or accuracy.min() < 0 or accuracy.max() > 1:
        raise ValueError(
            f"`probe` must be (L, H) = {expected} accuracies in [0, 1] (a GroundingProbeResult or an array), got shape {accuracy.shape}."
        )
    best_of_all = best_active_head(accuracy, None, active_heads_only=False)[:2]
    if result is not None:  # the probe's best head: the best actively attending one (Li et al.)
        best, among, share = (result.best_layer, result.best_head), result.best_among, result.best_head_active_share
    else:
        best, among, share = best_of_all, BEST_AMONG_ALL, None
    active = None if result is None or result.active is None else result.active.tolist()
    return {
        "view": "word_to_region",
        "accuracy": _rounded(accuracy, 4),
        "best": [int(best[0]), int(best[1])],
        "best_among": among,
        "best_head_active_share": share,
        "best_of_all_heads": [int(best_of_all[0]), int(best_of_all[1])],
        "active": active,
        "active_threshold": None if active is None else float(result.active_threshold),
        "baseline": None if result is None else float(result.baseline_accuracy),
        "baseline_name": None if result is None else result.baseline_name,
        "num_phrases": None if result is None else int(result.num_phrases),
        "examples": examples,
        "rule": rule,
    }


def _colour_stops(count: int = 11) -> list[str]:
    """`_COLORMAP` over `_COLORMAP_RANGE` sampled at `count` evenly spaced weights 0..1 (matplotlib's colours,
    interpolated in the page)."""
    require("matplotlib", extra="plots")
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[_COLORMAP]
    return [to_hex(cmap(value)) for value in np.linspace(*_COLORMAP_RANGE, count)]


def _view_specs(examples: Sequence[ExplorerExample]) -> dict:
    """View name -> {"label", "query", "shape" (L, H), "rollout"}; every example must have the views of the first."""
    first = examples[0]
    captioner = "aligned_word_to_region" in first.attention
    views = {
        view: {
            "label": _CAPTIONER_LABEL if captioner and view == "word_to_region" else VIEWS[view][1],
            "query": VIEWS[view][0],
            "shape": _layers_and_heads(first, maps),
            "rollout": view in first.rollout,
            "heads": None if first.heads is None else [list(pair) for pair in first.heads],
        }
        for view, maps in first.attention.items()
    }
    expected = {view: spec["shape"] for view, spec in views.items()}
    for index, example in enumerate(examples):
        shapes = {view: _layers_and_heads(example, maps) for view, maps in example.attention.items()}
        if shapes != expected or set(example.rollout) != set(first.rollout) or example.heads != first.heads:
            raise ValueError(
                f"`examples[{index}]` must have the views, layers and heads of examples[0] ({expected}, rollout "
                f"{sorted(first.rollout)}, heads kept {first.heads}), got {shapes}, rollout "
                f"{sorted(example.rollout)}, heads kept {example.heads}."
            )
    return views


def _layers_and_heads(example: ExplorerExample, maps: np.ndarray) -> list[int]:
    return list(example.model_shape) if example.heads is not None else list(maps.shape[:2])


def _quantised(maps: np.ndarray) -> dict:
    """(S, Q, K) maps as the page stores a subset of heads: "max", each row's largest weight (4 significant digits),
    and "codes", per map the base64 of its weights as one byte each, 0..255 of the row's largest (a weight is off by at
    most 1/510 of its row's largest, plus the largest's rounding): a byte per weight where a rounded decimal takes
    about seven characters."""
    peak = maps.max(-1, keepdims=True)
    scaled = np.divide(maps, peak, out=np.zeros_like(maps), where=peak > 0)
    codes = np.rint(scaled * 255).astype(np.uint8)
    return {
        "max": [[float(f"{value:.4g}") for value in rows] for rows in peak[..., 0]],
        "codes": [base64.b64encode(code.tobytes()).decode("ascii") for code in codes],
    }


def stored_maps(view: Mapping) -> np.ndarray:
    """The (S, Q, K) maps of one example's view in a page's data (`read_explorer_payload`) that keeps a subset of heads
    (its view spec's "heads"), decoded as the page decodes them."""
    peaks = np.asarray(view["max"], dtype=np.float64)
    codes = np.stack([np.frombuffer(base64.b64decode(code), dtype=np.uint8) for code in view["codes"]])
    return codes.reshape(*peaks.shape, -1) / 255.0 * peaks[..., None]


def _attention_payload(example: ExplorerExample, view: str, maps: np.ndarray, precision: int) -> dict:
    if example.heads is not None:
        return {"heads": None, "rollout": None, **_quantised(maps)}
    return {
        "heads": _rounded(maps, precision),
        "rollout": _rounded(example.rollout[view], precision) if view in example.rollout else None,
    }


def _payload(examples, probe, title, subtitle, source, precision, probe_rule, probe_examples, colour_scale) -> dict:
    """The JSON the page embeds: the views (shape, label, rollout available), the colour scale (`colours`, and `scale`:
    `SCALE`, the fill opacity and outline width of a weight; `colour_scales` and the one shown first, `colour_scale`),
    the outline styles of the most attended and gold boxes, the probe grid and, per example, its image (base64 PNG),
    words, region and gold boxes and attention (rounded to `precision` decimals; a subset of heads as bytes of each
    row's largest, `_quantised`)."""
    if not examples:
        raise ValueError("`examples` must be a non-empty list of ExplorerExample, got none.")
    views = _view_specs(examples)
    return {
        "title": title,
        "subtitle": subtitle,
        "source": source,
        "units": "attention weight (0 to 1)",
        "colour_scale": colour_scale,
        "colour_scales": COLOUR_SCALES,
        "colours": _colour_stops(),
        "scale": {name: list(value) if isinstance(value, tuple) else value for name, value in SCALE.items()},
        "top_box": dict(TOP_BOX_STYLE),
        "gold_box": dict(GOLD_BOX_STYLE),
        "views": views,
        "probe": _probe_payload(probe, views, probe_rule, probe_examples),
        "examples": [
            {
                "title": example.title,
                "image": _data_uri(example.image),
                "size": list(example.image.size) if example.image is not None else [400, 400],
                "words": example.words,
                "regions": _rounded(example.region_boxes, 5),
                "gold": [
                    {"tokens": phrase.tokens, "boxes": _rounded(np.asarray(phrase.boxes), 5), "text": phrase.text}
                    for phrase in example.gold
                ],
                "attention": {
                    view: _attention_payload(example, view, maps, precision) for view, maps in example.attention.items()
                },
            }
            for example in examples
        ],
    }


def write_attention_explorer(
    examples: Sequence[ExplorerExample],
    path: str | os.PathLike,
    *,
    probe: object = None,
    title: str = "Word-region attention explorer",
    subtitle: str = "",
    source: str = "",
    precision: int = 4,
    probe_rule: str = REGION_PROBE_RULE,
    probe_examples: str = "",
    colour_scale: str = "absolute",
) -> Path:
    """Writes the explorer of `examples` (from `explorer_examples`) to one self-contained HTML file.

    Args:
        examples: the examples; all must have the same views, layers and heads.
        path: the HTML file to write; parent folders are created. An existing file is replaced only when it is an
            explorer page (`is_explorer_page`).
        probe: the grounding probe's per-head accuracy, a `GroundingProbeResult` or an (L, H) array matching the
            "word_to_region" view; shown as a clickable heatmap, its best head starred and named with the heads it was
            chosen among (the actively attending ones, Li et al.; the others hatched), the best of all heads marked
            too where it differs, and the baseline named by its kind (`GroundingProbeResult.baseline_name`).
        title, subtitle: the page's heading and the line under it (model, data).
        source: the model family, shown in the page.
        precision: decimals kept of every attention weight.
        probe_rule: what the probe counts as a hit, shown over the grid: IoU >= 0.5 for region models, patch
            coverage for patches.
        probe_examples: which examples the probe read (e.g. "the first 128 of the 500 examples"), shown over the grid.
        colour_scale: the colour scale the page opens with, one of `COLOUR_SCALES` (the page offers all of them).
    Returns:
        the path written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a str or Path to the HTML file to write, got {type(path).__name__}.")
    if colour_scale not in COLOUR_SCALES:
        raise ValueError(f"`colour_scale` must be one of {tuple(COLOUR_SCALES)}, got {colour_scale!r}.")
    payload = _payload(examples, probe, title, subtitle, source, precision, probe_rule, probe_examples, colour_scale)
    # "</" inside a <script> element would close it: JSON allows the escaped form "<\/"
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    template = resources.files(__package__).joinpath(_TEMPLATE_FILE).read_text(encoding="utf-8")
    page = template.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)
    path = Path(path)
    refuse_foreign_file(path, "path", description="an attention explorer page", is_own=is_explorer_page)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def is_explorer_page(path: Path) -> bool:
    """Whether `path` is a page `write_attention_explorer` wrote (it embeds the explorer's data element)."""
    try:
        with open(path, encoding="utf-8") as file:
            return EXPLORER_DATA_ELEMENT in file.read(EXPLORER_HEAD_BYTES)
    except (OSError, UnicodeDecodeError):
        return False


def read_explorer_payload(path: str | os.PathLike) -> dict:
    """The JSON embedded in an explorer page written by `write_attention_explorer`."""
    text = Path(path).read_text(encoding="utf-8")
    start = text.find(EXPLORER_DATA_ELEMENT)
    end = text.find("</script>", start)
    if start < 0 or end < 0:
        raise ValueError(f"`path` {str(path)!r} is not an explorer page (no embedded data).")
    return json.loads(text[start + len(EXPLORER_DATA_ELEMENT) : end])


# the element holding a page's data: how `read_explorer_payload` finds it, and how a page is recognised as one this
# module wrote (it opens within the template's first `EXPLORER_HEAD_BYTES`, before the embedded data)
EXPLORER_DATA_ELEMENT = '<script type="application/json" id="explorer-data">'
EXPLORER_HEAD_BYTES = 16384
# the page: HTML, CSS and JS beside this module (package data), with __TITLE__ and __DATA__ filled in
_TEMPLATE_FILE = "explorer_template.html"
