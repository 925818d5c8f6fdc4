"""Security: weights only as safetensors, no code run from pickles or checkpoint folders, annotation paths confined.

The malicious payloads here are built with `pickle.dumps` / plain files and never executed by the library; each test
checks that the side effect the payload would have (a marker file) does not happen.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from shared_samples import real_sample
from transformers import AutoConfig, AutoModel

import hf_vlalign  # noqa: F401  (registers the Auto classes)
from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    SingleStreamModel,
    TwoStreamConfig,
    TwoStreamForPreTraining,
)
from hf_vlalign.data.builders import coco_captions, flickr30k_entities, refcoco, vgp
from hf_vlalign.data.formats.paths import check_relative_path, safe_join
from hf_vlalign.data.formats.safe_pickle import load_restricted_pickle
from hf_vlalign.models.saving import CheckpointMismatchError

SRC = Path(hf_vlalign.__file__).resolve().parent


# ----------------------------------------------------------------------------------------------------------------
# (1) weights only as safetensors
# ----------------------------------------------------------------------------------------------------------------

UNSAFE_LOADS = {
    "torch.load without weights_only=True": re.compile(r"\btorch\.load\s*\((?!.*weights_only\s*=\s*True)"),
    "pickle.load(s)": re.compile(r"\b(c?pickle|_pickle|dill|joblib)\.loads?\s*\("),
    "allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
    "safe_serialization=False": re.compile(r"safe_serialization\s*=\s*False"),
    "torch.save": re.compile(r"\btorch\.save\s*\("),
}
# (file, check) -> why it is not model weights. Trainer checkpoints keep optimiser state with torch.save, as
# transformers' Trainer does for optimizer.pt; it is read back with torch.load(weights_only=True).
ALLOWED = {
    ("trainers/captioning.py", "torch.save"): "the A2 mask optimiser's state_dict in a Trainer checkpoint",
}


def test_the_package_never_unpickles_or_saves_weights_with_pickle():
    """A source scan: no torch.load without weights_only=True, no pickle.load, no pickled weights written."""
    found, allowed_seen = [], set()
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#", 1)[0]
            for name, pattern in UNSAFE_LOADS.items():
                if not pattern.search(code):
                    continue
                if (relative, name) in ALLOWED:
                    allowed_seen.add((relative, name))
                else:
                    found.append(f"{relative}:{number}: {name}")
    assert found == []
    assert allowed_seen == set(ALLOWED), "an allowed exception is gone: remove it from ALLOWED"
    assert "pickle._Unpickler" in (SRC / "data" / "formats" / "safe_pickle.py").read_text()  # the scan reads real code


def _tiny_model(family: str) -> torch.nn.Module:
    common = dict(vocab_size=60, num_attention_heads=2, intermediate_size=16, max_position_embeddings=16, visual_feat_dim=6)
    if family == "single_stream":
        return SingleStreamForVisualParaphrase(SingleStreamConfig(hidden_size=8, num_hidden_layers=1, **common))
    if family == "two_stream":
        return TwoStreamForPreTraining(
            TwoStreamConfig(hidden_size=8, l_layers=1, r_layers=1, x_layers=1, num_object_labels=4, num_attr_labels=3, num_qa_labels=3, **common)
        )
    return RegionCaptionerForConditionalGeneration(
            RegionCaptionerConfig(
                vocab_size=30, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, visual_feat_dim=6,
                max_position_embeddings=16, geometry_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                decoder_start_token_id=1,
            )  # fmt: skip
        )


@pytest.mark.parametrize("family", ["single_stream", "two_stream", "captioning"])
def test_saved_model_folders_hold_safetensors_and_no_pickled_weights(tmp_path, family):
    model = _tiny_model(family)
    model.save_pretrained(tmp_path)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert "model.safetensors" in names, names
    pickled = [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"))]
    assert pickled == [], f"pickled weight files in a saved model folder: {pickled}"
    reloaded = type(model).from_pretrained(tmp_path)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# (2) the restricted unpickler refuses pickles that would run code
# (tests/data/test_feature_readers.py covers a Path.touch payload nested in a BUTD id map, tests/data/test_builders_text.py a
#  numpy global in RefCOCO+ refs; here: the classic os.system payload, at the top level and nested, every protocol)
# ----------------------------------------------------------------------------------------------------------------


class _ShellCommandWhenUnpickled:
    """Unpickling this runs `command` in a shell (what a malicious `*_imgid2idx.pkl` or `refs(unc).p` could hold)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("nested", [True], ids=["nested"])
