"""Li et al. 2020: only "actively attending" heads (> 20 % of their attention on the regions) are candidates for the best
head, in the entity grounding probe and per dependency relation (Table 2); hand-built attention where the most accurate
head overall barely looks at the image, so the filter changes the answer."""

import json

import numpy as np
import pytest
import torch

from hf_vlalign.analysis.grounding_probe import GroundingProbe, best_active_head
from hf_vlalign.analysis.probe_plots import plot_head_accuracy, plot_top_relations
from hf_vlalign.analysis.syntactic_grounding import SyntacticGroundingProbe
from hf_vlalign.evaluation.grounding import entity_grounding_metrics
from test_probe_analysis import PARSE  # "a man rides a horse", parsed

R = 4


def entity_batch():
    """One example, 4 phrases (last sub-words = tokens 0..3), phrase p's gold region is p (IoU 1, else 0.3).

    Rows are slices of joint maps (their mass on the regions is the head's share): head 0 puts only 0.1 on the regions
    but peaks on the gold one (accuracy 1, share 0.1: not active); head 1 puts 0.6 on the regions, peaked on the gold
    region for phrases 0 and 1 only (accuracy 1/2, share 0.6: active)."""
    rows = torch.zeros(1, 1, 2, R, R)
    rows[0, 0, 0] = 0.1 * (0.1 + 0.6 * torch.eye(R))  # each row sums to 0.1 * (0.4 + 0.6) = 0.1
    head1 = torch.full((R, R), 0.1)
    for phrase, region in ((0, 0), (1, 1), (2, 3), (3, 0)):
        head1[phrase, region] = 0.3  # each row: 0.3 + 3 * 0.1 = 0.6
    rows[0, 0, 1] = head1
    return dict(
        text_to_region=rows,
        phrase_token_index=torch.arange(R)[None],
        phrase_region_iou=torch.full((1, R, R), 0.3) + 0.7 * torch.eye(R)[None],
        visual_attention_mask=torch.ones(1, R, dtype=torch.long),
        region_confidence=torch.tensor([[0.1, 0.2, 0.3, 0.9]]),
    )


def test_the_best_entity_grounding_head_is_the_best_active_one():
    probe = GroundingProbe(num_layers=1, num_heads=2)
    probe.update_from_text_to_region(**entity_batch())
    result = probe.compute()
    np.testing.assert_allclose(result.accuracy, [[1.0, 0.5]])
    np.testing.assert_allclose(result.active_share, [[0.1, 0.6]])
    # the most accurate head (0) puts 10 % of its attention on the image: not a candidate
    assert (result.best_layer, result.best_head, result.best_head_accuracy) == (0, 1, 0.5)
    assert result.best_head_active_share == pytest.approx(0.6)
    payload = result.to_dict()
    assert payload["best_among"] == "active heads" and payload["best_head_active_share"] == pytest.approx(0.6)
    json.dumps(payload)

    metrics = entity_grounding_metrics(result)
    assert metrics["entity_grounding_accuracy_best_head"] == 0.5 and metrics["best_head"] == [0, 1]
    assert metrics["detection_confidence_baseline"] == pytest.approx(1 / R)
    (layer,) = metrics["entity_grounding_accuracy_best_head_per_layer"]
    assert (layer["head"], layer["active_share"]) == (1, pytest.approx(0.6))


def test_all_heads_option_takes_the_unrestricted_best():
    probe = GroundingProbe(num_layers=1, num_heads=2, active_heads_only=False)
    probe.update_from_text_to_region(**entity_batch())
    result = probe.compute()
    assert (result.best_head, result.best_head_accuracy, result.best_among) == (0, 1.0, "all heads")
    assert result.best_head_active_share == pytest.approx(0.1)
    (layer,) = entity_grounding_metrics(result)["entity_grounding_accuracy_best_head_per_layer"]
    assert layer["head"] == 0


def test_no_active_head_or_an_undefined_share_falls_back_to_all_heads():
    accuracy = np.array([[0.2, 0.9], [0.4, 0.1]])
    assert best_active_head(accuracy, np.full((2, 2), 0.1)) == (0, 1, "all heads (no head is actively attending)")
    layer, head, among = best_active_head(accuracy, None)
    assert (layer, head) == (0, 1) and among.startswith("all heads (active share undefined")
    assert best_active_head(accuracy, np.array([[0.5, 0.2], [0.21, 0.9]])) == (1, 0, "active heads")
    # the threshold is strict: a share of exactly 0.2 is not active
    assert best_active_head(accuracy, np.array([[0.5, 0.2], [0.2, 0.9]]))[:2] == (0, 0)


# ---------------------------------------------------------------------------------------------------------------------
# Syntactic grounding (Table 2): "a man rides a horse"

T_SYN, R_SYN = 8, 3
MAN_IOU, HORSE_IOU = [0.9, 0.1, 0.0], [0.0, 0.8, 0.3]


