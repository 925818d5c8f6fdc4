"""The user-data format: every task's file (JSON lines and CSV) read into its collator's rows, joined to region features
extracted from real photos, and bad files refused naming the file, the line and the column."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import skimage
import torch
from PIL import Image
from transformers import AutoTokenizer

from hf_vlalign.data.builders.user_data import (
    USER_TASKS,
    UserDataError,
    build_user_dataset,
    load_user_data,
    read_user_rows,
)
from hf_vlalign.data.collators import (
    GroundedCaptionCollator,
    ImagePairCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    VGPCollator,
)
from hf_vlalign.utils.text_model import default_text_model_path

PHOTOS = Path(os.path.dirname(skimage.__file__)) / "data"
CAT = "a cat looks to the side ."


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg"):
        shutil.copy(PHOTOS / name, folder / name)
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


ROWS = {
    "caption": [
        {"image": "photos/chelsea.png", "caption": CAT, "phrases": [{"text": "a cat", "boxes": [[50, 20, 440, 300]]}]},
        {"image": "photos/coffee.png", "caption": "a cup of coffee .", "phrases": [{"text": "a cup", "boxes": [[0, 0, 600, 400]]}]},
    ],
    "vqa": [
        {"image": "photos/chelsea.png", "question": "what animal is this ?", "answer": "cat"},
        {"image": "photos/coffee.png", "question": "what is in the cup ?", "answers": ["coffee", "coffee", "tea"]},
    ],
    "nlvr2": [
        {"left_image": "photos/chelsea.png", "right_image": "photos/coffee.png", "sentence": "one image shows a cat .", "label": True},
        {"left_image": "photos/rocket.jpg", "right_image": "photos/coffee.png", "sentence": "both show a cat .", "label": "false"},
    ],
    "refcoco": [{"image": "photos/chelsea.png", "expression": "the cat", "box": [0, 0, 451, 300]}],
    "vgp": [
        {"image": "photos/chelsea.png", "caption1": CAT, "caption2": "a kitten turns its head .", "phrase1": "a cat",
         "phrase2": "a kitten", "label": "both", "type": "Equivalence"},
    ],
}  # fmt: skip
COLLATORS = {
    "caption": lambda tokenizer, store: GroundedCaptionCollator(tokenizer, store, text_columns=("caption",)),
    "vqa": lambda tokenizer, store: QuestionAnsweringCollator(tokenizer, store, num_answers=3),
    "nlvr2": lambda tokenizer, store: ImagePairCollator(tokenizer, store),
    "refcoco": lambda tokenizer, store: ReferringExpressionCollator(tokenizer, store),
    "vgp": lambda tokenizer, store: VGPCollator(tokenizer, store),
}


@pytest.mark.parametrize("task", USER_TASKS)
def test_every_task_is_read_joined_and_collated(task, photos, tmp_path):
    data = load_user_data(write_jsonl(tmp_path / "train.jsonl", ROWS[task]), task, store_dir=tmp_path / "store")
    assert len(data.train) == len(ROWS[task])
    assert data.region_options == {"grid_size": 4, "include_whole_image": True, "encoder": "pixel"}
    assert data.store[data.train[0].get("image_id") or data.train[0]["left_image_id"]]["boxes"].shape == (17, 4)
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    batch = COLLATORS[task](tokenizer, data.store)(list(data.train))
    assert batch["visual_feats"].shape[-2:] == (17, 256)
    if task == "caption":  # the cat's gold box is covered by the whole-image region and grid cells: aligned
        assert batch["word_region_alignment"].sum() > 0


def test_csv_is_read_like_json_lines(photos, tmp_path):
    csv_file = tmp_path / "train.csv"
    csv_file.write_text(
        'image,caption,phrases\nphotos/chelsea.png,a cat looks to the side .,"[{""text"": ""a cat"", ""boxes"": [[50, 20, 440, 300]]}]"\n'
    )
    from_csv = build_user_dataset(csv_file, "caption")
    from_json = build_user_dataset(write_jsonl(tmp_path / "train.jsonl", ROWS["caption"][:1]), "caption")
    assert from_csv.to_list() == from_json.to_list()
    assert from_csv[0]["caption_phrase_spans"] == [[0, 5]]
    assert from_csv[0]["image_size"] == [300, 451]


def test_nlvr2_rows_of_one_sentence_share_its_identifier(photos, tmp_path):
    rows = [*ROWS["nlvr2"], dict(ROWS["nlvr2"][0], left_image="photos/rocket.jpg")]
    dataset = build_user_dataset(write_jsonl(tmp_path / "pairs.jsonl", rows), "nlvr2")
    # rows 0 and 2 state the same sentence of two image pairs: NLVR2's consistency groups them
    assert dataset["identifier"] == ["user-0-0-0", "user-1-0-0", "user-0-1-0"]
    assert dataset["label"] == [1, 0, 1]


def test_vqa_soft_scores_and_vocabulary(photos, tmp_path):
    data = load_user_data(write_jsonl(tmp_path / "train.jsonl", ROWS["vqa"]), "vqa", store_dir=tmp_path / "store")
    assert data.answer_vocab == {"coffee": 0, "cat": 1, "tea": 2}  # the most frequent first
    assert data.train[1]["labels"] == [0, 2] and data.train[1]["scores"] == pytest.approx([2 / 3, 1 / 3])


def test_given_regions_are_the_store_boxes_and_the_store_is_reused(photos, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    rows = [dict(row, regions=[[0, 0, 100, 100], [50, 20, 440, 300]]) for row in ROWS["caption"][:1]]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    first = load_user_data(path, "caption")
    assert first.store["chelsea"]["boxes"].tolist() == [[0, 0, 100, 100], [50, 20, 440, 300]]
    assert first.train[0]["caption_phrase_regions"] == [[0.0, 1.0]]
    assert load_user_data(path, "caption").store.directory == first.store.directory


def test_the_cache_says_when_it_is_reused_and_re_extracts_only_a_changed_image(photos, tmp_path, monkeypatch, caplog, capsys):
    cache = tmp_path / "cache" / "user_features"
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    caplog.set_level(logging.WARNING)
    path = write_jsonl(tmp_path / "train.jsonl", ROWS["caption"])  # chelsea and coffee
    first = load_user_data(path, "caption")
    coffee = first.store["coffee"]["features"]
    assert f"2 images: 0 reused from the cache {cache}, 2 extracted" in caplog.text
    assert "Extracting 2 images" in capsys.readouterr().err
    caplog.clear()
    assert load_user_data(path, "caption").store.directory == first.store.directory
    assert f"Region features of the 2 images: reused from the cache {first.store.directory}" in caplog.text
    assert "Extracting" not in capsys.readouterr().err
    other = load_user_data(write_jsonl(tmp_path / "other.jsonl", [dict(ROWS["caption"][0], image="photos/astronaut.png")]), "caption")
    # the coffee photo changes: only it is extracted again, and the store of the old photo is dropped (not the other's)
    caplog.clear()
    capsys.readouterr()
    Image.open(photos / "coffee.png").transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(photos / "coffee.png")
    changed = load_user_data(path, "caption")
    assert "2 images: 1 reused from the cache" in caplog.text and "1 extracted; 1 cached store(s)" in caplog.text
    assert "Extracting 1 images" in (err := capsys.readouterr().err) and "Extracting 2" not in err
    assert torch.equal(changed.store["chelsea"]["features"], first.store["chelsea"]["features"])
    assert not torch.equal(changed.store["coffee"]["features"], coffee)
    assert sorted(cache.iterdir()) == sorted([changed.store.directory, other.store.directory])
    assert changed.train[0]["caption_phrase_regions"] == first.train[0]["caption_phrase_regions"]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"image": "photos/chelsea.png"}, "missing ['caption']"),
        ({"image": "photos/nope.png", "caption": CAT}, "`image` 'photos/nope.png' is not a file"),
        ({"image": "photos/chelsea.png", "caption": CAT, "colour": 1}, "unknown column(s) ['colour']"),
        ({"image": "photos/chelsea.png", "caption": CAT, "phrases": [{"text": "a dog", "boxes": [[0, 0, 1, 1]]}]}, "'a dog' is not in the text"),
        ({"image": "photos/chelsea.png", "caption": CAT, "phrases": [{"text": "a cat", "boxes": [[0, 0, 900, 1]]}]}, "0 <= x1 < x2 <= 451"),
        ({"image": "photos/chelsea.png", "caption": CAT, "phrases": [{"text": "a cat", "boxes": [[0, 0, 9]]}]}, "4 numbers"),
        ({"image": "photos/chelsea.png", "caption": ""}, "`caption` must be a non-empty string"),
        ({"image": "photos/chelsea.png", "caption": CAT, "phrases": [{"text": "a cat", "boxes": [[1, 1, 9, 9]], "start": 3}]}, "does not start at character 3"),
    ],
)  # fmt: skip
def test_bad_caption_rows_name_the_file_line_and_column(row, message, photos, tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [ROWS["caption"][0], row])
    with pytest.raises((UserDataError, FileNotFoundError)) as error:
        build_user_dataset(path, "caption")
    assert message in str(error.value) and f"{path}, line 2" in str(error.value)


def test_bad_files_and_labels_are_refused(photos, tmp_path):
    with pytest.raises(ValueError, match="`task` must be one of"):
        read_user_rows(tmp_path / "x.jsonl", "ocr")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        read_user_rows(tmp_path / "absent.jsonl", "caption")
    (tmp_path / "train.txt").write_text("x")
    with pytest.raises(UserDataError, match="JSON lines .* or CSV"):
        read_user_rows(tmp_path / "train.txt", "caption")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserDataError, match="holds no example"):
        read_user_rows(tmp_path / "empty.jsonl", "caption")
    (tmp_path / "broken.jsonl").write_text('{"image": \n')
    with pytest.raises(ValueError, match="line 1: not valid JSON"):
        read_user_rows(tmp_path / "broken.jsonl", "caption")
    bad_label = [dict(ROWS["vgp"][0], label="first")]
    with pytest.raises(UserDataError, match="`label` must be one of"):
        build_user_dataset(write_jsonl(tmp_path / "vgp.jsonl", bad_label), "vgp")
    both_answers = [dict(ROWS["vqa"][0], answers=["cat"])]
    with pytest.raises(UserDataError, match="exactly one of `answer`"):
        build_user_dataset(write_jsonl(tmp_path / "vqa.jsonl", both_answers), "vqa")
    some_regions = [dict(ROWS["caption"][0], regions=[[0, 0, 10, 10]]), ROWS["caption"][1]]
    with pytest.raises(UserDataError, match="on every row or on none"):
        load_user_data(write_jsonl(tmp_path / "regions.jsonl", some_regions), "caption", store_dir=tmp_path / "s")
