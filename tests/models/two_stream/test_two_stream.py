"""Two-stream model: both cross-attention directions, supervision of the cross layers from logits equal to the one from
eager probabilities, pre-training losses, conversion from transformers' Lxmert, save/load exactness, the downstream
heads, and clear errors for bad input."""

import math

import pytest
import torch
from transformers import AutoModel, AutoModelForPreTraining, LxmertConfig, LxmertForPreTraining, LxmertModel

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import (
    AutoModelForVisualReasoning,
    TwoStreamConfig,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
    default_text_model_path,
)
from hf_vlalign.hub import convert_lxmert
from hf_vlalign.supervision import cross_modal_rollout, direct_supervision_loss, semi_direct_supervision_loss

B, T, R, DV = 3, 7, 5, 12


def tiny_config(**overrides) -> TwoStreamConfig:
    fields = dict(
        vocab_size=120,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        l_layers=2,
        r_layers=1,
        x_layers=2,
        visual_feat_dim=DV,
        num_object_labels=6,
        num_attr_labels=5,
        num_qa_labels=7,
        task_alignment=True,
        alignment_top_k=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return TwoStreamConfig(**{**fields, **overrides})


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
    return {
        "input_ids": torch.randint(1, 120, (B, T), generator=generator),
        "attention_mask": attention_mask,
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + sizes], dim=-1),
        "visual_attention_mask": visual_attention_mask,
        "word_region_alignment": alignment,
    }


def pretraining_labels(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.full((B, T), -100)
    labels[:, 2] = torch.randint(0, 120, (B,), generator=generator)
    masked = torch.zeros(B, R, dtype=torch.long)
    masked[:, 1] = 1
    object_labels = torch.where(masked.bool(), torch.randint(0, 6, (B, R), generator=generator), -100)
    attribute_labels = torch.where(masked.bool(), torch.randint(0, 5, (B, R), generator=generator), -100)
    return {
        "labels": labels,
        "object_labels": object_labels,
        "attribute_labels": attribute_labels,
        "feature_labels": torch.randn(B, R, DV, generator=generator),
        "masked_regions": masked,
        "matched_labels": torch.tensor([1, 0, 1]),
        "answer_labels": torch.tensor([3, -100, 6]),
    }


# --- the encoder ---------------------------------------------------------------------------------------------------


def test_both_cross_attention_directions_and_every_stack_are_returned():
    model = TwoStreamModel(tiny_config()).eval()
    outputs = model(**tiny_batch(), output_attentions=True, output_hidden_states=True)
    assert [tuple(a.shape) for a in outputs.cross_encoder_attentions] == [(B, 4, T, R)] * 2
    assert [tuple(a.shape) for a in outputs.cross_encoder_vision_attentions] == [(B, 4, R, T)] * 2
    assert [tuple(a.shape) for a in outputs.language_attentions] == [(B, 4, T, T)] * 2
    assert [tuple(a.shape) for a in outputs.vision_attentions] == [(B, 4, R, R)]
    assert len(outputs.language_hidden_states) == 2 + 2 and len(outputs.vision_hidden_states) == 1 + 2
    assert torch.equal(outputs.language_hidden_states[-1], outputs.language_output)
    # rows are distributions over the unmasked keys only
    l2v, v2l = outputs.cross_encoder_attentions[0], outputs.cross_encoder_vision_attentions[0]
    torch.testing.assert_close(l2v.sum(-1), torch.ones(B, 4, T))
    assert float(l2v[2, :, :, -1].detach().abs().max()) == 0.0  # the padded region of example 2
    assert float(v2l[1, :, :, -2:].detach().abs().max()) == 0.0  # the padded tokens of example 1


def test_sdpa_and_eager_agree():
    model = TwoStreamModel(tiny_config(attention_supervision="direct")).eval()
    batch = tiny_batch()
    sdpa = model(**batch)
    eager = model(**batch, output_attentions=True)
    for name in ("language_output", "vision_output", "pooler_output", "loss_attention_supervision"):
        torch.testing.assert_close(sdpa[name], eager[name], atol=1e-5, rtol=1e-5)


def test_shared_and_separate_cross_attention():
    shared, separate = TwoStreamModel(tiny_config()), TwoStreamModel(tiny_config(share_cross_attention=False))
    assert shared.encoder.cross_layers[0].vision_cross_attention is None
    assert separate.encoder.cross_layers[0].vision_cross_attention is not None
    extra = sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in shared.parameters())
    block = separate.encoder.cross_layers[0].vision_cross_attention
    assert extra == 2 * sum(p.numel() for p in block.parameters())


