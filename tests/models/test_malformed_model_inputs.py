"""Bad model inputs, matrix II (issue 17): dtypes, the labels of every head, 0/1 masks and `generate()`, over the three
families and each of their heads. Every case names the exception it must raise (always `ValueError`) and a pattern
the message must contain, starting with the offending argument; the few "cast" cases (float16 / float64 region
inputs, a documented cast to the model's dtype) must run with finite outputs instead."""

from __future__ import annotations

import functools
from collections.abc import Callable

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


def set_(index, value) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(tensor: torch.Tensor) -> torch.Tensor:
        tensor[index] = value
        return tensor

    return change


ALL = list(HEADS)
ENCODERS = [key for key in HEADS if key[0] != "cap"]
NAN, INF = float("nan"), float("inf")

# ----------------------------------------------------------------------------------------------------------------
# The matrix: (class, id, call, pattern); pattern None: the input is cast and must run with finite outputs
# ----------------------------------------------------------------------------------------------------------------

CASES: list[tuple[str, str, Callable, str | None]] = []


def case(kind: str, name: str, call: Callable, pattern: str | None) -> None:
    CASES.append((kind, name, call, pattern))


# --- dtypes, on every family and head ---------------------------------------------------------------------------
for family, head in ALL:
    key = f"{family}_{head}"
    for dtype in (torch.float16, torch.float64):
        case("dtype", f"{key}_feats_{str(dtype)[6:]}_cast", functools.partial(run, family, head, visual_feats=lambda f, d=dtype: f.to(d)), None)
    case("dtype", f"{key}_boxes_float64_cast", functools.partial(run, family, head, visual_boxes=lambda b: b.double()), None)
    case("dtype", f"{key}_feats_int", functools.partial(run, family, head, visual_feats=lambda f: f.long()), r"`visual_feats` must be a floating-point tensor.*int64")
    case("dtype", f"{key}_feats_bool", functools.partial(run, family, head, visual_feats=lambda f: f > 0), r"`visual_feats` must be a floating-point tensor.*bool")
    case("dtype", f"{key}_boxes_int", functools.partial(run, family, head, visual_boxes=lambda b: (b * 10).long()), r"`visual_boxes` must be a floating-point tensor")
    if family != "cap":
        case("dtype", f"{key}_input_ids_float", functools.partial(run, family, head, input_ids=lambda i: i.float()), r"`input_ids` must be an integer tensor")
for family, head in [("ss", "nlvr2"), ("ts", "nlvr2"), ("ss", "refcoco"), ("ts", "refcoco"), ("ss", "pretrain"), ("ts", "pretrain"), ("cap", "caption")]:
    case("dtype", f"{family}_{head}_labels_float", functools.partial(run, family, head, labels=lambda y: y.float()), r"`labels` must be an integer tensor.*float32")
