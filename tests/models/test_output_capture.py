"""transformers 5's output plumbing in every family (issue 22):

- every forward is `@can_return_tuple` (or `@capture_outputs`): `return_dict=False`, as an argument or in the config,
  gives the output's `to_tuple()`, and the task heads take `**kwargs: Unpack[TransformersKwargs]`;
- the single-stream model records its hidden states and attention maps with `@capture_outputs` and
  `_can_record_outputs` (hooks on its layers): each recorded state is the output of that layer on the previous one,
  each map is the probabilities of that layer's attention, the config's `output_*` defaults apply, only the forward
  pass is recorded under gradient checkpointing, and hidden states can be selected by index (transformers 5);
- a misspelt keyword argument raises a TypeError naming it (the `**kwargs` swallow nothing);
- transformers' `Trainer` passes no token count through those `**kwargs` (`accepts_loss_kwargs = False`): the
  losses divide by the per-loss counts that the library's trainers pass.
"""

from __future__ import annotations

import pytest
import torch
from test_captioning import caption_labels
from test_captioning import regions as caption_regions
from test_captioning import tiny_config as captioning_config
from test_single_stream import base_inputs, tiny_batch
from test_single_stream import tiny_config as single_stream_config
from test_task_heads import TASKS, model_of, task_batch
from test_two_stream import tiny_batch as two_stream_batch
from test_two_stream import tiny_config as two_stream_config
from transformers import Trainer, TrainingArguments

from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    RegionCaptionerModel,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    TwoStreamModel,
)
from hf_vlalign.models.attention_utils import key_padding_mask_4d


def single_stream_model(**overrides) -> SingleStreamModel:
    torch.manual_seed(0)
    return SingleStreamModel(single_stream_config(**overrides)).eval()


def captioning_inputs() -> dict[str, torch.Tensor]:
    return {**caption_regions(), "labels": caption_labels()}


# every model class with inputs that compute its losses (the task heads with their labels)
CASES = {
    "SingleStreamModel": (lambda: single_stream_model(), lambda: base_inputs(tiny_batch())),
    "SingleStreamForVisualParaphrase": (
        lambda: SingleStreamForVisualParaphrase(single_stream_config()).eval(),
        tiny_batch,
    ),
    "TwoStreamModel": (lambda: TwoStreamModel(two_stream_config()).eval(), two_stream_batch),
    "RegionCaptionerModel": (
        lambda: RegionCaptionerModel(captioning_config()).eval(),
        lambda: {**caption_regions(), "decoder_input_ids": torch.tensor([[1, 5, 6], [1, 8, 9]])},
    ),
    "RegionCaptionerForConditionalGeneration": (
        lambda: RegionCaptionerForConditionalGeneration(captioning_config()).eval(),
        captioning_inputs,
    ),
    **{
        family + task: (
            lambda family=family, task=task: model_of(family, task).eval(),
            lambda task=task: task_batch(task),
        )
        for family in ("SingleStream", "TwoStream")
        for task in TASKS
    },
}


