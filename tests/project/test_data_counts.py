"""The counts docs/datasets.md states of the published annotation files come from the whole files: its block is what
`benchmarks/data_counts.py --docs benchmarks/results/data_counts.json` renders from the committed counts, the prose
around it says what they show, and the counting reads the real samples (../shared/data) as the library does."""

from __future__ import annotations

import json

from script_modules import ROOT, load_script
from shared_samples import real_sample

counts = load_script("data_counts_benchmark", ROOT / "benchmarks" / "data_counts.py")
DATASETS = ROOT / "docs" / "datasets.md"


def _report() -> dict:
    return json.loads(counts.RESULTS.read_text())


def test_the_docs_block_is_rendered_from_the_committed_counts():
    assert counts.docs_block(_report()) in DATASETS.read_text()


def test_the_docs_prose_says_what_the_whole_files_show():
    report, text = _report(), " ".join(DATASETS.read_text().split())
    csvs = report["vgp_csvs"]
    typology = {entry["split"]: entry for name, entry in csvs.items() if name.startswith("VGP-Typology ")}
    # markup is left in every published VGP-Typology csv, not only the val one
    assert all(entry["markup_rows"] > 0 for entry in typology.values())
    assert "left in the published VGP-Typology csvs of every split" in text
    # the train csv has rows on Flickr30k val and test images
    overlap = typology["train"]["overlap"]
    assert overlap["val.txt"]["rows"] > 1 and overlap["test.txt"]["rows"] > 1
    for csv, split_list in (("val_data.csv", "val.txt"), ("test_data.csv", "test.txt")):
        assert overlap[csv]["rows"] == overlap[csv]["identical_rows"] == overlap[split_list]["rows"]
    assert "has rows on Flickr30k Entities val and test images, each identical to a row of the val or test csv" in text
    # "the 15k-image VGP-Typology train csv" (the scale section)
    assert round(typology["train"]["images"], -3) == 15_000 and "15k-image VGP-Typology train csv" in text
    vocab = report["answer_vocab_sizes"]
    assert f"({vocab['GQA']:,} answers;" in text and f"({vocab['VQA v2']:,} answers)" in text


def test_the_counts_of_the_samples(tmp_path):
    """The counting on the real samples (whole lines of the published csvs): what the VGP builder's split-overlap
    warning and markup skip count there."""
    typology, flickr = real_sample("vgp", "VGP-Typology"), real_sample("flickr30k_entities")
    split_lists = {split: counts.read_split(flickr / f"{split}.txt") for split in counts.SPLIT_NAMES}
    train = counts.csv_counts(typology / "train_data.csv", "train", split_lists, {"val": typology / "val_data.csv"})
    assert train["rows"] == 323 and train["markup_rows"] == 0
    assert train["overlap"]["test.txt"] == {"rows": 9, "images": 7}
    val = counts.csv_counts(typology / "val_data.csv", "val", split_lists, {"train": typology / "train_data.csv"})
    assert val["rows"] == 939 and val["markup_rows"] > 0 and val["markup_lines"][0] > 1
    block = counts.docs_block({**_report(), "vgp_csvs": {"VGP-Typology train_data.csv": train}})
    assert "| VGP-Typology train_data.csv | 323 |" in block and "9 on 7 images of test.txt" in block
