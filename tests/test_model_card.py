"""Hub model cards rendered from model_cards/single_stream.md."""

import configparser
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from hf_vlalign.hub.model_card import MODEL_CARD_FAMILIES, render_model_card


REPOSITORY_ROOT = Path(__file__).resolve().parents[1]
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


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="single_stream"):
        render_model_card("triple_stream", model_id=None, base_model=None, supervision="direct", results={}, training={})
    with pytest.raises(ValueError, match="supervision"):
        render(supervision="magic")
    with pytest.raises(ValueError, match="results"):
        render(results={"vgp_accuracy": float("nan")})
    with pytest.raises(ValueError, match="datasets"):
        render(datasets="nlphuji/flickr30k")


def test_templates_are_shipped_with_wheels():
    """Every family has a template in model_cards/, and setup.cfg's data_files install that folder."""
    for family in MODEL_CARD_FAMILIES:
        assert (REPOSITORY_ROOT / "model_cards" / f"{family}.md").is_file()
    setup = configparser.ConfigParser()
    setup.read(REPOSITORY_ROOT / "setup.cfg")
    data_files = setup["options.data_files"]["share/hf_vlalign/model_cards"].split()
    assert "model_cards/*.md" in data_files
