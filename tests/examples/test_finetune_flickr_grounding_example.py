"""`examples/finetune_flickr_grounding.py`: phrase grounding Recall@k by hand, the real Flickr30k Entities annotations
through the example's data path, and end-to-end runs of both families (in the test process, as `accelerate launch
--cpu` runs them)."""

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_image_use_reported
from launch_helpers import run_example
from shared_samples import real_sample
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoTokenizer, TrainingArguments

from hf_vlalign import (
    AutoModelForPhraseGrounding,
    SingleStreamConfig,
    SingleStreamForPhraseGrounding,
    TwoStreamConfig,
    TwoStreamForPhraseGrounding,
)
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import PhraseGroundingCollator
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.evaluation.task_metrics import PHRASE_COLUMNS, grounded_phrases_only, recall_results
from hf_vlalign.metrics import phrase_grounding_recall
from hf_vlalign.metrics.phrase_grounding import rank_boxes, union_box
from hf_vlalign.synthetic import SyntheticSceneConfig
from hf_vlalign.trainers import PhraseGroundingTrainer, PhraseGroundingTrainingArguments
from hf_vlalign.utils.text_model import default_text_model_path

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_flickr_grounding.py"
TRAIN_IMAGES, EVAL_IMAGES, EVAL_BATCH = 12, 6, 16


def _load_example():
    spec = importlib.util.spec_from_file_location("finetune_flickr_grounding", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


example = _load_example()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


# ----------------------------------------------------------------------------------------------------------------
# Recall@k by hand
# ----------------------------------------------------------------------------------------------------------------


def test_rank_boxes_sorts_by_score_and_checks_its_inputs():
    boxes = [[0, 0, 1, 1], [0, 0, 2, 2], [0, 0, 3, 3]]
    assert rank_boxes([0.5, 2.0, 0.5], boxes).tolist() == [[0, 0, 2, 2], [0, 0, 1, 1], [0, 0, 3, 3]]  # ties: box order
    assert rank_boxes([0.5, 2.0, 0.1], boxes, k=1).tolist() == [[0, 0, 2, 2]]
    with pytest.raises(ValueError, match="`scores` must hold one score per box"):
        rank_boxes([1.0, 2.0], boxes)
    with pytest.raises(ValueError, match="NaN"):
        rank_boxes([1.0, float("nan"), 0.0], boxes)
    with pytest.raises(ValueError, match="`k` must be a positive integer"):
        rank_boxes([1.0, 2.0, 3.0], boxes, k=0)


def test_recall_results_on_a_hand_example(tmp_path):
    records = [
        {"image_id": "a", "image_size": (50, 50),
         "boxes": np.array([[0, 0, 10, 10], [20, 20, 40, 40], [0, 0, 40, 40]], np.float32),
         "features": np.zeros((3, 2), np.float32), "object_conf": np.array([0.9, 0.5, 0.1], np.float32)},
        {"image_id": "b", "image_size": (80, 80), "boxes": np.array([[0, 0, 20, 20], [50, 50, 60, 60]], np.float32),
         "features": np.zeros((2, 2), np.float32), "object_conf": np.array([0.2, 0.8], np.float32)},
    ]  # fmt: skip
    store = RegionFeatureStore.write(records, tmp_path / "store")
    rows = [
        {"image_id": "a",
         "sentence_phrase_boxes": [[[0, 0, 10, 10]], [[20, 20, 40, 40]], [[0, 0, 10, 10], [20, 20, 40, 40]]]},
        {"image_id": "b", "sentence_phrase_boxes": [[[55, 55, 60, 60]], [[0, 0, 20, 20]]]},
    ]
    scores = [
        [torch.tensor([0.1, 2.0, 1.0]),  # r1, r2, r0: the gold r0 is third
         torch.tensor([3.0, 2.0, 1.0]),  # r0, r1: the gold r1 is second
         torch.tensor([5.0, 0.0, 0.0])],  # r0 matches one gold box (ANY-BOX) but not their union r2 (MERGED-BOXES)
        [torch.tensor([1.0, 0.0]),  # no region reaches IoU 0.5 with the small gold box (r1: 25 / 100)
         torch.tensor([1.0, 0.0])],  # r0 is the gold box: the only hit at 1
    ]  # fmt: skip
    results = recall_results(rows, store, scores)
    assert results["recall@1_merged_boxes"] == pytest.approx(1 / 5)
    assert results["recall@5_merged_boxes"] == results["recall@10_merged_boxes"] == pytest.approx(4 / 5)
    assert results["upper_bound_merged_boxes"] == pytest.approx(4 / 5)
    # detection confidence: image a ranks r0 first (a hit for phrase 0 only), image b ranks r1 first (never a hit)
    assert results["baseline_confidence_recall@1_merged_boxes"] == pytest.approx(1 / 5)
    assert results["baseline_confidence_recall@5_merged_boxes"] == pytest.approx(4 / 5)
    assert results["num_phrases"] == 5


@pytest.mark.parametrize("family", ["single_stream", "two_stream"])
def test_new_modules_get_the_head_learning_rate(family, tmp_path):
    config_class = {"single_stream": SingleStreamConfig, "two_stream": TwoStreamConfig}[family]
    sizes = {"l_layers": 1, "r_layers": 1, "x_layers": 1} if family == "two_stream" else {"num_hidden_layers": 1}
    config = config_class(vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                          visual_feat_dim=8, **sizes)  # fmt: skip
    model = example.TASK_CLASSES[family](config)
    args = PhraseGroundingTrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-4, weight_decay=0.01, report_to="none", head_learning_rate=1e-3
    )
    optimizer = PhraseGroundingTrainer(model=model, args=args).create_optimizer()
    rate_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert len(rate_of) == len(list(model.parameters()))  # every parameter once
    for name, parameter in model.named_parameters():
        new = name.split(".")[0] == "grounding_head" or ".visual_embeddings." in name
        assert rate_of[id(parameter)] == (1e-3 if new else 1e-4), name
    assert {group["weight_decay"] for group in optimizer.param_groups} == {0.0, 0.01}  # Trainer's decay groups kept


