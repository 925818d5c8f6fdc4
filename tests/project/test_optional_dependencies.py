"""The base install is what a training script needs: every module of the library imports, and the three model families
run, with none of the optional packages installed; each feature that needs one raises the pip command of its extra
(`hf_vlalign.utils.optional.EXTRAS`), the CLI prints it as a one-line error, and setup.cfg's extras install them.

Absence is simulated in a subprocess whose import finders return nothing for the optional packages, which is what
Python sees when a package is not installed (also for `importlib.util.find_spec`, which transformers' own
availability checks call).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vlalign.utils.optional import EXTRAS, MissingDependencyError, require

ROOT = Path(__file__).resolve().parents[2]
# the guarded packages and deepspeed (setup.cfg's `deepspeed` extra, for accelerate and the tests; never imported here)
OPTIONAL_PACKAGES = (*(package for package, _ in EXTRAS.values()), "deepspeed")

# run first in each subprocess: the optional packages become unfindable, as if they were not installed
HIDE_OPTIONAL_PACKAGES = """
import sys

HIDDEN = set(sys.argv[1].split(","))


class HiddenPackages:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find_spec = getattr(self.finder, "find_spec", None)
        return None if find_spec is None else find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(self.finder, name)


sys.meta_path[:] = [HiddenPackages(finder) for finder in sys.meta_path]
sys.argv[1:2] = []
"""


def run_without_extras(code: str, *argv: str, hidden: tuple[str, ...] = OPTIONAL_PACKAGES):
    """Runs `code` with `hidden` unimportable; `argv` are its sys.argv[1:]."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", HIDE_OPTIONAL_PACKAGES + code, ",".join(hidden), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)


def require_message(extra: str) -> str:
    package, feature = EXTRAS[extra]
    install = f'pip install "hf-vlalign[{extra}]" (or pip install {package})'
    return f"{feature} needs {package}, which is not installed: {install}"


@pytest.mark.slow
def test_every_module_imports_and_the_three_families_run_without_the_optional_packages():
    code = """
import importlib
import pkgutil

import torch

import hf_vlalign
from hf_vlalign import RegionCaptionerConfig, RegionCaptionerModel, SingleStreamConfig, SingleStreamModel
from hf_vlalign import TwoStreamConfig, TwoStreamModel

# every module, the models, trainers, data builders, analysis and CLI among them; the `evaluate` metric scripts under
# metrics/modules/ are loaded by `evaluate` itself (`load_*_metric`)
failed = []
for module in pkgutil.walk_packages(hf_vlalign.__path__, "hf_vlalign."):
    if not module.name.startswith("hf_vlalign.metrics.modules."):
        try:
            importlib.import_module(module.name)
        except Exception as error:
            failed.append(f"{module.name}: {type(error).__name__}: {error}")
assert not failed, failed
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.trainers import VGPTrainer

torch.manual_seed(0)
batch, words, regions, feat_dim = 2, 5, 3, 8
boxes = torch.tensor([0.1, 0.2, 0.6, 0.7]).expand(batch, regions, 4).clone()
visual = {"visual_feats": torch.rand(batch, regions, feat_dim), "visual_boxes": boxes}
text = {"input_ids": torch.randint(5, 30, (batch, words)), "attention_mask": torch.ones(batch, words, dtype=torch.long)}
sizes = {"vocab_size": 30, "visual_feat_dim": feat_dim, "visual_feature_normalization": "none"}
models = [
    (SingleStreamModel(SingleStreamConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=32, **sizes)), text),
    (TwoStreamModel(TwoStreamConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32, l_layers=1,
                                    r_layers=1, x_layers=1, **sizes)), text),
    (RegionCaptionerModel(RegionCaptionerConfig(d_model=16, encoder_layers=1, decoder_layers=1,
                                                encoder_attention_heads=2, decoder_attention_heads=2,
                                                encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                                                geometry_dim=8, **sizes)),
     {"decoder_input_ids": text["input_ids"]}),
]
for model, inputs in models:
    output = model(**visual, **inputs)
    assert all(torch.isfinite(value).all() for value in output.values() if isinstance(value, torch.Tensor))
print(sorted(name for name in sys.modules if name.partition(".")[0] in HIDDEN))
"""
    completed = run_without_extras(code)
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.splitlines()[-1] == "[]"


