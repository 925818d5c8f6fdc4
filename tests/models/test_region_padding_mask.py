"""Zero-padded regions without `visual_attention_mask`: all-zero boxes are refused with an error naming the mask (not
as "degenerate boxes"), all-zero features with valid boxes warn, and the forward docstrings and docs/reliability.md say that
padding with valid-looking boxes cannot be detected."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from test_captioning import regions
from test_captioning import tiny_config as captioning_config
from test_single_stream import tiny_batch as single_stream_batch
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_batch as two_stream_batch
from test_two_stream import tiny_config as two_stream_config

from hf_vlalign import RegionCaptionerForConditionalGeneration, RegionCaptionerModel, SingleStreamModel, TwoStreamModel

RELIABILITY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
TEXT_KEYS = ("input_ids", "attention_mask")


def single_stream():
    batch = single_stream_batch()
    return SingleStreamModel(single_stream_config()), {k: batch[k] for k in (*TEXT_KEYS, "visual_feats", "visual_boxes")}


def two_stream():
    batch = two_stream_batch()
    return TwoStreamModel(two_stream_config()), {k: batch[k] for k in (*TEXT_KEYS, "visual_feats", "visual_boxes")}


def captioner():
    inputs = {k: v for k, v in regions().items() if k != "visual_attention_mask"}
    return RegionCaptionerModel(captioning_config()), {**inputs, "decoder_input_ids": torch.tensor([[1, 5, 6], [1, 7, 8]])}


FAMILIES = {"single_stream": single_stream, "two_stream": two_stream, "captioner": captioner}


def zero_padded(inputs: dict) -> dict:
    """The last region of the second example is padding, written the usual way: zero features and a zero box."""
    padded = {**inputs, "visual_feats": inputs["visual_feats"].clone(), "visual_boxes": inputs["visual_boxes"].clone()}
    padded["visual_feats"][1, -1] = 0.0
    padded["visual_boxes"][1, -1] = 0.0
    return padded


@pytest.mark.parametrize("family", FAMILIES)
def test_all_zero_boxes_without_a_mask_are_reported_as_padding_naming_the_mask(family):
    torch.manual_seed(0)
    model, inputs = FAMILIES[family]()
    padded = zero_padded(inputs)
    last = padded["visual_feats"].shape[1] - 1
    with pytest.raises(ValueError) as raised:
        model(**padded)
    message = str(raised.value)
    assert f"`visual_boxes` has 1 all-zero region row(s) (e.g. at index [1, {last}]), which look like padding" in message
    assert "pass `visual_attention_mask` (1 for real regions, 0 for padding)" in message
    assert "degenerate" not in message

    mask = torch.ones(padded["visual_feats"].shape[:2], dtype=torch.long)
    with pytest.raises(ValueError, match=r"`visual_attention_mask` is 1 for them: set it to 0 for padding regions"):
        model(**padded, visual_attention_mask=mask)
    mask[1, -1] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # masked padding: no error, no warning
        model(**padded, visual_attention_mask=mask)


@pytest.mark.parametrize("family", FAMILIES)
def test_all_zero_features_with_valid_boxes_warn_without_a_mask(family):
    torch.manual_seed(0)
    model, inputs = FAMILIES[family]()
    inputs["visual_feats"] = inputs["visual_feats"].clone()
    inputs["visual_feats"][0, 1] = 0.0  # its box stays a valid one: nothing can tell it from a real region
    with pytest.warns(UserWarning, match=r"features are all zeros and no `visual_attention_mask` was given"):
        model(**inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model(**inputs, visual_attention_mask=torch.ones(inputs["visual_feats"].shape[:2], dtype=torch.long))


def test_valid_looking_padding_is_undetectable_and_documented():
    # the heads' forwards refer to their encoder's, which says it
    for model_class in (SingleStreamModel, TwoStreamModel, RegionCaptionerForConditionalGeneration):
        docstring = " ".join(model_class.forward.__doc__.split())
        assert "visual_attention_mask (`(batch, R)`): 1 for real regions, 0 for padding; without it every region is" in docstring
        assert "padding with valid-looking boxes and features cannot be detected" in docstring, model_class.__name__
    page = " ".join(RELIABILITY_PAGE.read_text().split())
    assert "pass `visual_attention_mask` whenever regions are padded" in page
    assert "padding with valid-looking boxes and non-zero features cannot be told from real regions" in page
