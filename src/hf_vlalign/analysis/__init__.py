"""Analyses that read model outputs only: the grounding probe (Li et al.) and attention plots."""

from .grounding_probe import GroundingProbe, GroundingProbeResult, text_to_region_attention
from .plots import plot_head_accuracy, plot_word_region_heatmap, plot_word_region_heatmaps

__all__ = [
    "GroundingProbe",
    "GroundingProbeResult",
    "plot_head_accuracy",
    "plot_word_region_heatmap",
    "plot_word_region_heatmaps",
    "text_to_region_attention",
]