case("dtype", "ss_nlvr2_label_1_7", functools.partial(run, "ss", "nlvr2", labels=torch.tensor([1.7, 0.0])), r"`labels` must be an integer tensor")
case("dtype", "ts_nlvr2_label_1_7", functools.partial(run, "ts", "nlvr2", labels=torch.tensor([1.7, 0.0])), r"`labels` must be an integer tensor")
case("dtype", "cap_labels_1d", functools.partial(run, "cap", "caption", labels=torch.tensor([5, 6, 2])), r"`labels` must have shape \(batch, caption_length\).*\(3,\)")
case("dtype", "cap_labels_3d", functools.partial(run, "cap", "caption", labels=torch.ones(B, 3, 1, dtype=torch.long)), r"`labels` must have shape \(batch, caption_length\)")
case("dtype", "ss_pretrain_sentence_image_float", functools.partial(run, "ss", "pretrain", sentence_image_labels=torch.tensor([0.0, 1.0])), r"`sentence_image_labels` must be an integer tensor")
case("dtype", "ss_pretrain_object_labels_float", functools.partial(run, "ss", "pretrain", object_labels=lambda y: y.float()), r"`object_labels` must be an integer tensor")
case("dtype", "ts_pretrain_object_labels_float", functools.partial(run, "ts", "pretrain", object_labels=lambda y: y.float()), r"`object_labels` must be an integer tensor")
case("dtype", "ts_pretrain_matched_labels_float", functools.partial(run, "ts", "pretrain", matched_labels=torch.tensor([1.0, 0.0])), r"`matched_labels` must be an integer tensor")
case("dtype", "ss_pretrain_feature_labels_int", functools.partial(run, "ss", "pretrain", feature_labels=lambda f: f.long()), r"`feature_labels` must be a floating-point tensor")
case("dtype", "ts_pretrain_feature_labels_int", functools.partial(run, "ts", "pretrain", feature_labels=lambda f: f.long()), r"`feature_labels` must be a floating-point tensor")
case("dtype", "ss_vgp_labels_float", functools.partial(run, "ss", "vgp", vgp_labels=torch.tensor([1.0, 0.0])), r"`vgp_labels` must be an integer tensor")
case("dtype", "ss_grounding_phrase_labels_int", functools.partial(run, "ss", "grounding", phrase_labels=lambda y: (y > 0).long()), r"`phrase_labels` must be a floating-point tensor")
case("dtype", "ts_refcoco_iou_int", functools.partial(run, "ts", "refcoco", target_region_iou=lambda y: (y > 0).long()), r"`target_region_iou` must be a floating-point tensor")
case("dtype", "ss_base_alignment_int", functools.partial(run, "ss", "base", word_region_alignment=torch.zeros(B, T, R, dtype=torch.long)), r"`word_region_alignment` must be a floating-point tensor")

for family in ("ss", "ts"):  # documented casts of the targets: other float precisions, integer widths
    for dtype in (torch.float16, torch.float64):
        bits = str(dtype)[6:]
        case("dtype", f"{family}_qa_soft_{bits}_cast", functools.partial(run, family, "qa", labels=lambda y, d=dtype: y.to(d)), None)
        case("dtype", f"{family}_refcoco_iou_{bits}_cast", functools.partial(run, family, "refcoco", target_region_iou=lambda y, d=dtype: y.to(d)), None)
        case("dtype", f"{family}_grounding_labels_{bits}_cast", functools.partial(run, family, "grounding", phrase_labels=lambda y, d=dtype: y.to(d)), None)
        case("dtype", f"{family}_pretrain_feature_labels_{bits}_cast", functools.partial(run, family, "pretrain", feature_labels=lambda y, d=dtype: y.to(d)), None)
    case("dtype", f"{family}_pretrain_labels_int32_cast", functools.partial(run, family, "pretrain", labels=lambda y: y.int(), object_labels=lambda y: y.int()), None)
    case("dtype", f"{family}_refcoco_labels_int32_cast", functools.partial(run, family, "refcoco", labels=lambda y: y.int(), target_region_iou=None), None)
    case("dtype", f"{family}_nlvr2_labels_int32_cast", functools.partial(run, family, "nlvr2", labels=lambda y: y.int()), None)
    case("dtype", f"{family}_qa_ids_int32_cast", functools.partial(run, family, "qa", labels=torch.tensor([2, 0], dtype=torch.int32)), None)
    case("dtype", f"{family}_token_type_ids_float", functools.partial(run, family, "qa", token_type_ids=lambda m: m.float()), r"`token_type_ids` must be an integer tensor")
case("dtype", "cap_labels_int32_cast", functools.partial(run, "cap", "caption", labels=lambda y: y.int()), None)
case("dtype", "ss_vgp_labels_int32_cast", functools.partial(run, "ss", "vgp", vgp_labels=lambda y: y.int(), id_labels=lambda y: y.int()), None)

