"""Two-stream pre-training data and training: masking rates of the pre-training collator, image-sentence mismatches,
soft alignment targets in batches, the VQA-loss schedule of the trainer, and one end-to-end run of the example."""

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_image_use_reported
from launch_helpers import save_tiny_bert
from script_modules import load_script
from transformers import AutoModelForPreTraining, AutoTokenizer, HfArgumentParser, TrainingArguments

from hf_vlalign import TwoStreamConfig, TwoStreamForPreTraining, default_text_model_path
from hf_vlalign.alignment import SoftAlignmentTargets, box_iou
from hf_vlalign.data import TwoStreamPretrainingCollator, build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.synthetic import COLOUR_NAMES, SHAPE_NAMES, SyntheticSceneConfig
from hf_vlalign.trainers import TwoStreamPretrainingTrainer, TwoStreamPretrainingTrainingArguments

ROOT = Path(__file__).resolve().parents[2]
SCENES = SyntheticSceneConfig(num_train_images=40, num_val_images=10, seed=3)


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    store = synthetic_region_features(root, SCENES)
    train = build_dataset("synthetic_scenes", root, "train", task="questions", config=SCENES, region_features=store)
    return train, store, AutoTokenizer.from_pretrained(default_text_model_path())


def collate_all(collator, dataset, batch_size=32):
    return [
        collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        for start in range(0, len(dataset), batch_size)
    ]


def test_masking_rates_match_lxmert(questions):
    train, store, tokenizer = questions
    torch.manual_seed(0)
    batches = collate_all(TwoStreamPretrainingCollator(tokenizer, store, num_answers=16), train)
    special = set(tokenizer.all_special_ids)
    maskable = masked_words = real_regions = masked_regions = mismatched = rows = 0
    for batch in batches:
        original = batch["labels"] != -100
        maskable_tokens = batch["attention_mask"].bool() & ~torch.isin(
            torch.where(original, batch["labels"], batch["input_ids"]), torch.tensor(sorted(special))
        )
        maskable += int(maskable_tokens.sum())
        masked_words += int(original.sum())
        real_regions += int(batch["visual_attention_mask"].sum())
        masked_regions += int(batch["masked_regions"].sum())
        mismatched += int((batch["matched_labels"] == 0).sum())
        rows += len(batch["matched_labels"])
    assert rows == len(train) > 250
    assert 0.12 < masked_words / maskable < 0.18
    assert 0.12 < masked_regions / real_regions < 0.18
    assert 0.42 < mismatched / rows < 0.58


def test_mismatched_rows_lose_their_alignment_and_answer(questions):
    train, store, tokenizer = questions
    torch.manual_seed(1)
    batch = TwoStreamPretrainingCollator(tokenizer, store, num_answers=16, object_mask_probability=0.0)(
        [train[i] for i in range(64)]
    )
    matched = batch["matched_labels"].bool()
    grounded = batch["word_region_alignment"].sum(-1).sum(-1) > 0
    has_pointers = torch.tensor([bool(train[i]["question_phrase_spans"]) for i in range(64)])
    assert not bool(grounded[~matched].any()) and torch.equal(grounded[matched], has_pointers[matched])
    assert bool((batch["answer_labels"][~matched] == -100).all()) and bool((batch["answer_labels"][matched] >= 0).all())
    for i in range(64):  # a matched row keeps its own image's features, a mismatched one shows another image
        own = store[train[i]["image_id"]]["features"]
        same = torch.equal(batch["visual_feats"][i, : len(own)], own)
        assert same == bool(matched[i])


def test_object_masking_targets_come_from_the_detector(questions):
    train, store, tokenizer = questions
    torch.manual_seed(2)
    collator = TwoStreamPretrainingCollator(tokenizer, store, object_mask_probability=0.5, mismatch_probability=0.0)
    batch = collator([train[i] for i in range(16)])
    masked = batch["masked_regions"].bool()
    for i in range(16):
        image = store[train[i]["image_id"]]
        ids = torch.as_tensor(image["object_ids"])
        assert torch.equal(batch["object_labels"][i][masked[i]], ids[masked[i]])
        assert bool((batch["object_labels"][i][~masked[i]] == -100).all())
        assert torch.equal(batch["feature_labels"][i], image["features"])
    zeroed = (batch["visual_feats"] == 0).all(-1)
    assert bool(zeroed[~masked].logical_not().all()) and 0.6 < float(zeroed[masked].float().mean()) < 1.0


