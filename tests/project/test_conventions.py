"""transformers / datasets conventions: the captioner is an `AutoModelForSeq2SeqLM`; the region-feature store of
`build_dataset` / `load_vgp_data` is `region_features=`; "validation" names every dataset's validation split; a saved
config.json carries the task fields of its own model class only (others at their default are left out, and a config
holding them loads the same)."""

from __future__ import annotations

import json

import pytest
import torch
from shared_samples import real_sample
from test_builders_text import _store
from test_captioning import regions
from test_captioning import tiny_config as captioning_config
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_config as two_stream_config
from transformers import AutoModelForSeq2SeqLM

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForPreTraining,
    SingleStreamForQuestionAnswering,
    SingleStreamForVisualParaphrase,
    TwoStreamConfig,
    TwoStreamForQuestionAnswering,
)
from hf_vlalign.data import VALIDATION_SPLITS, build_dataset, load_vgp_data, resolve_split
from hf_vlalign.data.builders import BUILDERS
from hf_vlalign.models.single_stream.configuration_single_stream import HEAD_FIELDS as SINGLE_STREAM_HEAD_FIELDS
from hf_vlalign.models.two_stream.configuration_two_stream import HEAD_FIELDS as TWO_STREAM_HEAD_FIELDS

# ----------------------------------------------------------------------------------------------------------------
# AutoModelForSeq2SeqLM
# ----------------------------------------------------------------------------------------------------------------


def test_auto_model_for_seq2seq_lm_loads_the_captioner_and_generates(tmp_path):
    torch.manual_seed(0)
    captioner = RegionCaptionerForConditionalGeneration(captioning_config()).eval()
    captioner.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is RegionCaptionerForConditionalGeneration
    inputs = regions()
    expected = captioner.generate(**inputs, max_new_tokens=5, num_beams=2)
    generated = loaded.generate(**inputs, max_new_tokens=5, num_beams=2)
    assert generated.shape[0] == 2 and torch.equal(generated, expected)


# ----------------------------------------------------------------------------------------------------------------
# region_features=
# ----------------------------------------------------------------------------------------------------------------


def test_region_features_is_the_store_argument(tmp_path):
    flickr = real_sample("flickr30k_entities")
    image_ids = (flickr / "val.txt").read_text().split()[:2]
    store = _store(tmp_path, {image_id: [[0, 0, 50, 50], [10, 10, 400, 300]] for image_id in image_ids})
    joined = build_dataset("flickr30k_entities", flickr, "val", region_features=store, max_images=2)
    assert joined["feature_row"] and "sentence_phrase_regions" in joined.column_names
    with pytest.raises(TypeError, match="features"):  # `features` is a dataset's column schema in `datasets`
        build_dataset("flickr30k_entities", flickr, "val", features=store, max_images=2)
    with pytest.raises(ValueError, match=r"Real VGP data needs all of .*'region_features'"):
        load_vgp_data(region_features=store.directory)


# ----------------------------------------------------------------------------------------------------------------
# split="validation" (each builder's test checks the rows equal those of its own split name)
# ----------------------------------------------------------------------------------------------------------------


def test_every_dataset_has_a_validation_split():
    assert set(VALIDATION_SPLITS) == set(BUILDERS)
    assert {name: resolve_split(name, "validation") for name in BUILDERS} == {
        **{name: "val" for name in BUILDERS}, "nlvr2": "dev"
    }  # fmt: skip
    assert resolve_split("nlvr2", "test1") == "test1" and resolve_split("gqa", "testdev") == "testdev"


# ----------------------------------------------------------------------------------------------------------------
# saved config.json: the model class's own task fields
# ----------------------------------------------------------------------------------------------------------------

OTHER_HEADS_OF_VGP = {
    "num_qa_labels", "referring_iou_threshold", "num_object_labels", "mlm_weight", "sentence_image_weight",
    "region_feature_weight", "region_class_weight",
}  # fmt: skip


def test_a_saved_vgp_config_carries_no_other_heads_fields(tmp_path):
    SingleStreamForVisualParaphrase(single_stream_config()).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not OTHER_HEADS_OF_VGP & set(saved)
    assert {"num_id_labels", "num_vgp_labels", "id_weight", "vgp_weight"} <= set(saved)
    assert {"hidden_size", "attention_supervision", "visual_feature_normalization"} <= set(saved)  # shared: kept
    # every other head loads from the folder with the defaults it would have read
    answers = SingleStreamForQuestionAnswering.from_pretrained(tmp_path)
    assert answers.config.num_qa_labels == SingleStreamConfig.num_qa_labels == answers.answer_head.classifier.out_features
    pretraining = SingleStreamForPreTraining.from_pretrained(tmp_path)
    assert pretraining.config.mlm_weight == 1.0 and pretraining.config.num_object_labels == 0


def test_other_heads_fields_are_kept_when_set_and_configs_holding_them_load(tmp_path):
    config = single_stream_config(num_qa_labels=17, mlm_weight=0.5)
    SingleStreamForVisualParaphrase(config).save_pretrained(tmp_path / "set")
    saved = json.loads((tmp_path / "set" / "config.json").read_text())
    assert (saved["num_qa_labels"], saved["mlm_weight"]) == (17, 0.5)  # not the default: nothing is lost
    assert not {"num_object_labels", "referring_iou_threshold"} & set(saved)

    # a config.json holding every field of every head, at its default
    every_field = {**saved, **{name: getattr(SingleStreamConfig, name) for name in OTHER_HEADS_OF_VGP}}
    (tmp_path / "set" / "config.json").write_text(json.dumps(every_field))
    reloaded = SingleStreamForVisualParaphrase.from_pretrained(tmp_path / "set")
    assert reloaded.config.num_qa_labels == SingleStreamConfig.num_qa_labels
    assert reloaded.config.to_dict()["num_vgp_labels"] == config.num_vgp_labels

    # a config saved on its own names no model class: it keeps every field
    single_stream_config().save_pretrained(tmp_path / "config_only")
    assert OTHER_HEADS_OF_VGP <= set(json.loads((tmp_path / "config_only" / "config.json").read_text()))


def test_a_saved_two_stream_answer_config_carries_no_pretraining_switches(tmp_path):
    config = two_stream_config(num_object_labels=TwoStreamConfig.num_object_labels, task_alignment=False,
                               alignment_top_k=TwoStreamConfig.alignment_top_k, num_attr_labels=TwoStreamConfig.num_attr_labels)  # fmt: skip
    TwoStreamForQuestionAnswering(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["num_qa_labels"] == 7
    assert not {"task_mask_lm", "task_qa", "task_alignment", "num_object_labels", "alignment_top_k", "itm_weight",
                "referring_iou_threshold"} & set(saved)  # fmt: skip


def test_head_fields_cover_every_model_class_and_name_real_fields():
    for config_class, head_fields in ((SingleStreamConfig, SINGLE_STREAM_HEAD_FIELDS), (TwoStreamConfig, TWO_STREAM_HEAD_FIELDS)):
        model_classes = {
            name for name in hf_vlalign.__all__
            if getattr(getattr(hf_vlalign, name), "config_class", None) is config_class and "PreTrained" not in name
        }  # fmt: skip
        assert set(head_fields) == model_classes
        assert all(name in config_class.__dataclass_fields__ for fields in head_fields.values() for name in fields)
