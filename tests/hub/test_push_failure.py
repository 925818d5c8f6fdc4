"""A failed push to the Hub costs nothing local: the examples push last, and a failure raises `HubPushError` naming the
complete local folder. Only the Hub's HTTP side (`HfApi.create_repo` / `HfApi.upload_folder`) is faked."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from launch_helpers import save_tiny_bert
from transformers import AutoTokenizer

from hf_vlalign import SingleStreamForVisualParaphrase
from hf_vlalign.hub import HubPushError, push_folder_to_hub

# end-to-end: each test runs an example, a launch or a whole training
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def load_example(name: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


def test_a_failed_create_repo_names_the_complete_local_folder(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")

    def offline(self, repo_id, **kwargs):
        raise OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/repos/create: offline mode is enabled.")

    monkeypatch.setattr(HfApi, "create_repo", offline)
    with pytest.raises(HubPushError) as raised:
        push_folder_to_hub(tmp_path, repo_id="someone/model", commit_message="test")
    message = str(raised.value)
    assert f"The local output folder {tmp_path.resolve()} is complete" in message
    assert "OfflineModeIsEnabled" in message and "hf upload someone/model" in message
    assert isinstance(raised.value.__cause__, OfflineModeIsEnabled)
    assert raised.value.folder == tmp_path.resolve() and (tmp_path / "config.json").read_text() == "{}"


def test_finetune_vgp_push_failure_leaves_a_complete_loadable_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    output_dir = tmp_path / "vgp"
    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id))
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        # what the push saw: every local file already written
        calls.append(("upload_folder", Path(folder_path), sorted(p.name for p in Path(folder_path).iterdir())))
        raise HfHubHTTPError("503 Server Error: Service Unavailable for url: https://huggingface.co/api/models")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    example = load_example("finetune_vgp", monkeypatch)
    arguments = [
        "--output_dir", str(output_dir), "--synthetic_train_images", "12", "--synthetic_eval_images", "6",
        "--num_train_epochs", "1", "--per_device_train_batch_size", "16", "--supervision", "direct",
        "--push_to_hub", "--hub_model_id", "someone/vgp-direct", "--use_cpu",
        "--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny_bert")),
    ]  # fmt: skip
    with pytest.raises(HubPushError, match=rf"local output folder {output_dir.resolve()} is complete"):
        example.main(arguments)

    expected = {
        "model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md",
        "eval_results.json", "grounding_probe.json", "training_args.json", "attention_heatmap.png",
        "grounding_accuracy_per_head.png",
    }  # fmt: skip
    assert calls[0] == ("create_repo", "someone/vgp-direct")
    assert calls[1][0] == "upload_folder" and calls[1][1] == output_dir.resolve()
    assert expected <= set(calls[1][2])  # the upload came after every local file
    present = {path.name for path in output_dir.iterdir()}
    assert expected <= present and not any(name.startswith(".") for name in present)
    results = json.loads((output_dir / "eval_results.json").read_text())
    assert 0.0 <= results["vgp_accuracy"] <= 1.0
    model = SingleStreamForVisualParaphrase.from_pretrained(output_dir)
    assert model.config.attention_supervision == "direct"
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    encoded = tokenizer(["a red square"], return_tensors="pt")
    assert encoded["input_ids"].shape[0] == 1 and torch.isfinite(model.id_classifier.weight).all()
