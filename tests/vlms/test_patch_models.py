"""transformers' own patch models (`hf_vlalign.vlms`) on tiny random ViLT / LLaVA / PaliGemma: the collator's
sequences and targets, ViLT's sampled patch order, the attention recorder against the models' eager attention, the
direct and semi-direct losses against hand computations from eager attention maps, and the grounding probe.

Every model is `tiny_patch_model`'s default (64 x 64 images cut into 16 x 16 patches, 2 layers of 4 heads), its
query / key projections re-drawn larger (`sharpen`); two LLaVA variants add CLIP's [CLS] image token ("llava-full")
and grouped-query attention ("llava-gqa")."""

import copy

import pytest
import torch
from PIL import Image
from transformers import LlavaForConditionalGeneration

from hf_vlalign.alignment.patches import cell_coverage
from hf_vlalign.analysis.grounding_probe import GroundingProbe
from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from hf_vlalign.vlms import (
    AttentionRecorder,
    PatchGroundingCollator,
    eager_attention,
    forward_with_layout,
    grounded_caption_examples,
    grounded_token_count,
    patch_attention_loss,
    patch_model_family,
    probe_patch_model,
)
from hf_vlalign.trainers.patch_supervision import PatchSupervisionTrainingArguments
from hf_vlalign.vlms import supervision
from hf_vlalign.vlms.families import PatchLayout
from hf_vlalign.vlms.probe import patch_attention_rows
from hf_vlalign.vlms.tiny import tiny_patch_model

FAMILIES = ("vilt", "llava", "paligemma")
DECODERS = ("llava", "paligemma")


def phrase(caption: str, text: str, boxes: list[list[int]]) -> dict:
    start = caption.index(text)
    return {"char_start": start, "char_end": start + len(text), "boxes": boxes, "text": text}


