"""Property tests: any input to a model forward (attention supervision on, so the losses run), a validator or a collator
either runs with FINITE outputs and losses, or raises ValueError; never another exception type, never NaN."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from transformers import AutoTokenizer

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForPhraseGrounding,
    SingleStreamForPreTraining,
    SingleStreamForQuestionAnswering,
    SingleStreamForReferringExpression,
    SingleStreamForVisualReasoning,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamForPhraseGrounding,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamForReferringExpression,
    default_text_model_path,
)
from hf_vlalign.data import (
    CaptioningCollator,
    GroundedCaptionCollator,
    ImagePairCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    RegionFeatureStore,
    TwoStreamPretrainingCollator,
    VGPCollator,
)
from hf_vlalign.models.captioning import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration
from hf_vlalign.utils.validation import check_alignment, check_normalised_boxes

V, DV, MAX_T = 40, 6, 12
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    single = SingleStreamConfig(vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=16, max_position_embeddings=MAX_T, visual_feat_dim=DV,
                                attention_supervision="direct")  # fmt: skip
    two = TwoStreamConfig(vocab_size=V, hidden_size=8, num_attention_heads=2, intermediate_size=16,
                          max_position_embeddings=MAX_T, l_layers=1, r_layers=1, x_layers=1, visual_feat_dim=DV,
                          num_object_labels=3, num_attr_labels=3, num_qa_labels=3, task_alignment=True,
                          alignment_top_k=2, attention_supervision="semi_direct")  # fmt: skip
    captioner = RegionCaptionerConfig(vocab_size=V, d_model=8, encoder_layers=1, decoder_layers=1,
                                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                      decoder_ffn_dim=16, visual_feat_dim=DV, max_position_embeddings=MAX_T,
                                      geometry_dim=8, attention_alignment="gate", pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2, decoder_start_token_id=1)  # fmt: skip
    return {
        "single": SingleStreamModel(single).eval(),
        "two": TwoStreamForPreTraining(two).eval(),
        "captioner": RegionCaptionerForConditionalGeneration(captioner).eval(),
    }


# ----------------------------------------------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------------------------------------------

SPECIAL = st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.5, 1.5, 0.0, 1.0])
UNIT = st.floats(0.0, 1.0, width=32)


@st.composite
def boxes(draw, batch: int, num_regions: int) -> torch.Tensor:
    """Mostly valid normalised boxes; sometimes out of range, degenerate (x2 <= x1) or NaN."""
    corners = draw(hnp.arrays(np.float32, (batch, num_regions, 2), elements=st.floats(0.0, 0.5, width=32)))
    sizes = draw(hnp.arrays(np.float32, (batch, num_regions, 2), elements=st.floats(0.0625, 0.375, width=32)))
    values = np.concatenate([corners, corners + sizes], axis=-1)
    kind = draw(st.sampled_from(["valid", "valid", "special", "degenerate"]))
    if kind != "valid":
        b, r, c = draw(st.integers(0, batch - 1)), draw(st.integers(0, num_regions - 1)), draw(st.integers(0, 3))
        if kind == "special":
            values[b, r, c] = draw(SPECIAL)
        else:
            values[b, r, 2] = values[b, r, 0]
    return torch.from_numpy(values)


def masks(draw, batch: int, length: int) -> torch.Tensor:
    """Random 0/1 masks, rows of all zeros included."""
    return torch.from_numpy(draw(hnp.arrays(np.int64, (batch, length), elements=st.sampled_from([0, 1, 1, 1]))))


@st.composite
def alignments(draw, batch: int, text_length: int, num_regions: int, region_mask: torch.Tensor) -> torch.Tensor:
    """Rows that are distributions over real regions or zeros; sometimes negative, unnormalised or NaN values."""
    raw = draw(hnp.arrays(np.float32, (batch, text_length, num_regions), elements=UNIT))
    alignment = torch.from_numpy(raw) * region_mask[:, None, :].float()
    grounded = torch.from_numpy(draw(hnp.arrays(np.bool_, (batch, text_length, 1))))
    sums = alignment.sum(-1, keepdim=True)
    alignment = torch.where(grounded & (sums > 1e-3), alignment / sums.clamp_min(1e-6), torch.zeros_like(alignment))
    if draw(st.booleans()) and alignment.numel():
        b, t, r = (draw(st.integers(0, n - 1)) for n in (batch, text_length, num_regions))
        alignment[b, t, r] = draw(SPECIAL)
    return alignment


@st.composite
def vision_language_batches(draw) -> dict[str, torch.Tensor]:
    batch, text_length, num_regions = draw(st.integers(1, 3)), draw(st.integers(1, MAX_T + 2)), draw(st.integers(0, 5))
    region_mask = masks(draw, batch, num_regions)
    feats = draw(hnp.arrays(np.float32, (batch, num_regions, DV), elements=st.floats(-3, 3, width=32)))
    if draw(st.integers(0, 4)) == 0 and feats.size:
        feats.flat[draw(st.integers(0, feats.size - 1))] = draw(SPECIAL)
    return {
        "input_ids": torch.from_numpy(draw(hnp.arrays(np.int64, (batch, text_length), elements=st.integers(0, V)))),
        "attention_mask": masks(draw, batch, text_length),
        "visual_feats": torch.from_numpy(feats),
        "visual_boxes": draw(boxes(batch, num_regions)) if num_regions else torch.zeros(batch, 0, 4),
        "visual_attention_mask": region_mask,
        "word_region_alignment": draw(alignments(batch, text_length, num_regions, region_mask)),
    }


def assert_finite(*tensors) -> None:
    for tensor in tensors:
        if tensor is not None:
            assert bool(torch.isfinite(tensor).all()), "a model returned NaN/inf instead of raising ValueError"


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


@FUZZ
@given(vision_language_batches())
def test_single_stream_forward_is_finite_or_raises_value_error(batch):
    try:
        out = models()["single"](**batch)
    except ValueError:
        return
    assert_finite(out.last_hidden_state, out.loss_attention_supervision)


@FUZZ
@given(vision_language_batches(), st.booleans())
def test_two_stream_pretraining_is_finite_or_raises_value_error(batch, with_labels):
    labels = {}
    if with_labels:
        labels = {"labels": batch["input_ids"].clamp(max=V - 1), "matched_labels": torch.ones(len(batch["input_ids"]), dtype=torch.long)}
    try:
        out = models()["two"](**batch, **labels)
    except ValueError:
        return
    assert_finite(out.loss, out.loss_attention_supervision, out.loss_alignment, out.alignment_scores, out.prediction_logits)


@FUZZ
@given(vision_language_batches(), st.sampled_from(["align", "perturb"]))
def test_captioner_forward_is_finite_or_raises_value_error(batch, mode):
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    try:
        out = models()["captioner"](
            visual_feats=batch["visual_feats"], visual_boxes=batch["visual_boxes"],
            visual_attention_mask=batch["visual_attention_mask"], labels=labels, alignment_mode=mode,
        )  # fmt: skip
    except ValueError:
        return
    assert_finite(out.logits, out.loss_caption, out.loss_mask)


# ----------------------------------------------------------------------------------------------------------------
# Heads' labels (issue 17): fixed valid regions and text (the last region and token of example 1 are padding), fuzzed
# labels (NaN/inf, out of range, float instead of int, on padding, wrong shapes): a finite loss or a ValueError, and a
# target on a padded position is always refused
# ----------------------------------------------------------------------------------------------------------------

HB, HT, HR, HP, HA = 2, 5, 4, 2, 3


@functools.cache
def head_models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    single = SingleStreamConfig(vocab_size=V, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16, max_position_embeddings=MAX_T, visual_feat_dim=DV,
                                num_qa_labels=HA, num_object_labels=3)  # fmt: skip
    two = TwoStreamConfig(vocab_size=V, hidden_size=8, num_attention_heads=2, intermediate_size=16,
                          max_position_embeddings=MAX_T, l_layers=1, r_layers=1, x_layers=1, visual_feat_dim=DV,
                          num_object_labels=3, num_attr_labels=3, num_qa_labels=HA)  # fmt: skip
    return {
        "ss_qa": SingleStreamForQuestionAnswering(single).eval(),
        "ts_qa": TwoStreamForQuestionAnswering(two).eval(),
        "ss_nlvr2": SingleStreamForVisualReasoning(single).eval(),
        "ss_refcoco": SingleStreamForReferringExpression(single).eval(),
        "ts_refcoco": TwoStreamForReferringExpression(two).eval(),
        "ss_grounding": SingleStreamForPhraseGrounding(single).eval(),
        "ts_grounding": TwoStreamForPhraseGrounding(two).eval(),
        "ss_pretrain": SingleStreamForPreTraining(single).eval(),
        "ts_pretrain": models()["two"],
    }


def head_batch(pair: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (HB, 2, HR) if pair else (HB, HR)
    corners = torch.rand(*shape, 2, generator=generator) * 0.5
    region_mask = torch.ones(shape, dtype=torch.long)
    region_mask[1, ..., HR - 1] = 0
    text_mask = torch.ones(HB, HT, dtype=torch.long)
    text_mask[1, HT - 1] = 0
    return {
        "input_ids": torch.randint(3, V, (HB, HT), generator=generator), "attention_mask": text_mask,
        "visual_feats": torch.randn(*shape, DV, generator=generator) * region_mask[..., None],
        "visual_boxes": torch.cat([corners, corners + 0.25], dim=-1) * region_mask[..., None],
        "visual_attention_mask": region_mask,
    }  # fmt: skip


LABEL_VALUE = st.sampled_from([-100, -100, -1, 0, 1, 2, 3, V - 1, V])
SOFT = UNIT | SPECIAL


@st.composite
def int_labels(draw, shape: tuple[int, ...]) -> torch.Tensor:
    """Integer labels, sometimes of another shape or a float dtype."""
    kind = draw(st.sampled_from(["ok", "ok", "ok", "float", "shape"]))
    if kind == "shape":
        shape = (*shape, 2) if len(shape) == 1 else shape[:-1]
    labels = torch.from_numpy(draw(hnp.arrays(np.int64, shape, elements=LABEL_VALUE)))
    return labels.float() if kind == "float" else labels


def soft_scores(draw, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(draw(hnp.arrays(np.float32, shape, elements=SOFT)))


def on_padding(labels: torch.Tensor, mask: torch.Tensor) -> bool:
    """A target (not -100 / not 0) on a position the mask pads, for labels of the mask's shape."""
    if tuple(labels.shape) != tuple(mask.shape) or labels.is_floating_point():
        return False
    return bool(((labels != -100) & (mask == 0)).any())


