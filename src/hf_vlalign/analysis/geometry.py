"""Region-to-region attention against scene geometry (Ilinykh, "Interplay between language and vision in
transformers"): Analysis II, attention as a function of the distance between box centres, and Analysis I, how much
attention stays within object clusters.

Both read the `region_to_region` block of `AttentionBlocks` renormalised over the real regions
(`AttentionBlocks.row_normalised`, so a single-stream joint map and a separate encoder map are comparable) and
averaged over heads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..utils.optional import require
from ..utils.validation import check_normalised_boxes, check_rank
from .attention_blocks import AttentionBlocks
from .figures import save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "AttentionDistance",
    "WithinClusterAttention",
    "attention_vs_distance",
    "box_centre_distances",
    "draw_attention_vs_distance",
    "plot_attention_vs_distance",
    "plot_within_cluster",
    "within_cluster_attention",
]

# the largest distance between two centres in the unit square
MAX_CENTRE_DISTANCE = math.sqrt(2.0)


def _region_attention(blocks: AttentionBlocks) -> list[torch.Tensor]:
    """Per layer, (B, R, R) region->region attention renormalised over the real regions and averaged over heads."""
    if not isinstance(blocks, AttentionBlocks):
        raise ValueError(f"`blocks` must be an AttentionBlocks, got {type(blocks).__name__}.")
    if blocks.region_to_region is None:
        raise ValueError(f"`blocks` must hold a region_to_region block, got only {blocks.available()}.")
    batch, num_regions = blocks.region_mask.shape
    for layer, attention in enumerate(blocks.region_to_region):
        if attention.dim() != 4 or (attention.shape[0], *attention.shape[2:]) != (batch, num_regions, num_regions):
            raise ValueError(
                f"`blocks.region_to_region[{layer}]` must have shape (B, H, R, R) = ({batch}, H, {num_regions}, "
                f"{num_regions}) from `blocks.region_mask`, got {tuple(attention.shape)}."
            )
    return [attention.double().mean(dim=1) for attention in blocks.row_normalised("region_to_region")]


def box_centre_distances(visual_boxes: torch.Tensor) -> torch.Tensor:
    """(B, R, 4) x1, y1, x2, y2 -> (B, R, R) Euclidean distances between box centres (normalised image units)."""
    centres = torch.stack([(visual_boxes[..., 0] + visual_boxes[..., 2]) / 2, (visual_boxes[..., 1] + visual_boxes[..., 3]) / 2], -1)
    return torch.cdist(centres.double(), centres.double())


def _real_pairs(region_mask: torch.Tensor) -> torch.Tensor:
    """(B, R, R) True for pairs of two different real regions (the diagonal is excluded)."""
    real = region_mask.bool()
    eye = torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
    return real[:, :, None] & real[:, None, :] & ~eye


class AttentionDistance:
    """Accumulates head-averaged region->region attention in bins of box-centre distance (Ilinykh, Analysis II).

    Bins split [0, sqrt(2)] (every distance in the unit square) into `num_bins` equal parts, so batches add up.
    """

    def __init__(self, num_bins: int = 10) -> None:
        if not isinstance(num_bins, int) or isinstance(num_bins, bool) or num_bins < 1:
            raise ValueError(f"`num_bins` must be a positive int, got {num_bins!r}.")
        self.num_bins = num_bins
        self.edges = torch.linspace(0.0, MAX_CENTRE_DISTANCE, num_bins + 1, dtype=torch.float64)
        self._sums: list[torch.Tensor] = []
        self._counts: list[torch.Tensor] = []

    def update(self, blocks: AttentionBlocks, visual_boxes: torch.Tensor) -> None:
        """Adds every pair of two different real regions of one batch, in every layer."""
        layers = _region_attention(blocks)
        check_rank("visual_boxes", visual_boxes, 3, "(B, R, 4)")
        if tuple(visual_boxes.shape) != (*blocks.region_mask.shape, 4):
            raise ValueError(
                f"`visual_boxes` must have shape (B, R, 4) = {(*blocks.region_mask.shape, 4)} from `blocks.region_mask`, "
                f"got {tuple(visual_boxes.shape)}."
            )
        check_normalised_boxes("visual_boxes", visual_boxes, blocks.region_mask)
        if self._sums and len(layers) != len(self._sums):
            raise ValueError(f"`blocks` has {len(layers)} region_to_region layers, earlier batches had {len(self._sums)}.")
        pairs = _real_pairs(blocks.region_mask)
        distances = box_centre_distances(visual_boxes)[pairs]
        bins = (torch.bucketize(distances, self.edges.to(distances.device), right=True) - 1).clamp(0, self.num_bins - 1)
        counts = torch.bincount(bins, minlength=self.num_bins).double().cpu()
        for layer, attention in enumerate(layers):
            sums = torch.bincount(bins, weights=attention[pairs], minlength=self.num_bins).cpu()
            if len(self._sums) <= layer:
                self._sums.append(torch.zeros(self.num_bins, dtype=torch.float64))
                self._counts.append(torch.zeros(self.num_bins, dtype=torch.float64))
            self._sums[layer] += sums
            self._counts[layer] += counts

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
    (Ilinykh, Analysis I): for each real, clustered query region, within = sum of its attention (renormalised over
    the real regions, heads averaged) on real regions of the same cluster, across = 1 - within (other clusters and
    unclustered regions); both are averaged over query rows.

    Args:
        include_self: count the query's attention to itself as within its cluster (default). With False the diagonal
            is dropped and each row renormalised over the other real regions before the shares are taken.
    """

    def __init__(self, include_self: bool = True) -> None:
        self.include_self = bool(include_self)
        self._within: list[float] = []
        self._rows: list[int] = []
        self._skipped: list[int] = []

    def update(self, blocks: AttentionBlocks, region_clusters: torch.Tensor) -> None:
        layers = _region_attention(blocks)
        _check_clusters(region_clusters, tuple(blocks.region_mask.shape))
        if self._within and len(layers) != len(self._within):
            raise ValueError(f"`blocks` has {len(layers)} region_to_region layers, earlier batches had {len(self._within)}.")
        real = blocks.region_mask.bool()
        clusters = region_clusters.to(real.device)
        same = (clusters[:, :, None] == clusters[:, None, :]) & real[:, None, :]  # keys in the query's cluster
        queries = real & (clusters >= 0)  # (B, R) rows that have a cluster
        eye = torch.eye(real.shape[1], dtype=torch.bool, device=real.device)
        for layer, attention in enumerate(layers):
            if not self.include_self:
                attention = attention.masked_fill(eye, 0.0)
                attention = attention / attention.sum(-1, keepdim=True).clamp(min=torch.finfo(attention.dtype).tiny)
            has_mass = attention.sum(-1) > 0
            rows = queries & has_mass
            within = (attention * same).sum(-1)[rows]
            if len(self._within) <= layer:
                self._within.append(0.0)
                self._rows.append(0)
                self._skipped.append(0)
            self._within[layer] += float(within.sum())
            self._rows[layer] += int(rows.sum())
            self._skipped[layer] += int((queries & ~has_mass).sum())

    def compute(self) -> list[dict]:
        """Rows {"layer", "within", "across", "num_rows", "num_skipped_rows"} (skipped: clustered real regions with
        no attention mass left on real regions); with no clustered row, within and across are NaN."""
        if not self._within:
            raise ValueError("`WithinClusterAttention.compute()` needs at least one `update(...)` first, got none.")
        table = []
        for layer, (within, rows, skipped) in enumerate(zip(self._within, self._rows, self._skipped)):
            share = within / rows if rows else math.nan
            table.append({"layer": layer, "within": share, "across": 1.0 - share, "num_rows": rows, "num_skipped_rows": skipped})
        return table


