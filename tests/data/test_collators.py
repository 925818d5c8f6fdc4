"""Task-family collators on real annotation rows (Flickr30k Entities, NLVR2) and the real MiniLM tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.alignment import alignment_target, box_iou, gold_region_iou
from hf_vlalign.data import (
    CaptioningCollator,
    GroundedCaptionCollator,
    ImagePairCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    RegionFeatureStore,
    build_dataset,
)
from hf_vlalign.data.collators.base import phrases_gold_iou

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
if not SHARED.is_dir():
    raise RuntimeError(f"The real data samples are expected in {SHARED} (the `shared` folder beside the repository).")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


def region_record(image_id: str, boxes, size=(100, 100), dim: int = 8) -> dict:
    boxes = np.asarray(boxes, dtype=np.float32)
    return {
        "image_id": image_id,
        "image_size": size,
        "boxes": boxes,
        "features": np.random.default_rng(len(boxes)).random((len(boxes), dim), dtype=np.float32),
        "object_conf": np.linspace(0.9, 0.5, len(boxes)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def flickr_rows_and_store(tmp_path_factory):
    """Real Flickr30k Entities val captions; regions = each image's gold boxes widened by 4 px, plus a distractor."""
    rows = build_dataset("flickr30k_entities", SHARED / "flickr30k_entities", "val", max_images=3)
    records = {}
    for row in rows:
        height, width = row["image_size"]
        gold = [box for boxes in row["sentence_phrase_boxes"] for box in boxes]
        widened = [[x1, y1, min(x2 + 4, width), y2] for x1, y1, x2, y2 in gold]
        records.setdefault(row["image_id"], []).extend(widened)
    store = RegionFeatureStore.write(
        [region_record(i, sorted(set(map(tuple, b))) + [(0, 0, 3, 3)], size=tuple(r["image_size"])) for i, b, r in
         ((i, b, next(r for r in rows if r["image_id"] == i)) for i, b in records.items())],
        tmp_path_factory.mktemp("flickr") / "store",
    )  # fmt: skip
    return rows, store


def test_caption_collator_aligns_real_phrases_to_their_regions(tokenizer, flickr_rows_and_store):
    rows, store = flickr_rows_and_store
    examples = [rows[i] for i in range(4)]
    batch = GroundedCaptionCollator(tokenizer, store, return_probe_targets=True)(examples)
    B, T = batch["input_ids"].shape
    R = batch["visual_feats"].shape[1]
    assert batch["word_region_alignment"].shape == (B, T, R) and batch["visual_boxes"].shape == (B, R, 4)
    sums = batch["word_region_alignment"].sum(-1)
    torch.testing.assert_close(sums[sums > 0], torch.ones_like(sums[sums > 0]))
    # one phrase checked by hand: its tokens spell the phrase and its row puts mass only on IoU >= 0.5 regions
    first = examples[0]
    boxed = [p for p, boxes in enumerate(first["sentence_phrase_boxes"]) if boxes]
    span = first["sentence_phrase_spans"][boxed[0]]
    mask = batch["phrase_masks"][0, 0]
    text = tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(batch["input_ids"][0, mask].tolist()))
    assert text == first["sentence"][span[0] : span[1]].lower()
    image = store[first["image_id"]]
    iou = box_iou(torch.tensor(first["sentence_phrase_boxes"][boxed[0]]), image["boxes"]).amax(0)
    row = batch["word_region_alignment"][0, mask.nonzero()[0, 0], : len(iou)]
    torch.testing.assert_close(row, (iou >= 0.5).float() / (iou >= 0.5).sum())
    assert (batch["phrase_region_iou"].amax(-1)[batch["phrase_token_index"] >= 0] >= 0.5).all()


def test_targets_built_by_build_dataset_match_the_collators_own(tokenizer, flickr_rows_and_store):
    rows, store = flickr_rows_and_store
    joined = build_dataset("flickr30k_entities", SHARED / "flickr30k_entities", "val", region_features=store, max_images=3)
    assert "sentence_phrase_regions" in joined.column_names and joined["feature_row"][0] == store.row_of(joined[0]["image_id"])
    collator = GroundedCaptionCollator(tokenizer, store)
    from_store = collator([joined[i] for i in range(5)])
    from_boxes = collator([rows[i] for i in range(5)])
    torch.testing.assert_close(from_store["word_region_alignment"], from_boxes["word_region_alignment"])



