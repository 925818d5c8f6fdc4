"""`hf-vlalign analyze` and `hf-vlalign evaluate` on saved models of the three families, over the synthetic scenes."""

import json

import pytest
from analysis_models import SCENES, SYNTHETIC_FLAGS, save_with_tokenizer, tiny_family_model

from hf_vlalign.cli import main
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.evaluation.model_analysis import analyze_model
from hf_vlalign.evaluation.tasks import evaluate_task

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")


@pytest.fixture(scope="module")
def single_stream_dir(tokenizer, tmp_path_factory):
    return save_with_tokenizer(tiny_family_model("single_stream", tokenizer), tokenizer, tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def two_stream_dir(tokenizer, tmp_path_factory):
    return save_with_tokenizer(tiny_family_model("two_stream", tokenizer), tokenizer, tmp_path_factory.mktemp("two"))


@pytest.fixture(scope="module")
def captioner_dir(tokenizer, tmp_path_factory):
    return save_with_tokenizer(tiny_family_model("captioner", tokenizer), tokenizer, tmp_path_factory.mktemp("captioner"))


PNGS = (
    "grounding_accuracy_per_head.png", "grounding_accuracy_per_layer.png", "attention_entropy.png",
    "attention_vs_distance.png", "word_region_heatmaps.png", "top_regions_on_image.png", "within_cluster_attention.png",
)


@pytest.mark.parametrize(
    "family, layers, heads, blocks",
    [
        ("single_stream_dir", 2, 4, {"word_to_word", "word_to_region", "region_to_region", "region_to_word"}),
        ("two_stream_dir", 2, 4, {"word_to_word", "word_to_region", "region_to_region", "region_to_word"}),
        ("captioner_dir", 2, 4, {"word_to_word", "decoder_cross", "region_to_region"}),
    ],
)
def test_analyze_writes_the_tables_and_plots(family, layers, heads, blocks, request, tmp_path, capsys):
    model_dir = request.getfixturevalue(family)
    out = tmp_path / "analysis"
    argv = ["analyze", str(model_dir), "--out", str(out), "--max_examples", "12", "--batch_size", "5", *SYNTHETIC_FLAGS]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads((out / "analysis.json").read_text(), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert report["num_examples"] == 12 and printed["num_phrases"] == report["grounding_probe"]["num_phrases"] > 0
    rows = report["grounding_probe_rows"]
    assert len(rows) == layers * heads and all(0.0 <= row["accuracy"] <= 1.0 for row in rows)
    assert {(row["layer"], row["head"]) for row in rows} == {(l, h) for l in range(layers) for h in range(heads)}
    entropy = report["attention_entropy"]
    assert {row["block"] for row in entropy} == blocks
    assert all(0.0 <= row["normalised_entropy"] <= 1.0 + 1e-6 for row in entropy if row["num_rows"])
    distance = report["attention_vs_distance"]
    assert distance and sum(row["num_pairs"] for row in distance) > 0
    # Ilinykh Analysis I on the region->region block (the captioner's encoder self-attention); the scenes' store has
    # the shape class of each region, so the clusters are the regions of one shape
    within = report["within_cluster_attention"]
    assert within["cluster_source"] == "detector_class" and within["plot"] == "within_cluster_attention.png"
    assert len(within["per_layer"]) == len({row["layer"] for row in distance})
    assert sum(row["num_rows"] for row in within["per_layer"]) > 0
    assert all(0.0 <= row["within"] <= 1.0 for row in within["per_layer"] if row["num_rows"])
    for name in PNGS:
        assert (out / name).stat().st_size > 1000, name
    # the scene's rendered image, drawn with the boxes the probe's best head attends to
    probe = report["grounding_probe"]
    drawn = report["top_regions_on_image"]
    assert drawn["png"] == "top_regions_on_image.png" and drawn["image"].endswith(".png")
    assert (drawn["layer"], drawn["head"]) == (probe["best_layer"], probe["best_head"])


def test_analyze_is_the_same_over_batch_sizes(single_stream_dir, tmp_path):
    small = analyze_model(single_stream_dir, tmp_path / "a", synthetic=SCENES, batch_size=3, max_examples=9, progress=False)
    large = analyze_model(single_stream_dir, tmp_path / "b", synthetic=SCENES, batch_size=9, max_examples=9, progress=False)
    assert small["grounding_probe"]["accuracy"] == large["grounding_probe"]["accuracy"]
    for a, b in zip(small["attention_entropy"], large["attention_entropy"]):
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-4, abs=1e-6)


def test_evaluate_vgp_counts_every_pair(single_stream_dir, tmp_path, capsys):
    out = tmp_path / "results.json"
    assert main(["evaluate", str(single_stream_dir), "--task", "vgp", "--out", str(out), *SYNTHETIC_FLAGS]) == 0
    results = json.loads(out.read_text())
    assert results == json.loads(capsys.readouterr().out)
    assert 0.0 <= results["vgp_accuracy"] <= 1.0 and 0.0 <= results["image_description_accuracy"] <= 1.0
    # accuracies are counts over the pairs: multiples of 1 / num_examples, VGP's over the pairs with a type
    labelled = results["vgp_labelled_pairs"]
    assert labelled + results["vgp_unlabelled_pairs"] == results["num_examples"]
    assert (results["vgp_accuracy"] * labelled) == pytest.approx(round(results["vgp_accuracy"] * labelled))
    assert sum(results[key] for key in results if key.startswith("vgp_type_count/")) == labelled
    # each accuracy beside the majority class of the scenes' training pairs (types: the typed pairs only)
    data = load_vgp_data(synthetic_config=SCENES)
    train_types = [label for label in data.train["type_label"] if label >= 0]
    majority = max(sorted(set(train_types)), key=train_types.count)
    eval_types = [label for label in data.eval["type_label"] if label >= 0]
    expected = sum(label == majority for label in eval_types) / len(eval_types)
    entry = results["baselines"]["vgp_accuracy"]
    assert entry == {"value": results["vgp_accuracy"], "baseline": pytest.approx(expected), "kind": "majority_class",
                     "beats": results["vgp_accuracy"] > expected}
    assert set(results["baselines"]) == {"image_description_accuracy", "vgp_accuracy"}


def test_evaluate_gqa_and_captioning(two_stream_dir, captioner_dir):
    gqa = evaluate_task(two_stream_dir, "gqa", synthetic=SCENES, batch_size=8, progress=False)
    assert set(gqa["computed"]) >= {"accuracy", "binary", "open"} and gqa["num_questions"] > 0
    assert 0.0 <= gqa["accuracy"] <= 1.0
    # the GQA script's accuracies beside those of the training split's most frequent answer
    assert set(gqa["baselines"]) == {"accuracy", "binary", "open"} & {key for key in gqa if gqa[key] is not None}
    for key, entry in gqa["baselines"].items():
        assert entry["kind"] == "majority_class" and entry["beats"] == (gqa[key] > entry["baseline"])
    captions = evaluate_task(captioner_dir, "captioning", synthetic=SCENES, batch_size=4, progress=False)
    assert captions["num_images"] == SCENES.num_val_images
    assert all(0.0 <= captions[key] <= 10.0 for key in ("bleu_4", "cider", "meteor", "rouge_l"))
    # `max_examples`: the first questions, the first images (with all their reference captions)
    first = evaluate_task(two_stream_dir, "gqa", synthetic=SCENES, batch_size=8, progress=False, max_examples=3)
    assert first["num_examples"] == first["num_questions"] == 3
    first = evaluate_task(captioner_dir, "captioning", synthetic=SCENES, batch_size=4, progress=False, max_examples=2)
    assert first["num_examples"] == first["num_images"] == 2
    assert "baselines" not in captions  # caption metrics have no accuracy baseline


def test_evaluate_refuses_a_model_of_another_task(single_stream_dir, tmp_path):
    with pytest.raises(ValueError, match=r"task 'captioning' needs a RegionCaptionerForConditionalGeneration model"):
        evaluate_task(single_stream_dir, "captioning", synthetic=SCENES)
    with pytest.raises(ValueError, match=r"`task` must be one of"):
        evaluate_task(single_stream_dir, "retrieval", synthetic=SCENES)
    with pytest.raises(ValueError, match=r"`max_examples` must be >= 1"):
        analyze_model(single_stream_dir, tmp_path, synthetic=SCENES, max_examples=0)


def test_analyze_reads_real_vgp_files(single_stream_dir, tmp_path, capsys):
    from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
    from hf_vlalign.synthetic import load_or_generate_synthetic_vgp

    # the synthetic scenes written in the published formats, read back as real files: the same analysis
    paths = load_or_generate_synthetic_vgp(config=SCENES)
    store = synthetic_region_features(config=SCENES)
    files = ["--flickr30k_entities_dir", str(paths.flickr30k_entities), "--vgp_train_csv", str(paths.vgp_csv["train"]),
             "--vgp_eval_csv", str(paths.vgp_csv["val"]), "--features", str(store.directory)]  # fmt: skip
    argv = ["analyze", str(single_stream_dir), "--data", "vgp", "--max_examples", "10", "--batch_size", "5"]
    assert main([*argv, "--out", str(tmp_path / "real"), *files]) == 0
    synthetic = analyze_model(
        single_stream_dir, tmp_path / "synthetic", synthetic=SCENES, batch_size=5, max_examples=10, progress=False
    )
    real = json.loads((tmp_path / "real" / "analysis.json").read_text())
    assert real["grounding_probe"] == synthetic["grounding_probe"] and real["data"].startswith("VGP caption pairs")
    # real VGP files come without their images: no boxes-on-image figure, and analysis.json says why
    assert "no image" in real["top_regions_on_image"]["skipped"] and not (tmp_path / "real" / "top_regions_on_image.png").exists()
    assert synthetic["top_regions_on_image"]["png"] == "top_regions_on_image.png"
    capsys.readouterr()
    with pytest.raises(SystemExit, match="2"):  # a user mistake: one line on stderr, exit status 2
        main([*argv, "--out", str(tmp_path / "x"), *files[:-2]])
    assert capsys.readouterr().err.splitlines()[-1] == "hf-vlalign analyze: error: `--data vgp` needs --features."


def test_make_analyze_figures_copies_every_png(single_stream_dir, tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "make_analyze_figures.py"
    spec = importlib.util.spec_from_file_location("make_analyze_figures", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    analysis, images = tmp_path / "analysis", tmp_path / "images"
    analysis.mkdir()
    (analysis / "stale.png").write_bytes(b"not this run's")  # a figure of an earlier run is not copied
    argv = ["--model", str(single_stream_dir), "--analysis_dir", str(analysis), "--out_dir", str(images),
            "--no_syntactic_grounding", *SYNTHETIC_FLAGS]  # fmt: skip
    paths = script.main(argv)
    assert sorted(p.name for p in paths) == sorted(f"analyze_{name}" for name in PNGS)
    assert all((images / p.name).read_bytes() == (analysis / p.name.removeprefix("analyze_")).read_bytes() for p in paths)
