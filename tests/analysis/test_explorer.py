"""The attention explorer: the JSON embedded in the HTML page holds the models' own attention (all three families and
transformers' VisualBert / Lxmert), the gold boxes, the image and the probe grid; bad input raises naming the argument;
and a real headless Chromium clicks a word, a probe cell and a box and finds the highlighted boxes and words equal to
the embedded numbers (a browser that cannot start fails the test where CI is set, and skips it elsewhere)."""

import base64
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import skimage
import torch
from analysis_models import FAMILIES, SCENES, SYNTHETIC_FLAGS, tiny_family_model
from PIL import Image
from transformers import AutoTokenizer, LxmertConfig, LxmertModel, VisualBertConfig, VisualBertModel

from hf_vlalign.analysis import (
    ExplorerExample,
    GoldPhrase,
    explorer_examples,
    layer_rollouts,
    read_explorer_payload,
    write_attention_explorer,
)
from hf_vlalign.analysis.explorer import GOLD_BOX_STYLE, SCALE, TOP_BOX_STYLE
from hf_vlalign.cli import main
from hf_vlalign.evaluation.inference import split_batch
from hf_vlalign.evaluation.model_analysis import ATTENTION_TARGET_KEYS, analyze_model, synthetic_analysis_data
from hf_vlalign.evaluation.tasks import load_model

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")

PROBE_EXAMPLES = 8
ATOL = 6e-5  # the page keeps 4 decimals




@pytest.fixture(scope="module")
def explored(tokenizer, tmp_path_factory):
    """family -> (model folder, explorer page written by `hf-vlalign explore`)."""
    pages = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(family)
        tiny_family_model(family, tokenizer).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        page = folder.with_name(f"{folder.name}-explorer.html")  # beside the model: never inside an input
        argv = [
            "explore",
            str(folder),
            "--out",
            str(page),
            "--num_examples",
            "2",
            "--probe_examples",
            str(PROBE_EXAMPLES),
        ]
        assert main([*argv, "--batch_size", "4", *SYNTHETIC_FLAGS]) == 0
        pages[family] = (folder, page)
    return pages


def _reference(folder, index: int = 0):
    """The model's own outputs on example `index` (as the analysis reads it), its batch and its row."""
    model = load_model(folder)
    data = synthetic_analysis_data(model, AutoTokenizer.from_pretrained(folder), SCENES)
    row = data.dataset[index]
    batch = data.collator([row])
    with torch.no_grad():
        outputs = model(**split_batch(batch, torch.device("cpu"), ATTENTION_TARGET_KEYS)[0], output_attentions=True)
    return outputs, batch, row, data


def _renormalised(maps: torch.Tensor) -> np.ndarray:
    maps = maps.double()
    return (maps / maps.sum(-1, keepdim=True)).numpy()