def test_head_learning_rate_is_a_flag_of_the_example(tmp_path):
    *_, training_args = example.parse_args(["--output_dir", str(tmp_path), "--head_learning_rate", "0.002", "--use_cpu"])
    assert type(training_args) is PhraseGroundingTrainingArguments and training_args.head_learning_rate == 0.002
    assert example.parse_args(["--output_dir", str(tmp_path), "--use_cpu"])[-1].head_learning_rate == 1e-3  # its default
    assert json.loads(training_args.to_json_string())["head_learning_rate"] == 0.002
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as ended:
        patch.setenv("COLUMNS", "200")
        example.parse_args(["--help"])  # what `python finetune_flickr_grounding.py --help` prints
    assert ended.value.code == 0
    help_text = printed.getvalue()
    assert all(flag in help_text for flag in ("--head_learning_rate", "--label_names", "--distill_from", "--ewc_weight"))
    with pytest.raises(ValueError, match=r"`head_learning_rate` must be > 0, got 0.0"):
        PhraseGroundingTrainingArguments(output_dir=str(tmp_path), head_learning_rate=0.0)
    with pytest.raises(TypeError, match="head_learning_rate"):
        PhraseGroundingTrainer(model=torch.nn.Linear(1, 1), args=TrainingArguments(str(tmp_path)), head_learning_rate=1e-3)


# ----------------------------------------------------------------------------------------------------------------
# Real Flickr30k Entities annotations through the example's data path (no real features: regions from the boxes)
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_rows_and_store(tmp_path_factory):
    """Real val captions; each image's regions are its gold boxes, the union box of each multi-box entity, and a
    corner distractor, so every boxed phrase has a region at IoU >= 0.5 under MERGED-BOXES."""
    root = real_sample("flickr30k_entities")
    raw = build_dataset("flickr30k_entities", root, "val", max_images=20)
    regions = {}
    for row in raw:
        found = regions.setdefault(row["image_id"], {"size": row["image_size"], "boxes": [[0, 0, 3, 3]]})
        for gold in filter(None, row["sentence_phrase_boxes"]):
            candidates = [*gold, union_box(torch.tensor(gold)).squeeze(0).tolist()]
            found["boxes"] += [box for box in candidates if box not in found["boxes"]]
    records = [
        {"image_id": image_id, "image_size": tuple(image["size"]), "boxes": np.array(image["boxes"], np.float32),
         "features": np.random.default_rng(0).random((len(image["boxes"]), 4), dtype=np.float32)}
        for image_id, image in regions.items()
    ]  # fmt: skip
    store = RegionFeatureStore.write(records, tmp_path_factory.mktemp("real_flickr") / "store")
    return raw, build_dataset("flickr30k_entities", root, "val", max_images=20, region_features=store), store


