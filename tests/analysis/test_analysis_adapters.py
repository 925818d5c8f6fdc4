"""Attention adapters: AttentionBlocks built from five real tiny models (our single-stream, two-stream and captioner,
transformers' VisualBert and Lxmert) slice the right parts of the raw maps; the grounding probe runs on them end to
end; the new plots write PNGs; the bertviz export round-trips through JSON; bad input raises naming the argument."""

import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from transformers import LxmertConfig, LxmertModel, VisualBertConfig, VisualBertModel

from hf_vlalign import SingleStreamConfig, SingleStreamModel, TwoStreamConfig, TwoStreamModel
from hf_vlalign.analysis.adapters import attention_blocks, infer_source, text_to_region_rows
from hf_vlalign.analysis.attention_blocks import AttentionBlocks
from hf_vlalign.analysis.bertviz_export import bertviz_inputs, load_bertviz_inputs, save_bertviz_inputs
from hf_vlalign.analysis.grounding_probe import GroundingProbe
from hf_vlalign.analysis.attention_plots import plot_head_grid, plot_layer_heatmaps, plot_top_regions_on_image
from hf_vlalign.models.captioning import RegionCaptionerConfig, RegionCaptionerModel

B, T, R, DV, H, V = 3, 6, 4, 12, 4, 60


def masks() -> tuple[torch.Tensor, torch.Tensor]:
    text_mask = torch.ones(B, T, dtype=torch.long)
    text_mask[1, -2:] = 0
    region_mask = torch.ones(B, R, dtype=torch.long)
    region_mask[2, -1] = 0
    return text_mask, region_mask


def regions(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    sizes = 0.1 + torch.rand(B, R, 2, generator=generator) * 0.4
    return {
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + sizes], dim=-1),
    }


def input_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(seed))


def run_single_stream(output_attentions: bool = True):
    torch.manual_seed(0)
    config = SingleStreamConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=H, intermediate_size=64,
        max_position_embeddings=32, visual_feat_dim=DV, attention_supervision="none",
    )  # fmt: skip
    text_mask, region_mask = masks()
    with torch.no_grad():
        return SingleStreamModel(config).eval()(
            input_ids=input_ids(), attention_mask=text_mask, visual_attention_mask=region_mask,
            output_attentions=output_attentions, **regions(),
        )  # fmt: skip


def run_two_stream():
    torch.manual_seed(0)
    config = TwoStreamConfig(
        vocab_size=V, hidden_size=32, num_attention_heads=H, intermediate_size=64, max_position_embeddings=32,
        l_layers=3, r_layers=1, x_layers=2, visual_feat_dim=DV, num_object_labels=6, num_attr_labels=5,
        num_qa_labels=7, share_cross_attention=False,
    )  # fmt: skip
    text_mask, region_mask = masks()
    with torch.no_grad():
        return TwoStreamModel(config).eval()(
            input_ids=input_ids(), attention_mask=text_mask, visual_attention_mask=region_mask,
            output_attentions=True, **regions(),
        )  # fmt: skip


def run_captioner():
    torch.manual_seed(0)
    config = RegionCaptionerConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=H,
        decoder_attention_heads=H, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=DV,
        max_position_embeddings=24, dropout=0.0, attention_dropout=0.0, geometry_dim=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    text_mask, region_mask = masks()
    with torch.no_grad():
        return RegionCaptionerModel(config).eval()(
            decoder_input_ids=input_ids(), decoder_attention_mask=text_mask, visual_attention_mask=region_mask,
            use_cache=False, output_attentions=True, **regions(),
        )  # fmt: skip


