"""How VGP csv rows are placed in two captions of their image, and the split-overlap check, on the real files.

The real samples (../shared/data: VGP-Typology train/val, the identification layout train/val, Flickr30k Entities
Sentences/Annotations and the official split lists) carry every case but two; those (a roi that tells apart two
entities sharing a phrase, a non-paraphrase row) get a small hand-written folder in the published layouts.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from hf_vlalign.data.builders import build_vgp_dataset, build_dataset, load_vgp_data
from hf_vlalign.data.builders import vgp as vgp_builder
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.data.formats import read_vgp_csv
from hf_vlalign.data.formats.flickr30k_entities import EntityAnnotation, Flickr30kEntities, write_annotation
from hf_vlalign.data.formats.vgp import has_markup, unescape_phrase

from shared_samples import real_sample

FLICKR = real_sample("flickr30k_entities")
TYPOLOGY_TRAIN = real_sample("vgp", "VGP-Typology", "train_data.csv")
TYPOLOGY_VAL = real_sample("vgp", "VGP-Typology", "val_data.csv")
IDENTIFICATION_TRAIN = real_sample("vgp", "RA_Files", "full_data_type_phrase_pair_train.csv")
IDENTIFICATION_VAL = real_sample("vgp", "RA_Files", "full_data_type_phrase_pair_val.csv")
VGP_LOGGER = "hf_vlalign.data.builders.vgp"


def _row(path: Path, line: int):
    return next(pair for pair in read_vgp_csv(path) if pair.line == line)


def _match(path: Path, line: int):
    pair = _row(path, line)
    sentences = Flickr30kEntities(FLICKR).sentences(pair.image_id)
    return vgp_builder.match_phrases(sentences, pair), sentences


def _entity(sentences, caption: str, span: list[int]) -> str:
    """The entity id of the phrase at `span` of `caption`, one of the image's captions."""
    sentence = next(s for s in sentences if s.text == caption)
    return next(p.phrase_id for p in sentence.phrases if [p.char_start, p.char_end] == list(span))


def _first_caption_rule(sentences, pair):
    """The published rule the matcher replaces: phrase 1 in the first caption holding it, phrase 2 in the first other."""

    def find(text, exclude=None):
        wanted = text.strip().lower()
        return next(
            (
                (i, j)
                for i, s in enumerate(sentences)
                if i != exclude
                for j, p in enumerate(s.phrases)
                if p.text.lower() == wanted
            ),
            None,
        )

    first = find(pair.original_phrase1)
    second = find(pair.original_phrase2, exclude=first[0]) if first else None
    return (first, second) if second else None


# ----------------------------------------------------------------------------------------------------------------
# Matching on the real files
# ----------------------------------------------------------------------------------------------------------------


def test_every_identification_paraphrase_joins_one_entity_and_21_leave_the_first_caption_rule():
    corpus = Flickr30kEntities(FLICKR)
    pairs = read_vgp_csv(IDENTIFICATION_VAL)
    dataset = build_vgp_dataset(FLICKR, IDENTIFICATION_VAL, replace_caption_prob=0.0)
    assert len(dataset) == len(pairs) == 1425  # every row kept, in csv order

    moved, captions = 0, {}
    for pair, row in zip(pairs, dataset.to_list()):
        if pair.image_id not in captions:
            captions[pair.image_id] = corpus.sentences(pair.image_id)
        sentences = captions[pair.image_id]
        assert row["caption1"][slice(*row["phrase1_span"])].lower() == pair.original_phrase1.lower()
        assert row["caption2"][slice(*row["phrase2_span"])].lower() == pair.original_phrase2.lower()
        assert row["caption1"] != row["caption2"]
        assert _entity(sentences, row["caption1"], row["phrase1_span"]) == _entity(
            sentences, row["caption2"], row["phrase2_span"]
        )
        (i, j), (k, l) = _first_caption_rule(sentences, pair)
        old = [sentences[i].phrases[j], sentences[k].phrases[l]]
        if old[0].phrase_id != old[1].phrase_id:  # the first-caption rule joined two entities: the row moved
            moved += 1
            old_place = [
                (sentences[i].text, [old[0].char_start, old[0].char_end]),
                (sentences[k].text, [old[1].char_start, old[1].char_end]),
            ]
            assert [(row["caption1"], row["phrase1_span"]), (row["caption2"], row["phrase2_span"])] != old_place
    assert moved == 21


