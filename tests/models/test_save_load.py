"""Nothing saved is lost: every model class round-trips exactly through save_pretrained / from_pretrained (weights,
tied weights, buffers, outputs bit for bit); loading into a mismatching config fails naming the keys and shapes, or
warns naming every re-initialised weight; saves are atomic (an interrupted save leaves the previous checkpoint)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers.modeling_utils
from test_captioning import regions
from test_captioning import tiny_config as captioning_config
from test_single_stream import tiny_batch as single_stream_batch
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_batch as two_stream_batch
from test_two_stream import tiny_config as two_stream_config
from transformers import PreTrainedModel
from transformers.utils import logging as transformers_logging

from hf_vlalign import (
    RegionCaptionerForConditionalGeneration,
    RegionCaptionerModel,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    TwoStreamForPreTraining,
    TwoStreamForQuestionAnswering,
    TwoStreamForVisualReasoning,
    TwoStreamModel,
)
from hf_vlalign.models.saving import CheckpointMismatchError, publish_saved_folder

ROOT = Path(__file__).resolve().parents[2]


def single_stream_inputs(with_heads: bool) -> dict[str, torch.Tensor]:
    batch = single_stream_batch()
    drop = ("id_labels", "vgp_labels") if with_heads else ("phrase1_mask", "phrase2_mask", "id_labels", "vgp_labels")
    return {key: value for key, value in batch.items() if key not in drop}


def two_stream_pair_inputs() -> dict[str, torch.Tensor]:
    batch = two_stream_batch()
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "visual_feats": torch.stack([batch["visual_feats"], batch["visual_feats"].flip(0)], dim=1),
        "visual_boxes": torch.stack([batch["visual_boxes"], batch["visual_boxes"]], dim=1),
        "visual_attention_mask": torch.ones(3, 2, 5, dtype=torch.long),
    }


def captioning_inputs() -> dict[str, torch.Tensor]:
    return {**regions(), "decoder_input_ids": torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]]), "use_cache": False}


# (class, config, inputs, the tied pairs (output parameter, input embedding))
CASES = {
    "SingleStreamModel": (SingleStreamModel, lambda: single_stream_config(), lambda: single_stream_inputs(False), []),
    "SingleStreamForVisualParaphrase": (
        SingleStreamForVisualParaphrase,
        lambda: single_stream_config(attention_supervision="indirect"),
        lambda: single_stream_inputs(True),
        [],
    ),
    "TwoStreamModel": (TwoStreamModel, lambda: two_stream_config(), two_stream_batch, []),
    "TwoStreamForPreTraining": (
        TwoStreamForPreTraining,
        lambda: two_stream_config(attention_supervision="direct"),
        two_stream_batch,
        [("lm_head.decoder.weight", "two_stream.embeddings.word_embeddings.weight")],
    ),
    "TwoStreamForQuestionAnswering": (TwoStreamForQuestionAnswering, two_stream_config, two_stream_batch, []),
    "TwoStreamForVisualReasoning": (TwoStreamForVisualReasoning, two_stream_config, two_stream_pair_inputs, []),
    "RegionCaptionerModel": (
        RegionCaptionerModel,
        lambda: captioning_config(attention_alignment="exp_decay"),
        captioning_inputs,
        [],
    ),
    "RegionCaptionerForConditionalGeneration": (
        RegionCaptionerForConditionalGeneration,
        lambda: captioning_config(attention_alignment="exp_decay"),
        captioning_inputs,
        [("lm_head.weight", "model.decoder.embed_tokens.weight")],
    ),
}


def perturb_weights(model: torch.nn.Module, seed: int = 1) -> None:
    """Moves every parameter off its initialisation, so that a head re-initialised by loading cannot pass as equal."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


def tensors_of(output) -> dict[str, torch.Tensor]:
    """Every tensor of a ModelOutput, nested tuples flattened (`attentions.0`, ...)."""
    found = {}

    def visit(name: str, value) -> None:
        if isinstance(value, torch.Tensor):
            found[name] = value
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                visit(f"{name}.{index}", item)

    for key, value in output.items():
        visit(key, value)
    return found


def buffers_to_set(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer for name, buffer in model.named_buffers() if name.endswith("alignment_step")}


@pytest.fixture
def transformers_warnings(caplog):
    """caplog sees transformers' WARNING records (its library logger does not propagate by default)."""
    library_logger = logging.getLogger("transformers")
    propagate, verbosity = library_logger.propagate, transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()
    library_logger.propagate = True
    caplog.set_level(logging.WARNING)
    yield caplog
    library_logger.propagate = propagate
    transformers_logging.set_verbosity(verbosity)


