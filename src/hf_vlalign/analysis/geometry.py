"""Region attention against scene geometry and object kinds (Ilinykh, "On the interplay between language and vision in
transformers", slides in /work/shared/papers/ilinykh2022_interplay_language_vision_transformers_slides.txt):
Analysis II, attention as a function of the distance between box centres (`AttentionDistance`, with its effect size:
the attention-weighted mean distance minus the uniform-attention mean distance); Analysis I, how much attention stays
within object clusters (`WithinClusterAttention`; clusters from `thematic_clusters`: the thematic group of each
region's object kind, as the slides' ground-truth clusters, or `region_clusters`: detector classes or spatial
k-means); Analysis IV, how much of a grounded word's cross-modal attention lands on its object's regions
(`GroundedWordAttention`). `depth_change` is the last - first layer difference of a per-layer effect.

All read a block renormalised over the real regions (`AttentionBlocks.row_normalised`, so joint and separate maps are
comparable) and averaged over heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .attention_blocks import AttentionBlocks
from .figures import new_figure, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "CLUSTER_SOURCES",
    "AttentionDistance",
    "GroundedWordAttention",
    "WithinClusterAttention",
    "attention_vs_distance",
    "box_centre_distances",
    "depth_change",
    "draw_attention_vs_distance",
    "plot_attention_vs_distance",
    "plot_within_cluster",
    "region_clusters",
    "spatial_clusters",
    "thematic_clusters",
    "within_cluster_attention",
]

# the largest distance between two centres in the unit square
MAX_CENTRE_DISTANCE = math.sqrt(2.0)

# where the object clusters of Analysis I come from ("auto": detector classes where the store has them, else spatial)
CLUSTER_SOURCES = ("auto", "detector_class", "spatial")
# k of the spatial k-means: a handful of groups among the 10-100 boxes of a detector's output
DEFAULT_NUM_SPATIAL_CLUSTERS = 5
# Lloyd iterations of the spatial k-means (it converges in a few on tens of points)
KMEANS_ITERATIONS = 20


def spatial_clusters(
    visual_boxes: torch.Tensor, visual_attention_mask: torch.Tensor, num_clusters: int = DEFAULT_NUM_SPATIAL_CLUSTERS
) -> torch.Tensor:
    """(B, R) k-means cluster id of each real region by its box centre, -1 on padding.

    Per image, k = min(`num_clusters`, real regions); deterministic: farthest-point initialisation from the first
    region, then `KMEANS_ITERATIONS` Lloyd steps (a cluster left empty keeps its centre).

    Args:
        visual_boxes: (B, R, 4) x1, y1, x2, y2 normalised to [0, 1].
        visual_attention_mask: (B, R), 1 for real regions.
        num_clusters: k.
    """
    boxes = visual_boxes.detach().double().cpu()
    centres = torch.stack([(boxes[..., 0] + boxes[..., 2]) / 2, (boxes[..., 1] + boxes[..., 3]) / 2], -1)
    mask = visual_attention_mask.detach().bool().cpu()
    clusters = torch.full(mask.shape, -1, dtype=torch.long)
    for example in range(mask.shape[0]):
        real = mask[example].nonzero().flatten()
        if real.numel() == 0:
            continue
        points = centres[example, real]  # (n, 2)
        k = min(num_clusters, len(points))
        chosen = [0]
        for _ in range(1, k):
            distance = torch.cdist(points, points[chosen]).min(dim=1).values
            chosen.append(int(distance.argmax()))
        means = points[chosen].clone()
        for _ in range(KMEANS_ITERATIONS):
            assignment = torch.cdist(points, means).argmin(dim=1)
            for cluster in range(k):
                members = points[assignment == cluster]
                if len(members):
                    means[cluster] = members.mean(dim=0)
        clusters[example, real] = torch.cdist(points, means).argmin(dim=1)
    return clusters


def region_clusters(
    visual_boxes: torch.Tensor,
    visual_attention_mask: torch.Tensor,
    object_ids: torch.Tensor | None = None,
    source: str = "auto",
    num_spatial_clusters: int = DEFAULT_NUM_SPATIAL_CLUSTERS,
    min_cluster_size: int = 2,
) -> tuple[torch.Tensor, str]:
    """The object clusters of Ilinykh's Analysis I: ((B, R) cluster id of each region, -1 for none; the source used).

    Args:
        visual_boxes: (B, R, 4) normalised boxes (for "spatial").
        visual_attention_mask: (B, R), 1 for real regions (padding is never clustered).
        object_ids: (B, R) detector class of each region (-1 where unknown), e.g. the store's `object_ids`.
        source: "detector_class" (regions of one detector class form a cluster), "spatial" (`spatial_clusters`:
            k-means on box centres with `num_spatial_clusters`), or "auto": detector classes when `object_ids` is
            given and holds a class for every real region, else spatial.
        num_spatial_clusters: k of the spatial k-means.
        min_cluster_size: a cluster needs this many real regions of its image, the regions of a smaller one get -1
            (2: a region alone in its cluster has only itself to attend to within it).
    """
    mask = visual_attention_mask.detach().bool().cpu()
    if object_ids is not None:
        object_ids = object_ids.detach().cpu().long()
    has_classes = object_ids is not None and bool((object_ids[mask] >= 0).all())
    if source == "auto":
        source = "detector_class" if has_classes else "spatial"
    if source == "detector_class":
        if object_ids is None:
            raise ValueError("`source='detector_class'` needs `object_ids` (the store's detector classes), got None.")
        clusters = object_ids.masked_fill(~mask, -1)
    else:
        clusters = spatial_clusters(visual_boxes, visual_attention_mask, num_spatial_clusters)
    if min_cluster_size > 1:
        same = (clusters[:, :, None] == clusters[:, None, :]) & mask[:, None, :] & (clusters[:, :, None] >= 0)
        clusters = clusters.masked_fill(same.sum(-1) < min_cluster_size, -1)
    return clusters, source


def thematic_clusters(
    object_ids: torch.Tensor, matched: torch.Tensor, class_themes: Sequence[int], min_cluster_size: int = 2
) -> torch.Tensor:
    """(B, R) thematic cluster of each region (Ilinykh, Analysis I: "We inspect attention against ground-truth object
    clusters", slides "Analysis I: Thematic Relatedness"): the theme of its object kind, -1 for none.

    Args:
        object_ids: (B, R) the object kind (detector class) of each region, -1 on padding or where unknown.
        matched: (B, R) bool, the regions that show an object (e.g. IoU >= 0.5 with an annotated object's box); the
            others (distractor boxes, background) belong to no theme and get -1.
        class_themes: the theme id of every kind, indexed by kind (e.g. `THEME_OF_KIND` of the synthetic shapes).
        min_cluster_size: a theme needs this many matched regions of its image, the regions of a smaller one get -1
            (2: a region alone in its theme has no other region to attend to within it).
    """
    object_ids = object_ids.detach().cpu().long()
    matched = matched.detach().cpu().bool() & (object_ids >= 0)
    table = torch.as_tensor(list(class_themes), dtype=torch.long)
    if len(table) == 0 or int(object_ids.max()) >= len(table):
        raise ValueError(
            f"`class_themes` must give a theme to every object kind of `object_ids` (up to {int(object_ids.max())}), "
            f"got {len(table)} themes."
        )
    clusters = torch.where(matched, table[object_ids.clamp(min=0)], torch.full_like(object_ids, -1))
    if min_cluster_size > 1:
        same = (clusters[:, :, None] == clusters[:, None, :]) & matched[:, None, :]
        clusters = clusters.masked_fill(same.sum(-1) < min_cluster_size, -1)
    return clusters


def depth_change(per_layer: Sequence[dict], key: str) -> float | None:
    """The last - first layer difference of `key` over rows {"layer", key} (Ilinykh's claims compare the first layer
    with the deepest); None with fewer than two layers or a missing value."""
    rows = sorted(per_layer, key=lambda row: row["layer"])
    if len(rows) < 2 or rows[0].get(key) is None or rows[-1].get(key) is None:
        return None
    first, last = float(rows[0][key]), float(rows[-1][key])
    return None if math.isnan(first) or math.isnan(last) else last - first


def _region_attention(blocks: AttentionBlocks) -> list[torch.Tensor]:
    """Per layer, (B, R, R) region->region attention renormalised over the real regions and averaged over heads."""
    return [attention.double().mean(dim=1) for attention in blocks.row_normalised("region_to_region")]


def box_centre_distances(visual_boxes: torch.Tensor) -> torch.Tensor:
    """(B, R, 4) x1, y1, x2, y2 -> (B, R, R) Euclidean distances between box centres (normalised image units)."""
    centres = torch.stack([(visual_boxes[..., 0] + visual_boxes[..., 2]) / 2, (visual_boxes[..., 1] + visual_boxes[..., 3]) / 2], -1)
    return torch.cdist(centres.double(), centres.double())


class AttentionDistance:
    """Accumulates head-averaged region->region attention in bins of box-centre distance (Ilinykh, Analysis II), and
    the effect size of `effects()`: the attention-weighted mean distance against the uniform-attention one.

    Bins split [0, sqrt(2)] (every distance in the unit square) into `num_bins` equal parts, so batches add up.
    """

    def __init__(self, num_bins: int = 10) -> None:
        self.num_bins = num_bins
        self.edges = torch.linspace(0.0, MAX_CENTRE_DISTANCE, num_bins + 1, dtype=torch.float64)
        self._sums: list[torch.Tensor] = []
        self._counts: list[torch.Tensor] = []
        # per layer: [sum of attention * distance, sum of attention] over the pairs; the pairs' distances and count
        self._weighted: list[list[float]] = []
        self._distance_sum, self._num_pairs = 0.0, 0

    def update(self, blocks: AttentionBlocks, visual_boxes: torch.Tensor) -> None:
        """Adds every pair of two different real regions of one batch, in every layer."""
        layers = _region_attention(blocks)
        real = blocks.region_mask.bool()  # pairs of two different real regions (the diagonal is excluded)
        pairs = real[:, :, None] & real[:, None, :] & ~torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
        distances = box_centre_distances(visual_boxes)[pairs]
        bins = (torch.bucketize(distances, self.edges.to(distances.device), right=True) - 1).clamp(0, self.num_bins - 1)
        counts = torch.bincount(bins, minlength=self.num_bins).double().cpu()
        self._distance_sum += float(distances.sum())
        self._num_pairs += int(distances.numel())
        for layer, attention in enumerate(layers):
            weights = attention[pairs]
            sums = torch.bincount(bins, weights=weights, minlength=self.num_bins).cpu()
            if len(self._sums) <= layer:
                self._sums.append(torch.zeros(self.num_bins, dtype=torch.float64))
                self._counts.append(torch.zeros(self.num_bins, dtype=torch.float64))
                self._weighted.append([0.0, 0.0])
            self._sums[layer] += sums
            self._counts[layer] += counts
            self._weighted[layer][0] += float((weights * distances).sum())
            self._weighted[layer][1] += float(weights.sum())

    def compute(self) -> list[dict]:
        """Rows {"layer", "distance_bin_low", "distance_bin_high", "mean_attention", "num_pairs"}; an empty bin has
        num_pairs 0 and mean_attention NaN."""
        if not self._sums:
            raise ValueError("`AttentionDistance.compute()` needs at least one `update(blocks, visual_boxes)` first, got none.")
        table = []
        for layer, (sums, counts) in enumerate(zip(self._sums, self._counts)):
            for index in range(self.num_bins):
                count = int(counts[index])
                table.append(
                    {
                        "layer": layer,
                        "distance_bin_low": float(self.edges[index]),
                        "distance_bin_high": float(self.edges[index + 1]),
                        "mean_attention": float(sums[index]) / count if count else math.nan,
                        "num_pairs": count,
                    }
                )
        return table


    def effects(self) -> list[dict]:
        """Per layer, Analysis II's effect size: rows {"layer", "attention_weighted_distance" (sum of a * d / sum of a
        over the pairs of two different real regions: the mean box-centre distance of what a region attends to),
        "uniform_distance" (the mean d over those pairs: the same under uniform attention), "effect" (weighted -
        uniform: < 0 local, > 0 attention goes to distant regions), "num_pairs"}; NaN without pairs or mass."""
        if not self._weighted:
            raise ValueError("`AttentionDistance.effects()` needs at least one `update(blocks, visual_boxes)` first, got none.")
        uniform = self._distance_sum / self._num_pairs if self._num_pairs else math.nan
        table = []
        for layer, (weighted, mass) in enumerate(self._weighted):
            mean = weighted / mass if mass > 0 else math.nan
            table.append(
                {
                    "layer": layer, "attention_weighted_distance": mean, "uniform_distance": uniform,
                    "effect": mean - uniform, "num_pairs": self._num_pairs,
                }
            )  # fmt: skip
        return table


def attention_vs_distance(blocks: AttentionBlocks, visual_boxes: torch.Tensor, num_bins: int = 10) -> list[dict]:
    """Mean head-averaged region->region attention per bin of box-centre distance, per layer, for one batch
    (Ilinykh, Analysis II); the diagonal (a region attending to itself) and padded regions are left out.

    Args:
        blocks: the batch's attention (its `region_to_region` block is read).
        visual_boxes: (B, R, 4) x1, y1, x2, y2 normalised to [0, 1].
        num_bins: equal-width bins over [0, sqrt(2)].
    Returns:
        rows {"layer", "distance_bin_low", "distance_bin_high", "mean_attention", "num_pairs"}.
    """
    meter = AttentionDistance(num_bins)
    meter.update(blocks, visual_boxes)
    return meter.compute()


class WithinClusterAttention:
    """Accumulates the share of region->region attention that stays within the query region's cluster
    (Ilinykh, Analysis I), averaged over the real, clustered query rows (across = 1 - within), its chance level
    `uniform_within`, the share uniform attention over the keys would give, and the effect size within - uniform.

    Args:
        include_self: count the query's attention to itself as within its cluster (default). With False the diagonal
            is dropped and each row renormalised over the other keys before the shares are taken.
        clustered_keys_only: the keys are the clustered real regions only (each row renormalised over them), so that
            regions of no cluster (e.g. boxes that show no object, for thematic clusters) are left out as queries and
            as keys; default False: every real region is a key.
    """

    def __init__(self, include_self: bool = True, clustered_keys_only: bool = False) -> None:
        self.include_self = bool(include_self)
        self.clustered_keys_only = bool(clustered_keys_only)
        # per layer: [sum of within shares, sum of their chance levels, rows, rows skipped]
        self._totals: list[list] = []

    def update(self, blocks: AttentionBlocks, region_clusters: torch.Tensor) -> None:
        layers = _region_attention(blocks)
        real = blocks.region_mask.bool()
        clusters = region_clusters.to(real.device)
        queries = real & (clusters >= 0)  # (B, R) rows that have a cluster
        keys = queries if self.clustered_keys_only else real
        eye = torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
        key_mask = keys[:, None, :] if self.include_self else keys[:, None, :] & ~eye
        same = (clusters[:, :, None] == clusters[:, None, :]) & key_mask  # keys in the query's cluster
        # chance level: the share of the query's keys that lie in its cluster
        uniform = same.sum(-1).double() / key_mask.sum(-1).double().clamp(min=1.0)
        for layer, attention in enumerate(layers):
            if self.clustered_keys_only or not self.include_self:
                attention = attention * key_mask
                attention = attention / attention.sum(-1, keepdim=True).clamp(min=torch.finfo(attention.dtype).tiny)
            has_mass = attention.sum(-1) > 0
            rows = queries & has_mass
            within = (attention * same).sum(-1)[rows]
            if len(self._totals) <= layer:
                self._totals.append([0.0, 0.0, 0, 0])
            totals = self._totals[layer]
            totals[0] += float(within.sum())
            totals[1] += float(uniform[rows].sum())
            totals[2] += int(rows.sum())
            totals[3] += int((queries & ~has_mass).sum())

    def compute(self) -> list[dict]:
        """Rows {"layer", "within", "across", "uniform_within", "effect" (within - uniform_within: > 0, attention
        stays within the cluster more than chance), "num_rows", "num_skipped_rows"} (skipped: clustered real regions
        with no attention mass left on the keys); with no clustered row, the shares are NaN."""
        if not self._totals:
            raise ValueError("`WithinClusterAttention.compute()` needs at least one `update(...)` first, got none.")
        table = []
        for layer, (within, uniform, rows, skipped) in enumerate(self._totals):
            share, chance = (within / rows, uniform / rows) if rows else (math.nan, math.nan)
            table.append(
                {
                    "layer": layer,
                    "within": share,
                    "across": 1.0 - share,
                    "uniform_within": chance,
                    "effect": share - chance,
                    "num_rows": rows,
                    "num_skipped_rows": skipped,
                }
            )
        return table


def within_cluster_attention(
    blocks: AttentionBlocks, region_clusters: torch.Tensor, include_self: bool = True, clustered_keys_only: bool = False
) -> list[dict]:
    """`WithinClusterAttention`'s table for one batch (Ilinykh, Analysis I), `region_clusters` (B, R) holding each
    region's cluster id (-1: none)."""
    meter = WithinClusterAttention(include_self, clustered_keys_only)
    meter.update(blocks, region_clusters)
    return meter.compute()


