"""A2 attention alignment of Fei (2022): mask (eq. 2), perturbation (eq. 3), mask objective (eq. 4), aligned attention
(eq. 5), the four fusions (eqs. 6-10) and the re-normalisation over regions."""

import math

import pytest
import torch
from torch import nn

from hf_vlalign.supervision.perturbation import (
    A2_DIAGNOSTICS,
    FUSIONS,
    A2Diagnostics,
    AttentionPerturbation,
    attention_change,
    fixed_mask,
    head_diversity,
    mask_row_statistics,
    aligned_attention,
    exp_decay_weight,
    fuse_attention,
    mask_objective,
    perturbed_attention,
    renormalise_over_regions,
)

LN2 = math.log(2.0)


def row(values):
    """(1, 1, 1, R) tensor: one head, one decoder step."""
    return torch.tensor([[[values]]], dtype=torch.float32)


# Shared hand example (one head, one step, three regions):
#   a = [0.5, 0.3, 0.2],  m = [1, 1 - ln 2, 1]  ->  exp(1 - m) = [1, 2, 1]  ->  a_m = [0.5, 0.6, 0.2]
A = row([0.5, 0.3, 0.2])
M = row([1.0, 1.0 - LN2, 1.0])
A_M = row([0.5, 0.6, 0.2])


# --- eq. 3: perturbed attention -------------------------------------------------------------------------------------


def test_perturbed_attention_two_heads_by_hand():
    # head 0: [0.6, 0.4], head 1: [0.2, 0.8]; mean over heads = [(0.6 + 0.2) / 2, (0.4 + 0.8) / 2] = [0.4, 0.6]
    attention = torch.tensor([[[[0.6, 0.4]], [[0.2, 0.8]]]])  # (1, 2, 1, 2)
    mask = torch.tensor([[[[0.5]], [[1.0]]]])  # (1, 2, 1, 1): head 0 half perturbed, head 1 untouched
    # head 0: 0.5 * [0.6, 0.4] + 0.5 * [0.4, 0.6] = [0.3 + 0.2, 0.2 + 0.3] = [0.5, 0.5]
    # head 1: 1.0 * [0.2, 0.8] + 0.0 * [0.4, 0.6] = [0.2, 0.8]
    expected = torch.tensor([[[[0.5, 0.5]], [[0.2, 0.8]]]])
    torch.testing.assert_close(perturbed_attention(attention, mask), expected)


def test_perturbed_attention_per_region_mask_by_hand():
    attention = torch.tensor([[[[0.6, 0.4]], [[0.2, 0.8]]]])
    # head 0 keeps region 0 (m = 1) and fully perturbs region 1 (m = 0); head 1 perturbs region 0 by a quarter
    mask = torch.tensor([[[[1.0, 0.0]], [[0.75, 1.0]]]])
    # head 0: [1 * 0.6 + 0 * 0.4, 0 * 0.4 + 1 * 0.6] = [0.6, 0.6]
    # head 1: [0.75 * 0.2 + 0.25 * 0.4, 1 * 0.8 + 0 * 0.6] = [0.15 + 0.1, 0.8] = [0.25, 0.8]
    expected = torch.tensor([[[[0.6, 0.6]], [[0.25, 0.8]]]])
    torch.testing.assert_close(perturbed_attention(attention, mask), expected)


def test_perturbed_attention_with_mask_one_is_identity_and_keeps_padded_regions_zero():
    attention = torch.softmax(torch.randn(2, 3, 4, 5), -1)
    attention = renormalise_over_regions(attention, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]))
    torch.testing.assert_close(perturbed_attention(attention, torch.ones(2, 3, 4, 1)), attention)
    perturbed = perturbed_attention(attention, torch.full((2, 3, 4, 1), 0.3))
    assert torch.all(perturbed[0, :, :, 4] == 0)
    torch.testing.assert_close(perturbed.sum(-1), torch.ones(2, 3, 4))  # per-step mask: rows stay distributions


