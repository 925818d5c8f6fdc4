"""Localization heads (Kang et al. 2025, `hf_vlalign.vlms.localization_heads`): the spatial entropy, the components,
the smoothing and the elbow on hand-made maps; the views' token map and the grounding box by hand; the attention rows
against eager `output_attentions`; a planted localization head (an attention function registered through transformers'
`AttentionInterface`) selected and grounding its box on a tiny LLaVA; the selection's JSON round trip and its refusal
for another model; `hf-vlalign localization-heads` on a RefCOCO-layout file of real photos."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import skimage
import torch
from PIL import Image
from torchvision.transforms.functional import gaussian_blur
from transformers.models.llama import modeling_llama

from hf_vlalign.cli import main
from hf_vlalign.vlms.image_token_geometry import single_grid_token_map
from hf_vlalign.vlms.localization_heads import (
    HeadSelection,
    elbow_threshold,
    find_localization_heads,
    flickr30k_phrase_examples,
    gaussian_smooth,
    gold_box_rows,
    ground_from_heads,
    head_spatial_entropy,
    image_attention_rows,
    largest_component_box,
    localization_head_grounding,
    select_localization_heads,
    spatial_entropy,
)
from hf_vlalign.vlms.tiny import tiny_patch_model, word_level_tokenizer
from hf_vlalign.vlms.views import ImageTokenMap, TokenView

PHOTOS = Path(os.path.dirname(skimage.__file__)) / "data"


def grid_map(cells: dict[tuple[int, int], float], shape=(4, 4)) -> torch.Tensor:
    values = torch.zeros(shape)
    for cell, value in cells.items():
        values[cell] = value
    return values


# ----------------------------------------------------------------------------------------------------------------
# Maps by hand
# ----------------------------------------------------------------------------------------------------------------


def test_spatial_entropy_counts_8_connected_components_by_area_or_mass():
    # (0, 0) and (1, 1) touch by a corner: one component of 2 cells under 8-connectivity; (3, 3) alone
    diagonal = grid_map({(0, 0): 1.0, (1, 1): 1.0, (3, 3): 1.0})
    area = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert float(spatial_entropy(diagonal)) == pytest.approx(area)
    # mass: mean 4 / 16 = 0.25; excess 0.75 + 0.75 in the pair, 1.75 alone
    heavier = grid_map({(0, 0): 1.0, (1, 1): 1.0, (3, 3): 2.0})
    shares = torch.tensor([1.5, 1.75]) / 3.25
    assert float(spatial_entropy(heavier, component_share="mass")) == pytest.approx(float(-(shares * shares.log()).sum()))
    # at twice the mean (0.5) the same three cells pass; one blob: 0; a uniform map: nothing above its mean
    assert float(spatial_entropy(heavier, threshold_factor=2.0)) == pytest.approx(area)
    batch = torch.stack([grid_map({(1, 1): 1.0, (1, 2): 1.0}), torch.full((4, 4), 0.0625)])
    assert spatial_entropy(batch).tolist() == [0.0, math.inf]
    with pytest.raises(ValueError, match="`component_share` must be one of"):
        spatial_entropy(diagonal, component_share="hull")


def test_largest_component_box_and_the_elbow_by_hand():
    mask = grid_map({(0, 0): 1, (1, 1): 1, (2, 1): 1, (3, 3): 1}, (4, 5)).bool()
    assert largest_component_box(mask) == (0, 0, 3, 2)  # rows 0-2, columns 0-1 (ends exclusive)
    assert largest_component_box(torch.zeros(3, 3, dtype=torch.bool)) is None
    # the chord from 0.05 to 1.0 over 8 points lies highest above the curve at the 5th point (gap 0.503)
    curve = torch.tensor([0.6, 0.05, 1.0, 0.07, 0.09, 0.06, 0.9, 0.08])
    assert elbow_threshold(curve) == pytest.approx(0.09)


def test_the_smoothing_is_torchvisions_7_by_7_gaussian():
    maps = torch.rand(3, 8, 9, generator=torch.Generator().manual_seed(0))
    expected = gaussian_blur(maps.unsqueeze(1), kernel_size=[7, 7], sigma=[1.0, 1.0]).squeeze(1)
    assert torch.allclose(gaussian_smooth(maps), expected, atol=1e-6)
    assert gaussian_smooth(torch.ones(2, 2)).allclose(torch.ones(2, 2))  # a grid too small to reflect: replicate


def test_single_grid_token_map_inverts_the_processors_geometry():
    # CLIP resizes a 96 x 64 image to a shortest edge of 64 and crops its central 64 x 64: x = x_processed + 16
    processor = tiny_patch_model("llava")[1].image_processor
    token_map = single_grid_token_map(processor, (96, 64), (64, 64), (4, 4), first=1)  # CLIP's [CLS] first
    assert token_map.views[0].box == (16.0, 0.0, 80.0, 64.0) and token_map.num_tokens == 17
    boxes = token_map.token_boxes()
    assert torch.isnan(boxes[0]).all() and boxes[1].tolist() == [16.0, 0.0, 32.0, 16.0]
    assert boxes[16].tolist() == [64.0, 48.0, 80.0, 64.0]


def test_grounding_box_from_one_view_and_from_a_thumbnail_with_tiles():
    token_map = ImageTokenMap((96, 64), 16, [TokenView("image", (4, 4), (16.0, 0.0, 80.0, 64.0), torch.arange(16))])
    rows = grid_map({(2, 2): 0.3, (2, 3): 0.3, (3, 2): 0.2, (0, 0): 0.1}).view(1, 16)
    # without smoothing (kernel 1): mean 0.0563, cells above it: the 2 x 2 block minus (3, 3) and (0, 0); the block's
    # component is larger: rows 2-3, columns 2-3 -> x 16 + 32 .. 16 + 64, y 32 .. 64
    assert ground_from_heads(rows, token_map, kernel_size=1) == [48.0, 32.0, 80.0, 64.0]
    # a 1 x 2 thumbnail over the whole image and two 2 x 2 tiles (left, right halves), all looking at the right half:
    # the canvas (cells of the finest view, 24 x 32 pixels) is 2 x 4; the right half is above the mean density
    thumbnail = TokenView("thumbnail", (1, 2), (0.0, 0.0, 96.0, 64.0), torch.tensor([0, 1]))
    left = TokenView("tile", (2, 2), (0.0, 0.0, 48.0, 64.0), torch.arange(2, 6))
    right = TokenView("tile", (2, 2), (48.0, 0.0, 96.0, 64.0), torch.arange(6, 10))
    views = ImageTokenMap((96, 64), 10, [thumbnail, left, right])
    rows = torch.tensor([[0.05, 0.3, 0.01, 0.01, 0.01, 0.01, 0.15, 0.15, 0.15, 0.15]])
    assert ground_from_heads(rows, views, kernel_size=1) == [48.0, 0.0, 96.0, 64.0]
    # the entropy of several views: each view's, weighted by the head's mass on it (thumbnail 0.35: one blob, 0;
    # left tile 0.04: uniform, inf, but weighted by 0.04 > 0 -> inf)
    assert math.isinf(float(head_spatial_entropy(rows, views)))


def test_gold_box_rows_are_uniform_over_the_tokens_the_gold_box_covers():
    token_map = ImageTokenMap((64, 32), 8, [TokenView("image", (2, 4), (0.0, 0.0, 64.0, 32.0), torch.arange(8))])
    # 16-pixel cells; a box over columns 1-2 of the top row and half of column 3: cells 1, 2 (and 3 at half)
    rows = gold_box_rows(token_map, [[16.0, 0.0, 56.0, 16.0]])
    assert rows[0].tolist() == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3, 0.0, 0.0, 0.0, 0.0])
    # two boxes: their union box (Plummer et al.) spans both rows' first column, or each box's own cells (any)
    boxes = [[0.0, 0.0, 16.0, 16.0], [0.0, 16.0, 16.0, 32.0]]
    assert gold_box_rows(token_map, boxes).tolist() == [[0.5, 0, 0, 0, 0.5, 0, 0, 0]]
    assert gold_box_rows(token_map, [[0.0, 0.0, 16.0, 16.0], [48.0, 16.0, 64.0, 32.0]], merge_gold_boxes=False).tolist() == [
        [0.5, 0, 0, 0, 0, 0, 0, 0.5]
    ]
    # a box smaller than half a cell: its most covered cell
    assert gold_box_rows(token_map, [[20.0, 20.0, 26.0, 26.0]]).tolist() == [[0, 0, 0, 0, 0, 1.0, 0, 0]]


def test_selection_by_hand():
    # 4 layers x 2 heads, 3 samples; layers 0-1 left out; mean S_img of layers 2-3: 0.1, 0.8, 0.9, 0.2 -> sorted
    # 0.1, 0.2, 0.8, 0.9: the chord from 0.1 to 0.9 lies highest above 0.2 (gap 0.167): tau = 0.2, L2H0 (0.1) fails it
    sums = torch.tensor([[0.99, 0.99], [0.99, 0.99], [0.1, 0.8], [0.9, 0.2]]).expand(3, -1, -1)
    entropies = torch.tensor(
        [
            [[0.0, 0.0], [0.0, 0.0], [0.5, 0.2], [0.3, 0.9]],  # lowest two (per_sample_heads=2): L2H1, L3H0
            [[0.0, 0.0], [0.0, 0.0], [0.5, 0.2], [0.1, 0.9]],  # L3H0, L2H1
            [[0.0, 0.0], [0.0, 0.0], [0.1, math.inf], [0.4, 0.9]],  # L3H0, L3H1 (L2H0 fails tau, L2H1 is inf)
        ]
    )
    result = select_localization_heads(sums, entropies, num_heads=2, per_sample_heads=2)
    assert result["tau"] == pytest.approx(0.2)
    assert result["frequency"].tolist() == [[0, 0], [0, 0], [0, 2], [3, 1]]
    assert result["selected"] == [(3, 0), (2, 1)]
    assert result["mean_entropy"][2, 1] == pytest.approx(0.2)  # the infinite entropy is left out of the mean


# ----------------------------------------------------------------------------------------------------------------
# A tiny LLaVA: the rows against eager attention, a planted head
# ----------------------------------------------------------------------------------------------------------------


def noise_image(seed: int) -> Image.Image:
    pixels = torch.randint(0, 256, (64, 64, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


GOLD = [32.0, 32.0, 64.0, 64.0]  # the bottom-right quarter of a 64 x 64 image: rows 4-7, columns 4-7 of the 8 x 8 grid
GOLD_CELLS = [row * 8 + column for row in range(4, 8) for column in range(4, 8)]
EXAMPLES = [{"image": noise_image(seed), "expression": text, "boxes": [GOLD]}
            for seed, text in enumerate(["the red box", "a box on the right", "the box", "box at the bottom"])]  # fmt: skip


@pytest.fixture(scope="module")
def llava():
    return tiny_patch_model("llava", image_size=128, num_layers=4, seed=0)


@pytest.mark.parametrize("family", ["llava", "paligemma"])
def test_rows_are_the_last_expression_tokens_eager_attention(family):
    from hf_vlalign.vlms import PatchGroundingCollator, eager_attention
    from hf_vlalign.vlms.families import model_inputs

    model, processor = tiny_patch_model(family, num_layers=3, seed=0)
    rows = [row for row, _ in image_attention_rows(model, processor, EXAMPLES[:2], batch_size=2)]
    collator = PatchGroundingCollator(processor, model.config, with_labels=False, return_details=True)
    batch = collator([{"image": e["image"], "caption": e["expression"]} for e in EXAMPLES[:2]])
    with eager_attention(model), torch.no_grad():
        attentions = model(**model_inputs(batch), output_attentions=True).attentions
    for i, details in enumerate(batch["details"]):
        last = details["caption_end"] - 1
        expected = torch.stack([layer[i, :, last, batch["image_positions"][i]] for layer in attentions])
        assert torch.allclose(rows[i], expected, atol=1e-6)


@pytest.fixture
def planted_head(llava):
    """Layer 2, head 1 of the tiny LLaVA attends from every text token after the image only to the gold cells' image
    tokens: the modeling file's eager attention, registered through the `AttentionInterface` under "eager" for the
    test, with that head's rows replaced and its output recomputed from them."""
    from hf_vlalign.vlms import PatchGroundingCollator

    model, processor = llava
    layer, head = 2, 1
    positions = PatchGroundingCollator(processor, model.config)([{"image": EXAMPLES[0]["image"], "caption": "x"}])["image_positions"][0]
    gold, first_text = positions[GOLD_CELLS], int(positions[-1]) + 1

    def planted(module, query, key, value, attention_mask, **kwargs):
        output, weights = modeling_llama.eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
        if module.layer_idx == layer:
            weights = weights.clone()
            weights[:, head, first_text:] = 0.0
            weights[:, head, first_text:, gold] = 1 / len(GOLD_CELLS)
            output = (weights @ value).transpose(1, 2).contiguous()  # as many key / value heads as query heads
        return output, weights

    interface = modeling_llama.ALL_ATTENTION_FUNCTIONS
    interface["eager"] = planted
    try:
        yield layer, head
    finally:
        del interface["eager"]


