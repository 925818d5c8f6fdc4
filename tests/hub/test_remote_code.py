"""`save_with_remote_code`: a saved folder loads with `trust_remote_code=True` in a process where hf_vlalign cannot be
imported, and its outputs equal the saved model's."""

import ast
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForQuestionAnswering,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamForQuestionAnswering,
)
from hf_vlalign.hub.remote_code import REMOTE_CODE_FAMILIES, save_with_remote_code

B, T, R, DV = 2, 7, 4, 8

# run in the fresh process: hf_vlalign made unimportable first, then each folder loaded as remote code
LOADER = r"""
import json, sys
sys.modules["hf_vlalign"] = None  # `import hf_vlalign` (and any submodule) now raises ImportError
try:
    import hf_vlalign
except ImportError:
    pass
else:
    raise SystemExit("hf_vlalign is importable")
import torch, transformers
from safetensors.torch import load_file, save_file

for folder, auto_class, inputs_path, outputs_path in json.loads(sys.argv[1]):
    model = getattr(transformers, auto_class).from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        outputs = model(**load_file(inputs_path))
    tensors = {k: v.detach().clone().contiguous() for k, v in outputs.items() if isinstance(v, torch.Tensor)}
    save_file(tensors, outputs_path)
    loaded = sorted(name for name, module in sys.modules.items() if name.startswith("hf_vlalign") and module is not None)
    print(json.dumps({"module": type(model).__module__, "class": type(model).__name__, "hf_vlalign_modules": loaded}))
"""


def single_stream_config() -> SingleStreamConfig:
    return SingleStreamConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        visual_feat_dim=DV,
        attention_supervision="direct",
    )


def two_stream_config() -> TwoStreamConfig:
    return TwoStreamConfig(
        vocab_size=100,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        l_layers=2,
        r_layers=1,
        x_layers=2,
        visual_feat_dim=DV,
        num_qa_labels=5,
        task_alignment=True,
        alignment_top_k=2,
    )


def captioner_config() -> RegionCaptionerConfig:
    return RegionCaptionerConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=DV,
        max_position_embeddings=24, geometry_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1,
    )  # fmt: skip


def caption_inputs() -> dict[str, torch.Tensor]:
    inputs = tiny_inputs()
    regions = {key: inputs[key] for key in ("visual_feats", "visual_boxes", "visual_attention_mask")}
    return {**regions, "labels": torch.tensor([[5, 6, 7, 2, -100], [8, 9, 10, 11, 2]])}


def tiny_inputs(phrases: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, -2:] = 0
    visual_attention_mask = torch.ones(B, R, dtype=torch.long)
    visual_attention_mask[1, -1] = 0
    corners = torch.rand(B, R, 2, generator=generator) * 0.5
    alignment = torch.zeros(B, T, R)
    alignment[0, 1, 2] = 1.0
    alignment[1, 3, [0, 1]] = 0.5
    inputs = {
        "input_ids": torch.randint(1, 100, (B, T), generator=generator),
        "attention_mask": attention_mask,
        "visual_feats": torch.randn(B, R, DV, generator=generator),
        "visual_boxes": torch.cat([corners, corners + 0.1 + 0.4 * torch.rand(B, R, 2, generator=generator)], dim=-1),
        "visual_attention_mask": visual_attention_mask,
        "word_region_alignment": alignment,
    }
    if phrases:
        inputs["phrase1_mask"] = torch.zeros(B, T, dtype=torch.bool)
        inputs["phrase1_mask"][:, 1:3] = True
        inputs["phrase2_mask"] = torch.zeros(B, T, dtype=torch.bool)
        inputs["phrase2_mask"][:, 3:5] = True
    return inputs


def load_in_fresh_process(loads: list[tuple], tmp_path) -> list[tuple[dict, dict]]:
    """Loads each (folder, transformers auto class name, inputs) of `loads` in one subprocess without hf_vlalign (one
    interpreter start-up for all); each one's outputs and report."""
    jobs = []
    for index, (folder, auto_class, inputs) in enumerate(loads):
        inputs_path, outputs_path = tmp_path / f"inputs{index}.safetensors", tmp_path / f"outputs{index}.safetensors"
        save_file(inputs, str(inputs_path))
        jobs.append([str(folder), auto_class, str(inputs_path), str(outputs_path)])
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "hf_modules"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "",
    }
    result = subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(jobs)], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads(line) for line in result.stdout.strip().splitlines()[-len(jobs) :]]
    assert (tmp_path / "hf_modules").is_dir()  # the dynamic modules went to the tmp cache, not the home folder
    return [(load_file(job[3]), report) for job, report in zip(jobs, reports)]


def assert_same_outputs(model, inputs, loaded_outputs) -> None:
    model.eval()
    with torch.no_grad():
        expected = {k: v for k, v in model(**inputs).items() if isinstance(v, torch.Tensor)}
    assert set(loaded_outputs) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(loaded_outputs[key], value, rtol=0, atol=1e-5, msg=key)


