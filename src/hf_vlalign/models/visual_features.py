"""Standardisation of region features before the visual projection, shared by every family (docs/datasets.md).

With `config.visual_feature_normalization="standardize"` (the default) features become `(x - mean) / std` per
dimension (LeCun et al., "Efficient BackProp", 1998, sec. 4.3), the statistics persistent buffers set once from the
training images' features (by the trainers, or `model.set_visual_feature_statistics(...)`; the identity until set);
"none" passes them on as they are (the converted VisualBERT and LXMERT checkpoints).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import initialization as init
from transformers.utils import logging

logger = logging.get_logger(__name__)

VISUAL_FEATURE_NORMALIZATIONS = ("none", "standardize")
NORMALIZATION_FIELD = "visual_feature_normalization"


class VisualFeatureNormalization(nn.Module):
    """`(visual_feats - mean) / std` per feature dimension, the statistics being persistent buffers (see the module
    docstring). `num_regions` counts the regions they were computed from (0: not set, the identity)."""

    def __init__(self, visual_feat_dim: int):
        super().__init__()
        self.mean = nn.Buffer(torch.zeros(visual_feat_dim))
        self.std = nn.Buffer(torch.ones(visual_feat_dim))
        self.num_regions = nn.Buffer(torch.zeros((), dtype=torch.long))
        self._known_to_be_set = False  # a host-side note, so that a training step never reads `num_regions`

    @property
    def is_set(self) -> bool:
        return bool(self.num_regions > 0)

    @torch.no_grad()
    def set_statistics(self, mean: torch.Tensor, std: torch.Tensor, num_regions: int) -> None:
        dim = self.mean.shape[0]
        mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1)
        std = torch.as_tensor(std, dtype=torch.float32).reshape(-1)
        if mean.shape != (dim,) or std.shape != (dim,):
            raise ValueError(
                f"`mean` and `std` must have shape ({dim},) (config.visual_feat_dim), got {tuple(mean.shape)} and "
                f"{tuple(std.shape)}."
            )
        if not bool(torch.isfinite(mean).all()):
            raise ValueError("`mean` must be finite, got NaN or inf values.")
        if not bool(torch.isfinite(std).all()) or not bool((std > 0).all()):
            raise ValueError(
                f"`std` must be finite and > 0 in every dimension (a constant dimension takes std 1), got min "
                f"{float(std.min()):.4g}."
            )
        if not isinstance(num_regions, int) or isinstance(num_regions, bool) or num_regions < 1:
            raise ValueError(f"`num_regions` (how many regions the statistics come from) must be an int >= 1, got {num_regions!r}.")
        self.mean.copy_(mean.to(self.mean.device, self.mean.dtype))
        self.std.copy_(std.to(self.std.device, self.std.dtype))
        self.num_regions.fill_(num_regions)
        self._known_to_be_set = True

    def train(self, mode: bool = True) -> VisualFeatureNormalization:
        """Warns, when training starts, about statistics that were never set. Reading `num_regions` is a host read:
        done here rather than in `forward`, and only until the statistics are known to be set (at once when
        `set_statistics` set them, at the first `train()` when a checkpoint loaded them)."""
        if mode and not self._known_to_be_set:
            self._known_to_be_set = self.is_set
            if not self._known_to_be_set:
                logger.warning_once(
                    "visual_feature_normalization='standardize' but the region-feature statistics were never set, so "
                    "features reach the projection unchanged; train with the library's trainers (they fit them) or "
                    "call `model.set_visual_feature_statistics(*hf_vlalign.data.region_feature_statistics(store, "
                    "train_rows))`."
                )
        return super().train(mode)

    def forward(self, visual_feats: torch.Tensor) -> torch.Tensor:
        return (visual_feats - self.mean.to(visual_feats.dtype)) / self.std.to(visual_feats.dtype)


def make_feature_normalization(config) -> VisualFeatureNormalization | None:
    """The family's normaliser, or None for `visual_feature_normalization="none"` (no buffers)."""
    if getattr(config, NORMALIZATION_FIELD) == "none":
        return None
    return VisualFeatureNormalization(config.visual_feat_dim)


class VisualFeatureStatisticsMixin:
    """`set_visual_feature_statistics` / `visual_feature_statistics` for every model of a family."""

    def _feature_normalizations(self) -> list[VisualFeatureNormalization]:
        return [module for module in self.modules() if isinstance(module, VisualFeatureNormalization)]

    def set_visual_feature_statistics(self, mean: torch.Tensor, std: torch.Tensor, num_regions: int) -> None:
        """Sets the per-dimension mean and standard deviation of the region features (e.g. from
        `hf_vlalign.data.region_feature_statistics(store, train_image_ids)`) that the model standardises its
        `visual_feats` with. Raises when the config has `visual_feature_normalization="none"`."""
        modules = self._feature_normalizations()
        if not modules:
            raise ValueError(
                f"this model has `{NORMALIZATION_FIELD}`={getattr(self.config, NORMALIZATION_FIELD)!r}: it reads features "
                "as they are; build it with visual_feature_normalization='standardize' to set statistics."
            )
        for module in modules:
            module.set_statistics(mean, std, num_regions)

    def visual_feature_statistics(self) -> dict[str, Any] | None:
        """{"mean", "std", "num_regions"} of the model's feature standardisation (None with "none")."""
        modules = self._feature_normalizations()
        if not modules:
            return None
        module = modules[0]
        return {"mean": module.mean.detach().clone(), "std": module.std.detach().clone(), "num_regions": int(module.num_regions)}


def init_feature_normalization(module: nn.Module) -> None:
    """`_init_weights` of the families: the normaliser starts as the identity (buffers loaded from a checkpoint are
    left alone: `transformers.initialization` skips them)."""
    if isinstance(module, VisualFeatureNormalization):
        init.zeros_(module.mean)
        init.ones_(module.std)
        init.zeros_(module.num_regions)


__all__ = [
    "VISUAL_FEATURE_NORMALIZATIONS",
    "VisualFeatureNormalization",
    "VisualFeatureStatisticsMixin",
    "init_feature_normalization",
    "make_feature_normalization",
]
