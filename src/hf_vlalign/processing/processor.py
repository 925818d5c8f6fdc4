"""`VLAlignProcessor`: the tokenizer and the `RegionFeatureExtractor` of a model, in transformers' `ProcessorMixin` sense.

`processor(images=..., text=..., text_pair=None, boxes=None)` returns the inputs of every single-stream and
two-stream model, so that `model(**inputs)` runs; the regions' pixel boxes come only with `return_region_boxes=True`
(pop them before calling the model). Saved with every trained model as `processor_config.json`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import BatchFeature, PreTrainedTokenizerBase
from transformers.processing_utils import ProcessorMixin
from transformers.utils import PROCESSOR_NAME

from .feature_extraction import ImageLike, RegionFeatureExtractor

__all__ = ["VLAlignProcessor"]


class VLAlignProcessor(ProcessorMixin):
    r"""The processor of hf_vlalign's models: a tokenizer and a [`RegionFeatureExtractor`].

    Args:
        image_processor: the `RegionFeatureExtractor` (regions and their features).
        tokenizer: the model's tokenizer.

    Example:
        ```python
        processor = AutoProcessor.from_pretrained("outputs/vgp")
        inputs = processor(images="photo.jpg", text="a red circle above a blue square", return_region_boxes=True)
        region_boxes = inputs.pop("region_boxes")  # (B, R, 4) pixels, for drawing
        outputs = model(**inputs, output_attentions=True)
        ```
    """

    def __init__(self, image_processor: RegionFeatureExtractor, tokenizer: PreTrainedTokenizerBase, **kwargs: Any):
        if not isinstance(image_processor, RegionFeatureExtractor):
            raise ValueError(f"`image_processor` must be a RegionFeatureExtractor, got {type(image_processor).__name__}.")
        super().__init__(image_processor, tokenizer, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> VLAlignProcessor:
        """`ProcessorMixin.from_pretrained`; a local folder without `processor_config.json` (a model saved before
        processors, or without `hf_vlalign.recipes.save_model`) raises a FileNotFoundError saying how to add one."""
        folder = Path(pretrained_model_name_or_path)
        if folder.is_dir() and not (folder / PROCESSOR_NAME).is_file() and not kwargs.get("subfolder"):
            raise FileNotFoundError(
                f"{str(folder)!r} has no {PROCESSOR_NAME}: the model was saved without its processor. Add one with "
                "VLAlignProcessor(RegionFeatureExtractor(<the region options of its training features>), "
                f"AutoTokenizer.from_pretrained(folder)).save_pretrained(folder)."
            )
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @property
    def model_input_names(self) -> list[str]:
        return [*self.tokenizer.model_input_names, *self.image_processor.model_input_names]

    def __call__(
        self,
        images: ImageLike | Sequence[ImageLike] | None = None,
        text: str | Sequence[str] | None = None,
        text_pair: str | Sequence[str] | None = None,
        boxes: Sequence | None = None,
        return_tensors: str | None = "pt",
        return_region_boxes: bool = False,
        padding: bool | str = True,
        truncation: bool | str = True,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> BatchFeature:
        """The model's inputs for `images` and `text` (example i: `images[i]` with `text[i]`, and `text_pair[i]` as
        the second sentence, e.g. VGP's second caption).

        Args:
            images: an image (path or PIL.Image) or a list of them; None for text only.
            text: a sentence or a list of them (one per image); None for images only.
            text_pair: the second sentence of each example (`[CLS] text [SEP] text_pair [SEP]`).
            boxes: per image None or its regions as pixel boxes [[x1, y1, x2, y2], ...] (a single image: its boxes);
                None uses the extractor's detector or grid.
            return_tensors: "pt" (the only kind: the models are PyTorch).
            return_region_boxes: add `region_boxes` (B, R, 4) in pixels (zeros on padding), to pop before the model.
            padding, truncation, max_length, kwargs: passed to the tokenizer.
        """
        if images is None and text is None:
            raise ValueError("Pass `images`, `text` or both, got neither.")
        if text is None and text_pair is not None:
            raise ValueError("`text_pair` needs `text` (the first sentence of each pair), got text=None.")
        if return_tensors not in ("pt", None):
            raise ValueError(f"`return_tensors` must be 'pt' (the models are PyTorch), got {return_tensors!r}.")
        if boxes is not None and images is None:
            raise ValueError("`boxes` are regions of `images`: pass the images too, got images=None.")
        data: dict[str, Any] = {}
        if text is not None:
            texts = _sentences("text", text)
            pairs = None if text_pair is None else _sentences("text_pair", text_pair)
            if pairs is not None and len(pairs) != len(texts):
                raise ValueError(f"`text` and `text_pair` must have as many sentences, got {len(texts)} and {len(pairs)}.")
            if images is not None:
                num_images = 1 if isinstance(images, (str, os.PathLike)) or not isinstance(images, Sequence) else len(images)
                if num_images != len(texts):
                    raise ValueError(
                        f"`images` and `text` must have one image per sentence, got {num_images} image(s) and "
                        f"{len(texts)} sentence(s)."
                    )
            encoding = self.tokenizer(
                texts, pairs, padding=padding, truncation=truncation, max_length=max_length, return_tensors="pt",
                **kwargs,
            )  # fmt: skip
            data.update(encoding)
        if images is not None:
            regions = self.image_processor(images, boxes=boxes)
            if not return_region_boxes:
                regions.pop("region_boxes")
            data.update(regions)
        return BatchFeature(data, tensor_type=None)

    def check_model(self, model: torch.nn.Module) -> None:
        """A ValueError when the extractor's `feature_dim` is set and differs from the model's `visual_feat_dim`."""
        expected = getattr(model.config, "visual_feat_dim", None)
        dim = self.image_processor.feature_dim
        if expected is not None and dim is not None and dim != expected:
            raise ValueError(
                f"The processor's region features have feature_dim={dim}, but the model reads visual_feat_dim="
                f"{expected}; load the processor saved with this model (AutoProcessor.from_pretrained(model_dir))."
            )


def _sentences(name: str, value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and value and all(isinstance(item, str) for item in value):
        return list(value)
    raise ValueError(f"`{name}` must be a str or a non-empty list of str, got {value!r}.")
