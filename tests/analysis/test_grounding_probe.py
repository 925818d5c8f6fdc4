"""Grounding probe (Li et al. 2020) on a hand-computed example: 2 layers x 2 heads, 2 examples, 3 text tokens,
3 regions, one padded phrase slot and one padded region that would win the argmax if it were not masked."""

import json

import numpy as np
import pytest
import torch

from hf_vlalign.analysis.grounding_probe import GroundingProbe, GroundingProbeResult, text_to_region_attention
from hf_vlalign.metrics import region_hits


T, R = 3, 3
N = T + R + 1  # text, regions, [END]

# the three real phrases: (example, last sub-word position)
PHRASE_A, PHRASE_B, PHRASE_C = (0, 1), (0, 2), (1, 0)

# text->region attention of each phrase token for (layer, head); the rest of each row goes to [END]
REGION_ROWS = {
    (0, 0): {PHRASE_A: [0.5, 0.1, 0.1], PHRASE_B: [0.1, 0.5, 0.2], PHRASE_C: [0.1, 0.2, 0.6]},
    (0, 1): {PHRASE_A: [0.1, 0.4, 0.2], PHRASE_B: [0.1, 0.2, 0.4], PHRASE_C: [0.3, 0.1, 0.5]},
    (1, 0): {PHRASE_A: [0.6, 0.1, 0.1], PHRASE_B: [0.5, 0.1, 0.2], PHRASE_C: [0.4, 0.2, 0.1]},
    (1, 1): {PHRASE_A: [0.1, 0.1, 0.7], PHRASE_B: [0.4, 0.2, 0.3], PHRASE_C: [0.1, 0.05, 0.8]},
}


def make_batch():
    attentions = []
    for layer in range(2):
        attention = torch.full((2, 2, N, N), 1.0 / N)
        for head in range(2):
            for (example, token), weights in REGION_ROWS[(layer, head)].items():
                row = torch.zeros(N)
                row[T : T + R] = torch.tensor(weights)
                row[-1] = 1.0 - row.sum()
                attention[example, head, token] = row
        attentions.append(attention)
    phrase_token_index = torch.tensor([[1, 2], [0, -1]])
    phrase_region_iou = torch.tensor(
        [
            [[0.9, 0.1, 0.0], [0.0, 0.6, 0.5]],  # A: region 0 correct; B: regions 1 and 2 (0.5 is the threshold)
            [[0.2, 0.7, 0.9], [0.0, 0.0, 0.0]],  # C: region 1 correct, region 2 is padding; second slot is padding
        ]
    )
    visual_attention_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    region_confidence = torch.tensor([[0.9, 0.5, 0.3], [0.6, 0.4, 0.99]])
    return dict(
        attentions=tuple(attentions),
        text_length=T,
        phrase_token_index=phrase_token_index,
        phrase_region_iou=phrase_region_iou,
        visual_attention_mask=visual_attention_mask,
        region_confidence=region_confidence,
    )


# predictions after masking -> correct?
#   L0H0: A r0 yes, B r1 yes, C r1 yes (r2 masked)        -> 3/3
#   L0H1: A r1 no,  B r2 yes (IoU 0.5), C r0 no (r2 masked) -> 1/3
#   L1H0: A r0 yes, B r0 no,  C r0 no                      -> 1/3
#   L1H1: A r2 no,  B r0 no,  C r0 no (r2 masked)          -> 0/3
EXPECTED_ACCURACY = np.array([[1.0, 1 / 3], [1 / 3, 0.0]])
# baseline: A r0 yes, B r0 no, C r0 no (r2 has the highest confidence but is masked) -> 1/3


def test_hand_computed_accuracies():
    probe = GroundingProbe(num_layers=2, num_heads=2)
    probe.update(**make_batch())
    result = probe.compute()

    assert isinstance(result, GroundingProbeResult)
    np.testing.assert_allclose(result.accuracy, EXPECTED_ACCURACY)
    assert (result.best_layer, result.best_head) == (0, 0)
    assert result.best_head_accuracy == pytest.approx(1.0)
    assert result.mean_head_accuracy == pytest.approx(5 / 12)
    assert result.baseline_accuracy == pytest.approx(1 / 3)
    assert result.num_phrases == 3