@pytest.mark.parametrize("layers, heads", [(None, None), ([1], [0, 2])])
def test_direct_supervision_of_cross_layers_equals_loss_from_eager_probabilities(layers, heads):
    config = tiny_config(attention_supervision="direct", supervised_layers=layers, supervised_heads=heads)
    model = TwoStreamModel(config).eval()
    batch = tiny_batch()
    outputs = model(**batch, output_attentions=True)
    heads = heads or list(range(4))
    layers = layers or [0, 1]
    # eq. (6): each head's probabilities re-normalised over the real regions are a softmax of its logits on them
    t2r = [outputs.cross_encoder_attentions[layer][:, heads].log() for layer in layers]
    r2t = [outputs.cross_encoder_vision_attentions[layer][:, heads].clamp(min=1e-30).log() for layer in layers]
    expected = direct_supervision_loss(
        t2r, r2t, batch["word_region_alignment"], batch["attention_mask"], batch["visual_attention_mask"]
    )
    torch.testing.assert_close(outputs.loss_attention_supervision, expected, atol=1e-5, rtol=1e-5)


def test_cross_modal_rollout_on_a_hand_example():
    # one word, one region, every attention trivially 1: each sub-layer mixes half of the other modality in
    probs = {
        name: torch.ones(1, 1, 1, 1)
        for name in ("language_to_vision", "vision_to_language", "language_self", "vision_self")
    }
    (rollout,) = cross_modal_rollout([probs])
    # cross: rownorm([[1, 1], [1, 1]]) = 1/2 everywhere; self: rownorm(2 I) = I
    torch.testing.assert_close(rollout, torch.full((1, 2, 2), 0.5))
    (first, second) = cross_modal_rollout([probs, probs])
    torch.testing.assert_close(second, torch.full((1, 2, 2), 0.5))


