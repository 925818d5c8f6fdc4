#!/usr/bin/env python
"""Compare two runs of `benchmarks/reproduce.py` (e.g. before and after a refactoring): the metrics of every run file
and every file the runs wrote (sha256), the wall-clock and provenance fields left out. Prints a table; exits 1 when a
metric or a file differs.

    python benchmarks/reproduce.py --budget smoke --num_seeds 1 --results_dir A --outputs_dir A_out   # tree 1
    python benchmarks/reproduce.py --budget smoke --num_seeds 1 --results_dir B --outputs_dir B_out   # tree 2
    python benchmarks/compare_runs.py A A_out B B_out
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

# files that name the output folder or hold times: they differ between two runs of the same code
VOLATILE_FILES = {
    "training_args.json",
    "training_args.bin",
    "trainer_state.json",
    "all_results.json",
    "train_results.json",
}
TIMING_WORDS = ("runtime", "per_second", "_time")


def metrics(path: Path) -> dict:
    record = json.loads(path.read_text())
    values = record.get("metrics", record)
    return {key: value for key, value in values.items() if not any(word in key for word in TIMING_WORDS)}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(root: Path) -> dict[str, Path]:
    return {
        str(path.relative_to(root)): path
        for path in root.rglob("*")
        if path.is_file() and path.name not in VOLATILE_FILES and "runs" not in path.relative_to(root).parts
    }


def compare(results_a: Path, outputs_a: Path, results_b: Path, outputs_b: Path) -> list[tuple[str, str, str]]:
    rows = []
    runs_a = {str(p.relative_to(results_a)): p for p in results_a.rglob("seed*.json")}
    runs_b = {str(p.relative_to(results_b)): p for p in results_b.rglob("seed*.json")}
    for name in sorted(runs_a.keys() | runs_b.keys()):
        if name not in runs_a or name not in runs_b:
            rows.append((name, "run", "missing in " + ("A" if name not in runs_a else "B")))
            continue
        a, b = metrics(runs_a[name]), metrics(runs_b[name])
        differing = sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key))
        rows.append((name, f"{len(a)} metrics", "equal" if not differing else f"differ: {differing}"))
    files_a, files_b = files_of(outputs_a), files_of(outputs_b)
    for name in sorted(files_a.keys() | files_b.keys()):
        if name not in files_a or name not in files_b:
            rows.append((name, "file", "missing in " + ("A" if name not in files_a else "B")))
        elif name.endswith("eval_results.json"):
            same = metrics(files_a[name]) == metrics(files_b[name])
            rows.append((name, "results", "equal" if same else "differ"))
        else:
            rows.append((name, "file", "identical" if digest(files_a[name]) == digest(files_b[name]) else "differ"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("results_a", "outputs_a", "results_b", "outputs_b"):
        parser.add_argument(name, type=Path)
    args = parser.parse_args(argv)
    rows = compare(args.results_a, args.outputs_a, args.results_b, args.outputs_b)
    print("| run / file | what | A vs B |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    bad = [row for row in rows if row[2] not in ("equal", "identical")]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} equal or identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
