"""Where a paper prints a value, the docs and the code say so: no statement calls a printed value or equation of
Kervadec et al. or Samaran et al. unavailable (the papers' text: ../shared/papers/)."""

import re

from script_modules import ROOT

UNAVAILABLE = re.compile(r"not available|could not be consulted|not in our (reference )?corpus", re.IGNORECASE)
# the pages and files that state where a paper's value comes from
STATEMENTS = (
    "README.md", *(f"docs/{page.name}" for page in sorted((ROOT / "docs").glob("*.md"))),
    "examples/configs/kervadec.yaml", "src/hf_vlalign/data/builders/visual_genome.py",
    "src/hf_vlalign/models/two_stream/configuration_two_stream.py",
)  # fmt: skip


def _paragraphs(text: str) -> list[str]:
    """Blank-line or bullet separated blocks, each joined to one line."""
    blocks = re.split(r"\n\s*\n|\n(?=- )", text)
    return [" ".join(block.split()) for block in blocks]


def test_no_statement_calls_a_printed_kervadec_or_samaran_value_unavailable():
    unavailable = [
        f"{name}: {paragraph[:120]}"
        for name in STATEMENTS
        for paragraph in _paragraphs((ROOT / name).read_text())
        if UNAVAILABLE.search(paragraph) and "CUDA" not in paragraph and "Fei" not in paragraph  # Fei: eqs. 9-10
    ]
    assert not unavailable, unavailable


def test_the_docs_quote_kervadecs_k_and_samarans_table_1_columns():
    """Kervadec et al. sec. 5, after eq. 13: "In this work, we empirically set k = 3"; Samaran et al. Table 1 (sec.
    3.2): VQAv2.0 val, RefCOCO+ (Detected) and RefCOCO+ (Ground-truth) val / testA / testB."""
    readme, experiments = (" ".join((ROOT / name).read_text().split()) for name in ("README.md", "docs/experiments.md"))
    assert "we empirically set k = 3" in readme and "we empirically set k = 3" in experiments
    assert "ground-truth RoIs" in experiments and '("Detected")' in experiments