def test_a_same_entity_pair_is_preferred_over_the_first_caption():
    # val_data.csv line 32: 19852513, "his haircut" / "a young boy 's hair" (Alternation). "his haircut" is entity
    # 24590 in caption 0 (a haircut being given) but 24589 (the boy's hair) in caption 3; "a young boy 's hair" is
    # 24589 in caption 1. The first-caption rule joined captions 0 and 1, two entities.
    match, sentences = _match(TYPOLOGY_VAL, 32)
    assert _first_caption_rule(sentences, _row(TYPOLOGY_VAL, 32)) == ((0, 1), (1, 2))
    assert (match.first.sentence, match.first.phrase, match.first.entity) == (3, 1, "24589")
    assert (match.second.sentence, match.second.phrase, match.second.entity) == (1, 2, "24589")
    assert match.entities == "agree" and match.skip_reason is None


def test_a_row_only_matchable_through_a_second_caption_is_kept():
    # train_data.csv line 116: 6214447, "another man" / "the first man". Both first meet in caption 1 only, so the
    # first-caption rule found no other caption; "another man" of caption 2 (same entity 250313) is one.
    pair = _row(TYPOLOGY_TRAIN, 116)
    match, sentences = _match(TYPOLOGY_TRAIN, 116)
    assert _first_caption_rule(sentences, pair) is None
    assert (match.first.sentence, match.second.sentence) == (
        2,
        1,
    ) and match.first.entity == match.second.entity == "250313"
    rows = build_vgp_dataset(FLICKR, TYPOLOGY_TRAIN, replace_caption_prob=0.0, on_missing_image="skip")
    kept = [
        r for r in rows if r["image_id"] == "6214447" and r["caption2"][slice(*r["phrase2_span"])] == "the first man"
    ]
    assert len(kept) == 1 and kept[0]["caption1"] == sentences[2].text


def test_backslash_escaped_quotes_match_the_caption():
    # train_data.csv line 14: 490870, "an adults lap" / "a man \'s lap"; the caption writes "a man 's lap"
    pair = _row(TYPOLOGY_TRAIN, 14)
    assert pair.original_phrase2 == "a man \\'s lap" and unescape_phrase(pair.original_phrase2) == "a man 's lap"
    match, sentences = _match(TYPOLOGY_TRAIN, 14)
    assert (
        match.skip_reason is None
        and sentences[match.second.sentence].phrases[match.second.phrase].text == "a man 's lap"
    )


def test_markup_and_same_caption_rows_are_skipped_with_their_reason(caplog):
    with caplog.at_level(logging.WARNING, logger=VGP_LOGGER):
        dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.0)
    assert len(dataset) == 939 - 7 - 12
    warning = caplog.text
    assert "VGP val_data.csv: skipped 19 of 939 rows that cannot be placed in two captions of their image: " in warning
    assert "7 with markup in a phrase cell (lines 50, 825, 828, 911, 913, ...)" in warning
    assert (
        "12 same-caption pairs (the phrases meet, or name one entity, only within one caption) (lines 61, 166, 237, 253, 266, ...)"
        in warning
    )
    assert "no caption of the image marks up" not in warning  # no phrase is missing from its captions
    assert "against their label" not in warning
    assert dataset.info.description.endswith(
        "placed in two captions: 920 (0 against their label's entities); skipped: 7 markup, 0 not_found, 12 same_caption; "
        "rows with a semantic type: 920, without (not VGPs, left out of the type loss): 0"
    )

    # the reasons, row by row
    markup = _row(TYPOLOGY_VAL, 50)  # "his daughter</font> in <font color="red">his daughter"
    assert has_markup(markup.original_phrase1) and _match(TYPOLOGY_VAL, 50)[0].skip_reason == "markup"
    # line 61: 110802332, "A hockey goalie" / "the opposing team", one entity (2808), both only in caption 4
    assert _match(TYPOLOGY_VAL, 61)[0].skip_reason == "same_caption"
    # line 266: 200797624, "coals" / "a variety of food": one entity (24935) within caption 0; "coals" of caption 1
    # is the grill (24934), so two captions would join two entities
    match, sentences = _match(TYPOLOGY_VAL, 266)
    assert match.skip_reason == "same_caption"
    assert [
        (s, p)
        for s, p, e in [(o.sentence, o.phrase, o.entity) for o in vgp_builder.phrase_occurrences(sentences, "coals")]
    ] == [(0, 5), (1, 3)]


