"""benchmarks/compare_runs.py: two runs compare equal only when every metric and written file is the same; with
`--renames`, a name renamed between the two trees compares equal and any other change still differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_modules import ROOT, load_script

compare_runs = load_script("compare_runs", ROOT / "benchmarks" / "compare_runs.py")


def write_tree(root: Path, metric_key: str, value: float, config_key: str, weights: bytes) -> tuple[Path, Path]:
    results, outputs = root / "results", root / "outputs"
    (results / "exp").mkdir(parents=True)
    (outputs / "exp" / "seed42").mkdir(parents=True)
    (results / "exp" / "seed42.json").write_text(json.dumps({"metrics": {metric_key: value, "train_runtime": 1.0}}))
    (outputs / "exp" / "seed42" / "config.json").write_text(json.dumps({config_key: 1.0, "hidden_size": 8}))
    (outputs / "exp" / "seed42" / "model.safetensors").write_bytes(weights)
    return results, outputs


def differing(rows: list[tuple[str, str, str]]) -> list[str]:
    return [name for name, _, verdict in rows if verdict not in ("equal", "identical")]


def test_a_rename_differs_without_renames_and_compares_equal_with_them(tmp_path):
    a = write_tree(tmp_path / "a", "loss_att", 0.5, "mask_loss_weight", b"weights")
    b = write_tree(tmp_path / "b", "loss_attention_supervision", 0.5, "mask_weight", b"weights")
    assert differing(compare_runs.compare(*a, *b)) == ["exp/seed42.json", "exp/seed42/config.json"]
    renames = {"loss_att": "loss_attention_supervision", "mask_loss_weight": "mask_weight"}
    assert differing(compare_runs.compare(*a, *b, renames)) == []


@pytest.mark.parametrize("change", ["metric", "weights"])
def test_any_other_change_differs_with_renames(tmp_path, change):
    a = write_tree(tmp_path / "a", "loss_att", 0.5, "mask_loss_weight", b"weights")
    b = write_tree(
        tmp_path / "b", "loss_attention_supervision", 0.25 if change == "metric" else 0.5, "mask_weight",
        b"weights" if change == "metric" else b"other weights",
    )  # fmt: skip
    renames = {"loss_att": "loss_attention_supervision", "mask_loss_weight": "mask_weight"}
    expected = ["exp/seed42.json"] if change == "metric" else ["exp/seed42/model.safetensors"]
    assert differing(compare_runs.compare(*a, *b, renames)) == expected


def test_renames_apply_to_whole_words_only():
    assert compare_runs.renamed("loss_att loss_attention", {"loss_att": "X"}) == "X loss_attention"