def test_restricted_unpickler_refuses_an_os_system_payload(tmp_path, protocol, nested):
    marker = tmp_path / "pwned"
    payload = _ShellCommandWhenUnpickled(f"echo pwned > {marker}")
    value = {"refs": [1, 2, payload]} if nested else payload
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps(value, protocol=protocol))  # building the pickle runs nothing

    system = f"{os.system.__module__}.system"  # posix.system (nt.system on Windows)
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a pickle of plain dicts") + f".*refused to load the global {system}"):
        load_restricted_pickle(path)
    assert not marker.exists()


@pytest.mark.slow
def test_the_os_system_payload_is_real_when_unpickled_without_restriction(tmp_path):
    """Keeps the test above honest: in a child process, plain pickle.loads does run the command."""
    marker = tmp_path / "pwned"
    data = pickle.dumps(_ShellCommandWhenUnpickled(f"echo pwned > {marker}"))
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"], input=data, check=True)
    assert marker.read_text().strip() == "pwned"


def test_restricted_unpickler_refuses_refcoco_refs_with_a_payload(tmp_path):
    """The same payload through a builder: `refcoco.build` reads refs(unc).p with the restricted unpickler."""
    marker = tmp_path / "pwned"
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps([_ShellCommandWhenUnpickled(f"touch {marker}")], protocol=2))
    (tmp_path / "instances.json").write_text(json.dumps(_INSTANCES))
    with pytest.raises(ValueError, match=r"refs\(unc\)\.p: not a pickle of plain dicts.*refused to load the global"):
        refcoco.build(tmp_path, "train")
    assert not marker.exists()


# ----------------------------------------------------------------------------------------------------------------
# (3) no code from a checkpoint folder runs without trust_remote_code=True
# ----------------------------------------------------------------------------------------------------------------

_REMOTE_CODE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
from transformers import PreTrainedConfig
class EvilConfig(PreTrainedConfig):
    model_type = "evil"
