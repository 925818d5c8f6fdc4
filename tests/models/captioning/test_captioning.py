"""Region captioner: geometry features on hand-made boxes, geometry-aware attention, every attention map, A2 alignment
inside the decoder, generation (greedy with and without cache, beam search), save/load, and clear errors."""

import math

import pytest
import torch

from hf_vlalign.models.captioning import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    box_geometry,
    sinusoidal_geometry_embedding,
)

B, R, DV, V = 2, 5, 12, 50


def tiny_config(**overrides) -> RegionCaptionerConfig:
    fields = dict(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=DV,
        max_position_embeddings=24, dropout=0.0, attention_dropout=0.0, geometry_dim=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    return RegionCaptionerConfig(**{**fields, **overrides})


def regions(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    sizes = 0.1 + torch.rand(B, R, 2, generator=generator) * 0.4
    mask = torch.ones(B, R, dtype=torch.long)
    mask[1, -1] = 0
    return {
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + sizes], dim=-1),
        "visual_attention_mask": mask,
    }


def caption_labels() -> torch.Tensor:
    return torch.tensor([[5, 6, 7, 2, -100], [8, 9, 10, 11, 2]])


# --- geometry -------------------------------------------------------------------------------------------------------


def test_box_geometry_on_hand_made_boxes():
    # A: centre (0.1, 0.1), 0.2 x 0.2; B: centre (0.4, 0.2), 0.4 x 0.4; C: same centre as B, 0.2 x 0.2
    boxes = torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.2, 0.0, 0.6, 0.4], [0.3, 0.1, 0.5, 0.3]]])
    geometry = box_geometry(boxes, floor=1e-3)
    expected_ab = [math.log(0.3 / 0.2), math.log(0.1 / 0.2), math.log(2.0), math.log(2.0)]
    torch.testing.assert_close(geometry[0, 0, 1], torch.tensor(expected_ab))
    expected_ba = [math.log(0.3 / 0.4), math.log(0.1 / 0.4), math.log(0.5), math.log(0.5)]
    torch.testing.assert_close(geometry[0, 1, 0], torch.tensor(expected_ba))
    # identical centres (B and C, and every box with itself): the floor keeps the log finite
    floor = math.log(1e-3)
    torch.testing.assert_close(geometry[0, 1, 2], torch.tensor([floor, floor, math.log(0.5), math.log(0.5)]))
    torch.testing.assert_close(geometry[0, 0, 0], torch.tensor([floor, floor, 0.0, 0.0]))
    assert torch.isfinite(geometry).all()


def test_sinusoidal_geometry_embedding():
    zero = sinusoidal_geometry_embedding(torch.zeros(1, 4), dim=16)
    assert zero.shape == (1, 16)
    # per coordinate: 2 sines (0) then 2 cosines (1)
    torch.testing.assert_close(zero, torch.tensor([[0.0, 0.0, 1.0, 1.0] * 4]))
    value = sinusoidal_geometry_embedding(torch.tensor([[0.5, 0.0, 0.0, 0.0]]), dim=16)
    frequencies = [1.0, 1000.0**-0.5]
    torch.testing.assert_close(value[0, :4], torch.tensor([math.sin(50 * f) for f in frequencies] + [math.cos(50 * f) for f in frequencies]))


def test_geometry_changes_encoder_attention_and_can_be_switched_off():
    torch.manual_seed(0)
    with_geometry = RegionCaptionerForConditionalGeneration(tiny_config()).eval()
    without = RegionCaptionerForConditionalGeneration(tiny_config(use_geometry=False)).eval()
    assert without.model.encoder.layers[0].self_attn.geometry_projection is None
    inputs = regions()
    out = with_geometry(**inputs, labels=caption_labels(), output_attentions=True)
    # the geometry bias enters the logits: dropping W_G changes the attention
    with torch.no_grad():
        with_geometry.model.encoder.layers[0].self_attn.geometry_projection.weight.mul_(3.0)
    changed = with_geometry(**inputs, labels=caption_labels(), output_attentions=True)
    assert not torch.allclose(out.encoder_attentions[0], changed.encoder_attentions[0])
    assert without(**inputs, labels=caption_labels()).loss.isfinite()


def test_every_attention_map_is_returned_per_layer():
    model = RegionCaptionerForConditionalGeneration(tiny_config()).eval()
    out = model(**regions(), labels=caption_labels(), output_attentions=True)
    assert [tuple(a.shape) for a in out.encoder_attentions] == [(B, 4, R, R)] * 2
    assert [tuple(a.shape) for a in out.decoder_attentions] == [(B, 4, 5, 5)] * 2
    assert [tuple(a.shape) for a in out.cross_attentions] == [(B, 4, 5, R)] * 2
    # padded region of example 1 gets no attention; causal decoder attention
    assert float(out.cross_attentions[0][1, :, :, -1].abs().max()) == 0.0
    assert float(out.encoder_attentions[0][1, :, :, -1].abs().max()) == 0.0
    assert float(out.decoder_attentions[0][:, :, 0, 1:].abs().max()) == 0.0


