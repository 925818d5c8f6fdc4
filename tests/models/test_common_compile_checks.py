"""transformers' common model tests, the project's version, part 4 of 4 (see `test_common_model_checks.py`):
`torch.compile` and `torch.export`, as transformers' `test_torch_compile*` / `test_torch_export` check their peers.

With the default settings (the value checks on, `validate_inputs=True`) a forward reads no tensor value on the host:
each value check is an asynchronous assertion (`utils.validation.require`), which dynamo and export keep in the
graph. So each family's base model and one task head compile into one graph (`torch.compile(fullgraph=True)`) and
equal eager mode, a training step (forward with labels and attention supervision, backward) compiles into one graph
with the same loss and gradients, and the inference forward of every (family, head) class exports (`torch.export`,
non-strict) and equals eager mode; compiled and exported graphs still refuse bad input. Here through AOTAutograd
(`aot_eager`), which needs no compiler process; inductor, the default backend, runs in a `slow` test.
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
def test_torch_compile_fullgraph_equals_eager_with_the_value_checks(key):
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


def out_of_vocabulary(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    inputs = inference_inputs(key)
    ids = "decoder_input_ids" if key[0] == "cap" else "input_ids"
    inputs[ids] = inputs[ids].clone()
    inputs[ids][0, 0] = config(key[0]).vocab_size
    return inputs


@pytest.mark.parametrize("family", ["ss", "ts", "cap"])
def test_compiled_and_exported_forwards_keep_the_value_checks(family):
    """The assertion is part of the graph: an id outside the vocabulary is refused, naming the input."""
    torch._dynamo.reset()
    key = (family, "caption" if family == "cap" else "base")
    model = build(key)
    exported = torch.export.export(model, args=(), kwargs=inference_inputs(key), strict=False).module()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    name = "decoder_input_ids" if family == "cap" else "input_ids"
    for run in (exported, compiled):
        with pytest.raises(RuntimeError, match=rf"`{name}` must be in \[0, "):
            run(**out_of_vocabulary(key))


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
