"""Every loss that is a mean over a variable number of items divides by the count it is given (`global_item_counts`).

For every head of every family, a batch is split into two shards with different numbers of grounded words, masked
tokens, caption tokens, phrases, ...; with the global counts (the sum of the shards' `loss_item_counts`), the shards'
losses sum to the loss of the whole batch, component by component, and so do their gradients. That is what makes N
processes x B examples (or B / k examples x k accumulation steps) train exactly as one process with N x B; the
multi-process runs themselves are in `tests/trainers/test_multiprocess.py`. Without counts, each loss is its batch's own mean.
"""

from __future__ import annotations

import pytest
import torch
from test_captioning import tiny_config as captioner_config
from test_single_stream import tiny_config as single_stream_config
from test_task_heads import grounding, regions, task_batch, text
from test_two_stream import tiny_config as two_stream_config

import hf_vlalign
from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    SingleStreamForPreTraining,
    SingleStreamForVisualParaphrase,
    TwoStreamForPreTraining,
)
from hf_vlalign.utils.item_counts import mean_over_items

B, T, R, DV = 3, 8, 5, 12
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
TOLERANCE = 1e-5


def add_counts(first: dict, second: dict) -> dict:
    assert first.keys() == second.keys()  # the keys depend on the config only
    return {key: first[key] + second[key] for key in first}


def shard(batch: dict, rows: slice) -> dict:
    return {key: value[rows] for key, value in batch.items()}


def losses_of(output) -> dict[str, torch.Tensor]:
    return {key: value for key, value in output.items() if key.startswith("loss") and value is not None}


def check_shards_sum_to_the_batch(model, batch: dict, split: int = 1, **forward) -> dict[str, torch.Tensor]:
    """Shards [0, split) and [split, B): their losses with the global counts sum to the batch's, and so do the
    gradients; with its own counts the batch's loss is its plain mean. Returns the batch's losses."""
    model.train()
    counts = model.loss_item_counts(batch)
    whole = model(**batch, **forward)
    assert losses_of(model(**batch, global_item_counts=counts, **forward)).keys() == losses_of(whole).keys()
    for key, value in losses_of(model(**batch, global_item_counts=counts, **forward)).items():
        assert torch.allclose(value, whole[key], atol=TOLERANCE), key
    whole.loss.backward()
    expected_gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    first, second = shard(batch, slice(0, split)), shard(batch, slice(split, None))
    global_counts = add_counts(model.loss_item_counts(first), model.loss_item_counts(second))
    assert all(torch.equal(global_counts[key], counts[key]) for key in counts)
    outputs = [model(**part, global_item_counts=global_counts, **forward) for part in (first, second)]
    for key, value in losses_of(whole).items():
        shares = [losses_of(output).get(key) for output in outputs]
        assert all(share is not None for share in shares), f"{key}: every shard returns it (zero when it has no item)"
        assert torch.allclose(shares[0] + shares[1], value, atol=TOLERANCE), (key, shares, value)
    (outputs[0].loss + outputs[1].loss).backward()
    for name, parameter in model.named_parameters():
        if name in expected_gradients:
            assert torch.allclose(parameter.grad, expected_gradients[name], atol=TOLERANCE), name
    return losses_of(whole)


def uneven_grounding() -> dict:
    """Row 0 carries grounded words in one phrase, rows 1-2 in two: the shards' means differ from the batch mean."""
    batch = grounding()
    alignment = batch["word_region_alignment"].clone()
    alignment[0, 4:] = 0
    return {"word_region_alignment": alignment, "phrase_masks": batch["phrase_masks"]}


@pytest.mark.parametrize("family", ["SingleStream", "TwoStream"])
@pytest.mark.parametrize("task", ["ForQuestionAnswering", "ForVisualReasoning", "ForReferringExpression", "ForPhraseGrounding"])
@pytest.mark.parametrize("supervision", ["direct", "semi_direct", "indirect"])
def test_task_head_shards_sum_to_the_batch(family, task, supervision):
    config = single_stream_config if family == "SingleStream" else two_stream_config
    torch.manual_seed(0)
    model = getattr(hf_vlalign, family + task)(
        config(num_qa_labels=7, visual_feat_dim=DV, attention_supervision=supervision, **NO_DROPOUT)
    )
    batch = task_batch(task)
    if task == "ForPhraseGrounding":
        batch["phrase_labels"] = batch["phrase_labels"].clone()
        batch["phrase_labels"][0] = 0  # row 0: no grounded phrase
    if task == "ForQuestionAnswering":
        batch["phrase_masks"] = grounding()["phrase_masks"]  # indirect supervision reads the phrases
    if task == "ForReferringExpression":
        batch["phrase_masks"] = (batch["word_region_alignment"].sum(-1) > 0).unsqueeze(1)  # the expression's word
    losses = check_shards_sum_to_the_batch(model, batch)
    assert "loss_task" in losses and (task == "ForVisualReasoning" or "loss_attention_supervision" in losses)


def test_soft_answer_scores_are_averaged_over_questions():
    model = hf_vlalign.TwoStreamForQuestionAnswering(two_stream_config(num_qa_labels=7, **NO_DROPOUT))
    scores = torch.zeros(B, 7)
    scores[0, 1], scores[1, 2], scores[2, 3] = 1.0, 0.6, 0.3
    check_shards_sum_to_the_batch(model, {**text(), **regions(), "labels": scores}, split=2)


