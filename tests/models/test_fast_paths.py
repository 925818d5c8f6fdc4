"""The performance paths (issue 8) compute the same thing as the plain ones: CPU dropout, eager attention with a boolean
mask, direct supervision from query/key projections with recomputation, and the one-reduction finiteness check."""

import math

import pytest
import torch
from torch import nn

from hf_vlalign import SingleStreamConfig, SingleStreamModel, TwoStreamConfig
from hf_vlalign.models.attention_utils import eager_attention_forward
from hf_vlalign.models.dropout import FastDropout, fast_dropout, make_dropout
from hf_vlalign.supervision import direct_supervision_loss
from hf_vlalign.supervision.direct import direct_supervision_loss_from_query_key
from hf_vlalign.utils.validation import check_finite

# ------------------------------------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fast_dropout_drops_with_probability_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    count = 1_000_000
    out = fast_dropout(torch.ones(count), p)
    dropped = float((out == 0).float().mean())
    # binomial standard deviation sqrt(p (1 - p) / n) <= 5e-4: 6 sigma
    assert abs(dropped - p) < 3e-3
    kept = out[out != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - round(p * 65536) / 65536)))
    assert float(out.mean()) == pytest.approx(1.0, abs=6e-3)


def test_fast_dropout_quarters_of_the_random_words_are_independent():
    # the 4 int16 shares of one 64-bit draw go to 4 neighbouring elements: each must drop at rate p on its own
    torch.manual_seed(1)
    out = fast_dropout(torch.ones(400_000), 0.3).view(-1, 4)
    rates = (out == 0).float().mean(0)
    assert torch.allclose(rates, torch.full((4,), 0.3), atol=6e-3), rates
    both = ((out[:, 0] == 0) & (out[:, 1] == 0)).float().mean()
    assert float(both) == pytest.approx(0.09, abs=4e-3)


def test_fast_dropout_edge_probabilities_eval_mode_and_dtype():
    hidden = torch.randn(3, 5)
    assert fast_dropout(hidden, 0.0) is hidden
    assert fast_dropout(hidden, 0.7, training=False) is hidden
    assert torch.equal(fast_dropout(hidden, 1.0), torch.zeros_like(hidden))
    assert fast_dropout(hidden.bfloat16(), 0.5).dtype == torch.bfloat16
    odd = torch.randn(7, 3, 3)  # numel not a multiple of 4
    assert fast_dropout(odd, 0.5).shape == odd.shape


def test_fast_dropout_is_reproducible_and_its_gradient_is_the_mask():
    hidden = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(3)
    first = fast_dropout(hidden, 0.2)
    torch.manual_seed(3)
    second = fast_dropout(hidden, 0.2)
    assert torch.equal(first, second)
    first.sum().backward()
    scale = 1 / (1 - round(0.2 * 65536) / 65536)
    expected = torch.where(first != 0, torch.tensor(scale), torch.tensor(0.0))
    assert torch.allclose(hidden.grad, expected)


def test_dropout_implementation_selects_the_module_and_is_validated():
    assert type(make_dropout(SingleStreamConfig(), 0.1)) is FastDropout
    assert type(make_dropout(SingleStreamConfig(dropout_implementation="torch"), 0.1)) is nn.Dropout
    model = SingleStreamModel(SingleStreamConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                 intermediate_size=64, vocab_size=100, visual_feat_dim=8,
                                                 dropout_implementation="torch"))  # fmt: skip
    assert not any(isinstance(module, FastDropout) for module in model.modules())
    with pytest.raises(ValueError, match=r"`dropout_implementation` must be one of .*got 'fast'"):
        TwoStreamConfig(dropout_implementation="fast")


# ----------------------------------------------------------------------------------------------------- attention


def test_eager_attention_reads_a_boolean_keep_mask_like_an_additive_one():
    module = nn.Module()
    module.training, module.config = False, SingleStreamConfig()
    query, key, value = (torch.randn(2, 3, 5, 4) for _ in range(3))
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    out_bool, probs_bool = eager_attention_forward(module, query, key, value, keep, scaling=0.5)
    out_add, probs_add = eager_attention_forward(module, query, key, value, additive, scaling=0.5)
    assert torch.allclose(out_bool, out_add) and torch.allclose(probs_bool, probs_add)
    assert float(probs_bool[0, :, :, 3:].abs().max()) == 0.0


def tiny_single_stream(**overrides) -> SingleStreamModel:
    config = SingleStreamConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                vocab_size=100, visual_feat_dim=8, **overrides)  # fmt: skip
    torch.manual_seed(0)
    return SingleStreamModel(config)


