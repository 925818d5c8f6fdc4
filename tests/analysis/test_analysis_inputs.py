"""`hf-vlalign analyze` runs the model without the attention-supervision targets (`word_region_alignment`,
`phrase_masks`): the model then computes no attention or alignment loss, and its attention maps, all the analyses
read, are the same as with the targets."""

from __future__ import annotations

import pytest
import torch
from analysis_models import SCENES, tiny_family_model

from hf_vlalign.analysis.adapters import attention_blocks
from hf_vlalign.evaluation import inference_batches
from hf_vlalign.evaluation.model_analysis import ATTENTION_TARGET_KEYS, synthetic_analysis_data

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")

TARGETS = ("word_region_alignment", "phrase_masks")


@pytest.mark.parametrize("family", ["single_stream", "two_stream"])
def test_analysis_inputs_leave_out_the_attention_targets_and_keep_every_map(family, tokenizer):
    model = tiny_family_model(family, tokenizer).eval()
    model.config.attention_supervision = "direct"  # the main job's setting: with the targets, a loss is computed
    data = synthetic_analysis_data(model, tokenizer, SCENES)
    assert set(ATTENTION_TARGET_KEYS) == set(TARGETS)  # what the analysis leaves out of its batches
    (first,) = inference_batches(model, data.dataset.select(range(8)), data.collator, 8, exclude=ATTENTION_TARGET_KEYS)
    batch, inputs = first.batch, first.inputs
    assert not set(TARGETS) & set(inputs)
    with torch.no_grad():
        without = model(**inputs, output_attentions=True)
        with_targets = model(**inputs, **{key: batch[key] for key in TARGETS}, output_attentions=True)
    assert with_targets.loss_attention_supervision is not None and without.loss_attention_supervision is None
    masks = {"text_mask": batch[data.text_mask_key], "region_mask": batch["visual_attention_mask"]}
    source = model.config.model_type.removeprefix("vlalign_")
    blocks, reference = (attention_blocks(out, **masks, source=source) for out in (without, with_targets))
    assert blocks.available() == reference.available() and blocks.available()
    for name in blocks.available():
        assert all(torch.equal(a, b) for a, b in zip(blocks.block(name), reference.block(name), strict=True)), name
