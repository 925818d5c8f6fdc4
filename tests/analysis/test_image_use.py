"""`image_use_gap`: the seeded derangement of images, an image-blind model's gap of exactly 0, a model trained to
read the image scoring far better with its own image than with another's, NLVR2 pairs and the captioner, per-group
results and clear errors."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForQuestionAnswering,
    SingleStreamForVisualReasoning,
    TwoStreamConfig,
    TwoStreamForQuestionAnswering,
    default_text_model_path,
)
from hf_vlalign.data import (
    CaptioningCollator,
    ImagePairCollator,
    QuestionAnsweringCollator,
    RegionFeatureStore,
    region_feature_statistics,
)
from hf_vlalign.evaluation import image_use_gap, shuffled_rows
from hf_vlalign.evaluation.image_use import image_derangement

NUM_IMAGES, REGIONS, DV, CLASSES = 24, 3, 6, 3


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


@pytest.fixture(scope="module")
def colour_store(tmp_path_factory) -> RegionFeatureStore:
    """Images of one of three "colours": every region's features are that colour's one-hot (x 3) plus noise."""
    rng = np.random.default_rng(0)
    records = []
    for index in range(NUM_IMAGES):
        colour = index % CLASSES
        features = rng.normal(0.0, 0.3, (REGIONS, DV)).astype(np.float32)
        features[:, colour] += 3.0
        corners = rng.random((REGIONS, 2)) * 30
        boxes = np.concatenate([corners, corners + 20], axis=1).astype(np.float32)
        records.append({"image_id": f"img{index}", "image_size": (64, 64), "boxes": boxes, "features": features})
    return RegionFeatureStore.write(records, tmp_path_factory.mktemp("colours") / "store")


def colour_rows(kind: str = "plain") -> datasets.Dataset:
    """Two identical questions per image whose answer is the image's colour: only the image tells them apart."""
    rows = [
        {"image_id": f"img{index}", "question": "what color is it?", "label": index % CLASSES, "answer_type": kind if index % 2 else "other"}
        for index in range(NUM_IMAGES)
        for _ in range(2)
    ]
    return datasets.Dataset.from_list(rows)


def tiny_single_stream(vocab_size: int) -> SingleStreamForQuestionAnswering:
    torch.manual_seed(0)
    config = SingleStreamConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, visual_feat_dim=DV, num_qa_labels=CLASSES, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return SingleStreamForQuestionAnswering(config)


def test_derangement_moves_every_image_to_another_one_seeded():
    keys = [f"i{k}" for k in range(10)]
    mapping = image_derangement(keys + keys[:3], seed=3)
    assert sorted(mapping) == sorted(mapping.values()) == sorted(keys)  # a permutation of the distinct images
    assert all(source != target for source, target in mapping.items())
    assert mapping == image_derangement(keys, seed=3) != image_derangement(keys, seed=4)
    with pytest.raises(ValueError, match="at least 2 distinct images"):
        image_derangement(["a", "a"])


def test_shuffled_rows_take_another_images_columns_and_drop_region_joins():
    rows = [
        {"image_id": "1", "feature_row": 10, "question": "q1", "question_phrase_regions": [[1.0]]},
        {"image_id": "1", "feature_row": 10, "question": "q2", "question_phrase_regions": [[1.0]]},
        {"image_id": "2", "feature_row": 20, "question": "q3", "question_phrase_regions": [[1.0]]},
        {"image_id": "3", "feature_row": 30, "question": "q4", "question_phrase_regions": [[1.0]]},
    ]
    shuffled = shuffled_rows(rows, seed=0)
    for row, new in zip(rows, shuffled):
        assert new["image_id"] != row["image_id"] and new["question"] == row["question"]
        assert new["feature_row"] == int(new["image_id"]) * 10  # the store row travels with its image
        assert "question_phrase_regions" not in new
    assert shuffled[0]["image_id"] == shuffled[1]["image_id"]  # one image, one replacement
    pairs = [{"image_id": f"l{k}", "left_image_id": f"l{k}", "right_image_id": f"r{k}", "label": 1} for k in range(3)]
    for row, new in zip(pairs, shuffled_rows(pairs, seed=1)):
        assert (new["left_image_id"], new["right_image_id"]) != (row["left_image_id"], row["right_image_id"])
        assert new["left_image_id"][1:] == new["right_image_id"][1:]  # a pair moves as a whole
        assert new["image_id"] == new["left_image_id"]  # NLVR2's join column is the left image