class GroundedWordAttention:
    """Accumulates, per layer of a word->region block, the share of a grounded word's attention (heads averaged,
    renormalised over the real regions) on the regions of the object its noun phrase names, its chance level (the
    share of the real regions that are the object's: uniform attention) and the effect size share - uniform
    (Ilinykh, Analysis IV: "deeper layers ... learn to mirror pairings of objects and noun phrases that correspond to
    them", slides "Analysis IV: Visual Grounding"). For a captioner, the block is its decoder cross-attention
    (`word_to_region`), whose query t generates the word at label position t.

    Args:
        block: the word->region block read (`word_to_region`).
    """

    def __init__(self, block: str = "word_to_region") -> None:
        self.block = block
        # per layer: [sum of shares on the object's regions, sum of their chance levels, rows]
        self._totals: list[list] = []

    def update(self, blocks: AttentionBlocks, word_region_alignment: torch.Tensor) -> None:
        """Adds the batch's grounded words: the real words whose `word_region_alignment` row (B, T, R, the collators'
        target over regions of a grounded phrase's words) puts weight on a real region."""
        query_mask, key_mask = blocks.masks(self.block)
        real = key_mask.bool()
        targets = (word_region_alignment.to(real.device) > 0) & real[:, None, :]  # (B, T, R)
        grounded = query_mask.bool() & targets.any(-1)
        uniform = targets.sum(-1).double() / real.sum(-1, keepdim=True).double().clamp(min=1.0)
        for layer, attention in enumerate(blocks.row_normalised(self.block)):
            mixed = attention.double().mean(dim=1)  # (B, T, R), heads averaged
            rows = grounded & (mixed.sum(-1) > 0)
            share = (mixed * targets).sum(-1)[rows]
            if len(self._totals) <= layer:
                self._totals.append([0.0, 0.0, 0])
            totals = self._totals[layer]
            totals[0] += float(share.sum())
            totals[1] += float(uniform[rows].sum())
            totals[2] += int(rows.sum())

    def compute(self) -> list[dict]:
        """Rows {"layer", "share" (mean share of a grounded word's attention on its object's regions),
        "uniform_share", "effect" (share - uniform_share), "num_words"}; NaN shares without a grounded word."""
        if not self._totals:
            raise ValueError("`GroundedWordAttention.compute()` needs at least one `update(...)` first, got none.")
        table = []
        for layer, (share, uniform, rows) in enumerate(self._totals):
            mean, chance = (share / rows, uniform / rows) if rows else (math.nan, math.nan)
            table.append({"layer": layer, "share": mean, "uniform_share": chance, "effect": mean - chance, "num_words": rows})
        return table