def test_a_planted_localization_head_is_selected_and_grounds_the_box(llava, planted_head):
    model, processor = llava
    selection = find_localization_heads(model, processor, EXAMPLES, "tiny llava", batch_size=2)
    assert selection.selected[0] == planted_head
    assert float(selection.mean_attention_sum[planted_head]) == pytest.approx(1.0)
    assert int(selection.frequency[planted_head]) == len(EXAMPLES)
    scores = localization_head_grounding(model, processor, EXAMPLES, selection, batch_size=2)
    # smoothed (sigma: one cell), the quarter's map stays above the mean one cell beyond its inner edges: rows and
    # columns 3-7 of the 8 x 8 grid over the 64-pixel image, IoU 32 x 32 / (40 x 40) = 0.64
    assert all(box == [24.0, 24.0, 64.0, 64.0] for box in scores["predicted_boxes"])
    assert scores["accuracy"] == 1.0 and scores["num_examples"] == 4
    # the centred box of the gold's relative size (0.5 x 0.5) meets the corner at IoU 0.14, the whole image at 0.25
    assert scores["centre_box_accuracy"] == 0.0 and scores["whole_image_accuracy"] == 0.0
    # the quarter as two gold boxes (its halves): their union is hit; any one half alone has IoU 16 x 32 / 1600 = 0.32
    halves = [{**example, "boxes": [[32.0, 32.0, 48.0, 64.0], [48.0, 32.0, 64.0, 64.0]]} for example in EXAMPLES]
    assert localization_head_grounding(model, processor, halves, selection, batch_size=4)["accuracy"] == 1.0
    any_box = localization_head_grounding(model, processor, halves, selection, merge_gold_boxes=False, batch_size=4)
    assert any_box["accuracy"] == 0.0 and any_box["gold_boxes"] == "any"
    # the procedure's ceiling: a map on the gold quarter's own cells widens to the same box (IoU 0.64)
    assert scores["gold_map_accuracy"] == 1.0 and scores["smoothing_sigma"] == 1.0
    # a third of a cell (the paper's share of the image on a grid a third as fine): the box is the quarter itself
    sharp = localization_head_grounding(model, processor, EXAMPLES, selection, batch_size=4, smoothing_sigma=1 / 3)
    assert all(box == [32.0, 32.0, 64.0, 64.0] for box in sharp["predicted_boxes"]) and sharp["accuracy"] == 1.0
    with pytest.raises(ValueError, match=r"`smoothing_sigma` \(the smoothing Gaussian's sigma, in grid cells\) must be a number > 0, got 0"):
        localization_head_grounding(model, processor, EXAMPLES, selection, smoothing_sigma=0)


