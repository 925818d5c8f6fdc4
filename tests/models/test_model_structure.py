"""The model structure both families share: the state-dict keys of every model class are those of
`state_dict_keys.json` (converted checkpoints depend on them), the masked-word decoder is tied to the word embeddings
with a bias starting at zero, and both families build their blocks from the shared modules `models/bert_modules.py`
and `models/task_heads.py`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from hf_vlalign import SingleStreamConfig, TwoStreamConfig
from hf_vlalign.models import bert_modules, task_heads
from hf_vlalign.models.single_stream import modeling_single_stream as single_stream
from hf_vlalign.models.two_stream import modeling_two_stream as two_stream

STATE_DICT_KEYS = Path(__file__).with_name("state_dict_keys.json")
MODELING_TWO_STREAM = Path(two_stream.__file__)


def state_dict_listing(model: torch.nn.Module, prefix: str = "") -> list[str]:
    """`name shape` of every state-dict entry under `prefix` (the prefix cut), layer indices written N."""
    return sorted({
        f"{re.sub(r'[.][0-9]+[.]', '.N.', key[len(prefix):])} {list(value.shape)}"
        for key, value in model.state_dict().items() if key.startswith(prefix)
    })  # fmt: skip


def small_configs() -> dict[str, tuple]:
    """Every optional module present: masked-region classes, indirect supervision's head, feature statistics, separate
    cross-attention for the vision queries."""
    small = dict(vocab_size=30, hidden_size=8, num_attention_heads=2, intermediate_size=16, max_position_embeddings=16,
                 visual_feat_dim=6, num_object_labels=5, num_qa_labels=4, attention_supervision="indirect",
                 visual_feature_normalization="standardize")  # fmt: skip
    return {
        "single_stream": (single_stream, "SingleStream", SingleStreamConfig(**small, num_hidden_layers=2)),
        "two_stream": (two_stream, "TwoStream", TwoStreamConfig(
            **small, l_layers=1, r_layers=1, x_layers=1, num_attr_labels=3, share_cross_attention=False
        )),
    }  # fmt: skip


def test_every_model_class_has_the_committed_state_dict_keys():
    """The task models' entries are listed beside their base model's: the heads only."""
    committed = json.loads(STATE_DICT_KEYS.read_text())
    tasks = ["ForPhraseGrounding", "ForPreTraining", "ForQuestionAnswering", "ForReferringExpression", "ForVisualReasoning"]
    listed = {}
    for family, (module, prefix, config) in small_configs().items():
        listed[f"{prefix}Model"] = state_dict_listing(getattr(module, f"{prefix}Model")(config))
        for task in tasks + (["ForVisualParaphrase"] if family == "single_stream" else []):
            model = getattr(module, prefix + task)(config)
            assert state_dict_listing(model, f"{family}.") == listed[f"{prefix}Model"], task
            base = {f"{family}.{line}" for line in listed[f"{prefix}Model"]}
            listed[prefix + task] = sorted(set(state_dict_listing(model)) - base)
    assert listed.keys() == committed.keys()
    for name, lines in committed.items():
        assert listed[name] == lines, name


@pytest.mark.parametrize("family", ["single_stream", "two_stream"])
def test_the_masked_word_head_is_the_shared_one_tied_with_a_zero_bias(family):
    module, prefix, config = small_configs()[family]
    torch.manual_seed(0)
    model = getattr(module, f"{prefix}ForPreTraining")(config)
    head = model.cls.predictions if family == "single_stream" else model.lm_head
    assert type(head) is task_heads.LMPredictionHead
    assert type(head.transform) is task_heads.PredictionHeadTransform
    assert model.get_output_embeddings() is head.decoder
    assert head.decoder.weight is model.get_input_embeddings().weight
    assert torch.equal(head.bias, torch.zeros_like(head.bias))
    assert not torch.equal(head.transform.dense.weight, torch.zeros_like(head.transform.dense.weight))


def test_the_families_share_their_blocks_from_one_module():
    tree = ast.parse(MODELING_TWO_STREAM.read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any("single_stream" in name for name in imported), imported  # each family imports shared modules only
    single, two = small_configs()["single_stream"], small_configs()["two_stream"]
    single_model, two_model = single[0].SingleStreamModel(single[2]), two[0].TwoStreamModel(two[2])
    for model in (single_model, two_model):
        assert type(model.embeddings) is bert_modules.TextEmbeddings and type(model.pooler) is bert_modules.Pooler
    layer = two_model.encoder.language_layers[0]
    assert type(layer.intermediate) is bert_modules.Intermediate and type(layer.output) is bert_modules.LayerOutput
    assert type(single_model.encoder.layer[0].attention.output) is bert_modules.SelfOutput
    assert isinstance(single_model.encoder.layer[0], bert_modules.TransformerLayer)
    assert isinstance(layer, bert_modules.TransformerLayer)
    assert isinstance(two_model.encoder.cross_layers[0].cross_attention.self, bert_modules.MultiHeadAttention)