# --- exact round trip ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_every_model_round_trips_exactly(name, tmp_path):
    model_class, make_config, make_inputs, tied = CASES[name]
    torch.manual_seed(0)
    model = model_class(make_config()).eval()
    perturb_weights(model)
    for buffer in buffers_to_set(model).values():
        buffer.fill_(5)  # the A2 step counter: a trained model's value, not the initial 0
    inputs = make_inputs()
    with torch.no_grad():
        before = tensors_of(model(**inputs))
    model.save_pretrained(tmp_path)

    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.parent.glob(f".{tmp_path.name}.saving-*"))
    reloaded = model_class.from_pretrained(tmp_path).eval()
    assert type(reloaded) is model_class
    reloaded_state = reloaded.state_dict()
    assert reloaded_state.keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert reloaded_state[key].dtype == tensor.dtype and torch.equal(reloaded_state[key], tensor), key
    for key, buffer in buffers_to_set(reloaded).items():
        assert int(buffer) == 5, key
    for output_key, input_key in tied:
        output, embedding = reloaded.get_parameter(output_key), reloaded.get_parameter(input_key)
        assert output.data_ptr() == embedding.data_ptr(), f"{output_key} is no longer tied to {input_key}"
        with torch.no_grad():
            embedding[3].fill_(0.25)
        assert torch.equal(output[3], torch.full_like(output[3], 0.25))
    reloaded = model_class.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        after = tensors_of(reloaded(**inputs))
    assert before.keys() == after.keys() and before
    for key in before:
        assert torch.equal(before[key], after[key]), f"{name}: output {key} differs after reloading"


def test_the_saved_file_holds_the_tied_weight_once(tmp_path):
    from safetensors import safe_open

    TwoStreamForPreTraining(two_stream_config()).save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as saved:
        keys = set(saved.keys())
    assert "two_stream.embeddings.word_embeddings.weight" in keys and "lm_head.decoder.weight" not in keys


# --- mismatching configs ------------------------------------------------------------------------------------------


def test_another_number_of_labels_fails_naming_the_keys_and_shapes(tmp_path):
    SingleStreamForVisualParaphrase(single_stream_config()).save_pretrained(tmp_path)
    with pytest.raises(CheckpointMismatchError) as raised:
        SingleStreamForVisualParaphrase.from_pretrained(tmp_path, num_vgp_labels=3)
    message = str(raised.value)
    assert "vgp_classifier.weight: checkpoint (5, 32) vs model (3, 32)" in message
    assert "vgp_classifier.bias: checkpoint (5,) vs model (3,)" in message
    assert "ignore_mismatched_sizes=True" in message and str(tmp_path) in message


def test_another_hidden_size_fails_naming_the_keys_and_shapes(tmp_path):
    TwoStreamForQuestionAnswering(two_stream_config()).save_pretrained(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"two_stream\.embeddings\.word_embeddings\.weight: checkpoint "
                       r"\(120, 32\) vs model \(120, 64\)"):
        TwoStreamForQuestionAnswering.from_pretrained(tmp_path, hidden_size=64, intermediate_size=128)


def test_ignored_mismatch_warns_naming_the_reinitialised_supervised_head(tmp_path, transformers_warnings):
    model = SingleStreamForVisualParaphrase(single_stream_config())
    model.save_pretrained(tmp_path)
    reloaded = SingleStreamForVisualParaphrase.from_pretrained(tmp_path, num_vgp_labels=3, ignore_mismatched_sizes=True)
    assert reloaded.vgp_classifier.out_features == 3
    assert torch.equal(reloaded.vgp_dense.weight, model.vgp_dense.weight)  # everything else still loaded
    report = [r for r in transformers_warnings.records if r.name.startswith("transformers") and r.levelno == logging.WARNING]
    assert report and "vgp_classifier.weight" in report[-1].getMessage() and "MISMATCH" in report[-1].getMessage()
    ours = [r for r in transformers_warnings.records if r.name == "hf_vlalign.models.saving"]
    assert len(ours) == 1 and ours[0].levelno == logging.WARNING
    assert "vgp_classifier.bias, vgp_classifier.weight" in ours[0].getMessage()


def test_newly_initialised_heads_are_named_in_a_warning(tmp_path, transformers_warnings):
    TwoStreamModel(two_stream_config()).save_pretrained(tmp_path)
    TwoStreamForPreTraining.from_pretrained(tmp_path)
    report = "\n".join(r.getMessage() for r in transformers_warnings.records if r.name.startswith("transformers"))
    for key in ("matching_head.weight", "answer_head.classifier.weight", "alignment_decoder.language_projection"):
        assert key in report, key
    ours = [r.getMessage() for r in transformers_warnings.records if r.name == "hf_vlalign.models.saving"]
    assert len(ours) == 1 and "alignment_decoder.vision_projection.dense_in.weight" in ours[0]
    assert "matching_head" not in ours[0]  # only the supervised heads are repeated here


def test_a_supervised_head_is_never_silent_even_with_transformers_errors_only(tmp_path, caplog):
    SingleStreamModel(single_stream_config()).save_pretrained(tmp_path)
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with caplog.at_level(logging.WARNING, logger="hf_vlalign.models.saving"):
            SingleStreamForVisualParaphrase.from_pretrained(tmp_path, attention_supervision="indirect")
    finally:
        transformers_logging.set_verbosity(verbosity)
    ours = [r.getMessage() for r in caplog.records if r.name == "hf_vlalign.models.saving"]
    assert len(ours) == 1
    for key in ("id_classifier.weight", "vgp_dense.weight", "vgp_classifier.weight", "indirect_grounding_head."):
        assert key in ours[0], key


