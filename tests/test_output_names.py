"""Output field names and the modules both families share, renamed or moved without a change of behaviour:

- every output names the attention-supervision loss `loss_attention` and the masked-region feature regression
  `loss_region_feat`, each in the place of its former name; the former names (`loss_att`, `loss_feat`,
  `pooled_output`) are no fields (no key, no tuple entry) and read the same tensor with a `FutureWarning`, as an
  attribute, an item, through `get` and `in`;
- the models return the new names and the library reads no former one (no `FutureWarning`);
- the trainers log under the keys they always had (`loss_att`, `loss_feat`), read from the new fields;
- the state-dict keys of every model class are those of `state_dict_keys.json` (listed before the shared heads moved
  to `models/task_heads.py` and the BERT blocks to `models/bert_modules.py`); the masked-word decoder is tied to the
  word embeddings and its bias starts at zero.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from hf_vlalign import SingleStreamConfig, TwoStreamConfig
from hf_vlalign.models import bert_modules, task_heads
from hf_vlalign.models.captioning.modeling_captioning import RegionCaptionerOutput
from hf_vlalign.models.single_stream import modeling_single_stream as single_stream
from hf_vlalign.models.two_stream import modeling_two_stream as two_stream
from hf_vlalign.trainers import (
    AlignmentPretrainingTrainer,
    CaptioningTrainer,
    SingleStreamPretrainingTrainer,
    TaskTrainer,
    VGPTrainer,
)

STATE_DICT_KEYS = Path(__file__).with_name("state_dict_keys.json")
MODELING_TWO_STREAM = Path(two_stream.__file__)

# each output's fields, in order: the former order with the renamed fields in their former places
FIELDS = {
    single_stream.SingleStreamModelOutput: [
        "last_hidden_state", "pooler_output", "loss_attention", "hidden_states", "attentions",
    ],
    single_stream.VisualParaphraseOutput: [
        "loss", "loss_id", "loss_vgp", "loss_attention", "id_logits", "vgp_logits", "hidden_states", "attentions",
    ],
    single_stream.SingleStreamClassificationOutput: [
        "loss", "loss_task", "loss_attention", "logits", "hidden_states", "attentions",
    ],
    single_stream.SingleStreamForPreTrainingOutput: [
        "loss", "loss_mlm", "loss_sentence_image", "loss_region_feat", "loss_region_class", "loss_attention",
        "prediction_logits", "seq_relationship_logits", "hidden_states", "attentions",
    ],
    two_stream.TwoStreamModelOutput: [
        "language_output", "vision_output", "pooler_output", "loss_attention", "language_hidden_states",
        "vision_hidden_states", "language_attentions", "vision_attentions", "cross_encoder_attentions",
        "cross_encoder_vision_attentions",
    ],
    two_stream.TwoStreamForPreTrainingOutput: [
        "loss", "loss_mlm", "loss_object_class", "loss_object_attr", "loss_region_feat", "loss_itm", "loss_vqa",
        "loss_align", "loss_attention", "prediction_logits", "cross_relationship_score", "question_answering_score",
        "alignment_scores", "language_attentions", "vision_attentions", "cross_encoder_attentions",
        "cross_encoder_vision_attentions",
    ],
    two_stream.TwoStreamClassificationOutput: [
        "loss", "loss_task", "loss_attention", "logits", "language_attentions", "vision_attentions",
        "cross_encoder_attentions", "cross_encoder_vision_attentions",
    ],
}  # fmt: skip
RENAMED = {
    single_stream.VisualParaphraseOutput: {"loss_att": "loss_attention"},
    single_stream.SingleStreamClassificationOutput: {"loss_att": "loss_attention"},
    single_stream.SingleStreamForPreTrainingOutput: {"loss_att": "loss_attention"},
    two_stream.TwoStreamModelOutput: {"pooled_output": "pooler_output"},
    two_stream.TwoStreamForPreTrainingOutput: {"loss_feat": "loss_region_feat", "loss_att": "loss_attention"},
    two_stream.TwoStreamClassificationOutput: {"loss_att": "loss_attention"},
}
RENAMINGS = [(cls, old, new) for cls, renamed in RENAMED.items() for old, new in renamed.items()]

# each trainer's log keys (unchanged, so results files are too) and the outputs of the models it trains
TRAINERS = {
    VGPTrainer: (("loss_id", "loss_vgp", "loss_att"), [single_stream.VisualParaphraseOutput]),
    TaskTrainer: (
        ("loss_task", "loss_att"),
        [single_stream.SingleStreamClassificationOutput, two_stream.TwoStreamClassificationOutput],
    ),
    SingleStreamPretrainingTrainer: (
        ("loss_mlm", "loss_sentence_image", "loss_region_feat", "loss_region_class", "loss_att"),
        [single_stream.SingleStreamForPreTrainingOutput],
    ),
    AlignmentPretrainingTrainer: (
        ("loss_mlm", "loss_object_class", "loss_object_attr", "loss_feat", "loss_itm", "loss_vqa", "loss_align",
         "loss_att"),
        [two_stream.TwoStreamForPreTrainingOutput],
    ),
    CaptioningTrainer: (("loss_caption", "loss_mask", "loss_scst"), [RegionCaptionerOutput]),
}  # fmt: skip


def field_names(cls) -> list[str]:
    return [field.name for field in dataclasses.fields(cls)]


def filled(cls, **overrides):
    """An output with a distinct tensor in every field (`overrides` replace some)."""
    values = {name: torch.tensor(float(index)) for index, name in enumerate(field_names(cls))}
    return cls(**{**values, **overrides})


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda cls: cls.__name__)
def test_every_field_keeps_its_place(cls):
    assert field_names(cls) == FIELDS[cls]
    outputs = filled(cls)
    assert list(outputs.keys()) == FIELDS[cls]
    values = outputs.to_tuple()
    assert len(values) == len(FIELDS[cls])
    assert all(values[index] is getattr(outputs, name) for index, name in enumerate(FIELDS[cls]))


@pytest.mark.parametrize("cls, old, new", RENAMINGS, ids=lambda value: getattr(value, "__name__", value))
def test_a_former_name_reads_the_new_field_with_a_future_warning(cls, old, new):
    assert old not in field_names(cls) and new in field_names(cls)
    outputs = filled(cls)
    assert old not in list(outputs.keys()) and all(value is not None for value in outputs.to_tuple())
    message = re.escape(f"`{cls.__name__}.{old}` is deprecated; use `{new}`.")
    reads = {
        "attribute": lambda: getattr(outputs, old),
        "item": lambda: outputs[old],
        "get": lambda: outputs.get(old),
    }
    for how, read in reads.items():
        with pytest.warns(FutureWarning, match=message):
            assert read() is getattr(outputs, new), how
    with pytest.warns(FutureWarning, match=message):
        assert old in outputs

    unset = filled(cls, **{new: None})  # a field left None is no key: neither is its former name
    with pytest.warns(FutureWarning, match=message):
        assert old not in unset
    with pytest.warns(FutureWarning, match=message):
        assert unset.get(old, "default") == "default"
    with pytest.warns(FutureWarning, match=message):
        assert getattr(unset, old) is None
    with pytest.warns(FutureWarning, match=message), pytest.raises(KeyError):
        unset[old]


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda cls: cls.__name__)
def test_the_new_names_and_positions_read_without_a_warning(cls):
    outputs = filled(cls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for index, name in enumerate(FIELDS[cls]):
            assert getattr(outputs, name) is outputs[name] is outputs.get(name) is outputs[index]
            assert name in outputs


@pytest.mark.filterwarnings("error::FutureWarning")
def test_the_pretraining_models_return_the_new_names():
    from test_single_stream import tiny_batch as single_stream_batch
    from test_single_stream import tiny_config as single_stream_config
    from test_two_stream import pretraining_labels, tiny_batch, tiny_config

    torch.manual_seed(0)
    model = two_stream.TwoStreamForPreTraining(tiny_config(attention_supervision="direct")).train()
    outputs = model(**tiny_batch(), **pretraining_labels())
    assert outputs.loss_region_feat is not None and outputs.loss_attention is not None
    assert "loss_feat" not in list(outputs.keys()) and "loss_att" not in list(outputs.keys())
    assert "region_feat" in model.loss_item_counts({**tiny_batch(), **pretraining_labels()})

    batch = single_stream_batch()
    model = single_stream.SingleStreamForPreTraining(single_stream_config(num_object_labels=4)).train()
    masked = torch.zeros(batch["visual_feats"].shape[:2], dtype=torch.long)
    masked[:, 0] = 1
    labels = torch.full(batch["input_ids"].shape, -100)
    labels[:, 1] = 7
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "visual_feats", "visual_boxes",
                                          "visual_attention_mask", "word_region_alignment")}  # fmt: skip
    outputs = model(**inputs, labels=labels, masked_regions=masked, feature_labels=batch["visual_feats"])
    assert outputs.loss_region_feat is not None and outputs.loss_attention is not None
    assert "loss_att" not in list(outputs.keys())


@pytest.mark.parametrize("trainer", list(TRAINERS), ids=lambda cls: cls.__name__)
def test_trainers_log_their_former_keys_from_the_new_fields(trainer):
    log_keys, output_classes = TRAINERS[trainer]
    assert trainer.loss_component_keys == log_keys
    fields = trainer.loss_component_fields()
    assert tuple(fields) == log_keys
    for cls in output_classes:
        for key, field in fields.items():
            assert field in field_names(cls) or key == "loss_scst", (cls.__name__, key, field)  # scst: the trainer's
            assert field not in getattr(cls, "_renamed_fields", {}), (cls.__name__, field)


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