def draw_attention_vs_distance(rows: list[dict], title: str = "") -> Figure:
    """The figure of `plot_attention_vs_distance`, not saved."""
    figure = new_figure(figsize=(6.5, 4.2), layout="constrained")
    ax = figure.subplots()
    # the number of pairs per bin (the same in every layer), as grey bars behind the lines
    first = sorted((row for row in rows if row["layer"] == rows[0]["layer"]), key=lambda row: row["distance_bin_low"])
    counts = ax.twinx()
    counts.bar([(row["distance_bin_low"] + row["distance_bin_high"]) / 2 for row in first],
               [row["num_pairs"] for row in first], width=[row["distance_bin_high"] - row["distance_bin_low"] for row in first],
               color="0.88", edgecolor="0.75", linewidth=0.5)  # fmt: skip
    counts.set_ylabel("region pairs per bin (grey bars)", color="0.4")
    counts.tick_params(axis="y", colors="0.4")
    ax.set_zorder(counts.get_zorder() + 1)
    ax.patch.set_visible(False)
    for layer in sorted({row["layer"] for row in rows}):
        points = sorted(
            ((row["distance_bin_low"] + row["distance_bin_high"]) / 2, row["mean_attention"]) for row in rows if row["layer"] == layer
        )
        centres, values = zip(*points)
        ax.plot(centres, np.asarray(values, dtype=np.float64), marker="o", label=f"layer {layer}")
    ax.set_xlabel("distance between box centres (normalised image coordinates: width and height = 1)")
    ax.set_ylabel("mean attention weight\n(heads averaged, renormalised over regions)")
    ax.set_xlim(0.0, MAX_CENTRE_DISTANCE)
    figure.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=6, fontsize=7, frameon=False,
                  title="region->region attention per layer (lines)", title_fontsize=7)  # fmt: skip
    total = sum(row["num_pairs"] for row in first)
    heading = f"attention vs box distance (n = {total:,} region pairs per layer, self-pairs excluded)"
    ax.set_title(f"{title}: {heading}" if title else heading, fontsize=10)
    return figure


