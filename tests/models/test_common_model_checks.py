"""transformers' common model tests (`ModelTesterMixin` of transformers' `tests/test_modeling_common.py`, with what
the VisualBert, Lxmert and Bart testers add), the project's version, part 1 of 4: what every (family, head) class
returns. The single-stream family is VisualBERT's peer, the two-stream family LXMERT's, the captioner BART's.

Checked per class: hidden states and attention maps (number and shapes, asked for by keyword or by the config),
`return_dict=False` tuples equal to the dict outputs, determinism in eval mode, batching equivalence (row i of a batch
equals example i alone), and the empty batch, refused by name in every forward and in `generate()`, validated or not,
where transformers' peers fail with "cannot reshape tensor of 0 elements". Parts 2 to 4:
`test_common_saving_checks.py` (saving, loading, embeddings, initialisation), `test_common_training_checks.py`
(training, gradient checkpointing, `generate()`) and `test_common_compile_checks.py` (`torch.compile`,
`torch.export`).
"""

from __future__ import annotations

import pytest
import torch
from common_model_checks import CLASSES, DECODER_LENGTH, assert_outputs_equal, build, tensors
from test_malformed_model_inputs import B, CAPTIONER, R, SINGLE, T, TWO, region_inputs, valid_inputs


# ----------------------------------------------------------------------------------------------------------------
# Layer outputs: what each class returns with output_hidden_states / output_attentions, count and shape
# ----------------------------------------------------------------------------------------------------------------


def expected_hidden_states(key: tuple[str, str]) -> dict[str, list[tuple[int, ...]]]:
    """Per output field, the shape of every hidden state (the embeddings first where the peer returns them)."""
    family, head = key
    batch = 2 * B if head == "nlvr2" else B  # NLVR2 encodes the sentence with each image of the pair
    if family == "ss":  # VisualBERT: embeddings + every layer over [text] [regions] [END]
        return {"hidden_states": [(batch, T + R + 1, SINGLE["hidden_size"])] * (SINGLE["num_hidden_layers"] + 1)}
    if family == "ts":  # LXMERT: every single-modality layer, then every cross layer, per stream
        hidden = TWO["hidden_size"]
        return {
            "language_hidden_states": [(batch, T, hidden)] * (TWO["l_layers"] + TWO["x_layers"]),
            "vision_hidden_states": [(batch, R, hidden)] * (TWO["r_layers"] + TWO["x_layers"]),
        }
    d_model = CAPTIONER["d_model"]  # BART: embeddings + every layer, encoder and decoder
    return {
        "encoder_hidden_states": [(B, R, d_model)] * (CAPTIONER["encoder_layers"] + 1),
        "decoder_hidden_states": [(B, DECODER_LENGTH, d_model)] * (CAPTIONER["decoder_layers"] + 1),
    }


def expected_attentions(key: tuple[str, str]) -> dict[str, list[tuple[int, ...]]]:
    family, head = key
    batch = 2 * B if head == "nlvr2" else B
    if family == "ss":
        heads, length = SINGLE["num_attention_heads"], T + R + 1
        return {"attentions": [(batch, heads, length, length)] * SINGLE["num_hidden_layers"]}
    if family == "ts":
        heads = TWO["num_attention_heads"]
        return {
            "language_attentions": [(batch, heads, T, T)] * TWO["l_layers"],
            "vision_attentions": [(batch, heads, R, R)] * TWO["r_layers"],
            "cross_encoder_attentions": [(batch, heads, T, R)] * TWO["x_layers"],
            "cross_encoder_vision_attentions": [(batch, heads, R, T)] * TWO["x_layers"],
        }
    encoder_heads, decoder_heads = CAPTIONER["encoder_attention_heads"], CAPTIONER["decoder_attention_heads"]
    return {
        "encoder_attentions": [(B, encoder_heads, R, R)] * CAPTIONER["encoder_layers"],
        "decoder_attentions": [(B, decoder_heads, DECODER_LENGTH, DECODER_LENGTH)] * CAPTIONER["decoder_layers"],
        "cross_attentions": [(B, decoder_heads, DECODER_LENGTH, R)] * CAPTIONER["decoder_layers"],
    }


def layer_output_shapes(outputs, fields) -> dict[str, list[tuple[int, ...]]]:
    return {name: [tuple(state.shape) for state in (getattr(outputs, name) or ())] for name in fields}


@CLASSES
@pytest.mark.parametrize("asked_by", ["kwargs", "config"])
def test_hidden_states_output(key, asked_by):
    """transformers' `test_hidden_states_output`: every stream's states, counted and shaped as the peer's."""
    expected = expected_hidden_states(key)
    model = build(key, output_hidden_states=True) if asked_by == "config" else build(key)
    with torch.no_grad():
        outputs = model(**valid_inputs(*key), **({"output_hidden_states": True} if asked_by == "kwargs" else {}))
        plain = build(key)(**valid_inputs(*key))
    assert layer_output_shapes(outputs, expected) == expected
    assert all(getattr(plain, name, None) is None for name in expected)  # only when asked for
    if key[0] == "ts":  # the last states are the outputs of the last cross layer
        base = outputs if key[1] == "base" else None
        if base is not None:
            assert torch.equal(base.language_hidden_states[-1], base.language_output)
            assert torch.equal(base.vision_hidden_states[-1], base.vision_output)


