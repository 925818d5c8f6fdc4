"""`image_use_gap`: the seeded derangement of images, an image-blind model's gap of exactly 0, a model trained to
read the image scoring far better with its own image than with another's, NLVR2 pairs and the captioner, per-group
results and clear errors; the shuffled-regions control: each image's region features deranged among its own valid
regions (boxes, masks and targets kept), a referring-expression scorer that reads the features losing all its accuracy
while a text-and-box scorer loses none."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from image_use_checks import assert_image_use_reported
from torch import nn
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
    PhraseGroundingCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    RegionFeatureStore,
    region_feature_statistics,
)
from hf_vlalign.evaluation import image_use_gap, shuffled_rows
from hf_vlalign.evaluation.image_use import (
    RegionShuffleCollator,
    image_derangement,
    region_derangement,
    shuffled_region_batch,
)

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
        {"image_id": f"img{index}", "question": "what color is it?", "label": index % CLASSES,
         "answer_type": kind if index % 2 else "other"}  # fmt: skip
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
        assert results["image_use_accuracy_gap"] == results["region_shuffle_accuracy_gap"] == 0.0
        assert results["image_use_loss_gap"] == pytest.approx(0.0, abs=1e-6)
        assert results["region_shuffle_loss_gap"] == pytest.approx(0.0, abs=1e-6)
        assert results["region_shuffle_gap"] == 0.0 and results["region_shuffle_rows_unshuffled"] == 0
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
    # every region of an image shows its colour: a model reading the bag of regions barely minds them shuffled
    assert results["region_shuffle_gap"] == results["region_shuffle_accuracy_gap"] <= results["image_use_gap"] - 0.2
    for group in ("yes_no", "other"):
        assert results[f"region_shuffle_accuracy_gap_{group}"] == pytest.approx(
            results[f"own_image_accuracy_{group}"] - results[f"shuffled_regions_accuracy_{group}"]
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
        {"image_id": f"img{k}", "left_image_id": f"img{k}", "right_image_id": f"img{k + 1}",
         "sentence": "both are red.", "label": k % 2}
        for k in range(0, 12, 2)
    ]
    results = image_use_gap(reasoning, pairs, ImagePairCollator(tokenizer, colour_store), batch_size=4, progress=False)
    assert results["image_use_images"] == 6 and results["image_use_gap_metric"] == "accuracy"
    assert np.isfinite(results["image_use_loss_gap"]) and 0 <= results["own_image_accuracy"] <= 1
    assert 0 <= results["shuffled_regions_accuracy"] <= 1 and results["region_shuffle_rows_unshuffled"] == 0
    assert results["region_shuffle_gap"] == results["own_image_accuracy"] - results["shuffled_regions_accuracy"]

    captioner = RegionCaptionerForConditionalGeneration(
        RegionCaptionerConfig(vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                              decoder_ffn_dim=64, visual_feat_dim=DV, geometry_dim=16)
    )  # fmt: skip
    captions = [{"image_id": f"img{k}", "caption": "a red square."} for k in range(5)]
    caption_collator = CaptioningCollator(tokenizer, colour_store)
    results = image_use_gap(captioner, captions, caption_collator, batch_size=2, progress=False)
    assert results["image_use_gap_metric"] == "loss"  # a captioner has no accuracy: the loss gap is the gap
    assert results["image_use_gap"] == results["image_use_loss_gap"]
    assert results["image_use_loss_gap"] == results["shuffled_image_loss"] - results["own_image_loss"]
    assert results["own_image_loss"] > 0
    assert results["region_shuffle_gap"] == results["region_shuffle_loss_gap"]
    assert_image_use_reported({"image_use": results}, None)  # what the examples' eval_results.json must hold
    assert results["region_shuffle_loss_gap"] == results["shuffled_regions_loss"] - results["own_image_loss"]
    without = image_use_gap(captioner, captions, caption_collator, batch_size=2, shuffle_regions=False, progress=False)
    assert not any("region" in key for key in without) and without["own_image_loss"] == results["own_image_loss"]


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
    with pytest.raises(ValueError, match="`shuffle_regions` must be True or False"):
        image_use_gap(model, colour_rows(), collator, shuffle_regions="yes", progress=False)


# ----------------------------------------------------------------------------------------------------------------
# Shuffled regions
# ----------------------------------------------------------------------------------------------------------------


def region_batch(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A pre-training-like batch of NLVR2 pairs (B, 2, R): images with 6, 4, 2, 1 and 0 valid regions (one with a
    hole), unique features, the appearance targets and gold targets a collator may return."""
    counts = torch.tensor([[6, 4], [2, 1], [0, 5]])
    mask = (torch.arange(6) < counts[..., None]).long()
    mask[2, 1, 1] = 0  # a padded region between valid ones stays put too
    features = torch.randn(3, 2, 6, 5, generator=generator)
    return {
        "visual_feats": features,
        "feature_labels": features.clone(),
        "masked_regions": torch.randint(0, 2, (3, 2, 6), generator=generator) * mask,
        "object_labels": torch.randint(0, 9, (3, 2, 6), generator=generator),
        "region_confidence": torch.rand(3, 2, 6, generator=generator),
        "visual_attention_mask": mask,
        "visual_boxes": torch.rand(3, 2, 6, 4, generator=generator),
        "target_region_iou": torch.rand(3, 2, 6, generator=generator),
        "labels": torch.tensor([1, 0, 1]),
    }


