"""`hf-vlalign probe`, `analyze` and `explore` of transformers' own patch models (saved tiny LLaVA and ViLT), the
errors they give for options a patch model does not read, and `examples/finetune_patch_vlm.py` end to end (a LoRA
adapter with supervision and activation checkpointing)."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from script_modules import ROOT, load_script
from transformers import AutoProcessor

from hf_vlalign.analysis.explorer import read_explorer_payload, stored_maps
from hf_vlalign.cli import main
from hf_vlalign.synthetic import SyntheticSceneConfig
from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
from hf_vlalign.vlms import PatchGroundingCollator, grounded_caption_examples, probe_patch_model
from hf_vlalign.vlms.families import model_inputs
from hf_vlalign.vlms.loading import is_patch_model, load_patch_model
from hf_vlalign.vlms.tiny import tiny_patch_model, word_level_tokenizer

SCENES = ["--synthetic_train_images", "12", "--synthetic_eval_images", "6"]


@pytest.fixture(scope="module")
def scenes():
    return load_or_generate_synthetic_vgp(config=SyntheticSceneConfig(num_train_images=12, num_val_images=6))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, scenes):
    """Folders of a tiny LLaVA and a tiny ViLT with their processors (word-level tokenizer over the captions)."""
    train, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "train")
    folders = {}
    for family in ("llava", "vilt"):
        tokenizer = word_level_tokenizer(example["caption"] for example in train)
        model, processor = tiny_patch_model(family, tokenizer=tokenizer, seed=3)
        folder = tmp_path_factory.mktemp(family)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        folders[family] = folder
    return folders


def test_a_saved_patch_model_loads_with_its_class_and_processor(saved):
    model, processor = load_patch_model(str(saved["llava"]))
    assert type(model).__name__ == "LlavaForConditionalGeneration" and not model.training
    assert processor.tokenizer.convert_ids_to_tokens(model.config.image_token_id) == "<image>"
    assert is_patch_model(str(saved["vilt"])) and not is_patch_model(str(saved["vilt"] / "missing"))


@pytest.mark.parametrize("family", ["llava", "vilt"])
def test_probe_prints_and_writes_what_the_python_probe_gives(saved, scenes, tmp_path, capsys, family):
    out = tmp_path / "probe.json"
    assert main(["probe", str(saved[family]), *SCENES, "--json", str(out), "--plot", str(tmp_path / "p.png")]) == 0
    printed = capsys.readouterr().out
    assert "centre-patch baseline" in printed and "detection-confidence" not in printed
    result = json.loads(out.read_text())
    model, processor = load_patch_model(str(saved[family]))
    examples, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "val")
    collator = PatchGroundingCollator(processor, model.config, with_labels=False)
    torch.manual_seed(0)
    expected = probe_patch_model(model, [collator(examples[i : i + 32]) for i in range(0, len(examples), 32)])
    assert result["num_examples"] == len(examples) == 30
    assert result["num_phrases"] == expected.num_phrases
    assert result["baseline_accuracy"] == pytest.approx(expected.baseline_accuracy)
    if family == "llava":  # ViLT samples its patch order anew each forward: the same set, another order
        assert torch.allclose(torch.tensor(result["accuracy"], dtype=torch.float64), torch.from_numpy(expected.accuracy))
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_probe_reads_flickr30k_entities_with_its_images(saved, scenes, tmp_path):
    out = tmp_path / "probe.json"
    flags = ["--data", "flickr30k_entities", "--flickr30k_entities_dir", str(scenes.flickr30k_entities),
             "--images_dir", str(scenes.images), "--split", "val", "--max_images", "2"]  # fmt: skip
    assert main(["probe", str(saved["llava"]), *flags, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["num_examples"] == 10 and "Flickr30k Entities val (2 images)" in result["data"]


def test_analyze_writes_the_probe_and_its_plots(saved, tmp_path):
    out = tmp_path / "analysis"
    assert main(["analyze", str(saved["llava"]), *SCENES, "--out", str(out)]) == 0
    report = json.loads((out / "analysis.json").read_text())
    probe = report["grounding_probe"]
    assert report["model_family"] == "llava" and report["coverage_threshold"] == 0.5
    assert len(probe["accuracy"]) == 2 and len(probe["accuracy"][0]) == 4
    assert probe["best_head_of_layer"] == [max(row) for row in probe["accuracy"]]
    for name in ("grounding_probe.png", "best_head_attention.png"):
        assert (out / name).stat().st_size > 10_000


@pytest.mark.parametrize("family", ["llava", "vilt"])
def test_explore_draws_the_image_under_its_patch_grid(saved, tmp_path, family):
    page = tmp_path / "explorer.html"
    assert main(["explore", str(saved[family]), *SCENES, "--out", str(page), "--num_examples", "2",
                 "--probe_examples", "8"]) == 0  # fmt: skip
    data = read_explorer_payload(page)
    assert len(data["examples"]) == 2 and data["source"] == family
    assert "patch" in data["probe"]["rule"] and data["probe"]["baseline_name"] == "centre-patch baseline"
    example = data["examples"][0]
    cells = sorted(tuple(box) for box in example["regions"])  # the 4 x 4 grid of the 64-pixel image, each cell once
    assert cells == sorted((c / 4, r / 4, (c + 1) / 4, (r + 1) / 4) for r in range(4) for c in range(4))
    assert example["size"] == [64, 64] and example["image"].startswith("data:image/png;base64,")
    assert set(example["attention"]) == ({"word_to_region", "region_to_word"} if family == "vilt" else {"word_to_region"})
    # each layer's mean over heads and the probe's best heads (8 of the 2 x 4: all), each map one byte per weight
    spec = data["views"]["word_to_region"]
    assert spec["shape"] == [2, 4] and spec["heads"][:2] == [[0, -1], [1, -1]] and data["probe"]["best"] in spec["heads"]
    assert len(spec["heads"]) == 2 + 8 and data["colour_scale"] == "row_max"
    maps = torch.from_numpy(stored_maps(example["attention"]["word_to_region"]))
    assert maps.shape == (10, len(example["words"]), 16)
    # rows re-normalised over the patches, each weight within 1/510 of its row's largest
    assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1], dtype=maps.dtype), atol=16 / 510)
    assert example["gold"] and all(example["words"][phrase["tokens"][-1]] for phrase in example["gold"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--data", "vgp"], "reads `--data synthetic` or `--data flickr30k_entities` or `--data user_file`, got `--data vgp`"),
        (["--features", "x"], "`--features` does not apply to a transformers patch model"),
        (["--data", "flickr30k_entities", "--flickr30k_entities_dir", "x"], "needs --images_dir"),
    ],
)
def test_options_a_patch_model_does_not_read_are_refused(saved, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["probe", str(saved["llava"]), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_images_dir_is_refused_for_a_region_model(tmp_path, capsys):
    from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase

    SingleStreamForVisualParaphrase(SingleStreamConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=64)).save_pretrained(tmp_path)  # fmt: skip
    with pytest.raises(SystemExit):
        main(["probe", str(tmp_path), "--images_dir", str(tmp_path)])
    assert "`--images_dir` applies only to transformers' patch models" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])  # one grid; dynamic resolution with its 2 x 2 merge
def test_the_example_fine_tunes_a_lora_adapter_with_supervision_and_probes(tmp_path, family):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    out = tmp_path / "run"
    argv = [
        *SCENES, "--output_dir", str(out), "--tiny_family", family, "--attention_supervision", "direct", "--supervised_layers", "1",
        "--tiny_layers", "2", "--tiny_image_size", "64", "--max_steps", "3", "--per_device_train_batch_size", "8",
        "--report_to", "none", "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
        "--attn_implementation", "eager",  # the supervision records the model's own kernel
        "--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.0", "--activation_checkpointing",
    ]  # fmt: skip
    results = example.main(argv)
    saved = json.loads((out / "eval_results.json").read_text())
    assert saved["eval_loss_attention"] > 0 and saved["eval_loss_task"] > 0
    # the mechanism diagnostics: minus the caption loss with the own / another image, the supervision's first and last
    # training logs
    diagnostics = saved["diagnostics"]
    assert diagnostics["caption"]["image_score"] == -saved["eval_loss_task"] == -saved["image_use"]["own_image_loss"]
    assert diagnostics["caption"]["text_only_score"] == -saved["image_use"]["shuffled_image_loss"]
    assert diagnostics["attention_loss_start"] > 0 and diagnostics["attention_loss_end"] > 0
    # the probe read the peft-wrapped model
    assert saved["grounding_probe"]["num_phrases"] == results["grounding_probe"]["num_phrases"] > 0
    assert saved["data"]["eval"]["captions"] == 30 and saved["data"]["phrases_cut_by_max_text_length"] == 0
    assert saved["model_family"] == family
    # the adapter alone is saved (LoRA matrices of the language model), with the processor
    adapter = load_file(out / "adapter_model.safetensors")
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    assert adapter and all(".lora_" in name and ".language_model." in name for name in adapter)
    assert len(AutoProcessor.from_pretrained(out).tokenizer) < 200
    # the untouched base (rebuilt from the same seed) with the adapter gives the evaluation's caption loss: the
    # training moved no base weight
    args, training_args = example.parse_args(argv)
    train, evaluation, _, _ = example.load_examples(args)
    base, processor = example.load_model(args, training_args.seed, train)
    model = PeftModel.from_pretrained(base, out).eval()
    batch = PatchGroundingCollator(processor, base.config)(evaluation)
    with torch.no_grad():
        loss = model(**model_inputs(batch)).loss
        with model.disable_adapter():
            base_loss = model(**model_inputs(batch)).loss
    assert float(loss) == pytest.approx(saved["eval_loss_task"], abs=1e-5)
    assert abs(float(base_loss) - float(loss)) > 1e-3  # the adapter was trained


def test_the_example_loads_a_saved_model_in_the_dtype_asked(saved):
    example = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    args, _ = example.parse_args(["--model_name_or_path", str(saved["llava"]), "--dtype", "bfloat16"])
    model, _ = example.load_model(args, 0, [])
    assert model.dtype == torch.bfloat16
    args.dtype = "bf16"
    expected = r"`--dtype` must be one of \('auto', 'bfloat16', 'float16', 'float32'\), got 'bf16'"
    with pytest.raises(ValueError, match=expected):
        example.load_model(args, 0, [])