def vgp_batch() -> dict:
    phrase1, phrase2 = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)
    phrase1[:, 1:3], phrase2[:, 4:6] = True, True
    return {
        **text(), **regions(), **uneven_grounding(),
        "phrase1_mask": phrase1, "phrase2_mask": phrase2,
        "id_labels": torch.tensor([0, 2, 1]), "vgp_labels": torch.tensor([1, 0, 1]),
    }  # fmt: skip


@pytest.mark.parametrize("supervision", ["direct", "semi_direct", "indirect"])
def test_visual_paraphrase_shards_sum_to_the_batch(supervision):
    torch.manual_seed(0)
    model = SingleStreamForVisualParaphrase(single_stream_config(attention_supervision=supervision, **NO_DROPOUT))
    losses = check_shards_sum_to_the_batch(model, vgp_batch(), split=2)
    assert set(losses) == {"loss", "loss_id", "loss_vgp", "loss_attention_supervision"}


def test_single_stream_pretraining_shards_sum_to_the_batch():
    torch.manual_seed(0)
    model = SingleStreamForPreTraining(single_stream_config(num_object_labels=6, **NO_DROPOUT))
    labels = torch.full((B, T), -100)
    labels[0, 1], labels[1, 2:5], labels[2, 6] = 5, torch.tensor([7, 8, 9]), 11
    masked = torch.zeros(B, R, dtype=torch.long)
    masked[1, :3] = 1  # row 0 masks no region: its shard has no region item
    masked[2, 0] = 1
    object_labels = torch.where(masked.bool(), torch.tensor(3), torch.tensor(-100))
    batch = {
        **text(), **regions(), **uneven_grounding(), "labels": labels,
        "sentence_image_labels": torch.tensor([0, 1, 0]), "masked_regions": masked,
        "feature_labels": torch.randn(B, R, DV), "object_labels": object_labels,
    }  # fmt: skip
    losses = check_shards_sum_to_the_batch(model, batch)
    assert {"loss_mlm", "loss_sentence_image", "loss_region_feature", "loss_region_class", "loss_attention_supervision"} <= set(losses)


def test_two_stream_pretraining_with_alignment_shards_sum_to_the_batch():
    torch.manual_seed(0)
    model = TwoStreamForPreTraining(two_stream_config(attention_supervision="direct", **NO_DROPOUT))
    labels = torch.full((B, T), -100)
    labels[1, 2:5], labels[2, 6] = torch.tensor([7, 8, 9]), 11  # row 0: no masked word
    masked = torch.zeros(B, R, dtype=torch.long)
    masked[0, 0], masked[2, 1:3] = 1, 1
    object_labels = torch.where(masked.bool(), torch.tensor(2), torch.tensor(-100))
    batch = {
        **text(), **regions(), **uneven_grounding(), "labels": labels, "masked_regions": masked,
        "object_labels": object_labels, "attribute_labels": object_labels.clamp(max=4).where(masked.bool(), -100),
        "feature_labels": torch.randn(B, R, DV), "matched_labels": torch.tensor([1, 0, 1]),
        "answer_labels": torch.tensor([3, -100, 5]),
    }  # fmt: skip
    losses = check_shards_sum_to_the_batch(model, batch)
    expected = {
        "loss_mlm", "loss_object_class", "loss_object_attr", "loss_region_feature", "loss_itm", "loss_qa", "loss_alignment",
        "loss_attention_supervision",
    }  # fmt: skip
    assert expected <= set(losses)


@pytest.mark.parametrize("mode", ["align", "perturb"])
def test_captioner_with_a2_shards_sum_to_the_batch(mode):
    torch.manual_seed(0)
    model = RegionCaptionerForConditionalGeneration(captioner_config(attention_alignment="gate"))
    generator = torch.Generator().manual_seed(1)
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    labels = torch.tensor([[5, 2, -100, -100, -100], [8, 9, 10, 11, 2], [6, 7, 2, -100, -100]])
    batch = {
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + 0.3], dim=-1),
        "visual_attention_mask": torch.ones(B, R, dtype=torch.long),
        "labels": labels,
    }
    losses = check_shards_sum_to_the_batch(model, batch, alignment_mode=mode)
    assert ("loss_mask" in losses) == (mode == "perturb") and "loss_caption" in losses


def test_counts_are_the_divisors_of_each_loss():
    """A hand check: direct supervision's text rows and region rows, counted as the loss divides by them."""
    alignment = torch.zeros(2, 4, 3)
    alignment[0, 1, 0] = 1.0
    alignment[1, 0, 1:] = 0.5
    alignment[1, 2, 1] = 1.0
    model = hf_vlalign.SingleStreamModel(single_stream_config(attention_supervision="direct"))
    counts = model.loss_item_counts({"word_region_alignment": alignment})
    assert counts == {"attention_text_rows": 3, "attention_region_rows": 3}
    assert float(mean_over_items(torch.tensor(6.0), torch.tensor(0))) == 6.0  # no item: the (zero) sum itself


def test_missing_count_key_is_named():
    model = SingleStreamForVisualParaphrase(single_stream_config(attention_supervision="none"))
    with pytest.raises(ValueError, match="`global_item_counts` must hold a count for 'id'"):
        model(**vgp_batch(), global_item_counts={"vgp": torch.tensor(2)})