def test_semi_direct_supervision_trains_and_matches_its_rollout_definition():
    model = TwoStreamModel(tiny_config(attention_supervision="semi_direct")).eval()
    batch = tiny_batch()
    loss = model(**batch).loss_attention_supervision
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.encoder.cross_layers[0].cross_attention.self.query.weight.grad.abs().sum() > 0
    # the same loss from the layer's query/key projections, recomputed by hand
    captured = {}
    hooks = [
        layer.register_forward_hook(lambda module, args, output, index=index: captured.__setitem__(index, output[3]))
        for index, layer in enumerate(model.encoder.cross_layers)
    ]
    model.zero_grad()
    with torch.no_grad():
        model(**batch)
    for hook in hooks:
        hook.remove()
    masks = {"language_to_vision": batch["visual_attention_mask"], "vision_to_language": batch["attention_mask"],
             "language_self": batch["attention_mask"], "vision_self": batch["visual_attention_mask"]}  # fmt: skip
    scaling = (32 // 4) ** -0.5
    probs = [
        {
            name: torch.softmax(
                (q @ k.transpose(-1, -2) * scaling).masked_fill(masks[name][:, None, None, :] == 0, -1e9), -1
            )
            for name, (q, k) in captured[index].items()
        }
        for index in range(2)
    ]
    expected = semi_direct_supervision_loss(
        cross_modal_rollout(probs), slice(0, T), slice(T, T + R), batch["word_region_alignment"],
        batch["attention_mask"], batch["visual_attention_mask"],
    )  # fmt: skip
    torch.testing.assert_close(loss.detach(), expected, atol=1e-5, rtol=1e-5)


def test_indirect_supervision_uses_final_states():
    model = TwoStreamModel(tiny_config(attention_supervision="indirect"))
    batch = tiny_batch()
    phrase_masks = batch["word_region_alignment"].sum(-1, keepdim=True).transpose(1, 2) > 0
    loss = model(**batch, phrase_masks=phrase_masks).loss_attention_supervision
    assert torch.isfinite(loss) and loss > 0


# --- pre-training heads --------------------------------------------------------------------------------------------


def test_pretraining_losses_match_their_definitions():
    model = TwoStreamForPreTraining(tiny_config()).eval()
    batch, labels = tiny_batch(), pretraining_labels()
    outputs = model(**batch, **labels)
    masked = labels["labels"] != -100
    torch.testing.assert_close(
        outputs.loss_mlm, torch.nn.functional.cross_entropy(outputs.prediction_logits[masked], labels["labels"][masked])
    )
    torch.testing.assert_close(
        outputs.loss_itm, torch.nn.functional.cross_entropy(outputs.cross_relationship_score, labels["matched_labels"])
    )
    answered = labels["answer_labels"] != -100
    torch.testing.assert_close(
        outputs.loss_qa,
        torch.nn.functional.cross_entropy(
            outputs.question_answering_score[answered], labels["answer_labels"][answered]
        ),
    )
    expected_total = sum(
        outputs[name]
        for name in (
            "loss_mlm",
            "loss_object_class",
            "loss_object_attr",
            "loss_region_feature",
            "loss_itm",
            "loss_qa",
            "loss_alignment",
        )
    )
    torch.testing.assert_close(outputs.loss, expected_total)
    assert outputs.alignment_scores.shape == (B, T, R)


def test_loss_weights_and_switches():
    config = tiny_config(task_qa=False, mlm_weight=2.0, alignment_weight=0.5, visual_feat_loss=False)
    outputs = TwoStreamForPreTraining(config).eval()(**tiny_batch(), **pretraining_labels())
    assert outputs.loss_qa is None and outputs.question_answering_score is None and outputs.loss_region_feature is None
    expected = (
        2.0 * outputs.loss_mlm
        + outputs.loss_object_class
        + outputs.loss_object_attr
        + outputs.loss_itm
        + 0.5 * outputs.loss_alignment
    )
    torch.testing.assert_close(outputs.loss, expected)


def test_training_scores_only_masked_words_with_the_same_loss():
    model = TwoStreamForPreTraining(tiny_config())
    batch, labels = tiny_batch(), pretraining_labels()
    model.train()
    sparse = model(**batch, **labels)
    model.eval()
    full = model(**batch, **labels)
    assert sparse.prediction_logits is None and full.prediction_logits.shape == (B, T, 120)
    torch.testing.assert_close(sparse.loss_mlm, full.loss_mlm)


def test_mlm_decoder_is_tied_to_word_embeddings(tmp_path):
    model = TwoStreamForPreTraining(tiny_config())
    assert model.lm_head.decoder.weight is model.two_stream.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path)
    reloaded = TwoStreamForPreTraining.from_pretrained(tmp_path)
    assert reloaded.lm_head.decoder.weight is reloaded.two_stream.embeddings.word_embeddings.weight


def test_alignment_loss_reaches_the_alignment_decoder_and_the_encoder():
    model = TwoStreamForPreTraining(tiny_config())
    model(**tiny_batch()).loss_alignment.backward()
    assert model.alignment_decoder.language_projection.dense_in.weight.grad.abs().sum() > 0
    assert model.two_stream.encoder.cross_layers[-1].language_output.dense.weight.grad.abs().sum() > 0


# --- downstream heads ----------------------------------------------------------------------------------------------


def test_question_answering_hard_and_soft_labels():
    model = TwoStreamForQuestionAnswering(tiny_config()).eval()
    batch = tiny_batch()
    hard = model(**batch, labels=torch.tensor([0, 6, -100]))
    torch.testing.assert_close(hard.loss, torch.nn.functional.cross_entropy(hard.logits[:2], torch.tensor([0, 6])))
    soft_labels = torch.zeros(B, 7)
    soft_labels[0, 1], soft_labels[1, 2], soft_labels[1, 3] = 1.0, 0.3, 0.6
    soft = model(**batch, labels=soft_labels)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(soft.logits, soft_labels, reduction="sum") / B
    torch.testing.assert_close(soft.loss, expected)


