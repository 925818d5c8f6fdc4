"""End to end: the output of `accelerate launch examples/finetune_vgp.py` (the `finetuned` fixture of conftest.py)."""

import csv
import json
from pathlib import Path

import pytest
import torch
from image_use_checks import assert_diagnostics_reported, assert_image_use_reported
from launch_helpers import save_tiny_bert
from published_features import write_lxmert_tsv_features
from script_modules import ROOT, load_script
from shared_samples import real_sample
from transformers import AutoModel, AutoProcessor, AutoTokenizer

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import AutoModelForVisualParaphrase, SingleStreamForVisualParaphrase
from hf_vlalign.cli import main
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.synthetic import SyntheticSceneConfig

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

TYPES = ("Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence")


def test_example_writes_weights_card_plots_and_results(finetuned):
    model_dir = finetuned / "model"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "processor_config.json", "README.md", "attention_heatmap.png",
                 "grounding_accuracy_per_head.png", "eval_results.json", "training_args.json"):
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))  # safetensors only, nothing pickled
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, "id_accuracy")
    tasks = {"vgp_identification": "id_accuracy", "vgp_type": "vgp_accuracy"}
    assert_diagnostics_reported(results, tasks, supervised=True)  # semi-direct supervision
    for key in ("image_description_accuracy", "vgp_accuracy", "grounding_accuracy_best_head",
                "grounding_accuracy_mean_head", "grounding_baseline_accuracy"):
        assert 0.0 <= results[key] <= 1.0, key
    # the default VGP task is the pair's semantic type (eq. 4); the synthetic scenes have 4 of the 5 types
    assert results["vgp_task"] == "type"
    assert results["vgp_untyped_rows"]["train"] > 0  # identification negatives: not VGPs, no type
    for name in TYPES:
        assert f"vgp_type_accuracy/{name}" in results and results[f"vgp_type_count/{name}"] >= 0
    assert results["vgp_type_count/Alternation"] == 0 and results["vgp_type_accuracy/Alternation"] is None
    assert results["supervision"] == "semi_direct"
    assert results["grounding_accuracy_best_head"] >= results["grounding_accuracy_mean_head"]
    card = (model_dir / "README.md").read_text()
    assert "library_name: hf_vlalign" in card and f"{results['vgp_accuracy']:.4f}"[:5] in card
    # each accuracy beside its baseline: the training pairs' majority class, the probe's most confident region
    kinds = {key: entry["kind"] for key, entry in results["baselines"].items()}
    assert kinds == {"image_description_accuracy": "majority_class", "vgp_accuracy": "majority_class",
                     "grounding_accuracy_best_head": "detection_confidence",
                     "grounding_accuracy_mean_head": "detection_confidence"}  # fmt: skip
    assert results["baselines"]["grounding_accuracy_best_head"]["baseline"] == results["grounding_baseline_accuracy"]
    for key, entry in results["baselines"].items():
        assert entry["value"] == results[key] and entry["beats"] == (results[key] > entry["baseline"]), key
    assert "| metric | value | baseline |" in card and "(majority class)" in card
    assert "| trained | " in card and "| epochs |" not in card


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
    id_correct = vgp_correct = typed = 0
    with torch.no_grad():
        for start in range(0, len(data.eval), 32):
            batch = collator([data.eval[i] for i in range(start, min(start + 32, len(data.eval)))])
            out = reloaded(**batch)
            id_correct += int((out.id_logits.argmax(-1) == batch["id_labels"]).sum())
            labelled = batch["vgp_labels"] != -100  # the type task: pairs that are not VGPs have no type
            vgp_correct += int((out.vgp_logits.argmax(-1) == batch["vgp_labels"])[labelled].sum())
            typed += int(labelled.sum())
    # the accuracies the training run measured in memory, reproduced by the reloaded weights
    assert id_correct / len(data.eval) == pytest.approx(results["image_description_accuracy"], abs=1e-12)
    assert typed == sum(results[f"vgp_type_count/{name}"] for name in TYPES)
    assert vgp_correct / typed == pytest.approx(results["vgp_accuracy"], abs=1e-12)

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


# the published VGP csvs of Samaran et al.'s code (identification layout with types) and of VGP-Typology
REAL_LAYOUTS = {
    "RA_Files": ("full_data_type_phrase_pair_train.csv", "full_data_type_phrase_pair_val.csv"),
    "VGP-Typology": ("train_data.csv", "val_data.csv"),
}


# rows kept of each csv: the leading rows on images of the Flickr30k Entities sample, whole and unedited
REAL_TRAIN_ROWS, REAL_EVAL_ROWS = 120, 200


