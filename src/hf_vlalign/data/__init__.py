"""Published formats, region-feature stores, dataset builders and collators.

The synthetic grounded scenes are `hf_vlalign.synthetic`; `import hf_vlalign.data` does not import it (its builders of
the synthetic data import it when they run).
"""

from .builders import (
    BUILDERS,
    ID_LABELS,
    USER_TASKS,
    VALIDATION_SPLITS,
    UserData,
    UserDataError,
    VGPData,
    attach_region_features,
    build_dataset,
    build_user_dataset,
    build_vgp_dataset,
    load_user_data,
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
    "TruncationStats",
    "TwoStreamPretrainingCollator",
    "VGPCollator",
    "USER_TASKS",
    "UserData",
    "UserDataError",
    "VGPData",
    "attach_region_features",
    "build_dataset",
    "build_user_dataset",
    "build_vgp_dataset",
    "convert_features",
    "drop_overlong_rows",
    "extract_region_features",
    "group_captions_by_image",
    "iter_feature_records",
    "load_user_data",
    "load_vgp_data",
    "region_feature_statistics",
    "resolve_split",
]