"""


def _checkpoint_with_remote_code(folder: Path, model_type: str, marker: Path) -> Path:
    """A saved tiny SingleStreamModel whose config.json maps the Auto classes to `evil.py` in the folder."""
    config = SingleStreamConfig(
        vocab_size=60, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, max_position_embeddings=16, visual_feat_dim=6
    )
    SingleStreamModel(config).save_pretrained(folder)
    (folder / "evil.py").write_text(_REMOTE_CODE.format(marker=str(marker)))
    saved = json.loads((folder / "config.json").read_text())
    saved["model_type"] = model_type
    saved["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(saved))
    return folder


def test_a_checkpoint_of_our_model_type_with_auto_map_loads_our_classes_and_runs_no_code(tmp_path):
    marker = tmp_path / "marker"
    folder = _checkpoint_with_remote_code(tmp_path / "checkpoint", SingleStreamConfig.model_type, marker)
    assert type(AutoConfig.from_pretrained(folder)) is SingleStreamConfig
    assert type(AutoModel.from_pretrained(folder)) is SingleStreamModel
    assert type(SingleStreamModel.from_pretrained(folder)) is SingleStreamModel
    assert not marker.exists()


def test_a_checkpoint_of_an_unknown_model_type_with_auto_map_is_refused_and_runs_no_code(tmp_path):
    marker = tmp_path / "marker"
    folder = _checkpoint_with_remote_code(tmp_path / "checkpoint", "evil", marker)
    for load in (AutoConfig.from_pretrained, AutoModel.from_pretrained):
        with pytest.raises(ValueError, match=r"trust_remote_code"):
            load(folder)
        with pytest.raises(ValueError, match=r"trust_remote_code"):
            load(folder, trust_remote_code=False)
    assert not marker.exists()
    # our own class ignores auto_map and refuses the folder by its model_type (its weights would not be loaded)
    with pytest.raises(CheckpointMismatchError, match=r"model_type 'vlalign_single_stream'.*model_type 'evil'"):
        SingleStreamModel.from_pretrained(folder)
    assert not marker.exists()


# ----------------------------------------------------------------------------------------------------------------
# (4) paths from annotation files stay inside the data folder
# ----------------------------------------------------------------------------------------------------------------

ESCAPES = ["val2014/../../../etc/passwd", "C:\\Windows\\win.ini"]


@pytest.mark.parametrize("relative", ESCAPES)
def test_safe_join_refuses_absolute_paths_and_escapes(tmp_path, relative):
    with pytest.raises(ValueError, match=r"^`images` entry 3: expected a relative path inside .*got .*" + re.escape(repr(relative))):
        safe_join(tmp_path, relative, "`images` entry 3")
    with pytest.raises(ValueError, match=re.escape(repr(relative))):
        check_relative_path(relative, "`file_name`")


def test_safe_join_admits_paths_that_stay_inside(tmp_path):
    assert safe_join(tmp_path, "val2014/COCO_val2014_000000391895.jpg", "x") == tmp_path / "val2014" / "COCO_val2014_000000391895.jpg"
    assert safe_join(tmp_path, "a/../b.jpg", "x") == tmp_path / "a/../b.jpg"
    assert safe_join(tmp_path, Path("1000092795.txt"), "x") == tmp_path / "1000092795.txt"
    for bad in ("", "a\x00b", 7, None):
        with pytest.raises(ValueError, match=r"^x: expected a "):
            safe_join(tmp_path, bad, "x")


def _coco_dataset(filename: str) -> dict:
    image = {"filepath": "val2014", "cocoid": 391895, "split": "val", "sentences": [{"raw": "A man.", "tokens": ["a", "man"], "sentid": 0}]}
    return {"dataset": "coco", "images": [{**image, "filename": "COCO_val2014_000000391895.jpg"}, {**image, "cocoid": 7, "filename": filename, "sentences": [{"raw": "A man.", "tokens": ["a", "man"], "sentid": 1}]}]}


@pytest.mark.parametrize("filename", ["../../etc/passwd", "/etc/passwd"])
def test_coco_captions_refuses_file_names_outside_the_image_folder(tmp_path, filename):
    (tmp_path / "dataset_coco.json").write_text(json.dumps(_coco_dataset(filename)))
    where = re.escape(f"{tmp_path / 'dataset_coco.json'}, images[1]: `filename`: expected a relative path")
    with pytest.raises(ValueError, match=where + r".*" + re.escape(repr(filename))):
        coco_captions.build(tmp_path, "val")
    (tmp_path / "dataset_coco.json").write_text(json.dumps(_coco_dataset("COCO_val2014_000000000007.jpg")))
    assert coco_captions.build(tmp_path, "val")["file_name"] == ["COCO_val2014_000000391895.jpg", "COCO_val2014_000000000007.jpg"]


_INSTANCES = {
    "images": [{"id": 9, "width": 640, "height": 480, "file_name": "COCO_train2014_000000000009.jpg"}],
    "annotations": [{"id": 1, "image_id": 9, "bbox": [1.0, 2.0, 30.0, 40.0], "category_id": 18}],
    "categories": [{"id": 18, "name": "dog"}],
}
_REFS = [{"ref_id": 0, "ann_id": 1, "image_id": 9, "category_id": 18, "split": "train", "sentences": [{"sent_id": 0, "sent": "dog", "tokens": ["dog"]}]}]


@pytest.mark.parametrize("file_name", ["../../etc/passwd", "/etc/passwd"])
def test_refcoco_refuses_file_names_outside_the_image_folder(tmp_path, file_name):
    (tmp_path / "refs.json").write_text(json.dumps(_REFS))
    bad = {**_INSTANCES, "images": [{**_INSTANCES["images"][0], "file_name": file_name}]}
    (tmp_path / "instances.json").write_text(json.dumps(bad))
    where = re.escape(f"`data_dir` {tmp_path / 'instances.json'}, image 9: `file_name`: expected a relative path")
    with pytest.raises(ValueError, match=where + r".*" + re.escape(repr(file_name))):
        refcoco.build(tmp_path, "train", refs_file="refs.json")
    (tmp_path / "instances.json").write_text(json.dumps(_INSTANCES))
    assert refcoco.build(tmp_path, "train", refs_file="refs.json")["file_name"] == ["COCO_train2014_000000000009.jpg"]


@pytest.mark.parametrize("image_id", ["../../etc/passwd", "/etc/passwd"])
def test_flickr30k_entities_and_vgp_refuse_image_ids_that_are_paths(tmp_path, image_id):
    """Flickr30k Entities split lists and VGP CSVs name images by id; an id that is a path never reaches the disk."""
    real = real_sample("flickr30k_entities")
    folder = tmp_path / "flickr30k_entities"
    folder.mkdir()
    for name in ("Sentences", "Annotations"):
        (folder / name).symlink_to(real / name)
    good_id = sorted(path.stem for path in (real / "Annotations").glob("*.xml"))[0]
    (folder / "train.txt").write_text(f"{good_id}\n{image_id}\n")
    with pytest.raises(ValueError, match=r"train\.txt, line 2: expected one numeric image id, got " + re.escape(repr(image_id))):
        flickr30k_entities.build(folder, "train")

    csv = tmp_path / "vgp.csv"
    header = "image,phrase1,phrase2,original_phrase1,original_phrase2,original_label,type_label"
    csv.write_text(f"{header}\n{good_id},man,person,A man,A person,Equivalence,3\n{image_id},man,person,A man,A person,Equivalence,3\n")
    with pytest.raises(ValueError, match=r"`image_id` must be a str of digits.*got " + re.escape(repr(image_id))):
        vgp.build_vgp_dataset(folder, csv)
