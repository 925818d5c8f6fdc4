"""benchmarks/main_job_time.py: each setting is the README's main-job command with flags the example parses, and the
previous defaults it passes are those the example had before issue 34 (2 epochs at 2e-4, evaluated each epoch)."""

from script_modules import ROOT, load_script

benchmark = load_script("main_job_time_commands", ROOT / "benchmarks" / "main_job_time.py")
example = load_script("finetune_vgp_for_main_job_time", ROOT / "examples" / "finetune_vgp.py")


def test_every_setting_is_the_readmes_command_with_flags_the_example_parses(tmp_path):
    readme = (ROOT / "README.md").read_text()
    for setting in benchmark.SETTINGS:
        command = benchmark.run_command(setting, 43, tmp_path / setting)
        launch = " ".join(command[: command.index(benchmark.EXAMPLE) + 1])
        assert f"&& {launch}\n" in readme, launch  # the README's first command
        _, training_args = example.parse_args(command[command.index(benchmark.EXAMPLE) + 1 :])
        assert (training_args.seed, training_args.output_dir) == (43, str(tmp_path / setting))


def test_the_previous_setting_passes_the_previous_defaults():
    previous = example.parse_args(["--output_dir", "unused", *benchmark.PREVIOUS_DEFAULTS])[1].to_dict()
    assert (previous["num_train_epochs"], previous["learning_rate"], previous["eval_strategy"]) == (2, 2e-4, "epoch")
    assert (previous["per_device_train_batch_size"], previous["warmup_steps"]) == (32, 50)
    assert benchmark.SETTINGS["defaults"] == ()  # the example's own defaults, whatever they are
