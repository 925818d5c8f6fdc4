"""Published formats, dataset builders, collators and the synthetic grounded scenes (the embedded default data)."""

from .builders import ID_LABELS, VGPData, build_vgp_dataset, load_vgp_data
from .collators import PROBE_KEYS, RegionFeatureLookup, VGPCollator
from .synthetic import SyntheticSceneConfig, SyntheticVGPPaths, generate_synthetic_vgp, load_or_generate_synthetic_vgp

__all__ = [
    "ID_LABELS",
    "PROBE_KEYS",
    "RegionFeatureLookup",
    "SyntheticSceneConfig",
    "SyntheticVGPPaths",
    "VGPCollator",
    "VGPData",
    "build_vgp_dataset",
    "generate_synthetic_vgp",
    "load_or_generate_synthetic_vgp",
    "load_vgp_data",
]
