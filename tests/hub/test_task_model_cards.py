"""Hub model cards of the downstream tasks and the single-stream pre-training, rendered from model_cards/task.md by
`render_task_model_card`: metadata that survives a save / `ModelCard.load` round trip, a loading snippet that really
loads the checkpoint with the task's Auto class, the attention-supervision settings of the config, the synthetic-data
limitation only for synthetic data."""

from __future__ import annotations

import configparser
import fnmatch
import re
from pathlib import Path

import pytest
import transformers
from huggingface_hub import ModelCard
from transformers import AutoTokenizer

import hf_vlalign
from hf_vlalign import SingleStreamConfig, TwoStreamConfig, default_text_model_path
from hf_vlalign.hub.model_card import TASK_CARD_TASKS, _find_template, render_task_model_card

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
RESULTS = {"accuracy": 0.625, "eval_loss": 0.6931}
TRAINING = {"max_steps": 4, "learning_rate": 5e-05}
SYNTHETIC_NAME = "synthetic grounded scenes (hf_vlalign)"

# task -> (Auto class, where it lives, model class suffix, model-index task type, a tag of the task)
EXPECTED = {
    "question_answering": ("AutoModelForVisualQuestionAnswering", transformers, "ForQuestionAnswering",
                           "visual-question-answering", "visual-question-answering"),
    "visual_reasoning": ("AutoModelForVisualReasoning", hf_vlalign, "ForVisualReasoning", "visual-reasoning", "nlvr2"),
    "referring_expression": ("AutoModelForReferringExpression", hf_vlalign, "ForReferringExpression",
                             "referring-expression-comprehension", "referring-expression-comprehension"),
    "phrase_grounding": ("AutoModelForPhraseGrounding", hf_vlalign, "ForPhraseGrounding", "phrase-grounding",
                         "phrase-grounding"),
    "pretraining": ("AutoModelForPreTraining", transformers, "ForPreTraining", "vision-language-pretraining",
                    "masked-language-modeling"),
}  # fmt: skip
PAIRS = [(task, family) for task in TASK_CARD_TASKS for family in ("single_stream", "two_stream")]
PAIRS.remove(("pretraining", "two_stream"))  # the two-stream pre-training has its own card


def tiny_config(family: str, **overrides):
    sizes = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    fields = dict(visual_feat_dim=16, num_qa_labels=5, attention_supervision="direct", **sizes)
    if family == "single_stream":
        return SingleStreamConfig(**{**fields, "num_hidden_layers": 2, "num_object_labels": 3, **overrides})
    return TwoStreamConfig(**{**fields, "l_layers": 1, "r_layers": 1, "x_layers": 2, **overrides})


def render(task: str, family: str, **overrides):
    arguments = dict(
        model_family=family,
        model_id=f"someone/{family}-{task}",
        base_model=BASE_MODEL,
        results=RESULTS,
        training=TRAINING,
        config=tiny_config(family),
    )
    return render_task_model_card(task, **{**arguments, **overrides})


def python_snippet(text: str) -> str:
    """The loading snippet: the card's first ```python block."""
    return re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


