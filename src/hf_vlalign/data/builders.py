"""Dataset builders: published annotation files -> Arrow-backed `datasets.Dataset` of text-level examples.

Tokenisation and region features are joined in the collator (`data/collators.py`), so one builder output serves
any tokenizer and any feature file of the same images.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import datasets
from transformers.utils import logging

from .formats.flickr30k_entities import EntitySentence, Flickr30kEntities
from .formats.lxmert_tsv import read_lxmert_tsv
from .formats.vgp import VGPPair, read_vgp_csv

logger = logging.get_logger(__name__)

# image-description identification classes (Samaran et al. 2021, eq. 1)
ID_LABELS = {0: "c1", 1: "c2", 2: "both"}

VGP_FEATURES = datasets.Features(
    {
        "image_id": datasets.Value("string"),
        "image_width": datasets.Value("int32"),
        "image_height": datasets.Value("int32"),
        "caption1": datasets.Value("string"),
        "caption2": datasets.Value("string"),
        "phrase1_span": datasets.Sequence(datasets.Value("int32"), length=2),
        "phrase2_span": datasets.Sequence(datasets.Value("int32"), length=2),
        "id_label": datasets.Value("int32"),
        "vgp_label": datasets.Value("int32"),
        "type_label": datasets.Value("int32"),
        # grounded phrases of each caption that describes the image: char spans and gold pixel boxes
        "caption1_phrase_spans": datasets.Sequence(datasets.Sequence(datasets.Value("int32"), length=2)),
        "caption1_phrase_boxes": datasets.Sequence(datasets.Sequence(datasets.Sequence(datasets.Value("float32"), length=4))),
        "caption2_phrase_spans": datasets.Sequence(datasets.Sequence(datasets.Value("int32"), length=2)),
        "caption2_phrase_boxes": datasets.Sequence(datasets.Sequence(datasets.Sequence(datasets.Value("float32"), length=4))),
    }
)


def _find_phrase(sentences: list[EntitySentence], text: str, exclude: int | None = None) -> tuple[int, int] | None:
    """(sentence index, phrase index) of the first phrase whose text equals `text` (case-insensitive)."""
    wanted = text.strip().lower()
    for sentence_index, sentence in enumerate(sentences):
        if sentence_index == exclude:
            continue
        for phrase_index, phrase in enumerate(sentence.phrases):
            if phrase.text.lower() == wanted:
                return sentence_index, phrase_index
    return None


def _grounded_phrases(sentence: EntitySentence, boxes: dict[str, list[list[int]]]) -> tuple[list, list]:
    """Char spans and gold boxes of the phrases of `sentence` that have boxes in the image."""
    spans, phrase_boxes = [], []
    for phrase in sentence.phrases:
        if phrase.phrase_id in boxes:
            spans.append([phrase.char_start, phrase.char_end])
            phrase_boxes.append([[float(v) for v in box] for box in boxes[phrase.phrase_id]])
    return spans, phrase_boxes


def _random_foreign_caption(
    corpus: Flickr30kEntities, image_ids: list[str], image_id: str, rng: random.Random
) -> tuple[EntitySentence, int]:
    """A caption of another image and one of its phrases (for the identification task's negatives)."""
    while True:
        other = rng.choice(image_ids)
        if other == image_id:
            continue
        candidates = [s for s in corpus.sentences(other) if s.phrases]
        if candidates:
            sentence = rng.choice(candidates)
            return sentence, rng.randrange(len(sentence.phrases))


def build_vgp_dataset(
    flickr30k_entities_dir: str | Path,
    vgp_csv: str | Path,
    *,
    replace_caption_prob: float = 1 / 3,
    seed: int = 0,
    max_examples: int | None = None,
) -> datasets.Dataset:
    """Visually grounded paraphrase examples from a VGP csv (either published layout) and Flickr30k Entities files.

    For each csv row, c1 is the first caption of the image holding a phrase equal to `original_phrase1` and c2 the
    first other caption holding `original_phrase2`. With probability `replace_caption_prob` one caption (c1 or c2,
    equally likely) is replaced by a caption of another image and its phrase by one of that caption's phrases: the
    identification label then names the caption that still describes the image and the pair is not a VGP.
    Rows whose phrases cannot be located are skipped, counted and reported in a warning.
    """
    if not 0.0 <= replace_caption_prob <= 1.0:
        raise ValueError(f"`replace_caption_prob` must be in [0, 1], got {replace_caption_prob}.")
    corpus = Flickr30kEntities(flickr30k_entities_dir)
    pairs = read_vgp_csv(vgp_csv)
    image_ids = sorted({pair.image_id for pair in pairs})
    if len(image_ids) < 2 and replace_caption_prob > 0:
        raise ValueError(f"`vgp_csv` {vgp_csv} must cover at least two images to draw foreign captions, got {image_ids}.")
    rng = random.Random(seed)
    rows, unlocated = [], 0
    for pair in pairs:
        row = _build_row(corpus, pair, image_ids, rng, replace_caption_prob)
        if row is None:
            unlocated += 1
            continue
        rows.append(row)
        if max_examples is not None and len(rows) >= max_examples:
            break
    if unlocated:
        logger.warning(f"build_vgp_dataset: skipped {unlocated} of {len(pairs)} rows of {vgp_csv} whose phrases are not in the captions.")
    if not rows:
        raise ValueError(f"`vgp_csv` {vgp_csv}: no row could be matched to the captions in {flickr30k_entities_dir}.")
    return datasets.Dataset.from_list(rows, features=VGP_FEATURES)


def _build_row(corpus, pair: VGPPair, image_ids, rng: random.Random, replace_caption_prob: float) -> dict | None:
    sentences = corpus.sentences(pair.image_id)
    first = _find_phrase(sentences, pair.original_phrase1)
    if first is None:
        return None
    second = _find_phrase(sentences, pair.original_phrase2, exclude=first[0])
    if second is None:
        return None
    annotation = corpus.annotation(pair.image_id)
    captions = [sentences[first[0]], sentences[second[0]]]
    phrases = [captions[0].phrases[first[1]], captions[1].phrases[second[1]]]
    grounded = [_grounded_phrases(caption, annotation.boxes) for caption in captions]
    id_label, vgp_label = 2, int(pair.is_paraphrase)
    if rng.random() < replace_caption_prob:
        replaced = rng.randrange(2)
        foreign, phrase_index = _random_foreign_caption(corpus, image_ids, pair.image_id, rng)
        captions[replaced], phrases[replaced] = foreign, foreign.phrases[phrase_index]
        grounded[replaced] = ([], [])
        id_label, vgp_label = 1 - replaced, 0
    return {
        "image_id": pair.image_id,
        "image_width": annotation.width,
        "image_height": annotation.height,
        "caption1": captions[0].text,
        "caption2": captions[1].text,
        "phrase1_span": [phrases[0].char_start, phrases[0].char_end],
        "phrase2_span": [phrases[1].char_start, phrases[1].char_end],
        "id_label": id_label,
        "vgp_label": vgp_label,
        "type_label": pair.type_label if vgp_label else -1,
        "caption1_phrase_spans": grounded[0][0],
        "caption1_phrase_boxes": grounded[0][1],
        "caption2_phrase_spans": grounded[1][0],
        "caption2_phrase_boxes": grounded[1][1],
    }


@dataclass
class VGPData:
    """Everything VGP fine-tuning reads: text-level train/eval examples and the region features of their images."""

    train: datasets.Dataset
    eval: datasets.Dataset
    region_features: datasets.Dataset
    source: str  # "synthetic" or "files"


def load_vgp_data(
    flickr30k_entities_dir: str | Path | None = None,
    vgp_train_csv: str | Path | None = None,
    vgp_eval_csv: str | Path | None = None,
    features_tsv: str | Path | None = None,
    synthetic_config=None,
) -> VGPData:
    """Real files when all four paths are given; otherwise the synthetic grounded scenes (the embedded default),
    generated once and cached, read back through the same readers."""
    paths = [flickr30k_entities_dir, vgp_train_csv, vgp_eval_csv, features_tsv]
    if any(paths) and not all(paths):
        raise ValueError(
            "Real VGP data needs all of `flickr30k_entities_dir`, `vgp_train_csv`, `vgp_eval_csv` and `features_tsv`; "
            f"got {dict(zip(['flickr30k_entities_dir', 'vgp_train_csv', 'vgp_eval_csv', 'features_tsv'], paths))}."
        )
    source = "files"
    if not all(paths):
        from .synthetic import load_or_generate_synthetic_vgp

        synthetic = load_or_generate_synthetic_vgp(config=synthetic_config)
        paths = [synthetic.flickr30k_entities, synthetic.vgp_csv["train"], synthetic.vgp_csv["val"], synthetic.features_tsv]
        source = "synthetic"
    flickr, train_csv, eval_csv, features = paths
    return VGPData(
        train=build_vgp_dataset(flickr, train_csv, seed=1),
        eval=build_vgp_dataset(flickr, eval_csv, seed=2),
        region_features=read_lxmert_tsv(features),
        source=source,
    )
