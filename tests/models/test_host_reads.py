"""No host synchronisation in a step: a training step (forward with every label and attention supervision, backward)
and an evaluation forward of every (family, head) class read no tensor value on the host with the default settings,
value checks included. Counted with `hf_vlalign.utils.host_reads.count_host_reads`, whose own tests come first (it
must see each kind of read, or a zero would prove nothing). The steps run on the CPU, or on a CUDA device when one is
there: then every synchronisation CUDA's sync debug mode reports is counted too."""

from __future__ import annotations

import inspect
import linecache

import pytest
import torch
from common_model_checks import config
from test_common_compile_checks import word_region_alignment
from test_malformed_model_inputs import HEADS, valid_inputs

from hf_vlalign.supervision.direct import select_heads
from hf_vlalign.utils.host_reads import count_host_reads

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# ----------------------------------------------------------------------------------------------------------------
# The counter
# ----------------------------------------------------------------------------------------------------------------

VALUES = torch.tensor([1.0, -2.0, 3.0])
READS = {
    "item": lambda: VALUES.sum().item(),
    "bool": lambda: bool(VALUES.sum() > 0),
    "int": lambda: int(VALUES[0]),
    "float": lambda: float(VALUES.max()),
    "index": lambda: [0, 1, 2][VALUES.long()[0]],
    "format": lambda: f"{VALUES[0]:.2f}",
    "tolist": lambda: VALUES.tolist(),
    "numpy": lambda: VALUES.numpy(),
    "bool_mask_index": lambda: VALUES[VALUES > 0],
    "bool_mask_assignment": lambda: VALUES.clone().__setitem__(VALUES > 0, 0.0),
    "nonzero": lambda: (VALUES > 0).nonzero(),
    "where_alone": lambda: torch.where(VALUES > 0),
    "masked_select": lambda: VALUES.masked_select(VALUES > 0),
    "unique": lambda: VALUES.unique(),
    "equal": lambda: torch.equal(VALUES, VALUES),
    "repeat_interleave": lambda: VALUES.repeat_interleave(torch.tensor([1, 2, 1])),
}
NOT_READS = {
    "arithmetic": lambda: (VALUES * 2).sum(),
    "reductions": lambda: (VALUES > 0).any() & (VALUES < 5).all(),
    "masked_fill": lambda: VALUES.masked_fill(VALUES < 0, 0.0),
    "where_three": lambda: torch.where(VALUES > 0, VALUES, 0.0),
    "integer_index": lambda: VALUES[torch.tensor([0, 2])],
    "async_assert": lambda: torch._assert_async((VALUES < 5).all(), "below 5"),
    "repeat_interleave_sized": lambda: VALUES.repeat_interleave(torch.tensor([1, 2, 1]), output_size=4),
    "shape": lambda: VALUES.shape[0] + VALUES.dim(),
}


@pytest.mark.parametrize("name", READS)
def test_the_counter_sees_each_kind_of_host_read_once(name):
    with count_host_reads() as reads:
        READS[name]()
    assert reads.count == 1, reads.events
    assert reads.events[0][1].endswith("test_host_reads.py:" + str(reads.events[0][1].rsplit(":", 1)[1]))


@pytest.mark.parametrize("name", NOT_READS)
def test_the_counter_ignores_work_that_stays_on_the_device(name):
    with count_host_reads() as reads:
        NOT_READS[name]()
    assert reads.count == 0, reads.events


def test_the_counter_names_where_each_read_was_written():
    with count_host_reads() as reads:
        bool(VALUES.sum() > 0)
        VALUES.tolist()
    assert [operation for operation, _ in reads.events] == ["__bool__", "tolist"]
    lines = []
    for _, where in reads.events:
        path, line = where.rsplit(":", 1)
        assert path == __file__
        lines.append(linecache.getline(path, int(line)).strip())
    assert lines == ["bool(VALUES.sum() > 0)", "VALUES.tolist()"]