def test_masked_region_is_never_predicted():
    batch = make_batch()
    batch["visual_attention_mask"] = torch.ones(2, 3, dtype=torch.long)  # unmask the padded region
    probe = GroundingProbe(2, 2)
    probe.update(**batch)
    result = probe.compute()
    # now region 2 (IoU 0.9 for C) wins for L0H1, L1H1 and the baseline
    np.testing.assert_allclose(result.accuracy, [[1.0, 2 / 3], [1 / 3, 1 / 3]])
    assert result.baseline_accuracy == pytest.approx(2 / 3)


def test_accumulates_over_batches():
    batch = make_batch()
    split = GroundingProbe(2, 2)
    for example in range(2):
        split.update(
            attentions=tuple(a[example : example + 1] for a in batch["attentions"]),
            text_length=T,
            **{k: batch[k][example : example + 1] for k in
               ("phrase_token_index", "phrase_region_iou", "visual_attention_mask", "region_confidence")},
        )
    result = split.compute()
    np.testing.assert_allclose(result.accuracy, EXPECTED_ACCURACY)
    assert result.num_phrases == 3

    split.update(**batch)
    assert split.compute().num_phrases == 6
    np.testing.assert_allclose(split.compute().accuracy, EXPECTED_ACCURACY)


def test_to_dict_is_json_ready():
    probe = GroundingProbe(2, 2)
    probe.update(**make_batch())
    payload = json.loads(json.dumps(probe.compute().to_dict()))
    assert payload["num_phrases"] == 3
    assert payload["best_layer"] == 0 and payload["best_head"] == 0
    np.testing.assert_allclose(payload["accuracy"], EXPECTED_ACCURACY)


def test_compute_without_phrases_raises():
    probe = GroundingProbe(2, 2)
    with pytest.raises(ValueError, match="at least one grounded phrase"):
        probe.compute()
    batch = make_batch()
    batch["phrase_token_index"] = torch.full((2, 2), -1)
    probe.update(**batch)
    with pytest.raises(ValueError, match="at least one grounded phrase"):
        probe.compute()