@pytest.mark.parametrize("task, family", PAIRS)
def test_card_round_trip_metadata_and_body(task, family, tmp_path):
    auto_class, _, head, task_type, task_tag = EXPECTED[task]
    card = render(task, family)
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert loaded.data.to_dict() == card.data.to_dict() and loaded.text == card.text

    data = loaded.data
    assert data.library_name == "hf_vlalign" and data.base_model == BASE_MODEL and data.license == "apache-2.0"
    assert data.pipeline_tag == ("visual-question-answering" if task == "question_answering" else None)
    assert {r.metric_name: r.metric_value for r in data.eval_results} == {"accuracy": 0.625}  # no loss in model-index
    assert {(r.task_type, r.dataset_name, r.dataset_type) for r in data.eval_results} == {
        (task_type, SYNTHETIC_NAME, "synthetic-grounded-scenes")
    }
    assert data.model_name == f"{family}-{task}"  # the model-index name
    for tag in ("vision-language", task_tag, family.replace("_", "-"), "hf_vlalign", "synthetic-data"):
        assert tag in data.tags
    supervised = task != "visual_reasoning"  # the NLVR2 heads take no word-region alignment
    assert ("direct-supervision" in data.tags) is supervised
    assert ("attention-supervision" in data.tags) is supervised

    text = loaded.text
    snippet = python_snippet(text)
    assert snippet.startswith("import hf_vlalign")
    prefix = "" if auto_class in ("AutoModelForVisualQuestionAnswering", "AutoModelForPreTraining") else "hf_vlalign."
    assert f'model = {prefix}{auto_class}.from_pretrained("someone/{family}-{task}")' in snippet
    if not prefix:
        assert f"from transformers import {auto_class}, AutoTokenizer" in snippet
    model_class = ("SingleStream" if family == "single_stream" else "TwoStream") + head
    assert f"# {model_class}" in snippet
    assert "| attention_supervision | direct |" in text and "| attention_supervision_weight | 1.0 |" in text
    assert ("| x_layers | 2 |" if family == "two_stream" else "| num_hidden_layers | 2 |") in text
    assert "**direct** attention supervision" in text
    assert ("takes no word-region alignment" in text) is not supervised
    assert "| accuracy | 0.625 |" in text and "| eval_loss | 0.6931 |" in text
    assert "| max_steps | 4 |" in text and "| learning_rate | 5e-05 |" in text
    assert "Trained on synthetic data" in text
    assert ("{LXMERT}" in text) is (family == "two_stream" or task in ("question_answering", "visual_reasoning"))
    if family == "single_stream":
        assert "arXiv:1908.03557" in text and "arXiv:1908.08530" in text  # VisualBERT, VL-BERT
    assert "Samaran" in text if supervised else "Samaran" not in text


@pytest.mark.parametrize("task, family", PAIRS)
def test_loading_snippet_loads_the_task_model(task, family, tmp_path, tokenizer):
    """The card's snippet, run as written against a saved checkpoint, gives the task's model class."""
    auto_class, module, head, _, _ = EXPECTED[task]
    config = tiny_config(family)
    model = getattr(module, auto_class).from_config(config)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    card = render(task, family, model_id=str(tmp_path), config=config)
    namespace = {}
    exec(python_snippet(card.text), namespace)
    assert type(namespace["model"]).__name__ == type(model).__name__
    assert type(model).__name__.endswith(head) and f"# {type(model).__name__}" in card.text
    assert namespace["tokenizer"].vocab_size == tokenizer.vocab_size


def test_task_specific_objectives_and_settings():
    qa = render("question_answering", "two_stream").text
    assert "over\n5 candidate answers" in qa and "| num_qa_labels | 5 |" in qa and "`logits` (B, 5)" in qa
    nlvr2 = render("visual_reasoning", "single_stream").text
    assert "two pooled [CLS] states are concatenated" in nlvr2 and "`visual_feats` (B, 2, R, D)" in nlvr2
    config = tiny_config("single_stream", referring_iou_threshold=0.6)
    refcoco = render("referring_expression", "single_stream", config=config)
    assert '"IoU with the referred box >= 0.6"' in refcoco.text and "| referring_iou_threshold | 0.6 |" in refcoco.text
    assert "IoU >= 0.5 with the gold box" in refcoco.text
    grounding = render("phrase_grounding", "two_stream").text
    assert "KL divergence" in grounding and "Recall@k" in grounding and "`phrase_masks` (B, P, T)" in grounding
    pretraining = render("pretraining", "single_stream").text
    assert "masked language modelling with the image" in pretraining and "two captions" in pretraining
    assert "classified into the detector's 3 classes" in pretraining and "| mlm_weight | 1.0 |" in pretraining
    assert "`seq_relationship_logits` (B, 2)" in pretraining