# --- eq. 5: aligned attention ---------------------------------------------------------------------------------------


def test_aligned_attention_by_hand():
    # m = [1, 1 - ln 2, 0.5]: a * exp(1 - m) = [0.5 * e^0, 0.3 * e^ln2, 0.2 * e^0.5] = [0.5, 0.6, 0.2 * 1.648721]
    mask = row([1.0, 1.0 - LN2, 0.5])
    expected = row([0.5, 0.6, 0.2 * math.exp(0.5)])
    torch.testing.assert_close(aligned_attention(A, mask), expected)
    torch.testing.assert_close(aligned_attention(A, M), A_M)


# --- re-normalisation -----------------------------------------------------------------------------------------------


def test_renormalise_with_masked_region_by_hand():
    attention = row([0.2, 0.3, 0.5])
    # region 2 is padding: [0.2, 0.3, 0] / (0.2 + 0.3) = [0.4, 0.6, 0]
    out = renormalise_over_regions(attention, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(out, row([0.4, 0.6, 0.0]))


def test_renormalise_keeps_all_zero_rows_zero_without_nan():
    attention = torch.tensor([[[[0.0, 0.0, 0.7]], [[1.0, 3.0, 0.0]]]], requires_grad=True)  # (1, 2, 1, 3)
    out = renormalise_over_regions(attention, torch.tensor([[1, 1, 0]]))
    # head 0 only attends to the padded region -> all zeros; head 1: [1, 3] / 4 = [0.25, 0.75]
    torch.testing.assert_close(out.detach(), torch.tensor([[[[0.0, 0.0, 0.0]], [[0.25, 0.75, 0.0]]]]))
    out.sum().backward()
    assert torch.isfinite(attention.grad).all()


# --- eqs. 6-10: fusions, each by hand on (a, a_m) = ([0.5, 0.3, 0.2], [0.5, 0.6, 0.2]) ----------------------------


def test_fusion_max_by_hand():
    # max(a, a_m) = [0.5, 0.6, 0.2], sum 1.3 -> [5/13, 6/13, 2/13]
    out = fuse_attention(A, A_M, "max")
    torch.testing.assert_close(out, row([5 / 13, 6 / 13, 2 / 13]))


def test_fusion_moving_average_printed_form_by_hand():
    # printed eq. 7, a + eta * a_m with eta = 0.5: [0.5, 0.3, 0.2] + [0.25, 0.3, 0.1] = [0.75, 0.6, 0.3], sum 1.65
    # -> re-normalised [75/165, 60/165, 30/165] = [5/11, 4/11, 2/11]
    out = fuse_attention(A, A_M, "moving_average", eta=0.5)
    torch.testing.assert_close(out, row([5 / 11, 4 / 11, 2 / 11]))
    torch.testing.assert_close(out, fuse_attention(A, A_M, "moving_average", eta=0.5, moving_average="additive"))
    # eta = 0 keeps the original attention; eta = 2: [0.5 + 1.0, 0.3 + 1.2, 0.2 + 0.4] = [1.5, 1.5, 0.6] / 3.6
    torch.testing.assert_close(fuse_attention(A, A_M, "moving_average", eta=0.0), A)
    torch.testing.assert_close(fuse_attention(A, A_M, "moving_average", eta=2.0), row([5 / 12, 5 / 12, 1 / 6]))


def test_fusion_moving_average_convex_option_by_hand():
    # (1 - eta) * a + eta * a_m, eta = 0.5: [0.5, 0.45, 0.2], sum 1.15 -> [10/23, 9/23, 4/23]
    out = fuse_attention(A, A_M, "moving_average", eta=0.5, moving_average="convex")
    torch.testing.assert_close(out, row([10 / 23, 9 / 23, 4 / 23]))
    # eta = 0 keeps the original attention, eta = 1 is the re-normalised a_m (= the max fusion here)
    torch.testing.assert_close(fuse_attention(A, A_M, "moving_average", eta=0.0, moving_average="convex"), A)
    one = fuse_attention(A, A_M, "moving_average", eta=1.0, moving_average="convex")
    torch.testing.assert_close(one, row([5 / 13, 6 / 13, 2 / 13]))


def test_fusion_exp_decay_by_hand():
    # T_P = 1 / ln 2, s = 2: w = exp(-2 ln 2) = 1/4 on the original attention, 3/4 on a_m
    temperature = 1.0 / LN2
    assert exp_decay_weight(2, temperature) == pytest.approx(0.25)
    # 0.25 * [0.5, 0.3, 0.2] + 0.75 * [0.5, 0.6, 0.2] = [0.125 + 0.375, 0.075 + 0.45, 0.05 + 0.15] = [0.5, 0.525, 0.2]
    # sum 1.225 -> [0.5 / 1.225, 0.525 / 1.225, 0.2 / 1.225] = [20/49, 21/49, 8/49]
    out = fuse_attention(A, A_M, "exp_decay", step=2, temperature=temperature)
    torch.testing.assert_close(out, row([20 / 49, 21 / 49, 8 / 49]))
    # s = 0: w = 1, the original attention; s -> infinity: the re-normalised a_m
    torch.testing.assert_close(fuse_attention(A, A_M, "exp_decay", step=0, temperature=temperature), A)
    far = fuse_attention(A, A_M, "exp_decay", step=10_000, temperature=temperature)
    torch.testing.assert_close(far, row([5 / 13, 6 / 13, 2 / 13]))


def test_fusion_gate_printed_form_by_hand():
    # eq. 9 as printed: g * a + (1 - g) * a_m; g = 0.75: 0.75 * [0.5, 0.3, 0.2] + 0.25 * [0.5, 0.6, 0.2]
    # = [0.5, 0.375, 0.2], sum 1.075 -> [20/43, 15/43, 8/43]
    out = fuse_attention(A, A_M, "gate", gate=torch.full((1, 1, 1, 1), 0.75))
    torch.testing.assert_close(out, row([20 / 43, 15 / 43, 8 / 43]))
    # g = 1 keeps the original attention, g = 0 gives the re-normalised a_m
    torch.testing.assert_close(fuse_attention(A, A_M, "gate", gate=torch.ones(1, 1, 1, 1)), A)
    torch.testing.assert_close(fuse_attention(A, A_M, "gate", gate=torch.zeros(1, 1, 1, 1)), row([5 / 13, 6 / 13, 2 / 13]))


def test_fusion_renormalises_with_region_mask():
    attention, aligned = row([0.5, 0.3, 0.2]), row([0.5, 0.6, 0.4])
    # max = [0.5, 0.6, 0.4], region 2 padded -> [0.5, 0.6, 0] / 1.1 = [5/11, 6/11, 0]
    out = fuse_attention(attention, aligned, "max", region_mask=torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(out, row([5 / 11, 6 / 11, 0.0]))


# --- module ---------------------------------------------------------------------------------------------------------


def test_module_align_each_fusion_by_hand():
    hidden = 4
    queries = torch.zeros(1, 1, hidden)
    expectations = {
        "max": ({}, [5 / 13, 6 / 13, 2 / 13]),
        "moving_average": ({"eta": 0.5}, [5 / 11, 4 / 11, 2 / 11]),
        "convex": ({"eta": 0.5, "moving_average": "convex"}, [10 / 23, 9 / 23, 4 / 23]),
        "exp_decay": ({"temperature": 1.0 / LN2}, [20 / 49, 21 / 49, 8 / 49]),
        "gate": ({}, [20 / 43, 15 / 43, 8 / 43]),
    }
    for fusion, (kwargs, expected) in expectations.items():
        module = AttentionPerturbation(hidden, 1, "moving_average" if fusion == "convex" else fusion, **kwargs)
        if fusion == "gate":
            with torch.no_grad():  # W_g = 0, b_g = ln 3 -> g = sigmoid(ln 3) = 3 / (1 + 3) = 0.75
                module.gate.weight.zero_()
                module.gate.bias.fill_(math.log(3.0))
        out = module.align(A, M, queries=queries, step=2 if fusion == "exp_decay" else None)
        torch.testing.assert_close(out, row(expected), msg=fusion)


@pytest.mark.parametrize(("mask_input", "shape"), [("query", (2, 4, 5, 3)), ("query_and_regions", (2, 4, 5, 1))])
def test_mask_starts_near_one(mask_input, shape):
    torch.manual_seed(0)
    module = AttentionPerturbation(hidden_size=32, num_heads=4, fusion="max", mask_input=mask_input, num_region_slots=6)
    # zero states -> m = sigmoid(b_m) = sigmoid(3) = 0.9526
    regions = torch.ones(2, 3) if mask_input == "query" else None
    zero = module.mask(torch.zeros(2, 5, 32), region_mask=regions)
    assert zero.shape == shape
    torch.testing.assert_close(zero, torch.full_like(zero, 1 / (1 + math.exp(-3.0))))
    mask = module.mask(torch.randn(2, 5, 32), region_mask=regions)
    assert 0.9 < float(mask.detach().min()) and float(mask.detach().max()) < 1.0


def test_printed_mask_network_by_hand():
    # eq. 2 as printed: m_t = sigmoid(W_m h_t + b_m), W_m: hidden 2 -> 2 heads x 3 region slots, no region term
    module = AttentionPerturbation(hidden_size=2, num_heads=2, fusion="max", num_region_slots=3)
    assert module.region_network is None and module.mask_input == "query"
    with torch.no_grad():
        # output index = head * 3 + slot; h = [1, 2] -> logits = W[:, 0] + 2 W[:, 1] + b
        module.mask_network.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0], [-1.0, 0.0], [0.0, 0.0],
                                                       [2.0, 2.0]]))  # fmt: skip
        module.mask_network.bias.copy_(torch.tensor([0.0, -2.0, 0.0, 1.0, 0.0, 0.0]))
    hidden = torch.tensor([[[1.0, 2.0]]])  # (B=1, T=1, D=2)
    # head 0: logits [1, 2 - 2, 15] -> slots 0, 1; head 1: [-1 + 1, 0, 6] -> slots 0, 1 (two regions, second padded)
    mask = module.mask(hidden, torch.randn(1, 2, 2), torch.tensor([[1, 0]]))
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    torch.testing.assert_close(mask, torch.tensor([[[[sigmoid(1.0), 1.0]], [[sigmoid(0.0), 1.0]]]]))
    # region_mask alone gives the number of regions
    torch.testing.assert_close(module.mask(hidden, region_mask=torch.tensor([[1, 0]])), mask)
    # the mask acts on regions: the aligned attention differs from the original one
    attention = torch.tensor([[[[0.5, 0.5, 0.0]], [[0.25, 0.75, 0.0]]]])
    three = module.mask(hidden, region_mask=torch.ones(1, 3))
    realigned = module.align(attention, three)
    assert (realigned - attention).abs().max() > 1e-3
    torch.testing.assert_close(realigned.sum(-1), torch.ones(1, 2, 1))


