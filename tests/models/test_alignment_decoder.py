"""Alignment decoder of Kervadec et al. (2020): scores (eqs. 11-12), top-k softmax (eq. 13), KL loss (eq. 14)."""

import math

import pytest
import torch

from hf_vlalign.supervision.alignment_decoder import (
    AlignmentDecoder,
    alignment_kl_loss,
    top_k_log_softmax,
    top_k_mask,
)

EPS = 1e-6


def one_word(values):
    """(1, 1, R) tensor from a list of R numbers."""
    return torch.tensor([[values]], dtype=torch.float32)


# --- decoder ------------------------------------------------------------------------------------------------------


def test_decoder_shapes_and_gradient():
    decoder = AlignmentDecoder(hidden_size=16)
    language, vision = torch.randn(2, 5, 16, requires_grad=True), torch.randn(2, 7, 16, requires_grad=True)
    scores = decoder(language, vision)
    assert scores.shape == (2, 5, 7)
    scores.sum().backward()
    assert language.grad is not None and vision.grad is not None
    assert decoder.language_projection.dense_in.weight.grad is not None
    assert decoder.vision_projection.dense_out.weight.grad is not None


def test_decoder_has_separate_projections():
    decoder = AlignmentDecoder(hidden_size=8)
    assert decoder.language_projection is not decoder.vision_projection
    assert (
        decoder.language_projection.dense_in.weight.data_ptr() != decoder.vision_projection.dense_in.weight.data_ptr()
    )


def test_decoder_score_is_scaled_dot_product_with_identity_projections():
    # With zero feed-forward weights and a plain LayerNorm, proj(x) = LayerNorm(x); for vectors of +-1 (mean 0,
    # variance 1) LayerNorm is the identity, so A_ij = s_i . o_j / sqrt(d).
    decoder = AlignmentDecoder(hidden_size=4)
    with torch.no_grad():
        for projection in (decoder.language_projection, decoder.vision_projection):
            for dense in (projection.dense_in, projection.dense_out):
                dense.weight.zero_()
                dense.bias.zero_()
            projection.LayerNorm.weight.fill_(1.0)
            projection.LayerNorm.bias.zero_()
    word = torch.tensor([[[1.0, -1.0, 1.0, -1.0]]])
    objects = torch.tensor([[[1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0], [-1.0, 1.0, -1.0, 1.0]]])
    scores = decoder(word, objects)
    # dot products 4, 0, -4 divided by sqrt(4) = 2
    torch.testing.assert_close(scores, torch.tensor([[[2.0, 0.0, -2.0]]]), atol=1e-5, rtol=0)


def test_top_k_log_softmax_by_hand():
    # scores [2, 1, 0], k = 2: A = [e^2, e^1] / (e^2 + e^1) on the two best regions, 0 on the third (read as eps)
    log_probs = top_k_log_softmax(one_word([2.0, 1.0, 0.0]), k=2, eps=EPS)
    expected = [
        math.log(math.e**2 / (math.e**2 + math.e)),
        math.log(math.e / (math.e**2 + math.e)),
        math.log(EPS),
    ]
    torch.testing.assert_close(log_probs, one_word(expected))
    probs = log_probs.exp()
    assert probs[0, 0, :2].sum().item() == pytest.approx(1.0)


def test_top_k_mask_skips_padded_regions_and_keeps_fewer_than_k():
    scores = torch.tensor([[[0.0, 1.0, 9.0, 8.0]], [[3.0, 2.0, 1.0, 0.0]]])
    region_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    keep = top_k_mask(scores, 3, region_mask)
    assert keep[0, 0].tolist() == [True, True, False, False]  # only two real regions
    assert keep[1, 0].tolist() == [True, True, True, False]
    log_probs = top_k_log_softmax(scores, 3, region_mask)
    assert torch.isfinite(log_probs).all()
    assert log_probs[0, 0, 2].item() == pytest.approx(math.log(EPS))


def test_gradient_reaches_only_the_kept_scores():
    # kept = top-2 {0, 1}; the target puts no mass on region 2, so its score gets no gradient
    scores = one_word([2.0, 1.0, 0.0]).requires_grad_()
    alignment_kl_loss(scores, one_word([0.4, 0.6, 0.0]), k=2).backward()
    assert scores.grad[0, 0, 2].item() == 0.0
    assert scores.grad[0, 0, :2].abs().sum().item() > 0


