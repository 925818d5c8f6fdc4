"""`examples/finetune_nlvr2.py`: one run of the single-stream default (the synthetic scenes' NLVR2 statements; in
the test process, as `accelerate launch --cpu` runs it), one quick two-stream run, a run on NLVR2 files in the
published layout (real lines of NLVR2's dev.json) with a region-feature store of their pair images, and the argument
errors. The two-stream run also pushes, to a local fake of the Hub's HTTP side (`conftest.fake_hub`)."""

import importlib.util
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_image_use_reported
from launch_helpers import run_example
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoTokenizer

import hf_vlalign
from hf_vlalign import SingleStreamForVisualReasoning, TwoStreamForVisualReasoning
from hf_vlalign.data import RegionFeatureStore, build_dataset
from hf_vlalign.data.builders.nlvr2 import pair_image_ids
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import ImagePairCollator
from hf_vlalign.metrics import nlvr2_scores
from hf_vlalign.synthetic import SyntheticSceneConfig

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_nlvr2.py"
NLVR2_SAMPLE = ROOT.parent / "shared" / "data" / "nlvr2" / "dev.json"
TINY = ["--synthetic_train_images", "12", "--synthetic_eval_images", "6"]
CONFIG = SyntheticSceneConfig(num_train_images=12, num_val_images=6)
EVAL_BATCH = 64  # the example's per_device_eval_batch_size: the same padding gives the same logits


def _load_example():
    spec = importlib.util.spec_from_file_location("finetune_nlvr2", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


finetune_nlvr2 = _load_example()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("nlvr2_cache")


@pytest.fixture(scope="module")
def single_stream_run(tmp_path_factory, cache):
    """`examples/finetune_nlvr2.py` with the defaults and small sizes, in this process as `accelerate launch --cpu`
    runs it (`tests/conftest.py`'s `finetuned` is the real single-process launch)."""
    output_dir = tmp_path_factory.mktemp("nlvr2_single") / "model"
    arguments = [
        "--output_dir", str(output_dir), *TINY,
        "--max_steps", "4", "--per_device_train_batch_size", "8", "--eval_steps", "2", "--logging_steps", "1",
        "--save_steps", "4",
    ]  # fmt: skip
    _, stdout = run_example(finetune_nlvr2.main, arguments, cache)
    return output_dir, stdout


def _synthetic_rows(split: str):
    store = synthetic_region_features(config=CONFIG, task="nlvr2")
    return build_dataset("synthetic_scenes", None, split, task="nlvr2", config=CONFIG, region_features=store), store


def _predictions(model, collator, rows) -> list[int]:
    """0 / 1 per row, batched as the example's evaluation batches them."""
    predicted = []
    with torch.no_grad():
        for start in range(0, len(rows), EVAL_BATCH):
            batch = collator([rows[i] for i in range(start, min(start + EVAL_BATCH, len(rows)))])
            batch.pop("labels")
            predicted += (model(**batch).logits > 0).long().tolist()
    return predicted


def _reproduce(model_dir: Path, rows, store, expected_class: type) -> dict:
    """The NLVR2 scores of the model reloaded from `model_dir` through `AutoModelForVisualReasoning`."""
    model = hf_vlalign.AutoModelForVisualReasoning.from_pretrained(model_dir).eval()
    assert type(model) is expected_class
    collator = ImagePairCollator(AutoTokenizer.from_pretrained(model_dir), store, max_text_length=48)
    return nlvr2_scores(_predictions(model, collator, rows), rows["label"], rows["identifier"])


def _model_index_metrics(model_dir: Path) -> tuple[dict, dict]:
    card = ModelCard.load(model_dir / "README.md")
    assert card.data.library_name == "hf_vlalign"
    result = card.data.to_dict()["model-index"][0]["results"][0]
    return {metric["type"]: metric["value"] for metric in result["metrics"]}, result["dataset"]


def test_single_stream_run_writes_model_results_and_card(single_stream_run, cache, monkeypatch):
    model_dir, stdout = single_stream_run
    for name in ("model.safetensors", "config.json", "tokenizer.json", "eval_results.json", "README.md",
                 "training_args.json"):  # fmt: skip
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))  # safetensors only, nothing pickled
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, "accuracy")
    assert json.loads(stdout[stdout.index("{\n"):]) == results  # the results JSON is printed last
    assert (results["dataset"], results["model_family"]) == ("synthetic_scenes", "single_stream")
    for key in ("accuracy", "consistency", "majority_baseline_accuracy", "majority_baseline_consistency"):
        assert 0.0 <= results[key] <= 1.0, key
    assert math.isfinite(results["eval_loss"]) and results["eval_loss"] > 0.0
    assert json.loads((model_dir / "config.json").read_text())["attention_supervision"] == "none"

    # the majority baseline, recomputed from the rows
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    train, _ = _synthetic_rows("train")
    rows, _ = _synthetic_rows("val")
    majority = Counter(train["label"]).most_common(1)[0][0]
    assert results["majority_label"] == majority
    assert results["majority_baseline_accuracy"] == pytest.approx(np.mean([label == majority for label in rows["label"]]))
    assert results["eval_examples"] == len(rows)
    assert results["eval_sentences"] == nlvr2_scores(rows["label"], rows["label"], rows["identifier"])["num_sentences"]
    # a sentence is (split, set, sentence id): "dev-3-1-0" is the set 3's sentence 0 with its image pair 1
    pairs = Counter(tuple(identifier.split("-")[i] for i in (0, 1, 3)) for identifier in rows["identifier"])
    assert results["chance_consistency"] == pytest.approx(np.mean([0.5**count for count in pairs.values()]))

    metrics, dataset = _model_index_metrics(model_dir)
    assert metrics["accuracy"] == pytest.approx(results["accuracy"])
    assert metrics["consistency"] == pytest.approx(results["consistency"])
    assert "synthetic" in dataset["name"].lower()