# --- labels of every head ---------------------------------------------------------------------------------------
for family in ("ss", "ts"):
    # QA soft scores (VQA) and answer ids (GQA)
    case("labels", f"{family}_qa_soft_nan", functools.partial(run, family, "qa", labels=set_((0, 1), NAN)), r"`labels` must be finite")
    case("labels", f"{family}_qa_soft_inf", functools.partial(run, family, "qa", labels=set_((1, 0), INF)), r"`labels` must be finite")
    case("labels", f"{family}_qa_soft_above_one", functools.partial(run, family, "qa", labels=set_((1, 0), 1.5)), r"soft `labels` must be scores in \[0, 1\].*1\.5")
    case("labels", f"{family}_qa_soft_negative", functools.partial(run, family, "qa", labels=set_((1, 0), -0.2)), r"soft `labels` must be scores in \[0, 1\]")
    case("labels", f"{family}_qa_soft_wrong_width", functools.partial(run, family, "qa", labels=torch.zeros(B, A + 1)), r"soft `labels` must have shape \(batch, num_qa_labels\)")
    case("labels", f"{family}_qa_ids_out_of_range", functools.partial(run, family, "qa", labels=torch.tensor([0, A])), r"`labels` must be in \[0, 2\]")
    case("labels", f"{family}_qa_ids_2d", functools.partial(run, family, "qa", labels=torch.ones(B, A, dtype=torch.long)), r"`labels` must have shape")
    # NLVR2
    case("labels", f"{family}_nlvr2_label_2", functools.partial(run, family, "nlvr2", labels=torch.tensor([2, 0])), r"`labels` must be in \[0, 1\]")
    case("labels", f"{family}_nlvr2_label_negative", functools.partial(run, family, "nlvr2", labels=torch.tensor([-1, 0])), r"`labels` must be in \[0, 1\]")
    case("labels", f"{family}_nlvr2_labels_2d", functools.partial(run, family, "nlvr2", labels=torch.ones(B, 1, dtype=torch.long)), r"`labels` must have shape")
    case("labels", f"{family}_nlvr2_labels_wrong_batch", functools.partial(run, family, "nlvr2", labels=torch.tensor([1, 0, 1])), r"`labels` must have shape \(2,\)")
    # RefCOCO+
    case("labels", f"{family}_refcoco_label_on_padded_region", functools.partial(run, family, "refcoco", labels=torch.tensor([2, R - 1]), target_region_iou=None), r"`labels` must name a real region.*`visual_attention_mask`.*\[1\]")
    case("labels", f"{family}_refcoco_label_out_of_range", functools.partial(run, family, "refcoco", labels=torch.tensor([R, 0])), r"`labels` must be in \[0, 3\]")
    case("labels", f"{family}_refcoco_label_ignored_without_iou", functools.partial(run, family, "refcoco", labels=torch.tensor([-100, 0]), target_region_iou=None), r"`labels` must name a region.*-100")
    case("labels", f"{family}_refcoco_iou_nan", functools.partial(run, family, "refcoco", target_region_iou=set_((0, 0), NAN)), r"`target_region_iou` must be finite")
    case("labels", f"{family}_refcoco_iou_above_one", functools.partial(run, family, "refcoco", target_region_iou=set_((0, 0), 1.2)), r"`target_region_iou` must hold IoUs in \[0, 1\]")
    case("labels", f"{family}_refcoco_iou_on_padded_region", functools.partial(run, family, "refcoco", target_region_iou=set_((1, R - 1), 0.9)), r"`target_region_iou` must put no mass.*`visual_attention_mask`")
    case("labels", f"{family}_refcoco_iou_wrong_shape", functools.partial(run, family, "refcoco", target_region_iou=torch.zeros(B, R + 1)), r"`target_region_iou` must have shape \(batch, R\)")
    # phrase grounding
    case("labels", f"{family}_grounding_nan", functools.partial(run, family, "grounding", phrase_labels=set_((0, 0, 1), NAN)), r"`phrase_labels` must be finite")
    case("labels", f"{family}_grounding_positive_on_padded_region", functools.partial(run, family, "grounding", phrase_labels=set_((1, 0), torch.tensor([0.0, 0.0, 0.0, 1.0]))), r"`phrase_labels` must put no mass.*`visual_attention_mask`")
    case("labels", f"{family}_grounding_not_a_distribution", functools.partial(run, family, "grounding", phrase_labels=set_((0, 0, 1), 0.5)), r"`phrase_labels` rows must be non-negative and sum to 1")
    case("labels", f"{family}_grounding_negative", functools.partial(run, family, "grounding", phrase_labels=set_((0, 0), torch.tensor([-0.5, 1.5, 0.0, 0.0]))), r"`phrase_labels` rows must be non-negative")
    case("labels", f"{family}_grounding_target_for_empty_phrase", functools.partial(run, family, "grounding", phrase_labels=set_((1, 1, 0), 1.0)), r"`phrase_labels` gives a target to a phrase whose `phrase_masks` row has no token")
    case("labels", f"{family}_grounding_phrase_masks_2d", functools.partial(run, family, "grounding", phrase_masks=lambda m: m[:, 0]), r"`phrase_masks` must have shape \(batch, num_phrases, text_length\) \(3 dims\)")
    case("labels", f"{family}_grounding_phrase_masks_wrong_length", functools.partial(run, family, "grounding", phrase_masks=torch.ones(B, P, T + 1)), r"`phrase_masks` must have shape")
    case("labels", f"{family}_grounding_labels_wrong_shape", functools.partial(run, family, "grounding", phrase_labels=torch.zeros(B, P, R + 1)), r"`phrase_labels` must have shape \(batch, P, R\)")
    # pre-training: MLM, objects, features (and sentence-image / matching)
    case("labels", f"{family}_pretrain_mlm_target_on_padding", functools.partial(run, family, "pretrain", labels=set_((1, T - 1), 4)), r"`labels` must be -100 \(no target\) where `attention_mask` is 0")
    case("labels", f"{family}_pretrain_mlm_out_of_vocab", functools.partial(run, family, "pretrain", labels=set_((0, 2), V)), r"`labels` must be in \[0, 59\]")
    case("labels", f"{family}_pretrain_mlm_wrong_shape", functools.partial(run, family, "pretrain", labels=torch.full((B, T + 1), -100)), r"`labels` must have shape")
    case("labels", f"{family}_pretrain_object_label_on_padded_region", functools.partial(run, family, "pretrain", object_labels=set_((1, R - 1), 2)), r"`object_labels` must be -100 \(no target\) where `visual_attention_mask` is 0")
    case("labels", f"{family}_pretrain_object_label_out_of_range", functools.partial(run, family, "pretrain", object_labels=set_((0, 1), 5)), r"`object_labels` must be in \[0, 4\]")
    case("labels", f"{family}_pretrain_masked_padded_region", functools.partial(run, family, "pretrain", masked_regions=set_((1, R - 1), 1)), r"`masked_regions` must put no mass.*`visual_attention_mask`")
    case("labels", f"{family}_pretrain_masked_regions_not_binary", functools.partial(run, family, "pretrain", masked_regions=set_((0, 0), 2)), r"`masked_regions` must hold only 1 \(kept\) and 0")
    case("labels", f"{family}_pretrain_feature_labels_nan", functools.partial(run, family, "pretrain", feature_labels=set_((0, 1, 0), NAN)), r"`feature_labels` must be finite")
    case("labels", f"{family}_pretrain_feature_labels_inf", functools.partial(run, family, "pretrain", feature_labels=set_((0, 1, 0), -INF)), r"`feature_labels` must be finite")
    case("labels", f"{family}_pretrain_feature_labels_wrong_shape", functools.partial(run, family, "pretrain", feature_labels=torch.zeros(B, R, DV - 1)), r"`feature_labels` must have the shape of `visual_feats`")
