"""Bad model inputs: one representative of each kind of refusal of a forward (wrong rank, wrong size, wrong dtype,
values out of range on the CPU, `generate()`'s arguments) and the switch of the value checks (`validate_inputs`).
Every refusal is a `ValueError` whose message starts with the offending argument. The valid batches of every
(family, head) class defined here are shared with the common model checks."""

from __future__ import annotations

import functools

import pytest
import torch

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForPhraseGrounding,
    SingleStreamForPreTraining,
    SingleStreamForQuestionAnswering,
    SingleStreamForReferringExpression,
    SingleStreamForVisualParaphrase,
    SingleStreamForVisualReasoning,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamForPhraseGrounding,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamForReferringExpression,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
)
from hf_vlalign.models.captioning import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration

B, T, R, P, DV, V, A = 2, 6, 4, 2, 12, 60, 3

SINGLE = dict(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=4, intermediate_size=32,
              max_position_embeddings=16, visual_feat_dim=DV, num_qa_labels=A, num_object_labels=5)  # fmt: skip
TWO = dict(vocab_size=V, hidden_size=16, num_attention_heads=4, intermediate_size=32, max_position_embeddings=16,
           l_layers=1, r_layers=1, x_layers=1, visual_feat_dim=DV, num_object_labels=5, num_attr_labels=4,
           num_qa_labels=A)  # fmt: skip
CAPTIONER = dict(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, visual_feat_dim=DV,
                 max_position_embeddings=10, geometry_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 decoder_start_token_id=1, max_regions=8)  # fmt: skip

# (family, head) -> model class; the captioner is ("cap", "caption")
HEADS = {
    ("ss", "base"): SingleStreamModel,
    ("ss", "qa"): SingleStreamForQuestionAnswering,
    ("ss", "nlvr2"): SingleStreamForVisualReasoning,
    ("ss", "refcoco"): SingleStreamForReferringExpression,
    ("ss", "grounding"): SingleStreamForPhraseGrounding,
    ("ss", "pretrain"): SingleStreamForPreTraining,
    ("ss", "vgp"): SingleStreamForVisualParaphrase,
    ("ts", "base"): TwoStreamModel,
    ("ts", "qa"): TwoStreamForQuestionAnswering,
    ("ts", "nlvr2"): TwoStreamForVisualReasoning,
    ("ts", "refcoco"): TwoStreamForReferringExpression,
    ("ts", "grounding"): TwoStreamForPhraseGrounding,
    ("ts", "pretrain"): TwoStreamForPreTraining,
    ("cap", "caption"): RegionCaptionerForConditionalGeneration,
}


@functools.cache
def model(family: str, head: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = {"ss": lambda: SingleStreamConfig(**SINGLE), "ts": lambda: TwoStreamConfig(**TWO),
              "cap": lambda: RegionCaptionerConfig(**CAPTIONER)}[family]()  # fmt: skip
    return HEADS[family, head](config).eval()


def region_inputs(pair: bool = False) -> dict[str, torch.Tensor]:
    """Regions with the last region of example 1 padding (mask 0, zero features and box)."""
    generator = torch.Generator().manual_seed(0)
    shape = (B, 2, R) if pair else (B, R)
    corners = torch.rand(*shape, 2, generator=generator) * 0.5
    boxes = torch.cat([corners, corners + 0.1 + torch.rand(*shape, 2, generator=generator) * 0.4], dim=-1)
    feats = torch.randn(*shape, DV, generator=generator)
    mask = torch.ones(shape, dtype=torch.long)
    mask[1, ..., R - 1], feats[1, ..., R - 1, :], boxes[1, ..., R - 1, :] = 0, 0.0, 0.0
    return {"visual_feats": feats, "visual_boxes": boxes, "visual_attention_mask": mask}


def valid_inputs(family: str, head: str) -> dict[str, torch.Tensor]:
    """A valid batch for the head: text with the last token of example 1 padding, and its labels."""
    regions = region_inputs(pair=head == "nlvr2")
    if family == "cap":
        return {**regions, "labels": torch.tensor([[5, 6, 7, 2], [8, 9, 2, -100]])}
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, T - 1] = 0
    batch = {"input_ids": torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(1)),
             "attention_mask": attention_mask, "token_type_ids": torch.zeros(B, T, dtype=torch.long), **regions}  # fmt: skip
    phrase_masks = torch.zeros(B, P, T, dtype=torch.long)
    phrase_masks[:, 0, 1:3] = 1
    phrase_masks[0, 1, 4] = 1
    if head == "qa":
        batch["labels"] = torch.tensor([[0.0, 1.0, 0.3], [0.6, 0.0, 0.0]])
    elif head == "nlvr2":
        batch["labels"] = torch.tensor([1, 0])
    elif head == "refcoco":
        batch["labels"] = torch.tensor([2, 0])
        batch["target_region_iou"] = torch.tensor([[0.1, 0.0, 0.8, 0.2], [0.7, 0.3, 0.0, 0.0]])
    elif head == "grounding":
        batch["phrase_masks"] = phrase_masks
        batch["phrase_labels"] = torch.tensor([[[0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.5]],
                                               [[0.2, 0.2, 0.6, 0.0], [0.0, 0.0, 0.0, 0.0]]])  # fmt: skip
    elif head == "pretrain":
        labels = torch.full((B, T), -100)
        labels[0, 2], labels[1, 1] = 7, 9
        masked = torch.zeros(B, R, dtype=torch.long)
        masked[0, 1] = masked[1, 0] = 1
        objects = torch.full((B, R), -100).masked_fill(masked.bool(), 3)
        batch.update(labels=labels, masked_regions=masked, feature_labels=regions["visual_feats"].clone(), object_labels=objects)
        if family == "ss":
            batch["sentence_image_labels"] = torch.tensor([0, 1])
        else:
            batch.update(attribute_labels=torch.full((B, R), -100).masked_fill(masked.bool(), 1),
                         matched_labels=torch.tensor([1, 0]), answer_labels=torch.tensor([2, -100]))  # fmt: skip
    elif head == "vgp":
        batch.update(phrase1_mask=phrase_masks[:, 0], phrase2_mask=torch.ones(B, T, dtype=torch.long),
                     id_labels=torch.tensor([0, 2]), vgp_labels=torch.tensor([1, 0]))  # fmt: skip
    return batch