def test_region_derangement_moves_every_valid_region_among_its_images_own():
    batch = region_batch(torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    shuffled, unshuffled = shuffled_region_batch(batch, torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), state)  # its own generator: a random collator's draws are untouched
    assert unshuffled == 2  # row 1's right image has a single region, row 2's left image none
    index = region_derangement(batch["visual_attention_mask"], torch.Generator().manual_seed(1))
    mask = batch["visual_attention_mask"].bool()
    for row in range(3):
        for side in range(2):
            valid, moved = mask[row, side], index[row, side]
            assert sorted(moved[valid].tolist()) == valid.nonzero().flatten().tolist()  # a permutation of the valid
            if valid.sum() >= 2:
                assert bool((moved[valid] != valid.nonzero().flatten()).all())  # none keeps its own features
            else:
                assert torch.equal(shuffled["visual_feats"][row, side], batch["visual_feats"][row, side])
            padding = (~valid).nonzero().flatten()
            assert torch.equal(moved[padding], padding)
            own, new = batch["visual_feats"][row, side], shuffled["visual_feats"][row, side]
            assert torch.equal(new, own[moved]) and torch.equal(new[~valid], own[~valid])
            for key in ("feature_labels", "masked_regions", "object_labels", "region_confidence"):  # appearance moves
                assert torch.equal(shuffled[key][row, side], batch[key][row, side][moved]), key
    for key in ("visual_boxes", "visual_attention_mask", "target_region_iou", "labels"):  # where regions are, targets
        assert shuffled[key] is batch[key], key
    assert torch.equal(shuffled["feature_labels"], shuffled["visual_feats"])


def test_region_shuffle_collator_is_seeded_by_seed_and_batch_index():
    batch = region_batch(torch.Generator().manual_seed(0))

    def shuffles(seed: int) -> list[torch.Tensor]:
        collator = RegionShuffleCollator(lambda rows: dict(batch), seed=seed)
        return [collator([{}])["visual_feats"] for _ in range(2)]

    first, second = shuffles(3)
    assert all(torch.equal(a, b) for a, b in zip(shuffles(3), (first, second)))  # deterministic
    assert not torch.equal(first, second)  # batch 1 gets its own permutation
    assert not torch.equal(shuffles(4)[0], first)
    collator = RegionShuffleCollator(lambda rows: dict(batch), seed=3)
    collator([{}]), collator([{}])
    assert collator.batches == 2 and collator.rows_unshuffled == 4


