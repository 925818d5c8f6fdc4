"""transformers' common model tests, the project's version, part 4 of 4 (see `test_common_model_checks.py`):
`torch.compile` and `torch.export`, as transformers' `test_torch_compile*` / `test_torch_export` check their peers.

A traced forward reads no tensor value on the host (its value checks run in eager mode on the CPU only, see
`utils.validation.checks_values`). So each family's base model and one task head compile into one graph
(`torch.compile(fullgraph=True)`) and equal eager mode, a training step (forward with labels and attention
supervision, backward) compiles into one graph with the same loss and gradients, with dropout on too (torch's
dropout replaces the CPU mask while compiling), and the inference forward of every (family, head) class exports
(`torch.export`, non-strict) and equals eager mode. Here through AOTAutograd (`aot_eager`), which needs no compiler
process; inductor, the default backend, runs in a `slow` test.
"""

from __future__ import annotations

import pytest
import torch
from common_model_checks import CLASSES, NO_DROPOUT, assert_outputs_equal, build, config, inference_inputs
from test_malformed_model_inputs import HEADS, B, R, T, valid_inputs

# each family's base model and one task head (the captioner: its generation head) for the compiler, every class for export
COMPILED = [("ss", "base"), ("ss", "qa"), ("ts", "base"), ("ts", "qa"), ("cap", "caption")]
COMPILED_CLASSES = pytest.mark.parametrize("key", COMPILED, ids=[f"{family}_{head}" for family, head in COMPILED])
# each family's attention supervision: direct (Samaran), the alignment decoder with direct supervision (Kervadec), A2
SUPERVISION = {
    "ss": {"attention_supervision": "direct"},
    "ts": {"attention_supervision": "direct", "task_alignment": True},
    "cap": {"attention_alignment": "max"},
}
TRAINED = [("ss", "vgp"), ("ts", "pretrain"), ("cap", "caption")]


def word_region_alignment() -> torch.Tensor:
    """A gold alignment for `valid_inputs`: two grounded words in example 0 (one split over two regions), one in 1."""
    alignment = torch.zeros(B, T, R)
    alignment[0, 1, 2] = alignment[1, 1, 0] = 1.0
    alignment[0, 2, :2] = 0.5
    return alignment


def supervised_training_batch(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    """The head's labels and its supervision: the gold alignment, or A2's mask step (`alignment_mode="perturb"`)."""
    inputs = valid_inputs(*key)
    if key[0] == "cap":
        inputs["alignment_mode"] = "perturb"
    else:
        inputs["word_region_alignment"] = word_region_alignment()
    return inputs


def supervised_model(key: tuple[str, str]) -> torch.nn.Module:
    torch.manual_seed(0)
    return HEADS[key](config(key[0], **SUPERVISION[key[0]], **NO_DROPOUT[key[0]])).train()


@COMPILED_CLASSES
def test_torch_compile_fullgraph_equals_eager(key):
    torch._dynamo.reset()
    model = build(key)
    inputs = inference_inputs(key)
    with torch.no_grad():
        assert_outputs_equal(torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs), model(**inputs))


@pytest.mark.parametrize("key", TRAINED, ids=[f"{family}_{head}" for family, head in TRAINED])
def test_a_supervised_training_step_compiles_into_one_graph_with_the_same_loss_and_gradients(key):
    """Forward with every label and attention supervision on, then backward: one graph, and the eager step's loss,
    loss components and gradients."""
    torch._dynamo.reset()
    model = supervised_model(key)
    inputs = supervised_training_batch(key)
    eager = model(**inputs)
    eager.loss.backward()
    eager_gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs)
    compiled.loss.backward()
    losses = [name for name in eager.keys() if name.startswith("loss")]
    assert len(losses) >= 3  # the total and at least the task and supervision components
    for name in losses:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-5, atol=1e-6, msg=name)
    compiled_gradients = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert compiled_gradients.keys() == eager_gradients.keys()
    for name, gradient in eager_gradients.items():
        torch.testing.assert_close(compiled_gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)


@CLASSES
def test_torch_export_of_the_inference_forward_equals_eager(key):
    model = build(key)
    inputs = inference_inputs(key)
    exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
    with torch.no_grad():
        expected = model(**inputs)
    got = exported.module()(**inputs)
    assert_outputs_equal(type(expected)(**got) if isinstance(got, dict) else got, expected)


def test_a_supervised_training_forward_with_dropout_compiles_into_one_graph_on_the_cpu():
    """The trainers' setting: dropout on, attention supervision on, the default CPU dropout; loss and gradients finite."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    key = ("ss", "vgp")
    model = HEADS[key](config("ss", **SUPERVISION["ss"], hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3))
    outputs = torch.compile(model.train(), fullgraph=True, backend="aot_eager")(**supervised_training_batch(key))
    outputs.loss.backward()
    assert torch.isfinite(outputs.loss) and torch.isfinite(outputs.loss_attention_supervision)
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients and all(bool(torch.isfinite(gradient).all()) for gradient in gradients)


# inductor, the default backend, runs its C++ compiler in other processes: a `slow` test (see tests/conftest.py)
@pytest.mark.slow
@pytest.mark.parametrize("family", ["ss", "ts", "cap"])
def test_torch_compile_with_inductor_equals_eager(family):
    """The default backend, the default settings, one graph."""
    torch._dynamo.reset()
    key = (family, "caption" if family == "cap" else "base")
    model = build(key)
    inputs = inference_inputs(key)
    with torch.no_grad():
        assert_outputs_equal(torch.compile(model, fullgraph=True)(**inputs), model(**inputs))
