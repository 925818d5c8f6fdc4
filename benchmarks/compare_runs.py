#!/usr/bin/env python
"""Compare two runs of `benchmarks/reproduce.py` (e.g. before and after a refactoring): the metrics of every run file
and every file the runs wrote (sha256), the wall-clock and provenance fields left out. Prints a table; exits 1 when a
metric or a file differs.

    python benchmarks/reproduce.py --budget smoke --num_seeds 1 --results_dir A --outputs_dir A_out   # tree 1
    python benchmarks/reproduce.py --budget smoke --num_seeds 1 --results_dir B --outputs_dir B_out   # tree 2
    python benchmarks/compare_runs.py A A_out B B_out
    python benchmarks/compare_runs.py A A_out B B_out --renames renames.json   # names renamed between the trees

`--renames` takes a JSON object {old name: new name}: A's metric keys and the text of A's files (whole words) are
renamed before the comparison, and JSON files are compared as parsed (key order aside), so a rename alone compares
equal while any other change of a number or a byte does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
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


def renamed(text: str, renames: dict[str, str]) -> str:
    """`text` with every whole-word old name of `renames` replaced by its new name (longest names first)."""
    for old in sorted(renames, key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(old)}(?![A-Za-z0-9_])", renames[old], text)
    return text


def metrics(path: Path, renames: dict[str, str] | None = None) -> dict:
    record = json.loads(path.read_text())
    values = record.get("metrics", record)
    values = {renamed(key, renames or {}): value for key, value in values.items()}
    return {key: value for key, value in values.items() if not any(word in key for word in TIMING_WORDS)}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_file(a: Path, b: Path, renames: dict[str, str]) -> bool:
    """Byte-identical, or, with renames, the same once A's names are renamed (JSON compared as parsed)."""
    if digest(a) == digest(b):
        return True
    if not renames:
        return False
    try:
        text_a, text_b = renamed(a.read_text(), renames), b.read_text()
    except UnicodeDecodeError:
        return False
    if a.suffix == ".json":
        return json.loads(text_a) == json.loads(text_b)
    return text_a == text_b


def files_of(root: Path) -> dict[str, Path]:
    return {
        str(path.relative_to(root)): path
        for path in root.rglob("*")
        if path.is_file() and path.name not in VOLATILE_FILES and "runs" not in path.relative_to(root).parts
    }


def compare(
    results_a: Path, outputs_a: Path, results_b: Path, outputs_b: Path, renames: dict[str, str] | None = None
) -> list[tuple[str, str, str]]:
    renames = renames or {}
    rows = []
    runs_a = {str(p.relative_to(results_a)): p for p in results_a.rglob("seed*.json")}
    runs_b = {str(p.relative_to(results_b)): p for p in results_b.rglob("seed*.json")}
    for name in sorted(runs_a.keys() | runs_b.keys()):
        if name not in runs_a or name not in runs_b:
            rows.append((name, "run", "missing in " + ("A" if name not in runs_a else "B")))
            continue
        a, b = metrics(runs_a[name], renames), metrics(runs_b[name])
        differing = sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key))
        rows.append((name, f"{len(a)} metrics", "equal" if not differing else f"differ: {differing}"))
    files_a, files_b = files_of(outputs_a), files_of(outputs_b)
    for name in sorted(files_a.keys() | files_b.keys()):
        if name not in files_a or name not in files_b:
            rows.append((name, "file", "missing in " + ("A" if name not in files_a else "B")))
        elif name.endswith("eval_results.json"):
            same = metrics(files_a[name], renames) == metrics(files_b[name])
            rows.append((name, "results", "equal" if same else "differ"))
        else:
            rows.append((name, "file", "identical" if same_file(files_a[name], files_b[name], renames) else "differ"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("results_a", "outputs_a", "results_b", "outputs_b"):
        parser.add_argument(name, type=Path)
    parser.add_argument("--renames", type=Path, help="JSON object {old name: new name} applied to A before comparing")
    args = parser.parse_args(argv)
    renames = json.loads(args.renames.read_text()) if args.renames else {}
    if not isinstance(renames, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in renames.items()):
        parser.error(f"--renames: expected a JSON object of old name -> new name strings, got {args.renames}")
    rows = compare(args.results_a, args.outputs_a, args.results_b, args.outputs_b, renames)
    print("| run / file | what | A vs B |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    bad = [row for row in rows if row[2] not in ("equal", "identical")]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} equal or identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
