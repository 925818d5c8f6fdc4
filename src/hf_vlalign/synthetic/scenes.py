"""Synthetic grounded scenes: the embedded default data of hf_vlalign.

Every image is a small canvas with a few coloured shapes (`shapes.py`). `generate_synthetic_scenes` writes the published
formats the real pipelines read: `flickr30k_entities/`, `vgp/{train,val}.csv`, `features/features.tsv` (the "detector":
noisy regions with `CropEncoder` features), `images/`, `gqa/` (`questions.py`), `nlvr2/` and `refcoco+/` (`tasks.py`).

Caption grammar (every claim is true in the image; every shape is mentioned by at least two captions):

    caption     := NP is LOCATION . | NP sits LOCATION . | There is NP LOCATION .          (one shape)
                 | NP is RELATION NP . | NP sits RELATION NP .                              (two shapes)
                 | NP is between NP and NP . | NP , NP and NP .                             (three shapes)
    NP          := DET [SIZE] [COLOUR] SHAPE          e.g. "a large crimson box", "the disc"

A paraphrase pair's type compares the attribute sets each phrase names (`_typology`); hard negatives are phrases of
two shapes of one image with the same category or colour (`_is_hard_negative`).

World v2 (`SyntheticSceneConfig(world="v2")`, docs/synthetic_world.md) draws a scene's kinds from one or two
`THEMATIC_GROUPS`, relates two or three shapes in every caption by a spatial relation true with a margin, gives each
shape one region and keeps all regions apart (IoU <= V2_MAX_REGION_IOU), and encodes appearance only.
"""

from __future__ import annotations

import colorsys
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations, permutations
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from tqdm.auto import tqdm

from ..alignment.boxes import box_iou
from ..data.formats.flickr30k_entities import (
    EntityAnnotation,
    EntityPhrase,
    EntitySentence,
    write_annotation,
    write_sentences,
)
from ..data.formats.lxmert_tsv import iter_lxmert_tsv_records, write_lxmert_tsv
from ..data.formats.vgp import TYPOLOGY_LABELS, VGPPair, write_vgp_csv
from ..data.region_extraction import CropEncoder
from ..utils.output_paths import refuse_foreign_folder
from ..utils.size_limits import MAX_SYNTHETIC_IMAGES, check_size
from .questions import SyntheticQuestionWriter, scene_graphs_file
from .shapes import (
    COLOUR_NAMES,
    OPPOSITE_RELATION,
    SHAPE_NAMES,
    SHAPE_WORDS,
    SIZE_NAMES,
    THEME_OF_KIND,
    THEMATIC_GROUPS,
    Shape,
    clear_relations,
    identifying_attribute_sets,
    phrase_wordings,
    pick,
    shape_relation,
)
from .tasks import SyntheticNLVR2Writer, SyntheticRefCOCOWriter, attribute_agreement, pair_feature_records

FORMAT_VERSION = 4  # in the manifest and the cache digest: a new version regenerates cached scenes
FIRST_IMAGE_ID = 100000

# Hues sit at the centres of CropEncoder's 30-degree hue bins.
COLOUR_HUES = {"red": 0, "orange": 30, "yellow": 60, "green": 120, "blue": 240, "purple": 270}
# Side of a shape's box as a fraction of the canvas, per size.
SIZE_RANGES = {"small": (0.11, 0.16), "large": (0.22, 0.30)}

NUM_CAPTIONS = 5
MAX_MENTIONS_PER_CAPTION = 3
DETERMINERS = ("a", "the")
LOCATIONS = ("on the left", "on the right", "at the top", "at the bottom", "in the middle")
TYPE_LABELS = {name: label for label, name in TYPOLOGY_LABELS.items()}

# Region ("detector") noise: IoU bounds, label noise and confidence ranges per region kind.
TRUE_REGION_MIN_IOU = 0.6  # kept above 0.5 so that a one-pixel box convention shift never breaks a hit
DISTRACTOR_MAX_IOU = 0.4
SECOND_TRUE_REGION_PROB = 0.25
CONFIDENCE_RANGES = {"true": (0.35, 0.98), "shifted": (0.3, 0.9), "straddle": (0.2, 0.8), "background": (0.05, 0.6)}
CLASS_NOISE = {"true": 0.1, "shifted": 0.3}  # probability of a random class id

# A scene with distractors holds its target, a shape of the same kind in another colour and one of the same colour
# of another kind.
MIN_SHAPES_WITH_DISTRACTORS = 3
WORLDS = ("v1", "v2")
VGP_BALANCE_STREAM = 4  # world v2: the split's VGP rows are balanced per text from a stream of their own
_KIND_WORDS = frozenset(word for kind in SHAPE_NAMES for word in (kind, *SHAPE_WORDS.get(kind, ())))

# World v2 (docs/synthetic_world.md).
V2_ONE_THEME_PROB = 0.5  # a scene's kinds come from one theme, else from two
V2_RELATION_MARGIN = 0.05  # a relation holds when the boxes are apart along its axis by this share of the canvas
# a v2 phrase may fit several shapes of its image, so that VGP types (what the phrases denote) need the image
V2_UNDERSPECIFIED_PROB = 0.25
ALL_ATTRIBUTE_SETS = (frozenset(), frozenset({"colour"}), frozenset({"size"}), frozenset({"colour", "size"}))
V2_MAX_REGION_IOU = 0.3  # no two regions of an image overlap more (no near-duplicate detections)
# "X has Y <phrase>": Y is <relation> X
RELATION_OF_PRONOUN = {"to its left": "to the left of", "to its right": "to the right of", "above it": "above", "below it": "below"}


@dataclass
class SyntheticSceneConfig:
    """Size and randomness of the synthetic data set; the defaults generate in seconds on two CPU cores."""

    num_train_images: int = 800
    num_val_images: int = 150
    image_size: int = 128  # square canvas, pixels
    min_shapes: int = 2
    max_shapes: int = 6
    num_regions: int = 12  # regions per image: jittered true boxes (IoU >= 0.5 with their shape) + distractors
    feature_dim: int = 256
    seed: int = 0
    distractors: bool = False  # each image's first shape gets a same-kind and a same-colour distractor
    world: str = "v1"  # one of WORLDS: "v1" the first world (kept, reproducible); "v2" docs/synthetic_world.md

    def __post_init__(self) -> None:
        if self.world not in WORLDS:
            raise ValueError(f"`world` must be one of {WORLDS}, got {self.world!r}.")
        for name, value in asdict(self).items():
            if name == "world":
                continue
            expected, named = (bool, "a bool") if name == "distractors" else (int, "an int")
            if type(value) is not expected:
                raise ValueError(f"`{name}` must be {named}, got {type(value).__name__} {value!r}.")
        lower_bounds = {"num_train_images": 1, "num_val_images": 1, "image_size": 64, "min_shapes": 1, "feature_dim": 1, "seed": 0}
        for name, low in lower_bounds.items():
            if getattr(self, name) < low:
                raise ValueError(f"`{name}` must be >= {low}, got {getattr(self, name)}.")
        for name in ("num_train_images", "num_val_images"):  # each image is rendered and written: bounded
            check_size(name, getattr(self, name), MAX_SYNTHETIC_IMAGES, limit_name="MAX_SYNTHETIC_IMAGES")
        if self.min_shapes > self.max_shapes:
            raise ValueError(f"`min_shapes` must be <= `max_shapes` ({self.max_shapes}), got {self.min_shapes}.")
        if self.distractors and self.max_shapes < MIN_SHAPES_WITH_DISTRACTORS:
            raise ValueError(
                f"`max_shapes` must be >= {MIN_SHAPES_WITH_DISTRACTORS} with `distractors=True` (the target, a "
                f"same-kind and a same-colour shape), got {self.max_shapes}."
            )
        max_shapes_limit = NUM_CAPTIONS * MAX_MENTIONS_PER_CAPTION // 2
        if self.max_shapes > max_shapes_limit:
            raise ValueError(
                f"`max_shapes` must be <= {max_shapes_limit} (every shape is mentioned in two of {NUM_CAPTIONS} "
                f"captions of at most {MAX_MENTIONS_PER_CAPTION} mentions), got {self.max_shapes}."
            )
        if self.num_regions < self.max_shapes:
            raise ValueError(
                f"`num_regions` must be >= `max_shapes` ({self.max_shapes}) so every shape gets a region, "
                f"got {self.num_regions}."
            )