def run(family: str, head: str, **changes):
    """The head's forward on its valid batch with `changes` (a callable receives a clone of the original value)."""
    batch = valid_inputs(family, head)
    for name, change in changes.items():
        batch[name] = change(batch[name].clone()) if callable(change) else change
    batch = {name: value for name, value in batch.items() if value is not None}
    return model(family, head)(**batch)


def set_(index, value):
    def change(tensor: torch.Tensor) -> torch.Tensor:
        tensor[index] = value
        return tensor

    return change


def finite_outputs(outputs) -> list[torch.Tensor]:
    values = outputs.values() if isinstance(outputs, dict) else [outputs]
    return [value for value in values if isinstance(value, torch.Tensor) and value.is_floating_point()]


def test_the_valid_batches_run_with_a_finite_loss():
    for family, head in HEADS:
        outputs = run(family, head)
        if head not in ("base", "vgp"):
            assert outputs.loss is not None and bool(torch.isfinite(outputs.loss)), (family, head)
        assert all(bool(torch.isfinite(value).all()) for value in finite_outputs(outputs)), (family, head)


# --- shapes and dtypes: always checked ----------------------------------------------------------------------------


def test_a_tensor_of_the_wrong_rank_is_refused():
    with pytest.raises(ValueError, match=r"`input_ids` must have shape \(batch, text_length\) \(2 dims\), got shape \(6,\)"):
        run("ss", "base", input_ids=lambda ids: ids[0])


def test_a_tensor_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match=r"`visual_feats` must have shape .* with size 12 at dim 2 \(config.visual_feat_dim\)"):
        run("ts", "base", visual_feats=lambda feats: feats[..., :-1])
    with pytest.raises(ValueError, match=r"`feature_labels` must have the shape of `visual_feats`"):
        run("ss", "pretrain", feature_labels=torch.zeros(B, R, DV - 1))


def test_a_tensor_of_the_wrong_dtype_is_refused():
    with pytest.raises(ValueError, match=r"`visual_feats` must be a floating-point tensor.*int64"):
        run("cap", "caption", visual_feats=lambda feats: feats.long())
    with pytest.raises(ValueError, match=r"`labels` must be an integer tensor.*float32"):
        run("ts", "nlvr2", labels=lambda labels: labels.float())


def test_region_inputs_of_another_float_precision_are_cast_to_the_model_dtype():
    outputs = run("ss", "refcoco", visual_feats=lambda feats: feats.half(), visual_boxes=lambda boxes: boxes.double())
    assert all(bool(torch.isfinite(value).all()) for value in finite_outputs(outputs))


def test_a_head_missing_an_input_it_needs_is_refused():
    with pytest.raises(ValueError, match=r"`phrase1_mask` \(batch, text_length\) is required"):
        run("ss", "vgp", phrase1_mask=None)
    with pytest.raises(ValueError, match=r"\['object_labels', 'attribute_labels', 'feature_labels'\].*`masked_regions`"):
        run("ts", "pretrain", masked_regions=None)


# --- values: checked on the CPU in eager mode ---------------------------------------------------------------------


