"""Questions with pointers about the synthetic scenes, written as published GQA files (Hudson & Manning 2019) under
`<root>/gqa/`: `{split}_sceneGraphs.json` (one object per shape, its id the shape's phrase id),
`{split}_all_questions.json` (the balanced questions and those they entail), `{split}_balanced_questions.json` and the
answer vocabulary of the balanced questions (`trainval_ans2label.json` / `trainval_label2ans.json`, LXMERT's layout).

Each image gets 6-10 distinct balanced questions from the `TEMPLATES` (GQA has no counting questions) whose noun
phrases identify their object and never name the attribute asked about; `entailed` and `equivalent` link an image's
questions as GQA's do, and `annotations` map token positions ("i" or "i:j", end exclusive) to object ids.
Image `index` draws from `np.random.default_rng([seed, index, QUESTION_STREAM])`, a stream of its own, so the
questions leave every other generated file unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .shapes import (
    COLOUR_NAMES,
    COLOUR_WORDS,
    SHAPE_NAMES,
    SIZE_NAMES,
    SIZE_WORDS,
    Shape,
    generic_attribute_sets,
    identifying_attribute_sets,
    named_words,
    pick,
    shape_relation,
)

QUESTION_STREAM = 1
MIN_QUESTIONS, MAX_QUESTIONS = 6, 10
ATTEMPTS_PER_QUESTION = 50
SPLITS = ("train", "val")
GENERIC_NOUNS = ("object", "shape", "thing")
RELATIONS = ("to the left of", "to the right of", "above", "below")
ANSWER_VOCAB_FILE = "trainval_ans2label.json"
ANSWER_LIST_FILE = "trainval_label2ans.json"
# detailed type -> (structural, semantic), as GQA's `types`
TEMPLATE_TYPES = {
    "queryColor": ("query", "attr"),
    "queryShape": ("query", "cat"),
    "chooseSize": ("choose", "attr"),
    "verifyColor": ("verify", "attr"),
    "exist": ("verify", "obj"),
    "relS": ("query", "rel"),
}


def questions_file(split: str) -> str:
    """The official GQA name of a split's balanced questions file."""
    return f"{split}_balanced_questions.json"


def all_questions_file(split: str) -> str:
    """The official GQA name of a split's all questions file (balanced and entailed questions)."""
    return f"{split}_all_questions.json"


def scene_graphs_file(split: str) -> str:
    """The official GQA name of a split's scene graphs file."""
    return f"{split}_sceneGraphs.json"


@dataclass(frozen=True)
class _Phrase:
    """Content words of a noun phrase (no determiner) and the object it points to (None: nothing in the image)."""

    words: tuple[str, ...]
    object_id: str | None


def _phrase_from(shape: Shape, sets: list, kind: str | None, rng: np.random.Generator) -> _Phrase | None:
    """A phrase naming `shape` by one of the attribute `sets` (drawn at random) and `kind` (None: a generic noun)."""
    if not sets:
        return None
    attributes = pick(sets, rng)
    colour = shape.colour if "colour" in attributes else None
    size = shape.size if "size" in attributes else None
    return _Phrase(tuple(named_words(kind, colour, size, rng, GENERIC_NOUNS)), shape.phrase_id)


def _shape_phrase(
    index: int, shapes: list[Shape], rng: np.random.Generator, avoid: str | None = None
) -> _Phrase | None:
    """A noun phrase that singles out shape `index` by its shape word, never naming the attribute `avoid`."""
    sets = [attributes for attributes in identifying_attribute_sets(index, shapes) if avoid not in attributes]
    return _phrase_from(shapes[index], sets, shapes[index].kind, rng)


_SIZE_VOCABULARY = frozenset(word for words in SIZE_WORDS.values() for word in words)


def _attribute_words(phrase: _Phrase) -> dict[str, str]:
    """"size" / "colour" -> the phrase's word for it; the noun (the last word) left out."""
    return {("size" if word in _SIZE_VOCABULARY else "colour"): word for word in phrase.words[:-1]}


