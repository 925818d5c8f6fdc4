"""Visually grounded paraphrases (VGP): a VGP csv + Flickr30k Entities -> caption pairs (Samaran et al.:
image-description identification, eq. 1, + VGP classification, eq. 4). How rows are placed in captions and what
`on_split_overlap` does: docs/datasets.md. `type_label` is the csv's semantic type (`TYPOLOGY_LABELS`), -1 for a row
that is not a VGP. Tokenisation and region features are joined in the collator (`data/collators/vgp.py`).
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
from transformers.utils import logging

from ..feature_store import RegionFeatureStore, convert_features
from ..formats.flickr30k_entities import SPLIT_NAMES, EntitySentence, Flickr30kEntities
from ..formats.vgp import TYPOLOGY_LABELS, VGPPair, has_markup, read_vgp_csv, unescape_phrase
from ._common import (
    DEFAULT_ON_MISSING_IMAGE,
    IMAGE_SIZE,
    check_on_missing_image,
    dataset_from_rows,
    grounding_features,
    missing_image_error,
    report_missing_images,
    resolve_split,
)
from ._neighbours import nearest_neighbours, tfidf_rows

logger = logging.get_logger(__name__)

# image-description identification classes (Samaran et al. 2021, eq. 1)
ID_LABELS = {0: "c1", 1: "c2", 2: "both"}
# what to do with rows on images of another split (`build_vgp_dataset(on_split_overlap=...)`)
SPLIT_OVERLAP_CHOICES = ("warn", "drop", "raise")

VGP_FEATURES = datasets.Features(
    {
        "image_id": datasets.Value("string"),
        "image_size": IMAGE_SIZE,  # height, width (pixels)
        "caption1": datasets.Value("string"),
        "caption2": datasets.Value("string"),
        "phrase1_span": datasets.Sequence(datasets.Value("int32"), length=2),
        "phrase2_span": datasets.Sequence(datasets.Value("int32"), length=2),
        "id_label": datasets.Value("int32"),
        "vgp_label": datasets.Value("int32"),
        "type_label": datasets.Value("int32"),
        # grounded phrases of each caption that describes the image: char spans and gold pixel boxes
        **grounding_features("caption1", "caption2"),
    }
)


NOTVISUAL = "0"  # the entity id Flickr30k Entities gives every `notvisual` phrase: it names no one entity

# why a row cannot be matched (keys of `PhraseMatch.skip_reason`), as the skip warning words them
SKIP_REASONS: dict[str, str] = {
    "markup": "with markup in a phrase cell",
    "not_found": "with a phrase that no caption of the image marks up",
    "same_caption": "same-caption pairs (the phrases meet, or name one entity, only within one caption)",
}


@dataclass(frozen=True, slots=True)
class PhraseOccurrence:
    """A marked-up phrase of an image's captions: caption (sentence) index, phrase index in it, entity id."""

    sentence: int
    phrase: int
    entity: str


@dataclass(slots=True)
class PhraseMatch:
    """Where a VGP row's two phrases are in its image's captions, or why not (`skip_reason`, a key of `SKIP_REASONS`;
    `first`/`second` are then None). `entities`: how the phrases' entities compare with the label (`ENTITY_CHECKS`;
    "unknown" when both are `notvisual`)."""

    first: PhraseOccurrence | None = None
    second: PhraseOccurrence | None = None
    entities: str | None = None
    skip_reason: str | None = None


ENTITY_CHECKS = ("agree", "unknown", "disagree")  # `PhraseMatch.entities`, best first


def phrase_occurrences(sentences: list[EntitySentence], text: str) -> list[PhraseOccurrence]:
    """Every marked-up phrase of `sentences` whose text equals `text` (a CSV cell: case-insensitive, backslash-escaped
    quotes restored, white space collapsed), in caption order."""
    wanted = unescape_phrase(text).lower()
    return [
        PhraseOccurrence(sentence_index, phrase_index, phrase.phrase_id)
        for sentence_index, sentence in enumerate(sentences)
        for phrase_index, phrase in enumerate(sentence.phrases)
        if phrase.text.lower() == wanted
    ]


