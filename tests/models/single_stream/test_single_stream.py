"""Single-stream model: supervision from logits equals supervision from eager probabilities, save/load exactness,
text weights copied from the real MiniLM, Auto registration, and clear errors for bad input."""

import math

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import (
    AutoModelForVisualParaphrase,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    default_text_model_path,
)
from hf_vlalign.supervision import attention_rollout, semi_direct_supervision_loss

B, T, R, DV = 3, 9, 5, 12


def tiny_config(**overrides) -> SingleStreamConfig:
    fields = dict(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        visual_feat_dim=DV,
        attention_supervision="direct",
    )
    return SingleStreamConfig(**{**fields, **overrides})


def tiny_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, -2:] = 0
    visual_attention_mask = torch.ones(B, R, dtype=torch.long)
    visual_attention_mask[2, -1] = 0
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    sizes = 0.1 + torch.rand(B, R, 2, generator=generator) * 0.4
    alignment = torch.zeros(B, T, R)
    alignment[0, 1, 2] = 1.0
    alignment[0, 2, [0, 3]] = 0.5
    alignment[1, 4, 1] = 1.0
    alignment[2, 3, 0] = 1.0
    phrase1 = torch.zeros(B, T, dtype=torch.bool)
    phrase1[:, 1:3] = True
    phrase2 = torch.zeros(B, T, dtype=torch.bool)
    phrase2[:, 4:6] = True
    return {
        "input_ids": torch.randint(1, 120, (B, T), generator=generator),
        "attention_mask": attention_mask,
        "token_type_ids": (torch.arange(T) >= 4).long().expand(B, T).clone(),
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + sizes], dim=-1),
        "visual_attention_mask": visual_attention_mask,
        "word_region_alignment": alignment,
        "phrase_masks": torch.stack([phrase1, phrase2], dim=1),
        "phrase1_mask": phrase1,
        "phrase2_mask": phrase2,
        "id_labels": torch.tensor([0, 1, 2]),
        "vgp_labels": torch.tensor([1, 0, 1]),
    }


def base_inputs(batch):
    return {k: v for k, v in batch.items() if k not in ("phrase1_mask", "phrase2_mask", "id_labels", "vgp_labels")}


def direct_loss_from_probabilities(attentions, batch, layers, heads):
    """The VGP paper's eqs. 6-8 computed the naive way, from eager attention probabilities."""
    regions = slice(T, T + R)
    alignment = batch["word_region_alignment"]
    text_mask, region_mask = batch["attention_mask"].bool(), batch["visual_attention_mask"].bool()
    losses = []
    for layer in layers:
        probs = attentions[layer][:, heads]
        t2r = probs[:, :, :T, regions] * region_mask[:, None, None, :]
        t2r = t2r / t2r.sum(-1, keepdim=True)
        r2t = probs[:, :, regions, :T] * text_mask[:, None, None, :]
        r2t = r2t / r2t.sum(-1, keepdim=True)
        grounded = alignment.sum(-1) > 0
        text_loss = -(alignment[:, None] * torch.log(t2r.clamp(min=1e-30))).sum(-1)
        text_loss = text_loss.permute(0, 2, 1)[grounded].mean()
        column = alignment.transpose(1, 2)
        has_word = column.sum(-1) > 0
        column = column / column.sum(-1, keepdim=True).clamp(min=1e-12)
        region_loss = -(column[:, None] * torch.log(r2t.clamp(min=1e-30))).sum(-1)
        region_loss = region_loss.permute(0, 2, 1)[has_word].mean()
        losses.append(text_loss + region_loss)
    return torch.stack(losses).mean()


@pytest.mark.parametrize("layers,heads", [(None, None), ([1, 2], [0, 3])])
def test_direct_loss_from_logits_equals_loss_from_eager_probabilities(layers, heads):
    torch.manual_seed(0)
    model = SingleStreamModel(tiny_config(supervised_layers=layers, supervised_heads=heads)).eval()
    batch = base_inputs(tiny_batch())
    ours = model(**batch).loss_attention_supervision  # sdpa main path, loss from the logits of the supervised rows
    assert model.config._attn_implementation == "sdpa"
    eager = model(**batch, output_attentions=True)
    expected = direct_loss_from_probabilities(
        eager.attentions, batch, layers or range(3), heads or list(range(4))
    )
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_semi_direct_loss_equals_rollout_of_eager_probabilities():
    torch.manual_seed(0)
    model = SingleStreamModel(tiny_config(attention_supervision="semi_direct", supervised_layers=[1, 2])).eval()
    batch = base_inputs(tiny_batch())
    ours = model(**batch).loss_attention_supervision
    attentions = model(**batch, output_attentions=True).attentions
    rollouts = attention_rollout(list(attentions))
    expected = semi_direct_supervision_loss(
        [rollouts[1], rollouts[2]], slice(0, T), slice(T, T + R), batch["word_region_alignment"],
        batch["attention_mask"], batch["visual_attention_mask"],
    )
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_sdpa_and_eager_agree():
    torch.manual_seed(0)
    sdpa = SingleStreamModel(tiny_config()).eval()
    eager = SingleStreamModel(tiny_config()).eval()
    eager.load_state_dict(sdpa.state_dict())
    eager.config._attn_implementation = "eager"
    batch = base_inputs(tiny_batch())
    mask = torch.cat([batch["attention_mask"], batch["visual_attention_mask"], torch.ones(B, 1, dtype=torch.long)], 1)
    a, b = sdpa(**batch).last_hidden_state, eager(**batch).last_hidden_state
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=1e-5)


