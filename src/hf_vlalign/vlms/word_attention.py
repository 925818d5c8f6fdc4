"""The "word-region-attention" pipeline (`hf_vlalign.processing.pipeline`) on a transformers patch model: the model's
own processor makes its input (`PatchGroundingCollator`, which knows where each caption token and image token sits),
each image token is a region whose box is its grid cell in the original image's pixels
(`views.ImageTokenMap.token_boxes`), and the attention is read with transformers' eager attention, as the probe reads
it (`hf_vlalign.vlms.probe`)."""

from __future__ import annotations

import torch
from PIL import Image

from ..supervision.direct import normalise_rows
from .data import PatchGroundingCollator
from .families import PATCH_MODEL_TYPES, patch_model_family
from .probe import patch_attention_rows, read_attention_rows

__all__ = ["PatchAttentionReader", "is_patch_model_instance"]


def is_patch_model_instance(model) -> bool:
    """Whether `model` is one of transformers' patch vision-language models `hf_vlalign.vlms` reads."""
    return getattr(getattr(model, "config", None), "model_type", None) in PATCH_MODEL_TYPES


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
        length = caption["caption_end"] - caption["caption_start"]
        return {"batch": batch, "caption_length": length, "example": grounded}

    def forward(self, model, inputs: dict, layer: int) -> dict:
        batch, details = inputs["batch"], inputs["batch"]["details"][0]
        # the caption tokens' rows of every layer, one layer's map alive at a time
        caption = torch.arange(details["caption_start"], details["caption_end"]).unsqueeze(0)
        _, layout, rows = read_attention_rows(model, batch, caption.to(batch["input_ids"].device))
        rows = patch_attention_rows(rows, layout.image_positions)[:, 0]  # (L, H, T, P)
        real = layout.patch_mask[0].bool().to(rows.device)
        rows = normalise_rows(rows[..., real])
        if not -len(rows) <= layer < len(rows):
            raise ValueError(f"`layer` must be in [-{len(rows)}, {len(rows) - 1}] (the model's layers), got {layer}.")
        width, height = inputs["example"]["image"].size
        boxes = layout.token_boxes[0].cpu() * torch.tensor([width, height, width, height], dtype=torch.float32)
        return {
            "attention": rows[layer].mean(dim=0).float().cpu(),  # (T, P): mean over heads
            "layer": layer % len(rows),
            "region_boxes": boxes[real.cpu()],
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