@dataclass
class SyntheticVGPPaths:
    """Where the generated files are."""

    root: Path
    flickr30k_entities: Path  # Sentences/, Annotations/, train.txt, val.txt
    vgp_csv: dict[str, Path]  # {"train": ..., "val": ...}, "identification" layout
    features_tsv: Path  # LXMERT TSV, all images of both splits
    images: Path  # <image_id>.png
    gqa_dir: Path  # {split}_{balanced,all}_questions.json, {split}_sceneGraphs.json, trainval_ans2label.json
    nlvr2_dir: Path  # train.json, dev.json (JSON lines)
    nlvr2_features_tsv: Path  # LXMERT TSV of the NLVR2 pair images ("<split>-<set>-<pair>-img0/1")
    refcoco_dir: Path  # refs(unc).p, instances.json

    @classmethod
    def from_root(cls, root: str | Path) -> SyntheticVGPPaths:
        """The layout `generate_synthetic_scenes` writes under `root`."""
        root = Path(root)
        return cls(
            root=root,
            flickr30k_entities=root / "flickr30k_entities",
            vgp_csv={split: root / "vgp" / f"{split}.csv" for split in ("train", "val")},
            features_tsv=root / "features" / "features.tsv",
            images=root / "images",
            gqa_dir=root / "gqa",
            nlvr2_dir=root / "nlvr2",
            nlvr2_features_tsv=root / "features" / "nlvr2_features.tsv",
            refcoco_dir=root / "refcoco+",
        )


@dataclass
class _Mention:
    """One noun phrase of a caption."""

    caption: int
    text: str  # as written in the caption
    shape: int  # index into the image's shapes
    attributes: frozenset[str]  # which of {"size", "colour"} the phrase names
    words: tuple[str, ...]  # content words (no determiner), lower case


def _sample_attributes(
    num_shapes: int,
    rng: np.random.Generator,
    first: Sequence[tuple[str, str, str]] = (),
    kinds: Sequence[str] = SHAPE_NAMES,
) -> list[tuple[str, str, str]]:
    """Distinct (shape, colour, size) triples, so that a full noun phrase always identifies its shape; the distinct
    triples `first` come first and the others are drawn at random, their shape among `kinds`."""
    triples: list[tuple[str, str, str]] = list(first)
    while len(triples) < num_shapes:
        triple = (str(rng.choice(kinds)), str(rng.choice(COLOUR_NAMES)), str(rng.choice(SIZE_NAMES)))
        if triple not in triples:
            triples.append(triple)
    return triples


def _sample_distractor_attributes(
    num_shapes: int, rng: np.random.Generator, kinds: Sequence[str] = SHAPE_NAMES
) -> list[tuple[str, str, str]]:
    """Distinct triples whose first (the target) has a same-kind / other-colour and a same-colour / other-kind shape
    next to it; sizes are random and the other shapes are drawn as `_sample_attributes` draws them, among `kinds`."""
    kind, colour, size = str(rng.choice(kinds)), str(rng.choice(COLOUR_NAMES)), str(rng.choice(SIZE_NAMES))
    other_colour = str(rng.choice([name for name in COLOUR_NAMES if name != colour]))
    other_kind = str(rng.choice([name for name in kinds if name != kind]))
    # distinct by construction: the second differs from the target by colour, the third from both by kind
    same_kind = (kind, other_colour, str(rng.choice(SIZE_NAMES)))
    same_colour = (other_kind, colour, str(rng.choice(SIZE_NAMES)))
    return _sample_attributes(num_shapes, rng, [(kind, colour, size), same_kind, same_colour], kinds)


def _place_boxes(sides: list[int], image_size: int, rng: np.random.Generator, gap: int = 2) -> list[tuple] | None:
    """Non-overlapping square boxes of the given sides, or None when random placement fails."""
    boxes: list[tuple[int, int, int, int]] = []
    for side in sides:
        for _ in range(200):
            x1, y1 = (int(v) for v in rng.integers(1, image_size - side, size=2))
            box = (x1, y1, x1 + side, y1 + side)
            if all(
                box[0] >= other[2] + gap
                or other[0] >= box[2] + gap
                or box[1] >= other[3] + gap
                or other[1] >= box[3] + gap
                for other in boxes
            ):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def _scene_kinds(rng: np.random.Generator) -> tuple[str, ...]:
    """World v2: the kinds of one scene, those of one theme or of two (`THEMATIC_GROUPS`), so that kinds co-occur
    within their theme far above chance."""
    num_themes = 1 if rng.random() < V2_ONE_THEME_PROB else 2
    themes = rng.choice(len(THEMATIC_GROUPS), size=num_themes, replace=False).tolist()
    return tuple(kind for index, group in enumerate(THEMATIC_GROUPS.values()) if index in themes for kind in group)


def _sample_scene(config: SyntheticSceneConfig, rng: np.random.Generator, first_phrase_id: int) -> list[Shape]:
    low = max(MIN_SHAPES_WITH_DISTRACTORS, config.min_shapes) if config.distractors else config.min_shapes
    num_shapes = int(rng.integers(low, config.max_shapes + 1))
    sample_attributes = _sample_distractor_attributes if config.distractors else _sample_attributes
    v2 = config.world == "v2"
    # v2: every two shapes are apart by the relation margin along some axis, so some spatial relation holds clearly
    gap = _relation_margin(config.image_size) if v2 else 2
    for _ in range(100):
        triples = sample_attributes(num_shapes, rng, kinds=_scene_kinds(rng)) if v2 else sample_attributes(num_shapes, rng)
        sides = [int(rng.uniform(*SIZE_RANGES[size]) * config.image_size) for _, _, size in triples]
        boxes = _place_boxes(sides, config.image_size, rng, gap)
        if boxes is not None:
            return [
                Shape(kind, colour, size, box, str(first_phrase_id + index))
                for index, ((kind, colour, size), box) in enumerate(zip(triples, boxes, strict=True))
            ]
    raise RuntimeError(f"Could not place {num_shapes} shapes on a {config.image_size}px canvas after 100 attempts.")