def single_stream_inputs(batch=2, words=6, regions=4):
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(batch, regions, 2, generator=generator) * 0.5
    alignment = torch.zeros(batch, words, regions)
    alignment[:, 1, 0] = 1.0
    alignment[:, 2, 0] = alignment[:, 2, 1] = 0.5
    alignment[0, 3, 2] = 1.0
    region_mask = torch.ones(batch, regions, dtype=torch.long)
    region_mask[1, -1] = 0
    return {
        "input_ids": torch.randint(5, 100, (batch, words), generator=generator),
        "visual_feats": torch.randn(batch, regions, 8, generator=generator),
        "visual_boxes": torch.cat([corners, corners + 0.3], dim=-1),
        "visual_attention_mask": region_mask,
        "word_region_alignment": alignment,
    }


def test_cpu_training_with_dropout_takes_the_eager_path_and_matches_sdpa_without_dropout():
    fast, plain = tiny_single_stream(), tiny_single_stream(dropout_implementation="torch")
    inputs = {name: tensor for name, tensor in single_stream_inputs().items() if name != "word_region_alignment"}
    fast.eval(), plain.eval()
    assert torch.allclose(fast(**inputs).last_hidden_state, plain(**inputs).last_hidden_state, atol=1e-5)
    # in training both paths are stochastic; with the same seed the fast path is reproducible
    fast.train()
    torch.manual_seed(5)
    first = fast(**inputs).last_hidden_state
    torch.manual_seed(5)
    assert torch.equal(first, fast(**inputs).last_hidden_state)


# --------------------------------------------------------------------------------------------------- supervision


@pytest.mark.parametrize("heads", [None, [0, 2]])
def test_supervision_from_query_key_equals_the_loss_from_logits(heads):
    generator = torch.Generator().manual_seed(0)
    batch, num_heads, words, regions, dim = 2, 4, 5, 3, 8
    layers = [(torch.randn(batch, num_heads, words + regions, dim, generator=generator, requires_grad=True),
               torch.randn(batch, num_heads, words + regions, dim, generator=generator, requires_grad=True))
              for _ in range(2)]  # fmt: skip
    alignment = torch.zeros(batch, words, regions)
    alignment[0, 0, 1] = alignment[1, 2, 0] = 1.0
    alignment[1, 3, 1] = alignment[1, 3, 2] = 0.5
    text_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    region_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    text, region, scaling = slice(0, words), slice(words, words + regions), dim**-0.5
    selected = heads if heads is not None else list(range(num_heads))

    t2r = [(q[:, :, text], k[:, :, region]) for q, k in layers]
    r2t = [(q[:, :, region], k[:, :, text]) for q, k in layers]
    fast = direct_supervision_loss_from_query_key(t2r, r2t, scaling, alignment, text_mask, region_mask, heads)
    fast_grads = torch.autograd.grad(fast, [tensor for pair in layers for tensor in pair])

    t2r_logits = [q[:, selected][:, :, text] @ k[:, selected][:, :, region].transpose(-1, -2) * scaling for q, k in layers]
    r2t_logits = [q[:, selected][:, :, region] @ k[:, selected][:, :, text].transpose(-1, -2) * scaling for q, k in layers]
    reference = direct_supervision_loss(t2r_logits, r2t_logits, alignment, text_mask, region_mask)
    reference_grads = torch.autograd.grad(reference, [tensor for pair in layers for tensor in pair])

    assert math.isfinite(fast.item())
    assert fast.item() == pytest.approx(reference.item(), rel=1e-6)
    for got, expected in zip(fast_grads, reference_grads):
        assert torch.allclose(got, expected, atol=1e-6)


def test_model_direct_loss_trains_with_a_head_subset():
    model = tiny_single_stream(attention_supervision="direct", supervised_heads=[1, 3], supervised_layers=[1])
    model.train()
    out = model(**single_stream_inputs())
    out.loss_attention_supervision.backward()
    query_grad = model.encoder.layer[1].attention.self.query.weight.grad
    assert query_grad is not None and float(query_grad.abs().sum()) > 0
    # the unsupervised layer 0 still gets a gradient through layer 1's inputs, and nothing is NaN
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------------- validation


def test_check_finite_names_bad_values_and_accepts_an_overflowing_sum():
    check_finite("visual_feats", torch.tensor([3e38, 3e38, 3e38]))  # the sum overflows, every value is finite
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=r"`visual_feats` must be finite, got 1 NaN/inf"):
            check_finite("visual_feats", torch.tensor([1.0, bad, 2.0]))
