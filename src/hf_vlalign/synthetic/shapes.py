"""The shapes of a synthetic scene and the words that name them, shared by every writer of the package.

`scenes.py` draws and describes the shapes; `questions.py` (GQA) and `tasks.py` (NLVR2, RefCOCO+) ask about them. All
three read the vocabularies, the `Shape` record, the spatial relation between two shapes and the noun phrases that
single a shape out from this module, which imports nothing of theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

# Detector vocabularies: `object_ids` index SHAPE_NAMES, `attr_ids` index COLOUR_NAMES.
SHAPE_NAMES = ("circle", "square", "triangle", "diamond", "star", "cross")
COLOUR_NAMES = ("red", "orange", "yellow", "green", "blue", "purple")
SIZE_NAMES = ("small", "large")
# world v2: object kinds co-occur in thematic groups (the ground-truth clusters of Ilinykh's Analysis I)
THEMATIC_GROUPS = {"theme_a": ("circle", "diamond"), "theme_b": ("square", "cross"), "theme_c": ("triangle", "star")}
THEME_OF_KIND = {kind: theme for theme, kinds in THEMATIC_GROUPS.items() for kind in kinds}

SHAPE_WORDS = {"circle": ("circle", "disc"), "square": ("square", "box")}
COLOUR_WORDS = {"red": ("red", "crimson"), "purple": ("purple", "violet")}
SIZE_WORDS = {"small": ("small", "little"), "large": ("large", "big")}


@dataclass
class Shape:
    """One shape of a scene; it is one Flickr30k Entities entity."""

    kind: str  # a SHAPE_NAMES entry
    colour: str  # a COLOUR_NAMES entry
    size: str  # a SIZE_NAMES entry
    box: tuple[int, int, int, int]  # 0-based pixels, x2 / y2 exclusive
    phrase_id: str

    @property
    def centre(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2, (y1 + y2) / 2


def shape_relation(first: Shape, second: Shape) -> str:
    """Where `first` is relative to `second`, along the axis where their centres are furthest apart."""
    dx = second.centre[0] - first.centre[0]
    dy = second.centre[1] - first.centre[1]
    if abs(dx) >= abs(dy):
        return "to the left of" if dx > 0 else "to the right of"
    return "above" if dy > 0 else "below"


# world v2's spatial relations, each with its axis test in `clear_relations`
SPATIAL_RELATIONS = ("to the left of", "to the right of", "above", "below")
OPPOSITE_RELATION = {"to the left of": "to the right of", "to the right of": "to the left of", "above": "below", "below": "above"}


def clear_relations(first: Shape, second: Shape, margin: float) -> list[str]:
    """The SPATIAL_RELATIONS that hold from `first` to `second` beyond doubt: along the relation's axis the boxes are
    apart by at least `margin` pixels (e.g. "to the left of": `first` ends `margin` or more before `second` starts)."""
    a, b = first.box, second.box
    holds = (a[2] + margin <= b[0], b[2] + margin <= a[0], a[3] + margin <= b[1], b[3] + margin <= a[1])
    return [name for name, true in zip(SPATIAL_RELATIONS, holds, strict=True) if true]


def identifying_attribute_sets(index: int, shapes: list[Shape]) -> list[frozenset[str]]:
    """Attribute sets (subsets of {"colour", "size"}) that, with the shape word, single out shape `index` among the
    image's shapes."""
    target = shapes[index]
    valid = []
    for attributes in (frozenset(), frozenset({"colour"}), frozenset({"size"}), frozenset({"colour", "size"})):
        clashes = [
            other
            for other in shapes
            if other is not target
            and other.kind == target.kind
            and all(getattr(other, attribute) == getattr(target, attribute) for attribute in attributes)
        ]
        if not clashes:
            valid.append(attributes)
    return valid


def generic_attribute_sets(index: int, shapes: list[Shape]) -> list[tuple[str, ...]]:
    """Which of size / colour / both single out shape `index` among *all* shapes (for a generic noun)."""
    target = shapes[index]
    return [
        names
        for names in (("colour",), ("size",), ("size", "colour"))
        if not any(
            other is not target and all(getattr(other, name) == getattr(target, name) for name in names)
            for other in shapes
        )
    ]


def pick(options: Sequence, rng: np.random.Generator):
    """One of `options` (one `rng.integers` draw)."""
    return options[int(rng.integers(len(options)))]


def named_words(
    kind: str | None, colour: str | None, size: str | None, rng: np.random.Generator, generic_nouns: tuple[str, ...]
) -> list[str]:
    """Words naming the given attributes (None: not named) and the shape, synonyms drawn in that order; one of
    `generic_nouns` when `kind` is None."""
    words = []
    if size is not None:
        words.append(pick(SIZE_WORDS[size], rng))
    if colour is not None:
        words.append(pick(COLOUR_WORDS.get(colour, (colour,)), rng))
    words.append(pick(SHAPE_WORDS.get(kind, (kind,)) if kind is not None else generic_nouns, rng))
    return words


def phrase_wordings(shape: Shape, attributes: frozenset[str]) -> list[tuple[str, ...]]:
    """Every choice of synonyms for a noun phrase naming `attributes` of the shape: tuples of content words."""
    size_words = SIZE_WORDS[shape.size] if "size" in attributes else ("",)
    colour_words = COLOUR_WORDS.get(shape.colour, (shape.colour,)) if "colour" in attributes else ("",)
    shape_words = SHAPE_WORDS.get(shape.kind, (shape.kind,))
    return [tuple(word for word in words if word) for words in product(size_words, colour_words, shape_words)]


__all__ = [
    "COLOUR_NAMES",
    "COLOUR_WORDS",
    "SHAPE_NAMES",
    "SHAPE_WORDS",
    "SIZE_NAMES",
    "SIZE_WORDS",
    "SPATIAL_RELATIONS",
    "THEMATIC_GROUPS",
    "THEME_OF_KIND",
    "Shape",
    "clear_relations",
    "generic_attribute_sets",
    "identifying_attribute_sets",
    "named_words",
    "phrase_wordings",
    "pick",
    "shape_relation",
]