def test_target_support_reading_trains_a_target_region_outside_top_k():
    # "target_support": A = softmax over {0, 1} u {2} = softmax([2, 1, 0])
    scores = one_word([2.0, 1.0, 0.0]).requires_grad_()
    loss = alignment_kl_loss(scores, one_word([0.0, 0.0, 1.0]), k=2, eps=EPS, outside_top_k="target_support")
    denominator = math.e**2 + math.e + 1
    assert loss.item() == pytest.approx(-math.log(1 / denominator), rel=1e-5)
    loss.backward()
    assert scores.grad[0, 0, 2].item() < 0  # descending the loss raises the target region's score


def test_default_target_entirely_outside_top_k_gives_zero_without_nan():
    # "renormalise_target": no target mass in the top-2 {0, 1}, so the renormalised target is empty: loss 0, no NaN,
    # but the word still counts among the grounded words (the second word's loss is halved)
    scores = torch.tensor([[[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]]], requires_grad=True)
    target = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    loss = alignment_kl_loss(scores, target, k=2)
    p0 = math.e**2 / (math.e**2 + math.e)
    assert loss.item() == pytest.approx(-math.log(p0) / 2, rel=1e-5)
    loss.backward()
    assert torch.isfinite(scores.grad).all()
    assert scores.grad[0, 0].abs().sum().item() == 0.0


# --- KL loss (eq. 14) ---------------------------------------------------------------------------------------------


def test_kl_by_hand():
    p0, p1 = math.e**2 / (math.e**2 + math.e), math.e / (math.e**2 + math.e)
    loss = alignment_kl_loss(one_word([2.0, 1.0, 0.0]), one_word([0.5, 0.5, 0.0]), k=2)
    expected = 0.5 * (math.log(0.5) - math.log(p0)) + 0.5 * (math.log(0.5) - math.log(p1))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_kl_renormalises_the_target_over_the_top_k_by_default():
    # scores [2, 1, 0], k = 2: A = [p0, p1, 0]; A* = [1/2, 1/4, 1/4] restricted to {0, 1} and renormalised: [2/3, 1/3, 0]
    p0, p1 = math.e**2 / (math.e**2 + math.e), math.e / (math.e**2 + math.e)
    loss = alignment_kl_loss(one_word([2.0, 1.0, 0.0]), one_word([0.5, 0.25, 0.25]), k=2)
    expected = 2 / 3 * (math.log(2 / 3) - math.log(p0)) + 1 / 3 * (math.log(1 / 3) - math.log(p1))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # k = 3 keeps every region: the full-softmax KL
    q = [math.e**2 / (math.e**2 + math.e + 1), math.e / (math.e**2 + math.e + 1), 1 / (math.e**2 + math.e + 1)]
    loss_k3 = alignment_kl_loss(one_word([2.0, 1.0, 0.0]), one_word([0.5, 0.25, 0.25]), k=3)
    target = [0.5, 0.25, 0.25]
    assert loss_k3.item() == pytest.approx(sum(t * (math.log(t) - math.log(x)) for t, x in zip(target, q)), rel=1e-5)


def test_kl_floor_reads_eps_outside_the_top_k():
    # "floor": A = [p0, p1, 0] read as [p0, p1, eps]; the target mass 1/4 on region 2 adds 1/4 (log 1/4 - log eps)
    p0, p1 = math.e**2 / (math.e**2 + math.e), math.e / (math.e**2 + math.e)
    scores = one_word([2.0, 1.0, 0.0]).requires_grad_()
    loss = alignment_kl_loss(scores, one_word([0.5, 0.25, 0.25]), k=2, eps=EPS, outside_top_k="floor")
    expected = (
        0.5 * (math.log(0.5) - math.log(p0))
        + 0.25 * (math.log(0.25) - math.log(p1))
        + 0.25 * (math.log(0.25) - math.log(EPS))
    )
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    # d/ds_j of -sum_{i in top-k} A*_i log A_i = m_K A_j - A*_j with m_K = 3/4 the target mass in the top-k
    torch.testing.assert_close(scores.grad, one_word([0.75 * p0 - 0.5, 0.75 * p1 - 0.25, 0.0]))