def test_ids_out_of_range_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match=r"`input_ids` must be in \[0, 59\] \(vocab_size\), got \[\d+, 60\]"):
        run("ss", "base", input_ids=set_((0, 0), V))
    with pytest.raises(ValueError, match=r"`labels` must be token ids in \[0, 59\]"):
        run("cap", "caption", labels=set_((0, 1), V))


def test_unnormalised_boxes_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match=r"`visual_boxes` must be normalised to \[0, 1\].*normalize_boxes"):
        run("ts", "qa", visual_boxes=lambda boxes: boxes * 100)


def test_label_values_are_refused_on_the_cpu():
    with pytest.raises(ValueError, match=r"soft `labels` must be scores in \[0, 1\].*1\.5"):
        run("ss", "qa", labels=set_((1, 0), 1.5))
    with pytest.raises(ValueError, match=r"`phrase_labels` rows must be non-negative and sum to 1"):
        run("ts", "grounding", phrase_labels=set_((0, 0, 1), 0.5))


def test_a_mask_that_is_not_zero_one_is_refused_on_the_cpu():
    with pytest.raises(ValueError, match=r"`visual_attention_mask` must hold only 1 \(kept\) and 0 \(padding\).*-2"):
        run("ss", "nlvr2", visual_attention_mask=lambda mask: ~mask)


def test_an_alignment_whose_rows_are_not_distributions_is_refused_on_the_cpu():
    alignment = torch.zeros(B, T, R)
    alignment[0, 1, 0] = 0.5
    with pytest.raises(ValueError, match=r"`word_region_alignment` rows must each sum to 1"):
        run("ss", "base", word_region_alignment=alignment)


# --- validate_inputs: the switch of the value checks --------------------------------------------------------------


def test_validate_inputs_false_skips_the_value_checks():
    """As a forward argument, or as the config's default."""
    outputs = run("ss", "qa", labels=set_((1, 0), 1.5), validate_inputs=False)
    assert bool(torch.isfinite(outputs.loss))
    quiet = TwoStreamForQuestionAnswering(TwoStreamConfig(**TWO, validate_inputs=False)).eval()
    batch = valid_inputs("ts", "qa")
    assert bool(torch.isfinite(quiet(**{**batch, "visual_boxes": batch["visual_boxes"] * 100}).loss))


def test_validate_inputs_true_checks_the_values_wherever_they_are():
    """Off the CPU (here the `meta` device, whose tensors have no values) the values are checked only on request."""
    from hf_vlalign.utils.validation import checks_values

    config = SingleStreamConfig(**SINGLE)
    on_meta = torch.zeros(2, 3, dtype=torch.long, device="meta")
    assert not checks_values(config, on_meta) and checks_values(config, on_meta, validate_inputs=True)
    assert checks_values(config, torch.zeros(2, 3)) and not checks_values(config, torch.zeros(2, 3), validate_inputs=False)
    quiet = SingleStreamForQuestionAnswering(SingleStreamConfig(**SINGLE, validate_inputs=False)).eval()
    batch = {**valid_inputs("ss", "qa"), "input_ids": torch.full((B, T), V)}
    with pytest.raises(ValueError, match=r"`input_ids` must be in \[0, 59\]"):
        quiet(**batch, validate_inputs=True)


# --- generate() ---------------------------------------------------------------------------------------------------


def generate(**changes):
    kwargs = {**region_inputs(), "max_new_tokens": 3, **changes}
    return model("cap", "caption").generate(**{name: value for name, value in kwargs.items() if value is not None})


def many_regions(num_regions: int) -> dict[str, torch.Tensor]:
    corners = torch.rand(1, num_regions, 2) * 0.5
    return {"visual_feats": torch.randn(1, num_regions, DV), "visual_boxes": torch.cat([corners, corners + 0.2], -1),
            "visual_attention_mask": torch.ones(1, num_regions, dtype=torch.long)}  # fmt: skip


def test_generate_runs_and_refuses_its_bad_arguments():
    assert generate(num_beams=2).shape[0] == B
    assert model("cap", "caption").generate(**many_regions(8), max_new_tokens=2).shape[0] == 1  # at the limit
    with pytest.raises(ValueError, match=r"`num_beams` must be an integer >= 1.*got 0"):
        generate(num_beams=0)
    with pytest.raises(ValueError, match=r"`generate\(\)` needs `visual_boxes`"):
        generate(visual_boxes=None)
    with pytest.raises(ValueError, match=r"`decoder_attention_mask` must have the shape of the decoder prompt.*\(2, 1\)"):
        generate(decoder_attention_mask=torch.ones(B, 5, dtype=torch.long))


def test_more_regions_than_max_regions_are_refused_before_allocating():
    with pytest.raises(ValueError, match=r"`visual_feats` has 9 regions, more than `max_regions` \(8\)"):
        model("cap", "caption").generate(**many_regions(9), max_new_tokens=2)
