"""The `hf-vlalign` console entry point: one flag convention, help on every option, errors without tracebacks, a
start-up that imports neither torch nor transformers, and the probe's table."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest
from analysis_models import SYNTHETIC_FLAGS, save_with_tokenizer, tiny_family_model

from hf_vlalign.cli import FEATURE_FORMATS, TASKS, build_parser, main, results_table
from hf_vlalign.data.formats.vgp import read_vgp_csv

HEAVY_MODULES = ("torch", "transformers", "datasets")


def run_cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    executable = shutil.which("hf-vlalign")
    assert executable is not None, "pip install -e . must install the `hf-vlalign` console script"
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([executable, *argv], capture_output=True, text=True, timeout=300, env=environment)


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.fixture(scope="module")
def vgp_model_dir(tokenizer, tmp_path_factory):
    model = tiny_family_model("single_stream", tokenizer)
    return save_with_tokenizer(model, tokenizer, tmp_path_factory.mktemp("vgp_model"))


def _write_results(folder, supervision, best, baselines=True):
    folder.mkdir()
    results = {
        "supervision": supervision, "image_description_accuracy": 0.5, "vgp_accuracy": 0.75,
        "grounding_accuracy_best_head": best, "grounding_accuracy_mean_head": 0.25, "grounding_baseline_accuracy": 0.2,
    }  # fmt: skip
    if baselines:  # as the examples write them (`hf_vlalign.evaluation.baselines.compare_with_baselines`)
        results["baselines"] = {
            "image_description_accuracy": {"value": 0.5, "baseline": 0.5, "kind": "majority_class", "beats": False},
            "vgp_accuracy": {"value": 0.75, "baseline": 0.4, "kind": "majority_class", "beats": True},
            "grounding_accuracy_best_head": {"value": best, "baseline": 0.2, "kind": "store_order", "beats": best > 0.2},
        }
    (folder / "eval_results.json").write_text(json.dumps(results))


def test_results_table_has_one_row_per_run_with_the_baselines_and_flags(tmp_path):
    _write_results(tmp_path / "a", "none", 0.15)
    _write_results(tmp_path / "b", "direct", 0.9)
    _write_results(tmp_path / "c", "indirect", 0.9, baselines=False)  # a run that recorded no majority baselines
    table = results_table([tmp_path / "a", tmp_path / "b", tmp_path / "c"]).splitlines()
    assert len(table) == 5
    assert table[0] == (
        "| supervision | identification acc. | majority class | VGP acc. | majority class | grounding, best head | "
        "grounding, mean head | grounding baseline | ⚠ not above baseline |"
    )
    # identification 0.5 ties its majority baseline, the best head (0.15) is below the grounding baseline (0.2), which
    # is named by how it was made
    assert table[2] == (
        "| none | 0.500 | 0.500 | 0.750 | 0.400 | 0.150 | 0.250 | 0.200 (store order) | ⚠ identification acc., grounding, best head |"
    )
    assert table[3] == "| direct | 0.500 | 0.500 | 0.750 | 0.400 | 0.900 | 0.250 | 0.200 (store order) | ⚠ identification acc. |"
    assert table[4] == "| indirect | 0.500 | n/a | 0.750 | n/a | 0.900 | 0.250 | 0.200 | - |"


def test_results_table_refuses_a_baseline_that_is_not_a_number(tmp_path):
    _write_results(tmp_path / "a", "none", 0.3)
    results = json.loads((tmp_path / "a" / "eval_results.json").read_text())
    results["baselines"]["vgp_accuracy"]["baseline"] = "0.4"
    (tmp_path / "a" / "eval_results.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match=r"`baselines.vgp_accuracy` must be an object with a number `baseline`"):
        results_table([tmp_path / "a"])


def test_results_table_names_a_missing_run(tmp_path):
    with pytest.raises(ValueError, match="no eval_results.json"):
        results_table([tmp_path])


def test_synthesize_writes_the_published_formats(tmp_path, capsys):
    assert main(["synthesize", "--out", str(tmp_path / "scenes"), "--train_images", "3", "--val_images", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["features_tsv"].endswith("features.tsv")
    assert read_vgp_csv(tmp_path / "scenes" / "vgp" / "train.csv")


@pytest.mark.slow
def test_console_script_is_installed():
    executable = shutil.which("hf-vlalign")
    assert executable is not None, "pip install -e . must install the `hf-vlalign` console script"
    completed = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0 and "synthesize" in completed.stdout and "probe" in completed.stdout


@pytest.mark.slow
def test_help_and_import_load_no_heavy_module():
    # `hf-vlalign --help` and every `hf-vlalign <verb> --help` build the parser only: no torch, transformers, datasets
    code = (
        "import json, sys\n"
        "import hf_vlalign.cli as cli\n"
        "for argv in [[], *[[verb] for verb in json.loads(sys.argv[1])]]:\n"
        "    try:\n"
        "        cli.main([*argv, '--help'])\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, argv\n"
        "print(json.dumps(sorted(name for name in sys.modules if name.split('.')[0] in json.loads(sys.argv[2]))))"
    )
    verbs, heavy = json.dumps(sorted(verb_parsers())), json.dumps(HEAVY_MODULES)
    completed = subprocess.run([sys.executable, "-c", code, verbs, heavy], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert len(completed.stdout) > 10_000  # the help of the 10 verbs
    assert json.loads(completed.stdout.splitlines()[-1]) == []


@pytest.mark.slow
def test_light_import_keeps_the_auto_classes_and_the_public_api(vgp_model_dir):
    # `import hf_vlalign` is lazy, yet the Auto classes find the models (also when transformers loads its auto module
    # in the middle of its own imports, as `from transformers import Trainer` does) and every public name imports
    code = (
        "import sys\n"
        "import hf_vlalign\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "from transformers import Trainer, AutoConfig, AutoModel\n"
        "assert AutoConfig.from_pretrained(sys.argv[1]).model_type == 'vlalign_single_stream'\n"
        "print(type(AutoModel.from_pretrained(sys.argv[1])).__name__)\n"
        "import hf_vlalign.models\n"
        "processing = {'RegionFeatureExtractor', 'VLAlignProcessor', 'WordRegionAttentionPipeline'}\n"
        "assert set(hf_vlalign.__all__) == {'AttentionSupervisionMixin', *hf_vlalign.models.__all__, *processing}\n"
        "assert all(getattr(hf_vlalign, name) is not None for name in hf_vlalign.__all__)\n"
        "from hf_vlalign import *\n"
        "print(SingleStreamForVisualParaphrase.__name__, hf_vlalign.data.__name__)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code, str(vgp_model_dir)], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["SingleStreamModel", "SingleStreamForVisualParaphrase", "hf_vlalign.data"]


def test_parser_choices_are_the_librarys():
    from hf_vlalign.data.feature_store import FEATURE_FORMATS as LIBRARY_FORMATS
    from hf_vlalign.evaluation.tasks import TASKS as LIBRARY_TASKS

    assert sorted(FEATURE_FORMATS) == sorted(LIBRARY_FORMATS) and TASKS == LIBRARY_TASKS


def test_every_option_has_help_and_shows_its_default():
    for name, parser in verb_parsers().items():
        text = " ".join(parser.format_help().split())  # argparse wraps lines
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and len(action.help) > 10, (name, action.dest)
            if action.default not in (None, False):
                assert f"(default: {action.default})" in text, (name, action.dest)
            # options are spelled with underscores, as in transformers' examples
            assert all("-" not in option[2:] for option in action.option_strings), (name, action.option_strings)


def test_one_flag_convention(capsys):
    parser = build_parser()
    argv = ["convert-features", "feats.tsv", "--format", "lxmert_tsv", "--out", "store"]
    args = parser.parse_args([*argv, "--on_error", "skip", "--id_map", "ids.json", "--image_sizes", "s.json", "--box_dir", "b"])
    assert capsys.readouterr().err == ""
    assert args.on_error == "skip" and str(args.box_dir) == "b"
    assert parser.parse_args(["extract-features", "images", "--out", "store", "--grid_size", "3"]).grid_size == 3
    # fisher: the model is positional and the output `--out`, as in every verb
    args = parser.parse_args(["fisher", "model_dir", "--out", "f.safetensors"])
    assert args.model == "model_dir" and str(args.out) == "f.safetensors"
    for spelling in (["--on-error", "skip"], ["--model", "model_dir"]):
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, *spelling])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["probe", "./no/such/folder"], "hf-vlalign probe: error: `model`: no such folder: ./no/such/folder"),
        (["analyze", "/no/such/folder", "--out", "x"], "hf-vlalign analyze: error: `model`: no such folder: /no/such/folder"),
        (["convert", "no/such/folder", "--from", "lxmert", "--out", "x"], "hf-vlalign convert: error: `src`: no such folder: no/such/folder"),
        (["evaluate", "nobody-here/not-cached", "--task", "vqa"], "hf-vlalign evaluate: error: `model`: no such folder: "
         "nobody-here/not-cached; as a Hub id it is not in the Hub cache, and HF_HUB_OFFLINE=1 forbids downloading it."),
    ],
)
def test_a_missing_model_is_one_line_without_traceback(argv, message, capsys):
    """Run in this process: the console script's own exit is `test_the_console_script_prints_one_line_and_no_traceback`."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr() == ("", message + "\n")


