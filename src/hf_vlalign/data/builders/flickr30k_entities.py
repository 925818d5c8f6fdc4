"""Flickr30k Entities (Plummer et al., 2015): one row per caption, every marked-up phrase with its entity's boxes.

`data_dir` holds the split lists `train.txt`, `val.txt`, `test.txt`, `Sentences/` and `Annotations/` (parsed by
`data.formats.flickr30k_entities`). Boxes are the XML's 1-based pixels as published (`alignment/boxes.py` normalises
them).
"""

from __future__ import annotations

from pathlib import Path

import datasets

from ..formats.flickr30k_entities import Flickr30kEntities
from ..formats.paths import safe_join
from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    SPANS,
    UniqueIds,
    check_split,
    dataset_from_rows,
    grounding_features,
    logger,
    missing_image_error,
    report_missing_images,
)


SPLITS = ("train", "val", "test")

FEATURES = datasets.Features(
    {
        "image_id": datasets.Value("string"),  # the Flickr id, e.g. "1000092795"
        "image_size": IMAGE_SIZE,  # from the XML `<size>`
        "sentence_index": datasets.Value("int32"),  # its line in `Sentences/<id>.txt`, 0-based, blanks not counted
        "sentence": datasets.Value("string"),  # the caption, markup removed, words joined by single spaces
        **grounding_features("sentence"),  # *every* marked-up phrase, in order; no boxes for phrases without them
        "sentence_phrase_token_spans": SPANS,  # the same phrases as spans of whitespace tokens of `sentence`
        "phrase_ids": datasets.List(datasets.Value("string")),  # entity ids ("0": `notvisual`, never with boxes)
        "phrase_types": datasets.List(datasets.List(datasets.Value("string"))),  # e.g. ["clothing", "bodyparts"]
        "phrase_nobndbox": datasets.List(datasets.Value("bool")),  # the XML `<nobndbox>` flag of the phrase's entity
        "phrase_scene": datasets.List(datasets.Value("bool")),  # the XML `<scene>` flag
    }
)


def build(
    data_dir: str | Path,
    split: str,
    *,
    max_images: int | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """One split of Flickr30k Entities, one row per caption (`FEATURES`).

    Args:
        data_dir: the folder with `<split>.txt`, `Sentences/` and `Annotations/`.
        max_images: keep only the first `max_images` images of the split that have both annotation files.
        on_missing_image: for the listed images without their `Sentences/` or `Annotations/` file.
    """
    check_split(split, SPLITS, "Flickr30k Entities")
    if max_images is not None and (not isinstance(max_images, int) or isinstance(max_images, bool) or max_images < 1):
        raise ValueError(f"`max_images` must be a positive int or None, got {max_images!r}.")
    if data_dir is None:
        raise ValueError("`data_dir` must be the Flickr30k Entities folder (with Sentences/ and Annotations/), got None.")
    corpus = Flickr30kEntities(data_dir)
    image_ids = _images_with_files(corpus, split, max_images, on_missing_image)
    rows = (row for image_id in image_ids for row in _image_rows(corpus, image_id))  # one image's files at a time
    return dataset_from_rows(rows, FEATURES)


def _images_with_files(
    corpus: Flickr30kEntities, split: str, max_images: int | None, on_missing_image: str
) -> list[str]:
    """The split's image ids that have both annotation files (the first `max_images` of them); the others raise or
    are counted and reported, following `on_missing_image`."""
    listed = corpus.image_ids(split)
    split_file, source = corpus.root / f"{split}.txt", f"Flickr30k Entities {split}"
    where = f"Sentences/ and Annotations/ of {corpus.root}"
    present, listed_ids = [], UniqueIds(f"`data_dir` {split_file}", "image id")
    for line, image_id in enumerate(listed, start=1):
        listed_ids.add(image_id, f"line {line}")
        argument = f"`data_dir` {split_file}, line {line} (image id)"
        sentences = safe_join(corpus.root / "Sentences", f"{image_id}.txt", argument)
        annotation = safe_join(corpus.root / "Annotations", f"{image_id}.xml", argument)
        if sentences.is_file() and annotation.is_file():
            present.append(image_id)
        elif on_missing_image == "raise":
            raise missing_image_error(source, f"{split_file}, line {line}", image_id, where, "images")
        if on_missing_image == "raise" and max_images is not None and len(present) == max_images:
            break  # the images after the first `max_images` are not read
    if on_missing_image == "skip":
        report_missing_images(source, len(listed) - len(present), len(listed), f"images listed in {split}.txt", where)
    if not present:
        raise ValueError(f"`data_dir` {corpus.root}: none of the {len(listed)} images of {split}.txt has annotation files.")
    if max_images is not None and max_images > len(present):
        used = len(present)
        logger.warning(f"`max_images` {max_images} is more than the {used} images of {source} with annotation files: using {used}.")
    return present[:max_images]


def _image_rows(corpus: Flickr30kEntities, image_id: str) -> list[dict]:
    annotation = corpus.annotation(image_id)
    return [
        {
            "image_id": image_id,
            "image_size": [annotation.height, annotation.width],
            "sentence_index": index,
            "sentence": sentence.text,
            "sentence_phrase_spans": [[phrase.char_start, phrase.char_end] for phrase in sentence.phrases],
            "sentence_phrase_boxes": [
                [[float(v) for v in box] for box in annotation.boxes.get(phrase.phrase_id, [])]
                for phrase in sentence.phrases
            ],
            "sentence_phrase_token_spans": [
                [phrase.first_word_index, phrase.first_word_index + len(phrase.text.split())]
                for phrase in sentence.phrases
            ],
            "phrase_ids": [phrase.phrase_id for phrase in sentence.phrases],
            "phrase_types": [list(phrase.phrase_types) for phrase in sentence.phrases],
            "phrase_nobndbox": [phrase.phrase_id in annotation.no_box for phrase in sentence.phrases],
            "phrase_scene": [phrase.phrase_id in annotation.scene for phrase in sentence.phrases],
        }
        for index, sentence in enumerate(corpus.sentences(image_id))
    ]
