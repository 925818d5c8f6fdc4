"""Python objects of the wrong kind (issue 32): a list or NumPy array where a tensor is expected, a stacked tensor
where a list of layers is, a checkpoint name where a model or tokenizer is, a dict of columns or a `DatasetDict` where
a dataset is, a path where a region-feature store is. Every public function listed here refuses them by argument with
`ArgumentKindError` (a `ValueError`, and a `TypeError`), naming the argument, what it takes and the type that came."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from hf_vlalign import default_text_model_path
from hf_vlalign.alignment import (
    alignment_target,
    box_area,
    box_iou,
    combine_criteria,
    gold_region_iou,
    normalise_over_objects,
    positional_criterion,
    semantic_criterion,
)
from hf_vlalign.analysis import (
    attention_vs_distance,
    layer_rollouts,
    region_clusters,
    text_to_region_attention,
    within_cluster_attention,
)
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
    inference_batches,
    probe_attention_blocks,
    word_region_attention,
)
from hf_vlalign.supervision import (
    alignment_kl_loss,
    attention_rollout,
    direct_supervision_loss,
    fuse_attention,
    grounded_word_count,
    indirect_supervision_loss,
    mask_objective,
    masked_log_softmax,
    max_pool_phrases,
    perturbed_attention,
    semi_direct_supervision_loss,
    soft_cross_entropy,
    supervised_row_counts,
    top_k_log_softmax,
    top_k_mask,
)
from hf_vlalign.utils.validation import ArgumentKindError

TENSOR, OPTIONAL, LAYERS, MODEL, ROWS, TOKENIZER, COLLATOR = "tensor", "optional", "layers", "model", "rows", "tokenizer", "collator"

# function -> (its arguments checked for their kind, in order, with the kind each takes; other arguments it needs)
FUNCTIONS = {
    box_area: ({"boxes": TENSOR}, {}),
    box_iou: ({"boxes_a": TENSOR, "boxes_b": TENSOR}, {}),
    gold_region_iou: ({"gold_boxes": TENSOR, "region_boxes": TENSOR}, {}),
    alignment_target: ({"gold_boxes": TENSOR, "region_boxes": TENSOR, "region_mask": OPTIONAL}, {}),
    combine_criteria: ({"positional": TENSOR, "semantic": TENSOR, "region_mask": OPTIONAL}, {}),
    normalise_over_objects: ({"scores": TENSOR, "region_mask": OPTIONAL}, {}),
    positional_criterion: ({"gold_boxes": TENSOR, "region_boxes": TENSOR}, {}),
    semantic_criterion: ({"word_vector": TENSOR, "class_vectors": TENSOR, "attribute_vectors": OPTIONAL}, {}),
    masked_log_softmax: ({"logits": TENSOR, "key_mask": TENSOR}, {}),
    soft_cross_entropy: ({"log_probs": TENSOR, "target": TENSOR, "num_rows": OPTIONAL}, {}),
    direct_supervision_loss: ({"text_to_region_logits": LAYERS, "region_to_text_logits": LAYERS,
                               "word_region_alignment": TENSOR, "text_mask": TENSOR, "region_mask": TENSOR}, {}),
    supervised_row_counts: ({"word_region_alignment": TENSOR}, {}),
    semi_direct_supervision_loss: ({"rollouts": LAYERS, "word_region_alignment": TENSOR, "text_mask": TENSOR,
                                    "region_mask": TENSOR, "num_text_rows": OPTIONAL, "num_region_rows": OPTIONAL},
                                   {"text_positions": slice(0, 1), "region_positions": slice(1, 2)}),
    attention_rollout: ({"attention_probs": LAYERS}, {}),
    indirect_supervision_loss: ({"pair_logits": TENSOR, "phrase_region_targets": TENSOR, "phrase_valid": TENSOR,
                                 "region_mask": TENSOR, "num_phrases": OPTIONAL}, {}),
    max_pool_phrases: ({"hidden_states": TENSOR, "phrase_masks": TENSOR}, {}),
    alignment_kl_loss: ({"scores": TENSOR, "target": TENSOR, "region_mask": OPTIONAL, "text_mask": OPTIONAL,
                         "num_words": OPTIONAL}, {}),
    top_k_mask: ({"scores": TENSOR, "region_mask": OPTIONAL}, {"k": 1}),
    top_k_log_softmax: ({"scores": TENSOR, "region_mask": OPTIONAL, "always_keep": OPTIONAL}, {"k": 1}),
    grounded_word_count: ({"target": TENSOR, "text_mask": OPTIONAL}, {}),
    perturbed_attention: ({"attention": TENSOR, "mask": TENSOR}, {}),
    fuse_attention: ({"attention": TENSOR, "aligned": TENSOR, "gate": OPTIONAL, "region_mask": OPTIONAL}, {"fusion": "max"}),
    mask_objective: ({"caption_loss": TENSOR, "masks": LAYERS, "valid": OPTIONAL, "num_steps": OPTIONAL}, {"weight": 0.1}),
    text_to_region_attention: ({"attentions": LAYERS, "visual_attention_mask": OPTIONAL}, {"text_length": 1, "num_regions": 1}),
    layer_rollouts: ({"attentions": LAYERS}, {}),
    region_clusters: ({"visual_boxes": TENSOR, "visual_attention_mask": TENSOR, "object_ids": OPTIONAL}, {}),
    attention_vs_distance: ({"visual_boxes": TENSOR}, {"blocks": None}),
    within_cluster_attention: ({"region_clusters": TENSOR}, {"blocks": None}),
    evaluate_grounding: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, {}),
    probe_attention_blocks: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, {"text_mask_key": "attention_mask"}),
    evaluate_cross_attention: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, {}),
    evaluate_decoder_grounding: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, {}),
    image_use_gap: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, {}),
    inference_batches: ({"model": MODEL, "dataset": ROWS, "collator": COLLATOR}, {"batch_size": 1}),
    word_region_attention: ({"model": MODEL, "tokenizer": TOKENIZER}, {"batch": {}, "layer": 0, "head": 0}),
    cross_attention_rows: ({"model": MODEL, "tokenizer": TOKENIZER}, {"batch": {}, "layer": 0}),
    drop_overlong_rows: ({"dataset": ROWS, "tokenizer": TOKENIZER}, {"max_text_length": 8}),
    group_captions_by_image: ({"rows": ROWS}, {}),
}  # fmt: skip

# kind -> (what the message says it takes, [(wrong value, what the message says came)])
WRONG = {
    TENSOR: (r"a torch\.Tensor", [([[0.0, 1.0]], r"list \(convert it with torch\.tensor\)"),
                                  (np.zeros((2, 2)), r"numpy\.ndarray of shape \(2, 2\) \(convert it with torch\.from_numpy\)"),
                                  ((0.0, 1.0), r"tuple \(convert it with torch\.tensor\)"), ("boxes", r"str 'boxes'"),
                                  (None, r"None")]),
    OPTIONAL: (r"a torch\.Tensor or None", [([1, 0], r"list \(convert it with torch\.tensor\)"),
                                            (np.ones(2), r"numpy\.ndarray of shape \(2,\)"), (1.0, r"float 1\.0")]),
    LAYERS: (r"a list or tuple of torch\.Tensors \(one torch\.Tensor per layer\)",
             [(torch.zeros(2, 1, 2, 2), r"torch\.Tensor of shape \(2, 1, 2, 2\) \(split a stacked tensor with list\(tensor\.unbind\(0\)\)\)"),
              ({"layer_0": torch.zeros(1)}, r"dict"), (np.zeros((2, 2)), r"numpy\.ndarray of shape \(2, 2\)"), ("attentions", r"str")]),
    MODEL: (r"a model \(torch\.nn\.Module, e\.g\. SingleStreamModel\)",
            [("bert-base-uncased", r"str 'bert-base-uncased' \(load it first, e\.g\. with <ModelClass>\.from_pretrained"),
             ({"state_dict": {}}, r"dict"), (None, r"None")]),
    ROWS: (r"a datasets\.Dataset or a list of rows",
           [({"sentence": ["a dog"]}, r"dict \(a dict of columns becomes a Dataset with datasets\.Dataset\.from_dict\)"),
            ("rows.json", r"str 'rows\.json'"), (iter([{"sentence": "a dog"}]), r"list_iterator"), (None, r"None")]),
    TOKENIZER: (r"a transformers tokenizer \(PreTrainedTokenizerBase\)",
                [("bert-base-uncased", r"str 'bert-base-uncased' \(load it with AutoTokenizer\.from_pretrained"),
                 ({"vocab": {}}, r"dict"), (None, r"None")]),
    COLLATOR: (r"a collator \(called with a list of rows, returning a batch dict\)", [("collate", r"str 'collate'"), (None, r"None")]),
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


def good_value(kind: str, tokenizer):
    return {
        TENSOR: torch.zeros(2, 2), OPTIONAL: None, LAYERS: [torch.zeros(1, 1, 2, 2)], MODEL: torch.nn.Linear(1, 1),
        ROWS: [{"sentence": "a dog"}], TOKENIZER: tokenizer, COLLATOR: lambda rows: {},
    }[kind]  # fmt: skip


def kind_cases() -> list:
    cases = []
    for function, (checked, _) in FUNCTIONS.items():
        for argument, kind in checked.items():
            for index, (_, came) in enumerate(WRONG[kind][1]):
                cases.append((function, argument, kind, index))
    return cases


KIND_CASES = kind_cases()
DATASET_DICT = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"sentence": "a dog"}])})


@pytest.mark.parametrize(
    "function, argument, kind, index", KIND_CASES, ids=[f"{c[0].__name__}-{c[1]}-{c[3]}" for c in KIND_CASES]
)
def test_wrong_kind_is_named_by_argument(function, argument, kind, index, tokenizer):
    checked, others = FUNCTIONS[function]
    value, came = WRONG[kind][1][index]
    kwargs = {**others, **{name: good_value(k, tokenizer) for name, k in checked.items()}, argument: value}
    what = WRONG[kind][0]
    with pytest.raises(ArgumentKindError, match=rf"^`{argument}(\[0\])?` must be {what}.*, got {came}") as caught:
        function(**kwargs)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)


def test_a_layer_of_the_wrong_kind_is_named_by_its_index():
    with pytest.raises(ArgumentKindError, match=r"^`attention_probs\[1\]` must be a torch\.Tensor, got numpy\.ndarray"):
        attention_rollout([torch.zeros(1, 1, 2, 2), np.zeros((1, 1, 2, 2))])


def test_a_dataset_dict_is_refused_naming_its_splits():
    match = r"`dataset` must be a datasets\.Dataset or a list of rows, got a DatasetDict of the splits \['train'\] \(pick one"
    with pytest.raises(ArgumentKindError, match=match):
        evaluate_grounding(torch.nn.Linear(1, 1), DATASET_DICT, lambda rows: {})


COLLATORS = (RegionTextCollator, CaptioningCollator, QuestionAnsweringCollator, VGPCollator)


@pytest.mark.parametrize("collator", COLLATORS)
@pytest.mark.parametrize(
    "value, came",
    [("bert-base-uncased", r"str 'bert-base-uncased' \(load it with AutoTokenizer"), (None, "None"), ({"vocab": {}}, "dict")],
)
def test_collator_refuses_a_tokenizer_of_the_wrong_kind(collator, value, came):
    with pytest.raises(ArgumentKindError, match=rf"^`tokenizer` must be a transformers tokenizer .*, got {came}"):
        collator(tokenizer=value, region_features=None)


@pytest.mark.parametrize("collator", COLLATORS)
@pytest.mark.parametrize(
    "value, came", [("features/store", r"str 'features/store'"), (None, "None"), ({"img": np.zeros((1, 4))}, "dict")]
)
def test_collator_refuses_a_store_of_the_wrong_kind(collator, value, came, tokenizer):
    match = rf"^`region_features` must be a RegionFeatureStore, got {came} \(open one with RegionFeatureStore\.load"
    with pytest.raises(ArgumentKindError, match=match):
        collator(tokenizer=tokenizer, region_features=value)


def test_right_kinds_pass_the_checks():
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]])
    assert box_iou(boxes, boxes).shape == (2, 2)
    assert torch.allclose(masked_log_softmax(torch.zeros(1, 2), torch.ones(1, 2)).exp().sum(-1), torch.ones(1))
    assert group_captions_by_image([{"image_id": "1", "sentence": "a dog"}]) == {"1": ["a dog"]}