def _stack(maps) -> np.ndarray:
    return torch.stack([layer[0] for layer in maps]).numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_embedded_attention_equals_the_model_outputs(family, explored):
    folder, page = explored[family]
    data = read_explorer_payload(page)
    outputs, batch, row, analysis = _reference(folder)
    example = data["examples"][0]
    text_mask = batch[analysis.text_mask_key][0].bool()
    assert len(data["examples"]) == 2 and len(example["words"]) == int(text_mask.sum())
    assert np.allclose(example["regions"], batch["visual_boxes"][0].numpy(), atol=1e-5)
    heads = {view: np.asarray(spec["heads"]) for view, spec in example["attention"].items()}
    num_words, num_regions = int(text_mask.sum()), batch["visual_boxes"].shape[1]
    if family == "single_stream":
        joint = _stack(outputs.attentions)  # (L, H, N, N) over [text; regions; END]
        text, regions = slice(0, num_words), slice(num_words, num_words + num_regions)
        expected = {"word_to_region": _renormalised(torch.from_numpy(joint[..., text, regions])),
                    "region_to_word": _renormalised(torch.from_numpy(joint[..., regions, text]))}  # fmt: skip
        rollout = torch.stack([r[0] for r in layer_rollouts(list(outputs.attentions))])
        assert np.allclose(
            example["attention"]["word_to_region"]["rollout"], _renormalised(rollout[:, text, regions]), atol=ATOL
        )
    elif family == "two_stream":
        expected = {"word_to_region": _stack(outputs.cross_encoder_attentions),
                    "region_to_word": _stack(outputs.cross_encoder_vision_attentions)}  # fmt: skip
    else:
        expected = {"word_to_region": _stack(outputs.cross_attentions),
                    "aligned_word_to_region": _renormalised(torch.stack([a[0] for a in outputs.aligned_cross_attentions]))}  # fmt: skip
        assert (
            "A2" in data["views"]["word_to_region"]["label"]
            and "after A2" in data["views"]["aligned_word_to_region"]["label"]
        )
    assert set(heads) == set(expected) == set(data["views"])
    for view, values in expected.items():
        assert heads[view].shape == values.shape == (2, 4, *values.shape[2:]), view
        assert np.allclose(heads[view], values, atol=ATOL), view
        assert data["views"][view]["shape"] == [2, 4]
        assert data["views"][view]["rollout"] == (family == "single_stream")
    # gold: every phrase of the row with its boxes (normalised by the image size) on the words that spell it
    columns = analysis.collator.text_columns
    phrases = [
        (row[c][s:e], boxes)
        for c in columns
        for (s, e), boxes in zip(row[f"{c}_phrase_spans"], row[f"{c}_phrase_boxes"])
    ]
    assert [gold["text"] for gold in example["gold"]] == [text for text, _ in phrases]
    height, width = row["image_size"]
    for gold, (text, boxes) in zip(example["gold"], phrases):
        assert np.allclose(gold["boxes"], np.asarray(boxes) / [width, height, width, height], atol=1e-5)
        spelled = " ".join(example["words"][t] for t in gold["tokens"]).replace(" ##", "")
        assert spelled == text.lower()
    # the synthetic scene's rendering, as a base64 PNG
    image = Image.open(io.BytesIO(base64.b64decode(example["image"].split(",", 1)[1])))
    assert example["size"] == [SCENES.image_size, SCENES.image_size] and image.size == (SCENES.image_size,) * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_probe_grid_is_the_analysis_probe(family, explored, tmp_path):
    folder, page = explored[family]
    probe = read_explorer_payload(page)["probe"]
    accuracy = np.asarray(probe["accuracy"])
    assert probe["view"] == "word_to_region" and accuracy.shape == (2, 4) and probe["num_phrases"] > 0
    assert ((accuracy >= 0) & (accuracy <= 1)).all()
    if probe["best_among"] == "active heads":  # the best actively attending head (Li et al.)
        assert probe["best_head_active_share"] > 0.2
    else:  # every head a candidate
        assert accuracy[tuple(probe["best"])] == accuracy.max()
    if family != "single_stream":
        return
    # `hf-vlalign analyze` on the same examples finds the same grid (its PNGs make it slow: one family)
    report = analyze_model(
        folder, tmp_path, synthetic=SCENES, batch_size=4, max_examples=PROBE_EXAMPLES, progress=False
    )
    expected = report["grounding_probe"]
    assert np.allclose(accuracy, expected["accuracy"], atol=ATOL)
    assert probe["num_phrases"] == expected["num_phrases"]
    assert probe["best"] == [expected["best_layer"], expected["best_head"]]
    assert probe["best_among"] == expected["best_among"]
    assert probe["baseline"] == pytest.approx(expected["baseline_accuracy"])
    assert probe["baseline_name"] == "detection-confidence baseline"  # the scenes' store holds detector confidences
    # the page says which examples its grid read, and how `analyze` reads the same ones
    assert probe["examples"].startswith(f"the first {PROBE_EXAMPLES} of the ")
    assert probe["examples"].endswith(f"(hf-vlalign analyze --max_examples {PROBE_EXAMPLES} reads the same)")


def test_page_is_self_contained(explored):
    text = explored["single_stream"][1].read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text
    local = text.replace('"http://www.w3.org/2000/svg"', "")  # the SVG namespace, not a request
    for remote in ("http://", "https://", "<link", "<script src", "url("):
        assert remote not in local, remote


def test_an_image_without_its_own_rows_is_refused_never_overlaid(explored, tmp_path, capsys):
    folder, _ = explored["two_stream"]
    Image.new("RGB", (300, 200), (10, 200, 30)).save(tmp_path / "photo.png")
    page = tmp_path / "report.html"
    argv = [
        "explore",
        str(folder),
        "--out",
        str(page),
        "--num_examples",
        "1",
        "--probe_examples",
        "0",
        *SYNTHETIC_FLAGS,
    ]
    with pytest.raises(SystemExit, match="2"):  # the synthetic scene's boxes and caption are not the photo's
        main([*argv, "--image", str(tmp_path / "photo.png")])
    assert "has no text and boxes of its own" in capsys.readouterr().err and not page.exists()
    with pytest.raises(SystemExit, match="2"):  # a user mistake: one line on stderr, exit status 2
        main([*argv, "--image", str(tmp_path / "missing.png")])
    assert "`image` must be an image file" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main([*argv[:4], "--num_examples", "0", *SYNTHETIC_FLAGS])
    assert "`num_examples` must be an int >= 1" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# transformers' VisualBert and Lxmert through the adapters
# ---------------------------------------------------------------------------------------------------------------------

B, T, R, DV, H, V = 2, 6, 4, 12, 4, 60
WORDS = [["[CLS]", "a", "red", "disc", "[SEP]"], ["[CLS]", "the", "blue", "square", "is", "[SEP]"]]
GOLD = [[{"tokens": [1, 2, 3], "boxes": [[0.1, 0.1, 0.4, 0.5]], "text": "a red disc"}], []]


def _inputs():
    generator = torch.Generator().manual_seed(0)
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    boxes = torch.cat([corners, corners + 0.1 + torch.rand(B, R, 2, generator=generator) * 0.4], dim=-1)
    text_mask = torch.ones(B, T, dtype=torch.long)
    text_mask[0, -1] = 0
    region_mask = torch.ones(B, R, dtype=torch.long)
    region_mask[1, -1] = 0
    ids = torch.randint(3, V, (B, T), generator=generator)
    return ids, torch.randn(B, R, DV, generator=generator), boxes, text_mask, region_mask


