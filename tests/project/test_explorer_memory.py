"""benchmarks/explorer_memory.py: each reading measured at tiny sizes reports what the results file holds, and the
block of docs/vlms.md ("The explorer and the probe at real sizes") is `docs_block` of the committed results, whose
claims hold there: reading one layer at a time holds a small part of every layer's maps, the page is a small part of
the page of every head, and the 7 B bound of the reading before is the issue's 22 GB at batch 4 and 576 image tokens."""

from __future__ import annotations

import json

import pytest
from script_modules import ROOT, load_script

memory = load_script("explorer_memory_benchmark", ROOT / "benchmarks" / "explorer_memory.py")
TINY = memory.Sizes(image_size=32, patch_size=16, hidden_size=16, num_layers=2, num_heads=2, batch_size=1,
                    num_examples=2)  # fmt: skip


@pytest.mark.parametrize("mode", memory.MODES)
def test_each_reading_reports_its_peak_and_page(mode):
    result = memory.measure(mode, TINY)
    assert result["mode"] == mode and result["image_tokens"] == 4 and result["sequence_length"] > 4
    assert result["peak_rss_bytes"] > 0
    assert (result["page_bytes"] is None) == (mode == "forward")


def test_docs_block_is_generated_from_the_committed_results():
    report = json.loads(memory.RESULTS.read_text())
    page = (ROOT / "docs" / "vlms.md").read_text()
    block = memory.docs_block(report)
    assert page[page.index(memory.DOCS_BEGIN) : page.index(memory.DOCS_END) + len(memory.DOCS_END)] == block
    assert report["constants"] == memory.constants(report)
    runs = {run["mode"]: run for run in report["runs"]}
    assert runs["rows"]["image_tokens"] == 576 and report["sizes"]["num_layers"] == report["sizes"]["num_heads"] == 32
    floor = runs["forward"]["peak_rss_bytes"]
    # one layer's map at a time: less than a tenth of every layer's maps above the plain forward
    assert runs["rows"]["peak_rss_bytes"] - floor < (runs["full_maps"]["peak_rss_bytes"] - floor) / 10
    assert runs["rows"]["page_bytes"] * 50 < runs["full_maps"]["page_bytes"]
    bounds = {(row["image_tokens"], row["batch_size"]): row for row in report["bounds"]}
    assert bounds[576, 4]["full_maps_gib"] > 20 > 1 > bounds[576, 4]["rows_gib"]
    assert bounds[2880, 1]["rows_gib"] < bounds[2880, 1]["full_maps_gib"] / 10
