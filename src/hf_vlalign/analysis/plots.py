"""Old path of the analysis plots, kept for compatibility: its contents were split by what they draw.

- `attention_plots.py`: attention maps (word x region heatmaps, per-layer heatmaps, per-head grids, the most attended
  boxes on the image, `format_region_labels`);
- `probe_plots.py`: grounding-probe accuracies (`plot_head_accuracy` / `draw_head_accuracy`, with the layer scatter
  and the relation plots that were there already);
- `figures.py`: the shared helpers, public there (`as_matrix`, `as_array`, `annotate_cells`, `save_png`).

Every name this module had is still found here, imported from those modules on first access (this module imports
nothing at import time). Import from the modules above.
"""

from ..utils.lazy_exports import lazy_exports

_FIGURES = "hf_vlalign.analysis.figures"
_PROBE_PLOTS = "hf_vlalign.analysis.probe_plots"

__getattr__, __dir__ = lazy_exports(
    __name__,
    default="hf_vlalign.analysis.attention_plots",
    names={
        "draw_head_accuracy": (_PROBE_PLOTS, "draw_head_accuracy"),
        "plot_head_accuracy": (_PROBE_PLOTS, "plot_head_accuracy"),
        "_decile_norm": (_PROBE_PLOTS, "_decile_norm"),
        "_colourbar_baseline": (_PROBE_PLOTS, "_colourbar_baseline"),
        "_MAX_ANNOTATED_CELLS": (_FIGURES, "MAX_ANNOTATED_CELLS"),
        "_as_matrix": (_FIGURES, "as_matrix"),
        "_as_array": (_FIGURES, "as_array"),
        "_annotate": (_FIGURES, "annotate_cells"),
        "_save": (_FIGURES, "save_png"),
    },
)

# the names a star import takes (the old module's `__all__`), imported on first access like the others
_STAR_NAMES = (
    "draw_head_accuracy",
    "draw_top_regions_on_image",
    "draw_word_region_heatmaps",
    "format_region_labels",
    "plot_head_accuracy",
    "plot_head_grid",
    "plot_layer_heatmaps",
    "plot_top_regions_on_image",
    "plot_word_region_heatmap",
    "plot_word_region_heatmaps",
)
__all__ = list(_STAR_NAMES)
