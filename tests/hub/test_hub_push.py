"""The push path loses nothing: for every model family, a saved checkpoint (safetensors, config, tokenizer,
eval_results.json, model card) pushed with `push_folder_to_hub` loads back from the "remote" copy with the same
outputs, and its model card carries valid metadata. Only the Hub's HTTP side is faked: `HfApi.create_repo` and
`HfApi.upload_folder` write into a local folder standing for the Hub."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard
from test_captioning import caption_labels, regions
from test_captioning import tiny_config as captioning_config
from test_single_stream import tiny_batch as single_stream_batch
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_batch as two_stream_batch
from test_two_stream import tiny_config as two_stream_config
from transformers import AutoTokenizer
from transformers.utils import ModelOutput

from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    SingleStreamForVisualParaphrase,
    TwoStreamForPreTraining,
    default_text_model_path,
)
from hf_vlalign.hub import push_folder_to_hub
from hf_vlalign.hub.model_card import MODEL_CARD_FAMILIES, metrics_from_eval_results, render_model_card

BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def single_stream():
    batch = single_stream_batch()
    return SingleStreamForVisualParaphrase(single_stream_config()), batch, {
        "vgp_accuracy": 0.75,
        "grounding_accuracy_best_head": 0.5,
        "supervision": "direct",
        "best_head": [1, 2],
    }


def two_stream():
    return TwoStreamForPreTraining(two_stream_config()), two_stream_batch(), {
        "vqa_accuracy": 0.625,
        "cross_attention_grounding_accuracy": 0.375,
        "alignment_decoder_grounding_accuracy": 0.5,
        "alignment_loss_enabled": True,
    }


def captioner():
    config = captioning_config(attention_alignment="gate", use_geometry=True)
    return RegionCaptionerForConditionalGeneration(config), {**regions(), "labels": caption_labels()}, {
        "bleu_4": 0.25,
        "cider": 1.5,
        "alignment": 0.4,
        "alignment_per_layer": [0.3, 0.4],
        "attention_alignment": "gate",
    }


FAMILIES = {"single_stream": single_stream, "two_stream": two_stream, "captioner": captioner}


def assert_same_outputs(expected: ModelOutput, actual: ModelOutput) -> None:
    assert expected.keys() == actual.keys()
    for key in expected.keys():
        first, second = expected[key], actual[key]
        if isinstance(first, torch.Tensor):
            assert torch.equal(first, second), key
        elif isinstance(first, (tuple, list)):
            assert len(first) == len(second), key
            for a, b in zip(first, second):
                assert not isinstance(a, torch.Tensor) or torch.equal(a, b), key


def test_every_family_is_covered():
    assert set(FAMILIES) == set(MODEL_CARD_FAMILIES)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pushed_checkpoint_loads_back_unchanged_with_a_valid_card(family, tmp_path, fake_hub):
    torch.manual_seed(0)
    model, batch, eval_results = FAMILIES[family]()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())

    output_dir = tmp_path / "output"
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "eval_results.json").write_text(json.dumps(eval_results, indent=2) + "\n")
    metrics = metrics_from_eval_results(json.loads((output_dir / "eval_results.json").read_text()))
    card = render_model_card(
        family,
        model_id=f"someone/{family}",
        base_model=BASE_MODEL,
        results=metrics,
        training={"epochs": 1, "learning_rate": 1e-4},
        config=model.config,
    )
    card.save(output_dir / "README.md")

    commit_url = push_folder_to_hub(output_dir, repo_id=f"someone/{family}", commit_message="test push")
    assert commit_url.startswith(f"https://huggingface.co/someone/{family}/commit/")
    pushed = fake_hub / "someone" / family

    names = {path.name for path in pushed.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "eval_results.json"} <= names
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in names)

    reloaded = type(model).from_pretrained(pushed).eval()
    assert reloaded.config.to_diff_dict() | {"_name_or_path": ""} == model.config.to_diff_dict() | {"_name_or_path": ""}
    with torch.no_grad():
        assert_same_outputs(model(**batch), reloaded(**batch))
    text = ["a red square left of a blue circle"]
    assert AutoTokenizer.from_pretrained(pushed)(text)["input_ids"] == tokenizer(text)["input_ids"]

    loaded = ModelCard.load(pushed / "README.md")
    metadata = loaded.data.to_dict()
    assert metadata["library_name"] == "hf_vlalign"
    assert metadata["base_model"] == BASE_MODEL
    assert {"vision-language", "hf_vlalign", family.replace("_", "-")} <= set(metadata["tags"])
    (entry,) = metadata["model-index"]
    assert entry["name"] == family
    reported = {m["type"]: m["value"] for result in entry["results"] for m in result["metrics"]}
    assert reported == {name: value for name, value in eval_results.items() if isinstance(value, float)}
    assert json.loads((pushed / "eval_results.json").read_text()) == eval_results
