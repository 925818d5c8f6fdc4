"""The `hf-vlalign` console entry point."""

import json
import shutil
import subprocess

import pytest

from hf_vlalign.cli import main, results_table
from hf_vlalign.data.formats.vgp import read_vgp_csv


def _write_results(folder, supervision, best):
    folder.mkdir()
    results = {
        "supervision": supervision, "image_description_accuracy": 0.5, "vgp_accuracy": 0.75,
        "grounding_accuracy_best_head": best, "grounding_accuracy_mean_head": 0.25, "grounding_baseline_accuracy": 0.2,
    }
    (folder / "eval_results.json").write_text(json.dumps(results))


def test_results_table_has_one_row_per_run(tmp_path):
    _write_results(tmp_path / "a", "none", 0.3)
    _write_results(tmp_path / "b", "direct", 0.9)
    table = results_table([tmp_path / "a", tmp_path / "b"]).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| none | 0.500 | 0.750 | 0.300 |")
    assert table[3].startswith("| direct |") and "0.900" in table[3]


def test_results_table_names_a_missing_run(tmp_path):
    with pytest.raises(ValueError, match="no eval_results.json"):
        results_table([tmp_path])


def test_synthesize_writes_the_published_formats(tmp_path, capsys):
    assert main(["synthesize", "--out", str(tmp_path / "scenes"), "--train_images", "3", "--val_images", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["features_tsv"].endswith("features.tsv")
    assert read_vgp_csv(tmp_path / "scenes" / "vgp" / "train.csv")


def test_console_script_is_installed():
    executable = shutil.which("hf-vlalign")
    assert executable is not None, "pip install -e . must install the `hf-vlalign` console script"
    completed = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0 and "synthesize" in completed.stdout and "probe" in completed.stdout