def _unit_polygon(kind: str) -> np.ndarray:
    """Outline of a polygonal shape as (N, 2) points whose bounding box is exactly [0, 1] x [0, 1]."""
    if kind == "triangle":
        return np.array([[0.5, 0.0], [1.0, 1.0], [0.0, 1.0]])
    if kind == "diamond":
        return np.array([[0.5, 0.0], [1.0, 0.5], [0.5, 1.0], [0.0, 0.5]])
    if kind == "cross":
        a, b = 1 / 3, 2 / 3
        return np.array(
            [[a, 0], [b, 0], [b, a], [1, a], [1, b], [b, b], [b, 1], [a, 1], [a, b], [0, b], [0, a], [a, a]]
        )
    angles = np.pi / 2 + np.arange(10) * np.pi / 5  # a star
    radii = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
    points = np.stack([radii * np.cos(angles), -radii * np.sin(angles)], axis=1)
    return (points - points.min(0)) / (points.max(0) - points.min(0))


def _render_scene(shapes: list[Shape], image_size: int, rng: np.random.Generator) -> Image.Image:
    """Plain or lightly textured grey background, each shape filling its box."""
    background = rng.integers(200, 236) + rng.integers(-6, 7, size=3)
    pixels = np.broadcast_to(background, (image_size, image_size, 3)).astype(np.float64)
    if rng.random() < 0.5:
        pixels = pixels + rng.normal(0.0, 4.0, size=pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for shape in shapes:
        hue = (COLOUR_HUES[shape.colour] + rng.uniform(-6, 6)) % 360
        rgb = colorsys.hsv_to_rgb(hue / 360, rng.uniform(0.65, 0.9), rng.uniform(0.75, 0.95))
        fill = tuple(int(round(255 * channel)) for channel in rgb)
        x1, y1, x2, y2 = shape.box
        inclusive = (x1, y1, x2 - 1, y2 - 1)  # PIL draws both end pixels
        if shape.kind == "circle":
            draw.ellipse(inclusive, fill=fill)
        elif shape.kind == "square":
            draw.rectangle(inclusive, fill=fill)
        else:
            scale = np.array([x2 - 1 - x1, y2 - 1 - y1])
            points = _unit_polygon(shape.kind) * scale + np.array([x1, y1])
            draw.polygon([tuple(point) for point in points.tolist()], fill=fill)
    return image


def _assign_mentions(num_shapes: int, rng: np.random.Generator, min_mentions: int = 1) -> list[list[int]]:
    """Which shapes each caption mentions: `min_mentions`-3 distinct shapes per caption (fewer when the image has
    fewer), every shape in at least two captions.

    Each shape takes the two captions with the most room left (Havel-Hakimi style), which always succeeds when the
    total room covers two mentions per shape; the room left over is filled with random extra mentions.
    """
    room = np.minimum(rng.integers(min_mentions, MAX_MENTIONS_PER_CAPTION + 1, size=NUM_CAPTIONS), num_shapes)
    while room.sum() < 2 * num_shapes:
        room[rng.choice(np.flatnonzero(room < min(MAX_MENTIONS_PER_CAPTION, num_shapes)))] += 1
    captions: list[list[int]] = [[] for _ in range(NUM_CAPTIONS)]
    for shape in rng.permutation(num_shapes).tolist():
        for _ in range(2):
            left = [room[c] - len(captions[c]) if shape not in captions[c] else -1 for c in range(NUM_CAPTIONS)]
            best = np.flatnonzero(np.array(left) == max(left))
            captions[int(rng.choice(best))].append(shape)
    for caption, slots in zip(captions, room.tolist(), strict=True):
        missing = [shape for shape in range(num_shapes) if shape not in caption]
        caption.extend(rng.choice(missing, size=slots - len(caption), replace=False).tolist())
        rng.shuffle(caption)
    return captions


def _location(shape: Shape, image_size: int, rng: np.random.Generator) -> str:
    """A true absolute location of the shape's centre (thirds of the canvas)."""
    cx, cy = shape.centre
    third = image_size / 3
    holds = (
        cx < third,
        cx > 2 * third,
        cy < third,
        cy > 2 * third,
        max(abs(cx - 1.5 * third), abs(cy - 1.5 * third)) <= third / 2,
    )
    candidates = [name for name, true in zip(LOCATIONS, holds, strict=True) if true]
    return str(rng.choice(candidates))  # the five regions cover the canvas


def _is_between(middle: Shape, first: Shape, second: Shape) -> bool:
    return any(
        min(first.centre[axis], second.centre[axis])
        < middle.centre[axis]
        < max(first.centre[axis], second.centre[axis])
        for axis in (0, 1)
    )


def _template(
    mentioned: list[int], shapes: list[Shape], image_size: int, rng: np.random.Generator
) -> tuple[str, list[int]]:
    """A caption template with slots {0}, {1}, {2} and the shapes filling them, in order; every claim is true."""
    if len(mentioned) == 1:
        location = _location(shapes[mentioned[0]], image_size, rng)
        options = ["{0} is " + location + " .", "{0} sits " + location + " .", "There is {0} " + location + " ."]
        return str(rng.choice(options)), mentioned
    if len(mentioned) == 2:
        relation = shape_relation(shapes[mentioned[0]], shapes[mentioned[1]])
        return str(rng.choice(["{0} is " + relation + " {1} .", "{0} sits " + relation + " {1} ."])), mentioned
    between = [list(order) for order in permutations(mentioned) if _is_between(*(shapes[i] for i in order))]
    if between and rng.random() < 0.5:
        return "{0} is between {1} and {2} .", between[int(rng.integers(len(between)))]
    return "{0} , {1} and {2} .", mentioned


def _relation_margin(image_size: int) -> int:
    """World v2: how far apart (pixels) two boxes are along an axis for a spatial relation along it to hold."""
    return max(2, math.ceil(V2_RELATION_MARGIN * image_size))


def _template_v2(
    mentioned: list[int], shapes: list[Shape], image_size: int, rng: np.random.Generator
) -> tuple[str, list[int]]:
    """World v2: the first mentioned shape related to each other one by a spatial relation that holds with a margin,
    through a verb or a preposition (so nsubj / dobj / pobj arcs link the grounded phrases); a one-shape scene gets
    v1's location captions."""
    if len(mentioned) == 1:
        return _template(mentioned, shapes, image_size, rng)
    margin = _relation_margin(image_size)
    subject, *others = mentioned
    relations = [pick(clear_relations(shapes[subject], shapes[other], margin), rng) for other in others]
    if len(others) == 2:
        verb = pick(("is", "sits", "lies"), rng)
        return f"{{0}} {verb} {relations[0]} {{1}} and {relations[1]} {{2}} .", mentioned
    pronoun = {relation: phrase for phrase, relation in RELATION_OF_PRONOUN.items()}[OPPOSITE_RELATION[relations[0]]]
    options = (
        f"{{0}} is {relations[0]} {{1}} .",
        f"{{0}} sits {relations[0]} {{1}} .",
        f"{{0}} has {{1}} {pronoun} .",  # dobj: the object is the second shape, placed relative to the subject
    )
    return pick(options, rng), mentioned


def _noun_phrase(
    index: int, shapes: list[Shape], used: list[tuple[str, ...]], rng: np.random.Generator, identifying: bool = True
) -> tuple[frozenset[str], tuple[str, ...]]:
    """Attribute set and content words for a new mention of shape `index`, avoiding wordings already `used`; with
    `identifying` False any attribute set may be drawn, also one that fits other shapes of the image ("a circle" among
    two circles, grounded to its own shape as Flickr30k Entities grounds "a man" among several)."""
    attribute_sets = identifying_attribute_sets(index, shapes) if identifying else ALL_ATTRIBUTE_SETS
    options = {attributes: phrase_wordings(shapes[index], attributes) for attributes in attribute_sets}
    fresh = {attributes: [w for w in words if w not in used] for attributes, words in options.items()}
    fresh = {attributes: words for attributes, words in fresh.items() if words} or options
    attributes = list(fresh)[int(rng.integers(len(fresh)))]
    words = fresh[attributes][int(rng.integers(len(fresh[attributes])))]
    return attributes, words


def _with_determiner(words: tuple[str, ...], rng: np.random.Generator) -> str:
    determiner = str(rng.choice(DETERMINERS))
    if determiner == "a" and words[0][0] in "aeiou":
        determiner = "an"
    return " ".join((determiner, *words))


def _build_sentence(
    template: str, phrases: list[tuple[str, str]], phrase_types: Sequence[str] = ("other",)
) -> EntitySentence:
    """Fill the template's slots with (text, phrase_id) phrases, capitalising the first word; `phrase_types`: the
    Flickr30k Entities types of the slots' phrases, one per slot, or one for all."""
    words: list[str] = []
    entity_phrases: list[EntityPhrase] = []
    for token in template.split():
        if token.startswith("{"):
            text, phrase_id = phrases[int(token[1:-1])]
            if not words:
                text = text[0].upper() + text[1:]
            char_start = len(" ".join(words)) + (1 if words else 0)
            entity_phrases.append(
                EntityPhrase(phrase_id, [_slot_type(phrase_types, token)], text, len(words), char_start, char_start + len(text))
            )
            words.extend(text.split())
        else:
            words.append(token)
    return EntitySentence(" ".join(words), entity_phrases)


def _slot_type(phrase_types: Sequence[str], token: str) -> str:
    return phrase_types[0] if len(phrase_types) == 1 else phrase_types[int(token[1:-1])]


def _describe_scene(
    shapes: list[Shape], image_size: int, rng: np.random.Generator, world: str = "v1"
) -> tuple[list[EntitySentence], list[_Mention]]:
    """Five captions with phrase markup, and every mention they make. World v2: every caption relates two or three
    shapes (when the image has them), and a phrase's Flickr30k Entities type is its shape's theme."""
    used: list[list[tuple[str, ...]]] = [[] for _ in shapes]
    sentences: list[EntitySentence] = []
    mentions: list[_Mention] = []
    v2 = world == "v2"
    for caption, mentioned in enumerate(_assign_mentions(len(shapes), rng, min_mentions=2 if v2 else 1)):
        template, order = (_template_v2 if v2 else _template)(mentioned, shapes, image_size, rng)
        # A caption mentions a shape at most once, so its noun phrases can be chosen together.
        choices = [
            _noun_phrase(index, shapes, used[index], rng, identifying=not v2 or rng.random() >= V2_UNDERSPECIFIED_PROB)
            for index in order
        ]
        phrases = [
            (_with_determiner(words, rng), shapes[index].phrase_id)
            for index, (_, words) in zip(order, choices, strict=True)
        ]
        phrase_types = [THEME_OF_KIND[shapes[index].kind] for index in order] if v2 else ("other",)
        sentence = _build_sentence(template, phrases, phrase_types)
        sentences.append(sentence)
        for index, (attributes, words), phrase in zip(order, choices, sentence.phrases, strict=True):
            used[index].append(words)
            mentions.append(_Mention(caption, phrase.text, index, attributes, words))
    return sentences, mentions


def _typology(attributes1: frozenset, attributes2: frozenset) -> int:
    """Type of a paraphrase pair from the attribute sets its phrases name (v1; v2 passes denotation sets,
    `_denotation_typology`): the same, a larger, a smaller or neither."""
    if attributes1 == attributes2:
        return TYPE_LABELS["Equivalence"]
    if attributes1 > attributes2:
        return TYPE_LABELS["Entailment1"]
    if attributes1 < attributes2:
        return TYPE_LABELS["Entailment2"]
    return TYPE_LABELS["Independence"]


def _named(mention: _Mention) -> frozenset[str]:
    """Which of {"kind", "colour", "size"} the phrase names: its attributes, and the kind when a shape word is in it."""
    return mention.attributes | ({"kind"} if set(mention.words) & _KIND_WORDS else set())


def _denotation(mention: _Mention, shapes: list[Shape]) -> frozenset[int]:
    """The shapes of the image the phrase can denote: those with every value it names (its own shape's values)."""
    target, named = shapes[mention.shape], _named(mention)
    return frozenset(
        index for index, shape in enumerate(shapes) if all(getattr(shape, a) == getattr(target, a) for a in named)
    )


def _denotation_typology(mention1: _Mention, mention2: _Mention, shapes: list[Shape]) -> int:
    """World v2's type: the denotation sets compared in the image (Equivalence: equal; Entailment1: the first's a
    strict subset, as a phrase naming more attributes denotes fewer shapes; Entailment2: the second's; Independence:
    neither), so one text pair takes different types in different images."""
    return _typology(_denotation(mention2, shapes), _denotation(mention1, shapes))


def _coreference_undecided(first: _Mention, second: _Mention, shapes: list[Shape]) -> bool:
    """Whether the texts leave open if the phrases co-refer: they name no attribute with different values, and each
    names one the other does not ("the red circle" / "the large circle"); nested sets ("the circle" / "the red
    circle") would co-refer whenever the shorter phrase singles its shape out."""
    named1, named2 = _named(first), _named(second)
    shape1, shape2 = shapes[first.shape], shapes[second.shape]
    compatible = all(getattr(shape1, a) == getattr(shape2, a) for a in named1 & named2)
    return compatible and not (named1 <= named2 or named2 <= named1)


def _is_hard_negative(first: _Mention, second: _Mention, shapes: list[Shape]) -> bool:
    """Phrases of two different shapes that name the same shape category or the same colour (maybe by synonyms)."""
    shape1, shape2 = shapes[first.shape], shapes[second.shape]
    same_colour = "colour" in (first.attributes & second.attributes) and shape1.colour == shape2.colour
    return first.shape != second.shape and (shape1.kind == shape2.kind or same_colour)


def _locate(first: str, second: str, mentions: list[_Mention]) -> tuple[_Mention, _Mention] | None:
    """The mentions a builder recovers: phrase1 in the first caption that has it (case-insensitive), phrase2 in the
    first *other* caption that has it; None when no other caption has phrase2."""
    mention1 = next(m for m in mentions if m.text.lower() == first)
    mention2 = next((m for m in mentions if m.text.lower() == second and m.caption != mention1.caption), None)
    return None if mention2 is None else (mention1, mention2)


def _vgp_pair(image_id: str, mention1: _Mention, mention2: _Mention, is_paraphrase: bool, type_label: int) -> VGPPair:
    return VGPPair(
        image_id=image_id,
        phrase1=" ".join(mention1.words),  # the preprocessed phrase: no determiner, lower case
        phrase2=" ".join(mention2.words),
        original_phrase1=mention1.text,
        original_phrase2=mention2.text,
        is_paraphrase=is_paraphrase,
        type_label=type_label,
        original_label=TYPOLOGY_LABELS[type_label] if is_paraphrase else "",
    )


def _located_pairs(mentions: list[_Mention], rng: np.random.Generator) -> list[tuple[_Mention, _Mention]]:
    """Every pair of distinct phrase texts of the image, in random direction, as a builder places it in two captions."""
    texts = sorted({mention.text.lower() for mention in mentions})
    located = []
    for text1, text2 in combinations(texts, 2):
        directions = [(text1, text2), (text2, text1)]
        if rng.random() < 0.5:
            directions.reverse()
        found = next((found for found in (_locate(a, b, mentions) for a, b in directions) if found), None)
        if found is not None:
            located.append(found)
    return located


def _sample_vgp_pairs(
    image_id: str, mentions: list[_Mention], shapes: list[Shape], rng: np.random.Generator, world: str = "v1"
) -> list[VGPPair]:
    """The image's VGP rows, in random order.

    v1: paraphrase pairs (same shape, different wording, different captions) and as many hard negatives, in random
    direction; the image's larger kind is subsampled so that every image is balanced; the type compares the attribute
    sets the phrases name (`_typology`), which the text shows. v2: every pair whose texts leave co-reference open
    (`_coreference_undecided`), a paraphrase when both phrases are mentions of one shape, typed by what the phrases
    denote in the image (`_denotation_typology`); `_balance_vgp_pairs` then balances the split per text.
    """
    positives, negatives = [], []
    for mention1, mention2 in _located_pairs(mentions, rng):
        same = mention1.shape == mention2.shape
        if world == "v2":
            if _coreference_undecided(mention1, mention2, shapes):
                type_label = _denotation_typology(mention1, mention2, shapes) if same else -1
                (positives if same else negatives).append(_vgp_pair(image_id, mention1, mention2, same, type_label))
        elif same:
            type_label = _typology(mention1.attributes, mention2.attributes)
            positives.append(_vgp_pair(image_id, mention1, mention2, True, type_label))
        elif _is_hard_negative(mention1, mention2, shapes):
            negatives.append(_vgp_pair(image_id, mention1, mention2, False, -1))
    if world == "v2":
        pairs = positives + negatives
        return [pairs[i] for i in rng.permutation(len(pairs)).tolist()]
    count = min(len(positives), len(negatives))
    pairs = [kind[i] for kind in (positives, negatives) for i in sorted(rng.permutation(len(kind))[:count].tolist())]
    return [pairs[i] for i in rng.permutation(len(pairs)).tolist()]


def _balance_vgp_pairs(pairs: list[VGPPair], rng: np.random.Generator) -> list[VGPPair]:
    """World v2: as many paraphrases as non-paraphrases for every pattern of what the two texts name
    (`tasks.attribute_agreement`: per attribute, named by one phrase, by both alike, ...), the larger side
    subsampled; order kept. Finer texts (the values named, synonyms) are drawn alike for both labels by the
    generator's symmetry, so they tell nothing either (`evaluation.text_only.text_only_ceilings` measures it)."""
    by_text: dict[tuple, tuple[list[int], list[int]]] = {}
    for index, pair in enumerate(pairs):
        pattern = attribute_agreement(pair.original_phrase1, pair.original_phrase2)
        by_text.setdefault(pattern, ([], []))[int(pair.is_paraphrase)].append(index)
    kept: list[int] = []
    for negatives, positives in by_text.values():
        count = min(len(negatives), len(positives))
        kept.extend(side[i] for side in (negatives, positives) for i in rng.permutation(len(side))[:count].tolist())
    return [pairs[i] for i in sorted(kept)]


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box (4,) with boxes (N, 4), both x1, y1, x2, y2 (`alignment.box_iou` on numpy arrays)."""
    return box_iou(torch.as_tensor(box, dtype=torch.float64)[None], torch.as_tensor(boxes, dtype=torch.float64))[0].numpy()


def _clip_box(box: np.ndarray, image_size: int, min_side: float = 3.0) -> np.ndarray | None:
    """The box clipped to the canvas, or None when less than `min_side` pixels of it are left."""
    box = box.clip(0, image_size)
    return box if box[2] - box[0] >= min_side and box[3] - box[1] >= min_side else None


def _jittered_box(box: np.ndarray, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """A detection of the shape in `box`: every side moved by noise, IoU with the true box >= TRUE_REGION_MIN_IOU."""
    extent = np.tile(box[2:] - box[:2], 2)
    for _ in range(50):
        candidate = _clip_box(box + rng.normal(0.0, 0.1, size=4) * extent, image_size)
        if candidate is not None and _iou(candidate, box[None])[0] >= TRUE_REGION_MIN_IOU:
            return candidate
    return box.copy()


def _distractor_box(
    kind: str, shape_boxes: np.ndarray, image_size: int, rng: np.random.Generator
) -> tuple[np.ndarray | None, int]:
    """A box of IoU < DISTRACTOR_MAX_IOU with every shape (or None) and the shape it was derived from (-1: none).

    "shifted": a shape's box moved by about half its size; "straddle": the box around a shape and its nearest
    neighbour; "background": a random box.
    """
    source = int(rng.integers(len(shape_boxes)))
    box = shape_boxes[source]
    if kind == "shifted":
        extent = box[2:] - box[:2]
        direction = rng.normal(size=2)
        centre = (box[:2] + box[2:]) / 2 + rng.uniform(0.45, 0.9) * extent * direction / np.linalg.norm(direction)
        half = rng.uniform(0.4, 0.65) * extent
        candidate = np.concatenate([centre - half, centre + half])
    elif kind == "straddle":
        centres = (shape_boxes[:, :2] + shape_boxes[:, 2:]) / 2
        distances = np.linalg.norm(centres - centres[source], axis=1)
        distances[source] = np.inf
        pair = shape_boxes[[source, int(distances.argmin())]]
        candidate = np.concatenate([pair[:, :2].min(0), pair[:, 2:].max(0)])
        shrink = rng.uniform(0.0, 0.1, size=4) * np.tile(candidate[2:] - candidate[:2], 2)
        candidate = candidate + shrink * np.array([1, 1, -1, -1])
    else:
        side = rng.uniform(0.08, 0.5, size=2) * image_size
        corner = rng.uniform(0, image_size - side)
        candidate, source = np.concatenate([corner, corner + side]), -1
    candidate = _clip_box(candidate, image_size)
    if candidate is None or _iou(candidate, shape_boxes).max() >= DISTRACTOR_MAX_IOU:
        return None, source
    return candidate, source


def _place_regions_v2(
    shapes: list[Shape], config: SyntheticSceneConfig, rng: np.random.Generator
) -> list[tuple[np.ndarray, int, str]]:
    """World v2: one jittered true region per shape and distractors, no two of them with IoU > V2_MAX_REGION_IOU."""
    shape_boxes = np.array([shape.box for shape in shapes], dtype=np.float64)
    regions: list[tuple[np.ndarray, int, str]] = []

    def apart(box: np.ndarray) -> bool:
        return not regions or _iou(box, np.stack([region for region, _, _ in regions])).max() <= V2_MAX_REGION_IOU

    for index, box in enumerate(shape_boxes):
        jittered = _jittered_box(box, config.image_size, rng)
        # the shapes are apart by the relation margin, so their exact boxes never overlap
        regions.append((jittered if apart(jittered) else box.copy(), index, "true"))
    return _add_distractors(regions, shape_boxes, config, rng, accept=apart)


def _detect(shapes: list[Shape], config: SyntheticSceneConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`num_regions` shuffled regions with noisy classes, colours and confidences, like a detector's output.

    Each shape gets one jittered true region (sometimes two in world v1); distractors fill the rest. True regions are
    usually, not always, more confident than distractors, so the highest-confidence region is an imperfect guess.
    """
    regions = _place_regions_v2(shapes, config, rng) if config.world == "v2" else _place_regions_v1(shapes, config, rng)
    return _region_labels(regions, shapes, rng)


def _place_regions_v1(
    shapes: list[Shape], config: SyntheticSceneConfig, rng: np.random.Generator
) -> list[tuple[np.ndarray, int, str]]:
    """World v1: a jittered true region per shape (sometimes two) and distractors of IoU < DISTRACTOR_MAX_IOU with
    every shape (they may overlap each other and the true regions)."""
    shape_boxes = np.array([shape.box for shape in shapes], dtype=np.float64)
    regions = [(_jittered_box(box, config.image_size, rng), index, "true") for index, box in enumerate(shape_boxes)]
    for index in rng.permutation(len(shapes)).tolist():
        if len(regions) < config.num_regions and rng.random() < SECOND_TRUE_REGION_PROB:
            regions.append((_jittered_box(shape_boxes[index], config.image_size, rng), index, "true"))
    return _add_distractors(regions, shape_boxes, config, rng)


def _add_distractors(
    regions: list[tuple[np.ndarray, int, str]],
    shape_boxes: np.ndarray,
    config: SyntheticSceneConfig,
    rng: np.random.Generator,
    accept: Callable[[np.ndarray], bool] = lambda box: True,
) -> list[tuple[np.ndarray, int, str]]:
    """Fills `regions` up to `num_regions` with distractor regions ("shifted", "straddle", "background") that `accept`
    keeps."""
    kinds = ["shifted", "straddle", "background"] if len(shape_boxes) > 1 else ["shifted", "background"]
    for _ in range(1000 * config.num_regions):
        if len(regions) == config.num_regions:
            break
        kind = str(rng.choice(kinds))
        box, source = _distractor_box(kind, shape_boxes, config.image_size, rng)
        if box is not None and accept(box):
            regions.append((box, source, kind))
    else:
        raise RuntimeError(f"Could not place {config.num_regions} regions on a {config.image_size}px canvas.")
    return regions


def _region_labels(
    regions: list[tuple[np.ndarray, int, str]], shapes: list[Shape], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """The regions (box, source shape or -1, kind) in random order with noisy class, colour and confidences."""
    object_ids, attr_ids, object_conf = [], [], []
    for _, source, kind in regions:
        object_id = SHAPE_NAMES.index(shapes[source].kind) if source >= 0 else int(rng.integers(len(SHAPE_NAMES)))
        if rng.random() < CLASS_NOISE.get(kind, 0.0):
            object_id = int(rng.integers(len(SHAPE_NAMES)))
        object_ids.append(object_id)
        attr_ids.append(
            COLOUR_NAMES.index(shapes[source].colour) if source >= 0 else int(rng.integers(len(COLOUR_NAMES)))
        )
        object_conf.append(rng.uniform(*CONFIDENCE_RANGES[kind]))
    object_conf = np.array(object_conf)
    attr_conf = (object_conf + rng.normal(0.0, 0.1, size=len(regions))).clip(0.01, 0.99)
    order = rng.permutation(len(regions))
    return {
        "boxes": np.stack([box for box, _, _ in regions])[order].astype(np.float32),
        "object_ids": np.array(object_ids, dtype=np.int64)[order],
        "object_conf": object_conf[order].astype(np.float32),
        "attr_ids": np.array(attr_ids, dtype=np.int64)[order],
        "attr_conf": attr_conf[order].astype(np.float32),
    }


def _generate_image(
    image_id: str,
    config: SyntheticSceneConfig,
    rng: np.random.Generator,
    first_phrase_id: int,
    encoder: CropEncoder,
    paths: SyntheticVGPPaths,
) -> tuple[list[Shape], dict, list[VGPPair]]:
    """Writes one image, its captions and annotation; returns its shapes, feature record and VGP pairs."""
    shapes = _sample_scene(config, rng, first_phrase_id)
    image = _render_scene(shapes, config.image_size, rng)
    sentences, mentions = _describe_scene(shapes, config.image_size, rng, config.world)
    regions = _detect(shapes, config, rng)
    pairs = _sample_vgp_pairs(image_id, mentions, shapes, rng, config.world)

    image.save(paths.images / f"{image_id}.png", format="PNG")
    write_sentences(paths.flickr30k_entities / "Sentences" / f"{image_id}.txt", sentences)
    # published boxes are 1-based and inclusive
    boxes = {shape.phrase_id: [[shape.box[0] + 1, shape.box[1] + 1, shape.box[2], shape.box[3]]] for shape in shapes}
    size = config.image_size
    annotation = EntityAnnotation(width=size, height=size, depth=3, boxes=boxes, scene=[], no_box=[])
    write_annotation(paths.flickr30k_entities / "Annotations" / f"{image_id}.xml", annotation)
    record = {
        "image_id": image_id,
        "image_size": (size, size),  # height, width
        **regions,
        "features": encoder.encode(image, regions["boxes"]),
    }
    return shapes, record, pairs


def _manifest(config: SyntheticSceneConfig) -> dict:
    settings = asdict(config)
    for name, unset in (("distractors", False), ("world", "v1")):  # named only when set: v1's digest is unchanged
        if settings[name] == unset:
            del settings[name]
    return {"format_version": FORMAT_VERSION, "config": settings}


def _read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def generate_synthetic_scenes(out_dir: str | Path, config: SyntheticSceneConfig | None = None) -> SyntheticVGPPaths:
    """Generates the synthetic grounded scenes into `out_dir`: the Flickr30k Entities, VGP, GQA, NLVR2 and RefCOCO+
    files, the images and their region features (see the module docstring for the layout).

    Deterministic: the same config writes byte-identical files. `manifest.json` (config and format version) is
    written last. `out_dir` must be new, empty or earlier synthetic scenes (with their `manifest.json`): a folder of
    other files is left alone, since the scenes' files would mix with or replace them.
    """
    config = SyntheticSceneConfig() if config is None else config
    if not isinstance(config, SyntheticSceneConfig):
        raise ValueError(f"`config` must be a SyntheticSceneConfig or None, got {type(config).__name__}.")
    refuse_foreign_folder(
        out_dir, "out_dir", description="a synthetic-scenes folder", is_own=lambda root: _read_manifest(root) is not None
    )
    paths = SyntheticVGPPaths.from_root(out_dir)
    paths.images.mkdir(parents=True, exist_ok=True)  # the other files' writers make their folders

    encoder = CropEncoder(config.feature_dim, config.seed, geometry=config.world == "v1")  # v2: appearance only
    questions = SyntheticQuestionWriter(paths.gqa_dir, config.image_size, config.seed, config.world)
    nlvr2 = SyntheticNLVR2Writer(paths.nlvr2_dir, config.seed)
    refcoco = SyntheticRefCOCOWriter(paths.refcoco_dir, config.image_size, config.seed)
    split_sizes = {"train": config.num_train_images, "val": config.num_val_images}
    records: list[dict] = []
    next_phrase_id = 1
    with tqdm(total=sum(split_sizes.values()), desc="Generating synthetic scenes") as progress:
        for split, size in split_sizes.items():
            image_ids, pairs = [], []
            for _ in range(size):
                index = len(records)
                image_id = str(FIRST_IMAGE_ID + index)
                rng = np.random.default_rng([config.seed, index])
                shapes, record, image_pairs = _generate_image(image_id, config, rng, next_phrase_id, encoder, paths)
                for writer in (questions, nlvr2, refcoco):
                    writer.add(split, index, image_id, shapes)
                next_phrase_id += len(shapes)
                image_ids.append(image_id)
                records.append(record)
                pairs.extend(image_pairs)
                progress.update()
            (paths.flickr30k_entities / f"{split}.txt").write_text("\n".join(image_ids) + "\n")
            if config.world == "v2":
                balance_rng = np.random.default_rng([config.seed, len(records), VGP_BALANCE_STREAM])
                pairs = _balance_vgp_pairs(pairs, balance_rng)
            write_vgp_csv(paths.vgp_csv[split], pairs, layout="identification")
    write_lxmert_tsv(paths.features_tsv, records)
    questions.write()
    write_lxmert_tsv(paths.nlvr2_features_tsv, pair_feature_records(nlvr2.write(), records))
    refcoco.write()
    (paths.root / "manifest.json").write_text(json.dumps(_manifest(config), indent=2, sort_keys=True) + "\n")
    return paths


def load_or_generate_synthetic_vgp(
    cache_dir: str | Path | None = None, config: SyntheticSceneConfig | None = None
) -> SyntheticVGPPaths:
    """The synthetic data set for `config`, generated once and then read from the cache.

    The cache lives in `cache_dir` (default: $HF_VLALIGN_CACHE or ~/.cache/hf_vlalign), in a subfolder named from a
    hash of the config; it is reused only when its manifest matches. Generation happens in a temporary folder that
    is renamed into place, so an interrupted run never leaves a half-written cache.
    """
    config = SyntheticSceneConfig() if config is None else config
    if not isinstance(config, SyntheticSceneConfig):
        raise ValueError(f"`config` must be a SyntheticSceneConfig or None, got {type(config).__name__}.")
    cache_root = Path(cache_dir or os.environ.get("HF_VLALIGN_CACHE") or Path.home() / ".cache" / "hf_vlalign")
    manifest = _manifest(config)
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    root = cache_root / f"synthetic_vgp_{digest}"
    if _read_manifest(root) == manifest:
        return SyntheticVGPPaths.from_root(root)

    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=cache_root))
    try:
        generate_synthetic_scenes(staging, config)
        # a concurrent run that finished first placed a complete copy, which another process may be reading: keep it
        if _read_manifest(root) != manifest:
            if root.exists():  # stale or incomplete: replace it
                shutil.rmtree(root)
            try:
                os.replace(staging, root)
            except OSError:
                if _read_manifest(root) != manifest:
                    raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return SyntheticVGPPaths.from_root(root)