# ----------------------------------------------------------------------------------------------------------------
# A hand-written folder in the published layouts: rois, non-paraphrases, phrases not found
# ----------------------------------------------------------------------------------------------------------------

SENTENCES = """[/EN#1/people A man] greets [/EN#2/people a man] .
[/EN#2/people The man] waves at [/EN#1/people the man] .
[/EN#1/people A tall person] stands near [/EN#2/people a short person] on [/EN#3/scene a street] .
[/EN#2/people A man] in [/EN#4/clothing blue] smiles .
"""
IDENTIFICATION_HEADER = "image,phrase1,phrase2,original_phrase1,original_phrase2,ytrue,roi1,roi2,preprocessed_phrase1,preprocessed_phrase2,original_label,type_label\n"


@pytest.fixture()
def two_men(tmp_path) -> Path:
    """Image 100: two men, entities 1 and 2, both called "a man" and "the man" in different captions."""
    root = tmp_path / "flickr30k_entities"
    (root / "Sentences").mkdir(parents=True)
    (root / "Sentences" / "100.txt").write_text(SENTENCES, encoding="utf-8")
    boxes = {
        "1": [[10, 10, 100, 300]],
        "2": [[200, 20, 290, 310]],
        "3": [[1, 250, 400, 320]],
        "4": [[210, 100, 280, 200]],
    }
    write_annotation(root / "Annotations" / "100.xml", EntityAnnotation(width=400, height=320, depth=3, boxes=boxes))
    return root


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "pairs.csv"
    path.write_text(IDENTIFICATION_HEADER + "".join(row + "\n" for row in rows), encoding="utf-8")
    return path


def test_roi_tells_apart_two_entities_that_share_the_phrases(two_men, tmp_path, caplog):
    rows = [
        "100,man,man,a man,the man,True,7,7,man,man,Equivalence,3",  # line 2: which man? roi 7
        "100,short+person,man,a short person,A man,True,7,7,short person,man,Equivalence,3",  # line 3: roi 7 is man 2
    ]
    without_rois = [row.replace(",7,7,", ",,,") for row in rows]
    sentences = Flickr30kEntities(two_men).sentences("100")
    by_position = vgp_builder.match_phrases(sentences, read_vgp_csv(_csv(tmp_path, without_rois))[0])
    assert (by_position.first.entity, by_position.first.sentence, by_position.second.sentence) == (
        "1",
        0,
        1,
    )  # the first

    pairs = read_vgp_csv(_csv(tmp_path, rows))
    assert vgp_builder.entities_of_rois(sentences, pairs) == {7: {"2"}}  # "a short person" names entity 2 only
    with caplog.at_level(logging.WARNING, logger=VGP_LOGGER):
        dataset = build_vgp_dataset(two_men, _csv(tmp_path, rows), replace_caption_prob=0.0)
    row = dataset[0]
    assert (row["caption1"], row["phrase1_span"]) == ("A man greets a man .", [13, 18])  # the second "a man": man 2
    assert (row["caption2"], row["phrase2_span"]) == ("The man waves at the man .", [0, 7])  # "The man": man 2
    assert row["caption1_phrase_boxes"][1] == [[200.0, 20.0, 290.0, 310.0]]
    assert caplog.text == ""  # nothing skipped, nothing against the label


