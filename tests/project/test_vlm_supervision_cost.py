"""benchmarks/vlm_supervision_cost.py: its measuring function, run for 2 steps on tiny sizes, returns every field of
every supervision setting with positive finite ratios to the family's baseline, and the table renders from it; the
block of docs/vlms.md ("What supervision costs") is `docs_block` of the committed CPU results, and what the page says
of them holds there. No timing is asserted: ratios on a shared machine mean nothing."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image
from script_modules import ROOT, load_script

cost = load_script("vlm_supervision_cost_benchmark", ROOT / "benchmarks" / "vlm_supervision_cost.py")

SIZES = cost.Sizes(image_size=32, patch_size=16, hidden_size=16, num_layers=2, num_heads=2, vision_layers=1, batch=2,
                   supervised_layer=1)  # fmt: skip
RUN_FIELDS = {
    "step_seconds", "step_seconds_all", "saved_for_backward_bytes", "saved_for_backward_storages",
    "cuda_max_memory_allocated_bytes", "cuda_step_peak_bytes", "final_loss", "time_ratio", "extra_step_seconds",
    "extra_saved_for_backward_bytes", "saved_for_backward_ratio", "cuda_max_memory_allocated_ratio",
    "cuda_step_peak_ratio",
}  # fmt: skip


def examples(count: int) -> list[dict]:
    """`count` grounded captions of plain images (the benchmark's own run reads the synthetic scenes)."""
    caption = "A red box left of a blue ball ."
    return [
        {
            "image": Image.new("RGB", (48 + 8 * index, 40), (200, 30 * index, 30)),
            "caption": caption,
            "phrases": [
                {"char_start": 0, "char_end": 9, "boxes": [[0, 0, 24, 20]]},
                {"char_start": caption.index("a blue"), "char_end": caption.index(" ."), "boxes": [[24, 20, 48, 40]]},
            ],
        }
        for index in range(count)
    ]


@pytest.fixture(scope="module", params=["llava", "vilt"])
def measured(request):
    torch.manual_seed(0)
    family = request.param
    return family, cost.measure_family(family, SIZES, steps=2, warmup=1, batches=2, examples=examples(4))


def test_every_setting_is_measured_with_positive_finite_ratios(measured):
    family, result = measured
    assert result["family"] == family
    settings = ("direct", "semi_direct") if family == "vilt" else ("none", "direct", "semi_direct")
    assert result["baseline"] == settings[0] and tuple(result["settings"]) == settings
    assert result["parameters"] > 0 and result["image_tokens"] == (SIZES.image_size // SIZES.patch_size) ** 2
    # the default vocabulary: the training captions' words and the special tokens
    assert result["vocabulary"] == "data" and result["vocabulary_size"] == len(cost.tokenizer_of("data", examples(4)))
    assert result["sequence_length"] > result["image_tokens"]
    for supervision, run in result["settings"].items():
        assert set(run) == RUN_FIELDS, supervision
        assert len(run["step_seconds_all"]) == 2 and run["step_seconds"] > 0
        assert run["saved_for_backward_bytes"] > 0 and run["saved_for_backward_storages"] > 0
        assert math.isfinite(run["final_loss"])
        for key in ("time_ratio", "saved_for_backward_ratio"):
            assert isinstance(run[key], float) and math.isfinite(run[key]) and run[key] > 0, (supervision, key)
        # the CPU: no CUDA allocator numbers
        assert run["cuda_max_memory_allocated_bytes"] is None and run["cuda_step_peak_ratio"] is None
    baseline = result["settings"][result["baseline"]]
    assert baseline["time_ratio"] == baseline["saved_for_backward_ratio"] == 1.0
    assert baseline["extra_step_seconds"] == baseline["extra_saved_for_backward_bytes"] == 0
    # the rollout rows are kept for backward
    assert result["settings"]["semi_direct"]["saved_for_backward_ratio"] > 1.0


def test_table_renders_every_setting(measured):
    family, result = measured
    report = {
        "settings": {"sizes": cost.asdict(SIZES), "steps": 2, "warmup": 1},
        "machine": cost.machine(torch.device("cpu")),
        "versions": cost.versions(),
        "families": [result],
    }
    table = cost.table(report)
    assert table.count(f"| {family} |") == len(result["settings"])
    assert "| family | supervision | step (ms) | time ratio |" in table


def test_every_setting_gets_the_same_vocabulary(tmp_path):
    """PaliGemmaProcessor adds its 1,152 <loc> / <seg> tokens to its tokenizer: `tiny_patch_model` builds it from a
    copy (the caller's tokenizer is unchanged) and sizes the model's vocabulary to it, so the settings compare models
    of one vocabulary."""
    tokenizer = cost.tokenizer_of("data", examples(2))
    words = len(tokenizer)
    trainees = [cost.Trainee("paligemma", supervision, SIZES, torch.device("cpu"), 0, str(tmp_path), tokenizer)
                for supervision in ("none", "direct")]  # fmt: skip
    sizes = [trainee.model.get_input_embeddings().num_embeddings for trainee in trainees]
    assert sizes == [words + 1152] * 2 == [len(trainee.collator.tokenizer) for trainee in trainees]
    assert len(tokenizer) == words
    with pytest.raises(ValueError, match="vocabulary"):
        cost.tokenizer_of("glove", examples(2))


def test_docs_block_is_generated_from_the_committed_results():
    report = json.loads((cost.RESULTS_DIR / "vlm_supervision_cost_cpu.json").read_text())
    page = (ROOT / "docs" / "vlms.md").read_text()
    block = cost.docs_block(report)
    assert block.startswith(cost.DOCS_BEGIN) and block.endswith(cost.DOCS_END)
    assert page[page.index(cost.DOCS_BEGIN) : page.index(cost.DOCS_END) + len(cost.DOCS_END)] == block
    # the run the block describes: the default vocabulary, every family and setting, ratios to the family's baseline
    assert report["settings"]["vocabulary"] == "data" and report["machine"]["device"] == "cpu"
    families = {family["family"]: family for family in report["families"]}
    assert tuple(families) == cost.FAMILIES
    for name, family in families.items():
        # the captions' words, not 30,523 (PaliGemma: and its processor's 1,152 <loc> / <seg> tokens)
        extra = 1152 if name == "paligemma" else 0
        assert family["vocabulary"] == "data" and family["vocabulary_size"] - extra < 100
        assert tuple(family["settings"]) == cost.settings_of(name) and family["baseline"] == cost.baseline_of(name)
        assert family["settings"][family["baseline"]]["saved_for_backward_ratio"] == 1.0
        # semi-direct keeps its rollout rows for the backward: more bytes than the baseline
        assert family["settings"]["semi_direct"]["extra_saved_for_backward_bytes"] > 0
    # what docs/vlms.md says under the table: in the bytes saved for backward, direct and semi-direct supervision each
    # add less than 1 MiB (2 %) for LLaVA and PaliGemma
    text = " ".join(page.split())
    assert "direct and semi-direct supervision each add less than 1 MiB (2 %) for LLaVA and PaliGemma" in text
    for name in ("llava", "paligemma"):
        for key in ("direct", "semi_direct"):
            run = families[name]["settings"][key]
            assert 0 <= run["extra_saved_for_backward_bytes"] < 2**20 and run["saved_for_backward_ratio"] < 1.02, name


def test_vilt_has_no_unsupervised_setting():
    assert cost.settings_of("vilt") == ("direct", "semi_direct") and cost.baseline_of("vilt") == "direct"
    assert cost.settings_of("llava") == cost.SUPERVISIONS and cost.baseline_of("paligemma") == "none"
    with pytest.raises(ValueError, match="steps >= 1"):
        cost.measure_family("llava", SIZES, steps=0, warmup=0, batches=1, examples=examples(2))