def finite_loss_or_value_error(model, inputs) -> None:
    try:
        out = model(**inputs)
    except ValueError:
        return
    assert out.loss is None or bool(torch.isfinite(out.loss)), "a head returned a NaN/inf loss instead of raising"


@FUZZ
@given(st.data(), st.sampled_from(["ss", "ts"]))
def test_answer_labels_are_finite_or_raise(data, family):
    batch = head_batch()
    soft = data.draw(st.booleans())
    labels = soft_scores(data.draw, (HB, HA)) if soft else data.draw(int_labels((HB,)))
    finite_loss_or_value_error(head_models()[f"{family}_qa"], {**batch, "labels": labels})


@FUZZ
@given(st.data())
def test_nlvr2_labels_are_finite_or_raise(data):
    labels = data.draw(int_labels((HB,))) if data.draw(st.booleans()) else soft_scores(data.draw, (HB,))
    batch = head_batch(pair=True)
    inputs = {**batch, "input_ids": batch["input_ids"], "labels": labels}
    finite_loss_or_value_error(head_models()["ss_nlvr2"], inputs)


@FUZZ
@given(st.data(), st.sampled_from(["ss", "ts"]))
def test_referring_labels_are_finite_or_raise_and_never_name_padding(data, family):
    batch = head_batch()
    labels = torch.tensor([data.draw(st.sampled_from([-100, -1, 0, 1, 2, 3, 4])) for _ in range(HB)])
    inputs = {**batch, "labels": labels}
    if data.draw(st.booleans()):
        inputs["target_region_iou"] = soft_scores(data.draw, (HB, HR))
    padded = labels[1] == HR - 1
    if padded and "target_region_iou" not in inputs:
        with pytest.raises(ValueError, match="`labels`"):
            head_models()[f"{family}_refcoco"](**inputs)
        return
    finite_loss_or_value_error(head_models()[f"{family}_refcoco"], inputs)