def test_every_phrase_target_is_the_one_phrase_formula(tokenizer, flickr_rows_and_store):
    """The collator computes each text's IoU in one matrix; every phrase's probe IoU and alignment rows are still
    exactly `gold_region_iou` and `alignment_target` of that phrase alone."""
    rows, store = flickr_rows_and_store
    examples = [rows[i] for i in range(6)]
    batch = GroundedCaptionCollator(tokenizer, store, return_probe_targets=True)(examples)
    checked = 0
    for i, example in enumerate(examples):
        pixels = torch.as_tensor(store[example["image_id"]]["boxes"], dtype=torch.float32)
        region_mask = batch["visual_attention_mask"][i, : len(pixels)]
        golds = [torch.tensor(boxes, dtype=torch.float32) for boxes in example["sentence_phrase_boxes"] if boxes]
        for p, gold in enumerate(golds):
            target = alignment_target(gold, pixels, region_mask)
            probe_iou = batch["phrase_region_iou"][i, p, : len(pixels)]
            assert torch.equal(probe_iou, gold_region_iou(gold, pixels) * region_mask)
            for token in batch["phrase_masks"][i, p].nonzero()[:, 0]:
                assert torch.equal(batch["word_region_alignment"][i, token, : len(pixels)], target)
            checked += 1
        assert not batch["phrase_masks"][i, len(golds) :].any()
    assert checked >= 10
    # one IoU matrix over several phrases gives each phrase's own values, bit for bit; a phrase without a box: None
    golds = [torch.tensor([[0.0, 0.0, 5.0, 5.0]]), torch.zeros(0, 4), torch.tensor([[1.0, 1, 4, 9], [2, 2, 8, 8]])]
    regions = torch.tensor([[0.0, 0.0, 4.0, 4.0], [1.0, 2.0, 8.0, 9.0], [6.0, 6.0, 9.0, 9.0]])
    first, missing, last = phrases_gold_iou(golds, regions)
    assert missing is None and phrases_gold_iou([torch.zeros(0, 4)], regions) == [None]
    assert torch.equal(first, gold_region_iou(golds[0], regions))
    assert torch.equal(last, gold_region_iou(golds[2], regions))

def test_image_pair_collator_on_real_nlvr2_rows(tokenizer, tmp_path):
    rows = build_dataset("nlvr2", SHARED / "nlvr2", "dev").select(range(3))
    image_ids = sorted({row[c] for row in rows for c in ("left_image_id", "right_image_id")})
    store = RegionFeatureStore.write(
        [region_record(i, [[0, 0, 50, 50]] * (2 + n % 3)) for n, i in enumerate(image_ids)], tmp_path / "store"
    )
    batch = ImagePairCollator(tokenizer, store)([rows[i] for i in range(3)])
    R = batch["visual_feats"].shape[2]
    assert batch["visual_feats"].shape == (3, 2, R, 8) and batch["visual_attention_mask"].shape == (3, 2, R)
    assert batch["labels"].tolist() == rows["label"]
    right = store[rows[1]["right_image_id"]]
    assert int(batch["visual_attention_mask"][1, 1].sum()) == len(right["boxes"])
    torch.testing.assert_close(batch["visual_feats"][1, 1, : len(right["boxes"])], right["features"])
    joined = build_dataset("nlvr2", SHARED / "nlvr2", "dev", region_features=store, on_missing_image="skip")
    assert len(joined) >= 3 and {"left_feature_row", "right_feature_row"} <= set(joined.column_names)