def _kinds_and_colours_of_graphs(paths: SyntheticVGPPaths, split: str) -> list[list[tuple[str, str]]]:
    """(kind, colour) of every shape, per image of `split`, read back from the split's GQA scene graphs."""
    graphs_path = paths.gqa_dir / scene_graphs_file(split)
    if not graphs_path.is_file():
        raise ValueError(f"`scenes` must be generated synthetic scenes with {graphs_path}, which does not exist.")
    graphs = json.loads(graphs_path.read_text(encoding="utf-8"))
    # a scene graph object's `attributes` are [colour, size] (questions.scene_graph)
    return [[(obj["name"], obj["attributes"][0]) for obj in graph["objects"].values()] for graph in graphs.values()]


def distractor_statistics(
    scenes: SyntheticVGPPaths | Sequence[Sequence[Shape]], split: str = "train"
) -> dict[str, float | int]:
    """How many shapes of a synthetic world have distractors in their image.

    Args:
        scenes: generated scenes (what `load_or_generate_synthetic_vgp` or `generate_synthetic_scenes` returns; their
            `split` is read from the GQA scene graphs), or the shapes of each image.
        split: "train" or "val", the split read from generated scenes (unused with shape lists).

    Returns:
        `same_kind_other_colour` and `same_colour_other_kind`: the share of shapes that have in their image a shape of
        the same kind in another colour, resp. of the same colour of another kind; `images_with_both`: the share of
        images holding at least one pair of each of these kinds; `num_images` and `num_shapes`, what was counted.
    """
    if isinstance(scenes, SyntheticVGPPaths):
        if split not in ("train", "val"):
            raise ValueError(f"`split` must be 'train' or 'val', got {split!r}.")
        images = _kinds_and_colours_of_graphs(scenes, split)
    elif isinstance(scenes, Sequence) and not isinstance(scenes, (str, bytes)):
        images = [[(shape.kind, shape.colour) for shape in shapes] for shapes in scenes]
    else:
        raise ValueError(f"`scenes` must be a SyntheticVGPPaths or a list of shape lists, got {type(scenes).__name__}.")
    num_shapes = sum(len(shapes) for shapes in images)
    if num_shapes == 0:
        raise ValueError(f"`scenes` must hold at least one shape, got {len(images)} images and no shape.")

    same_kind = same_colour = images_with_both = 0
    for shapes in images:
        has_same_kind = [any(k == kind and c != colour for k, c in shapes) for kind, colour in shapes]
        has_same_colour = [any(c == colour and k != kind for k, c in shapes) for kind, colour in shapes]
        same_kind += sum(has_same_kind)
        same_colour += sum(has_same_colour)
        images_with_both += any(has_same_kind) and any(has_same_colour)
    return {
        "same_kind_other_colour": same_kind / num_shapes,
        "same_colour_other_kind": same_colour / num_shapes,
        "images_with_both": images_with_both / len(images),
        "num_images": len(images),
        "num_shapes": num_shapes,
    }