@FUZZ
@given(st.data(), st.sampled_from(["ss", "ts"]))
def test_phrase_labels_are_finite_or_raise_and_never_ground_on_padding(data, family):
    batch = head_batch()
    phrase_masks = torch.from_numpy(data.draw(hnp.arrays(np.int64, (HB, HP, HT), elements=st.sampled_from([0, 1]))))
    phrase_labels = data.draw(alignments(HB, HP, HR, torch.ones(HB, HR)))
    inputs = {**batch, "phrase_masks": phrase_masks, "phrase_labels": phrase_labels}
    if bool(torch.isfinite(phrase_labels).all()) and bool((phrase_labels[1, :, HR - 1] > 0).any()):
        with pytest.raises(ValueError, match="`phrase_labels`"):
            head_models()[f"{family}_grounding"](**inputs)
        return
    finite_loss_or_value_error(head_models()[f"{family}_grounding"], inputs)


@FUZZ
@given(st.data(), st.sampled_from(["ss", "ts"]))
def test_pretraining_labels_are_finite_or_raise_and_never_target_padding(data, family):
    batch = head_batch()
    labels = data.draw(int_labels((HB, HT)))
    masked = torch.from_numpy(data.draw(hnp.arrays(np.int64, (HB, HR), elements=st.sampled_from([0, 0, 1, 2]))))
    objects = data.draw(int_labels((HB, HR)))
    features = soft_scores(data.draw, (HB, HR, DV)) if data.draw(st.booleans()) else batch["visual_feats"].clone()
    inputs = {**batch, "labels": labels, "masked_regions": masked, "object_labels": objects, "feature_labels": features}
    must_refuse = on_padding(labels, batch["attention_mask"]) or on_padding(objects, batch["visual_attention_mask"])
    if must_refuse:
        with pytest.raises(ValueError):
            head_models()[f"{family}_pretrain"](**inputs)
        return
    finite_loss_or_value_error(head_models()[f"{family}_pretrain"], inputs)


