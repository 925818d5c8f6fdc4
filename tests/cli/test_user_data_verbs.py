"""Every `hf-vlalign` verb that reads data runs on a user-format file of real photos (`--data_file`): analyze, probe,
explore, evaluate (every task) and fisher; `explore --image` is refused unless the data file's rows name the image; a
missing file, a file of the wrong task, a file without grounded phrases for the probe and a processor of another
feature dimension are refused in one line; the data file and its images are inputs no output may overwrite."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import skimage
import torch
from analysis_models import save_with_tokenizer, tiny_family_model

from hf_vlalign import (
    SingleStreamConfig,
    SingleStreamForPhraseGrounding,
    SingleStreamForQuestionAnswering,
    SingleStreamForReferringExpression,
    SingleStreamForVisualParaphrase,
    SingleStreamForVisualReasoning,
)
from hf_vlalign.analysis import read_explorer_payload
from hf_vlalign.cli import main
from hf_vlalign.evaluation.user_files import region_options_for_model

PHOTOS = Path(os.path.dirname(skimage.__file__)) / "data"
FEATURE_DIM = 32  # the tiny models' visual_feat_dim: the pixel encoder makes features of this size
CAT = "a cat looks to the side ."
CUP = "a cup of coffee on a saucer ."
ROWS = {
    "caption": [
        {"image": "photos/chelsea.png", "caption": CAT, "phrases": [{"text": "a cat", "boxes": [[0, 0, 451, 300]]}]},
        {"image": "photos/coffee.png", "caption": CUP, "phrases": [{"text": "a cup", "boxes": [[0, 0, 600, 400]]}]},
    ],
    "vqa": [
        {"image": "photos/chelsea.png", "question": "what animal is this ?", "answer": "cat"},
        {"image": "photos/coffee.png", "question": "what is in the cup ?", "answers": ["coffee", "coffee", "tea"]},
    ],
    "nlvr2": [
        {"left_image": "photos/chelsea.png", "right_image": "photos/coffee.png", "sentence": "one image shows a cat .", "label": True},
        {"left_image": "photos/coffee.png", "right_image": "photos/chelsea.png", "sentence": "one image shows a cat .", "label": True},
        {"left_image": "photos/coffee.png", "right_image": "photos/rocket.jpg", "sentence": "both show a cat .", "label": False},
    ],
    "refcoco": [
        {"image": "photos/chelsea.png", "expression": "the cat", "box": [0, 0, 451, 300]},
        {"image": "photos/coffee.png", "expression": "the cup", "box": [0, 0, 300, 200]},
    ],
    "vgp": [
        {"image": "photos/chelsea.png", "caption1": CAT, "caption2": "a kitten turns its head .", "phrase1": "a cat",
         "phrase2": "a kitten", "label": "both", "type": "Equivalence"},
        {"image": "photos/coffee.png", "caption1": CUP, "caption2": "a dog sleeps .", "phrase1": "a cup",
         "phrase2": "a dog", "label": "c1"},
    ],
}  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Real photos (scikit-image's) and one file of each task beside them; the features' cache in the folder."""
    root = tmp_path_factory.mktemp("own_data")
    (root / "photos").mkdir()
    for name in ("chelsea.png", "coffee.png", "rocket.jpg"):
        shutil.copy(PHOTOS / name, root / "photos" / name)
    for task, rows in ROWS.items():
        write_jsonl(root / f"{task}.jsonl", rows)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_VLALIGN_CACHE", str(root / "cache"))
        yield root


def _config(tokenizer, **fields) -> SingleStreamConfig:
    return SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=80, visual_feat_dim=FEATURE_DIM, **fields,
    )  # fmt: skip


