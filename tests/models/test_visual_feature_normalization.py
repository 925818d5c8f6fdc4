"""Region-feature standardisation (`visual_feature_normalization`): exact statistics from a store, the same outputs as
a model without it fed standardised features, "none" configs and converted checkpoints unchanged, statistics saved with
the weights (safetensors and remote code), fitted by the trainers before training, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_remote_code import captioner_config, load_in_fresh_process, single_stream_config, tiny_inputs, two_stream_config
from transformers import AutoTokenizer, TrainingArguments

from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForQuestionAnswering,
    TwoStreamConfig,
    TwoStreamForQuestionAnswering,
    default_text_model_path,
)
from hf_vlalign.data import QuestionAnsweringCollator, RegionFeatureStore, region_feature_statistics
from hf_vlalign.hub.remote_code import save_with_remote_code
from hf_vlalign.trainers import TaskTrainer

DV = 8  # the feature size of test_remote_code's tiny configs


def store_of(tmp_path, num_images: int = 6, dim: int = DV, constant_dim: int | None = None) -> RegionFeatureStore:
    rng = np.random.default_rng(0)
    records = []
    for index in range(num_images):
        count = 2 + index % 3
        features = (rng.random((count, dim)) * 255.0).astype(np.float32)  # raw pooled-colour-like values
        if constant_dim is not None:
            features[:, constant_dim] = 7.0
        corners = rng.random((count, 2)) * 40
        records.append(
            {
                "image_id": f"img{index}",
                "image_size": (64, 64),
                "boxes": np.concatenate([corners, corners + 10 + rng.random((count, 2)) * 10], axis=1).astype(np.float32),
                "features": features,
            }
        )
    return RegionFeatureStore.write(records, tmp_path / "store")


def all_features(store, image_ids) -> np.ndarray:
    return np.concatenate([store[image_id]["features"].numpy().astype(np.float64) for image_id in image_ids])


def family_models(normalization: str) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    configs = [single_stream_config(), two_stream_config(), captioner_config()]
    classes = [SingleStreamForQuestionAnswering, TwoStreamForQuestionAnswering, RegionCaptionerForConditionalGeneration]
    models = []
    for config, model_class in zip(configs, classes):
        config.visual_feature_normalization = normalization
        torch.manual_seed(0)
        models.append(model_class(config).eval())
    return models


def model_inputs(model) -> dict[str, torch.Tensor]:
    inputs = tiny_inputs()
    inputs["visual_feats"] = inputs["visual_feats"] * 60.0 + 130.0  # raw 0..255-like features
    if isinstance(model, RegionCaptionerForConditionalGeneration):
        return {k: inputs[k] for k in ("visual_feats", "visual_boxes", "visual_attention_mask")} | {
            "labels": torch.tensor([[5, 6, 7, 2, -100], [8, 9, 10, 11, 2]])
        }
    return {k: v for k, v in inputs.items() if k != "word_region_alignment"}


def first_output(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


# ----------------------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------------------


def test_statistics_are_the_exact_mean_and_std_of_every_region_of_the_chosen_images(tmp_path):
    store = store_of(tmp_path, constant_dim=3)
    mean, std, count = region_feature_statistics(store)
    values = all_features(store, store.image_ids)
    assert count == len(values) == 18
    np.testing.assert_allclose(mean.numpy(), values.mean(0), rtol=1e-6)
    expected_std = values.std(0)
    expected_std[3] = 1.0  # a constant dimension keeps std 1 (its centred value is 0 anyway)
    np.testing.assert_allclose(std.numpy(), expected_std, rtol=1e-5)
    assert mean.dtype == std.dtype == torch.float32

    # a subset: by store image ids, by store rows, or by a dataset joined to the store (its `feature_row`)
    subset = ["img1", "img4"]
    by_ids = region_feature_statistics(store, subset)
    by_rows = region_feature_statistics(store, [store.row_of(image_id) for image_id in subset])
    import datasets

    by_dataset = region_feature_statistics(
        store, datasets.Dataset.from_dict({"question": ["a", "b", "c"], "feature_row": [1, 4, 1]})
    )
    values = all_features(store, subset)
    for result in (by_ids, by_rows, by_dataset):
        np.testing.assert_allclose(result[0].numpy(), values.mean(0), rtol=1e-6)
        assert result[2] == len(values)  # each image counted once, however many rows show it

    # max_images: a seeded subset, the same every time
    first, again = region_feature_statistics(store, max_images=3, seed=5), region_feature_statistics(store, max_images=3, seed=5)
    assert torch.equal(first[0], again[0]) and first[2] == again[2] < count


def test_statistics_errors_name_the_argument(tmp_path):
    store = store_of(tmp_path)
    with pytest.raises(ValueError, match="`images`: image 'nope' is not in the region-feature store"):
        region_feature_statistics(store, ["nope"])
    with pytest.raises(ValueError, match="outside the store's 6 rows"):
        region_feature_statistics(store, [6])
    with pytest.raises(ValueError, match="`max_images` must be None or an int >= 1"):
        region_feature_statistics(store, max_images=0)
    with pytest.raises(ValueError, match="`store` must be a RegionFeatureStore"):
        region_feature_statistics({"img0": None})


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


def test_new_configs_standardize_and_every_family_equals_the_unnormalised_model_on_standardised_features():
    mean, std = torch.linspace(100.0, 160.0, DV), torch.linspace(30.0, 70.0, DV)
    for model, plain in zip(family_models("standardize"), family_models("none")):
        assert model.config.visual_feature_normalization == "standardize"
        assert not any("feature_normalization" in key for key in plain.state_dict())
        inputs = model_inputs(model)
        # statistics not set: the identity, so the outputs are the unnormalised model's
        assert model.visual_feature_statistics()["num_regions"] == 0
        torch.testing.assert_close(first_output(model, inputs), first_output(plain, inputs), rtol=0, atol=0)
        model.set_visual_feature_statistics(mean, std, 100)
        standardised = {**inputs, "visual_feats": (inputs["visual_feats"] - mean) / std}
        torch.testing.assert_close(first_output(model, inputs), first_output(plain, standardised), rtol=1e-5, atol=1e-5)
        stats = model.visual_feature_statistics()
        assert torch.equal(stats["mean"], mean) and torch.equal(stats["std"], std) and stats["num_regions"] == 100


def test_standardisation_separates_regions_of_raw_pooled_colour_features():
    """The mechanism: raw 0..255 features share a large mean, so after the projection and LayerNorm every region is
    nearly the same vector; standardised, they are not (the cause of the image-use gap of 0, issue 18.7)."""
    torch.manual_seed(0)
    features = 130.0 + 40.0 * torch.randn(200, 192)
    features = features.clamp(0, 255)
    boxes = torch.tensor([[0.1, 0.1, 0.5, 0.5]]).repeat(200, 1)
    config = SingleStreamConfig(hidden_size=384, num_hidden_layers=1, num_attention_heads=12, intermediate_size=64, visual_feat_dim=192)
    model = SingleStreamForQuestionAnswering(config).eval()
    embeddings = model.single_stream.visual_embeddings

    def mean_cosine() -> float:
        with torch.no_grad():
            regions = torch.nn.functional.normalize(embeddings(features[None], boxes[None])[0, :-1], dim=-1)
        similarity = regions @ regions.T
        return float((similarity.sum() - len(regions)) / (len(regions) * (len(regions) - 1)))

    raw = mean_cosine()
    model.set_visual_feature_statistics(features.mean(0), features.std(0), 200)
    assert raw > 0.7 and mean_cosine() < 0.1, (raw, mean_cosine())


def test_statistics_are_saved_with_the_weights_and_none_configs_load_without_them(tmp_path):
    model = family_models("standardize")[0]
    model.set_visual_feature_statistics(torch.full((DV,), 120.0), torch.full((DV,), 50.0), 42)
    model.save_pretrained(tmp_path / "new")
    loaded = SingleStreamForQuestionAnswering.from_pretrained(tmp_path / "new").eval()
    assert loaded.visual_feature_statistics()["num_regions"] == 42
    inputs = model_inputs(model)
    torch.testing.assert_close(first_output(loaded, inputs), first_output(model, inputs), rtol=0, atol=0)

    # a "none" checkpoint: no statistics in its weights
    plain = family_models("none")[0]
    plain.save_pretrained(tmp_path / "none")
    assert SingleStreamConfig.from_pretrained(tmp_path / "none").visual_feature_normalization == "none"
    reloaded, info = SingleStreamForQuestionAnswering.from_pretrained(tmp_path / "none", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(first_output(reloaded.eval(), inputs), first_output(plain, inputs), rtol=0, atol=0)
    # a config built in code standardises
    assert SingleStreamConfig().visual_feature_normalization == TwoStreamConfig().visual_feature_normalization == "standardize"


@pytest.mark.slow
def test_remote_code_carries_the_statistics(tmp_path):
    model = family_models("standardize")[0]
    model.set_visual_feature_statistics(torch.linspace(100.0, 150.0, DV), torch.linspace(20.0, 60.0, DV), 9)
    save_with_remote_code(model, tmp_path / "remote")
    inputs = model_inputs(model)
    [(outputs, report)] = load_in_fresh_process([(tmp_path / "remote", "AutoModelForVisualQuestionAnswering", inputs)], tmp_path)
    assert (tmp_path / "remote" / "visual_features.py").is_file()  # the flat copy of the normaliser's module
    torch.testing.assert_close(outputs["logits"], first_output(model, inputs), rtol=1e-5, atol=1e-5)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="`visual_feature_normalization` must be one of"):
        SingleStreamConfig(visual_feature_normalization="batch")
    model, plain = family_models("standardize")[0], family_models("none")[0]
    with pytest.raises(ValueError, match=r"`mean` and `std` must have shape \(8,\)"):
        model.set_visual_feature_statistics(torch.zeros(3), torch.ones(3), 1)
    with pytest.raises(ValueError, match="`std` must be finite and > 0"):
        model.set_visual_feature_statistics(torch.zeros(DV), torch.zeros(DV), 1)
    with pytest.raises(ValueError, match="`num_regions`"):
        model.set_visual_feature_statistics(torch.zeros(DV), torch.ones(DV), 0)
    with pytest.raises(ValueError, match="visual_feature_normalization='standardize' to set statistics"):
        plain.set_visual_feature_statistics(torch.zeros(DV), torch.ones(DV), 1)


# ----------------------------------------------------------------------------------------------------------------
# Trainers
# ----------------------------------------------------------------------------------------------------------------


def test_trainer_fits_the_statistics_of_the_training_images_once(tmp_path):
    import datasets

    store = store_of(tmp_path)
    train = datasets.Dataset.from_dict(
        {"image_id": ["img0", "img2", "img3", "img0"], "question": ["what color?"] * 4, "label": [0, 1, 2, 1]}
    )
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    config = single_stream_config()
    config.vocab_size, config.num_qa_labels, config.attention_supervision = tokenizer.vocab_size, 3, "none"
    torch.manual_seed(0)
    model = SingleStreamForQuestionAnswering(config)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, report_to="none",
        save_strategy="no", remove_unused_columns=False, use_cpu=True,
    )  # fmt: skip
    collator = QuestionAnsweringCollator(tokenizer=tokenizer, region_features=store, num_answers=3)
    TaskTrainer(model=model, args=args, train_dataset=train, data_collator=collator).train()
    mean, std, count = region_feature_statistics(store, ["img0", "img2", "img3"])  # the training images only
    stats = model.visual_feature_statistics()
    assert stats["num_regions"] == count
    torch.testing.assert_close(stats["mean"], mean)
    torch.testing.assert_close(stats["std"], std)

    # statistics already set (a checkpoint, or the caller's) are kept
    model.set_visual_feature_statistics(torch.zeros(DV), torch.ones(DV), 1)
    TaskTrainer(model=model, args=args, train_dataset=train, data_collator=collator).train()
    assert model.visual_feature_statistics()["num_regions"] == 1
