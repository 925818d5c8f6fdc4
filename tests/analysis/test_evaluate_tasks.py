"""`hf-vlalign evaluate --task vqa | gqa | nlvr2 | refcoco | flickr_grounding` on tiny saved task models over the synthetic
scenes (written in the GQA, NLVR2, RefCOCO+ and Flickr30k Entities layouts): the metrics the examples report, checked
against the own-image accuracy that `image_use_gap` computes from the collators' targets (another code path)."""

import json

import pytest
import torch
from analysis_models import SCENES, SYNTHETIC_FLAGS, save_with_tokenizer

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForQuestionAnswering,
    SingleStreamForReferringExpression,
    TwoStreamConfig,
    TwoStreamForPhraseGrounding,
    TwoStreamForVisualReasoning,
)
from hf_vlalign.cli import main
from hf_vlalign.data import (
    ImagePairCollator,
    PhraseGroundingCollator,
    QuestionAnsweringCollator,
    ReferringExpressionCollator,
    build_dataset,
)
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.evaluation.image_use import image_use_gap
from hf_vlalign.evaluation.tasks import evaluate_task, load_model
from hf_vlalign.synthetic import load_or_generate_synthetic_vgp
from hf_vlalign.synthetic.questions import ANSWER_VOCAB_FILE

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")


def single_stream(model_class, tokenizer, seed=0, **fields):
    torch.manual_seed(seed)
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=80, visual_feat_dim=SCENES.feature_dim, **fields,
    )  # fmt: skip
    return model_class(config)


def two_stream(model_class, tokenizer, seed=0):
    torch.manual_seed(seed)
    config = TwoStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64, l_layers=1,
        r_layers=1, x_layers=2, visual_feat_dim=SCENES.feature_dim,
    )  # fmt: skip
    return model_class(config)


def evaluate_cli(model_dir, task: str, capsys) -> dict:
    assert main(["evaluate", str(model_dir), "--task", task, "--batch_size", "8", *SYNTHETIC_FLAGS]) == 0
    return json.loads(capsys.readouterr().out)


def rows_of_two_images(rows) -> int:
    """The count of first rows that show two images (the own-image accuracy needs two to swap)."""
    keys = [tuple(row[c] for c in ("image_id", "left_image_id") if c in row) for row in rows]
    return next(index for index, key in enumerate(keys) if key != keys[0]) + 1


def own_image_accuracy(model_dir, rows, collator) -> float:
    return image_use_gap(load_model(model_dir), rows, collator, batch_size=8, progress=False)["own_image_accuracy"]


@pytest.fixture(scope="module")
def answer_vocab():
    return json.loads((load_or_generate_synthetic_vgp(config=SCENES).gqa_dir / ANSWER_VOCAB_FILE).read_text())


