"""`pipeline("word-region-attention", model=DIR)`: a tiny single-stream and two-stream model saved with its processor
to a folder, loaded offline; whole words, each word's weights over the regions (mean over heads of one layer), top
boxes in pixels, the explorer page; the captioner refused."""

from __future__ import annotations

import matplotlib.cbook
import pytest
import torch
from analysis_models import tiny_family_model
from transformers import AutoTokenizer, pipeline

import hf_vlalign  # noqa: F401  (registers the pipeline task)
from hf_vlalign import default_text_model_path
from hf_vlalign.analysis.adapters import attention_blocks
from hf_vlalign.analysis.explorer import read_explorer_payload
from hf_vlalign.processing import RegionFeatureExtractor, VLAlignProcessor, WordRegionAttentionPipeline

PHOTO = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)  # 512 x 600 pixels
CAPTION = "a trailblazer in uniform"  # "trailblazer" is three word pieces: trail ##bla ##zer


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


def _saved(family: str, tokenizer, folder):
    model = tiny_family_model(family, tokenizer)
    extractor = RegionFeatureExtractor(grid_size=2, include_whole_image=True, feature_dim=model.config.visual_feat_dim)
    model.save_pretrained(folder)
    VLAlignProcessor(extractor, tokenizer).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_dirs(tokenizer, tmp_path_factory):
    return {family: _saved(family, tokenizer, tmp_path_factory.mktemp(family)) for family in ("single_stream", "two_stream")}


@pytest.mark.parametrize("family", ["single_stream", "two_stream"])
def test_each_word_gets_its_region_weights_and_top_boxes(family, model_dirs, tokenizer):
    grounder = pipeline("word-region-attention", model=str(model_dirs[family]))
    assert isinstance(grounder, WordRegionAttentionPipeline)
    result = grounder(PHOTO, text=CAPTION, top_k=2)
    assert [word["word"] for word in result["words"]] == ["a", "trailblazer", "in", "uniform"]
    assert len(result["words"][1]["tokens"]) == len(tokenizer.tokenize("trailblazer")) > 1
    assert result["region_boxes"][0] == [0.0, 0.0, 512.0, 600.0] and len(result["region_boxes"]) == 5
    for word in result["words"]:
        assert len(word["weights"]) == 5 and sum(word["weights"]) == pytest.approx(1.0, abs=1e-5)
        top = word["top_boxes"]
        assert len(top) == 2 and top[0]["weight"] >= top[1]["weight"]
        assert top[0]["weight"] == pytest.approx(max(word["weights"]))
        assert top[0]["box"] == result["region_boxes"][top[0]["region"]]

    # the weights are the model's own: the last layer's word -> region rows, renormalised, mean over heads
    processor, model = grounder.processor, grounder.model
    inputs = processor(images=PHOTO, text=CAPTION)
    with torch.no_grad():
        outputs = model(**{name: value for name, value in inputs.items() if name in grounder._forward_names}, output_attentions=True)
    blocks = attention_blocks(outputs, text_mask=inputs["attention_mask"], region_mask=inputs["visual_attention_mask"])
    rows = blocks.row_normalised("word_to_region")[-1][0].mean(dim=0)
    uniform = result["words"][3]["tokens"]
    torch.testing.assert_close(torch.tensor(result["words"][3]["weights"]), rows[uniform].mean(dim=0))
    assert result["layer"] == len(blocks.row_normalised("word_to_region")) - 1


def test_several_examples_boxes_pairs_and_the_explorer(model_dirs, tmp_path):
    grounder = pipeline("word-region-attention", model=str(model_dirs["single_stream"]))
    results = grounder(
        [PHOTO, PHOTO], text=["a woman", "a uniform"], text_pair=["a person", "clothes"],
        boxes=[[[0, 0, 256, 300], [100, 100, 400, 500]], None], layer=0, top_k=1, explorer=tmp_path / "page.html",
    )  # fmt: skip
    assert len(results) == 2 and results[0]["layer"] == 0
    assert [(word["word"], word["sentence"]) for word in results[0]["words"]] == [("a", 0), ("woman", 0), ("a", 1), ("person", 1)]
    assert results[0]["region_boxes"] == [[0.0, 0.0, 512.0, 600.0], [0.0, 0.0, 256.0, 300.0], [100.0, 100.0, 400.0, 500.0]]
    assert len(results[1]["region_boxes"]) == 5  # the grid
    assert results[0]["explorer"] == results[1]["explorer"] == tmp_path / "page.html"
    payload = read_explorer_payload(tmp_path / "page.html")
    assert len(payload["examples"]) == 2 and payload["examples"][0]["title"] == "a woman / a person"

    one = grounder({"image": PHOTO, "text": "a woman"}, explorer=True)
    assert one["explorer"].lstrip().startswith("<!DOCTYPE html>") and "a woman" in one["explorer"]


def test_the_captioner_and_bad_input_are_refused(tokenizer, model_dirs, tmp_path):
    with pytest.raises(ValueError, match="a captioner generates its words"):
        pipeline("word-region-attention", model=str(_saved("captioner", tokenizer, tmp_path / "captioner")))
    grounder = pipeline("word-region-attention", model=str(model_dirs["two_stream"]))
    with pytest.raises(ValueError, match="one sentence per image, got 2 images"):
        grounder([PHOTO, PHOTO], text=["a woman"])
    with pytest.raises(ValueError, match=r"`layer` must be in \[-2, 1\]"):
        grounder(PHOTO, text="a woman", layer=5)
    with pytest.raises(ValueError, match="`top_k` must be an int >= 1"):
        grounder(PHOTO, text="a woman", top_k=0)
    with pytest.raises(ValueError, match="`text` of example 0 must be a non-empty str"):
        grounder(PHOTO)
    with pytest.raises(ValueError, match="`batch_size` must be an int in \\[1, 4096\\], got float 2.5"):
        pipeline("word-region-attention", model=str(model_dirs["two_stream"]), batch_size=2.5)
    with pytest.raises(ValueError, match="`batch_size` must be >= 1, got 0"):
        grounder(PHOTO, text="a woman", batch_size=0)
    tokenizer.save_pretrained(tmp_path / "no_processor")  # a folder saved before processors: a model and a tokenizer
    tiny_family_model("two_stream", tokenizer).save_pretrained(tmp_path / "no_processor")
    with pytest.raises(FileNotFoundError, match="has no processor_config.json: the model was saved without its processor"):
        pipeline("word-region-attention", model=str(tmp_path / "no_processor"))
    with pytest.raises(ValueError, match="needs the model's VLAlignProcessor, got BertTokenizer"):
        pipeline("word-region-attention", model=str(tmp_path / "no_processor"), processor=tokenizer)
    small = VLAlignProcessor(RegionFeatureExtractor(grid_size=1, feature_dim=8), tokenizer)
    with pytest.raises(ValueError, match="feature_dim=8, but the model reads visual_feat_dim=256"):
        pipeline("word-region-attention", model=str(model_dirs["two_stream"]), processor=small)