def match_phrases(
    sentences: list[EntitySentence], pair: VGPPair, roi_entities: dict[int, set[str]] | None = None
) -> PhraseMatch:
    """Places a VGP row's phrases in two different captions of its image, trying every caption and every occurrence.

    The pair kept agrees with the label through the Flickr30k entities (one entity for a paraphrase, two otherwise;
    two `notvisual` phrases come next, then pairs against the label), then with `roi1`/`roi2` through `roi_entities`
    (`entities_of_rois`), then comes first (the published VGP code's rule). Rows not placed get a `skip_reason`
    (`SKIP_REASONS`); "same_caption" also covers phrases that agree with the label only within one caption.
    """
    if has_markup(pair.original_phrase1) or has_markup(pair.original_phrase2):
        return PhraseMatch(skip_reason="markup")
    firsts = phrase_occurrences(sentences, pair.original_phrase1)
    seconds = phrase_occurrences(sentences, pair.original_phrase2)
    if not firsts or not seconds:
        return PhraseMatch(skip_reason="not_found")
    pairs = [(a, b) for a in firsts for b in seconds if a != b]
    across = [(a, b) for a, b in pairs if a.sentence != b.sentence]
    within_agreeing = [(a, b) for a, b in pairs if a.sentence == b.sentence and _entities(a, b, pair) == "agree"]
    if not across or (within_agreeing and all(_entities(a, b, pair) != "agree" for a, b in across)):
        return PhraseMatch(skip_reason="same_caption")
    roi_entities = roi_entities or {}

    def rank(candidate: tuple[PhraseOccurrence, PhraseOccurrence]) -> tuple:
        a, b = candidate
        roi_votes = _roi_agrees(a, pair.roi1, roi_entities) + _roi_agrees(b, pair.roi2, roi_entities)
        entities = ENTITY_CHECKS.index(_entities(a, b, pair))
        return (entities, -roi_votes, a.sentence, a.phrase, b.sentence, b.phrase)

    first, second = min(across, key=rank)
    return PhraseMatch(first, second, entities=_entities(first, second, pair))


def _entities(a: PhraseOccurrence, b: PhraseOccurrence, pair: VGPPair) -> str:
    """How the two occurrences' entities compare with the label: "agree", "disagree" or "unknown" (both notvisual)."""
    if a.entity == NOTVISUAL and b.entity == NOTVISUAL:
        return "unknown"
    return "agree" if (a.entity == b.entity) == pair.is_paraphrase else "disagree"


def _roi_agrees(occurrence: PhraseOccurrence, roi: int | None, roi_entities: dict[int, set[str]]) -> int:
    return int(roi is not None and roi >= 0 and occurrence.entity in roi_entities.get(roi, ()))


def entities_of_rois(sentences: list[EntitySentence], pairs: list[VGPPair]) -> dict[int, set[str]]:
    """roi -> the Flickr30k entities its phrases name, from the rows of one image (identification layout): a roi is the
    region a phrase was localised to; only phrases whose text names a single entity of the image vote."""
    entities: dict[int, set[str]] = {}
    for pair in pairs:
        for cell, roi in ((pair.original_phrase1, pair.roi1), (pair.original_phrase2, pair.roi2)):
            if roi is None or roi < 0 or has_markup(cell):
                continue
            named = {occurrence.entity for occurrence in phrase_occurrences(sentences, cell)} - {NOTVISUAL}
            if len(named) == 1:
                entities.setdefault(roi, set()).update(named)
    return entities


def _grounded_phrases(sentence: EntitySentence, boxes: dict[str, list[list[int]]]) -> tuple[list, list]:
    """Char spans and gold boxes of the phrases of `sentence` that have boxes in the image."""
    spans, phrase_boxes = [], []
    for phrase in sentence.phrases:
        if phrase.phrase_id in boxes:
            spans.append([phrase.char_start, phrase.char_end])
            phrase_boxes.append([[float(v) for v in box] for box in boxes[phrase.phrase_id]])
    return spans, phrase_boxes


