"""The results harness (benchmarks/reproduce.py): its commands are valid example command lines (each experiment at each
budget, parsed without launching anything); its statistics are right; its smoke mode runs real examples over two seeds; and a two-stream run
repeated with the same seed, machine and thread count gives the same metrics and the same weights, byte for byte."""

from __future__ import annotations

import json
import math

import pytest
from script_modules import ROOT, load_script

reproduce = load_script("reproduce_benchmark", ROOT / "benchmarks" / "reproduce.py")


def representative_cases() -> list[tuple]:
    """Each experiment at each budget it supports, another of its settings at each budget, and every setting that
    runs a CLI verb or starts from another setting's model: every example's command line and every budget's flags."""
    cases = []
    for experiment in reproduce.EXPERIMENTS.values():
        settings = list(experiment.settings)
        budgets = [budget for budget in reproduce.BUDGETS if reproduce.supports(experiment, budget)]
        chosen = {(settings[index % len(settings)], budget) for index, budget in enumerate(budgets)}
        special = [name for name, spec in experiment.settings.items() if spec.verb or spec.start_from]
        chosen |= {(name, budgets[-1]) for name in special}
        cases += [(experiment, setting, budget) for setting, budget in sorted(chosen)]
    return cases


CASES = representative_cases()


def flag_values(flags: list[str]) -> dict[str, str]:
    """Each `--flag value` of a command line, the last one where a flag repeats (as argparse reads it)."""
    return {
        flag.removeprefix("--"): value
        for flag, value in zip(flags, [*flags[1:], "--"])
        if flag.startswith("--") and not value.startswith("--")
    }


@pytest.mark.parametrize("experiment, setting, budget", CASES, ids=[f"{e.name}-{s}-{b}" for e, s, b in CASES])
def test_every_command_is_a_valid_example_command_line(experiment, setting, budget, tmp_path):
    output_dir = tmp_path / budget / experiment.name / setting / "seed7"
    command = reproduce.run_command(experiment, setting, budget, 7, output_dir, 1, tmp_path)
    spec = experiment.settings[setting]
    if spec.start_from is not None:  # a chained run starts from its parent's model folder of the same seed
        parent = tmp_path / budget / experiment.name / spec.start_from / "seed7" / spec.start_from_subfolder
        assert str(parent) in command
    if spec.verb is not None:
        from hf_vlalign.cli import build_parser

        parsed = build_parser().parse_args(command[2:])
        assert (parsed.verb, str(parsed.out)) == (spec.verb, str(output_dir))
        for name, value in flag_values(command[4:]).items():
            assert str(getattr(parsed, name)) == value, (name, value)
        return
    script = ROOT / command[0]
    example = load_script(f"reproduce_{script.stem}", script)
    parsed = example.parse_args(command[1:])
    training_args = parsed[-1]
    assert (training_args.seed, training_args.output_dir) == (7, str(output_dir))
    assert training_args.report_to == [] or training_args.report_to in ("none", ["none"])
    flags = [*spec.args, *reproduce.budget_args(experiment, budget)]
    for name, value in flag_values(flags).items():  # every `--flag value` reaches the parsed arguments
        value = reproduce.with_study_data(value.replace(reproduce.TINY_TEXT_MODEL, str(reproduce.TINY_TEXT_MODEL_DIR)))
        found = [getattr(part, name) for part in parsed if hasattr(part, name)]
        parsed_value = found[0] if found else None
        parsed_value = getattr(parsed_value, "value", parsed_value)  # transformers' enums hold the flag's string
        if isinstance(parsed_value, list) and len(parsed_value) == 1:  # one value of a list flag: `--supervised_layers 2`
            parsed_value = parsed_value[0]
        assert found and (str(parsed_value) == value or parsed_value == float(value)), (name, value, found)
    if "--no_geometry" in command:
        assert parsed[0].geometry is False
    if "--synthetic_distractors" in command:
        assert [part.synthetic_distractors for part in parsed if hasattr(part, "synthetic_distractors")] == [True]


