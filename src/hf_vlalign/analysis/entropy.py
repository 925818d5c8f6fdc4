"""Attention entropy per block, layer and head (Ilinykh, "Interplay between language and vision in transformers",
Analysis III): the Shannon entropy (nats) of each real query row renormalised over the block's real keys, and its
normalised form H / log(n), n the real keys of the example's block (for the captioner's causal decoder
self-attention n is every real word, not the visible prefix, so early words read low). The captioner's
`word_to_region` (its decoder cross-attention) is labelled "decoder_cross".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .attention_blocks import AttentionBlocks
from .figures import new_figure, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["AttentionEntropy", "attention_entropy", "block_label", "draw_entropy", "plot_entropy"]


def block_label(name: str, source: str) -> str:
    """The name a block carries in the tables: the captioner's word_to_region is its decoder cross-attention."""
    return "decoder_cross" if source == "captioner" and name == "word_to_region" else name


def row_entropy(probabilities: torch.Tensor) -> torch.Tensor:
    """H(p) = -sum_k p_k log p_k over the last dim, in nats, with 0 log 0 = 0 (Ilinykh, Analysis III)."""
    logs = torch.log(probabilities.clamp(min=torch.finfo(probabilities.dtype).tiny))
    return -(probabilities * logs).sum(-1)


class AttentionEntropy:
    """Accumulates per-head attention entropy over batches of `AttentionBlocks` (`update(blocks)`); `compute()` returns
    the tidy table."""

    def __init__(self) -> None:
        # (block label, layer) -> [entropy sum per head, normalised entropy sum per head, rows, rows skipped]
        self._sums: dict[tuple[str, int], list] = {}

    def update(self, blocks: AttentionBlocks) -> None:
        """Adds the real query rows of every available block of one batch."""
        for name in blocks.available():
            query_mask, key_mask = blocks.masks(name)
            for layer, probabilities in enumerate(blocks.row_normalised(name)):
                self._add(block_label(name, blocks.source), layer, probabilities.double(), query_mask.bool(), key_mask)

    def _add(self, label: str, layer: int, probabilities: torch.Tensor, query_mask: torch.Tensor, key_mask: torch.Tensor) -> None:
        entropy = row_entropy(probabilities)  # (B, H, Q)
        log_keys = torch.log(key_mask.sum(-1).double().clamp(min=1))[:, None, None]  # (B, 1, 1)
        normalised = torch.where(log_keys > 0, entropy / log_keys.clamp(min=1e-12), torch.zeros_like(entropy))
        has_mass = probabilities.sum(-1) > 0  # rows with no mass on real keys have no distribution
        rows = query_mask[:, None, :] & has_mass  # (B, H, Q)
        keep = rows.to(entropy.dtype)
        entry = self._sums.get((label, layer))
        heads = entropy.shape[1]
        if entry is None:
            entry = self._sums[(label, layer)] = [torch.zeros(heads, dtype=torch.float64), torch.zeros(heads, dtype=torch.float64), 0, 0]
        entry[0] += (entropy * keep).sum(dim=(0, 2))
        entry[1] += (normalised * keep).sum(dim=(0, 2))
        entry[2] += int(rows[:, 0].sum())
        entry[3] += int((query_mask & ~has_mass[:, 0]).sum())

    def compute(self) -> list[dict]:
        """Rows {"block", "layer", "head" (int, or "mean" for the average over heads), "entropy" (nats),
        "normalised_entropy", "num_rows", "num_skipped_rows" (real queries with no mass on real keys)}."""
        if not self._sums:
            raise ValueError("`AttentionEntropy.compute()` needs at least one `update(blocks)` first, got none.")
        table = []
        for (label, layer), (entropy, normalised, count, skipped) in self._sums.items():
            scale = 1.0 / count if count else math.nan
            per_head = [(int(h), float(e) * scale, float(n) * scale) for h, (e, n) in enumerate(zip(entropy, normalised))]
            per_head.append(("mean", float(entropy.mean()) * scale, float(normalised.mean()) * scale))
            for head, mean_entropy, mean_normalised in per_head:
                table.append(
                    {
                        "block": label, "layer": layer, "head": head, "entropy": mean_entropy,
                        "normalised_entropy": mean_normalised, "num_rows": count, "num_skipped_rows": skipped,
                    }
                )  # fmt: skip
        return table


def attention_entropy(blocks: AttentionBlocks) -> list[dict]:
    """The entropy table of one batch (see `AttentionEntropy.compute`)."""
    meter = AttentionEntropy()
    meter.update(blocks)
    return meter.compute()


def draw_entropy(rows: list[dict], value: str = "normalised_entropy", title: str = "") -> Figure:
    """The figure of `plot_entropy`, not saved."""
    means = [row for row in rows if row["head"] == "mean"]
    figure = new_figure(figsize=(6.5, 4.0), layout="constrained")
    ax = figure.subplots()
    for label in sorted({row["block"] for row in means}):
        block = sorted((row for row in means if row["block"] == label), key=lambda row: row["layer"])
        counts = [int(row["num_rows"]) for row in block]
        count = f"{counts[0]:,}" if min(counts) == max(counts) else f"{min(counts):,}-{max(counts):,}"
        ax.plot([row["layer"] for row in block], [row[value] for row in block], marker="o",
                label=f"{label} (n = {count} query rows per layer)")  # fmt: skip
    ax.set_xlabel("layer (counted from 0)")
    if value == "normalised_entropy":
        ax.set_ylabel("normalised entropy H / ln(n keys)\n(0 = one key, 1 = uniform)")
        ax.set_ylim(-0.02, 1.02)
    else:
        ax.set_ylabel("entropy H (nats)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(color="0.9", linewidth=0.6)
    ax.legend(fontsize=7, loc="best")
    heading = "attention entropy per block and layer (mean over heads and query rows)"
    ax.set_title(f"{title}: {heading}" if title else heading, fontsize=10)
    return figure


def plot_entropy(rows: list[dict], path: str | Path, value: str = "normalised_entropy", title: str = "") -> Path:
    """One line per block over layers of the head-averaged entropy (the "mean" rows), saved as a PNG; the legend
    gives each block's number of query rows per layer.

    Args:
        rows: the table of `attention_entropy` / `AttentionEntropy.compute`.
        path: where to write the PNG; parent folders are created.
        value: "normalised_entropy" (default; H / ln(n keys), in [0, 1]) or "entropy" (nats).
        title: optional first title line (e.g. the model's name).
    """
    return save_png(draw_entropy(rows, value, title), path)
