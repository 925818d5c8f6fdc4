"""Analyses that read model outputs only: the grounding probe (Li et al.) and its syntactic variant, attention entropy,
attention against geometry, rollout and flow, attention against gradient importance, plots, the bertviz export and
the interactive HTML attention explorer."""

from .adapters import attention_blocks, infer_source, text_to_region_rows
from .attention_blocks import BLOCK_NAMES, AttentionBlocks
from .attention_plots import (
    format_region_labels,
    plot_head_grid,
    plot_layer_heatmaps,
    plot_top_regions_on_image,
    plot_word_region_heatmap,
    plot_word_region_heatmaps,
)
from .bertviz_export import bertviz_inputs, load_bertviz_inputs, save_bertviz_inputs
from .entropy import AttentionEntropy, attention_entropy, plot_entropy
from .explorer import ExplorerExample, GoldPhrase, explorer_examples, read_explorer_payload, write_attention_explorer
from .flow import attention_flow, layer_rollouts
from .geometry import (
    AttentionDistance,
    GroundedWordAttention,
    WithinClusterAttention,
    attention_vs_distance,
    depth_change,
    plot_attention_vs_distance,
    plot_within_cluster,
    region_clusters,
    spatial_clusters,
    thematic_clusters,
    within_cluster_attention,
)
from .grounding_probe import GroundingProbe, GroundingProbeResult, best_active_head, text_to_region_attention
from .importance import captioner_attention_importance, kendall_tau
from .probe_plots import (
    plot_head_accuracy,
    plot_layer_accuracy_scatter,
    plot_relation_accuracy_scatter,
    plot_top_relations,
)
from .syntactic_grounding import SyntacticGroundingProbe, SyntacticGroundingResult, parse_with_spacy, read_conllu

__all__ = [
    "BLOCK_NAMES",
    "AttentionBlocks",
    "AttentionDistance",
    "AttentionEntropy",
    "ExplorerExample",
    "GoldPhrase",
    "GroundedWordAttention",
    "GroundingProbe",
    "GroundingProbeResult",
    "SyntacticGroundingProbe",
    "SyntacticGroundingResult",
    "WithinClusterAttention",
    "attention_blocks",
    "attention_entropy",
    "attention_flow",
    "attention_vs_distance",
    "bertviz_inputs",
    "best_active_head",
    "depth_change",
    "captioner_attention_importance",
    "explorer_examples",
    "format_region_labels",
    "infer_source",
    "kendall_tau",
    "layer_rollouts",
    "load_bertviz_inputs",
    "parse_with_spacy",
    "plot_attention_vs_distance",
    "plot_entropy",
    "plot_head_accuracy",
    "plot_head_grid",
    "plot_layer_accuracy_scatter",
    "plot_layer_heatmaps",
    "plot_relation_accuracy_scatter",
    "plot_top_relations",
    "plot_top_regions_on_image",
    "plot_within_cluster",
    "plot_word_region_heatmap",
    "plot_word_region_heatmaps",
    "read_conllu",
    "read_explorer_payload",
    "region_clusters",
    "save_bertviz_inputs",
    "spatial_clusters",
    "text_to_region_attention",
    "text_to_region_rows",
    "thematic_clusters",
    "within_cluster_attention",
    "write_attention_explorer",
]
