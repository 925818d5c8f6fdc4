"""The one inference loop (`hf_vlalign.evaluation.inference_batches`)."""

import random

import datasets
import pytest
import torch
from torch.utils.data import DataLoader

from hf_vlalign.data.collators import PROBE_KEYS
from hf_vlalign.evaluation import NON_MODEL_KEYS, inference_batches, split_batch


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, input_ids, visual_feats=None):
        return self.linear(visual_feats)


def collate(rows: list[dict]) -> dict:
    """A collator with probe targets and references."""
    batch = {
        "input_ids": torch.tensor([row["token"] for row in rows])[:, None],
        "visual_feats": torch.tensor([row["feature"] for row in rows]),
        "word_region_alignment": torch.zeros(len(rows), 1, 1),
        "references": [[f"caption {row['token']}"] for row in rows],
        "masked": torch.tensor([row["token"] % 2 == 0 for row in rows]),
    }
    batch.update({key: torch.full((len(rows), 1), row_index) for row_index, key in enumerate(PROBE_KEYS)})
    return batch


def random_collate(rows: list[dict]) -> dict:
    """A random collator: its mask is drawn from torch's global random state (as the pre-training collator's)."""
    return collate(rows) | {"masked": torch.rand(len(rows)) < 0.5}


@pytest.fixture
def dataset() -> datasets.Dataset:
    return datasets.Dataset.from_list([{"token": i, "feature": [float(i), -float(i)]} for i in range(11)])


@pytest.mark.parametrize("as_list", [False, True])
def test_batches_are_a_sequential_dataloaders_split_into_inputs_and_probe_targets(dataset, as_list):
    rows = dataset.to_list() if as_list else dataset
    expected = list(DataLoader(rows, batch_size=4, collate_fn=collate))
    model, state = TinyModel(), torch.random.get_rng_state()
    batches = list(inference_batches(model, rows, collate, 4, exclude=("word_region_alignment",)))
    assert torch.equal(torch.random.get_rng_state(), state)  # the loop draws nothing from the global state
    assert [batch.index for batch in batches] == [0, 1, 2]
    assert [len(batch.rows) for batch in batches] == [4, 4, 3]
    assert [row["token"] for batch in batches for row in batch.rows] == list(range(11))
    for batch, reference in zip(batches, expected):
        assert set(batch.inputs) == {"input_ids", "visual_feats", "masked"}  # no probe target, reference, excluded key
        assert set(batch.targets) == set(PROBE_KEYS)
        for key, value in reference.items():
            assert torch.equal(batch.batch[key], value) if torch.is_tensor(value) else batch.batch[key] == value
        assert all(torch.equal(batch.inputs[key], reference[key]) for key in batch.inputs)


def test_forward_arguments_only_and_the_non_model_keys(dataset):
    (batch, *_) = inference_batches(TinyModel(), dataset, collate, 8, forward_arguments_only=True)
    assert set(batch.inputs) == {"input_ids", "visual_feats"}
    assert set(NON_MODEL_KEYS) == {*PROBE_KEYS, "references"}
    inputs, targets = split_batch(collate(dataset.to_list()[:2]), torch.device("cpu"), exclude=("masked",))
    assert set(inputs) == {"input_ids", "visual_feats", "word_region_alignment"} and set(targets) == set(PROBE_KEYS)


def test_a_seed_gives_a_random_collator_the_same_batches_in_every_pass_and_keeps_the_callers_state(dataset):
    model = TinyModel()

    def masks(seed):
        return [batch.batch["masked"] for batch in inference_batches(model, dataset, random_collate, 4, seed=seed)]

    torch.manual_seed(1)
    random.seed(1)
    before = (torch.random.get_rng_state(), random.getstate())
    first, again, other = masks(7), masks(7), masks(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    assert torch.equal(torch.random.get_rng_state(), before[0]) and random.getstate() == before[1]