def test_vqa_and_gqa_read_the_folders_answer_vocabulary(answer_vocab, tokenizer, tmp_path, capsys):
    model = single_stream(SingleStreamForQuestionAnswering, tokenizer, num_qa_labels=len(answer_vocab))
    model_dir = save_with_tokenizer(model, tokenizer, tmp_path / "qa")
    # the answer ids of the head, as examples/finetune_vqa.py saves them (here: reversed, unlike the scenes' file)
    reversed_vocab = {answer: len(answer_vocab) - 1 - index for answer, index in answer_vocab.items()}
    (model_dir / "answer_vocab.json").write_text(json.dumps(reversed_vocab))
    results = evaluate_cli(model_dir, "vqa", capsys)
    assert results["model"] == "SingleStreamForQuestionAnswering" and results["num_answers"] == len(answer_vocab)
    assert {"accuracy", "gqa_binary", "gqa_open", "eval_loss"} <= set(results)
    store = synthetic_region_features(config=SCENES)
    rows = build_dataset("synthetic_scenes", None, "val", task="questions", config=SCENES, region_features=store)
    rows = rows.map(lambda row: {"label": reversed_vocab[row["answer"]]})  # the labels in the folder's answer ids
    collator = QuestionAnsweringCollator(tokenizer, store, num_answers=len(answer_vocab))
    assert results["num_questions"] == len(rows)
    assert results["accuracy"] == pytest.approx(own_image_accuracy(model_dir, rows, collator), abs=1e-9)
    # the baseline: the most frequent answer of the scenes' training split
    train_answers = build_dataset("synthetic_scenes", None, "train", task="questions", config=SCENES)["answer"]
    majority = max(sorted(set(train_answers)), key=train_answers.count)
    expected = sum(answer == majority for answer in rows["answer"]) / len(rows)
    assert results["baselines"]["accuracy"]["baseline"] == pytest.approx(expected)
    assert {"accuracy", "gqa_accuracy", "gqa_binary", "gqa_open"} <= set(results["baselines"])
    assert evaluate_cli(model_dir, "gqa", capsys) == {**results, "task": "gqa"}
    count = rows_of_two_images(rows)  # the first questions
    first = evaluate_task(model_dir, "vqa", synthetic=SCENES, batch_size=8, progress=False, max_examples=count)
    assert first["num_examples"] == first["num_questions"] == count < len(rows)
    assert first["accuracy"] == pytest.approx(own_image_accuracy(model_dir, rows.select(range(count)), collator), abs=1e-9)

    (model_dir / "answer_vocab.json").write_text(json.dumps({"yes": 0, "no": 1}))
    with pytest.raises(ValueError, match=rf"answers over {len(answer_vocab)} answers, but the answer vocabulary"):
        evaluate_task(model_dir, "vqa", synthetic=SCENES, progress=False)