def _visual_bert():
    torch.manual_seed(0)
    config = VisualBertConfig(vocab_size=V, hidden_size=32, visual_embedding_dim=DV, num_hidden_layers=2,
                              num_attention_heads=H, intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    ids, feats, boxes, text_mask, region_mask = _inputs()
    with torch.no_grad():
        outputs = VisualBertModel(config).eval()(input_ids=ids, attention_mask=text_mask, visual_embeds=feats,
                                                 visual_attention_mask=region_mask, output_attentions=True)  # fmt: skip
    return outputs, boxes, text_mask, region_mask


def _lxmert():
    torch.manual_seed(0)
    config = LxmertConfig(
        vocab_size=V, hidden_size=32, num_attention_heads=H, intermediate_size=64, l_layers=2, r_layers=1, x_layers=3,
        visual_feat_dim=DV, visual_pos_dim=4, num_object_labels=6, num_attr_labels=5, num_qa_labels=7,
        max_position_embeddings=32,
    )  # fmt: skip
    ids, feats, boxes, text_mask, region_mask = _inputs()
    with torch.no_grad():
        outputs = LxmertModel(config).eval()(input_ids=ids, visual_feats=feats, visual_pos=boxes, attention_mask=text_mask,
                                             visual_attention_mask=region_mask, output_attentions=True)  # fmt: skip
    return outputs, boxes, text_mask, region_mask


def _write(outputs, boxes, text_mask, region_mask, path, **options):
    examples = explorer_examples(
        outputs, words=WORDS, region_boxes=boxes, text_mask=text_mask, region_mask=region_mask, gold=GOLD
    )
    return read_explorer_payload(write_attention_explorer(examples, path, **options))


def test_visual_bert_page_slices_the_joint_map(tmp_path):
    outputs, boxes, text_mask, region_mask = _visual_bert()
    data = _write(outputs, boxes, text_mask, region_mask, tmp_path / "vb.html", probe=np.full((2, H), 0.5))
    assert set(data["views"]) == {"word_to_region", "region_to_word"} and data["views"]["word_to_region"]["rollout"]
    assert data["probe"]["accuracy"] == [[0.5] * H] * 2
    for index, (words, real_regions) in enumerate(zip(WORDS, (R, R - 1))):
        example = data["examples"][index]
        assert example["words"] == words and example["image"] is None and len(example["regions"]) == real_regions
        joint = torch.stack([layer[index] for layer in outputs.attentions])  # (L, H, T + R, T + R)
        rows = joint[..., : len(words), T : T + real_regions]
        assert np.allclose(example["attention"]["word_to_region"]["heads"], _renormalised(rows), atol=ATOL)
        columns = joint[..., T : T + real_regions, : len(words)]
        assert np.allclose(example["attention"]["region_to_word"]["heads"], _renormalised(columns), atol=ATOL)
    assert data["examples"][0]["gold"] == [{"tokens": [1, 2, 3], "boxes": [[0.1, 0.1, 0.4, 0.5]], "text": "a red disc"}]


def test_lxmert_page_has_language_to_vision_only(tmp_path):
    outputs, boxes, text_mask, region_mask = _lxmert()
    data = _write(outputs, boxes, text_mask, region_mask, tmp_path / "lxmert.html")
    assert list(data["views"]) == ["word_to_region"] and data["views"]["word_to_region"] == {
        "label": "language \u2192 vision (word \u2192 region)", "query": "word", "shape": [3, H], "rollout": False,
        "heads": None,
    }  # fmt: skip
    example = data["examples"][1]
    expected = torch.stack([layer[1] for layer in outputs.cross_encoder_attentions])[:, :, :, : R - 1]
    assert np.allclose(example["attention"]["word_to_region"]["heads"], _renormalised(expected), atol=ATOL)
    assert example["attention"]["word_to_region"]["rollout"] is None


def test_bad_input_raises_naming_the_argument(tmp_path):
    outputs, boxes, text_mask, region_mask = _visual_bert()
    kwargs = {"words": WORDS, "region_boxes": boxes, "text_mask": text_mask, "region_mask": region_mask}
    with pytest.raises(ValueError, match=r"`words\[0\]` must hold one token per real text position \(5\), got 4"):
        explorer_examples(outputs, **{**kwargs, "words": [WORDS[0][:4], WORDS[1]]})
    with pytest.raises(ValueError, match="`words` must hold one entry per example"):
        explorer_examples(outputs, **{**kwargs, "words": WORDS[:1]})
    with pytest.raises(ValueError, match="`region_boxes` must be normalised to"):
        explorer_examples(outputs, **{**kwargs, "region_boxes": boxes * 100})
    with pytest.raises(ValueError, match=r"`region_boxes` must be \(B, R, 4\)"):
        explorer_examples(outputs, **{**kwargs, "region_boxes": boxes[0]})
    with pytest.raises(ValueError, match=r"`gold\[0\].tokens` must be word positions in \[0, 4\]"):
        explorer_examples(outputs, **kwargs, gold=[[{"tokens": [7], "boxes": [[0, 0, 1, 1]]}], []])
    with pytest.raises(ValueError, match=r"`gold\[0\]` must have the keys"):
        explorer_examples(outputs, **kwargs, gold=[[{"tokens": [1]}], []])
    with pytest.raises(ValueError, match=r"`images\[0\]` must be an existing image file"):
        explorer_examples(outputs, **kwargs, images=[tmp_path / "missing.png", None])
    with pytest.raises(ValueError, match="hold no attention maps"):
        explorer_examples(object(), **kwargs)
    examples = explorer_examples(outputs, **kwargs)
    with pytest.raises(ValueError, match=r"`probe` must be \(L, H\) = \(2, 4\)"):
        write_attention_explorer(examples, tmp_path / "a.html", probe=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="`examples` must be a non-empty list"):
        write_attention_explorer([], tmp_path / "a.html")
    with pytest.raises(ValueError, match="`path` must be a str or Path"):
        write_attention_explorer(examples, None)
    lxmert = explorer_examples(_lxmert()[0], **{**kwargs, "text_mask": text_mask, "region_mask": region_mask})
    with pytest.raises(ValueError, match=r"`examples\[1\]` must have the views, layers and heads of examples\[0\]"):
        write_attention_explorer([examples[0], lxmert[1]], tmp_path / "a.html")


# ---------------------------------------------------------------------------------------------------------------------
# A real browser
# ---------------------------------------------------------------------------------------------------------------------




@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's `chromium` + `chromium-driver`) through selenium. Where CI is set, a browser that
    cannot start fails the tests: CI installs it (.ci/run)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        binary = next(
            (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)),
            None,
        )
        driver_path = shutil.which("chromedriver")
        if binary is None or driver_path is None:
            raise RuntimeError(f"chromium ({binary}) or chromedriver ({driver_path}) not found")
        options = webdriver.ChromeOptions()
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
        ):
            options.add_argument(argument)
        options.binary_location = binary
        driver = webdriver.Chrome(options=options, service=Service(driver_path))
    except Exception as error:  # ImportError, WebDriverException, RuntimeError: no browser here
        message = f"headless Chromium could not start ({type(error).__name__}: {error}); apt-get install chromium chromium-driver; pip install selenium"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(message)
        pytest.skip(message)
    yield driver
    driver.quit()