@FUZZ
@given(st.data())
def test_caption_labels_are_finite_or_raise(data):
    length = data.draw(st.integers(1, MAX_T))
    shape = data.draw(st.sampled_from([(2, length), (length,), (2, length, 1)]))
    labels = torch.from_numpy(data.draw(hnp.arrays(np.int64, shape, elements=LABEL_VALUE)))
    if data.draw(st.booleans()):
        labels = labels.float()
    batch = head_batch()
    inputs = {name: batch[name] for name in ("visual_feats", "visual_boxes", "visual_attention_mask")}
    if data.draw(st.booleans()):
        inputs["decoder_attention_mask"] = torch.from_numpy(
            data.draw(hnp.arrays(np.int64, (2, data.draw(st.integers(1, MAX_T))), elements=st.sampled_from([-1, 0, 1, 1])))
        )
    finite_loss_or_value_error(models()["captioner"], {**inputs, "labels": labels})


# ----------------------------------------------------------------------------------------------------------------
# Validators
# ----------------------------------------------------------------------------------------------------------------


@FUZZ
@given(st.data())
def test_box_validator_accepts_exactly_the_valid_boxes(data):
    batch, num_regions = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4))
    values = data.draw(boxes(batch, num_regions))
    valid = masks(data.draw, batch, num_regions) if data.draw(st.booleans()) else None
    rows = values if valid is None else values[valid.bool()]
    expected_ok = bool(torch.isfinite(values).all()) and (
        rows.numel() == 0
        or (bool((rows >= 0).all() & (rows <= 1).all()) and bool(((rows[..., 2] > rows[..., 0]) & (rows[..., 3] > rows[..., 1])).all()))
    )
    if expected_ok:
        check_normalised_boxes("visual_boxes", values, valid)
    else:
        with pytest.raises(ValueError, match="`visual_boxes`"):
            check_normalised_boxes("visual_boxes", values, valid)


