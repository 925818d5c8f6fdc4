"""`examples/finetune_refcoco.py`: the accuracy, baseline and upper bound by hand, the RefCOCO+ data path (the synthetic
RefCOCO+ files read as real data against a store keyed by COCO ids), and end-to-end runs of both families (in the
test process, as `accelerate launch --cpu` runs them)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_diagnostics_reported, assert_image_use_reported
from launch_helpers import run_example
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoTokenizer, EvalPrediction, TrainingArguments

from hf_vlalign import (
    AutoModelForReferringExpression,
    SingleStreamForReferringExpression,
    TwoStreamForReferringExpression,
)
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import ReferringExpressionCollator
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.evaluation.task_metrics import accuracy_from_region_iou, referring_results
from hf_vlalign.metrics import referring_expression_accuracy
from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from hf_vlalign.utils.text_model import default_text_model_path

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_refcoco.py"
TRAIN_IMAGES, EVAL_IMAGES, EVAL_BATCH = 12, 6, 16


def _load_example():
    spec = importlib.util.spec_from_file_location("finetune_refcoco", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


example = _load_example()


# ----------------------------------------------------------------------------------------------------------------
# Accuracy, baseline and upper bound by hand
# ----------------------------------------------------------------------------------------------------------------


def _hand_store(directory: Path, with_confidence: bool = True) -> RegionFeatureStore:
    records = [
        {"image_id": "a", "image_size": (50, 50), "boxes": np.array([[0, 0, 10, 10], [20, 20, 40, 40], [0, 0, 20, 10]], np.float32),
         "features": np.zeros((3, 2), np.float32), "object_conf": np.array([0.9, 0.5, 0.1], np.float32)},
        {"image_id": "b", "image_size": (80, 80), "boxes": np.array([[0, 0, 20, 20], [50, 50, 60, 60]], np.float32),
         "features": np.zeros((2, 2), np.float32), "object_conf": np.array([0.2, 0.8], np.float32)},
    ]  # fmt: skip
    if not with_confidence:
        for record in records:
            del record["object_conf"]
    return RegionFeatureStore.write(records, directory)


HAND_ROWS = [
    {"image_id": "a", "expression_phrase_boxes": [[[0, 0, 10, 10]]]},  # r0 (IoU 1) and r2 (IoU 100 / 200 = 0.5) hit
    {"image_id": "a", "expression_phrase_boxes": [[[20, 20, 40, 40]]]},  # r1 only
    {"image_id": "b", "expression_phrase_boxes": [[[55, 55, 60, 60]]]},  # none: r1 has IoU 25 / 100
    {"image_id": "b", "expression_phrase_boxes": [[[0, 0, 20, 20]]]},  # r0 only
]


def test_referring_results_on_a_hand_example(tmp_path):
    store = _hand_store(tmp_path / "store")
    # r2 at IoU exactly 0.5 counts; r0 misses row 1; row 2 is out of reach; r0 hits row 3
    results = referring_results(HAND_ROWS, store, [2, 0, 1, 0])
    assert results["accuracy"] == pytest.approx(2 / 4)
    assert results["num_expressions"] == 4
    assert results["upper_bound_accuracy"] == pytest.approx(3 / 4)  # the detector never covers row 2's box
    # most confident: r0 in image a (hits row 0 only), r1 in image b (never hits)
    assert results["baseline_confidence_accuracy"] == pytest.approx(1 / 4)
    # a uniformly drawn region hits 2 / 3, 1 / 3, 0 and 1 / 2 of the time
    assert results["chance_accuracy"] == pytest.approx((2 / 3 + 1 / 3 + 0 + 1 / 2) / 4)
    # the same accuracy from the library's metric on the chosen boxes
    chosen = [[0, 0, 20, 10], [0, 0, 10, 10], [50, 50, 60, 60], [0, 0, 20, 20]]
    gold = [row["expression_phrase_boxes"][0][0] for row in HAND_ROWS]
    assert referring_expression_accuracy(chosen, gold)["accuracy"] == results["accuracy"]


def test_referring_results_without_confidences(tmp_path, caplog):
    store = _hand_store(tmp_path / "store", with_confidence=False)
    results = referring_results(HAND_ROWS, store, [0, 1, 0, 0])
    assert results["accuracy"] == 1.0 - 1 / 4
    assert "baseline_confidence_accuracy" not in results
    assert "no detection confidences" in caplog.text


def test_accuracy_during_training_reads_the_top_region_iou():
    prediction = EvalPrediction(predictions=np.array([0.7, 0.5, 0.49, 0.0]), label_ids=np.array([0.9, 0.6, 0.8, 0.3]))
    assert accuracy_from_region_iou(prediction) == {"accuracy": 0.5, "upper_bound": 0.75}


# ----------------------------------------------------------------------------------------------------------------
# RefCOCO+ data path: the synthetic RefCOCO+ files read as `--dataset refcoco+`, with a store keyed by COCO ids
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refcoco_files(tmp_path_factory):
    """(refcoco+ folder, store keyed "COCO_train2014_<id:012d>", the synthetic store) of a few synthetic scenes."""
    root = tmp_path_factory.mktemp("refcoco_files")
    config = SyntheticSceneConfig(4, 2)
    paths = load_or_generate_synthetic_vgp(cache_dir=root / "cache", config=config)
    store = synthetic_region_features(root / "cache", config)
    records = [
        {**{key: image[key].numpy() for key in ("boxes", "features", "object_conf")},
         "image_id": f"COCO_train2014_{int(image['image_id']):012d}", "image_size": tuple(image["image_size"].tolist())}
        for image in store
    ]  # fmt: skip
    return paths.refcoco_dir, RegionFeatureStore.write(records, root / "coco_store"), store


def test_real_data_path_joins_the_store_images_and_collates(refcoco_files):
    refcoco_dir, coco_store, synthetic_store = refcoco_files
    data_args = example.DataArguments(dataset="refcoco+", data_dir=str(refcoco_dir), features=str(coco_store.directory))
    train, evaluation, store, source = example.load_splits(data_args, example.ReferringArguments())
    assert source.startswith("RefCOCO+") and store.image_ids == coco_store.image_ids
    plain = build_dataset("refcoco+", refcoco_dir, "val")
    assert len(evaluation) == len(plain) and len(train) == len(build_dataset("refcoco+", refcoco_dir, "train"))
    assert evaluation["image_id"] == plain["image_id"]  # COCO ids, joined to "COCO_train2014_<id:012d>" by row
    assert [coco_store.image_id_at(row) for row in evaluation["feature_row"]] == [
        f"COCO_train2014_{int(i):012d}" for i in plain["image_id"]
    ]
    assert evaluation["expression"] == plain["expression"]

    # the collator reads the regions through `feature_row`: every referred shape has a detected region at IoU >= 0.5
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    batch = ReferringExpressionCollator(tokenizer, store)(list(evaluation))
    assert bool((batch["target_region_iou"].max(-1).values >= 0.5).all())
    assert batch["labels"].tolist() == batch["target_region_iou"].argmax(-1).tolist()
    referred = batch["word_region_alignment"].sum(1).argmax(-1)  # the expression is aligned to the referred box
    assert bool((batch["target_region_iou"].gather(1, referred[:, None]) >= 0.5).all())
    results = referring_results(evaluation, store, batch["labels"].tolist())
    assert results["accuracy"] == results["upper_bound_accuracy"] == 1.0



def test_unknown_dataset_and_missing_paths_are_refused():
    with pytest.raises(ValueError, match="`--dataset` must be refcoco\\+"):
        example.main(["--output_dir", "unused", "--dataset", "flickr30k_entities"])
    with pytest.raises(ValueError, match="needs `--data_dir`"):
        example.main(["--output_dir", "unused", "--dataset", "refcoco+", "--data_dir", "somewhere"])


def test_test_splits_are_refcoco_splits_of_the_real_dataset():
    with pytest.raises(ValueError, match="`--test_splits` evaluates further RefCOCO\\+ splits: pass `--dataset refcoco\\+`"):
        example.main(["--output_dir", "unused", "--test_splits", "testA"])
    with pytest.raises(ValueError, match=r"`--test_splits` must be comma-separated RefCOCO\+ splits among .*got 'testA,testC'"):
        example.main(["--output_dir", "unused", "--dataset", "refcoco+", "--test_splits", "testA,testC"])
    data_args = example.DataArguments(dataset="refcoco+")
    assert example.parse_test_splits(data_args, example.ReferringArguments(test_splits="testA, testB")) == ["testA", "testB"]


def test_defaults_are_the_measured_ones():
    model_args, data_args, _, training_args = example.parse_args([])
    assert isinstance(training_args, TrainingArguments)
    assert (data_args.synthetic_train_images, data_args.synthetic_eval_images) == (320, 80)
    assert (training_args.learning_rate, training_args.per_device_train_batch_size) == (2e-4, 16)
    assert model_args.model_family == "single_stream" and model_args.supervision == "none"


# ----------------------------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------------------------


def _launch(output_dir: Path, *arguments: str) -> Path:
    """The example end to end, in this process as `accelerate launch --cpu` runs it (`tests/conftest.py`'s
    `finetuned` is the real single-process launch)."""
    command = [
        "--output_dir", str(output_dir / "model"),
        "--synthetic_train_images", str(TRAIN_IMAGES), "--synthetic_eval_images", str(EVAL_IMAGES),
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", str(EVAL_BATCH), "--logging_steps", "1",
        *arguments,
    ]  # fmt: skip
    _, stdout = run_example(example.main, command, output_dir / "cache")
    printed = json.loads(stdout[stdout.index("{\n") :])
    assert printed == json.loads((output_dir / "model" / "eval_results.json").read_text())
    return output_dir


@pytest.fixture(scope="module")
def single_stream_run(tmp_path_factory):
    return _launch(
        tmp_path_factory.mktemp("refcoco_single"), "--supervision", "direct", "--max_steps", "4", "--eval_steps", "2"
    )


@pytest.fixture(scope="module")
def two_stream_run(tmp_path_factory):
    return _launch(
        tmp_path_factory.mktemp("refcoco_two"), "--model_family", "two_stream",
        "--l_layers", "1", "--r_layers", "1", "--x_layers", "1", "--max_steps", "2", "--eval_steps", "2",
    )  # fmt: skip


def _reloaded_accuracy(run: Path, monkeypatch) -> tuple[type, dict]:
    """Accuracy of the saved model, reloaded with its Auto class, on the synthetic evaluation expressions: its argmax
    region's pixel box against the referred box, computed here independently of the example's code."""
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(run / "cache"))
    config = SyntheticSceneConfig(TRAIN_IMAGES, EVAL_IMAGES)
    store = synthetic_region_features(config=config)
    rows = build_dataset("synthetic_scenes", None, "val", task="refcoco", config=config, region_features=store)
    model = AutoModelForReferringExpression.from_pretrained(run / "model").eval()
    collator = ReferringExpressionCollator(AutoTokenizer.from_pretrained(run / "model"), store, max_text_length=48)
    predicted, gold = [], []
    with torch.no_grad():
        for start in range(0, len(rows), EVAL_BATCH):
            examples = [rows[i] for i in range(start, min(start + EVAL_BATCH, len(rows)))]
            logits = model(**collator(examples)).logits
            for row, region in zip(examples, logits.argmax(-1).tolist()):
                predicted.append(store[row["image_id"]]["boxes"][region].tolist())
                gold.append(row["expression_phrase_boxes"][0][0])
    return type(model), referring_expression_accuracy(predicted, gold)


def _check_outputs(run: Path, family: str, supervision: str) -> dict:
    model_dir = run / "model"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "eval_results.json",
                 "training_args.json"):  # fmt: skip
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))  # safetensors only, nothing pickled
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, "accuracy")
    assert_diagnostics_reported(results, {"refcoco": "accuracy"}, supervised=supervision != "none")
    assert results["model_family"] == family and results["supervision"] == supervision
    for key in ("accuracy", "upper_bound_accuracy", "baseline_confidence_accuracy", "chance_accuracy",
                "accuracy_from_collator_iou"):  # fmt: skip
        assert 0.0 <= results[key] <= 1.0, key
    assert results["accuracy"] <= results["upper_bound_accuracy"]
    assert results["upper_bound_accuracy"] == 1.0  # the synthetic detector finds every shape
    # Trainer's evaluation (float32 IoUs of the collator) and the ordered pass (the library's metric) agree
    assert results["accuracy_from_collator_iou"] == pytest.approx(results["accuracy"], abs=1e-12)
    assert results["eval_loss"] > 0 and np.isfinite(results["eval_loss"])

    card = ModelCard.load(model_dir / "README.md")
    model_index = card.data.to_dict()["model-index"]
    assert model_index[0]["results"][0]["task"]["type"] == "referring-expression-comprehension"
    reported = {metric["type"]: metric["value"] for metric in model_index[0]["results"][0]["metrics"]}
    assert reported["accuracy"] == pytest.approx(results["accuracy"])
    # baselines and the detector's upper bound describe the data, not the model: results table only
    assert not {"baseline_confidence_accuracy", "upper_bound_accuracy", "chance_accuracy", "eval_loss"} & set(reported)
    for key in ("baseline_confidence_accuracy", "upper_bound_accuracy"):
        assert key in card.text, key
    assert "AutoModelForReferringExpression" in card.text

    events = list((model_dir / "runs").rglob("events.out.tfevents.*"))
    assert events
    tags = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/loss_task", "eval/loss", "eval/accuracy", "eval/upper_bound"} <= tags
    if supervision != "none":
        assert {"train/loss_attention_supervision", "eval/loss_attention_supervision"} <= tags
    return results


def test_single_stream_run_with_attention_supervision(single_stream_run, monkeypatch):
    results = _check_outputs(single_stream_run, "single_stream", "direct")
    assert results["eval_loss_attention_supervision"] > 0
    model_class, reloaded = _reloaded_accuracy(single_stream_run, monkeypatch)
    assert model_class is SingleStreamForReferringExpression
    assert reloaded["num_expressions"] == results["num_expressions"]
    assert reloaded["accuracy"] == results["accuracy"]  # exactly


def test_two_stream_run(two_stream_run, monkeypatch):
    results = _check_outputs(two_stream_run, "two_stream", "none")
    assert "eval_loss_attention_supervision" not in results
    model_class, reloaded = _reloaded_accuracy(two_stream_run, monkeypatch)
    assert model_class is TwoStreamForReferringExpression
    assert reloaded["accuracy"] == results["accuracy"]  # exactly
