"""Old path of `hf_vlalign.synthetic.tasks` (NLVR2 and RefCOCO+ files of the synthetic scenes), kept for compatibility.

Import from `hf_vlalign.synthetic.tasks`; every name this module had is still found here, imported from there on first
access (this module imports nothing at import time).
"""

from ..utils.lazy_exports import lazy_exports

_SHAPES = "hf_vlalign.synthetic.shapes"

__getattr__, __dir__ = lazy_exports(
    __name__,
    default="hf_vlalign.synthetic.tasks",
    names={
        "_Shape": (_SHAPES, "Shape"),
        "_relation": (_SHAPES, "shape_relation"),
        "_valid_attribute_sets": (_SHAPES, "identifying_attribute_sets"),
        "_wordings": (_SHAPES, "phrase_wordings"),
    },
)

# the names a star import takes (the old module's public names), imported on first access like the others
_STAR_NAMES = (
    "NLVR2_SPLITS",
    "REFCOCO_SPLITS",
    "STATEMENT_TEMPLATES",
    "SyntheticNLVR2Writer",
    "SyntheticRefCOCOWriter",
    "category_id",
    "pair_feature_records",
    "pair_image_id",
    "referring_expressions",
    "relation_truth",
    "sample_set_sentences",
)
__all__ = list(_STAR_NAMES)