def test_printed_mask_network_refuses_more_regions_than_slots():
    module = AttentionPerturbation(hidden_size=4, num_heads=1, fusion="max", num_region_slots=3)
    with pytest.raises(ValueError, match=r"`alignment_mask_regions` = 3.*4 regions"):
        module.mask(torch.randn(1, 2, 4), torch.randn(1, 4, 4))


def test_per_region_mask_shape_padding_and_initial_value():
    torch.manual_seed(0)
    module = AttentionPerturbation(hidden_size=8, num_heads=2, fusion="max", mask_input="query_and_regions")
    hidden, regions = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    region_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    per_step = module.mask(hidden)
    per_region = module.mask(hidden, regions, region_mask)
    assert per_region.shape == (2, 2, 3, 4)
    assert torch.all(per_region[0, :, :, 3] == 1.0)  # padded region: no perturbation
    # U_m starts at zero: the per-region mask starts equal to the per-step one on real regions
    torch.testing.assert_close(per_region[1], per_step[1].expand(2, 3, 4))


def test_per_step_mask_makes_alignment_the_identity_but_per_region_mask_does_not():
    # A per-(head, step) mask scales a whole row by exp(1 - m): after re-normalisation every fusion gives back a.
    torch.manual_seed(0)
    attention = torch.softmax(torch.randn(2, 2, 3, 4), -1)
    per_step, per_region = torch.rand(2, 2, 3, 1), torch.rand(2, 2, 3, 4)
    queries = torch.randn(2, 3, 8)
    for fusion in FUSIONS:
        module = AttentionPerturbation(8, 2, fusion)
        torch.testing.assert_close(module.align(attention, per_step, queries=queries, step=5000), attention)
        realigned = module.align(attention, per_region, queries=queries, step=5000)
        assert (realigned - attention).abs().max() > 1e-3, fusion
        torch.testing.assert_close(realigned.sum(-1), torch.ones(2, 2, 3))


