"""PNG plots: written, readable by PIL, sized for their labels, and validated against their labels."""

import numpy as np
import pytest
from PIL import Image

from hf_vlalign.analysis.plots import plot_head_accuracy, plot_word_region_heatmap


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


def test_label_length_mismatch_raises(tmp_path):
    attention = np.ones((2, 3)) / 3
    with pytest.raises(ValueError, match="words"):
        plot_word_region_heatmap(attention, ["only one"], ["a", "b", "c"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="region_labels"):
        plot_word_region_heatmap(attention, ["a", "b"], ["a", "b"], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_invalid_matrices_raise(tmp_path):
    with pytest.raises(ValueError, match="attention"):
        plot_word_region_heatmap(np.ones(3), ["a"], ["a", "b", "c"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="attention"):
        plot_word_region_heatmap(np.array([[np.nan, 1.0]]), ["a"], ["a", "b"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="accuracy"):
        plot_head_accuracy(np.array([[0.5, 1.5]]), tmp_path / "x.png")
    with pytest.raises(ValueError, match="accuracy"):
        plot_head_accuracy(np.zeros((0, 4)), tmp_path / "x.png")