def test_single_stream_run_logs_to_tensorboard_every_eval_steps(single_stream_run):
    model_dir, _ = single_stream_run
    event_files = list((model_dir / "runs").rglob("events.out.tfevents.*"))
    assert event_files
    tags = set()
    for path in event_files:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags.update(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/loss_task", "eval/accuracy", "eval/consistency", "eval/loss"} <= tags, tags
    state = json.loads((model_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_accuracy" in entry] == [2, 4]  # every --eval_steps


def test_reloaded_single_stream_model_reproduces_the_reported_scores(single_stream_run, cache, monkeypatch):
    model_dir, _ = single_stream_run
    results = json.loads((model_dir / "eval_results.json").read_text())
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    rows, store = _synthetic_rows("val")
    scores = _reproduce(model_dir, rows, store, SingleStreamForVisualReasoning)
    assert scores["accuracy"] == pytest.approx(results["accuracy"], abs=1e-12)
    assert scores["consistency"] == pytest.approx(results["consistency"], abs=1e-12)


def test_two_stream_run_pushes_everything_last(cache, tmp_path, monkeypatch, fake_hub):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    output_dir = tmp_path / "model"
    results = finetune_nlvr2.main([
        "--output_dir", str(output_dir), *TINY, "--model_family", "two_stream", "--l_layers", "1", "--r_layers", "1",
        "--x_layers", "1", "--max_steps", "2", "--eval_steps", "2", "--per_device_train_batch_size", "8",
        "--save_strategy", "no", "--push_to_hub", "--hub_model_id", "someone/nlvr2-two-stream",
    ])  # fmt: skip
    assert results == json.loads((output_dir / "eval_results.json").read_text())
    # the Hub's copy (only its HTTP side is faked) is the whole local folder: card, results, weights, tokenizer
    pushed = fake_hub / "someone" / "nlvr2-two-stream"
    local = {path.relative_to(output_dir) for path in output_dir.rglob("*") if path.is_file()}
    assert local == {path.relative_to(pushed) for path in pushed.rglob("*") if path.is_file()}
    assert {"README.md", "eval_results.json", "model.safetensors", "tokenizer.json"} <= {path.name for path in local}
    assert "someone/nlvr2-two-stream" in (pushed / "README.md").read_text()
    assert type(hf_vlalign.AutoModelForVisualReasoning.from_pretrained(pushed)) is TwoStreamForVisualReasoning
    assert (results["dataset"], results["model_family"]) == ("synthetic_scenes", "two_stream")
    assert 0.0 <= results["accuracy"] <= 1.0 and math.isfinite(results["eval_loss"])
    config = json.loads((output_dir / "config.json").read_text())
    assert (config["l_layers"], config["r_layers"], config["x_layers"]) == (1, 1, 1)
    assert list((output_dir / "runs").rglob("events.out.tfevents.*"))
    metrics, _ = _model_index_metrics(output_dir)
    assert metrics["accuracy"] == pytest.approx(results["accuracy"])

    rows, store = _synthetic_rows("val")
    scores = _reproduce(output_dir, rows, store, TwoStreamForVisualReasoning)
    assert scores["accuracy"] == pytest.approx(results["accuracy"], abs=1e-12)
    assert scores["consistency"] == pytest.approx(results["consistency"], abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# NLVR2 files in the published layout
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nlvr2_folder(tmp_path_factory):
    """`train.json` and `dev.json` made of whole lines of NLVR2's published dev.json (16 and 12 lines), and a store
    of 16-dimensional random region features (2-5 regions) for every pair image but the right image of the first
    dev example (whose pair the other sentences of its set share)."""
    if not NLVR2_SAMPLE.is_file():
        pytest.fail(f"the real NLVR2 sample {NLVR2_SAMPLE} is missing (the shared data folder beside the checkout).")
    lines = NLVR2_SAMPLE.read_text().splitlines(keepends=True)
    data_dir = tmp_path_factory.mktemp("nlvr2_data")
    (data_dir / "train.json").write_text("".join(lines[:16]))
    (data_dir / "dev.json").write_text("".join(lines[16:28]))
    image_ids = sorted({image for line in lines[:28] for image in pair_image_ids(json.loads(line)["identifier"])})
    missing = pair_image_ids(json.loads(lines[16])["identifier"])[1]
    rng = np.random.default_rng(0)

    def record(image_id: str) -> dict:
        count = int(rng.integers(2, 6))
        corners = rng.uniform(0, 300, size=(count, 2)).astype(np.float32)
        return {
            "image_id": image_id,
            "image_size": (640, 480),
            "boxes": np.concatenate([corners, corners + 100], axis=1),
            "features": rng.standard_normal((count, 16), dtype=np.float32),
        }

    store_dir = tmp_path_factory.mktemp("nlvr2_store") / "store"
    RegionFeatureStore.write((record(image_id) for image_id in image_ids if image_id != missing), store_dir)
    return data_dir, store_dir, missing


def test_published_nlvr2_files_are_read_and_a_missing_image_is_skipped_or_refused(nlvr2_folder, tmp_path):
    data_dir, store_dir, missing = nlvr2_folder
    real = ["--dataset", "nlvr2", "--data_dir", str(data_dir), "--features", str(store_dir)]
    with pytest.raises(ValueError, match=rf"image {missing!r} is not in the region-feature store"):
        finetune_nlvr2.main(["--output_dir", str(tmp_path / "refused"), *real])

    output_dir = tmp_path / "model"
    results = finetune_nlvr2.main([
        "--output_dir", str(output_dir), *real, "--on_missing_image", "skip", "--max_steps", "2", "--eval_steps", "2",
        "--per_device_train_batch_size", "8", "--save_strategy", "no",
    ])  # fmt: skip
    rows = build_dataset("nlvr2", data_dir, "dev", region_features=store_dir, on_missing_image="skip")
    dev_pairs = [pair_image_ids(json.loads(line)["identifier"]) for line in (data_dir / "dev.json").open()]
    assert results["eval_examples"] == len(rows) == sum(missing not in pair for pair in dev_pairs) < len(dev_pairs)
    assert (results["dataset"], results["model_family"]) == ("nlvr2", "single_stream")
    assert json.loads((output_dir / "config.json").read_text())["visual_feat_dim"] == 16
    metrics, dataset = _model_index_metrics(output_dir)
    assert dataset["name"] == "NLVR2" and metrics["accuracy"] == pytest.approx(results["accuracy"])
    scores = _reproduce(output_dir, rows, RegionFeatureStore.load(store_dir), SingleStreamForVisualReasoning)
    assert scores["accuracy"] == pytest.approx(results["accuracy"], abs=1e-12)
    assert scores["consistency"] == pytest.approx(results["consistency"], abs=1e-12)


@pytest.mark.parametrize("subset", ["balanced", "unbalanced"])
def test_eval_subset_reads_the_published_subset_file(nlvr2_folder, tmp_path, subset):
    data_dir, store_dir, _ = nlvr2_folder
    subset_dir = tmp_path / "nlvr2"
    (subset_dir / subset).mkdir(parents=True)  # nlvr2/data/{balanced,unbalanced}/<subset>_dev.json, as published
    lines = (data_dir / "dev.json").read_text().splitlines(keepends=True)
    (subset_dir / "train.json").write_text((data_dir / "train.json").read_text())
    (subset_dir / subset / f"{subset}_dev.json").write_text("".join(lines[8:12]))
    _, data_args, nlvr2_args, _ = finetune_nlvr2.parse_args([
        "--output_dir", "unused", "--dataset", "nlvr2", "--data_dir", str(subset_dir), "--features", str(store_dir),
        "--eval_subset", subset,
    ])  # fmt: skip
    data = finetune_nlvr2.load_pair_data(data_args, nlvr2_args)
    assert data.eval["identifier"] == [json.loads(line)["identifier"] for line in lines[8:12]]
    assert len(data.train) == 16 and data.dataset == "nlvr2"


# ----------------------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--supervision", "direct"], r"`--supervision` must be 'none' for NLVR2, got 'direct'"),
        (["--dataset", "gqa"], r"`--dataset` must be 'nlvr2' \(or absent: synthetic scenes\), got 'gqa'"),
        (["--data_dir", "nlvr2/data"], r"`--data_dir` reads the real NLVR2: pass `--dataset nlvr2`"),
        (["--dataset", "nlvr2", "--data_dir", "nlvr2/data"], r"`--features` is required with `--dataset nlvr2`"),
    ],
)
def test_bad_arguments_are_clear_errors(arguments, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        finetune_nlvr2.main(["--output_dir", str(tmp_path), *arguments])