def _regions(driver) -> dict[int, dict]:
    """region index -> its rect's weight, fill opacity and classes."""
    rects = driver.execute_script(
        "return [...document.querySelectorAll('rect.region')].map(r => [r.dataset.region, r.dataset.weight, "
        "r.getAttribute('fill-opacity'), r.getAttribute('class')])"
    )
    return {
        int(r): {"weight": float(w) if w else None, "opacity": float(o), "top": "top" in c.split()}
        for r, w, o, c in rects
    }


def _word_weights(driver) -> list[float | None]:
    spans = driver.execute_script(
        "return [...document.querySelectorAll('#sentence span.tok')].map(s => s.dataset.weight || null)"
    )
    return [None if w is None else float(w) for w in spans]


def _fill_opacity(weights: np.ndarray) -> np.ndarray:
    """The scale's fill opacity of each weight: from its minimum (any weight above 0) to its maximum, in sqrt(w)."""
    low, high = SCALE["fill_opacity"]
    return np.where(weights > 0, low + (high - low) * np.sqrt(weights), 0.0)


def _assert_boxes_show(driver, weights: np.ndarray) -> None:
    shown = _regions(driver)
    assert sorted(shown) == list(range(len(weights)))
    assert np.allclose([shown[r]["weight"] for r in range(len(weights))], weights, atol=1e-9)
    assert np.allclose([shown[r]["opacity"] for r in range(len(weights))], _fill_opacity(weights), atol=1e-4)
    assert [r for r in shown if shown[r]["top"]] == [int(np.argmax(weights))]