@pytest.mark.usefixtures("synthetic_scene_cache")
def test_flickr30k_entities_phrases_are_expressions_with_their_boxes():
    from hf_vlalign.synthetic import SyntheticSceneConfig
    from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
    from hf_vlalign.vlms import grounded_caption_examples

    scenes = load_or_generate_synthetic_vgp(config=SyntheticSceneConfig(num_train_images=2, num_val_images=2))
    captions, counts = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "val")
    examples = flickr30k_phrase_examples(scenes.flickr30k_entities, scenes.images, "val")
    assert len(examples) == counts["phrases"] > 0
    phrase = captions[0]["phrases"][0]
    assert examples[0] == {
        "image_path": captions[0]["image_path"],
        "expression": captions[0]["caption"][phrase["char_start"] : phrase["char_end"]],
        "boxes": phrase["boxes"],
    }


def test_the_selection_round_trips_and_is_refused_for_another_model(llava, tmp_path):
    model, processor = llava
    selection = find_localization_heads(model, processor, EXAMPLES[:2], "tiny llava", num_heads=2, batch_size=2)
    path = tmp_path / "heads.json"
    selection.save(path)
    again = HeadSelection.load(path, model)
    assert again.to_dict() == selection.to_dict() and again.selected == selection.selected
    written = json.loads(path.read_text())
    assert len(written["heads"]) == 16 and sum(head["selected"] for head in written["heads"]) == 2
    other, _ = tiny_patch_model("llava", num_layers=3, seed=0)
    with pytest.raises(ValueError, match=r"holds the localization heads of tiny llava \(llava, 4 layers x 4 heads.*not of "
                       r"small \(llava, 3 layers x 4 heads"):  # fmt: skip
        HeadSelection.load(path, other, "small")


