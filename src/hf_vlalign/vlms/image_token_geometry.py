"""Where every image token of a transformers vision-language model lies in the original image: per family, the views of
one image (`views.ImageTokenMap`) composed from its processor's geometry and its model's merging or pooling.

Measured geometry of transformers 5.24 per family: docs/vlms.md ("What works for each family"). A family adds its own
views here; each reads what the processor returned (`image_grid_thw`, `image_sizes`, the image tokens of the example)
and, where the processor does not return what the views need (InternVL's tiles, Idefics3's rows and columns, Gemma 3's
pan-and-scan crops, LLaVA-NeXT's best resolution and unpadding), re-derives it with the image processor's or the
model's own functions, never a copy of them:

- qwen2_vl / qwen2_5_vl / qwen3_vl: one view, the whole image squashed to `image_grid_thw` patches, 2 x 2 merged.
- mistral3: one view, the whole image squashed to `image_sizes`, 2 x 2 merged (row breaks are no image tokens).
- llava_next / llava_onevision: the base view (the whole image squashed), then the tiles' grid after the model's
  unpadding (and OneVision's downsampling), one newline token (no box) after each of its rows.
- idefics3 / smolvlm: the tiles of the resized image (row-major), then the global view (the whole image).
- gemma3: the whole image, then the pan-and-scan crops.
- internvl: the tiles of the squashed image (row-major), then the thumbnail (the whole image) when there is more than
  one tile.
- llava, paligemma, vilt: one view, the processed image's rectangle in original pixels (CLIP's centre crop, SigLIP's
  squash, ViLT's resize before its padding).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..alignment.patches import ImageGeometry
from .views import ImageTokenMap, TokenView

__all__ = [
    "MULTIVIEW_MODEL_TYPES",
    "REFUSED_MODEL_TYPES",
    "image_placeholder",
    "image_token_map",
    "processor_call_kwargs",
]

# what a text says where one image goes, without a chat template (the processor expands it to the image's tokens)
_PLACEHOLDERS = {
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "llava_next": "<image>",
    "llava_onevision": "<image>",
    "idefics3": "<image>",
    "smolvlm": "<image>",
    "gemma3": "<start_of_image>",
    "internvl": "<IMG_CONTEXT>",
    "mistral3": "[IMG]",
}
MULTIVIEW_MODEL_TYPES = tuple(_PLACEHOLDERS)
# decoder-style over image tokens they are not: their image tokens are not in the sequence a word attends over
REFUSED_MODEL_TYPES = {
    "mllama": "cross-attention: Mllama's image features enter the language model through cross-attention layers "
    "(`cross_attention_states`), not as tokens of its sequence",
}


def image_placeholder(model_type: str) -> str:
    """The text standing for one image in a `model_type` prompt without a chat template."""
    return _PLACEHOLDERS[model_type]


def processor_call_kwargs(model_type: str, image_processor) -> dict:
    """Keyword arguments of the processor's call that keep the image processor's own settings: Gemma 3's processor
    turns pan-and-scan off at call time whatever its image processor says (`Gemma3Processor` images defaults)."""
    if model_type != "gemma3":
        return {}
    keys = (
        "do_pan_and_scan",
        "pan_and_scan_min_crop_size",
        "pan_and_scan_max_num_crops",
        "pan_and_scan_min_ratio_to_activate",
    )
    return {key: getattr(image_processor, key) for key in keys if getattr(image_processor, key, None) is not None}


def _grid_view(name: str, grid: tuple[int, int], box, first: int, row_stride: int | None = None) -> TokenView:
    """A view whose cell (r, c) is the image's token `first + r * row_stride + c` (`row_stride` default: columns)."""
    rows, columns = grid
    stride = columns if row_stride is None else row_stride
    row, column = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    index = (first + row * stride + column).flatten()
    return TokenView(name, (int(rows), int(columns)), tuple(float(value) for value in box), index)


def _whole(size: tuple[int, int]) -> tuple[float, float, float, float]:
    return (0.0, 0.0, float(size[0]), float(size[1]))


