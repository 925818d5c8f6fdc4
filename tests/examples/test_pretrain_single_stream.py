"""VisualBERT-style single-stream pre-training: the sentence-image collator (caption pairs, BERT masking, VL-BERT's
masked regions, task-specific mode, errors) with the real tokenizer and synthetic scenes, and one end-to-end run of
`examples/pretrain_single_stream.py` (in the test process, as `accelerate launch --cpu` runs it)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_diagnostics_reported, assert_image_use_reported
from launch_helpers import run_example
from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer, EvalPrediction

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForPreTraining,
    SingleStreamForQuestionAnswering,
    default_text_model_path,
)
from hf_vlalign.data import SingleStreamPretrainingCollator, build_dataset, group_captions_by_image
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.evaluation.task_metrics import pretraining_metrics
from hf_vlalign.synthetic import SyntheticSceneConfig

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCENES = SyntheticSceneConfig(num_train_images=40, num_val_images=6, seed=5)


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    store = synthetic_region_features(root, SCENES)
    train = build_dataset("synthetic_scenes", root, "train", task="captions", config=SCENES, region_features=store)
    return train, store, AutoTokenizer.from_pretrained(default_text_model_path())


def collate_all(collator, rows, batch_size=25):
    starts = range(0, len(rows), batch_size)
    return [collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))]) for start in starts]


def segments(tokenizer, batch, i):
    """The decoded first and second text of batch row `i`."""
    tokens, types = batch["input_ids"][i][batch["attention_mask"][i].bool()], batch["token_type_ids"][i]
    first = tokens[1 : int((tokens == tokenizer.sep_token_id).nonzero()[0])]
    second = tokens[(types[: len(tokens)] == 1) & (tokens != tokenizer.sep_token_id)]
    return tokenizer.decode(first), tokenizer.decode(second)


def test_second_captions_are_half_random_and_from_the_right_images(captions):
    train, store, tokenizer = captions
    pool = group_captions_by_image(train)
    images_of = {}  # decoded caption -> the images it describes
    for image_id, texts in pool.items():
        for text in texts:
            decoded = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])
            images_of.setdefault(decoded, set()).add(image_id)
    collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train, mlm_probability=0)
    torch.manual_seed(0)
    labels = []
    for _ in range(5):  # 5 x 200 draws
        for start in range(0, len(train), 25):
            rows = [train[i] for i in range(start, start + 25)]
            batch = collator(rows)
            for i, row in enumerate(rows):
                first, second = segments(tokenizer, batch, i)
                assert row["image_id"] in images_of[first]
                label = int(batch["sentence_image_labels"][i])
                if label == 0:  # another caption of the same image
                    assert row["image_id"] in images_of[second] and second != first
                else:  # a caption of another image
                    assert images_of[second] - {row["image_id"]}
                labels.append(label)
    assert len(labels) == 1000 and 0.45 < sum(labels) / len(labels) < 0.55
    assert torch.equal(batch["token_type_ids"].max(dim=1).values, torch.ones(len(rows), dtype=torch.long))


def test_always_random_and_never_random_second_captions(captions):
    train, store, tokenizer = captions
    rows = [train[i] for i in range(20)]
    for probability, label in ((0.0, 0), (1.0, 1)):
        collator = SingleStreamPretrainingCollator(
            tokenizer, store, captions_by_image=group_captions_by_image(train), random_caption_probability=probability
        )
        assert collator(rows)["sentence_image_labels"].tolist() == [label] * 20


def test_masked_word_labels_only_on_masked_positions(captions):
    train, store, tokenizer = captions
    masked_collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train)
    plain_collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train, mlm_probability=0)
    special = torch.tensor(tokenizer.all_special_ids)
    masked = maskable = as_mask_token = 0
    for start in range(0, len(train), 50):
        rows = [train[i] for i in range(start, start + 50)]
        torch.manual_seed(start)  # the same second captions: they are drawn before the words are masked
        batch = masked_collator(rows)
        torch.manual_seed(start)
        plain = plain_collator(rows)
        assert torch.equal(batch["sentence_image_labels"], plain["sentence_image_labels"])
        assert bool((plain["labels"] == -100).all())
        scored = batch["labels"] != -100
        assert torch.equal(batch["input_ids"][~scored], plain["input_ids"][~scored])  # unmasked tokens unchanged
        assert torch.equal(batch["labels"][scored], plain["input_ids"][scored])  # labels: the original words
        candidates = plain["attention_mask"].bool() & ~torch.isin(plain["input_ids"], special)
        assert not bool((scored & ~candidates).any())  # never [CLS], [SEP] or padding
        masked, maskable = masked + int(scored.sum()), maskable + int(candidates.sum())
        as_mask_token += int((batch["input_ids"][scored] == tokenizer.mask_token_id).sum())
    assert 0.12 < masked / maskable < 0.18
    assert 0.7 < as_mask_token / masked < 0.9


def test_task_specific_mode_has_one_text_and_no_pair_labels(captions):
    train, store, tokenizer = captions
    collator = SingleStreamPretrainingCollator(tokenizer, store, paired=False)  # no caption pool needed
    torch.manual_seed(1)
    batch = collator([train[i] for i in range(8)])
    assert "sentence_image_labels" not in batch
    assert bool((batch["token_type_ids"] == 0).all())
    assert ((batch["input_ids"] == tokenizer.sep_token_id).sum(dim=1) == 1).all()
    assert bool((batch["labels"] != -100).any())
    for i in range(8):  # the row's caption alone (where no word is masked)
        words = tokenizer(train[i]["sentence"], add_special_tokens=True)["input_ids"]
        kept = (batch["labels"][i, : len(words)] == -100).tolist()
        assert [w for w, k in zip(words, kept) if k] == [w for w, k in zip(batch["input_ids"][i].tolist(), kept) if k]


def test_a_batch_without_drawn_masks_gets_one_masked_word(captions):
    train, store, tokenizer = captions
    collator = SingleStreamPretrainingCollator(tokenizer, store, paired=False, mlm_probability=1e-6)
    batch = collator([train[0]])
    assert int((batch["labels"] != -100).sum()) == 1
    assert int((batch["input_ids"] == tokenizer.mask_token_id).sum()) == 1


def test_masked_regions_are_zeroed_with_feature_and_class_labels(captions):
    train, store, tokenizer = captions
    rows = [train[i] for i in range(0, 200, 2)]
    collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train, region_mask_probability=0.3)
    torch.manual_seed(2)
    batch = collator(rows)
    original = store.padded([row["image_id"] for row in rows])
    masked, real = batch["masked_regions"].bool(), batch["visual_attention_mask"].bool()
    assert not bool((masked & ~real).any()) and 0.22 < int(masked.sum()) / int(real.sum()) < 0.38
    assert bool((batch["visual_feats"][masked] == 0).all())
    assert torch.equal(batch["visual_feats"][~masked], original[~masked])
    assert torch.equal(batch["feature_labels"], original)
    for i, row in enumerate(rows):
        object_ids = store[row["image_id"]]["object_ids"]
        count = len(object_ids)
        expected = torch.where(masked[i, :count], object_ids, torch.full_like(object_ids, -100))
        assert torch.equal(batch["object_labels"][i, :count], expected)
        assert bool((batch["object_labels"][i, count:] == -100).all())
    assert "attribute_labels" not in batch
    without_classes = SingleStreamPretrainingCollator(
        tokenizer, store, captions_by_image=train, region_mask_probability=0.3, return_object_labels=False
    )(rows)
    assert "object_labels" not in without_classes and "masked_regions" in without_classes
    visualbert = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train)(rows)
    assert not {"masked_regions", "feature_labels", "object_labels"} & set(visualbert)
    assert torch.equal(visualbert["visual_feats"], original)

    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, visual_feat_dim=store.feature_dim, num_object_labels=6,
    )  # fmt: skip
    outputs = SingleStreamForPreTraining(config)(**batch)
    for key in ("loss_mlm", "loss_sentence_image", "loss_region_feature", "loss_region_class"):
        assert torch.isfinite(outputs[key]), key


def test_grounding_comes_from_the_first_caption_only(captions):
    train, store, tokenizer = captions
    rows = [train[i] for i in range(30)]
    batch = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train, mlm_probability=0)(rows)
    grounded = batch["word_region_alignment"].sum(-1) > 0
    assert int(grounded.sum()) > 0
    assert not bool((grounded & (batch["token_type_ids"] == 1)).any())
    torch.testing.assert_close(batch["word_region_alignment"][grounded].sum(-1), torch.ones(int(grounded.sum())))
    # the first caption's tokens sit at the same positions alone and paired, with the same alignment
    single = SingleStreamPretrainingCollator(tokenizer, store, paired=False, mlm_probability=0)(rows)
    length = single["input_ids"].shape[1]
    assert int(grounded[:, :length].sum()) == int(grounded.sum())
    torch.testing.assert_close(batch["word_region_alignment"][:, :length], single["word_region_alignment"], rtol=0, atol=0)


def test_seeded_collation_is_fixed_per_batch_and_leaves_the_rng_alone(captions):
    train, store, tokenizer = captions
    rows = [train[i] for i in range(16)]
    collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train, seed=7, region_mask_probability=0.2)
    torch.manual_seed(0)
    first = collator(rows)
    state = torch.random.get_rng_state()
    torch.manual_seed(123)
    second = collator(rows)
    assert first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)
    torch.manual_seed(0)
    assert torch.equal(torch.random.get_rng_state(), state)  # the collation drew nothing from torch's RNG
    other = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train, seed=8)(rows)
    assert not torch.equal(other["input_ids"], first["input_ids"])
    torch.manual_seed(4)  # unseeded: the same global state gives the same batch
    unseeded = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train)
    a = unseeded(rows)
    torch.manual_seed(4)
    assert all(torch.equal(a[key], value) for key, value in unseeded(rows).items())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"captions_by_image": None}, r"`captions_by_image` is required"),
        ({"mlm_probability": 1.5}, r"`mlm_probability` must be a probability in \[0, 1\], got 1.5"),
        ({"captions_by_image": {"100000": ["a", "b"]}}, r"at least two images to draw random captions"),
        ({"captions_by_image": [("100000", ["a", "b"])]}, r"`captions_by_image` must be a mapping"),
    ],
)
def test_bad_arguments_are_named(captions, options, message):
    train, store, tokenizer = captions
    with pytest.raises(ValueError, match=message):
        SingleStreamPretrainingCollator(tokenizer, store, **{"captions_by_image": train, **options})


def test_bad_rows_are_named(captions):
    train, store, tokenizer = captions
    pool = {"100000": ["a b", "c d"], "100001": ["e", "f"]}
    collator = SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=pool)
    with pytest.raises(ValueError, match=r"`examples` must hold at least one example"):
        collator([])
    with pytest.raises(ValueError, match=r"image '100039' of batch row 0 is not in `captions_by_image`"):
        collator([train[len(train) - 1]])
    with pytest.raises(ValueError, match=r"batch row 0 must have the columns \['sentence'\]"):
        SingleStreamPretrainingCollator(tokenizer, store, captions_by_image=train)([{"image_id": "100000", "caption": "x"}])
    with pytest.raises(ValueError, match=r"caption rows must have the columns \['caption'\]"):
        group_captions_by_image(train, "caption")
    with pytest.raises(ValueError, match=r"`feature_row` of image 'COCO_1' must be a row of the region-feature store"):
        SingleStreamPretrainingCollator(tokenizer, store, paired=False)(
            [{**train[0], "image_id": "COCO_1", "feature_row": len(store)}]
        )


# ----------------------------------------------------------------------------------------------------------------
# The example, end to end
# ----------------------------------------------------------------------------------------------------------------

EXAMPLE_SCENES = SyntheticSceneConfig(num_train_images=12, num_val_images=6)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, example):
    """The example end to end, in this process as `accelerate launch --cpu` runs it (`tests/conftest.py`'s
    `finetuned` is the real single-process launch)."""
    output_dir = tmp_path_factory.mktemp("single_stream_pretraining")
    arguments = [
        "--output_dir", str(output_dir / "model"),
        "--synthetic_train_images", "12", "--synthetic_eval_images", "6", "--max_steps", "4", "--eval_steps", "2",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--region_mask_probability", "0.2",
    ]  # fmt: skip
    _, stdout = run_example(example.main, arguments, output_dir / "cache")
    return output_dir, stdout


def test_example_writes_weights_card_logs_and_results(pretrained):
    output_dir, stdout = pretrained
    model_dir = output_dir / "model"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "eval_results.json", "training_args.json"):
        assert (model_dir / name).is_file(), name
    assert not list(model_dir.glob("*.bin"))
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert_image_use_reported(results, None)
    assert_diagnostics_reported(results, {"pretraining": "loss"}, supervised=False)
    assert results == json.loads(stdout[stdout.index('{\n  "') :])  # printed too, last
    for key in ("mlm_accuracy", "sentence_image_accuracy", "mlm_most_frequent_token_accuracy"):
        assert 0.0 <= results[key] <= 1.0, key
    for key in ("loss", "loss_mlm", "loss_sentence_image", "loss_region_feature", "loss_region_class"):
        assert results[key] > 0, key
    assert results["eval_examples"] == 30 and results["num_masked_words"] > 0
    card = ModelCard.load(model_dir / "README.md").data.to_dict()
    assert card["library_name"] == "hf_vlalign" and card["model-index"][0]["results"]
    reported = {metric["type"]: metric["value"] for metric in card["model-index"][0]["results"][0]["metrics"]}
    assert reported["sentence_image_accuracy"] == pytest.approx(results["sentence_image_accuracy"])
    assert list((model_dir / "runs").rglob("events.out.tfevents.*"))
    config = json.loads((model_dir / "config.json").read_text())
    assert config["num_object_labels"] == 6  # the synthetic store's detector classes (shapes)


def test_reloaded_model_reproduces_the_reported_accuracies(pretrained, monkeypatch):
    output_dir, _ = pretrained
    model_dir = output_dir / "model"
    results = json.loads((model_dir / "eval_results.json").read_text())
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(output_dir / "cache"))
    store = synthetic_region_features(config=EXAMPLE_SCENES)
    evaluation = build_dataset("synthetic_scenes", None, "val", task="captions", config=EXAMPLE_SCENES, region_features=store)
    collator = SingleStreamPretrainingCollator(
        AutoTokenizer.from_pretrained(model_dir), store, captions_by_image=evaluation, region_mask_probability=0.2,
        max_text_length=64, seed=results["eval_collation_seed"],
    )  # fmt: skip
    model = AutoModelForPreTraining.from_pretrained(model_dir).eval()
    assert type(model) is SingleStreamForPreTraining
    pair_correct = word_correct = words = 0
    with torch.no_grad():
        for batch in collate_all(collator, evaluation, batch_size=8):  # the evaluation's batches
            outputs = model(**batch)
            pair_correct += int((outputs.seq_relationship_logits.argmax(-1) == batch["sentence_image_labels"]).sum())
            scored = batch["labels"] != -100
            word_correct += int((outputs.prediction_logits.argmax(-1)[scored] == batch["labels"][scored]).sum())
            words += int(scored.sum())
    assert words == results["num_masked_words"]
    assert pair_correct / len(evaluation) == results["sentence_image_accuracy"]
    assert word_correct / words == results["mlm_accuracy"]


def test_the_checkpoint_starts_downstream_models(pretrained):
    model_dir = pretrained[0] / "model"
    pretraining = SingleStreamForPreTraining.from_pretrained(model_dir)
    answering = SingleStreamForQuestionAnswering.from_pretrained(model_dir, num_qa_labels=5)
    encoder = AutoModel.from_pretrained(model_dir)
    assert type(encoder).__name__ == "SingleStreamModel" and answering.config.num_qa_labels == 5
    expected = pretraining.single_stream.state_dict()
    for model in (answering.single_stream, encoder):
        state = model.state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[name], expected[name]) for name in expected)


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import pretrain_single_stream
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return pretrain_single_stream


def test_example_refuses_the_two_stream_family_and_bad_probabilities(example):
    with pytest.raises(ValueError, match=r"examples/pretrain_two_stream.py"):
        example.main(["--model_family", "two_stream", "--output_dir", "unused"])
    with pytest.raises(ValueError, match=r"`--region_mask_probability` must be a probability in \[0, 1\], got 2.0"):
        example.main(["--region_mask_probability", "2", "--output_dir", "unused"])
    with pytest.raises(ValueError, match=r"`--dataset coco_captions` needs `--data_dir`"):
        example.main(["--dataset", "coco_captions", "--output_dir", "unused"])


def test_pretraining_metrics_with_and_without_pairs():
    words = np.array([[-100, 7, 9, -100], [5, -100, -100, 7]])  # masked words 7, 9, 5, 7
    predicted_words = np.array([[0, 7, 1, 2], [5, 5, 5, 9]])  # 7 and 5 right
    pair_logits, pair_labels = np.array([[2.0, 1.0], [0.0, 3.0]]), np.array([1, 1])
    paired = pretraining_metrics(True)(EvalPrediction((predicted_words, pair_logits), (words, pair_labels)))
    assert paired == {"mlm_accuracy": 0.5, "mlm_most_frequent_token_accuracy": 0.5, "num_masked_words": 4.0,
                      "sentence_image_accuracy": 0.5, "sentence_image_most_frequent_label_accuracy": 1.0}  # fmt: skip
    task_specific = pretraining_metrics(False)(EvalPrediction((predicted_words, pair_logits), words))
    assert task_specific == {"mlm_accuracy": 0.5, "mlm_most_frequent_token_accuracy": 0.5, "num_masked_words": 4.0}