def _variant(phrase: _Phrase, attributes: dict[str, str], object_id: str | None, noun: str | None = None) -> _Phrase:
    """`phrase` naming exactly `attributes` (attribute -> word), in the grammar's order: size, colour, noun."""
    words = tuple(attributes[name] for name in ("size", "colour") if name in attributes)
    return _Phrase((*words, noun or phrase.words[-1]), object_id)


def _with_attribute(phrase: _Phrase, name: str, word: str, object_id: str | None) -> _Phrase:
    return _variant(phrase, {**_attribute_words(phrase), name: word}, object_id)


def _article(words: tuple[str, ...]) -> str:
    return "an" if words[0][0] in "aeiou" else "a"


def _compose(parts: list[str | _Phrase], end: str) -> tuple[str, dict[str, str]]:
    """Plain words and phrases -> (text, GQA pointers): first letter capitalised, `end` attached to the last token."""
    tokens: list[str] = []
    pointers: dict[str, str] = {}
    for part in parts:
        if isinstance(part, _Phrase):
            start = len(tokens)
            tokens.extend(part.words)
            if part.object_id is not None:
                stop = len(tokens)
                pointers[str(start) if stop == start + 1 else f"{start}:{stop}"] = part.object_id
        else:
            tokens.extend(part.split())
    tokens[0] = tokens[0][0].upper() + tokens[0][1:]
    tokens[-1] += end
    return " ".join(tokens), pointers


def _operation(operation: str, argument: str, *dependencies: int) -> dict:
    return {"operation": operation, "dependencies": list(dependencies), "argument": argument}


def _select(kind: str, object_id: str | None, colour: str | None = None, size: str | None = None) -> list[dict]:
    """select the object (`-` when absent), then one filter per attribute the phrase names."""
    program = [_operation("select", f"{kind} ({object_id or '-'})")]
    for name, value in (("color", colour), ("size", size)):
        if value is not None:
            program.append(_operation(f"filter {name}", value, len(program) - 1))
    return program


def _then(program: list[dict], operation: str, argument: str) -> list[dict]:
    return [*program, _operation(operation, argument, len(program) - 1)]


def _phrase_program(phrase: _Phrase, shape: Shape) -> list[dict]:
    """The select / filter steps of a phrase naming `shape` (attributes read back from its words)."""
    colour = shape.colour if set(phrase.words) & set(COLOUR_WORDS.get(shape.colour, (shape.colour,))) else None
    size = shape.size if set(phrase.words) & set(SIZE_WORDS[shape.size]) else None
    kind = shape.kind if phrase.words[-1] not in GENERIC_NOUNS else phrase.words[-1]
    return _select(kind, phrase.object_id, colour, size)


def _semantic_str(program: list[dict]) -> str:
    steps = []
    for step in program:
        dependencies = f" [{', '.join(str(d) for d in step['dependencies'])}]" if step["dependencies"] else ""
        steps.append(f"{step['operation']}: {step['argument']}{dependencies}")
    return "->".join(steps)


@dataclass
class _Draft:
    template: str
    question: list[str | _Phrase]
    answer: str
    full_answer: list[str | _Phrase]
    program: list[dict]
    answer_object: str | None = None  # the object the answer names (GQA points the answer at it)
    # the questions whose answers this answer fixes; a function, as those entail questions in turn
    entails: Callable[[], list[_Draft]] = lambda: []


def _question_text(draft: _Draft) -> str:
    return _compose(draft.question, "?")[0]


# Deterministic builders (no random draws, so entailments never shift the balanced questions' random stream)


def _query_colour_draft(phrase: _Phrase, index: int, shapes: list[Shape]) -> _Draft:
    """"What colour is the <phrase>?" about shape `index` (the phrase does not name its colour)."""
    shape = shapes[index]
    colour = shape.colour
    program = _then(_phrase_program(phrase, shape), "query", "color")

    def entails() -> list[_Draft]:
        coloured = _with_attribute(phrase, "colour", colour, shape.phrase_id)
        return [
            _exist_draft(phrase, index, shapes),
            _verify_colour_draft(phrase, index, shapes, colour, colour),
            _exist_draft(coloured, index, shapes),
        ]

    question, full_answer = ["What colour is the", phrase], ["the", phrase, "is", colour]
    return _Draft("queryColor", question, colour, full_answer, program, entails=entails)


