"""benchmarks/memory_estimate.py, the 7 B recipe's memory estimate (docs/scaling.md, "Supervising a 7 B
vision-language model"): the committed results are what the script computes, the docs block is rendered from them, the
parameter counts are those of a meta-device LLaVA-1.5-7B (LoRA: of peft's own wrapping), and the formulas grow as
the docs say (linear in the image tokens but for semi-direct supervision from full maps)."""

from __future__ import annotations

import json

import torch
from peft import get_peft_model
from script_modules import ROOT, load_script

from hf_vlalign.lora import lora_config

memory = load_script("memory_estimate_benchmark", ROOT / "benchmarks" / "memory_estimate.py")


def test_the_committed_results_are_the_scripts_and_the_docs_block_is_rendered_from_them():
    committed = json.loads(memory.RESULTS.read_text())
    assert committed == json.loads(json.dumps(memory.estimate()))
    assert memory.docs_block(committed) in (ROOT / "docs" / "scaling.md").read_text()


def test_parameter_counts_are_those_of_a_meta_device_model_and_its_peft_wrapping():
    config = memory.llava_15_7b_config()
    counts = memory.parameter_counts(config, lora_r=16, lora_preset="attention")
    with torch.device("meta"):
        model = memory.LlavaForConditionalGeneration(config)
    assert counts["total"] == sum(parameter.numel() for parameter in model.parameters()) == 7_063_427_072
    base = model.model
    parts = (counts["vision_tower"], counts["projector"], counts["language_model"], counts["lm_head"])
    assert sum(parts) == counts["total"] and counts["lm_head"] == 32064 * 4096
    assert counts["decoder_layer"] == sum(p.numel() for p in base.language_model.layers[0].parameters())
    peft_model = get_peft_model(model, lora_config(model, r=16, preset="attention"))
    assert counts["lora"] == sum(p.numel() for p in peft_model.parameters() if p.requires_grad) == 32 * 4 * 16 * 8192


def test_every_row_grows_linearly_with_the_image_tokens_but_the_full_maps():
    config = memory.llava_15_7b_config()
    small, large = (memory.supervision_rows(config, tokens, memory.SETTINGS) for tokens in (576, 5 * 576))
    for name in ("supervision, direct", "supervision, semi-direct (rows only)"):
        assert large[name] < 5 * small[name]
    assert large["supervision, semi-direct (full maps)"] > 15 * small["supervision, semi-direct (full maps)"]
    rows_only = [memory.semi_direct_rows_only_bytes(32, 32, 64, 128, tokens) for tokens in (1000, 2000, 4000)]
    assert rows_only[2] - rows_only[1] == 2 * (rows_only[1] - rows_only[0])