def _caption_neighbours(
    corpus: Flickr30kEntities | _CachedCorpus, image_ids: list[str], num_neighbours: int
) -> dict[str, list[str]]:
    """The `num_neighbours` images nearest to each image (ties by the earlier id), by TF-IDF cosine of their captions:
    Lu et al. (2019)'s "100 nearest neighbors of the target image", measured without region features."""
    documents = (" ".join(s.text.lower() for s in corpus.sentences(image_id)) for image_id in image_ids)
    order = nearest_neighbours(tfidf_rows(documents), num_neighbours)
    return {image_id: [image_ids[j] for j in order[i]] for i, image_id in enumerate(image_ids)}


def _foreign_caption(
    corpus: Flickr30kEntities | _CachedCorpus, candidates: list[str], image_id: str, rng: random.Random
) -> tuple[EntitySentence, int]:
    """A caption of another image (drawn from `candidates`) and one of its phrases, for the identification negatives."""
    for _ in range(100 * len(candidates)):
        other = rng.choice(candidates)
        if other == image_id:
            continue
        sentences = [s for s in corpus.sentences(other) if s.phrases]
        if sentences:
            sentence = rng.choice(sentences)
            return sentence, rng.randrange(len(sentence.phrases))
    raise ValueError(
        f"no caption with a phrase among the images {candidates[:5]}... drawn as negatives for image {image_id}."
    )


class _CachedCorpus:
    """A `Flickr30kEntities` folder whose captions and annotations are read once per image."""

    def __init__(self, corpus: Flickr30kEntities) -> None:
        self.sentences = functools.cache(corpus.sentences)
        self.annotation = functools.cache(corpus.annotation)