def test_evaluation_collator_masks_nothing(questions):
    train, store, tokenizer = questions
    collator = TwoStreamPretrainingCollator(
        tokenizer, store, mlm_probability=0, object_mask_probability=0, mismatch_probability=0, num_answers=16
    )
    batch = collator([train[i] for i in range(8)])
    assert bool((batch["labels"] == -100).all()) and int(batch["masked_regions"].sum()) == 0
    assert bool(batch["matched_labels"].all())
    assert torch.equal(batch["answer_labels"], torch.tensor([train[i]["label"] for i in range(8)]))


def test_soft_targets_in_batches_favour_the_pointed_object(questions):
    train, store, tokenizer = questions

    def one_hot_words(texts):  # a word vector per shape / colour name, so the semantic criterion is exact
        vocabulary = [*SHAPE_NAMES, *COLOUR_NAMES]
        return torch.stack([torch.tensor([float(name in text.split()) for name in vocabulary]) for text in texts])

    soft = SoftAlignmentTargets(one_hot_words, SHAPE_NAMES, COLOUR_NAMES)
    collator = TwoStreamPretrainingCollator(
        tokenizer,
        store,
        mlm_probability=0,
        object_mask_probability=0,
        mismatch_probability=0,
        soft_targets=soft,
        return_probe_targets=True,
    )
    batch = collator([train[i] for i in range(32)])
    rows = batch["word_region_alignment"].flatten(0, 1)
    grounded = rows.sum(-1) > 0
    torch.testing.assert_close(rows[grounded].sum(-1), torch.ones(int(grounded.sum())))
    # the most likely region of each phrase overlaps the pointed object (IoU >= 0.5) for most phrases
    best = batch["word_region_alignment"].argmax(-1)
    token = batch["phrase_token_index"][:, 0]
    has = token >= 0
    iou_of_best = batch["phrase_region_iou"][has, 0].gather(-1, best[has, token[has]].unsqueeze(-1)).squeeze(-1)
    assert float((iou_of_best >= 0.5).float().mean()) > 0.8
    assert box_iou is not None


def tiny_model(vocab_size: int) -> TwoStreamForPreTraining:
    config = TwoStreamConfig(
        vocab_size=vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64, l_layers=1, r_layers=1,
        x_layers=2, visual_feat_dim=SCENES.feature_dim, num_object_labels=len(SHAPE_NAMES),
        num_attr_labels=len(COLOUR_NAMES), num_qa_labels=16, task_alignment=True,
    )  # fmt: skip
    return TwoStreamForPreTraining(config)


def test_trainer_logs_every_loss_and_starts_vqa_at_its_epoch(questions, tmp_path):
    train, store, tokenizer = questions
    args = TwoStreamPretrainingTrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=64, logging_steps=1,
        report_to="none", remove_unused_columns=False, save_strategy="no", use_cpu=True, seed=0, qa_start_epoch=1.0,
    )  # fmt: skip
    subset = train.select(range(128))
    trainer = TwoStreamPretrainingTrainer(
        model=tiny_model(tokenizer.vocab_size), args=args, train_dataset=subset,
        data_collator=TwoStreamPretrainingCollator(tokenizer, store, num_answers=16),
    )  # fmt: skip
    trainer.train()
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 4
    for log in steps:
        for key in ("loss_mlm", "loss_object_class", "loss_object_attr", "loss_region_feature", "loss_itm", "loss_alignment"):
            assert key in log, (key, log)
    # the epoch is counted after each step: steps 1-2 run in epoch 0 (no answer loss), steps 3-4 in epoch 1
    assert [("loss_qa" in log) for log in steps] == [False, False, True, True]
    assert [log["qa_loss_enabled"] for log in steps] == [0.0, 0.0, 1.0, 1.0]


def test_qa_start_epoch_is_an_argument(tmp_path):
    parser = HfArgumentParser(TwoStreamPretrainingTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--qa_start_epoch", "2.5"])
    assert args.qa_start_epoch == 2.5 and "--qa_start_epoch" in parser.format_help()
    assert json.loads(args.to_json_string())["qa_start_epoch"] == 2.5  # saved with the run
    with pytest.raises(ValueError, match=r"`qa_start_epoch` must be >= 0, got -1.0"):
        TwoStreamPretrainingTrainingArguments(output_dir=str(tmp_path), qa_start_epoch=-1.0)
    model = tiny_model(128)
    with pytest.raises(TypeError, match="vqa_start_epoch"):
        TwoStreamPretrainingTrainer(model=model, args=args, vqa_start_epoch=1.0)
    with pytest.raises(TypeError, match="qa_start_epoch"):
        TwoStreamPretrainingTrainer(model=model, args=args, qa_start_epoch=1.0)
    # a plain TrainingArguments is converted; another trainer's arguments are refused, naming `args`
    plain = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, seed=7)
    trainer = TwoStreamPretrainingTrainer(model=model, args=plain)
    assert type(trainer.args) is TwoStreamPretrainingTrainingArguments and (trainer.args.seed, trainer.args.qa_start_epoch) == (7, 0.0)
    from hf_vlalign.trainers import CaptioningTrainingArguments

    other = CaptioningTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match=r"`args` must be TwoStreamPretrainingTrainingArguments or a .*, got CaptioningTrainingArguments, whose settings .*'mask_update_every'"):
        TwoStreamPretrainingTrainer(model=model, args=other)


