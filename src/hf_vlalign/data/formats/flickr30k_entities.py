"""Flickr30k Entities (Plummer et al.): phrase markup in `Sentences/<id>.txt`, boxes in `Annotations/<id>.xml`.

Reading mirrors the official `flickr30k_entities_utils.py` (`get_sentence_data`, `get_annotations`) with one
deliberate difference: boxes keep the published 1-based pixel coordinates instead of subtracting 1, because
boxes on disk stay in the file's own convention and are normalised once, in `hf_vlalign.alignment.boxes`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ...utils.validation import check_existing_path
from .text_files import FileFormatError, read_text

_PHRASE_HEADER = re.compile(r"\[/EN#(\d+)((?:/[^/\s\]]+)+)$")
_BOX_TAGS = ("xmin", "ymin", "xmax", "ymax")
_SIZE_TAGS = ("width", "height", "depth")
_IMAGE_FILES = (("Sentences", ".txt"), ("Annotations", ".xml"))
SPLIT_NAMES = ("train", "val", "test")  # the official split lists, `<split>.txt`


@dataclass(slots=True)  # one per phrase / caption / image of a data set: no __dict__ each
class EntityPhrase:
    """One marked-up phrase `[/EN#<phrase_id>/<type>[/<type>...] <text>]` of a sentence."""

    phrase_id: str
    phrase_types: list[str]
    text: str
    first_word_index: int
    char_start: int
    char_end: int


@dataclass(slots=True)
class EntitySentence:
    """A plain sentence (markup removed, words joined by single spaces) and its phrases."""

    text: str
    phrases: list[EntityPhrase] = field(default_factory=list)


@dataclass(slots=True)
class EntityAnnotation:
    """The content of one `Annotations/<id>.xml` file.

    An `<object>` with several `<name>` entries applies its box (or its scene / no-box flags) to every name.
    """

    width: int
    height: int
    depth: int
    boxes: dict[str, list[list[int]]] = field(default_factory=dict)
    scene: list[str] = field(default_factory=list)
    no_box: list[str] = field(default_factory=list)


def parse_sentence(line: str) -> EntitySentence:
    """Parses one line of a `Sentences/<id>.txt` file, e.g. `[/EN#5473/people Three children] sit .`."""
    words: list[str] = []
    spans: list[tuple[str, list[str], int, int]] = []  # phrase id, types, first word, end word (exclusive)
    header: tuple[str, list[str], int] | None = None
    for token in line.split():
        if header is None:
            if token.startswith("["):
                header = _parse_phrase_header(token, first_word=len(words))
                continue
            if token.endswith("]"):
                raise ValueError(f"malformed markup: {token!r} closes a phrase that was never opened.")
            words.append(token)
            continue
        if token.startswith("["):
            raise ValueError(f"malformed markup: phrase {token!r} opens inside phrase /EN#{header[0]} (nesting).")
        closes = token.endswith("]")
        word = token[:-1] if closes else token
        if not word:
            raise ValueError(f"malformed markup: stray ']' in phrase /EN#{header[0]}.")
        words.append(word)
        if closes:
            spans.append((*header, len(words)))
            header = None
    if header is not None:
        raise ValueError(f"malformed markup: phrase /EN#{header[0]} is never closed with ']'.")
    return _build_sentence(words, spans)


def _parse_phrase_header(token: str, first_word: int) -> tuple[str, list[str], int]:
    if token.endswith("]"):
        raise ValueError(f"malformed markup: phrase {token!r} has no words.")
    match = _PHRASE_HEADER.match(token)
    if match is None:
        raise ValueError(f"malformed markup: expected a phrase header '[/EN#<id>/<type>', got {token!r}.")
    return match.group(1), match.group(2).split("/")[1:], first_word


def _build_sentence(words: list[str], spans: list[tuple[str, list[str], int, int]]) -> EntitySentence:
    starts = [0]
    for word in words:
        starts.append(starts[-1] + len(word) + 1)  # one space after every word
    phrases = [
        EntityPhrase(
            phrase_id=phrase_id,
            phrase_types=types,
            text=" ".join(words[first:end]),
            first_word_index=first,
            char_start=starts[first],
            char_end=starts[end] - 1,
        )
        for phrase_id, types, first, end in spans
    ]
    return EntitySentence(text=" ".join(words), phrases=phrases)


def format_sentence(sentence: EntitySentence) -> str:
    """Writes a sentence back in the published markup; the inverse of `parse_sentence`."""
    text, pieces, cursor = sentence.text, [], 0
    for phrase in sorted(sentence.phrases, key=lambda phrase: phrase.char_start):
        pieces.append(text[cursor : phrase.char_start])
        pieces.append(f"[/EN#{phrase.phrase_id}/{'/'.join(phrase.phrase_types)} {phrase.text}]")
        cursor = phrase.char_end
    pieces.append(text[cursor:])
    return "".join(pieces)


def read_sentences(path: str | Path) -> list[EntitySentence]:
    """Reads one `Sentences/<id>.txt` file: one marked-up sentence per line (blank lines are not sentences)."""
    path = check_existing_path("path", path, "file (a Flickr30k Entities Sentences/<id>.txt file)")
    sentences = []
    for line_number, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            sentences.append(parse_sentence(line))
        except ValueError as error:
            raise FileFormatError(f"{path}, line {line_number}: {error}") from None
    return sentences


def write_sentences(path: str | Path, sentences: list[EntitySentence]) -> None:
    """Writes sentences in the published markup, one per line, creating the parent folder if needed."""
    lines = [format_sentence(sentence) for sentence in sentences]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def read_annotation(path: str | Path) -> EntityAnnotation:
    """Reads one `Annotations/<id>.xml` file (image size, boxes per phrase id, scene and no-box phrase ids)."""
    path = check_existing_path("path", path, "file (a Flickr30k Entities Annotations/<id>.xml file)")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as error:
        raise ValueError(f"{path}, line {error.position[0]}: malformed XML ({error}).") from None
    try:
        return _parse_annotation(root)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _parse_annotation(root: ET.Element) -> EntityAnnotation:
    if root.tag != "annotation":
        raise ValueError(f"expected the root element <annotation>, got <{root.tag}>.")
    size = _child(root, "size", "<annotation>")
    width, height, depth = (_int_child(size, tag, "<size>") for tag in _SIZE_TAGS)
    for tag, value in zip(_SIZE_TAGS, (width, height, depth)):
        if value <= 0:
            raise ValueError(f"<size> <{tag}> must be a positive integer, got {value}.")
    annotation = EntityAnnotation(width=width, height=height, depth=depth)
    for index, element in enumerate(root.findall("object")):
        _add_object(annotation, element, f"<object> #{index + 1}")
    return annotation


def _add_object(annotation: EntityAnnotation, element: ET.Element, where: str) -> None:
    names = [(name.text or "").strip() for name in element.findall("name")]
    if not names or not all(names):
        raise ValueError(f"{where} must have at least one non-empty <name> (a phrase id), got {names}.")
    where = f"{where} (names {names})"
    box_element = element.find("bndbox")
    if box_element is not None:
        box = [_int_child(box_element, tag, f"{where} <bndbox>") for tag in _BOX_TAGS]
        if box[2] < box[0] or box[3] < box[1]:
            raise ValueError(f"{where}: <bndbox> must have xmin <= xmax and ymin <= ymax, got {box}.")
        if min(box) < 0:
            raise ValueError(f"{where}: <bndbox> must have non-negative pixel coordinates, got {box}.")
        for name in names:
            annotation.boxes.setdefault(name, []).append(list(box))
        return
    if _int_child(element, "nobndbox", where) > 0:
        annotation.no_box.extend(names)
    if _int_child(element, "scene", where) > 0:
        annotation.scene.extend(names)


def _child(element: ET.Element, tag: str, where: str) -> ET.Element:
    child = element.find(tag)
    if child is None:
        raise ValueError(f"{where} must contain <{tag}>, found none.")
    return child


def _int_child(element: ET.Element, tag: str, where: str) -> int:
    text = (_child(element, tag, where).text or "").strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{where}: <{tag}> must be an integer, got {text!r}.") from None


def write_annotation(path: str | Path, annotation: EntityAnnotation) -> None:
    """Writes an annotation in the published XML layout (tab-indented, `<filename>` is `<path stem>.jpg`).

    Phrases whose next boxes coincide share one multi-`<name>` object, as in the published files; reading the
    written file gives back an equal `EntityAnnotation`.
    """
    path = Path(path)
    root = ET.Element("annotation")
    ET.SubElement(root, "filename").text = f"{path.stem}.jpg"
    size = ET.SubElement(root, "size")
    for tag in _SIZE_TAGS:
        ET.SubElement(size, tag).text = str(getattr(annotation, tag))
    for box, names in _merge_heads(annotation.boxes):
        element = _object_element(root, names)
        box_element = ET.SubElement(element, "bndbox")
        for tag, value in zip(_BOX_TAGS, box):
            ET.SubElement(box_element, tag).text = str(value)
    for name, flags in _merge_heads({"scene": annotation.scene, "nobndbox": annotation.no_box}):
        element = _object_element(root, [name])
        for flag in ("scene", "nobndbox"):
            ET.SubElement(element, flag).text = "1" if flag in flags else "0"
    ET.indent(root, space="\t")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ET.tostring(root, encoding="unicode"), encoding="utf-8")


def _object_element(root: ET.Element, names: list[str]) -> ET.Element:
    element = ET.SubElement(root, "object")
    for name in names:
        ET.SubElement(element, "name").text = name
    return element


def _merge_heads(queues: dict) -> list[tuple]:
    """Drains several ordered queues into (item, keys) steps, one step taking `item` off every queue it heads.

    Reading the steps back in order appends each item to each of its keys, rebuilding every queue exactly.
    """
    positions = dict.fromkeys(queues, 0)
    steps = []
    while pending := [key for key in queues if positions[key] < len(queues[key])]:
        item = queues[pending[0]][positions[pending[0]]]
        keys = [key for key in pending if queues[key][positions[key]] == item]
        for key in keys:
            positions[key] += 1
        steps.append((item, keys))
    return steps


def read_split(path: str | Path) -> list[str]:
    """Reads `train.txt` / `val.txt` / `test.txt`: one numeric image id per line."""
    path = check_existing_path("path", path, "file (a Flickr30k Entities split file such as train.txt)")
    image_ids = []
    for line_number, line in enumerate(read_text(path).splitlines(), start=1):
        image_id = line.strip()
        if not image_id.isdigit():
            raise FileFormatError(f"{path}, line {line_number}: expected one numeric image id, got {line.rstrip()!r}.")
        image_ids.append(image_id)
    return image_ids


class Flickr30kEntities:
    """A Flickr30k Entities folder: `Sentences/<id>.txt`, `Annotations/<id>.xml` and `<split>.txt` files."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        missing = [name for name in ("Sentences", "Annotations") if not (self.root / name).is_dir()]
        if missing:
            raise ValueError(f"`root` must contain Sentences/ and Annotations/, got {self.root} without {missing}.")

    def split_lists(self) -> dict[str, list[str]]:
        """The official split lists present in the folder (`train.txt`, `val.txt`, `test.txt`): split -> image ids."""
        paths = {split: self.root / f"{split}.txt" for split in SPLIT_NAMES}
        return {split: read_split(path) for split, path in paths.items() if path.is_file()}

    def image_ids(self, split: str) -> list[str]:
        """Image ids listed in `<root>/<split>.txt`."""
        path = self.root / f"{split}.txt"
        if not path.is_file():
            available = sorted(p.stem for p in self.root.glob("*.txt"))
            raise ValueError(f"`split` must name a <split>.txt file in {self.root} ({available}), got {split!r}.")
        return read_split(path)

    def sentences(self, image_id: str) -> list[EntitySentence]:
        """The five (or so) marked-up captions of an image."""
        return read_sentences(self._file("Sentences", image_id, ".txt"))

    def annotation(self, image_id: str) -> EntityAnnotation:
        """The boxes and flags of an image's phrases."""
        return read_annotation(self._file("Annotations", image_id, ".xml"))

    def has_image(self, image_id: str) -> bool:
        """Whether the image has both its files, `Sentences/<id>.txt` and `Annotations/<id>.xml` (an `image_id` that is
        not a str of digits, e.g. a path, is refused, never looked up on disk)."""
        return all(self._path(folder, image_id, suffix).is_file() for folder, suffix in _IMAGE_FILES)

    def _path(self, folder: str, image_id: str, suffix: str) -> Path:
        if not isinstance(image_id, str) or not image_id.isdigit():
            raise ValueError(f"`image_id` must be a str of digits such as '1000092795', got {image_id!r}.")
        return self.root / folder / f"{image_id}{suffix}"

    def _file(self, folder: str, image_id: str, suffix: str) -> Path:
        path = self._path(folder, image_id, suffix)
        if not path.is_file():
            raise ValueError(f"`image_id` {image_id!r} must have a file {folder}/{image_id}{suffix} in {self.root}.")
        return path
