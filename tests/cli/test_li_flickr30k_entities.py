"""Li et al.'s setting from the CLI, end to end on the real Flickr30k Entities sample: `hf-vlalign probe` and
`hf-vlalign analyze --data flickr30k_entities` read each val caption alone with its image's regions (features written in
LXMERT's TSV layout for the sample's image ids, converted to a store with `hf-vlalign convert-features`), for a saved
hf_vlalign single-stream model and for a converted VisualBERT checkpoint; the results carry the paper's metric names."""

import json

import pytest
import torch
from published_features import write_lxmert_tsv_features
from shared_samples import real_sample
from transformers import VisualBertConfig, VisualBertModel

from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase
from hf_vlalign.cli import main

NUM_IMAGES = 2  # the first val images of the sample (five captions each)
FEATURE_DIM = 16  # published_features' default


@pytest.fixture(scope="module")
def flickr30k_entities():
    return real_sample("flickr30k_entities")


@pytest.fixture(scope="module")
def store(flickr30k_entities, tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    image_ids = (flickr30k_entities / "val.txt").read_text().split()[:NUM_IMAGES]
    tsv = write_lxmert_tsv_features(folder / "val_obj36.tsv", image_ids)
    out = folder / "store"
    assert main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def trained_model_dir(tokenizer, tmp_path_factory):
    torch.manual_seed(0)
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=80, visual_feat_dim=FEATURE_DIM,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("single_stream")
    SingleStreamForVisualParaphrase(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def visualbert_dir(tokenizer, tmp_path_factory):
    """A tiny random transformers VisualBERT, converted with `hf-vlalign convert --from visualbert`."""
    torch.manual_seed(0)
    config = VisualBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        visual_embedding_dim=FEATURE_DIM, max_position_embeddings=128,
    )  # fmt: skip
    source = tmp_path_factory.mktemp("visualbert")
    VisualBertModel(config).save_pretrained(source)
    tokenizer_dir = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(tokenizer_dir)
    out = tmp_path_factory.mktemp("converted") / "visualbert"
    argv = ["convert", str(source), "--from", "visualbert", "--out", str(out), "--tokenizer", str(tokenizer_dir)]
    assert main(argv) == 0
    return out


def data_flags(flickr30k_entities, store):
    return [
        "--data", "flickr30k_entities", "--flickr30k_entities_dir", str(flickr30k_entities), "--split", "val",
        "--features", str(store), "--max_images", str(NUM_IMAGES), "--batch_size", "8",
    ]  # fmt: skip


@pytest.mark.parametrize("model", ["trained_model_dir", "visualbert_dir"])
def test_probe_on_flickr30k_entities_single_captions(model, flickr30k_entities, store, tmp_path, request, capsys):
    model_dir = request.getfixturevalue(model)
    path, plot = tmp_path / "probe.json", tmp_path / "probe.png"
    argv = ["probe", str(model_dir), *data_flags(flickr30k_entities, store), "--json", str(path), "--plot", str(plot)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["data"].startswith(f"Flickr30k Entities val, single captions ({5 * NUM_IMAGES} captions)")
    assert len(result["accuracy"]) == 2 and len(result["accuracy"][0]) == 4 and result["num_phrases"] > 0
    metrics = result["paper_metrics"]
    for key in ("entity_grounding_accuracy", "entity_grounding_accuracy_best_head", "best_head_active_share",
                "entity_grounding_accuracy_best_head_per_layer", "detection_confidence_baseline"):  # fmt: skip
        assert key in metrics
    layer, head = metrics["best_head"]
    assert metrics["best_head_active_share"] == pytest.approx(result["active_share"][layer][head])
    assert "detection-confidence baseline" in table and "active share" in table
    assert plot.stat().st_size > 0


@pytest.mark.parametrize("model, clusters", [("trained_model_dir", "auto"), ("visualbert_dir", "spatial")])
def test_analyze_on_flickr30k_entities_single_captions(model, clusters, flickr30k_entities, store, tmp_path, request):
    model_dir = request.getfixturevalue(model)
    out = tmp_path / "analysis"
    argv = ["analyze", str(model_dir), *data_flags(flickr30k_entities, store), "--out", str(out), "--cluster_source", clusters]
    assert main(argv) == 0
    report = json.loads((out / "analysis.json").read_text())
    assert report["data"].startswith("Flickr30k Entities val, single captions")
    probe = report["grounding_probe"]
    assert probe["best_among"] in ("active heads", "all heads (no head is actively attending)")
    assert probe["best_head_active_share"] is not None and probe["baseline_accuracy"] is not None

    syntactic = report["syntactic_grounding"]
    assert syntactic["parser"].startswith("en_core_web_sm") and syntactic["num_arcs"] > 0
    for key in ("syntactic_grounding_accuracy_best_head", "best_head_active_share", "detection_confidence_baseline"):
        assert set(syntactic[key]) == {row["relation"] for row in syntactic["top_relations"]}
    for row in syntactic["top_relations"]:
        assert row["active_share"] == pytest.approx(syntactic["relations"]["active_share"][row["layer"]][row["head"]])

    within = report["within_cluster_attention"]
    # the sample's features draw 10 of 1600 detector classes per image, so classes rarely repeat: "auto" reads them
    expected = {"auto": "detector_class", "spatial": "spatial"}[clusters]
    assert within["cluster_source"] == expected and len(within["per_layer"]) == 2
    if clusters == "spatial":
        assert all(row["num_rows"] > 0 and 0.0 <= row["within"] <= 1.0 for row in within["per_layer"])
    for png in ("grounding_accuracy_per_head.png", "grounding_accuracy_per_layer.png", "syntactic_grounding.png",
                "within_cluster_attention.png", "attention_entropy.png", "attention_vs_distance.png"):  # fmt: skip
        assert (out / png).stat().st_size > 0, png


def test_flickr30k_entities_data_mistakes_are_one_line(trained_model_dir, flickr30k_entities, store, tmp_path, capsys):
    flags = data_flags(flickr30k_entities, store)
    without_features = flags[: flags.index("--features")] + flags[flags.index("--features") + 2 :]
    mistakes = [
        (["probe", str(trained_model_dir), *without_features], "`--data flickr30k_entities` needs --features"),
        (["analyze", str(trained_model_dir), *flags, "--vgp_eval_csv", "x.csv", "--out", str(tmp_path)],
         "`--vgp_eval_csv` applies only to `--data vgp`, not to `--data flickr30k_entities`: drop it."),
    ]  # fmt: skip
    for argv, message in mistakes:
        with pytest.raises(SystemExit, match="2"):
            main(argv)
        assert message in capsys.readouterr().err


def test_probe_best_head_among_all_heads(trained_model_dir, flickr30k_entities, store, tmp_path):
    path = tmp_path / "probe.json"
    argv = ["probe", str(trained_model_dir), *data_flags(flickr30k_entities, store), "--json", str(path)]
    assert main([*argv, "--best_head_among", "all"]) == 0
    result = json.loads(path.read_text())
    assert result["best_among"] == "all heads"
    assert result["best_head_accuracy"] == max(max(row) for row in result["accuracy"])
