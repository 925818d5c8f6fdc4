"""An interactive word-region attention explorer: one self-contained HTML file (plain HTML, JS and SVG, the data
embedded as JSON; no server, no network) to look at what every head attends to, per example, direction ("view"),
layer and head (or the mean over heads, or the attention rollout of joint maps), with the grounding probe's per-head
accuracy grid (Li et al.) as a clickable heatmap; docs/analysis.md shows the page.

Views, each a stack of (L, H, queries, keys) maps with rows renormalised over the real keys: "word_to_region"
(language -> vision; for the captioner its cross-attention before A2's alignment), "region_to_word" (vision ->
language) and "aligned_word_to_region" (the captioner's cross-attention after A2's alignment).

Example:
    ```python
    outputs = model(**inputs, output_attentions=True)
    examples = explorer_examples(
        outputs, words=words, region_boxes=inputs["visual_boxes"], text_mask=inputs["attention_mask"],
        region_mask=inputs["visual_attention_mask"], gold=gold, images=images,
    )
    write_attention_explorer(examples, "explorer.html", probe=probe_result)
    ```
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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

__all__ = [
    "GOLD_BOX_STYLE",
    "SCALE",
    "TOP_BOX_STYLE",
    "VIEWS",
    "ExplorerExample",
    "GoldPhrase",
    "explorer_examples",
    "explorer_payload",
    "read_explorer_payload",
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
    """

    words: list[str]
    region_boxes: np.ndarray
    attention: dict[str, np.ndarray]
    rollout: dict[str, np.ndarray] = field(default_factory=dict)
    gold: list[GoldPhrase] = field(default_factory=list)
    image: Image.Image | None = None
    title: str = ""

    def __post_init__(self) -> None:
        self.words = [str(word) for word in self.words]
        self.region_boxes = _check_boxes("region_boxes", self.region_boxes)
        self.attention = {view: _as_numpy(maps) for view, maps in self.attention.items()}
        self.rollout = {view: _as_numpy(maps) for view, maps in self.rollout.items()}
        self.gold = [_as_gold(phrase, len(self.words), f"gold[{index}]") for index, phrase in enumerate(self.gold)]


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


# what the probe counts as a hit and its baseline, for region models (Li et al.)
REGION_PROBE_RULE = ("a box with IoU \u2265 0.5 with the gold box", "detection-confidence baseline")


def _probe_payload(probe: object, views: dict, rule: tuple[str, str] = REGION_PROBE_RULE) -> dict | None:
    """The probe's (L, H) accuracy grid (a `GroundingProbeResult` or an array) for the "word_to_region" view; `rule`:
    (what a hit is, the baseline's name), as the page words them."""
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
    if result is not None:  # the probe's best head: the best actively attending one (Li et al.)
        best, among, share = (result.best_layer, result.best_head), result.best_among, result.best_head_active_share
    else:
        best, among, share = np.unravel_index(int(np.argmax(accuracy)), accuracy.shape), "all heads", None
    return {
        "view": "word_to_region",
        "accuracy": _rounded(accuracy, 4),
        "best": [int(best[0]), int(best[1])],
        "best_among": among,
        "best_head_active_share": share,
        "baseline": None if result is None else float(result.baseline_accuracy),
        "num_phrases": None if result is None else int(result.num_phrases),
        "rule": rule[0],
        "baseline_name": rule[1],
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
            "shape": list(maps.shape[:2]),
            "rollout": view in first.rollout,
        }
        for view, maps in first.attention.items()
    }
    expected = {view: spec["shape"] for view, spec in views.items()}
    for index, example in enumerate(examples):
        shapes = {view: list(maps.shape[:2]) for view, maps in example.attention.items()}
        if shapes != expected or set(example.rollout) != set(first.rollout):
            raise ValueError(
                f"`examples[{index}]` must have the views, layers and heads of examples[0] ({expected}, rollout "
                f"{sorted(first.rollout)}), got {shapes}, rollout {sorted(example.rollout)}."
            )
    return views