def _check_clusters(region_clusters: torch.Tensor, expected: tuple[int, int]) -> None:
    check_rank("region_clusters", region_clusters, 2, "(B, R)")
    if region_clusters.is_floating_point() or region_clusters.dtype == torch.bool:
        raise ValueError(f"`region_clusters` must hold integer cluster ids (-1 = no cluster), got dtype {region_clusters.dtype}.")
    if tuple(region_clusters.shape) != expected:
        raise ValueError(f"`region_clusters` must have shape (B, R) = {expected} from `blocks.region_mask`, got {tuple(region_clusters.shape)}.")
    if region_clusters.numel() and int(region_clusters.min()) < -1:
        raise ValueError(f"`region_clusters` must be cluster ids >= 0 or -1 (no cluster), got minimum {int(region_clusters.min())}.")


def within_cluster_attention(blocks: AttentionBlocks, region_clusters: torch.Tensor, include_self: bool = True) -> list[dict]:
    """Within-cluster vs across-cluster share of region->region attention per layer, for one batch (Ilinykh,
    Analysis I; see `WithinClusterAttention`).

    Args:
        blocks: the batch's attention (its `region_to_region` block is read).
        region_clusters: (B, R) long cluster id of each region, -1 for regions in no cluster.
        include_self: whether a region's attention to itself counts as within its cluster.
    Returns:
        rows {"layer", "within", "across", "num_rows", "num_skipped_rows"}.
    """
    meter = WithinClusterAttention(include_self)
    meter.update(blocks, region_clusters)
    return meter.compute()


def draw_attention_vs_distance(rows: list[dict], title: str = "") -> Figure:
    """The figure of `plot_attention_vs_distance`, not saved."""
    require("matplotlib", extra="plots")
    from matplotlib.figure import Figure

    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("`rows` must be the non-empty table of `attention_vs_distance`, got none.")
    figure = Figure(figsize=(6.5, 4.2), layout="constrained")
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
    require("matplotlib", extra="plots")
    from matplotlib.figure import Figure

    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("`rows` must be the non-empty table of `within_cluster_attention`, got none.")
    ordered = sorted(rows, key=lambda row: row["layer"])
    layers = [row["layer"] for row in ordered]
    within = np.asarray([row["within"] for row in ordered], dtype=np.float64)
    figure = Figure(figsize=(max(4.0, 0.5 * len(layers) + 2.5), 3.5))
    ax = figure.subplots()
    ax.bar(layers, within, label="within cluster")
    ax.bar(layers, 1.0 - within, bottom=within, label="across clusters")
    ax.set_ylim(0.0, 1.0)
    ax.set_xticks(layers)
    ax.set_xlabel("layer")
    ax.set_ylabel("share of attention")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return save_png(figure, path)