@FUZZ
@given(st.data())
def test_alignment_validator_accepts_exactly_distributions_or_zeros(data):
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)))
    alignment = data.draw(alignments(*shape, torch.ones(shape[0], shape[2])))
    sums = alignment.sum(-1)
    expected_ok = (
        bool(torch.isfinite(alignment).all())
        and bool((alignment >= 0).all())
        and bool((((sums - 1).abs() <= 1e-3) | (sums.abs() <= 1e-3)).all())
    )
    if expected_ok:
        check_alignment("word_region_alignment", alignment)
    else:
        with pytest.raises(ValueError, match="`word_region_alignment`"):
            check_alignment("word_region_alignment", alignment)


# ----------------------------------------------------------------------------------------------------------------
# Collators
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> RegionFeatureStore:
    rng = np.random.default_rng(0)
    records = []
    for index, count in enumerate([1, 3, 5]):
        corners = rng.uniform(0, 50, (count, 2))
        records.append({
            "image_id": str(index), "image_size": (100, 120), "features": rng.random((count, DV), dtype=np.float32),
            "boxes": np.concatenate([corners, corners + rng.uniform(5, 40, (count, 2))], axis=1).astype(np.float32),
        })  # fmt: skip
    return RegionFeatureStore.write(records, tmp_path_factory.mktemp("fuzz") / "store")


WORDS = st.sampled_from(["a", "red", "circle", "left", "of", "the", "big", "blue", "square", "."])


@st.composite
def caption_rows(draw) -> list[dict]:
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        sentence = " ".join(draw(st.lists(WORDS, min_size=1, max_size=12)))
        start = draw(st.integers(0, len(sentence) + 3))
        span = [start, draw(st.integers(start, len(sentence) + 5))]
        box = [draw(st.floats(-20, 130)) for _ in range(4)]
        regions = draw(st.none() | st.lists(st.floats(-0.5, 1.5) | SPECIAL, min_size=0, max_size=6))
        row = {"image_id": draw(st.sampled_from(["0", "1", "2", "unknown"])), "sentence": sentence,
               "sentence_phrase_spans": [span], "sentence_phrase_boxes": [[box]]}  # fmt: skip
        if regions is not None:
            row["sentence_phrase_regions"] = [regions]
        rows.append(row)
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(caption_rows(), st.integers(2, 16))
def test_caption_collator_gives_a_valid_batch_or_raises_value_error(tokenizer, store, rows, max_text_length):
    try:
        batch = GroundedCaptionCollator(tokenizer, store, max_text_length=max_text_length)(rows)
    except ValueError:
        return
    alignment = batch["word_region_alignment"]
    assert bool(torch.isfinite(alignment).all()) and bool(torch.isfinite(batch["visual_boxes"]).all())
    check_alignment("word_region_alignment", alignment)
    check_normalised_boxes("visual_boxes", batch["visual_boxes"], batch["visual_attention_mask"])
    assert not bool(((alignment > 0) & (batch["visual_attention_mask"][:, None, :] == 0)).any())
    assert bool((batch["attention_mask"].sum(-1) > 0).all())


