"""The project's own version of transformers' common model tests (`ModelTesterMixin` of transformers'
`tests/test_modeling_common.py`, with what the VisualBert, Lxmert and Bart testers add), over every (family, head)
class of the library: the single-stream family (VisualBERT's peer), the two-stream family (LXMERT's) and the captioner
(BART's).

Checked per class: hidden states and attention maps (number and shapes, asked for by keyword or by the config),
`return_dict=False` tuples equal to the dict outputs, a save / load round trip, loading with a missing weight (warned
and initialised) and with no shared weight (refused, see `models/saving.py`), `resize_token_embeddings` up and down
(tied weights stay tied, the masked-word bias follows), `_init_weights` of every parameter and buffer of a model built
on the meta device, determinism in eval mode, batching equivalence, gradients reaching every trainable parameter (with
the documented exceptions), gradient checkpointing, `torch.compile` and `torch.export` of each family's inference
forward, `generate()`'s optional outputs and model keyword arguments, and the empty batch (refused by name everywhere,
where transformers' peers fail with a reshape error).
"""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_malformed_model_inputs import B, CAPTIONER, HEADS, R, SINGLE, T, TWO, V, region_inputs, valid_inputs
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

from hf_vlalign import SingleStreamConfig, TwoStreamConfig
from hf_vlalign.models.captioning import RegionCaptionerConfig
from hf_vlalign.models.saving import CheckpointMismatchError
from hf_vlalign.models.task_heads import LMPredictionHead

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


# ----------------------------------------------------------------------------------------------------------------
# Layer outputs: what each class returns with output_hidden_states / output_attentions, count and shape
# ----------------------------------------------------------------------------------------------------------------


def expected_hidden_states(key: tuple[str, str]) -> dict[str, list[tuple[int, ...]]]:
    """Per output field, the shape of every hidden state (the embeddings first where the peer returns them)."""
    family, head = key
    batch = 2 * B if head == "nlvr2" else B  # NLVR2 encodes the sentence with each image of the pair
    if family == "ss":  # VisualBERT: embeddings + every layer over [text] [regions] [END]
        return {"hidden_states": [(batch, T + R + 1, SINGLE["hidden_size"])] * (SINGLE["num_hidden_layers"] + 1)}
    if family == "ts":  # LXMERT: every single-modality layer, then every cross layer, per stream
        hidden = TWO["hidden_size"]
        return {
            "language_hidden_states": [(batch, T, hidden)] * (TWO["l_layers"] + TWO["x_layers"]),
            "vision_hidden_states": [(batch, R, hidden)] * (TWO["r_layers"] + TWO["x_layers"]),
        }
    d_model = CAPTIONER["d_model"]  # BART: embeddings + every layer, encoder and decoder
    return {
        "encoder_hidden_states": [(B, R, d_model)] * (CAPTIONER["encoder_layers"] + 1),
        "decoder_hidden_states": [(B, DECODER_LENGTH, d_model)] * (CAPTIONER["decoder_layers"] + 1),
    }


def expected_attentions(key: tuple[str, str]) -> dict[str, list[tuple[int, ...]]]:
    family, head = key
    batch = 2 * B if head == "nlvr2" else B
    if family == "ss":
        heads, length = SINGLE["num_attention_heads"], T + R + 1
        return {"attentions": [(batch, heads, length, length)] * SINGLE["num_hidden_layers"]}
    if family == "ts":
        heads = TWO["num_attention_heads"]
        return {
            "language_attentions": [(batch, heads, T, T)] * TWO["l_layers"],
            "vision_attentions": [(batch, heads, R, R)] * TWO["r_layers"],
            "cross_encoder_attentions": [(batch, heads, T, R)] * TWO["x_layers"],
            "cross_encoder_vision_attentions": [(batch, heads, R, T)] * TWO["x_layers"],
        }
    encoder_heads, decoder_heads = CAPTIONER["encoder_attention_heads"], CAPTIONER["decoder_attention_heads"]
    return {
        "encoder_attentions": [(B, encoder_heads, R, R)] * CAPTIONER["encoder_layers"],
        "decoder_attentions": [(B, decoder_heads, DECODER_LENGTH, DECODER_LENGTH)] * CAPTIONER["decoder_layers"],
        "cross_attentions": [(B, decoder_heads, DECODER_LENGTH, R)] * CAPTIONER["decoder_layers"],
    }


