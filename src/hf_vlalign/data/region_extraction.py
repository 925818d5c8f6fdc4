"""Region features for one's own images (`extract_region_features`, docs/own_data.md): boxes from a JSON file or dict,
a grid or a transformers object detector (`RegionDetector`); features from the pixel `CropEncoder` or a transformers
vision model pooled with RoIAlign (`BackboneRegionEncoder`). Records keep the image as stored in the file: `image_id`
is the file stem, `image_size` the file's (height, width), `boxes` its pixels (EXIF orientation is not applied).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tqdm.auto import tqdm
from transformers import AutoImageProcessor, AutoModel, AutoModelForObjectDetection

from ..utils.output_paths import refuse_output_overlapping_inputs
from ..utils.size_limits import (
    MAX_BACKBONE_INPUT_SIDE,
    MAX_BATCH_SIZE,
    MAX_FEATURE_DIM,
    MAX_GRID_SIZE,
    MAX_REGIONS_PER_IMAGE,
    SizeLimitError,
    check_size,
)
from .feature_store import RegionFeatureStore, check_store_output
from .formats.region_records import normalise_record
from .formats.text_files import read_json_file, short_repr

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PIXEL_ENCODER = "pixel"
DEFAULT_PIXEL_FEATURE_DIM = 256
ROI_OUTPUT_SIZE = 7
ROI_SAMPLING_RATIO = 2
MAX_PREFIX_TOKENS = 16  # CLS, distillation and register tokens before the patch tokens of a ViT-like model
DEFAULT_DETECTOR_THRESHOLD = 0.5  # the score transformers' object-detection pipeline keeps by default
DEFAULT_MAX_REGIONS = 36  # detector boxes kept per image, highest scores first (bottom-up attention's usual count)


def _hue_saturation(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hue in degrees [0, 360) and HSV saturation in [0, 1] of RGB values in [0, 1] (..., 3)."""
    high, low = rgb.max(-1), rgb.min(-1)
    chroma = high - low
    safe = np.where(chroma > 0, chroma, 1.0)
    red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    hue = np.where(
        high == red,
        ((green - blue) / safe) % 6,
        np.where(high == green, (blue - red) / safe + 2, (red - green) / safe + 4),
    )
    return np.where(chroma > 0, hue * 60.0, 0.0), chroma / np.where(high > 0, high, 1.0)


