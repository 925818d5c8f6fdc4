"""The examples' arguments: `--config FILE` (an experiment's settings as a YAML or JSON file of flag values, which the
other flags override), and one representative of each kind of bad value refused with a line naming the flag or file."""

import json

import pytest
from script_modules import ROOT, load_script

from hf_vlalign.recipes import DataArguments, ModelArguments, parse_recipe_args


def parse(argv):
    return parse_recipe_args(argv, (ModelArguments, DataArguments))


def test_yaml_config_sets_defaults_and_flags_override(tmp_path):
    config = tmp_path / "experiment.yaml"
    config.write_text("supervision: direct\nlearning_rate: 1e-5\nnum_train_epochs: 3\n")
    model_args, _, training_args = parse(["--config", str(config), "--num_train_epochs", "5", "--output_dir", "o"])
    assert model_args.supervision == "direct"
    assert training_args.learning_rate == 1e-5  # YAML reads `1e-5` as a string: the flag's type converts it
    assert training_args.num_train_epochs == 5  # the flag wins over the file


def test_json_config_with_equals_spelling(tmp_path):
    config = tmp_path / "experiment.json"
    config.write_text(json.dumps({"supervision": "indirect", "max_text_length": 64}))
    model_args, data_args, _ = parse([f"--config={config}", "--output_dir", "o"])
    assert (model_args.supervision, data_args.max_text_length) == ("indirect", 64)


ALIAS_BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(9))

BAD_CONFIGS = {  # file content -> what the message says
    b"supervison: direct\n": r"names flags this recipe does not take: \['supervison'\]",
    b"- a\n- b\n": "must hold a mapping of flag names to values, got list",
    b"a: [\n": ", line 2: not valid YAML: expected the node content",
    b"supervision: \xff\xfe\n": r"is not UTF-8 text \(the byte 0xff at offset 13\)",
    b"supervision: direct\nsupervision: none\n": ", line 2: not valid YAML: the key 'supervision' is given twice",
    ALIAS_BOMB.encode(): r", line 2: not valid YAML: an alias \(\*l0\), which a config file does not take",
    b"per_device_train_batch_size: 2.5\n": r"`per_device_train_batch_size` must be of type int, got 2.5 \(float\)",
    b"num_train_epochs: [1, 2]\n": r"`num_train_epochs` must be of type float, got \[1, 2\] \(list\)",
    b"learning_rate: {a: 1}\n": r"`learning_rate` must be of type float, got \{'a': 1\} \(dict\)",
}


@pytest.mark.parametrize("content", list(BAD_CONFIGS), ids=["unknown", "list", "syntax", "utf8", "repeated", "alias", "float", "list_value", "dict_value"])
def test_a_bad_config_is_refused_naming_the_file_and_the_problem(tmp_path, content):
    config = tmp_path / "experiment.yaml"
    config.write_bytes(content)
    with pytest.raises(ValueError, match=f"^`--config` '{config}'.*{BAD_CONFIGS[content]}"):
        parse(["--config", str(config)])


def test_a_missing_or_second_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="`--config` must be an existing YAML or JSON file"):
        parse(["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(ValueError, match="`--config` expects a YAML or JSON file, got nothing"):
        parse(["--config"])
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(ValueError, match="^`--config` expects one YAML or JSON file, got it twice"):
        parse(["--config", str(tmp_path / "a.json"), f"--config={tmp_path / 'a.json'}"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max_train_samples", "0"], "`--max_train_samples` must be an integer >= 1, got 0."),
        (["--image_use_examples", "-1"], "`--image_use_examples` must be an integer >= 1, got -1."),
        (["--per_device_train_batch_size", "0"], "`--per_device_train_batch_size` must be an integer >= 1, got 0."),
        (["--num_train_epochs", "-1"], r"`--num_train_epochs` must be > 0 \(or `--max_steps` set\), got -1.0."),
    ],
)
def test_a_count_below_one_is_refused_naming_the_flag(argv, message, tmp_path):
    with pytest.raises(ValueError, match=f"^{message}$"):
        parse([*argv, "--output_dir", str(tmp_path)])


def test_a_tiny_model_image_size_is_bounded_before_anything_is_allocated(tmp_path):
    patch_vlm = load_script("finetune_patch_vlm", ROOT / "examples" / "finetune_patch_vlm.py")
    with pytest.raises(ValueError, match=r"^`--tiny_image_size` must be at most 1024 pixels, got 100000.$"):
        patch_vlm.parse_args(["--tiny_image_size", "100000", "--output_dir", str(tmp_path)])
