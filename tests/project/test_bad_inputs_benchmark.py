"""The bad-input harness (benchmarks/bad_inputs.py) classifies a child's result as the docs of its outcomes say."""

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def harness():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bad_inputs.py"
    spec = importlib.util.spec_from_file_location("bad_inputs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_one_line_refusal_naming_the_argument_is_clear_and_a_traceback_is_not(harness):
    line = "hf-vlalign probe: error: `--batch_size` must be >= 1, got 0."
    refusal = {"kind": "cli", "rc": 2, "stdout": "", "stderr": line + "\n"}
    assert harness.classify(refusal, ("batch_size",)) == ("clear", line)
    assert harness.classify(refusal, ("max_examples",))[0] == "traceback"  # names another argument

    traceback = dict(refusal, stderr="Traceback (most recent call last):\n  ...\nIndexError: index 3 out of range\n")
    assert harness.classify(traceback, ("batch_size",)) == ("traceback", "IndexError: index 3 out of range")

    error = {"ok": False, "exc_type": "ValueError", "message": "`top_k` must be >= 1, got 0."}
    snippet = {"kind": "python", "rc": 1, "stderr": "", "python": error}
    assert harness.classify(snippet, ("top_k",))[0] == "clear"
    accepted = {"kind": "python", "rc": 0, "stderr": "", "python": {"ok": True, "nan": True}}
    assert harness.classify(accepted, ("top_k",)) == ("accepted", "NaN in the output")


def test_a_replaced_user_file_is_lost_even_when_the_run_refused(harness, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    protected = [harness.Protected(notes, owned=False, before=harness.hashes(notes))]
    notes.write_text('{"accuracy": 0.5}')
    result = {"kind": "cli", "rc": 2, "stderr": "error: `--json` ...\n", "lost": harness.lost_files(protected)}
    assert harness.classify(result, ("json",)) == ("lost", "notes.txt: replaced")

    # a result the library wrote may be replaced by a complete new one, never left truncated
    previous = tmp_path / "probe.json"
    previous.write_text('{"accuracy": 0.25}')
    owned = [harness.Protected(previous, owned=True, before=harness.hashes(previous))]
    previous.write_text('{"accuracy": 0.5}')
    assert harness.lost_files(owned) == []
    previous.write_text('{"accur')
    assert harness.lost_files(owned) == ["probe.json: truncated or damaged"]
