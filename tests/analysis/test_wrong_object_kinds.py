"""Python objects of the wrong kind (issue 32) at the doors: a checkpoint name where a model or tokenizer is, a dict
of columns or a `DatasetDict` where a dataset is, a path where a region-feature store is. Each public evaluation
function and collator refuses them with a `ValueError` naming the argument,
what it takes and the type that came. One representative wrong value per door."""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.data import (
    CaptioningCollator,
    QuestionAnsweringCollator,
    RegionTextCollator,
    VGPCollator,
    drop_overlong_rows,
    group_captions_by_image,
)
from hf_vlalign.evaluation import (
    cross_attention_rows,
    evaluate_cross_attention,
    evaluate_decoder_grounding,
    evaluate_grounding,
    image_use_gap,
    probe_attention_blocks,
    word_region_attention,
)

MODEL, ROWS, COLLATOR = torch.nn.Linear(1, 1), [{"sentence": "a dog"}], (lambda rows: {})
# door -> (its good arguments, the argument given a wrong value, that value, what the message says it takes)
DOORS = {
    evaluate_grounding: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, "model", "bert-base-uncased", r"a model \(torch\.nn\.Module"),
    probe_attention_blocks: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR, "text_mask_key": "attention_mask"},
                             "dataset", {"sentence": ["a dog"]}, r"a datasets\.Dataset or a list of rows"),
    evaluate_cross_attention: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, "collator", "collate", r"a collator"),
    evaluate_decoder_grounding: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, "model", None, r"a model"),
    image_use_gap: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, "dataset", "rows.json", r"a datasets\.Dataset"),
    word_region_attention: ({"model": MODEL, "tokenizer": None, "batch": {}, "layer": 0, "head": 0}, "tokenizer",
                            "bert-base-uncased", r"a transformers tokenizer"),
    cross_attention_rows: ({"model": MODEL, "tokenizer": None, "batch": {}, "layer": 0}, "model", "bert-base-uncased", r"a model"),
    drop_overlong_rows: ({"dataset": datasets.Dataset.from_list(ROWS), "tokenizer": None, "max_text_length": 8}, "tokenizer", {"vocab": {}}, r"a transformers tokenizer"),
    group_captions_by_image: ({"rows": ROWS}, "rows", iter(ROWS), r"a datasets\.Dataset or a list of rows"),
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


@pytest.mark.parametrize("door", DOORS, ids=[door.__name__ for door in DOORS])
def test_a_door_refuses_an_object_of_the_wrong_kind_by_argument(door, tokenizer):
    good, argument, value, what = DOORS[door]
    kwargs = {**{name: tokenizer if name == "tokenizer" else given for name, given in good.items()}, argument: value}
    with pytest.raises(ValueError, match=rf"^`{argument}` must be {what}.*, got "):
        door(**kwargs)


def test_a_dataset_dict_is_refused_naming_its_splits():
    dataset_dict = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})
    match = r"`dataset` must be a datasets\.Dataset or a list of rows, got a DatasetDict of the splits \['train'\] \(pick one"
    with pytest.raises(ValueError, match=match):
        evaluate_grounding(MODEL, dataset_dict, COLLATOR)


COLLATORS = (RegionTextCollator, CaptioningCollator, QuestionAnsweringCollator, VGPCollator)


@pytest.mark.parametrize("collator", COLLATORS)
def test_a_collator_refuses_a_tokenizer_name(collator):
    with pytest.raises(ValueError, match=r"^`tokenizer` must be a transformers tokenizer .*, got str 'bert-base-uncased' \(load it"):
        collator(tokenizer="bert-base-uncased", region_features=None)


def test_a_collator_refuses_a_store_path(tokenizer):
    match = r"^`region_features` must be a RegionFeatureStore, got str 'features/store' \(open one with RegionFeatureStore\.load"
    with pytest.raises(ValueError, match=match):
        RegionTextCollator(tokenizer=tokenizer, region_features="features/store")


def test_right_kinds_pass_the_checks():
    assert group_captions_by_image([{"image_id": "1", "sentence": "a dog"}]) == {"1": ["a dog"]}