def build_vgp_dataset(
    flickr30k_entities_dir: str | Path,
    vgp_csv: str | Path,
    *,
    replace_caption_prob: float = 1 / 3,
    negatives: str = "hard",
    num_neighbours: int = 100,
    seed: int = 0,
    max_examples: int | None = None,
    split: str | None = None,
    held_out_csvs: Sequence[str | Path] = (),
    on_split_overlap: str = "warn",
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> datasets.Dataset:
    """Visually grounded paraphrase examples from a VGP csv (either published layout) and Flickr30k Entities files.

    Each csv row is placed in two captions of its image by `match_phrases` (the rows skipped are counted in a warning).
    With probability `replace_caption_prob` one caption is replaced by a caption of another image and its phrase by one
    of that caption's phrases: `id_label` then names the caption that still describes the image and the pair is not a
    VGP. The other image is among the `num_neighbours` nearest images (`negatives="hard"`, after Lu et al. 2019) or any
    image of the csv ("random"). Everything is drawn from `seed`.

    Args:
        split: the Flickr30k Entities split of the csv ("train", "val" or "test"); rows on images of the other split
            lists are split overlap.
        held_out_csvs: VGP csvs of the evaluation splits; rows of `vgp_csv` on their images are split overlap too
            (those with the same phrase pair are counted as identical).
        on_split_overlap: "warn" (the default) keeps the overlapping rows, "drop" leaves them out (and out of the
            negatives), "raise" stops; each reports the counts.
        on_missing_image: a row whose image has no `Sentences/` or `Annotations/` file raises ("raise", the default)
            or is skipped and counted in a warning ("skip").
    """
    if not isinstance(replace_caption_prob, (int, float)) or not 0.0 <= replace_caption_prob <= 1.0:
        raise ValueError(f"`replace_caption_prob` must be in [0, 1], got {replace_caption_prob}.")
    if negatives not in ("hard", "random"):
        raise ValueError(f"`negatives` must be 'hard' or 'random', got {negatives!r}.")
    if not isinstance(num_neighbours, int) or num_neighbours < 1:
        raise ValueError(f"`num_neighbours` must be a positive int, got {num_neighbours!r}.")
    if max_examples is not None and (type(max_examples) is not int or max_examples < 1):
        raise ValueError(f"`max_examples` must be a positive int or None, got {max_examples!r}.")
    if split is not None and split not in SPLIT_NAMES:
        raise ValueError(f"`split` must be one of the Flickr30k Entities splits {SPLIT_NAMES} or None, got {split!r}.")
    if on_split_overlap not in SPLIT_OVERLAP_CHOICES:
        raise ValueError(f"`on_split_overlap` must be one of {SPLIT_OVERLAP_CHOICES}, got {on_split_overlap!r}.")
    if isinstance(held_out_csvs, (str, Path)) or not all(isinstance(path, (str, Path)) for path in held_out_csvs):
        raise ValueError(f"`held_out_csvs` must be a list of VGP csv paths, got {held_out_csvs!r}.")
    check_on_missing_image(on_missing_image)
    corpus = Flickr30kEntities(flickr30k_entities_dir)
    pairs = read_vgp_csv(vgp_csv)
    num_csv_rows, source = len(pairs), f"VGP {Path(vgp_csv).name}"
    _report_repeated_rows(pairs, source)
    if split is not None or held_out_csvs:
        pairs = handle_split_overlap(pairs, corpus, split, held_out_csvs, on_split_overlap, source)
    pairs = _pairs_with_images(pairs, corpus, on_missing_image, source)
    captions = _CachedCorpus(corpus)
    image_ids = sorted({pair.image_id for pair in pairs})
    if len(image_ids) < 2 and replace_caption_prob > 0:
        raise ValueError(
            f"`vgp_csv` {vgp_csv} must cover at least two images to draw foreign captions, got {image_ids}."
        )
    matches = _match_rows(captions, pairs)
    summary = _report_matches(num_csv_rows, pairs, matches, source)
    neighbours = _caption_neighbours(captions, image_ids, num_neighbours) if negatives == "hard" else None
    rng = random.Random(seed)
    placed = [(pair, match) for pair, match in zip(pairs, matches) if match.skip_reason is None][:max_examples]
    candidates = neighbours.__getitem__ if neighbours else lambda image_id: image_ids
    rows = (  # in csv order, drawing from `rng` row after row
        _build_row(captions, pair, match, candidates(pair.image_id), rng, replace_caption_prob)
        for pair, match in placed
    )
    dataset = dataset_from_rows(rows, VGP_FEATURES)
    if not len(dataset):
        raise ValueError(f"`vgp_csv` {vgp_csv}: no row could be matched to the captions in {flickr30k_entities_dir}.")
    types = count_vgp_types(dataset)
    dataset.info.description = (
        f"{summary}; rows with a semantic type: {types['typed']}, without "
        f"(not VGPs, left out of the type loss): {types['untyped']}"
    )
    return dataset


def _pairs_with_images(
    pairs: list[VGPPair], corpus: Flickr30kEntities, on_missing_image: str, source: str
) -> list[VGPPair]:
    """The rows whose image has both annotation files; the others raise or are counted (`on_missing_image`)."""
    where = f"Sentences/ and Annotations/ of {corpus.root}"
    has_image = functools.cache(corpus.has_image)  # refuses an id that is not digits
    for pair in pairs:
        if not has_image(pair.image_id) and on_missing_image == "raise":
            raise missing_image_error(source, f"line {pair.line}", pair.image_id, where)
    kept = [pair for pair in pairs if has_image(pair.image_id)]
    report_missing_images(source, len(pairs) - len(kept), len(pairs), "rows", where)
    return kept


def _match_rows(captions: _CachedCorpus, pairs: list[VGPPair]) -> list[PhraseMatch]:
    by_image: dict[str, list[VGPPair]] = {}
    for pair in pairs:
        by_image.setdefault(pair.image_id, []).append(pair)
    rois = {image_id: entities_of_rois(captions.sentences(image_id), rows) for image_id, rows in by_image.items()}
    return [match_phrases(captions.sentences(pair.image_id), pair, rois[pair.image_id]) for pair in pairs]


def _report_repeated_rows(pairs: list[VGPPair], source: str) -> None:
    """Warns about rows that repeat an earlier row in every field but the preprocessed phrases; they are kept, as
    published (the csvs have no pair id; VGP-Typology's train_data.csv lines 315-316 label one pair twice)."""
    first_line, repeats = {}, []
    for pair in pairs:
        key = (pair.image_id, pair.original_phrase1, pair.original_phrase2, pair.is_paraphrase, pair.type_label,
               pair.original_label, pair.roi1, pair.roi2)  # fmt: skip
        first = first_line.setdefault(key, pair.line)
        if first != pair.line:
            repeats.append((pair.line, first))
    if repeats:
        shown = ", ".join(f"line {line} = line {first}" for line, first in repeats[:5]) + (", ..." if len(repeats) > 5 else "")
        logger.warning(
            f"{source}: {len(repeats)} row(s) repeat an earlier row (same image, phrases and labels: {shown}); they are "
            "kept, as published, and count once more each."
        )


def _lines(pairs: list[VGPPair], limit: int = 5) -> str:
    lines = [str(pair.line) for pair in pairs[:limit]]
    return ", ".join(lines) + (", ..." if len(pairs) > limit else "")


def _report_matches(num_csv_rows: int, pairs: list[VGPPair], matches: list[PhraseMatch], source: str) -> str:
    """One warning for the rows skipped (count and csv lines per reason), one for kept rows against their label;
    returns what became of the csv rows, for `dataset.info.description`."""
    skipped = {reason: [p for p, m in zip(pairs, matches) if m.skip_reason == reason] for reason in SKIP_REASONS}
    total = sum(map(len, skipped.values()))
    if total:
        reasons = "; ".join(
            f"{len(rows)} {SKIP_REASONS[reason]} (lines {_lines(rows)})" for reason, rows in skipped.items() if rows
        )
        logger.warning(
            f"{source}: skipped {total} of {len(pairs)} rows that cannot be placed in two captions of their image: "
            f"{reasons}."
        )
    kept = [(p, m) for p, m in zip(pairs, matches) if m.skip_reason is None]
    against = [p for p, m in kept if m.entities == "disagree"]
    if against:
        logger.warning(
            f"{source}: {len(against)} of {len(kept)} kept rows join phrases whose Flickr30k entities disagree with the "
            f"label (a paraphrase on two entities or a non-paraphrase on one): no pair of captions agrees (lines "
            f"{_lines(against)})."
        )
    return (
        f"VGP csv rows: {num_csv_rows}; dropped before matching (split overlap, missing image): "
        f"{num_csv_rows - len(pairs)}; placed in two captions: {len(kept)} ({len(against)} against their label's "
        f"entities); skipped: {', '.join(f'{len(rows)} {reason}' for reason, rows in skipped.items())}"
    )


def _build_row(
    captions: _CachedCorpus,
    pair: VGPPair,
    match: PhraseMatch,
    candidates,
    rng: random.Random,
    replace_caption_prob: float,
) -> dict:
    sentences = captions.sentences(pair.image_id)
    annotation = captions.annotation(pair.image_id)
    chosen = [sentences[match.first.sentence], sentences[match.second.sentence]]
    phrases = [chosen[0].phrases[match.first.phrase], chosen[1].phrases[match.second.phrase]]
    grounded = [_grounded_phrases(caption, annotation.boxes) for caption in chosen]
    id_label, vgp_label = 2, int(pair.is_paraphrase)
    if rng.random() < replace_caption_prob:
        replaced = rng.randrange(2)
        foreign, phrase_index = _foreign_caption(captions, candidates, pair.image_id, rng)
        chosen[replaced], phrases[replaced] = foreign, foreign.phrases[phrase_index]
        grounded[replaced] = ([], [])
        id_label, vgp_label = 1 - replaced, 0
    return {
        "image_id": pair.image_id,
        "image_size": [annotation.height, annotation.width],
        "caption1": chosen[0].text,
        "caption2": chosen[1].text,
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


def count_vgp_types(dataset: datasets.Dataset) -> dict[str, int]:
    """`{"typed": n, "untyped": m, <type name>: count, ...}` of a VGP dataset (`build_vgp_dataset`), every name of
    `TYPOLOGY_LABELS` included; "untyped" rows (`type_label` -1, not VGPs) are left out of the type task's loss."""
    labels = Counter(dataset["type_label"][:])  # one list: iterating the column object formats row by row, far slower
    counts = {name: labels[type_label] for type_label, name in TYPOLOGY_LABELS.items()}
    typed = sum(counts.values())
    return {"typed": typed, "untyped": len(dataset) - typed, **counts}


def find_split_overlap(
    pairs: list[VGPPair],
    split: str | None,
    split_lists: dict[str, list[str]],
    held_out: dict[str, list[VGPPair]] | None = None,
) -> dict[str, list[int]]:
    """"<other>.txt" (a split list of `split_lists` other than `split`, unless `split` is None) or a `held_out` csv's
    name -> the indices of the rows of `pairs` on its images."""
    images = {f"{other}.txt": set(ids) for other, ids in split_lists.items() if split is not None and other != split}
    images.update({name: {pair.image_id for pair in rows} for name, rows in (held_out or {}).items()})
    overlap = {name: [i for i, pair in enumerate(pairs) if pair.image_id in ids] for name, ids in images.items()}
    return {name: indices for name, indices in overlap.items() if indices}


def split_overlap_counts(
    pairs: list[VGPPair], overlap: dict[str, list[int]], held_out: dict[str, list[VGPPair]]
) -> dict[str, dict[str, int]]:
    """Per entry of `overlap` (`find_split_overlap`): its `rows`, their `images` and, for a `held_out` csv,
    `identical_rows` (rows of the same image and the same two phrases as one of its rows)."""
    counts = {}
    for name, indices in overlap.items():
        counts[name] = {"rows": len(indices), "images": len({pairs[i].image_id for i in indices})}
        if name in held_out:
            keys = {_pair_key(pair) for pair in held_out[name]}
            counts[name]["identical_rows"] = sum(_pair_key(pairs[i]) in keys for i in indices)
    return counts


def _pair_key(pair: VGPPair) -> tuple[str, frozenset[str]]:
    return pair.image_id, frozenset(unescape_phrase(p).lower() for p in (pair.original_phrase1, pair.original_phrase2))


def handle_split_overlap(
    pairs: list[VGPPair],
    corpus: Flickr30kEntities,
    split: str | None,
    held_out_csvs: Sequence[str | Path],
    on_split_overlap: str,
    source: str,
) -> list[VGPPair]:
    """Finds the rows of `pairs` on images of other splits (`find_split_overlap`), reports their counts (rows, images,
    identical rows of a held-out csv) and keeps, drops or refuses them following `on_split_overlap`."""
    split_lists = corpus.split_lists() if split is not None else {}
    if split is not None and not set(split_lists) - {split}:
        logger.warning(
            f"{source}: no other Flickr30k Entities split list than {split}.txt in {corpus.root}; rows on images of "
            "other splits cannot be found (the published folder has train.txt, val.txt and test.txt)."
        )
    held_out = {Path(path).name: read_vgp_csv(path) for path in held_out_csvs}
    overlap = find_split_overlap(pairs, split, split_lists, held_out)
    if not overlap:
        return pairs
    rows = sorted({i for indices in overlap.values() for i in indices})
    parts = []
    for name, counts in split_overlap_counts(pairs, overlap, held_out).items():
        part = f"{counts['rows']} row(s) on {counts['images']} image(s) of {name}"
        if "identical_rows" in counts:
            part += f", {counts['identical_rows']} of them identical to its rows"
        parts.append(part)
    message = (
        f"{source}{f' (split {split!r})' if split else ''}: {len(rows)} of {len(pairs)} rows overlap other splits: "
        f"{'; '.join(parts)} (lines {_lines([pairs[i] for i in rows])})"
    )
    if on_split_overlap == "raise":
        raise ValueError(f"{message}; pass on_split_overlap='drop' to leave them out or 'warn' to keep them.")
    if on_split_overlap == "drop":
        logger.warning(f"{message}; dropped (on_split_overlap='drop').")
        dropped = set(rows)
        return [pair for i, pair in enumerate(pairs) if i not in dropped]
    logger.warning(f"{message}; kept (on_split_overlap='warn'; pass 'drop' to leave them out).")
    return pairs


_CSV_NAMES = ("{split}_data.csv", "full_data_type_phrase_pair_{split}.csv", "{split}.csv")
# the splits whose images a split's rows must not be on, besides the split lists: their csvs, when found beside it
_HELD_OUT_SPLITS = {"train": ("val", "test"), "val": ("test",)}


def build(
    data_dir: str | Path,
    split: str,
    *,
    flickr30k_entities_dir: str | Path | None = None,
    vgp_csv: str | Path | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
    **options,
) -> datasets.Dataset:
    """`build_dataset("vgp", data_dir, split)`: the csv of `split` in `data_dir` (`_CSV_NAMES`), joined to Flickr30k
    Entities (by default `data_dir/flickr30k_entities`); `options` go to `build_vgp_dataset`. For a Flickr30k split
    the rows are checked against the other split lists, and a train (val) csv found in `data_dir` against the val and
    test (test) csvs beside it (`held_out_csvs`)."""
    data_dir = Path(data_dir) if data_dir is not None else None
    if vgp_csv is None:
        if data_dir is None:
            raise ValueError("`data_dir` or `vgp_csv` must be given for the vgp dataset.")
        vgp_csv = _split_csv(data_dir, split)
        if vgp_csv is None:
            expected = [name.format(split=split) for name in _CSV_NAMES]
            raise ValueError(f"`data_dir` {data_dir} holds no VGP csv for split {split!r}; expected one of {expected}.")
        siblings = (_split_csv(data_dir, other) for other in _HELD_OUT_SPLITS.get(split, ()))
        options.setdefault("held_out_csvs", [path for path in siblings if path is not None])
    if flickr30k_entities_dir is None:
        if data_dir is None:
            raise ValueError("`flickr30k_entities_dir` must be given when `data_dir` is None.")
        flickr30k_entities_dir = data_dir / "flickr30k_entities"
    if split not in SPLIT_NAMES:
        logger.warning(
            f"VGP split {split!r} is not a Flickr30k Entities split {SPLIT_NAMES}: its rows are not checked against the "
            "split lists for images of other splits."
        )
    seed = options.pop("seed", {"train": 1, "val": 2}.get(split, 3))
    split = split if split in SPLIT_NAMES else None  # rows of another split are checked against no split list
    return build_vgp_dataset(
        flickr30k_entities_dir, vgp_csv, seed=seed, split=split, on_missing_image=on_missing_image, **options
    )


def _split_csv(data_dir: Path, split: str) -> Path | None:
    return next(
        (data_dir / n.format(split=split) for n in _CSV_NAMES if (data_dir / n.format(split=split)).is_file()), None
    )


@dataclass
class VGPData:
    """Everything VGP fine-tuning reads: text-level train/eval examples and the region features of their images."""

    train: datasets.Dataset
    eval: datasets.Dataset
    region_features: RegionFeatureStore
    source: str  # "synthetic" or "files"


def load_vgp_data(
    flickr30k_entities_dir: str | Path | None = None,
    vgp_train_csv: str | Path | None = None,
    vgp_eval_csv: str | Path | None = None,
    region_features: str | Path | RegionFeatureStore | None = None,
    synthetic_config=None,
    negatives: str = "random",
    *,
    eval_split: str = "val",
    on_split_overlap: str = "warn",
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
) -> VGPData:
    """Real files when all four are given (`region_features`: a `RegionFeatureStore` or its directory), otherwise the
    synthetic grounded scenes (the embedded default), generated once and cached, read through the same readers.

    Args:
        negatives, on_split_overlap: passed to `build_vgp_dataset`.
        eval_split: the Flickr30k Entities split of `vgp_eval_csv` ("val", alias "validation", or "test"); the train
            rows are also checked against the eval csv's images.
        on_missing_image: for the images in the Flickr30k Entities files and in `region_features`, checked here,
            before any training.
    """
    eval_split = resolve_split("vgp", eval_split)
    check_on_missing_image(on_missing_image)
    given = {
        "flickr30k_entities_dir": flickr30k_entities_dir,
        "vgp_train_csv": vgp_train_csv,
        "vgp_eval_csv": vgp_eval_csv,
        "region_features": region_features,
    }
    if any(v is not None for v in given.values()) and not all(v is not None for v in given.values()):
        raise ValueError(f"Real VGP data needs all of {list(given)}; got {given}.")
    source = "files"
    if region_features is None:
        from ...synthetic.scenes import load_or_generate_synthetic_vgp

        synthetic = load_or_generate_synthetic_vgp(config=synthetic_config)
        flickr30k_entities_dir, vgp_train_csv = synthetic.flickr30k_entities, synthetic.vgp_csv["train"]
        vgp_eval_csv = synthetic.vgp_csv["val"]
        region_features = _synthetic_store(synthetic.features_tsv, synthetic.root / "region_features")
        source = "synthetic"
    store = region_features if isinstance(region_features, RegionFeatureStore) else RegionFeatureStore.load(region_features)
    shared = {"negatives": negatives, "on_split_overlap": on_split_overlap, "on_missing_image": on_missing_image}
    train = build_vgp_dataset(
        flickr30k_entities_dir, vgp_train_csv, seed=1, split="train", held_out_csvs=[vgp_eval_csv], **shared
    )
    evaluation = build_vgp_dataset(flickr30k_entities_dir, vgp_eval_csv, seed=2, split=eval_split, **shared)
    return VGPData(
        train=rows_with_features(train, store, on_missing_image, f"VGP {Path(vgp_train_csv).name}"),
        eval=rows_with_features(evaluation, store, on_missing_image, f"VGP {Path(vgp_eval_csv).name}"),
        region_features=store,
        source=source,
    )


def rows_with_features(
    dataset: datasets.Dataset,
    store: RegionFeatureStore,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
    source: str = "VGP",
) -> datasets.Dataset:
    """The rows whose `image_id` is in the region-feature store (the VGP collator reads them there); the others raise
    ("raise") or are dropped and counted in a warning ("skip")."""
    where = f"the region-feature store {store.directory}"
    present = [image_id in store for image_id in dataset["image_id"][:]]
    if all(present):
        return dataset
    if on_missing_image == "raise":
        index = present.index(False)
        raise missing_image_error(source, f"row {index}", dataset[index]["image_id"], f"{where} of {len(store)} images")
    report_missing_images(source, present.count(False), len(dataset), "rows", where)
    if not any(present):
        raise ValueError(f"{source}: no row has its image in {where}.")
    return dataset.select([i for i, found in enumerate(present) if found])


def _synthetic_store(features_tsv: Path, directory: Path) -> RegionFeatureStore:
    """The store of the synthetic scenes' TSV, converted once beside it (several processes may race to do so)."""
    if not directory.exists():
        try:
            convert_features(features_tsv, "lxmert_tsv", directory)
        except (ValueError, OSError):
            if not directory.exists():  # not another process winning the race
                raise
    return RegionFeatureStore.load(directory)