def layer_output_shapes(outputs, fields) -> dict[str, list[tuple[int, ...]]]:
    return {name: [tuple(state.shape) for state in (getattr(outputs, name) or ())] for name in fields}


@CLASSES
@pytest.mark.parametrize("asked_by", ["kwargs", "config"])
def test_hidden_states_output(key, asked_by):
    """transformers' `test_hidden_states_output`: every stream's states, counted and shaped as the peer's."""
    expected = expected_hidden_states(key)
    model = build(key, output_hidden_states=True) if asked_by == "config" else build(key)
    with torch.no_grad():
        outputs = model(**valid_inputs(*key), **({"output_hidden_states": True} if asked_by == "kwargs" else {}))
        plain = build(key)(**valid_inputs(*key))
    assert layer_output_shapes(outputs, expected) == expected
    assert all(getattr(plain, name, None) is None for name in expected)  # only when asked for
    if key[0] == "ts":  # the last states are the outputs of the last cross layer
        base = outputs if key[1] == "base" else None
        if base is not None:
            assert torch.equal(base.language_hidden_states[-1], base.language_output)
            assert torch.equal(base.vision_hidden_states[-1], base.vision_output)


@CLASSES
@pytest.mark.parametrize("asked_by", ["kwargs", "config"])
def test_attention_outputs(key, asked_by):
    """transformers' `test_attention_outputs`: every attention map, counted and shaped, each row a distribution."""
    expected = expected_attentions(key)
    model = build(key, output_attentions=True) if asked_by == "config" else build(key)
    with torch.no_grad():
        outputs = model(**valid_inputs(*key), **({"output_attentions": True} if asked_by == "kwargs" else {}))
    assert layer_output_shapes(outputs, expected) == expected
    for name in expected:
        for probabilities in getattr(outputs, name):
            torch.testing.assert_close(probabilities.sum(-1), torch.ones(probabilities.shape[:-1]), msg=name)


@CLASSES
def test_return_dict_false_gives_the_tuple_of_the_dict_outputs(key):
    model = build(key)
    with torch.no_grad():
        as_dict = model(**valid_inputs(*key), output_hidden_states=True, output_attentions=True)
        as_tuple = model(**valid_inputs(*key), output_hidden_states=True, output_attentions=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict.to_tuple())
    for expected, got in zip(as_dict.to_tuple(), as_tuple):
        if isinstance(expected, torch.Tensor):
            assert torch.equal(expected, got)
        elif isinstance(expected, tuple):
            assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


# ----------------------------------------------------------------------------------------------------------------
# Saving and loading
# ----------------------------------------------------------------------------------------------------------------


@CLASSES
def test_save_load_round_trip_gives_the_same_outputs(key, tmp_path):
    model = build(key)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert_outputs_equal(model(**valid_inputs(*key)), loaded(**valid_inputs(*key)), exact=True)


def weight_to_drop(model: torch.nn.Module) -> str:
    """A weight every class has that no supervised head owns: the last LayerNorm's weight of the base model."""
    names = [name for name, _ in model.named_parameters() if re.search(r"(LayerNorm|layer_norm)\.weight$", name)]
    return names[-1]


@CLASSES
def test_a_checkpoint_missing_a_weight_loads_with_it_initialised_and_reported(key, tmp_path):
    """As in transformers: the missing weight is initialised by `_init_weights` and named in the load report."""
    model = build(key)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    missing = weight_to_drop(model)
    weights.pop(missing)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with CaptureLogger(transformers_logging.get_logger("transformers.modeling_utils")) as captured:
        loaded = type(model).from_pretrained(tmp_path)
    assert re.search(rf"{re.escape(missing)}\s*\|\s*MISSING", captured.out), captured.out
    assert torch.equal(loaded.get_parameter(missing), torch.ones_like(loaded.get_parameter(missing)))
    with torch.no_grad():
        assert all(torch.isfinite(value).all() for value in tensors(loaded.eval()(**valid_inputs(*key))).values())