@pytest.mark.slow
def test_example_pretrains_both_runs_and_reports(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    summary = _example().main([
        "--output_dir", str(tmp_path / "out"), "--synthetic_train_images", "30", "--synthetic_eval_images", "8",
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--x_layers", "2", "--qa_start_epoch", "0",
        "--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny_bert")), "--use_cpu",
    ])  # fmt: skip
    assert set(summary) == {"with_alignment", "without_alignment"}
    on_disk = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    card = ModelCard.load(tmp_path / "out" / "README.md").data.to_dict()
    assert card["library_name"] == "hf_vlalign" and card["model-index"][0]["results"]
    assert on_disk == json.loads(json.dumps(summary))
    for name, results in summary.items():
        assert 0.0 <= results["vqa_accuracy"] <= 1.0 and 0.0 <= results["cross_attention_grounding_accuracy"] <= 1.0
        assert results["alignment_loss_enabled"] == (name == "with_alignment")
        glove = "GloveWordVectors('glove_6B_50d_emb.npy', 400000 words, 50-d)"  # the default with the `test` extra
        assert results["word_vectors"] == (glove if name == "with_alignment" else None)
        assert_image_use_reported(results, None)
        assert (results["alignment_loss"] is not None) == (name == "with_alignment")
        assert (results["alignment_decoder_grounding_accuracy"] is not None) == (name == "with_alignment")
        model = AutoModelForPreTraining.from_pretrained(tmp_path / "out" / name)
        assert model.config.task_alignment == (name == "with_alignment")
        # the answers beside the training questions' majority answer, the grounding beside the most confident region
        kinds = {key: entry["kind"] for key, entry in results["baselines"].items()}
        assert kinds["vqa_accuracy"] == "majority_class"
        assert kinds["cross_attention_grounding_accuracy"] == kinds["best_head_grounding_accuracy"] == "detection_confidence"
        assert results["trained"].startswith("3 optimizer steps (") and "planned: 3 steps (--max_steps)" in results["trained"]
    text = ModelCard.load(tmp_path / "out" / "README.md").text
    assert "| with_alignment/vqa_accuracy |" in text and "(majority class)" in text and "(most confident region)" in text
    assert f"| trained | {summary['with_alignment']['trained']} |" in text
    assert (tmp_path / "out" / "cross_attention.png").stat().st_size > 1000


def _example():
    return load_script("pretrain_two_stream", ROOT / "examples" / "pretrain_two_stream.py")


def test_synthetic_captions_and_questions_in_lxmert_layout(tmp_path, monkeypatch, questions):
    """--synthetic_text captions_and_questions: every caption and question of both splits as LXMERT's `sentence` rows,
    answers on the question rows only, pointers kept; the collator's answers come from the question rows alone."""
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    example = _example()
    flags = ["--output_dir", str(tmp_path / "out"), "--synthetic_train_images", "12", "--synthetic_eval_images", "6"]
    args, training_args = example.parse_args([*flags, "--synthetic_text", "captions_and_questions"])
    data = example.load_data(args, training_args)
    only_questions = example.load_data(*example.parse_args(flags))
    assert data.text_column == "sentence" and only_questions.text_column == "question"
    for mixed, questions_only in ((data.train, only_questions.train), (data.eval, only_questions.eval)):
        asked = mixed.filter(lambda row: row["source"] == "questions")
        assert asked["sentence"] == questions_only["question"]
        assert asked["label"] == questions_only["label"] == [ids[0] for ids in asked["answer_ids"]]
        assert asked["sentence_phrase_regions"] == questions_only["question_phrase_regions"]
        captions = mixed.filter(lambda row: row["source"] == "captions")
        assert len(captions) >= len(set(mixed["image_id"])) and set(captions["label"]) == {-1}
        assert all(ids == [] for ids in captions["answer_ids"]) and any(captions["sentence_phrase_spans"])
    _, store, tokenizer = questions
    collator = TwoStreamPretrainingCollator(
        tokenizer, data.store, text_columns=("sentence",), num_answers=data.num_answers, sample_answers=True,
        mismatch_probability=0.0,
    )  # fmt: skip
    rows = [data.train[i] for i in range(len(data.train))]
    batch = collator(rows)
    assert (batch["answer_labels"] >= 0).tolist() == [row["source"] == "questions" for row in rows]
    expected = r"`--synthetic_text` must be one of \['questions', 'captions_and_questions'\], got 'captions'"
    with pytest.raises(ValueError, match=expected):
        example.parse_args([*flags, "--synthetic_text", "captions"])