def test_visual_reasoning_reads_image_pairs():
    model = TwoStreamForVisualReasoning(tiny_config()).eval()
    batch = tiny_batch()
    pair = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "visual_feats": torch.stack([batch["visual_feats"], batch["visual_feats"].flip(0)], dim=1),
        "visual_boxes": torch.stack([batch["visual_boxes"], batch["visual_boxes"]], dim=1),
        "visual_attention_mask": torch.ones(B, 2, R, dtype=torch.long),
    }
    outputs = model(**pair, labels=torch.tensor([1, 0, 1]))
    assert outputs.logits.shape == (B,)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(outputs.logits, torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(outputs.loss, expected)
    with pytest.raises(ValueError, match=r"`visual_feats` must have shape \(batch, 2, R, visual_feat_dim\)"):
        model(**{**pair, "visual_feats": batch["visual_feats"]})


def test_downstream_heads_start_from_a_pretraining_checkpoint(tmp_path):
    pretrained = TwoStreamForPreTraining(tiny_config())
    pretrained.save_pretrained(tmp_path)
    qa = TwoStreamForQuestionAnswering.from_pretrained(tmp_path)
    for name, tensor in pretrained.state_dict().items():
        if name.startswith(("two_stream.", "answer_head.")):
            assert torch.equal(qa.state_dict()[name], tensor), name
    reasoning = AutoModelForVisualReasoning.from_pretrained(tmp_path)
    assert isinstance(reasoning, TwoStreamForVisualReasoning)
    assert torch.equal(reasoning.two_stream.pooler.dense.weight, pretrained.two_stream.pooler.dense.weight)


# --- save / load / conversion --------------------------------------------------------------------------------------


def test_save_load_roundtrip_is_exact_with_safetensors(tmp_path):
    model = TwoStreamForPreTraining(tiny_config(attention_supervision="direct", share_cross_attention=False)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not list(tmp_path.glob("*.bin"))
    for loader in (TwoStreamForPreTraining, AutoModelForPreTraining):
        reloaded = loader.from_pretrained(tmp_path).eval()
        assert type(reloaded) is TwoStreamForPreTraining
        for name, tensor in model.state_dict().items():
            assert torch.equal(reloaded.state_dict()[name], tensor), name
        batch = tiny_batch()
        torch.testing.assert_close(reloaded(**batch).loss, model(**batch).loss, atol=0, rtol=0)
    encoder = AutoModel.from_pretrained(tmp_path)
    assert type(encoder) is TwoStreamModel


def lxmert_config() -> LxmertConfig:
    return LxmertConfig(
        vocab_size=120, hidden_size=32, num_attention_heads=4, intermediate_size=64, l_layers=2, r_layers=2,
        x_layers=2, visual_feat_dim=DV, num_object_labels=6, num_attr_labels=5, num_qa_labels=7,
        max_position_embeddings=32,
    )  # fmt: skip


def test_conversion_from_lxmert_gives_equal_outputs():
    torch.manual_seed(0)
    lxmert = LxmertModel(lxmert_config()).eval()
    converted = convert_lxmert(lxmert)
    assert isinstance(converted, TwoStreamModel) and converted.config.share_cross_attention
    batch = tiny_batch()
    with torch.no_grad():
        expected = lxmert(
            input_ids=batch["input_ids"], visual_feats=batch["visual_feats"], visual_pos=batch["visual_boxes"],
            attention_mask=batch["attention_mask"], visual_attention_mask=batch["visual_attention_mask"],
            output_attentions=True,
        )  # fmt: skip
        outputs = converted(**{k: v for k, v in batch.items() if k != "word_region_alignment"}, output_attentions=True)
    # transformers' Lxmert calls the pooled [CLS] state `pooled_output`; ours is `pooler_output` (BERT's name)
    for ours, theirs in (("language_output",) * 2, ("vision_output",) * 2, ("pooler_output", "pooled_output")):
        torch.testing.assert_close(outputs[ours], expected[theirs], atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(outputs.cross_encoder_attentions, expected.cross_encoder_attentions):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_conversion_of_lxmert_pretraining_heads():
    torch.manual_seed(1)
    lxmert = LxmertForPreTraining(lxmert_config()).eval()
    converted = convert_lxmert(lxmert)
    assert isinstance(converted, TwoStreamForPreTraining)
    batch = tiny_batch()
    with torch.no_grad():
        expected = lxmert(
            input_ids=batch["input_ids"], visual_feats=batch["visual_feats"], visual_pos=batch["visual_boxes"],
            attention_mask=batch["attention_mask"], visual_attention_mask=batch["visual_attention_mask"],
        )  # fmt: skip
        outputs = converted(**{k: v for k, v in batch.items() if k != "word_region_alignment"})
    for name in ("prediction_logits", "cross_relationship_score", "question_answering_score"):
        torch.testing.assert_close(outputs[name], expected[name], atol=1e-5, rtol=1e-5)


def test_from_text_pretrained_copies_the_real_minilm_language_layers():
    model = TwoStreamModel.from_text_pretrained(l_layers=2, r_layers=1, x_layers=1, visual_feat_dim=DV)
    minilm = AutoModel.from_pretrained(default_text_model_path())
    assert torch.equal(model.embeddings.word_embeddings.weight, minilm.embeddings.word_embeddings.weight)
    for index in range(2):
        ours, theirs = model.encoder.language_layers[index].state_dict(), minilm.encoder.layer[index].state_dict()
        assert set(ours) == set(theirs)
        assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    with pytest.raises(ValueError, match=r"`l_layers` \(7\) must be <= the 6 layers"):
        TwoStreamModel.from_text_pretrained(l_layers=7, visual_feat_dim=DV)


# --- errors --------------------------------------------------------------------------------------------------------


def _unnormalised_alignment(batch):
    batch["word_region_alignment"][0, 1, 2] = 0.7


def _region_count_mismatch(batch):
    batch["visual_boxes"] = batch["visual_boxes"][:, :-1]


def _nan_feature(batch):
    batch["visual_feats"][0, 0, 0] = math.nan


@pytest.mark.parametrize(
    "mutate, match",
    [
        (_unnormalised_alignment, r"`word_region_alignment` rows must each sum to 1"),
        (_region_count_mismatch, r"`visual_boxes` must have shape \(batch, num_regions, 4\)"),
        (_nan_feature, r"`visual_feats` must be finite"),
    ],
)
def test_bad_input_raises_a_clear_value_error(mutate, match):
    batch = tiny_batch()
    mutate(batch)
    with pytest.raises(ValueError, match=match):
        TwoStreamForPreTraining(tiny_config())(**batch)


def test_top_k_larger_than_the_regions_keeps_every_real_region():
    """Eq. (13)'s top-k over fewer than k regions is the softmax over all of them, as for an example with padding."""
    losses = []
    for k in (R, R + 1):
        torch.manual_seed(0)
        losses.append(TwoStreamForPreTraining(tiny_config(alignment_top_k=k)).eval()(**tiny_batch()).loss_alignment)
    torch.testing.assert_close(losses[0], losses[1])


def test_bad_labels_are_refused():
    model = TwoStreamForPreTraining(tiny_config())
    with pytest.raises(ValueError, match=r"`answer_labels` must be in \[0, 6\]"):
        model(**tiny_batch(), answer_labels=torch.tensor([7, 0, 0]))
    with pytest.raises(ValueError, match=r"`object_labels` must have shape"):
        model(**tiny_batch(), object_labels=torch.zeros(B, R + 1, dtype=torch.long))


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"num_qa_labels": 0}, r"`num_qa_labels` \(the answer vocabulary\) must be >= 1, got an empty vocabulary"),
        ({"hidden_size": 30}, r"`hidden_size` \(30\) must be a multiple of `num_attention_heads`"),
        ({"supervised_layers": [2]}, r"`supervised_layers` must hold layer indices in \[0, 1\]"),
        ({"attention_supervision": "cross"}, r"`attention_supervision` must be one of"),
        ({"alignment_top_k": 0}, r"`alignment_top_k` must be >= 1"),
    ],
)
def test_bad_config_raises_value_error(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


def test_conversion_of_lxmert_question_answering():
    from transformers import LxmertForQuestionAnswering

    torch.manual_seed(2)
    lxmert = LxmertForQuestionAnswering(lxmert_config()).eval()
    converted = convert_lxmert(lxmert)
    assert isinstance(converted, TwoStreamForQuestionAnswering)
    batch = tiny_batch()
    with torch.no_grad():
        expected = lxmert(
            input_ids=batch["input_ids"], visual_feats=batch["visual_feats"], visual_pos=batch["visual_boxes"],
            attention_mask=batch["attention_mask"], visual_attention_mask=batch["visual_attention_mask"],
        )  # fmt: skip
        outputs = converted(**{k: v for k, v in batch.items() if k != "word_region_alignment"})
    torch.testing.assert_close(outputs.logits, expected.question_answering_score, atol=1e-5, rtol=1e-5)


def test_conversion_refuses_other_models():
    with pytest.raises(ValueError, match=r"`model_or_path` must be one of"):
        convert_lxmert(TwoStreamModel(tiny_config()))


def test_alignment_top_k_default_is_the_printed_k():
    """Kervadec et al. 2020, sec. 5, after eq. (13): "In this work, we empirically set k = 3"."""
    assert TwoStreamConfig().alignment_top_k == 3
