"""The attention recorder keeps the attention implementation a tiny LLaVA / PaliGemma was loaded with (`eager`,
`sdpa`, kernels this file registers in transformers' `AttentionInterface`, `flex_attention`): outputs with and without
recording are equal, the registered kernel runs in every layer, the recorded query / key of a layer reproduce eager's
attention probabilities and the semi-direct loss is the same as under `sdpa`; gradient checkpointing recomputes with
the same kernel; an implementation whose masks the supervision cannot read is refused, naming it.

Kernels registered here: "counting" (eager math, counting its calls per attention module), "padding-only"
(flash attention's contract on CPU: a causal kernel given no mask or the 2-D padding mask, `flash_attention_mask`; no
"flash" in its name, which would send transformers looking for the flash-attn package) and "no-mask" (a kernel with
no mask function: transformers then gives its layers no mask). The recorded forwards' outputs are compared with
`torch.equal`: every kernel here is deterministic on CPU."""

import collections

import pytest
import torch
from script_modules import ROOT, load_script
from test_patch_models import EXAMPLES, sharpen
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, flash_attention_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_vlalign.trainers.patch_supervision import PatchSupervisionTrainer, PatchSupervisionTrainingArguments
from hf_vlalign.vlms import AttentionRecorder, PatchGroundingCollator, forward_with_layout, patch_attention_loss
from hf_vlalign.vlms.families import patch_model_family
from hf_vlalign.vlms.tiny import tiny_patch_model

COUNTING, PADDING_ONLY, NO_MASK = "hf_vlalign_test_counting", "hf_vlalign_test_padding_only", "hf_vlalign_test_no_mask"
calls: collections.Counter = collections.Counter()