@CLASSES
def test_a_checkpoint_sharing_no_weight_with_the_model_is_refused(key, tmp_path):
    """transformers warns and returns a model whose every weight is new; the library refuses it (`models/saving.py`):
    a model loaded without error from the folder the user named must hold that folder's weights."""
    model = build(key)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({f"other_model.{name}": value for name, value in weights.items()}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointMismatchError, match=rf"into {type(model).__name__}: none of its \d+ weight\(s\)"):
        type(model).from_pretrained(tmp_path)


# ----------------------------------------------------------------------------------------------------------------
# Embeddings and initialisation
# ----------------------------------------------------------------------------------------------------------------


@CLASSES
@pytest.mark.parametrize("new_size", [V + 7, V - 10], ids=["up", "down"])
def test_resize_token_embeddings_then_forward(key, new_size):
    """transformers' `test_resize_tokens_embeddings`: the vocabulary size, the tied output layer and the masked-word
    bias follow; kept rows are unchanged; a forward with the new ids runs."""
    model = build(key)
    old_rows = model.get_input_embeddings().weight[: min(V, new_size)].clone()
    model.resize_token_embeddings(new_size)
    embeddings = model.get_input_embeddings().weight
    assert embeddings.shape[0] == new_size and model.config.vocab_size == new_size
    assert torch.equal(embeddings[: min(V, new_size)], old_rows)
    output_embeddings = model.get_output_embeddings()
    if output_embeddings is not None:
        assert output_embeddings.weight is embeddings  # still tied
    for head in (module for module in model.modules() if isinstance(module, LMPredictionHead)):
        assert head.bias.shape == (new_size,)
    inputs = valid_inputs(*key)
    text = "labels" if key[0] == "cap" else "input_ids"
    inputs[text] = inputs[text].clamp(max=new_size - 1)
    inputs[text][0, 1] = new_size - 1
    if key == ("ts", "pretrain") or key == ("ss", "pretrain"):
        inputs["labels"] = inputs["labels"].clamp(max=new_size - 1)
    outputs = model(**inputs)
    for name in ("prediction_logits", "logits") if key[1] in ("pretrain", "caption") else ():
        if getattr(outputs, name, None) is not None:
            assert outputs[name].shape[-1] == new_size
    assert all(torch.isfinite(value).all() for value in tensors(outputs).values())


@CLASSES
def test_init_weights_sets_every_parameter_and_buffer_of_a_meta_device_model(key):
    """transformers' `test_init_weights_can_init_buffers` / `test_all_tensors_are_parameter_or_buffer`: a model built on
    the meta device, moved with `to_empty` and filled with NaN (-1 for integer buffers), then `init_weights()`, holds
    no NaN, has the buffers of a model built normally, and runs."""
    reference = build(key)
    with torch.device("meta"):
        model = HEADS[key](config(key[0]))
    model.to_empty(device="cpu")
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.fill_(float("nan") if tensor.is_floating_point() else -1)
    model.init_weights()
    assert not [name for name, value in model.named_parameters() if torch.isnan(value).any()]
    expected_buffers = dict(reference.named_buffers())
    got_buffers = dict(model.named_buffers())
    assert got_buffers.keys() == expected_buffers.keys()
    assert not [name for name in expected_buffers if not torch.equal(got_buffers[name], expected_buffers[name])]
    with torch.no_grad():
        assert all(torch.isfinite(value).all() for value in tensors(model.eval()(**valid_inputs(*key))).values())


# ----------------------------------------------------------------------------------------------------------------
# Forward behaviour
# ----------------------------------------------------------------------------------------------------------------


@CLASSES
def test_eval_mode_is_deterministic(key):
    model = build(key)
    with torch.no_grad():
        assert_outputs_equal(model(**valid_inputs(*key)), model(**valid_inputs(*key)), exact=True)