def test_kl_target_support_reading_keeps_the_target_in_the_softmax():
    # region 2 is outside the top-2 but carries target mass: A = softmax over all three scores, KL exact and finite
    denominator = math.e**2 + math.e + 1
    p0, p2 = math.e**2 / denominator, 1 / denominator
    loss = alignment_kl_loss(
        one_word([2.0, 1.0, 0.0]), one_word([0.5, 0.0, 0.5]), k=2, eps=EPS, outside_top_k="target_support"
    )
    expected = 0.5 * (math.log(0.5) - math.log(p0)) + 0.5 * (math.log(0.5) - math.log(p2))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_default_gradient_by_hand():
    # renormalised target [2/3, 1/3, 0] over the top-2: d loss / d s_j = A_j - A*_j on the kept regions, 0 elsewhere
    p0, p1 = math.e**2 / (math.e**2 + math.e), math.e / (math.e**2 + math.e)
    scores = one_word([2.0, 1.0, 0.0]).requires_grad_()
    alignment_kl_loss(scores, one_word([0.5, 0.25, 0.25]), k=2).backward()
    torch.testing.assert_close(scores.grad, one_word([p0 - 2 / 3, p1 - 1 / 3, 0.0]))


def test_loss_reads_no_tensor_value_on_the_host():
    # meta tensors have no values: any .item(), bool(t) or float(t) would raise
    scores = torch.randn(2, 3, 5, device="meta", requires_grad=True)
    target = torch.rand(2, 3, 5, device="meta")
    region_mask = torch.ones(2, 5, device="meta")
    text_mask = torch.ones(2, 3, device="meta")
    for reading in ("renormalise_target", "floor", "target_support"):
        loss = alignment_kl_loss(scores, target, region_mask, text_mask, k=2, outside_top_k=reading)
        assert loss.shape == () and loss.device.type == "meta"


def test_kl_is_zero_when_prediction_matches_target():
    # scores [log 3, log 1, -inf-like] with k = 2 give A = [3/4, 1/4, 0]
    scores = one_word([math.log(3.0), 0.0, -50.0])
    loss = alignment_kl_loss(scores, one_word([0.75, 0.25, 0.0]), k=2)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_ungrounded_and_padded_words_are_ignored():
    scores = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 5.0, 1.0], [1.0, 1.0, 9.0]]])
    target = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])
    text_mask = torch.tensor([[1, 1, 0]])  # the third word is padding: its target row is ignored
    loss = alignment_kl_loss(scores, target, text_mask=text_mask, k=2)
    alone = alignment_kl_loss(scores[:, :1], target[:, :1], k=2)
    assert loss.item() == pytest.approx(alone.item())


def test_kl_averages_over_grounded_words():
    scores = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]]])
    target = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    loss = alignment_kl_loss(scores, target, k=2)
    # both rows: KL = -log(e^2 / (e^2 + e))
    assert loss.item() == pytest.approx(-math.log(math.e**2 / (math.e**2 + math.e)), rel=1e-5)


def test_zero_loss_with_graph_when_nothing_is_grounded():
    decoder = AlignmentDecoder(hidden_size=8)
    scores = decoder(torch.randn(2, 4, 8), torch.randn(2, 3, 8))
    loss = alignment_kl_loss(scores, torch.zeros(2, 4, 3), k=2)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert decoder.language_projection.dense_in.weight.grad is not None
    assert decoder.language_projection.dense_in.weight.grad.abs().sum().item() == 0.0


def test_end_to_end_loss_is_finite_and_trains():
    torch.manual_seed(0)
    decoder = AlignmentDecoder(hidden_size=8)
    language, vision = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    target = torch.zeros(2, 4, 5)
    target[0, 1] = torch.tensor([0.7, 0.3, 0.0, 0.0, 0.0])
    target[1, 2] = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    region_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    optimizer = torch.optim.SGD(decoder.parameters(), lr=0.5)
    losses = []
    for _ in range(20):
        loss = alignment_kl_loss(decoder(language, vision), target, region_mask, k=3)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(value) for value in losses)
    assert losses[-1] < losses[0]


# --- config -------------------------------------------------------------------------------------------------------


def test_config_outside_top_k_round_trips_and_is_checked(tmp_path):
    from hf_vlalign.models.two_stream.configuration_two_stream import TwoStreamConfig

    assert TwoStreamConfig().alignment_outside_top_k == "renormalise_target"
    TwoStreamConfig(alignment_outside_top_k="floor").save_pretrained(tmp_path)
    assert TwoStreamConfig.from_pretrained(tmp_path).alignment_outside_top_k == "floor"
    with pytest.raises(ValueError, match="alignment_outside_top_k"):
        TwoStreamConfig(alignment_outside_top_k="drop")
