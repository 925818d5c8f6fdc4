"""PEFT on every model family: LoRA trained for a few steps with attention supervision (or A2 alignment) on, only the
adapter and the saved heads change, the adapter saves and reloads to the same outputs, `merge_and_unload` too; the
target-module table matches real Linear layers of each family; clear errors from `lora_config`."""

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from torch import nn

from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    TwoStreamConfig,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
)
from hf_vlalign.lora import LORA_TARGET_MODULES, lora_config

B, T, R, DV, V = 2, 6, 4, 8, 100
ENCODER = dict(vocab_size=V, hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
               visual_feat_dim=DV, attention_supervision="direct")  # fmt: skip


def single_stream_config(**overrides) -> SingleStreamConfig:
    return SingleStreamConfig(**{**ENCODER, "num_hidden_layers": 2, **overrides})


def two_stream_config(**overrides) -> TwoStreamConfig:
    fields = dict(l_layers=2, r_layers=1, x_layers=2, num_object_labels=6, num_attr_labels=5, num_qa_labels=7,
                  task_alignment=True, alignment_top_k=2)  # fmt: skip
    return TwoStreamConfig(**{**ENCODER, **fields, **overrides})


def captioner_config(**overrides) -> RegionCaptionerConfig:
    fields = dict(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=DV,
        max_position_embeddings=16, geometry_dim=16, attention_alignment="max",
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    return RegionCaptionerConfig(**{**fields, **overrides})


def region_inputs(generator: torch.Generator) -> dict[str, torch.Tensor]:
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    sizes = 0.1 + torch.rand(B, R, 2, generator=generator) * 0.4
    visual_attention_mask = torch.ones(B, R, dtype=torch.long)
    visual_attention_mask[1, -1] = 0
    return {
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + sizes], dim=-1),
        "visual_attention_mask": visual_attention_mask,
    }


def encoder_inputs(generator: torch.Generator) -> dict[str, torch.Tensor]:
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, -1] = 0
    alignment = torch.zeros(B, T, R)  # grounded rows are distributions over the real regions
    alignment[0, 1, 2] = 1.0
    alignment[0, 2, [0, 3]] = 0.5
    alignment[1, 3, 1] = 1.0
    return {
        "input_ids": torch.randint(3, V, (B, T), generator=generator),
        "attention_mask": attention_mask,
        **region_inputs(generator),
        "word_region_alignment": alignment,
    }


def paraphrase_batch() -> dict[str, torch.Tensor]:
    batch = encoder_inputs(torch.Generator().manual_seed(0))
    phrase1, phrase2 = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)
    phrase1[:, 1:3], phrase2[:, 3:5] = True, True
    return {
        **batch,
        "token_type_ids": (torch.arange(T) >= 3).long().expand(B, T).clone(),
        "phrase1_mask": phrase1,
        "phrase2_mask": phrase2,
        "id_labels": torch.tensor([0, 2]),
        "vgp_labels": torch.tensor([1, 0]),
    }


def question_answering_batch() -> dict[str, torch.Tensor]:
    return {**encoder_inputs(torch.Generator().manual_seed(1)), "labels": torch.tensor([3, 6])}


def pretraining_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    batch = encoder_inputs(generator)
    labels = torch.full((B, T), -100)
    labels[:, 2] = torch.randint(3, V, (B,), generator=generator)
    masked = torch.zeros(B, R, dtype=torch.long)
    masked[:, 1] = 1
    return {
        **batch,
        "labels": labels,
        "object_labels": torch.where(masked.bool(), torch.randint(0, 6, (B, R), generator=generator), -100),
        "attribute_labels": torch.where(masked.bool(), torch.randint(0, 5, (B, R), generator=generator), -100),
        "feature_labels": torch.randn(B, R, DV, generator=generator),
        "masked_regions": masked,
        "matched_labels": torch.tensor([1, 0]),
        "answer_labels": torch.tensor([3, 5]),
    }


def caption_batch() -> dict[str, torch.Tensor]:
    labels = torch.tensor([[5, 6, 7, 2, -100], [8, 9, 10, 11, 2]])
    return {**region_inputs(torch.Generator().manual_seed(3)), "labels": labels}


@dataclass
class Case:
    build: Callable[[], nn.Module]
    batch: Callable[[], dict[str, torch.Tensor]]
    compared: tuple[str, ...]  # outputs that must survive save/reload and merging
    heads: tuple[str, ...]  # modules_to_save expected from `lora_config`