COLOURS = ("red", "green", "blue")


@pytest.fixture(scope="module")
def referring_store(tmp_path_factory) -> RegionFeatureStore:
    """Images of three regions, one per colour (a seeded arrangement): features the colour's one-hot, boxes apart."""
    generator = torch.Generator().manual_seed(0)
    boxes = np.array([[0, 0, 20, 20], [30, 0, 50, 20], [0, 30, 20, 50]], dtype=np.float32)
    records = []
    for index in range(8):
        features = np.eye(len(COLOURS), DV, dtype=np.float32)[torch.randperm(len(COLOURS), generator=generator).numpy()]
        records.append({"image_id": f"ref{index}", "image_size": (64, 64), "boxes": boxes, "features": features})
    return RegionFeatureStore.write(records, tmp_path_factory.mktemp("referring") / "store")


def referring_rows(store: RegionFeatureStore) -> list[dict]:
    """\"the <colour> one\" for each colour of each image, referring to the box of the region showing that colour."""
    rows = []
    for image_id in store.image_ids:
        image = store.batch([image_id])[0]
        showing = np.asarray(image["features"]).argmax(-1).argsort()  # the region showing each colour
        for name, region in zip(COLOURS, showing):
            box = np.asarray(image["boxes"])[region].tolist()
            rows.append({"image_id": image_id, "expression": f"the {name} one", "expression_phrase_boxes": [[box]]})
    return rows