def test_a_read_inside_a_counted_read_is_one_read():
    """`float(tensor)` runs `aten._local_scalar_dense` inside: counted at the Python call only."""
    with count_host_reads() as reads:
        float(VALUES.sum())
    assert [operation for operation, _ in reads.events] == ["__float__"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's sync debug mode needs a CUDA device")
def test_on_cuda_the_counter_also_sees_synchronizing_copies_and_counts_a_read_once():
    values = VALUES.to("cuda")
    with count_host_reads() as reads:
        values.new_tensor([0.0, 0.0, 1.0, 1.0])  # a blocking copy of host data to the device
    assert [operation for operation, _ in reads.events] == ["cuda synchronization"], reads.events
    assert reads.events[0][1].startswith(__file__)
    with count_host_reads() as reads:
        values.sum().item()  # one read, whose synchronisation is part of it
        torch.cat([values.new_zeros(2), values.new_ones(2)]) * 2  # filled and computed on the device
    assert [operation for operation, _ in reads.events] == ["item"], reads.events
    scores = torch.randn(2, 4, 3, 3, device="cuda")
    with count_host_reads() as reads:
        scores[:, [0, 2]]  # indexing with a Python list: a blocking copy of the index
    assert [operation for operation, _ in reads.events] == ["cuda synchronization"], reads.events
    with count_host_reads() as reads:
        select_heads(scores, [0, 2]), select_heads(scores, [1, 2]), select_heads(scores, None)
    assert reads.count == 0, reads.events


# ----------------------------------------------------------------------------------------------------------------
# Every family and head, with and without attention supervision
# ----------------------------------------------------------------------------------------------------------------

# each family's supervision methods and options that change the forward's code path
SUPERVISION = {
    "ss": [{}, {"attention_supervision": "direct"}, {"attention_supervision": "semi_direct"}],
    "ts": [{}, {"attention_supervision": "direct", "task_alignment": True}, {"attention_supervision": "semi_direct"}],
    "cap": [{}] + [{"attention_alignment": fusion} for fusion in ("max", "moving_average", "exp_decay", "gate")],
}
CASES = [
    (key, supervision)
    for key in HEADS
    for supervision in SUPERVISION[key[0]]
]  # fmt: skip


def supervised_batch(key: tuple[str, str], model: torch.nn.Module, supervision: dict) -> dict:
    inputs = valid_inputs(*key)
    takes = inspect.signature(model.forward).parameters
    if supervision and key[0] != "cap" and "word_region_alignment" in takes:
        inputs["word_region_alignment"] = word_region_alignment()
    return on_device(inputs)


def on_device(inputs: dict) -> dict:
    return {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}


def loss_of(outputs) -> torch.Tensor | None:
    return outputs["loss"] if "loss" in outputs else outputs.get("loss_attention_supervision")


def case_id(case) -> str:
    (family, head), supervision = case
    return f"{family}_{head}-" + ("_".join(str(value) for value in supervision.values()) or "none")


@pytest.mark.parametrize("case", CASES, ids=[case_id(case) for case in CASES])
def test_a_training_step_and_an_evaluation_forward_read_nothing_on_the_host(case):
    """Default settings (`validate_inputs=True`), feature statistics set as the trainers set them."""
    key, supervision = case
    torch.manual_seed(0)
    model = HEADS[key](config(key[0], **supervision)).to(DEVICE)
    dim = model.config.visual_feat_dim
    model.set_visual_feature_statistics(torch.zeros(dim, device=DEVICE), torch.ones(dim, device=DEVICE), 10)
    inputs = supervised_batch(key, model, supervision)
    model.train()
    with count_host_reads() as training:
        loss = loss_of(model(**inputs))
        if loss is not None:  # a base model without supervision has no loss
            loss.backward()
    model.eval()
    with count_host_reads() as evaluation, torch.no_grad():
        model(**inputs)
    assert (loss is None) == (key[1] == "base" and not supervision)
    assert loss is None or torch.isfinite(loss)
    assert training.count == 0, training.events
    assert evaluation.count == 0, evaluation.events


def test_a2_mask_step_reads_nothing_on_the_host():
    """The captioner's second optimiser step of A2 (`alignment_mode="perturb"`, the mask objective)."""
    torch.manual_seed(0)
    model = HEADS["cap", "caption"](config("cap", attention_alignment="gate")).to(DEVICE).train()
    inputs = on_device(valid_inputs("cap", "caption"))
    with count_host_reads() as reads:
        outputs = model(**inputs, alignment_mode="perturb")
        outputs.loss_mask.backward()
    assert reads.count == 0, reads.events


def test_bad_values_still_fail_with_the_inputs_named_and_what_came():
    """The same errors as reading the values on the host gave: on the CPU a failed check explains itself."""
    model = HEADS["ss", "qa"](config("ss")).eval()
    inputs = valid_inputs("ss", "qa")
    inputs["input_ids"] = inputs["input_ids"].clone()
    inputs["input_ids"][0, 0] = -1
    with pytest.raises(ValueError, match=r"`input_ids` must be in \[0, 59\] \(vocab_size\), got \[-1, "):
        model(**inputs)
    inputs = valid_inputs("ss", "qa")
    inputs["labels"] = inputs["labels"] * 2
    with pytest.raises(ValueError, match=r"soft `labels` must be scores in \[0, 1\], got values in \[0, 2\]"):
        model(**inputs)
