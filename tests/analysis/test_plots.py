"""PNG plots: written, readable by PIL, sized for their labels, and validated against their labels."""

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle
from PIL import Image

from hf_vlalign.analysis.entropy import draw_entropy
from hf_vlalign.analysis.geometry import draw_attention_vs_distance
from hf_vlalign.analysis.attention_plots import (
    draw_top_regions_on_image,
    draw_word_region_heatmaps,
    format_region_labels,
    plot_word_region_heatmap,
    plot_word_region_heatmaps,
)
from hf_vlalign.analysis.probe_plots import draw_head_accuracy, draw_layer_accuracy_scatter, plot_head_accuracy


def _open(path):
    with Image.open(path) as image:
        image.load()
        return image.format, image.size, np.asarray(image.convert("L"))


def test_word_region_heatmap_writes_png(tmp_path):
    attention = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    path = plot_word_region_heatmap(
        attention, ["a", "red circle"], ["circle", "square", "triangle"], tmp_path / "plots" / "heatmap.png", "layer 3"
    )
    assert path == tmp_path / "plots" / "heatmap.png"
    image_format, (width, height), pixels = _open(path)
    assert image_format == "PNG"
    assert width > 200 and height > 150
    assert pixels.std() > 10  # not a blank canvas


def test_head_accuracy_writes_png(tmp_path):
    accuracy = np.linspace(0, 1, 6 * 12).reshape(6, 12)
    path = plot_head_accuracy(accuracy, tmp_path / "probe.png", title="grounding probe")
    image_format, (width, height), pixels = _open(path)
    assert image_format == "PNG"
    assert width > 300 and height > 150
    assert pixels.std() > 10


def test_large_heatmap_still_renders(tmp_path):
    attention = np.random.default_rng(0).random((30, 36))
    words = [f"w{i}" for i in range(30)]
    regions = [f"region {i}" for i in range(36)]
    _, (width, height), _ = _open(plot_word_region_heatmap(attention, words, regions, tmp_path / "big.png"))
    assert width > 1000 and height > 800  # figure grows with the labels


RED = to_rgba("red")


def _red_cells(ax):
    """(x, y) centres of the red outlined cells of a heatmap axes."""
    return sorted(
        (round(patch.get_x() + 0.5), round(patch.get_y() + 0.5))
        for patch in ax.patches
        if isinstance(patch, Rectangle) and not patch.get_fill() and patch.get_edgecolor() == RED
    )


def test_region_labels_carry_class_and_box():
    boxes = np.array([[0.12, 0.4, 0.3, 0.62], [0.0, 0.0, 1.0, 1.0]])
    assert format_region_labels(boxes, ["circle", "square"]) == [
        "r0 circle (0.12,0.40)-(0.30,0.62)", "r1 square (0.00,0.00)-(1.00,1.00)"
    ]
    assert format_region_labels(boxes, digits=1)[0] == "r0 (0.1,0.4)-(0.3,0.6)"


def test_word_region_panels_share_one_colour_scale():
    weak = np.array([[0.4, 0.3, 0.3], [0.2, 0.5, 0.3]])
    strong = np.array([[0.9, 0.05, 0.05], [0.0, 0.1, 0.9]])
    figure = draw_word_region_heatmaps([(weak, "layer 0"), (strong, "layer 5")], ["a", "b"], ["r0", "r1", "r2"])
    images = [ax.images[0] for ax in figure.axes if ax.images]
    assert len(images) == 2
    assert {image.get_clim() for image in images} == {(0.0, 0.9)}  # one range: the largest value over both panels
    colourbars = [ax for ax in figure.axes if not ax.images]
    assert len(colourbars) == 1 and "one scale for all 2 panels" in colourbars[0].get_ylabel()
    assert "softmax prob." in colourbars[0].get_ylabel()
    assert [ax.get_title() for ax in figure.axes if ax.images] == ["layer 0", "layer 5"]
    figure = draw_word_region_heatmaps([(weak, ""), (strong, "")], ["a", "b"], ["r0", "r1", "r2"], vmax=1.0)
    assert {ax.images[0].get_clim() for ax in figure.axes if ax.images} == {(0.0, 1.0)}


def test_gold_regions_are_outlined_in_every_panel(tmp_path):
    attention = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    gold = [[0, 2], []]  # word 0 has two gold regions, word 1 none
    figure = draw_word_region_heatmaps([(attention, "a"), (attention, "b")], ["w0", "w1"], ["r0", "r1", "r2"], gold)
    heatmaps = [ax for ax in figure.axes if ax.images]
    # words are rows (y), regions columns (x)
    assert [_red_cells(ax) for ax in heatmaps] == [[(0, 0), (2, 0)]] * 2
    assert [text.get_text() for text in figure.legends[0].get_texts()] == ["gold region"]
    transposed = draw_word_region_heatmaps([(attention, "a")], ["w0", "w1"], ["r0", "r1", "r2"], gold, regions_as_rows=True)
    ax = transposed.axes[0]
    assert _red_cells(ax) == [(0, 0), (0, 2)]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["r0", "r1", "r2"]
    path = plot_word_region_heatmaps([(attention, "a")], ["w0", "w1"], ["r0", "r1", "r2"], tmp_path / "gold.png", gold)
    assert _open(path)[0] == "PNG"