def plot_attention_vs_distance(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Mean attention against box-centre distance (bin centres), one line per layer, with the number of region pairs
    per bin as grey bars on a second axis, saved as a PNG.

    Args:
        rows: the table of `attention_vs_distance` / `AttentionDistance.compute`.
        path: where to write the PNG; parent folders are created.
        title: optional first title line (e.g. the model's name).
    """
    return save_png(draw_attention_vs_distance(rows, title), path)


def plot_within_cluster(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Within- and across-cluster attention shares over layers (stacked bars), saved as a PNG."""
    ordered = sorted(rows, key=lambda row: row["layer"])
    layers = [row["layer"] for row in ordered]
    within = np.asarray([row["within"] for row in ordered], dtype=np.float64)
    figure = new_figure(figsize=(max(5.0, 0.5 * len(layers) + 2.5), 4.2), layout="constrained")
    ax = figure.subplots()
    ax.bar(layers, within, label="within cluster")
    ax.bar(layers, 1.0 - within, bottom=within, label="across clusters")
    uniform = [row.get("uniform_within", math.nan) for row in ordered]
    ax.scatter(layers, uniform, marker="_", s=900, linewidths=2.5, color="black", zorder=3,
               label="within, if attention were uniform")  # fmt: skip
    ax.set_ylim(0.0, 1.0)
    ax.set_xticks(layers)
    ax.set_xlabel("layer (counted from 0)")
    ax.set_ylabel("share of a region's attention\n(heads averaged)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)  # below the axes: bars stay visible
    if title:
        ax.set_title(title)
    return save_png(figure, path)
