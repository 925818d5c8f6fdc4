"""Published formats, region-feature stores, dataset builders and collators.

The synthetic grounded scenes moved to `hf_vlalign.synthetic`. Their four names that this package exported
(`_SYNTHETIC_NAMES`) are still found here, imported from there on first access: `import hf_vlalign.data` does not
import `hf_vlalign.synthetic`. So are the old modules `data.synthetic`, `data.synthetic_questions` and
`data.synthetic_tasks` (compatibility paths of `hf_vlalign.synthetic.scenes`, `.questions` and `.tasks`).
"""

from ..utils.lazy_exports import lazy_exports
from .builders import (
    BUILDERS,
    ID_LABELS,
    VALIDATION_SPLITS,
    VGPData,
    attach_region_features,
    build_dataset,
    build_vgp_dataset,
    load_vgp_data,
    resolve_split,
)
from .collators import (
    PROBE_KEYS,
    CaptioningCollator,
    GroundedCaptionCollator,
    ImagePairCollator,
    PhraseGroundingCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    RegionTextCollator,
    SingleStreamPretrainingCollator,
    TruncationStats,
    TwoStreamPretrainingCollator,
    VGPCollator,
    drop_overlong_rows,
    group_captions_by_image,
)
from .feature_statistics import region_feature_statistics
from .feature_store import FEATURE_FORMATS, RegionFeatureStore, convert_features, iter_feature_records
from .region_extraction import extract_region_features

# re-exported from hf_vlalign.synthetic on first access (see the module docstring)
_SYNTHETIC_NAMES = (
    "SyntheticSceneConfig",
    "SyntheticVGPPaths",
    "generate_synthetic_vgp",
    "load_or_generate_synthetic_vgp",
)
_COMPATIBILITY_MODULES = ("synthetic", "synthetic_questions", "synthetic_tasks")

__getattr__, __dir__ = lazy_exports(
    __name__,
    names={
        **{name: ("hf_vlalign.synthetic.scenes", name) for name in _SYNTHETIC_NAMES},
        **{name: (f"{__name__}.{name}", None) for name in _COMPATIBILITY_MODULES},
    },
)

__all__ = [
    "BUILDERS",
    "FEATURE_FORMATS",
    "ID_LABELS",
    "PROBE_KEYS",
    "VALIDATION_SPLITS",
    "CaptioningCollator",
    "GroundedCaptionCollator",
    "ImagePairCollator",
    "PhraseGroundingCollator",
    "QuestionAnsweringCollator",
    "ReferringExpressionCollator",
    "RegionFeatureStore",
    "RegionTextCollator",
    "SingleStreamPretrainingCollator",
    "SyntheticSceneConfig",
    "SyntheticVGPPaths",
    "TruncationStats",
    "TwoStreamPretrainingCollator",
    "VGPCollator",
    "VGPData",
    "attach_region_features",
    "build_dataset",
    "build_vgp_dataset",
    "convert_features",
    "drop_overlong_rows",
    "extract_region_features",
    "generate_synthetic_vgp",
    "group_captions_by_image",
    "iter_feature_records",
    "load_or_generate_synthetic_vgp",
    "load_vgp_data",
    "region_feature_statistics",
    "resolve_split",
]
