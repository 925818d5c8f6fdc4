"""No traceback for a user mistake: for every verb of `hf-vlalign`, a table of user mistakes (options the chosen
format, data source, task or model family does not read, options a setting needs, output paths of the wrong kind,
damaged checkpoints and input files, malformed results files) run through `hf_vlalign.cli.main` in-process. Each exits
with status 2 and prints exactly one line, `hf-vlalign <verb>: error: ...`, naming the option or file. Then the one
mapping of exception types to that line (`user_error_message`), counts larger than the data (a warning naming the
option and the count used), and the examples' flags that a setting does not read (`recipes.arguments`)."""

from __future__ import annotations

import errno
import json
import re
import shlex
import tempfile

import pytest
from analysis_models import save_with_tokenizer, tiny_family_model
from PIL import Image
from test_cli import run_cli, verb_parsers
from transformers.testing_utils import CaptureLogger

from hf_vlalign.cli import main, user_error_message
from hf_vlalign.utils.user_errors import INTERRUPTED_EXIT_STATUS
from hf_vlalign.utils.optional import MissingDependencyError

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")

SCENES = "--synthetic_train_images 4 --synthetic_eval_images 2 --synthetic_seed 5 --batch_size 2"
PROGRESS_BAR = re.compile(r"\[[\d:]+(<[\d:?]+)?, [^\]]*/s\]$")
VGP_FILES = "--flickr30k_entities_dir {files}/folder --vgp_train_csv {files}/a.csv --vgp_eval_csv {files}/a.csv --features {files}/folder"


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: one tiny model per family, damaged checkpoints and files (shared by the module)
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def places(tokenizer, tmp_path_factory) -> dict[str, str]:
    """The paths the cases' argv templates name: {single}, {two}, {captioner}, {files} and damaged checkpoints."""
    root = tmp_path_factory.mktemp("cli_errors")
    models = {family: save_with_tokenizer(tiny_family_model(family, tokenizer), tokenizer, root / family)
              for family in ("single_stream", "two_stream", "captioner")}  # fmt: skip
    files = root / "files"
    (files / "folder").mkdir(parents=True)
    (files / "empty").mkdir()
    (files / "images").mkdir()
    (files / "images" / "a.png").write_bytes(b"not a png")
    (files / "huge").mkdir()
    Image.new("1", (14000, 14000)).save(files / "huge" / "a.png")  # 196 M pixels: beyond PIL's decompression-bomb limit
    (files / "good_images").mkdir()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(files / "good_images" / "a.png")
    (files / "a_file").write_text("x")
    (files / "a.csv").write_text("x\n")
    (files / "bad.json").write_text('{"a": ')
    (files / "non_utf8.json").write_bytes(b"\xff\xfe{}")
    (files / "list.json").write_text("[1, 2]")
    (files / "junk.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"x" * 40)
    (files / "features.tsv").write_bytes(b"1\t2\xff\n")
    for name, text in RESULTS_FILES.items():
        (files / "runs" / name).mkdir(parents=True)
        (files / "runs" / name / "eval_results.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    (files / "runs" / "no_results").mkdir()
    damaged = {
        "config_list": ("config.json", "[1]"),
        "config_bad_json": ("config.json", '{"model_type": '),
        "config_null": ("config.json", "null"),
        "config_type_number": ("config.json", '{"model_type": 3}'),
        "tokenizer_bad_json": ("tokenizer.json", '{"version": '),
    }
    places = {"single": str(models["single_stream"]), "two": str(models["two_stream"]),
              "captioner": str(models["captioner"]), "files": str(files)}  # fmt: skip
    for name, (file, text) in damaged.items():
        folder = root / name
        folder.mkdir()
        for item in models["single_stream"].iterdir():
            (folder / item.name).write_bytes(item.read_bytes())
        (folder / file).write_text(text)
        places[name] = str(folder)
    without_tokenizer = root / "no_tokenizer"
    without_tokenizer.mkdir()
    for item in models["single_stream"].iterdir():
        if not item.name.startswith("tokenizer"):
            (without_tokenizer / item.name).write_bytes(item.read_bytes())
    places["no_tokenizer"] = str(without_tokenizer)
    return places


VALID_RESULTS = {
    "supervision": "none", "image_description_accuracy": 0.5, "vgp_accuracy": 0.75,
    "grounding_accuracy_best_head": 0.3, "grounding_accuracy_mean_head": 0.25, "grounding_baseline_accuracy": 0.2,
}  # fmt: skip
RESULTS_FILES = {
    "bad_json": '{"supervision": ',
    "truncated": json.dumps(VALID_RESULTS)[:60],
    "non_utf8": b'{"supervision": "\xff"}',
    "null": "null",
    "list": json.dumps([VALID_RESULTS]),
    "null_value": json.dumps(VALID_RESULTS | {"vgp_accuracy": None}),
    "string_value": json.dumps(VALID_RESULTS | {"grounding_accuracy_best_head": "0.3"}),
    "number_supervision": json.dumps(VALID_RESULTS | {"supervision": 3}),
    "missing_key": json.dumps({k: v for k, v in VALID_RESULTS.items() if k != "vgp_accuracy"}),
    "nan": json.dumps(VALID_RESULTS | {"vgp_accuracy": float("nan")}),
}


# ----------------------------------------------------------------------------------------------------------------
# The table: (verb, argv template, what the line must name)
# ----------------------------------------------------------------------------------------------------------------

# one representative per kind of refusal per verb family: an option the setting does not read, an option a setting
# needs, an output of the wrong kind, a model of the wrong kind, a damaged file, a value out of range
MISTAKES = {
    "synthesize": [
        ("out_is_a_file", "--out {files}/a_file", "`--out` {files}/a_file is a file"),
        ("no_images", "--out {files}/scenes --train_images 0", "`num_train_images` must be >= 1"),
    ],
    "convert-features": [
        ("id_map_of_another_format", "{files}/features.tsv --format butd_tsv --out {files}/s --id_map {files}/list.json",
         "`--id_map` applies only to `--format butd_h5`, not to `--format butd_tsv`"),
        ("butd_h5_without_id_map", "{files}/junk.h5 --format butd_h5 --out {files}/s", "`--format butd_h5` needs --id_map"),
        ("source_not_utf8", "{files}/features.tsv --format butd_tsv --out {files}/s", "{files}/features.tsv, line 1: not UTF-8"),
    ],
    "convert": [
        ("another_family", "{single} --from lxmert --out {files}/c", "holds a SingleStreamForVisualParaphrase"),
        ("config_a_list", "{config_list} --from lxmert --out {files}/c", "`src` {config_list}/config.json must hold a JSON object"),
    ],
    "extract-features": [
        ("no_boxes_nor_grid", "{files}/images --out {files}/s", "exactly one of `boxes`"),
        ("image_unreadable", "{files}/images --out {files}/s --grid_size 2", "{files}/images/a.png is not a readable image"),
    ],
    "probe": [
        ("two_stream_model", "{two} " + SCENES, "`probe` with `--data synthetic` needs a SingleStreamForVisualParaphrase, but `model` {two} holds a TwoStreamForPreTraining"),
        ("features_with_synthetic", "{single} --features {files}/folder", "`--features` applies only to `--data vgp` or `--data flickr30k_entities`, not to `--data synthetic`"),
        ("vgp_without_files", "{single} --data vgp", "`--data vgp` needs --flickr30k_entities_dir, --vgp_train_csv, --vgp_eval_csv, --features"),
        ("json_is_a_folder", "{single} --json {files}/folder", "`--json` {files}/folder is a folder; `probe` writes a file there"),
        ("plot_under_a_file", "{single} --plot {files}/a_file/p.png", "`--plot` {files}/a_file/p.png cannot be written: {files}/a_file is a file"),
    ],
    "analyze": [
        ("spacy_model_without_syntax", "{single} --out {files}/a --spacy_model en_core_web_sm --no_syntactic_grounding",
         "`--spacy_model` applies only to a run without `--no_syntactic_grounding`"),
        ("tokenizer_bad_json", "{tokenizer_bad_json} --out {files}/a", "{tokenizer_bad_json}/tokenizer.json, line 1: not valid JSON"),
        ("no_tokenizer", "{no_tokenizer} --out {files}/a", "`model` {no_tokenizer} has no tokenizer"),
    ],
    "explore": [
        ("image_missing", "{single} --out {files}/x.html --image {files}/no.png", "got '{files}/no.png' which does not exist"),
        ("config_null", "{config_null} --out {files}/x.html", "`model` {config_null}/config.json must hold a JSON object"),
    ],
    "evaluate": [
        ("max_text_length_with_vgp", "{single} --task vgp --max_text_length 20", "`max_text_length` applies only to the tasks"),
        ("task_of_another_head", "{single} --task nlvr2", "task 'nlvr2' needs a SingleStreamForVisualReasoning or"),
        ("batch_size_zero", "{single} --task vgp --batch_size 0", "`--batch_size` must be >= 1, got 0"),
    ],
    "localization-heads": [
        ("region_model", "{single} --out {files}/heads", "`model` {single} must be a transformers decoder vision-language model"),
    ],
    "fisher": [
        ("out_is_a_folder", "{single} --out {files}/folder", "`--out` {files}/folder is a folder; `fisher` writes a file there"),
        ("vgp_without_files", "{single} --out {files}/f.safetensors --data vgp --features {files}/folder", "`--data vgp` needs --flickr30k_entities_dir, --vgp_train_csv"),
    ],
    "results-table": [
        ("bad_json", "{files}/runs/bad_json", "{files}/runs/bad_json/eval_results.json, line 1: not valid JSON"),
        ("null", "{files}/runs/null", "{files}/runs/null/eval_results.json must hold a JSON object of results, got null"),
        ("string_value", "{files}/runs/string_value", '`grounding_accuracy_best_head` must be a number, got "0.3"'),
        ("no_results", "{files}/runs/no_results", "`output_dirs` entry {files}/runs/no_results has no eval_results.json"),
    ],
}
CASES = [pytest.param(verb, argv, named, id=f"{verb}-{name}") for verb, table in MISTAKES.items() for name, argv, named in table]


def run_mistake(argv: list[str], capsys) -> tuple[int, list[str]]:
    """(exit status, stderr lines other than progress bars) of `hf-vlalign argv`, which must exit."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # tqdm's progress bars (reading files, loading weights: "... [00:00<00:00, 3.2it/s]") are not messages
    lines = [line.split("\r")[-1] for line in err.split("\n")]
    return exit_info.value.code, [line for line in lines if line.strip() and not PROGRESS_BAR.search(line)]


@pytest.mark.parametrize("verb, template, named", CASES)
def test_a_user_mistake_is_one_line_naming_the_option_or_file(verb, template, named, places, capsys):
    argv = [verb, *shlex.split(template.format(**places))]
    status, lines = run_mistake(argv, capsys)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"hf-vlalign {verb}: error: "), lines[0]
    assert named.format(**places) in lines[0], lines[0]


def test_every_verb_has_its_table_of_mistakes():
    assert set(MISTAKES) == set(verb_parsers())


def test_the_applicability_tables_name_real_options_and_values():
    """Each option of a verb's `option_settings` / `required_options` / `outputs` is an option of that verb, each
    setting value one of the setting's choices, and each model requirement a real class or family (a renamed option
    cannot leave a dead rule)."""
    from hf_vlalign.models.family import FAMILIES

    class_names = {model.class_name for spec in FAMILIES.values() for model in spec.models.values()}
    for verb, parser in verb_parsers().items():
        actions = {action.dest: action for action in parser._actions}
        tables = parser._defaults
        for option, (setting, values) in tables["option_settings"].items():
            assert option in actions and actions[option].option_strings, (verb, option)
            assert set(values) <= set(actions[setting].choices or (True, False)), (verb, setting, values)
        for (setting, value), options in tables["required_options"].items():
            assert value in actions[setting].choices and set(options) <= set(actions), (verb, setting)
        assert set(tables["outputs"]) <= set(actions), verb
        for data, (kind, name) in tables["model_requirements"].items():
            assert data in actions["data"].choices and name in (class_names if kind == "architecture" else FAMILIES), verb


def test_an_option_given_with_its_default_value_is_still_refused(places, capsys):
    """Refusal follows what was typed, not the value: `--split val` (the default) with `--data synthetic` too, and
    an abbreviation (`--spl`) or `--opt=value` spelling is recognised."""
    for option in (["--split", "val"], ["--spl", "val"], ["--split=val"]):
        status, lines = run_mistake(["probe", places["single"], *option], capsys)
        assert status == 2 and lines == [
            "hf-vlalign probe: error: `--split` applies only to `--data flickr30k_entities`, not to `--data synthetic`: drop it."
        ]


# ----------------------------------------------------------------------------------------------------------------
# The mapping of exception types to the line
# ----------------------------------------------------------------------------------------------------------------


def _unicode_error() -> UnicodeDecodeError:
    try:
        b"ab\xffcd".decode("utf-8")
    except UnicodeDecodeError as error:
        return error


def _json_error() -> json.JSONDecodeError:
    try:
        json.loads('{"a":\n 1,')
    except json.JSONDecodeError as error:
        return error


@pytest.mark.parametrize(
    "error, line",
    [
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/x.json"), "No such file or directory: /data/x.json"),
        (_unicode_error(), "not UTF-8 text: the byte b'\\xff' at position 2 (invalid start byte)"),
        (_json_error(), "not valid JSON: Expecting property name enclosed in double quotes (line 2, column 4)"),
        (MissingDependencyError('plots need matplotlib: pip install "hf-vlalign[plots]"'), 'plots need matplotlib: pip install "hf-vlalign[plots]"'),
        (MemoryError(), "out of memory (MemoryError): ask for fewer examples, regions or a smaller batch"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_user_errors_map_to_one_line(error, line):
    assert user_error_message(error) == line


@pytest.mark.parametrize("error", [TypeError("x"), KeyError("x")])
def test_bugs_map_to_no_line_and_keep_their_traceback(error, monkeypatch, tmp_path):
    assert user_error_message(error) is None
    from hf_vlalign.cli import model_verbs

    def broken(output_dirs):
        raise error

    monkeypatch.setattr(model_verbs, "results_table", broken)  # a verb with a bug
    with pytest.raises(type(error)):
        main(["results-table", str(tmp_path)])


def test_ctrl_c_is_one_line_and_exit_status_130(monkeypatch, tmp_path, capsys):
    from hf_vlalign.cli import model_verbs

    def interrupted(output_dirs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model_verbs, "results_table", interrupted)  # Ctrl-C while the verb runs
    with pytest.raises(SystemExit) as exit_info:
        main(["results-table", str(tmp_path)])
    assert exit_info.value.code == INTERRUPTED_EXIT_STATUS == 130
    assert capsys.readouterr().err == "hf-vlalign results-table: error: interrupted\n"


def test_a_message_of_several_lines_is_printed_on_one(monkeypatch, tmp_path, capsys):
    from hf_vlalign.cli import model_verbs

    def failing(output_dirs):
        raise ValueError("first line\n  second line\n\nthird")

    monkeypatch.setattr(model_verbs, "results_table", failing)
    with pytest.raises(SystemExit):
        main(["results-table", str(tmp_path)])
    assert capsys.readouterr().err == "hf-vlalign results-table: error: first line second line third\n"


# ----------------------------------------------------------------------------------------------------------------
# Counts larger than the data: a warning naming the option, and the count used in the output
# ----------------------------------------------------------------------------------------------------------------


def test_explore_counts_larger_than_the_data_are_warned_and_the_used_counts_reported(places, tmp_path, capsys):
    from hf_vlalign.evaluation import inference

    out = tmp_path / "page.html"
    argv = ["explore", places["single"], "--out", str(out), *shlex.split(SCENES), "--num_examples", "1", "--probe_examples", "5000"]
    with CaptureLogger(inference.logger) as warnings:  # printed on stderr by transformers' logging
        assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_examples"] == 1 and 0 < summary["probe_examples"] < 5000
    assert f"`probe_examples` 5000 is more than the {summary['probe_examples']} examples of" in warnings.out
    assert warnings.out.rstrip().endswith(f"using {summary['probe_examples']}.")


def test_explore_shows_all_examples_of_a_smaller_split_with_a_warning():
    import datasets

    from hf_vlalign.evaluation import inference

    rows = datasets.Dataset.from_dict({"x": list(range(3))})
    with CaptureLogger(inference.logger) as warnings:
        assert len(inference.first_examples(rows, 10, "the split", "num_examples")) == 3
    assert "`num_examples` 10 is more than the 3 examples of the split: using 3." in warnings.out


def test_analyze_max_examples_larger_than_the_data_is_warned(places, tmp_path):
    out = tmp_path / "analysis"
    argv = ["analyze", places["single"], "--out", str(out), *shlex.split(SCENES), "--max_examples", "1000", "--no_syntactic_grounding"]
    from hf_vlalign.evaluation import inference

    with CaptureLogger(inference.logger) as warnings:
        assert main(argv) == 0
    used = json.loads((out / "analysis.json").read_text())["num_examples"]
    assert 0 < used < 1000
    assert f"`max_examples` 1000 is more than the {used} examples of" in warnings.out


# ----------------------------------------------------------------------------------------------------------------
# The examples' flags (recipes.arguments): a flag the setting does not read is refused by name
# ----------------------------------------------------------------------------------------------------------------


def _parse_recipe(argv: list[str]):
    from hf_vlalign.recipes.arguments import DataArguments, ModelArguments, parse_recipe_args
    from hf_vlalign.trainers.task import TaskTrainingArguments

    with tempfile.TemporaryDirectory() as output_dir:
        return parse_recipe_args(["--output_dir", output_dir, *argv], (ModelArguments, DataArguments), TaskTrainingArguments)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--l_layers", "2"], "`--l_layers` applies only to `--model_family two_stream`, not to `--model_family single_stream`"),
        (["--dataset", "gqa", "--synthetic_seed", "3"], "`--synthetic_seed` applies only to no `--dataset` or `--dataset synthetic_scenes`, not to `--dataset gqa`"),
    ],
)
def test_a_recipe_flag_the_setting_does_not_read_is_refused(argv, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        _parse_recipe(argv)


def test_a_recipe_flag_in_a_config_file_is_checked_too(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("supervision_weight: 2.0\n")
    with pytest.raises(ValueError, match="`--supervision_weight` applies only to"):
        _parse_recipe(["--config", str(config)])
    model_args, *_ = _parse_recipe(["--config", str(config), "--supervision", "direct"])
    assert model_args.supervision_weight == 2.0


def test_recipe_flags_with_the_setting_that_reads_them_are_kept():
    model_args, data_args, _ = _parse_recipe(
        ["--model_family", "two_stream", "--l_layers", "2", "--supervision", "direct", "--supervised_layers", "0",
         "--dataset", "synthetic_scenes", "--synthetic_seed", "3"]
    )  # fmt: skip
    assert (model_args.l_layers, model_args.supervised_layers, data_args.synthetic_seed) == (2, "0", 3)


def test_layer_flags_with_an_hf_vlalign_checkpoint_are_refused(places):
    argv = ["--model_family", "two_stream", "--model_name_or_path", places["two"], "--x_layers", "4"]
    with pytest.raises(ValueError, match=f"^--x_layers size a model built from a text checkpoint, but `--model_name_or_path` {places['two']} is a two_stream checkpoint"):
        _parse_recipe(argv)
    model_args, *_ = _parse_recipe(argv[:4])  # without the flag the checkpoint's layers are kept
    assert model_args.model_name_or_path == places["two"]


def test_a_recipe_row_count_larger_than_the_split_is_warned():
    import datasets

    from hf_vlalign.recipes import subsets

    rows = datasets.Dataset.from_dict({"x": list(range(5))})
    with CaptureLogger(subsets.logger) as warnings:
        assert len(subsets.first_rows(rows, 3)) == 3
    assert warnings.out == ""
    with CaptureLogger(subsets.logger) as warnings:
        assert len(subsets.first_rows(rows, 50)) == 5
    assert "`--max_train_samples` / `--max_eval_samples` 50 is more than the 5 rows of the split: using 5." in warnings.out


# ----------------------------------------------------------------------------------------------------------------
# The real console script
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_console_script_prints_one_line_and_no_traceback(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "eval_results.json").write_bytes(b'{"supervision": "\xff')
    completed = run_cli("results-table", str(tmp_path / "run"))
    assert completed.returncode == 2 and completed.stdout == "" and "Traceback" not in completed.stderr
    assert completed.stderr == f"hf-vlalign results-table: error: {tmp_path}/run/eval_results.json, line 1: not UTF-8 text (the byte 0xff).\n"


def test_typed_options_tells_typed_options_from_defaults_and_restores_the_defaults():
    from hf_vlalign.cli import build_parser
    from hf_vlalign.utils.typed_options import typed_options

    parser = build_parser()
    argv = ["convert-features", "src.tsv", "--form=butd_tsv", "--out", "o"]  # an abbreviation and a `=value` spelling
    assert typed_options(parser, argv) == {"format", "out"}
    assert parser.parse_args(argv).on_error == "raise"  # the defaults are back