def _verify_colour_draft(phrase: _Phrase, index: int, shapes: list[Shape], asked: str, asked_word: str) -> _Draft:
    """"Is the <phrase> <asked_word>?" about shape `index`; `asked` is the colour that `asked_word` names."""
    shape = shapes[index]
    holds = asked == shape.colour
    full_answer = ["yes, the" if holds else "no, the", phrase, "is", shape.colour]
    program = _then(_phrase_program(phrase, shape), "verify color", asked)

    def entails() -> list[_Draft]:
        if holds:
            coloured = _with_attribute(phrase, "colour", asked_word, shape.phrase_id)
            return [
                _exist_draft(phrase, index, shapes),
                _query_colour_draft(phrase, index, shapes),
                _exist_draft(coloured, index, shapes),
            ]
        # the phrase names this shape only, so nothing in the image matches it with the other colour
        described = _with_attribute(phrase, "colour", asked_word, None)
        size = shape.size if "size" in _attribute_words(phrase) else None
        return [_exist_draft(phrase, index, shapes), _absent_exist_draft(described, shape.kind, asked, size)]

    question = ["Is the", phrase, asked_word]
    return _Draft("verifyColor", question, "yes" if holds else "no", full_answer, program, entails=entails)


def _exist_draft(phrase: _Phrase, index: int, shapes: list[Shape]) -> _Draft:
    """"Is there a <phrase>?" -> "yes", the phrase naming shape `index` only."""
    shape = shapes[index]
    program = _then(_phrase_program(phrase, shape), "exist", "?")

    def entails() -> list[_Draft]:
        words = _attribute_words(phrase)
        fewer = [kept for kept in identifying_attribute_sets(index, shapes) if kept < frozenset(words)]
        return [
            _exist_draft(_variant(phrase, {name: words[name] for name in kept}, shape.phrase_id), index, shapes)
            for kept in fewer
        ]

    article = _article(phrase.words)
    question, full_answer = ["Is there", article, phrase], ["yes, there is", article, phrase]
    return _Draft("exist", question, "yes", full_answer, program, entails=entails)


def _absent_exist_draft(phrase: _Phrase, kind: str, colour: str | None, size: str | None) -> _Draft:
    """"Is there a <phrase>?" -> "no": no shape of the image is a `kind` of that colour and size (None: any)."""
    program = _then(_select(kind, None, colour, size), "exist", "?")
    question, full_answer = ["Is there", _article(phrase.words), phrase], ["no, there is no", phrase]
    return _Draft("exist", question, "no", full_answer, program)


# Templates: each returns a draft question, or None when the scene does not allow it


def _query_colour(shapes: list[Shape], rng: np.random.Generator) -> _Draft | None:
    index = int(rng.integers(len(shapes)))
    phrase = _shape_phrase(index, shapes, rng, avoid="colour")
    return None if phrase is None else _query_colour_draft(phrase, index, shapes)


def _query_shape(shapes: list[Shape], rng: np.random.Generator) -> _Draft | None:
    index = int(rng.integers(len(shapes)))
    # a noun phrase without the shape word ("the blue object") that singles out shape `index` among all shapes
    phrase = _phrase_from(shapes[index], generic_attribute_sets(index, shapes), None, rng)
    if phrase is None:
        return None
    kind = shapes[index].kind
    answer_phrase = _Phrase((kind,), phrase.object_id)
    full_answer = ["the", phrase, "is", _article(answer_phrase.words), answer_phrase]
    program = _then(_phrase_program(phrase, shapes[index]), "query", "name")

    def entails() -> list[_Draft]:
        # the generic phrase names this shape only among all shapes, so with its shape word too
        named = _variant(phrase, _attribute_words(phrase), phrase.object_id, noun=kind)
        return [_exist_draft(named, index, shapes)]

    question = ["What shape is the", phrase]
    return _Draft("queryShape", question, kind, full_answer, program, phrase.object_id, entails=entails)


