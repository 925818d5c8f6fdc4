"""`RegionFeatureExtractor`: images (PIL or paths) -> region boxes and features, the image half of `VLAlignProcessor`;
an image processor in transformers' sense that computes for one image the features `extract_region_features` stores,
with that function's keyword arguments (but `boxes`, given per call).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from PIL import Image
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.utils import IMAGE_PROCESSOR_NAME, PROCESSOR_NAME

from ..alignment.boxes import normalize_boxes
from ..data.region_extraction import (
    DEFAULT_DETECTOR_THRESHOLD,
    DEFAULT_MAX_REGIONS,
    PIXEL_ENCODER,
    BackboneRegionEncoder,
    CropEncoder,
    RegionDetector,
    build_region_encoder,
    check_region_options,
    check_image_boxes,
    grid_boxes,
    load_rgb_image,
    with_whole_image,
)

__all__ = ["RegionFeatureExtractor", "RegionFeatureExtractorKwargs"]

ImageLike = str | os.PathLike | Image.Image


class RegionFeatureExtractorKwargs(TypedDict, total=False):
    """The options of `RegionFeatureExtractor` (the names of `extract_region_features`)."""

    grid_size: int | None
    include_whole_image: bool
    encoder: str | None
    feature_dim: int | None
    seed: int
    detector: str | None
    detector_threshold: float
    max_regions: int
    device: str


class RegionFeatureExtractor(BaseImageProcessor):
    r"""Region boxes and features of images, as the library's models read them.

    Args:
        grid_size, include_whole_image, feature_dim, seed, detector, detector_threshold, max_regions, device: as in
            `hf_vlalign.data.extract_region_features`; a call's `boxes` come first, then the detector's, then the grid.
        encoder: as in `extract_region_features`, or None: the model's features come from files this extractor cannot
            reproduce, so only text can be processed.

    Calling it (`extractor(images, boxes=None)`) returns a `BatchFeature` with `visual_feats` (B, R, D) float32,
    `visual_boxes` (B, R, 4) normalised to [0, 1], `visual_attention_mask` (B, R) (padding as the collators pad) and
    `region_boxes` (B, R, 4) in pixels of each image (zeros on padding), for drawing.
    """

    model_input_names = ["visual_feats", "visual_boxes", "visual_attention_mask"]
    valid_kwargs = RegionFeatureExtractorKwargs

    def __init__(
        self,
        grid_size: int | None = None,
        include_whole_image: bool = False,
        encoder: str | os.PathLike | None = PIXEL_ENCODER,
        feature_dim: int | None = None,
        seed: int = 0,
        detector: str | os.PathLike | None = None,
        detector_threshold: float = DEFAULT_DETECTOR_THRESHOLD,
        max_regions: int = DEFAULT_MAX_REGIONS,
        device: str = "cpu",
        **kwargs: Any,
    ) -> None:
        kwargs.pop("image_processor_type", None)  # written by `to_dict`, the class itself
        if kwargs:
            raise ValueError(f"RegionFeatureExtractor got unknown option(s) {sorted(kwargs)}.")
        super().__init__()
        check_region_options(grid_size, feature_dim, detector_threshold, max_regions)
        if not isinstance(include_whole_image, bool):
            raise ValueError(f"`include_whole_image` must be a bool, got {include_whole_image!r}.")
        if encoder is not None and (not isinstance(encoder, (str, os.PathLike)) or not str(encoder)):
            raise ValueError(f"`encoder` must be {PIXEL_ENCODER!r}, a Hub id, a local folder or None, got {encoder!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"`seed` must be a non-negative int, got {seed!r}.")
        if detector is not None and (not isinstance(detector, (str, os.PathLike)) or not str(detector)):
            raise ValueError(f"`detector` must be a Hub id, a local folder or None, got {detector!r}.")
        self.grid_size = grid_size
        self.include_whole_image = include_whole_image
        self.encoder = None if encoder is None else str(encoder)
        self.feature_dim = feature_dim
        self.seed = seed
        self.detector = None if detector is None else str(detector)
        self.detector_threshold = float(detector_threshold)
        self.max_regions = max_regions
        self.device = str(device)
        self._region_encoder: CropEncoder | BackboneRegionEncoder | None = None
        self._region_detector: RegionDetector | None = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any) -> RegionFeatureExtractor:
        """`BaseImageProcessor.from_pretrained`; a bad saved option is a ValueError naming the file and the field."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except ValueError as error:
            folder = Path(pretrained_model_name_or_path)
            saved = next((folder / name for name in (PROCESSOR_NAME, IMAGE_PROCESSOR_NAME) if (folder / name).is_file()), folder)
            raise ValueError(f"{saved}, field 'image_processor': {error}") from None

    def to_dict(self) -> dict[str, Any]:
        options = {name: getattr(self, name) for name in RegionFeatureExtractorKwargs.__annotations__}
        return {**options, "image_processor_type": type(self).__name__}

    @property
    def region_options(self) -> dict[str, Any]:
        """The options as keyword arguments of `extract_region_features` (without `device`)."""
        return {name: value for name, value in self.to_dict().items() if name not in ("image_processor_type", "device")}

    @property
    def region_encoder(self) -> CropEncoder | BackboneRegionEncoder:
        """The encoder (built on first use); a ValueError when `encoder` is None."""
        if self.encoder is None:
            raise ValueError(
                "This model's region features came from files the RegionFeatureExtractor cannot reproduce (encoder=None, "
                "e.g. published bottom-up-attention features): pass the model `visual_feats`, `visual_boxes` and "
                "`visual_attention_mask` yourself (the processor still tokenizes text), or set an encoder "
                "(`processor.image_processor = RegionFeatureExtractor(encoder=..., feature_dim=...)`) that gives the "
                "model's visual_feat_dim."
            )
        if self._region_encoder is None:
            self._region_encoder = build_region_encoder(
                self.encoder, feature_dim=self.feature_dim, device=self.device, seed=self.seed
            )
        return self._region_encoder

    def region_boxes(
        self, images: Sequence[Image.Image], boxes: Sequence[object | None] | None = None
    ) -> list[np.ndarray]:
        """Pixel boxes (R_i, 4) float32 of each image: its given boxes, else the detector's, else the grid's; with
        `include_whole_image` the whole-image box first."""
        boxes = [None] * len(images) if boxes is None else list(boxes)
        regions: list[np.ndarray | None] = []
        for index, (image, given) in enumerate(zip(images, boxes)):
            if given is not None:
                if isinstance(given, torch.Tensor):
                    given = given.detach().cpu().numpy()
                regions.append(check_image_boxes(given, f"`boxes[{index}]`", image.width, image.height))
            elif self.detector is None and self.grid_size is None:
                raise ValueError(
                    f"`boxes[{index}]`: no boxes given for image {index}, and this extractor has neither a `detector` "
                    "nor a `grid_size` to find regions; pass boxes=[[x1, y1, x2, y2], ...] in pixels per image."
                )
            elif self.detector is None:
                regions.append(grid_boxes(image.height, image.width, self.grid_size))
            else:
                regions.append(None)
        missing = [index for index, found in enumerate(regions) if found is None]
        if missing:
            if self._region_detector is None:
                self._region_detector = RegionDetector(
                    self.detector, self.detector_threshold, self.max_regions, device=self.device
                )
            detected = self._region_detector.detect([images[index] for index in missing])
            for index, found in zip(missing, detected):
                regions[index] = found
        if self.include_whole_image:
            regions = [with_whole_image(found, image.width, image.height) for found, image in zip(regions, images)]
        return regions

    def __call__(
        self, images: ImageLike | Sequence[ImageLike], boxes: Sequence | None = None, **kwargs: Any
    ) -> BatchFeature:
        return self.preprocess(images, boxes=boxes, **kwargs)

    def preprocess(
        self,
        images: ImageLike | Sequence[ImageLike],
        boxes: Sequence | None = None,
        return_tensors: str | None = "pt",
    ) -> BatchFeature:
        """Region tensors of `images` (one image or a list: paths or PIL images); `boxes`: per image None or its
        pixel boxes [[x1, y1, x2, y2], ...] (for a single image, its boxes)."""
        single = isinstance(images, (str, os.PathLike, Image.Image))
        images = load_images([images] if single else images)
        if boxes is not None and single:
            boxes = [boxes]
        if boxes is not None and (isinstance(boxes, (str, bytes)) or not isinstance(boxes, Sequence) or len(boxes) != len(images)):
            got = len(boxes) if isinstance(boxes, Sequence) else type(boxes).__name__
            raise ValueError(f"`boxes` must hold one entry (None or pixel boxes) per image ({len(images)}), got {got}.")
        if return_tensors not in ("pt", None):
            raise ValueError(f"`return_tensors` must be 'pt' (or None: the same torch tensors), got {return_tensors!r}.")
        encoder = self.region_encoder  # before any detector runs: a model without an encoder fails first
        regions = self.region_boxes(images, boxes)
        features = encoder.encode_batch(images, regions)
        return BatchFeature(pad_regions(images, regions, features))


