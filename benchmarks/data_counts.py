#!/usr/bin/env python
"""Counts docs/datasets.md states of the published annotation files, computed from the whole files (never the samples).

    python benchmarks/data_counts.py --vgp_typology_dir VGP-Typology --ra_files_dir RA_Files \
        --flickr30k_entities_dir flickr30k_entities --vqa_answer_vocab data/vqa/trainval_ans2label.json \
        --gqa_answer_vocab data/gqa/trainval_ans2label.json --json benchmarks/results/data_counts.json

For each VGP csv (VGP-Typology's `{train,val,test}_data.csv`, RA_Files' `full_data_type_phrase_pair_{split}.csv`):
its rows and images, the rows whose phrase cell holds markup (`has_markup`, which the VGP builder skips), the rows on
images of another Flickr30k Entities split list and the rows on images of the collection's other csvs, with how many
of those are identical to one of their rows (`find_split_overlap`, `split_overlap_counts`: what the builder's
`on_split_overlap` reports); and the answer vocabularies' sizes. The files are read as the library reads them
(`read_vgp_csv`, `read_split`). Where the whole files are: felixgiov/VGP-Typology and codecreator2053/RA_Files on
GitHub (`git show HEAD:<file>` of a clone), Flickr30k Entities' split lists in BryanPlummer/flickr30k_entities,
LXMERT's answer vocabularies in airsplay/lxmert (data/vqa, data/gqa).

`--docs benchmarks/results/data_counts.json` rewrites the block of docs/datasets.md from the committed results;
tests/project/test_data_counts.py checks that it is that rendering.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from hf_vlalign.data.builders.vgp import find_split_overlap, split_overlap_counts
from hf_vlalign.data.formats.flickr30k_entities import SPLIT_NAMES, read_split
from hf_vlalign.data.formats.vgp import has_markup, read_vgp_csv

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_blocks import ROOT, replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)

RESULTS = ROOT / "benchmarks" / "results" / "data_counts.json"
DOCS_BEGIN = "<!-- benchmarks/data_counts.py table: begin -->"
DOCS_END = "<!-- benchmarks/data_counts.py table: end -->"
# the csv of each split in each published collection
COLLECTIONS = {
    "VGP-Typology": "{split}_data.csv",
    "RA_Files": "full_data_type_phrase_pair_{split}.csv",
}
# where the whole files were read from (the committed results' provenance)
SOURCES = {
    "VGP-Typology": "felixgiov/VGP-Typology @ 0c596e145fc2b92837f5f9349654e2c91bf80dcd",
    "RA_Files": "codecreator2053/RA_Files @ 32085ec304d8ab94ddac42a53da54565bc88b917",
    "flickr30k_entities": "BryanPlummer/flickr30k_entities @ 68b3d6f12d1d710f96233f6bd2b6de799d6f4e5b",
    "answer_vocab": "airsplay/lxmert @ 0db1182b9030da3ce41f17717cc628e1cd0a95d5",
}


def file_digest(path: Path) -> dict:
    """The file's name, size and sha256: which whole file was counted."""
    data = path.read_bytes()
    return {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def csv_counts(path: Path, split: str, split_lists: dict[str, list[str]], others: dict[str, Path]) -> dict:
    """One VGP csv's counts: rows, images, markup rows, and its overlap with the other split lists and csvs."""
    pairs = read_vgp_csv(path)
    held_out = {other.name: read_vgp_csv(other) for other in others.values()}
    overlap = find_split_overlap(pairs, split, split_lists, held_out)
    markup = [pair for pair in pairs if has_markup(pair.original_phrase1) or has_markup(pair.original_phrase2)]
    return {
        **file_digest(path),
        "split": split,
        "rows": len(pairs),
        "images": len({pair.image_id for pair in pairs}),
        "markup_rows": len(markup),
        "markup_lines": [pair.line for pair in markup],
        "overlap": split_overlap_counts(pairs, overlap, held_out),
    }


def count(collection_dirs: dict[str, Path], flickr30k_entities_dir: Path, answer_vocabs: dict[str, Path]) -> dict:
    """Every count of the report, from the whole files."""
    split_lists = {split: read_split(flickr30k_entities_dir / f"{split}.txt") for split in SPLIT_NAMES}
    csvs = {}
    for collection, folder in collection_dirs.items():
        paths = {split: folder / COLLECTIONS[collection].format(split=split) for split in SPLIT_NAMES}
        for split, path in paths.items():
            others = {other: other_path for other, other_path in paths.items() if other != split}
            csvs[f"{collection} {path.name}"] = csv_counts(path, split, split_lists, others)
    return {
        "sources": SOURCES,
        "flickr30k_entities_split_images": {split: len(ids) for split, ids in split_lists.items()},
        "vgp_csvs": csvs,
        "answer_vocab_sizes": {name: len(json.loads(path.read_text())) for name, path in answer_vocabs.items()},
    }


def overlap_cell(counts: dict, names: list[str]) -> str:
    parts = []
    for name in names:
        if name in counts:
            entry = counts[name]
            part = f"{entry['rows']:,} on {entry['images']:,} images of {name}"
            if "identical_rows" in entry:
                part += f" ({entry['identical_rows']:,} identical to its rows)"
            parts.append(part)
    return "; ".join(parts) or "none"


def docs_block(report: dict) -> str:
    sources = ", ".join(f"{name}: {source[:source.index(' @ ') + 10]}" for name, source in report["sources"].items())
    lines = [
        DOCS_BEGIN,
        f"Counted on the whole published files ({sources}); "
        f"`python benchmarks/data_counts.py --json {RESULTS.relative_to(ROOT)}`",
        "",
        "| csv | rows | images | rows with markup in a phrase cell | rows on images of other Flickr30k Entities split "
        "lists | rows on images of the collection's other csvs |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, entry in report["vgp_csvs"].items():
        others = [key for key in entry["overlap"] if not key.endswith(".txt")]
        lists = [f"{split}.txt" for split in SPLIT_NAMES]
        lines.append(
            f"| {name} | {entry['rows']:,} | {entry['images']:,} | {entry['markup_rows']:,} | "
            f"{overlap_cell(entry['overlap'], lists)} | {overlap_cell(entry['overlap'], others)} |"
        )
    vocab = report["answer_vocab_sizes"]
    lines += ["", "Answer vocabularies: " + ", ".join(f"{name} {size:,} answers" for name, size in vocab.items()) + "."]
    return "\n".join([*lines, DOCS_END])


def write_docs(results: Path) -> None:
    replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(json.loads(results.read_text())))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vgp_typology_dir", help="folder of VGP-Typology's {train,val,test}_data.csv")
    parser.add_argument("--ra_files_dir", help="folder of RA_Files' full_data_type_phrase_pair_{train,val,test}.csv")
    parser.add_argument("--flickr30k_entities_dir", help="folder of Flickr30k Entities' train.txt, val.txt, test.txt")
    parser.add_argument("--vqa_answer_vocab", help="LXMERT's data/vqa/trainval_ans2label.json")
    parser.add_argument("--gqa_answer_vocab", help="LXMERT's data/gqa/trainval_ans2label.json")
    parser.add_argument("--json", default=None, help=f"write the counts here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' block from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(Path(args.docs))
        return {}
    paths = ("vgp_typology_dir", "ra_files_dir", "flickr30k_entities_dir", "vqa_answer_vocab", "gqa_answer_vocab")
    missing = [f"--{name}" for name in paths if getattr(args, name) is None]
    if missing:
        parser.error(f"the whole files are needed: {', '.join(missing)} (or --docs RESULTS to render the docs only)")
    report = count(
        {"VGP-Typology": Path(args.vgp_typology_dir), "RA_Files": Path(args.ra_files_dir)},
        Path(args.flickr30k_entities_dir),
        {"VQA v2": Path(args.vqa_answer_vocab), "GQA": Path(args.gqa_answer_vocab)},
    )
    print(docs_block(report))
    if args.json:
        write_results(args.json, report)
    return report


if __name__ == "__main__":
    main()
