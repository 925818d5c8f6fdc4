"""The "word-region-attention" pipeline (`hf_vlalign.processing.pipeline`) on a transformers patch model: the model's
own processor makes its input (`PatchGroundingCollator`, which knows where each caption token and image token sits),
each image token is a region whose box is its grid cell in the original image's pixels
(`views.ImageTokenMap.token_boxes`), and the attention is read with transformers' eager attention, as the probe reads
it (`hf_vlalign.vlms.probe`)."""

from __future__ import annotations

import torch
from PIL import Image

from ..alignment.patches import ImageGeometry
from ..supervision.direct import normalise_rows
from .data import PatchGroundingCollator, _content_sizes
from .families import PATCH_MODEL_TYPES, forward_with_layout, patch_model_family
from .probe import eager_attention, patch_attention_rows
from .views import ImageTokenMap, TokenView

__all__ = ["PatchAttentionReader", "is_patch_model_instance", "single_grid_token_map"]


def is_patch_model_instance(model) -> bool:
    """Whether `model` is one of transformers' patch vision-language models `hf_vlalign.vlms` reads."""
    return getattr(getattr(model, "config", None), "model_type", None) in PATCH_MODEL_TYPES


def single_grid_token_map(
    cell_index: torch.Tensor, grid: tuple[int, int], geometry: ImageGeometry, image_size: tuple[int, int]
) -> ImageTokenMap:
    """The `ImageTokenMap` of an image seen as one grid over the processed image (ViLT, LLaVA, PaliGemma): the grid's
    box is the processed image carried back into the original pixels (`geometry` inverted); `cell_index` (P,) is the
    cell of each image token, -1 for a token that is no cell (LLaVA's CLIP [CLS])."""
    corners = torch.tensor([0.0, 0.0, geometry.width, geometry.height])
    offset = torch.tensor([geometry.offset_x, geometry.offset_y] * 2)
    scale = torch.tensor([geometry.scale_x, geometry.scale_y] * 2)
    box = tuple(float(value) for value in (corners + offset) / scale)
    token_index = torch.zeros(grid[0] * grid[1], dtype=torch.long)
    is_cell = cell_index >= 0
    token_index[cell_index[is_cell]] = torch.arange(len(cell_index))[is_cell]
    return ImageTokenMap(image_size, len(cell_index), [TokenView("image", grid, box, token_index)])


class PatchAttentionReader:
    """The pipeline's steps for a patch model: `preprocess` one (image, text) example, `forward` to the caption tokens'
    attention over the image tokens of one layer (each head's row renormalised over the image's real tokens, then
    averaged over heads), in the layout `WordRegionAttentionPipeline.postprocess` reads (it adds the words: the
    caption's tokens are the text's tokens without special tokens, `caption_length` of them kept)."""

    def __init__(self, model, processor) -> None:
        self.family = patch_model_family(model)
        self.collator = PatchGroundingCollator(processor, model.config, with_labels=False, return_details=True)

    def preprocess(self, example: dict, image: Image.Image) -> dict:
        if example.get("text_pair") is not None or example.get("boxes") is not None:
            raise ValueError(
                f"`text_pair` and `boxes` apply to hf_vlalign's region models; a {self.family.name} model reads one "
                "text per image, and its regions are its image tokens."
            )
        grounded = {"image": image, "caption": example["text"], "phrases": []}
        batch = self.collator([grounded])
        caption = batch["details"][0]
        pixels = batch["pixel_values"]
        content = _content_sizes(pixels, batch.get("pixel_mask"))[0]
        geometry = ImageGeometry.from_processor(
            self.collator.image_processor, image.size, (pixels.shape[-1], pixels.shape[-2]), content
        )
        length = caption["caption_end"] - caption["caption_start"]
        return {"batch": batch, "caption_length": length, "geometry": geometry, "example": grounded}

    def forward(self, model, inputs: dict, layer: int) -> dict:
        batch, details = inputs["batch"], inputs["batch"]["details"][0]
        with eager_attention(model):
            outputs, layout = forward_with_layout(model, batch, output_attentions=True)
        rows = patch_attention_rows(outputs.attentions, layout.image_positions)[:, 0]  # (L, H, N, P)
        real = layout.patch_mask[0].bool().to(rows.device)
        rows = normalise_rows(rows[:, :, details["caption_start"] : details["caption_end"]][..., real])
        if not -len(rows) <= layer < len(rows):
            raise ValueError(f"`layer` must be in [-{len(rows)}, {len(rows) - 1}] (the model's layers), got {layer}.")
        image = inputs["example"]["image"]
        token_map = single_grid_token_map(layout.cell_index[0].cpu(), layout.grid, inputs["geometry"], image.size)
        return {
            "attention": rows[layer].mean(dim=0).float().cpu(),  # (T, P): mean over heads
            "layer": layer % len(rows),
            "region_boxes": token_map.token_boxes()[real.cpu()],
            "num_regions": int(real.sum()),
            "words": inputs["words"],
        }

    def explorer_example(self, model, inputs: dict):
        """The explorer's example of `inputs` (`hf_vlalign.vlms.explore.patch_explorer_examples`)."""
        from .explore import patch_explorer_examples

        return patch_explorer_examples(model, self.collator, [inputs["example"]])[0]

    def subtitle(self, model) -> str:
        return (
            f"{model.config.model_type}; regions: the image tokens (patches of the processed image); each word's "
            "weights renormalised over them; layers and heads counted from 0"
        )