def test_real_annotations_keep_their_boxed_phrases_in_order(real_rows_and_store, tokenizer):
    raw, rows, store = real_rows_and_store
    kept, counts = grounded_phrases_only(rows, tokenizer, max_text_length=48)
    boxed = [[i for i, gold in enumerate(row["sentence_phrase_boxes"]) if gold] for row in raw]
    assert counts["phrases"] == sum(len(row["sentence_phrase_spans"]) for row in raw)
    assert counts["phrases_without_box"] == counts["phrases"] - sum(map(len, boxed)) > 0  # notvisual, nobndbox
    assert counts["phrases_truncated"] == 0
    assert counts["rows_without_phrase"] == sum(not phrases for phrases in boxed)
    assert len(kept) == len(raw) - counts["rows_without_phrase"]
    originals = [(row, phrases) for row, phrases in zip(raw, boxed) if phrases]
    for row, (original, phrases) in zip(kept, originals):
        assert row["sentence"] == original["sentence"]
        for column in PHRASE_COLUMNS:
            if column in original:
                assert row[column] == [original[column][i] for i in phrases], column
        assert len(row["sentence_phrase_regions"]) == len(phrases)

    # the collator's phrases are the rows' phrases, in order: phrase p's target lies on its own gold boxes
    batch = PhraseGroundingCollator(tokenizer, store, max_text_length=48, return_probe_targets=True)(list(kept))
    assert batch["phrase_masks"].any(-1).sum(-1).tolist() == [len(row["sentence_phrase_spans"]) for row in kept]
    targets_on_gold = (batch["phrase_labels"] > 0) <= (batch["phrase_region_iou"] >= 0.5)
    assert bool(targets_on_gold.all())

    # the example's Recall@k on real boxes: each phrase scored by its own target, every phrase within reach
    regions = [len(store[row["image_id"]]["boxes"]) for row in kept]
    scores = [list(batch["phrase_labels"][i, : len(row["phrase_ids"]), : regions[i]]) for i, row in enumerate(kept)]
    results = recall_results(kept, store, scores)
    assert results["num_phrases"] == sum(map(len, boxed))
    assert results["upper_bound_merged_boxes"] == 1.0
    # the target is uniform over the regions matching *any* gold box: its best region always hits under ANY-BOX, but
    # the first of them is often one box of a multi-box phrase, which misses their union (MERGED-BOXES)
    boxes = [store[row["image_id"]]["boxes"] for row in kept]
    ranked = [rank_boxes(phrase, image_boxes) for image_boxes, phrases in zip(boxes, scores) for phrase in phrases]
    gold = [boxes for row in kept for boxes in row["sentence_phrase_boxes"]]
    assert phrase_grounding_recall(ranked, gold, ks=(1,), merge_gold_boxes=False)["recall@1"] == 1.0
    assert phrase_grounding_recall(ranked, gold, ks=(1,))["recall@1"] == results["recall@1_merged_boxes"]
    assert 0.5 < results["recall@1_merged_boxes"] < 1.0


def test_unknown_dataset_and_missing_paths_are_refused():
    with pytest.raises(ValueError, match="`--dataset` must be flickr30k_entities"):
        example.main(["--output_dir", "unused", "--dataset", "vqa_v2"])
    with pytest.raises(ValueError, match="needs `--data_dir`"):
        example.main(["--output_dir", "unused", "--dataset", "flickr30k_entities", "--data_dir", "somewhere"])


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
    return _launch(tmp_path_factory.mktemp("grounding_single"), "--max_steps", "4", "--eval_steps", "2")


@pytest.fixture(scope="module")
def two_stream_run(tmp_path_factory):
    return _launch(
        tmp_path_factory.mktemp("grounding_two"), "--model_family", "two_stream", "--supervision", "direct",
        "--l_layers", "1", "--r_layers", "1", "--x_layers", "1", "--max_steps", "2", "--eval_steps", "2",
    )  # fmt: skip