def example(inputs: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    return {name: value[index : index + 1] for name, value in inputs.items()}


@CLASSES
def test_batching_equivalence(key):
    """transformers' `test_batching_equivalence`: row i of the batched outputs (hidden states and attention maps
    included) equals the outputs of example i alone; the losses, which average over the batch, are left out."""
    model = build(key)
    inputs = valid_inputs(*key)
    with torch.no_grad():
        batched = tensors(model(**inputs, output_hidden_states=True, output_attentions=True))
        for index in range(B):
            single = tensors(model(**example(inputs, index), output_hidden_states=True, output_attentions=True))
            compared = [name for name, value in batched.items() if value.dim() > 0 and value.is_floating_point()]
            assert compared and set(compared) <= set(single)
            for name in compared:
                value = batched[name]
                rows = value.shape[0] // B  # NLVR2's encoder outputs hold 2 rows per example
                torch.testing.assert_close(value[index * rows : (index + 1) * rows], single[name], atol=1e-5, rtol=1e-5, msg=name)


def training_inputs(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    """The valid batch, with alignment targets for the two-stream pre-training (its alignment decoder trains on them)."""
    inputs = valid_inputs(*key)
    if key == ("ts", "pretrain"):
        alignment = torch.zeros(B, T, R)
        alignment[:, 1, 0] = 1.0
        inputs["word_region_alignment"] = alignment
    return inputs


def training_loss(model, key) -> torch.Tensor:
    outputs = model(**training_inputs(key))
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    return sum(value.sum() for value in tensors(outputs).values() if value.is_floating_point())  # base models


# heads that exist whatever the config but train only when switched on
TRAINING_OVERRIDES = {("ts", "pretrain"): {"task_alignment": True}}
LAST_CROSS = TWO["x_layers"] - 1
# parameters no loss of the head reaches, and why; transformers' `test_training` checks the same on its peers
NOT_TRAINED_BY_THE_HEAD = {
    ("ss", "refcoco"): r"^single_stream\.pooler\.",  # scores every region's state, not [CLS]
    ("ss", "grounding"): r"^single_stream\.pooler\.",  # scores phrase and region states, not [CLS]
    # the answer / pair heads read [CLS] only: the vision side of the last cross layer feeds nothing (as in LXMERT)
    ("ts", "qa"): rf"^two_stream\.encoder\.cross_layers\.{LAST_CROSS}\.vision_(self_attention|intermediate|output)\.",
    ("ts", "nlvr2"): rf"^two_stream\.encoder\.cross_layers\.{LAST_CROSS}\.vision_(self_attention|intermediate|output)\.",
    # region scoring reads the vision stream only: the language side of the last cross layer and the pooler feed nothing
    ("ts", "refcoco"): rf"^two_stream\.(encoder\.cross_layers\.{LAST_CROSS}\.language_(self_attention|intermediate|output)|pooler)\.",
    ("ts", "grounding"): r"^two_stream\.pooler\.",
}


@CLASSES
def test_training_step_reaches_every_trainable_parameter(key):
    model = build(key, **TRAINING_OVERRIDES.get(key, {})).train()
    training_loss(model, key).backward()
    untrained = [name for name, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    pattern = NOT_TRAINED_BY_THE_HEAD.get(key)
    assert [name for name in untrained if not (pattern and re.search(pattern, name))] == []
    if pattern:  # the exceptions are real: each matches an untrained parameter
        assert any(re.search(pattern, name) for name in untrained)


@CLASSES
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(key):
    """transformers' `test_training_gradient_checkpointing`: the layers run again in the backward pass (counted by a
    forward hook on a module inside the first layer), with the loss and gradients of a plain step (dropout off so both
    steps compute the same)."""
    results = []
    for checkpointing in (False, True):
        model = build(key, **NO_DROPOUT[key[0]], **TRAINING_OVERRIDES.get(key, {})).train()
        assert model.supports_gradient_checkpointing
        if checkpointing:
            model.activation_checkpointing_enable()
        calls = []
        layer = next(module for name, module in model.named_modules() if re.search(r"(layer|layers|cross_layers)\.0$", name))
        next(layer.children()).register_forward_hook(lambda *_: calls.append(1))
        loss = training_loss(model, key)
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}, len(calls)))
    (plain_loss, plain_grads, plain_calls), (loss, grads, calls) = results
    assert calls == 2 * plain_calls  # recomputed in the backward pass
    torch.testing.assert_close(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], atol=1e-5, rtol=1e-4, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# torch.compile and torch.export
