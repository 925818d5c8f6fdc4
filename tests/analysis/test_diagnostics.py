"""Mechanism diagnostics (`hf_vlalign.evaluation.diagnostics`) against hand computations: the attention loss's first
and last training log, each task's score with its own image and with another image's (minus the loss for a loss),
and the geometry check of `image_use_gap(perturb_boxes=True)` on a two-region toy whose loss is known by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hf_vlalign.evaluation import image_use_gap, shuffled_rows
from hf_vlalign.evaluation.diagnostics import (
    attention_loss_trajectory,
    geometry_loss_changes,
    mechanism_diagnostics,
    task_image_scores,
)
from hf_vlalign.evaluation.image_use import BOX_KEYS, BlankBoxesCollator, RegionShuffleCollator

# a Trainer's log history: training logs carry the component under its name, evaluation logs as eval_<name>
LOG_HISTORY = [
    {"loss": 2.0, "loss_attention_supervision": 0.9, "step": 1},
    {"eval_loss": 1.5, "eval_loss_attention_supervision": 0.05, "step": 1},
    {"loss": 1.0, "loss_attention_supervision": 0.6, "step": 2},
    {"loss": 0.5, "loss_attention_supervision": 0.4, "step": 3},
    {"train_runtime": 3.0, "step": 3},
]


def test_attention_loss_start_and_end_are_the_first_and_last_training_logs():
    assert attention_loss_trajectory(LOG_HISTORY, "loss_attention_supervision") == {
        "attention_loss_start": 0.9,
        "attention_loss_end": 0.4,
    }
    assert attention_loss_trajectory(LOG_HISTORY, "loss_alignment") == {}  # not logged: an unsupervised run
    with pytest.raises(ValueError, match="`loss_key`"):
        attention_loss_trajectory(LOG_HISTORY, "")


IMAGE_USE = {
    "own_image_loss": 0.7,
    "shuffled_image_loss": 1.9,
    "own_image_id_accuracy": 0.9,
    "shuffled_image_id_accuracy": 0.55,
    "own_image_vgp_accuracy": 1.0,
    "shuffled_image_vgp_accuracy": 1.0,
}


def test_task_scores_with_own_and_shuffled_images_minus_the_loss_for_a_loss():
    assert task_image_scores(IMAGE_USE, "id_accuracy") == {"image_score": 0.9, "text_only_score": 0.55}
    assert task_image_scores(IMAGE_USE, "loss") == {"image_score": -0.7, "text_only_score": -1.9}  # higher = better
    with pytest.raises(ValueError, match="'accuracy' is not scored in `image_use`.*id_accuracy"):
        task_image_scores(IMAGE_USE, "accuracy")
    with pytest.raises(ValueError, match="perturb_boxes=True"):
        geometry_loss_changes(IMAGE_USE)
    diagnostics = mechanism_diagnostics(
        IMAGE_USE, {"vgp_identification": "id_accuracy", "vgp_type": "vgp_accuracy"}, LOG_HISTORY,
        attention_loss_key="loss_attention_supervision",
    )  # fmt: skip
    assert diagnostics == {
        "vgp_identification": {"image_score": 0.9, "text_only_score": 0.55},
        "vgp_type": {"image_score": 1.0, "text_only_score": 1.0},  # a type the text alone gives away
        "attention_loss_start": 0.9,
        "attention_loss_end": 0.4,
    }
    assert "attention_loss_start" not in mechanism_diagnostics(IMAGE_USE, {}, LOG_HISTORY)  # no supervision asked
    with pytest.raises(ValueError, match="`tasks` must be a mapping"):
        mechanism_diagnostics(IMAGE_USE, ["vgp_type"])


# two images of two regions; each region's single feature is its box's x1, which the toy model predicts from the box
X1 = {"a": (0.1, 0.5), "b": (0.2, 0.8)}


def toy_collator(rows: list[dict]) -> dict[str, torch.Tensor]:
    x1 = torch.tensor([X1[row["image_id"]] for row in rows])  # (B, 2)
    boxes = torch.stack([x1, torch.zeros_like(x1), x1 + 0.1, torch.full_like(x1, 0.1)], dim=-1)  # (B, 2, 4)
    return {"visual_feats": x1.unsqueeze(-1), "visual_boxes": boxes, "visual_attention_mask": torch.ones_like(x1)}


class BoxReader(nn.Module):
    """loss = the mean over regions of (x1 of the region's box - its feature)^2: 0 with the true boxes."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(()))  # where the inputs go

    def forward(self, visual_feats, visual_boxes, visual_attention_mask):
        return SimpleNamespace(loss=((visual_boxes[..., 0] - visual_feats[..., 0]) ** 2).mean() + self.unused)


def test_geometry_loss_changes_of_a_two_region_toy_equal_the_hand_computation():
    rows = [{"image_id": "a"}, {"image_id": "b"}]
    image_use = image_use_gap(BoxReader(), rows, toy_collator, batch_size=2, perturb_boxes=True, progress=False)
    assert image_use["own_image_loss"] == 0.0 and image_use["shuffled_image_loss"] == 0.0  # images move whole
    # shuffled: two regions swap boxes, ((0.5 - 0.1)^2 * 2 + (0.8 - 0.2)^2 * 2) / 4 = (0.16 + 0.36) / 2
    assert math.isclose(image_use["boxes_shuffled_loss"], 0.26, rel_tol=1e-6)
    # zeroed geometry: every box the whole image, x1 = 0: (0.1^2 + 0.5^2 + 0.2^2 + 0.8^2) / 4
    assert math.isclose(image_use["boxes_zeroed_loss"], 0.235, rel_tol=1e-6)
    geometry = mechanism_diagnostics(image_use, {"toy": "loss"})["geometry"]
    assert math.isclose(geometry["loss_change_boxes_shuffled"], 0.26, rel_tol=1e-6)
    assert math.isclose(geometry["loss_change_boxes_zeroed"], 0.235, rel_tol=1e-6)
    assert "boxes_shuffled_loss" not in image_use_gap(BoxReader(), rows, toy_collator, batch_size=2, progress=False)


def test_box_collators_move_or_blank_the_boxes_and_keep_the_features():
    rows = [{"image_id": "a"}, {"image_id": "b"}]
    batch = toy_collator(rows)
    shuffled = RegionShuffleCollator(toy_collator, seed=0, keys=BOX_KEYS)(rows)
    assert torch.equal(shuffled["visual_boxes"], batch["visual_boxes"].flip(1))  # two regions: a swap
    assert torch.equal(shuffled["visual_feats"], batch["visual_feats"])
    blank = BlankBoxesCollator(toy_collator)(rows)
    assert torch.equal(blank["visual_boxes"], torch.tensor([0.0, 0.0, 1.0, 1.0]).expand(2, 2, 4))
    assert torch.equal(blank["visual_feats"], batch["visual_feats"])


def test_shuffled_rows_move_a_pixel_models_picture_with_its_image():
    rows = [{"image_id": name, "image_path": f"{name}.png", "caption": f"caption of {name}"} for name in "abc"]
    shuffled = shuffled_rows(rows, seed=0)
    for row, new in zip(rows, shuffled):
        assert new["image_id"] != row["image_id"] and new["image_path"] == f"{new['image_id']}.png"
        assert new["caption"] == row["caption"]  # the text stays