def visual_bert_model() -> VisualBertModel:
    torch.manual_seed(0)
    config = VisualBertConfig(
        vocab_size=V, hidden_size=32, visual_embedding_dim=DV, num_hidden_layers=2, num_attention_heads=H,
        intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    return VisualBertModel(config).eval()


def run_visual_bert(model: VisualBertModel | None = None, ids: torch.Tensor | None = None):
    text_mask, region_mask = masks()
    with torch.no_grad():
        return (model or visual_bert_model())(
            input_ids=input_ids() if ids is None else ids, attention_mask=text_mask,
            visual_embeds=regions()["visual_feats"], visual_attention_mask=region_mask, output_attentions=True,
        )  # fmt: skip


def run_lxmert():
    torch.manual_seed(0)
    config = LxmertConfig(
        vocab_size=V, hidden_size=32, num_attention_heads=H, intermediate_size=64, l_layers=2, r_layers=1,
        x_layers=3, visual_feat_dim=DV, visual_pos_dim=4, num_object_labels=6, num_attr_labels=5, num_qa_labels=7,
        max_position_embeddings=32,
    )  # fmt: skip
    text_mask, region_mask = masks()
    batch = regions()
    with torch.no_grad():
        return LxmertModel(config).eval()(
            input_ids=input_ids(), visual_feats=batch["visual_feats"], visual_pos=batch["visual_boxes"],
            attention_mask=text_mask, visual_attention_mask=region_mask, output_attentions=True,
        )  # fmt: skip


def build(outputs, source=None) -> AttentionBlocks:
    text_mask, region_mask = masks()
    return attention_blocks(outputs, text_mask=text_mask, region_mask=region_mask, source=source)


def assert_rows_sum_to_one(maps):
    for attention in maps:
        torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]), atol=1e-5, rtol=0)


def assert_same_maps(block, raw):
    assert block is not None and len(block) == len(raw)
    for ours, theirs in zip(block, raw):
        assert torch.equal(ours, theirs)


# --- joint maps ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source, extra", [("single_stream", 1), ("visual_bert", 0)])
def test_joint_maps_are_sliced_into_the_four_blocks(source, extra):
    outputs = run_single_stream() if source == "single_stream" else run_visual_bert()
    assert infer_source(outputs) == source
    blocks = build(outputs)
    assert blocks.source == source and blocks.available() == (
        "word_to_word", "word_to_region", "region_to_region", "region_to_word"
    )  # fmt: skip
    assert outputs.attentions[0].shape == (B, H, T + R + extra, T + R + extra)
    layers = len(outputs.attentions)
    expected = {"word_to_word": (T, T), "word_to_region": (T, R), "region_to_region": (R, R), "region_to_word": (R, T)}
    for name, (queries, keys) in expected.items():
        assert len(blocks.block(name)) == layers
        assert all(attention.shape == (B, H, queries, keys) for attention in blocks.block(name))
    for layer, joint in enumerate(outputs.attentions):
        assert torch.equal(blocks.word_to_word[layer], joint[:, :, :T, :T])
        assert torch.equal(blocks.word_to_region[layer], joint[:, :, :T, T : T + R])
        assert torch.equal(blocks.region_to_region[layer], joint[:, :, T : T + R, T : T + R])
        assert torch.equal(blocks.region_to_word[layer], joint[:, :, T : T + R, :T])
        # the four blocks hold the whole mass of a row except the [END] column of the single-stream model
        total = blocks.word_to_word[layer].sum(-1) + blocks.word_to_region[layer].sum(-1)
        torch.testing.assert_close(total, 1 - joint[:, :, :T, T + R :].sum(-1), atol=1e-5, rtol=0)
    if extra:
        assert float(outputs.attentions[0][:, :, :T, -1].max()) > 0  # the dropped [END] column did hold attention


def test_text_to_region_rows_renormalise_over_real_regions():
    blocks = build(run_single_stream())
    rows = text_to_region_rows(blocks)
    assert len(rows) == 3 and rows[0].shape == (B, H, T, R)
    for layer, attention in enumerate(rows):
        torch.testing.assert_close(attention.sum(-1), torch.ones(B, H, T), atol=1e-5, rtol=0)
        assert float(attention[2, :, :, -1].abs().max()) == 0.0  # padded region of example 2
        raw = blocks.word_to_region[layer][0]
        torch.testing.assert_close(attention[0], raw / raw.sum(-1, keepdim=True))


