"""After the Qwen2-VL check's second plan (not part of it): Kang et al.'s training-free grounding from the heads of
the supervised layer itself instead of the heads the selection picked, and why the selection passed them over.

For each seed's `none` and `direct` models of `vlm_qwen2vl_mechanism_v2`, the grounding of the evaluation expressions
(the study's verb settings: `--smoothing_sigma 0.3333`) from the selected heads (as the study's verb run) and from
all heads of language layer 2, the layer the `direct` runs supervise; beside it, each head's data-set-mean S_img and
spatial entropy from the verb's saved selection, and the tau it had to pass. Writes
`results/vlm_qwen2vl_mechanism/v2/supervised_heads.json`.

    python benchmarks/studies/supervised_heads_grounding.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from hf_vlalign.vlms.loading import load_patch_model
from hf_vlalign.vlms.localization_heads import HeadSelection, localization_head_grounding, refcoco_file_examples

ROOT = Path(__file__).resolve().parents[2]
STUDY = "vlm_qwen2vl_mechanism_v2"
SUPERVISED_LAYER = 2
SMOOTHING_SIGMA = 0.3333  # the study's verb settings (benchmarks/studies/vlm_qwen2vl_mechanism_v2.py)
EXPRESSIONS = ROOT / "outputs/studies/synthetic_canvases/refcoco_val.jsonl"


def _finite(value) -> float | None:
    """JSON has no NaN / infinity: an entropy never computed (a layer left out) or infinite is written as null."""
    value = float(value)
    return value if math.isfinite(value) else None


def head_statistics(selection: HeadSelection, layer: int) -> list[dict]:
    return [
        {"head": head, "mean_attention_sum": float(selection.mean_attention_sum[layer, head]),
         "mean_entropy": _finite(selection.mean_entropy[layer, head]),
         "frequency": int(selection.frequency[layer, head])}
        for head in range(selection.mean_attention_sum.shape[1])
    ]  # fmt: skip


def one_model(outputs: Path, setting: str, seed: int, examples: list[dict]) -> dict:
    model_dir = outputs / setting / f"seed{seed}"
    selection = HeadSelection.load(outputs / f"{setting}_heads" / f"seed{seed}" / "localization_heads.json")
    model, processor = load_patch_model(str(model_dir))
    layer_heads = [(SUPERVISED_LAYER, head) for head in range(model.config.text_config.num_attention_heads)]
    scores = {}
    for name, heads in (("selected", selection.selected), ("supervised_layer", layer_heads)):
        chosen = dataclasses.replace(selection, selected=heads)
        result = localization_head_grounding(model, processor, examples, chosen, batch_size=16, smoothing_sigma=SMOOTHING_SIGMA)
        scores[name] = {"heads": [list(pair) for pair in heads], "accuracy": result["accuracy"]}
    return {
        **scores, "tau": selection.tau, "gold_map_accuracy": result["gold_map_accuracy"],
        "centre_box_accuracy": result["centre_box_accuracy"],
        "supervised_layer_statistics": head_statistics(selection, SUPERVISED_LAYER),
        "selected_statistics": [
            {"layer": layer, **head_statistics(selection, layer)[head]} for layer, head in selection.selected
        ],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outputs", type=Path, default=ROOT / "outputs/reproduce/miniature" / STUDY)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44, 45, 46])
    args = parser.parse_args()
    examples = refcoco_file_examples(EXPRESSIONS)
    report = {
        f"{setting}/seed{seed}": one_model(args.outputs, setting, seed, examples)
        for seed in args.seeds for setting in ("none", "direct")
    }  # fmt: skip
    for setting in ("none", "direct"):
        rows = [value for key, value in report.items() if key.startswith(f"{setting}/")]
        report[f"{setting}/mean"] = {
            name: sum(row[name]["accuracy"] for row in rows) / len(rows) for name in ("selected", "supervised_layer")
        }
    path = ROOT / "results/vlm_qwen2vl_mechanism/v2/supervised_heads.json"
    path.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    print(json.dumps({key: value for key, value in report.items() if key.endswith("/mean")}, indent=1))


if __name__ == "__main__":
    main()
