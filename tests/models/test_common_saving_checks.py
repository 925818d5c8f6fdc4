"""transformers' common model tests, the project's version, part 2 of 4 (see `test_common_model_checks.py`): saving,
loading, embeddings and initialisation of every (family, head) class.

Checked per class: a save / load round trip with bit-equal outputs; a checkpoint missing one weight loads with it
initialised and named in transformers' load report (as in transformers); a checkpoint sharing no weight name with the
model is refused with `CheckpointMismatchError`, where transformers warns and returns a random model (the decision is
documented in `models/saving.py`); `resize_token_embeddings` up and down (vocabulary size, tied output layer,
masked-word bias, kept rows, a forward with the new ids); `_init_weights` sets every parameter and buffer of a model
built on the meta device.
"""

from __future__ import annotations

import re

import pytest
import torch
from common_model_checks import CLASSES, HEADS, assert_outputs_equal, build, config, tensors
from safetensors.torch import load_file, save_file
from test_malformed_model_inputs import V, valid_inputs
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

from hf_vlalign.models.saving import CheckpointMismatchError
from hf_vlalign.models.task_heads import LMPredictionHead


# ----------------------------------------------------------------------------------------------------------------
# Saving and loading
# ----------------------------------------------------------------------------------------------------------------


@CLASSES
def test_save_load_round_trip_gives_the_same_outputs(key, tmp_path):
    model = build(key)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert_outputs_equal(model(**valid_inputs(*key)), loaded(**valid_inputs(*key)), exact=True)


def weight_to_drop(model: torch.nn.Module) -> str:
    """A weight every class has that no supervised head owns: the last LayerNorm's weight of the base model."""
    names = [name for name, _ in model.named_parameters() if re.search(r"(LayerNorm|layer_norm)\.weight$", name)]
    return names[-1]


@CLASSES
def test_a_checkpoint_missing_a_weight_loads_with_it_initialised_and_reported(key, tmp_path):
    """As in transformers: the missing weight is initialised by `_init_weights` and named in the load report."""
    model = build(key)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    missing = weight_to_drop(model)
    weights.pop(missing)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with CaptureLogger(transformers_logging.get_logger("transformers.modeling_utils")) as captured:
        loaded = type(model).from_pretrained(tmp_path)
    assert re.search(rf"{re.escape(missing)}\s*\|\s*MISSING", captured.out), captured.out
    assert torch.equal(loaded.get_parameter(missing), torch.ones_like(loaded.get_parameter(missing)))
    with torch.no_grad():
        assert all(torch.isfinite(value).all() for value in tensors(loaded.eval()(**valid_inputs(*key))).values())


@CLASSES
def test_a_checkpoint_sharing_no_weight_with_the_model_is_refused(key, tmp_path):
    """transformers warns and returns a model whose every weight is new; the library refuses it (`models/saving.py`):
    a model loaded without error from the folder the user named must hold that folder's weights."""
    model = build(key)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({f"other_model.{name}": value for name, value in weights.items()}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatchError, match=rf"into {type(model).__name__}: none of its \d+ weight\(s\)"):
        type(model).from_pretrained(tmp_path)


# ----------------------------------------------------------------------------------------------------------------
# Embeddings and initialisation
# ----------------------------------------------------------------------------------------------------------------


@CLASSES
@pytest.mark.parametrize("new_size", [V + 7, V - 10], ids=["up", "down"])
def test_resize_token_embeddings_then_forward(key, new_size):
    """transformers' `test_resize_tokens_embeddings`: the vocabulary size, the tied output layer and the masked-word
    bias follow; kept rows are unchanged; a forward with the new ids runs."""
    model = build(key)
    old_rows = model.get_input_embeddings().weight[: min(V, new_size)].clone()
    model.resize_token_embeddings(new_size)
    embeddings = model.get_input_embeddings().weight
    assert embeddings.shape[0] == new_size and model.config.vocab_size == new_size
    assert torch.equal(embeddings[: min(V, new_size)], old_rows)
    output_embeddings = model.get_output_embeddings()
    if output_embeddings is not None:
        assert output_embeddings.weight is embeddings  # still tied
    for head in (module for module in model.modules() if isinstance(module, LMPredictionHead)):
        assert head.bias.shape == (new_size,)
    inputs = valid_inputs(*key)
    for name in ("input_ids", "labels") if key[1] in ("pretrain", "caption") else ("input_ids",):
        if name in inputs:
            inputs[name] = inputs[name].clamp(max=new_size - 1)
    inputs["labels" if key[0] == "cap" else "input_ids"][0, 1] = new_size - 1  # the last id of the new vocabulary
    outputs = model(**inputs)
    vocabulary_scores = {"pretrain": "prediction_logits", "caption": "logits"}.get(key[1])
    if vocabulary_scores:
        assert outputs[vocabulary_scores].shape[-1] == new_size
    assert all(torch.isfinite(value).all() for value in tensors(outputs).values())


@CLASSES
def test_init_weights_sets_every_parameter_and_buffer_of_a_meta_device_model(key):
    """transformers' `test_init_weights_can_init_buffers` / `test_all_tensors_are_parameter_or_buffer`: a model built on
    the meta device, moved with `to_empty` and filled with NaN (-1 for integer buffers), then `init_weights()`, holds
    no NaN, has the buffers of a model built normally, and runs."""
    reference = build(key)
    with torch.device("meta"):
        model = HEADS[key](config(key[0]))
    model.to_empty(device="cpu")
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.fill_(float("nan") if tensor.is_floating_point() else -1)
    model.init_weights()
    assert not [name for name, value in model.named_parameters() if torch.isnan(value).any()]
    expected_buffers = dict(reference.named_buffers())
    got_buffers = dict(model.named_buffers())
    assert got_buffers.keys() == expected_buffers.keys()
    assert not [name for name in expected_buffers if not torch.equal(got_buffers[name], expected_buffers[name])]
    with torch.no_grad():
        assert all(torch.isfinite(value).all() for value in tensors(model.eval()(**valid_inputs(*key))).values())


