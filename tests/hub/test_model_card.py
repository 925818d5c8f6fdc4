"""Hub model cards rendered from model_cards/<family>.md (single_stream, two_stream, captioner)."""

import configparser
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from hf_vlalign import RegionCaptionerConfig, SingleStreamConfig, TwoStreamConfig
from hf_vlalign.evaluation.baselines import BASELINE_KINDS
from hf_vlalign.hub.model_card import MODEL_CARD_FAMILIES, is_task_metric, metrics_from_eval_results, render_model_card

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
RESULTS = {"vgp_accuracy": 0.8125, "grounding_probe_best_head_accuracy": 0.4375}
TRAINING = {"epochs": 3, "learning_rate": 5e-05, "attention_supervision_weight": 1.0}


def render(**overrides):
    arguments = dict(
        model_id="someone/vgp-direct",
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        supervision="direct",
        results=RESULTS,
        training=TRAINING,
    )
    arguments.update(overrides)
    return render_model_card("single_stream", **arguments)


def test_metadata():
    card = render()
    assert card.data.library_name == "hf_vlalign"
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.license == "apache-2.0"
    for tag in ("vision-language", "attention-supervision", "visual-grounding", "direct-supervision"):
        assert tag in card.data.tags
    header = card.content.split("---")[1]
    assert "library_name: hf_vlalign" in header
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in header
    assert "model-index" in header
    assert {result.metric_type: result.metric_value for result in card.data.eval_results} == RESULTS


def test_body_has_results_loading_training_and_citations():
    text = render().text
    assert "| vgp_accuracy | 0.8125 |" in text
    assert "| grounding_probe_best_head_accuracy | 0.4375 |" in text
    assert "import hf_vlalign" in text
    assert 'AutoModel.from_pretrained("someone/vgp-direct")' in text
    assert "| learning_rate | 5e-05 |" in text
    assert "**direct** attention supervision" in text
    assert "Attending Self-Attention" in text and "Samaran" in text
    assert "What Does {BERT} with Vision Look At?" in text and "Li, Liunian Harold" in text


def test_synthetic_data_limitation_only_when_synthetic():
    synthetic = render(datasets=None)
    assert "Trained on synthetic data" in synthetic.text
    assert "synthetic-data" in synthetic.data.tags
    real = render(datasets=["nlphuji/flickr_1k_test_image_text_retrieval"])
    assert "Trained on synthetic data" not in real.text
    assert real.data.datasets == ["nlphuji/flickr_1k_test_image_text_retrieval"]
    assert "`nlphuji/flickr_1k_test_image_text_retrieval`" in real.text


def test_local_base_model_stays_out_of_metadata(tmp_path):
    card = render(base_model=str(tmp_path), model_id=None, supervision="semi-direct", results={})
    assert card.data.base_model is None
    assert str(tmp_path) in card.text
    assert 'AutoModel.from_pretrained("path/to/checkpoint")' in card.text
    assert "No evaluation results" in card.text
    assert "**semi-direct** attention supervision" in card.text


def test_round_trip_through_readme(tmp_path):
    card = render()
    path = tmp_path / "README.md"
    card.save(path)
    loaded = ModelCard.load(path)
    assert loaded.data.to_dict() == card.data.to_dict()
    assert loaded.text == card.text
    assert loaded.data.eval_results[0].metric_value == 0.8125


def test_templates_are_shipped_with_wheels():
    """Every family has a template in model_cards/, and setup.cfg's data_files install that folder."""
    for family in MODEL_CARD_FAMILIES:
        assert (REPOSITORY_ROOT / "model_cards" / f"{family}.md").is_file()
    setup = configparser.ConfigParser()
    setup.read(REPOSITORY_ROOT / "setup.cfg")
    data_files = setup["options.data_files"]["share/hf_vlalign/model_cards"].split()
    assert "model_cards/*.md" in data_files


