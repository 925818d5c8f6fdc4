"""`--config FILE`: an experiment's settings as a YAML or JSON file of flag values, which the other flags override."""

import json

import pytest

from hf_vlalign.recipes import DataArguments, ModelArguments, parse_recipe_args


def parse(argv):
    return parse_recipe_args(argv, (ModelArguments, DataArguments))


def test_yaml_config_sets_defaults_and_flags_override(tmp_path):
    config = tmp_path / "experiment.yaml"
    config.write_text("supervision: direct\nlearning_rate: 1.0e-5\nnum_train_epochs: 3\n")
    model_args, _, training_args = parse(["--config", str(config), "--num_train_epochs", "5", "--output_dir", "o"])
    assert model_args.supervision == "direct"
    assert training_args.learning_rate == 1e-5
    assert training_args.num_train_epochs == 5  # the flag wins over the file


def test_json_config_with_equals_spelling(tmp_path):
    config = tmp_path / "experiment.json"
    config.write_text(json.dumps({"supervision": "indirect", "max_text_length": 64}))
    model_args, data_args, _ = parse([f"--config={config}", "--output_dir", "o"])
    assert (model_args.supervision, data_args.max_text_length) == ("indirect", 64)


@pytest.mark.parametrize(
    "text, message",
    [
        ("supervison: direct\n", r"names flags this recipe does not take: \['supervison'\]"),
        ("- a\n- b\n", "must hold a mapping of flag names to values, got list"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_bad_config_names_the_problem(tmp_path, text, message):
    config = tmp_path / "experiment.yaml"
    config.write_text(text)
    with pytest.raises(ValueError, match=message):
        parse(["--config", str(config)])


def test_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match="`--config` must be an existing YAML or JSON file"):
        parse(["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(ValueError, match="`--config` expects a YAML or JSON file, got nothing"):
        parse(["--config"])