@CLASSES
@pytest.mark.parametrize("asked_by", ["kwargs", "config"])
def test_attention_outputs(key, asked_by):
    """transformers' `test_attention_outputs`: every attention map, counted and shaped, each row a distribution."""
    expected = expected_attentions(key)
    model = build(key, output_attentions=True) if asked_by == "config" else build(key)
    with torch.no_grad():
        outputs = model(**valid_inputs(*key), **({"output_attentions": True} if asked_by == "kwargs" else {}))
    assert layer_output_shapes(outputs, expected) == expected
    for name in expected:
        for probabilities in getattr(outputs, name):
            torch.testing.assert_close(probabilities.sum(-1), torch.ones(probabilities.shape[:-1]), msg=name)


@CLASSES
def test_return_dict_false_gives_the_tuple_of_the_dict_outputs(key):
    model = build(key)
    with torch.no_grad():
        as_dict = model(**valid_inputs(*key), output_hidden_states=True, output_attentions=True)
        as_tuple = model(**valid_inputs(*key), output_hidden_states=True, output_attentions=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict.to_tuple())
    for expected, got in zip(as_dict.to_tuple(), as_tuple):
        if isinstance(expected, torch.Tensor):
            assert torch.equal(expected, got)
        elif isinstance(expected, tuple):
            assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


# ----------------------------------------------------------------------------------------------------------------
# Forward behaviour
# ----------------------------------------------------------------------------------------------------------------


@CLASSES
def test_eval_mode_is_deterministic(key):
    model = build(key)
    with torch.no_grad():
        assert_outputs_equal(model(**valid_inputs(*key)), model(**valid_inputs(*key)), exact=True)


def example(inputs: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    return {name: value[index : index + 1] for name, value in inputs.items()}


@CLASSES
def test_batching_equivalence(key):
    """transformers' `test_batching_equivalence`: row i of the batched outputs (hidden states and attention maps
    included) equals the outputs of example i alone; the losses, which average over the batch, are left out."""
    model = build(key)
    inputs = valid_inputs(*key)
    with torch.no_grad():
        batched = tensors(model(**inputs, output_hidden_states=True, output_attentions=True))
        for index in range(B):
            single = tensors(model(**example(inputs, index), output_hidden_states=True, output_attentions=True))
            compared = [name for name, value in batched.items() if value.dim() > 0 and value.is_floating_point()]
            assert compared and set(compared) <= set(single)
            for name in compared:
                value = batched[name]
                rows = value.shape[0] // B  # NLVR2's encoder outputs hold 2 rows per example
                torch.testing.assert_close(value[index * rows : (index + 1) * rows], single[name], atol=1e-5, rtol=1e-5, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# Empty batches
# ----------------------------------------------------------------------------------------------------------------


def empty_batch(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    return {name: value[:0] for name, value in valid_inputs(*key).items()}


@CLASSES
def test_an_empty_batch_is_refused_naming_the_argument(key):
    """transformers' VisualBert, Lxmert and Bart fail on a batch of size 0 with "cannot reshape tensor of 0 elements";
    every forward here refuses it first with a ValueError naming its batch argument (a shape check, no value read)."""
    name = "visual_feats" if key[0] == "cap" else "input_ids"
    model = build(key)
    with pytest.raises(ValueError, match=rf"`{name}` has batch size 0 .*{type(model).__name__} needs at least one example"):
        model(**empty_batch(key))


@pytest.mark.parametrize(
    "inputs, name",
    [
        (lambda: {name: value[:0] for name, value in region_inputs().items()}, "visual_feats"),
        (lambda: {**region_inputs(), "decoder_input_ids": torch.ones(0, 1, dtype=torch.long)}, "decoder_input_ids"),
    ],
    ids=["regions", "prompt"],
)
def test_generate_refuses_an_empty_batch(inputs, name):
    with pytest.raises(ValueError, match=rf"`{name}` has batch size 0"):
        build(("cap", "caption")).generate(**inputs(), max_new_tokens=2)


def test_the_encoder_outputs_of_an_empty_batch_are_refused():
    model = build(("cap", "caption"))
    empty = torch.zeros(0, R, CAPTIONER["d_model"])
    with pytest.raises(ValueError, match=r"`encoder_outputs` has batch size 0"):
        model(encoder_outputs=(empty,), decoder_input_ids=torch.ones(0, 2, dtype=torch.long))