def load_images(images: Sequence[ImageLike]) -> list[Image.Image]:
    """RGB PIL images of paths or PIL images (paths read as `extract_region_features` reads them)."""
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence) or not len(images):
        raise ValueError(f"`images` must be an image (path or PIL.Image) or a non-empty list of them, got {images!r}.")
    loaded = []
    for index, image in enumerate(images):
        if isinstance(image, (str, os.PathLike)):
            loaded.append(load_rgb_image(image, argument=f"images[{index}]"))
        elif isinstance(image, Image.Image):
            loaded.append(image.convert("RGB"))
        else:
            raise ValueError(f"`images[{index}]` must be a path or a PIL.Image, got {type(image).__name__}.")
    return loaded


def pad_regions(
    images: Sequence[Image.Image], regions: Sequence[np.ndarray], features: Sequence[np.ndarray]
) -> dict[str, torch.Tensor]:
    """The padded region tensors of a batch: `visual_feats`, `visual_boxes` (normalised), `visual_attention_mask`,
    `region_boxes` (pixels); padding as `data.collators.regions.pad_regions` pads."""
    batch, num_regions = len(images), max(len(boxes) for boxes in regions)
    feature_dim = features[0].shape[1]
    visual_feats = torch.zeros(batch, num_regions, feature_dim)
    visual_boxes = torch.tensor([0.0, 0.0, 1.0, 1.0]).repeat(batch, num_regions, 1)
    mask = torch.zeros(batch, num_regions, dtype=torch.long)
    pixels = torch.zeros(batch, num_regions, 4)
    for index, (image, boxes, image_features) in enumerate(zip(images, regions, features)):
        count = len(boxes)
        visual_feats[index, :count] = torch.as_tensor(image_features, dtype=torch.float32)
        visual_boxes[index, :count] = normalize_boxes(torch.as_tensor(boxes), image.width, image.height)
        mask[index, :count] = 1
        pixels[index, :count] = torch.as_tensor(boxes, dtype=torch.float32)
    return {
        "visual_feats": visual_feats,
        "visual_boxes": visual_boxes,
        "visual_attention_mask": mask,
        "region_boxes": pixels,
    }