@pytest.mark.slow
def test_example_pretrains_on_captions_and_questions_and_scores_gqa(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    summary = _example().main([
        "--output_dir", str(tmp_path / "out"), "--synthetic_train_images", "12", "--synthetic_eval_images", "6",
        "--synthetic_text", "captions_and_questions", "--alignment_loss", "with", "--max_steps", "2",
        "--per_device_train_batch_size", "8", "--x_layers", "1", "--qa_start_epoch", "0", "--use_cpu",
        "--image_use_examples", "8", "--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny_bert")),
    ])  # fmt: skip
    results = summary["with_alignment"]
    assert results["data"] == "synthetic grounded scenes: captions and questions"
    counts = results["pointers"]["train"]["by_source"]
    assert set(counts) == {"captions", "questions"} and counts["captions"]["rows_with_pointers"] > 0
    # the QA head scored on the questions alone (None: no correctly answered question to check the consistency of)
    assert 0.0 <= results["gqa_accuracy"] <= 1.0 and "gqa_consistency" in results
    assert results["vqa_accuracy"] == results["gqa_accuracy"]  # caption rows carry no answer


def test_soft_targets_from_real_visual_genome_descriptions(tmp_path):
    """Kervadec et al. build A* from Visual Genome descriptions: the real VG sample, its objects as the detected
    regions (classes from the real bottom-up-attention vocabulary) and the real MiniLM word vectors."""
    from hf_vlalign.alignment import SentenceEmbeddingWordVectors, read_vocabulary
    from hf_vlalign.data import RegionFeatureStore
    from tests.shared_samples import real_sample

    rows = build_dataset("visual_genome", real_sample("visual_genome"), "train")
    classes = read_vocabulary(real_sample("bottom_up_attention", "objects_vocab.txt"))
    index = {name: i for i, name in enumerate(classes)}
    records = []
    for image_id in sorted(set(rows["image_id"])):
        row = next(r for r in rows if r["image_id"] == image_id)
        boxes = torch.tensor(row["object_boxes"])
        records.append({
            "image_id": image_id,
            "image_size": row["image_size"],
            "boxes": boxes.numpy(),
            "features": torch.randn(len(boxes), 8).numpy(),
            "object_ids": torch.tensor([index.get(name, 0) for name in row["object_names"]]).numpy(),
            "object_conf": None, "attr_ids": None, "attr_conf": None,
        })  # fmt: skip
    store = RegionFeatureStore.write(records, tmp_path / "store")
    soft = SoftAlignmentTargets(SentenceEmbeddingWordVectors(), classes)
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    collator = TwoStreamPretrainingCollator(
        tokenizer, store, text_columns=("sentence",), mlm_probability=0, object_mask_probability=0,
        mismatch_probability=0, soft_targets=soft, return_probe_targets=True,
    )  # fmt: skip
    batch = collator([rows[i] for i in range(len(rows))])
    grounded = batch["word_region_alignment"].sum(-1) > 0
    assert int(grounded.sum()) > 0
    torch.testing.assert_close(batch["word_region_alignment"][grounded].sum(-1), torch.ones(int(grounded.sum())))
    # eq. 17: A* = (IoU criterion + semantic criterion) / 2, each summing to one, so wherever some object overlaps the
    # described region at least half of the mass sits on the overlapping objects
    phrase_rows, overlaps = [], []
    for i, slot in (batch["phrase_token_index"] >= 0).nonzero().tolist():
        phrase_rows.append(batch["word_region_alignment"][i, batch["phrase_token_index"][i, slot]])
        overlaps.append(batch["phrase_region_iou"][i, slot] > 0)
    mass = torch.stack([(row * overlap).sum() for row, overlap in zip(phrase_rows, overlaps) if overlap.any()])
    assert len(mass) >= 5 and float(mass.min()) >= 0.5 - 1e-5