def test_align_renormalises_over_real_regions():
    torch.manual_seed(0)
    module = AttentionPerturbation(8, 2, "moving_average", eta=0.7)
    region_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    attention = renormalise_over_regions(torch.softmax(torch.randn(2, 2, 3, 4), -1), region_mask)
    mask = module.mask(torch.randn(2, 3, 8), torch.randn(2, 4, 8), region_mask)
    out = module.align(attention, mask, region_mask=region_mask)
    assert torch.all(out[0, :, :, 2:] == 0)
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 2, 3))


# --- eq. 4: mask objective ------------------------------------------------------------------------------------------


def test_mask_objective_by_hand():
    caption_loss = torch.tensor(2.0)
    # layer 1 (B=1, H=2, T=2, 1): step 0 has m = (0.5, 1.0) -> (1-m)^2 summed over heads = 0.25; step 1 (padding) = 1.0
    layer1 = torch.tensor([[[[0.5], [0.0]], [[1.0], [0.0]]]])  # (1, 2, 2, 1)
    # layer 2: step 0 has m = (0.9, 0.8) -> 0.01 + 0.04 = 0.05
    layer2 = torch.tensor([[[[0.9], [1.0]], [[0.8], [1.0]]]])
    valid = torch.tensor([[1, 0]])
    # penalty = 0.25 + 0.05 = 0.3 (valid step only); objective = -2 + 0.5 * 0.3 = -1.85
    out = mask_objective(caption_loss, [layer1, layer2], weight=0.5, valid=valid)
    assert float(out) == pytest.approx(-1.85)
    # without `valid` both steps count: layer 1 mean (0.25 + 2.0) / 2 = 1.125; layer 2: (0.05 + 0) / 2 = 0.025
    assert float(mask_objective(caption_loss, [layer1, layer2], weight=1.0)) == pytest.approx(-2 + 1.15)


