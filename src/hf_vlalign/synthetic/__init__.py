"""Synthetic grounded scenes, the embedded default data: generated images of shapes with their captions, paraphrase
pairs, questions, statements and referring expressions, written in the published formats of the real data sets
(`scenes.py`: images, captions, VGP pairs, regions; `questions.py`: GQA; `tasks.py`: NLVR2 and RefCOCO+).
"""

from .questions import ANSWER_LIST_FILE, ANSWER_VOCAB_FILE, SyntheticQuestionWriter, questions_file, scene_graphs_file
from .scenes import (
    FORMAT_VERSION,
    SyntheticSceneConfig,
    SyntheticVGPPaths,
    distractor_statistics,
    generate_synthetic_scenes,
    load_or_generate_synthetic_vgp,
    world_statistics,
)
from .shapes import (
    COLOUR_NAMES,
    COLOUR_WORDS,
    SHAPE_NAMES,
    SHAPE_WORDS,
    SIZE_NAMES,
    SIZE_WORDS,
    Shape,
    identifying_attribute_sets,
    phrase_wordings,
    shape_relation,
)
from .tasks import NLVR2_SPLITS, REFCOCO_SPLITS, SyntheticNLVR2Writer, SyntheticRefCOCOWriter, pair_feature_records

__all__ = [
    "ANSWER_LIST_FILE",
    "ANSWER_VOCAB_FILE",
    "COLOUR_NAMES",
    "COLOUR_WORDS",
    "FORMAT_VERSION",
    "NLVR2_SPLITS",
    "REFCOCO_SPLITS",
    "SHAPE_NAMES",
    "SHAPE_WORDS",
    "SIZE_NAMES",
    "SIZE_WORDS",
    "Shape",
    "SyntheticNLVR2Writer",
    "SyntheticQuestionWriter",
    "SyntheticRefCOCOWriter",
    "SyntheticSceneConfig",
    "SyntheticVGPPaths",
    "distractor_statistics",
    "generate_synthetic_scenes",
    "identifying_attribute_sets",
    "load_or_generate_synthetic_vgp",
    "pair_feature_records",
    "phrase_wordings",
    "questions_file",
    "scene_graphs_file",
    "shape_relation",
    "world_statistics",
]