def test_browser_clicks_word_probe_cell_and_region(browser, explored, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page = explored["single_stream"][1]
    data = read_explorer_payload(page)
    example = data["examples"][0]
    heads = np.asarray(example["attention"]["word_to_region"]["heads"])
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    assert browser.find_element(By.TAG_NAME, "h1").text == data["title"]
    assert "attention weight (0 to 1)" in browser.find_element(By.ID, "legend").text
    assert browser.get_log("browser") == []  # no script error
    # the page opens on the probe's best head; click a word of the first gold phrase
    layer, head = data["probe"]["best"]
    gold = example["gold"][0]
    word = gold["tokens"][-1]
    browser.find_element(By.CSS_SELECTOR, f'span.tok[data-token="{word}"]').click()
    _assert_boxes_show(browser, heads[layer, head, word])
    (gold_rect,) = browser.find_elements(By.CSS_SELECTOR, "rect.gold")
    x1, y1, x2, y2 = np.asarray(gold["boxes"][0]) * (example["size"] * 2)
    placed = [float(gold_rect.get_attribute(name)) for name in ("x", "y", "width", "height")]
    assert np.allclose(placed, [x1, y1, x2 - x1, y2 - y1], atol=1e-3)
    browser.save_screenshot(str(tmp_path / "word.png"))
    # a probe cell switches the view to its layer and head
    cell = browser.find_element(By.CSS_SELECTOR, 'td.probe-cell[data-layer="0"][data-head="2"]')
    assert float(cell.get_attribute("data-accuracy")) == data["probe"]["accuracy"][0][2]
    cell.click()
    assert Select(browser.find_element(By.ID, "layer")).first_selected_option.get_attribute("value") == "0"
    assert Select(browser.find_element(By.ID, "head")).first_selected_option.get_attribute("value") == "2"
    assert "current" in browser.find_element(
        By.CSS_SELECTOR, 'td.probe-cell[data-layer="0"][data-head="2"]'
    ).get_attribute("class")
    _assert_boxes_show(browser, heads[0, 2, word])
    # the mean over heads and the rollout
    Select(browser.find_element(By.ID, "head")).select_by_value("mean")
    assert Select(browser.find_element(By.ID, "head")).first_selected_option.text == "mean over heads"
    assert "mean over heads" in browser.find_element(By.ID, "info").text
    _assert_boxes_show(browser, heads[0, :, word].mean(0))
    Select(browser.find_element(By.ID, "head")).select_by_value("rollout")
    _assert_boxes_show(browser, np.asarray(example["attention"]["word_to_region"]["rollout"])[0, word])
    Select(browser.find_element(By.ID, "head")).select_by_value("2")
    # click a box (the smallest one is drawn last, so a real click lands on it): the words' attention on it
    sizes = [(b[2] - b[0]) * (b[3] - b[1]) for b in example["regions"]]
    region = int(np.argmin(sizes))
    browser.find_element(By.CSS_SELECTOR, f'rect.region[data-region="{region}"]').click()
    assert np.allclose(_word_weights(browser), heads[0, 2, :, region], atol=1e-9)
    assert len(browser.find_elements(By.CSS_SELECTOR, "rect.selected-region")) == 1
    assert browser.find_elements(By.CSS_SELECTOR, "rect.region.top") == []
    # vision -> language: the box's own attention over the words
    Select(browser.find_element(By.ID, "view")).select_by_value("region_to_word")
    rows = np.asarray(example["attention"]["region_to_word"]["heads"])
    assert np.allclose(_word_weights(browser), rows[0, 2, region], atol=1e-9)
    browser.save_screenshot(str(tmp_path / "region.png"))
    assert (tmp_path / "word.png").stat().st_size > 10_000 and browser.get_log("browser") == []


# ---------------------------------------------------------------------------------------------------------------------
# A real photo: low weights visible, the most attended box and the gold box told apart
# ---------------------------------------------------------------------------------------------------------------------

PHOTO_BOXES = np.array([[150, 15, 300, 190], [20, 150, 365, 512], [0, 0, 95, 512], [355, 0, 470, 285],
                        [275, 340, 512, 512], [132, 345, 210, 425]]) / 512  # fmt: skip
PHOTO_WORDS = ["[CLS]", "a", "woman", "in", "an", "orange", "suit", "beside", "a", "flag", "[SEP]"]
WOMAN, SUIT = 2, 6


@pytest.fixture
def photo_page(tmp_path):
    """skimage's astronaut.png (a real photo whose orange suit and red flag share the scale's colours) with hand-made
    boxes (face, suit, flag, shuttle, helmet, patch) and two heads: "woman" puts 0.55 on the face and 0.02-0.20 on the
    others, its gold box the whole person; "suit" attends most to its gold box."""
    import skimage

    photo = Image.open(os.path.join(os.path.dirname(skimage.__file__), "data", "astronaut.png"))
    attention = np.full((1, 2, len(PHOTO_WORDS), len(PHOTO_BOXES)), 1 / len(PHOTO_BOXES))
    attention[0, 0, WOMAN] = [0.55, 0.20, 0.10, 0.08, 0.05, 0.02]
    attention[0, 1, WOMAN] = [0.45, 0.30, 0.10, 0.08, 0.05, 0.02]
    attention[0, :, SUIT] = [0.15, 0.30, 0.10, 0.05, 0.15, 0.25]
    gold = [GoldPhrase([1, WOMAN], [[140 / 512, 10 / 512, 370 / 512, 1.0]], "a woman"),
            GoldPhrase([4, 5, SUIT], [PHOTO_BOXES[1].tolist()], "an orange suit")]  # fmt: skip
    example = ExplorerExample(PHOTO_WORDS, PHOTO_BOXES, {"word_to_region": attention}, gold=gold, image=photo)
    return write_attention_explorer([example], tmp_path / "photo.html"), attention[0]


def test_payload_holds_one_scale_and_two_distinct_outlines(photo_page):
    data = read_explorer_payload(photo_page[0])
    assert data["scale"] == {name: list(value) if isinstance(value, tuple) else value for name, value in SCALE.items()}
    low, high = data["scale"]["fill_opacity"]
    assert 0 < low < high <= 1 and 0 < data["scale"]["dim_photo"] < 1
    assert low + (high - low) * np.sqrt(0.1) > 0.25  # a weight of 0.1 is filled at opacity > 0.25
    # the scale's 0 is a colour (yellow), not the near-white that vanishes on a photo
    red, green, blue = (int(data["colours"][0][i : i + 2], 16) for i in (1, 3, 5))
    assert red > 240 and blue < 150
    # the two outlines differ in colour and in line style, and neither colour is on the weights' scale
    top, gold = data["top_box"], data["gold_box"]
    assert top == TOP_BOX_STYLE and gold == GOLD_BOX_STYLE
    assert top["colour"] != gold["colour"] and top["dasharray"] == "" and gold["dasharray"]
    assert {top["colour"], gold["colour"]}.isdisjoint(data["colours"])


def test_browser_shows_low_weights_and_tells_the_top_box_from_the_gold_box(browser, photo_page, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page, attention = photo_page
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1" and browser.get_log("browser") == []
    # the page opens on the mean over heads (no probe grid), named so
    head = Select(browser.find_element(By.ID, "head"))
    assert head.first_selected_option.get_attribute("value") == "mean"
    assert [option.text for option in head.options] == ["head 0", "head 1", "mean over heads"]
    browser.find_element(By.CSS_SELECTOR, f'span.tok[data-token="{WOMAN}"]').click()
    weights = attention[:, WOMAN].mean(0)
    _assert_boxes_show(browser, weights)
    assert "mean over heads" in browser.find_element(By.ID, "info").text
    # every weight above 0, down to 0.02, is filled and outlined: opacity and width from the scale's minimum
    shown = browser.execute_script(
        "return [...document.querySelectorAll('rect.region')].map(r => [Number(r.dataset.weight), "
        "Number(r.getAttribute('fill-opacity')), Number(r.getAttribute('stroke-width')), r.getAttribute('stroke')])"
    )
    for weight, opacity, width, stroke in shown:
        assert opacity >= SCALE["fill_opacity"][0] and width >= SCALE["outline_width"][0] and stroke != "#ffffff"
    low_weight = next(row for row in shown if row[0] == pytest.approx(0.10))  # the flag
    assert low_weight[1] == pytest.approx(_fill_opacity(np.array(0.10)), abs=1e-4) and low_weight[1] > 0.25
    dim = browser.find_element(By.ID, "dim")
    assert float(dim.get_attribute("fill-opacity")) == SCALE["dim_photo"]
    # the most attended box (the face) solid magenta, the gold box (the whole person) dashed green
    (top,) = browser.find_elements(By.CSS_SELECTOR, "rect.top-outline")
    (gold,) = browser.find_elements(By.CSS_SELECTOR, "rect.gold")
    assert top.get_attribute("data-region") == "0" and top.get_attribute("stroke") == TOP_BOX_STYLE["colour"]
    assert (top.get_attribute("stroke-dasharray") or "") == ""
    assert gold.get_attribute("stroke") == GOLD_BOX_STYLE["colour"] and gold.get_attribute("stroke-dasharray") == "8 5"
    browser.save_screenshot(str(tmp_path / "woman.png"))
    # where they are the same box ("suit"), both are drawn: the gold dashes over the solid magenta
    browser.find_element(By.CSS_SELECTOR, f'span.tok[data-token="{SUIT}"]').click()
    (top,) = browser.find_elements(By.CSS_SELECTOR, "rect.top-outline")
    (gold,) = browser.find_elements(By.CSS_SELECTOR, "rect.gold")
    placed = [[float(rect.get_attribute(name)) for name in ("x", "y", "width", "height")] for rect in (top, gold)]
    assert top.get_attribute("data-region") == "1" and np.allclose(*placed)
    overlay = browser.execute_script("return [...document.getElementById('overlay').children].map(e => e.getAttribute('class'))")
    assert overlay.index("top-outline") < overlay.index("gold")
    # the legend names both outlines with their styles and shows the scale with sample boxes from 0.02 up
    legend = browser.find_element(By.ID, "legend")
    assert "most attended box (solid magenta)" in legend.find_element(By.CLASS_NAME, "legend-top").text
    assert "gold box, the annotation (dashed green)" in legend.find_element(By.CLASS_NAME, "legend-gold").text
    assert f"from {SCALE['fill_opacity'][0]} just above 0" in legend.text and "one scale for every word" in legend.text
    samples = legend.find_elements(By.CSS_SELECTOR, "svg.samples rect[stroke]")
    assert [float(r.get_attribute("fill-opacity")) for r in samples] == pytest.approx(
        _fill_opacity(np.array([0.02, 0.1, 0.2, 0.3, 0.5, 1.0])), abs=1e-3
    )
    # a box clicked: the words take the same scale and the photo is not dimmed
    browser.execute_script(
        "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))",
        browser.find_element(By.CSS_SELECTOR, 'rect.region[data-region="1"]'),
    )
    assert float(dim.get_attribute("fill-opacity")) == 0
    assert np.allclose(_word_weights(browser), attention[:, :, 1].mean(0), atol=ATOL)
    browser.save_screenshot(str(tmp_path / "region.png"))
    assert (tmp_path / "woman.png").stat().st_size > 10_000 and browser.get_log("browser") == []


def test_browser_shows_the_captioner_before_and_after_alignment(browser, explored):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page = explored["captioner"][1]
    example = read_explorer_payload(page)["examples"][1]
    browser.get(page.resolve().as_uri())
    Select(browser.find_element(By.ID, "example")).select_by_value("1")
    Select(browser.find_element(By.ID, "layer")).select_by_value("1")
    Select(browser.find_element(By.ID, "head")).select_by_value("3")
    browser.find_element(By.CSS_SELECTOR, 'span.tok[data-token="1"]').click()
    _assert_boxes_show(browser, np.asarray(example["attention"]["word_to_region"]["heads"])[1, 3, 1])
    assert "After A2 alignment" in browser.find_element(By.ID, "info").text
    Select(browser.find_element(By.ID, "view")).select_by_value("aligned_word_to_region")
    _assert_boxes_show(browser, np.asarray(example["attention"]["aligned_word_to_region"]["heads"])[1, 3, 1])
    assert "Before A2 alignment" in browser.find_element(By.ID, "info").text


@pytest.mark.slow
def test_screenshot_script_writes_three_states(browser, explored, tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "make_explorer_screenshots.py"
    spec = importlib.util.spec_from_file_location("make_explorer_screenshots", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    paths = script.take_screenshots(explored["single_stream"][1], tmp_path)
    assert [p.name for p in paths] == ["explorer_word.png", "explorer_probe_head.png", "explorer_region.png"]
    for p in paths:
        assert Image.open(p).size[0] == 1400


def test_browser_names_the_best_heads_candidates_and_the_baseline_kind(browser, tmp_path):
    """The most accurate head (0.93) barely looks at the image; the star marks the best actively attending one (0.92)
    and says so, the other is marked and named too, and a store without confidences gives the store-order baseline."""
    from selenium.webdriver.common.by import By

    from hf_vlalign.analysis.grounding_probe import GroundingProbeResult

    result = GroundingProbeResult(
        accuracy=np.array([[0.93, 0.92]]), best_layer=0, best_head=1, best_head_accuracy=0.92, mean_head_accuracy=0.925,
        baseline_accuracy=0.4, num_phrases=36, active_share=np.array([[0.05, 0.6]]), best_among="active heads",
        baseline_kind="store_order",
    )  # fmt: skip
    attention = np.full((1, 2, len(PHOTO_WORDS), len(PHOTO_BOXES)), 1 / len(PHOTO_BOXES))
    example = ExplorerExample(PHOTO_WORDS, PHOTO_BOXES, {"word_to_region": attention})
    page = write_attention_explorer(
        [example], tmp_path / "page.html", probe=result, probe_examples="the first 128 of the 500 examples of a file"
    )
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1" and browser.get_log("browser") == []
    best = browser.find_element(By.ID, "probe-best").text
    assert "\u2605 best of active heads: layer 0, head 1 (0.92, actively attending)" in best
    assert "\u25c6 best of all heads: layer 0, head 0 (0.93, not actively attending)" in best
    assert "hatched: not actively attending (\u2264 20 % of the phrases\u2019 attention on the image)" in best
    probe = browser.find_element(By.ID, "probe").text
    assert "36 phrases of the first 128 of the 500 examples of a file" in probe
    assert "store-order baseline (each image's first stored region) 0.400" in probe and "detection" not in probe
    cells = browser.find_elements(By.CSS_SELECTOR, "td.probe-cell")
    assert [cell.text for cell in cells] == ["\u25c60.93", "\u26050.92"]
    assert ["inactive" in cell.get_attribute("class").split() for cell in cells] == [True, False]


# ---------------------------------------------------------------------------------------------------------------------
# A transformers patch model: the image under its patch grid
# ---------------------------------------------------------------------------------------------------------------------


def test_browser_shows_a_patch_models_attention_over_its_grid(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from hf_vlalign.analysis.explorer import stored_maps

    from hf_vlalign.synthetic import SyntheticSceneConfig
    from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
    from hf_vlalign.vlms import grounded_caption_examples
    from hf_vlalign.vlms.explore import write_patch_explorer
    from hf_vlalign.vlms.tiny import tiny_patch_model, word_level_tokenizer

    scenes = load_or_generate_synthetic_vgp(config=SyntheticSceneConfig(num_train_images=12, num_val_images=6))
    examples, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "val")
    model, processor = tiny_patch_model("llava", tokenizer=word_level_tokenizer(e["caption"] for e in examples))
    page = write_patch_explorer(model, processor, examples, tmp_path / "patches.html", num_examples=1, probe_examples=8)
    data = read_explorer_payload(page)
    example = data["examples"][0]
    maps = stored_maps(example["attention"]["word_to_region"])  # each layer's mean, then the probe's best heads
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1" and browser.get_log("browser") == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "rect.region")) == 16  # the 4 x 4 grid of 16-pixel patches
    assert "a patch at least 0.5 inside a gold box" in browser.find_element(By.ID, "probe").text
    layer, head = read_explorer_payload(page)["probe"]["best"]
    word = example["gold"][0]["tokens"][-1]
    browser.find_element(By.CSS_SELECTOR, f'span.tok[data-token="{word}"]').click()
    weights = maps[data["views"]["word_to_region"]["heads"].index([layer, head]), word]
    # the page opens on each word's own scale (its weights over its largest); the absolute scale shows them as such
    shown = browser.execute_script("return [...document.querySelectorAll('rect.region')].map(r => Number(r.dataset.shown))")
    assert np.isclose(max(shown), 1.0) and data["colour_scale"] == "row_max"
    Select(browser.find_element(By.ID, "scale")).select_by_value("absolute")
    _assert_boxes_show(browser, weights)
    assert len(browser.find_elements(By.CSS_SELECTOR, "rect.gold")) == len(example["gold"][0]["boxes"])
    browser.save_screenshot(str(tmp_path / "patches.png"))
    assert (tmp_path / "patches.png").stat().st_size > 10_000


def test_browser_draws_every_views_token_boxes_over_the_original_photo(browser, tmp_path):
    """Idefics3 on a 451 x 300 photo: the global view's 2 x 2 tokens and the 4 tiles' 2 x 2 each, every token's box
    drawn over the original photo (the global cells 225.5 x 150 pixels, the tiles' 112.75 x 75), the gold box over the
    cat's face."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from hf_vlalign.vlms.explore import write_patch_explorer
    from hf_vlalign.vlms.tiny import tiny_patch_model, word_level_tokenizer

    photo = Image.open(Path(skimage.__file__).parent / "data" / "chelsea.png").convert("RGB")
    caption = "the cat looks at the camera"
    model, processor = tiny_patch_model("idefics3", tokenizer=word_level_tokenizer([caption]), seed=3)
    example = {"image": photo, "caption": caption, "phrases": [{"char_start": 4, "char_end": 7, "boxes": [[140, 20, 330, 290]]}]}
    page = write_patch_explorer(model, processor, [example], tmp_path / "views.html", num_examples=1, probe_examples=1)
    assert read_explorer_payload(page)["examples"][0]["size"] == [451, 300]
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1" and browser.get_log("browser") == []
    rects = browser.execute_script(
        "return [...document.querySelectorAll('rect.region')].map(r => ['x', 'y', 'width', 'height'].map(a => Number(r.getAttribute(a))))"
    )
    sizes = sorted({(width, height) for _, _, width, height in rects})
    assert len(rects) == 4 + 4 * 4 and sizes == [(112.75, 75.0), (225.5, 150.0)]
    # both views tile the whole photo
    for width, height in sizes:
        cells = [rect for rect in rects if (rect[2], rect[3]) == (width, height)]
        assert sum(w * h for _, _, w, h in cells) == pytest.approx(451 * 300)
    assert len(browser.find_elements(By.CSS_SELECTOR, "rect.gold")) == 1
    Select(browser.find_element(By.ID, "scale")).select_by_value("absolute")  # the photo under the outlines
    browser.save_screenshot(str(tmp_path / "views.png"))
    assert (tmp_path / "views.png").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------------------------------
# A page keeping a subset of heads (patch models at real sizes), and its colour scales
# ---------------------------------------------------------------------------------------------------------------------


def test_browser_colour_scales_and_kept_heads_on_a_hand_made_map(browser, tmp_path):
    """One word over 4 boxes, weights 0.06, 0.12, 0.30, 0.51 (each an exact byte of 0.51): "row_max" colours w / 0.51,
    "uniform" log(4 w) / log 4 clipped to [0, 1] (0.06 and 0.12 are below uniform 1/4), "absolute" w, each box's fill
    opacity the scale's own of that value; the page offers only the kept heads, and a probe cell of a head it does
    not keep shows the layer's mean and says so."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from hf_vlalign.analysis.explorer import COLOUR_SCALES, MEAN_OVER_HEADS

    weights = np.array([0.06, 0.12, 0.30, 0.51])
    boxes = np.array([[0, 0, 0.5, 0.5], [0.5, 0, 1, 0.5], [0, 0.5, 0.5, 1], [0.5, 0.5, 1, 1]])
    kept = [(0, MEAN_OVER_HEADS), (1, MEAN_OVER_HEADS), (1, 2)]
    maps = np.stack([np.full((2, 4), 0.25), np.full((2, 4), 0.25), np.stack([weights, weights[::-1]])])
    example = ExplorerExample(["a", "dog"], boxes, {"word_to_region": maps}, heads=kept, model_shape=(2, 4))
    accuracy = np.array([[0.1, 0.2, 0.3, 0.9], [0.2, 0.4, 0.95, 0.1]])
    page = write_attention_explorer([example], tmp_path / "kept.html", probe=accuracy, colour_scale="row_max")
    browser.get(page.resolve().as_uri())
    assert browser.execute_script("return document.body.dataset.ready") == "1" and browser.get_log("browser") == []
    # the probe's best head (layer 1, head 2) is kept: the page opens on it; its layer offers it and the mean only
    assert [o.text for o in Select(browser.find_element(By.ID, "layer")).options] == ["layer 0", "layer 1"]
    assert [o.text for o in Select(browser.find_element(By.ID, "head")).options] == ["head 2", "mean over heads"]
    scale = Select(browser.find_element(By.ID, "scale"))
    assert [o.get_attribute("value") for o in scale.options] == list(COLOUR_SCALES)
    browser.find_element(By.CSS_SELECTOR, 'span.tok[data-token="0"]').click()
    expected = {
        "row_max": weights / 0.51,
        "uniform": np.clip(np.log(4 * weights) / np.log(4), 0, 1),
        "absolute": weights,
    }
    legends = {"row_max": "the row\u2019s largest weight", "uniform": "relative to uniform attention 1/4",
               "absolute": "attention weight (0 to 1)"}  # fmt: skip
    for name in ("row_max", "uniform", "absolute"):
        scale.select_by_value(name)
        shown = browser.execute_script(
            "return [...document.querySelectorAll('rect.region')].sort((a, b) => a.dataset.region - b.dataset.region)"
            ".map(r => [Number(r.dataset.weight), Number(r.dataset.shown), Number(r.getAttribute('fill-opacity'))])"
        )
        raw, values, opacity = np.asarray(shown).T
        assert np.allclose(raw, weights, atol=1e-9), name
        assert np.allclose(values, expected[name], atol=1e-9), name
        assert np.allclose(opacity, _fill_opacity(expected[name]), atol=1e-4), name
        assert legends[name] in browser.find_element(By.ID, "legend").text, name
    # a head the page does not keep: the layer's mean, said in the info line
    browser.find_element(By.CSS_SELECTOR, 'td.probe-cell[data-layer="0"][data-head="3"]').click()
    assert Select(browser.find_element(By.ID, "head")).first_selected_option.text == "mean over heads"
    assert "Layer 0, head 3 is not kept on this page" in browser.find_element(By.ID, "info").text
    assert browser.get_log("browser") == []