@pytest.mark.parametrize("pre_norm", [False, True])
def test_sdpa_and_eager_agree(pre_norm):
    model = RegionCaptionerForConditionalGeneration(tiny_config(normalize_before=pre_norm)).eval()
    inputs = regions()
    plain = model(**inputs, labels=caption_labels())
    eager = model(**inputs, labels=caption_labels(), output_attentions=True)
    torch.testing.assert_close(plain.logits, eager.logits, atol=1e-5, rtol=1e-5)


def test_loss_is_token_cross_entropy_on_shifted_labels():
    model = RegionCaptionerForConditionalGeneration(tiny_config()).eval()
    labels = caption_labels()
    out = model(**regions(), labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.flatten()))
    # teacher forcing: the decoder read [start] + labels[:-1]
    decoder_input_ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 10, 11]])
    direct = model(**regions(), decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(direct.logits, out.logits)


# --- A2 inside the decoder ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fusion", ["max", "moving_average", "exp_decay", "gate"])
def test_aligned_layers_use_the_fused_attention(fusion):
    model = RegionCaptionerForConditionalGeneration(tiny_config(attention_alignment=fusion, aligned_layers=[1])).eval()
    out = model(**regions(), labels=caption_labels(), output_attentions=True)
    assert model.model.decoder.layers[0].encoder_attn.perturbation is None
    assert model.model.decoder.layers[1].encoder_attn.perturbation is not None
    torch.testing.assert_close(out.aligned_cross_attentions[0], out.cross_attentions[0])
    aligned = out.aligned_cross_attentions[1]
    torch.testing.assert_close(aligned.sum(-1), torch.ones(B, 4, 5))
    assert float(aligned[1, :, :, -1].abs().max()) == 0.0
    assert out.mask_mean is not None and 0 < float(out.mask_mean) < 1


@pytest.mark.parametrize("mask_input", ["query", "query_and_regions"])
def test_a2_readings_round_trip_and_reach_the_modules(mask_input, tmp_path):
    config = tiny_config(attention_alignment="moving_average", alignment_eta=2.0, alignment_moving_average="additive",
                         alignment_mask_input=mask_input, alignment_mask_regions=7)  # fmt: skip
    config.save_pretrained(tmp_path)
    loaded = RegionCaptionerConfig.from_pretrained(tmp_path)
    for name in ("alignment_eta", "alignment_moving_average", "alignment_mask_input", "alignment_mask_regions"):
        assert getattr(loaded, name) == getattr(config, name), name
    defaults = RegionCaptionerConfig()
    assert (defaults.alignment_moving_average, defaults.alignment_mask_input) == ("additive", "query")
    perturbation = RegionCaptionerForConditionalGeneration(loaded).model.decoder.layers[0].encoder_attn.perturbation
    assert (perturbation.mask_input, perturbation.num_region_slots) == (mask_input, 7)
    assert (perturbation.moving_average, perturbation.eta) == ("additive", 2.0)
    assert (perturbation.region_network is None) == (mask_input == "query")


def test_mask_objective_gradient_reaches_only_the_mask_networks():
    model = RegionCaptionerForConditionalGeneration(tiny_config(attention_alignment="gate"))
    out = model(**regions(), labels=caption_labels(), alignment_mode="perturb")
    assert out.loss is out.loss_mask
    mask_parameters = model.mask_parameters()
    assert len(mask_parameters) == 2 * 2  # W_m, b_m of each aligned layer (the printed eq. 2 has no region term)
    grads = torch.autograd.grad(out.loss_mask, mask_parameters, retain_graph=True)
    assert all(g.abs().sum() > 0 for g in grads)
    # the captioner's step: the caption loss on the aligned attention does not reach the mask networks
    model.zero_grad()
    model(**regions(), labels=caption_labels()).loss.backward()
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0.0 for p in mask_parameters)
    assert model.model.decoder.layers[0].encoder_attn.perturbation.gate.weight.grad.abs().sum() > 0


# --- generation -----------------------------------------------------------------------------------------------------


def trained_enough_model(**overrides) -> RegionCaptionerForConditionalGeneration:
    torch.manual_seed(0)
    return RegionCaptionerForConditionalGeneration(tiny_config(**overrides)).eval()


