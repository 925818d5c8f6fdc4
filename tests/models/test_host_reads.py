"""No host synchronisation in a step: off the CPU, a training step (forward with every label and attention
supervision, the trainers' global item counts, backward) reads no tensor value on the host, so on an accelerator it
waits for no kernel. The steps run on the `meta` device, whose tensors have shapes and dtypes but no values: any host
read there (`.item()`, `bool(tensor)`, `.tolist()`, a boolean-mask index, `nonzero`) raises, so a forward that read a
value would fail these tests, as the last one shows with the value checks requested."""

from __future__ import annotations

import pytest
import torch
from common_model_checks import config
from test_common_compile_checks import word_region_alignment
from test_malformed_model_inputs import HEADS, valid_inputs

META = torch.device("meta")
# (family, head, config overrides, forward arguments): each family's supervision methods and A2's step kinds
STEPS = [
    ("ss", "vgp", {"attention_supervision": "direct"}, {}),
    ("ss", "pretrain", {"attention_supervision": "semi_direct"}, {}),
    ("ts", "pretrain", {"attention_supervision": "direct", "task_alignment": True}, {}),
    ("ts", "grounding", {"attention_supervision": "semi_direct"}, {}),
    ("cap", "caption", {"attention_alignment": "exp_decay"}, {}),
    ("cap", "caption", {"attention_alignment": "gate"}, {"alignment_mode": "perturb"}),
]


def model_and_batch(family: str, head: str, overrides: dict) -> tuple[torch.nn.Module, dict]:
    """The head with dropout on and feature statistics set (as the trainers set them, on the host), and its valid batch
    with the gold alignment, both on the meta device."""
    torch.manual_seed(0)
    model = HEADS[family, head](config(family, **overrides))
    dim = model.config.visual_feat_dim
    model.set_visual_feature_statistics(torch.zeros(dim), torch.ones(dim), 10)
    model = model.train().to(META)
    batch = valid_inputs(family, head)
    if family != "cap":
        batch["word_region_alignment"] = word_region_alignment()
    return model, {name: value.to(META) for name, value in batch.items()}


@pytest.mark.parametrize(("family", "head", "overrides", "arguments"), STEPS, ids=[f"{s[0]}_{s[1]}_{i}" for i, s in enumerate(STEPS)])
def test_a_training_step_off_the_cpu_reads_nothing_on_the_host(family, head, overrides, arguments):
    model, batch = model_and_batch(family, head, overrides)
    outputs = model(**batch, **arguments, global_item_counts=model.loss_item_counts(batch))
    outputs.loss.backward()
    assert outputs.loss.device == META
    assert any(p.grad is not None for p in model.parameters())


def test_an_evaluation_forward_off_the_cpu_reads_nothing_on_the_host():
    model, batch = model_and_batch("ts", "refcoco", {})
    with torch.no_grad():
        assert model.eval()(**batch).logits.device == META


def test_the_meta_device_catches_a_host_read():
    """`validate_inputs=True` asks for the value checks off the CPU: they read the values, which meta tensors lack."""
    model, batch = model_and_batch("ss", "qa", {})
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
        model(**batch, validate_inputs=True)
