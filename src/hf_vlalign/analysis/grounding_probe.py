"""Grounding probe: every attention head used as a ready-made phrase-grounding classifier.

Li et al. 2020, "What does BERT with vision look at?": a head grounds a phrase correctly when the region its
last sub-word attends to most has IoU >= 0.5 with a gold box of the phrase; the baseline picks the region with the
highest detection confidence. A region store without detection confidences (regions from a grid or the user-data
builder: the collators give every region confidence 1) leaves the baseline only ties, so it picks each image's first
stored region: the result's `baseline_kind` names which of the two was measured (`probe_baseline_kind`). A head is
"actively attending" when the mean share of attention that the probed entity tokens put on the (real) regions exceeds
`active_threshold` (20 % in the paper), and only actively attending heads are candidates for the best head
(`active_heads_only=True`, the paper's choice; see `best_active_head`).

Sequence layout of the single-stream model: positions [0, T) are text tokens, [T, T + R) the R regions and
T + R the [END] token, so every attention map is (B, H, N, N) with N = T + R + 1 (rows are queries).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..metrics.grounding import IOU_THRESHOLD, region_hits

__all__ = [
    "PROBE_BASELINE_NAMES",
    "GroundingProbe",
    "GroundingProbeResult",
    "best_active_head",
    "probe_baseline_kind",
    "score_rows",
    "text_to_region_attention",
]


# rows passed as text->region maps count as attention probabilities while their region mass stays below 1 + this
_PROBABILITY_TOLERANCE = 1e-3

# what `best_active_head` chose its head among, as the results files spell it
BEST_AMONG_ACTIVE = "active heads"
BEST_AMONG_ALL = "all heads"
BEST_AMONG_ALL_NONE_ACTIVE = "all heads (no head is actively attending)"
BEST_AMONG_ALL_SHARE_UNDEFINED = "all heads (active share undefined: the rows are not attention probabilities)"

# how the probe's outputs name its baseline, by kind (`evaluation.baselines.BASELINE_KINDS` describes each)
PROBE_BASELINE_NAMES = {
    "detection_confidence": "detection-confidence baseline",
    "store_order": "store-order baseline (each image's first stored region)",
    "detection_confidence_or_store_order": "detection-confidence baseline (store order for images without confidences)",
    "centre_patch": "centre-patch baseline",
}


def probe_baseline_kind(ranked_phrases: int, tied_phrases: int) -> str:
    """The kind of the probe's baseline from how the region confidences of its phrases' images were: `ranked_phrases`
    had confidences that told their regions apart (a detector's), `tied_phrases` had one confidence for all of their
    (two or more) regions, so the pick was the first region in store order."""
    if tied_phrases == 0:
        return "detection_confidence"
    return "store_order" if ranked_phrases == 0 else "detection_confidence_or_store_order"


def best_active_head(
    accuracy: np.ndarray, active_share: np.ndarray | None, active_threshold: float = 0.2, active_heads_only: bool = True
) -> tuple[int, int, str]:
    """(layer, head, candidates) of the most accurate head, first in layer then head order on ties.

    Li et al. 2020 (sec. 3 and Table 2) take the best head among the actively attending ones only: a head that barely
    looks at the image can still have its tiny region mass peak on the right box. When the share is undefined
    (`active_share` None: rows that are not attention probabilities) or no head is active, every head is a candidate,
    and `candidates` says so.

    Args:
        accuracy: (L, H) head accuracies.
        active_share: (L, H) mean share of attention on the regions, or None.
        active_threshold: a head is active when its share is above this.
        active_heads_only: restrict the candidates to the active heads (False: the best over all heads).
    """
    accuracy = np.asarray(accuracy, dtype=np.float64)
    candidates = BEST_AMONG_ALL
    scores = accuracy
    if active_heads_only:
        if active_share is None:
            candidates = BEST_AMONG_ALL_SHARE_UNDEFINED
        else:
            active = np.asarray(active_share, dtype=np.float64) > active_threshold
            if active.any():
                candidates = BEST_AMONG_ACTIVE
                scores = np.where(active, accuracy, -np.inf)
            else:
                candidates = BEST_AMONG_ALL_NONE_ACTIVE
    layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return int(layer), int(head), candidates


@dataclass
class GroundingProbeResult:
    """Accumulated probe accuracies; `accuracy[l, h]` is the accuracy of head `h` of layer `l`.

    `active_share[l, h]` is the mean share of attention head (l, h) puts on the real regions from the probed tokens
    (None for rows that are not attention probabilities); `best_layer`, `best_head` is the most accurate actively
    attending head (`best_among` says which heads were candidates, see `best_active_head`); `baseline_accuracy` is the
    baseline of kind `baseline_kind` (a `PROBE_BASELINE_NAMES` key).
    """

    accuracy: np.ndarray
    best_layer: int
    best_head: int
    best_head_accuracy: float
    mean_head_accuracy: float
    baseline_accuracy: float
    num_phrases: int
    active_share: np.ndarray | None = None
    active_threshold: float = 0.2
    best_among: str = BEST_AMONG_ALL
    baseline_kind: str = "detection_confidence"
    active: np.ndarray | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Li et al. sec. 3: "actively attending" heads put more than 20 % of the entity tokens' attention on regions
        self.active = None if self.active_share is None else self.active_share > self.active_threshold

    @property
    def active_heads(self) -> list[tuple[int, int]]:
        """(layer, head) of every actively attending head, in layer then head order (empty when undefined)."""
        if self.active is None:
            return []
        return [(int(layer), int(head)) for layer, head in zip(*np.nonzero(self.active))]

    @property
    def baseline_name(self) -> str:
        """The baseline as the probe's table, plots and pages name it."""
        return PROBE_BASELINE_NAMES[self.baseline_kind]

    @property
    def best_head_active_share(self) -> float | None:
        """The share of attention the best head puts on the regions (None when undefined)."""
        return None if self.active_share is None else float(self.active_share[self.best_layer, self.best_head])

    def to_dict(self) -> dict:
        """JSON-ready dictionary (plain lists, ints and floats)."""
        return {
            "accuracy": self.accuracy.tolist(),
            "best_layer": int(self.best_layer),
            "best_head": int(self.best_head),
            "best_head_accuracy": float(self.best_head_accuracy),
            "best_head_active_share": self.best_head_active_share,
            "best_among": self.best_among,
            "mean_head_accuracy": float(self.mean_head_accuracy),
            "baseline_accuracy": float(self.baseline_accuracy),
            "baseline_kind": self.baseline_kind,
            "baseline_name": self.baseline_name,
            "num_phrases": int(self.num_phrases),
            "active_share": None if self.active_share is None else self.active_share.tolist(),
            "active_threshold": float(self.active_threshold),
            "active_heads": [list(pair) for pair in self.active_heads],
        }

    def to_rows(self) -> list[dict]:
        """Tidy table, one row per head: {"layer", "head", "accuracy", "active_share", "active"} (the last two None
        when the share is undefined)."""
        rows = []
        for (layer, head), accuracy in np.ndenumerate(self.accuracy):
            share = None if self.active_share is None else float(self.active_share[layer, head])
            active = None if self.active is None else bool(self.active[layer, head])
            rows.append(
                {"layer": int(layer), "head": int(head), "accuracy": float(accuracy), "active_share": share, "active": active}
            )
        return rows


def _text_to_region_rows(attentions: Sequence[torch.Tensor], text_length: int, num_regions: int) -> torch.Tensor:
    """Raw (not re-normalised) text->region blocks of every layer, stacked to (L, B, H, T, R)."""
    regions = slice(text_length, text_length + num_regions)
    return torch.stack([attention[:, :, :text_length, regions] for attention in attentions])


def text_to_region_attention(
    attentions: Sequence[torch.Tensor],
    text_length: int,
    num_regions: int,
    visual_attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Text->region attention of every layer and head, each row re-normalised over the regions (for plots).

    Args:
        attentions: L tensors (B, H, N, N) of attention probabilities with N = T + R + 1.
        text_length: T, the number of text positions.
        num_regions: R, the number of region positions.
        visual_attention_mask: optional (B, R) mask; masked regions get zero weight before re-normalising.

    Returns:
        (L, B, H, T, R) float tensor; a row with no attention on (unmasked) regions stays all zeros, never NaN.
    """
    rows = _text_to_region_rows(attentions, text_length, num_regions).float()
    if visual_attention_mask is not None:
        rows = rows * visual_attention_mask.to(rows.device, rows.dtype)[None, :, None, None, :]
    mass = rows.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, rows / mass.clamp(min=1e-12), torch.zeros_like(rows))


def score_rows(
    rows: torch.Tensor, region_iou: torch.Tensor, region_mask: torch.Tensor, iou_threshold: float
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Every head's hits and attention share for K probed rows (K, L, H, R), against each row's (K, R) region IoUs
    and real regions: (hits (K, L, H), share of attention on the real regions (K, L, H), whether the rows are
    attention probabilities, i.e. the share is defined: no negative entry and no more than 1 in total)."""
    region_mask = region_mask[:, None, None, :]
    hits = region_hits(rows, region_iou[:, None, None, :], region_mask, iou_threshold)
    real = rows.masked_fill(~region_mask, 0.0)
    share = real.sum(dim=-1)
    probabilities = not (bool((real < 0).any()) or bool((share > 1 + _PROBABILITY_TOLERANCE).any()))
    return hits, share, probabilities


class GroundingProbe:
    """Accumulates, over batches, how often each head's most-attended region grounds a phrase correctly (Li et al. 2020,
    see the module docstring), and each head's mean share of attention on the real regions. `baseline_kind` names a
    baseline whose scores are not detection confidences (patch models: "centre_patch"); None reads it from the
    confidences (`probe_baseline_kind`).

    Example:
        ```python
        probe = GroundingProbe(config.num_hidden_layers, config.num_attention_heads)
        for batch in loader:
            outputs = model(**inputs, output_attentions=True)
            probe.update(outputs.attentions, text_length, batch["phrase_token_index"], batch["phrase_region_iou"],
                         batch["visual_attention_mask"], batch["region_confidence"])
        result = probe.compute()
        ```
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        iou_threshold: float = IOU_THRESHOLD,
        active_threshold: float = 0.2,
        active_heads_only: bool = True,
        baseline_kind: str | None = None,
    ) -> None:
        if baseline_kind is not None and baseline_kind not in PROBE_BASELINE_NAMES:
            raise ValueError(f"`baseline_kind` must be None or one of {sorted(PROBE_BASELINE_NAMES)}, got {baseline_kind!r}.")
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.iou_threshold = float(iou_threshold)
        self.active_threshold = float(active_threshold)
        self.active_heads_only = bool(active_heads_only)
        self.baseline_kind = baseline_kind
        self.reset()

    @property
    def num_phrases(self) -> int:
        """Grounded phrases scored so far."""
        return self._num_phrases

    def reset(self) -> None:
        """Forgets every phrase seen so far."""
        self._correct = torch.zeros(self.num_layers, self.num_heads, dtype=torch.long)
        self._baseline_correct = 0
        self._baseline_ranked = self._baseline_tied = 0  # phrases whose image's confidences ranked / tied its regions
        self._num_phrases = 0
        self._share_sum = torch.zeros(self.num_layers, self.num_heads, dtype=torch.float64)
        self._share_defined = True

    @torch.no_grad()
    def update(
        self,
        attentions: Sequence[torch.Tensor],
        text_length: int,
        phrase_token_index: torch.Tensor,
        phrase_region_iou: torch.Tensor,
        visual_attention_mask: torch.Tensor,
        region_confidence: torch.Tensor,
    ) -> None:
        """Scores one batch for every (layer, head) at once.

        Args:
            attentions: L tensors (B, H, N, N) of attention probabilities, N = T + R + 1.
            text_length: T, the number of text positions.
            phrase_token_index: (B, P) long, position of the last sub-word of each grounded phrase, -1 = padding.
            phrase_region_iou: (B, P, R) best IoU of each region with the phrase's gold boxes.
            visual_attention_mask: (B, R), 1 for real regions, 0 for padding.
            region_confidence: (B, R) detection confidence of each region (the baseline; one value for all regions of
                an image: its first region, in store order).
        """
        rows = _text_to_region_rows(attentions, text_length, phrase_region_iou.shape[-1])
        self.update_from_text_to_region(
            rows, phrase_token_index, phrase_region_iou, visual_attention_mask, region_confidence
        )

    @torch.no_grad()
    def update_from_text_to_region(
        self,
        text_to_region: torch.Tensor,
        phrase_token_index: torch.Tensor,
        phrase_region_iou: torch.Tensor,
        visual_attention_mask: torch.Tensor,
        region_confidence: torch.Tensor,
    ) -> None:
        """Scores one batch from text->region attention given directly, (L, B, H, T, R): e.g. the language->vision
        cross-attention of a two-stream model (`torch.stack(outputs.cross_encoder_attentions)`); the other arguments
        are those of `update`. The active share is left undefined once rows that are not probabilities (negative
        entries or more than 1 in total, e.g. alignment scores or heads summed) have been scored.
        """
        device = text_to_region.device
        # one entry per real phrase (K of them): its example, its slot and its last sub-word
        phrase_token_index = phrase_token_index.to(device)
        batch_index, slot_index = (phrase_token_index >= 0).nonzero(as_tuple=True)
        if batch_index.numel() == 0:
            return
        token_index = phrase_token_index[batch_index, slot_index]
        iou = phrase_region_iou.to(device).float()[batch_index, slot_index]  # (K, R)
        region_mask = visual_attention_mask.to(device).bool()[batch_index]  # (K, R)

        # (L, B, H, T, R) -> (B, T, L, H, R), then pick each phrase's row: (K, L, H, R)
        rows = text_to_region.permute(1, 3, 0, 2, 4)[batch_index, token_index].float()
        hits, share, probabilities = score_rows(rows, iou, region_mask, self.iou_threshold)
        self._correct += hits.sum(dim=0).cpu()
        self._share_defined &= probabilities
        self._share_sum += share.sum(dim=0).double().cpu()

        confidence = region_confidence.to(device).float()[batch_index]
        self._baseline_correct += int(region_hits(confidence, iou, region_mask, self.iou_threshold).sum())
        highest = confidence.masked_fill(~region_mask, float("-inf")).amax(dim=-1)
        lowest = confidence.masked_fill(~region_mask, float("inf")).amin(dim=-1)
        self._baseline_ranked += int((highest > lowest).sum())
        self._baseline_tied += int(((highest == lowest) & (region_mask.sum(dim=-1) > 1)).sum())
        self._num_phrases += int(batch_index.numel())

    def compute(self) -> GroundingProbeResult:
        """Per-head accuracies, the best head, the mean over heads, the baseline (of the kind given to the probe, else
        `probe_baseline_kind` of the confidences seen) and the per-head active share."""
        if self._num_phrases == 0:
            raise ValueError(
                "`GroundingProbe.compute` needs at least one grounded phrase, got none: every `phrase_token_index` "
                "passed to `update` was -1 (or `update` was never called)."
            )
        accuracy = self._correct.double().numpy() / self._num_phrases
        active_share = (self._share_sum.numpy() / self._num_phrases) if self._share_defined else None
        best_layer, best_head, best_among = best_active_head(
            accuracy, active_share, self.active_threshold, self.active_heads_only
        )
        return GroundingProbeResult(
            accuracy=accuracy,
            best_layer=int(best_layer),
            best_head=int(best_head),
            best_head_accuracy=float(accuracy[best_layer, best_head]),
            mean_head_accuracy=float(accuracy.mean()),
            baseline_accuracy=self._baseline_correct / self._num_phrases,
            num_phrases=self._num_phrases,
            active_share=active_share,
            active_threshold=self.active_threshold,
            best_among=best_among,
            baseline_kind=self.baseline_kind or probe_baseline_kind(self._baseline_ranked, self._baseline_tied),
        )