def test_mask_objective_with_no_valid_step_keeps_graph():
    mask = torch.full((1, 2, 2, 1), 0.5, requires_grad=True)
    out = mask_objective(torch.tensor(1.0), [mask], weight=1.0, valid=torch.zeros(1, 2))
    assert float(out.detach()) == -1.0
    out.backward()
    assert torch.all(mask.grad == 0)


def _toy_scene(mask_input: str):
    """A frozen-path toy captioner: a = softmax(W x) from a Linear "captioner", perturbed by the mask network
    ("query": printed eq. 2; "query_and_regions": with the region term; "per_step": that network without regions)."""
    torch.manual_seed(0)
    batch, heads, steps, regions, hidden = 2, 2, 3, 4, 8
    captioner = nn.Linear(hidden, heads * regions)
    per_region = mask_input != "per_step"
    network = "query" if mask_input == "query" else "query_and_regions"
    perturbation = AttentionPerturbation(hidden, heads, "max", mask_input=network, num_region_slots=5)
    states, region_states = torch.randn(batch, steps, hidden), torch.randn(batch, regions, hidden)

    def objective():
        attention = captioner(states).view(batch, steps, heads, regions).permute(0, 2, 1, 3).softmax(-1)
        mask = perturbation.mask(states, region_states if per_region else None)
        perturbed = perturbation.perturb(attention, mask)
        # toy caption loss that grows with the perturbation: how far the perturbed attention moved
        caption_loss = (perturbed - attention.detach()).pow(2).sum(-1).mean() * 100.0
        return mask_objective(caption_loss, [mask], weight=0.01), mask

    return captioner, perturbation, objective