def test_gate_reads_the_cross_attention_query():
    # eq. 10: g_t = sigmoid(W_g q_t + b_g), q_t the query projection of the decoder state (section 2), not h_t itself
    torch.manual_seed(0)
    model = RegionCaptionerForConditionalGeneration(tiny_config(attention_alignment="gate")).eval()
    cross = model.model.decoder.layers[1].encoder_attn
    seen = {}
    cross.register_forward_pre_hook(lambda module, args: seen.update(hidden=args[0]))
    cross.perturbation.gate.register_forward_pre_hook(lambda module, args: seen.update(gate_input=args[0]))
    model(**regions(), labels=caption_labels())
    torch.testing.assert_close(seen["gate_input"], cross.q_proj(seen["hidden"]))


@pytest.mark.parametrize("alignment, pre_norm", [("none", False), ("exp_decay", False), ("gate", True)])
def test_greedy_generation_with_and_without_cache_is_identical(alignment, pre_norm):
    model = trained_enough_model(attention_alignment=alignment, normalize_before=pre_norm)
    inputs = regions()
    cached = model.generate(**inputs, max_new_tokens=8, do_sample=False, use_cache=True)
    uncached = model.generate(**inputs, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached[:, 0].tolist() == [1, 1] and cached.shape[1] <= 9


def test_beam_search_returns_sorted_hypotheses():
    model = trained_enough_model()
    out = model.generate(
        **regions(), max_new_tokens=6, num_beams=3, num_return_sequences=3, length_penalty=1.0,
        output_scores=True, return_dict_in_generate=True, do_sample=False,
    )  # fmt: skip
    assert out.sequences.shape[0] == B * 3
    scores = out.sequences_scores.view(B, 3)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])


def test_save_load_generate_after_from_pretrained(tmp_path):
    model = trained_enough_model(attention_alignment="moving_average")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    reloaded = RegionCaptionerForConditionalGeneration.from_pretrained(tmp_path).eval()
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    assert reloaded.lm_head.weight is reloaded.model.decoder.embed_tokens.weight
    inputs = regions()
    assert torch.equal(model.generate(**inputs, max_new_tokens=6), reloaded.generate(**inputs, max_new_tokens=6))


# --- errors ---------------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    model = trained_enough_model()
    inputs = regions()
    zero_area = {**inputs, "visual_boxes": inputs["visual_boxes"].clone()}
    zero_area["visual_boxes"][0, 0, 2] = zero_area["visual_boxes"][0, 0, 0]
    with pytest.raises(ValueError, match=r"`visual_boxes` must satisfy x2 > x1 and y2 > y1"):
        model(**zero_area, labels=caption_labels())
    empty = {"visual_feats": torch.zeros(B, 0, DV), "visual_boxes": torch.zeros(B, 0, 4), "visual_attention_mask": torch.zeros(B, 0, dtype=torch.long)}
    with pytest.raises(ValueError, match=r"`visual_feats` must hold at least one region"):
        model(**empty, labels=caption_labels())
    all_masked = {**inputs, "visual_attention_mask": torch.zeros(B, R, dtype=torch.long)}
    with pytest.raises(ValueError, match=r"`visual_attention_mask` must keep at least one region"):
        model(**all_masked, labels=caption_labels())
    with pytest.raises(ValueError, match=r"max_new_tokens"):
        model.generate(**inputs, max_new_tokens=0)
    with pytest.raises(ValueError, match=r"`labels` must be token ids in \[0, 49\]"):
        model(**inputs, labels=torch.tensor([[5, 60], [1, 2]]))
    with pytest.raises(ValueError, match=r"`alignment_mode='perturb'` needs aligned layers"):
        model(**inputs, labels=caption_labels(), alignment_mode="perturb")


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"attention_alignment": "mean"}, r"`attention_alignment` must be one of \('none', 'max', 'moving_average', 'exp_decay', 'gate'\)"),
        ({"aligned_layers": [2]}, r"`aligned_layers` must hold decoder layer indices in \[0, 1\]"),
        ({"d_model": 30}, r"`d_model` \(30\) must be a multiple of `encoder_attention_heads`"),
        ({"geometry_dim": 12}, r"`geometry_dim` must be a positive multiple of 8"),
        ({"alignment_eta": 1.5, "alignment_moving_average": "convex"}, r"`alignment_eta` must be in \[0, 1\]"),
        ({"alignment_eta": -0.5}, r"`alignment_eta` must be a finite number >= 0"),
        ({"alignment_moving_average": "ema"}, r"`alignment_moving_average` must be one of \('additive', 'convex'\)"),
        ({"alignment_mask_input": "regions"}, r"`alignment_mask_input` must be one of \('query', 'query_and_regions'\)"),
        ({"alignment_mask_regions": 0}, r"`alignment_mask_regions` must be >= 1"),
    ],
)
def test_bad_config_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)