# ----------------------------------------------------------------------------------------------------------------

# each family's base model and one task head (the captioner: its generation head); the other heads add a small layer
COMPILED = [("ss", "base"), ("ss", "qa"), ("ts", "base"), ("ts", "qa"), ("cap", "caption")]
COMPILED_CLASSES = pytest.mark.parametrize("key", COMPILED, ids=[f"{family}_{head}" for family, head in COMPILED])


@COMPILED_CLASSES
def test_torch_compile_fullgraph_equals_eager_without_value_checks(key):
    """With `validate_inputs=False` the inference forward reads no tensor value on the host, so dynamo captures it in
    one graph (`fullgraph=True`); run here through AOTAutograd (`aot_eager`), which needs no compiler process (inductor,
    the default backend, is `test_torch_compile_with_inductor_equals_eager`)."""
    torch._dynamo.reset()
    model = build(key, validate_inputs=False)
    inputs = inference_inputs(key)
    with torch.no_grad():
        assert_outputs_equal(torch.compile(model, fullgraph=True, backend="aot_eager")(**inputs), model(**inputs))


@COMPILED_CLASSES
def test_torch_export_of_the_inference_forward_equals_eager(key):
    """`torch.export` (non-strict) of the inference forward needs `validate_inputs=False`: the value checks read the
    inputs on the host, which export cannot trace (a data-dependent guard, next test)."""
    model = build(key, validate_inputs=False)
    inputs = inference_inputs(key)
    exported = torch.export.export(model, args=(), kwargs=inputs, strict=False)
    with torch.no_grad():
        expected = model(**inputs)
    got = exported.module()(**inputs)
    assert_outputs_equal(type(expected)(**got) if isinstance(got, dict) else got, expected)


@pytest.mark.parametrize("family", ["ss", "ts", "cap"])
def test_torch_export_with_value_checks_stops_at_a_data_dependent_check(family):
    key = (family, "caption" if family == "cap" else "base")
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(build(key), args=(), kwargs=inference_inputs(key), strict=False)


# inductor runs its C++ compiler in other processes (so `slow`) and compiles for about a minute per family on 2 cores
@pytest.mark.slow
@pytest.mark.parametrize("validate_inputs", [False, True], ids=["fullgraph_unvalidated", "graph_breaks_validated"])
@pytest.mark.parametrize("family", ["ss", "ts", "cap"])
def test_torch_compile_with_inductor_equals_eager(family, validate_inputs):
    """The default backend: one graph without the value checks (`fullgraph=True`), a graph break at each value check
    with them (the default settings, `validate_inputs=True`)."""
    torch._dynamo.reset()
    key = (family, "caption" if family == "cap" else "base")
    model = build(key, validate_inputs=validate_inputs)
    inputs = inference_inputs(key)
    with torch.no_grad():
        assert_outputs_equal(torch.compile(model, fullgraph=not validate_inputs)(**inputs), model(**inputs))


