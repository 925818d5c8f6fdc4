"""The family registry (`hf_vlalign.models.family`): every `FamilySpec` names real classes, registered with the Auto
classes it says; its probe shape is the shape of the attention the probe reads; its LoRA targets and head modules are
real module names; its mask keys are forward arguments; lookups by short name, model_type, config or model work and
anything else raises a clear ValueError; the tables that list the families are derived from the specs."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
import transformers
from test_captioning import regions
from test_captioning import tiny_config as captioning_config
from test_single_stream import tiny_batch as single_stream_batch
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_batch as two_stream_batch
from test_two_stream import tiny_config as two_stream_config
from torch import nn
from transformers import AutoConfig

import hf_vlalign
from hf_vlalign import cli
from hf_vlalign.hub.model_card import MODEL_CARD_FAMILIES, _find_template
from hf_vlalign.hub.remote_code import REMOTE_CODE_FAMILIES
from hf_vlalign.lora import HEAD_MODULES, LORA_TARGET_MODULES, MODEL_TYPE_TO_FAMILY
from hf_vlalign.models import auto as auto_module
from hf_vlalign.models.family import FAMILIES, LIBRARY_AUTO_CLASSES, FamilySpec, family_spec

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPOSITORY_ROOT / "src" / "hf_vlalign"

# tiny configs with distinct layer and head counts per stack, so that a wrong probe field shows
CONFIGS = {
    "single_stream": lambda **o: single_stream_config(num_hidden_layers=3, num_attention_heads=4, **o),
    "two_stream": lambda **o: two_stream_config(l_layers=1, r_layers=2, x_layers=3, num_attention_heads=2, **o),
    "captioner": lambda **o: captioning_config(
        encoder_layers=1, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=2, **o
    ),
}
# the output field holding the text->region attention the grounding probe reads (`analysis/adapters.py`)
PROBE_OUTPUTS = {
    "single_stream": "attentions",
    "two_stream": "cross_encoder_attentions",
    "captioner": "cross_attentions",
}
# config variants under which every optional module exists (the separate vision->language cross-attention, A2's gate)
FULL_CONFIGS = {"two_stream": {"share_cross_attention": False}, "captioner": {"attention_alignment": "gate"}}


def base_inputs(name: str) -> dict[str, torch.Tensor]:
    if name == "single_stream":
        return single_stream_batch()
    if name == "two_stream":
        return two_stream_batch()
    inputs = regions()
    batch = inputs["visual_feats"].shape[0]
    inputs["decoder_input_ids"] = torch.tensor([[1, 5, 6, 7, 8]] * batch)
    inputs["decoder_attention_mask"] = torch.ones(batch, 5, dtype=torch.long)
    return inputs


def spec_ids(spec: FamilySpec) -> str:
    return spec.name


SPECS = pytest.mark.parametrize("spec", list(FAMILIES.values()), ids=spec_ids)


def test_registry_is_keyed_by_short_name_in_family_order():
    assert list(FAMILIES) == ["single_stream", "two_stream", "captioner"]
    assert all(name == spec.name for name, spec in FAMILIES.items())
    assert len({spec.model_type for spec in FAMILIES.values()}) == len(FAMILIES)


@SPECS
def test_model_type_and_modules_match_the_config_and_model_classes(spec):
    config_class = spec.config_class_object()
    assert config_class is getattr(hf_vlalign, spec.config_class)
    assert config_class.model_type == spec.model_type
    assert config_class.__module__ == spec.config_module
    for kind, model in spec.models.items():
        model_class = spec.model_class_object(kind)
        assert model_class is getattr(hf_vlalign, model.class_name)
        assert model_class.__module__ == spec.modeling_module
        assert model_class.config_class is config_class
    assert spec.base_model.auto_classes == ("AutoModel",)


def test_every_model_class_of_the_library_is_in_exactly_one_spec():
    named = [model.class_name for spec in FAMILIES.values() for model in spec.models.values()]
    config_classes = {spec.config_class_object() for spec in FAMILIES.values()}
    library = {
        name
        for name in hf_vlalign.__all__
        if getattr(getattr(hf_vlalign, name), "config_class", None) in config_classes and "PreTrained" not in name
    }
    assert sorted(named) == sorted(library)


def test_library_auto_classes_are_the_ones_hf_vlalign_defines():
    defined = {
        name
        for name, value in vars(auto_module).items()
        if isinstance(value, type) and issubclass(value, transformers.models.auto.auto_factory._BaseAutoModelClass)
        and value.__module__ == auto_module.__name__
    }  # fmt: skip
    assert set(LIBRARY_AUTO_CLASSES) == defined
    assert not any(hasattr(transformers, name) for name in LIBRARY_AUTO_CLASSES)


@SPECS
def test_auto_classes_round_trip_every_model_class(spec, tmp_path):
    config = CONFIGS[spec.name]()
    config.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is spec.config_class_object()
    assert type(AutoConfig.for_model(spec.model_type)) is spec.config_class_object()
    for kind, model in spec.models.items():
        for auto_name in model.auto_classes:
            auto_class = getattr(auto_module if auto_name in LIBRARY_AUTO_CLASSES else transformers, auto_name)
            assert type(auto_class.from_config(config)) is spec.model_class_object(kind), (auto_name, kind)
        transformers_auto = model.transformers_auto_class
        assert transformers_auto is None or hasattr(transformers, transformers_auto)


@SPECS
@torch.no_grad()
def test_probe_shape_is_the_shape_of_the_attention_the_probe_reads(spec):
    config = CONFIGS[spec.name]()
    model = spec.model_class_object("base")(config).eval()
    forward = inspect.signature(model.forward).parameters
    inputs = {key: value for key, value in base_inputs(spec.name).items() if key in forward}
    maps = getattr(model(**inputs, output_attentions=True), PROBE_OUTPUTS[spec.name])
    layers, heads = spec.probe_shape(config)
    assert (len(maps), maps[0].shape[1]) == (layers, heads)
    assert spec.probe_shape(model) == (layers, heads)


@SPECS
def test_mask_keys_are_forward_arguments_of_every_model_class(spec):
    for kind in spec.models:
        forward = inspect.signature(spec.model_class_object(kind).forward).parameters
        assert {spec.text_mask_key, spec.region_mask_key} <= set(forward), kind


@SPECS
def test_config_fields_named_by_the_spec_exist(spec):
    config = spec.config_class_object()()
    fields = (spec.probe_layers_field, spec.probe_heads_field, *spec.layer_fields, *spec.card.settings)
    assert all(hasattr(config, name) for name in fields), [name for name in fields if not hasattr(config, name)]
    assert spec.attention_supervision == hasattr(config, "attention_supervision")


@SPECS
def test_lora_targets_and_head_modules_are_module_names_of_tiny_models(spec):
    config = CONFIGS[spec.name](**FULL_CONFIGS.get(spec.name, {}))
    linear_names = set()
    for kind, model_spec in spec.models.items():
        model = spec.model_class_object(kind)(config)
        names = {name for name, _ in model.named_modules()}
        for head in model_spec.head_modules:
            assert head in names, (model_spec.class_name, head)
        linear_names |= {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    for target in (*spec.lora_attention, *spec.lora_ffn):
        assert any(n == target or n.endswith(f".{target}") for n in linear_names), target


@SPECS
def test_card_template_exists(spec):
    assert _find_template(spec.card.template).is_file()
    assert spec.card.default_name.format(supervision="direct", alignment="", fusion="max")


@SPECS
def test_lookup_by_short_name_model_type_config_model_and_dict(spec):
    config = CONFIGS[spec.name]()
    assert family_spec(spec.name) is spec
    assert family_spec(spec.model_type) is spec
    assert family_spec(config) is spec
    assert family_spec(config.to_dict()) is spec
    assert family_spec(spec.model_class_object("base")(config)) is spec


@pytest.mark.parametrize("bad", ["captioning", "bert", "", None, 3, {"model_type": "single_stream"}, nn.Linear(2, 2)])
def test_unknown_family_raises_a_clear_value_error(bad):
    with pytest.raises(ValueError, match=r"^`family` must name an hf_vlalign model family") as error:
        family_spec(bad)
    assert all(spec.name in str(error.value) and spec.model_type in str(error.value) for spec in FAMILIES.values())
    with pytest.raises(ValueError, match=r"^`model` must name"):
        family_spec(bad, argument="model")


def test_unknown_model_kind_raises():
    with pytest.raises(
        ValueError, match=r"`kind` must be one of the captioner family's models \('base', 'captioning'\)"
    ):
        FAMILIES["captioner"].model("question_answering")


def test_derived_tables_read_the_specs():
    tasks = tuple(dict.fromkeys(task for spec in FAMILIES.values() for task in spec.tasks))
    assert cli.TASKS == tasks  # spelled out in the CLI so that `--help` imports nothing heavy
    assert MODEL_CARD_FAMILIES == tuple(FAMILIES)
    assert list(LORA_TARGET_MODULES) == list(FAMILIES) == list(REMOTE_CODE_FAMILIES)
    assert MODEL_TYPE_TO_FAMILY == {spec.model_type: spec.name for spec in FAMILIES.values()}
    assert set(HEAD_MODULES) == {model.class_name for spec in FAMILIES.values() for model in spec.models.values()}
    remote = REMOTE_CODE_FAMILIES["captioner"]
    assert remote.model_classes == {
        "RegionCaptionerModel": "AutoModel",
        "RegionCaptionerForConditionalGeneration": "AutoModelForSeq2SeqLM",
    }


@pytest.mark.parametrize(
    "path",
    [
        "models/family.py",
        "models/family_types.py",
        *(f"models/{p}/family.py" for p in ("single_stream", "two_stream", "captioning")),
    ],
)
def test_spec_modules_import_the_standard_library_and_the_family_types_only(path):
    # the specs name classes by strings, so reading them never imports torch or transformers by itself
    tree = ast.parse((PACKAGE_ROOT / path).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    allowed = {"__future__", "importlib", "collections.abc", "dataclasses", "types", "typing", "..family_types"}
    allowed |= {".family_types", ".captioning.family", ".single_stream.family", ".two_stream.family"}
    assert imported <= allowed, imported - allowed
