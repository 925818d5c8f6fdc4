"""Config fields of the wrong type (issue 32): every field of every family's config, given a value of another type
(a string, null, a float or a bool where an int is expected, a non-list or a list of the wrong items), raises
`ConfigFieldError` (a `ValueError`) naming the field, from the constructor and from a `config.json` alike; a
`config.json` that is not a JSON object is named; an unknown key one typo away from a field is warned about in every
family."""

from __future__ import annotations

import json
import logging
import re
import typing

import pytest
from transformers import AutoConfig, AutoModel

import hf_vlalign
from hf_vlalign import SingleStreamConfig, TwoStreamConfig
from hf_vlalign.models.captioning import RegionCaptionerConfig
from hf_vlalign.models.config_fields import ConfigFieldError, field_types

FAMILIES = {
    "single_stream": SingleStreamConfig,
    "two_stream": TwoStreamConfig,
    "captioning": RegionCaptionerConfig,
}


def wrong_values(expected) -> list:
    """Values of other types than `expected` (None only where the field is not optional)."""
    args = set(typing.get_args(expected)) or {expected}
    optional = type(None) in args
    kinds = {typing.get_origin(arg) or arg for arg in args} - {type(None)}
    values = [] if optional else [None]
    if kinds == {int}:
        values += ["3", 2.5, 2.0, True, [1]]
    elif kinds == {float, int}:
        values += ["0.1", True, [0.1]]
    elif kinds == {float}:
        values += ["0.1", True, [0.1]]
    elif kinds == {bool}:
        values += ["yes", 1, 0.0]
    elif kinds == {str}:
        values += [3, True, ["gelu"]]
    elif kinds == {list}:
        item = typing.get_args(next(arg for arg in args if typing.get_origin(arg) is list))[0]
        values += ["0,1", 3, [0, "1"]] if item is int else ["name", [1, 2]]
        values += [[0.0], [True]] if item is int else []
    elif kinds == {dict}:
        values += [["LABEL_0"], "LABEL_0"]
    elif kinds == {typing.Literal}:
        values += [3, ["regression"]]
    else:  # dtype: a torch dtype or its name
        values += [3, ["float32"]]
    return values


def type_cases() -> list:
    return [
        (family, name, value)
        for family, config_class in FAMILIES.items()
        for name, expected in field_types(config_class).items()
        for value in wrong_values(expected)
    ]


TYPE_CASES = type_cases()


@pytest.mark.parametrize("family, name, value", TYPE_CASES, ids=[f"{f}-{n}={v!r}" for f, n, v in TYPE_CASES])
def test_wrong_type_is_refused_naming_the_field(family, name, value, tmp_path):
    config_class = FAMILIES[family]
    with pytest.raises(ConfigFieldError, match=rf"`{name}` of {config_class.__name__} must be .*, got ") as caught:
        config_class(**{name: value})
    assert isinstance(caught.value, ValueError) and caught.value.field == name
    # the same value in a saved config.json is named with the file
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"model_type": config_class.model_type, name: value}))
    with pytest.raises(ConfigFieldError, match=rf"{config_file}: `{name}` of {config_class.__name__} must be "):
        config_class.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_from_json_file_names_the_file(family, tmp_path):
    config_class = FAMILIES[family]
    config_file = tmp_path / "settings.json"
    name = "aligned_layers" if family == "captioning" else "supervised_layers"
    config_file.write_text(json.dumps({name: [0, "1"]}))
    match = rf"{config_file}: `{name}` of {config_class.__name__} must be None or a list of ints, got list "
    with pytest.raises(ConfigFieldError, match=match + r"\[0, '1'\] \(item 1 is str '1'\)"):
        config_class.from_json_file(config_file)


def test_every_family_field_is_in_the_matrix():
    # at least the int, float, bool, str and list fields of each family and transformers' own ones are covered
    for family, config_class in FAMILIES.items():
        covered = {name for f, name, _ in TYPE_CASES if f == family}
        assert covered == set(field_types(config_class)), family
        assert {"vocab_size", "layer_norm_eps", "tie_word_embeddings", "output_hidden_states", "id2label"} <= covered