def _choose_size(shapes: list[Shape], rng: np.random.Generator) -> _Draft | None:
    index = int(rng.integers(len(shapes)))
    phrase = _shape_phrase(index, shapes, rng, avoid="size")
    if phrase is None:
        return None
    first, second = SIZE_NAMES if rng.random() < 0.5 else SIZE_NAMES[::-1]
    shape = shapes[index]
    question = ["Is the", phrase, f"{first} or {second}"]
    program = _then(_phrase_program(phrase, shape), "choose size", f"{first}|{second}")

    def entails() -> list[_Draft]:
        sized = _with_attribute(phrase, "size", shape.size, shape.phrase_id)
        return [_exist_draft(phrase, index, shapes), _exist_draft(sized, index, shapes)]

    return _Draft("chooseSize", question, shape.size, ["the", phrase, "is", shape.size], program, entails=entails)


def _verify_colour(shapes: list[Shape], rng: np.random.Generator) -> _Draft | None:
    index = int(rng.integers(len(shapes)))
    phrase = _shape_phrase(index, shapes, rng, avoid="colour")
    if phrase is None:
        return None
    colour = shapes[index].colour
    holds = bool(rng.random() < 0.5)
    asked = colour if holds else pick([c for c in COLOUR_NAMES if c != colour], rng)
    asked_word = pick(list(COLOUR_WORDS.get(asked, (asked,))), rng)
    return _verify_colour_draft(phrase, index, shapes, asked, asked_word)


def _absent_description(shapes: list[Shape], rng: np.random.Generator) -> tuple[str, str | None, str | None] | None:
    """A random (shape, colour or None, size or None) that no shape of the image matches."""
    for _ in range(ATTEMPTS_PER_QUESTION):
        kind, colour, size = (pick(list(names), rng) for names in (SHAPE_NAMES, COLOUR_NAMES, SIZE_NAMES))
        named = pick([(), ("colour",), ("size",), ("colour", "size")], rng)
        colour, size = (colour if "colour" in named else None), (size if "size" in named else None)
        if not any(
            shape.kind == kind and colour in (None, shape.colour) and size in (None, shape.size) for shape in shapes
        ):
            return kind, colour, size
    return None


def _exist(shapes: list[Shape], rng: np.random.Generator) -> _Draft | None:
    if rng.random() < 0.5:
        index = int(rng.integers(len(shapes)))
        return _exist_draft(_shape_phrase(index, shapes, rng), index, shapes)
    description = _absent_description(shapes, rng)
    if description is None:
        return None
    kind, colour, size = description
    phrase = _Phrase(tuple(named_words(kind, colour, size, rng, GENERIC_NOUNS)), None)
    return _absent_exist_draft(phrase, kind, colour, size)


def _relate(shapes: list[Shape], rng: np.random.Generator, generic_reference: bool = False) -> _Draft | None:
    """"What is <relation> the <reference>?" where exactly one other shape stands in that relation to it; with
    `generic_reference` (world v2) the reference is named without its shape word ("the red object"), since kinds
    that co-occur in thematic groups would let its shape word predict the answer's."""
    candidates = []
    for reference in range(len(shapes)):
        if generic_reference and not generic_attribute_sets(reference, shapes):
            continue
        for relation in RELATIONS:
            others = [
                other
                for other in range(len(shapes))
                if other != reference and shape_relation(shapes[other], shapes[reference]) == relation
            ]
            if len(others) == 1:
                candidates.append((reference, relation, others[0]))
    if not candidates:
        return None
    reference, relation, other = pick(candidates, rng)
    if generic_reference:
        reference_phrase = _phrase_from(shapes[reference], generic_attribute_sets(reference, shapes), None, rng)
    else:
        reference_phrase = _shape_phrase(reference, shapes, rng)
    other_phrase = _shape_phrase(other, shapes, rng)
    kind = shapes[other].kind
    question = [f"What is {relation} the", reference_phrase]
    full_answer = ["the", other_phrase, f"is {relation} the", reference_phrase]
    program = _phrase_program(reference_phrase, shapes[reference])
    program = _then(program, "relate", f"_,{relation},s ({shapes[other].phrase_id})")
    program = _then(program, "query", "name")

    def entails() -> list[_Draft]:
        entailed = [_exist_draft(reference_phrase, reference, shapes)]
        if frozenset() in identifying_attribute_sets(other, shapes):  # the shape word alone names the answer's shape
            entailed.append(_exist_draft(_Phrase((kind,), shapes[other].phrase_id), other, shapes))
        return entailed

    return _Draft("relS", question, kind, full_answer, program, shapes[other].phrase_id, entails=entails)