# each family's model, the auto class it is saved for (None: the default), the one it is loaded with, its inputs
FAMILIES = {
    "single_stream": (lambda: SingleStreamModel(single_stream_config()), None, "AutoModel", tiny_inputs),
    "single_stream_vgp": (
        lambda: SingleStreamForVisualParaphrase(single_stream_config()),
        "AutoModelForSequenceClassification",
        "AutoModelForSequenceClassification",
        lambda: tiny_inputs(phrases=True),
    ),
    "single_stream_qa": (
        lambda: SingleStreamForQuestionAnswering(single_stream_config()), None, "AutoModelForVisualQuestionAnswering", tiny_inputs
    ),
    "two_stream_qa": (
        lambda: TwoStreamForQuestionAnswering(two_stream_config()), None, "AutoModelForVisualQuestionAnswering", tiny_inputs
    ),
    "captioner": (
        lambda: RegionCaptionerForConditionalGeneration(captioner_config()), None, "AutoModelForSeq2SeqLM", caption_inputs
    ),
}


@pytest.fixture(scope="module")
def loaded_without_hf_vlalign(tmp_path_factory) -> dict[str, tuple]:
    """Every family saved with remote code, then all loaded in one fresh process: name -> (model, folder, inputs,
    outputs of the loaded copy, the loading process's report)."""
    tmp_path = tmp_path_factory.mktemp("remote_code")
    saved = {}
    for name, (make_model, auto_class, loader_class, make_inputs) in FAMILIES.items():
        torch.manual_seed(0)
        model = make_model().eval()
        saved[name] = (model, save_with_remote_code(model, tmp_path / name, auto_class=auto_class), make_inputs())
    loaded = load_in_fresh_process(
        [(folder, FAMILIES[name][2], inputs) for name, (_, folder, inputs) in saved.items()], tmp_path
    )
    return {name: (*saved[name], *result) for name, result in zip(saved, loaded)}


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.slow
def test_loads_without_hf_vlalign(name, loaded_without_hf_vlalign):
    model, folder, inputs, outputs, report = loaded_without_hf_vlalign[name]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"][FAMILIES[name][2]].endswith(f".{type(model).__name__}")
    assert not hasattr(model.config, "auto_map")  # the in-memory config is left as it was
    assert report["class"] == type(model).__name__
    assert report["module"].startswith("transformers_modules.")
    assert report["hf_vlalign_modules"] == []
    assert_same_outputs(model, inputs, outputs)


def test_flat_code_is_self_contained(tmp_path):
    folder = save_with_remote_code(SingleStreamModel(single_stream_config()), tmp_path / "saved")
    files = {path.stem: path for path in folder.glob("*.py")}
    assert {"modeling_single_stream", "configuration_single_stream"} <= set(files)
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1 and not (node.module or "").startswith("hf_vlalign"), (name, node.lineno)
                if node.level == 1:
                    assert node.module in files, (name, node.module)
            if isinstance(node, ast.Import):
                assert all(not alias.name.startswith("hf_vlalign") for alias in node.names), name


def test_saved_weights_and_config_are_those_of_save_pretrained(tmp_path):
    model = SingleStreamModel(single_stream_config())
    model.save_pretrained(tmp_path / "plain")
    save_with_remote_code(model, tmp_path / "remote")
    plain, remote = (json.loads((tmp_path / name / "config.json").read_text()) for name in ("plain", "remote"))
    assert remote.pop("auto_map") == {
        "AutoConfig": "configuration_single_stream.SingleStreamConfig",
        "AutoModel": "modeling_single_stream.SingleStreamModel",
    }
    assert remote == plain
    weights_plain = load_file(str(tmp_path / "plain" / "model.safetensors"))
    weights_remote = load_file(str(tmp_path / "remote" / "model.safetensors"))
    assert weights_plain.keys() == weights_remote.keys()
    assert all(torch.equal(weights_plain[key], weights_remote[key]) for key in weights_plain)


def test_unsupported_model_raises(tmp_path):
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4))
    with pytest.raises(ValueError, match="`model` must be an instance of one of .*got transformers.*BertModel"):
        save_with_remote_code(bert, tmp_path / "bert")
    assert not (tmp_path / "bert").exists()


def test_bad_auto_class_raises(tmp_path):
    with pytest.raises(ValueError, match="`auto_class` must be the name of a transformers AutoModel class.*AutoConfig"):
        save_with_remote_code(SingleStreamModel(single_stream_config()), tmp_path / "saved", auto_class="AutoConfig")


def test_families_are_described():
    assert {"single_stream", "two_stream"} <= set(REMOTE_CODE_FAMILIES)
    assert REMOTE_CODE_FAMILIES["single_stream"].model_classes["SingleStreamModel"] == "AutoModel"
