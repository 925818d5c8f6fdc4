"""Old path of `hf_vlalign.synthetic.scenes` (the synthetic grounded scenes), kept for compatibility.

The generators moved to their own package, `hf_vlalign.synthetic`; import from there. Every name this module had is
still found here, imported from the new modules on first access (this module imports nothing at import time):
the scene generator's names from `hf_vlalign.synthetic.scenes`, and the shared shape helpers under their old private
names (`_Shape`, `_relation`, `_valid_attribute_sets`, `_wordings`) from `hf_vlalign.synthetic.shapes`, where they are
public (`Shape`, `shape_relation`, `identifying_attribute_sets`, `phrase_wordings`).
"""

from ..utils.lazy_exports import lazy_exports

_SHAPES = "hf_vlalign.synthetic.shapes"

__getattr__, __dir__ = lazy_exports(
    __name__,
    default="hf_vlalign.synthetic.scenes",
    names={
        "_Shape": (_SHAPES, "Shape"),
        "_relation": (_SHAPES, "shape_relation"),
        "_valid_attribute_sets": (_SHAPES, "identifying_attribute_sets"),
        "_wordings": (_SHAPES, "phrase_wordings"),
    },
)

# the names a star import takes (the old module's public API), imported on first access like the others
_STAR_NAMES = (
    "COLOUR_HUES",
    "COLOUR_NAMES",
    "COLOUR_WORDS",
    "FIRST_IMAGE_ID",
    "FORMAT_VERSION",
    "SHAPE_NAMES",
    "SHAPE_WORDS",
    "SIZE_NAMES",
    "SIZE_WORDS",
    "SyntheticSceneConfig",
    "SyntheticVGPPaths",
    "generate_synthetic_vgp",
    "load_or_generate_synthetic_vgp",
)
__all__ = list(_STAR_NAMES)