def two_stream_config(**overrides) -> TwoStreamConfig:
    fields = dict(hidden_size=32, num_attention_heads=4, l_layers=1, r_layers=1, x_layers=2, task_alignment=True)
    return TwoStreamConfig(**{**fields, **overrides})


def captioner_config(**overrides) -> RegionCaptionerConfig:
    fields = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4)
    return RegionCaptionerConfig(**{**fields, **overrides})


def test_two_stream_card_describes_the_alignment_decoder_and_supervision(tmp_path):
    results = {"vqa_accuracy": 0.5, "cross_attention_grounding_accuracy": 0.375}
    card = render_model_card(
        "two_stream",
        model_id="someone/two-stream",
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        results=results,
        training={"epochs": 2},
        config=two_stream_config(attention_supervision="direct", alignment_top_k=2),
        subfolder="with_alignment",
    )
    assert card.data.library_name == "hf_vlalign" and card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    for tag in ("two-stream", "alignment-decoder", "direct-supervision", "attention-supervision", "hf_vlalign"):
        assert tag in card.data.tags
    assert {r.metric_type: r.metric_value for r in card.data.eval_results} == results
    assert {r.task_type for r in card.data.eval_results} == {"visual-question-answering"}
    text = card.text
    assert "**object-word alignment decoder**" in text and "top-2 objects per word" in text
    assert "**direct** attention supervision" in text
    assert 'from_pretrained("someone/two-stream", subfolder="with_alignment")' in text
    assert "| task_alignment | True |" in text and "| vqa_accuracy | 0.5 |" in text
    assert "Kervadec" in text and "{LXMERT}" in text
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert "model-index" in loaded.data.to_dict() and loaded.data.to_dict() == card.data.to_dict()

    baseline = render_model_card(
        "two_stream", model_id=None, base_model=None, results={}, training={},
        config=two_stream_config(task_alignment=False),
    )  # fmt: skip
    assert "**without** the object-word alignment loss" in baseline.text
    assert "alignment-decoder" not in baseline.data.tags
    assert "No evaluation results" in baseline.text and baseline.data.eval_results is None


def test_captioner_card_describes_geometry_and_a2_fusion(tmp_path):
    card = render_model_card(
        "captioner",
        model_id="someone/captioner",
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        results={"cider": 1.25, "alignment": 0.5},
        training={"epochs": 2, "scst_start_epoch": 1},
        config=captioner_config(attention_alignment="exp_decay", use_geometry=True),
    )
    for tag in ("captioner", "image-captioning", "geometry-aware-attention", "attention-alignment", "a2-exp-decay"):
        assert tag in card.data.tags
    assert {r.task_type for r in card.data.eval_results} == {"image-to-text"}
    text = card.text
    assert "**geometry-aware**" in text and "fusion `exp_decay`" in text and "exponentially decaying" in text
    assert "self-critical" in text and "AutoModelForRegionCaptioning.from_pretrained(\"someone/captioner\")" in text
    assert "| use_geometry | True |" in text and "Fei" in text and "Ilinykh" in text
    card.save(tmp_path / "README.md")
    assert ModelCard.load(tmp_path / "README.md").data.to_dict() == card.data.to_dict()

    plain = render_model_card(
        "captioner", model_id=None, base_model=None, results={}, training={},
        config=captioner_config(attention_alignment="none", use_geometry=False),
    )  # fmt: skip
    assert "**plain** self-attention" in plain.text and "**not aligned**" in plain.text
    assert "geometry-aware-attention" not in plain.data.tags and "attention-alignment" not in plain.data.tags
    assert "self-critical" not in plain.text


def test_supervision_is_read_from_the_config():
    card = render_model_card(
        "single_stream", model_id=None, base_model=None, results={}, training={},
        config=SingleStreamConfig(hidden_size=32, num_attention_heads=4, attention_supervision="indirect"),
    )  # fmt: skip
    assert "**indirect** attention supervision" in card.text and "indirect-supervision" in card.data.tags