def noise_image(width: int, height: int, seed: int) -> Image.Image:
    """Random pixels: image tokens that differ (ViLT's patches of a flat image are identical, its attention over them
    uniform)."""
    pixels = torch.randint(0, 256, (height, width, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


CAPTION_A = "A skateboarder jumps over the red box ."
CAPTION_B = "Two small cats sleep ."
# A: a 96 x 64 image, B: 64 x 80 (ViLT pads both to 96 x 80; CLIP crops their centre, SigLIP squeezes them)
EXAMPLES = [
    {
        "image": noise_image(96, 64, 0),
        "caption": CAPTION_A,
        "phrases": [phrase(CAPTION_A, "A skateboarder", [[0, 0, 48, 32]]), phrase(CAPTION_A, "the red box", [[48, 32, 96, 64]])],
    },
    {"image": noise_image(64, 80, 1), "caption": CAPTION_B, "phrases": [phrase(CAPTION_B, "Two small cats", [[10, 10, 20, 20]])]},
]
# the cells each phrase covers (coverage >= 0.5), worked out by hand from each processor's geometry:
# LLaVA (CLIP): A is cut to its central 64 x 64 (x - 16); PaliGemma (SigLIP): A is squeezed to 64 x 64 (x * 2 / 3);
# both 4 x 4 grids. ViLT: a 5 x 6 grid over the padded 96 x 80 batch. The tiny box of B covers no cell at 0.5: its
# target is the cell it covers most, cell 0.
COVERED = {
    "llava": [[{0, 1, 4, 5}, {10, 11, 14, 15}], [{0}]],
    "paligemma": [[{0, 1, 4, 5}, {10, 11, 14, 15}], [{0}]],
    "vilt": [[{0, 1, 2, 6, 7, 8}, {15, 16, 17, 21, 22, 23}], [{0}]],
}
GRIDS = {"llava": (4, 4), "paligemma": (4, 4), "vilt": (5, 6)}


def sharpen(model, std: float = 0.25) -> None:
    """Re-draws the query / key projections of the supervised attention layers: at the default initialisation a tiny
    model's attention is nearly uniform (losses within 1e-3 of log(#patches)), where a wrong key or mask would hardly change a loss or a map."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in patch_model_family(model).attention_modules(model):
            for name in ("q_proj", "k_proj", "query", "key"):
                if hasattr(module, name):
                    weight = getattr(module, name).weight
                    weight.copy_(torch.randn(weight.shape, generator=generator) * std)


@pytest.fixture(scope="module")
def tiny():
    """family -> (model, processor, collator), models in eval mode; "llava-full" is the tiny LLaVA with
    `vision_feature_select_strategy="full"` (CLIP's [CLS] first among its 17 image tokens), "llava-gqa" with 2 key /
    value heads for its 4 query heads (PaliGemma's single key / value head cannot tell how keys are shared)."""
    built = {}
    for family in FAMILIES:
        model, processor = tiny_patch_model(family)
        model.eval()
        built[family] = (model, processor, PatchGroundingCollator(processor, model.config))
    config = copy.deepcopy(built["llava"][0].config)
    config.vision_feature_select_strategy = "full"
    config.image_seq_length = 17
    torch.manual_seed(0)
    processor = built["llava"][1]
    built["llava-full"] = (LlavaForConditionalGeneration(config).eval(), processor, PatchGroundingCollator(processor, config))
    config = copy.deepcopy(built["llava"][0].config)
    config.text_config.num_key_value_heads = 2
    built["llava-gqa"] = (LlavaForConditionalGeneration(config).eval(), processor, PatchGroundingCollator(processor, config))
    for model, _, _ in built.values():
        sharpen(model)
    return built


@pytest.fixture(scope="module")
def batches(tiny):
    return {family: collator(EXAMPLES) for family, (_, _, collator) in tiny.items()}


def image_token_mask(batch: dict) -> torch.Tensor:
    return torch.zeros_like(batch["attention_mask"], dtype=torch.bool).scatter(1, batch["image_positions"], True)


def gather_columns(probabilities: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(B, H, N, K) -> (B, H, N, P) at the (B, P) key positions."""
    index = columns[:, None, None, :].expand(*probabilities.shape[:-1], columns.shape[-1])
    return probabilities.gather(-1, index)


def renormalised(probabilities: torch.Tensor, columns: torch.Tensor, column_mask: torch.Tensor) -> torch.Tensor:
    """Attention probabilities restricted to the real keys at `columns` and re-normalised."""
    restricted = gather_columns(probabilities, columns) * column_mask[:, None, None, :]
    return restricted / restricted.sum(-1, keepdim=True)


def recorded_probabilities(recorder, layer: int, columns: torch.Tensor, column_mask: torch.Tensor) -> torch.Tensor:
    """softmax of the recorded logits restricted to the real keys at `columns`."""
    query, key = recorder.queries[layer], recorder.keys[layer]
    key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    logits = gather_columns(query @ key.transpose(-1, -2) * recorder.scaling, columns)
    return torch.softmax(logits.masked_fill(~column_mask[:, None, None, :], float("-inf")), dim=-1)


def token_targets(alignment: torch.Tensor, layout: PatchLayout) -> torch.Tensor:
    """(B, N, C) per-cell targets -> (B, N, P) per image token (by hand: token p shows cell cell_index[p])."""
    index = layout.cell_index.clamp(min=0)[:, None, :].expand(-1, alignment.shape[1], -1)
    per_token = alignment.gather(-1, index) * layout.patch_mask[:, None, :]
    sums = per_token.sum(-1, keepdim=True)
    return torch.where(sums > 0, per_token / sums.clamp(min=1e-12), torch.zeros_like(per_token))


def cross_entropy(probabilities: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over (heads x rows with target mass) of -sum t log p; probabilities (B, H, N, K), target (B, N, K)."""
    target = target[:, None].expand_as(probabilities)
    per_row = -torch.where(target > 0, target * probabilities.clamp(min=1e-30).log(), torch.zeros_like(target)).sum(-1)
    rows = target.sum(-1) > 0
    return per_row[rows].sum() / rows.sum()


def dense_alignment(batch: dict, sequence_length: int) -> torch.Tensor:
    """The collator's grounded rows expanded to (B, N, C) over the model's whole sequence of `sequence_length`
    positions, zeros for every other position (ViLT appends [CLS] and the patches to the text)."""
    alignment, positions = batch["word_cell_alignment"], batch["grounded_token_positions"]
    dense = torch.zeros(alignment.shape[0], sequence_length, alignment.shape[-1])
    return dense.scatter_add(1, positions[..., None].expand_as(alignment), alignment)


# ------------------------------------------------------------------------------------------------------ collator


@pytest.mark.parametrize("family", FAMILIES)
def test_phrase_tokens_and_their_alignment(tiny, batches, family):
    _, processor, _ = tiny[family]
    batch = batches[family]
    tokenizer = processor.tokenizer
    num_cells = GRIDS[family][0] * GRIDS[family][1]
    # the grounded tokens' rows only: A's 7 ("a skate ##board ##er", "the red box"), B's 3 and 4 padding rows
    assert batch["word_cell_alignment"].shape == (2, 7, num_cells)
    positions = batch["grounded_token_positions"]
    assert positions.shape == (2, 7) and positions.dtype == torch.long
    assert positions[1, 3:].tolist() == [0] * 4 and (batch["word_cell_alignment"][1, 3:] == 0).all()
    assert batch["phrase_token_index"].tolist()[1][1] == -1  # B has one phrase: the second slot is padding
    alignment = dense_alignment(batch, batch["input_ids"].shape[1])
    row_sums = alignment.sum(-1)
    for b, example in enumerate(EXAMPLES):
        grounded = set()
        for k, gold in enumerate(example["phrases"]):
            last = int(batch["phrase_token_index"][b, k])
            pieces = tokenizer.tokenize(gold["text"])
            # the phrase's last word piece ("##er" of "skateboarder")
            assert tokenizer.convert_ids_to_tokens(int(batch["input_ids"][b, last])) == pieces[-1]
            tokens = range(last - len(pieces) + 1, last + 1)
            assert tokenizer.convert_ids_to_tokens(batch["input_ids"][b, tokens.start : tokens.stop].tolist()) == pieces
            grounded.update(tokens)
            covered = COVERED[family][b][k]
            expected = torch.zeros(num_cells)
            expected[sorted(covered)] = 1.0 / len(covered)
            for token in tokens:
                torch.testing.assert_close(alignment[b, token], expected)
            coverage = batch["phrase_cell_coverage"][b, k]
            if len(covered) > 1:
                assert set((coverage >= 0.5).nonzero()[:, 0].tolist()) == covered
            else:  # the tiny box: below the threshold everywhere, its best cell takes the target
                assert float(coverage.max()) < 0.5 and int(coverage.argmax()) in covered
        expected_sums = torch.zeros(row_sums.shape[1])
        expected_sums[sorted(grounded)] = 1.0
        torch.testing.assert_close(row_sums[b], expected_sums)


def test_collator_targets_grow_with_the_cells_only():
    # a tiny LLaVA at 64 and 256 image tokens: the supervision targets hold the grounded tokens' rows x grid cells
    # (G x C), not sequence x cells ((T + P) x C), and no tensor of the batch but the pixels is that large
    shapes = {}
    for image_size in (128, 256):
        model, processor = tiny_patch_model("llava", image_size=image_size, hidden_size=16, num_layers=1)
        batch = PatchGroundingCollator(processor, model.config)(PROBE_EXAMPLES)
        cells, sequence_length = (image_size // 16) ** 2, batch["input_ids"].shape[1]
        assert batch["image_positions"].shape[1] == cells and sequence_length > cells
        shapes[cells] = batch["word_cell_alignment"].shape
        assert batch["grounded_token_positions"].shape == shapes[cells][:2]
        for key, value in batch.items():
            if key != "pixel_values":
                assert value.numel() < batch["input_ids"].numel() * cells / 4, key
    # "a dog" / "a cat" (2 + 2 word pieces) and "a cat": the same 4 rows at both sizes, 4 times the cells
    assert shapes == {64: (2, 4, 64), 256: (2, 4, 256)}


@pytest.mark.parametrize("family", DECODERS)
def test_image_tokens_sit_at_the_layout_positions(tiny, batches, family):
    model, _, _ = tiny[family]
    batch = batches[family]
    image_token = model.config.image_token_id
    assert batch["image_positions"].shape == (2, 16)
    assert (batch["input_ids"].gather(1, batch["image_positions"]) == image_token).all()
    assert ((batch["input_ids"] == image_token).sum(-1) == 16).all()
    assert (batch["image_positions"].diff(dim=1) == 1).all()  # one contiguous block, row-major cells
    assert batch["cell_index"].tolist() == [list(range(16))] * 2
    assert batch["patch_mask"].all()
    # no image token is grounded text
    grounded = batch["word_cell_alignment"].sum(-1) > 0  # the padding rows sit at position 0 (an image token here)
    assert not image_token_mask(batch).gather(1, batch["grounded_token_positions"])[grounded].any()


def test_paligemma_suffix_is_the_caption(tiny, batches):
    _, processor, _ = tiny["paligemma"]
    batch = batches["paligemma"]
    tokenizer = processor.tokenizer
    prefix = 16 + len(tokenizer.tokenize("caption en"))  # image tokens, then the task prompt (no BOS in this tokenizer)
    for b, example in enumerate(EXAMPLES):
        length = int(batch["attention_mask"][b].sum())
        suffix = torch.zeros(batch["input_ids"].shape[1], dtype=torch.long)
        suffix[prefix:length] = 1
        assert batch["token_type_ids"][b].tolist() == suffix.tolist()
        caption = tokenizer.convert_ids_to_tokens(batch["input_ids"][b, prefix:length].tolist())
        assert caption == tokenizer.tokenize(example["caption"]) + [tokenizer.sep_token]
        labels = batch["labels"][b]
        assert (labels[suffix.bool()] == batch["input_ids"][b, suffix.bool()]).all()
        assert (labels[~suffix.bool()] == -100).all()


def test_llava_labels_the_caption_only(tiny, batches):
    batch = batches["llava"]
    assert "token_type_ids" not in batch
    for b, example in enumerate(EXAMPLES):
        length = int(batch["attention_mask"][b].sum())
        start = int(batch["image_positions"][b, -1]) + 1  # no prompt by default
        labelled = (batch["labels"][b] != -100).nonzero()[:, 0].tolist()
        assert labelled == list(range(start, length))
        assert (batch["labels"][b, start:length] == batch["input_ids"][b, start:length]).all()


def test_llava_full_strategy_keeps_a_cls_token_that_is_no_cell(tiny, batches):
    full_model, _, _ = tiny["llava-full"]
    config = full_model.config
    batch = batches["llava-full"]
    assert ((batch["input_ids"] == config.image_token_id).sum(-1) == 17).all()
    assert batch["cell_index"][:, 0].tolist() == [-1, -1]
    assert batch["cell_index"][:, 1:].tolist() == [list(range(16))] * 2
    assert batch["patch_mask"][:, 0].tolist() == [False, False] and batch["patch_mask"][:, 1:].all()
    # the model agrees: CLIP's [CLS] and 16 patches fill the 17 `<image>` tokens
    with torch.no_grad():
        outputs, layout = forward_with_layout(full_model, batch)
    assert outputs.logits.shape[:2] == batch["input_ids"].shape
    assert layout.grid == (4, 4) and layout.cell_index[0, 0] == -1
    # per-cell values land on the tokens, the [CLS] gets the fill
    per_token = layout.to_tokens(torch.arange(16.0).expand(2, 16), fill=-5.0)
    assert per_token[:, 0].tolist() == [-5.0, -5.0] and per_token[0, 1:].tolist() == list(range(16))


@pytest.mark.parametrize("family", DECODERS)
def test_wrong_number_of_image_tokens_is_refused(tiny, batches, family):
    model, processor, _ = tiny[family]
    batch = batches[family]
    input_ids = batch["input_ids"].clone()
    input_ids[1, batch["image_positions"][1, 3]] = processor.tokenizer.pad_token_id
    with pytest.raises(ValueError, match=r"`input_ids` must hold one image of 16 `<image>` tokens.*\[16, 15\]"):
        patch_model_family(model).layout(model.config, input_ids, batch["pixel_values"])


def test_collator_and_family_errors(tiny):
    model, processor, collator = tiny["llava"]
    with pytest.raises(ValueError, match="`examples`"):
        collator([])
    with pytest.raises(ValueError, match="`caption`"):
        collator([{"image": EXAMPLES[0]["image"], "caption": " ", "phrases": []}])
    with pytest.raises(ValueError, match="`coverage_threshold`"):
        PatchGroundingCollator(processor, model.config, coverage_threshold=0.0)
    with pytest.raises(ValueError, match="`processor`"):
        PatchGroundingCollator(processor.tokenizer, model.config)
    with pytest.raises(ValueError, match="`model`.*model_type 'llama'"):
        patch_model_family(model.config.text_config)


def test_grounded_caption_examples_from_flickr30k_entities_files(tiny, tmp_path):
    paths = load_or_generate_synthetic_vgp(tmp_path / "cache", SyntheticSceneConfig(num_train_images=2, num_val_images=2, feature_dim=8))
    examples, counts = grounded_caption_examples(paths.flickr30k_entities, paths.images, "val")
    assert counts["images"] == 2 and counts["captions"] == len(examples) > 0
    assert counts["phrases"] == sum(len(example["phrases"]) for example in examples) > 0
    image_ids = {example["image_id"] for example in examples}
    assert len(image_ids) == 2 and image_ids <= {path.stem for path in paths.images.iterdir()}
    only_one, _ = grounded_caption_examples(paths.flickr30k_entities, paths.images, "val", max_images=1)
    assert len({example["image_id"] for example in only_one}) == 1
    # the phrases' boxes end up in the batch: square 128-pixel scenes are a plain resize onto the 64-pixel input
    _, _, collator = tiny["llava"]
    batch = collator(examples[:2])
    for b, example in enumerate(examples[:2]):
        assert Image.open(example["image_path"]).size == (128, 128)
        for k, gold in enumerate(example["phrases"]):
            assert gold["char_end"] > gold["char_start"] >= 0
            expected = cell_coverage(torch.tensor(gold["boxes"], dtype=torch.float32) / 128, (4, 4))
            torch.testing.assert_close(batch["phrase_cell_coverage"][b, k], expected)
    with pytest.raises(ValueError, match="`images_dir`"):
        grounded_caption_examples(paths.flickr30k_entities, tmp_path, "val")


# ---------------------------------------------------------------------------------------------------- ViLT layout


def test_vilt_samples_a_permutation_of_the_cells_and_each_token_carries_its_cell():
    model, processor = tiny_patch_model("vilt")
    model.eval()
    # without position embeddings an image token is its patch's projection plus the image token type
    with torch.no_grad():
        model.embeddings.position_embeddings.zero_()
    same_size = [dict(EXAMPLES[0], image=noise_image(96, 64, seed)) for seed in (2, 3)]
    batch = PatchGroundingCollator(processor, model.config)(same_size)
    base = model.embeddings
    patches = base.patch_embeddings(batch["pixel_values"]).flatten(2).transpose(1, 2)  # (B, C, D), row-major cells
    orders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        with torch.no_grad():
            outputs, layout = forward_with_layout(model, batch, output_hidden_states=True)
        assert layout.grid == (4, 6)
        text_length = batch["input_ids"].shape[1]
        assert layout.image_positions.tolist() == [list(range(text_length + 1, text_length + 25))] * 2
        assert layout.patch_mask.all()
        for b in range(2):
            assert sorted(layout.cell_index[b].tolist()) == list(range(24))
        embedded = outputs.hidden_states[0][:, text_length + 1 :] - base.token_type_embeddings.weight[1]
        expected = patches.gather(1, layout.cell_index[..., None].expand(-1, -1, patches.shape[-1]))
        torch.testing.assert_close(embedded, expected, rtol=1e-5, atol=1e-5)
        orders.append((layout.cell_index, outputs.last_hidden_state, text_length))
    # the order is sampled; the per-cell outputs do not depend on it
    (first, first_hidden, length), (second, second_hidden, _) = orders
    assert not torch.equal(first, second)
    torch.testing.assert_close(first_hidden[:, :length + 1], second_hidden[:, :length + 1], rtol=1e-5, atol=1e-5)
    for b in range(2):
        by_cell = [hidden[b, length + 1 :][order[b].argsort()] for order, hidden in ((first, first_hidden), (second, second_hidden))]
        torch.testing.assert_close(*by_cell, rtol=1e-5, atol=1e-5)


def test_vilt_padded_batch_marks_the_padding_patches(tiny, batches):
    model, _, _ = tiny["vilt"]
    batch = batches["vilt"]
    torch.manual_seed(0)
    with torch.no_grad():
        _, layout = forward_with_layout(model, batch)
    rows, columns = layout.grid
    assert (rows, columns) == (5, 6)
    # A (96 x 64): the first 4 rows; B (64 x 80): the first 4 columns
    real = [{r * columns + c for r in range(4) for c in range(6)}, {r * columns + c for r in range(5) for c in range(4)}]
    for b in range(2):
        cells = layout.cell_index[b][layout.patch_mask[b]].tolist()
        assert len(cells) == len(set(cells)) and set(cells) == real[b]
        assert not set(layout.cell_index[b][~layout.patch_mask[b]].tolist()) & real[b]


# ------------------------------------------------------------------------------------------------------ recording


@pytest.mark.parametrize("family", [*DECODERS, "llava-gqa"])
def test_recorder_matches_eager_attention_of_decoders(tiny, batches, family):
    model, _, _ = tiny[family]
    batch = batches[family]
    language_model = patch_model_family(model).language_model(model)
    before = language_model.config._attn_implementation
    with torch.no_grad():
        plain, _ = forward_with_layout(model, batch)
        with AttentionRecorder(model) as recorder:
            assert language_model.config._attn_implementation == before  # the model's own kernel runs
            recorded, layout = forward_with_layout(model, batch)
        assert language_model.config._attn_implementation == before
        with eager_attention(model):
            assert language_model.config._attn_implementation == "eager"
            eager, _ = forward_with_layout(model, batch, output_attentions=True)
        assert language_model.config._attn_implementation == before
    torch.testing.assert_close(recorded.logits, plain.logits)
    torch.testing.assert_close(eager.logits, plain.logits, rtol=1e-4, atol=1e-4)
    assert sorted(recorder.queries) == [0, 1] and recorder.scaling == pytest.approx(8 ** -0.5)
    text_rows = batch["attention_mask"].bool() & ~image_token_mask(batch)
    for layer in (0, 1):
        expected = renormalised(eager.attentions[layer], layout.image_positions, layout.patch_mask)
        actual = recorded_probabilities(recorder, layer, layout.image_positions, layout.patch_mask)
        mask = text_rows[:, None, :, None].expand_as(actual)
        torch.testing.assert_close(actual[mask], expected[mask], rtol=1e-4, atol=1e-5)


def test_recorder_restores_the_attention_after_an_error(tiny, batches):
    model, _, _ = tiny["llava"]
    language_model = patch_model_family(model).language_model(model)
    before = language_model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), AttentionRecorder(model, layers=[1]):
        raise RuntimeError("boom")
    assert language_model.config._attn_implementation == before
    # a recorder of layer 1 records layer 1 only
    with torch.no_grad(), AttentionRecorder(model, layers=[1]) as recorder:
        forward_with_layout(model, batches["llava"])
    assert sorted(recorder.queries) == [1] and sorted(recorder.keys) == [1]


def test_recorder_matches_eager_attention_of_vilt(tiny, batches):
    model, _, _ = tiny["vilt"]
    batch = batches["vilt"]
    with torch.no_grad():
        torch.manual_seed(0)
        plain, plain_layout = forward_with_layout(model, batch)
        torch.manual_seed(0)
        with AttentionRecorder(model) as recorder:
            recorded, layout = forward_with_layout(model, batch, output_attentions=True)
    assert torch.equal(plain_layout.cell_index, layout.cell_index)
    torch.testing.assert_close(recorded.last_hidden_state, plain.last_hidden_state)
    assert not model.encoder.layer[0].attention.attention.query._forward_hooks  # the hooks are gone
    text_length = batch["input_ids"].shape[1]
    text_mask = batch["attention_mask"].bool()
    text_columns = torch.arange(text_length).expand(2, -1)
    for layer in (0, 1):
        # text -> image, re-normalised over the real patches
        expected = renormalised(recorded.attentions[layer], layout.image_positions, layout.patch_mask)
        actual = recorded_probabilities(recorder, layer, layout.image_positions, layout.patch_mask)
        rows = torch.zeros(2, actual.shape[2], dtype=torch.bool)
        rows[:, :text_length] = text_mask
        mask = rows[:, None, :, None].expand_as(actual)
        torch.testing.assert_close(actual[mask], expected[mask], rtol=1e-4, atol=1e-5)
        # image -> text (eq. 7's direction), on the real patches' rows
        expected = renormalised(recorded.attentions[layer], text_columns, text_mask)
        actual = recorded_probabilities(recorder, layer, text_columns, text_mask)
        rows = torch.zeros(2, actual.shape[2], dtype=torch.bool).scatter(1, layout.image_positions, layout.patch_mask)
        mask = rows[:, None, :, None].expand_as(actual)
        torch.testing.assert_close(actual[mask], expected[mask], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- supervision


def eager_forward(model, batch, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad(), eager_attention(model):
        return forward_with_layout(model, batch, output_attentions=True)


def recorded_forward(model, batch, layers, seed=0):
    torch.manual_seed(seed)  # ViLT: the same patch order as `eager_forward`'s
    with AttentionRecorder(model, layers=layers) as recorder:
        outputs, layout = forward_with_layout(model, batch)
    return recorder, outputs, layout


def hand_text_to_image(attentions, batch, layout, layers, heads=None):
    """Direct text->image loss from eager attention maps: mean over layers, heads and grounded rows."""
    alignment = dense_alignment(batch, attentions[0].shape[-1])
    target = token_targets(alignment, layout)
    heads = slice(None) if heads is None else heads
    losses = [cross_entropy(renormalised(attentions[layer], layout.image_positions, layout.patch_mask)[:, heads], target)
              for layer in layers]  # fmt: skip
    return torch.stack(losses).mean()


@pytest.mark.parametrize(
    ("family", "layers", "heads"),
    [
        ("vilt", [1], None), ("vilt", [0, 1], [0, 2]), ("llava", [1], None), ("llava", [0, 1], [0, 2]),
        ("paligemma", [0, 1], [0, 2]), ("llava-full", [1], None), ("llava-gqa", [1], None), ("llava-gqa", [0, 1], [1, 3]),
    ],
)  # fmt: skip
def test_direct_loss_equals_a_hand_computation(tiny, batches, family, layers, heads):
    model, _, _ = tiny[family]
    batch = batches[family]
    eager, eager_layout = eager_forward(model, batch)
    recorder, _, layout = recorded_forward(model, batch, layers)
    assert torch.equal(layout.cell_index, eager_layout.cell_index)
    loss = patch_attention_loss(recorder, batch, layout, method="direct", heads=heads)
    text_to_image = hand_text_to_image(eager.attentions, batch, layout, layers, heads)
    if family != "vilt":
        torch.testing.assert_close(loss, text_to_image, rtol=1e-4, atol=1e-5)
        return
    # ViLT adds eq. (7): each covered patch's attention over the text, target = its alignment column re-normalised
    text_length = batch["input_ids"].shape[1]
    target = token_targets(dense_alignment(batch, eager.attentions[0].shape[-1]), layout).transpose(1, 2)[..., :text_length]
    sums = target.sum(-1, keepdim=True)
    target = torch.where(sums > 0, target / sums.clamp(min=1e-12), target)
    text_columns = torch.arange(text_length).expand(2, -1)
    image_rows = layout.image_positions[:, None, :, None].expand(-1, 4, -1, text_length)
    losses = []
    for layer in layers:
        probabilities = renormalised(eager.attentions[layer], text_columns, batch["attention_mask"].bool())
        selected = probabilities.gather(2, image_rows)
        losses.append(cross_entropy(selected if heads is None else selected[:, heads], target))
    image_to_text = torch.stack(losses).mean()
    assert float(image_to_text) > 0.1
    torch.testing.assert_close(loss, text_to_image + image_to_text, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", DECODERS)
def test_num_rows_rescales_the_direct_loss(tiny, batches, family):
    model, _, _ = tiny[family]
    batch = batches[family]
    recorder, _, layout = recorded_forward(model, batch, [0, 1])
    local = grounded_token_count(batch["word_cell_alignment"])
    assert int(local) == 4 + 3 + 3  # "a skate ##board ##er", "the red box", "two small cats"
    mean = patch_attention_loss(recorder, batch, layout)
    global_count = local + 7
    rescaled = patch_attention_loss(recorder, batch, layout, num_rows=global_count)
    torch.testing.assert_close(rescaled, mean * local / global_count)
    semi = patch_attention_loss(recorder, batch, layout, method="semi_direct")
    torch.testing.assert_close(
        patch_attention_loss(recorder, batch, layout, method="semi_direct", num_rows=global_count), semi * local / global_count
    )


@pytest.mark.parametrize("family", ["llava", "vilt"])
def test_direct_loss_trains_the_supervised_layer_projections(tiny, batches, family):
    model, _, _ = tiny[family]
    batch = batches[family]
    model.zero_grad(set_to_none=True)
    try:
        recorder, _, layout = recorded_forward(model, batch, [0])
        loss = patch_attention_loss(recorder, batch, layout, method="direct")
        assert loss.requires_grad
        loss.backward()
        if family == "llava":
            first, second = (layer.self_attn for layer in model.model.language_model.layers)
            query, key, value, later = first.q_proj, first.k_proj, first.v_proj, second.q_proj
            upstream = model.model.multi_modal_projector.linear_1  # the image tokens' keys come from the projector
        else:
            first, second = (layer.attention.attention for layer in model.encoder.layer)
            query, key, value, later = first.query, first.key, first.value, second.query
            upstream = model.embeddings.patch_embeddings.projection
        for module in (query, key, upstream):
            assert module.weight.grad is not None and float(module.weight.grad.abs().sum()) > 0
        # layer 0's logits depend neither on its values nor on any later layer
        for module in (value, later):
            assert module.weight.grad is None or float(module.weight.grad.abs().sum()) == 0
    finally:
        model.zero_grad(set_to_none=True)


def hand_rollout(attentions, heads=None):
    rollouts, rollout = [], None
    for probabilities in attentions:
        mixed = (probabilities if heads is None else probabilities[:, heads]).mean(1)
        mixed = mixed + torch.eye(mixed.shape[-1])
        mixed = mixed / mixed.sum(-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
        rollouts.append(rollout)
    return rollouts


@pytest.mark.parametrize(
    ("family", "num_examples"), [("vilt", 2), ("llava", 2), ("llava", 1), ("paligemma", 2), ("llava-full", 2), ("llava-gqa", 2)]
)
def test_semi_direct_loss_equals_a_rollout_of_eager_attention(tiny, family, num_examples):
    # one LLaVA example: no padding, the layers get no mask (plain causal attention) and the loss rebuilds it;
    # "llava-full": the [CLS] image token gets rollout mass but is no cell, the loss must leave it out
    model, _, collator = tiny[family]
    batch = collator(EXAMPLES[:num_examples])
    eager, _ = eager_forward(model, batch)
    recorder, _, layout = recorded_forward(model, batch, [0, 1])
    loss = patch_attention_loss(recorder, batch, layout, method="semi_direct", layers=[1])
    both = patch_attention_loss(recorder, batch, layout, method="semi_direct", layers=[0, 1])
    assert torch.isfinite(loss) and torch.isfinite(both) and loss.requires_grad
    target = token_targets(dense_alignment(batch, eager.attentions[0].shape[-1]), layout)
    text_length = batch["input_ids"].shape[1]
    image_target = target.transpose(1, 2)[..., :text_length]
    sums = image_target.sum(-1, keepdim=True)
    image_target = torch.where(sums > 0, image_target / sums.clamp(min=1e-12), image_target)
    expected = []
    for rollout in hand_rollout(eager.attentions):
        text_to_image = gather_columns(rollout[:, None], layout.image_positions) * layout.patch_mask[:, None, None, :]
        term = cross_entropy(text_to_image / text_to_image.sum(-1, keepdim=True), target)
        if family == "vilt":  # eq. (7) on rollout: each covered patch's rollout over the text tokens
            image_rows = layout.image_positions[:, :, None].expand(-1, -1, rollout.shape[-1])
            image_to_text = rollout.gather(1, image_rows)[..., :text_length] * batch["attention_mask"][:, None, :]
            term = term + cross_entropy((image_to_text / image_to_text.sum(-1, keepdim=True))[:, None], image_target)
        expected.append(term)
    torch.testing.assert_close(loss, expected[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(both, (expected[0] + expected[1]) / 2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("family", "num_examples", "heads"),
    [("llava", 2, None), ("llava", 1, [1, 3]), ("llava-gqa", 2, None), ("paligemma", 2, [0, 2]), ("vilt", 2, None)],
)
def test_semi_direct_supervised_rows_equal_the_full_rollout(tiny, monkeypatch, family, num_examples, heads):
    # LLaVA causal (one example: no mask recorded), PaliGemma's prefix-LM mask, ViLT with eq. (7)'s image rows; chunks
    # of 8 query rows so that every layer's map is cut into several checkpointed chunks
    monkeypatch.setattr(supervision, "ROLLOUT_CHUNK_ROWS", 8)
    model, _, collator = tiny[family]
    batch = collator(EXAMPLES[:num_examples])
    recorder, _, layout = recorded_forward(model, batch, [0, 1])
    recorded = [recorder.queries[0], recorder.keys[0], recorder.queries[1], recorder.keys[1]]
    assert recorded[0].shape[2] > 2 * 8
    losses, gradients = {}, {}
    for rollout in ("full", "supervised_rows"):
        loss = patch_attention_loss(
            recorder, batch, layout, method="semi_direct", layers=[0, 1], heads=heads, semi_direct_rollout=rollout
        )
        losses[rollout], gradients[rollout] = loss, torch.autograd.grad(loss, recorded, retain_graph=True)
    assert float(losses["full"].detach()) > 0.1
    torch.testing.assert_close(losses["supervised_rows"], losses["full"], rtol=0, atol=1e-6)
    for rows, full in zip(gradients["supervised_rows"], gradients["full"]):
        assert float(full.abs().max()) > 1e-4
        torch.testing.assert_close(rows, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["direct", "semi_direct"])
def test_supervision_saves_nothing_of_sequence_by_image_size(method):
    # memory linear in the image tokens: on a LLaVA of 256 image tokens, no tensor the loss saves for the backward (its
    # targets, gathered queries / keys, rollout rows) holds sequence x image tokens values per example, as a target
    # or logits over every row, or a (sequence x sequence) attention map, would. The (B, 1, N, N) mask the model made
    # for its own attention (and sdpa saves) is the model's, not counted.
    model, processor = tiny_patch_model("llava", image_size=256, patch_size=16, hidden_size=16, num_layers=2)
    batch = PatchGroundingCollator(processor, model.config)(PROBE_EXAMPLES)
    recorder, _, layout = recorded_forward(model, batch, [0, 1])
    sequence_length = batch["input_ids"].shape[1]
    models_masks = {mask.untyped_storage().data_ptr() for mask in recorder.masks.values() if mask is not None}
    assert models_masks  # two examples, padded: the layers got a mask
    saved = []

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in models_masks:
            saved.append(tensor.numel() // tensor.shape[0] if tensor.dim() else 1)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = patch_attention_loss(recorder, batch, layout, method=method, layers=[0, 1])
    loss.backward()
    assert saved and layout.image_positions.shape[1] == 256
    assert max(saved) < sequence_length * 256 / 2


def test_semi_direct_rollout_is_checked(tmp_path):
    with pytest.raises(ValueError, match="`semi_direct_rollout` must be one of"):
        patch_attention_loss(None, {}, None, method="semi_direct", semi_direct_rollout="rows")
    with pytest.raises(ValueError, match=r"`semi_direct_rollout` must be one of \('supervised_rows', 'full'\), got 'rows'"):
        PatchSupervisionTrainingArguments(output_dir=str(tmp_path), semi_direct_rollout="rows", report_to=[])


# ---------------------------------------------------------------------------------------------------------- probe

CAPTION_P = "A dog in the middle and a cat in the corner ."
# a square image: every family sees the same 4 x 4 grid; the dog covers the four central cells, the cat cell 0
PROBE_EXAMPLES = [
    {"image": noise_image(64, 64, 4), "caption": CAPTION_P,
     "phrases": [phrase(CAPTION_P, "A dog", [[16, 16, 48, 48]]), phrase(CAPTION_P, "a cat", [[0, 0, 16, 16]])]},
    {"image": noise_image(64, 64, 5), "caption": "A cat .",
     "phrases": [phrase("A cat .", "A cat", [[48, 0, 64, 16]])]},
]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_probe_runs_on_every_family(tiny, family):
    model, _, collator = tiny[family]
    batches = [collator(PROBE_EXAMPLES), collator(PROBE_EXAMPLES[:1])]
    language_model = None if family == "vilt" else patch_model_family(model).language_model(model)
    before = None if language_model is None else language_model.config._attn_implementation
    model.train()
    try:
        result = probe_patch_model(model, batches)
        assert model.training  # the mode is restored
    finally:
        model.eval()
    if language_model is not None:
        assert language_model.config._attn_implementation == before
    assert result.accuracy.shape == (2, 4)
    assert result.num_phrases == 3 + 2 == sum(int((batch["phrase_token_index"] >= 0).sum()) for batch in batches)
    assert ((result.accuracy * 5) == (result.accuracy * 5).round()).all()
    # the centre baseline predicts a central cell: right for the dog, wrong for the cats
    assert result.baseline_accuracy == pytest.approx(2 / 5)
    assert result.active_share is not None and ((result.active_share > 0) & (result.active_share <= 1 + 1e-6)).all()


@pytest.mark.parametrize("family", [*DECODERS, "llava-full"])
def test_probe_finds_a_planted_grounding_head(tiny, family):
    model, _, collator = tiny[family]
    batch = collator(PROBE_EXAMPLES)
    phrases = (batch["phrase_token_index"] >= 0).nonzero().tolist()
    has_cls = family == "llava-full"

    def position(b, cell):
        return int(batch["image_positions"][b][batch["cell_index"][b] == cell])

    def plant(module, args, output):
        # layer 1: head 2 attends from each phrase to a covered patch, head 3 to an uncovered one; with a [CLS]
        # image token, that token draws the most attention of both heads (it is no cell: the probe must skip it)
        attention = output[1].clone()
        for b, k in phrases:
            token, coverage = int(batch["phrase_token_index"][b, k]), batch["phrase_cell_coverage"][b, k]
            for head, cell in ((2, int(coverage.argmax())), (3, int(coverage.argmin()))):
                attention[b, head, token] = 0.0
                attention[b, head, token, position(b, cell)] = 0.4 if has_cls else 0.9
                attention[b, head, token, token] = 0.1
                if has_cls:
                    attention[b, head, token, position(b, -1)] = 0.5
        return output[0], attention, *output[2:]

    # the probe reads each layer's map as its attention module returns it: a hook registered first plants it
    handle = patch_model_family(model).attention_modules(model)[1].register_forward_hook(plant)
    try:
        result = probe_patch_model(model, [batch])
    finally:
        handle.remove()
    assert result.num_phrases == 3
    assert result.accuracy[1, 2] == 1.0 and result.accuracy[1, 3] == 0.0
    # the share on the image counts the cells only
    share = 0.4 if has_cls else 0.9
    assert result.active_share[1, 2] == pytest.approx(share) and result.active_share[1, 3] == pytest.approx(share)
    assert result.best_head_accuracy == 1.0
    assert result.baseline_accuracy == pytest.approx(1 / 3)


def test_probe_pieces_ignore_a_cls_token_and_score_the_centre_baseline():
    """Hand-made attention maps through `patch_attention_rows` and `GroundingProbe`, as `probe_patch_model` feeds
    them: a LLaVA "full" layout whose [CLS] (no cell) draws the most attention must not be predicted."""
    grid = (2, 2)
    # one example: 2 text tokens, then [CLS] + 4 patches at positions 2..6, then one more text token
    image_positions = torch.tensor([[2, 3, 4, 5, 6]])
    layout = PatchLayout(image_positions, torch.tensor([[-1, 0, 1, 2, 3]]), torch.tensor([[False, True, True, True, True]]), grid)
    length = 8
    attention = torch.full((1, 2, length, length), 0.0)
    # the phrase is token 1: head 0 -> mostly [CLS], then cell 3 (covered); head 1 -> cell 0 (not covered)
    attention[0, 0, 1, [2, 6, 0]] = torch.tensor([0.5, 0.3, 0.2])
    attention[0, 1, 1, [3, 0]] = torch.tensor([0.6, 0.4])
    rows = patch_attention_rows((attention,), image_positions)
    assert rows.shape == (1, 1, 2, length, 5)
    torch.testing.assert_close(rows[0, 0, 0, 1], torch.tensor([0.5, 0.0, 0.0, 0.0, 0.3]))
    coverage = torch.tensor([[[0.0, 0.0, 0.0, 1.0]]])  # the phrase covers cell 3 (bottom right)
    probe = GroundingProbe(1, 2, iou_threshold=0.5)
    centre = torch.tensor([[0.0, -1.0, -1.0, -2.0]])  # a baseline preferring cell 0
    probe.update_from_text_to_region(
        rows, torch.tensor([[1]]), layout.to_tokens(coverage), layout.patch_mask, layout.to_tokens(centre, fill=5.0)
    )
    result = probe.compute()
    assert result.accuracy.tolist() == [[1.0, 0.0]]
    assert result.baseline_accuracy == 0.0  # the [CLS]'s fill of 5 is masked: the baseline picks cell 0
    # the share on the image counts the real patches only (the [CLS] is no cell)
    assert result.active_share[0].tolist() == pytest.approx([0.3, 0.6])


# ---------------------------------------------------------------------------------- the old, dense path as reference


def normalised(matrix: torch.Tensor) -> torch.Tensor:
    sums = matrix.sum(-1, keepdim=True)
    return torch.where(sums > 0, matrix / sums.clamp(min=1e-12), torch.zeros_like(matrix))


def soft_ce(log_probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over (heads x rows with target mass) of -sum t log p; log_probs (B, H, N, K), target (B, N, K)."""
    target = target[:, None].expand_as(log_probs)
    per_row = -torch.where(target > 0, target * log_probs, torch.zeros_like(target)).sum(-1)
    return per_row.sum() / ((target.sum(-1) > 0).sum())


def dense_reference_loss(recorder, batch, layout, method, layers, heads):
    """`patch_attention_loss` computed the literal way from the dense (B, N, C) alignment over every sequence position:
    every row's logits or rollout over the whole sequence, the loss read at the rows with target mass."""
    query = recorder.queries[layers[0]]
    batch_size, length = query.shape[0], query.shape[2]
    target = token_targets(dense_alignment(batch, length), layout)  # (B, N, P)
    attention_mask = batch["attention_mask"].bool()
    vilt = recorder.family.image_attends_to_text
    if vilt:  # [text; image [CLS]; patches]
        padding = length - attention_mask.shape[1]
        key_mask = torch.cat([attention_mask, torch.ones(batch_size, 1, dtype=torch.bool), layout.patch_mask], 1)
        text_mask = torch.nn.functional.pad(attention_mask, (0, padding))
    else:
        key_mask, text_mask = attention_mask, attention_mask & ~image_token_mask(batch)
    image_target = normalised(target.transpose(1, 2) * text_mask[:, None, :])  # (B, P, N), eq. (7)
    selected = slice(None) if heads is None else heads

    def logits(layer):
        query, key = recorder.queries[layer], recorder.keys[layer]
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        return query @ key.transpose(-1, -2) * recorder.scaling

    minimum = torch.finfo(torch.float32).min
    image_rows = layout.image_positions[:, None, :, None]
    losses = []
    if method == "direct":
        for layer in layers:
            scores = logits(layer)[:, selected]
            to_image = gather_columns(scores, layout.image_positions).masked_fill(~layout.patch_mask[:, None, None, :], minimum)
            loss = soft_ce(torch.log_softmax(to_image, -1), target)
            if vilt:
                to_text = torch.log_softmax(scores.masked_fill(~text_mask[:, None, None, :], minimum), -1)
                to_text = to_text.gather(2, image_rows.expand(-1, to_text.shape[1], -1, length))
                loss = loss + soft_ce(to_text, image_target)
            losses.append(loss)
        return torch.stack(losses).mean()
    probabilities = []
    for layer in range(max(layers) + 1):
        mask = recorder.masks[layer]
        if mask is not None:
            allowed = mask if mask.dtype == torch.bool else mask > minimum / 2
        else:
            allowed = key_mask[:, None, None, :].expand(-1, 1, length, -1)
            if not vilt:
                allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
        probabilities.append(torch.softmax(logits(layer).masked_fill(~allowed, minimum), -1))
    rollouts = hand_rollout(probabilities, heads)
    for layer in layers:
        rollout = rollouts[layer][:, None]  # (B, 1, N, N)
        to_image = gather_columns(rollout, layout.image_positions) * layout.patch_mask[:, None, None, :]
        loss = soft_ce(torch.log(normalised(to_image).clamp(min=1e-12)), target)
        if vilt:
            to_text = rollout.gather(2, image_rows.expand(-1, 1, -1, length)) * text_mask[:, None, None, :]
            loss = loss + soft_ce(torch.log(normalised(to_text).clamp(min=1e-12)), image_target)
        losses.append(loss)
    return torch.stack(losses).mean()


@pytest.mark.parametrize(
    ("family", "method", "heads"),
    [
        (family, method, heads)
        for family in FAMILIES
        for method in ("direct", "semi_direct:full", "semi_direct:supervised_rows")
        for heads in (None, [0, 2])
    ]
    + [("llava-gqa", "direct", [1, 3]), ("llava-full", "semi_direct:supervised_rows", None)],
)
def test_losses_and_gradients_equal_the_dense_path(tiny, monkeypatch, family, method, heads):
    # the compact batch (the grounded rows only) gives the losses and gradients of the literal computation from the
    # dense alignment over every sequence position, within 1e-6; chunks of 8 rows cut each map into several
    monkeypatch.setattr(supervision, "ROLLOUT_CHUNK_ROWS", 8)
    model, _, collator = tiny[family]
    batch = collator(EXAMPLES)
    recorder, _, layout = recorded_forward(model, batch, [0, 1])
    recorded = [recorder.queries[0], recorder.keys[0], recorder.queries[1], recorder.keys[1]]
    method, _, rollout = method.partition(":")
    loss = patch_attention_loss(
        recorder, batch, layout, method=method, layers=[0, 1], heads=heads, semi_direct_rollout=rollout or "full"
    )
    expected = dense_reference_loss(recorder, batch, layout, method, [0, 1], heads)
    assert float(expected.detach()) > 0.1
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
    gradients = torch.autograd.grad(loss, recorded, retain_graph=True)
    for actual, reference in zip(gradients, torch.autograd.grad(expected, recorded)):
        assert float(reference.abs().max()) > 1e-4
        torch.testing.assert_close(actual, reference, rtol=0, atol=1e-6)

