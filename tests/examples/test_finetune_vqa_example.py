"""`examples/finetune_vqa.py`: one run of the single-stream default (GQA-format synthetic questions, direct attention
supervision; in the test process, as `accelerate launch --cpu` runs it), one quick two-stream run in bf16 on VQA v2
files written from the synthetic scenes, and the argument errors."""

import dataclasses
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_diagnostics_reported, assert_image_use_reported
from launch_helpers import run_example
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForVisualQuestionAnswering, AutoTokenizer

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import SingleStreamForQuestionAnswering, TwoStreamConfig, TwoStreamForQuestionAnswering
from hf_vlalign.data import build_dataset
from hf_vlalign.data.builders import vqa_v2
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import QuestionAnsweringCollator
from hf_vlalign.metrics import gqa_scores, vqa_accuracy
from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "finetune_vqa.py"
TINY = ["--synthetic_train_images", "12", "--synthetic_eval_images", "6"]
CONFIG = SyntheticSceneConfig(num_train_images=12, num_val_images=6)
EVAL_BATCH = 64  # the example's per_device_eval_batch_size: the same padding gives the same logits


def _load_example():
    spec = importlib.util.spec_from_file_location("finetune_vqa", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


finetune_vqa = _load_example()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("vqa_cache")


@pytest.fixture(scope="module")
def single_stream_run(tmp_path_factory, cache):
    """`examples/finetune_vqa.py` with the defaults, small sizes and direct supervision, in this process as
    `accelerate launch --cpu` runs it (`tests/conftest.py`'s `finetuned` is the real single-process launch)."""
    output_dir = tmp_path_factory.mktemp("vqa_single") / "model"
    arguments = [
        "--output_dir", str(output_dir), *TINY,
        "--max_steps", "4", "--per_device_train_batch_size", "8", "--eval_steps", "2", "--logging_steps", "1",
        "--save_steps", "4", "--supervision", "direct",
    ]  # fmt: skip
    _, stdout = run_example(finetune_vqa.main, arguments, cache)
    return output_dir, stdout


def test_single_stream_run_writes_model_vocabulary_results_and_card(single_stream_run):
    model_dir, stdout = single_stream_run
    for name in ("model.safetensors", "config.json", "tokenizer.json", "answer_vocab.json", "eval_results.json",
                 "README.md", "training_args.json"):  # fmt: skip
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))  # safetensors only, nothing pickled
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, "accuracy")
    assert_diagnostics_reported(results, {"vqa": "accuracy"}, supervised=True)  # direct supervision
    assert json.loads(stdout[stdout.index("{\n") :]) == results  # the results JSON is printed last
    run = (results["dataset"], results["model_family"], results["supervision"])
    assert run == ("synthetic_scenes", "single_stream", "direct")
    for key in ("accuracy", "gqa_binary", "gqa_open", "majority_baseline_accuracy"):
        assert 0.0 <= results[key] <= 1.0, key
    for key in ("eval_loss", "loss_task", "loss_attention_supervision"):
        assert math.isfinite(results[key]) and results[key] > 0.0, key
    vocab = json.loads((model_dir / "answer_vocab.json").read_text())
    assert vocab == vqa_v2.read_answer_vocab(vocab)  # an ans2label file that --answer_vocab reads back
    config = json.loads((model_dir / "config.json").read_text())
    assert config["num_qa_labels"] == len(vocab) == results["num_answers"]
    assert config["attention_supervision"] == "direct"
    assert results["majority_answer"] in vocab

    card = ModelCard.load(model_dir / "README.md")
    assert card.data.library_name == "hf_vlalign"
    metrics = {m["type"]: m["value"] for m in card.data.to_dict()["model-index"][0]["results"][0]["metrics"]}
    assert metrics["accuracy"] == pytest.approx(results["accuracy"])
    assert "answer_vocab.json" in card.text

    # every accuracy beside its baseline: the most frequent training answer, scored like the model
    baselines = results["baselines"]
    assert set(baselines) == {"accuracy", "gqa_accuracy", "gqa_binary", "gqa_open"}
    entry = baselines["accuracy"]
    assert entry["baseline"] == pytest.approx(results["majority_baseline_accuracy"])
    assert entry == {**entry, "value": results["accuracy"], "kind": "majority_class"}
    assert entry["beats"] == (results["accuracy"] > entry["baseline"])
    row = f"| accuracy | {results['accuracy']:.4g} | {entry['baseline']:.4g} (majority class)"
    assert row + (" |" if entry["beats"] else " ⚠ does not beat the majority class baseline |") in card.text
    assert ("do not beat their baseline" in card.text) == (not all(e["beats"] for e in baselines.values()))
    assert "majority" not in str(metrics)  # baselines stay out of the model-index
    # the steps trained, read from the trainer's state: 4 steps of batch 8, less than an epoch of the questions
    state = json.loads((model_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["epoch"] < 1
    assert f"| trained | 4 optimizer steps ({state['epoch']:.2g} of an epoch; planned: 4 steps (--max_steps)) |" in card.text


def test_single_stream_run_logs_every_loss_component_to_tensorboard(single_stream_run):
    model_dir, _ = single_stream_run
    event_files = list((model_dir / "runs").rglob("events.out.tfevents.*"))
    assert event_files
    tags = set()
    for path in event_files:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags.update(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/loss_task", "train/loss_attention_supervision", "eval/accuracy", "eval/loss_attention_supervision"} <= tags, tags
    state = json.loads((model_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_accuracy" in entry] == [2, 4]  # every --eval_steps


def test_reloaded_single_stream_model_reproduces_the_reported_accuracy(single_stream_run, cache, monkeypatch):
    model_dir, _ = single_stream_run
    results = json.loads((model_dir / "eval_results.json").read_text())
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    store = synthetic_region_features(config=CONFIG)
    rows = build_dataset("synthetic_scenes", None, "val", task="questions", config=CONFIG, region_features=store)
    model = AutoModelForVisualQuestionAnswering.from_pretrained(model_dir).eval()
    assert type(model) is SingleStreamForQuestionAnswering
    collator = QuestionAnsweringCollator(
        tokenizer=AutoTokenizer.from_pretrained(model_dir), region_features=store, num_answers=results["num_answers"]
    )
    predicted = _predictions(model, collator, rows)
    accuracy = sum(p == label for p, label in zip(predicted, rows["label"])) / len(rows)
    assert accuracy == pytest.approx(results["accuracy"], abs=1e-12)

    answers = sorted(json.loads((model_dir / "answer_vocab.json").read_text()).items(), key=lambda item: item[1])
    questions_file = load_or_generate_synthetic_vgp(config=CONFIG).gqa_dir / "val_balanced_questions.json"
    questions = json.loads(questions_file.read_text())
    official = gqa_scores({qid: answers[p][0] for qid, p in zip(rows["question_id"], predicted)}, questions)
    assert official["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert official["binary"] == pytest.approx(results["gqa_binary"], abs=1e-12)


def _predictions(model, collator, rows, autocast: bool = False) -> list[int]:
    predicted = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for start in range(0, len(rows), EVAL_BATCH):
            batch = collator([rows[i] for i in range(start, min(start + EVAL_BATCH, len(rows)))])
            batch.pop("labels")
            predicted += model(**batch).logits.argmax(-1).tolist()
    return predicted


# ----------------------------------------------------------------------------------------------------------------
# Two-stream, VQA v2 files, bf16
# ----------------------------------------------------------------------------------------------------------------


def write_vqa_files(gqa_dir: Path, data_dir: Path) -> None:
    """The synthetic GQA questions as VQA v2 question and annotation files (official names), each with 10 human
    answers: 7 times the gold answer and 3 times another one (the opposite of yes / no, else "other"), so that
    both answers have the soft score min(count / 3, 1) = 1, and the official VQA accuracy 1.0 and 0.9."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        records = json.loads((gqa_dir / f"{split}_balanced_questions.json").read_text())
        questions, annotations = [], []
        for question_id, record in enumerate(records.values(), 1):
            image_id, answer = int(record["imageId"]), record["answer"]
            other = {"yes": "no", "no": "yes"}.get(answer, "other")
            answers = [answer] * 7 + [other] * 3
            questions.append({"image_id": image_id, "question": record["question"], "question_id": question_id})
            annotations.append({
                "question_id": question_id, "image_id": image_id,
                "question_type": " ".join(record["question"].lower().split()[:2]),
                "answer_type": "yes/no" if answer in ("yes", "no") else "other",
                "multiple_choice_answer": answer,
                "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i} for i, a in enumerate(answers)],
            })  # fmt: skip
        (data_dir / vqa_v2.QUESTIONS_FILE[split]).write_text(json.dumps({"questions": questions}))
        (data_dir / vqa_v2.ANNOTATIONS_FILE[split]).write_text(json.dumps({"annotations": annotations}))


@pytest.fixture(scope="module")
def vqa_files(tmp_path_factory, cache):
    previous = os.environ.get("HF_VLALIGN_CACHE")
    os.environ["HF_VLALIGN_CACHE"] = str(cache)
    try:
        paths = load_or_generate_synthetic_vgp(config=CONFIG)
        store = synthetic_region_features(config=CONFIG)
    finally:
        if previous is None:
            del os.environ["HF_VLALIGN_CACHE"]
        else:
            os.environ["HF_VLALIGN_CACHE"] = previous
    data_dir = tmp_path_factory.mktemp("vqa_v2")
    write_vqa_files(paths.gqa_dir, data_dir)
    return data_dir, store


def _vqa_arguments(vqa_files) -> list[str]:
    data_dir, store = vqa_files
    # no --answer_vocab: built from the train annotations; every answer of >= 1 question is kept
    return ["--dataset", "vqa_v2", "--data_dir", str(data_dir), "--features", str(store.directory),
            "--min_answer_count", "1", "--image_id_template", "{id}"]  # fmt: skip


def test_two_stream_vqa_v2_run_in_bf16(vqa_files, tmp_path):
    output_dir = tmp_path / "model"
    arguments = [
        "--output_dir", str(output_dir), *_vqa_arguments(vqa_files), "--model_family", "two_stream",
        "--l_layers", "1", "--r_layers", "1", "--x_layers", "1", "--max_steps", "2", "--eval_subset_size", "3",
        "--per_device_train_batch_size", "8", "--mixed_precision", "bf16", "--save_strategy", "no",
    ]  # fmt: skip  (the evaluations during training read 3 rows; the reported metrics, all of them: checked below)
    results = finetune_vqa.main(arguments)
    assert results == json.loads((output_dir / "eval_results.json").read_text())
    assert (results["dataset"], results["model_family"], results["supervision"]) == ("vqa_v2", "two_stream", "none")
    for key in ("accuracy", "vqa_accuracy", "vqa_accuracy_yes_no", "vqa_accuracy_other", "majority_baseline_accuracy"):
        assert 0.0 <= results[key] <= 1.0, key
    assert math.isfinite(results["eval_loss"]) and "loss_attention_supervision" not in results
    training_args = json.loads((output_dir / "training_args.json").read_text())
    assert training_args["bf16"] is True
    assert list((output_dir / "runs").rglob("events.out.tfevents.*"))
    assert ModelCard.load(output_dir / "README.md").data.to_dict()["model-index"]

    # the reloaded two-stream model, under the same bf16 autocast, gives the reported official VQA accuracy
    data_dir, store = vqa_files
    vocab = json.loads((output_dir / "answer_vocab.json").read_text())
    assert vocab == vqa_v2.build_answer_vocab(data_dir / vqa_v2.ANNOTATIONS_FILE["train"], min_count=1)
    rows = build_dataset("vqa_v2", data_dir, "val", region_features=store, answer_vocab=vocab, image_id_template="{id}")
    model = AutoModelForVisualQuestionAnswering.from_pretrained(output_dir).eval()
    assert type(model) is TwoStreamForQuestionAnswering
    collator = QuestionAnsweringCollator(
        tokenizer=AutoTokenizer.from_pretrained(output_dir), region_features=store, num_answers=len(vocab)
    )
    answers = sorted(vocab, key=vocab.get)
    predicted = [answers[p] for p in _predictions(model, collator, rows, autocast=True)]
    official = vqa_accuracy(predicted, rows["answers"])
    assert official["accuracy"] == pytest.approx(results["vqa_accuracy"], abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Arguments and data
# ----------------------------------------------------------------------------------------------------------------


def test_a_bad_model_family_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"`--model_family` must be one of .*'three_stream'"):
        finetune_vqa.main(["--output_dir", str(tmp_path), "--model_family", "three_stream"])


def test_a_checkpoint_of_the_other_family_is_a_clear_error(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    checkpoint = tmp_path / "two_stream"
    TwoStreamConfig(visual_feat_dim=CONFIG.feature_dim).save_pretrained(checkpoint)
    arguments = ["--output_dir", str(tmp_path / "out"), *TINY, "--model_name_or_path", str(checkpoint)]
    with pytest.raises(ValueError, match=r"is a two_stream checkpoint but `--model_family` is 'single_stream'"):
        finetune_vqa.main(arguments)


def test_data_arguments_a_run_cannot_use_are_clear_errors(vqa_files, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ValueError, match=r"`--supervision direct` needs questions whose words point to regions"):
        finetune_vqa.main(["--output_dir", str(tmp_path / "out"), *_vqa_arguments(vqa_files), "--supervision", "direct"])
    with pytest.raises(ValueError, match=r"`--data_dir` reads a real dataset: pass `--dataset gqa`"):
        finetune_vqa.main(["--output_dir", str(tmp_path / "out"), "--data_dir", str(data)])
    with pytest.raises(ValueError, match=r"`--answer_vocab` is required with `--dataset gqa`"):
        finetune_vqa.main(["--output_dir", str(tmp_path / "out"), "--dataset", "gqa", "--data_dir", str(data),
                           "--features", str(data)])  # fmt: skip
    with pytest.raises(ValueError, match=r"`--answer_vocab` reads a real dataset"):
        finetune_vqa.main(["--output_dir", str(tmp_path / "out"), "--answer_vocab", "trainval_ans2label.json"])
    with pytest.raises(ValueError, match=r"`--scene_graphs` is not read by `--dataset vqa_v2`"):
        finetune_vqa.main(["--output_dir", str(tmp_path / "out"), *_vqa_arguments(vqa_files), "--scene_graphs", "x.json"])
    with pytest.raises(ValueError, match=r"`--dataset` must be one of \('gqa', 'vqa_v2'\)"):
        finetune_vqa.main(["--output_dir", str(tmp_path / "out"), "--dataset", "nlvr2"])


def test_gqa_files_read_as_the_default_and_without_scene_graphs_carry_no_alignment(vqa_files, cache, monkeypatch):
    """`--dataset gqa` on the synthetic scenes' GQA files gives the default's rows; without scene graphs the pointers
    have no boxes, the batches no alignment, and supervision is refused."""
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    _, store = vqa_files
    gqa_dir = load_or_generate_synthetic_vgp(config=CONFIG).gqa_dir
    parse = finetune_vqa.parse_args
    _, data_args, qa_args, _ = parse(["--output_dir", "unused", *TINY])
    default = finetune_vqa.load_question_data(data_args, qa_args)
    real = ["--output_dir", "unused", "--dataset", "gqa", "--data_dir", str(gqa_dir),
            "--features", str(store.directory), "--answer_vocab", "trainval_ans2label.json"]  # fmt: skip
    graphs = ["--scene_graphs", "train_sceneGraphs.json", "--eval_scene_graphs", "val_sceneGraphs.json"]
    model_args, data_args, qa_args, _ = parse([*real, *graphs])
    with_graphs = finetune_vqa.load_question_data(data_args, qa_args)
    assert with_graphs.answer_vocab == default.answer_vocab
    for split in ("train", "eval"):
        for column in ("question_id", "label", "question_phrase_regions"):
            assert getattr(with_graphs, split)[column] == getattr(default, split)[column], (split, column)
    assert with_graphs.eval_questions == default.eval_questions
    assert finetune_vqa.count_grounded_questions(with_graphs.train) > 0

    model_args, data_args, qa_args, _ = parse([*real, "--supervision", "direct"])
    without_graphs = finetune_vqa.load_question_data(data_args, qa_args)
    assert finetune_vqa.count_grounded_questions(without_graphs.train) == 0
    tokenizer = AutoTokenizer.from_pretrained(hf_vlalign.default_text_model_path())
    collator = QuestionAnsweringCollator(
        tokenizer=tokenizer, region_features=store, num_answers=len(default.answer_vocab)
    )
    batch = collator([without_graphs.train[i] for i in range(8)])
    assert float(batch["word_region_alignment"].sum()) == 0.0 and batch["labels"].shape == (8,)
    with pytest.raises(ValueError, match="use GQA with `--scene_graphs`"):
        finetune_vqa.check_supervision(model_args, without_graphs)


def test_training_on_balanced_questions_and_scoring_consistency_on_all(vqa_files, cache, monkeypatch):
    """GQA's practice: train on the balanced questions, evaluate on the "all" file, whose entailed questions only
    consistency reads; the image-use check runs on the scored (balanced) questions. Bad subsets are clear errors."""
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(cache))
    parse = finetune_vqa.parse_args
    _, data_args, qa_args, _ = parse(["--output_dir", "unused", *TINY, "--gqa_eval_subset", "all"])
    data = finetune_vqa.load_question_data(data_args, qa_args)
    _, data_args, qa_args, _ = parse(["--output_dir", "unused", *TINY])
    balanced = finetune_vqa.load_question_data(data_args, qa_args)
    assert data.train["question_id"] == balanced.train["question_id"]
    assert all(data.eval_questions[qid]["isBalanced"] for qid in balanced.eval["question_id"])
    assert len(data.eval) > len(balanced.eval)  # the entailed questions are evaluated too
    assert finetune_vqa.balanced_questions(data)["question_id"] == balanced.eval["question_id"]
    assert finetune_vqa.balanced_questions(balanced)["question_id"] == balanced.eval["question_id"]
    gold = dict(zip(data.eval["question_id"], data.eval["answer"]))
    assert gqa_scores(gold, data.eval_questions)["consistency"] == 1.0
    assert finetune_vqa.image_use_questions(data)["question_id"] == balanced.eval["question_id"]
    # balanced questions of a single image: the check swaps images, so it reads every evaluated question
    first = data.eval[0]["image_id"]
    one_image = dataclasses.replace(data, eval=data.eval.filter(lambda row: row["image_id"] == first))
    assert finetune_vqa.image_use_questions(one_image)["question_id"] == one_image.eval["question_id"]

    for flag, value in (("--gqa_subset", "testdev"), ("--gqa_eval_subset", "entailed")):
        _, data_args, qa_args, _ = parse(["--output_dir", "unused", *TINY, flag, value])
        with pytest.raises(ValueError, match=rf"`{flag}` must be one of \['balanced', 'all'\], got '{value}'"):
            finetune_vqa.load_question_data(data_args, qa_args)
    _, data_args, qa_args, _ = parse(["--output_dir", "unused", *_vqa_arguments(vqa_files), "--gqa_eval_subset", "all"])
    with pytest.raises(ValueError, match=r"`--gqa_eval_subset` is not read by `--dataset vqa_v2`"):
        finetune_vqa.load_question_data(data_args, qa_args)