@pytest.mark.parametrize("family", FAMILIES)
def test_assignment_after_construction_is_checked(family):
    config = FAMILIES[family]()
    with pytest.raises(ConfigFieldError, match=r"`vocab_size` of .* must be an int, got str '100'"):
        config.vocab_size = "100"
    with pytest.raises(ConfigFieldError, match=r"`num_hidden_layers`|`x_layers`|`decoder_layers`"):
        config.num_hidden_layers = 2.0  # a generic name of the attribute map names the field it stands for


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("content, kind", [("[1, 2]", "list"), ('"hidden_size"', "string"), ("3", "number"),
                                           ("null", "null"), ("true", "boolean")])  # fmt: skip
def test_config_json_that_is_not_an_object_is_named(family, content, kind, tmp_path):
    config_class = FAMILIES[family]
    (tmp_path / "config.json").write_text(content)
    match = rf"{tmp_path / 'config.json'}: a config.json must hold a JSON object of fields .*, got a JSON {kind}"
    with pytest.raises(ConfigFieldError, match=match):
        config_class.from_pretrained(tmp_path)
    with pytest.raises(ConfigFieldError, match=match):
        config_class.from_json_file(tmp_path / "config.json")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bad_dtype_name_is_named(family):
    for name in ("dtype", "torch_dtype"):
        with pytest.raises(ConfigFieldError, match=rf"`{name}` of .* must be a torch dtype name such as 'float32', got str 'float99'"):
            FAMILIES[family](**{name: "float99"})


@pytest.mark.parametrize("family", FAMILIES)
def test_right_types_are_accepted_and_round_trip(family, tmp_path, caplog):
    config_class = FAMILIES[family]
    config = config_class(dtype="float32", id2label={0: "no", 1: "yes"}, output_hidden_states=True)
    config.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = config_class.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert "did you mean" not in caplog.text  # a saved config's own keys are never taken for typos


# ----------------------------------------------------------------------------------------------------------------
# Typos of fields
# ----------------------------------------------------------------------------------------------------------------

TYPOS = {
    "single_stream": {"attention_supervison": "attention_supervision", "supervised_layer": "supervised_layers",
                      "attention_supervision_wieght": "attention_supervision_weight", "supervised_haeds": "supervised_heads",
                      "vgp_wieght": "vgp_weight"},
    "two_stream": {"alignment_weigth": "alignment_weight", "attention_supervison": "attention_supervision",
                   "task_alignmnet": "task_alignment", "supervised_heads_": "supervised_heads",
                   "alignment_top_kk": "alignment_top_k"},
    "captioning": {"attention_alignmnet": "attention_alignment", "aligned_layer": "aligned_layers",
                   "mask_weigth": "mask_weight", "alignment_temprature": "alignment_temperature",
                   "alignment_mask_input_": "alignment_mask_input"},
}  # fmt: skip
TYPO_CASES = [(family, typo, field) for family, typos in TYPOS.items() for typo, field in typos.items()]


@pytest.mark.parametrize("family, typo, field", TYPO_CASES, ids=[f"{c[0]}-{c[1]}" for c in TYPO_CASES])
def test_key_one_typo_away_from_a_field_is_warned_about(family, typo, field, tmp_path, caplog):
    config_class = FAMILIES[family]
    value = [0] if field.endswith(("layers", "heads")) else 0.5
    expected = rf"{config_class.__name__} got the unknown key '{typo}', which no model reads .*did you mean '{field}'\?"
    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        config_class(**{typo: value})
    assert len(caplog.records) == 1
    assert re.search(expected, caplog.text)
    caplog.clear()
    (tmp_path / "config.json").write_text(json.dumps({typo: value}))
    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        config_class.from_pretrained(tmp_path)
    assert re.search(expected, caplog.text)


@pytest.mark.parametrize("family", FAMILIES)
def test_unknown_keys_far_from_every_field_are_kept_without_warning(family, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_vlalign"):
        config = FAMILIES[family](experiment_note="run 3", dataset_name="coco")
    assert config.experiment_note == "run 3" and "did you mean" not in caplog.text


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


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_model_with_a_field_of_the_wrong_type_names_the_field_and_file(family, tmp_path):
    model_name, kwargs = TINY[family]
    model_class = getattr(hf_vlalign, model_name)
    model_class(FAMILIES[family](**kwargs)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vocab_size"] = "40"
    (tmp_path / "config.json").write_text(json.dumps(config))
    match = rf"{tmp_path / 'config.json'}: `vocab_size` of {FAMILIES[family].__name__} must be an int, got str '40'"
    for load in (model_class.from_pretrained, AutoModel.from_pretrained, AutoConfig.from_pretrained):
        with pytest.raises(ConfigFieldError, match=match):
            load(tmp_path)
