"""transformers' own vision-language models whose image tokens are patches: where those tokens are in the sequence.

The families are read without copying their modeling code (docs/vlms.md): "vilt" (one encoder over `[text; image
[CLS]; patches]`; it samples its patch order, so the forward here runs `visual_embed` itself and keeps the
`patch_index`), "llava" (CLIP patches replace `<image>` tokens, row-major; with `vision_feature_select_strategy="full"`
CLIP's [CLS] comes first and is masked), "paligemma" (SigLIP patches under Gemma's prefix-LM attention) and the
multi-view decoders (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-NeXT, LLaVA-OneVision, Idefics3, SmolVLM, Gemma 3, InternVL,
Mistral 3), whose image tokens are boxes over any number of views (`image_token_geometry`): there the layout's "cells"
are the example's image tokens themselves, each with its box.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..alignment.patches import centre_prior
from .image_token_geometry import MULTIVIEW_MODEL_TYPES, REFUSED_MODEL_TYPES

__all__ = [
    "LAYOUT_KEYS",
    "MultiViewFamily",
    "NON_MODEL_KEYS",
    "PATCH_MODEL_TYPES",
    "PatchLayout",
    "PatchModelFamily",
    "patch_model_family",
]

# the entries of a `PatchGroundingCollator` batch that are no model input: the patch layout (LLaVA, PaliGemma), the
# supervision targets, the probe's phrases and the explorer's details
LAYOUT_KEYS = ("image_positions", "cell_index", "patch_mask", "image_cell_boxes")
SUPERVISION_KEYS = ("word_cell_alignment", "grounded_token_positions")
NON_MODEL_KEYS = (*SUPERVISION_KEYS, "phrase_token_index", "phrase_cell_coverage", "details", *LAYOUT_KEYS)


@dataclass
class PatchLayout:
    """Where the patches of a batch sit in the model's token sequence.

    image_positions: (B, P) long, the sequence position of each image token.
    cell_index: (B, P) long, the grid cell (row-major) each image token shows; -1 for a token that is no cell
        (LLaVA's CLIP [CLS] with `vision_feature_select_strategy="full"`).
    patch_mask: (B, P) bool, image tokens that are real cells (not padding, not [CLS], not a token without a box).
    grid: (rows, columns) of the patch grid over the processed image (one-grid families); None for the multi-view
        families, whose cells are the example's image tokens (`cell_index` the identity, P the batch's most).
    token_boxes: (B, P, 4) each image token's box in its original image, normalised by the image's width and height
        (NaN where no cell), from the collator's `image_cell_boxes` (`forward_with_layout`); None when not given.
    """

    image_positions: torch.Tensor
    cell_index: torch.Tensor
    patch_mask: torch.Tensor
    grid: tuple[int, int] | None
    token_boxes: torch.Tensor | None = None

    def to_tokens(self, per_cell: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(B, ..., C) values per grid cell -> (B, ..., P) values per image token (`fill` where a token is no cell)."""
        index = self.cell_index.clamp(min=0).to(per_cell.device)
        shape = (index.shape[0],) + (1,) * (per_cell.dim() - 2) + (index.shape[1],)
        index = index.view(shape).expand(*per_cell.shape[:-1], index.shape[1])
        values = per_cell.gather(-1, index)
        keep = self.patch_mask.to(per_cell.device).view(shape)
        return values.masked_fill(~keep, fill)

    def centre_scores(self) -> torch.Tensor:
        """(B, P) the centre baseline's score of each image token (-1 where no cell): higher nearer the image centre.
        One grid: `centre_prior`'s cell ranks. Multi-view (`grid` None): minus the rank of the token's box centre by its
        distance to the image centre (in coordinates normalised by the image's width and height), ties (e.g. a
        thumbnail's and a tile's equally central token) won by the token first in the model's order."""
        if self.grid is not None:
            centre = centre_prior(self.grid).to(self.cell_index.device).expand(self.cell_index.shape[0], -1)
            return self.to_tokens(centre, fill=-1.0)
        boxes = self.token_boxes
        centres = (boxes[..., :2] + boxes[..., 2:]) / 2
        distance = ((centres - 0.5) ** 2).sum(-1)
        # rounded so that equal distances computed from different views tie exactly; the stable sort keeps token order
        distance = torch.round(distance * 1e6).masked_fill(~self.patch_mask.to(boxes.device), float("inf"))
        order = torch.sort(distance, dim=-1, stable=True).indices
        ranks = torch.empty_like(distance).scatter_(
            -1, order, torch.arange(distance.shape[-1], dtype=distance.dtype, device=boxes.device).expand_as(order)
        )
        return (-ranks).masked_fill(~self.patch_mask.to(boxes.device), -1.0).to(self.cell_index.device)


