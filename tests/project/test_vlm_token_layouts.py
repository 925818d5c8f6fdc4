"""benchmarks/vlm_token_layouts.py: the committed layouts are what the tiny models give now, and the table of
docs/vlms.md ("What works for each family") is `docs_block` of them."""

from __future__ import annotations

import json

from script_modules import ROOT, load_script

layouts = load_script("vlm_token_layouts_benchmark", ROOT / "benchmarks" / "vlm_token_layouts.py")


def test_committed_layouts_are_measured_and_the_docs_table_is_generated_from_them():
    report = json.loads(layouts.RESULTS.read_text())
    assert layouts.measure() == report
    page = (ROOT / "docs" / "vlms.md").read_text()
    block = layouts.docs_block(report)
    assert page[page.index(layouts.DOCS_BEGIN) : page.index(layouts.DOCS_END) + len(layouts.DOCS_END)] == block
    # every family of the library has its row, the refused cross-attention model too
    from hf_vlalign.vlms.families import PATCH_MODEL_TYPES

    assert [family["model_type"] for family in report["families"]] == list(PATCH_MODEL_TYPES)
    assert "| `mllama` | refused by name: cross-attention" in block
    # the acceptance's columns: probe / explorer, supervision, localization heads, what is refused and why
    header = block.splitlines()[1]
    assert header.endswith("| probe, explorer, analyze | supervision (direct, semi-direct) | localization heads | refused, and why |")
    assert "| no | localization heads: an encoder" in block.splitlines()[3]  # ViLT