@pytest.fixture(scope="module")
def models(tokenizer, tmp_path_factory) -> dict[str, Path]:
    """A tiny single-stream checkpoint of every task head, saved with the tokenizer (the QA head with its answers)."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    heads = {
        "vgp": SingleStreamForVisualParaphrase(_config(tokenizer)),
        "vqa": SingleStreamForQuestionAnswering(_config(tokenizer, num_qa_labels=3)),
        "nlvr2": SingleStreamForVisualReasoning(_config(tokenizer)),
        "refcoco": SingleStreamForReferringExpression(_config(tokenizer)),
        "flickr_grounding": SingleStreamForPhraseGrounding(_config(tokenizer)),
    }
    folders = {task: save_with_tokenizer(model, tokenizer, root / task) for task, model in heads.items()}
    (folders["vqa"] / "answer_vocab.json").write_text(json.dumps({"cat": 0, "coffee": 1, "dog": 2}))
    captioner = tiny_family_model("captioner", tokenizer)  # 256-d features: the pixel encoder's default size
    folders["captioning"] = save_with_tokenizer(captioner, tokenizer, root / "captioning")
    return folders


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit:
        main(list(argv))
    assert exit.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    line = error.splitlines()[-1]  # the error's one line (after any progress bar of the model's loading)
    assert line.startswith(f"hf-vlalign {argv[0]}: error: "), error
    return line


# ----------------------------------------------------------------------------------------------------------------
# Every verb on a user file
# ----------------------------------------------------------------------------------------------------------------


def test_probe_reads_the_captions_of_a_user_file(models, folder, tmp_path, capsys):
    out = run(capsys, "probe", str(models["vgp"]), "--data_file", str(folder / "caption.jsonl"), "--json", str(tmp_path / "p.json"))
    assert "caption.jsonl, single captions (2 captions)" in out
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["num_phrases"] == 2 and len(result["accuracy"]) == 2  # both phrases, 2 layers
    # the regions come from a grid after the whole image, not a detector: the baseline is each image's first region
    assert result["baseline_kind"] == "store_order" and "store_order_baseline" in result["paper_metrics"]
    assert "store-order baseline (each image's first stored region)" in out and "detection" not in out
    # the features were extracted once into the cache named in --help, at the model's visual_feat_dim
    stores = list((folder / "cache" / "user_features").iterdir())
    assert stores and json.loads((stores[0] / "store.json").read_text())


def test_analyze_reads_a_user_file_and_draws_its_own_photo(models, folder, tmp_path, capsys):
    printed = json.loads(run(capsys, "analyze", str(models["vgp"]), "--data_file", str(folder / "caption.jsonl"),
                             "--out", str(tmp_path / "analysis"), "--no_syntactic_grounding"))  # fmt: skip
    assert printed["data"].endswith("single captions (2 captions)") and printed["num_phrases"] == 2
    assert printed["baseline_kind"] == "store_order" and printed["best_among"]  # the baseline and the best head named
    report = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    assert report["grounding_probe"]["baseline_kind"] == "store_order"
    assert report["top_regions_on_image"]["image"] == str(folder / "photos" / "chelsea.png")
    assert (tmp_path / "analysis" / "top_regions_on_image.png").is_file()


@pytest.mark.parametrize("family", ["two_stream", "captioner"])
def test_explore_reads_a_user_file_with_every_family(family, tokenizer, folder, tmp_path, capsys):
    model = save_with_tokenizer(tiny_family_model(family, tokenizer), tokenizer, tmp_path / family)
    page = tmp_path / "page.html"
    run(capsys, "explore", str(model), "--data_file", str(folder / "caption.jsonl"), "--out", str(page), "--probe_examples", "2")
    payload = read_explorer_payload(page)
    assert [example["title"] for example in payload["examples"]] == [CAT, CUP]
    assert payload["probe"] is not None  # the phrases' gold boxes were probed


def test_explore_draws_each_example_on_its_own_photo(models, folder, tmp_path, capsys):
    page = tmp_path / "page.html"
    run(capsys, "explore", str(models["vgp"]), "--data_file", str(folder / "caption.jsonl"), "--out", str(page))
    payload = read_explorer_payload(page)
    examples = payload["examples"]
    assert payload["probe"]["baseline_name"].startswith("store-order baseline")  # grid regions: no detector
    assert payload["probe"]["examples"].startswith("all 2 examples of ")
    assert [example["title"] for example in examples] == [CAT, CUP]
    assert all(example["image"].startswith("data:image/") for example in examples)
    assert examples[0]["gold"][0]["text"] == "a cat" and examples[0]["size"] == [451, 300]


def test_explore_image_shows_only_the_rows_of_that_image(models, folder, tmp_path, capsys):
    page = tmp_path / "page.html"
    run(capsys, "explore", str(models["vgp"]), "--data_file", str(folder / "caption.jsonl"), "--out", str(page),
        "--image", str(folder / "photos" / "coffee.png"))  # fmt: skip
    assert [example["title"] for example in read_explorer_payload(page)["examples"]] == [CUP]


# captioning's METEOR starts a Java process (about 50 s here)
@pytest.mark.parametrize(
    "task", ["vgp", "vqa", "gqa", "nlvr2", "refcoco", "flickr_grounding", pytest.param("captioning", marks=pytest.mark.slow)]
)
def test_evaluate_reads_the_user_file_of_its_task(task, models, folder, tmp_path, capsys):
    data = {"vgp": "vgp", "vqa": "vqa", "gqa": "vqa", "nlvr2": "nlvr2", "refcoco": "refcoco"}.get(task, "caption")
    if task == "captioning":
        pytest.importorskip("pycocoevalcap")
    model = models["vqa" if task == "gqa" else task]
    results = json.loads(run(capsys, "evaluate", str(model), "--task", task, "--data_file", str(folder / f"{data}.jsonl")))
    assert results["data_file"] == str(folder / f"{data}.jsonl")
    counts = {
        "vgp": ("num_examples", 2), "vqa": ("num_questions", 2), "gqa": ("num_questions", 2),
        "nlvr2": ("num_examples", 3), "refcoco": ("num_expressions", 2), "flickr_grounding": ("num_phrases", 2),
        "captioning": ("num_images", 2),
    }  # fmt: skip
    key, count = counts[task]
    assert results[key] == count
    if task in ("vqa", "gqa"):  # soft scores over the model's own answers (answer_vocab.json)
        assert results["num_answers"] == 3 and 0.0 <= results["accuracy"] <= 1.0


def test_fisher_reads_a_user_vgp_file(models, folder, tmp_path, capsys):
    printed = json.loads(run(capsys, "fisher", str(models["vgp"]), "--data_file", str(folder / "vgp.jsonl"),
                             "--out", str(tmp_path / "fisher.safetensors"), "--batch_size", "2"))  # fmt: skip
    assert printed["data"] == str(folder / "vgp.jsonl") and printed["num_batches"] == 1 and printed["fisher_sum"] > 0


# ----------------------------------------------------------------------------------------------------------------
# Refusals, each one line
# ----------------------------------------------------------------------------------------------------------------


def test_explore_image_without_its_own_rows_is_refused(models, folder, tmp_path, capsys):
    photo = folder / "photos" / "rocket.jpg"  # a real photo that no caption row names
    out = str(tmp_path / "page.html")
    error = refused(capsys, "explore", str(models["vgp"]), "--out", out, "--image", str(photo))
    assert "has no text and boxes of its own" in error  # with the synthetic scenes: never overlaid
    error = refused(capsys, "explore", str(models["vgp"]), "--out", out, "--image", str(photo),
                    "--data_file", str(folder / "caption.jsonl"))  # fmt: skip
    assert "is named by no row of `data_file`" in error and "chelsea.png, coffee.png" in error
    assert not (tmp_path / "page.html").exists()


def test_a_missing_file_a_wrong_task_and_a_wrong_setting_are_refused(models, folder, tmp_path, capsys):
    model = str(models["vgp"])
    assert "the data file" in refused(capsys, "probe", model, "--data_file", str(tmp_path / "absent.jsonl"))
    error = refused(capsys, "probe", model, "--data_file", str(folder / "vqa.jsonl"))
    assert "the `caption` task needs the columns ['image', 'caption']; missing ['caption']" in error
    error = refused(capsys, "evaluate", str(models["refcoco"]), "--task", "refcoco", "--data_file", str(folder / "caption.jsonl"))
    assert "missing ['expression', 'box']" in error
    error = refused(capsys, "fisher", model, "--data", "synthetic", "--data_file", str(folder / "vgp.jsonl"), "--out", str(tmp_path / "f"))
    assert "`--data_file` applies only to `--data user_file`, not to `--data synthetic`" in error
    assert "`--data user_file` needs --data_file" in refused(capsys, "evaluate", model, "--task", "vgp", "--data", "user_file")
    error = refused(capsys, "fisher", model, "--data_file", str(folder / "vgp.jsonl"), "--split", "eval", "--out", str(tmp_path / "f"))
    assert "`--split` applies only to" in error


def test_a_file_without_grounded_phrases_is_refused_by_the_probe(models, folder, tmp_path, capsys):
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"image": str(folder / "photos" / "chelsea.png"), "caption": CAT}])
    error = refused(capsys, "probe", str(models["vgp"]), "--data_file", str(plain))
    assert "has no grounded phrases" in error and "the grounding probe" in error


def test_a_model_whose_features_cannot_be_made_from_images_is_refused(models, folder, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(models["vgp"], model)
    data = ["--data_file", str(folder / "caption.jsonl")]
    (model / "processor_config.json").write_text(json.dumps({"image_processor": {"encoder": "pixel", "feature_dim": 64}}))
    error = refused(capsys, "probe", str(model), *data)
    assert "makes 64-dimensional region features" in error and f"reads {FEATURE_DIM}" in error
    (model / "processor_config.json").write_text(json.dumps({"image_processor": {"encoder": None, "feature_dim": FEATURE_DIM}}))
    assert "features of a data file's images cannot be made" in refused(capsys, "probe", str(model), *data)


def test_region_options_follow_the_model():
    config = SingleStreamConfig(visual_feat_dim=48)
    assert region_options_for_model("no-folder", config) == {
        "grid_size": 4, "include_whole_image": True, "encoder": "pixel", "feature_dim": 48,
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The data file and its images are inputs
# ----------------------------------------------------------------------------------------------------------------


def test_outputs_never_meet_the_data_file_or_its_images(models, folder, capsys):
    data_file, photos = folder / "caption.jsonl", folder / "photos"
    before = {path.name: path.read_bytes() for path in (data_file, *photos.iterdir())}
    model = str(models["vgp"])
    cases = [
        (["explore", model, "--data_file", str(data_file), "--out", str(data_file)], "--out", "--data_file"),
        (["explore", model, "--data_file", str(data_file), "--out", str(photos / "chelsea.png")], "--out", "--data_file image chelsea.png"),
        (["analyze", model, "--data_file", str(data_file), "--out", str(photos)], "--out", "--data_file image"),
        (["probe", model, "--data_file", str(data_file), "--json", str(photos / "coffee.png")], "--json", "--data_file image coffee.png"),
        (["evaluate", str(models["vgp"]), "--task", "vgp", "--data_file", str(folder / "vgp.jsonl"), "--out", str(folder / "vgp.jsonl")],
         "--out", "--data_file"),
        (["fisher", model, "--data_file", str(folder / "vgp.jsonl"), "--out", str(photos / "chelsea.png")], "--out", "--data_file image chelsea.png"),
    ]  # fmt: skip
    for argv, output, given in cases:
        error = refused(capsys, *argv)
        assert f"`{output}`" in error and f"the input `{given}" in error, error
    assert {path.name: path.read_bytes() for path in (data_file, *photos.iterdir())} == before