class PatchModelFamily:
    """What the library needs to know of one family of patch models; each family defines `base_model(model)`,
    `attention_modules(model)` (per layer, the module whose attention is read and supervised), `num_heads(model)` and
    `grid(config, pixel_values)` ((rows, columns) of the patch grid over (B, 3, height, width) `pixel_values`)."""

    name: str = ""
    model_types: tuple[str, ...] = ()
    # whether image tokens attend to the text (Samaran et al.'s eq. 7 direction exists)
    image_attends_to_text: bool = False


class ViltFamily(PatchModelFamily):
    name = "vilt"
    model_types = ("vilt",)
    image_attends_to_text = True

    def base_model(self, model):
        return getattr(model, "vilt", model)

    def attention_modules(self, model):
        return [layer.attention.attention for layer in self.base_model(model).encoder.layer]

    def num_heads(self, model):
        return model.config.num_attention_heads

    def grid(self, config, pixel_values):
        patch = config.patch_size
        return pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch

    def embed_images(self, model, pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None):
        """(image_embeds, image_mask, patch_index): ViLT's own `visual_embed`, so that the sampled patch order is
        known; `image_embeds` / `image_mask` go to the model as `image_embeds` / `pixel_mask`."""
        base = self.base_model(model)
        if pixel_mask is None:
            pixel_mask = torch.ones(
                pixel_values.shape[0], *pixel_values.shape[-2:], dtype=torch.long, device=pixel_values.device
            )
        embeds, mask, (patch_index, _) = base.embeddings.visual_embed(
            pixel_values, pixel_mask, max_image_length=base.config.max_image_length
        )
        return embeds, mask, patch_index

    def layout(
        self, model, input_ids: torch.Tensor, pixel_values: torch.Tensor, image_mask, patch_index
    ) -> PatchLayout:
        rows, columns = self.grid(model.config, pixel_values)
        batch, text_length = input_ids.shape
        num_patches = patch_index.shape[1]
        positions = text_length + 1 + torch.arange(num_patches, device=input_ids.device)
        return PatchLayout(
            image_positions=positions.expand(batch, -1),
            cell_index=patch_index[..., 0] * columns + patch_index[..., 1],
            patch_mask=image_mask[:, 1:].bool(),
            grid=(rows, columns),
        )