CLOSE_REGION_DISTANCE = 0.14  # centres closer than this share of the canvas: a "close" region pair
PROBE_RIDGE = 1e-3


def _scene_graph_objects(paths: SyntheticVGPPaths) -> dict[str, list[tuple[str, np.ndarray]]]:
    """(kind, 0-based box x1, y1, x2, y2) of every object, per image of both splits, from the GQA scene graphs."""
    objects = {}
    for split in ("train", "val"):
        graphs = json.loads((paths.gqa_dir / scene_graphs_file(split)).read_text(encoding="utf-8"))
        for image_id, graph in graphs.items():
            objects[image_id] = [
                (obj["name"], np.array([obj["x"], obj["y"], obj["x"] + obj["w"], obj["y"] + obj["h"]], dtype=np.float64))
                for obj in graph["objects"].values()
            ]
    return objects


def _centre_probe_r2(features: np.ndarray, centres: np.ndarray) -> float:
    """Held-out R^2 of a least-squares (ridge PROBE_RIDGE) probe from features to box centres: fit on the first three
    quarters of the regions, scored on the last quarter against their mean on the fit part (<= 0: no better)."""
    inputs = np.concatenate([features, np.ones((len(features), 1))], axis=1).astype(np.float64)
    fit = len(inputs) * 3 // 4
    gram = inputs[:fit].T @ inputs[:fit] + PROBE_RIDGE * np.eye(inputs.shape[1])
    weights = np.linalg.solve(gram, inputs[:fit].T @ centres[:fit])
    error = ((inputs[fit:] @ weights - centres[fit:]) ** 2).sum()
    return float(1.0 - error / ((centres[fit:] - centres[:fit].mean(0)) ** 2).sum())