def test_region_hits_pick_the_best_real_region_and_count_iou_at_the_threshold():
    """The one grounding rule (`metrics.grounding.region_hits`) that the probes, their confidence baseline, the
    largest-region baseline and the referring accuracy of the image-use gap all apply."""
    scores = torch.tensor([[0.2, 0.3, 0.9], [0.5, 0.5, 0.1], [0.1, 0.2, 0.3]])
    iou = torch.tensor([[0.0, 0.5, 1.0], [0.6, 0.0, 0.0], [0.9, 0.49, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    # row 0: region 2 is padding, region 1 (IoU 0.5, the threshold) is picked; row 1: a tie goes to the first region;
    # row 2: region 1 (IoU 0.49) is picked
    assert region_hits(scores, iou, mask).tolist() == [True, True, False]
    assert region_hits(scores, iou).tolist() == [True, True, False]  # unmasked, row 0 picks region 2 (IoU 1.0)
    assert region_hits(scores, iou, mask, iou_threshold=0.55).tolist() == [False, True, False]
    # broadcast: (K, L, H, R) rows of heads against each phrase's (K, R) IoUs, as the probes read them
    rows = scores[:, None, None, :].expand(3, 2, 2, 3)
    assert region_hits(rows, iou[:, None, None, :], mask[:, None, None, :]).shape == (3, 2, 2)


def test_text_to_region_attention_renormalises_over_regions():
    batch = make_batch()
    rows = text_to_region_attention(batch["attentions"], T, R)
    assert rows.shape == (2, 2, 2, T, R)  # (L, B, H, T, R)
    torch.testing.assert_close(rows.sum(-1), torch.ones(2, 2, 2, T))
    # layer 0, head 0, phrase A: [0.5, 0.1, 0.1] / 0.7
    torch.testing.assert_close(rows[0, 0, 0, 1], torch.tensor([5 / 7, 1 / 7, 1 / 7]))

    masked = text_to_region_attention(batch["attentions"], T, R, batch["visual_attention_mask"])
    assert torch.all(masked[:, 1, :, :, 2] == 0)
    # phrase C, layer 0, head 0: [0.1, 0.2] / 0.3 once region 2 is masked
    torch.testing.assert_close(masked[0, 1, 0, 0], torch.tensor([1 / 3, 2 / 3, 0.0]))


def test_text_to_region_attention_zero_rows_stay_zero():
    attention = torch.zeros(1, 1, N, N)
    attention[..., -1] = 1.0  # everything on [END]
    rows = text_to_region_attention([attention], T, R)
    assert torch.all(rows == 0) and not torch.isnan(rows).any()


# ---------------------------------------------------------------------------------------------------------------------
# The baseline named by how it was made
# ---------------------------------------------------------------------------------------------------------------------


def _confidences(batch: dict, confidence: torch.Tensor) -> dict:
    return {**batch, "region_confidence": confidence}


def test_a_store_without_confidences_gives_the_store_order_baseline():
    # the collators give every region confidence 1 where the store has none (grid or user-data regions): the pick is
    # each image's first stored region, A r0 yes, B r0 no, C r0 no
    probe = GroundingProbe(2, 2)
    probe.update(**_confidences(make_batch(), torch.ones(2, 3)))
    result = probe.compute()
    assert result.baseline_accuracy == pytest.approx(1 / 3)
    assert result.baseline_kind == "store_order" and result.baseline_name.startswith("store-order baseline")
    assert "detection" not in result.baseline_name
    assert result.to_dict()["baseline_kind"] == "store_order"
    # a detector's confidences rank the regions: Li et al.'s detection-confidence baseline
    detected = GroundingProbe(2, 2)
    detected.update(**make_batch())
    assert detected.compute().baseline_kind == "detection_confidence"
    assert detected.compute().to_dict()["baseline_name"] == "detection-confidence baseline"


def test_images_with_and_without_confidences_and_single_region_images():
    # example 0 ranked by confidence, example 1 tied: both kinds, named so
    mixed = GroundingProbe(2, 2)
    mixed.update(**_confidences(make_batch(), torch.tensor([[0.9, 0.5, 0.3], [1.0, 1.0, 0.2]])))
    assert mixed.compute().baseline_kind == "detection_confidence_or_store_order"
    # an image of one region ties with nothing: it does not make a detector's store "store order"
    single = GroundingProbe(2, 2)
    batch = make_batch()
    batch["visual_attention_mask"] = torch.tensor([[1, 1, 1], [1, 0, 0]])
    single.update(**_confidences(batch, torch.tensor([[0.9, 0.5, 0.3], [1.0, 1.0, 1.0]])))
    assert single.compute().baseline_kind == "detection_confidence"
    # a baseline whose scores are not confidences is named by the caller
    assert GroundingProbe(2, 2, baseline_kind="centre_patch").baseline_kind == "centre_patch"
    with pytest.raises(ValueError, match="`baseline_kind` must be None or one of"):
        GroundingProbe(2, 2, baseline_kind="detector")


def test_every_probe_baseline_kind_is_described_and_compared_under_its_kind():
    from hf_vlalign.analysis.grounding_probe import PROBE_BASELINE_NAMES
    from hf_vlalign.evaluation.baselines import BASELINE_KINDS, grounding_probe_baselines

    assert set(PROBE_BASELINE_NAMES) <= set(BASELINE_KINDS)
    probe = GroundingProbe(2, 2)
    probe.update(**_confidences(make_batch(), torch.ones(2, 3)))
    baselines = grounding_probe_baselines(probe.compute(), ("best", "mean"))
    assert {b.kind for b in baselines.values()} == {"store_order"} and baselines["best"].value == pytest.approx(1 / 3)