# --- separate maps ---------------------------------------------------------------------------------------------------


def test_two_stream_blocks_map_language_vision_and_both_cross_directions():
    outputs = run_two_stream()
    blocks = build(outputs)
    assert blocks.source == "two_stream"
    assert_same_maps(blocks.word_to_word, outputs.language_attentions)  # 3 language layers
    assert_same_maps(blocks.region_to_region, outputs.vision_attentions)  # 1 object layer
    assert_same_maps(blocks.word_to_region, outputs.cross_encoder_attentions)  # 2 cross layers
    assert_same_maps(blocks.region_to_word, outputs.cross_encoder_vision_attentions)
    assert [len(blocks.block(name)) for name in blocks.available()] == [3, 2, 1, 2]
    assert blocks.word_to_region[0].shape == (B, H, T, R) and blocks.region_to_word[0].shape == (B, H, R, T)
    for name in blocks.available():
        assert_rows_sum_to_one(blocks.block(name))


def test_lxmert_cross_encoder_attentions_are_language_to_vision():
    outputs = run_lxmert()
    assert infer_source(outputs) == "lxmert"
    blocks = build(outputs)
    assert blocks.available() == ("word_to_word", "word_to_region", "region_to_region")
    assert blocks.region_to_word is None
    assert_same_maps(blocks.word_to_word, outputs.language_attentions)
    assert_same_maps(blocks.region_to_region, outputs.vision_attentions)
    assert_same_maps(blocks.word_to_region, outputs.cross_encoder_attentions)
    assert len(blocks.word_to_region) == 3 and blocks.word_to_region[0].shape == (B, H, T, R)
    for name in blocks.available():
        assert_rows_sum_to_one(blocks.block(name))
    # padded region of example 2 gets no attention from the words
    assert float(blocks.word_to_region[0][2, :, :, -1].max()) < 1e-6


def test_captioner_blocks_are_encoder_decoder_and_cross_attention():
    outputs = run_captioner()
    assert infer_source(outputs) == "captioner"
    blocks = build(outputs)
    assert blocks.available() == ("word_to_word", "word_to_region", "region_to_region")
    assert_same_maps(blocks.region_to_region, outputs.encoder_attentions)
    assert_same_maps(blocks.word_to_word, outputs.decoder_attentions)
    assert_same_maps(blocks.word_to_region, outputs.cross_attentions)
    assert len(blocks.region_to_region) == 2 and len(blocks.word_to_word) == 3
    for name in blocks.available():
        assert_rows_sum_to_one(blocks.block(name))
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert float(blocks.word_to_word[0][..., upper].abs().max()) < 1e-6  # causal decoder self-attention


# --- grounding probe end to end --------------------------------------------------------------------------------------


def test_grounding_probe_runs_on_visual_bert_blocks():
    model = visual_bert_model()
    probe = GroundingProbe(model.config.num_hidden_layers, model.config.num_attention_heads)
    text_mask, region_mask = masks()
    # phrases end at tokens 2 and 3 (example 0), 1 (example 1) and 4 (example 2); -1 is a padded phrase slot
    phrase_token_index = torch.tensor([[2, 3], [1, -1], [4, -1]])
    phrase_region_iou = torch.zeros(B, 2, R)
    phrase_region_iou[0, 0, 1] = 0.8
    phrase_region_iou[0, 1, [0, 2]] = torch.tensor([0.6, 0.3])
    phrase_region_iou[1, 0, 3] = 0.9
    phrase_region_iou[2, 0, 0] = 0.7
    confidence = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.5, 0.1, 0.2, 0.4], [0.2, 0.1, 0.3, 0.9]])
    for seed in (1, 2):
        blocks = build(run_visual_bert(model, input_ids(seed)))
        rows = torch.stack(text_to_region_rows(blocks))
        assert rows.shape == (2, B, H, T, R)
        probe.update_from_text_to_region(rows, phrase_token_index, phrase_region_iou, region_mask, confidence)
    result = probe.compute()
    assert result.num_phrases == 8
    assert result.accuracy.shape == (2, H)
    assert ((result.accuracy >= 0) & (result.accuracy <= 1)).all()
    # the baseline picks region 1 (example 0: a hit for its first phrase only), 0 (example 1: a miss) and 2
    # (example 2, whose most confident region 3 is padded: a miss), so 1 hit in 4 phrases per batch
    assert result.baseline_accuracy == pytest.approx(0.25)
    # every accuracy is a count of hits over the 8 phrases
    assert np.allclose(result.accuracy * 8, np.round(result.accuracy * 8))


