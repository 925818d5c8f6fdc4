"""Flickr30k Entities Sentences/Annotations reader and writer, on the real published files and on hand-made cases."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_vlalign.data.formats import (
    EntityAnnotation,
    EntityPhrase,
    EntitySentence,
    Flickr30kEntities,
    format_sentence,
    parse_sentence,
    read_annotation,
    read_sentences,
    read_split,
    write_annotation,
    write_sentences,
)


DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="module")
def root() -> Path:
    folder = DATA / "flickr30k_entities"
    if not (folder / "Sentences").is_dir() or not (folder / "Annotations").is_dir():
        pytest.fail(f"Real Flickr30k Entities sample missing: expected Sentences/ and Annotations/ in {folder}.")
    return folder


# ----------------------------------------------------------------------------------------------------------------
# Real files
# ----------------------------------------------------------------------------------------------------------------


def test_read_sentences_real_file(root):
    sentences = read_sentences(root / "Sentences" / "1220027979.txt")

    assert len(sentences) == 5
    first = sentences[0]
    assert first.text == "Three children , baby in the center , sit in an outdoor swing chair ."
    assert [(p.phrase_id, p.phrase_types, p.text) for p in first.phrases] == [
        ("5473", ["people"], "Three children"),
        ("5472", ["people"], "baby"),
        ("5477", ["scene"], "the center"),
        ("5475", ["other"], "an outdoor swing chair"),
    ]
    assert [(p.first_word_index, p.char_start, p.char_end) for p in first.phrases] == [
        (0, 0, 14),
        (3, 17, 21),
        (5, 25, 35),
        (10, 45, 67),
    ]
    notvisual = sentences[4].phrases[0]
    assert (notvisual.phrase_id, notvisual.phrase_types, notvisual.text) == ("0", ["notvisual"], "There")


def test_phrase_with_two_types(root):
    sentence = read_sentences(root / "Sentences" / "10350842.txt")[1]

    boat = next(p for p in sentence.phrases if p.phrase_id == "992")
    assert boat.phrase_types == ["vehicles", "scene"]
    assert boat.text == "a small boat"
    assert format_sentence(sentence).count("[/EN#992/vehicles/scene a small boat]") == 1


def test_read_annotation_multi_name_objects_and_nobndbox(root):
    annotation = read_annotation(root / "Annotations" / "1220027979.xml")

    assert (annotation.width, annotation.height, annotation.depth) == (500, 375, 3)
    assert annotation.boxes == {
        "5472": [[191, 124, 307, 319]],
        "5473": [[191, 124, 307, 319], [19, 70, 211, 375], [295, 72, 439, 365]],
        "5474": [[19, 70, 211, 375], [295, 72, 439, 365]],
        "5475": [[4, 46, 499, 375]],
    }
    assert annotation.scene == []
    assert annotation.no_box == ["5477", "5478"]


def test_read_annotation_scene_flags(root):
    annotation = read_annotation(root / "Annotations" / "1000092795.xml")
    assert annotation.scene == ["8", "9"]
    assert annotation.no_box == ["10"]

    both = read_annotation(root / "Annotations" / "10002456.xml")
    assert both.scene == ["17"] and both.no_box == ["17"]
    assert [len(both.boxes[i]) for i in ("11", "15", "16")] == [4, 2, 3]


def test_every_real_sentence_file_round_trips_byte_for_byte(root):
    files = sorted((root / "Sentences").glob("*.txt"))
    assert len(files) > 400
    for path in files:
        sentences = read_sentences(path)
        for sentence in sentences:
            for phrase in sentence.phrases:
                assert sentence.text[phrase.char_start : phrase.char_end] == phrase.text
                assert sentence.text.split()[phrase.first_word_index] == phrase.text.split()[0]
        assert "".join(format_sentence(s) + "\n" for s in sentences) == path.read_text(encoding="utf-8")


def test_every_real_annotation_round_trips(root, tmp_path):
    files = sorted((root / "Annotations").glob("*.xml"))
    assert len(files) > 400
    for path in files:
        annotation = read_annotation(path)
        write_annotation(tmp_path / path.name, annotation)
        assert read_annotation(tmp_path / path.name) == annotation, path.name


def test_written_annotation_matches_published_layout(root, tmp_path):
    published = root / "Annotations" / "1220027979.xml"
    write_annotation(tmp_path / published.name, read_annotation(published))
    assert (tmp_path / published.name).read_bytes() == published.read_bytes()


def test_folder_phrase_ids_match_between_sentences_and_annotations(root):
    dataset = Flickr30kEntities(root)
    val = dataset.image_ids("val")
    assert len(val) == 1000 and val[:2] == ["100652400", "101958970"]
    assert len(dataset.image_ids("train")) == 29783

    for image_id in val[:150]:  # the sample holds the first 150 val images
        annotation = dataset.annotation(image_id)
        annotated = set(annotation.boxes) | set(annotation.scene) | set(annotation.no_box)
        for sentence in dataset.sentences(image_id):
            for phrase in sentence.phrases:
                if phrase.phrase_id == "0":
                    assert phrase.phrase_types == ["notvisual"]
                else:
                    assert phrase.phrase_id in annotated, (image_id, phrase)


# ----------------------------------------------------------------------------------------------------------------
# Hand-made round trips
# ----------------------------------------------------------------------------------------------------------------


def test_hand_written_sentences_round_trip(tmp_path):
    lines = [
        "[/EN#0/notvisual There] is [/EN#7/people/other a man] in [/EN#8/scene the street] .",
        "Nobody is grounded here .",
        "[/EN#9/animals Dogs]",
    ]
    sentences = [parse_sentence(line) for line in lines]
    assert sentences[1] == EntitySentence(text="Nobody is grounded here .", phrases=[])
    assert sentences[2].phrases == [EntityPhrase("9", ["animals"], "Dogs", 0, 0, 4)]

    write_sentences(tmp_path / "Sentences" / "1.txt", sentences)
    assert read_sentences(tmp_path / "Sentences" / "1.txt") == sentences
    assert (tmp_path / "Sentences" / "1.txt").read_text().splitlines() == lines


def test_hand_made_annotation_round_trips_with_crossing_orders(tmp_path):
    annotation = EntityAnnotation(
        width=100,
        height=80,
        depth=3,
        boxes={"1": [[1, 1, 10, 10], [5, 5, 50, 50]], "2": [[2, 2, 20, 20], [5, 5, 50, 50]], "3": [[1, 1, 1, 1]]},
        scene=["5", "4"],
        no_box=["4", "6", "5"],
    )
    write_annotation(tmp_path / "7.xml", annotation)

    assert read_annotation(tmp_path / "7.xml") == annotation
    text = (tmp_path / "7.xml").read_text()
    assert text.startswith("<annotation>\n\t<filename>7.jpg</filename>\n\t<size>\n\t\t<width>100</width>")


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[/EN#1/people A man walks .", r"phrase /EN#1 is never closed"),
        ("[/EN#1/people A [/EN#2/other dog] ] .", r"opens inside phrase /EN#1 \(nesting\)"),
        ("A man] walks .", r"closes a phrase that was never opened"),
        ("[/EN#x/people A man] .", r"expected a phrase header '\[/EN#<id>/<type>', got '\[/EN#x/people'"),
        ("[/EN#1 A man] .", r"expected a phrase header"),
        ("[/EN#1/people] walks .", r"has no words"),
        ("[/EN#1/people A man ] .", r"stray '\]' in phrase /EN#1"),
    ],
)
def test_malformed_markup(line, problem):
    with pytest.raises(ValueError, match=f"malformed markup: .*{problem}"):
        parse_sentence(line)


def test_malformed_markup_names_file_and_line(tmp_path):
    path = tmp_path / "42.txt"
    path.write_text("[/EN#1/people A man] walks .\n[/EN#2/other a dog barks .\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, line 2: malformed markup: phrase /EN#2 is never"):
        read_sentences(path)


@pytest.mark.parametrize(
    ("xml", "problem"),
    [
        ("<annotation>\n\t<size>\n\t\t<width>5</width>\n</annotation>", r"line 4: malformed XML \(mismatched tag"),
        ("<annotation>\n\t<filename>1.jpg</filename>\n</annotation>", r"<annotation> must contain <size>"),
        ("<image><size/></image>", r"expected the root element <annotation>, got <image>"),
        (
            "<annotation><size><width>five</width><height>5</height><depth>3</depth></size></annotation>",
            r"<size>: <width> must be an integer, got 'five'",
        ),
        (
            "<annotation><size><width>9</width><height>9</height><depth>3</depth></size>"
            "<object><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax></bndbox></object></annotation>",
            r"<object> #1 must have at least one non-empty <name>",
        ),
        (
            "<annotation><size><width>9</width><height>9</height><depth>3</depth></size><object><name>3</name>"
            "<bndbox><xmin>5</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax></bndbox></object></annotation>",
            r"<object> #1 \(names \['3'\]\): <bndbox> must have xmin <= xmax and ymin <= ymax, got \[5, 1, 2, 2\]",
        ),
        (
            "<annotation><size><width>9</width><height>9</height><depth>3</depth></size>"
            "<object><name>3</name><scene>0</scene></object></annotation>",
            r"<object> #1 \(names \['3'\]\) must contain <nobndbox>",
        ),
    ],
)
def test_bad_annotation_xml(tmp_path, xml, problem):
    path = tmp_path / "1.xml"
    path.write_text(xml)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}(, |: ){problem}"):
        read_annotation(path)


def test_read_split_rejects_bad_lines(tmp_path):
    path = tmp_path / "val.txt"
    path.write_text("12345\n12 34\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, line 2: expected one numeric image id, got '12 3"):
        read_split(path)


def test_folder_errors(root, tmp_path):
    with pytest.raises(ValueError, match=r"`root` must contain Sentences/ and Annotations/, got"):
        Flickr30kEntities(tmp_path)
    dataset = Flickr30kEntities(root)
    with pytest.raises(ValueError, match=r"`split` must name a <split>.txt file .*got 'dev'"):
        dataset.image_ids("dev")
    with pytest.raises(ValueError, match=r"`image_id` '1' must have a file Annotations/1.xml"):
        dataset.annotation("1")
    with pytest.raises(ValueError, match=r"`path` must be an existing file .* does not exist"):
        read_sentences(tmp_path / "missing.txt")



def test_more_images_than_the_split_holds_says_how_many_are_used(root, caplog):
    from hf_vlalign.data.builders.flickr30k_entities import build

    with caplog.at_level("WARNING"):
        dataset = build(root, "val", max_images=10**5, on_missing_image="skip")
    used = len(set(dataset["image_id"]))
    assert f"`max_images` 100000 is more than the {used} images of Flickr30k Entities val" in caplog.text


def test_rows_become_arrow_in_batches_with_the_same_content():
    from hf_vlalign.data.builders._common import dataset_from_rows
    from hf_vlalign.data.builders.flickr30k_entities import FEATURES

    rows = [
        {"image_id": str(i), "image_size": [4, 5], "sentence_index": i, "sentence": f"a dog {i}",
         "sentence_phrase_spans": [[0, 5]], "sentence_phrase_boxes": [[[1.0, 1.0, 2.0, 2.0]] * i],
         "sentence_phrase_token_spans": [[0, 2]], "phrase_ids": ["1"], "phrase_types": [["animals"]],
         "phrase_nobndbox": [False], "phrase_scene": [False]}
        for i in range(5)
    ]  # fmt: skip
    for batch_size in (1, 2, 3, 10):
        dataset = dataset_from_rows(iter(rows), FEATURES, batch_size=batch_size)
        assert dataset.features == FEATURES and dataset.to_list() == rows
    assert len(dataset_from_rows(iter([]), FEATURES)) == 0