def _reloaded_recall(run: Path, monkeypatch) -> tuple[type, dict]:
    """Recall@k of the saved model, reloaded with its Auto class, on the synthetic eval captions (every phrase of which
    has a box), ranked and scored here independently of the example's code."""
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(run / "cache"))
    config = SyntheticSceneConfig(TRAIN_IMAGES, EVAL_IMAGES)
    store = synthetic_region_features(config=config)
    rows = build_dataset("synthetic_scenes", None, "val", task="captions", config=config, region_features=store)
    model = AutoModelForPhraseGrounding.from_pretrained(run / "model").eval()
    collator = PhraseGroundingCollator(AutoTokenizer.from_pretrained(run / "model"), store, max_text_length=48)
    ranked, gold = [], []
    with torch.no_grad():
        for start in range(0, len(rows), EVAL_BATCH):
            examples = [rows[i] for i in range(start, min(start + EVAL_BATCH, len(rows)))]
            logits = model(**collator(examples)).logits
            for i, row in enumerate(examples):
                boxes = store[row["image_id"]]["boxes"]
                for p, phrase_gold in enumerate(row["sentence_phrase_boxes"]):
                    ranked.append(rank_boxes(logits[i, p, : len(boxes)], boxes))
                    gold.append(phrase_gold)
    return type(model), phrase_grounding_recall(ranked, gold, ks=(1, 5, 10))


def _check_outputs(run: Path, family: str, supervision: str) -> dict:
    model_dir = run / "model"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "eval_results.json",
                 "grounding_scores.png", "training_args.json"):  # fmt: skip
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))  # safetensors only, nothing pickled
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, "accuracy")
    assert results["model_family"] == family and results["supervision"] == supervision
    for key in ("recall@1_merged_boxes", "recall@5_merged_boxes", "recall@10_merged_boxes", "recall@1_any_box",
                "upper_bound_merged_boxes", "baseline_confidence_recall@1_merged_boxes"):  # fmt: skip
        assert 0.0 <= results[key] <= 1.0, key
    assert results["recall@1_merged_boxes"] <= results["recall@5_merged_boxes"] <= results["recall@10_merged_boxes"]
    assert results["recall@10_merged_boxes"] <= results["upper_bound_merged_boxes"]
    # synthetic phrases have one gold box each: ANY-BOX (Trainer's evaluation) and MERGED-BOXES agree exactly
    assert results["recall@1_any_box"] == pytest.approx(results["recall@1_merged_boxes"], abs=1e-12)
    assert results["eval_loss"] > 0 and np.isfinite(results["eval_loss"])

    card = ModelCard.load(model_dir / "README.md")
    model_index = card.data.to_dict()["model-index"]
    reported = {metric["type"]: metric["value"] for metric in model_index[0]["results"][0]["metrics"]}
    assert reported["recall@1_merged_boxes"] == pytest.approx(results["recall@1_merged_boxes"])

    events = list((model_dir / "runs").rglob("events.out.tfevents.*"))
    assert events
    tags = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/loss_task", "eval/loss", "eval/recall@1_any_box"} <= tags
    return results


def test_single_stream_run_writes_its_results_and_the_reloaded_model_reproduces_them(single_stream_run, monkeypatch):
    results = _check_outputs(single_stream_run, "single_stream", "none")
    model_class, recall = _reloaded_recall(single_stream_run, monkeypatch)
    assert model_class is SingleStreamForPhraseGrounding
    assert recall["num_phrases"] == results["num_phrases"]  # no synthetic phrase was left out
    for k in (1, 5, 10):
        assert recall[f"recall@{k}"] == results[f"recall@{k}_merged_boxes"], k  # exactly


def test_two_stream_run_with_attention_supervision(two_stream_run, monkeypatch):
    results = _check_outputs(two_stream_run, "two_stream", "direct")
    assert results["eval_loss_attention_supervision"] > 0
    model_class, recall = _reloaded_recall(two_stream_run, monkeypatch)
    assert model_class is TwoStreamForPhraseGrounding
    assert recall["recall@1"] == results["recall@1_merged_boxes"]