case("labels", "ss_pretrain_sentence_image_label_2", functools.partial(run, "ss", "pretrain", sentence_image_labels=torch.tensor([0, 2])), r"`sentence_image_labels` must be in \[0, 1\]")
case("labels", "ss_pretrain_sentence_image_2d", functools.partial(run, "ss", "pretrain", sentence_image_labels=torch.zeros(B, 1, dtype=torch.long)), r"`sentence_image_labels` must have shape")
case("labels", "ts_pretrain_matched_label_2", functools.partial(run, "ts", "pretrain", matched_labels=torch.tensor([2, 0])), r"`matched_labels` must be in \[0, 1\]")
case("labels", "ts_pretrain_attribute_label_on_padded_region", functools.partial(run, "ts", "pretrain", attribute_labels=set_((1, R - 1), 0)), r"`attribute_labels` must be -100 \(no target\) where `visual_attention_mask` is 0")
case("labels", "ts_pretrain_object_labels_without_masked_regions", functools.partial(run, "ts", "pretrain", masked_regions=None), r"\['object_labels', 'attribute_labels', 'feature_labels'\].*`masked_regions`")
case("labels", "ts_pretrain_answer_soft_nan", functools.partial(run, "ts", "pretrain", answer_labels=torch.tensor([[NAN, 0.0, 0.0], [0.0, 1.0, 0.0]])), r"`answer_labels` must be finite")
case("labels", "ss_vgp_id_labels_2d", functools.partial(run, "ss", "vgp", id_labels=torch.zeros(B, 1, dtype=torch.long)), r"`id_labels` must have shape \(batch,\)")
# captioning
case("labels", "cap_labels_out_of_vocab", functools.partial(run, "cap", "caption", labels=set_((0, 1), V)), r"`labels` must be token ids in \[0, 59\]")
case("labels", "cap_labels_negative", functools.partial(run, "cap", "caption", labels=set_((0, 1), -1)), r"`labels` must be token ids")
case("labels", "cap_labels_all_ignored", functools.partial(run, "cap", "caption", labels=torch.full((B, 3), -100)), r"`labels` must hold at least one caption token")
case("labels", "cap_target_on_padding", functools.partial(run, "cap", "caption", decoder_attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), labels=torch.tensor([[5, 6, 7, 2], [8, 9, 2, 4]])), r"`labels` must be -100 \(no target\) where `decoder_attention_mask` is 0")
case("labels", "cap_decoder_mask_wrong_length", functools.partial(run, "cap", "caption", decoder_attention_mask=torch.ones(B, 7, dtype=torch.long)), r"`decoder_attention_mask` must have the shape of `labels` \(2, 4\)")
case("labels", "cap_decoder_input_ids_float", functools.partial(run, "cap", "caption", decoder_input_ids=torch.ones(B, 4)), r"`decoder_input_ids` must be an integer tensor")