def test_nlvr2_accuracy_and_consistency(tokenizer, tmp_path, capsys):
    model_dir = save_with_tokenizer(two_stream(TwoStreamForVisualReasoning, tokenizer), tokenizer, tmp_path / "nlvr2")
    assert main(["evaluate", str(model_dir), "--task", "nlvr2", "--batch_size", "8", *SYNTHETIC_FLAGS]) == 0
    printed = capsys.readouterr()
    results = json.loads(printed.out)
    store = synthetic_region_features(config=SCENES, task="nlvr2")
    rows = build_dataset("synthetic_scenes", None, "val", task="nlvr2", config=SCENES, region_features=store)
    assert results["num_examples"] == len(rows) and 0.0 <= results["consistency"] <= results["accuracy"]
    # the baseline: the scenes' training split's most frequent truth value, on the evaluation rows
    train_labels = build_dataset("synthetic_scenes", None, "train", task="nlvr2", config=SCENES)["label"]
    majority = max(sorted(set(train_labels)), key=train_labels.count)
    expected = sum(label == majority for label in rows["label"]) / len(rows)
    entry = results["baselines"]["accuracy"]
    assert entry == {"value": results["accuracy"], "baseline": pytest.approx(expected), "kind": "majority_class",
                     "beats": results["accuracy"] > expected}
    assert results["baselines"]["consistency"]["kind"] == "majority_class"
    # stderr: the same comparison as a table for the reader, flagged where the accuracy does not beat its baseline
    row = next(line for line in printed.err.splitlines() if line.startswith("| accuracy |"))
    assert row.startswith(f"| accuracy | {results['accuracy']:.3f} | {expected:.3f} | majority_class |")
    assert row.endswith("| ⚠ does not beat its baseline |") != entry["beats"]
    accuracy = own_image_accuracy(model_dir, rows, ImagePairCollator(tokenizer, store))
    assert results["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    count = rows_of_two_images(rows)  # the first statements
    first = evaluate_task(model_dir, "nlvr2", synthetic=SCENES, batch_size=8, progress=False, max_examples=count)
    accuracy = own_image_accuracy(model_dir, rows.select(range(count)), ImagePairCollator(tokenizer, store))
    assert first["num_examples"] == count < len(rows) and first["accuracy"] == pytest.approx(accuracy, abs=1e-9)


def test_refcoco_accuracy_with_its_baselines(tokenizer, tmp_path, capsys):
    model = single_stream(SingleStreamForReferringExpression, tokenizer, seed=1)
    model_dir = save_with_tokenizer(model, tokenizer, tmp_path / "refcoco")
    results = evaluate_cli(model_dir, "refcoco", capsys)
    store = synthetic_region_features(config=SCENES)
    rows = build_dataset("synthetic_scenes", None, "val", task="refcoco", config=SCENES, region_features=store)
    assert results["num_expressions"] == len(rows)
    assert 0.0 <= results["chance_accuracy"] <= results["upper_bound_accuracy"] <= 1.0
    assert 0.0 <= results["baseline_confidence_accuracy"] <= results["upper_bound_accuracy"]
    # the text-blind baseline: each image's largest region, at IoU >= 0.5 with the referred box
    hits = []
    for row in rows:
        boxes = store[row["image_id"]]["boxes"].double()
        largest = boxes[((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).argmax()]
        gold = torch.tensor(row["expression_phrase_boxes"][0][0], dtype=torch.float64)
        low, high = torch.maximum(largest[:2], gold[:2]), torch.minimum(largest[2:], gold[2:])
        inter = (high - low).clamp(min=0).prod()
        union = (largest[2:] - largest[:2]).prod() + (gold[2:] - gold[:2]).prod() - inter
        hits.append(bool(inter / union >= 0.5))
    assert results["largest_region_accuracy"] == pytest.approx(sum(hits) / len(hits))
    assert results["baselines"] == {"accuracy": {
        "value": results["accuracy"], "baseline": results["largest_region_accuracy"], "kind": "largest_region",
        "beats": results["accuracy"] > results["largest_region_accuracy"],
    }}  # fmt: skip
    accuracy = own_image_accuracy(model_dir, rows, ReferringExpressionCollator(tokenizer, store, iou_threshold=0.5))
    assert results["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    count = rows_of_two_images(rows)  # the first expressions
    first = evaluate_task(model_dir, "refcoco", synthetic=SCENES, batch_size=8, progress=False, max_examples=count)
    collator = ReferringExpressionCollator(tokenizer, store, iou_threshold=0.5)
    accuracy = own_image_accuracy(model_dir, rows.select(range(count)), collator)
    assert first["num_examples"] == first["num_expressions"] == count < len(rows)
    assert first["accuracy"] == pytest.approx(accuracy, abs=1e-9)


def test_flickr_grounding_recall_with_its_baselines(tokenizer, tmp_path, capsys):
    model_dir = save_with_tokenizer(two_stream(TwoStreamForPhraseGrounding, tokenizer), tokenizer, tmp_path / "flickr")
    results = evaluate_cli(model_dir, "flickr_grounding", capsys)
    store = synthetic_region_features(config=SCENES)
    rows = build_dataset("synthetic_scenes", None, "val", task="captions", config=SCENES, region_features=store)
    grounded = [boxes for row in rows for boxes in row["sentence_phrase_boxes"] if boxes]
    assert results["num_phrases"] == len(grounded) and results["phrases_without_box_left_out"] == 0
    recall = [results[f"recall@{k}_merged_boxes"] for k in (1, 5, 10)]
    assert recall == sorted(recall) and recall[-1] <= results["upper_bound_merged_boxes"] <= 1.0
    for k in (1, 5, 10):
        baseline = results[f"largest_region_recall@{k}_merged_boxes"]
        assert results["baselines"][f"recall@{k}_merged_boxes"] == {
            "value": results[f"recall@{k}_merged_boxes"], "baseline": baseline, "kind": "largest_region",
            "beats": results[f"recall@{k}_merged_boxes"] > baseline,
        }  # fmt: skip
    accuracy = own_image_accuracy(model_dir, rows, PhraseGroundingCollator(tokenizer, store, iou_threshold=0.5))
    assert results["recall@1_merged_boxes"] == pytest.approx(accuracy, abs=1e-9)
    first = evaluate_task(model_dir, "flickr_grounding", synthetic=SCENES, batch_size=8, progress=False, max_examples=2)  # 2 captions
    assert first["num_examples"] == first["eval_captions"] == 2 and first["num_phrases"] < results["num_phrases"]
