"""End to end: the output of `accelerate launch examples/finetune_vgp.py` (the `finetuned` fixture of conftest.py)."""

import json

import pytest
import torch
from image_use_checks import assert_image_use_reported
from transformers import AutoModel, AutoTokenizer

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import AutoModelForVisualParaphrase, SingleStreamForVisualParaphrase
from hf_vlalign.cli import main
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.synthetic import SyntheticSceneConfig

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow


def test_example_writes_weights_card_plots_and_results(finetuned):
    model_dir = finetuned / "model"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "attention_heatmap.png",
                 "grounding_accuracy_per_head.png", "eval_results.json", "training_args.json"):
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))  # safetensors only, nothing pickled
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, "id_accuracy")
    for key in ("image_description_accuracy", "vgp_accuracy", "grounding_accuracy_best_head",
                "grounding_accuracy_mean_head", "grounding_baseline_accuracy"):
        assert 0.0 <= results[key] <= 1.0, key
    assert results["supervision"] == "semi_direct"
    assert results["grounding_accuracy_best_head"] >= results["grounding_accuracy_mean_head"]
    card = (model_dir / "README.md").read_text()
    assert "library_name: hf_vlalign" in card and f"{results['vgp_accuracy']:.4f}"[:5] in card


def test_launch_prints_no_accelerate_or_pin_memory_notice(finetuned):
    # accelerate lists the defaults it picked when no config gives them (examples/accelerate_configs/single_process.yaml
    # does); torch warns at every DataLoader when memory is pinned without an accelerator (the recipes pin only with one)
    stderr = (finetuned / "launch_stderr.txt").read_text()
    assert "were not passed to `accelerate launch`" not in stderr
    assert "pin_memory" not in stderr


def test_reloaded_model_reproduces_the_trained_models_predictions(finetuned, monkeypatch):
    model_dir = finetuned / "model"
    results = json.loads((model_dir / "eval_results.json").read_text())
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(finetuned / "cache"))
    data = load_vgp_data(synthetic_config=SyntheticSceneConfig(num_train_images=12, num_val_images=6))
    collator = VGPCollator(AutoTokenizer.from_pretrained(model_dir), data.region_features)
    reloaded = AutoModelForVisualParaphrase.from_pretrained(model_dir).eval()
    assert type(reloaded) is SingleStreamForVisualParaphrase
    id_correct = vgp_correct = 0
    with torch.no_grad():
        for start in range(0, len(data.eval), 32):
            batch = collator([data.eval[i] for i in range(start, min(start + 32, len(data.eval)))])
            out = reloaded(**batch)
            id_correct += int((out.id_logits.argmax(-1) == batch["id_labels"]).sum())
            vgp_correct += int((out.vgp_logits.argmax(-1) == batch["vgp_labels"]).sum())
    # the accuracies the training run measured in memory, reproduced by the reloaded weights
    assert id_correct / len(data.eval) == pytest.approx(results["image_description_accuracy"], abs=1e-12)
    assert vgp_correct / len(data.eval) == pytest.approx(results["vgp_accuracy"], abs=1e-12)

    base = AutoModel.from_pretrained(model_dir).eval()
    assert type(base).__name__ == "SingleStreamModel"
    model_inputs = {k: v for k, v in batch.items() if k not in ("phrase1_mask", "phrase2_mask", "id_labels", "vgp_labels")}
    with torch.no_grad():
        assert torch.equal(base(**model_inputs).last_hidden_state, reloaded.single_stream(**model_inputs).last_hidden_state)


def test_cli_probe_reproduces_the_reported_grounding(finetuned, monkeypatch, capsys):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(finetuned / "cache"))
    plot, full = finetuned / "heads.png", finetuned / "probe.json"
    arguments = ["probe", str(finetuned / "model"), "--synthetic_train_images", "12", "--synthetic_eval_images", "6",
                 "--plot", str(plot), "--json", str(full)]  # fmt: skip
    assert main(arguments) == 0
    table = capsys.readouterr().out  # a short table; the accuracy of every head goes to --json
    probe = json.loads(full.read_text())
    results = json.loads((finetuned / "model" / "eval_results.json").read_text())
    assert probe["best_head_accuracy"] == pytest.approx(results["grounding_accuracy_best_head"], abs=1e-9)
    assert probe["baseline_accuracy"] == pytest.approx(results["grounding_baseline_accuracy"], abs=1e-9)
    assert f"{results['grounding_accuracy_best_head']:.3f}" in table and len(table.splitlines()) < 30
    assert plot.is_file()