# --- plots -----------------------------------------------------------------------------------------------------------


def small_image(tmp_path):
    image = Image.new("RGB", (96, 64), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([5, 5, 40, 30], fill="red")
    draw.ellipse([50, 20, 90, 60], fill="blue")
    path = tmp_path / "scene.png"
    image.save(path)
    return image, path


def assert_png(path):
    assert path.stat().st_size > 1000
    with Image.open(path) as written:
        assert written.format == "PNG"
        assert np.asarray(written.convert("L")).std() > 10


def test_plot_top_regions_on_image_from_pil_and_path(tmp_path):
    image, image_path = small_image(tmp_path)
    boxes = np.array([[5, 5, 40, 30], [50, 20, 90, 60], [0, 0, 95, 63], [30, 10, 70, 50]], dtype=float)
    attention = np.array([[0.6, 0.2, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.25, 0.25, 0.4, 0.1]])
    words = ["red", "circle", "scene"]
    for source, name in ((image, "pil.png"), (image_path, "path.png"), (str(image_path), "str.png")):
        assert_png(plot_top_regions_on_image(source, boxes, words, attention, tmp_path / "out" / name, top_k=2))
    assert_png(plot_top_regions_on_image(image, boxes, words[:1], attention[:1], tmp_path / "one.png", top_k=9))


def test_plot_head_grid_and_layer_heatmaps(tmp_path):
    blocks = build(run_two_stream())
    words, region_labels = [f"w{i}" for i in range(T)], [f"[R{i}]" for i in range(R)]
    assert_png(plot_head_grid(blocks.word_to_region[0][0], words, region_labels, tmp_path / "heads.png", "cross 0"))
    rows = torch.stack(text_to_region_rows(blocks))[:, 0].mean(1)  # (L, T, R) of example 0, heads averaged
    assert_png(plot_layer_heatmaps(rows, words, region_labels, tmp_path / "layers.png"))


def test_plots_raise_naming_the_argument(tmp_path):
    image, _ = small_image(tmp_path)
    boxes = np.array([[5, 5, 40, 30], [50, 20, 90, 60]], dtype=float)
    attention = np.array([[0.6, 0.4]])
    with pytest.raises(ValueError, match="`image`"):
        plot_top_regions_on_image(tmp_path / "missing.png", boxes, ["a"], attention, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- bertviz export --------------------------------------------------------------------------------------------------


def test_bertviz_export_of_a_joint_map_keeps_the_end_token(tmp_path):
    outputs = run_single_stream()
    tokens = [f"w{i}" for i in range(T)]
    inputs = bertviz_inputs(outputs.attentions, tokens, batch_index=1, num_regions=R)
    assert inputs["tokens"] == tokens + ["[R0]", "[R1]", "[R2]", "[R3]", "[END]"]
    assert len(inputs["attention"]) == 3
    for ours, raw in zip(inputs["attention"], outputs.attentions):
        assert torch.equal(ours, raw[1:2])
    path = save_bertviz_inputs(tmp_path / "bertviz" / "joint.json", outputs.attentions, tokens, num_regions=R)
    loaded = load_bertviz_inputs(path)
    assert set(loaded) == {"attention", "tokens"} and loaded["tokens"] == inputs["tokens"]
    for ours, raw in zip(loaded["attention"], outputs.attentions):
        torch.testing.assert_close(ours, raw[0:1], atol=0, rtol=0)


def test_bertviz_export_of_two_stream_blocks_places_each_block(tmp_path):
    outputs = run_two_stream()
    blocks = build(outputs)
    tokens = [f"w{i}" for i in range(T)]
    inputs = bertviz_inputs(blocks, tokens, batch_index=0)
    attention = inputs["attention"]
    assert inputs["tokens"] == tokens + [f"[R{i}]" for i in range(R)]
    assert len(attention) == 3 + 2  # max(l_layers=3, r_layers=1) single-modality layers, then 2 cross layers
    assert all(layer.shape == (1, H, T + R, T + R) for layer in attention)
    assert torch.equal(attention[0][0, :, :T, :T], outputs.language_attentions[0][0])
    assert torch.equal(attention[0][0, :, T:, T:], outputs.vision_attentions[0][0])
    assert float(attention[1][0, :, T:, T:].abs().max()) == 0.0  # no second object layer
    assert float(attention[0][0, :, :T, T:].abs().max()) == 0.0  # no cross attention in the language layers
    assert torch.equal(attention[3][0, :, :T, T:], outputs.cross_encoder_attentions[0][0])
    assert torch.equal(attention[4][0, :, T:, :T], outputs.cross_encoder_vision_attentions[1][0])
    assert float(attention[4][0, :, :T, :T].abs().max()) == 0.0
    # example 1 has two padded words: they are dropped
    trimmed = bertviz_inputs(blocks, tokens, batch_index=1)
    assert trimmed["tokens"] == tokens[:-2] + [f"[R{i}]" for i in range(R)]
    assert trimmed["attention"][0].shape == (1, H, T - 2 + R, T - 2 + R)
    assert torch.equal(trimmed["attention"][4][0, :, : T - 2, T - 2 :], outputs.cross_encoder_attentions[1][1, :, :-2])
    path = save_bertviz_inputs(tmp_path / "two_stream.json", blocks, tokens, batch_index=1)
    assert set(json.loads(path.read_text())) == {"attention", "tokens"}
    loaded = load_bertviz_inputs(path)
    assert loaded["tokens"] == trimmed["tokens"]
    for ours, expected in zip(loaded["attention"], trimmed["attention"]):
        torch.testing.assert_close(ours, expected, atol=0, rtol=0)


def test_bertviz_export_of_captioner_blocks_runs_encoder_then_decoder():
    outputs = run_captioner()
    inputs = bertviz_inputs(build(outputs), [f"w{i}" for i in range(T)], trim_padding=False)
    attention = inputs["attention"]
    assert len(attention) == 2 + 3
    assert torch.equal(attention[1][0, :, T:, T:], outputs.encoder_attentions[1][0])
    assert torch.equal(attention[2][0, :, :T, :T], outputs.decoder_attentions[0][0])
    assert torch.equal(attention[2][0, :, :T, T:], outputs.cross_attentions[0][0])
    assert float(attention[2][0, :, T:, :].abs().max()) == 0.0  # no region->word attention in a captioner


# --- errors ----------------------------------------------------------------------------------------------------------


def test_errors_name_the_argument(tmp_path):
    text_mask, region_mask = masks()
    with pytest.raises(ValueError, match="`outputs`"):
        build(run_single_stream(output_attentions=False))
    outputs = run_single_stream()
    with pytest.raises(ValueError, match="`text_mask`"):
        attention_blocks(outputs, text_mask=text_mask[:, :-1], region_mask=region_mask)
    with pytest.raises(ValueError, match="`source`"):
        build(outputs, source="bert")
    # a single-stream map read as VisualBert (no [END] token) does not fit the masks
    with pytest.raises(ValueError, match="`region_mask`"):
        build(outputs, source="visual_bert")
    two_stream = run_two_stream()
    with pytest.raises(ValueError, match="`outputs`"):
        build({"language_output": two_stream.language_output}, source="two_stream")
    (tmp_path / "bad.json").write_text(json.dumps({"tokens": []}))
    with pytest.raises(ValueError, match="`path`"):
        load_bertviz_inputs(tmp_path / "bad.json")
