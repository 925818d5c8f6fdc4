"""The patch-model probe and explorer at real sizes: attention read one layer at a time (each layer's map freed before
the next is made; only the needed rows kept), the probe's numbers those of the full maps, the explorer's heads, and a
page whose size grows with the heads it keeps, not with every head of every layer (docs/vlms.md, "The explorer and the
probe at real sizes"). Tiny random ViLT / LLaVA / PaliGemma (`tiny_patch_model`'s defaults: 2 layers of 4 heads)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from PIL import Image
from test_patch_models import sharpen

from hf_vlalign.alignment.patches import centre_prior
from hf_vlalign.analysis.explorer import (
    MEAN_OVER_HEADS,
    ExplorerExample,
    read_explorer_payload,
    stored_maps,
    write_attention_explorer,
)
from hf_vlalign.analysis.grounding_probe import GroundingProbe
from hf_vlalign.vlms import PatchGroundingCollator, eager_attention, forward_with_layout, probe_patch_model
from hf_vlalign.vlms.explore import patch_explorer_examples
from hf_vlalign.vlms.families import patch_model_family
from hf_vlalign.vlms.probe import patch_attention_rows, read_attention_rows
from hf_vlalign.vlms.tiny import tiny_patch_model


def noise_image(width: int, height: int, seed: int) -> Image.Image:
    pixels = torch.randint(0, 256, (height, width, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def _phrase(caption: str, text: str, box: list[int]) -> dict:
    start = caption.index(text)
    return {"char_start": start, "char_end": start + len(text), "boxes": [box], "text": text}


CAPTIONS = ["A dog chases a cat .", "A cat sleeps .", "Two red boxes beside a ball ."]
EXAMPLES = [
    {"image": noise_image(64, 64, 0), "caption": CAPTIONS[0],
     "phrases": [_phrase(CAPTIONS[0], "A dog", [16, 16, 48, 48]), _phrase(CAPTIONS[0], "a cat", [0, 0, 16, 16])]},
    {"image": noise_image(64, 64, 1), "caption": CAPTIONS[1], "phrases": [_phrase(CAPTIONS[1], "A cat", [48, 0, 64, 16])]},
    {"image": noise_image(80, 64, 2), "caption": CAPTIONS[2],
     "phrases": [_phrase(CAPTIONS[2], "Two red boxes", [0, 32, 40, 64]), _phrase(CAPTIONS[2], "a ball", [40, 0, 80, 32])]},
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny():
    built = {}
    for family in ("vilt", "llava", "paligemma"):
        model, processor = tiny_patch_model(family)
        sharpen(model.eval())
        built[family] = (model, processor, PatchGroundingCollator(processor, model.config, return_details=True))
    return built


def full_maps_probe(model, batch, threshold: float):
    """The probe as it read attention before: every layer's (B, H, N, N) map from `output_attentions=True`."""
    family = patch_model_family(model)
    probe = GroundingProbe(len(family.attention_modules(model)), family.num_heads(model), threshold, 0.2, True,
                           "centre_patch")  # fmt: skip
    with torch.no_grad(), eager_attention(model):
        outputs, layout = forward_with_layout(model, batch, output_attentions=True)
    rows = patch_attention_rows(outputs.attentions, layout.image_positions)
    centre = layout.to_tokens(centre_prior(layout.grid).expand(rows.shape[1], -1), fill=-1.0)
    coverage = layout.to_tokens(batch["phrase_cell_coverage"])
    probe.update_from_text_to_region(rows, batch["phrase_token_index"], coverage, layout.patch_mask, centre)
    return probe.compute()


@pytest.mark.parametrize("family", ["vilt", "llava", "paligemma"])
def test_the_probe_gives_the_numbers_of_every_layers_full_maps(tiny, family):
    model, _, collator = tiny[family]
    batch = collator(EXAMPLES)
    torch.manual_seed(0)  # ViLT draws its patch order in each forward: the same one for both readings
    expected = full_maps_probe(model, batch, collator.coverage_threshold)
    torch.manual_seed(0)
    result = probe_patch_model(model, [batch], collator.coverage_threshold)
    assert result.num_phrases == expected.num_phrases == 5
    assert np.array_equal(result.accuracy, expected.accuracy)
    assert np.array_equal(result.active_share, expected.active_share)
    assert result.baseline_accuracy == expected.baseline_accuracy
    assert (result.best_layer, result.best_head) == (expected.best_layer, expected.best_head)