class ColourWords(nn.Module):
    """The colour each colour word names (its one-hot over the first feature dimensions), 0 for other words."""

    def __init__(self, tokenizer):
        super().__init__()
        table = torch.zeros(tokenizer.vocab_size, DV)
        for colour, token_id in enumerate(tokenizer.convert_tokens_to_ids(list(COLOURS))):
            table[token_id, colour] = 1.0
        self.word_colours = nn.Embedding.from_pretrained(table)

    def named_colour(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (self.word_colours(input_ids) * attention_mask.unsqueeze(-1)).sum(1)  # (B, Dv)

    def output(self, logits: torch.Tensor, visual_attention_mask: torch.Tensor, labels: torch.Tensor | None):
        logits = logits.masked_fill(visual_attention_mask == 0, -1e4)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SimpleNamespace(loss=loss, logits=logits)


class FeatureScorer(ColourWords):
    """Scores each region by how much its features show the colour the expression names."""

    def forward(self, input_ids, attention_mask, visual_feats, visual_attention_mask, labels=None):
        colour = self.named_colour(input_ids, attention_mask)
        return self.output(torch.einsum("bd,brd->br", colour, visual_feats), visual_attention_mask, labels)


class TextAndBoxScorer(ColourWords):
    """Scores each region from the expression and its box only (a colour word -> place prior); never reads features."""

    def forward(self, input_ids, attention_mask, visual_boxes, visual_attention_mask, labels=None):
        colour = self.named_colour(input_ids, attention_mask)[:, : len(COLOURS)]  # (B, 3)
        places = torch.stack([visual_boxes[..., 0], visual_boxes[..., 1], -visual_boxes[..., 0]], dim=-1)  # (B, R, 3)
        return self.output(torch.einsum("bc,brc->br", colour, places), visual_attention_mask, labels)


def test_shuffled_regions_cost_a_feature_reading_referring_scorer_its_accuracy_and_not_a_text_one(
    tokenizer, referring_store
):
    rows = referring_rows(referring_store)
    collator = ReferringExpressionCollator(tokenizer, referring_store)
    reader = image_use_gap(FeatureScorer(tokenizer), rows, collator, batch_size=5, progress=False)
    assert reader["own_image_accuracy"] == 1.0 and reader["shuffled_regions_accuracy"] == 0.0  # 3 regions: all move
    assert reader["region_shuffle_gap"] == reader["region_shuffle_accuracy_gap"] == 1.0
    assert reader["region_shuffle_loss_gap"] == reader["shuffled_regions_loss"] - reader["own_image_loss"]
    assert reader["region_shuffle_loss_gap"] > 0.5 and reader["region_shuffle_rows_unshuffled"] == 0
    assert reader == image_use_gap(FeatureScorer(tokenizer), rows, collator, batch_size=5, progress=False)  # seeded
    assert_image_use_reported({"image_use": reader}, "accuracy")
    blind = image_use_gap(TextAndBoxScorer(tokenizer), rows, collator, batch_size=5, progress=False)
    assert 0.0 < blind["own_image_accuracy"] < 1.0
    assert blind["region_shuffle_accuracy_gap"] == blind["region_shuffle_loss_gap"] == 0.0


# Phrase grounding: a phrase whose gold box overlaps no region of the image put in its place


@pytest.fixture(scope="module")
def sides_store(tmp_path_factory) -> RegionFeatureStore:
    """Images whose two regions are all on the left edge or all on the right edge: a gold box on one edge overlaps no
    region of an image of the other."""
    records = []
    for index in range(6):
        left = index % 2 == 0
        boxes = np.array([[0, 0, 20, 20], [0, 40, 20, 60]] if left else [[80, 0, 100, 20], [80, 40, 100, 60]])
        features = np.eye(2, DV, dtype=np.float32)
        records.append({"image_id": f"side{index}", "image_size": (100, 100), "boxes": boxes.astype(np.float32), "features": features})
    return RegionFeatureStore.write(records, tmp_path_factory.mktemp("sides") / "store")


def side_rows(store: RegionFeatureStore) -> list[dict]:
    """One caption per image whose phrase's gold box is its image's second region."""
    return [
        {"image_id": image_id, "caption": "a red square .", "caption_phrase_spans": [[0, 12]],
         "caption_phrase_boxes": [[np.asarray(store.batch([image_id])[0]["boxes"])[1].tolist()]]}
        for image_id in store.image_ids
    ]  # fmt: skip


class FirstRegion(nn.Module):
    """Phrase grounding logits (B, P, R) that pick each image's first region for every phrase."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, phrase_masks, visual_feats, visual_attention_mask):
        logits = (self.scale * visual_feats[..., 0]).masked_fill(visual_attention_mask == 0, -1e4)
        return SimpleNamespace(logits=logits.unsqueeze(1).expand(-1, phrase_masks.shape[1], -1))


def test_the_shuffled_pass_scores_every_phrase_and_warnings_name_their_pass(tokenizer, sides_store, caplog):
    rows = side_rows(sides_store)
    caplog.set_level(logging.INFO)
    collator = PhraseGroundingCollator(tokenizer, sides_store, text_columns=("caption",))
    results = image_use_gap(FirstRegion(), rows, collator, batch_size=4, shuffle_regions=False, progress=False)
    # every phrase matches a region of its own image: the other images' regions miss some, scored as misses, unwarned
    assert results["own_image_accuracy_items"] == results["shuffled_image_accuracy_items"] == len(rows)
    assert results["own_image_unmatched_phrases"] == 0 and results["shuffled_image_unmatched_phrases"] > 0
    assert results["own_image_accuracy"] == results["shuffled_image_accuracy"] == 0.0  # the first region: never gold
    assert "overlaps no region" not in caplog.text and "image-use check, shuffled images pass: " in caplog.text
    # a gold box of an own image on the other edge: warned, naming the pass
    rows[0] = dict(rows[0], caption_phrase_boxes=[[[80.0, 80.0, 100.0, 100.0]]])
    collator = PhraseGroundingCollator(tokenizer, sides_store, text_columns=("caption",))
    results = image_use_gap(FirstRegion(), rows, collator, batch_size=4, shuffle_regions=False, progress=False)
    assert "PhraseGroundingCollator (image-use check, own images pass): a gold box overlaps no region" in caplog.text
    assert results["own_image_unmatched_phrases"] == 1
    assert results["own_image_accuracy_items"] == results["shuffled_image_accuracy_items"] == len(rows)