# ----------------------------------------------------------------------------------------------------------------
# generate()
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_beams", [1, 2], ids=["greedy", "beam"])
def test_generate_returns_hidden_states_attentions_and_scores(num_beams):
    model = build(("cap", "caption"))
    steps = 3
    outputs = model.generate(
        **region_inputs(), max_new_tokens=steps, num_beams=num_beams, min_new_tokens=steps, return_dict_in_generate=True,
        output_hidden_states=True, output_attentions=True, output_scores=True,
    )  # fmt: skip
    rows = B * num_beams  # the encoder runs once per example, the decoder once per beam (as for BART)
    d_model, layers = CAPTIONER["d_model"], CAPTIONER["decoder_layers"]
    assert [tuple(state.shape) for state in outputs.encoder_hidden_states] == [(B, R, d_model)] * (CAPTIONER["encoder_layers"] + 1)
    assert len(outputs.decoder_hidden_states) == steps
    assert [len(step) for step in outputs.decoder_hidden_states] == [layers + 1] * steps
    assert all(tuple(state.shape) == (rows, 1, d_model) for step in outputs.decoder_hidden_states for state in step)
    assert len(outputs.scores) == steps and outputs.scores[0].shape == (rows, V)
    assert [len(step) for step in outputs.cross_attentions] == [layers] * steps
    assert outputs.sequences.shape == (B, steps + 1)
    plain = model.generate(**region_inputs(), max_new_tokens=steps, min_new_tokens=steps, num_beams=num_beams)
    assert torch.equal(plain, outputs.sequences)


def test_generate_passes_every_model_keyword_argument_to_the_forward():
    """transformers' peers forward the model kwargs given to `generate()` at every step: here `decoder_attention_mask`
    (grown by generate each step) and `output_attentions` reach the captioner's forward."""
    model = build(("cap", "caption"))
    seen = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True)
    mask = torch.ones(B, 1, dtype=torch.long)
    model.generate(**region_inputs(), max_new_tokens=3, min_new_tokens=3, decoder_attention_mask=mask, output_attentions=True)
    assert len(seen) == 3
    assert [tuple(step["decoder_attention_mask"].shape) for step in seen] == [(B, 1), (B, 2), (B, 3)]
    assert all(step["output_attentions"] for step in seen)


def test_generate_refuses_an_unknown_model_keyword_argument():
    with pytest.raises(ValueError, match=r"model_kwargs.*not used by the model.*\['decoder_atention_mask'\]"):
        build(("cap", "caption")).generate(**region_inputs(), max_new_tokens=2, decoder_atention_mask=torch.ones(B, 1))


# ----------------------------------------------------------------------------------------------------------------
# Empty batches
# ----------------------------------------------------------------------------------------------------------------


def empty_batch(key: tuple[str, str]) -> dict[str, torch.Tensor]:
    return {name: value[:0] for name, value in valid_inputs(*key).items()}


@CLASSES
@pytest.mark.parametrize("validate_inputs", [True, False], ids=["validated", "unvalidated"])
def test_an_empty_batch_is_refused_naming_the_argument(key, validate_inputs):
    """transformers' VisualBert, Lxmert and Bart fail on a batch of size 0 with "cannot reshape tensor of 0 elements";
    every forward here refuses it first with a ValueError naming its batch argument, validated or not (a shape
    check, no value read)."""
    name = "visual_feats" if key[0] == "cap" else "input_ids"
    model = build(key, validate_inputs=validate_inputs)
    with pytest.raises(ValueError, match=rf"`{name}` has batch size 0 .*{type(model).__name__} needs at least one example"):
        model(**empty_batch(key))


@pytest.mark.parametrize(
    "inputs, name",
    [
        (lambda: {name: value[:0] for name, value in region_inputs().items()}, "visual_feats"),
        (lambda: {**region_inputs(), "decoder_input_ids": torch.ones(0, 1, dtype=torch.long)}, "decoder_input_ids"),
    ],
    ids=["regions", "prompt"],
)
def test_generate_refuses_an_empty_batch(inputs, name):
    with pytest.raises(ValueError, match=rf"`{name}` has batch size 0"):
        build(("cap", "caption")).generate(**inputs(), max_new_tokens=2)


def test_the_encoder_outputs_of_an_empty_batch_are_refused():
    model = build(("cap", "caption"))
    empty = torch.zeros(0, R, CAPTIONER["d_model"])
    with pytest.raises(ValueError, match=r"`encoder_outputs` has batch size 0"):
        model(encoder_outputs=(empty,), decoder_input_ids=torch.ones(0, 2, dtype=torch.long))