@pytest.mark.parametrize("family", ["llava", "paligemma"])
def test_one_layers_map_is_alive_at_a_time_and_only_the_needed_rows_are_kept(tiny, family):
    """Each layer's map is freed before the next layer makes its own (a weak reference to every map, counted alive as
    each layer returns), and the rows kept are (B, H, phrases, N): phrases / N of every layer's maps' bytes. The same
    count on `output_attentions=True` finds every layer's map alive."""
    model, _, collator = tiny[family]
    batch = collator(EXAMPLES)
    modules = patch_model_family(model).attention_modules(model)
    maps, alive = [], []

    def watch(module, args, output):
        maps.append(weakref.ref(output[1]))
        alive.append(sum(ref() is not None for ref in maps))

    handles = [module.register_forward_hook(watch) for module in modules]
    try:
        phrases = batch["phrase_token_index"].clamp(min=0)
        _, _, rows = read_attention_rows(model, batch, phrases)
        read_alive, maps[:] = list(alive), []
        alive.clear()
        with torch.no_grad(), eager_attention(model):
            outputs, _ = forward_with_layout(model, batch, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    assert read_alive == [1, 1] and alive == [1, 2] and len(outputs.attentions) == 2
    batch_size, heads, length = outputs.attentions[0].shape[:3]
    kept = sum(row.numel() * row.element_size() for row in rows)
    full = sum(attention.numel() * attention.element_size() for attention in outputs.attentions)
    assert rows[0].shape == (batch_size, heads, phrases.shape[1], length)
    assert kept / full == phrases.shape[1] / length < 0.1


def test_the_explorer_keeps_each_layers_mean_and_the_heads_most_on_the_image(tiny):
    """Without a probe the page keeps the heads whose caption tokens put the most attention on the image, each map the
    full map's rows re-normalised over the real patches."""
    model, _, collator = tiny["llava"]
    (example,) = patch_explorer_examples(model, collator, EXAMPLES[:1], num_heads=3)
    with torch.no_grad(), eager_attention(model):
        outputs, layout = forward_with_layout(model, collator(EXAMPLES[:1]), output_attentions=True)
    maps = torch.stack(outputs.attentions)[:, 0]  # (L, H, N, N)
    details = collator(EXAMPLES[:1])["details"][0]
    caption = slice(details["caption_start"], details["caption_end"])
    on_image = maps[:, :, caption][..., layout.image_positions[0]]  # (L, H, T, P)
    share = on_image.sum(-1).mean(-1)  # (L, H)
    top = sorted(divmod(int(index), 4) for index in share.flatten().argsort(descending=True)[:3])
    assert example.heads == [(0, MEAN_OVER_HEADS), (1, MEAN_OVER_HEADS), *top] and example.model_shape == (2, 4)
    renormalised = on_image / on_image.sum(-1, keepdim=True)
    layer, head = top[0]
    np.testing.assert_allclose(example.head_map("word_to_region", layer, head), renormalised[layer, head], atol=1e-6)
    np.testing.assert_allclose(example.head_map("word_to_region", 1, MEAN_OVER_HEADS), renormalised[1].mean(0), atol=1e-6)


def test_a_page_of_kept_heads_is_a_byte_per_weight(tmp_path):
    """A LLaVA-1.5-shaped example (32 layers x 32 heads, 576 patches, 12 words): the page of each layer's mean and 8
    heads stays under 0.5 MB, where every head rounded to 4 decimals is over 60 times larger; the stored weights are
    within 1/510 of their row's largest (plus its rounding to 4 significant digits)."""
    generator = np.random.default_rng(0)
    layers, heads, words, patches = 32, 32, 12, 576
    kept = [(layer, MEAN_OVER_HEADS) for layer in range(layers)] + [(layer, 5) for layer in range(0, 32, 4)]
    maps = generator.dirichlet(np.full(patches, 0.3), size=(len(kept), words))
    boxes = np.array([[c / 24, r / 24, (c + 1) / 24, (r + 1) / 24] for r in range(24) for c in range(24)])
    words_of = [f"w{index}" for index in range(words)]
    small = ExplorerExample(words_of, boxes, {"word_to_region": maps}, heads=kept, model_shape=(layers, heads))
    page = write_attention_explorer([small], tmp_path / "kept.html")
    assert page.stat().st_size < 500_000
    decoded = stored_maps(read_explorer_payload(page)["examples"][0]["attention"]["word_to_region"])
    assert decoded.shape == maps.shape
    peak = maps.max(-1, keepdims=True)  # a code is off by 1/510 of it, and it is rounded to 4 significant digits
    assert (np.abs(decoded - maps) <= peak / 510 + 5e-4 * peak).all()
    # every head, as the page stored them before: (L, H, T, P) rounded to 4 decimals (1 layer written, x 32)
    every = ExplorerExample(words_of, boxes, {"word_to_region": generator.dirichlet(np.full(patches, 0.3), size=(1, heads, words))})
    one_layer = write_attention_explorer([every], tmp_path / "every.html").stat().st_size
    assert layers * one_layer > 60 * page.stat().st_size
    with pytest.raises(ValueError, match=r"`colour_scale` must be one of \('absolute', 'row_max', 'uniform'\), got 'log'"):
        write_attention_explorer([small], tmp_path / "kept.html", colour_scale="log")
    with pytest.raises(ValueError, match=r"With `heads`, each `attention` view must be \(S, Q, K\) with S = 40"):
        ExplorerExample(words_of, boxes, {"word_to_region": maps[:3]}, heads=kept, model_shape=(layers, heads))


def test_vilts_patches_attend_over_each_captions_own_tokens(tiny):
    """ViLT's "region_to_word": each real patch's row over the caption's tokens, re-normalised over that caption only
    (a shorter caption of the batch is not padded with repeats of its last token)."""
    model, _, collator = tiny["vilt"]
    torch.manual_seed(0)
    examples = patch_explorer_examples(model, collator, EXAMPLES[:2], heads=[(1, 2)])
    batch = collator(EXAMPLES[:2])
    torch.manual_seed(0)
    with torch.no_grad():
        outputs, layout = forward_with_layout(model, batch, output_attentions=True)
    for index, example in enumerate(examples):
        details = batch["details"][index]
        caption = torch.arange(details["caption_start"], details["caption_end"])
        patches = layout.image_positions[index][layout.patch_mask[index]]
        rows = outputs.attentions[1][index, 2][patches][:, caption]
        expected = rows / rows.sum(-1, keepdim=True)
        np.testing.assert_allclose(example.head_map("region_to_word", 1, 2), expected, atol=1e-6)
    assert len(examples[1].words) < len(examples[0].words)