def test_the_label_decides_between_one_and_two_entities(two_men, tmp_path):
    # "a man" (man 1 and man 2 in caption 0, man 2 in caption 3) / "a tall person" (man 1, caption 2): as a
    # paraphrase the earliest pair, man 1 twice; as a non-paraphrase the second "a man" of caption 0, man 2
    sentences = Flickr30kEntities(two_men).sentences("100")
    positive, negative = read_vgp_csv(
        _csv(tmp_path, ["100,man,tall+person,a man,a tall person,True,,,man,tall person,Equivalence,3",
                        "100,man,tall+person,a man,a tall person,False,,,man,tall person,,"])
    )  # fmt: skip
    match = vgp_builder.match_phrases(sentences, positive)
    assert (match.first.sentence, match.first.phrase, match.first.entity, match.second.entity) == (0, 0, "1", "1")
    match = vgp_builder.match_phrases(sentences, negative)
    assert (match.first.sentence, match.first.phrase, match.first.entity, match.second.entity) == (0, 1, "2", "1")
    assert match.entities == "agree"


def test_not_found_and_against_the_label_are_counted(two_men, tmp_path, caplog):
    rows = [
        "100,man,short+person,a man,a short person,True,,,man,short person,Equivalence,3",  # man 2 in captions 0 and 2
        "100,woman,man,a woman,the man,True,,,woman,man,Equivalence,3",  # no "a woman" in the captions
        "100,street,blue,a street,blue,True,,,street,blue,Independence,4",  # two entities, no caption pair agrees
    ]
    with caplog.at_level(logging.WARNING, logger=VGP_LOGGER):
        dataset = build_vgp_dataset(two_men, _csv(tmp_path, rows), replace_caption_prob=0.0)
    assert len(dataset) == 2
    assert (
        "VGP pairs.csv: skipped 1 of 3 rows that cannot be placed in two captions of their image: 1 with a phrase that no caption of the image marks up (lines 3)."
        in caplog.text
    )
    assert (
        "VGP pairs.csv: 1 of 2 kept rows join phrases whose Flickr30k entities disagree with the label" in caplog.text
    )
    assert "(lines 4)" in caplog.text


# ----------------------------------------------------------------------------------------------------------------
# Split overlap
# ----------------------------------------------------------------------------------------------------------------

TRAIN_OVERLAP = "VGP train_data.csv (split 'train'): 10 of 323 rows overlap other splits: 1 row(s) on 1 image(s) of val.txt; 9 row(s) on 7 image(s) of test.txt"


def test_train_rows_on_test_images_are_counted_and_can_be_dropped(caplog):
    with caplog.at_level(logging.WARNING, logger=VGP_LOGGER):
        kept = build_vgp_dataset(
            FLICKR, TYPOLOGY_TRAIN, split="train", replace_caption_prob=0.0, on_missing_image="skip"
        )
    assert (
        TRAIN_OVERLAP
        + " (lines 302, 303, 314, 315, 316, ...); kept (on_split_overlap='warn'; pass 'drop' to leave them out)."
        in caplog.text
    )
    assert len(kept) == 304  # the 9 test rows are then skipped only because the sample lacks the test images' files

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        dropped = build_vgp_dataset(
            FLICKR,
            TYPOLOGY_TRAIN,
            split="train",
            held_out_csvs=[TYPOLOGY_VAL],
            on_split_overlap="drop",
            replace_caption_prob=0.0,
        )
    assert TRAIN_OVERLAP + "; 1 row(s) on 1 image(s) of val_data.csv, 1 of them identical to its rows" in caplog.text
    assert "dropped (on_split_overlap='drop')" in caplog.text and "on_missing_image" not in caplog.text
    assert len(dropped) == 323 - 10 - 10  # 10 overlapping rows, then the 10 same-caption pairs
    test_images = set((FLICKR / "test.txt").read_text().split()) | set((FLICKR / "val.txt").read_text().split())
    assert not test_images & set(dropped["image_id"])
    assert "dropped before matching (split overlap, missing image): 10" in dropped.info.description

    with pytest.raises(ValueError, match=re.escape(TRAIN_OVERLAP) + r".*pass on_split_overlap='drop'"):
        build_vgp_dataset(FLICKR, TYPOLOGY_TRAIN, split="train", on_split_overlap="raise")
    with pytest.raises(
        ValueError, match=r"`on_split_overlap` must be one of \('warn', 'drop', 'raise'\), got 'ignore'"
    ):
        build_vgp_dataset(FLICKR, TYPOLOGY_TRAIN, split="train", on_split_overlap="ignore")
    with pytest.raises(ValueError, match=r"`split` must be one of the Flickr30k Entities splits"):
        build_vgp_dataset(FLICKR, TYPOLOGY_TRAIN, split="dev")


