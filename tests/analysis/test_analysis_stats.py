"""Per-layer attention statistics on hand-built attention with known answers: entropy (Ilinykh III), attention vs
distance and within clusters (Ilinykh II, I), rollout and flow (Abnar & Zuidema), Kendall tau and the A2 attention vs
gradient-importance analysis on a tiny captioner."""

import itertools
import math

import numpy as np
import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from hf_vlalign.analysis.attention_blocks import AttentionBlocks
from hf_vlalign.analysis.entropy import AttentionEntropy, attention_entropy, plot_entropy
from hf_vlalign.analysis.flow import attention_flow, layer_capacities, layer_rollouts
from hf_vlalign.analysis.geometry import (
    AttentionDistance,
    GroundedWordAttention,
    attention_vs_distance,
    depth_change,
    plot_attention_vs_distance,
    plot_within_cluster,
    thematic_clusters,
    within_cluster_attention,
)
from hf_vlalign.analysis.importance import captioner_attention_importance, kendall_tau, region_importance
from hf_vlalign.models.captioning import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration


def region_blocks(attention: torch.Tensor, region_mask: torch.Tensor, source: str = "two_stream") -> AttentionBlocks:
    """Blocks holding only region_to_region, (B, H, R, R) per layer (one layer given)."""
    batch = region_mask.shape[0]
    return AttentionBlocks(
        text_mask=torch.ones(batch, 1, dtype=torch.long), region_mask=region_mask, region_to_region=(attention,), source=source
    )


# --- entropy ---------------------------------------------------------------------------------------------------------


