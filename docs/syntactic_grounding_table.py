"""The syntactic-grounding table of docs/analysis.md (Li et al. 2020, "What does BERT with vision look at?",
Table 2) of the main job's model, rendered from a committed results file and never typed by hand:

    accelerate launch examples/finetune_vgp.py --output_dir outputs/vgp
    hf-vlalign analyze outputs/vgp --out outputs/vgp_analysis
    python docs/syntactic_grounding_table.py --analysis outputs/vgp_analysis   # -> docs/results/syntactic_grounding.json
                                                                               #    and docs/images/analyze_syntactic_grounding.png
    python docs/syntactic_grounding_table.py --docs                            # docs/analysis.md's block from that JSON

A test checks that docs/analysis.md holds exactly what `docs_block` renders from the committed JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from docs_blocks import replace_docs_block  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "syntactic_grounding.json"
PLOT = ROOT / "docs" / "images" / "analyze_syntactic_grounding.png"
DOCS_BEGIN = "<!-- syntactic grounding table: begin -->"
DOCS_END = "<!-- syntactic grounding table: end -->"
SUMMARY_KEYS = ("parser", "num_arcs", "num_words", "words_without_token", "iou_threshold", "top_relations")


def results_from_analysis(analysis_dir: Path) -> dict:
    """The small, commit-ready part of `hf-vlalign analyze`'s analysis.json: what the docs' table needs."""
    analysis = json.loads((analysis_dir / "analysis.json").read_text())
    syntactic = analysis.get("syntactic_grounding")
    if syntactic is None or "skipped" in syntactic:
        reason = "no syntactic_grounding entry" if syntactic is None else syntactic["skipped"]
        raise ValueError(f"`--analysis` {analysis_dir} has no syntactic grounding to report: {reason}")
    config = json.loads((Path(analysis["model_dir"]) / "config.json").read_text())
    probe = analysis["grounding_probe"]
    return {
        "command": f"hf-vlalign analyze {analysis['model_dir']} --out {analysis_dir}",
        "model_dir": analysis["model_dir"],
        "model_type": analysis["model_type"],
        "attention_supervision": config.get("attention_supervision"),
        "data": analysis["data"],
        "num_examples": analysis["num_examples"],
        "grounding_probe_best_head_accuracy": probe["best_head_accuracy"],
        **{key: syntactic[key] for key in SUMMARY_KEYS},
    }


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(rows: list[dict]) -> str:
    """Markdown table, one row per relation, most frequent first (layers and heads counted from 0): the best actively
    attending head (Li et al.'s Table 2) with its active share (its attention's share on regions)."""
    lines = [
        "| relation | arcs | best active head | its active share | best-head accuracy | mean over heads | "
        "detection-confidence baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['relation']} | {row['count']:,} | layer {row['layer']}, head {row['head']} | "
            f"{row['active_share']:.2f} | {_accuracy(row['accuracy'])} | {_accuracy(row['mean_accuracy'])} | "
            f"{_accuracy(row['baseline_accuracy'])} |"
        )
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    """The docs' table and its one-line setting, from a results file this script wrote."""
    family = report["model_type"].removeprefix("vlalign_").replace("_", "-")
    caption = (
        f"{family.capitalize()} model with `{report['attention_supervision']}` attention supervision; data: "
        f"{report['data']}, {report['num_examples']:,} examples, {report['num_arcs']:,} arcs touching an entity word; "
        f"parser: spaCy `{report['parser']}` ({report['words_without_token']} of {report['num_words']:,} words without "
        f"a token). From `{report['command']}`, saved in `{RESULTS.relative_to(ROOT)}`:"
    )
    return f"{DOCS_BEGIN}\n{caption}\n\n{table(report['top_relations'])}\n{DOCS_END}"


def write_docs(results: Path) -> None:
    replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(json.loads(results.read_text())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--analysis", type=Path, help="an `hf-vlalign analyze --out` folder: write the results JSON and the PNG")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/analysis.md's block from the results JSON")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.analysis is None and not args.docs:
        parser.error("give --analysis DIR and/or --docs")
    if args.analysis is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results_from_analysis(args.analysis), indent=2) + "\n")
        PLOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.analysis / "syntactic_grounding.png", PLOT)
    if args.docs:
        write_docs(args.results)


if __name__ == "__main__":
    main()
