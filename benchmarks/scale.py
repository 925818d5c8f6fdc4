#!/usr/bin/env python
"""How the builders, the feature converter and the store grow with the number of images: wall time and peak memory.

    python benchmarks/scale.py                                  # 1k, 10k and 30k images (30k = Flickr30k train)
    python benchmarks/scale.py --sizes 500 2000 --feature-dim 64
    python benchmarks/scale.py --json benchmarks/results/scale.json      # the docs' run
    python benchmarks/scale.py --docs benchmarks/results/scale.json      # only rewrite the docs' table

For each size, synthetic files in the published layouts are written into a temporary folder: a Flickr30k Entities
folder (`Sentences/<id>.txt` with `[/EN#<id>/<type> ...]` markup, `Annotations/<id>.xml`, `train.txt`, `val.txt`,
`test.txt`), a VGP-Typology `train_data.csv` (about 6 rows per image, as the published val csv has) and an LXMERT
feature TSV (36 boxes per image). Captions are five per image, 10-15 words, drawn from an 18,000-word vocabulary with
Zipf frequencies plus the function words every caption shares, so that the TF-IDF neighbour search of the hard
negatives meets the word overlap of real captions.

Each measurement runs in a fresh Python process (`--measure TASK --root DIR`), which reports the seconds of the work
itself (imports excluded), its peak resident memory (`ru_maxrss`) and its resident memory after the imports, before
the work. Tasks: the VGP builder with hard negatives (the default) and with random ones (everything but the
neighbour search), the Flickr30k Entities builder, `convert-features` (LXMERT TSV -> store), and reading every image
of the store in random batches of 64 after `RegionFeatureStore.load` (checksum included). Growth is reported as
ratios to the smallest size. The table of docs/datasets.md is rendered from the committed results file
(tests/project/test_scale_benchmark.py checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from machine_info import cpu_model  # noqa: E402  (benchmarks/machine_info.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"
DOCS_BEGIN = "<!-- benchmarks/scale.py table: begin -->"
DOCS_END = "<!-- benchmarks/scale.py table: end -->"
TASKS = {
    "vgp_hard": "VGP builder, hard negatives (the default)",
    "vgp_random": "VGP builder, random negatives",
    "flickr30k_entities": "Flickr30k Entities builder",
    "convert_features": "convert-features (LXMERT TSV -> store)",
    "store_read": "store: load + read every image",
}
NUM_BOXES = 36
VOCABULARY_SIZE = 18_000
FUNCTION_WORDS = ["a", "the", "in", "on", "of", "with", "and", "is", "are", "at", "while", "near", "an", "to", "his"]
ENTITY_TYPES = ["people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other"]
TYPES = ["Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence"]


# ----------------------------------------------------------------------------------------------------------------
# Synthetic files in the published layouts
# ----------------------------------------------------------------------------------------------------------------


def vocabulary() -> list[str]:
    """Word-like tokens made of syllables, so that they sort and tokenise as words do."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70
    return [
        syllables[i // 70 % 70] + syllables[i % 70] + ("" if i < 4900 else syllables[i // 4900])
        for i in range(VOCABULARY_SIZE)
    ]


class CaptionWriter:
    """Draws an image's entities, their phrases and five captions naming them, in Flickr30k Entities markup."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.words = vocabulary()
        frequencies = 1.0 / np.arange(1, VOCABULARY_SIZE + 1) ** 1.05
        self.cumulative = np.cumsum(frequencies / frequencies.sum())
        self.cumulative[-1] = 1.0

    def content_words(self, count: int) -> list[str]:
        return [self.words[i] for i in np.searchsorted(self.cumulative, self.rng.random(count), side="right")]

    def image(self, image_id: str) -> tuple[list[str], list[tuple[str, str]], str]:
        """(caption lines, (phrase, phrase) pairs naming one entity in two captions, annotation XML)."""
        rng = self.rng
        num_entities = int(rng.integers(3, 6))
        entities = []
        for entity in range(num_entities):
            head = self.content_words(1)[0]
            variants = [
                " ".join([rng.choice(["a", "the", "an", "two"]), *self.content_words(int(rng.integers(0, 3))), head])
                for _ in range(3)
            ]
            entities.append((str(entity + 1), rng.choice(ENTITY_TYPES), variants))
        lines, mentions = [], {}
        for caption in range(5):
            chosen = rng.choice(num_entities, size=int(rng.integers(2, 4)), replace=False)
            pieces = []
            for position, index in enumerate(chosen):
                entity_id, entity_type, variants = entities[index]
                phrase = variants[int(rng.integers(len(variants)))]
                if position == 0 and caption % 2 == 0:
                    phrase = phrase[0].upper() + phrase[1:]
                mentions.setdefault(entity_id, []).append((caption, phrase))
                pieces.append(f"[/EN#{entity_id}/{entity_type} {phrase}]")
                filler = [*self.content_words(int(rng.integers(1, 4))), rng.choice(FUNCTION_WORDS)]
                pieces.append(" ".join(filler))
            lines.append(" ".join(pieces) + " .")
        pairs = []
        for found in mentions.values():
            across = [(a, b) for a in found for b in found if a[0] < b[0] and a[1].lower() != b[1].lower()]
            unique = {(a[1].lower(), b[1].lower()): (a[1], b[1]) for a, b in across}  # a repeated row is a repeat
            pairs += list(unique.values())[:2]
        return lines, pairs, self.annotation(image_id, entities)

    def annotation(self, image_id: str, entities: list) -> str:
        width, height = int(self.rng.integers(300, 501)), int(self.rng.integers(300, 501))
        objects = []
        for entity_id, entity_type, _ in entities:
            if entity_type == "scene":
                objects.append(f"\t<object>\n\t\t<name>{entity_id}</name>\n\t\t<nobndbox>0</nobndbox>\n\t\t<scene>1</scene>\n\t</object>")
                continue
            for _ in range(int(self.rng.integers(1, 3))):
                x1, y1 = int(self.rng.integers(1, width // 2)), int(self.rng.integers(1, height // 2))
                x2, y2 = int(self.rng.integers(x1 + 10, width)), int(self.rng.integers(y1 + 10, height))
                corners = zip(("xmin", "ymin", "xmax", "ymax"), (x1, y1, x2, y2))
                box = "".join(f"\t\t\t<{tag}>{value}</{tag}>\n" for tag, value in corners)
                objects.append(f"\t<object>\n\t\t<name>{entity_id}</name>\n\t\t<bndbox>\n{box}\t\t</bndbox>\n\t</object>")
        size = f"\t<size>\n\t\t<width>{width}</width>\n\t\t<height>{height}</height>\n\t\t<depth>3</depth>\n\t</size>"
        return f"<annotation>\n\t<filename>{image_id}.jpg</filename>\n{size}\n" + "\n".join(objects) + "\n</annotation>"


def preprocess(phrase: str) -> str:
    """The `phrase1`/`phrase2` cells of VGP-Typology: lower case, without determiners."""
    return " ".join(word for word in phrase.lower().split() if word not in ("a", "the", "an"))


def write_files(root: Path, num_images: int, feature_dim: int, seed: int = 0) -> dict[str, Path]:
    """Writes the Flickr30k Entities folder, the VGP csv and the LXMERT TSV of `num_images` images under `root`."""
    from hf_vlalign.data.formats.lxmert_tsv import write_lxmert_tsv

    flickr = root / "flickr30k_entities"
    (flickr / "Sentences").mkdir(parents=True)
    (flickr / "Annotations").mkdir()
    writer = CaptionWriter(seed)
    image_ids = [str(1_000_000 + index) for index in range(num_images + 20)]  # 10 val and 10 test images after train
    csv_lines = ["image,phrase1,phrase2,original_phrase1,original_phrase2,original_label,type_label"]
    for index, image_id in enumerate(image_ids):
        lines, pairs, annotation = writer.image(image_id)
        (flickr / "Sentences" / f"{image_id}.txt").write_text("".join(f"{line}\n" for line in lines))
        (flickr / "Annotations" / f"{image_id}.xml").write_text(annotation)
        for first, second in pairs if index < num_images else ():
            label = int(writer.rng.integers(len(TYPES)))
            csv_lines.append(f"{image_id},{preprocess(first)},{preprocess(second)},{first},{second},{TYPES[label]},{label}")
    for split, ids in (("train", image_ids[:num_images]), ("val", image_ids[-20:-10]), ("test", image_ids[-10:])):
        (flickr / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
    (root / "train_data.csv").write_text("\n".join(csv_lines) + "\n")
    write_lxmert_tsv(root / "features.tsv", feature_records(image_ids[:num_images], feature_dim, seed))
    return {"flickr30k_entities": flickr, "vgp_csv": root / "train_data.csv", "tsv": root / "features.tsv"}


def feature_records(image_ids: list[str], feature_dim: int, seed: int):
    rng = np.random.default_rng(seed)
    for image_id in image_ids:
        corners = rng.uniform(0, 300, size=(NUM_BOXES, 2)).astype(np.float32)
        yield {
            "image_id": image_id,
            "image_size": (500, 500),
            "boxes": np.concatenate([corners, corners + 100], axis=1),
            "features": rng.random((NUM_BOXES, feature_dim), dtype=np.float32),
            "object_ids": rng.integers(0, 1600, NUM_BOXES),
            "object_conf": rng.random(NUM_BOXES, dtype=np.float32),
            "attr_ids": rng.integers(0, 400, NUM_BOXES),
            "attr_conf": rng.random(NUM_BOXES, dtype=np.float32),
        }


# ----------------------------------------------------------------------------------------------------------------
# One measurement (in its own process)
# ----------------------------------------------------------------------------------------------------------------


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_task(task: str, root: Path) -> dict:
    """Imports what `task` needs, then times it; returns seconds, rows made and memory."""
    import datasets
    import transformers

    from hf_vlalign.data.builders import build_dataset, build_vgp_dataset
    from hf_vlalign.data.feature_store import RegionFeatureStore, convert_features

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()  # the builders' warnings name synthetic rows: not measured
    files = {"flickr30k_entities": root / "flickr30k_entities", "vgp_csv": root / "train_data.csv"}
    store_dir = root / "store"
    before = current_mib()
    start = time.perf_counter()
    if task in ("vgp_hard", "vgp_random"):
        negatives = task.removeprefix("vgp_")
        rows = len(build_vgp_dataset(files["flickr30k_entities"], files["vgp_csv"], negatives=negatives, split="train"))
    elif task == "flickr30k_entities":
        rows = len(build_dataset("flickr30k_entities", files["flickr30k_entities"], "train"))
    elif task == "convert_features":
        rows = len(convert_features(root / "features.tsv", "lxmert_tsv", store_dir, overwrite=True))
    elif task == "store_read":
        store = RegionFeatureStore.load(store_dir)
        order = np.random.default_rng(0).permutation(len(store))
        ids = store.image_ids
        for batch in range(0, len(order), 64):
            store.padded([ids[i] for i in order[batch : batch + 64]], "features")
        rows = len(store)
    else:
        raise ValueError(f"`task` must be one of {list(TASKS)}, got {task!r}.")
    return {"seconds": time.perf_counter() - start, "rows": rows, "peak_mib": peak_mib(), "start_mib": before}


def measure_in_child(task: str, root: Path) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", task, "--root", str(root)]
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if completed.returncode != 0:
        raise RuntimeError(f"{task} on {root} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def measure(sizes: list[int], feature_dim: int) -> dict:
    runs = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix=f"scale_{size}_") as tmp:
            start = time.perf_counter()
            write_files(Path(tmp), size, feature_dim)
            print(f"{size} images: files written in {time.perf_counter() - start:.0f} s", flush=True)
            for task in TASKS:  # convert_features before store_read, which reads its store
                result = measure_in_child(task, Path(tmp))
                runs.append({"task": task, "num_images": size, **result})
                print(f"  {task}: {result['seconds']:.1f} s, peak {result['peak_mib']:.0f} MiB", flush=True)
    return {
        "settings": {"sizes": sizes, "feature_dim": feature_dim, "num_boxes": NUM_BOXES},
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
        "load_average_before": [round(value, 2) for value in os.getloadavg()],
        "runs": runs,
        "growth": growth(runs, sizes),
    }


def work_mib(run: dict) -> float:
    """Memory the work added to the process: peak RSS - RSS after the imports."""
    return run["peak_mib"] - run["start_mib"]


def growth(runs: list[dict], sizes: list[int]) -> dict:
    """Per task, ratios of the largest size to the smallest: images, work seconds, peak memory and memory above the
    imports (peak - start)."""
    by = {(run["task"], run["num_images"]): run for run in runs}
    small, large = min(sizes), max(sizes)
    out = {}
    for task in TASKS:
        first, last = by[task, small], by[task, large]
        out[task] = {
            "size_ratio": large / small,
            "time_ratio": last["seconds"] / first["seconds"],
            "peak_ratio": last["peak_mib"] / first["peak_mib"],
            "work_memory_ratio": work_mib(last) / max(work_mib(first), 1.0),
        }
    return out


# ----------------------------------------------------------------------------------------------------------------
# The docs' table
# ----------------------------------------------------------------------------------------------------------------


def table(report: dict) -> str:
    sizes = report["settings"]["sizes"]
    by = {(run["task"], run["num_images"]): run for run in report["runs"]}
    machine, settings = report["machine"], report["settings"]
    small, large = min(sizes), max(sizes)
    header = " | ".join(f"{size:,} images" for size in sizes)
    lines = [
        f"Seconds of work and peak resident memory (MiB, imports included) of one fresh process per cell; synthetic "
        f"files in the published layouts ({settings['num_boxes']} boxes x {settings['feature_dim']} features per image "
        f"in the TSV); {machine['cpu']}, {machine['cores']} cores, load average before the run "
        f"{', '.join(map(str, report['load_average_before']))}; `python benchmarks/scale.py --json "
        f"{RESULTS.relative_to(ROOT)}`",
        "",
        f"| task | {header} | time {large // small}x images | memory above imports {large // small}x images |",
        "|---|" + "---:|" * (len(sizes) + 2),
    ]
    for task, name in TASKS.items():
        cells = " | ".join(f"{by[task, size]['seconds']:.1f} s, {by[task, size]['peak_mib']:.0f} MiB" for size in sizes)
        ratios = report["growth"][task]
        lines.append(f"| {name} | {cells} | {ratios['time_ratio']:.1f}x | {ratios['work_memory_ratio']:.1f}x |")
    search_seconds = {size: by["vgp_hard", size]["seconds"] - by["vgp_random", size]["seconds"] for size in sizes}
    search = ", ".join(f"{seconds:.1f} s at {size:,} images" for size, seconds in search_seconds.items())
    lines += [
        "",
        f"The hard-negative search (hard - random negatives) took {search}: it is exact, so it compares every pair of "
        "images (time O(N^2), a dense product over the frequent words plus the pairs that share a rare word), in "
        "blocks of 256 images against all (memory O(256 x N)).",
    ]
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    return f"{DOCS_BEGIN}\n{table(report)}\n{DOCS_END}"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 30_000], help="numbers of images")
    dim_help = "features per box in the TSV (2048 in the published files; a smaller one keeps the files small)"
    parser.add_argument("--feature-dim", "--feature_dim", dest="feature_dim", type=int, default=256, help=dim_help)
    parser.add_argument("--json", default=None, help=f"write the results here (the docs': {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--docs", default=None, help="only rewrite the docs' table from this results JSON")
    parser.add_argument("--measure", choices=list(TASKS), help=argparse.SUPPRESS)  # the child process of one cell
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(run_task(args.measure, Path(args.root))))
        return None
    if args.docs:
        report = json.loads(Path(args.docs).read_text())
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))
        return report
    if len(args.sizes) < 2 or min(args.sizes) < 2:
        raise SystemExit(f"--sizes must be at least two numbers of images >= 2, got {args.sizes}.")
    report = measure(sorted(args.sizes), args.feature_dim)
    print(table(report))
    if args.json:
        write_results(args.json, report)
    return report


if __name__ == "__main__":
    main()