def counting_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    calls[module] += 1
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    logits = query @ key.transpose(2, 3) * scaling
    if attention_mask is not None:  # additive (`eager_mask`)
        logits = logits + attention_mask
    weights = logits.softmax(-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def padding_only_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    length = query.shape[2]
    allowed = torch.ones(length, length, dtype=torch.bool)
    if module.is_causal:  # as flash attention: the language model's layers, not the vision tower's
        allowed = allowed.tril()
    if attention_mask is not None:  # (B, N) padding
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


KERNELS = {COUNTING: (counting_attention, eager_mask), PADDING_ONLY: (padding_only_attention, flash_attention_mask),
           NO_MASK: (counting_attention, None)}  # fmt: skip
IMPLEMENTATIONS = {"llava": ("eager", "sdpa", COUNTING, PADDING_ONLY), "paligemma": ("eager", "sdpa", COUNTING)}


@pytest.fixture(scope="module", autouse=True)
def registered_kernels():
    for name, (function, mask) in KERNELS.items():
        AttentionInterface.register(name, function)
        if mask is not None:
            AttentionMaskInterface.register(name, mask)
    yield
    for name in KERNELS:
        AttentionInterface._global_mapping.pop(name)
        AttentionMaskInterface._global_mapping.pop(name, None)


def loaded(family: str, implementation: str, train: bool = False):
    """(model, batch): the tiny `family` model loaded with `implementation`, its query / key projections re-drawn
    larger (`sharpen`, the same weights for every implementation), and a padded batch of two grounded captions."""
    model, processor = tiny_patch_model(family, attn_implementation=implementation)
    sharpen(model)
    model.train(train)
    return model, PatchGroundingCollator(processor, model.config)(EXAMPLES)


@pytest.fixture(scope="module")
def references():
    """family -> (eager attentions with `output_attentions`, semi-direct loss of the last layer under `sdpa`)."""
    built = {}
    for family in IMPLEMENTATIONS:
        model, batch = loaded(family, "eager")
        with torch.no_grad():
            attentions = forward_with_layout(model, batch, output_attentions=True)[0].attentions
        model, batch = loaded(family, "sdpa")
        with torch.no_grad(), AttentionRecorder(model) as recorder:
            _, layout = forward_with_layout(model, batch)
        built[family] = attentions, patch_attention_loss(recorder, batch, layout, "semi_direct", layers=[1])
    return built


def recorded_probabilities(recorder, layer: int, key_mask: torch.Tensor) -> torch.Tensor:
    """softmax of the recorded logits under the recorded mask (None: causal over the real keys)."""
    query, key, mask = recorder.queries[layer], recorder.keys[layer], recorder.masks[layer]
    key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    logits = query @ key.transpose(-1, -2) * recorder.scaling
    if mask is None:
        length = key.shape[2]
        mask = torch.ones(length, length, dtype=torch.bool).tril() & key_mask.bool()[:, None, None, :]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return logits.masked_fill(~allowed, float("-inf")).softmax(-1)


@pytest.mark.parametrize(
    ("family", "implementation"), [(family, name) for family, names in IMPLEMENTATIONS.items() for name in names]
)
def test_recording_keeps_the_kernel_the_model_was_loaded_with(references, family, implementation):
    model, batch = loaded(family, implementation)
    language_model = patch_model_family(model).language_model(model)
    modules = patch_model_family(model).attention_modules(model)
    returns_maps = {"output_attentions": True} if implementation in ("eager", COUNTING) else {}
    with torch.no_grad():
        plain, _ = forward_with_layout(model, batch, **returns_maps)
        calls.clear()
        with AttentionRecorder(model) as recorder:
            assert language_model.config._attn_implementation == implementation
            recorded, layout = forward_with_layout(model, batch, **returns_maps)
    assert language_model.config._attn_implementation == implementation
    assert torch.equal(recorded.logits, plain.logits)
    if returns_maps:
        assert all(torch.equal(a, b) for a, b in zip(recorded.attentions, plain.attentions, strict=True))
    if implementation == COUNTING:
        assert [calls[module] for module in modules] == [1, 1]
    if implementation == PADDING_ONLY:  # the 2-D padding mask is recorded as None: causal over the batch's keys
        assert recorder.masks == {0: None, 1: None}
    # the recorded query / key of each layer give eager's probabilities on the real rows
    eager_attentions, semi_direct_sdpa = references[family]
    real_rows = batch["attention_mask"].bool()[:, None, :, None]
    for layer in (0, 1):
        actual = recorded_probabilities(recorder, layer, batch["attention_mask"])
        expected = eager_attentions[layer]
        torch.testing.assert_close(actual * real_rows, expected * real_rows, rtol=1e-5, atol=1e-6)
    # the supervision reads the recorded masks as it reads sdpa's
    semi_direct = patch_attention_loss(recorder, batch, layout, "semi_direct", layers=[1])
    torch.testing.assert_close(semi_direct, semi_direct_sdpa, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", IMPLEMENTATIONS)
def test_gradient_checkpointing_recomputes_with_the_models_kernel(family):
    gradients = []
    for checkpointing in (False, True):
        model, batch = loaded(family, COUNTING, train=True)
        if checkpointing:
            model.activation_checkpointing_enable()  # transformers 5.24's name of `gradient_checkpointing_enable`
        modules = patch_model_family(model).attention_modules(model)
        calls.clear()
        with AttentionRecorder(model) as recorder:
            outputs, layout = forward_with_layout(model, batch)
        recorded = {layer: recorder.queries[layer].detach().clone() for layer in recorder.layers}
        loss = outputs.loss + patch_attention_loss(recorder, batch, layout, "semi_direct", layers=[1])
        loss.backward()
        # the backward recomputed each layer with the counting kernel (once more) and recorded nothing
        assert [calls[module] for module in modules] == ([2, 2] if checkpointing else [1, 1])
        assert all(torch.equal(recorder.queries[layer], query) for layer, query in recorded.items())
        gradients.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    # the same gradients, up to float32 accumulation order (the recomputation's are summed in another order)
    assert gradients[0].keys() == gradients[1].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, rtol=1e-5, atol=1e-6)


def test_nested_recorders_keep_their_own_layers_and_the_kernel_is_restored_after_an_error():
    model, batch = loaded("llava", COUNTING)
    other, _ = loaded("llava", "eager")
    with pytest.raises(RuntimeError, match="boom"), AttentionRecorder(model, layers=[1]) as outer:
        with AttentionRecorder(model, layers=[0]) as inner, AttentionRecorder(other) as eager, torch.no_grad():
            forward_with_layout(model, batch)
        raise RuntimeError("boom")
    assert sorted(outer.queries) == [1] and sorted(inner.queries) == [0] and not eager.queries
    # the interface is as before: the registered kernel, and no instance entry left ("eager": the modeling file's)
    assert ALL_ATTENTION_FUNCTIONS.get_interface(COUNTING, None) is counting_attention
    assert ALL_ATTENTION_FUNCTIONS.get_interface("eager", None) is None
    assert COUNTING not in ALL_ATTENTION_FUNCTIONS._local_mapping


def test_an_implementation_whose_masks_the_supervision_cannot_read_is_refused(tmp_path):
    model, _ = tiny_patch_model("llava", attn_implementation=NO_MASK)
    with pytest.raises(ValueError, match=f"'{NO_MASK}' of the llava language model has no mask function"):
        AttentionRecorder(model)
    # PaliGemma under a flash-style mask would lose its bidirectional prefix: refused when the trainer is built
    model, processor = tiny_patch_model("paligemma", attn_implementation=PADDING_ONLY)
    args = PatchSupervisionTrainingArguments(output_dir=str(tmp_path), attention_supervision="direct", report_to="none")
    with pytest.raises(ValueError, match=f"implementation '{PADDING_ONLY}' takes flash attention's padding-only mask"):
        PatchSupervisionTrainer(model=model, args=args, data_collator=PatchGroundingCollator(processor, model.config))
    # without supervision nothing is recorded: the trainer takes it
    args = PatchSupervisionTrainingArguments(output_dir=str(tmp_path), report_to="none")
    PatchSupervisionTrainer(model=model, args=args, data_collator=PatchGroundingCollator(processor, model.config))


def test_the_example_refuses_an_unknown_attention_implementation(tmp_path):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    refusal = r"^`--attn_implementation` must be one of \('eager', .*'sdpa'.* or a Hub kernel id .*got 'fast'.$"
    with pytest.raises(ValueError, match=refusal):
        example.parse_args(["--attn_implementation", "fast", "--output_dir", str(tmp_path)])
    hub_kernel, _ = example.parse_args(["--attn_implementation", "kernels-community/flash-attn", "--output_dir", "x"])
    assert hub_kernel.attn_implementation == "kernels-community/flash-attn"  # from_pretrained loads it (`kernels`)
    args, _ = example.parse_args(["--attn_implementation", COUNTING, "--output_dir", str(tmp_path)])
    model, _ = example.load_model(args, 0, [{"caption": "a red box ."}])
    assert patch_model_family(model).language_model(model).config._attn_implementation == COUNTING


@pytest.mark.slow  # flex attention and its block mask are compiled on first use: 10-40 s on CPU
def test_flex_attention_is_kept_and_its_block_mask_recorded_densely(references):
    model, batch = loaded("paligemma", "flex_attention")
    with torch.no_grad():
        plain, _ = forward_with_layout(model, batch)
        with AttentionRecorder(model) as recorder:
            recorded, layout = forward_with_layout(model, batch)
        sdpa_model, _ = loaded("paligemma", "sdpa")
        with AttentionRecorder(sdpa_model) as sdpa_recorder:
            forward_with_layout(sdpa_model, batch)
    assert torch.equal(recorded.logits, plain.logits)
    # the prefix-LM mask (image and prefix bidirectional, padding) as sdpa's
    assert torch.equal(recorder.masks[1], sdpa_recorder.masks[1])
    semi_direct = patch_attention_loss(recorder, batch, layout, "semi_direct", layers=[1])
    torch.testing.assert_close(semi_direct, references["paligemma"][1], rtol=0, atol=1e-6)