def test_attention_loss_trains_only_supervised_layers_query_key():
    torch.manual_seed(0)
    model = SingleStreamModel(tiny_config(supervised_layers=[1])).train()
    model(**base_inputs(tiny_batch())).loss_attention_supervision.backward()
    layers = model.encoder.layer
    assert layers[1].attention.self.query.weight.grad.abs().sum() > 0
    assert layers[2].attention.self.query.weight.grad is None  # above the supervised layer: untouched
    assert layers[1].attention.self.value.weight.grad is None  # the loss reads logits only


def test_indirect_supervision_head_and_loss():
    torch.manual_seed(0)
    model = SingleStreamModel(tiny_config(attention_supervision="indirect"))
    out = model(**base_inputs(tiny_batch()))
    assert out.loss_attention_supervision.item() > 0
    out.loss_attention_supervision.backward()
    assert model.indirect_grounding_head.classifier.weight.grad is not None
    with pytest.raises(ValueError, match="phrase_masks"):
        batch = base_inputs(tiny_batch())
        batch.pop("phrase_masks")
        model(**batch)


def test_visual_paraphrase_losses_and_total_eq9():
    torch.manual_seed(0)
    config = tiny_config(id_weight=0.5, vgp_weight=2.0, attention_supervision_weight=0.25)
    out = SingleStreamForVisualParaphrase(config)(**tiny_batch())
    assert out.id_logits.shape == (B, 3) and out.vgp_logits.shape == (B, 5)  # the 5 VGP types
    expected = 0.5 * out.loss_id + 2.0 * out.loss_vgp + 0.25 * out.loss_attention_supervision
    torch.testing.assert_close(out.loss, expected)
    assert out.loss_id.item() == pytest.approx(math.log(3), rel=0.3)


def test_vgp_type_loss_eq4_by_hand_leaves_out_pairs_without_a_type():
    # eq. (4): softmax over the 5 semantic types of MLP([e1, e2, e1 * e2, |e1 - e2|]), e_i the max-pooled phrase
    # states; a pair without a type (-100) is left out of the mean
    torch.manual_seed(0)
    model = SingleStreamForVisualParaphrase(tiny_config(attention_supervision="none")).eval()
    batch = {**tiny_batch(), "vgp_labels": torch.tensor([3, -100, 4])}
    out = model(**batch)
    with torch.no_grad():
        states = model.single_stream(**base_inputs(batch)).last_hidden_state[:, :T]
        e1 = states.masked_fill(~batch["phrase1_mask"][..., None], float("-inf")).amax(1)
        e2 = states.masked_fill(~batch["phrase2_mask"][..., None], float("-inf")).amax(1)
        pair = torch.cat([e1, e2, e1 * e2, (e1 - e2).abs()], dim=-1)
        logits = model.vgp_classifier(model.vgp_activation(model.vgp_dense(pair)))
    torch.testing.assert_close(out.vgp_logits, logits)
    log_probs = logits.log_softmax(-1)
    expected = -(log_probs[0, 3] + log_probs[2, 4]) / 2  # row 1 has no type
    torch.testing.assert_close(out.loss_vgp, expected)
    assert model.loss_item_counts(batch)["vgp"] == 2


def test_vgp_task_config_fields():
    config = tiny_config()
    assert (config.vgp_task, config.num_vgp_labels) == ("type", 5)
    assert config.vgp_class_names() == ["Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence"]
    binary = tiny_config(vgp_task="binary", num_vgp_labels=2)
    assert binary.vgp_class_names() == ["not_paraphrase", "paraphrase"]
    assert SingleStreamForVisualParaphrase(binary).vgp_classifier.out_features == 2
    assert tiny_config(num_vgp_labels=3, vgp_label_names=["a", "b", "c"]).vgp_class_names() == ["a", "b", "c"]
    with pytest.raises(ValueError, match="`num_vgp_labels` must be 2"):
        tiny_config(vgp_task="binary")
    with pytest.raises(ValueError, match="`vgp_task` must be one of"):
        tiny_config(vgp_task="paraphrase")
    with pytest.raises(ValueError, match="`vgp_label_names` must be None or a list of 5"):
        tiny_config(vgp_label_names=["a", "b"])