def syntactic_batch():
    """Head 0 peaks on: a(1) -> r0, man -> r0, rides -> r0, a(4) -> r1, horse -> r2 but puts only 10 % of each row on
    the regions; head 1 is uniform over the regions with 60 % of each row on them (its argmax: region 0)."""
    rows = torch.full((1, 2, T_SYN, R_SYN), 0.2)
    rows[0, 0] = 0.1 / R_SYN
    for token, region in ((1, 0), (2, 0), (4, 0), (5, 1), (6, 2)):
        rows[0, 0, token] = torch.tensor([0.08 if r == region else 0.01 for r in range(R_SYN)])
    return dict(
        text_to_region=[rows],
        parses=[PARSE],
        word_token_index=torch.tensor([[1, 2, 4, 5, 6]]),
        word_region_iou=torch.tensor([[MAN_IOU, MAN_IOU, [0.0] * 3, HORSE_IOU, HORSE_IOU]]),
        word_grounded=torch.tensor([[True, True, False, True, True]]),
        visual_attention_mask=torch.ones(1, R_SYN),
        region_confidence=torch.tensor([[0.1, 0.9, 0.5]]),
    )


def test_the_best_head_of_each_relation_is_the_best_active_one(tmp_path):
    probe = SyntacticGroundingProbe(num_layers=1, num_heads=2)
    probe.update(**syntactic_batch())
    result = probe.compute()
    # det: head 0 is right for a->man, man->a, a->horse (3 / 4); head 1 (argmax r0) for the "a man" arcs (2 / 4)
    np.testing.assert_allclose(result.accuracy["det"], [[3 / 4, 2 / 4]])
    np.testing.assert_allclose(result.active_share, [[0.1, 0.6]])
    assert result.best_head("det") == (0, 1, 0.5)
    (row,) = result.top_relations(k=1)
    assert row["relation"] == "det" and (row["head"], row["accuracy"]) == (1, 0.5)
    assert row["active_share"] == pytest.approx(0.6) and row["best_among"] == "active heads"
    payload = result.to_dict()
    assert payload["active_share"] == [[pytest.approx(0.1), pytest.approx(0.6)]] and payload["active_heads_only"]
    json.dumps(payload)
    assert plot_top_relations(result.top_relations(3), tmp_path / "relations.png").stat().st_size > 0


def test_syntactic_all_heads_option_takes_the_unrestricted_best():
    probe = SyntacticGroundingProbe(num_layers=1, num_heads=2, active_heads_only=False)
    probe.update(**syntactic_batch())
    result = probe.compute()
    assert result.best_head("det") == (0, 0, 0.75)
    assert result.top_relations(1)[0]["best_among"] == "all heads"


def test_syntactic_share_is_undefined_for_rows_that_are_not_probabilities():
    batch = syntactic_batch()
    batch["text_to_region"] = [batch["text_to_region"][0] * 3]  # head 1's rows now sum to 1.8
    probe = SyntacticGroundingProbe(num_layers=1, num_heads=2)
    probe.update(**batch)
    result = probe.compute()
    assert result.active_share is None
    assert result.top_relations(1)[0]["best_among"].startswith("all heads (active share undefined")


def test_head_heatmap_marks_inactive_heads(tmp_path):
    accuracy = np.array([[1.0, 0.5]])
    path = plot_head_accuracy(accuracy, tmp_path / "heads.png", active_share=np.array([[0.1, 0.6]]), baseline=0.25)
    assert path.stat().st_size > 0


def test_every_best_head_shown_names_its_candidates(tmp_path):
    """The probe's table, heatmap and explorer page say which heads the best was chosen among, and where the best of
    all heads differs (head 0: accuracy 1, 10 % of its attention on the image), name it too."""
    from hf_vlalign.analysis.explorer import ExplorerExample, read_explorer_payload, write_attention_explorer
    from hf_vlalign.analysis.probe_plots import draw_head_accuracy
    from hf_vlalign.cli.grounding_verbs import probe_table

    probe = GroundingProbe(num_layers=1, num_heads=2)
    probe.update_from_text_to_region(**entity_batch())
    result = probe.compute()
    table = probe_table(result.to_dict(), "model", "data")
    assert "best head of active heads (layer 0, head 1, active share 0.60)  0.500" in table
    assert "best of all heads (layer 0, head 0, active share 0.10)" in table and "detection-confidence baseline" in table
    assert "best head of each layer, of its active heads" in table
    figure = draw_head_accuracy(result.accuracy, active_share=result.active_share, active_heads_only=False)
    assert "best (red, of all heads): layer 0, head 0" in figure.axes[0].get_title()

    words = ["a", "b", "c", "d"]
    example = ExplorerExample(words, np.array([[0, 0, 0.5, 0.5]] * R), {"word_to_region": np.full((1, 2, 4, R), 0.25)})
    page = write_attention_explorer([example], tmp_path / "page.html", probe=result, probe_examples="the first 1 of 2 examples")
    payload = read_explorer_payload(page)["probe"]
    assert payload["best"] == [0, 1] and payload["best_among"] == "active heads"
    assert payload["best_of_all_heads"] == [0, 0] and payload["active"] == [[False, True]]
    assert payload["baseline_name"] == "detection-confidence baseline"
    assert payload["examples"] == "the first 1 of 2 examples"