@pytest.mark.slow
def test_each_feature_raises_the_pip_command_of_its_extra(tmp_path):
    (tmp_path / "features.h5").write_bytes(b"")
    code = """
import json

import numpy as np

from hf_vlalign.utils.optional import MissingDependencyError

folder = sys.argv[1]


def plots():
    from hf_vlalign.analysis.probe_plots import plot_head_accuracy

    plot_head_accuracy(np.full((2, 3), 0.5), f"{folder}/heads.png")


def heatmap():
    from hf_vlalign.analysis.attention_plots import plot_word_region_heatmap

    plot_word_region_heatmap(np.full((2, 3), 0.5), ["a", "b"], ["r0", "r1", "r2"], f"{folder}/heatmap.png")


def entropy():
    from hf_vlalign.analysis.entropy import plot_entropy

    rows = [{"block": "text", "layer": 0, "head": "mean", "normalised_entropy": 0.5, "entropy": 1.0, "num_rows": 4}]
    plot_entropy(rows, f"{folder}/entropy.png")


def hdf5():
    from hf_vlalign.data.formats.m2_hdf5 import iter_m2_hdf5_records

    next(iter(iter_m2_hdf5_records(f"{folder}/features.h5")))


def caption_metrics():
    from hf_vlalign.metrics.captioning import caption_scores

    caption_scores(["a dog runs"], [["a dog is running"]], tokenizer="simple")


def lora():
    from hf_vlalign.lora import lora_config

    lora_config(object())


def evaluate_modules():
    from hf_vlalign.metrics.vqa import load_vqa_metric

    load_vqa_metric()


def vlms():
    from hf_vlalign.vlms.tiny import tiny_patch_model

    tiny_patch_model("qwen2_vl")


messages = {}
for feature in (plots, heatmap, entropy, hdf5, caption_metrics, lora, evaluate_modules, vlms):
    try:
        feature()
    except MissingDependencyError as error:
        messages[feature.__name__] = str(error)
from hf_vlalign.metrics.captioning import spice_unavailable_reason

messages["spice"] = spice_unavailable_reason()
print(json.dumps(messages))
"""
    completed = run_without_extras(code, str(tmp_path))
    assert completed.returncode == 0, completed.stderr[-4000:]
    messages = json.loads(completed.stdout.splitlines()[-1])
    expected = {
        "plots": "plots", "heatmap": "plots", "entropy": "plots", "hdf5": "hdf5", "caption_metrics": "caption-metrics",
        "spice": "caption-metrics", "lora": "peft", "evaluate_modules": "evaluate", "vlms": "vlms",
    }  # fmt: skip
    assert set(messages) == set(expected)
    for feature, extra in expected.items():
        assert messages[feature] == require_message(extra), feature
    assert not list(tmp_path.glob("*.png"))


# verb -> its arguments ({folder}: the test's folder) and the extra it needs
CLI_VERBS = {
    "convert-features": (["{folder}/features.h5", "--format", "m2_hdf5", "--out", "{folder}/store"], "hdf5"),
    "analyze": (["{folder}/model", "--out", "{folder}/analysis"], "plots"),
    "explore": (["{folder}/model", "--out", "{folder}/explorer.html"], "plots"),
    "probe": (["{folder}/model", "--plot", "{folder}/heads.png"], "plots"),
    "evaluate": (["{folder}/model", "--task", "captioning"], "caption-metrics"),
}


@pytest.mark.slow
def test_cli_verbs_print_the_pip_command_without_a_traceback(tmp_path):
    # the checks run before any model loads: a folder with a config.json naming the VGP model and a tokenizer file
    # passes the CLI's checkpoint checks
    (tmp_path / "model").mkdir()
    config = {"model_type": "vlalign_single_stream", "architectures": ["SingleStreamForVisualParaphrase"]}
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    (tmp_path / "features.h5").write_bytes(b"")
    code = """
import contextlib
import io
import json

from hf_vlalign.cli import main

results = {}
for argv in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code
    results[argv[0]] = [status, stderr.getvalue()]
print(json.dumps(results))
"""
    argvs = [[verb, *(arg.format(folder=tmp_path) for arg in args)] for verb, (args, _) in CLI_VERBS.items()]
    completed = run_without_extras(code, json.dumps(argvs))
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads(completed.stdout.splitlines()[-1])
    for verb, (_, extra) in CLI_VERBS.items():
        assert results[verb] == [2, f"hf-vlalign {verb}: error: {require_message(extra)}\n"], verb
    assert not (tmp_path / "store").exists() and not (tmp_path / "analysis").exists()


def test_require_returns_the_module_and_checks_its_arguments():
    import matplotlib.colors

    assert require("matplotlib.colors", extra="plots") is matplotlib.colors
    with pytest.raises(ValueError, match=r"extra must be one of .*'plots'.*got 'plot'"):
        require("matplotlib", extra="plot")
    with pytest.raises(ValueError, match=r"module must be 'h5py' or one of its submodules .* got 'numpy'"):
        require("numpy", extra="hdf5")
    assert issubclass(MissingDependencyError, ModuleNotFoundError)


@pytest.mark.slow
def test_a_broken_optional_package_is_not_reported_as_missing():
    # matplotlib installed but one of its own dependencies missing: that error, not the extra's pip command
    code = """
from hf_vlalign.utils.optional import MissingDependencyError, require

try:
    require("matplotlib.figure", extra="plots")
except MissingDependencyError:
    print("missing extra")
except ModuleNotFoundError as error:
    print(error.name)
"""
    completed = run_without_extras(code, hidden=("numpy",))
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert completed.stdout.split() == ["numpy"]


def extras_of_setup_cfg() -> dict[str, set[str]]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extras = {}
    for extra, lines in setup["options.extras_require"].items():
        requirements = [line.strip() for line in lines.splitlines() if line.strip()]
        extras[extra] = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in requirements}
    install_requires = {
        re.match(r"[A-Za-z0-9_.-]+", line.strip()).group(0).lower()
        for line in setup["options"]["install_requires"].splitlines()
        if line.strip()
    }
    return extras | {"": install_requires}


def test_setup_cfg_extras_install_what_each_guarded_feature_names():
    extras = extras_of_setup_cfg()
    base = extras[""]
    for extra, (package, _) in EXTRAS.items():
        assert extras.get(extra) == {package}, extra
        assert package not in base, f"{package} is optional (extra {extra!r}) but in install_requires"
    features = [requirements for name, requirements in extras.items() if name not in ("", "all", "test")]
    optional_runtime = set().union(*features)
    assert extras["all"] == optional_runtime
    assert extras["test"] >= extras["all"]
    # the DeepSpeed accelerate configs; tests/trainers/test_fsdp_patch.py runs ZeRO-3
    assert extras["deepspeed"] == {"deepspeed"} and "deepspeed" not in base
    # the README's main job (examples/finetune_vgp.py) plots its heatmaps; the captioning example scores captions
    assert extras["default"] >= {"matplotlib", "pycocoevalcap"}
