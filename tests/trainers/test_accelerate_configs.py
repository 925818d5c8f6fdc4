"""The accelerate configs shipped in examples/accelerate_configs parse with accelerate's own loader, and the FSDP
wrap classes they name are the models' transformer layers (`_no_split_modules`), the library's own and those of the
patch VLMs' language models and vision towers."""

import re
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig
from accelerate.utils import DistributedType
from transformers import CLIPVisionModel, GemmaForCausalLM, LlamaForCausalLM, SiglipVisionModel

from hf_vlalign import RegionCaptionerForConditionalGeneration, SingleStreamModel, TwoStreamModel

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "accelerate_configs"
EXPECTED = {
    "ddp.yaml": DistributedType.MULTI_GPU,
    "fsdp.yaml": DistributedType.FSDP,
    "deepspeed_zero2.yaml": DistributedType.DEEPSPEED,
    "fsdp_patch_vlm.yaml": DistributedType.FSDP,
    "deepspeed_zero3.yaml": DistributedType.DEEPSPEED,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_parses_with_accelerate(name):
    config = ClusterConfig.from_yaml_file(CONFIGS / name)
    assert config.distributed_type == EXPECTED[name]
    assert config.num_processes >= 2 and config.num_machines == 1


def test_single_process_config_is_what_a_launch_without_config_runs():
    # one process on the machine's device, no mixed precision, not forced onto the CPU (a forced CPU launch sets the
    # thread count and warns about it); tests/conftest.py launches the VGP example with it and finds no notice
    config = ClusterConfig.from_yaml_file(CONFIGS / "single_process.yaml")
    assert config.distributed_type == DistributedType.NO and (config.num_processes, config.num_machines) == (1, 1)
    assert config.mixed_precision == "no" and config.use_cpu is False


def test_single_gpu_lora_config_is_one_bf16_process_on_the_gpu():
    # the 7 B recipe's one-GPU config (docs/scaling.md)
    config = ClusterConfig.from_yaml_file(CONFIGS / "single_gpu_lora.yaml")
    assert config.distributed_type == DistributedType.NO and (config.num_processes, config.num_machines) == (1, 1)
    assert config.mixed_precision == "bf16" and config.use_cpu is False and config.gpu_ids == "0"


def test_every_shipped_config_is_checked():
    shipped = [*EXPECTED, "single_process.yaml", "single_gpu_lora.yaml"]
    assert sorted(path.name for path in CONFIGS.glob("*.yaml")) == sorted(shipped)


def test_fsdp_wrap_classes_are_the_models_layers():
    text = (CONFIGS / "fsdp.yaml").read_text()
    config = ClusterConfig.from_yaml_file(CONFIGS / "fsdp.yaml")
    layers = {cls: set(cls._no_split_modules) for cls in (SingleStreamModel, TwoStreamModel, RegionCaptionerForConditionalGeneration)}
    assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] in layers[SingleStreamModel]
    # the comment's per-family lists name real layer classes of each family
    for family_line, cls in (("single-stream", SingleStreamModel), ("two-stream", TwoStreamModel), ("captioner", RegionCaptionerForConditionalGeneration)):
        named = re.search(rf"{family_line} ([A-Za-z,]+)", text).group(1).split(",")
        assert set(named) <= layers[cls], (family_line, named, layers[cls])


def test_patch_vlm_configs_shard_the_language_model_and_the_vision_tower():
    text = (CONFIGS / "fsdp_patch_vlm.yaml").read_text()
    fsdp = ClusterConfig.from_yaml_file(CONFIGS / "fsdp_patch_vlm.yaml").fsdp_config
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_activation_checkpointing"] is True
    assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    # per family: a decoder layer of the language model and an encoder layer of the vision tower (accelerate refuses
    # a class the model lacks, so the configured list is LLaVA's alone)
    towers = {"llava": (LlamaForCausalLM, CLIPVisionModel), "paligemma": (GemmaForCausalLM, SiglipVisionModel)}
    for family, (language_model, vision_tower) in towers.items():
        named = re.search(rf"{family} ([A-Za-z,]+)", text).group(1).split(",")
        assert len(named) == 2 and named[0] in language_model._no_split_modules, (family, named)
        assert named[1] in vision_tower._no_split_modules and named[1].endswith("EncoderLayer"), (family, named)
        if family == "llava":
            assert fsdp["fsdp_transformer_layer_cls_to_wrap"].split(",") == named
    zero3 = ClusterConfig.from_yaml_file(CONFIGS / "deepspeed_zero3.yaml").deepspeed_config
    assert zero3["zero_stage"] == 3 and zero3["zero3_save_16bit_model"] is True  # the adapter is saved from it