# ----------------------------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cli_selects_scores_and_reuses_the_selection(tmp_path, capsys):
    (tmp_path / "photos").mkdir()
    for name in ("chelsea.png", "coffee.png"):
        shutil.copy(PHOTOS / name, tmp_path / "photos" / name)
    rows = [
        {"image": "photos/chelsea.png", "expression": "the cat", "box": [0, 0, 451, 300]},
        {"image": "photos/chelsea.png", "expression": "the cat's face", "box": [100, 20, 300, 200]},
        {"image": "photos/coffee.png", "expression": "the cup", "box": [100, 40, 500, 350]},
        {"image": "photos/coffee.png", "expression": "the saucer", "box": [50, 200, 550, 400]},
        {"image": "photos/coffee.png", "expression": "the coffee", "box": [150, 60, 450, 250]},
    ]
    data_file = tmp_path / "refcoco.jsonl"
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model, processor = tiny_patch_model(
        "llava", num_layers=4, tokenizer=word_level_tokenizer(row["expression"] for row in rows)
    )
    folder = tmp_path / "llava"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    out, selection_file = tmp_path / "out", tmp_path / "heads.json"
    argv = ["localization-heads", str(folder), "--data_file", str(data_file), "--selection_samples", "3",
            "--selection_file", str(selection_file), "--batch_size", "2"]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    scores = json.loads((out / "grounding_scores.json").read_text())
    assert printed["num_examples"] == scores["num_examples"] == 2 and not scores["selection_reused"]
    assert set(scores) >= {"accuracy", "centre_box_accuracy", "whole_image_accuracy", "predicted_boxes"}
    assert json.loads((out / "localization_heads.json").read_text()) == json.loads(selection_file.read_text())
    assert (out / "localization_heads.png").stat().st_size > 10_000
    # a second run reuses the saved heads and scores every example
    assert main([*argv, "--out", str(tmp_path / "again")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["selection_reused"] and again["num_examples"] == 5 and again["selected_heads"] == scores["selected_heads"]
    # heads selected on another file's expressions (the paper: RefCOCO train), every example of the data scored
    other = ["localization-heads", str(folder), "--data_file", str(data_file), "--selection_samples", "3"]
    assert main([*other, "--selection_data_file", str(data_file), "--out", str(tmp_path / "other")]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert not chosen["selection_reused"] and chosen["selection_samples"] == 3 and chosen["num_examples"] == 5
    with pytest.raises(SystemExit):  # and not beside a selection to reuse
        main([*argv, "--selection_data_file", str(data_file), "--out", str(tmp_path / "y")])
    assert "`--selection_data_file` " in capsys.readouterr().err
    # too many selection samples: one line naming the option
    with pytest.raises(SystemExit):
        main(["localization-heads", str(folder), "--data_file", str(data_file), "--out", str(tmp_path / "x")])
    assert "`--selection_samples` 1000 leaves none of the data's 5 examples to score" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a smoothing of no width, before the model loads
        main([*other, "--smoothing_sigma", "0", "--out", str(tmp_path / "z")])
    assert "`--smoothing_sigma` (the smoothing Gaussian's sigma, in grid cells) must be a number > 0, got 0.0" in capsys.readouterr().err
