"""Ilinykh, Analysis I: where the object clusters come from (the detector's class of each region, or k-means on box
centres), checked on hand-built boxes and classes, and fed to the within-cluster share."""

import pytest
import torch

from hf_vlalign.analysis.attention_blocks import AttentionBlocks
from hf_vlalign.analysis.geometry import region_clusters, spatial_clusters, within_cluster_attention


def boxes_at(centres, size=0.05):
    centres = torch.tensor(centres, dtype=torch.float32)
    return torch.cat([centres - size, centres + size], dim=-1)[None]  # (1, R, 4)


# two groups of centres far apart (top left, bottom right) and a padded region
BOXES = boxes_at([[0.1, 0.1], [0.15, 0.12], [0.12, 0.18], [0.8, 0.85], [0.85, 0.8], [0.5, 0.5]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 0]])


def test_spatial_clusters_group_nearby_boxes():
    clusters = spatial_clusters(BOXES, MASK, num_clusters=2)
    assert clusters[0, 5] == -1  # padding
    first, second = clusters[0, :3].tolist(), clusters[0, 3:5].tolist()
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]
    # k is capped by the number of real regions; deterministic
    assert sorted(spatial_clusters(BOXES, MASK, num_clusters=9)[0, :5].tolist()) == [0, 1, 2, 3, 4]
    assert torch.equal(spatial_clusters(BOXES, MASK, 2), clusters)


def test_detector_classes_are_the_default_and_singletons_are_no_cluster():
    object_ids = torch.tensor([[7, 7, 3, 7, 3, 9]])  # region 5 is padding
    clusters, source = region_clusters(BOXES, MASK, object_ids)
    assert source == "detector_class"
    assert clusters.tolist() == [[7, 7, 3, 7, 3, -1]]
    lonely = torch.tensor([[7, 7, 3, 7, 1, 9]])  # class 3 and class 1 are alone in the image
    clusters, _ = region_clusters(BOXES, MASK, lonely)
    assert clusters.tolist() == [[7, 7, -1, 7, -1, -1]]
    assert region_clusters(BOXES, MASK, lonely, min_cluster_size=1)[0].tolist() == [[7, 7, 3, 7, 1, -1]]


def test_auto_falls_back_to_spatial_without_classes():
    clusters, source = region_clusters(BOXES, MASK, None, num_spatial_clusters=2)
    assert source == "spatial" and torch.equal(clusters, spatial_clusters(BOXES, MASK, 2))
    unknown = torch.tensor([[7, -1, 3, 7, 3, -1]])  # a real region without a class: spatial
    assert region_clusters(BOXES, MASK, unknown, num_spatial_clusters=2)[1] == "spatial"
    assert region_clusters(BOXES, MASK, torch.tensor([[1, 1, 1, 2, 2, 0]]), "spatial", 2)[1] == "spatial"


def test_detector_classes_asked_for_without_classes_are_refused():
    with pytest.raises(ValueError, match="`source='detector_class'` needs `object_ids`"):
        region_clusters(BOXES, MASK, None, source="detector_class")


def test_within_cluster_share_with_detector_clusters():
    # classes: regions 0, 1 are "man" (cluster), region 2 "horse" alone (no cluster)
    mask = torch.ones(1, 3, dtype=torch.long)
    clusters, _ = region_clusters(boxes_at([[0.2, 0.2], [0.3, 0.3], [0.7, 0.7]]), mask, torch.tensor([[4, 4, 8]]))
    head = torch.tensor([[0.5, 0.2, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]])
    blocks = AttentionBlocks(
        text_mask=torch.ones(1, 1, dtype=torch.long), region_mask=mask, region_to_region=(head[None, None],),
        source="captioner",
    )  # fmt: skip
    (row,) = within_cluster_attention(blocks, clusters)
    assert row["within"] == pytest.approx((0.7 + 0.4) / 2) and row["num_rows"] == 2