def test_metrics_from_eval_results_keeps_finite_floats_only():
    eval_results = {
        "vqa_accuracy": 0.5, "steps": 3, "enabled": True, "data": "synthetic", "per_layer": [0.1, 0.2],
        "alignment_loss": None, "bad": float("nan"), "nested": {"a": 1.0},
    }  # fmt: skip
    assert metrics_from_eval_results(eval_results) == {"vqa_accuracy": 0.5}
    assert metrics_from_eval_results({"cider": 1.0}, prefix="run/") == {"run/cider": 1.0}


def test_model_index_lists_task_metrics_only_and_the_table_every_result(tmp_path):
    # the float entries of a real VGP run's eval_results.json (examples/finetune_vgp.py) and of a two-stream run
    results = {
        "image_description_accuracy": 0.79, "vgp_accuracy": 0.85, "grounding_accuracy_best_head": 0.87,
        "grounding_accuracy_mean_head": 0.78, "grounding_baseline_accuracy": 0.19, "eval_loss": 3.7, "loss_id": 0.5,
        "loss_vgp": 0.34, "loss_attention_supervision": 2.86, "with_alignment/loss_mlm": 1.2, "test_loss_own_image": 1.18,
        "eval_runtime": 12.5, "eval_samples_per_second": 40.0, "epoch": 2.0,
    }  # fmt: skip
    card = render(results=results)
    card.save(tmp_path / "README.md")
    listed = {r.metric_type for r in ModelCard.load(tmp_path / "README.md").data.eval_results}
    assert listed == {"image_description_accuracy", "vgp_accuracy", "grounding_accuracy_best_head",
                      "grounding_accuracy_mean_head"}  # fmt: skip
    assert "| loss_attention_supervision | 2.86 |" in card.text and "| grounding_baseline_accuracy | 0.19 |" in card.text
    assert is_task_metric("bleu_4") and is_task_metric("run/cider") and not is_task_metric("run/eval_loss")
    only_losses = render(results={"eval_loss": 1.0, "loss_attention_supervision": 0.5})
    assert only_losses.data.eval_results is None and "model-index" not in only_losses.content.split("---")[1]


@pytest.mark.parametrize("family", ["single_stream", "two_stream", "captioner"])
def test_every_family_card_shows_the_baselines_and_flags_a_result_below_its_baseline(family):
    results = {"alignment": 0.3, "bleu_4": 0.2}
    baselines = {"alignment": {"value": 0.3, "baseline": 0.35, "kind": "detection_confidence", "beats": False}}
    card = render_model_card(family, model_id=None, base_model=None, results=results, training={}, baselines=baselines)
    assert "| alignment | 0.3 | 0.35 (most confident region) ⚠ does not beat the most confident region baseline |" in card.text
    assert "| bleu_4 | 0.2 |  |" in card.text  # caption metrics have no accuracy baseline
    assert "**⚠ 1 result(s) do not beat their baseline (alignment)" in card.text


def test_a_store_order_baseline_is_named_as_such_in_the_card():
    # a probe over grid regions (no detector): its baseline is each image's first stored region, never "most confident"
    results = {"alignment": 0.5}
    baselines = {"alignment": {"value": 0.5, "baseline": 0.35, "kind": "store_order", "beats": True}}
    card = render_model_card("single_stream", model_id=None, base_model=None, results=results, training={}, baselines=baselines)
    assert "| alignment | 0.5 | 0.35 (first stored region) |" in card.text
    assert "*first stored region* predicts the image's first region as the region store holds it" in card.text
    assert "confident" not in card.text
    # every kind of baseline has its name and legend in the card
    for kind in BASELINE_KINDS:
        entry = {"alignment": {**baselines["alignment"], "kind": kind}}
        text = render_model_card("single_stream", model_id=None, base_model=None, results=results, training={}, baselines=entry).text
        assert "0.35 ()" not in text and "Baselines: ** predicts" not in text and "predicts ." not in text, kind