def _relate_generic(shapes: list[Shape], rng: np.random.Generator) -> _Draft | None:
    return _relate(shapes, rng, generic_reference=True)


TEMPLATES: dict[str, Callable[[list[Shape], np.random.Generator], _Draft | None]] = {
    "queryColor": _query_colour,
    "queryShape": _query_shape,
    "chooseSize": _choose_size,
    "verifyColor": _verify_colour,
    "exist": _exist,
    "relS": _relate,
}
# world v2: the same templates, the relation's reference named without its shape word
TEMPLATES_V2 = {**TEMPLATES, "relS": _relate_generic}


def _record(image_id: str, draft: _Draft, is_balanced: bool) -> dict:
    """The GQA record of a draft, without `entailed` / `equivalent` (they need the image's other questions)."""
    question, question_pointers = _compose(draft.question, "?")
    full_answer, full_answer_pointers = _compose(draft.full_answer, ".")
    structural, semantic = TEMPLATE_TYPES[draft.template]
    return {
        "imageId": image_id,
        "question": question,
        "answer": draft.answer,
        "fullAnswer": full_answer,
        "annotations": {
            "question": question_pointers,
            "answer": {"0": draft.answer_object} if draft.answer_object is not None else {},
            "fullAnswer": full_answer_pointers,
        },
        "types": {"structural": structural, "semantic": semantic, "detailed": draft.template},
        "semantic": draft.program,
        "semanticStr": _semantic_str(draft.program),
        "isBalanced": is_balanced,
    }


def scene_graph(shapes: list[Shape], image_size: int) -> dict:
    """The GQA scene graph of one image: per shape its 0-based pixel box, [colour, size] and relations to the others."""
    objects = {}
    for shape in shapes:
        x1, y1, x2, y2 = shape.box
        relations = [
            {"name": shape_relation(shape, other), "object": other.phrase_id} for other in shapes if other is not shape
        ]
        objects[shape.phrase_id] = {
            "name": shape.kind,
            "x": x1,
            "y": y1,
            "w": x2 - x1,
            "h": y2 - y1,
            "attributes": [shape.colour, shape.size],
            "relations": relations,
        }
    return {"width": image_size, "height": image_size, "objects": objects}


def _balanced_drafts(shapes: list[Shape], rng: np.random.Generator, world: str = "v1") -> dict[str, _Draft]:
    """6-10 drafts of distinct questions from random templates (`TEMPLATES`, world v2: `TEMPLATES_V2`), by question
    text."""
    templates = TEMPLATES_V2 if world == "v2" else TEMPLATES
    target = int(rng.integers(MIN_QUESTIONS, MAX_QUESTIONS + 1))
    names = list(templates)
    drafts: dict[str, _Draft] = {}
    for _ in range(ATTEMPTS_PER_QUESTION * target):
        if len(drafts) == target:
            break
        draft = templates[pick(names, rng)](shapes, rng)
        if draft is not None:
            drafts.setdefault(_question_text(draft), draft)
    return drafts


def _entailed_only_drafts(balanced: dict[str, _Draft]) -> dict[str, _Draft]:
    """The questions the balanced ones entail that are no balanced question themselves, by question text."""
    entailed: dict[str, _Draft] = {}
    for draft in balanced.values():
        for candidate in draft.entails():
            text = _question_text(candidate)
            if text not in balanced:
                entailed.setdefault(text, candidate)
    return entailed


def _entailed_ids(text: str, drafts: dict[str, _Draft], ids: dict[str, str]) -> list[str]:
    """GQA's `entailed` of question `text`: the ids of its entailments among the image's questions, in order."""
    found: list[str] = []
    for candidate in drafts[text].entails():
        other = _question_text(candidate)
        if other not in drafts or other == text or ids[other] in found:
            continue
        found.append(ids[other])
    return found


