"""Malformed configs and collator rows (issue 17): one representative of each kind of bad value is refused when the
config is built, and of each kind of bad row when it is collated, by a `ValueError` naming the field (or the batch row
and column), what was expected and what came. A gold box that overlaps no region is counted and warned about, never
put on region 0."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import SingleStreamConfig, TwoStreamConfig, default_text_model_path
from hf_vlalign.data import (
    CaptioningCollator,
    GroundedCaptionCollator,
    ImagePairCollator,
    PhraseGroundingCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    RegionFeatureStore,
    TwoStreamPretrainingCollator,
    VGPCollator,
)
from hf_vlalign.models.captioning import RegionCaptionerConfig

# ----------------------------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------------------------

TINY = {
    "single": (SingleStreamConfig, dict(vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=16, max_position_embeddings=16, visual_feat_dim=6)),
    "two": (TwoStreamConfig, dict(vocab_size=40, hidden_size=8, num_attention_heads=2, intermediate_size=16,
                                  max_position_embeddings=16, l_layers=1, r_layers=1, x_layers=1, visual_feat_dim=6,
                                  num_object_labels=3, num_attr_labels=3, num_qa_labels=3)),
    "captioner": (RegionCaptionerConfig, dict(vocab_size=40, d_model=8, encoder_layers=1, decoder_layers=1,
                                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                              decoder_ffn_dim=16, visual_feat_dim=6, max_position_embeddings=16,
                                              geometry_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                              decoder_start_token_id=1)),
}  # fmt: skip
DROPOUTS = {
    "single": ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
    "two": ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
    "captioner": ("dropout", "attention_dropout"),
}
WEIGHTS = {
    "single": ("initializer_range", "mlm_weight", "vgp_weight", "attention_supervision_weight"),
    "two": ("initializer_range", "mlm_weight", "qa_weight", "attention_supervision_weight"),
    "captioner": ("init_std", "mask_weight"),
}
ACTIVATION = {"single": "hidden_act", "two": "hidden_act", "captioner": "activation_function"}
NAN = float("nan")


# one representative per kind of refused config value: a size, a probability, a name
CONFIG_CASES = [
    ("single", "hidden_size", 0, r"`hidden_size`.* must be .*got .*0"),
    ("two", "hidden_dropout_prob", 1.5, r"`hidden_dropout_prob` must be a dropout probability in \[0, 1\), got 1.5"),
    ("single", "hidden_act", "no_such_act", r"`hidden_act` must be one of transformers' activations .*, got 'no_such_act'"),
]


@pytest.mark.parametrize(
    "family, name, value, match", CONFIG_CASES, ids=[f"{c[0]}-{c[1]}={c[2]!r}" for c in CONFIG_CASES]
)
def test_bad_config_field_is_refused_by_name(family, name, value, match):
    config_class, kwargs = TINY[family]
    with pytest.raises(ValueError, match=match):
        config_class(**{**kwargs, name: value})
    # the same value read from a saved config.json is refused too
    with pytest.raises(ValueError, match=match):
        config_class.from_dict({**kwargs, name: value})


def test_tiny_configs_and_edge_values_are_accepted():
    for family, (config_class, kwargs) in TINY.items():
        edges = {DROPOUTS[family][0]: 0.0, "layer_norm_eps": 1e-12, WEIGHTS[family][0]: 0.0, ACTIVATION[family]: "gelu_new"}
        config = config_class(**kwargs, **edges)
        assert config.layer_norm_eps == 1e-12 and math.isfinite(getattr(config, WEIGHTS[family][0]))
        assert config_class.from_dict(config.to_dict()).to_dict() == config.to_dict()


SUPERVISION_LIKE = ("attention_supervision", "supervised_layers", "supervised_heads", "attention_supervision_weight",
                    "attention_loss_weight", "supervision_method", "attn_loss_weight", "attention_target")  # fmt: skip


def test_captioner_config_refuses_supervision_fields():
    kwargs = TINY["captioner"][1]
    for name in SUPERVISION_LIKE:
        match = rf"`RegionCaptionerConfig` has no attention supervision, got the unknown field\(s\) \['{name}'\]"
        with pytest.raises(ValueError, match=match):
            RegionCaptionerConfig(**kwargs, **{name: "direct"})
        with pytest.raises(ValueError, match=match):
            RegionCaptionerConfig.from_dict({**kwargs, name: [0]})


def test_captioner_config_keeps_other_unknown_fields():
    config = RegionCaptionerConfig(**TINY["captioner"][1], experiment_note="run 3")
    assert config.experiment_note == "run 3" and RegionCaptionerConfig.from_dict(config.to_dict()).experiment_note == "run 3"


# ----------------------------------------------------------------------------------------------------------------
# Collators
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> RegionFeatureStore:
    rng = np.random.default_rng(0)
    records = [
        {"image_id": "1", "image_size": (100, 100), "features": rng.random((3, 6), dtype=np.float32),
         "boxes": np.array([[0, 0, 40, 40], [50, 50, 100, 100], [45, 45, 100, 100]], dtype=np.float32)},
        {"image_id": "2", "image_size": (100, 100), "features": rng.random((2, 6), dtype=np.float32),
         "boxes": np.array([[0, 0, 10, 10], [0, 0, 50, 50]], dtype=np.float32)},
    ]  # fmt: skip
    return RegionFeatureStore.write(records, tmp_path_factory.mktemp("malformed") / "store")


COLLATORS = {
    "caption": lambda tok, store: GroundedCaptionCollator(tok, store),
    "vgp": lambda tok, store: VGPCollator(tok, store),
    "vqa": lambda tok, store: QuestionAnsweringCollator(tok, store, num_answers=5),
    "gqa": lambda tok, store: QuestionAnsweringCollator(tok, store, num_answers=5),
    "nlvr2": lambda tok, store: ImagePairCollator(tok, store),
    "refcoco": lambda tok, store: ReferringExpressionCollator(tok, store),
    "captioning": lambda tok, store: CaptioningCollator(tok, store, reference_column="references"),
    "pretraining": lambda tok, store: TwoStreamPretrainingCollator(tok, store, mismatch_probability=0.0, num_answers=5),
}
GOOD = {
    "caption": {"image_id": "1", "sentence": "a red box and a blue box",
                "sentence_phrase_spans": [[2, 9], [14, 24]], "sentence_phrase_boxes": [[[0, 0, 40, 40]], [[50, 50, 99, 99]]]},
    "vgp": {"image_id": "1", "caption1": "a red box", "caption2": "the box", "phrase1_span": [2, 9],
            "phrase2_span": [4, 7], "id_label": 0, "vgp_label": 1, "type_label": 3},
    "vqa": {"image_id": "1", "question": "what colour?", "labels": [3, 0], "scores": [1.0, 0.3]},
    "gqa": {"image_id": "2", "question": "is it red?", "label": 2},
    "nlvr2": {"left_image_id": "1", "right_image_id": "2", "sentence": "two boxes", "label": 1},
    "refcoco": {"image_id": "1", "expression": "the right box", "expression_phrase_spans": [[0, 13]],
                "expression_phrase_boxes": [[[50, 50, 100, 100]]]},
    "captioning": {"image_id": "1", "caption": "a box", "references": ["a box", "one box"]},
    "pretraining": {"image_id": "1", "question": "what colour?", "label": 1},
}  # fmt: skip
DROP = object()  # a column removed from the row


def case(collator: str, changes, match: str, case_id: str):
    """The second row of a two-row batch is the good row with `changes` (a dict; DROP removes a column), or `changes`
    itself when it is not a dict."""
    return pytest.param(collator, changes, match, id=f"{collator}-{case_id}")


ROW1 = r"batch row 1: "
BAD_ROWS = [
    # one representative per kind of refused row
    case("caption", {"sentence": DROP}, r"rows must have the columns \['sentence'\] for GroundedCaptionCollator; batch row 1", "missing-column"),
    case("vgp", {"type_label": DROP}, r"rows must have the columns \['type_label'\] for VGPCollator; batch row 1", "missing-label-column"),
    case("caption", "a red box", r"batch row 1 must be a dict of columns for GroundedCaptionCollator, got str", "row-not-a-dict"),
    case("caption", {"sentence": 7, "sentence_phrase_spans": DROP}, ROW1 + r"`sentence` must be a string, got int 7", "text-not-a-string"),
    case("nlvr2", {"left_image_id": ["1"]}, ROW1 + r"`left_image_id` must be an image id .*, got list", "image-id-not-an-id"),
    case("caption", {"sentence_phrase_spans": [[2, 9], "14:24"]}, ROW1 + r"`sentence_phrase_spans` must be a character span \[start, end\] of two ints, got str '14:24'", "span-not-two-ints"),
    case("vgp", {"phrase2_span": [4, 70]}, ROW1 + r"`phrase2_span` must be a span with 0 <= start <= end <= 7", "span-outside-text"),
    case("caption", {"sentence_phrase_spans": [[2, 9], [5, 5]]}, r"`sentence_phrase_spans` .*the phrase at characters \[5, 5\] .*has no token after tokenisation", "span-without-token"),
    case("caption", {"sentence_phrase_boxes": [[[0, 0, 40, 40]]]}, ROW1 + r"`sentence_phrase_boxes` must be a list of 2 \(one per phrase span\), got list", "boxes-not-one-per-span"),
    case("caption", {"sentence_phrase_boxes": [[[0, 0, 40, NAN]], []]}, ROW1 + r"`sentence_phrase_boxes` must be lists of 4 finite numbers", "box-not-finite"),
    case("caption", {"sentence_phrase_regions": ["x", None]}, ROW1 + r"`sentence_phrase_regions` must be lists of region weights \(numbers\), got str 'x'", "regions-not-numbers"),
    case("refcoco", {"expression_phrase_boxes": [[]], "expression_phrase_spans": DROP}, ROW1 + r"`expression_phrase_boxes` must be a list holding the referred object's boxes", "no-referred-box"),
    case("nlvr2", {"label": 0.5}, ROW1 + r"`label` must be an int label, got float 0.5", "label-not-an-int"),
    case("vgp", {"type_label": 5}, ROW1 + r"`type_label` must be a label in \[-1, 4\], got int 5", "label-outside-its-classes"),
    case("vqa", {"scores": [1.5, 0.3]}, ROW1 + r"`scores` must be a list of scores in \[0, 1\] \(one per answer id\)", "score-outside-0-1"),
    case("captioning", {"references": ["a box", None]}, ROW1 + r"`references` must be a non-empty list of reference captions \(strings\), got list", "references-not-strings"),
]  # fmt: skip


def bad_row(collator: str, changes) -> object:
    if not isinstance(changes, dict):
        return changes
    row = {**GOOD[collator], **changes}
    return {key: value for key, value in row.items() if value is not DROP}


def test_good_rows_collate(tokenizer, store):
    for collator, row in GOOD.items():
        batch = COLLATORS[collator](tokenizer, store)([row, dict(row)])
        floats = [value for value in batch.values() if torch.is_tensor(value) and value.is_floating_point()]
        assert floats and all(bool(torch.isfinite(value).all()) for value in floats), collator


@pytest.mark.parametrize("collator, changes, match", BAD_ROWS)
def test_bad_row_is_refused_naming_row_and_column(tokenizer, store, collator, changes, match):
    with pytest.raises(ValueError, match=match):
        COLLATORS[collator](tokenizer, store)([GOOD[collator], bad_row(collator, changes)])


def test_gold_box_overlapping_no_region_is_counted_not_put_on_region_0(tokenizer, store, caplog):
    far = {"image_id": "2", "sentence": "a red box and a blue box", "sentence_phrase_spans": [[2, 9], [14, 24]],
           "sentence_phrase_boxes": [[[60, 60, 90, 90]], [[0, 0, 10, 10]]]}  # fmt: skip
    collator = PhraseGroundingCollator(tokenizer, store, return_probe_targets=True)
    with caplog.at_level(logging.WARNING, logger="hf_vlalign.data.collators"):
        batch = collator([far, far])
    assert collator.unmatched_phrases == 2 and "a gold box overlaps no region of its image" in caplog.text
    # the second phrase lies on region 0 itself; the first is kept (a miss for Recall@k) with no mass anywhere
    assert batch["phrase_labels"].tolist() == [[[0.0, 0.0], [1.0, 0.0]]] * 2
    assert batch["phrase_masks"].any(-1).all() and float(batch["phrase_region_iou"][:, 0].sum()) == 0.0
    red = tokenizer.convert_tokens_to_ids("red")
    assert float(batch["word_region_alignment"][batch["input_ids"] == red].sum()) == 0.0


def test_referred_box_overlapping_no_region_is_ignored_not_region_0(tokenizer, store):
    row = {"image_id": "2", "expression": "the far box", "expression_phrase_boxes": [[[60, 60, 90, 90]]]}
    collator = ReferringExpressionCollator(tokenizer, store)
    batch = collator([GOOD["refcoco"], row])
    assert batch["labels"].tolist() == [1, -100] and float(batch["target_region_iou"][1].sum()) == 0.0
    assert collator.unmatched_phrases == 1