def test_a_complete_checkpoint_loads_without_any_warning(tmp_path, transformers_warnings):
    TwoStreamForPreTraining(two_stream_config()).save_pretrained(tmp_path)
    TwoStreamForPreTraining.from_pretrained(tmp_path)
    assert not [r for r in transformers_warnings.records if r.levelno >= logging.WARNING]


# --- atomic saves -------------------------------------------------------------------------------------------------


def failing_writer(monkeypatch) -> None:
    """Makes the safetensors writer that `save_pretrained` calls write half a file, then fail (a disk full, a crash)."""

    def write_half_then_fail(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x00" * 64)
        raise OSError("No space left on device")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", write_half_then_fail)


def test_an_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "model"
    first = SingleStreamForVisualParaphrase(single_stream_config()).eval()
    first.save_pretrained(target)
    (target / "eval_results.json").write_text("{}\n")
    second = SingleStreamForVisualParaphrase(single_stream_config(hidden_size=64, intermediate_size=128))
    failing_writer(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        second.save_pretrained(target)
    monkeypatch.undo()

    reloaded = SingleStreamForVisualParaphrase.from_pretrained(target)
    assert reloaded.config.hidden_size == 32
    for key, tensor in first.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    assert (target / "eval_results.json").read_text() == "{}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no staging folder left behind


def test_an_interrupted_first_save_leaves_no_loadable_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "model"
    failing_writer(monkeypatch)
    with pytest.raises(OSError):
        TwoStreamForPreTraining(two_stream_config()).save_pretrained(target)
    monkeypatch.undo()
    assert not (target / "config.json").exists() and not (target / "model.safetensors").exists()
    with pytest.raises(OSError):
        TwoStreamForPreTraining.from_pretrained(target)


@pytest.mark.slow
def test_a_killed_save_keeps_the_previous_checkpoint(tmp_path):
    """A process killed (SIGKILL: no `finally`, no cleanup) in the middle of writing the weights."""
    target = tmp_path / "model"
    first = RegionCaptionerForConditionalGeneration(captioning_config())
    first.save_pretrained(target)
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT / "tests" / "models" / "captioning")!r})
        import transformers.modeling_utils
        from test_captioning import tiny_config
        from hf_vlalign import RegionCaptionerForConditionalGeneration

        def killed_while_writing(tensors, filename, metadata=None):
            Path(filename).write_bytes(b"\\x00" * 64)
            os.kill(os.getpid(), signal.SIGKILL)

        transformers.modeling_utils.safe_save_file = killed_while_writing
        RegionCaptionerForConditionalGeneration(tiny_config(d_model=64)).save_pretrained({str(target)!r})
        """
    )
    completed = subprocess.run([sys.executable, "-c", script], env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert completed.returncode == -9
    reloaded = RegionCaptionerForConditionalGeneration.from_pretrained(target)
    assert reloaded.config.d_model == 32
    for key, tensor in first.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key


def test_a_new_save_replaces_weights_and_keeps_user_files(tmp_path):
    first = TwoStreamForQuestionAnswering(two_stream_config())
    first.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    (tmp_path / "eval_results.json").write_text('{"accuracy": 0.5}\n')
    second = TwoStreamForQuestionAnswering(two_stream_config(num_qa_labels=4))
    perturb_weights(second)
    second.save_pretrained(tmp_path)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["config.json", "eval_results.json", "model.safetensors"]  # the superseded shards are gone
    reloaded = TwoStreamForQuestionAnswering.from_pretrained(tmp_path)
    for key, tensor in second.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    # and back to shards: the single file that would shadow them goes
    first.save_pretrained(tmp_path, max_shard_size="20KB")
    assert not (tmp_path / "model.safetensors").exists() and (tmp_path / "eval_results.json").is_file()
    reloaded = TwoStreamForQuestionAnswering.from_pretrained(tmp_path)
    for key, tensor in first.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key


def test_config_is_published_last_when_files_are_moved_one_by_one(tmp_path, monkeypatch):
    """The fallback for a target whose parent is not writable (no staging sibling, so no folder swap)."""
    RegionCaptionerForConditionalGeneration(captioning_config()).save_pretrained(tmp_path / "staged")
    moved = []
    real_replace = os.replace

    def recording_replace(source, destination):
        moved.append(Path(destination).name)
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", recording_replace)
    (tmp_path / "model").mkdir()
    publish_saved_folder(tmp_path / "staged", tmp_path / "model")
    assert moved[0] == "model.safetensors" and moved[-1] == "config.json"
    assert set(moved) == {"model.safetensors", "generation_config.json", "config.json"}


def test_every_family_uses_the_atomic_save():
    for model_class, *_ in CASES.values():
        assert model_class.save_pretrained is not PreTrainedModel.save_pretrained, model_class.__name__
