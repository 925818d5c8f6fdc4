"""Attention-supervision losses on hand-computed examples, and the logits-vs-probabilities equality."""

import math

import pytest
import torch

from hf_vlalign.supervision import (
    attention_rollout,
    direct_supervision_loss,
    indirect_supervision_loss,
    max_pool_phrases,
    semi_direct_supervision_loss,
    soft_cross_entropy,
)


def test_direct_loss_hand_example():
    # one example, T=2 tokens, R=2 regions, one layer with one head
    t2r = torch.tensor([[[[0.0, math.log(3.0)], [0.0, 0.0]]]])  # token 0: p = (1/4, 3/4)
    r2t = torch.tensor([[[[math.log(4.0), 0.0], [0.0, 0.0]]]])  # region 0: p = (4/5, 1/5)
    alignment = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]])  # token 0 -> region 1; token 1 ungrounded
    loss = direct_supervision_loss([t2r], [r2t], alignment, torch.ones(1, 2), torch.ones(1, 2))
    # text->region: -log(3/4) over the single grounded token; region->text: region 1's column is (1, 0), and
    # region 1's logits are (0, 0) so p = (1/2, 1/2): -log(1/2); region 0 carries no target.
    assert loss.item() == pytest.approx(-math.log(0.75) - math.log(0.5), abs=1e-6)


def test_direct_loss_ignores_masked_regions_and_averages_layers():
    t2r_a = torch.tensor([[[[0.0, 0.0, 50.0]]]])  # the third region is padding: must not take probability mass
    t2r_b = torch.tensor([[[[0.0, math.log(3.0), 0.0]]]])
    r2t = torch.zeros(1, 1, 3, 1)
    alignment = torch.tensor([[[1.0, 0.0, 0.0]]])
    region_mask = torch.tensor([[1, 1, 0]])
    loss = direct_supervision_loss([t2r_a, t2r_b], [r2t, r2t], alignment, torch.ones(1, 1), region_mask)
    # layer a: -log(1/2); layer b: -log(1/4); region->text: one word key -> log 1 = 0
    assert loss.item() == pytest.approx((math.log(2.0) + math.log(4.0)) / 2, abs=1e-6)


def test_soft_cross_entropy_without_targets_is_zero_not_nan():
    log_probs = torch.log_softmax(torch.randn(2, 3, 4, requires_grad=True), -1)
    loss = soft_cross_entropy(log_probs, torch.zeros(3, 4))
    assert loss.item() == 0.0
    loss.backward()


def test_rollout_hand_example():
    a1 = torch.tensor([[[[0.5, 0.5], [0.0, 1.0]]]])
    a2 = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])
    r1, r2 = attention_rollout([a1, a2])
    # layer 1: (a1 + I) row-normalised = [[0.75, 0.25], [0, 1]]
    expected_1 = torch.tensor([[0.75, 0.25], [0.0, 1.0]])
    # layer 2: (a2 + I) row-normalised = [[1, 0], [0.25, 0.75]], times layer-1 rollout
    expected_2 = torch.tensor([[1.0, 0.0], [0.25, 0.75]]) @ expected_1
    torch.testing.assert_close(r1[0], expected_1)
    torch.testing.assert_close(r2[0], expected_2)


def test_rollout_averages_selected_heads():
    heads = torch.stack([torch.eye(3), torch.full((3, 3), 1 / 3)]).unsqueeze(0)
    (only_first,) = attention_rollout([heads], heads=[0])
    torch.testing.assert_close(only_first[0], torch.eye(3))
    (both,) = attention_rollout([heads])
    torch.testing.assert_close(both.sum(-1), torch.ones(1, 3))


def test_semi_direct_loss_hand_example():
    # N = 3: one text token (0), two regions (1, 2)
    rollout = torch.tensor([[[0.2, 0.2, 0.6], [0.5, 0.5, 0.0], [0.1, 0.0, 0.9]]])
    alignment = torch.tensor([[[0.0, 1.0]]])  # the token is grounded in region 2
    loss = semi_direct_supervision_loss([rollout], slice(0, 1), slice(1, 3), alignment, torch.ones(1, 1), torch.ones(1, 2))
    # text->region (0.2, 0.6) -> p(region 2) = 0.75; region 2 -> text: one word -> p = 1
    assert loss.item() == pytest.approx(-math.log(0.75), abs=1e-6)


def test_indirect_loss_hand_example():
    logits = torch.tensor([[[0.0, 2.0, 5.0]]])  # one phrase, three regions, the last one padding
    targets = torch.tensor([[[0.0, 1.0, 1.0]]])
    loss = indirect_supervision_loss(logits, targets, torch.tensor([[True]]), torch.tensor([[1, 1, 0]]))
    expected = (math.log(2.0) + math.log(1 + math.exp(-2.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_max_pool_phrases():
    hidden = torch.tensor([[[1.0, -1.0], [3.0, -5.0], [-2.0, 4.0]]])
    masks = torch.tensor([[[True, True, False], [False, False, False]]])
    pooled = max_pool_phrases(hidden, masks)
    torch.testing.assert_close(pooled, torch.tensor([[[3.0, -1.0], [0.0, 0.0]]]))


@pytest.mark.parametrize("heads", [None, [0, 1, 2, 3], [1, 2], [2], [0, 2], [3, 1]])
def test_selecting_heads_is_indexing_with_the_list(heads):
    """`select_heads` (a slice for consecutive heads, an index copied without waiting otherwise) gives `[:, heads]`."""
    from hf_vlalign.supervision.direct import select_heads

    scores = torch.randn(2, 4, 3, 5)
    expected = scores if heads is None else scores[:, heads]
    assert torch.equal(select_heads(scores, heads), expected)
