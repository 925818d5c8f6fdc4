"""LoRA on transformers' patch models (`hf_vlalign.lora.lora_config` of a tiny LLaVA / PaliGemma / ViLT): adapters on
the language model's layers only (never the vision tower or the projector, whose projections bear the same names), a
`PatchSupervisionTrainer` run with direct supervision and activation checkpointing moves only the adapter, the adapter
saves and reloads to the same outputs, and the grounding probe reads the peft-wrapped model."""

import pytest
import torch
from peft import PeftModel, get_peft_model
from test_patch_models import EXAMPLES

from hf_vlalign.lora import lora_config
from hf_vlalign.trainers.patch_supervision import PatchSupervisionTrainer, PatchSupervisionTrainingArguments
from hf_vlalign.vlms import PatchGroundingCollator, probe_patch_model
from hf_vlalign.vlms.families import model_inputs
from hf_vlalign.vlms.tiny import tiny_patch_model

LAYERS = (0, 1)
# family -> preset -> the adapted modules of a 2-layer tiny model, written out
DECODER_ATTENTION = [f"model.language_model.layers.{i}.self_attn.{p}_proj" for i in LAYERS for p in "qkvo"]
DECODER_MLP = [f"model.language_model.layers.{i}.mlp.{p}_proj" for i in LAYERS for p in ("gate", "up", "down")]
VILT_ATTENTION = [f"encoder.layer.{i}.attention.{p}" for i in LAYERS
                  for p in ("attention.query", "attention.key", "attention.value", "output.dense")]  # fmt: skip
VILT_FFN = [f"encoder.layer.{i}.{p}.dense" for i in LAYERS for p in ("intermediate", "output")]
ADAPTED = {
    "llava": {"attention": DECODER_ATTENTION, "attention_ffn": DECODER_ATTENTION + DECODER_MLP},
    "paligemma": {"attention": DECODER_ATTENTION, "attention_ffn": DECODER_ATTENTION + DECODER_MLP},
    "vilt": {"attention": VILT_ATTENTION, "attention_ffn": VILT_ATTENTION + VILT_FFN},
}


def adapted_modules(model: PeftModel) -> set[str]:
    return {
        name.removeprefix("base_model.model.").removesuffix(".base_layer")
        for name, _ in model.named_modules()
        if name.endswith(".base_layer")
    }


@pytest.mark.parametrize("family", list(ADAPTED))
@pytest.mark.parametrize("preset", ["attention", "attention_ffn"])
def test_patch_presets_adapt_the_language_model_layers_only(family, preset):
    model, _ = tiny_patch_model(family, num_layers=len(LAYERS))
    config = lora_config(model, preset=preset)
    assert config.modules_to_save is None
    adapted = adapted_modules(get_peft_model(model, config))
    assert adapted == set(ADAPTED[family][preset])
    assert not any(part in name for name in adapted for part in ("vision_tower", "projector", "lm_head", "pooler"))


def test_patch_preset_errors_name_the_argument():
    model, _ = tiny_patch_model("vilt", num_layers=1)
    with pytest.raises(ValueError, match=r"`preset` must be one of \['attention', 'attention_ffn'\], got 'all'"):
        lora_config(model, preset="all")


@pytest.mark.parametrize("family", ["llava", "vilt"])
def test_supervised_lora_training_moves_only_the_adapter_and_reloads(family, tmp_path):
    model, processor = tiny_patch_model(family, seed=0)
    collator = PatchGroundingCollator(processor, model.config)
    model = get_peft_model(model, lora_config(model, r=4, alpha=8))
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    args = PatchSupervisionTrainingArguments(
        output_dir=str(tmp_path / "run"), attention_supervision="direct", supervised_layers=[1], max_steps=2,
        per_device_train_batch_size=2, learning_rate=1e-2, activation_checkpointing=True, report_to=[],
        save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = PatchSupervisionTrainer(model=model, args=args, train_dataset=EXAMPLES, data_collator=collator)
    trainer.train()
    assert model.is_activation_checkpointing
    assert all(log["loss_attention"] > 0 for log in trainer.state.log_history if "loss_attention" in log)

    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)
    changed = {name for name, parameter in model.named_parameters() if not torch.equal(parameter, before[name])}
    assert changed <= trainable, f"frozen weights changed: {sorted(changed - trainable)}"
    assert any(".lora_A." in name for name in changed) and any(".lora_B." in name for name in changed)

    batch = collator(EXAMPLES)
    model.eval()
    torch.manual_seed(0)  # ViLT samples its patch order each forward
    with torch.no_grad():
        trained = model(**model_inputs(batch))
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = PeftModel.from_pretrained(tiny_patch_model(family, seed=0)[0], tmp_path / "adapter").eval()
    torch.manual_seed(0)
    with torch.no_grad():
        output = reloaded(**model_inputs(batch))
    name = "logits" if family == "llava" else "last_hidden_state"
    torch.testing.assert_close(output[name], trained[name], atol=1e-6, rtol=1e-6)

    if family == "llava":  # the probe reads the wrapped model with its adapter, as the merged model
        probed = probe_patch_model(model, [batch])
        merged = probe_patch_model(reloaded.merge_and_unload(), [batch])
        assert probed.num_phrases == merged.num_phrases == 3
        torch.testing.assert_close(torch.as_tensor(probed.accuracy), torch.as_tensor(merged.accuracy))


def test_supervision_refuses_reentrant_checkpointing(tmp_path):
    # a reentrant checkpoint records the supervised layers' query / key without autograd: the loss would not train
    with pytest.raises(ValueError, match=r"`activation_checkpointing_kwargs` must not set `use_reentrant: True`"):
        PatchSupervisionTrainingArguments(
            output_dir=str(tmp_path), attention_supervision="direct", activation_checkpointing=True,
            activation_checkpointing_kwargs={"use_reentrant": True}, report_to=[],
        )  # fmt: skip
    PatchSupervisionTrainingArguments(
        output_dir=str(tmp_path), activation_checkpointing=True,
        activation_checkpointing_kwargs={"use_reentrant": True}, report_to=[],
    )  # fmt: skip