def assert_same(first, second, where: str = "") -> None:
    if isinstance(first, torch.Tensor):
        assert torch.equal(first, second), where
    elif isinstance(first, (tuple, list)):
        assert len(first) == len(second), where
        for index, (a, b) in enumerate(zip(first, second)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert first == second, where


@pytest.mark.parametrize("name", list(CASES))
def test_return_dict_false_gives_the_outputs_tuple(name):
    build, inputs = CASES[name]
    model = build()
    torch.manual_seed(1)
    with torch.no_grad():
        as_dict = model(**inputs(), output_attentions=True)
        as_tuple = model(**inputs(), output_attentions=True, return_dict=False)
        model.config.return_dict = False
        from_config = model(**inputs(), output_attentions=True)
        as_dict_again = model(**inputs(), output_attentions=True, return_dict=True)
    assert isinstance(as_tuple, tuple) and isinstance(from_config, tuple)
    assert len(as_tuple) == len(as_dict.to_tuple()) > 1
    assert_same(as_tuple, as_dict.to_tuple())
    assert_same(from_config, as_dict.to_tuple())
    assert_same(as_dict_again.to_tuple(), as_dict.to_tuple())
    assert type(as_dict_again) is type(as_dict)


@pytest.mark.parametrize("name", list(CASES))
def test_a_misspelt_keyword_argument_is_named_in_a_type_error(name):
    build, inputs = CASES[name]
    model = build()
    with pytest.raises(
        TypeError,
        match=rf"{type(model).__name__}\.forward\(\) got unexpected keyword argument\(s\) \['output_atentions'\]",
    ):
        model(**inputs(), output_atentions=True)


def test_recorded_hidden_states_are_each_layers_output_on_the_previous_one():
    model = single_stream_model()
    batch = base_inputs(tiny_batch())
    with torch.no_grad():
        outputs = model(**batch, output_hidden_states=True, output_attentions=True)
    layers = model.config.num_hidden_layers
    assert len(outputs.hidden_states) == layers + 1 and len(outputs.attentions) == layers
    assert outputs.hidden_states[-1] is outputs.last_hidden_state
    embeddings = torch.cat(
        [
            model.embeddings(batch["input_ids"], batch["token_type_ids"]),
            model.visual_embeddings(batch["visual_feats"], batch["visual_boxes"]),
        ],
        dim=1,
    )
    assert torch.equal(outputs.hidden_states[0], embeddings)
    keep = model._key_padding_mask(batch["attention_mask"], batch["visual_attention_mask"])
    mask = key_padding_mask_4d(keep, embeddings.dtype, eager=True)
    with torch.no_grad():
        for index, layer in enumerate(model.encoder.layer):
            state, probabilities, _ = layer(outputs.hidden_states[index], mask, True)
            assert torch.equal(outputs.hidden_states[index + 1], state), index
            assert torch.equal(outputs.attentions[index], probabilities), index
            assert torch.allclose(probabilities.sum(-1), torch.ones(()))  # rows of probabilities


def test_the_configs_output_flags_are_the_defaults_and_arguments_take_precedence():
    model = single_stream_model(output_attentions=True, output_hidden_states=True)
    batch = base_inputs(tiny_batch())
    with torch.no_grad():
        by_config = model(**batch)
        switched_off = model(**batch, output_attentions=False, output_hidden_states=False)
    assert len(by_config.attentions) == 3 and len(by_config.hidden_states) == 4
    assert switched_off.attentions is None and switched_off.hidden_states is None
    assert torch.allclose(by_config.last_hidden_state, switched_off.last_hidden_state, atol=1e-6)  # eager vs sdpa


def test_nothing_is_recorded_unless_asked_and_the_state_is_the_same():
    model = single_stream_model()
    batch = base_inputs(tiny_batch())
    with torch.no_grad():
        plain = model(**batch)
        recorded = model(**batch, output_hidden_states=True, output_attentions=True)
    assert plain.hidden_states is None and plain.attentions is None
    assert torch.allclose(plain.last_hidden_state, recorded.last_hidden_state, atol=1e-6)  # sdpa vs eager
    assert torch.equal(plain.loss_attention_supervision, recorded.loss_attention_supervision)  # supervision reads query/key, not the maps


def test_gradient_checkpointing_records_the_forward_pass_only():
    model = single_stream_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.activation_checkpointing_enable()
    model.train()
    batch = base_inputs(tiny_batch())
    outputs = model(**batch, output_hidden_states=True, output_attentions=True)
    (outputs.last_hidden_state.square().mean() + outputs.loss_attention_supervision).backward()
    assert len(outputs.hidden_states) == 4 and len(outputs.attentions) == 3
    assert all(parameter.grad is not None for parameter in model.encoder.parameters())
    again = model(**batch, output_hidden_states=True, output_attentions=True)  # the backward left nothing behind
    assert len(again.hidden_states) == 4 and len(again.attentions) == 3
    assert_same(again.attentions, outputs.attentions)


def test_hidden_states_can_be_selected_by_index():
    model = single_stream_model()
    batch = base_inputs(tiny_batch())
    with torch.no_grad():
        every = model(**batch, output_hidden_states=True).hidden_states
        selected = model(**batch, output_hidden_states=[0, -1]).hidden_states
    assert len(selected) == len(every)
    assert torch.equal(selected[0], every[0]) and torch.equal(selected[-1], every[-1])
    assert all(state is None for state in selected[1:-1])


def test_the_task_heads_pass_the_flags_through_to_the_encoder():
    model = model_of("SingleStream", "ForQuestionAnswering").eval()
    with torch.no_grad():
        outputs = model(**task_batch("ForQuestionAnswering"), output_hidden_states=True, output_attentions=True)
    assert len(outputs.hidden_states) == 4 and len(outputs.attentions) == 3
    two_stream = model_of("TwoStream", "ForQuestionAnswering").eval()
    with torch.no_grad():
        outputs = two_stream(**task_batch("ForQuestionAnswering"), output_hidden_states=True)
    config = two_stream.config
    assert len(outputs.language_hidden_states) == config.l_layers + config.x_layers
    assert len(outputs.vision_hidden_states) == config.r_layers + config.x_layers


@pytest.mark.parametrize(
    "build",
    [
        lambda: SingleStreamForVisualParaphrase(single_stream_config()),
        lambda: model_of("TwoStream", "ForPhraseGrounding"),
        lambda: RegionCaptionerForConditionalGeneration(captioning_config()),
    ],
    ids=["single_stream", "two_stream", "captioning"],
)
def test_transformers_trainer_passes_no_token_count_through_the_kwargs(build, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Trainer(model=build(), args=args)
    assert trainer.model_accepts_loss_kwargs is False


def test_the_captioner_returns_hidden_states_from_forward_and_generate():
    model = RegionCaptionerForConditionalGeneration(captioning_config()).eval()
    config = model.config
    with torch.no_grad():
        outputs = model(**captioning_inputs(), output_hidden_states=True)
    assert len(outputs.encoder_hidden_states) == config.encoder_layers + 1
    assert len(outputs.decoder_hidden_states) == config.decoder_layers + 1
    assert torch.equal(outputs.encoder_hidden_states[-1], outputs.encoder_last_hidden_state)
    generated = model.generate(**caption_regions(), max_new_tokens=2, output_hidden_states=True, return_dict_in_generate=True)
    assert len(generated.encoder_hidden_states) == config.encoder_layers + 1
    assert all(len(step) == config.decoder_layers + 1 for step in generated.decoder_hidden_states)
    generated = model.generate(
        **caption_regions(), max_new_tokens=2, output_attentions=True, return_dict_in_generate=True
    )
    assert len(generated.cross_attentions) == 2 and len(generated.cross_attentions[0]) == 2  # steps x layers
