"""Image tokens as boxes for every multi-view family (`hf_vlalign.vlms.image_token_geometry`), on the tiny models saved
by `tiny_family_folders` and reloaded with both image-processor backends (torchvision, the Auto default here, and Pil):

- the image tokens of each image against the processor's own numbers (`_get_num_multimodal_tokens`, `image_grid_thw`,
  tile / crop counts, row-break and tile-position tokens) and against `model.get_image_features`;
- a white rectangle planted in a black image: the tokens whose boxes lie inside it read white pixels of the processed
  views, those whose boxes lie outside it black ones;
- planted attention: a head that attends to the tokens inside the rectangle is scored right by the probe, one that
  attends to the opposite corner wrong;
- `probe_patch_model` and one direct / semi-direct supervised step on 4 synthetic-scene captions.
"""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor
from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava_next.modeling_llava_next import unpad_image

from hf_vlalign.vlms import (
    AttentionRecorder,
    PatchGroundingCollator,
    forward_with_layout,
    patch_attention_loss,
    patch_model_family,
    probe_patch_model,
)
from hf_vlalign.vlms.explore import patch_explorer_examples
from hf_vlalign.vlms.image_token_geometry import (
    image_placeholder,
    image_token_map,
    processor_call_kwargs,
    single_grid_token_map,
)
from hf_vlalign.vlms.tiny import MULTIVIEW_FAMILIES, tiny_patch_model, word_level_tokenizer

# (width, height): a landscape and a portrait image, different tiles, crops and resolutions in every family
SIZES = ((96, 48), (40, 112))
# the planted white rectangle of each size, in original pixels
RECTANGLES = {(96, 48): (0, 0, 64, 32), (40, 112): (0, 0, 28, 84)}
BACKENDS = ("torchvision", "pil")


@pytest.fixture(scope="module")
def families(tiny_family_folders):
    """model_type -> (model, {backend: processor}) reloaded from the saved folders."""
    torch.set_num_threads(1)
    loaded = {}
    for model_type, folder in tiny_family_folders.items():
        model = AutoModelForImageTextToText.from_pretrained(folder).eval()
        pil = AutoProcessor.from_pretrained(folder, image_processor=AutoImageProcessor.from_pretrained(folder, backend="pil"))
        loaded[model_type] = model, {"torchvision": AutoProcessor.from_pretrained(folder), "pil": pil}
    return loaded


def planted_image(size):
    width, height = size
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    x0, y0, x1, y1 = RECTANGLES[size]
    pixels[y0:y1, x0:x1] = 255
    return Image.fromarray(pixels)


def processed(model_type, processor, image):
    text = f"{image_placeholder(model_type)} a dog"
    call_kwargs = processor_call_kwargs(model_type, processor.image_processor)
    return processor(images=[[image]], text=[text], return_tensors="pt", **call_kwargs)


def token_map_of(model_type, model, processor, image):
    inputs = processed(model_type, processor, image)
    count = int((inputs["input_ids"][0] == model.config.image_token_id).sum())
    return inputs, image_token_map(processor, model.config, image.size, inputs, 0, count)


def token_ids(processor, *tokens):
    return [processor.tokenizer.convert_tokens_to_ids(token) for token in tokens]


def _num_features(image_features) -> int:
    features = getattr(image_features, "pooler_output", image_features)
    if isinstance(features, torch.Tensor):
        return features.shape[:-1].numel()
    return sum(feature.shape[:-1].numel() for feature in features)