def test_the_statistics_of_the_aggregate(tmp_path):
    experiment = reproduce.EXPERIMENTS["two_stream_alignment"]
    values = {"with": {1: 0.50, 2: 0.40, 3: 0.45}, "without": {1: 0.30, 2: 0.35, 3: 0.50}}
    for setting, by_seed in values.items():
        for seed, value in by_seed.items():
            path = reproduce.run_file(tmp_path, "reduced", experiment.name, setting, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            record = {
                "seed": seed, "command": f"python examples/x.py --seed {seed}", "threads": 1, "wall_seconds": 60.0 + seed,
                "machine": {"cpu": "cpu", "cores": 2}, "versions": {"torch": "t"}, "git_commit": "abc",
                "metrics": {"cross_attention_grounding_accuracy": value, "vqa_accuracy": 0.3},
            }  # fmt: skip
            path.write_text(json.dumps(record))
    summary = reproduce.aggregate(tmp_path, "reduced")["experiments"][experiment.name]
    grounding = summary["settings"]["with"]["metrics"]["cross_attention_grounding_accuracy"]
    assert grounding["mean"] == pytest.approx(0.45) and grounding["sd"] == pytest.approx(0.05)  # n - 1 denominator
    assert summary["settings"]["with"]["command"] == "python examples/x.py --seed S"
    comparison = next(
        c for c in summary["comparisons"] if c["name"] == "with - without: cross_attention_grounding_accuracy"
    )
    differences = [0.20, 0.05, -0.05]
    mean = sum(differences) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / 2)
    assert comparison["mean"] == pytest.approx(mean) and comparison["sd"] == pytest.approx(sd)
    assert comparison["paired_t"] == pytest.approx(mean / (sd / math.sqrt(3)))
    assert comparison["seeds_with_sign_of_mean"] == 2
    assert "2 of 3 seeds" in reproduce.comparison_line(comparison)
    # a metric some run lacks is left out of the table rather than averaged over fewer seeds
    assert "alignment_decoder_grounding_accuracy" not in summary["settings"]["with"]["metrics"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """CI's smoke mode of the harness: the two-stream experiment, tiny budget, two seeds, two runs side by side."""
    root = tmp_path_factory.mktemp("reproduce")
    argv = [
        "--budget", "smoke", "--experiments", "two_stream_alignment", "--seeds", "1", "2", "--jobs", "2",
        "--results_dir", str(root / "results"), "--outputs_dir", str(root / "outputs"),
    ]  # fmt: skip
    return root, reproduce.main(argv)


@pytest.mark.slow
def test_smoke_mode_writes_one_file_per_run_and_the_paired_aggregate(smoke):
    root, report = smoke
    files = sorted((root / "results" / "smoke" / "two_stream_alignment").glob("*/seed*.json"))
    assert [f.relative_to(root / "results" / "smoke" / "two_stream_alignment").as_posix() for f in files] == [
        "with/seed1.json", "with/seed2.json", "without/seed1.json", "without/seed2.json",
    ]  # fmt: skip
    for path in files:
        record = json.loads(path.read_text())
        assert record["budget"] == "smoke" and record["threads"] >= 1 and record["wall_seconds"] > 0
        assert f"--seed {record['seed']}" in record["command"]
        assert {"torch", "transformers", "accelerate", "datasets", "hf_vlalign", "python"} <= set(record["versions"])
        assert record["machine"]["cores"] >= 1 and record["machine"]["cpu"]
        assert 0.0 <= record["metrics"]["vqa_accuracy"] <= 1.0
    summary = report["experiments"]["two_stream_alignment"]
    assert json.loads((root / "results" / "smoke" / "aggregate.json").read_text()) == json.loads(json.dumps(report))
    assert summary["settings"]["with"]["seeds"] == summary["settings"]["without"]["seeds"] == [1, 2]
    runs = reproduce.load_runs(root / "results", "smoke", reproduce.EXPERIMENTS["two_stream_alignment"])
    comparison = next(c for c in summary["comparisons"] if c["name"].endswith("cross_attention_grounding_accuracy"))
    key = "cross_attention_grounding_accuracy"
    assert comparison["by_seed"] == {
        str(seed): runs["with"][seed]["metrics"][key] - runs["without"][seed]["metrics"][key] for seed in (1, 2)
    }
    assert "alignment_decoder_grounding_accuracy" in summary["settings"]["with"]["metrics"]  # only the with run has it
    block = reproduce.docs_block("two_stream_alignment", report)
    assert block.startswith(reproduce.docs_markers("two_stream_alignment")[0]) and "| with |" in block


@pytest.mark.slow
def test_a_repeated_two_stream_run_gives_the_same_metrics_and_weights(smoke):
    """Same seed, same machine, same thread count (another process, so another PYTHONHASHSEED): the same numbers."""
    root, _ = smoke
    experiment = reproduce.EXPERIMENTS["two_stream_alignment"]
    check = reproduce.check_determinism(experiment, "with", "smoke", 1, root / "results", root / "outputs")
    assert check["same_machine"] and check["same_versions"] and check["num_metrics"] > 20
    assert check["differing_metrics"] == []
    assert check["same_weights"] is True
    # and the two seeds differ: the seed reaches the run
    first, other = (reproduce.run_file(root / "results", "smoke", experiment.name, "with", seed) for seed in (1, 2))
    assert json.loads(first.read_text())["metrics"] != json.loads(other.read_text())["metrics"]