# --- masks must be 0/1 ------------------------------------------------------------------------------------------
for family, head in ALL:
    key = f"{family}_{head}"
    case("masks", f"{key}_inverted_region_mask", functools.partial(run, family, head, visual_attention_mask=lambda m: ~m), r"`visual_attention_mask` must hold only 1 \(kept\) and 0 \(padding\).*-2")
    case("masks", f"{key}_fractional_region_mask", functools.partial(run, family, head, visual_attention_mask=lambda m: m * 0.5), r"`visual_attention_mask` must hold only 1")
    if family != "cap":
        case("masks", f"{key}_inverted_attention_mask", functools.partial(run, family, head, attention_mask=lambda m: ~m), r"`attention_mask` must hold only 1 \(kept\) and 0 \(padding\)")
        case("masks", f"{key}_attention_mask_of_twos", functools.partial(run, family, head, attention_mask=lambda m: m * 2), r"`attention_mask` must hold only 1")
for family in ("ss", "ts"):
    case("masks", f"{family}_grounding_inverted_phrase_masks", functools.partial(run, family, "grounding", phrase_masks=lambda m: ~m, phrase_labels=None), r"`phrase_masks` must hold only 1")
    case("masks", f"{family}_base_phrase_masks_4d", functools.partial(run, family, "base", phrase_masks=torch.ones(B, 1, 1, T)), r"`phrase_masks` must have shape \(batch, text_length\) or \(batch, num_phrases, text_length\)")
    case("masks", f"{family}_base_inverted_phrase_masks", functools.partial(run, family, "base", phrase_masks=-torch.ones(B, T, dtype=torch.long)), r"`phrase_masks` must hold only 1")
case("masks", "ss_vgp_inverted_phrase1_mask", functools.partial(run, "ss", "vgp", phrase1_mask=lambda m: ~m), r"`phrase1_mask` must hold only 1")
case("masks", "cap_inverted_decoder_mask", functools.partial(run, "cap", "caption", decoder_attention_mask=~torch.ones(B, 4, dtype=torch.long)), r"`decoder_attention_mask` must hold only 1")


# --- generate() ---------------------------------------------------------------------------------------------------
def generate(**changes):
    regions = region_inputs()
    regions.pop("labels", None)
    kwargs = {**regions, "max_new_tokens": 3, **changes}
    return model("cap", "caption").generate(**{name: value for name, value in kwargs.items() if value is not None})