@pytest.mark.parametrize("mask_input", ["query", "query_and_regions", "per_step"])
def test_mask_objective_gradient_reaches_only_the_mask_network(mask_input):
    captioner, perturbation, objective = _toy_scene(mask_input)
    value, _ = objective()
    weight, bias, *region_weight = torch.autograd.grad(value, perturbation.mask_parameters(), allow_unused=True)
    assert torch.isfinite(weight).all() and float(weight.abs().sum()) > 0  # W_m
    assert torch.isfinite(bias).all() and float(bias.abs().sum()) > 0  # b_m
    if mask_input == "query_and_regions":
        assert torch.isfinite(region_weight[0]).all() and float(region_weight[0].abs().sum()) > 0  # U_m
    elif mask_input == "per_step":
        assert region_weight == [None]  # the per-step mask does not read the region states
    else:
        assert region_weight == []  # the printed eq. 2 has no region term
    assert all(p.grad is None for p in captioner.parameters())  # the captioner got nothing
    # the objective does depend on the captioner (it would train it to caption badly), which is why the mask step
    # differentiates with respect to `mask_parameters()` only
    value, _ = objective()
    captioner_grads = torch.autograd.grad(value, list(captioner.parameters()))
    assert any(float(g.abs().sum()) > 0 for g in captioner_grads)


@pytest.mark.parametrize("mask_input", ["query", "query_and_regions", "per_step"])
def test_sgd_on_mask_parameters_only_decreases_the_objective(mask_input):
    captioner, perturbation, objective = _toy_scene(mask_input)
    frozen = [p.detach().clone() for p in captioner.parameters()]
    optimizer = torch.optim.SGD(perturbation.mask_parameters(), lr=0.5)
    values, mean_masks = [], []
    for _ in range(6):
        value, mask = objective()
        values.append(float(value.detach()))
        mean_masks.append(float(mask.detach().mean()))
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    assert all(later < earlier for earlier, later in zip(values, values[1:])), values
    assert mean_masks[-1] < mean_masks[0]  # it learned to perturb more where it hurts the caption
    for before, after in zip(frozen, captioner.parameters()):
        assert torch.equal(before, after)


# --- errors ---------------------------------------------------------------------------------------------------------


# --- diagnostics: does A2 act? ---------------------------------------------------------------------------------------