def test_vgp_labels_out_of_range_are_refused_and_minus_100_is_not():
    model = SingleStreamForVisualParaphrase(tiny_config())
    with pytest.raises(ValueError, match=r"`vgp_labels` must be in \[0, 4\] or -100"):
        model(**{**tiny_batch(), "vgp_labels": torch.tensor([5, 0, 1])})
    with pytest.raises(ValueError, match="`vgp_labels` must be in"):
        model(**{**tiny_batch(), "vgp_labels": torch.tensor([-1, 0, 1])})
    out = model(**{**tiny_batch(), "vgp_labels": torch.full((B,), -100)})
    # no typed pair in the batch: a zero VGP loss that keeps the graph (whether one exists is not read on the host)
    assert out.loss_vgp == 0 and out.loss_vgp.requires_grad


def test_no_supervision_has_no_attention_loss():
    out = SingleStreamForVisualParaphrase(tiny_config(attention_supervision="none"))(**tiny_batch())
    assert out.loss_attention_supervision is None
    torch.testing.assert_close(out.loss, out.loss_id + out.loss_vgp)


def test_save_load_roundtrip_is_exact_with_safetensors(tmp_path):
    torch.manual_seed(0)
    model = SingleStreamForVisualParaphrase(tiny_config(attention_supervision="indirect")).eval()
    batch = tiny_batch()
    before = model(**batch)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    assert AutoConfig.from_pretrained(tmp_path).model_type == "vlalign_single_stream"
    reloaded = AutoModelForVisualParaphrase.from_pretrained(tmp_path).eval()
    assert type(reloaded) is SingleStreamForVisualParaphrase
    after = reloaded(**batch)
    for key in ("id_logits", "vgp_logits", "loss", "loss_attention_supervision"):
        assert torch.equal(before[key], after[key]), key
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(base) is SingleStreamModel
    assert torch.equal(base(**base_inputs(batch)).last_hidden_state, model.single_stream(**base_inputs(batch)).last_hidden_state)


def test_from_text_pretrained_copies_the_real_minilm_exactly():
    model = SingleStreamForVisualParaphrase.from_text_pretrained(visual_feat_dim=DV, attention_supervision="direct")
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    own = model.single_stream.state_dict()
    path = f"{default_text_model_path()}/model.safetensors"
    copied = 0
    with safe_open(path, "pt") as checkpoint:
        for key in checkpoint.keys():
            if key.endswith("position_ids"):
                continue
            assert torch.equal(own[key], checkpoint.get_tensor(key)), key
            copied += 1
    assert copied == 103  # embeddings (5) + 6 layers x 16 + pooler (2)


def test_from_text_pretrained_refuses_to_change_the_text_architecture():
    with pytest.raises(ValueError, match="hidden_size"):
        SingleStreamModel.from_text_pretrained(hidden_size=128)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda b: b.update(visual_boxes=b["visual_boxes"][:, :-1]), "visual_boxes.*num_regions"),
        (lambda b: b["visual_boxes"].__setitem__((0, 0, 2), 1.7), r"normalised to \[0, 1\]"),
        (lambda b: b["visual_boxes"].__setitem__((0, 0, 0), 0.95), "x2 > x1"),
        (lambda b: b["visual_feats"].__setitem__((1, 2, 3), float("nan")), "visual_feats.*NaN"),
        (lambda b: b.update(word_region_alignment=b["word_region_alignment"][:, :, :-1]), "word_region_alignment.*shape"),
        (lambda b: b.update(visual_feats=b["visual_feats"][:, :0], visual_boxes=b["visual_boxes"][:, :0],
                            visual_attention_mask=b["visual_attention_mask"][:, :0],
                            word_region_alignment=b["word_region_alignment"][:, :, :0]), "empty region set"),
        (lambda b: b["visual_attention_mask"].__setitem__(1, 0), "visual_attention_mask.*at least one region"),
        (lambda b: b["phrase1_mask"].__setitem__(2, False), "phrase1_mask.*at least one token"),
        (lambda b: b.update(visual_feats=b["visual_feats"][..., :5]), "visual_feat_dim"),
        (lambda b: b["word_region_alignment"].__setitem__((0, 1, 0), 0.5), "sum to 1"),
        (lambda b: b["input_ids"].__setitem__((0, 0), 500), "vocab_size"),
        (lambda b: b.update(id_labels=torch.tensor([0, 1, 3])), "id_labels"),
    ],
)
def test_bad_input_raises_a_clear_value_error(mutate, match):
    model = SingleStreamForVisualParaphrase(tiny_config())
    batch = tiny_batch()
    mutate(batch)
    with pytest.raises(ValueError, match=match):
        model(**batch)


def test_bad_config_raises_value_error():
    with pytest.raises(ValueError, match="multiple of `num_attention_heads`"):
        tiny_config(hidden_size=30)
    with pytest.raises(ValueError, match="supervised_heads"):
        tiny_config(supervised_heads=[7])
    with pytest.raises(ValueError, match="attention_supervision"):
        tiny_config(attention_supervision="rollout")