def _leading_rows(path: Path, flickr: Path, out: Path, count: int) -> Path:
    """The header and the first `count` rows of a published csv whose image is in the Flickr30k Entities sample (the
    VGP-Typology train sample also has rows on other images), as bytes of the original lines."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines[1:] if (flickr / "Annotations" / f"{line.split(',', 1)[0]}.xml").is_file()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(lines[0] + "".join(kept[:count]), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def real_vgp_inputs(tmp_path_factory):
    """The real Flickr30k Entities sample, the VGP csvs, a tiny BERT, and region features for every image of the
    csvs written in LXMERT's TSV layout and converted with `hf-vlalign convert-features`, as a user would."""
    folder = tmp_path_factory.mktemp("real_vgp")
    flickr = real_sample("flickr30k_entities")
    csvs = {
        layout: [
            _leading_rows(real_sample("vgp", layout, name), flickr, folder / layout / name, rows)
            for name, rows in zip(names, (REAL_TRAIN_ROWS, REAL_EVAL_ROWS))
        ]
        for layout, names in REAL_LAYOUTS.items()
    }
    image_ids = sorted({row["image"] for paths in csvs.values() for path in paths for row in csv.DictReader(open(path))})
    tsv = write_lxmert_tsv_features(folder / "features.tsv", image_ids)
    assert main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(folder / "store")]) == 0
    return {"flickr": flickr, "csvs": csvs, "store": folder / "store", "text_model": save_tiny_bert(folder / "bert")}


@pytest.mark.parametrize("layout", sorted(REAL_LAYOUTS))
def test_paper_config_on_the_real_samples_trains_and_reports_each_type(real_vgp_inputs, tmp_path, monkeypatch, layout):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    example = load_script("finetune_vgp", ROOT / "examples" / "finetune_vgp.py")
    train_csv, eval_csv = real_vgp_inputs["csvs"][layout]
    output_dir = tmp_path / "out"
    results = example.main([
        "--config", str(ROOT / "examples" / "configs" / "samaran_vgp.yaml"),
        "--flickr30k_entities_dir", str(real_vgp_inputs["flickr"]), "--vgp_train_csv", str(train_csv),
        "--vgp_eval_csv", str(eval_csv), "--features", str(real_vgp_inputs["store"]),
        "--model_name_or_path", str(real_vgp_inputs["text_model"]), "--output_dir", str(output_dir),
        # tiny overrides of the paper's settings
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
        "--warmup_steps", "0", "--eval_strategy", "no", "--per_device_eval_batch_size", "128",
        "--image_use_examples", "16", "--use_cpu",
    ])  # fmt: skip
    assert results == json.loads((output_dir / "eval_results.json").read_text())
    assert results["supervision"] == "semi_direct" and results["vgp_task"] == "type"  # the config's
    # every published type occurs in the real eval csvs: each has pairs and an accuracy
    for name in TYPES:
        assert results[f"vgp_type_count/{name}"] > 0 and 0.0 <= results[f"vgp_type_accuracy/{name}"] <= 1.0
    counts = [results[f"vgp_type_count/{name}"] for name in TYPES]
    correct = sum(results[f"vgp_type_accuracy/{name}"] * count for name, count in zip(TYPES, counts))
    assert results["vgp_accuracy"] == pytest.approx(correct / sum(counts))
    # the replaced captions (1/3 of the rows) are not VGPs: no type, left out of the type loss and counted
    assert results["vgp_untyped_rows"]["train"] > 0 and results["vgp_untyped_rows"]["eval"] > 0
    config = json.loads((output_dir / "config.json").read_text())
    assert (config["vgp_task"], config["num_vgp_labels"], config["vgp_label_names"]) == ("type", 5, list(TYPES))
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 32)  # the tiny text model's
    args = json.loads((output_dir / "training_args.json").read_text())
    assert args["optim"] == "sgd" and args["learning_rate"] == pytest.approx(2.24e-3) and args["seed"] == 12345


def test_binary_vgp_task_on_the_real_samples(real_vgp_inputs, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    example = load_script("finetune_vgp", ROOT / "examples" / "finetune_vgp.py")
    train_csv, eval_csv = real_vgp_inputs["csvs"]["RA_Files"]
    results = example.main([
        "--flickr30k_entities_dir", str(real_vgp_inputs["flickr"]), "--vgp_train_csv", str(train_csv),
        "--vgp_eval_csv", str(eval_csv), "--features", str(real_vgp_inputs["store"]),
        "--model_name_or_path", str(real_vgp_inputs["text_model"]), "--output_dir", str(tmp_path / "out"),
        "--vgp_task", "binary", "--max_steps", "1", "--per_device_train_batch_size", "8", "--eval_strategy", "no",
        "--per_device_eval_batch_size", "128", "--image_use_examples", "16", "--use_cpu",
    ])  # fmt: skip
    assert results["vgp_task"] == "binary" and 0.0 <= results["vgp_accuracy"] <= 1.0
    # published features the region-feature extractor cannot reproduce: the saved processor has no encoder
    processor = AutoProcessor.from_pretrained(tmp_path / "out")
    assert processor.image_processor.encoder is None and processor(text="two dogs")["input_ids"].shape[0] == 1
    assert results["vgp_class_count/paraphrase"] + results["vgp_class_count/not_paraphrase"] > 0
    assert not any(key.startswith("vgp_type_") for key in results)