class CropEncoder:
    """Deterministic pixel encoder for the synthetic scenes and simple images of coloured shapes (blind to the
    semantics of natural photos). Each box is cropped to `crop_size` x `crop_size`; the features start with
    `num_statistics` statistics (foreground hue histogram and mean colour, foreground fraction and coarse mask, and
    with `geometry=True` the box geometry), and a seeded random projection of the raw pixels fills the rest (with a
    `feature_dim` below `num_statistics`, statistics and pixels are projected together).

    `geometry=False` (synthetic world v2) describes appearance only: the same pixels give the same features wherever
    their box lies, so a model learns where a region is only from its box (`visual_boxes`).
    """

    crop_size = 12
    mask_size = 6
    hue_bins = 12  # 30-degree bins centred on 0, 30, 60, ... degrees
    num_appearance_statistics = hue_bins + 3 + 1 + mask_size**2
    num_geometry_statistics = 6  # x1, y1, x2, y2 and width, height, as fractions of the image

    def __init__(self, feature_dim: int = 256, seed: int = 0, geometry: bool = True) -> None:
        if not isinstance(feature_dim, int) or isinstance(feature_dim, bool) or feature_dim <= 0:
            raise ValueError(f"`feature_dim` must be a positive int, got {feature_dim!r}.")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"`seed` must be a non-negative int, got {seed!r}.")
        if not isinstance(geometry, bool):
            raise ValueError(f"`geometry` must be a bool, got {type(geometry).__name__} {geometry!r}.")
        self.feature_dim = feature_dim
        self.geometry = geometry
        self.num_statistics = self.num_appearance_statistics + (self.num_geometry_statistics if geometry else 0)
        num_pixels = 3 * self.crop_size**2
        rng = np.random.default_rng(seed)
        if feature_dim >= self.num_statistics:
            projection = np.zeros((self.num_statistics + num_pixels, feature_dim))
            projection[: self.num_statistics, : self.num_statistics] = np.eye(self.num_statistics)
            projection[self.num_statistics :, self.num_statistics :] = rng.standard_normal(
                (num_pixels, feature_dim - self.num_statistics)
            ) / np.sqrt(num_pixels)
        else:
            projection = rng.standard_normal((self.num_statistics + num_pixels, feature_dim)) / np.sqrt(feature_dim)
        self.projection = projection.astype(np.float32)

    def _statistics(self, crops: np.ndarray, boxes: np.ndarray, width: int, height: int) -> np.ndarray:
        hue, saturation = _hue_saturation(crops)
        # soft foreground (R, crop, crop): the background is grey (saturation < 0.15), the shapes saturated (> 0.45)
        foreground = np.clip((saturation - 0.15) / 0.3, 0.0, 1.0).astype(np.float32)
        count = foreground.sum((1, 2))
        bins = (((hue + 15.0) % 360.0) // 30.0).astype(np.int64)
        histogram = (np.eye(self.hue_bins, dtype=np.float32)[bins] * foreground[..., None]).sum((1, 2))
        histogram /= np.maximum(count, 1.0)[:, None]
        colour = (crops * foreground[..., None]).sum((1, 2)) / np.maximum(count, 1.0)[:, None]
        pool = self.crop_size // self.mask_size
        mask = foreground.reshape(-1, self.mask_size, pool, self.mask_size, pool).mean((2, 4)).reshape(len(crops), -1)
        fraction = count[:, None] / self.crop_size**2
        if not self.geometry:
            return np.concatenate([histogram, colour, fraction, mask], axis=1)
        scale = np.array([width, height, width, height], dtype=np.float32)
        geometry = boxes / scale
        extent = geometry[:, 2:] - geometry[:, :2]
        return np.concatenate([histogram, colour, fraction, mask, geometry, extent], axis=1)

    def encode(self, image: Image.Image, boxes: np.ndarray) -> np.ndarray:
        """Features (R, feature_dim) float32 of the pixel boxes (R, 4) x1, y1, x2, y2 of an RGB image."""
        boxes = np.asarray(boxes, dtype=np.float32)
        size, rgb = (self.crop_size, self.crop_size), image.convert("RGB")
        crops = [np.asarray(rgb.resize(size, Image.Resampling.BILINEAR, box=tuple(box))) for box in boxes.tolist()]
        crops = np.stack(crops).astype(np.float32) / 255.0
        statistics = self._statistics(crops, boxes, image.width, image.height)
        descriptors = np.concatenate([statistics, crops.reshape(len(crops), -1) - 0.5], axis=1)
        return descriptors @ self.projection

    def encode_batch(self, images: Sequence[Image.Image], boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
        """`encode` for each image and its boxes (the common interface with `BackboneRegionEncoder`)."""
        return [self.encode(image, image_boxes) for image, image_boxes in zip(images, boxes)]


def roi_align(
    feature_map: torch.Tensor,
    boxes: torch.Tensor,
    output_size: int = ROI_OUTPUT_SIZE,
    sampling_ratio: int = ROI_SAMPLING_RATIO,
) -> torch.Tensor:
    """RoIAlign of boxes on one feature map: (C, h, w) and (R, 4) -> (R, C, output_size, output_size).

    `boxes` are x1, y1, x2, y2 in continuous feature-map coordinates (cell (i, j) covers [j, j + 1) x [i, i + 1)), as
    torchvision's `roi_align(..., aligned=True)`. Each bin is the mean of sampling_ratio x sampling_ratio bilinear
    samples at evenly spaced points inside it; a sample within half a cell of the map's edge takes the edge value.
    """
    # RoIAlign: He et al., "Mask R-CNN", ICCV 2017, sec. 3 (bilinear samples at regular points of each bin, no rounding).
    channels, height, width = feature_map.shape
    num_boxes, points = boxes.shape[0], output_size * sampling_ratio
    boxes = boxes.to(feature_map)
    # along each side, sample k sits at (k + 0.5) / points of the box: bin k // sampling_ratio, evenly spaced in it
    fractions = (torch.arange(points, dtype=feature_map.dtype, device=feature_map.device) + 0.5) / points
    xs = boxes[:, 0:1] + fractions * (boxes[:, 2:3] - boxes[:, 0:1])  # (R, points)
    ys = boxes[:, 1:2] + fractions * (boxes[:, 3:4] - boxes[:, 1:2])
    # with align_corners=False, grid values -1 and +1 are the outer edges of the map: continuous 0 and width / height
    grid_x = (2 * xs / width - 1)[:, None, :].expand(num_boxes, points, points)
    grid_y = (2 * ys / height - 1)[:, :, None].expand(num_boxes, points, points)
    grid = torch.stack([grid_x, grid_y], dim=-1).reshape(1, num_boxes * points, points, 2)
    samples = F.grid_sample(feature_map[None], grid, mode="bilinear", padding_mode="border", align_corners=False)
    samples = samples.reshape(channels, num_boxes, output_size, sampling_ratio, output_size, sampling_ratio)
    return samples.mean(dim=(3, 5)).permute(1, 0, 2, 3)


class BackboneRegionEncoder:
    """Region features pooled with `roi_align` from the feature map (`last_hidden_state`: (B, C, h, w), or the last
    h x w patch tokens of a ViT-like model) of a transformers vision model (a Hub id or local folder, safetensors;
    CLIP-like dual encoders keep their `vision_model`); `feature_dim` is the channel count C.

    Each image is resized *here* to the processor's output size, aspect ratio not kept, and the processor only
    rescales and normalises: a centre crop would cut boxes off, and so every box maps exactly onto map cells.
    """

    def __init__(
        self,
        name_or_path: str | os.PathLike,
        device: str | torch.device = "cpu",
        output_size: int = ROI_OUTPUT_SIZE,
        sampling_ratio: int = ROI_SAMPLING_RATIO,
    ) -> None:
        self.name_or_path = str(name_or_path)
        self.device = _torch_device(device)
        self.output_size, self.sampling_ratio = output_size, sampling_ratio
        self.processor, self.model = _load_backbone(self.name_or_path)
        self.model.to(self.device).eval()
        self.input_size = _processor_output_size(self.processor, self.name_or_path)
        vision_config = getattr(self.model.config, "vision_config", self.model.config)
        self.patch_size = _pair(getattr(vision_config, "patch_size", None))
        self._forward_kwargs = _forward_kwargs(self.model, vision_config, self.input_size)
        probe, _ = self.feature_maps([Image.new("RGB", (self.input_size[1], self.input_size[0]))])
        self.feature_dim = int(probe.shape[1])

    def pixel_values(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """The model input (B, 3, H, W) for `images`: resized here to `input_size`, then rescaled and normalised."""
        height, width = self.input_size
        resample = getattr(self.processor, "resample", None)
        resample = Image.Resampling.BILINEAR if resample is None else Image.Resampling(int(resample))
        resized = [image.convert("RGB").resize((width, height), resample) for image in images]
        inputs = self.processor(images=resized, do_resize=False, do_center_crop=False, return_tensors="pt")
        return inputs["pixel_values"]

    @torch.inference_mode()
    def feature_maps(self, images: Sequence[Image.Image]) -> tuple[torch.Tensor, tuple[float, float]]:
        """Feature maps (B, C, h, w) of `images` and the map cells per resized-image pixel, (along y, along x)."""
        pixel_values = self.pixel_values(images).to(self.device, torch.float32)
        outputs = self.model(pixel_values=pixel_values, **self._forward_kwargs)
        hidden = getattr(outputs, "last_hidden_state", None)
        if not isinstance(hidden, torch.Tensor):
            raise ValueError(
                f"`encoder` {self.name_or_path!r}: {type(self.model).__name__} returns no `last_hidden_state`; "
                "expected a vision model whose output has a spatial map or patch tokens."
            )
        return _spatial_feature_map(hidden, self.input_size, self.patch_size, self.name_or_path)

    @torch.inference_mode()
    def encode_batch(self, images: Sequence[Image.Image], boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Features (R_i, feature_dim) float32 of each image's pixel boxes (R_i, 4), one forward pass for the batch."""
        maps, (cells_y, cells_x) = self.feature_maps(images)
        height, width = self.input_size
        features = []
        for image, image_boxes, feature_map in zip(images, boxes, maps):
            # image pixels -> resized pixels -> feature-map cells
            scale_x, scale_y = width / image.width * cells_x, height / image.height * cells_y
            map_boxes = np.asarray(image_boxes, dtype=np.float64) * [scale_x, scale_y, scale_x, scale_y]
            map_boxes = torch.as_tensor(map_boxes, dtype=torch.float32, device=feature_map.device)
            pooled = roi_align(feature_map.float(), map_boxes, self.output_size, self.sampling_ratio).mean(dim=(2, 3))
            features.append(pooled.cpu().numpy())
        return features

    def encode(self, image: Image.Image, boxes: np.ndarray) -> np.ndarray:
        """Features (R, feature_dim) float32 of the pixel boxes (R, 4) x1, y1, x2, y2 of one image."""
        return self.encode_batch([image], [boxes])[0]


def check_model_reference(argument: str, name_or_path: str) -> None:
    """A FileNotFoundError naming `argument` when `name_or_path` is meant as a local folder (absolute, starting with
    "." or "~", or more than one "/" deep) and is none; a Hub id ("org/name") is left to `from_pretrained`."""
    path = Path(name_or_path).expanduser()
    looks_local = path.is_absolute() or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1
    if looks_local and not path.is_dir():
        raise FileNotFoundError(
            f"`{argument}` {name_or_path!r} is not a folder: expected a local model folder or a Hub model id."
        )


def _load_vision_model(
    argument: str, name_or_path: str, auto_class: type, not_found: str, not_loadable: str
) -> tuple[object, torch.nn.Module]:
    """The image processor and the `auto_class` model of `name_or_path` (float32, safetensors); a FileNotFoundError
    (`not_found`) when it cannot be found, a ValueError (`not_loadable`) when it is not such a model."""
    check_model_reference(argument, name_or_path)
    try:
        processor = AutoImageProcessor.from_pretrained(name_or_path)
        model = auto_class.from_pretrained(name_or_path, use_safetensors=True, dtype=torch.float32)
    except OSError as error:  # no such Hub id, or not cached offline
        raise FileNotFoundError(f"`{argument}` {name_or_path!r} is {not_found} ({error}).") from error
    except (ValueError, KeyError) as error:
        raise ValueError(f"`{argument}` {name_or_path!r} is {not_loadable}: {error}") from error
    return processor, model


def _load_backbone(name_or_path: str) -> tuple[object, torch.nn.Module]:
    processor, model = _load_vision_model(
        "encoder", name_or_path, AutoModel,
        f"neither {PIXEL_ENCODER!r} nor a local folder or Hub id of a transformers vision model that can be loaded",
        f"neither {PIXEL_ENCODER!r} nor a loadable transformers vision model: expected a local folder or Hub id with "
        "safetensors weights and a preprocessor_config.json",
    )  # fmt: skip
    vision_model = getattr(model, "vision_model", None)  # CLIP / SigLIP-style dual encoders: keep the image tower
    if isinstance(vision_model, torch.nn.Module):
        if not hasattr(vision_model, "config"):
            vision_model.config = model.config.vision_config
        model = vision_model
    return processor, model


def _processor_output_size(processor: object, name_or_path: str) -> tuple[int, int]:
    """(height, width) the processor's own pipeline would produce: the crop when it centre-crops, else the resize."""
    sizes = [getattr(processor, "crop_size", None)] if getattr(processor, "do_center_crop", False) else []
    sizes.append(getattr(processor, "size", None))
    for size in sizes:
        height_width = _pair(size)
        if height_width is not None and max(height_width) > MAX_BACKBONE_INPUT_SIDE:  # every image is resized to it
            raise SizeLimitError(
                f"`encoder` {name_or_path!r}: its image processor's output size {height_width} exceeds "
                f"MAX_BACKBONE_INPUT_SIDE = {MAX_BACKBONE_INPUT_SIDE} (hf_vlalign.utils.size_limits)."
            )
        if height_width is not None:
            return height_width
    raise ValueError(
        f"`encoder` {name_or_path!r}: its image processor {type(processor).__name__} has no fixed output size "
        f"(size={getattr(processor, 'size', None)!r}); expected a size with height and width, or a shortest_edge."
    )


def _pair(size: object) -> tuple[int, int] | None:
    """(height, width) of a positive int, a pair, or a size with height and width (or a shortest_edge); else None."""
    if isinstance(size, int):
        return (size, size) if size > 0 else None
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    field = size.get if isinstance(size, Mapping) else lambda name: getattr(size, name, None)
    if field("height") and field("width"):
        return int(field("height")), int(field("width"))
    if field("shortest_edge"):
        return int(field("shortest_edge")), int(field("shortest_edge"))
    return None


def _forward_kwargs(model: torch.nn.Module, config: object, input_size: tuple[int, int]) -> dict:
    """`interpolate_pos_encoding=True` for ViT-like models fed another size than the one they were trained at."""
    native = _pair(getattr(config, "image_size", None))
    accepts = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    return {"interpolate_pos_encoding": True} if accepts and native is not None and native != input_size else {}


def _spatial_feature_map(
    hidden: torch.Tensor, input_size: tuple[int, int], patch_size: tuple[int, int] | None, name_or_path: str
) -> tuple[torch.Tensor, tuple[float, float]]:
    """(B, C, h, w) from a CNN's map or a ViT's tokens, and the map cells per input pixel (along y, along x)."""
    height, width = input_size
    if hidden.ndim == 4:
        return hidden, (hidden.shape[2] / height, hidden.shape[3] / width)
    grid = _token_grid(hidden.shape[1], input_size, patch_size) if hidden.ndim == 3 else None
    if grid is None:
        raise ValueError(
            f"`encoder` {name_or_path!r}: cannot read a spatial map from `last_hidden_state` of shape "
            f"{tuple(hidden.shape)} for {height}x{width} inputs; expected (B, C, h, w) or (B, [prefix +] h * w, C)."
        )
    rows, cols, cells_per_pixel = grid
    batch, length, channels = hidden.shape
    patches = hidden[:, length - rows * cols :]  # drops the leading CLS / distillation / register tokens
    return patches.transpose(1, 2).reshape(batch, channels, rows, cols), cells_per_pixel


def _token_grid(
    length: int, input_size: tuple[int, int], patch_size: tuple[int, int] | None
) -> tuple[int, int, tuple[float, float]] | None:
    """(rows, cols, cells per pixel) of the patch tokens among `length` tokens, or None."""
    height, width = input_size
    if patch_size is not None:
        rows, cols = height // patch_size[0], width // patch_size[1]
        if rows * cols > 0 and 0 <= length - rows * cols <= MAX_PREFIX_TOKENS:
            return rows, cols, (1 / patch_size[0], 1 / patch_size[1])
    # no patch size, or tokens merged after patching (Swin): the first token grid with the image's aspect ratio
    for prefix in range(min(length, MAX_PREFIX_TOKENS + 1)):
        count = length - prefix
        rows = max(1, round(math.sqrt(count * height / width)))
        if count % rows == 0 and math.isclose(height / rows, width / (count // rows), rel_tol=0.25):
            return rows, count // rows, (rows / height, (count // rows) / width)
    return None


class RegionDetector:
    """Region boxes in pixels from a transformers object detection model (DETR, YOLOS, RT-DETR, ...): those scoring at
    least `threshold`, clipped to the image, without the empty ones, the `max_regions` best. An image where nothing
    scores `threshold` gets the whole-image box (a warning counts them).
    """

    def __init__(
        self,
        name_or_path: str | os.PathLike,
        threshold: float = DEFAULT_DETECTOR_THRESHOLD,
        max_regions: int = DEFAULT_MAX_REGIONS,
        device: str | torch.device = "cpu",
    ) -> None:
        self.name_or_path = str(name_or_path)
        self.threshold, self.max_regions = float(threshold), int(max_regions)
        self.device = _torch_device(device)
        self.processor, self.model = _load_detector(self.name_or_path)
        self.model.to(self.device).eval()

    @torch.inference_mode()
    def detect(self, images: Sequence[Image.Image]) -> list[np.ndarray]:
        """Boxes (R_i, 4) float32, x1, y1, x2, y2 in pixels of each image, best first (1 <= R_i <= max_regions)."""
        images = [image.convert("RGB") for image in images]
        inputs = self.processor(images=images, return_tensors="pt").to(self.device)
        outputs = self.model(**inputs)
        sizes = [(image.height, image.width) for image in images]
        results = self.processor.post_process_object_detection(outputs, threshold=self.threshold, target_sizes=sizes)
        boxes, empty = [], 0
        for image, result in zip(images, results):
            found = self._kept(result, image.width, image.height)
            if not len(found):
                empty += 1
                found = np.array([[0.0, 0.0, image.width, image.height]], dtype=np.float32)
            boxes.append(found)
        if empty:
            logger.warning(
                "`detector` %r found no box scoring >= %s in %d of %d images: they get the whole-image box.",
                self.name_or_path, self.threshold, empty, len(images),
            )  # fmt: skip
        return boxes

    def _kept(self, result: Mapping, width: int, height: int) -> np.ndarray:
        scores = result["scores"].detach().cpu().numpy()
        boxes = result["boxes"].detach().cpu().numpy().astype(np.float32).reshape(-1, 4)
        boxes = np.clip(boxes, 0.0, [width, height, width, height]).astype(np.float32)
        valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        boxes, scores = boxes[valid], scores[valid]
        return boxes[np.argsort(-scores, kind="stable")[: self.max_regions]]


def check_region_options(grid_size: object, feature_dim: object, threshold: object, max_regions: object) -> None:
    """The options `extract_region_features` and `RegionFeatureExtractor` share: `grid_size` and `feature_dim` None
    or within their size limits, `detector_threshold` in [0, 1], `max_regions` in [1, MAX_REGIONS_PER_IMAGE]."""
    if grid_size is not None:
        check_size("grid_size", grid_size, MAX_GRID_SIZE, limit_name="MAX_GRID_SIZE")
    if feature_dim is not None:  # the pixel encoder's projection is allocated in proportion to it
        check_size("feature_dim", feature_dim, MAX_FEATURE_DIM, limit_name="MAX_FEATURE_DIM")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"`detector_threshold` must be a score in [0, 1], got {threshold!r}.")
    check_size("max_regions", max_regions, MAX_REGIONS_PER_IMAGE, limit_name="MAX_REGIONS_PER_IMAGE")


def _load_detector(name_or_path: str) -> tuple[object, torch.nn.Module]:
    processor, model = _load_vision_model(
        "detector", name_or_path, AutoModelForObjectDetection,
        "not a local folder or Hub id of a transformers object detection model that can be loaded",
        "not a transformers object detection model (AutoModelForObjectDetection with an image processor that has "
        "`post_process_object_detection`)",
    )  # fmt: skip
    if not hasattr(processor, "post_process_object_detection"):
        raise ValueError(
            f"`detector` {name_or_path!r}: its image processor {type(processor).__name__} has no "
            "`post_process_object_detection`."
        )
    return processor, model


@dataclass(frozen=True)
class _ImageEntry:
    path: Path
    image_id: str
    height: int
    width: int


def list_images(images: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The image files of a folder (every .jpg / .jpeg / .png in it, sorted by name) or of a list of paths (as given).

    Other files of a folder (and its sub-folders) are left out with a warning that counts them.
    """
    if isinstance(images, (str, os.PathLike)):
        folder = Path(images)
        if not folder.is_dir():
            raise ValueError(f"`images` must be a folder or a list of image paths, got {str(folder)!r}, which is not a folder.")
        files = sorted(path for path in folder.iterdir() if path.is_file())
        paths = [path for path in files if path.suffix.lower() in IMAGE_SUFFIXES]
        if len(paths) < len(files):
            logger.warning(
                "Leaving out %d file(s) of %s that are not %s.", len(files) - len(paths), folder, "/".join(IMAGE_SUFFIXES)
            )
        if not paths:
            raise ValueError(f"`images` folder {folder} holds no {'/'.join(IMAGE_SUFFIXES)} file.")
        return paths
    if isinstance(images, Sequence) and images and all(isinstance(path, (str, os.PathLike)) for path in images):
        paths = [Path(path) for path in images]
        missing = [path for path in paths if not path.is_file()]
        if missing:
            raise ValueError(f"`images`: {missing[0]} is not a file ({len(missing)} of the {len(paths)} paths are not).")
        return paths
    raise ValueError(f"`images` must be a folder or a non-empty list of image paths, got {short_repr(images)}.")


def read_image_entries(paths: Sequence[Path], argument: str = "images") -> list[_ImageEntry]:
    """Id (file stem) and size of every image, reading headers only; ids must be unique. Errors name `argument`."""
    entries, path_of = [], {}
    for path in paths:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except (OSError, Image.DecompressionBombError) as error:  # UnidentifiedImageError is an OSError
            raise ValueError(f"`{argument}`: {path} is not a readable image ({error}).") from None
        if path.stem in path_of:
            raise ValueError(f"`{argument}`: {path_of[path.stem]} and {path} share the image id {path.stem!r} (the file stem).")
        path_of[path.stem] = path
        entries.append(_ImageEntry(path=path, image_id=path.stem, height=height, width=width))
    return entries


def load_rgb_image(path: str | os.PathLike, argument: str = "images") -> Image.Image:
    """The image file at `path` as RGB, as stored (EXIF orientation not applied); errors name `argument`."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"`{argument}`: {str(path)!r} is not a file.")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"`{argument}`: {path} is not a readable image ({error}).") from None


def grid_boxes(height: int, width: int, grid_size: int) -> np.ndarray:
    """Boxes (g * g, 4) float32 in pixels of a g x g grid covering a height x width image, row by row."""
    check_size("grid_size", grid_size, MAX_GRID_SIZE, limit_name="MAX_GRID_SIZE")
    xs, ys = np.linspace(0.0, width, grid_size + 1), np.linspace(0.0, height, grid_size + 1)
    cells = [[xs[col], ys[row], xs[col + 1], ys[row + 1]] for row in range(grid_size) for col in range(grid_size)]
    return np.array(cells, dtype=np.float32)


def read_boxes_file(path: str | os.PathLike) -> dict:
    """The JSON object `{"<image file name or id>": [[x1, y1, x2, y2], ...]}` of a boxes file (checked later)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`boxes` file {path} does not exist.")
    data = read_json_file(path)  # a FileFormatError names the file and the line
    if not isinstance(data, dict):
        raise ValueError(
            f'`boxes` file {path}: expected a JSON object {{"<image file name or id>": [[x1, y1, x2, y2], ...]}}, '
            f"got a JSON {type(data).__name__}."
        )
    return data


def _boxes_per_image(boxes: Mapping, source: str, entries: Sequence[_ImageEntry]) -> dict[str, np.ndarray]:
    """Checked (R, 4) float32 pixel boxes per image id; every key must name one image, every image have boxes."""
    entry_of = {entry.path.name: entry for entry in entries} | {entry.image_id: entry for entry in entries}
    key_of: dict[str, str] = {}
    boxes_of: dict[str, np.ndarray] = {}
    for key, values in boxes.items():
        entry = entry_of.get(key) if isinstance(key, str) else None
        if entry is None:
            raise ValueError(
                f"{source}: image {key!r} is not among the {len(entries)} images; expected a file name such as "
                f"{entries[0].path.name!r} or an id (file stem) such as {entries[0].image_id!r}."
            )
        if entry.image_id in key_of:
            raise ValueError(f"{source}: image {entry.path.name!r} has boxes under two keys, {key_of[entry.image_id]!r} and {key!r}.")
        key_of[entry.image_id] = key
        boxes_of[entry.image_id] = check_image_boxes(values, f"{source}: image {key!r}", entry.width, entry.height)
    missing = [entry.path.name for entry in entries if entry.image_id not in boxes_of]
    if missing:
        listed = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ValueError(
            f"{source}: no boxes for {len(missing)} of the {len(entries)} images ({listed}); give every image at least "
            "one box, or pass only the images that have boxes."
        )
    return boxes_of


def check_image_boxes(values: object, where: str, width: int, height: int) -> np.ndarray:
    """Pixel boxes [[x1, y1, x2, y2], ...] of a width x height image as (R, 4) float32: non-empty, at most
    MAX_REGIONS_PER_IMAGE, each inside the image with x1 < x2 and y1 < y2; else a ValueError starting with `where`."""
    if isinstance(values, Sized) and len(values) > MAX_REGIONS_PER_IMAGE:  # before converting a huge list
        raise SizeLimitError(
            f"{where}: {len(values)} boxes, more than MAX_REGIONS_PER_IMAGE = {MAX_REGIONS_PER_IMAGE} per image."
        )
    try:
        array = np.asarray(values)
    except ValueError:  # ragged lists
        array = np.asarray([], dtype=object)
    if array.dtype.kind not in "iuf" or array.ndim != 2 or array.shape[1] != 4 or len(array) == 0:
        raise ValueError(f"{where}: expected a non-empty list of [x1, y1, x2, y2] boxes in pixels, got {short_repr(values)}.")
    for index, (x1, y1, x2, y2) in enumerate(array.astype(np.float64)):
        if not (np.isfinite([x1, y1, x2, y2]).all() and 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
            raise ValueError(
                f"{where}: box {index} = {array[index].tolist()} must satisfy 0 <= x1 < x2 <= width and "
                f"0 <= y1 < y2 <= height, with the image's width={width}, height={height} (pixels)."
            )
    return array.astype(np.float32)


def build_region_encoder(
    encoder: str | os.PathLike = PIXEL_ENCODER,
    *,
    feature_dim: int | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> CropEncoder | BackboneRegionEncoder:
    """`"pixel"` -> `CropEncoder(feature_dim or 256, seed)`; anything else -> `BackboneRegionEncoder(encoder, device)`.

    A backbone's `feature_dim` is its channel count: `feature_dim` may be None or that number (features are never
    projected). The pixel encoder runs on the CPU whatever `device` says; `seed` only seeds its projection.
    """
    if str(encoder) == PIXEL_ENCODER:
        return CropEncoder(DEFAULT_PIXEL_FEATURE_DIM if feature_dim is None else feature_dim, seed)
    backbone = BackboneRegionEncoder(encoder, device=device)
    if feature_dim is not None and feature_dim != backbone.feature_dim:
        raise ValueError(
            f"`feature_dim` is {feature_dim}, but the backbone {str(encoder)!r} gives {backbone.feature_dim} channels; "
            f"pass feature_dim=None or {backbone.feature_dim} (backbone features are not projected)."
        )
    return backbone


def extract_region_features(
    images: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    boxes: str | os.PathLike | Mapping | None = None,
    grid_size: int | None = None,
    detector: str | os.PathLike | None = None,
    detector_threshold: float = DEFAULT_DETECTOR_THRESHOLD,
    max_regions: int = DEFAULT_MAX_REGIONS,
    include_whole_image: bool = False,
    encoder: str | os.PathLike = PIXEL_ENCODER,
    feature_dim: int | None = None,
    device: str = "cpu",
    batch_size: int = 8,
    overwrite: bool = False,
    seed: int = 0,
) -> RegionFeatureStore:
    """Region features of one's own images, written as a `RegionFeatureStore` at `out_dir` and returned opened.

    Args:
        images: a folder (every .jpg / .jpeg / .png in it, sorted by name) or a list of image paths; the image id
            is the file stem, so stems must be unique.
        out_dir: the store directory, neither an input nor inside or around one; an existing store is replaced only
            with `overwrite=True`.
        boxes, grid_size, detector: exactly one: a JSON file or dict `{"<image file name or id>": [[x1, y1, x2, y2],
            ...]}` in pixels (every image needs a box, every key must name an image), a g x g grid, or a transformers
            object detection model (`RegionDetector`, with `detector_threshold` and `max_regions`).
        include_whole_image: put the whole-image box first.
        encoder: `"pixel"` (`CropEncoder`, offline; a local folder named "pixel" is "./pixel") or a Hub id / local
            folder of a transformers vision model (`BackboneRegionEncoder`).
        feature_dim: the pixel encoder's dimension (default 256); for a backbone None or its channel count.
        device, batch_size, seed: where the backbone runs, images per forward pass, the pixel encoder's seed.

    Images and boxes are all checked before any feature is computed. `hf_vlalign.processing.RegionFeatureExtractor`
    takes the same keyword arguments (but `boxes`, given per call) and computes the same features.
    """
    if sum(source is not None for source in (boxes, grid_size, detector)) != 1:
        raise ValueError(
            "Pass exactly one of `boxes` (a JSON file or dict of pixel boxes per image), `grid_size` (g for a g x g "
            f"grid) and `detector` (an object detection model), got boxes={short_repr(boxes)}, grid_size={grid_size!r} "
            f"and detector={short_repr(detector)}."
        )
    check_region_options(grid_size, feature_dim, detector_threshold, max_regions)
    check_size("batch_size", batch_size, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE")
    if not isinstance(encoder, (str, os.PathLike)) or not str(encoder):
        raise ValueError(f"`encoder` must be {PIXEL_ENCODER!r}, a Hub model id or a local model folder, got {short_repr(encoder)}.")
    _torch_device(device)
    out_dir = Path(out_dir)
    inputs = {"boxes": boxes if isinstance(boxes, (str, os.PathLike)) else None, "encoder": encoder, "detector": detector}
    if isinstance(images, (str, os.PathLike)):
        inputs["images"] = images
    else:
        inputs |= {f"images[{index}]": path for index, path in enumerate(images) if isinstance(path, (str, os.PathLike))}
    refuse_output_overlapping_inputs(out_dir, inputs, output_argument="out_dir")
    check_store_output(out_dir, "out_dir", overwrite=overwrite)

    entries = read_image_entries(list_images(images))
    region_detector = None
    if grid_size is not None:
        boxes_of = {entry.image_id: grid_boxes(entry.height, entry.width, grid_size) for entry in entries}
        box_source = f"grid_size={grid_size}"
    elif boxes is not None:
        if isinstance(boxes, (str, os.PathLike)):
            boxes_of = _boxes_per_image(read_boxes_file(boxes), f"`boxes` file {boxes}", entries)
        elif isinstance(boxes, Mapping):
            boxes_of = _boxes_per_image(boxes, "`boxes`", entries)
        else:
            raise ValueError(f"`boxes` must be a JSON file path or a dict of pixel boxes per image, got {short_repr(boxes)}.")
        box_source = f"boxes={str(boxes)!r}" if isinstance(boxes, (str, os.PathLike)) else "boxes=<dict>"
    else:
        region_detector = RegionDetector(detector, detector_threshold, max_regions, device=device)
        boxes_of = None  # found a batch of images at a time
        box_source = f"detector={str(detector)!r}, detector_threshold={detector_threshold}, max_regions={max_regions}"

    region_encoder = build_region_encoder(encoder, feature_dim=feature_dim, device=device, seed=seed)
    source = (
        f"extract_region_features(encoder={str(encoder)!r}, feature_dim={region_encoder.feature_dim}, {box_source}, "
        f"include_whole_image={include_whole_image})"
    )
    records = _records(entries, boxes_of, region_detector, include_whole_image, region_encoder, batch_size)
    records = tqdm(records, desc=f"Extracting {len(entries)} images", unit=" images", total=len(entries))
    return RegionFeatureStore._write(records, out_dir, source=source, overwrite=overwrite)


def with_whole_image(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """The whole-image box (0, 0, width, height) followed by `boxes` (R, 4) pixels: (R + 1, 4) float32."""
    whole = np.array([[0.0, 0.0, width, height]], dtype=np.float32)
    return np.concatenate([whole, np.asarray(boxes, dtype=np.float32)])


def _records(
    entries: Sequence[_ImageEntry],
    boxes_of: dict[str, np.ndarray] | None,
    detector: RegionDetector | None,
    include_whole_image: bool,
    encoder: CropEncoder | BackboneRegionEncoder,
    batch_size: int,
) -> Iterator[dict]:
    """The store records of the images; boxes (from `boxes_of`, else the detector) and features are computed a batch of
    images at a time."""
    for start in range(0, len(entries), batch_size):
        batch = entries[start : start + batch_size]
        images = [load_rgb_image(entry.path) for entry in batch]
        found = detector.detect(images) if boxes_of is None else [boxes_of[entry.image_id] for entry in batch]
        if include_whole_image:
            found = [with_whole_image(boxes, entry.width, entry.height) for boxes, entry in zip(found, batch)]
        features = encoder.encode_batch(images, found)
        for entry, image_boxes, image_features in zip(batch, found, features):
            record = {"image_id": entry.image_id, "image_size": (entry.height, entry.width), "boxes": image_boxes}
            yield normalise_record(record | {"features": image_features})


def _torch_device(device: str | torch.device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"`device` must be a torch device such as 'cpu' or 'cuda:0', got {device!r} ({error}).") from None
