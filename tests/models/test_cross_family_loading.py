"""A checkpoint is loaded only into a model it fits: each family's model classes refuse a folder of another model
type (another family, a text checkpoint) with `CheckpointMismatchError` naming the class, both model types and the
folder, instead of returning a model whose weights are all random; a `config.json` building fewer layers than the
weights hold is refused naming both counts, instead of dropping the extra layers."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_captioning import tiny_config as captioning_config
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_config as two_stream_config
from transformers import AutoModel, BertConfig, BertModel

from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    RegionCaptionerModel,
    SingleStreamForQuestionAnswering,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamModel,
)
from hf_vlalign.models.saving import CheckpointMismatchError

FAMILIES = {
    "vlalign_single_stream": lambda: SingleStreamForVisualParaphrase(single_stream_config()),
    "vlalign_two_stream": lambda: TwoStreamForPreTraining(two_stream_config()),
    "vlalign_captioner": lambda: RegionCaptionerForConditionalGeneration(captioning_config()),
}
# a model class of each family asked to load the folder of another family
CROSS_FAMILY = [
    (SingleStreamModel, "vlalign_two_stream"),
    (TwoStreamForQuestionAnswering, "vlalign_captioner"),
    (RegionCaptionerForConditionalGeneration, "vlalign_single_stream"),
]


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory) -> dict:
    folders = {}
    for model_type, build in FAMILIES.items():
        torch.manual_seed(0)
        folders[model_type] = tmp_path_factory.mktemp(model_type)
        build().save_pretrained(folders[model_type])
    return folders


@pytest.mark.parametrize(
    ("model_class", "model_type"), CROSS_FAMILY, ids=[f"{c.__name__}-{t}" for c, t in CROSS_FAMILY]
)
def test_another_familys_folder_is_refused_naming_both_model_types(model_class, model_type, family_folders):
    folder = family_folders[model_type]
    with pytest.raises(CheckpointMismatchError) as raised:
        model_class.from_pretrained(folder)
    message = str(raised.value)
    assert f"{model_class.__name__} expects a checkpoint of model_type {model_class.config_class.model_type!r}" in message
    assert f"the config.json of {folder} has model_type {model_type!r}" in message
    assert "its weights would not be loaded" in message
    assert isinstance(raised.value, ValueError)  # bad input, like every other of the library


def test_the_own_familys_folders_still_load(family_folders):
    single = SingleStreamForQuestionAnswering.from_pretrained(family_folders["vlalign_single_stream"])
    two = TwoStreamForQuestionAnswering.from_pretrained(family_folders["vlalign_two_stream"])
    captioner = RegionCaptionerModel.from_pretrained(family_folders["vlalign_captioner"])
    assert (type(single), type(two), type(captioner)) == (
        SingleStreamForQuestionAnswering, TwoStreamForQuestionAnswering, RegionCaptionerModel
    )  # fmt: skip
    assert type(AutoModel.from_pretrained(family_folders["vlalign_two_stream"])) is TwoStreamModel


def test_a_text_checkpoint_is_refused_with_the_way_to_start_from_it(tmp_path):
    BertModel(BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=4)).save_pretrained(
        tmp_path
    )
    with pytest.raises(CheckpointMismatchError, match=r"has model_type 'bert'.*SingleStreamModel\.from_text_pretrained"):
        SingleStreamModel.from_pretrained(tmp_path)


def test_an_explicit_config_on_another_familys_weights_is_refused(family_folders):
    folder = family_folders["vlalign_single_stream"]
    with pytest.raises(CheckpointMismatchError, match=r"none of its \d+ weight\(s\) .* is a weight of the model"):
        TwoStreamForQuestionAnswering.from_pretrained(folder, config=two_stream_config())


# (family, the config field lowered in config.json, the layer list it sizes, the base model class)
LAYER_CASES = [
    ("vlalign_single_stream", "num_hidden_layers", "single_stream.encoder.layer", SingleStreamModel),
    ("vlalign_two_stream", "x_layers", "two_stream.encoder.cross_layers", TwoStreamModel),
    ("vlalign_captioner", "decoder_layers", "model.decoder.layers", RegionCaptionerModel),
]


@pytest.mark.parametrize(("model_type", "field", "layers", "base_class"), LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_a_config_with_fewer_layers_than_the_weights_is_refused(
    model_type, field, layers, base_class, family_folders, tmp_path
):
    folder = tmp_path / "fewer_layers"
    shutil.copytree(family_folders[model_type], folder)
    config = json.loads((folder / "config.json").read_text())
    saved = config[field]
    config[field] = saved - 1
    (folder / "config.json").write_text(json.dumps(config))
    head_class = type(FAMILIES[model_type]())
    expected = rf"{layers}: the config builds {saved - 1} layer\(s\) \(`{field}`={saved - 1}\), the checkpoint holds {saved}"
    with pytest.raises(CheckpointMismatchError, match=expected):
        head_class.from_pretrained(folder)
    # the base model reads the head checkpoint's layers under its own names
    base_layers = layers.split(".", 1)[1]
    with pytest.raises(CheckpointMismatchError, match=rf"{base_layers}: the config builds {saved - 1} layer"):
        base_class.from_pretrained(folder)
    # an override lowering the count is refused the same way
    with pytest.raises(CheckpointMismatchError, match=rf"the checkpoint holds {saved}"):
        head_class.from_pretrained(family_folders[model_type], **{field: saved - 1})