def test_entropy_one_hot_uniform_and_padded_keys():
    # one example, 2 heads, 2 word queries (the second padded), 4 region keys (the last padded)
    text_mask, region_mask = torch.tensor([[1, 0]]), torch.tensor([[1, 1, 1, 0]])
    attention = torch.zeros(1, 2, 2, 4)
    attention[0, 0, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # head 0: one-hot -> 0
    attention[0, 1, 0] = torch.tensor([0.2, 0.2, 0.2, 0.4])  # head 1: uniform over the 3 real keys once 0.4 is dropped
    attention[0, :, 1] = torch.tensor([0.7, 0.1, 0.1, 0.1])  # padded query: must not count
    blocks = AttentionBlocks(text_mask=text_mask, region_mask=region_mask, word_to_region=(attention, attention))
    rows = attention_entropy(blocks)
    assert len(rows) == 2 * 3  # 2 layers x (2 heads + mean)
    by_head = {(row["layer"], row["head"]): row for row in rows}
    assert by_head[(0, 0)]["entropy"] == pytest.approx(0.0, abs=1e-9)
    assert by_head[(0, 1)]["entropy"] == pytest.approx(math.log(3))
    assert by_head[(0, 1)]["normalised_entropy"] == pytest.approx(1.0)
    assert by_head[(1, "mean")]["entropy"] == pytest.approx(math.log(3) / 2)
    assert by_head[(1, "mean")]["normalised_entropy"] == pytest.approx(0.5)
    assert all(row["num_rows"] == 1 and row["block"] == "word_to_region" for row in rows)


def test_entropy_accumulates_and_labels_captioner_cross_attention(tmp_path):
    uniform = torch.full((1, 1, 1, 2), 0.5)  # log 2
    one_hot = torch.tensor([[[[1.0, 0.0]]]])  # 0
    meter = AttentionEntropy()
    for attention in (uniform, one_hot):
        meter.update(
            AttentionBlocks(
                text_mask=torch.ones(1, 1), region_mask=torch.ones(1, 2), word_to_region=(attention,),
                region_to_region=(torch.full((1, 1, 2, 2), 0.5),), source="captioner",
            )
        )  # fmt: skip
    rows = {(row["block"], row["head"]): row for row in meter.compute()}
    assert set(block for block, _ in rows) == {"decoder_cross", "region_to_region"}
    assert rows[("decoder_cross", "mean")]["entropy"] == pytest.approx(math.log(2) / 2)
    assert rows[("decoder_cross", "mean")]["num_rows"] == 2
    assert rows[("region_to_region", 0)]["normalised_entropy"] == pytest.approx(1.0)
    assert rows[("region_to_region", 0)]["num_rows"] == 4
    path = plot_entropy(meter.compute(), tmp_path / "plots" / "entropy.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_entropy_of_no_batch_is_refused():
    with pytest.raises(ValueError, match="compute"):
        AttentionEntropy().compute()


# --- attention vs distance (Analysis II) -----------------------------------------------------------------------------


def three_boxes() -> torch.Tensor:
    # centres A (0.1, 0.1), B (0.4, 0.5) at 0.5 from A, C (0.9, 0.1) at 0.8 from A and sqrt(0.41) = 0.64 from B;
    # a fourth, padded region sits on top of A
    return torch.tensor([[[0.0, 0.0, 0.2, 0.2], [0.3, 0.4, 0.5, 0.6], [0.8, 0.0, 1.0, 0.2], [0.0, 0.0, 0.2, 0.2]]])


def test_attention_vs_distance_on_three_boxes(tmp_path):
    region_mask = torch.tensor([[1, 1, 1, 0]])
    head = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.5, 0.4, 0.0], [0.2, 0.2, 0.6, 0.0], [0.25, 0.25, 0.25, 0.25]])
    attention = torch.stack([head, head.roll(1, dims=0)])[None]  # 2 heads; the second's rows are permuted
    # head-averaged rows renormalised over the 3 real regions:
    # head 0: A [4, 3, 2]/9, B [.1, .5, .4], C [.2, .2, .6]; head 1 (rows C', A, B): A [.25]*3/.75, B [4, 3, 2]/9,
    # C [.1, .5, .4]
    h0 = torch.tensor([[4 / 9, 3 / 9, 2 / 9], [0.1, 0.5, 0.4], [0.2, 0.2, 0.6]])
    h1 = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [4 / 9, 3 / 9, 2 / 9], [0.1, 0.5, 0.4]])
    mixed = (h0 + h1) / 2
    rows = attention_vs_distance(region_blocks(attention, region_mask), three_boxes(), num_bins=2)
    edges = [value for row in rows for value in (row["distance_bin_low"], row["distance_bin_high"])]
    assert edges == pytest.approx([0.0, math.sqrt(2) / 2, math.sqrt(2) / 2, math.sqrt(2)])
    near, far = rows
    # bin [0, 0.707): A-B, B-A (0.5) and B-C, C-B (0.64); bin [0.707, 1.414]: A-C, C-A (0.8)
    assert near["num_pairs"] == 4 and far["num_pairs"] == 2
    assert near["mean_attention"] == pytest.approx(float(mixed[0, 1] + mixed[1, 0] + mixed[1, 2] + mixed[2, 1]) / 4)
    assert far["mean_attention"] == pytest.approx(float(mixed[0, 2] + mixed[2, 0]) / 2)
    # ten bins: an empty bin says so instead of hiding
    rows = attention_vs_distance(region_blocks(attention, region_mask), three_boxes())
    assert sum(row["num_pairs"] for row in rows) == 6
    assert all(math.isnan(row["mean_attention"]) for row in rows if row["num_pairs"] == 0)
    assert plot_attention_vs_distance(rows, tmp_path / "distance.png").stat().st_size > 0


def test_distance_effect_is_the_attention_weighted_minus_the_uniform_mean_distance():
    # Ilinykh, Analysis II as an effect size: sum(a * d) / sum(a) over the pairs of two different real regions, minus
    # the mean d over those pairs (uniform attention); layer 0 local (A <-> B), layer 1 far (A <-> C)
    region_mask = torch.tensor([[1, 1, 1, 0]])
    local = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    far = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0], [0.25] * 4])
    blocks = AttentionBlocks(
        text_mask=torch.ones(1, 1), region_mask=region_mask, region_to_region=(local[None, None], far[None, None])
    )
    meter = AttentionDistance()
    meter.update(blocks, three_boxes())
    near, distant = meter.effects()
    ab, ac, bc = 0.5, 0.8, math.sqrt(0.41)
    uniform = (ab + ac + bc) / 3  # each pair twice
    # layer 0: A->B 0.5, B->A 0.5, C->B 0.5 (self-attention left out); layer 1: A->C 0.5, C->A 0.5 (B only itself)
    assert near["attention_weighted_distance"] == pytest.approx((0.5 * ab + 0.5 * ab + 0.5 * bc) / 1.5)
    assert distant["attention_weighted_distance"] == pytest.approx(ac)
    assert near["uniform_distance"] == distant["uniform_distance"] == pytest.approx(uniform)
    assert near["effect"] == pytest.approx((ab + ab + bc) / 3 - uniform) and near["effect"] < 0 < distant["effect"]
    assert near["num_pairs"] == 6
    assert depth_change(meter.effects(), "effect") == pytest.approx(ac - (ab + ab + bc) / 3)
    with pytest.raises(ValueError, match="effects"):
        AttentionDistance().effects()