def _equivalent_ids(records: dict[str, dict]) -> dict[str, list[str]]:
    """GQA's `equivalent` of each question: the ids of the questions with its program, itself included."""
    by_program: dict[str, list[str]] = {}
    for question_id, record in records.items():
        by_program.setdefault(record["semanticStr"], []).append(question_id)
    return {question_id: list(by_program[record["semanticStr"]]) for question_id, record in records.items()}


def sample_questions(
    image_id: str, shapes: list[Shape], rng: np.random.Generator, world: str = "v1"
) -> dict[str, dict]:
    """6-10 distinct balanced questions about one image, then the questions they entail (`isBalanced` false);
    question id -> GQA record, ids `image_id` and two digits, the balanced questions first. `world`: "v1" or "v2"
    (`TEMPLATES_V2`)."""
    balanced = _balanced_drafts(shapes, rng, world)
    drafts = {**balanced, **_entailed_only_drafts(balanced)}
    ids = {text: f"{image_id}{number:02d}" for number, text in enumerate(drafts)}
    records = {ids[text]: _record(image_id, draft, text in balanced) for text, draft in drafts.items()}
    equivalents = _equivalent_ids(records)
    for text in drafts:
        records[ids[text]]["entailed"] = _entailed_ids(text, drafts, ids)
        records[ids[text]]["equivalent"] = equivalents[ids[text]]
    return records


def answer_vocab(answers: list[str]) -> dict[str, int]:
    """ans2label of `answers`: labels by decreasing count, ties in alphabetical order."""
    counts = Counter(answers)
    ordered = sorted(counts, key=lambda answer: (-counts[answer], answer))
    return {answer: label for label, answer in enumerate(ordered)}


@dataclass
class SyntheticQuestionWriter:
    """Collects the scene graphs and questions of the generated images, then writes the GQA files of every split."""

    gqa_dir: Path
    image_size: int
    seed: int
    world: str = "v1"  # `SyntheticSceneConfig.world`: v2 asks with `TEMPLATES_V2`
    graphs: dict[str, dict[str, dict]] = field(default_factory=lambda: {split: {} for split in SPLITS})
    questions: dict[str, dict[str, dict]] = field(default_factory=lambda: {split: {} for split in SPLITS})

    def add(self, split: str, index: int, image_id: str, shapes: list[Shape]) -> None:
        """The scene graph and questions of image `index` (its place in the generation order) of `split`."""
        rng = np.random.default_rng([self.seed, index, QUESTION_STREAM])
        self.graphs[split][image_id] = scene_graph(shapes, self.image_size)
        self.questions[split].update(sample_questions(image_id, shapes, rng, self.world))

    def balanced(self, split: str) -> dict[str, dict]:
        """The balanced questions of `split` (GQA's balanced file)."""
        return {qid: record for qid, record in self.questions[split].items() if record["isBalanced"]}

    def write(self) -> None:
        """`{split}_all_questions.json`, `{split}_balanced_questions.json`, `{split}_sceneGraphs.json` and the
        trainval answer vocabulary (of the balanced questions)."""
        self.gqa_dir.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            _write_json(self.gqa_dir / all_questions_file(split), self.questions[split])
            _write_json(self.gqa_dir / questions_file(split), self.balanced(split))
            _write_json(self.gqa_dir / scene_graphs_file(split), self.graphs[split])
        vocab = answer_vocab([q["answer"] for split in SPLITS for q in self.balanced(split).values()])
        _write_json(self.gqa_dir / ANSWER_VOCAB_FILE, vocab)
        _write_json(self.gqa_dir / ANSWER_LIST_FILE, list(vocab))


def _write_json(path: Path, content: object) -> None:
    path.write_text(json.dumps(content) + "\n", encoding="utf-8")


__all__ = [
    "ANSWER_VOCAB_FILE",
    "TEMPLATES",
    "TEMPLATES_V2",
    "SyntheticQuestionWriter",
    "all_questions_file",
    "answer_vocab",
    "questions_file",
    "sample_questions",
    "scene_graph",
    "scene_graphs_file",
]