def test_mask_row_statistics_by_hand():
    mask = row([0.2, 0.6, 1.0])
    # real regions 0 and 1: mean (0.2 + 0.6) / 2 = 0.4, std sqrt((0.2^2 + 0.2^2) / 2) = 0.2
    mean, std = mask_row_statistics(mask, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close((mean.item(), std.item()), (0.4, 0.2))
    # every region: mean 0.6, std sqrt((0.4^2 + 0 + 0.4^2) / 3)
    mean, std = mask_row_statistics(mask)
    torch.testing.assert_close((mean.item(), std.item()), (0.6, math.sqrt(0.32 / 3)))


def test_attention_change_by_hand():
    raw = torch.cat([row([0.5, 0.3, 0.2]), row([0.5, 0.3, 0.2])], dim=1)  # two heads
    aligned = torch.cat([row([0.3, 0.5, 0.2]), row([0.45, 0.35, 0.2])], dim=1)
    l1, changed = attention_change(raw, aligned)
    # head 0: |0.3 - 0.5| + |0.5 - 0.3| = 0.4, argmax 0 -> 1; head 1: 0.05 + 0.05 = 0.1, argmax stays 0
    torch.testing.assert_close(l1.flatten(), torch.tensor([0.4, 0.1]))
    assert changed.flatten().tolist() == [True, False]


def test_head_diversity_by_hand():
    # heads [0.6, 0.4] and [0.2, 0.8], mean [0.4, 0.6]: each head is 0.2 + 0.2 = 0.4 from the mean
    attention = torch.tensor([[[[0.6, 0.4]], [[0.2, 0.8]]]])  # (1, 2, 1, 2)
    torch.testing.assert_close(head_diversity(attention), torch.tensor([[0.4]]))
    assert head_diversity(torch.cat([attention[:, :1]] * 2, dim=1)).item() == 0.0  # identical heads


def test_a2_diagnostics_on_a_constant_mask_captioner():
    from test_captioning import caption_labels, regions, tiny_config

    from hf_vlalign.models.captioning import RegionCaptionerForConditionalGeneration

    torch.manual_seed(0)
    model = RegionCaptionerForConditionalGeneration(tiny_config(attention_alignment="gate", mask_weight=0.5)).eval()
    perturbations = [module for module in model.modules() if isinstance(module, AttentionPerturbation)]
    with torch.no_grad():  # m = sigmoid(ln 3) = 0.75 everywhere: the same for every region, so no region is favoured
        for module in perturbations:
            module.mask_network.weight.zero_()
            module.mask_network.bias.fill_(math.log(3.0))
    inputs = {**regions(), "labels": caption_labels()}
    diagnostics = A2Diagnostics()
    diagnostics.update(model, inputs)
    result = diagnostics.compute()
    assert set(result) == set(A2_DIAGNOSTICS)
    assert result["mask_mean"] == pytest.approx(0.75) and result["mask_std_across_regions"] == pytest.approx(0.0, abs=1e-7)
    # a uniform m scales a row uniformly (eq. 5), which the fusion's re-normalisation undoes
    assert result["attention_change_l1"] == pytest.approx(0.0, abs=1e-6) and result["argmax_change_share"] == 0.0
    with torch.no_grad(), fixed_mask(model, 0.0):
        zero = model(**inputs, alignment_mode="perturb").loss_caption
    with torch.no_grad(), fixed_mask(model, 1.0):
        raw = model(**inputs, alignment_mode="perturb").loss_caption
    assert result["caption_loss_change_zero_mask"] == pytest.approx(float(zero - raw), abs=1e-6)
    assert float(zero - raw) != 0.0 and result["head_diversity"] > 0  # random heads differ, so m = 0 changes the loss
    # eq. 4 with the learned mask: -L_IC(a_p) + lambda * sum over heads and regions of (1 - 0.75)^2 per step, per layer
    with torch.no_grad():
        loss_caption = float(model(**inputs, alignment_mode="perturb").loss_caption)
    heads, real_regions = 4, regions()["visual_attention_mask"]
    # per valid step of example b: heads * real regions of b (padded regions have m = 1) * 0.0625; mean over steps
    valid = caption_labels() != -100
    per_step = (heads * real_regions.sum(dim=1, keepdim=True) * 0.0625).expand_as(valid)[valid].mean()
    expected = -loss_caption + 0.5 * 2 * float(per_step)  # two aligned layers
    assert result["mask_loss"] == pytest.approx(expected, rel=1e-5)

