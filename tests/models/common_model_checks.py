"""What the common model checks (`test_common_*_checks.py`) share: a tiny config and a model of every (family, head)
class (those of `test_malformed_model_inputs.py`, with their valid batches), the batch without labels, and the
comparison of two `ModelOutput`s tensor by tensor."""

from __future__ import annotations

import pytest
import torch
from test_malformed_model_inputs import CAPTIONER, HEADS, SINGLE, TWO, valid_inputs

from hf_vlalign import SingleStreamConfig, TwoStreamConfig
from hf_vlalign.models.captioning import RegionCaptionerConfig

CONFIGS = {"ss": (SingleStreamConfig, SINGLE), "ts": (TwoStreamConfig, TWO), "cap": (RegionCaptionerConfig, CAPTIONER)}
NO_DROPOUT = {
    "ss": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "ts": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "cap": {"dropout": 0.0, "attention_dropout": 0.0},
}
ALL = list(HEADS)
CLASSES = pytest.mark.parametrize("key", ALL, ids=[f"{family}_{head}" for family, head in ALL])
DECODER_LENGTH = 4  # the captioner's labels in `valid_inputs`


def config(family: str, **overrides):
    config_class, fields = CONFIGS[family]
    return config_class(**{**fields, **overrides})


def build(key: tuple[str, str], **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return HEADS[key](config(key[0], **overrides)).eval()


def inference_inputs(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    """The valid batch of the class without its labels (the captioner keeps its decoder inputs)."""
    inputs = valid_inputs(*key)
    if key[0] == "cap":
        labels = inputs.pop("labels")
        inputs["decoder_input_ids"] = labels.clamp(min=0)
    for name in ("labels", "target_region_iou", "phrase_labels", "id_labels", "vgp_labels", "masked_regions",
                 "feature_labels", "object_labels", "attribute_labels", "sentence_image_labels", "matched_labels",
                 "answer_labels"):  # fmt: skip
        inputs.pop(name, None)
    return inputs


def tensors(outputs) -> dict[str, torch.Tensor]:
    """Every tensor of a `ModelOutput`, tuples of tensors flattened as `name.index`."""
    flat = {}
    for name, value in outputs.items():
        if isinstance(value, torch.Tensor):
            flat[name] = value
        elif isinstance(value, tuple):
            flat.update({f"{name}.{index}": item for index, item in enumerate(value) if isinstance(item, torch.Tensor)})
    return flat


def assert_outputs_equal(first, second, exact: bool = False, atol: float = 1e-5) -> None:
    first, second = tensors(first), tensors(second)
    assert first.keys() == second.keys()
    for name in first:
        if exact:
            assert torch.equal(first[name], second[name]), name
        else:
            torch.testing.assert_close(first[name], second[name], atol=atol, rtol=1e-5, msg=name)