def test_an_image_blind_model_has_a_gap_of_exactly_zero(tokenizer, colour_store):
    for model in (tiny_single_stream(tokenizer.vocab_size), tiny_two_stream(tokenizer.vocab_size)):
        with torch.no_grad():  # regions carry nothing of their image: projections of features and boxes at 0
            for name, parameter in model.named_parameters():
                if "visual_embeddings" in name and ("projection" in name):
                    parameter.zero_()
        collator = QuestionAnsweringCollator(tokenizer=tokenizer, region_features=colour_store, num_answers=CLASSES)
        results = image_use_gap(model, colour_rows(), collator, batch_size=10, progress=False)
        assert results["image_use_accuracy_gap"] == 0.0
        assert results["image_use_loss_gap"] == pytest.approx(0.0, abs=1e-6)
        assert results["own_image_loss"] > 0 and results["image_use_gap_metric"] == "accuracy"
        assert results["image_use_examples"] == 2 * NUM_IMAGES and results["image_use_images"] == NUM_IMAGES


def tiny_two_stream(vocab_size: int) -> TwoStreamForQuestionAnswering:
    torch.manual_seed(0)
    config = TwoStreamConfig(
        vocab_size=vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
        l_layers=1, r_layers=1, x_layers=1, visual_feat_dim=DV, num_qa_labels=CLASSES, num_object_labels=4,
        num_attr_labels=4,
    )  # fmt: skip
    return TwoStreamForQuestionAnswering(config)


def test_a_model_trained_to_read_the_image_loses_its_accuracy_with_another_image(tokenizer, colour_store):
    model = tiny_single_stream(tokenizer.vocab_size)
    model.set_visual_feature_statistics(*region_feature_statistics(colour_store))
    rows = colour_rows("yes/no")
    collator = QuestionAnsweringCollator(tokenizer=tokenizer, region_features=colour_store, num_answers=CLASSES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(60):
        batch = collator([rows[int(i)] for i in torch.randperm(len(rows), generator=generator)[:16]])
        model(**{k: v for k, v in batch.items() if k != "word_region_alignment"}).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    results = image_use_gap(model, rows, collator, batch_size=16, group_column="answer_type", progress=False)
    assert model.training  # left in the mode it had
    assert results["own_image_accuracy"] >= 0.6, results
    assert results["shuffled_image_accuracy"] <= 0.4, results  # about a third of the other images share the colour
    assert results["image_use_gap"] == results["image_use_accuracy_gap"] >= 0.3
    assert results["image_use_loss_gap"] > 0.5
    for group in ("yes_no", "other"):  # one accuracy and gap per answer type, names made key-safe
        assert results[f"image_use_accuracy_gap_{group}"] == pytest.approx(
            results[f"own_image_accuracy_{group}"] - results[f"shuffled_image_accuracy_{group}"]
        )
    again = image_use_gap(model, rows, collator, batch_size=7, group_column="answer_type", progress=False)
    assert again["shuffled_image_accuracy"] == results["shuffled_image_accuracy"]  # seeded, batch-independent


def test_image_pairs_and_the_captioner(tokenizer, colour_store):
    torch.manual_seed(0)
    reasoning = SingleStreamForVisualReasoning(
        SingleStreamConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, visual_feat_dim=DV)
    )  # fmt: skip
    pairs = [
        {"image_id": f"img{k}", "left_image_id": f"img{k}", "right_image_id": f"img{k + 1}", "sentence": "both are red.",
         "label": k % 2}
        for k in range(0, 12, 2)
    ]
    results = image_use_gap(reasoning, pairs, ImagePairCollator(tokenizer, colour_store), batch_size=4, progress=False)
    assert results["image_use_images"] == 6 and results["image_use_gap_metric"] == "accuracy"
    assert np.isfinite(results["image_use_loss_gap"]) and 0 <= results["own_image_accuracy"] <= 1

    captioner = RegionCaptionerForConditionalGeneration(
        RegionCaptionerConfig(vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                              decoder_ffn_dim=64, visual_feat_dim=DV, geometry_dim=16)
    )  # fmt: skip
    captions = [{"image_id": f"img{k}", "caption": "a red square."} for k in range(5)]
    results = image_use_gap(captioner, captions, CaptioningCollator(tokenizer, colour_store), batch_size=2, progress=False)
    assert results["image_use_gap_metric"] == "loss"  # a captioner has no accuracy: the loss gap is the gap
    assert results["image_use_gap"] == results["image_use_loss_gap"] == results["shuffled_image_loss"] - results["own_image_loss"]
    assert results["own_image_loss"] > 0


def test_errors_are_clear(tokenizer, colour_store):
    model = tiny_single_stream(tokenizer.vocab_size)
    collator = QuestionAnsweringCollator(tokenizer=tokenizer, region_features=colour_store, num_answers=CLASSES)
    one_image = [{"image_id": "img0", "question": "what color?", "label": 0}] * 3
    with pytest.raises(ValueError, match="at least 2 distinct images"):
        image_use_gap(model, one_image, collator, progress=False)
    with pytest.raises(ValueError, match="`group_column` 'answer_type' is not a column"):
        image_use_gap(model, one_image, collator, group_column="answer_type", progress=False)
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1"):
        image_use_gap(model, colour_rows(), collator, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="must name their image in `image_id`"):
        image_use_gap(model, [{"question": "q", "label": 0}] * 2, collator, progress=False)