def test_head_accuracy_colours_span_the_data_and_mark_the_baseline():
    accuracy = np.array([[0.35, 0.52, 0.61], [0.86, 0.91, 0.88]])
    figure = draw_head_accuracy(accuracy, "probe", baseline=0.5, num_phrases=4892)
    ax, colourbar = figure.axes
    image = ax.images[0]
    # one colour bin per decile of the heads, from the lowest to the highest accuracy (not 0-1)
    assert image.norm.boundaries[0] == 0.35 and image.norm.boundaries[-1] == 0.91
    low, high = (np.array(image.to_rgba(value)[:3]) for value in (0.86, 0.91))
    assert np.abs(low - high).max() > 0.3  # close accuracies get distinct colours
    assert "0.910" in {text.get_text() for text in ax.texts}  # values written in the cells
    assert _red_cells(ax) == [(1, 1)]  # the best head, layer 1 head 1
    assert "layer 1, head 1 = 0.910" in ax.get_title() and "baseline 0.500" in ax.get_title()
    assert "n = 4,892 phrases" in ax.get_title()
    labels = [label.get_text() for label in colourbar.get_yticklabels()]
    assert "baseline 0.500" in labels  # the baseline's own tick on the colourbar
    assert any(line.get_ydata()[0] == 0.5 for line in colourbar.lines)
    below = draw_head_accuracy(accuracy, baseline=0.194).axes[1]
    assert "baseline 0.194 lies below the scale" in below.get_ylabel()
    flat = draw_head_accuracy(np.full((2, 3), 0.5)).axes[0].images[0]  # one value: a narrow linear scale around it
    assert flat.get_clim() == pytest.approx((0.495, 0.505))


def test_layer_scatter_has_baseline_units_and_count():
    accuracy = np.array([[0.4, 0.5], [0.86, 0.91]])
    figure = draw_layer_accuracy_scatter(accuracy, baseline=0.2, title="probe", num_phrases=12,
                                         baseline_label="detection-confidence baseline")  # fmt: skip
    ax = figure.axes[0]
    assert ax.get_title() == "probe (n = 12 phrases)"
    assert "share of phrases" in ax.get_ylabel() and "layer" in ax.get_xlabel()
    assert [line.get_ydata()[0] for line in ax.lines] == [0.2]
    assert "detection-confidence baseline (0.200)" in [text.get_text() for text in ax.get_legend().get_texts()]


def test_image_figure_draws_top_boxes_and_the_gold_box(tmp_path):
    from PIL import Image as PILImage

    image = PILImage.new("RGB", (100, 80), "white")
    boxes = np.array([[5, 5, 40, 30], [50, 20, 90, 60], [0, 0, 99, 79]], dtype=float)
    attention = np.array([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7]])
    gold = [np.array([[6, 4, 41, 31]]), None]
    figure = draw_top_regions_on_image(image, boxes, ["'red': layer 1, head 2", "'scene'"], attention, top_k=2,
                                       gold_boxes=gold, region_labels=["r0 square", "r1 circle", "r2 scene"])  # fmt: skip
    first, second = figure.axes
    assert first.get_title() == "'red': layer 1, head 2"
    dashed = [patch for patch in first.patches if patch.get_linestyle() != "solid"]
    assert [(patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()) for patch in dashed] == [(6, 4, 35, 27)]
    assert [text.get_text() for text in first.get_legend().get_texts()] == [
        "#1 r0 square: 0.60", "#2 r1 circle: 0.30", "gold box"
    ]
    assert [text.get_text() for text in second.get_legend().get_texts()] == ["#1 r2 scene: 0.70", "#2 r1 circle: 0.20"]


def test_entropy_and_distance_plots_carry_titles_units_and_counts():
    rows = [
        {"block": block, "layer": layer, "head": "mean", "entropy": 0.5 + layer, "normalised_entropy": 0.3, "num_rows": 40}
        for block in ("word_to_region", "region_to_region") for layer in range(2)
    ]  # fmt: skip
    ax = draw_entropy(rows, "entropy", title="model").axes[0]
    assert ax.get_title().startswith("model: attention entropy") and ax.get_ylabel() == "entropy H (nats)"
    assert [text.get_text() for text in ax.get_legend().get_texts()] == [
        "region_to_region (n = 40 query rows per layer)", "word_to_region (n = 40 query rows per layer)"
    ]
    assert "ln(n keys)" in draw_entropy(rows).axes[0].get_ylabel()
    distance = [
        {"layer": layer, "distance_bin_low": low, "distance_bin_high": low + 0.5, "mean_attention": 0.2, "num_pairs": pairs}
        for layer in range(2) for low, pairs in ((0.0, 30), (0.5, 10))
    ]  # fmt: skip
    figure = draw_attention_vs_distance(distance, title="model")
    ax, counts = figure.axes
    assert "n = 40 region pairs per layer" in ax.get_title()
    assert "normalised image coordinates" in ax.get_xlabel() and "attention weight" in ax.get_ylabel()
    assert [bar.get_height() for bar in counts.patches] == [30, 10] and "pairs" in counts.get_ylabel()
    assert [text.get_text() for text in figure.legends[0].get_texts()] == ["layer 0", "layer 1"]