@pytest.mark.slow
def test_a_model_left_out_is_argparse_s_error():
    completed = run_cli("fisher", "--out", "f.safetensors")
    assert completed.returncode == 2 and completed.stdout == "" and "Traceback" not in completed.stderr
    assert completed.stderr.splitlines()[-1] == "hf-vlalign fisher: error: the following arguments are required: model"


def test_a_folder_or_file_that_is_no_checkpoint_and_bad_values_are_one_line(vgp_model_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    cases = [
        (["explore", str(tmp_path / "empty"), "--out", "x.html"], "has no config.json"),
        (["explore", str(tmp_path / "file.txt"), "--out", "x.html"], "file.txt is not a checkpoint folder"),
        (["evaluate", str(vgp_model_dir), "--task", "nlvr2"], "task 'nlvr2' needs a SingleStreamForVisualReasoning or"),
        (["evaluate", str(vgp_model_dir), "--task", "vgp", "--batch_size", "0"], "`--batch_size` must be >= 1, got 0"),
        (["results-table", str(tmp_path)], "has no eval_results.json"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        error = capsys.readouterr().err
        assert exit_info.value.code == 2 and "Traceback" not in error
        assert error.splitlines()[-1].startswith(f"hf-vlalign {argv[0]}: error: ") and message in error.splitlines()[-1]


def test_probe_prints_a_table_and_writes_the_full_json(vgp_model_dir, synthetic_scene_cache, tmp_path, capsys):
    path = tmp_path / "probe.json"
    assert main(["probe", str(vgp_model_dir), *SYNTHETIC_FLAGS, "--batch_size", "4", "--json", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    result = json.loads(path.read_text())
    layers, heads = len(result["accuracy"]), len(result["accuracy"][0])
    assert (layers, heads) == (2, 4) and len(table) < 20
    assert table[0].endswith(f"{result['num_phrases']} phrases, 2 layers x 4 heads")
    # the best actively attending head (Li et al.), with its share of attention on the regions
    share = result["best_head_active_share"]
    best = f"best head of {result['best_among']} (layer {result['best_layer']}, head {result['best_head']}, active share {share:.2f})"
    assert any(best in line and line.endswith(f"{result['best_head_accuracy']:.3f}") for line in table)
    assert any(line.split()[-1] == f"{result['baseline_accuracy']:.3f}" for line in table if "baseline" in line)
    rows = [line.split() for line in table if line.strip()[:1].isdigit()]
    assert [int(row[0]) for row in rows] == [0, 1]
    for layer, row in enumerate(rows):  # each layer's best active head, its accuracy and its share
        active = [h for h in range(heads) if result["active_share"][layer][h] > result["active_threshold"]] or range(heads)
        assert float(row[2]) == pytest.approx(max(result["accuracy"][layer][h] for h in active), abs=5e-4)
        assert float(row[3]) == pytest.approx(result["active_share"][layer][int(row[1])], abs=5e-3)


def test_probe_and_evaluate_read_the_first_max_examples(vgp_model_dir, synthetic_scene_cache, tmp_path, capsys):
    import torch
    from transformers import AutoTokenizer

    from hf_vlalign.data.builders import load_vgp_data
    from hf_vlalign.data.collators import VGPCollator
    from hf_vlalign.evaluation.grounding import evaluate_grounding
    from hf_vlalign.evaluation.tasks import load_model
    from hf_vlalign.synthetic import SyntheticSceneConfig

    path = tmp_path / "probe.json"
    assert main(["probe", str(vgp_model_dir), *SYNTHETIC_FLAGS, "--max_examples", "3", "--json", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    result = json.loads(path.read_text())
    assert result["num_examples"] == 3 and ": 3 examples, " in table[0]
    # the probe of exactly the first three pairs of the split
    scenes = SyntheticSceneConfig(*(int(SYNTHETIC_FLAGS[i]) for i in (1, 3)), seed=int(SYNTHETIC_FLAGS[5]))
    data = load_vgp_data(synthetic_config=scenes)
    collator = VGPCollator(AutoTokenizer.from_pretrained(vgp_model_dir), data.region_features, return_probe_targets=True)
    with torch.no_grad():
        expected = evaluate_grounding(load_model(vgp_model_dir), data.eval.select(range(3)), collator, progress=False)
    assert result["num_phrases"] == expected.num_phrases and len(data.eval) > 3
    assert torch.allclose(torch.tensor(result["accuracy"]).double(), torch.as_tensor(expected.accuracy).double())

    assert main(["evaluate", str(vgp_model_dir), "--task", "vgp", *SYNTHETIC_FLAGS, "--max_examples", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["num_examples"] == 3


def test_max_examples_beyond_the_data_reads_all_of_it_with_a_warning(vgp_model_dir, synthetic_scene_cache, tmp_path, capsys):
    from transformers.testing_utils import CaptureLogger

    from hf_vlalign.evaluation import inference

    path = tmp_path / "probe.json"
    with CaptureLogger(inference.logger) as warnings:  # printed on stderr by transformers' logging
        assert main(["probe", str(vgp_model_dir), *SYNTHETIC_FLAGS, "--max_examples", "1000", "--json", str(path)]) == 0
    used = json.loads(path.read_text())["num_examples"]
    assert 3 < used < 1000 and f": {used} examples, " in capsys.readouterr().out.splitlines()[0]
    assert f"`max_examples` 1000 is more than the {used} examples of synthetic (eval): using {used}." in warnings.out
    with CaptureLogger(inference.logger) as warnings:
        assert main(["evaluate", str(vgp_model_dir), "--task", "vgp", *SYNTHETIC_FLAGS, "--max_examples", "1000"]) == 0
    assert json.loads(capsys.readouterr().out)["num_examples"] == used
    assert f"`max_examples` 1000 is more than the {used} examples of" in warnings.out
    for verb in (["probe"], ["evaluate", "--task", "vgp"]):  # below 1, above the size limit: one line, exit status 2
        argv = [verb[0], str(vgp_model_dir), *verb[1:], *SYNTHETIC_FLAGS]
        with pytest.raises(SystemExit, match="2"):
            main([*argv, "--max_examples", "0"])
        assert "`max_examples` must be >= 1, got 0" in capsys.readouterr().err
        with pytest.raises(SystemExit, match="2"):
            main([*argv, "--max_examples", "100000000"])
        assert "argument --max_examples: must be <= " in capsys.readouterr().err


def test_the_synthetic_verbs_read_the_world_they_are_given():
    """`--synthetic_world` of every verb that reads the synthetic scenes, e.g. `analyze` probing a study of world v2."""
    from hf_vlalign.cli.common import SYNTHETIC_WORLDS, synthetic_config
    from hf_vlalign.synthetic.scenes import WORLDS

    assert SYNTHETIC_WORLDS == WORLDS
    parser = build_parser()
    args = parser.parse_args(["analyze", "model", "--out", "o", "--synthetic_world", "v2"])
    assert synthetic_config(args).world == "v2"
    assert synthetic_config(parser.parse_args(["analyze", "model", "--out", "o"])).world == "v1"
    with pytest.raises(SystemExit):
        parser.parse_args(["analyze", "model", "--out", "o", "--synthetic_world", "v3"])


@pytest.mark.slow
def test_stdout_holds_the_verbs_json_alone(tokenizer, tmp_path):
    # a library's print during the verb (DeepSpeed's accelerator notice, printed when the conversion's save first
    # imports it) goes to stderr: stdout parses as the verb's JSON
    from transformers import VisualBertConfig, VisualBertModel

    config = VisualBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        visual_embedding_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    VisualBertModel(config).save_pretrained(tmp_path / "visualbert")
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    argv = ["convert", str(tmp_path / "visualbert"), "--from", "visualbert", "--out", str(tmp_path / "converted")]
    completed = run_cli(*argv, "--tokenizer", str(tmp_path / "tokenizer"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert json.loads(completed.stdout)["vocabulary_size"] == len(tokenizer), (completed.stdout, completed.stderr)