def test_split_overlap_finds_rows_by_split_lists_and_held_out_csvs():
    pairs = read_vgp_csv(TYPOLOGY_TRAIN)
    lists = Flickr30kEntities(FLICKR).split_lists()
    assert set(lists) == {"train", "val", "test"}
    overlap = vgp_builder.find_split_overlap(pairs, "train", lists, {"val_data.csv": read_vgp_csv(TYPOLOGY_VAL)})
    assert {name: len(rows) for name, rows in overlap.items()} == {"val.txt": 1, "test.txt": 9, "val_data.csv": 1}
    assert overlap["val.txt"] == overlap["val_data.csv"] and pairs[overlap["val.txt"][0]].line == 302
    assert vgp_builder.find_split_overlap(read_vgp_csv(TYPOLOGY_VAL), "val", lists) == {}  # the val csv is all val
    assert vgp_builder.find_split_overlap(pairs, None, lists) == {}  # no split, no list read


def test_build_dataset_vgp_checks_the_csvs_beside_it(tmp_path, caplog):
    data_dir = tmp_path / "vgp"
    data_dir.mkdir()
    for name, path in (
        ("train_data.csv", TYPOLOGY_TRAIN),
        ("val_data.csv", TYPOLOGY_VAL),
        ("flickr30k_entities", FLICKR),
    ):
        (data_dir / name).symlink_to(path)
    with caplog.at_level(logging.WARNING, logger=VGP_LOGGER):
        rows = build_dataset("vgp", data_dir, "train", on_split_overlap="drop", negatives="random")
    assert len(rows) == 303
    assert "1 row(s) on 1 image(s) of val_data.csv, 1 of them identical to its rows" in caplog.text


# ----------------------------------------------------------------------------------------------------------------
# load_vgp_data: images missing from the store are found before training
# ----------------------------------------------------------------------------------------------------------------


def _store(image_ids: list[str], directory: Path) -> RegionFeatureStore:
    corpus = Flickr30kEntities(FLICKR)
    records = []
    for image_id in image_ids:
        annotation = corpus.annotation(image_id)
        boxes = np.array(
            [box for boxes in annotation.boxes.values() for box in boxes] + [[0, 0, 5, 5]], dtype=np.float32
        )
        records.append({"image_id": image_id, "image_size": (annotation.height, annotation.width), "boxes": boxes,
                        "features": np.ones((len(boxes), 4), dtype=np.float32)})  # fmt: skip
    return RegionFeatureStore.write(records, directory)


def test_load_vgp_data_refuses_or_counts_rows_whose_image_has_no_features(tmp_path, caplog):
    train_images = sorted({p.image_id for p in read_vgp_csv(IDENTIFICATION_TRAIN)})
    val_images = sorted({p.image_id for p in read_vgp_csv(IDENTIFICATION_VAL)})
    absent = train_images[0]
    store = _store([i for i in train_images + val_images if i != absent], tmp_path / "store")
    files = (FLICKR, IDENTIFICATION_TRAIN, IDENTIFICATION_VAL, store)

    with pytest.raises(
        ValueError,
        match=rf"VGP full_data_type_phrase_pair_train.csv: row \d+: image '{absent}' is not in the region-feature store",
    ):
        load_vgp_data(*files)
    with caplog.at_level(logging.WARNING):
        data = load_vgp_data(*files, on_missing_image="skip")
    absent_rows = sum(p.image_id == absent for p in read_vgp_csv(IDENTIFICATION_TRAIN))
    assert len(data.train) == 305 - absent_rows and len(data.eval) == 1425 and absent not in data.train["image_id"]
    assert (
        f"VGP full_data_type_phrase_pair_train.csv: {absent_rows} of 305 rows skipped (on_missing_image='skip'): image not "
        f"in the region-feature store {store.directory}." in caplog.text
    )
    assert "overlap" not in caplog.text  # train and val images and csvs are apart