class _ImageTokenFamily(PatchModelFamily):
    """Decoder VLMs whose image features replace `<image>` placeholder tokens in `input_ids`."""

    # the base model's attribute holding the language model
    text_attribute = "language_model"

    def base_model(self, model):
        return model.model if hasattr(model, "model") and hasattr(model.model, self.text_attribute) else model

    def language_model(self, model):
        return getattr(self.base_model(model), self.text_attribute)

    def attention_modules(self, model):
        return [layer.self_attn for layer in self.language_model(model).layers]

    def num_heads(self, model):
        return model.config.text_config.num_attention_heads

    def grid(self, config, pixel_values):
        vision = config.vision_config
        side = vision.image_size // vision.patch_size
        return side, side

    def leading_non_cells(self, config) -> int:
        """Image tokens before the first cell ([CLS])."""
        return 0

    def num_image_tokens(self, config, pixel_values: torch.Tensor) -> int:
        rows, columns = self.grid(config, pixel_values)
        return rows * columns + self.leading_non_cells(config)

    def layout(self, config, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> PatchLayout:
        """From `<image>` tokens of `input_ids`; read on the host (collators and evaluation, never a forward)."""
        rows, columns = self.grid(config, pixel_values)
        is_image = input_ids == config.image_token_id
        counts = is_image.sum(-1)
        extra = self.leading_non_cells(config)
        expected = rows * columns + extra
        if bool((counts != expected).any()):
            raise ValueError(
                f"`input_ids` must hold one image of {expected} `<image>` tokens (id {config.image_token_id}) per "
                f"example for {self.name} ({rows} x {columns} patches{' + [CLS]' if extra else ''}), got "
                f"{counts.tolist()}."
            )
        positions = is_image.nonzero()[:, 1].view(input_ids.shape[0], expected)
        cells = torch.arange(-extra, rows * columns, device=input_ids.device).expand(input_ids.shape[0], -1)
        return PatchLayout(positions, cells.clamp(min=-1), cells >= 0, (rows, columns))


class LlavaFamily(_ImageTokenFamily):
    name = "llava"
    model_types = ("llava",)

    def leading_non_cells(self, config):
        return 1 if config.vision_feature_select_strategy == "full" else 0


class PaliGemmaFamily(_ImageTokenFamily):
    name = "paligemma"
    model_types = ("paligemma",)


class MultiViewFamily(_ImageTokenFamily):
    """A decoder VLM whose image tokens come from any number of views (tiles, a thumbnail, crops, a dynamic
    resolution): the collator builds its prefix with the model's own processor and places each image token in the
    original image (`image_token_geometry.image_token_map`); the layout's cells are the image tokens themselves."""

    def __init__(self, model_type: str):
        self.name = model_type
        self.model_types = (model_type,)
        # Idefics3 / SmolVLM name their language model `text_model`
        self.text_attribute = "text_model" if model_type in ("idefics3", "smolvlm") else "language_model"

    def grid(self, config, pixel_values):
        return None


FAMILIES = (ViltFamily(), LlavaFamily(), PaliGemmaFamily(), *(MultiViewFamily(name) for name in MULTIVIEW_MODEL_TYPES))
PATCH_MODEL_TYPES = tuple(model_type for family in FAMILIES for model_type in family.model_types)


def patch_model_family(model_or_config) -> PatchModelFamily:
    """The family of a transformers patch model (or its config), from `config.model_type`."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    if model_type in REFUSED_MODEL_TYPES:
        raise ValueError(
            f"`model` of model_type {model_type!r} is not supported ({REFUSED_MODEL_TYPES[model_type]}): the patch "
            f"families read a word's attention over image tokens of the sequence, model_type one of "
            f"{PATCH_MODEL_TYPES}."
        )
    raise ValueError(
        f"`model` must be one of transformers' patch vision-language models (model_type one of {PATCH_MODEL_TYPES}), "
        f"got {type(model_or_config).__name__} with model_type {model_type!r}."
    )


def model_inputs(batch: dict) -> dict:
    """The entries of a `PatchGroundingCollator` batch that the model's forward takes."""
    return {key: value for key, value in batch.items() if key not in NON_MODEL_KEYS}


def forward_with_layout(
    model: nn.Module, batch: dict, plain_model: nn.Module | None = None, **kwargs
) -> tuple[object, PatchLayout]:
    """Runs `model` on a `PatchGroundingCollator` batch; returns its outputs and the batch's `PatchLayout`.

    ViLT's patches are embedded here (`ViltFamily.embed_images`) so that their sampled order is known; the other
    families read the layout the collator computed (`image_positions`, `cell_index`, `patch_mask`); every family's
    token boxes come from the collator's `image_cell_boxes`. `plain_model`:
    the model itself when `model` is wrapped (DDP, PEFT); `kwargs` go to the forward."""
    plain_model = model if plain_model is None else plain_model
    family = patch_model_family(plain_model)
    inputs = model_inputs(batch)
    if isinstance(family, ViltFamily):
        pixel_values, pixel_mask = inputs.pop("pixel_values"), inputs.pop("pixel_mask", None)
        image_embeds, image_mask, patch_index = family.embed_images(plain_model, pixel_values, pixel_mask)
        outputs = model(**inputs, image_embeds=image_embeds, pixel_mask=image_mask, **kwargs)
        layout = family.layout(plain_model, inputs["input_ids"], pixel_values, image_mask, patch_index)
        return outputs, _with_token_boxes(layout, batch.get("image_cell_boxes"))
    grid = family.grid(plain_model.config, batch["pixel_values"])
    layout = PatchLayout(batch["image_positions"], batch["cell_index"], batch["patch_mask"].bool(), grid)
    return model(**inputs, **kwargs), _with_token_boxes(layout, batch.get("image_cell_boxes"))


def _with_token_boxes(layout: PatchLayout, cell_boxes: torch.Tensor | None) -> PatchLayout:
    """`layout` with its `token_boxes`: the (B, C, 4) `cell_boxes` carried to the image tokens (NaN where no cell)."""
    if cell_boxes is not None:
        layout.token_boxes = layout.to_tokens(cell_boxes.transpose(1, 2), fill=float("nan")).transpose(1, 2)
    return layout