def check_family_layout(model_type, model, processor, inputs, token_map):
    """What each processor says of the views: its grid, its tiles or crops, its row-break and position tokens."""
    ids = inputs["input_ids"][0]
    positions = (ids == model.config.image_token_id).nonzero()[:, 0]
    views = token_map.views
    if model_type.startswith("qwen"):
        merge = model.config.vision_config.spatial_merge_size
        assert len(views) == 1 and views[0].grid == tuple((inputs["image_grid_thw"][0, 1:] // merge).tolist())
        start, end = token_ids(processor, "<|vision_start|>", "<|vision_end|>")
        assert ids[positions[0] - 1] == start and ids[positions[-1] + 1] == end
        assert (positions.diff() == 1).all()
    elif model_type in ("llava_next", "llava_onevision"):
        assert [view.name for view in views] == ["base", "tiles"]
        rows, columns = views[1].grid
        newlines = torch.isnan(token_map.token_boxes()[:, 0]).nonzero()[:, 0]
        base = views[0].grid[0] * views[0].grid[1]
        assert newlines.tolist() == [base + (row + 1) * (columns + 1) - 1 for row in range(rows)]
        height, width = inputs["image_sizes"][0].tolist()
        canvas = select_best_resolution((height, width), model.config.image_grid_pinpoints)
        tile = model.config.vision_config.image_size
        assert inputs["pixel_values"].shape[1] == 1 + (canvas[0] // tile) * (canvas[1] // tile)
    elif model_type in ("idefics3", "smolvlm"):
        tiles = [token for token in processor.tokenizer.convert_ids_to_tokens(ids) if token.startswith("<row_")]
        assert [view.name for view in views] == ["tile"] * len(tiles) + ["global"]
        assert int(inputs["pixel_attention_mask"][0].flatten(1).any(1).sum()) == len(views)
        (global_image,) = token_ids(processor, "<global-img>")
        assert ids[positions[views[-1].token_index[0]] - 1] == global_image
    elif model_type == "gemma3":
        (boi,) = token_ids(processor, "<start_of_image>")
        assert int((ids == boi).sum()) == len(views) == inputs["pixel_values"].shape[0]
        assert [view.name for view in views] == ["image"] + ["crop"] * (len(views) - 1)
    elif model_type == "internvl":
        assert len(views) == inputs["pixel_values"].shape[0]
        assert views[-1].name == ("thumbnail" if len(views) > 1 else "image")
    elif model_type == "mistral3":
        (view,) = views
        breaks = (ids == token_ids(processor, "[IMG_BREAK]")[0]) | (ids == token_ids(processor, "[IMG_END]")[0])
        row_ends = breaks.nonzero()[:, 0]
        assert view.grid[0] == len(row_ends)
        assert view.grid[1] == int(((positions > row_ends[0] - view.grid[1] - 1) & (positions < row_ends[0])).sum())


def processor_image_token_count(model_type, config, processor, inputs, size, token_map) -> int:
    """The image tokens the processor's own numbers give: `_get_num_multimodal_tokens` counts what each image
    expands to, markers included (InternVL's <img> </img>, Pixtral's row breaks); Idefics3 gives its views
    (`num_image_patches`), SmolVLM has no such helper (its views are those of `pixel_attention_mask`), Gemma 3's
    ignores pan-and-scan (its views are `pixel_values`' images)."""
    if model_type == "smolvlm":
        return int(inputs["pixel_attention_mask"][0].flatten(1).any(1).sum()) * processor.image_seq_len
    if model_type == "gemma3":
        return inputs["pixel_values"].shape[0] * config.mm_tokens_per_image
    numbers = processor._get_num_multimodal_tokens(image_sizes=[size[::-1]])
    if model_type == "idefics3":
        return numbers.num_image_patches[0] * processor.image_seq_len
    if model_type == "internvl":
        assert numbers.num_image_patches[0] == len(token_map.views)
        return numbers.num_image_tokens[0] - 2
    if model_type == "mistral3":
        return numbers.num_image_tokens[0] - token_map.views[0].grid[0]
    return numbers.num_image_tokens[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_image_tokens_match_the_processor_and_the_model(families, model_type, backend):
    model, processors = families[model_type]
    processor = processors[backend]
    layouts = []
    for size in SIZES:
        inputs, token_map = token_map_of(model_type, model, processor, planted_image(size))
        expected = processor_image_token_count(model_type, model.config, processor, inputs, size, token_map)
        image_inputs = {key: value for key, value in inputs.items() if "input_ids" not in key and "token_type" not in key}
        image_inputs.pop("attention_mask")
        with torch.no_grad():
            features = _num_features(model.get_image_features(**image_inputs))
        assert token_map.num_tokens == int((inputs["input_ids"] == model.config.image_token_id).sum())
        assert token_map.num_tokens == expected == features
        # every token is in exactly one view, or (LLaVA-NeXT's newlines) in none; boxes lie in the image
        index = torch.cat([view.token_index for view in token_map.views])
        assert len(set(index.tolist())) == len(index) and int(index.max()) < token_map.num_tokens
        boxes = token_map.token_boxes()
        real = ~torch.isnan(boxes[:, 0])
        assert int(real.sum()) == len(index)
        assert (boxes[real, 2] > boxes[real, 0]).all() and (boxes[real, 3] > boxes[real, 1]).all()
        check_family_layout(model_type, model, processor, inputs, token_map)
        width, height = size
        layouts.append([(view.grid, round(view.box[2] / width, 3), round(view.box[3] / height, 3)) for view in token_map.views])
    assert layouts[0] != layouts[1]  # the two aspect ratios get their own views (tiles, crops) or grids


def token_pixels(model_type, config, inputs, token_map, token: int) -> torch.Tensor | None:
    """The processed pixels token `token` is made of (None for a token in no view), read from `pixel_values` with
    the model's own merge order (2 x 2 blocks raster, pooled blocks, the unpadded tile grid)."""
    pixel_values, patch = inputs["pixel_values"], config.vision_config.patch_size
    views = token_map.token_views()
    view = int(views[token])
    if view < 0:
        return None
    local = int((token_map.views[view].token_index == token).nonzero())
    rows, columns = token_map.views[view].grid
    row, column = divmod(local, columns)
    if model_type.startswith("qwen"):
        return pixel_values[4 * token : 4 * token + 4]  # each merged token is 4 consecutive patches
    if model_type == "mistral3":
        side = patch * config.spatial_merge_size
        return pixel_values[0, :, row * side : (row + 1) * side, column * side : (column + 1) * side]
    if model_type in ("llava_next", "llava_onevision"):
        if view == 0:
            return pixel_values[0, 0, :, row * patch : (row + 1) * patch, column * patch : (column + 1) * patch]
        height, width = inputs["image_sizes"][0].tolist()
        canvas_height, canvas_width = select_best_resolution((height, width), config.image_grid_pinpoints)
        cells = torch.stack(
            torch.meshgrid(torch.arange(canvas_height // patch), torch.arange(canvas_width // patch), indexing="ij")
        )
        kept = unpad_image(cells, (height, width))
        assert kept.shape[1:] == (rows, columns)  # no OneVision downsampling at these sizes
        canvas_row, canvas_column = int(kept[0, row, column]), int(kept[1, row, column])
        side = config.vision_config.image_size // patch
        tile = 1 + (canvas_row // side) * (canvas_width // config.vision_config.image_size) + canvas_column // side
        row, column = canvas_row % side, canvas_column % side
        return pixel_values[0, tile, :, row * patch : (row + 1) * patch, column * patch : (column + 1) * patch]
    images = pixel_values[0] if model_type in ("idefics3", "smolvlm") else pixel_values
    side = images.shape[-1] // columns
    return images[view, :, row * side : (row + 1) * side, column * side : (column + 1) * side]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_token_boxes_read_the_pixels_of_a_planted_rectangle(families, model_type, backend):
    model, processors = families[model_type]
    for size in SIZES:
        inputs, token_map = token_map_of(model_type, model, processors[backend], planted_image(size))
        coverage = token_map.coverage(torch.tensor([RECTANGLES[size]], dtype=torch.float32))
        # the share of a token's processed pixels that are white is the share of its box inside the rectangle (up to
        # the resize's blur at the rectangle's edges)
        for token in range(token_map.num_tokens):
            pixels = token_pixels(model_type, model.config, inputs, token_map, token)
            if pixels is None:
                continue
            white = float((pixels > 0).float().mean())  # normalised: white > 0 > black for every family's mean
            assert white == pytest.approx(float(coverage[token]), abs=0.15), (size, token)
        assert (coverage == 0).any() and (coverage > 0.5).any()
        # every view sees part of the rectangle
        views = token_map.token_views()
        assert {int(views[token]) for token in (coverage > 0).nonzero()[:, 0]} == set(range(len(token_map.views)))


@pytest.fixture(scope="module")
def built(synthetic_captions):
    """model_type -> (model, collator) of tiny models built with their Pil image processors."""
    train, evaluation = synthetic_captions
    tokenizer = word_level_tokenizer(example["caption"] for example in [*train, *evaluation, {"caption": "a dog"}])
    result = {}
    for model_type in MULTIVIEW_FAMILIES:
        model, processor = tiny_patch_model(model_type, tokenizer=tokenizer, seed=3)
        result[model_type] = model.eval(), PatchGroundingCollator(processor, model.config, return_details=True)
    return result


@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_the_probe_scores_a_head_on_the_planted_rectangle_right(built, model_type):
    model, collator = built[model_type]
    examples = [
        {"image": planted_image(size), "caption": "a dog", "phrases": [{"char_start": 2, "char_end": 5, "boxes": [RECTANGLES[size]]}]}
        for size in SIZES
    ]
    batch = collator(examples)
    layout_boxes = batch["image_cell_boxes"]

    def plant(module, args, output):
        # layer 1: head 2 attends from "dog" uniformly to the tokens the geometry puts inside the rectangle, head 3
        # to the real token farthest from the rectangle's centre (the opposite corner)
        attention = output[1].clone()
        for b, size in enumerate(SIZES):
            token = int(batch["phrase_token_index"][b, 0])
            covered = batch["phrase_cell_coverage"][b, 0] >= collator.coverage_threshold
            width, height = size
            x0, y0, x1, y1 = RECTANGLES[size]
            centre = torch.tensor([(x0 + x1) / 2 / width, (y0 + y1) / 2 / height])
            distance = ((layout_boxes[b, :, :2] + layout_boxes[b, :, 2:]) / 2 - centre).norm(dim=-1)
            far = int(torch.nan_to_num(distance, nan=-1.0).argmax())
            for head, cells in ((2, covered.nonzero()[:, 0]), (3, torch.tensor([far]))):
                attention[b, head, token] = 0.0
                attention[b, head, token, batch["image_positions"][b, cells]] = 0.9 / len(cells)
                attention[b, head, token, token] = 0.1
        return (output[0], attention, *output[2:])

    handle = patch_model_family(model).attention_modules(model)[1].register_forward_hook(plant)
    try:
        result = probe_patch_model(model, [batch])
    finally:
        handle.remove()
    assert result.num_phrases == 2
    assert result.accuracy[1, 2] == 1.0 and result.accuracy[1, 3] == 0.0
    assert result.active_share[1, 2] == pytest.approx(0.9)


@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_probe_and_one_supervised_step_on_synthetic_captions(built, synthetic_captions, model_type):
    model, collator = built[model_type]
    train, _ = synthetic_captions
    batch = collator(train[:4])
    result = probe_patch_model(model, [batch])
    assert result.num_phrases == int((batch["phrase_token_index"] >= 0).sum()) > 0
    assert result.accuracy.shape == (2, 4) and 0.0 <= result.baseline_accuracy <= 1.0
    # the target of a grounded token is uniform over the covered tokens of all views
    targets = batch["word_cell_alignment"][batch["word_cell_alignment"].sum(-1) > 0]
    assert torch.allclose(targets.sum(-1), torch.ones(len(targets)))
    assert not (targets[:, ~batch["patch_mask"].any(0)] > 0).any()
    family = patch_model_family(model)
    for method in ("direct", "semi_direct"):
        model.zero_grad(set_to_none=True)
        with AttentionRecorder(model, layers=[0, 1]) as recorder:
            _, layout = forward_with_layout(model, batch)
        loss = patch_attention_loss(recorder, batch, layout, method=method, layers=[1])
        assert torch.isfinite(loss) and loss > 0
        loss.backward()
        attention = family.attention_modules(model)[1]
        for projection in (attention.q_proj, attention.k_proj):
            assert projection.weight.grad is not None and float(projection.weight.grad.abs().sum()) > 0
    model.zero_grad(set_to_none=True)


def box_share(cells: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
    """(C, 4) boxes, (4,) box -> (C,) share of each cell inside the box (0 for a cell of no area or NaN)."""
    width = (torch.minimum(cells[:, 2], box[2]) - torch.maximum(cells[:, 0], box[0])).clamp(min=0)
    height = (torch.minimum(cells[:, 3], box[3]) - torch.maximum(cells[:, 1], box[1])).clamp(min=0)
    area = (cells[:, 2] - cells[:, 0]) * (cells[:, 3] - cells[:, 1])
    return torch.nan_to_num(width * height / area, nan=0.0)


@pytest.mark.parametrize("family", ["vilt", "llava", "paligemma"])
def test_one_grid_families_carry_one_view_whose_boxes_give_the_cell_coverage(family):
    """The one-grid families' batches carry each cell's box in the original image (CLIP: the centre crop's rectangle,
    SigLIP: the squashed image, ViLT: the resized image inside its padding), and the share of those boxes inside a
    gold box is the collator's cell coverage, as it was computed before boxes."""
    model, processor = tiny_patch_model(family, tokenizer=word_level_tokenizer(["a dog on a box"]))
    collator = PatchGroundingCollator(processor, model.config)
    sizes, gold = ((96, 64), (64, 80)), ((8, 4, 60, 40), (10, 30, 50, 76))
    examples = [
        {"image": noise_image(size), "caption": "a dog on a box", "phrases": [{"char_start": 2, "char_end": 5, "boxes": [box]}]}
        for size, box in zip(sizes, gold)
    ]
    batch = collator(examples)
    for index, (size, box) in enumerate(zip(sizes, gold)):
        scale = torch.tensor([*size, *size], dtype=torch.float32)
        shares = box_share(batch["image_cell_boxes"][index], torch.tensor(box) / scale)
        torch.testing.assert_close(shares, batch["phrase_cell_coverage"][index, 0], atol=1e-5, rtol=0)
    if family == "llava":  # CLIP crops the 96 x 64 image's central 64 x 64: x from 16 to 80
        torch.testing.assert_close(batch["image_cell_boxes"][0, 0], torch.tensor([16 / 96, 0.0, 32 / 96, 16 / 64]))
    model.eval()
    _, layout = forward_with_layout(model, batch)
    real = layout.patch_mask
    expected = batch["image_cell_boxes"].gather(1, layout.cell_index.clamp(min=0)[..., None].expand(-1, -1, 4))
    torch.testing.assert_close(layout.token_boxes[real], expected[real])


def noise_image(size):
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def test_single_grid_token_map_counts_a_leading_cls_token():
    model, processor = tiny_patch_model("llava", tokenizer=word_level_tokenizer(["a dog"]))
    token_map = single_grid_token_map(processor.image_processor, (96, 64), (64, 64), (4, 4), first=1)
    (view,) = token_map.views
    assert view.box == (16.0, 0.0, 80.0, 64.0) and token_map.num_tokens == 17
    assert torch.isnan(token_map.token_boxes()[0]).all() and not torch.isnan(token_map.token_boxes()[1:]).any()


def test_cross_attention_models_are_refused_by_name():
    from transformers import MllamaConfig

    with pytest.raises(ValueError, match="'mllama' is not supported \\(cross-attention.*'qwen2_vl'"):
        patch_model_family(MllamaConfig())


@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_the_explorer_draws_every_token_box_over_the_original_image(built, model_type):
    model, collator = built[model_type]
    examples = [
        {"image": planted_image(size), "caption": "a dog", "phrases": [{"char_start": 2, "char_end": 5, "boxes": [RECTANGLES[size]]}]}
        for size in SIZES
    ]
    batch = collator(examples)
    for example, shown, real in zip(examples, patch_explorer_examples(model, collator, examples), batch["patch_mask"]):
        assert shown.image.size == example["image"].size
        assert shown.region_boxes.shape == (int(real.sum()), 4)
        width, height = example["image"].size
        x0, y0, x1, y1 = RECTANGLES[example["image"].size]
        assert shown.gold[0].boxes[0] == pytest.approx([x0 / width, y0 / height, x1 / width, y1 / height])
        words = shown.attention["word_to_region"]
        assert words.shape[-1] == int(real.sum()) and torch.isfinite(torch.as_tensor(words)).all()


def test_llava_onevision_downsampled_tile_grid_matches_the_model():
    """Past 9 tiles' worth of features ("anyres_max_9") OneVision downsamples the unpadded grid: the tiles view is the
    smaller grid over the same rectangle, one newline per row of it."""
    model, processor = tiny_patch_model("llava_onevision", tokenizer=word_level_tokenizer(["a dog"]))
    pinpoints = [[64, 128], [128, 64], [128, 128], [256, 256], [256, 192]]
    model.config.image_grid_pinpoints = processor.image_processor.image_grid_pinpoints = pinpoints
    for size, grid in (((256, 256), (12, 12)), ((250, 180), (10, 13))):
        inputs, token_map = token_map_of("llava_onevision", model, processor, noise_image(size))
        with torch.no_grad():
            features = model.get_image_features(pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"])
        assert token_map.num_tokens == _num_features(features) == 16 + grid[0] * (grid[1] + 1)
        assert token_map.views[1].grid == grid
        assert int(torch.isnan(token_map.token_boxes()[:, 0]).sum()) == grid[0]


@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_the_cli_probes_a_saved_folder_as_python_does(tiny_family_folders, synthetic_captions, tmp_path, model_type):
    """`hf-vlalign probe` (in process) on the saved folder: the Python probe's phrases and accuracies, through the
    processor `AutoProcessor` loads (torchvision image processor where installed)."""
    import json

    from hf_vlalign.cli import main
    from hf_vlalign.vlms.loading import load_patch_model

    out = tmp_path / "probe.json"
    scenes = ["--synthetic_train_images", "12", "--synthetic_eval_images", "6"]
    assert main(["probe", str(tiny_family_folders[model_type]), *scenes, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    model, processor = load_patch_model(str(tiny_family_folders[model_type]))
    _, evaluation = synthetic_captions
    collator = PatchGroundingCollator(processor, model.config, with_labels=False)
    expected = probe_patch_model(model, [collator(evaluation[i : i + 32]) for i in range(0, len(evaluation), 32)])
    assert result["num_phrases"] == expected.num_phrases > 0
    assert result["baseline_accuracy"] == pytest.approx(expected.baseline_accuracy)
    torch.testing.assert_close(torch.tensor(result["accuracy"], dtype=torch.float64), torch.from_numpy(expected.accuracy))
