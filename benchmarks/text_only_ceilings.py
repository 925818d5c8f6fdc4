"""The text-only ceilings of the synthetic worlds' tasks (`hf_vlalign.evaluation.text_only`), measured on the default
scenes of world v1 and world v2 and rendered into docs/synthetic_world.md, never typed by hand:

    python benchmarks/text_only_ceilings.py --measure   # -> docs/results/text_only_ceilings.json (about 3 minutes)
    python benchmarks/text_only_ceilings.py --docs      # docs/synthetic_world.md's table from that JSON

A test checks that the page holds exactly what `docs_block` renders from the committed JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block  # noqa: E402  (benchmarks/docs_blocks.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "text_only_ceilings.json"
DOCS_BEGIN = "<!-- text-only ceilings table: begin -->"
DOCS_END = "<!-- text-only ceilings table: end -->"
TASK_NAMES = {
    "vgp_identification": "VGP identification",
    "vgp_type": "VGP type",
    "gqa": "GQA",
    "refcoco": "RefCOCO+",
    "nlvr2": "NLVR2",
}


def measure() -> dict:
    """Both worlds' ceilings on the default scenes (`SyntheticSceneConfig()`, one per world)."""
    from hf_vlalign.evaluation.text_only import text_only_ceilings
    from hf_vlalign.synthetic import SyntheticSceneConfig, generate_synthetic_scenes

    report = {"command": "python benchmarks/text_only_ceilings.py --measure", "worlds": {}}
    for world in ("v1", "v2"):
        config = SyntheticSceneConfig(world=world)
        with tempfile.TemporaryDirectory() as folder:
            root = generate_synthetic_scenes(Path(folder) / "scenes", config).root
            report["worlds"][world] = {"config": asdict(config), "ceilings": text_only_ceilings(root)}
    return report


def table(report: dict) -> str:
    """One row per task and world: the text-only ceiling, its reference (the majority class; GQA: the question-type
    prior too) and the image oracle, on the val split, with the examples counted."""
    lines = [
        "| task | world | text-only ceiling | majority class | question-type prior | image oracle | "
        "train / val examples |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, name in TASK_NAMES.items():
        for world, measured in report["worlds"].items():
            scores = measured["ceilings"][task]
            prior = scores.get("question_type_prior")
            lines.append(
                f"| {name} | {world} | {scores['text_only']:.3f} | {scores['majority']:.3f} | "
                f"{'-' if prior is None else f'{prior:.3f}'} | {scores['image_oracle']:.3f} | "
                f"{scores['num_train']:,} / {scores['num_eval']:,} |"
            )
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    caption = (
        f"Default scenes of each world (800 train / 150 val images, seed 0); from `{report['command']}`, saved in "
        f"`{RESULTS.relative_to(ROOT)}`:"
    )
    return f"{DOCS_BEGIN}\n{caption}\n\n{table(report)}\n{DOCS_END}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true", help="generate both worlds and write the results JSON")
    parser.add_argument("--docs", action="store_true", help="rewrite docs/synthetic_world.md's table from the JSON")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not (args.measure or args.docs):
        parser.error("give --measure and/or --docs")
    if args.measure:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(measure(), indent=2) + "\n")
    if args.docs:
        replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(json.loads(args.results.read_text())))


if __name__ == "__main__":
    main()
