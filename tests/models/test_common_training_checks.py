"""transformers' common model tests, the project's version, part 3 of 4 (see `test_common_model_checks.py`): training,
and generation (compilation: `test_common_compile_checks.py`).

Checked: a training step's gradients reach every trainable parameter of every (family, head) class, except the
documented ones no loss of the head reads (`NOT_TRAINED_BY_THE_HEAD`); gradient checkpointing recomputes the layers
and gives the same loss and gradients; `generate()` returns hidden states, attention maps and scores (greedy and beam
search) and passes every model keyword argument to the forward.
"""

from __future__ import annotations

import re

import pytest
import torch
from common_model_checks import CLASSES, NO_DROPOUT, build, tensors
from test_malformed_model_inputs import B, CAPTIONER, R, T, TWO, V, region_inputs, valid_inputs


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def training_inputs(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    """The valid batch, with alignment targets for the two-stream pre-training (its alignment decoder trains on them)."""
    inputs = valid_inputs(*key)
    if key == ("ts", "pretrain"):
        alignment = torch.zeros(B, T, R)
        alignment[:, 1, 0] = 1.0
        inputs["word_region_alignment"] = alignment
    return inputs


def training_loss(model, key) -> torch.Tensor:
    outputs = model(**training_inputs(key))
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    return sum(value.sum() for value in tensors(outputs).values() if value.is_floating_point())  # base models


# heads that exist whatever the config but train only when switched on
TRAINING_OVERRIDES = {("ts", "pretrain"): {"task_alignment": True}}
LAST_CROSS = TWO["x_layers"] - 1
# parameters no loss of the head reaches, and why; transformers' `test_training` checks the same on its peers
NOT_TRAINED_BY_THE_HEAD = {
    ("ss", "refcoco"): r"^single_stream\.pooler\.",  # scores every region's state, not [CLS]
    ("ss", "grounding"): r"^single_stream\.pooler\.",  # scores phrase and region states, not [CLS]
    # the answer / pair heads read [CLS] only: the vision side of the last cross layer feeds nothing (as in LXMERT)
    ("ts", "qa"): rf"^two_stream\.encoder\.cross_layers\.{LAST_CROSS}\.vision_(self_attention|intermediate|output)\.",
    ("ts", "nlvr2"): rf"^two_stream\.encoder\.cross_layers\.{LAST_CROSS}\.vision_(self_attention|intermediate|output)\.",
    # region scoring reads the vision stream only: the language side of the last cross layer and the pooler feed nothing
    ("ts", "refcoco"): rf"^two_stream\.(encoder\.cross_layers\.{LAST_CROSS}\.language_(self_attention|intermediate|output)|pooler)\.",
    ("ts", "grounding"): r"^two_stream\.pooler\.",
}


@CLASSES
def test_training_step_reaches_every_trainable_parameter(key):
    model = build(key, **TRAINING_OVERRIDES.get(key, {})).train()
    training_loss(model, key).backward()
    untrained = [name for name, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    pattern = NOT_TRAINED_BY_THE_HEAD.get(key)
    assert [name for name in untrained if not (pattern and re.search(pattern, name))] == []
    if pattern:  # the exceptions are real: each matches an untrained parameter
        assert any(re.search(pattern, name) for name in untrained)


@CLASSES
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(key):
    """transformers' `test_training_gradient_checkpointing`: the layers run again in the backward pass (counted by a
    forward hook on a module inside the first layer), with the loss and gradients of a plain step (dropout off so both
    steps compute the same)."""
    results = []
    for checkpointing in (False, True):
        model = build(key, **NO_DROPOUT[key[0]], **TRAINING_OVERRIDES.get(key, {})).train()
        assert model.supports_gradient_checkpointing
        if checkpointing:
            model.activation_checkpointing_enable()
        calls = []
        layer = next(module for name, module in model.named_modules() if re.search(r"(layer|layers|cross_layers)\.0$", name))
        next(layer.children()).register_forward_hook(lambda *_: calls.append(1))
        loss = training_loss(model, key)
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}, len(calls)))
    (plain_loss, plain_grads, plain_calls), (loss, grads, calls) = results
    assert calls == 2 * plain_calls  # recomputed in the backward pass
    torch.testing.assert_close(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# generate()
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_beams", [1, 2], ids=["greedy", "beam"])
def test_generate_returns_hidden_states_attentions_and_scores(num_beams):
    model = build(("cap", "caption"))
    steps = 3
    outputs = model.generate(
        **region_inputs(), max_new_tokens=steps, num_beams=num_beams, min_new_tokens=steps, return_dict_in_generate=True,
        output_hidden_states=True, output_attentions=True, output_scores=True,
    )  # fmt: skip
    rows = B * num_beams  # the encoder runs once per example, the decoder once per beam (as for BART)
    d_model, layers = CAPTIONER["d_model"], CAPTIONER["decoder_layers"]
    assert [tuple(state.shape) for state in outputs.encoder_hidden_states] == [(B, R, d_model)] * (CAPTIONER["encoder_layers"] + 1)
    assert len(outputs.decoder_hidden_states) == steps
    assert [len(step) for step in outputs.decoder_hidden_states] == [layers + 1] * steps
    assert all(tuple(state.shape) == (rows, 1, d_model) for step in outputs.decoder_hidden_states for state in step)
    assert len(outputs.scores) == steps and outputs.scores[0].shape == (rows, V)
    assert [len(step) for step in outputs.cross_attentions] == [layers] * steps
    assert outputs.sequences.shape == (B, steps + 1)
    plain = model.generate(**region_inputs(), max_new_tokens=steps, min_new_tokens=steps, num_beams=num_beams)
    assert torch.equal(plain, outputs.sequences)


def test_generate_passes_every_model_keyword_argument_to_the_forward():
    """transformers' peers forward the model kwargs given to `generate()` at every step: here `decoder_attention_mask`
    (grown by generate each step) and `output_attentions` reach the captioner's forward."""
    model = build(("cap", "caption"))
    seen = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True)
    mask = torch.ones(B, 1, dtype=torch.long)
    model.generate(**region_inputs(), max_new_tokens=3, min_new_tokens=3, decoder_attention_mask=mask, output_attentions=True)
    assert len(seen) == 3
    assert [tuple(step["decoder_attention_mask"].shape) for step in seen] == [(B, 1), (B, 2), (B, 3)]
    assert all(step["output_attentions"] for step in seen)


def test_generate_refuses_an_unknown_model_keyword_argument():
    with pytest.raises(ValueError, match=r"model_kwargs.*not used by the model.*\['decoder_atention_mask'\]"):
        build(("cap", "caption")).generate(**region_inputs(), max_new_tokens=2, decoder_atention_mask=torch.ones(B, 1))