def test_real_dataset_names_objective_and_citation():
    vqa = render("question_answering", "single_stream", dataset_name="vqa_v2")
    assert "Trained on synthetic data" not in vqa.text and "synthetic-data" not in vqa.data.tags
    assert {(r.dataset_name, r.dataset_type) for r in vqa.data.eval_results} == {("VQA v2", "vqa_v2")}
    assert "binary cross-entropy over the answers' soft" in vqa.text and "cross-entropy.\n" not in vqa.text
    assert "Goyal, Yash" in vqa.text and "Hudson" not in vqa.text
    gqa = render("question_answering", "two_stream", dataset_name="gqa")
    assert "trained with cross-entropy" in gqa.text and "Hudson, Drew A." in gqa.text and "Goyal" not in gqa.text

    refcoco = render("referring_expression", "two_stream", datasets=["someone/refcoco-plus"])
    assert refcoco.data.datasets == ["someone/refcoco-plus"] and "Trained on synthetic data" not in refcoco.text
    assert {r.dataset_name for r in refcoco.data.eval_results} == {"someone/refcoco-plus"}
    assert "Modeling Context in Referring Expressions" in refcoco.text

    flickr = render("phrase_grounding", "single_stream", synthetic_data=False)  # real data read from a local folder
    assert {r.dataset_name for r in flickr.data.eval_results} == {"Flickr30k Entities"}
    assert "Trained on synthetic data" not in flickr.text and "Plummer, Bryan A." in flickr.text
    assert "Suhr, Alane" in render("visual_reasoning", "two_stream", dataset_name="nlvr2").text


def test_without_supervision_or_config(tmp_path):
    config = tiny_config("single_stream", attention_supervision="none")
    plain = render("referring_expression", "single_stream", config=config)
    assert "No attention supervision was used" in plain.text and "| attention_supervision | none |" in plain.text
    assert "attention-supervision" not in plain.data.tags and "Samaran" not in plain.text

    no_config = render(
        "phrase_grounding", "two_stream", config=None, model_id=None, base_model=str(tmp_path), results={},
        subfolder="pg",
    )  # fmt: skip
    assert "configuration was not given" in no_config.text and "| model setting |" not in no_config.text
    assert no_config.data.base_model is None and str(tmp_path) in no_config.text  # a local path is not a Hub id
    assert no_config.data.eval_results is None and "No evaluation results" in no_config.text
    assert 'AutoModelForPhraseGrounding.from_pretrained("path/to/checkpoint", subfolder="pg")' in no_config.text
    assert no_config.data.model_name is None and no_config.text.startswith("\n# two-stream-phrase-grounding\n")


def test_template_is_found_in_the_checkout_and_shipped_with_wheels():
    """`_find_template` reads model_cards/task.md of the checkout; setup.cfg's `model_cards/*.md` ships it in wheels
    (to `share/hf_vlalign/model_cards/`, where `_find_template` looks in an installed distribution)."""
    assert _find_template("task") == REPOSITORY_ROOT / "model_cards" / "task.md"
    setup = configparser.ConfigParser()
    setup.read(REPOSITORY_ROOT / "setup.cfg")
    patterns = setup["options.data_files"]["share/hf_vlalign/model_cards"].split()
    assert any(fnmatch.fnmatch("model_cards/task.md", pattern) for pattern in patterns)


def test_results_stand_beside_their_baselines_and_a_result_below_its_baseline_is_flagged():
    results = {"accuracy": 0.625, "vqa_accuracy_yes_no": 0.5, "eval_loss": 0.6931}
    baselines = {  # the `baselines` entry of eval_results.json (`compare_with_baselines`)
        "accuracy": {"value": 0.625, "baseline": 0.4, "kind": "majority_class", "beats": True},
        "vqa_accuracy_yes_no": {"value": 0.5, "baseline": 0.55, "kind": "majority_class_per_type", "beats": False},
    }
    card = render("question_answering", "single_stream", results=results, baselines=baselines)
    text = ModelCard(str(card)).text
    assert "| metric | value | baseline |" in text
    assert "| accuracy | 0.625 | 0.4 (majority class) |" in text
    assert (
        "| vqa_accuracy_yes_no | 0.5 | 0.55 (majority class per answer type) ⚠ does not beat the majority class per "
        "answer type baseline |"
    ) in text
    assert "| eval_loss | 0.6931 |  |" in text  # a loss has no baseline
    assert "**⚠ 1 result(s) do not beat their baseline (vqa_accuracy_yes_no)" in text
    assert "Baselines: *majority class* predicts the most frequent training label" in text
    assert "*majority class per answer type* predicts each answer type" in text and "largest region" not in text
    # without baselines the table keeps its two columns and no warning
    plain = render("question_answering", "single_stream", results=results).text
    assert "| metric | value |\n|---|---|\n| accuracy | 0.625 |" in plain and "⚠" not in plain