def test_depth_change_is_last_minus_first_layer():
    rows = [{"layer": 2, "value": 0.1}, {"layer": 0, "value": 0.5}, {"layer": 1, "value": 9.0}]
    assert depth_change(rows, "value") == pytest.approx(0.1 - 0.5)
    assert depth_change(rows[:1], "value") is None  # one layer: no change
    assert depth_change([{"layer": 0, "value": math.nan}, {"layer": 1, "value": 1.0}], "value") is None


# --- within-cluster attention (Analysis I) ---------------------------------------------------------------------------


def test_within_cluster_share_on_a_hand_example(tmp_path):
    # regions 0, 1 in cluster 0; region 2 unclustered; region 3 in cluster 1 but padded
    region_mask = torch.tensor([[1, 1, 1, 0]])
    clusters = torch.tensor([[0, 0, -1, 1]])
    head = torch.tensor([[0.5, 0.2, 0.3, 0.0], [0.1, 0.3, 0.4, 0.2], [0.3, 0.3, 0.4, 0.0], [0.0, 0.0, 0.0, 1.0]])
    blocks = region_blocks(head[None, None], region_mask)
    # row 0: within 0.7 of 1.0; row 1 renormalised over 0.8: within (0.1 + 0.3) / 0.8 = 0.5; row 2 has no cluster
    (row,) = within_cluster_attention(blocks, clusters)
    assert row["within"] == pytest.approx((0.7 + 0.5) / 2)
    assert row["across"] == pytest.approx(1 - (0.7 + 0.5) / 2)
    assert row["num_rows"] == 2 and row["num_skipped_rows"] == 0
    # chance level: 2 of the 3 real regions are in cluster 0
    assert row["uniform_within"] == pytest.approx(2 / 3)
    # without the diagonal: row 0 -> within 0.2 / 0.5, row 1 -> 0.1 / 0.5; chance 1 of the 2 other real regions
    (row,) = within_cluster_attention(blocks, clusters, include_self=False)
    assert row["within"] == pytest.approx((0.4 + 0.2) / 2)
    assert row["uniform_within"] == pytest.approx(1 / 2)
    assert plot_within_cluster([row], tmp_path / "clusters.png").stat().st_size > 0


def test_thematic_clusters_from_object_kinds():
    # kinds 0..3 in themes [0, 1, 0, 1]; region 2 shows no object, region 5 is padding, region 4 is alone in theme 1
    kinds = torch.tensor([[0, 2, 1, 0, 3, -1]])
    matched = torch.tensor([[True, True, True, True, True, False]])
    matched[0, 2] = False
    clusters = thematic_clusters(kinds, matched, [0, 1, 0, 1])
    assert clusters.tolist() == [[0, 0, -1, 0, -1, -1]]
    clusters = thematic_clusters(kinds, matched, [0, 1, 0, 1], min_cluster_size=1)
    assert clusters.tolist() == [[0, 0, -1, 0, 1, -1]]
    with pytest.raises(ValueError, match="class_themes"):
        thematic_clusters(kinds, matched, [0, 1])