CASES = {
    "single_stream": Case(
        lambda: SingleStreamForVisualParaphrase(single_stream_config()),
        paraphrase_batch,
        ("id_logits", "vgp_logits", "loss", "loss_attention_supervision"),
        ("id_classifier", "vgp_dense", "vgp_classifier"),
    ),
    "two_stream_qa": Case(
        lambda: TwoStreamForQuestionAnswering(two_stream_config()),
        question_answering_batch,
        ("logits", "loss", "loss_attention_supervision"),
        ("answer_head",),
    ),
    "two_stream_pretraining": Case(
        lambda: TwoStreamForPreTraining(two_stream_config()),
        pretraining_batch,
        ("question_answering_score", "cross_relationship_score", "alignment_scores", "loss", "loss_attention_supervision",
         "loss_alignment"),
        ("matching_head", "object_head", "answer_head", "alignment_decoder"),
    ),
    "captioner_a2": Case(
        lambda: RegionCaptionerForConditionalGeneration(captioner_config()),
        caption_batch,
        ("logits", "loss", "mask_mean"),
        ("perturbation.mask_network",),
    ),
}


def fresh_model(case: Case) -> nn.Module:
    torch.manual_seed(0)  # the same base weights every time
    return case.build()


def train_three_steps(model: PeftModel, batch: dict[str, torch.Tensor]) -> None:
    """AdamW on the model's total loss (task + weighted attention supervision). With A2 each step first updates the
    mask networks on the mask objective (eq. 4, gradient w.r.t. them only), as `CaptioningTrainer` does."""
    model.train()
    is_a2 = getattr(model.config, "attention_alignment", "none") != "none"
    # peft keeps the frozen original of a saved module next to its trainable copy: train the copy
    mask_parameters = [p for p in model.mask_parameters() if p.requires_grad] if is_a2 else []
    masks = {id(p) for p in mask_parameters}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad and id(p) not in masks], lr=1e-2)
    mask_optimizer = torch.optim.AdamW(mask_parameters, lr=1e-2) if mask_parameters else None
    for _ in range(3):
        if mask_optimizer is not None:
            loss_mask = model(**batch, alignment_mode="perturb").loss_mask
            for parameter, gradient in zip(mask_parameters, torch.autograd.grad(loss_mask, mask_parameters)):
                parameter.grad = gradient
            mask_optimizer.step()
            mask_optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        assert torch.isfinite(loss)
        loss.backward()
        assert all(p.grad is None for p in mask_parameters)  # the caption loss reads the masks detached
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def assert_outputs_close(expected, actual, names, tolerance):
    for name in names:
        assert expected[name] is not None, name
        torch.testing.assert_close(actual[name], expected[name], atol=tolerance, rtol=tolerance, msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_lora_trains_saves_reloads_and_merges(name, tmp_path):
    case = CASES[name]
    batch = case.batch()
    base = fresh_model(case)
    config = lora_config(base)
    assert sorted(config.modules_to_save or []) == sorted(case.heads)
    model = get_peft_model(base, config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    train_three_steps(model, batch)

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed <= trainable, f"frozen base weights changed: {sorted(changed - trainable)}"
    # every saved head was trained, and so were LoRA matrices (A from the second step on, B from the first)
    for head in case.heads:
        head_parameters = {n for n in trainable if f"{head}.modules_to_save." in n}
        assert head_parameters and head_parameters <= changed, head
    assert any(".lora_A." in n for n in changed) and any(".lora_B." in n for n in changed)

    model.eval()
    with torch.no_grad():
        trained = model(**batch)
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert not list((tmp_path / "adapter").glob("*.bin"))

    reloaded = PeftModel.from_pretrained(fresh_model(case), tmp_path / "adapter").eval()
    with torch.no_grad():
        assert_outputs_close(trained, reloaded(**batch), case.compared, 1e-6)

    merged = reloaded.merge_and_unload().eval()
    assert type(merged) is type(base)
    assert not any(isinstance(m, (LoraLayer, ModulesToSaveWrapper)) for m in merged.modules())
    with torch.no_grad():
        assert_outputs_close(trained, merged(**batch), case.compared, 1e-5)

    # the merged model is a plain checkpoint of its class again
    merged.save_pretrained(tmp_path / "merged")
    checkpoint = type(base).from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert_outputs_close(trained, checkpoint(**batch), case.compared, 1e-5)


def test_captioner_generates_the_same_captions_through_peft_reloaded_and_merged(tmp_path):
    case = CASES["captioner_a2"]
    model = get_peft_model(fresh_model(case), lora_config(fresh_model(case), preset="attention_ffn"))
    train_three_steps(model, case.batch())
    model.eval().save_pretrained(tmp_path)
    regions = region_inputs(torch.Generator().manual_seed(3))
    generate = dict(max_new_tokens=4, do_sample=False, num_beams=1)
    expected = model.generate(**regions, **generate)
    reloaded = PeftModel.from_pretrained(fresh_model(case), tmp_path).eval()
    assert torch.equal(reloaded.generate(**regions, **generate), expected)
    assert torch.equal(reloaded.merge_and_unload().generate(**regions, **generate), expected)


@pytest.mark.parametrize("name, top_layer", [("single_stream", "layer.1."), ("two_stream_qa", "cross_layers.1.")])
def test_attention_supervision_loss_reaches_the_query_key_adapters(name, top_layer):
    case = CASES[name]
    model = get_peft_model(fresh_model(case), lora_config(fresh_model(case)))
    loss_attention_supervision = model(**case.batch()).loss_attention_supervision
    adapters = {n: p for n, p in model.named_parameters() if ".lora_B." in n}
    gradients = dict(zip(adapters, torch.autograd.grad(loss_attention_supervision, list(adapters.values()), allow_unused=True)))
    reached = {n for n, g in gradients.items() if g is not None and float(g.abs().sum()) > 0}
    assert reached, "the attention-supervision loss does not reach any LoRA matrix"
    # the loss reads the supervised rows' logits: in the top supervised layer, only the query/key adapters
    top = {n for n in reached if top_layer in n}
    assert top and all(".query." in n or ".key." in n for n in top), sorted(top)


MODULE_SETS = {
    "single_stream": lambda: SingleStreamForVisualParaphrase(single_stream_config(attention_supervision="indirect")),
    "two_stream": lambda: TwoStreamForPreTraining(two_stream_config(share_cross_attention=False)),
    "captioner": lambda: RegionCaptionerForConditionalGeneration(captioner_config(attention_alignment="gate")),
}


@pytest.mark.parametrize("family", list(LORA_TARGET_MODULES))
@pytest.mark.parametrize("preset", ["attention", "attention_ffn"])
def test_every_target_name_matches_linear_layers_and_never_a_head(family, preset):
    model = MODULE_SETS[family]()
    config = lora_config(model, preset=preset)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for target in config.target_modules:
        assert any(n == target or n.endswith(f".{target}") for n in names), f"{family}: {target!r} matches nothing"
    adapted = {n for n, _ in get_peft_model(model, config).named_modules() if n.endswith(".base_layer")}
    heads = tuple(config.modules_to_save)
    assert adapted and not any(h in n for n in adapted for h in (*heads, "lm_head", "pooler", "embeddings"))
    if preset == "attention":
        assert not any("intermediate" in n or ("output.dense" in n and "attention" not in n) for n in adapted)


def test_lora_config_defaults_and_overrides():
    model = SingleStreamForVisualParaphrase(single_stream_config(attention_supervision="indirect"))
    config = lora_config(model, r=4, alpha=8, dropout=0.1)
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.1)
    assert set(config.modules_to_save) == {"id_classifier", "vgp_dense", "vgp_classifier", "indirect_grounding_head"}
    custom = lora_config(model, target_modules=["query", "value"], modules_to_save=["id_classifier"], use_rslora=True)
    assert set(custom.target_modules) == {"query", "value"} and custom.modules_to_save == ["id_classifier"]
    assert custom.use_rslora
    gated = lora_config(RegionCaptionerForConditionalGeneration(captioner_config(attention_alignment="gate")))
    assert "perturbation.gate" in gated.modules_to_save
    plain = lora_config(RegionCaptionerForConditionalGeneration(captioner_config(attention_alignment="none")))
    assert plain.modules_to_save is None


def test_lora_config_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"`model` must be a model of hf_vlalign.*got Linear with model_type None"):
        lora_config(nn.Linear(2, 2))
    model = SingleStreamForVisualParaphrase(single_stream_config())
    with pytest.raises(ValueError, match=r"`preset` must be one of \['attention', 'attention_ffn'\], got 'all'"):
        lora_config(model, preset="all")
