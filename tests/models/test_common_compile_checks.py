"""transformers' common model tests, the project's version, part 4 of 4 (see `test_common_model_checks.py`):
`torch.compile` and `torch.export`, as transformers' `test_torch_compile*` / `test_torch_export` check their peers.

The inference forward (no labels) of every (family, head) class exports (`torch.export`, non-strict) and equals eager
mode with `validate_inputs=False`; with the value checks on (the default) export stops at the first one, which reads
an input on the host (a data-dependent guard), in all three families. Each family's base model and one task head
compile into one graph (`torch.compile(fullgraph=True)`) with `validate_inputs=False` and equal eager mode; inductor,
the default backend, is run in a `slow` test (its compiler runs in other processes), in one graph without the value
checks and with a graph break at each value check with them. Training forwards with labels are not compiled whole:
some losses decide on the host whether they exist (`utils/item_counts.has_items`).
"""

from __future__ import annotations

import pytest
import torch
from common_model_checks import CLASSES, assert_outputs_equal, build, inference_inputs


# ----------------------------------------------------------------------------------------------------------------
# torch.compile and torch.export
# ----------------------------------------------------------------------------------------------------------------

# each family's base model and one task head (the captioner: its generation head) for the compiler, every class for export
COMPILED = [("ss", "base"), ("ss", "qa"), ("ts", "base"), ("ts", "qa"), ("cap", "caption")]
COMPILED_CLASSES = pytest.mark.parametrize("key", COMPILED, ids=[f"{family}_{head}" for family, head in COMPILED])


@COMPILED_CLASSES
def test_torch_compile_fullgraph_equals_eager_without_value_checks(key):
    """With `validate_inputs=False` the inference forward reads no tensor value on the host, so dynamo captures it in
    one graph (`fullgraph=True`); run here through AOTAutograd (`aot_eager`), which needs no compiler process (inductor,
    the default backend, is `test_torch_compile_with_inductor_equals_eager`)."""
    torch._dynamo.reset()
    model = build(key, validate_inputs=False)
    inputs = inference_inputs(key)
    with torch.no_grad():
        assert_outputs_equal(torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs), model(**inputs))


@CLASSES
def test_torch_export_of_the_inference_forward_equals_eager(key):
    """`torch.export` (non-strict) of the inference forward needs `validate_inputs=False`: the value checks read the
    inputs on the host, which export cannot trace (a data-dependent guard, next test)."""
    model = build(key, validate_inputs=False)
    inputs = inference_inputs(key)
    exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
    with torch.no_grad():
        expected = model(**inputs)
    got = exported.module()(**inputs)
    assert_outputs_equal(type(expected)(**got) if isinstance(got, dict) else got, expected)


@pytest.mark.parametrize("family", ["ss", "ts", "cap"])
def test_torch_export_with_value_checks_stops_at_a_data_dependent_check(family):
    key = (family, "caption" if family == "cap" else "base")
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(build(key), args=(), kwargs=inference_inputs(key), strict=False)


# inductor, the default backend, runs its C++ compiler in other processes: a `slow` test (see tests/conftest.py)
@pytest.mark.slow
@pytest.mark.parametrize("validate_inputs", [False, True], ids=["fullgraph_unvalidated", "graph_breaks_validated"])
@pytest.mark.parametrize("family", ["ss", "ts", "cap"])
def test_torch_compile_with_inductor_equals_eager(family, validate_inputs):
    """The default backend: one graph without the value checks (`fullgraph=True`), a graph break at each value check
    with them (the default settings, `validate_inputs=True`)."""
    torch._dynamo.reset()
    key = (family, "caption" if family == "cap" else "base")
    model = build(key, validate_inputs=validate_inputs)
    inputs = inference_inputs(key)
    with torch.no_grad():
        assert_outputs_equal(torch.compile(model, fullgraph=not validate_inputs)(**inputs), model(**inputs))