# ----------------------------------------------------------------------------------------------------------------
# Collators' row schemas (issue 17): any column of a well-formed row of each task replaced by junk (or removed), in
# any batch row, gives a batch of finite tensors or a ValueError; never a KeyError, TypeError or IndexError
# ----------------------------------------------------------------------------------------------------------------

SCHEMA_COLLATORS = {
    "caption": lambda tok, store: GroundedCaptionCollator(tok, store),
    "vgp": lambda tok, store: VGPCollator(tok, store),
    "vqa": lambda tok, store: QuestionAnsweringCollator(tok, store, num_answers=4),
    "gqa": lambda tok, store: QuestionAnsweringCollator(tok, store, num_answers=4),
    "nlvr2": lambda tok, store: ImagePairCollator(tok, store),
    "refcoco": lambda tok, store: ReferringExpressionCollator(tok, store),
    "captioning": lambda tok, store: CaptioningCollator(tok, store, reference_column="references"),
    "pretraining": lambda tok, store: TwoStreamPretrainingCollator(tok, store, mismatch_probability=0.5, num_answers=4),
}
SCHEMA_ROWS = {
    "caption": {"image_id": "1", "sentence": "a red circle", "sentence_phrase_spans": [[2, 12]],
                "sentence_phrase_boxes": [[[10, 10, 60, 60]]], "sentence_phrase_regions": [[0.0, 1.0, 0.0]]},
    "vgp": {"image_id": "2", "caption1": "a red circle", "caption2": "the circle", "phrase1_span": [2, 12],
            "phrase2_span": [4, 10], "id_label": 2, "vgp_label": 0, "type_label": -1},
    "vqa": {"image_id": "1", "question": "what colour?", "labels": [3, 0], "scores": [1.0, 0.3]},
    "gqa": {"image_id": "0", "question": "is it red?", "label": 2},
    "nlvr2": {"left_image_id": "1", "right_image_id": "2", "sentence": "two circles", "label": 1},
    "refcoco": {"image_id": "2", "expression": "the big square", "expression_phrase_spans": [[0, 14]],
                "expression_phrase_boxes": [[[10, 10, 60, 60]]]},
    "captioning": {"image_id": "1", "caption": "a circle", "references": ["a circle", "one circle"]},
    "pretraining": {"image_id": "1", "question": "what colour?", "label": 1},
}  # fmt: skip
SCALARS = (
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-1e6, 1e6, width=32) | SPECIAL | st.text(max_size=4)
)
JUNK = st.recursive(
    SCALARS, lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=2), children, max_size=2),
    max_leaves=10,
)


def with_junk_inside(draw, value: object) -> object:
    """`value` with junk somewhere inside it: the value itself, or an element at any depth of its lists."""
    if isinstance(value, list) and value and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        return [with_junk_inside(draw, item) if k == index else item for k, item in enumerate(value)]
    return draw(JUNK)


@st.composite
def malformed_batches(draw) -> tuple[str, list]:
    task = draw(st.sampled_from(sorted(SCHEMA_ROWS)))
    rows = [dict(SCHEMA_ROWS[task]) for _ in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 2))):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        column = draw(st.sampled_from(sorted(SCHEMA_ROWS[task])))
        if draw(st.integers(0, 5)) == 0:
            row.pop(column, None)
        elif column in row:
            row[column] = with_junk_inside(draw, row[column])
    return task, rows


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(malformed_batches())
def test_collators_give_finite_batches_or_raise_value_error_on_malformed_rows(tokenizer, store, task_and_rows):
    task, rows = task_and_rows
    try:
        batch = SCHEMA_COLLATORS[task](tokenizer, store)(rows)
    except ValueError:
        return
    for name, value in batch.items():
        if torch.is_tensor(value) and value.is_floating_point():
            assert bool(torch.isfinite(value).all()), name
    if "word_region_alignment" in batch:
        check_alignment("word_region_alignment", batch["word_region_alignment"])
    if "references" in batch:
        assert all(isinstance(text, str) for references in batch["references"] for text in references)
