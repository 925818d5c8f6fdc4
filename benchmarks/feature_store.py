#!/usr/bin/env python
"""Random batches from a RegionFeatureStore vs parsing the same LXMERT TSV, and the store's resident memory.

    python benchmarks/feature_store.py                    # 1024 images x 36 boxes x 2048 features, batches of 64
    python benchmarks/feature_store.py --num-images 4096 --batches 50
    python benchmarks/feature_store.py --json benchmarks/results/feature_store.json      # the docs' run
    python benchmarks/feature_store.py --docs benchmarks/results/feature_store.json      # only rewrite the docs' tables

Writes a synthetic LXMERT TSV (random features, the published layout), converts it to a store, then times the same
random batches of image ids three ways in one run: the store; the TSV read by seeking to each image's line (an index
of line offsets built once) and decoding it; and LXMERT's own approach, loading the whole TSV into memory first
(`load_obj_tsv`), whose start-up cost and memory are reported. Memory comes from /proc/self/status: `RssAnon` is
private memory, `RssFile` pages of memory-mapped files (shared with the page cache, dropped under pressure).
The tables of docs/datasets.md are rendered from the committed results file (tests/project/test_readme_benchmark_tables.py
checks it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hf_vlalign.data.feature_store import RegionFeatureStore, convert_features
from hf_vlalign.data.formats.lxmert_tsv import _decode_row, write_lxmert_tsv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "feature_store.json"
DOCS_BEGIN = "<!-- benchmarks/feature_store.py table: begin -->"
DOCS_END = "<!-- benchmarks/feature_store.py table: end -->"


def memory_mib() -> dict[str, float]:
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            values[key] = int(rest.split()[0]) / 1024
    return values


def synthetic_records(num_images: int, num_boxes: int, dim: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for index in range(num_images):
        corners = rng.uniform(0, 300, size=(num_boxes, 2)).astype(np.float32)
        yield {
            "image_id": f"COCO_val2014_{index:012d}",
            "image_size": (480, 640),
            "boxes": np.concatenate([corners, corners + 100], axis=1),
            "features": rng.random((num_boxes, dim), dtype=np.float32),
            "object_ids": rng.integers(0, 1600, num_boxes),
            "object_conf": rng.random(num_boxes, dtype=np.float32),
            "attr_ids": rng.integers(0, 400, num_boxes),
            "attr_conf": rng.random(num_boxes, dtype=np.float32),
        }


def line_offsets(path: Path) -> dict[str, int]:
    offsets, position = {}, 0
    with open(path, "rb") as handle:
        for line in handle:
            offsets[line.split(b"\t", 1)[0].decode()] = position
            position += len(line)
    return offsets


def tsv_batch(path: Path, offsets: dict[str, int], image_ids: list[str]) -> torch.Tensor:
    features = []
    with open(path, "rb") as handle:
        for image_id in image_ids:
            handle.seek(offsets[image_id])
            record = _decode_row(handle.readline().decode().rstrip("\r\n").split("\t"))
            features.append(torch.from_numpy(record["features"].copy()))
    return torch.stack(features)


def store_batch(store: RegionFeatureStore, image_ids: list[str]) -> torch.Tensor:
    return store.padded(image_ids, "features")  # what the collators read


def load_obj_tsv(path: Path) -> dict[str, np.ndarray]:
    """LXMERT's approach: every image's decoded arrays in memory before training starts."""
    with open(path) as handle:
        return {line.split("\t", 1)[0]: _decode_row(line.rstrip("\r\n").split("\t"))["features"].copy() for line in handle}


def batches_per_second(read, batches: list[list[str]]) -> float:
    read(batches[0])  # warm-up
    start = time.perf_counter()
    for image_ids in batches:
        read(image_ids)
    return len(batches) / (time.perf_counter() - start)


def measure(args: argparse.Namespace) -> dict:
    """Writes the TSV and the store in a temporary folder and measures the three readers on the same batches."""
    load_average = [round(value, 2) for value in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        tsv = Path(tmp) / "features.tsv"
        write_lxmert_tsv(tsv, synthetic_records(args.num_images, args.num_boxes, args.dim))
        store_dir = Path(tmp) / "store"
        convert_features(tsv, "lxmert_tsv", store_dir)
        gc.collect()
        before_open = memory_mib()
        store = RegionFeatureStore.load(store_dir)
        rng = np.random.default_rng(0)
        ids = store.image_ids
        batches = [[ids[i] for i in rng.choice(len(ids), args.batch_size, replace=False)] for _ in range(args.batches)]
        # the same values both ways
        assert torch.equal(store_batch(store, batches[0][:2]), tsv_batch(tsv, line_offsets(tsv), batches[0][:2]))

        store_rate = batches_per_second(lambda b: store_batch(store, b), batches)
        after_store = memory_mib()
        offsets = line_offsets(tsv)
        tsv_rate = batches_per_second(lambda b: tsv_batch(tsv, offsets, b), batches)

        gc.collect()
        before_load = memory_mib()
        start = time.perf_counter()
        in_memory = load_obj_tsv(tsv)
        load_seconds = time.perf_counter() - start
        after_load = memory_mib()
        memory_rate = batches_per_second(lambda b: torch.stack([torch.from_numpy(in_memory[i]) for i in b]), batches)
        tsv_mib, store_mib = tsv.stat().st_size / 2**20, (store_dir / "region_features.arrow").stat().st_size / 2**20
    return {
        "settings": {key: getattr(args, key) for key in ("num_images", "num_boxes", "dim", "batch_size", "batches")},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "load_average_before": load_average,
        "store_batches_per_second": store_rate,
        "tsv_batches_per_second": tsv_rate,
        "in_memory_batches_per_second": memory_rate,
        "in_memory_load_seconds": load_seconds,
        "store_private_mib": after_store["RssAnon"] - before_open["RssAnon"],
        "store_mapped_mib": after_store["RssFile"] - before_open["RssFile"],
        "in_memory_private_mib": after_load["RssAnon"] - before_load["RssAnon"],
        "tsv_file_mib": tsv_mib,
        "store_file_mib": store_mib,
    }


def tables(report: dict) -> str:
    settings = report["settings"]
    raw_mib = settings["num_images"] * settings["num_boxes"] * settings["dim"] * 4 / 2**20
    store, tsv, memory = (report[f"{name}_batches_per_second"] for name in ("store", "tsv", "in_memory"))
    anon, mapped, loaded = report["store_private_mib"], report["store_mapped_mib"], report["in_memory_private_mib"]
    lines = [
        f"{settings['num_images']} images x {settings['num_boxes']} boxes x {settings['dim']} float32 features "
        f"({raw_mib:.0f} MiB of features); {settings['batches']} random batches of {settings['batch_size']} images; "
        f"{report['machine']}, torch {report['torch']}, load average before the run "
        f"{', '.join(map(str, report['load_average_before']))}; `python benchmarks/feature_store.py --json "
        f"{RESULTS.relative_to(ROOT)}`",
        "",
        "| reader | batches/s | vs TSV seek+parse |",
        "|---|---:|---:|",
        f"| RegionFeatureStore (memory-mapped Arrow) | {store:.1f} | {store / tsv:.1f}x |",
        f"| LXMERT TSV, seek to the line + parse | {tsv:.1f} | 1.0x |",
        f"| LXMERT TSV loaded whole first (after {report['in_memory_load_seconds']:.1f} s of parsing) | {memory:.1f} | "
        f"{memory / tsv:.1f}x |",
        "",
        "| memory | private (RssAnon) MiB | mapped file (RssFile) MiB | vs raw feature bytes |",
        "|---|---:|---:|---:|",
        f"| store, after the batches | {anon:.0f} | {mapped:.0f} | {anon / raw_mib:.2f}x private |",
        f"| whole TSV in memory (LXMERT) | {loaded:.0f} | - | {loaded / raw_mib:.2f}x private |",
        "",
        f"on disk: TSV {report['tsv_file_mib']:.0f} MiB, store {report['store_file_mib']:.0f} MiB "
        f"({report['store_file_mib'] / report['tsv_file_mib']:.2f}x)",
    ]
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    return f"{DOCS_BEGIN}\n{tables(report)}\n{DOCS_END}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", "--num_images", dest="num_images", type=int, default=1024)
    parser.add_argument("--num-boxes", "--num_boxes", dest="num_boxes", type=int, default=36)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--json", default=None, help=f"write the results here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' tables from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        report = json.loads(Path(args.docs).read_text())
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))
        return report
    report = measure(args)
    print(tables(report))
    if args.json:
        write_results(args.json, report)
    return report


if __name__ == "__main__":
    main()
