"""Old path of `hf_vlalign.synthetic.questions` (GQA questions about the synthetic scenes), kept for compatibility.

Import from `hf_vlalign.synthetic.questions`; every name this module had is still found here, imported from there on
first access (this module imports nothing at import time).
"""

from ..utils.lazy_exports import lazy_exports

_SHAPES = "hf_vlalign.synthetic.shapes"

__getattr__, __dir__ = lazy_exports(
    __name__,
    default="hf_vlalign.synthetic.questions",
    names={
        "_Shape": (_SHAPES, "Shape"),
        "_relation": (_SHAPES, "shape_relation"),
        "_valid_attribute_sets": (_SHAPES, "identifying_attribute_sets"),
    },
)

# the names a star import takes (the old module's public names), imported on first access like the others
_STAR_NAMES = (
    "ANSWER_VOCAB_FILE",
    "TEMPLATES",
    "SyntheticQuestionWriter",
    "answer_vocab",
    "questions_file",
    "sample_questions",
    "scene_graph",
    "scene_graphs_file",
)
__all__ = list(_STAR_NAMES)