def test_within_theme_share_leaves_out_regions_of_no_object_and_self():
    # Analysis I on thematic clusters: regions 0, 1 in theme 0, region 2 in theme 1, region 3 shows no object (-1)
    region_mask = torch.tensor([[1, 1, 1, 1]])
    clusters = torch.tensor([[0, 0, 1, -1]])
    head = torch.tensor([[0.4, 0.3, 0.1, 0.2], [0.2, 0.2, 0.2, 0.4], [0.3, 0.3, 0.2, 0.2], [0.1, 0.1, 0.1, 0.7]])
    (row,) = within_cluster_attention(region_blocks(head[None, None], region_mask), clusters, False, True)
    # keys: the other clustered regions; row 0 -> 0.3 / (0.3 + 0.1), row 1 -> 0.2 / 0.4, row 2 -> 0 (no theme-mate)
    assert row["within"] == pytest.approx((0.75 + 0.5 + 0.0) / 3)
    # chance: 1 of the 2 other clustered regions for rows 0 and 1, 0 of 2 for row 2
    assert row["uniform_within"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert row["effect"] == pytest.approx(row["within"] - row["uniform_within"])
    assert row["num_rows"] == 3


# --- a grounded word's attention on its object (Analysis IV) ---------------------------------------------------------


def test_grounded_word_attention_share_against_chance():
    # 3 words (the last padded), 4 regions (the last padded); word 0 names the object of regions 0 and 1, word 1 none
    text_mask, region_mask = torch.tensor([[1, 1, 0]]), torch.tensor([[1, 1, 1, 0]])
    alignment = torch.zeros(1, 3, 4)
    alignment[0, 0, :2] = 0.5
    alignment[0, 2, :2] = 0.5  # a padded word: not counted
    first = torch.tensor([[0.2, 0.2, 0.4, 0.2], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])  # renormalised: .25 .25 .5
    second = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    heads = lambda rows: torch.stack([rows, rows])[None]  # noqa: E731  (two equal heads)
    blocks = AttentionBlocks(text_mask=text_mask, region_mask=region_mask, word_to_region=(heads(first), heads(second)))
    meter = GroundedWordAttention()
    meter.update(blocks, alignment)
    layer0, layer1 = meter.compute()
    assert layer0["share"] == pytest.approx(0.5) and layer1["share"] == pytest.approx(0.9)
    assert layer0["uniform_share"] == pytest.approx(2 / 3) and layer0["num_words"] == 1
    assert layer1["effect"] == pytest.approx(0.9 - 2 / 3)
    assert depth_change(meter.compute(), "effect") == pytest.approx(0.4)


# --- rollout and flow (Abnar & Zuidema 2020) -------------------------------------------------------------------------


def test_identity_layers_give_identity_rollout_and_flow():
    identity = torch.eye(4).expand(2, 4, 4)  # 2 heads
    rollouts = layer_rollouts([identity, identity, identity])
    assert len(rollouts) == 3
    torch.testing.assert_close(rollouts[-1], torch.eye(4))
    torch.testing.assert_close(layer_rollouts([identity[None]] * 2)[-1], torch.eye(4)[None])
    np.testing.assert_allclose(attention_flow([identity, identity, identity]), np.eye(4), atol=1e-12)
    np.testing.assert_allclose(attention_flow([torch.eye(4)] * 2, residual=False), np.eye(4), atol=1e-12)


def test_flow_two_layer_hand_example():
    # rows are queries: layer 1 A1[i, j] from input j to middle i, layer 2 A2[i, k] from middle k to output i
    a1 = np.array([[0.5, 0.5], [0.2, 0.8]])
    a2 = np.array([[0.9, 0.1], [0.4, 0.6]])
    # With two layers every path input j -> middle k -> output i is disjoint from the others, so the max flow is
    # sum_k min(A1[k, j], A2[i, k]):
    #   out 0 <- in 0: min(0.5, 0.9) + min(0.2, 0.1) = 0.6      out 0 <- in 1: min(0.5, 0.9) + min(0.8, 0.1) = 0.6
    #   out 1 <- in 0: min(0.5, 0.4) + min(0.2, 0.6) = 0.6      out 1 <- in 1: min(0.5, 0.4) + min(0.8, 0.6) = 1.0
    # (the rollout A2 A1 gives 0.47, 0.53, 0.32, 0.68 instead: flow is not a product of weights)
    flow = attention_flow([a1, a2], residual=False)
    np.testing.assert_allclose(flow, [[0.6, 0.6], [0.6, 1.0]], atol=1e-12)
    np.testing.assert_allclose(attention_flow([a1, a2], residual=False, normalise=True), [[0.5, 0.5], [0.375, 0.625]])
    rollout = layer_rollouts([torch.tensor(a1), torch.tensor(a2)])[-1]
    res1, res2 = (torch.tensor(a) * 0.5 + torch.eye(2) * 0.5 for a in (a1, a2))  # 0.5 W + 0.5 I
    torch.testing.assert_close(rollout, res2 @ res1)


def brute_force_min_cut(layers: list[np.ndarray], source: int, sink: int) -> float:
    """Min over every s-t cut of the layered graph (max-flow = min-cut): each hidden node on the source side or not."""
    num_tokens, num_layers = layers[0].shape[0], len(layers)
    hidden = [(layer, token) for layer in range(1, num_layers) for token in range(num_tokens)]
    best = math.inf
    for sides in itertools.product([False, True], repeat=len(hidden)):
        in_source = {(0, token): token == source for token in range(num_tokens)}
        in_source.update({(num_layers, token): False for token in range(num_tokens)})
        in_source.update(dict(zip(hidden, sides)))
        # only the source node of layer 0 emits flow; the other inputs are cut off from the source anyway
        cut = sum(
            layers[layer - 1][i, j]
            for layer in range(1, num_layers + 1) for i in range(num_tokens) for j in range(num_tokens)
            if in_source[(layer - 1, j)] and not in_source[(layer, i)] and (layer < num_layers or i == sink)
        )  # fmt: skip
        best = min(best, cut)
    return best


def test_flow_equals_brute_force_min_cut_on_three_random_layers():
    generator = torch.Generator().manual_seed(0)
    attentions = [torch.rand(2, 3, 3, generator=generator).softmax(-1) for _ in range(3)]
    flow = attention_flow(attentions)
    layers = layer_capacities(attentions)
    for output_token, input_token in itertools.product(range(3), range(3)):
        assert flow[output_token, input_token] == pytest.approx(brute_force_min_cut(layers, input_token, output_token), abs=1e-9)
    # the flow into one output never exceeds its total incoming capacity (rows of the last layer sum to 1)
    assert (flow <= 1 + 1e-9).all()


# --- Kendall tau and A2's attention vs importance --------------------------------------------------------------------


def test_kendall_tau_known_values():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # x = [1, 2, 2, 3], y = [1, 2, 3, 3]: of the 6 pairs, 4 concordant, (1, 2) tied in x, (2, 3) tied in y;
    # tau-b = 4 / sqrt((6 - 1) (6 - 1)) = 0.8
    assert kendall_tau(torch.tensor([1.0, 2.0, 2.0, 3.0]), np.array([1, 2, 3, 3])) == pytest.approx(0.8)
    # one discordant pair among 3: (2 - 1) / 3
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_kendall_tau_errors():
    with pytest.raises(ValueError, match="same length, got 3 and 2"):
        kendall_tau([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        kendall_tau([1], [1])
    with pytest.raises(ValueError, match="`y` must not be constant"):
        kendall_tau([1, 2, 3], [5, 5, 5])


def tiny_captioner(**settings) -> RegionCaptionerForConditionalGeneration:
    config = RegionCaptionerConfig(
        vocab_size=30, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=12,
        max_position_embeddings=16, dropout=0.1, attention_dropout=0.1, geometry_dim=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, **settings,
    )  # fmt: skip
    torch.manual_seed(0)
    return RegionCaptionerForConditionalGeneration(config)


def captioner_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    corners = torch.rand(2, 5, 2, generator=generator) * 0.5
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, -1] = 0
    return {
        "visual_feats": torch.randn(2, 5, 12, generator=generator),
        "visual_boxes": torch.cat([corners, corners + 0.1 + 0.3 * torch.rand(2, 5, 2, generator=generator)], -1),
        "visual_attention_mask": mask,
        "labels": torch.tensor([[5, 6, 7, 2, -100], [8, 9, 10, 11, 2]]),
    }


def test_captioner_attention_importance_runs_on_a_tiny_model():
    model = tiny_captioner().train()
    rows = captioner_attention_importance(model, captioner_batch())
    assert model.training  # the mode is restored
    assert [row["layer"] for row in rows] == [0, 1]
    for row in rows:
        assert -1.0 <= row["kendall_tau"] <= 1.0
        assert row["num_words"] + row["num_undefined"] == 9  # 4 + 5 caption tokens
        assert row["num_words"] > 0
    # eval mode inside: the same model and batch give the same taus
    assert captioner_attention_importance(model, captioner_batch()) == rows
    assert all(p.grad is None for p in model.parameters())


def test_captioner_attention_importance_ranks_the_attention_the_decoder_used():
    # layer 1 A2-aligned ("max" fusion), layer 0 not: the attention ranked is the aligned one where there is one
    model = tiny_captioner(attention_alignment="max", aligned_layers=[1]).eval()
    batch = captioner_batch()
    importance, attentions, words = region_importance(model, batch)
    with torch.no_grad():
        outputs = model(**batch, output_attentions=True)
    assert torch.allclose(attentions[0], outputs.cross_attentions[0].double(), atol=1e-6)
    assert torch.allclose(attentions[1], outputs.aligned_cross_attentions[1].double(), atol=1e-6)
    assert not torch.allclose(attentions[1], outputs.cross_attentions[1].double(), atol=1e-3)
    # per layer: the mean over words of Kendall's tau-b between head-averaged attention and importance, real regions
    real = batch["visual_attention_mask"].bool()
    rows = captioner_attention_importance(model, batch)
    for layer, row in enumerate(rows):
        mixed = attentions[layer].mean(dim=1)  # (B, T, R)
        taus = [
            kendall_tau(mixed[example, position, real[example]], importance[example, position, real[example]])
            for example, position in words.nonzero().tolist()
        ]
        assert row["num_words"] == len(taus) == 9 and row["num_undefined"] == 0
        assert row["kendall_tau"] == pytest.approx(float(np.mean(taus)))


def test_an_image_of_one_region_has_nothing_to_rank_and_is_counted():
    model = tiny_captioner().eval()
    batch = captioner_batch()
    batch["visual_attention_mask"][1, 1:] = 0  # the second image keeps one region
    for row in captioner_attention_importance(model, batch):
        assert row["num_undefined"] >= 5 and row["num_words"] + row["num_undefined"] == 9  # its 5 words counted


def test_region_importance_is_the_gradient_norm_of_the_word_probability():
    model = tiny_captioner().eval()
    batch = captioner_batch()
    importance, attentions, words = region_importance(model, batch)
    assert importance.shape == (2, 5, 5) and len(attentions) == 2 and attentions[0].shape == (2, 4, 5, 5)
    assert importance[1, :, -1].abs().max() == 0  # the padded region gets no attention, hence no gradient
    assert importance[0, -1].abs().max() == 0 and not words[0, -1]  # the padded word is not scored
    # finite difference along one region's state: p changes by about eps * |d p / d h_i| in the gradient's direction
    states = model.get_encoder()(batch["visual_feats"], batch["visual_boxes"], batch["visual_attention_mask"]).last_hidden_state
    states = states.detach().double()
    model = model.double()

    def word_probability(hidden: torch.Tensor) -> torch.Tensor:
        logits = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden), visual_attention_mask=batch["visual_attention_mask"],
            labels=batch["labels"],
        ).logits  # fmt: skip
        return logits.softmax(-1)[0, 2, batch["labels"][0, 2]]

    hidden = states.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(word_probability(hidden), hidden)
    region = 1
    direction = gradient[0, region] / gradient[0, region].norm()
    eps = 1e-6
    shifted = states.clone()
    shifted[0, region] += eps * direction
    with torch.no_grad():
        slope = (word_probability(shifted) - word_probability(states)) / eps
    assert float(slope) == pytest.approx(float(importance[0, 2, region]), rel=1e-3)