def test_referring_expression_question_answering_and_captioning(tokenizer, tmp_path):
    store = RegionFeatureStore.write(
        [region_record("1", [[0, 0, 40, 40], [50, 50, 100, 100], [45, 45, 100, 100]]), region_record("2", [[0, 0, 10, 10]])],
        tmp_path / "store",
    )
    expression = {"image_id": "1", "expression": "the right square", "expression_phrase_spans": [[0, 16]],
                  "expression_phrase_boxes": [[[50, 50, 100, 100]]]}  # fmt: skip
    batch = ReferringExpressionCollator(tokenizer, store)([expression])
    assert batch["labels"].tolist() == [1]
    assert batch["target_region_iou"][0, 2] == pytest.approx(50 * 50 / 55**2)
    assert batch["word_region_alignment"][0, 1:4].sum(-1).tolist() == [1.0, 1.0, 1.0]  # both regions at IoU >= 0.5

    questions = [
        {"image_id": "1", "question": "what colour?", "labels": [3, 0], "scores": [1.0, 1 / 3]},
        {"image_id": "2", "question": "how many?", "labels": [], "scores": []},
    ]
    batch = QuestionAnsweringCollator(tokenizer, store, num_answers=5)(questions)
    assert batch["labels"].shape == (2, 5) and batch["labels"][0].tolist() == pytest.approx([1 / 3, 0, 0, 1, 0])
    gqa = [{"image_id": "1", "question": "is it red?", "label": 2}, {"image_id": "2", "question": "why?", "label": -1}]
    assert QuestionAnsweringCollator(tokenizer, store, num_answers=3)(gqa)["labels"].tolist() == [2, -100]
    with pytest.raises(ValueError, match=r"answer label 7 is outside the vocabulary of `num_answers`=5"):
        QuestionAnsweringCollator(tokenizer, store, num_answers=5)([{**questions[0], "labels": [7], "scores": [1.0]}])
    with pytest.raises(ValueError, match=r"`num_answers` must be the size of the answer vocabulary"):
        QuestionAnsweringCollator(tokenizer, store)

    captions = [{"image_id": "1", "caption": "two squares"}, {"image_id": "2", "caption": "a small square in a corner"}]
    batch = CaptioningCollator(tokenizer, store)(captions)
    assert "input_ids" not in batch and batch["labels"].shape == batch["decoder_attention_mask"].shape
    assert (batch["labels"][0][batch["decoder_attention_mask"][0] == 0] == -100).all()
    assert tokenizer.decode(batch["labels"][1][batch["labels"][1] >= 0], skip_special_tokens=True) == captions[1]["caption"]
    # the targets start at the first word (the decoder starts from [CLS]) and end with [SEP]
    first = batch["labels"][0][batch["decoder_attention_mask"][0] == 1].tolist()
    assert first == tokenizer("two squares", add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]


def test_rows_joined_to_differently_named_store_images_collate_through_their_feature_row(tokenizer, tmp_path):
    # RefCOCO+ / VQA rows carry the COCO id ("581857"); the store names the image "COCO_train2014_000000581857"
    coco_name = "COCO_train2014_000000581857"
    store = RegionFeatureStore.write(
        [region_record("other", [[0, 0, 10, 10]]), region_record(coco_name, [[0, 0, 40, 40], [50, 50, 100, 100]])],
        tmp_path / "store",
    )
    row = {"image_id": "581857", "feature_row": store.row_of(coco_name), "expression": "the right square",
           "expression_phrase_spans": [[0, 16]], "expression_phrase_boxes": [[[50, 50, 100, 100]]]}  # fmt: skip
    batch = ReferringExpressionCollator(tokenizer, store)([row])
    assert torch.equal(batch["visual_feats"][0], store[coco_name]["features"])
    assert batch["labels"].tolist() == [1]
    # an id the store has is read by name, whatever `feature_row` says
    named = ReferringExpressionCollator(tokenizer, store)([{**row, "image_id": coco_name, "feature_row": 0}])
    assert torch.equal(named["visual_feats"], batch["visual_feats"])
    with pytest.raises(ValueError, match=r"`image_id` '581857' is not in the region-feature store"):
        ReferringExpressionCollator(tokenizer, store)([{k: v for k, v in row.items() if k != "feature_row"}])
    with pytest.raises(ValueError, match=r"`image_id` '999' is not in the region-feature store, and its `feature_row`"):
        ReferringExpressionCollator(tokenizer, store)([{**row, "image_id": "999"}])  # a row joined to another image


def test_collator_errors_are_clear(tokenizer, tmp_path):
    no_size = RegionFeatureStore.write([region_record("1", [[0, 0, 4, 4]], size=None)], tmp_path / "store")
    with pytest.raises(ValueError, match=r"image '1' has no image size in the region-feature store"):
        GroundedCaptionCollator(tokenizer, no_size)([{"image_id": "1", "sentence": "a box"}])
    with pytest.raises(ValueError, match=r"`region_features` must be a RegionFeatureStore, got list"):
        GroundedCaptionCollator(tokenizer, [])
    with pytest.raises(ValueError, match=r"rows must have the columns \['sentence'\]"):
        GroundedCaptionCollator(tokenizer, no_size)([{"image_id": "1", "caption": "a box"}])
