"""NLVR2 statements and RefCOCO+ referring expressions about the synthetic scenes, written as the published files.

`<root>/nlvr2/` (Suhr et al. 2019): `train.json` and `dev.json`, JSON lines with NLVR2's fields. A set takes eight
consecutive images of its split (wrapping around) as four pairs; each of its sentences (`STATEMENT_TEMPLATES`, truth
computed from the shapes, a `relate` sentence ambiguous in some pair dropped) is judged against every pair, keeping as
many True as False pairs. The pair images' features are `<root>/features/nlvr2_features.tsv` (`pair_feature_records`).
`<root>/refcoco+/` (Yu et al. 2016, UNC splits): `refs(unc).p` (one ref per shape, 1-3 expressions naming appearance
only, as RefCOCO+ forbade location words) and `instances.json` (one COCO category per SHAPE_NAMES entry).
`canonical_words` / `attribute_agreement` read back what a text names (world v2's VGP pairs, the text-only
ceilings of `evaluation.text_only`). Image `index` (NLVR2: a set's first image) draws from `np.random.default_rng([seed, index, STREAM])`, each writer's own
stream, so these files leave every other generated file unchanged.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .shapes import (
    COLOUR_NAMES,
    COLOUR_WORDS,
    SHAPE_NAMES,
    SHAPE_WORDS,
    SIZE_NAMES,
    SIZE_WORDS,
    Shape,
    generic_attribute_sets,
    identifying_attribute_sets,
    named_words,
    phrase_wordings,
    pick,
    shape_relation,
)

NLVR2_STREAM = 2
REFCOCO_STREAM = 3
SPLITS = ("train", "val")
NLVR2_SPLITS = {"train": "train", "val": "dev"}  # synthetic split -> NLVR2 file / identifier split
REFCOCO_SPLITS = {"train": "train", "val": "val"}

PAIRS_PER_SET = 4
SENTENCES_PER_SET = 3
ATTEMPTS_PER_TEMPLATE = 12
CONTRAST_ATTEMPTS = 200
CONTENT_PROBABILITY = 0.75  # a statement names the attributes of a shape of the set this often (else random ones)
SIDES = ("left", "right")
GENERIC_NOUNS = ("shape", "object")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")
# a relation -> (axis, sign): "to the left of" holds when the first centre's x is smaller
RELATION_AXES = {"to the left of": (0, -1), "to the right of": (0, 1), "above": (1, -1), "below": (1, 1)}

MAX_EXPRESSIONS = 3
ATTEMPTS_PER_EXPRESSION = 30
REFCOCO_GENERIC_NOUNS = ("one", "thing", "shape", "object")
REFS_FILE = "refs(unc).p"
INSTANCES_FILE = "instances.json"
SHAPE_SUPERCATEGORY = "shape"
TEXT_DETERMINERS = frozenset({"a", "an", "the"})
# synonym -> (attribute, canonical name), from the vocabularies the writers draw their words from
_VOCABULARY = {
    word: (attribute, name)
    for attribute, synonyms in (
        ("kind", {**{kind: (kind,) for kind in SHAPE_NAMES}, **SHAPE_WORDS}),
        ("colour", {colour: COLOUR_WORDS.get(colour, (colour,)) for colour in COLOUR_NAMES}),
        ("size", SIZE_WORDS),
    )
    for name, words in synonyms.items()
    for word in words
}


def canonical_words(text: str) -> tuple[str, ...]:
    """The words of `text`, lower case, punctuation and determiners dropped, each synonym replaced by its name."""
    words = re.findall(r"[a-z]+", text.lower())
    return tuple(_VOCABULARY.get(word, (None, word))[1] for word in words if word not in TEXT_DETERMINERS)


def _named(words: tuple[str, ...]) -> dict[str, str]:
    """attribute -> canonical value, for the attributes the (canonical) words name."""
    return {_VOCABULARY[word][0]: word for word in words if word in _VOCABULARY}


def attribute_agreement(first: str, second: str) -> tuple[str, ...]:
    """Per attribute (kind, colour, size), what the two phrases' texts say of it: named by neither, by one of them
    only, by both with the same value, or with different values."""
    named1, named2 = _named(canonical_words(first)), _named(canonical_words(second))
    statuses = []
    for attribute in ("kind", "colour", "size"):
        if attribute in named1 and attribute in named2:
            statuses.append("same" if named1[attribute] == named2[attribute] else "different")
        else:
            statuses.append("first" if attribute in named1 else "second" if attribute in named2 else "neither")
    return tuple(statuses)


@dataclass(frozen=True)
class _Description:
    """The shapes a noun phrase names: a category, colour and size each, or None where the phrase does not say."""

    kind: str | None
    colour: str | None
    size: str | None

    def matches(self, shape: Shape) -> bool:
        return (
            (self.kind is None or self.kind == shape.kind)
            and (self.colour is None or self.colour == shape.colour)
            and (self.size is None or self.size == shape.size)
        )

    def count(self, shapes: list[Shape]) -> int:
        return sum(self.matches(shape) for shape in shapes)

    def words(self, rng: np.random.Generator, plural: bool = False) -> str:
        """"large crimson discs", "violet object": synonyms drawn at random, a generic noun when no category."""
        words = named_words(self.kind, self.colour, self.size, rng, GENERIC_NOUNS)
        if plural:
            words[-1] += "es" if words[-1].endswith(("s", "x")) else "s"
        return " ".join(words)

    def singular(self, rng: np.random.Generator) -> str:
        """The phrase with its indefinite article: "a red circle", "an orange star"."""
        words = self.words(rng)
        return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"

    def counted(self, number: int, rng: np.random.Generator) -> str:
        """"one red circle", "three stars"."""
        return f"{NUMBER_WORDS[number]} {self.words(rng, plural=number != 1)}"


# which attributes a statement's noun phrase names; () is "shapes" (every shape)
EXIST_NAMES = (("kind",), ("kind", "colour"), ("kind", "size"), ("colour",), ("kind", "colour", "size"))
COUNT_NAMES = ((), ("kind",), ("kind",), ("colour",), ("kind", "colour"), ("size",))
RELATE_NAMES = (("kind",), ("kind", "colour"), ("kind", "colour"), ("colour",))


def _sample_description(
    scenes: list[list[Shape]],
    names: tuple[tuple[str, ...], ...],
    rng: np.random.Generator,
    source: Shape | None = None,
) -> _Description:
    """A description naming one of the attribute sets `names` of `source`, or when None, mostly of a random shape of
    the set and otherwise random values."""
    named = pick(names, rng)
    if source is None and rng.random() < CONTENT_PROBABILITY:
        source = pick(pick(scenes, rng), rng)
    if source is not None:
        values = (source.kind, source.colour, source.size)
    else:
        values = tuple(pick(options, rng) for options in (SHAPE_NAMES, COLOUR_NAMES, SIZE_NAMES))
    kind, colour, size = (value if name in named else None for value, name in zip(values, ("kind", "colour", "size")))
    return _Description(kind, colour, size)


def _sample_number(description: _Description, scenes: list[list[Shape]], rng: np.random.Generator, top: int) -> int:
    """A count of the description in a random scene of the set when it is in [1, top], else a random one."""
    count = description.count(pick(scenes, rng))
    return count if 1 <= count <= top else int(rng.integers(1, top + 1))


Truth = Callable[[list[Shape], list[Shape]], bool | None]


@dataclass
class _Statement:
    sentence: str
    truth: Truth
    meaning: tuple  # the template and its arguments: two sentences of a set never mean the same (synonyms aside)


def _side(left: list[Shape], right: list[Shape], side: str) -> list[Shape]:
    return left if side == "left" else right


def _exist_side(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    side, description = pick(SIDES, rng), _sample_description(scenes, EXIST_NAMES, rng)
    phrase = description.singular(rng)
    sentence = pick(
        [f"The {side} image contains {phrase}.", f"There is {phrase} in the {side} image.",
         f"The {side} image shows {phrase}."],
        rng,
    )  # fmt: skip
    return _Statement(
        sentence, lambda left, right: description.count(_side(left, right, side)) >= 1, ("existSide", side, description)
    )


def _exist_both(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    description = _sample_description(scenes, EXIST_NAMES, rng)
    phrase = description.singular(rng)
    sentence = pick([f"Both images contain {phrase}.", f"There is {phrase} in both images."], rng)
    return _Statement(
        sentence, lambda left, right: min(map(description.count, (left, right))) >= 1, ("existBoth", description)
    )


def _exist_one(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    description = _sample_description(scenes, EXIST_NAMES, rng)
    phrase = description.singular(rng)
    sentence = pick([f"Exactly one image contains {phrase}.", f"Only one of the two images has {phrase}."], rng)
    return _Statement(
        sentence,
        lambda left, right: (description.count(left) >= 1) != (description.count(right) >= 1),
        ("existOne", description),
    )


def _count_side(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    side, description = pick(SIDES, rng), _sample_description(scenes, COUNT_NAMES, rng)
    number = _sample_number(description, scenes, rng, top=3)
    phrase = description.counted(number, rng)
    verb = "is" if number == 1 else "are"
    sentence = pick(
        [f"The {side} image has exactly {phrase}.", f"There {verb} exactly {phrase} in the {side} image."], rng
    )
    return _Statement(
        sentence,
        lambda left, right: description.count(_side(left, right, side)) == number,
        ("countSide", side, description, number),
    )


def _count_total(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    description = _sample_description(scenes, COUNT_NAMES, rng)
    number = _sample_number(description, scenes, rng, top=4)
    phrase = description.counted(number, rng)
    verb = "is" if number == 1 else "are"
    sentence = pick(
        [f"There {verb} exactly {phrase} in total.", f"The two images contain exactly {phrase} in total."], rng
    )
    return _Statement(
        sentence,
        lambda left, right: description.count(left) + description.count(right) == number,
        ("countTotal", description, number),
    )


def _compare(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    more, description = pick(SIDES, rng), _sample_description(scenes, COUNT_NAMES, rng)
    less = "right" if more == "left" else "left"
    phrase = description.words(rng, plural=True)
    sentence = pick(
        [f"The {more} image has more {phrase} than the {less} image.",
         f"There are more {phrase} in the {more} image than in the {less} image."],
        rng,
    )  # fmt: skip
    return _Statement(
        sentence,
        lambda left, right: description.count(_side(left, right, more)) > description.count(_side(left, right, less)),
        ("compare", more, description),
    )


def relation_truth(shapes: list[Shape], first: _Description, relation: str, second: _Description) -> bool | None:
    """Whether some shape matching `first` is `relation` a *different* shape matching `second` (the captions' rule);
    None (ambiguous) when none is, but one such pair still lies in the relation's direction along its axis."""
    axis, sign = RELATION_AXES[relation]
    leaning = False
    for a in shapes:
        for b in shapes:
            if a is b or not first.matches(a) or not second.matches(b):
                continue
            if shape_relation(a, b) == relation:
                return True
            leaning |= (a.centre[axis] - b.centre[axis]) * sign > 0
    return None if leaning else False


def _relate(scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    side = pick(SIDES, rng)
    crowded = [shapes for shapes in scenes if len(shapes) >= 2]
    if crowded and rng.random() < CONTENT_PROBABILITY:  # two shapes of a scene of the set, as they stand
        shapes = pick(crowded, rng)
        a, b = [shapes[i] for i in rng.choice(len(shapes), size=2, replace=False).tolist()]
        relation = shape_relation(a, b)
        first, second = (_sample_description(scenes, RELATE_NAMES, rng, source) for source in (a, b))
    else:
        relation = pick(list(RELATION_AXES), rng)
        first, second = (_sample_description(scenes, RELATE_NAMES, rng) for _ in range(2))
    phrase1, phrase2 = first.singular(rng), second.singular(rng)
    sentence = pick(
        [f"In the {side} image, {phrase1} is {relation} {phrase2}.",
         f"The {side} image shows {phrase1} {relation} {phrase2}."],
        rng,
    )  # fmt: skip
    return _Statement(
        sentence,
        lambda left, right: relation_truth(_side(left, right, side), first, relation, second),
        ("relate", side, first, relation, second),
    )


STATEMENT_TEMPLATES: dict[str, Callable[[list[list[Shape]], np.random.Generator], _Statement]] = {
    "existSide": _exist_side,
    "existBoth": _exist_both,
    "existOne": _exist_one,
    "countSide": _count_side,
    "countTotal": _count_total,
    "compare": _compare,
    "relate": _relate,
}


def _sample_statement(template: str, scenes: list[list[Shape]], rng: np.random.Generator) -> _Statement:
    statement = STATEMENT_TEMPLATES[template](scenes, rng)
    statement.sentence = statement.sentence[0].upper() + statement.sentence[1:]
    return statement


def _balanced_pairs(truths: list[bool], rng: np.random.Generator) -> list[int]:
    """Pair ids keeping as many True as False pairs (a random subset of the larger side), in pair order."""
    true = [i for i, truth in enumerate(truths) if truth]
    false = [i for i, truth in enumerate(truths) if not truth]
    count = min(len(true), len(false))
    keep = [side[i] for side in (true, false) for i in rng.permutation(len(side))[:count].tolist()]
    return sorted(keep)


def sample_set_sentences(
    pairs: list[tuple[list[Shape], list[Shape]]], rng: np.random.Generator
) -> list[tuple[str, dict[int, bool]]]:
    """The sentences of one NLVR2 set and, for each, the pairs it is judged on: {pair_id: label}, as many True as False.

    Each sentence tries the templates in random order, `ATTEMPTS_PER_TEMPLATE` draws each, and takes the first draw of
    the first template that tells the pairs apart: one true of exactly half of the pairs, else one true of some other
    share. When no statement tells the pairs apart (identical pairs), one True and one False sentence about pair 0 are
    returned.
    """
    scenes = [shapes for pair in pairs for shapes in pair]
    sentences: list[tuple[str, dict[int, bool]]] = []
    meanings: set[tuple] = set()
    for _ in range(SENTENCES_PER_SET):
        chosen = None
        names = list(STATEMENT_TEMPLATES)
        for template in [names[i] for i in rng.permutation(len(names)).tolist()]:
            for _ in range(ATTEMPTS_PER_TEMPLATE):
                statement = _sample_statement(template, scenes, rng)
                truths = [statement.truth(left, right) for left, right in pairs]
                if None in truths or statement.meaning in meanings or not 0 < sum(truths) < len(truths):
                    continue
                if chosen is None or 2 * sum(truths) == len(truths):
                    chosen = statement, truths
                if 2 * sum(truths) == len(truths):  # half of the pairs: the best there is
                    break
            if chosen is not None:
                break
        if chosen is not None:
            statement, truths = chosen
            meanings.add(statement.meaning)
            sentences.append((statement.sentence, {i: truths[i] for i in _balanced_pairs(truths, rng)}))
    return sentences or _contrasting_sentences(pairs[0], rng)


def _contrasting_sentences(
    pair: tuple[list[Shape], list[Shape]], rng: np.random.Generator
) -> list[tuple[str, dict[int, bool]]]:
    """One True and one False sentence about one pair (a set whose pairs are all alike)."""
    found: dict[bool, str] = {}
    for _ in range(CONTRAST_ATTEMPTS):
        statement = _sample_statement(pick(list(STATEMENT_TEMPLATES), rng), [*pair], rng)
        truth = statement.truth(*pair)
        if truth is not None and truth not in found:
            found[truth] = statement.sentence
        if len(found) == 2:
            return [(found[True], {0: True}), (found[False], {0: False})]
    raise RuntimeError(f"no true and no false sentence found for a pair in {CONTRAST_ATTEMPTS} draws.")


def pair_image_id(nlvr2_split: str, set_id: int, pair_id: int, side: int) -> str:
    """NLVR2's image id: "<split>-<set_id>-<pair_id>-img0" (left) / "-img1" (right)."""
    return f"{nlvr2_split}-{set_id}-{pair_id}-img{side}"


def _nlvr2_record(identifier: str, sentence: str, label: bool, images: tuple[str, str], set_id: int) -> dict:
    """One JSON line, in the published field order."""
    return {
        "validation": {},
        "sentence": sentence,
        "left_url": f"images/{images[0]}.png",
        "writer": "synthetic",
        "label": "True" if label else "False",
        "right_url": f"images/{images[1]}.png",
        "synset": SHAPE_SUPERCATEGORY,
        "query": f"synthetic shapes{set_id}",
        "identifier": identifier,
        "extra_validations": {},
    }


@dataclass
class SyntheticNLVR2Writer:
    """Collects the generated images of each split, then writes the NLVR2 files (see the module docstring)."""

    nlvr2_dir: Path
    seed: int
    images: dict[str, list[tuple[int, str, list[Shape]]]] = field(default_factory=lambda: {s: [] for s in SPLITS})

    def add(self, split: str, index: int, image_id: str, shapes: list[Shape]) -> None:
        """Image `index` (its place in the generation order) of `split`, with its shapes."""
        self.images[split].append((index, image_id, shapes))

    def write(self) -> dict[str, str]:
        """`train.json` and `dev.json`; returns {NLVR2 image id: synthetic image id} for every pair of every set."""
        self.nlvr2_dir.mkdir(parents=True, exist_ok=True)
        pair_images: dict[str, str] = {}
        for split, images in self.images.items():
            nlvr2_split, lines = NLVR2_SPLITS[split], []
            set_size = 2 * PAIRS_PER_SET
            for set_id in range(-(-len(images) // set_size)):  # the last set wraps around to the split's start
                members = [images[(set_size * set_id + i) % len(images)] for i in range(set_size)]
                lines.extend(self._set_lines(nlvr2_split, set_id, members, pair_images))
            (self.nlvr2_dir / f"{nlvr2_split}.json").write_text("".join(lines), encoding="utf-8")
        return pair_images

    def _set_lines(
        self, nlvr2_split: str, set_id: int, members: list[tuple[int, str, list[Shape]]], pair_images: dict[str, str]
    ) -> list[str]:
        """The JSON lines of one set of eight images (pair p: images 2p, 2p + 1); records its pair images."""
        ids = [(members[2 * p][1], members[2 * p + 1][1]) for p in range(PAIRS_PER_SET)]
        for pair_id, pair in enumerate(ids):
            for side, image_id in enumerate(pair):
                pair_images[pair_image_id(nlvr2_split, set_id, pair_id, side)] = image_id
        pairs = [(members[2 * p][2], members[2 * p + 1][2]) for p in range(PAIRS_PER_SET)]
        rng = np.random.default_rng([self.seed, members[0][0], NLVR2_STREAM])
        lines = []
        for sentence_id, (sentence, labels) in enumerate(sample_set_sentences(pairs, rng)):
            for pair_id, label in labels.items():
                identifier = f"{nlvr2_split}-{set_id}-{pair_id}-{sentence_id}"
                lines.append(json.dumps(_nlvr2_record(identifier, sentence, label, ids[pair_id], set_id)) + "\n")
        return lines


def pair_feature_records(pair_images: dict[str, str], records: list[dict]) -> Iterator[dict]:
    """The feature record of each NLVR2 pair image: its synthetic image's record under the NLVR2 image id."""
    by_id = {record["image_id"]: record for record in records}
    return ({**by_id[image_id], "image_id": pair_id} for pair_id, image_id in pair_images.items())


def _expression(
    shape: Shape, shape_word_sets: list[frozenset[str]], generic_sets: list[tuple[str, ...]], rng: np.random.Generator
) -> str:
    """One expression from the attribute sets that single the shape out: "red circle", "the big crimson disc",
    "square in violet" (with the shape word), or "the small one", "large blue thing" (a generic noun)."""
    colour_words = COLOUR_WORDS.get(shape.colour, (shape.colour,))
    if generic_sets and rng.random() < 0.25:
        names = pick(generic_sets, rng)
        words = [pick(SIZE_WORDS[shape.size] if name == "size" else colour_words, rng) for name in names]
        words.append(pick(REFCOCO_GENERIC_NOUNS, rng))
    else:
        attributes = pick(shape_word_sets, rng)
        if "colour" in attributes and rng.random() < 0.3:
            words = [*pick(phrase_wordings(shape, attributes - {"colour"}), rng), "in", pick(colour_words, rng)]
        else:
            words = list(pick(phrase_wordings(shape, attributes), rng))
    if rng.random() < 0.4:
        words.insert(0, "the")
    return " ".join(words)


def referring_expressions(index: int, shapes: list[Shape], rng: np.random.Generator) -> list[str]:
    """1-3 distinct lower-case expressions, each naming shape `index` uniquely among `shapes` by its appearance."""
    shape_word_sets, generic_sets = identifying_attribute_sets(index, shapes), generic_attribute_sets(index, shapes)
    target = int(rng.integers(1, MAX_EXPRESSIONS + 1))
    expressions: list[str] = []
    for _ in range(ATTEMPTS_PER_EXPRESSION * target):
        if len(expressions) == target:
            break
        expression = _expression(shapes[index], shape_word_sets, generic_sets, rng)
        if expression not in expressions:
            expressions.append(expression)
    return expressions


def category_id(kind: str) -> int:
    """The COCO category id of a shape category: its position in SHAPE_NAMES, plus one."""
    return SHAPE_NAMES.index(kind) + 1


@dataclass
class SyntheticRefCOCOWriter:
    """Collects one ref per shape of the generated images, then writes `refs(unc).p` and `instances.json`."""

    refcoco_dir: Path
    image_size: int
    seed: int
    refs: list[dict] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    annotations: list[dict] = field(default_factory=list)
    num_sentences: int = 0

    def add(self, split: str, index: int, image_id: str, shapes: list[Shape]) -> None:
        """The COCO image, annotations and refs of image `index` (its place in the generation order) of `split`."""
        rng = np.random.default_rng([self.seed, index, REFCOCO_STREAM])
        coco_id = int(image_id)
        self.images.append(
            {"id": coco_id, "width": self.image_size, "height": self.image_size, "file_name": f"{image_id}.png"}
        )
        for shape_index, shape in enumerate(shapes):
            x1, y1, x2, y2 = shape.box
            ann_id = int(shape.phrase_id)
            self.annotations.append(
                {"id": ann_id, "image_id": coco_id, "bbox": [x1, y1, x2 - x1, y2 - y1],
                 "category_id": category_id(shape.kind), "iscrowd": 0}
            )  # fmt: skip
            expressions = referring_expressions(shape_index, shapes, rng)
            sent_ids = list(range(self.num_sentences, self.num_sentences + len(expressions)))
            self.num_sentences += len(expressions)
            self.refs.append(
                {
                    "sent_ids": sent_ids,
                    "file_name": f"{image_id}_{ann_id}.png",
                    "ann_id": ann_id,
                    "ref_id": len(self.refs),
                    "image_id": coco_id,
                    "split": REFCOCO_SPLITS[split],
                    "sentences": [
                        {"tokens": text.split(), "raw": text[0].upper() + text[1:], "sent_id": sent_id, "sent": text}
                        for sent_id, text in zip(sent_ids, expressions, strict=True)
                    ],
                    "category_id": category_id(shape.kind),
                }
            )

    def write(self) -> None:
        """`refs(unc).p` (pickle protocol 2 of plain lists, dicts, ints and strings) and `instances.json`."""
        self.refcoco_dir.mkdir(parents=True, exist_ok=True)
        with open(self.refcoco_dir / REFS_FILE, "wb") as handle:
            pickle.dump(self.refs, handle, protocol=2)
        categories = [
            {"supercategory": SHAPE_SUPERCATEGORY, "id": category_id(kind), "name": kind} for kind in SHAPE_NAMES
        ]
        instances = {"images": self.images, "annotations": self.annotations, "categories": categories}
        (self.refcoco_dir / INSTANCES_FILE).write_text(json.dumps(instances) + "\n", encoding="utf-8")


__all__ = [
    "NLVR2_SPLITS",
    "REFCOCO_SPLITS",
    "STATEMENT_TEMPLATES",
    "SyntheticNLVR2Writer",
    "SyntheticRefCOCOWriter",
    "attribute_agreement",
    "canonical_words",
    "category_id",
    "pair_feature_records",
    "pair_image_id",
    "referring_expressions",
    "relation_truth",
    "sample_set_sentences",
]
