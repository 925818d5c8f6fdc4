"""The issue's acceptance on every family's saved tiny folder (`tiny_family_folders`, `one_grid_family_folders`), the
CLI called in process: `explore` and `analyze` on every family, `localization-heads` on a RefCOCO-layout file for
every decoder family (ViLT refused by name), the `word-region-attention` pipeline on a multi-view family, and the
attention the supervision reads (recorded query / key under the recorded mask) against eager `output_attentions`
for every decoder family: Gemma 3's image blocks attend bidirectionally (`token_type_ids`), the others causally."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import pipeline

from hf_vlalign.analysis.explorer import read_explorer_payload, stored_maps
from hf_vlalign.cli import main
from hf_vlalign.vlms import (
    AttentionRecorder,
    PatchGroundingCollator,
    eager_attention,
    forward_with_layout,
    patch_attention_loss,
)
from hf_vlalign.vlms.families import model_inputs
from hf_vlalign.vlms.loading import load_patch_model
from hf_vlalign.vlms.localization_heads import DECODER_MODEL_TYPES
from hf_vlalign.vlms.supervision import _layer_probabilities
from hf_vlalign.vlms.tiny import MULTIVIEW_FAMILIES, tiny_patch_model, word_level_tokenizer

SCENES = ["--synthetic_train_images", "12", "--synthetic_eval_images", "6"]
ONE_GRID_FAMILIES = ("vilt", "llava", "paligemma")
EVERY_FAMILY = (*ONE_GRID_FAMILIES, *MULTIVIEW_FAMILIES)


@pytest.fixture(scope="module")
def folders(tiny_family_folders, synthetic_captions, tmp_path_factory):
    """model_type -> saved folder of every family: the multi-view ones of the session and the three one-grid ones."""
    train, evaluation = synthetic_captions
    tokenizer = word_level_tokenizer(example["caption"] for example in [*train, *evaluation])
    saved = dict(tiny_family_folders)
    for family in ONE_GRID_FAMILIES:
        model, processor = tiny_patch_model(family, tokenizer=tokenizer, seed=3)
        saved[family] = tmp_path_factory.mktemp(family)
        model.save_pretrained(saved[family])
        processor.save_pretrained(saved[family])
    return saved


def real_image_tokens(folder, examples) -> list[int]:
    """The image tokens of each example that lie in a view, boxes of some area (the explorer's regions)."""
    model, processor = load_patch_model(str(folder))
    boxes = PatchGroundingCollator(processor, model.config, with_labels=False)(examples)["image_cell_boxes"]
    return (torch.nan_to_num(boxes[..., 2] - boxes[..., 0]) > 0).sum(-1).tolist()


@pytest.mark.parametrize("model_type", EVERY_FAMILY)
def test_explore_draws_every_views_token_boxes_over_the_original_image(folders, synthetic_captions, tmp_path, model_type):
    page = tmp_path / "explorer.html"
    argv = ["explore", str(folders[model_type]), *SCENES, "--out", str(page), "--num_examples", "2", "--probe_examples", "4"]
    assert main(argv) == 0
    data = read_explorer_payload(page)
    assert data["source"] == model_type and len(data["examples"]) == 2
    _, evaluation = synthetic_captions
    counts = real_image_tokens(folders[model_type], evaluation[:2])
    for example, caption, count in zip(data["examples"], evaluation[:2], counts, strict=True):
        # multi-view: the original image under every view's token boxes; one grid: the processed 64-pixel image
        original = list(Image.open(caption["image_path"]).size)
        assert example["size"] == (original if model_type in MULTIVIEW_FAMILIES else [64, 64])
        boxes = torch.tensor(example["regions"])
        assert boxes.shape == (count, 4) and (boxes >= 0).all() and (boxes <= 1).all()
        # the views together cover the whole (square) image: the thumbnail / base view, or the tiles
        assert boxes[:, :2].min(0).values.tolist() == [0.0, 0.0] and boxes[:, 2:].max(0).values.tolist() == [1.0, 1.0]
        maps = stored_maps(example["attention"]["word_to_region"])
        assert maps.shape == (len(data["views"]["word_to_region"]["heads"]), len(example["words"]), count)
        assert example["gold"]


@pytest.mark.parametrize("model_type", EVERY_FAMILY)
def test_analyze_writes_the_probe_and_its_plots(folders, tmp_path, model_type):
    out = tmp_path / "analysis"
    assert main(["analyze", str(folders[model_type]), *SCENES, "--out", str(out)]) == 0
    report = json.loads((out / "analysis.json").read_text())
    assert report["model_family"] == model_type and report["num_examples"] == 30
    probe = report["grounding_probe"]
    assert len(probe["accuracy"]) == 2 and len(probe["accuracy"][0]) == 4 and probe["num_phrases"] > 0
    for name in ("grounding_probe.png", "best_head_attention.png"):  # the latter: every token's box over the image
        assert (out / name).stat().st_size > 10_000


@pytest.fixture(scope="module")
def refcoco_file(synthetic_captions, tmp_path_factory):
    """A RefCOCO-layout file (image, expression, box in pixels) of 6 synthetic-scene phrases."""
    _, evaluation = synthetic_captions
    rows = [
        {"image": str(example["image_path"]), "expression": example["caption"][p["char_start"] : p["char_end"]], "box": p["boxes"][0]}
        for example in evaluation[:3] for p in example["phrases"][:2]
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("refcoco") / "refcoco.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("model_type", DECODER_MODEL_TYPES)
def test_localization_heads_select_and_ground_on_a_refcoco_file(folders, refcoco_file, tmp_path, capsys, model_type):
    out = tmp_path / "heads"
    argv = ["localization-heads", str(folders[model_type]), "--data", "user_file", "--data_file", str(refcoco_file),
            "--selection_samples", "3", "--excluded_layers", "0", "--batch_size", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    scores = json.loads((out / "grounding_scores.json").read_text())
    assert printed["num_examples"] == scores["num_examples"] == 3 and scores["flat_maps"] == 0
    selection = json.loads((out / "localization_heads.json").read_text())
    # at most 3 heads: those above the elbow of the image attention, among each sample's 10 of lowest entropy
    selected = [[head["layer"], head["head"]] for head in selection["heads"] if head["selected"]]
    assert len(selection["heads"]) == 2 * 4 and sorted(scores["selected_heads"]) == sorted(selected)
    assert 1 <= len(selected) <= 3 and 0.0 <= scores["accuracy"] <= 1.0
    # each predicted box: a box of cells inside the 128-pixel image
    boxes = torch.tensor(scores["predicted_boxes"])
    assert boxes.shape == (3, 4) and (boxes[:, 2:] > boxes[:, :2]).all() and (boxes >= 0).all() and (boxes <= 128).all()
    assert (out / "localization_heads.png").stat().st_size > 10_000


def test_localization_heads_refuse_vilt_naming_it(folders, refcoco_file, tmp_path, capsys):
    argv = ["localization-heads", str(folders["vilt"]), "--data", "user_file", "--data_file", str(refcoco_file),
            "--selection_samples", "3", "--out", str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit):
        main(argv)
    assert "ViLT is an encoder, got a ViltModel" in capsys.readouterr().err


def test_the_pipeline_reads_a_multi_view_folder(folders, synthetic_captions, tmp_path):
    """Idefics3: tiles and a global view; the pipeline's boxes are the image tokens' boxes of all views."""
    _, evaluation = synthetic_captions
    example = evaluation[0]
    reader = pipeline("word-region-attention", model=str(folders["idefics3"]))
    result = reader(example["image_path"], text=example["caption"], top_k=2, explorer=tmp_path / "page.html")
    assert [word["word"] for word in result["words"]] == example["caption"].split()
    boxes = torch.tensor(result["region_boxes"])
    model, processor = load_patch_model(str(folders["idefics3"]))
    collator = PatchGroundingCollator(processor, model.config, with_labels=False, return_details=True)
    token_map = collator([{"image": Image.open(example["image_path"]), "caption": example["caption"], "phrases": []}])["details"][0]["token_map"]
    torch.testing.assert_close(boxes, token_map.token_boxes())
    assert len(token_map.views) > 1 and token_map.views[-1].name == "global"
    weights = torch.tensor([word["weights"] for word in result["words"]])
    assert torch.allclose(weights.sum(-1), torch.ones(len(weights)), atol=1e-5)
    assert read_explorer_payload(tmp_path / "page.html")["source"] == "idefics3"


@pytest.mark.parametrize("model_type", DECODER_MODEL_TYPES)
@pytest.mark.parametrize("num_examples", [1, 2])
def test_the_supervision_reads_the_mask_the_model_applies(folders, synthetic_captions, model_type, num_examples):
    """The probabilities the supervision computes from the recorded query / key under the recorded mask (sdpa, the
    default) are eager's `output_attentions` on every real row: Gemma 3's bidirectional image blocks included, with
    (2 examples) and without (1 example) padding."""
    model, processor = load_patch_model(str(folders[model_type]))
    train, _ = synthetic_captions
    batch = PatchGroundingCollator(processor, model.config)(train[:num_examples])
    with torch.no_grad(), AttentionRecorder(model) as recorder:
        _, layout = forward_with_layout(model, batch)
    with torch.no_grad(), eager_attention(model):
        attentions = model(**model_inputs(batch), output_attentions=True).attentions
    if model_type in ("gemma3", "paligemma"):  # some query sees a later key: the mask the model applies is recorded
        assert recorder.masks[0] is not None and bool(recorder.masks[0][:, 0].triu(1).any())
    real_rows = batch["attention_mask"].bool()[:, None, :, None]
    for layer in recorder.layers:
        recorded = _layer_probabilities(recorder, layer, batch["attention_mask"], causal=not recorder.family.image_attends_to_text)
        torch.testing.assert_close(recorded * real_rows, attentions[layer] * real_rows, rtol=1e-5, atol=1e-6)
    # the semi-direct rollout of the supervised rows alone (its own masking of each row) is the full rollout's
    rollouts = [patch_attention_loss(recorder, batch, layout, "semi_direct", semi_direct_rollout=kind) for kind in ("full", "supervised_rows")]
    assert float(rollouts[0]) > 0
    torch.testing.assert_close(rollouts[1], rollouts[0], rtol=0, atol=1e-6)