def _pairwise_iou(boxes: np.ndarray) -> np.ndarray:
    tensor = torch.as_tensor(boxes, dtype=torch.float64)
    return box_iou(tensor, tensor).numpy()


def _theme_lifts(kinds_of_images: list[set[str]]) -> tuple[float, float]:
    """Mean lift (P(both kinds in an image) / (P(first) P(second))) of kind pairs of one theme, and of two themes."""
    present = {kind: np.array([kind in kinds for kinds in kinds_of_images]) for kind in SHAPE_NAMES}
    lifts: dict[bool, list[float]] = {True: [], False: []}
    for first, second in combinations(SHAPE_NAMES, 2):
        expected = present[first].mean() * present[second].mean()
        if expected > 0:
            same_theme = THEME_OF_KIND[first] == THEME_OF_KIND[second]
            lifts[same_theme].append(float((present[first] & present[second]).mean() / expected))
    return float(np.mean(lifts[True])), float(np.mean(lifts[False]))


def world_statistics(scenes: SyntheticVGPPaths) -> dict[str, float | int]:
    """What a synthetic world's published files give away, measured on every image of both splits
    (docs/synthetic_world.md): the region features (features.tsv) and the objects (GQA scene graphs).

    Returns:
        `centre_probe_r2`: held-out R^2 of a linear probe from region features to box centres (about 1 when features
        hold the box, <= 0 when they describe appearance only); `max_region_iou`: the largest IoU of two regions of one
        image; `close_duplicate_share`: the share of region pairs closer than CLOSE_REGION_DISTANCE (centres, share of
        the canvas) that overlap with IoU > V2_MAX_REGION_IOU; `theme_lift_within` / `theme_lift_between`: the mean
        co-occurrence lift of two kinds of one theme / of two themes (`THEMATIC_GROUPS`); `theme_distance_ratio`: the
        mean centre distance of two objects of one theme over that of two objects of two themes, in images holding
        two themes (about 1: themes are not spatial clusters); `num_images`.
    """
    if not isinstance(scenes, SyntheticVGPPaths):
        raise ValueError(f"`scenes` must be a SyntheticVGPPaths, got {type(scenes).__name__}.")
    objects = _scene_graph_objects(scenes)
    features, centres, largest, close, duplicates = [], [], 0.0, 0, 0
    for record in iter_lxmert_tsv_records(scenes.features_tsv):
        boxes = record["boxes"].astype(np.float64) / np.tile(record["image_size"][::-1], 2)
        features.append(record["features"])
        centres.append((boxes[:, :2] + boxes[:, 2:]) / 2)
        pairs = np.triu(np.ones((len(boxes), len(boxes)), dtype=bool), k=1)
        iou = _pairwise_iou(boxes)
        near = pairs & (np.linalg.norm(centres[-1][:, None] - centres[-1][None], axis=-1) < CLOSE_REGION_DISTANCE)
        largest = max(largest, float(iou[pairs].max(initial=0.0)))
        close += int(near.sum())
        duplicates += int((near & (iou > V2_MAX_REGION_IOU)).sum())
    within, between = _theme_lifts([{kind for kind, _ in shapes} for shapes in objects.values()])
    distances: dict[bool, list[float]] = {True: [], False: []}
    for shapes in objects.values():
        if len({THEME_OF_KIND[kind] for kind, _ in shapes}) > 1:
            for (kind1, box1), (kind2, box2) in combinations(shapes, 2):
                distance = float(np.linalg.norm((box1[:2] + box1[2:] - box2[:2] - box2[2:]) / 2))
                distances[THEME_OF_KIND[kind1] == THEME_OF_KIND[kind2]].append(distance)
    return {
        "centre_probe_r2": _centre_probe_r2(np.concatenate(features), np.concatenate(centres)),
        "max_region_iou": largest,
        "close_duplicate_share": duplicates / max(close, 1),
        "theme_lift_within": within,
        "theme_lift_between": between,
        "theme_distance_ratio": float(np.mean(distances[True]) / np.mean(distances[False])) if distances[False] else float("nan"),
        "num_images": len(objects),
    }


__all__ = [
    "COLOUR_HUES",
    "FIRST_IMAGE_ID",
    "FORMAT_VERSION",
    "SyntheticSceneConfig",
    "SyntheticVGPPaths",
    "distractor_statistics",
    "generate_synthetic_scenes",
    "load_or_generate_synthetic_vgp",
    "world_statistics",
]