def explorer_payload(
    examples: Sequence[ExplorerExample],
    *,
    probe: object = None,
    title: str = "Word-region attention explorer",
    subtitle: str = "",
    source: str = "",
    precision: int = 4,
    probe_rule: tuple[str, str] = REGION_PROBE_RULE,
) -> dict:
    """The JSON the page embeds: the views (shape, label, rollout available), the colour scale (`colours`, and `scale`:
    `SCALE`, the fill opacity and outline width of a weight), the outline styles of the most attended and gold boxes,
    the probe grid and, per example, its image (base64 PNG), words, region and gold boxes and attention (rounded to `precision` decimals)."""
    if not examples:
        raise ValueError("`examples` must be a non-empty list of ExplorerExample, got none.")
    views = _view_specs(examples)
    return {
        "title": title,
        "subtitle": subtitle,
        "source": source,
        "units": "attention weight (0 to 1)",
        "colours": _colour_stops(),
        "scale": {name: list(value) if isinstance(value, tuple) else value for name, value in SCALE.items()},
        "top_box": dict(TOP_BOX_STYLE),
        "gold_box": dict(GOLD_BOX_STYLE),
        "views": views,
        "probe": _probe_payload(probe, views, probe_rule),
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
                    view: {
                        "heads": _rounded(maps, precision),
                        "rollout": _rounded(example.rollout[view], precision) if view in example.rollout else None,
                    }
                    for view, maps in example.attention.items()
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
    probe_rule: tuple[str, str] = REGION_PROBE_RULE,
) -> Path:
    """Writes the explorer of `examples` (from `explorer_examples`) to one self-contained HTML file.

    Args:
        examples: the examples; all must have the same views, layers and heads.
        path: the HTML file to write; parent folders are created. An existing file is replaced only when it is an
            explorer page (`is_explorer_page`).
        probe: the grounding probe's per-head accuracy, a `GroundingProbeResult` or an (L, H) array matching the
            "word_to_region" view; shown as a clickable heatmap.
        title, subtitle: the page's heading and the line under it (model, data).
        source: the model family, shown in the page.
        precision: decimals kept of every attention weight.
        probe_rule: (what the probe counts as a hit, its baseline's name), shown under the grid: IoU >= 0.5 and
            the detection-confidence baseline for region models, patch coverage and the centre baseline for patches.
    Returns:
        the path written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a str or Path to the HTML file to write, got {type(path).__name__}.")
    payload = explorer_payload(
        examples, probe=probe, title=title, subtitle=subtitle, source=source, precision=precision, probe_rule=probe_rule
    )
    # "</" inside a <script> element would close it: JSON allows the escaped form "<\/"
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    page = _TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)
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

_TEMPLATE = (
    """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 18px 26px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 0 0 6px; }