def many_regions(num_regions: int) -> dict[str, torch.Tensor]:
    corners = torch.rand(1, num_regions, 2) * 0.5
    return {"visual_feats": torch.randn(1, num_regions, DV), "visual_boxes": torch.cat([corners, corners + 0.2], -1),
            "visual_attention_mask": torch.ones(1, num_regions, dtype=torch.long)}  # fmt: skip


case("generate", "gen_num_beams_zero", functools.partial(generate, num_beams=0), r"`num_beams` must be an integer >= 1.*got 0")
case("generate", "gen_num_beams_negative", functools.partial(generate, num_beams=-2), r"`num_beams` must be an integer >= 1.*got -2")
case("generate", "gen_num_beams_float", functools.partial(generate, num_beams=2.5), r"`num_beams` must be an integer >= 1")
case("generate", "gen_missing_visual_boxes", functools.partial(generate, visual_boxes=None), r"`generate\(\)` needs `visual_boxes`")
case("generate", "gen_missing_visual_feats", functools.partial(generate, visual_feats=None), r"`generate\(\)` needs `visual_feats`")
case("generate", "gen_decoder_mask_wrong_length", functools.partial(generate, decoder_attention_mask=torch.ones(B, 5, dtype=torch.long)), r"`decoder_attention_mask` must have the shape of the decoder prompt.*\(2, 1\)")
case("generate", "gen_decoder_mask_disagrees_with_prompt", functools.partial(generate, decoder_input_ids=torch.ones(B, 2, dtype=torch.long), decoder_attention_mask=torch.ones(B, 3, dtype=torch.long)), r"`decoder_attention_mask`.*\(2, 2\)")
case("generate", "gen_decoder_mask_inverted", functools.partial(generate, decoder_attention_mask=-torch.ones(B, 1, dtype=torch.long)), r"`decoder_attention_mask` must hold only 1")
case("generate", "gen_feats_int", functools.partial(generate, visual_feats=torch.ones(B, R, DV, dtype=torch.long)), r"`visual_feats` must be a floating-point tensor")
case("generate", "gen_regions_above_max_regions", lambda: model("cap", "caption").generate(**many_regions(9), max_new_tokens=2), r"`visual_feats` has 9 regions, more than `max_regions` \(8\)")
case("generate", "fwd_regions_above_max_regions", lambda: model("cap", "caption")(**many_regions(50), labels=torch.tensor([[5, 2]])), r"`visual_feats` has 50 regions, more than `max_regions` \(8\)")
case("generate", "cfg_max_regions_zero", lambda: RegionCaptionerConfig(**{**CAPTIONER, "max_regions": 0}), r"`max_regions`")


def finite_outputs(outputs) -> list[torch.Tensor]:
    values = outputs.values() if isinstance(outputs, dict) else [outputs]
    return [value for value in values if isinstance(value, torch.Tensor) and value.is_floating_point()]


@pytest.mark.parametrize(("call", "pattern"), [c[2:] for c in CASES], ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_malformed_model_input(call, pattern):
    if pattern is None:  # a documented cast: runs, every float output finite
        outputs = finite_outputs(call())
        assert outputs and all(bool(torch.isfinite(value).all()) for value in outputs)
        return
    with pytest.raises(ValueError, match=pattern):
        call()


def test_the_valid_batches_run_with_a_finite_loss():
    """Each case changes one thing of a valid batch: the unchanged batches run (with a loss where the head has one)."""
    for family, head in ALL:
        outputs = run(family, head)
        if head not in ("base", "vgp"):
            assert outputs.loss is not None and bool(torch.isfinite(outputs.loss)), (family, head)
        assert all(bool(torch.isfinite(value).all()) for value in finite_outputs(outputs)), (family, head)
    ids = model("cap", "caption").generate(**region_inputs(), max_new_tokens=3, num_beams=2)
    assert ids.shape[0] == B
    assert model("cap", "caption").generate(**many_regions(8), max_new_tokens=2).shape[0] == 1  # at the limit


def test_the_matrix_covers_every_class_and_its_ids_are_unique():
    ids = [f"{c[0]}-{c[1]}" for c in CASES]
    assert len(ids) == len(set(ids))
    counts = {kind: sum(c[0] == kind for c in CASES) for kind in ("dtype", "labels", "masks", "generate")}
    assert min(counts.values()) >= 10, counts
