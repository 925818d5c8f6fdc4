"""The studies' part of the results harness (benchmarks/reproduce.py, budget `miniature`): where their files go,
what a run keeps of its results files, chained runs in order, and the verdict on each paper's claim."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from script_modules import ROOT, load_script

reproduce = load_script("reproduce_benchmark", ROOT / "benchmarks" / "reproduce.py")
LI = reproduce.EXPERIMENTS["li_emergent_grounding"]
KERVADEC = reproduce.EXPERIMENTS["kervadec_alignment"]


def test_a_study_keeps_its_results_beside_its_plan_and_every_study_has_one():
    assert reproduce.run_file(Path("results"), "miniature", LI.name, "probe", 42) == Path(
        "results/li_emergent_grounding/probe/seed42.json"
    )
    assert reproduce.run_file(Path("results"), "reduced", "downstream", "vqa", 42) == Path(
        "results/reduced/downstream/vqa/seed42.json"
    )
    studies = [e for e in reproduce.EXPERIMENTS.values() if reproduce.is_study(e)]
    assert {e.name for e in studies} >= {LI.name, KERVADEC.name}
    for study in studies:
        assert study.claims, study.name
    with pytest.raises(SystemExit, match="no plan for"):
        reproduce.check_plans(Path("nowhere"), {LI.name})
    reproduce.check_plans(ROOT / "results", {LI.name})
    # a second-world study's plan lies beside the v1 plan: results/<study>/PLAN_v2.md
    assert reproduce.plan_path(reproduce.EXPERIMENTS["fei_a2_fusions_v2"]) == Path("fei_a2_fusions/PLAN_v2.md")
    reproduce.check_plans(ROOT / "results", {"fei_a2_fusions_v2"})
    with pytest.raises(ValueError, match="has no budget 'reduced'"):
        reproduce.budget_args(LI, "reduced")


def test_lists_of_a_results_file_are_kept_by_index():
    flat = reproduce.flatten_numbers({"a": [0.5, {"b": 2, "name": "x"}], "ok": True, "none": None, "c": {"d": 1.0}})
    assert flat == {"a.0": 0.5, "a.1.b": 2, "c.d": 1.0}


def test_a_run_keeps_its_extra_files_the_kept_keys_and_the_derived_numbers(tmp_path):
    probe = LI.settings["probe"]
    accuracy = [[0.1, 0.3], [0.2, 0.05]]
    (tmp_path / "analysis.json").write_text(
        json.dumps({"grounding_probe": {"accuracy": accuracy, "best_head_accuracy": 0.3}, "num_examples": 7})
    )
    metrics = reproduce.read_results(tmp_path, probe)
    assert metrics["grounding_probe.best_head_of_layer.0"] == 0.3
    assert metrics["grounding_probe.best_head_of_layer.1"] == 0.2
    assert metrics["grounding_probe.accuracy.1.0"] == 0.2 and "num_examples" not in metrics  # not a kept key
    captioner = reproduce.EXPERIMENTS["ilinykh_captioner_attention"].settings["geometry"]
    (tmp_path / "eval_results.json").write_text(json.dumps({"cider": 0.5}))
    (tmp_path / "paper_results.json").write_text(json.dumps({"attention_vs_distance": {"per_layer": [{"r": -0.2}]}}))
    assert reproduce.read_results(tmp_path, captioner) == {
        "cider": 0.5, "paper_results.attention_vs_distance.per_layer.0.r": -0.2
    }  # fmt: skip


def test_a_chained_run_starts_from_its_parent_and_runs_after_it(tmp_path):
    results, outputs = tmp_path / "results", tmp_path / "outputs"
    planned = reproduce.planned_runs([KERVADEC.name], [1, 2])
    todo = reproduce.runs_to_do(planned, "miniature", results, outputs, overwrite=False)
    main_settings = ("with", "without", "qa_with", "qa_without")
    assert [(s, seed) for _, s, seed in todo if s in main_settings] == [
        (s, seed) for seed in (1, 2) for s in main_settings
    ]
    command = reproduce.run_command(KERVADEC, "qa_with", "miniature", 1, outputs / "x" / "y" / "z" / "w", 1, outputs)
    assert command[command.index("--model_name_or_path") + 1] == str(
        outputs / "miniature" / "kervadec_alignment" / "with" / "seed1" / "with_alignment"
    )
    # a child whose result is missing brings back its parent when the parent's model folder is gone
    parent_file = reproduce.run_file(results, "miniature", KERVADEC.name, "with", 1)
    parent_file.parent.mkdir(parents=True)
    parent_file.write_text("{}")
    todo = reproduce.runs_to_do([(KERVADEC, "qa_with", 1)], "miniature", results, outputs, overwrite=False)
    assert [s for _, s, _ in todo] == ["with", "qa_with"]
    events, lock = [], threading.Lock()

    def run(task):
        _, setting, seed = task
        with lock:
            events.append(("start", setting, seed))
        time.sleep(0.05 if setting.startswith("qa") else 0.2)
        with lock:
            events.append(("end", setting, seed))

    todo = reproduce.runs_to_do(planned, "miniature", tmp_path / "none", outputs, overwrite=False)
    reproduce.run_in_order(todo, 2, run)
    assert len(events) == 2 * len(todo)
    for _, setting, seed in todo:
        parent = KERVADEC.settings[setting].start_from
        if parent is not None:
            assert events.index(("end", parent, seed)) < events.index(("start", setting, seed))


def test_a_failed_run_stops_the_harness():
    def run(task):
        raise RuntimeError(f"{task[1]} failed")

    with pytest.raises(RuntimeError, match="failed"):
        reproduce.run_in_order([(LI, "pretrain", 1)], 1, run)


def test_a_difference_of_differences_pairs_every_side_by_seed():
    """gate - none at 8 epochs minus gate - none at 2 (Fei's further experiment): per seed, over the seeds that have
    all four runs."""
    values = {"gate_8": {1: 0.9, 2: 0.8, 3: 0.5}, "none_8": {1: 0.6, 2: 0.7, 3: 0.5}, "gate_2": {1: 0.4, 2: 0.3},
              "none_2": {1: 0.5, 2: 0.1}}  # fmt: skip
    runs = {name: {seed: {"metrics": {"cider": v}} for seed, v in by_seed.items()} for name, by_seed in values.items()}
    late = reproduce.Comparison(("gate_8", "cider"), ("none_8", "cider"))
    grows = reproduce.Comparison(late.a, late.b, minus=reproduce.Comparison(("gate_2", "cider"), ("none_2", "cider")))
    assert late.differences(runs) == pytest.approx({1: 0.3, 2: 0.1, 3: 0.0})
    assert grows.differences(runs) == pytest.approx({1: 0.4, 2: -0.1})
    assert grows.name == "(gate_8 - none_8: cider) - (gate_2 - none_2: cider)"
    assert reproduce.compare(runs, grows)["n"] == 2
    assert reproduce.compare(runs, reproduce.Comparison(("gate_2", "cider"), ("missing", "cider"))) is None


def verdict(differences, sign=1, min_effect=0.0):
    claim = reproduce.Claim("x", reproduce.Comparison(("a", "m"), ("b", "m")), sign, min_effect)
    summary = reproduce.summarise(dict(enumerate(differences)))
    return reproduce.claim_verdict(claim, summary | {"name": "a - b: m"})


def test_the_verdict_on_a_claim_follows_the_interval_of_the_paired_differences():
    assert verdict([0.10, 0.12, 0.09, 0.11, 0.13])["verdict"] == "holds"
    assert verdict([0.10, 0.12, 0.09, 0.11, 0.13], sign=-1)["verdict"] == "does not hold"
    assert verdict([0.10, -0.12, 0.09, -0.11, 0.02])["verdict"] == "inconclusive"
    # an interval around 0 that excludes every effect of the size counted: the effect is absent
    tiny = [0.001, -0.001, 0.002, -0.002, 0.0]
    assert verdict(tiny, min_effect=0.02)["verdict"] == "does not hold"
    assert verdict(tiny)["verdict"] == "inconclusive"
    result = verdict([0.10, 0.12, 0.09, 0.11, 0.13])
    low, high = result["interval"]
    # 95 % interval: mean ± t(0.975, 4) * sd / sqrt(5), t = 2.776
    assert (low + high) / 2 == pytest.approx(0.11)
    assert (high - low) / 2 == pytest.approx(2.776 * 0.0158114 / 5**0.5, 1e-3)
    assert verdict([0.1])["verdict"] == "inconclusive"
    assert "**holds**" in reproduce.claim_line(result)


def test_the_claims_table_says_planned_under_way_or_the_verdict(tmp_path):
    fei = reproduce.EXPERIMENTS["fei_a2_fusions"]
    assert "not planned yet" in reproduce.studies_block(tmp_path)
    (tmp_path / fei.name).mkdir()
    (tmp_path / fei.name / "PLAN.md").write_text("plan")
    assert f"[planned](results/{fei.name}/PLAN.md), not run yet" in reproduce.studies_block(tmp_path)
    for seeds in ([42], [42, 43, 44, 45, 46]):
        for setting in fei.planned_settings():
            for seed in seeds:
                path = reproduce.run_file(tmp_path, "miniature", fei.name, setting, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                record = {
                    "seed": seed, "command": "python examples/x.py", "threads": 1, "wall_seconds": 1.0,
                    "machine": {"cpu": "cpu", "cores": 2}, "versions": {"torch": "t"}, "git_commit": "abc",
                    "metrics": {"cider": 0.5 + (0.1 + 0.01 * seed if setting != "none" else 0.0)},
                }  # fmt: skip
                path.write_text(json.dumps(record))
        reproduce.write_aggregate(tmp_path, "miniature", [fei.name], docs=False)
        block = reproduce.studies_block(tmp_path)
        if len(seeds) == 1:
            settings = len(fei.planned_settings())
            assert f"runs under way ({settings} of {5 * settings})" in block
        else:
            gate = "the gate fusion gives a higher CIDEr-D than no alignment (Table 2)"
            assert f"| fei_a2_fusions | {gate} | **holds** | 5 |" in block


def test_threads_per_run_can_leave_cores_free_and_must_be_positive(capsys):
    assert reproduce.parse_args(["--jobs", "1", "--threads", "1"]).threads == 1
    assert reproduce.parse_args([]).threads is None
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--threads", "0"])
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_matching_pilot_learns_a_mismatch_the_features_show(capsys):
    """The Kervadec pilot's control (benchmarks/studies/matching_pilot.py): with a mismatched image's features made
    constant, the two-stream model learns image-sentence matching within 100 steps."""
    pilot = load_script("matching_pilot", ROOT / "benchmarks" / "studies" / "matching_pilot.py")
    pilot.main(["--steps", "100", "--constant_mismatch"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("step 100: matching loss") and float(last.split("accuracy ")[1]) >= 0.95


def test_settings_choose_part_of_a_study_and_must_exist(capsys):
    args = reproduce.parse_args(["--budget", "miniature", "--experiments", "fei_a2_fusions", "--settings", "none"])
    assert args.settings == ["none"]
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--budget", "miniature", "--experiments", "fei_a2_fusions", "--settings", "probe"])
    assert "--settings ['probe'] are not settings of ['fei_a2_fusions']" in capsys.readouterr().err
