"""bf16 autocast on the CPU, for every family with its attention supervision on: a training step's loss and its
components are finite and within 5 % of float32's (bf16 keeps 8 bits of mantissa: about 0.4 % per rounding, a few
roundings deep in these tiny models), the gradients are finite, a few optimizer steps lower the loss, and generation
(the captioner) or inference (the encoders) under autocast gives float32's predictions up to the same bound."""

from __future__ import annotations

import pytest
import torch
from common_model_checks import tensors
from test_common_compile_checks import TRAINED, supervised_model, supervised_training_batch
from test_malformed_model_inputs import valid_inputs

RELATIVE_BOUND = 0.05


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def losses(outputs) -> dict[str, torch.Tensor]:
    return {name: value.float() for name, value in outputs.items() if name.startswith("loss") and value is not None}


@pytest.mark.parametrize("key", TRAINED, ids=[f"{family}_{head}" for family, head in TRAINED])
def test_a_bf16_autocast_training_step_is_finite_and_close_to_float32(key):
    model = supervised_model(key)
    inputs = supervised_training_batch(key)
    with torch.no_grad():
        reference = losses(model(**inputs))
    with bf16():
        outputs = model(**inputs)
    got = losses(outputs)
    assert got.keys() == reference.keys() and len(got) >= 3
    for name, value in got.items():
        assert torch.isfinite(value), name
        assert abs(value - reference[name]) <= RELATIVE_BOUND * abs(reference[name]) + 1e-3, (name, value, reference[name])
    outputs.loss.backward()
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients and all(torch.isfinite(gradient).all() for gradient in gradients)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast leaves the weights in float32


@pytest.mark.parametrize("key", TRAINED, ids=[f"{family}_{head}" for family, head in TRAINED])
def test_bf16_autocast_training_lowers_the_loss(key):
    model = supervised_model(key)
    inputs = supervised_training_batch(key)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    history = []
    for _ in range(8):
        with bf16():
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        history.append(float(loss))
    assert all(map(torch.isfinite, map(torch.tensor, history)))
    assert history[-1] < 0.9 * history[0], history


def test_bf16_autocast_generation_matches_float32():
    """Greedy captions of the captioner with A2 on: the first step's log-probabilities within the bound of float32's,
    and the same tokens where float32's best token leads by more than bf16's error."""
    model = supervised_model(("cap", "caption")).eval()
    regions = {name: value for name, value in valid_inputs("cap", "caption").items() if name != "labels"}
    settings = dict(max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        reference = model.generate(**regions, **settings)
        with bf16():
            got = model.generate(**regions, **settings)
    first_reference = torch.log_softmax(reference.scores[0].float(), -1)
    first_got = torch.log_softmax(got.scores[0].float(), -1)
    torch.testing.assert_close(first_got, first_reference, rtol=RELATIVE_BOUND, atol=0.05)
    top2 = first_reference.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1
    assert torch.equal(got.sequences[clear, :2], reference.sequences[clear, :2])
    assert got.sequences.shape[0] == reference.sequences.shape[0]


@pytest.mark.parametrize("key", [("ss", "qa"), ("ts", "qa")], ids=["ss_qa", "ts_qa"])
def test_bf16_autocast_inference_matches_float32(key):
    model = supervised_model(key).eval()
    inputs = {name: value for name, value in valid_inputs(*key).items() if name != "labels"}
    with torch.no_grad():
        reference = model(**inputs, output_attentions=True)
        with bf16():
            got = model(**inputs, output_attentions=True)
    got, reference = tensors(got), tensors(reference)
    compared = [name for name in reference if name == "logits" or "attentions" in name]
    assert "logits" in compared and len(compared) > 1
    for name in compared:
        atol = 0.05 if name == "logits" else 0.02  # attention weights are probabilities
        torch.testing.assert_close(got[name].float(), reference[name], rtol=RELATIVE_BOUND, atol=atol, msg=name)
