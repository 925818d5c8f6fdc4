"""Config refusals, one per kind: huggingface_hub's strict dataclasses check each field's type, the class validators
its range; both raise `ConfigFieldError` (a one-line `ValueError`), named with the `config.json` when read from a
folder. An unknown key one typo away from a field is warned about, naming the field meant."""

from __future__ import annotations

import json
import logging

import pytest
from transformers import AutoConfig, AutoModel

import hf_vlalign
from hf_vlalign import SingleStreamConfig, TwoStreamConfig
from hf_vlalign.models.captioning import RegionCaptionerConfig
from hf_vlalign.models.config_fields import ConfigFieldError

FAMILIES = {
    "single_stream": SingleStreamConfig,
    "two_stream": TwoStreamConfig,
    "captioning": RegionCaptionerConfig,
}
TINY = {
    "single_stream": ("SingleStreamModel", dict(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=16, max_position_embeddings=16, visual_feat_dim=6)),
    "two_stream": ("TwoStreamModel", dict(vocab_size=40, hidden_size=8, num_attention_heads=2, intermediate_size=16,
                                          max_position_embeddings=16, l_layers=1, r_layers=1, x_layers=1, visual_feat_dim=6,
                                          num_object_labels=3, num_attr_labels=3, num_qa_labels=3)),
    "captioning": ("RegionCaptionerModel", dict(vocab_size=40, d_model=8, encoder_layers=1, decoder_layers=1,
                                                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                                decoder_ffn_dim=16, visual_feat_dim=6, max_position_embeddings=16,
                                                geometry_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                decoder_start_token_id=1)),
}  # fmt: skip


def test_wrong_type_is_refused_naming_the_field_what_it_takes_and_what_came():
    with pytest.raises(ConfigFieldError, match=r"^SingleStreamConfig: Field 'vocab_size' expected int, got str \(value: '3'\)\.$"):
        SingleStreamConfig(vocab_size="3")
    # a float for an int is refused, not truncated; a bool is not an int
    with pytest.raises(ConfigFieldError, match=r"Field 'num_id_labels' expected int, got float \(value: 2.0\)"):
        SingleStreamConfig(num_id_labels=2.0)
    with pytest.raises(ConfigFieldError, match=r"Field 'use_geometry' expected bool, got int"):
        RegionCaptionerConfig(use_geometry=1)
    # list items are checked
    with pytest.raises(ConfigFieldError, match=r"Invalid item at index 1 in list 'supervised_layers'"):
        TwoStreamConfig(supervised_layers=[0, "1"])


@pytest.mark.parametrize("family", FAMILIES)
def test_assignment_after_construction_is_type_checked(family):
    config = FAMILIES[family]()
    with pytest.raises(ConfigFieldError, match=r"Field 'vocab_size' expected int, got str"):
        config.vocab_size = "100"
    # a generic name of the attribute map is checked as the field it stands for
    with pytest.raises(ConfigFieldError, match=r"Field '(num_hidden_layers|x_layers|decoder_layers)' expected int"):
        config.num_hidden_layers = 2.0


@pytest.mark.parametrize(
    "family, field, value, match",
    [
        ("single_stream", "hidden_size", 30, r"`hidden_size` \(30\) must be a multiple of `num_attention_heads` \(12\)"),
        ("two_stream", "alignment_top_k", 0, r"`alignment_top_k` must be >= 1, got 0"),
        ("captioning", "geometry_dim", 12, r"`geometry_dim` must be a positive multiple of 8, got 12"),
    ],
)
def test_out_of_range_value_is_refused_by_name(family, field, value, match):
    with pytest.raises(ConfigFieldError, match=match):
        FAMILIES[family](**{field: value})


def test_a_bad_dtype_name_is_named():
    for name in ("dtype", "torch_dtype"):
        with pytest.raises(ConfigFieldError, match=rf"`{name}` of .* must be a torch dtype name such as 'float32', got 'float99'"):
            SingleStreamConfig(**{name: "float99"})


@pytest.mark.parametrize(
    "family, typo, field",
    [
        ("single_stream", "attention_supervison", "attention_supervision"),
        ("two_stream", "alignment_weigth", "alignment_weight"),
        ("captioning", "aligned_layer", "aligned_layers"),
    ],
)
def test_key_one_typo_away_from_a_field_is_warned_about(family, typo, field, tmp_path, caplog):
    config_class = FAMILIES[family]
    expected = f"{config_class.__name__} got the unknown key '{typo}', which no model reads (it is only stored): did you mean '{field}'?"
    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        config = config_class(**{typo: [0]})
    assert caplog.messages == [expected]
    assert getattr(config, typo) == [0]  # stored all the same
    caplog.clear()
    (tmp_path / "config.json").write_text(json.dumps({typo: [0]}))
    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        config_class.from_pretrained(tmp_path)
    assert expected in caplog.messages


def test_unknown_keys_far_from_every_field_are_kept_without_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        config = TwoStreamConfig(experiment_note="run 3", dataset_name="coco")
    assert config.experiment_note == "run 3" and "did you mean" not in caplog.text


@pytest.mark.parametrize("family", FAMILIES)
def test_right_types_are_accepted_and_round_trip_without_warnings(family, tmp_path, caplog):
    config_class = FAMILIES[family]
    config = config_class(dtype="float32", id2label={0: "no", 1: "yes"}, output_hidden_states=True, hidden_dropout_prob=0)
    config.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = config_class.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert "did you mean" not in caplog.text  # a saved config's own keys are never taken for typos


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_model_with_a_field_of_the_wrong_type_names_the_field_and_file(family, tmp_path):
    model_name, kwargs = TINY[family]
    model_class = getattr(hf_vlalign, model_name)
    model_class(FAMILIES[family](**kwargs)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vocab_size"] = "40"
    (tmp_path / "config.json").write_text(json.dumps(config))
    match = rf"^{tmp_path / 'config.json'}: {FAMILIES[family].__name__}: Field 'vocab_size' expected int, got str \(value: '40'\)\.$"
    for load in (model_class.from_pretrained, AutoModel.from_pretrained, AutoConfig.from_pretrained):
        with pytest.raises(ConfigFieldError, match=match):
            load(tmp_path)


def test_out_of_range_value_in_config_json_names_the_file(tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"hidden_size": 30}))
    with pytest.raises(ConfigFieldError, match=rf"^{tmp_path / 'settings.json'}: `hidden_size` \(30\) must be a multiple"):
        SingleStreamConfig.from_json_file(tmp_path / "settings.json")


def test_config_json_that_is_not_an_object_is_named(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    match = rf"{tmp_path / 'config.json'}: a config.json must hold a JSON object of fields .*, got a JSON list"
    with pytest.raises(ConfigFieldError, match=match):
        RegionCaptionerConfig.from_pretrained(tmp_path)
    with pytest.raises(ConfigFieldError, match=match):
        RegionCaptionerConfig.from_json_file(tmp_path / "config.json")


def test_a_transformers_base_field_of_the_wrong_type_in_config_json_names_the_field_and_file(tmp_path):
    # `PreTrainedConfig`'s own fields are annotated as strings, which `@strict` does not check
    model_name, kwargs = TINY["single_stream"]
    getattr(hf_vlalign, model_name)(SingleStreamConfig(**kwargs)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "id2label": ["no", "yes"]}))
    match = rf"^{tmp_path / 'config.json'}: SingleStreamConfig: Field 'id2label' with value \['no', 'yes'\] doesn't match"
    with pytest.raises(ConfigFieldError, match=match):
        AutoModel.from_pretrained(tmp_path)
