"""What the region models have, for transformers' patch models too: one's own data (the `caption` and `refcoco` user
formats) in `examples/finetune_patch_vlm.py` and in `probe` / `analyze` / `explore --data_file`, any family loaded by
its class (ViLT has no `AutoModelForImageTextToText`), the model card, the push after saving, `results-table`, the
"word-region-attention" pipeline with the model's own processor, and the refusal of an unsupported VLM."""

from __future__ import annotations

import json
import re

import pytest
import torch
from PIL import Image
from script_modules import ROOT, load_script
from transformers import MllamaConfig, pipeline

from hf_vlalign.analysis.explorer import read_explorer_payload
from hf_vlalign.cli import build_parser, main, results_table
from hf_vlalign.data.builders.user_data import UserDataError
from hf_vlalign.hub import HubPushError
from hf_vlalign.recipes import patch_user_splits
from hf_vlalign.vlms import PATCH_MODEL_TYPES, PatchGroundingCollator
from hf_vlalign.vlms.loading import load_patch_model
from hf_vlalign.vlms.tiny import tiny_patch_model
from hf_vlalign.vlms.user_data import user_file_examples

COLOURS = ("red", "blue", "green", "white", "black")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A `caption` file and a `refcoco` file over five 64 x 48 images."""
    folder = tmp_path_factory.mktemp("user_data")
    for colour in COLOURS:
        Image.new("RGB", (64, 48), colour).save(folder / f"{colour}.png")
    captions = [
        {"image": f"{colour}.png", "caption": f"a {colour} square on the left",
         "phrases": [{"text": f"a {colour} square", "boxes": [[0, 0, 32, 48]]}]}
        for colour in COLOURS
    ]  # fmt: skip
    expressions = [{"image": f"{colour}.png", "expression": f"the {colour} top", "box": [0, 0, 64, 24]} for colour in COLOURS]
    for name, rows in (("captions.jsonl", captions), ("refs.jsonl", expressions)):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folders = {}
    for family in ("llava", "vilt"):
        model, processor = tiny_patch_model(family, seed=1)
        folder = tmp_path_factory.mktemp(family)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        folders[family] = folder
    return folders


def test_a_caption_file_and_a_refcoco_file_become_grounded_captions(files, saved):
    examples, counts = user_file_examples(files / "captions.jsonl", "caption")
    assert counts == {"images": 5, "captions": 5, "phrases": 5, "phrases_without_box": 0}
    first = examples[0]
    assert first["caption"] == "a red square on the left" and first["image_path"] == str(files / "red.png")
    assert first["phrases"] == [{"char_start": 0, "char_end": 12, "boxes": [[0.0, 0.0, 32.0, 48.0]]}]
    # a referring expression is one phrase over the whole text, grounded in its box
    references, _ = user_file_examples(files / "refs.jsonl", "refcoco")
    assert references[1]["phrases"] == [{"char_start": 0, "char_end": 12, "boxes": [[0.0, 0.0, 64.0, 24.0]]}]
    # the collator reads them: the left half of the centre crop is covered
    model, processor = load_patch_model(str(saved["llava"]))
    batch = PatchGroundingCollator(processor, model.config)(examples[:2])
    coverage = batch["phrase_cell_coverage"][0, 0].view(4, 4)
    assert torch.equal(coverage[:, :2] > 0.5, torch.ones(4, 2, dtype=torch.bool))
    assert not (coverage[:, 3] > 0).any()


def test_the_splits_hold_out_whole_images_or_read_the_validation_file(files):
    train, evaluation, counts, source = patch_user_splits(files / "captions.jsonl", None, "caption", seed=0)
    assert len(evaluation) == 2 and len(train) == 3 and "held out for evaluation" in source
    assert not {row["image_path"] for row in train} & {row["image_path"] for row in evaluation}
    train, evaluation, counts, _ = patch_user_splits(files / "captions.jsonl", files / "captions.jsonl", "caption", seed=0)
    assert counts["train"]["captions"] == counts["eval"]["captions"] == 5


def test_a_bad_file_is_refused_naming_its_line_and_column(files, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"image": str(files / "red.png"), "caption": "a dog", "phrases": [{"text": "a cat", "boxes": [[0, 0, 5, 5]]}]}) + "\n")
    with pytest.raises(UserDataError, match=r"bad.jsonl, line 1: `phrases\[0\].text` 'a cat' is not in the text"):
        user_file_examples(bad, "caption")
    with pytest.raises(ValueError, match=r"task must be one of \('caption', 'refcoco'\), got 'vqa'"):
        user_file_examples(bad, "vqa")


def test_the_example_trains_a_saved_vilt_on_a_refcoco_file_then_saves_its_card_before_the_push(files, saved, tmp_path):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    out = tmp_path / "run"
    argv = [
        "--model_name_or_path", str(saved["vilt"]), "--train_file", str(files / "refs.jsonl"),
        "--user_data_task", "refcoco", "--attention_supervision", "direct", "--output_dir", str(out),
        "--max_steps", "2", "--report_to", "none", "--disable_tqdm", "true",
        "--push_to_hub", "--hub_model_id", "someone/vilt-refs",  # offline in the tests: the push fails, last
    ]  # fmt: skip
    with pytest.raises(HubPushError, match="is complete"):
        example.main(argv)
    results = json.loads((out / "eval_results.json").read_text())
    assert results["model_family"] == "vilt" and results["supervision"] == "direct"
    assert results["data"]["train"]["captions"] == 3 and results["data"]["eval"]["captions"] == 2
    assert results["grounding_accuracy_best_head"] == results["grounding_probe"]["best_head_accuracy"]
    assert results["baselines"]["grounding_accuracy_best_head"]["kind"] == "centre_patch"
    card = (out / "README.md").read_text()
    assert "A transformers `ViltModel` (vilt) fine-tuned from" in card and "user data (refs.jsonl)" in card
    assert "**direct** attention supervision" in card and "grounding_accuracy_best_head" in card
    assert (out / "training_args.json").is_file() and not (out / "training_args.bin").exists()
    model, _ = load_patch_model(str(out))
    assert type(model).__name__ == "ViltModel"
    row = results_table([out]).splitlines()[2]
    assert row.startswith("| direct | n/a | n/a | n/a | n/a | ") and "(centre patch)" in row


def test_the_example_refuses_mixed_data_sources_and_unknown_tasks(files):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    with pytest.raises(ValueError, match="`--validation_file` applies only to your own data"):
        example.parse_args(["--validation_file", str(files / "refs.jsonl")])
    with pytest.raises(ValueError, match=r"`--user_data_task` must be one of \('caption', 'refcoco'\), got 'vqa'"):
        example.parse_args(["--train_file", str(files / "refs.jsonl"), "--user_data_task", "vqa"])


def test_the_example_refuses_an_encoder_without_supervision_before_training(files, tmp_path):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    argv = ["--tiny_family", "vilt", "--train_file", str(files / "refs.jsonl"), "--user_data_task", "refcoco",
            "--output_dir", str(tmp_path / "run"), "--report_to", "none"]  # fmt: skip
    with pytest.raises(ValueError, match="`--attention_supervision` is needed for a ViltModel: its batches carry no"):
        example.main(argv)
    assert not (tmp_path / "run").exists()


def test_the_example_refuses_an_unsupported_vlm_before_loading_it(tmp_path):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    MllamaConfig().save_pretrained(tmp_path)  # a cross-attention VLM: its config alone, no weights
    args, _ = example.parse_args(["--model_name_or_path", str(tmp_path)])
    expected = re.escape(f"holds a MllamaConfig (mllama); hf_vlalign reads the transformers vision-language models of "
                         f"the model types {', '.join(PATCH_MODEL_TYPES)}")
    with pytest.raises(ValueError, match=r"`--model_name_or_path` .* " + expected):
        example.load_model(args, 0, [])


@pytest.mark.parametrize("verb", ["probe", "analyze", "explore"])
def test_the_grounding_verbs_read_a_user_file_with_a_patch_model(files, saved, tmp_path, capsys, verb):
    out = tmp_path / ("probe.json" if verb == "probe" else "analysis" if verb == "analyze" else "page.html")
    option = "--json" if verb == "probe" else "--out"
    assert main([verb, str(saved["llava"]), "--data_file", str(files / "captions.jsonl"), option, str(out)]) == 0
    if verb == "probe":
        result = json.loads(out.read_text())
        assert result["num_examples"] == 5 and result["num_phrases"] == 5
        assert "captions.jsonl (5 captions, 5 images)" in result["data"]
    elif verb == "analyze":
        assert json.loads((out / "analysis.json").read_text())["num_examples"] == 5
    else:
        assert read_explorer_payload(out)["examples"][0]["gold"][0]["text"] == "a red square"
        # `--image`: only the rows of that image
        argv = [str(saved["llava"]), "--data_file", str(files / "captions.jsonl"), "--image", str(files / "blue.png")]
        assert main([verb, *argv, "--out", str(out)]) == 0
        assert [example["gold"][0]["text"] for example in read_explorer_payload(out)["examples"]] == ["a blue square"]


def test_an_unsupported_vlm_is_refused_naming_the_supported_families(tmp_path, capsys):
    MllamaConfig().save_pretrained(tmp_path)  # a cross-attention VLM, saved without its tokenizer
    with pytest.raises(SystemExit):
        main(["probe", str(tmp_path)])
    message = capsys.readouterr().err
    assert "holds a" in message and "(mllama)" in message and "no tokenizer" not in message
    assert f"transformers' vision-language models of the families {', '.join(PATCH_MODEL_TYPES)}" in message
    for verb in ("probe", "analyze", "explore"):
        parser = build_parser()._subparsers._group_actions[0].choices[verb]
        assert "transformers vision-language model" in parser.format_help().replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("family", ["llava", "vilt"])
def test_the_pipeline_reads_a_patch_model_with_its_own_processor(saved, files, tmp_path, family):
    reader = pipeline("word-region-attention", model=str(saved[family]))
    result = reader(str(files / "red.png"), text="a red square", top_k=2, explorer=tmp_path / "page.html")
    assert [word["word"] for word in result["words"]] == ["a", "red", "square"]
    boxes = torch.tensor(result["region_boxes"])
    weights = torch.tensor([word["weights"] for word in result["words"]])
    assert boxes.shape == ((16 if family == "llava" else 20), 4) and torch.allclose(weights.sum(-1), torch.ones(3), atol=1e-5)
    # the image tokens' boxes tile the part of the 64 x 48 image the model sees, in its pixels
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).sum()
    seen = 48 * 48 if family == "llava" else 64 * 48  # LLaVA's CLIP crops the centre square, ViLT resizes the whole
    assert float(area) == pytest.approx(seen, rel=1e-3)
    assert boxes[:, 2].max() <= 64 and boxes[:, 3].max() <= 48
    top = result["words"][2]["top_boxes"][0]
    assert top["weight"] == pytest.approx(max(result["words"][2]["weights"]))
    assert read_explorer_payload(tmp_path / "page.html")["source"] == family
    with pytest.raises(ValueError, match="`text_pair` and `boxes` apply to hf_vlalign's region models"):
        reader(str(files / "red.png"), text="a red square", boxes=[[0, 0, 5, 5]])
    with pytest.raises(ValueError, match="must be 1 \\(each example runs alone\\), got 2"):
        reader([str(files / "red.png")] * 2, text=["a", "b"], batch_size=2)
    # a list of examples, one result each
    assert [len(one["words"]) for one in reader([str(files / "red.png")] * 2, text=["a red", "square"])] == [2, 1]