.subtitle { color: #555; font-size: 13px; margin-bottom: 10px; }
.controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; font-size: 14px; margin: 8px 0 14px;
  padding: 8px 10px; background: #f4f4f6; border-radius: 6px; }
.controls select { font-size: 14px; }
.main { display: flex; flex-wrap: wrap; gap: 26px; align-items: flex-start; }
#scene { width: 440px; height: auto; border: 1px solid #bbb; background: #ddd; display: block; }
.column { flex: 1; min-width: 380px; max-width: 760px; }
.sentence { font-size: 21px; line-height: 2.1; margin: 4px 0 10px; }
.tok { padding: 3px 3px; border-radius: 4px; cursor: pointer; border-bottom: 3px solid transparent; }
.tok.special { color: #999; font-size: 13px; }
.tok.grounded { border-bottom-color: #00c853; }
.tok.selected { outline: 3px solid #1565c0; }
#info { font-size: 14px; min-height: 42px; color: #333; margin-bottom: 12px; }
rect.region { cursor: pointer; }
.legend { display: flex; flex-wrap: wrap; gap: 18px; align-items: center; font-size: 13px; margin: 6px 0 14px; }
.bar { width: 220px; height: 14px; border: 1px solid #888; }
.ticks { display: flex; justify-content: space-between; width: 222px; font-size: 11px; color: #444; }
#probe table { border-collapse: collapse; font-size: 11px; }
#probe td, #probe th { width: 34px; height: 22px; text-align: center; padding: 0; }
#probe td { cursor: pointer; border: 1px solid #fff; }
#probe td.current { outline: 3px solid #1565c0; outline-offset: -3px; }
#probe th { font-weight: normal; color: #555; }
.note { color: #666; font-size: 12px; }
</style>
</head>
<body>
<h1 id="title"></h1>
<div class="subtitle" id="subtitle"></div>
<div class="controls">
  <label>example <select id="example"></select></label>
  <label>direction <select id="view"></select></label>
  <label>layer <select id="layer"></select></label>
  <label>head <select id="head"></select></label>
</div>
<div class="main">
  <div>
    <svg id="scene" xmlns="http://www.w3.org/2000/svg"></svg>
    <div class="note">click a box: the words' attention on it</div>
  </div>
  <div class="column">
    <h2 id="words-title">Words <span class="note">(click or hover a word: its attention over the boxes)</span></h2>
    <div class="sentence" id="sentence"></div>
    <div id="info"></div>
    <div class="legend" id="legend"></div>
    <div id="probe"></div>
  </div>
</div>
"""
    + EXPLORER_DATA_ELEMENT
    + """__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
const SVG = "http://www.w3.org/2000/svg";
const GOLD = DATA.gold_box.colour, TOP = DATA.top_box.colour, SELECT = "#1565c0";
const state = { example: 0, view: null, layer: 0, head: "mean", select: null, hover: null };

function colour(w) {  // the shared 0..1 scale, linear between the stops
  const stops = DATA.colours, x = Math.min(Math.max(w, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
  const a = hex(stops[i]), b = hex(stops[i + 1]);
  return "rgb(" + [0, 1, 2].map(k => Math.round(a[k] + f * (b[k] - a[k]))).join(",") + ")";
}
// a weight's fill opacity and outline width: from the scale's minimum (any w > 0) to its maximum (w = 1), in sqrt(w)
function along(range, w) { return w > 0 ? range[0] + (range[1] - range[0]) * Math.sqrt(Math.min(w, 1)) : 0; }
function fillOpacity(w) { return along(DATA.scale.fill_opacity, w); }
function outlineWidth(w) { return w > 0 ? along(DATA.scale.outline_width, w) : 1; }
function hex(s) { return [1, 3, 5].map(k => parseInt(s.slice(k, k + 2), 16)); }
function el(tag, attrs, parent) {
  const node = document.createElementNS(SVG, tag);
  for (const k in attrs) node.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(node);
  return node;
}
function example() { return DATA.examples[state.example]; }
function spec() { return DATA.views[state.view]; }
function fmt(w) { return w.toFixed(2); }

// the (Q, K) map of the selected example, view, layer and head ("mean": the mean over heads; "rollout")
function matrix() {
  const v = example().attention[state.view];
  if (state.head === "rollout") return v.rollout[state.layer];
  const heads = v.heads[state.layer];
  if (state.head !== "mean") return heads[Number(state.head)];
  return heads[0].map((row, q) => row.map((_, k) => heads.reduce((s, h) => s + h[q][k], 0) / heads.length));
}
// weights over the regions of word t, and over the words of region r, in either direction
function regionWeights(t) { const m = matrix(); return spec().query === "word" ? m[t] : m.map(row => row[t]); }
function wordWeights(r) { const m = matrix(); return spec().query === "word" ? m.map(row => row[r]) : m[r]; }
function argmax(ws) { let best = 0; ws.forEach((w, i) => { if (w > ws[best]) best = i; }); return best; }
function headName() {
  return state.head === "mean" ? "mean over heads" : state.head === "rollout" ? "rollout" : "head " + state.head;
}

function fillSelect(id, options, value) {
  const select = document.getElementById(id);
  select.innerHTML = "";
  for (const [v, text] of options) { const o = document.createElement("option"); o.value = v; o.textContent = text; select.appendChild(o); }
  select.value = value;
}
function syncControls() {
  const short = t => t.length > 70 ? t.slice(0, 69) + "\\u2026" : t;
  fillSelect("example", DATA.examples.map((e, i) => [i, (i + 1) + ". " + short(e.title)]), state.example);
  fillSelect("view", Object.entries(DATA.views).map(([k, v]) => [k, v.label]), state.view);
  const [layers, heads] = spec().shape;
  state.layer = Math.min(state.layer, layers - 1);
  if (state.head === "rollout" && !spec().rollout) state.head = "mean";
  if (state.head !== "mean" && state.head !== "rollout" && Number(state.head) >= heads) state.head = "mean";
  fillSelect("layer", [...Array(layers).keys()].map(l => [l, "layer " + l]), state.layer);
  const options = [...Array(heads).keys()].map(h => [String(h), "head " + h]);
  options.push(["mean", "mean over heads"]);
  if (spec().rollout) options.push(["rollout", "attention rollout"]);
  fillSelect("head", options, state.head);
  document.body.dataset.view = state.view; document.body.dataset.layer = state.layer; document.body.dataset.head = state.head;
}

function defaultSelection() {
  const ex = example();
  if (ex.gold.length) return { kind: "word", index: Math.max(...ex.gold[0].tokens) };
  const t = ex.words.findIndex(w => !/^\\[.*\\]$/.test(w));
  return { kind: "word", index: Math.max(t, 0) };
}

// the image and the region boxes are built once per example and updated in place (a click lands on a stable
// element); the overlay (gold boxes, labels, the selected box) ignores the pointer and is redrawn freely
let built = -1;
function buildScene() {
  const ex = example(), svg = document.getElementById("scene"), [w, h] = ex.size;
  svg.innerHTML = "";
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  if (ex.image) el("image", { href: ex.image, x: 0, y: 0, width: w, height: h, preserveAspectRatio: "none" }, svg);
  else el("rect", { x: 0, y: 0, width: w, height: h, fill: "#d0d0d0" }, svg);
  el("rect", { id: "dim", x: 0, y: 0, width: w, height: h, fill: "#000", "fill-opacity": 0, "pointer-events": "none" }, svg);
  const area = b => (b[2] - b[0]) * (b[3] - b[1]);
  const order = ex.regions.map((b, r) => r).sort((a, b) => area(ex.regions[b]) - area(ex.regions[a]));
  order.forEach(r => {  // larger boxes first, so that every box keeps a clickable part
    const b = ex.regions[r];
    const rect = el("rect", { x: b[0] * w, y: b[1] * h, width: (b[2] - b[0]) * w, height: (b[3] - b[1]) * h,
      class: "region", "data-region": r, "vector-effect": "non-scaling-stroke" }, svg);
    el("title", {}, rect);
    rect.addEventListener("click", () => { state.select = { kind: "region", index: r }; state.hover = null; render(); });
  });
  el("g", { id: "overlay", "pointer-events": "none" }, svg);
}
function drawScene(active) {
  const ex = example(), svg = document.getElementById("scene"), [w, h] = ex.size, font = Math.max(w, h) / 26;
  const weights = active && active.kind === "word" ? regionWeights(active.index) : null;
  const top = weights ? argmax(weights) : -1;
  // the photo is dimmed while weights are shown, so that the scale's colours stand out over any photo
  document.getElementById("dim").setAttribute("fill-opacity", weights ? DATA.scale.dim_photo : 0);
  svg.querySelectorAll("rect.region").forEach(rect => {
    const r = Number(rect.dataset.region), wt = weights ? weights[r] : 0;
    rect.setAttribute("class", "region" + (r === top ? " top" : ""));
    rect.setAttribute("data-weight", weights ? wt : "");
    rect.setAttribute("fill", colour(wt));
    rect.setAttribute("fill-opacity", fillOpacity(wt).toFixed(4));
    rect.setAttribute("stroke", weights ? colour(wt) : "#ffffff");
    rect.setAttribute("stroke-opacity", weights && wt > 0 ? 1 : 0.55);
    rect.setAttribute("stroke-width", outlineWidth(wt).toFixed(2));
    rect.firstChild.textContent = "box r" + r + (weights ? ": attention " + wt.toFixed(4) : "");
  });
  const overlay = document.getElementById("overlay");
  overlay.innerHTML = "";
  const place = b => ({ x: b[0] * w, y: b[1] * h, width: (b[2] - b[0]) * w, height: (b[3] - b[1]) * h, fill: "none",
    "vector-effect": "non-scaling-stroke" });
  const gold = active && active.kind === "word" ? ex.gold.filter(g => g.tokens.includes(active.index)) : [];
  // dark underlays first, then the most attended box solid magenta, then the gold boxes dashed green on top of it:
  // where the two coincide, the magenta shows in the gaps of the green dashes
  gold.forEach(g => g.boxes.forEach(b =>
    el("rect", Object.assign(place(b), { stroke: "#000", "stroke-width": 6, "stroke-opacity": 0.7 }), overlay)));
  if (top >= 0) {
    el("rect", Object.assign(place(ex.regions[top]), { stroke: "#000", "stroke-width": 6, "stroke-opacity": 0.7 }), overlay);
    el("rect", Object.assign(place(ex.regions[top]), { stroke: TOP, "stroke-width": 3.5,
      "stroke-dasharray": DATA.top_box.dasharray, class: "top-outline", "data-region": top }), overlay);
  }
  gold.forEach(g => g.boxes.forEach(b =>
    el("rect", Object.assign(place(b), { stroke: GOLD, "stroke-width": 3.5, "stroke-dasharray": DATA.gold_box.dasharray, class: "gold",
      "data-phrase": g.text }), overlay)));
  if (top >= 0) label(overlay, ex.regions[top], "r" + top + " " + fmt(weights[top]), w, h, font, TOP, "#fff");
  if (active && active.kind === "region") {
    const b = ex.regions[active.index];
    el("rect", Object.assign(place(b), { stroke: SELECT, "stroke-width": 4, class: "selected-region" }), overlay);
    label(overlay, b, "r" + active.index, w, h, font, SELECT, "#fff");
  }
}
function label(parent, b, text, w, h, font, background, fg) {
  const x = b[0] * w, y = Math.max(b[1] * h - font * 1.25, 0);
  el("rect", { x: x, y: y, width: font * 0.62 * text.length + font * 0.4, height: font * 1.2, fill: background,
    "fill-opacity": 0.9 }, parent);
  el("text", { x: x + font * 0.2, y: y + font * 0.95, "font-size": font, fill: fg, "font-family": "monospace" },
    parent).textContent = text;
}

function buildWords() {
  const ex = example(), box = document.getElementById("sentence");
  box.innerHTML = "";
  const grounded = new Set(ex.gold.flatMap(g => g.tokens));
  ex.words.forEach((word, t) => {
    const piece = word.startsWith("##");
    if (t > 0 && !piece) box.appendChild(document.createTextNode(" "));
    const span = document.createElement("span");
    span.textContent = piece ? word.slice(2) : word;
    span.className = "tok" + (/^\\[.*\\]$/.test(word) ? " special" : "") + (grounded.has(t) ? " grounded" : "");
    span.dataset.token = t;
    span.addEventListener("click", () => { state.select = { kind: "word", index: t }; state.hover = null; render(); });
    span.addEventListener("mouseenter", () => { state.hover = { kind: "word", index: t }; draw(); });
    span.addEventListener("mouseleave", () => { state.hover = null; draw(); });
    box.appendChild(span);
  });
}
function drawWords(active) {
  const weights = active && active.kind === "region" ? wordWeights(active.index) : null;
  document.querySelectorAll("#sentence span.tok").forEach(span => {
    const t = Number(span.dataset.token), wt = weights ? weights[t] : null;
    span.classList.toggle("selected", Boolean(active && active.kind === "word" && active.index === t));
    if (wt === null) { delete span.dataset.weight; span.style.backgroundColor = ""; span.style.color = ""; span.title = ""; return; }
    span.dataset.weight = wt;  // background colour and opacity from the scale, as a box's fill
    span.style.backgroundColor = colour(wt).replace("rgb", "rgba").replace(")", "," + fillOpacity(wt).toFixed(4) + ")");
    span.style.color = wt > 0.55 ? "#fff" : "";
    span.title = "attention " + wt.toFixed(4);
  });
}

function drawInfo(active) {
  const ex = example(), info = document.getElementById("info"), where = spec().label + ", layer " + state.layer + ", " + headName();
  if (!active) { info.textContent = ""; return; }
  if (active.kind === "word") {
    const ws = regionWeights(active.index), top = argmax(ws);
    const phrases = ex.gold.filter(g => g.tokens.includes(active.index)).map(g => "\\u201c" + g.text + "\\u201d");
    let text = "\\u201c" + ex.words[active.index] + "\\u201d (token " + active.index + ") \\u2014 " + where
      + ": most attended box r" + top + ", weight " + ws[top].toFixed(3)
      + (spec().query === "region" ? " (boxes attending to the word)" : "") + ". ";
    text += phrases.length ? "Gold box of " + phrases.join(", ") + " shown dashed green." : "No gold box for this word.";
    const other = state.view === "word_to_region" ? "aligned_word_to_region" : state.view === "aligned_word_to_region" ? "word_to_region" : null;
    if (other && DATA.views[other] && state.head !== "rollout") {
      const saved = state.view; state.view = other;
      const ow = regionWeights(active.index), otop = argmax(ow); state.view = saved;
      text += " " + (other === "aligned_word_to_region" ? "After" : "Before") + " A2 alignment: r" + otop + ", " + ow[otop].toFixed(3) + ".";
    }
    info.textContent = text;
  } else {
    const ws = wordWeights(active.index), top = argmax(ws);
    info.textContent = "Box r" + active.index + " \\u2014 " + where + ": words coloured by "
      + (spec().query === "word" ? "their attention on this box" : "this box's attention on them")
      + "; highest \\u201c" + ex.words[top] + "\\u201d, weight " + ws[top].toFixed(3) + ".";
  }
}

function drawLegend() {
  const legend = document.getElementById("legend"), scale = DATA.scale;
  const gradient = "linear-gradient(to right, " + DATA.colours.join(", ") + ")";
  // sample boxes drawn as the scene draws them, on a grey photo dimmed as the scene dims it
  const samples = [0.02, 0.1, 0.2, 0.3, 0.5, 1].map((wt, i) => '<rect x="' + (6 + 40 * i) + '" y="5" width="30" height="18" fill="'
    + colour(wt) + '" fill-opacity="' + fillOpacity(wt).toFixed(3) + '" stroke="' + colour(wt) + '" stroke-width="'
    + outlineWidth(wt).toFixed(2) + '"/><text x="' + (21 + 40 * i) + '" y="36" font-size="10" fill="#fff" text-anchor="middle">'
    + wt + '</text>').join("");
  const outline = style => '<svg width="40" height="20"><rect x="3" y="3" width="34" height="14" fill="none" stroke="#000" stroke-width="6" stroke-opacity="0.7"/>'
    + '<rect x="3" y="3" width="34" height="14" fill="none" stroke="' + style.colour + '" stroke-width="3.5" stroke-dasharray="'
    + style.dasharray + '"/></svg> ' + style.name;
  legend.innerHTML = '<div class="legend-scale"><div><b>' + DATA.units + '</b> \\u2014 one scale for every word and example:'
    + ' fill colour, opacity (from ' + scale.fill_opacity[0] + ' just above 0 to ' + scale.fill_opacity[1] + ' at 1, in \u221aweight)'
    + ' and outline width; the photo is dimmed under the boxes</div>'
    + '<div class="bar" style="background:' + gradient + '"></div>'
    + '<div class="ticks"><span>0</span><span>0.25</span><span>0.5</span><span>0.75</span><span>1</span></div>'
    + '<svg class="samples" width="246" height="40"><rect width="246" height="40" fill="#8c8c8c"/>'
    + '<rect width="246" height="40" fill="#000" fill-opacity="' + scale.dim_photo + '"/>' + samples + '</svg></div>'
    + '<div class="legend-top">' + outline(DATA.top_box) + '</div>'
    + '<div class="legend-gold">' + outline(DATA.gold_box) + '</div>'
    + '<div><svg width="40" height="20"><rect x="3" y="3" width="34" height="14" fill="none" stroke="' + SELECT + '" stroke-width="4"/></svg> selected box</div>'
    + '<div><span class="tok grounded">word</span> has a gold box</div>';
}

function drawProbe() {
  const probe = DATA.probe, box = document.getElementById("probe");
  if (!probe) { box.innerHTML = '<div class="note">No grounding-probe grid in this report.</div>'; return; }
  const acc = probe.accuracy;
  let head = '<h2>Grounding probe: accuracy per head (Li et al.; ' + DATA.views[probe.view].label + ')</h2><div class="note">'
    + 'share of phrases whose last word attends most to ' + probe.rule + ' (0 to 1, same colour scale)'
    + (probe.num_phrases !== null ? '; ' + probe.num_phrases + ' phrases' : '')
    + (probe.baseline !== null ? '; ' + probe.baseline_name + ' ' + probe.baseline.toFixed(3) : '')
    + '; best \\u2605 layer ' + probe.best[0] + ', head ' + probe.best[1] + '. Click a cell to view that head.</div>';
  let table = "<table><tr><th>layer \\\\ head</th>" + acc[0].map((_, h) => "<th>" + h + "</th>").join("") + "</tr>";
  acc.forEach((row, l) => {
    table += "<tr><th>" + l + "</th>" + row.map((a, h) => {
      const current = state.view === probe.view && state.layer === l && state.head === String(h);
      const best = probe.best[0] === l && probe.best[1] === h;
      return '<td class="probe-cell' + (current ? " current" : "") + '" data-layer="' + l + '" data-head="' + h
        + '" data-accuracy="' + a + '" title="layer ' + l + ', head ' + h + ': accuracy ' + a.toFixed(3) + '" style="background:'
        + colour(a) + ";color:" + (a > 0.55 ? "#fff" : "#222") + '">' + (best ? "\\u2605" : "") + a.toFixed(2) + "</td>";
    }).join("") + "</tr>";
  });
  box.innerHTML = head + table + "</table>";
  box.querySelectorAll("td.probe-cell").forEach(cell => cell.addEventListener("click", () => {
    state.view = probe.view; state.layer = Number(cell.dataset.layer); state.head = cell.dataset.head; render();
  }));
}

function draw() {
  if (built !== state.example) { buildScene(); buildWords(); built = state.example; }
  const active = state.hover || state.select;
  drawScene(active); drawWords(active); drawInfo(active);
}
function render() { syncControls(); draw(); drawProbe(); }

function init() {
  document.getElementById("title").textContent = DATA.title;
  document.getElementById("subtitle").textContent = DATA.subtitle;
  state.view = DATA.probe ? DATA.probe.view : Object.keys(DATA.views)[0];
  if (DATA.probe) { state.layer = DATA.probe.best[0]; state.head = String(DATA.probe.best[1]); }
  else { state.layer = DATA.views[state.view].shape[0] - 1; state.head = "mean"; }
  state.select = defaultSelection();
  document.getElementById("example").addEventListener("change", e => { state.example = Number(e.target.value); state.select = defaultSelection(); render(); });
  document.getElementById("view").addEventListener("change", e => { state.view = e.target.value; render(); });
  document.getElementById("layer").addEventListener("change", e => { state.layer = Number(e.target.value); render(); });
  document.getElementById("head").addEventListener("change", e => { state.head = e.target.value; render(); });
  drawLegend(); render();
  document.body.dataset.ready = "1";
}
init();
</script>
</body>
</html>
"""
)