def _tiles_then_whole(size, rows: int, columns: int, side: int, whole_name: str) -> list[TokenView]:
    """`rows` x `columns` tiles of the image (row-major, each `side` x `side` tokens over an equal part of the image:
    the tiles cut a resize of the whole image), then the whole image as one more view."""
    width, height = size
    views = []
    for row in range(rows):
        for column in range(columns):
            x0, y0 = column * width / columns, row * height / rows
            box = (x0, y0, (column + 1) * width / columns, (row + 1) * height / rows)
            views.append(_grid_view("tile", (side, side), box, len(views) * side * side))
    return [*views, _grid_view(whole_name, (side, side), _whole(size), len(views) * side * side)]


def _qwen(processor, config, size, inputs, index, num_tokens):
    _, height, width = (int(value) for value in inputs["image_grid_thw"][index])
    merge = config.vision_config.spatial_merge_size
    return [_grid_view("image", (height // merge, width // merge), _whole(size), 0)]


def _mistral3(processor, config, size, inputs, index, num_tokens):
    height, width = (int(value) for value in inputs["image_sizes"][index])  # the resized image, not the original
    side = config.vision_config.patch_size * config.spatial_merge_size
    return [_grid_view("image", (height // side, width // side), _whole(size), 0)]


def _llava_next(processor, config, size, inputs, index, num_tokens):
    """The base view, then the tiles' grid: the image resized (aspect kept) into the best pinpoint canvas and padded
    centred, cut by the model's `unpad_image` to the image's rows or columns (OneVision: then downsampled), a newline
    token after each row."""
    from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
    from transformers.image_utils import ChannelDimension
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    width, height = size
    tile, patch = config.vision_config.image_size, config.vision_config.patch_size
    side = tile // patch
    views = [_grid_view("base", (side, side), _whole(size), 0)]
    canvas_height, canvas_width = select_best_resolution((height, width), config.image_grid_pinpoints)
    # the canvas' patch grid, each cell holding its own (row, column), unpadded as the model unpads its features
    cells = torch.stack(
        torch.meshgrid(torch.arange(canvas_height // patch), torch.arange(canvas_width // patch), indexing="ij")
    )
    kept = unpad_image(cells, (height, width))
    first_row, first_column = int(kept[0, 0, 0]), int(kept[1, 0, 0])
    last_row, last_column = int(kept[0, -1, 0]) + 1, int(kept[1, 0, -1]) + 1
    # OneVision downsamples the unpadded grid ("anyres_max_9"): the processor's count gives its rows and columns
    unpadded, rows = processor._get_unpadded_features(
        height, width, side, side, canvas_height // tile, canvas_width // tile
    )
    columns = unpadded // rows
    # canvas pixels -> original pixels: the image was resized to (new_height, new_width) and padded centred
    blank = np.broadcast_to(np.zeros(1, dtype=np.uint8), (height, width, 1))
    new_height, new_width = get_patch_output_size(blank, (canvas_height, canvas_width), ChannelDimension.LAST)
    (top, _), (left, _) = LlavaNextImageProcessorPil._get_padding_size(
        None, (new_height, new_width), (canvas_height, canvas_width)
    )
    x_scale, y_scale = width / new_width, height / new_height
    box = (
        (first_column * patch - left) * x_scale,
        (first_row * patch - top) * y_scale,
        (last_column * patch - left) * x_scale,
        (last_row * patch - top) * y_scale,
    )
    views.append(_grid_view("tiles", (rows, columns), box, side * side, row_stride=columns + 1))
    return views


def _idefics3(processor, config, size, inputs, index, num_tokens):
    """Tiles of the image resized to rows x columns tiles (`get_number_of_image_patches`), then the global view."""
    width, height = size
    _, rows, columns = processor.image_processor.get_number_of_image_patches(height, width)
    return _tiles_then_whole(size, rows, columns, math.isqrt(processor.image_seq_len), "global")


def _gemma3(processor, config, size, inputs, index, num_tokens):
    """The whole image, then its pan-and-scan crops: the image processor's own `pan_and_scan` run on an image of
    pixel coordinates gives each crop's rectangle."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    width, height = size
    side = math.isqrt(config.mm_tokens_per_image)
    views = [_grid_view("image", (side, side), _whole(size), 0)]
    if num_tokens == config.mm_tokens_per_image:
        return views
    image_processor = processor.image_processor
    coordinates = np.stack(np.meshgrid(np.arange(width), np.arange(height), indexing="xy")).astype(np.float32)
    crops = Gemma3ImageProcessorPil.pan_and_scan(
        None,
        coordinates,
        pan_and_scan_min_crop_size=image_processor.pan_and_scan_min_crop_size,
        pan_and_scan_max_num_crops=image_processor.pan_and_scan_max_num_crops,
        pan_and_scan_min_ratio_to_activate=image_processor.pan_and_scan_min_ratio_to_activate,
    )
    for crop in crops:
        box = (float(crop[0].min()), float(crop[1].min()), float(crop[0].max()) + 1, float(crop[1].max()) + 1)
        views.append(_grid_view("crop", (side, side), box, len(views) * side * side))
    return views


def _internvl(processor, config, size, inputs, index, num_tokens):
    """Tiles of the image squashed to the best (columns, rows) canvas (`get_optimal_tiled_canvas`), then the
    thumbnail when there is more than one tile."""
    from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

    width, height = size
    image_processor = processor.image_processor
    side = math.isqrt(processor.image_seq_length)
    num_views = num_tokens // processor.image_seq_length
    if num_views == 1:
        return [_grid_view("image", (side, side), _whole(size), 0)]
    tile = image_processor.size
    tile = (tile["height"], tile["width"]) if isinstance(tile, dict) else (tile.height, tile.width)
    columns, rows = get_optimal_tiled_canvas(
        (height, width), tile, image_processor.min_patches, image_processor.max_patches
    )
    return _tiles_then_whole(size, rows, columns, side, "thumbnail")


_VIEWS = {
    "qwen2_vl": _qwen,
    "qwen2_5_vl": _qwen,
    "qwen3_vl": _qwen,
    "mistral3": _mistral3,
    "llava_next": _llava_next,
    "llava_onevision": _llava_next,
    "idefics3": _idefics3,
    "smolvlm": _idefics3,
    "gemma3": _gemma3,
    "internvl": _internvl,
}


def image_token_map(
    processor, config, image_size: tuple[int, int], inputs: dict, index: int, num_tokens: int
) -> ImageTokenMap:
    """The `ImageTokenMap` of the `index`-th image of a processor output `inputs` (one image per example).

    Args:
        processor: the model's processor (the one that made `inputs`).
        config: the model's config (its `model_type` picks the family).
        image_size: (width, height) of the original image.
        inputs: the processor's output for the batch.
        index: the image's index in the batch.
        num_tokens: the image's tokens in its example's `input_ids` (`config.image_token_id`).
    """
    views = _VIEWS[config.model_type](processor, config, image_size, inputs, index, num_tokens)
    return ImageTokenMap(tuple(image_size), num_tokens, views)


def single_grid_token_map(
    image_processor, image_size: tuple[int, int], processed_size: tuple[int, int], grid: tuple[int, int],
    content_size: tuple[int, int] | None = None, first: int = 0,
) -> ImageTokenMap:  # fmt: skip
    """The `ImageTokenMap` of a one-grid family (llava, paligemma, vilt): the grid over the processed image, whose
    rectangle in original pixels is its `ImageGeometry` inverted (CLIP's centre crop, SigLIP's squash, ViLT's resize;
    ViLT's padding reaches past the image and is clipped by `token_boxes`); `first`: image tokens before the first
    cell (LLaVA's CLIP [CLS] with `vision_feature_select_strategy="full"`)."""
    geometry = ImageGeometry.from_processor(image_processor, image_size, processed_size, content_size)
    box = (
        geometry.offset_x / geometry.scale_x,
        geometry.offset_y / geometry.scale_y,
        (geometry.width + geometry.offset_x) / geometry.scale_x,
        (geometry.height + geometry.offset_y) / geometry.scale_y,
    )
    view = _grid_view("image", grid, box, first)
    return ImageTokenMap(tuple(image_size), first + grid[0] * grid[1], [view])
