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
    assert reproduce.plan_file(reproduce.EXPERIMENTS["fei_a2_fusions_v2"]) == "results/fei_a2_fusions/PLAN_v2.md"
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


def test_ilinykh_v2_claims_and_diagnostics_read_what_the_captioner_writes(tmp_path):
    # the captioner's paper_results keys (examples/train_captioning.py `ilinykh_effects`) and the run's diagnostics
    study = reproduce.EXPERIMENTS["ilinykh_captioner_attention_v2"]
    assert (
        study.results_subdir == "ilinykh_captioner_attention/v2"
        and "--synthetic_world" in study.settings["geometry"].args
    )
    row = {"within": 0.5, "uniform_within": 0.4, "effect": 0.1, "num_rows": 2000, "attention_weighted_distance": 0.4,
           "uniform_distance": 0.4, "normalised_entropy": 0.5, "share": 0.3, "uniform_share": 0.1, "num_words": 900}  # fmt: skip
    layers = [{"layer": layer, **row} for layer in range(3)]
    paper = {
        name: {"per_layer": layers}
        for name in ("within_theme_attention", "attention_distance_effect", "grounded_word_attention")
    }
    paper["attention_entropy_per_layer"] = {"region_to_region": layers}
    diagnostics = {
        "caption": {"image_score": -1.0, "text_only_score": -1.25},
        "geometry": {"loss_change_boxes_shuffled": 0.05},
    }
    (tmp_path / "eval_results.json").write_text(json.dumps({"cider": 0.5, "diagnostics": diagnostics}))
    (tmp_path / "paper_results.json").write_text(json.dumps(paper))
    metrics = reproduce.read_results(tmp_path, study.settings["geometry"])
    assert metrics["diagnostics.caption.image_gain"] == pytest.approx(0.25)
    for claim in study.claims:
        assert claim.diagnostics, claim.statement
        for _, key in (claim.comparison.a, claim.comparison.b):
            assert key in metrics, (claim.statement, key)
        assert all(diagnostic.key in metrics for diagnostic in claim.diagnostics), claim.statement


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
    assert "not planned yet" in reproduce.claims_block(tmp_path)
    (tmp_path / fei.name).mkdir()
    (tmp_path / fei.name / "PLAN.md").write_text("plan")
    assert f"[planned](../results/{fei.name}/PLAN.md), not run yet" in reproduce.claims_block(tmp_path)
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
        block = reproduce.claims_block(tmp_path)
        if len(seeds) == 1:
            settings = len(fei.planned_settings())
            assert f"runs under way ({settings} of {5 * settings})" in block
        else:
            gate = "the gate fusion gives a higher CIDEr-D than no alignment (Table 2)"
            assert f"| fei_a2_fusions | {gate} | **holds** | — | 5 |" in block  # a v1 claim: no mechanism diagnostic
            # the README's row: the plan and how many claims got each verdict
            row = next(
                line for line in reproduce.studies_block(tmp_path).splitlines() if "| fei_a2_fusions | v1 |" in line
            )
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            verdicts = [
                claim["verdict"]
                for claim in json.loads((tmp_path / fei.name / "aggregate.json").read_text())["experiments"][fei.name][
                    "claims"
                ]
            ]
            assert cells[2] == "[PLAN.md](results/fei_a2_fusions/PLAN.md)" and cells[-1] == "5"
            assert cells[3:7] == [str(verdicts.count(verdict)) for verdict in reproduce.VERDICTS]
            assert sum(map(int, cells[3:7])) == len(fei.claims)


def toy_study_runs(acted: dict[int, float]) -> dict[str, dict[int, dict]]:
    """Runs of a toy study: setting "a" beats "b" by 0.1 in every seed; "a" records its mechanism diagnostic `acted`
    (seed -> value) in the seeds given."""
    runs = {"a": {}, "b": {}}
    for seed in range(5):
        runs["a"][seed] = {
            "metrics": {"m": 0.6 + 0.01 * seed} | ({"diagnostics.d": acted[seed]} if seed in acted else {})
        }
        runs["b"][seed] = {"metrics": {"m": 0.5 + 0.01 * seed}}
    return runs


def test_a_claim_whose_mechanism_does_not_act_is_not_testable_here_with_its_diagnostic():
    diagnostic = reproduce.Diagnostic("a", "diagnostics.d", "mask sd", threshold=0.1)
    claim = reproduce.Claim("x", reproduce.Comparison(("a", "m"), ("b", "m")), diagnostics=(diagnostic,))

    def judged(acted: dict[int, float]) -> dict:
        runs = toy_study_runs(acted)
        return reproduce.claim_verdict(claim, reproduce.compare(runs, claim.comparison), runs=runs)

    acting = judged({seed: 0.2 for seed in range(5)})
    assert acting["verdict"] == "holds"  # the mechanism acts: the comparison decides
    assert acting["diagnostics"] == [{"setting": "a", "key": "diagnostics.d", "label": "mask sd", "threshold": 0.1,
                                      "above": True, "mean": pytest.approx(0.2), "n": 5, "met": True}]  # fmt: skip
    idle = judged({0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 0.25})  # mean 0.05, below the plan's 0.1
    assert idle["verdict"] == "not testable here" and idle["interval"] is not None  # the difference is kept
    assert idle["diagnostics"][0]["mean"] == pytest.approx(0.05) and not idle["diagnostics"][0]["met"]
    assert reproduce.claim_line(idle).endswith("; mechanism: mask sd: 0.050 (≥ 0.1))")
    assert reproduce.mechanism_cell(idle) == "mask sd: 0.050 (≥ 0.1)"
    unrecorded = judged({})
    assert unrecorded["verdict"] == "not testable here" and unrecorded["diagnostics"][0]["mean"] is None
    assert reproduce.mechanism_cell(unrecorded) == "mask sd: not recorded (≥ 0.1)"
    at_most = reproduce.Claim(
        "x", claim.comparison, diagnostics=(reproduce.Diagnostic("a", "diagnostics.d", "l", 0.1, above=False),)
    )
    runs = toy_study_runs({seed: 0.05 for seed in range(5)})
    assert reproduce.claim_verdict(at_most, reproduce.compare(runs, claim.comparison), runs=runs)["verdict"] == "holds"
    one_seed = reproduce.claim_verdict(claim, None, runs=toy_study_runs({0: 0.0}))
    assert one_seed["verdict"] == "not testable here" and one_seed["interval"] is None
    # a claim without diagnostics (every v1 claim): the record and its line are what they were
    plain = reproduce.claim_verdict(reproduce.Claim("x", claim.comparison), reproduce.compare(runs, claim.comparison))
    assert (
        "diagnostics" not in plain
        and reproduce.mechanism_cell(plain) == "—"
        and "mechanism" not in reproduce.claim_line(plain)
    )


def test_the_study_table_shows_each_settings_diagnostics_over_seeds():
    runs = toy_study_runs({seed: 0.1 * seed for seed in range(5)})
    assert reproduce.setting_diagnostics(runs["a"]) == {"diagnostics.d": reproduce.summarise(
        {seed: 0.1 * seed for seed in range(5)})}  # fmt: skip
    assert reproduce.setting_diagnostics(runs["b"]) == {}
    experiment = reproduce.Experiment("toy", "toy", {"a": reproduce.Setting(), "b": reproduce.Setting()}, ())
    summary = {"settings": {"a": {"diagnostics": reproduce.setting_diagnostics(runs["a"])}, "b": {}}}
    assert reproduce.diagnostics_table(summary, experiment).splitlines() == [
        "| setting | d |", "|---|---|", "| a | 0.200 ± 0.158 |", "| b | - |"
    ]  # fmt: skip
    assert reproduce.diagnostics_table({"settings": {"b": {}}}, experiment) == ""  # v1 runs: no table


def test_a_second_version_of_a_study_is_planned_in_plan_v2_beside_the_first():
    v2 = reproduce.Experiment("fei_a2_fusions_v2", "t", {}, (), results_subdir="fei_a2_fusions/v2")
    assert reproduce.plan_file(v2) == "results/fei_a2_fusions/PLAN_v2.md"
    assert reproduce.plan_file(LI) == "results/li_emergent_grounding/PLAN.md"


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


SECOND_WORLD = {"samaran_table1_v2": "samaran_table1", "kervadec_alignment_v2": "kervadec_alignment",
                "li_emergent_grounding_v2": "li_emergent_grounding"}  # fmt: skip


@pytest.mark.parametrize("name", SECOND_WORLD)
def test_a_second_world_study_runs_in_world_v2_beside_its_plan_and_conditions_every_claim(name):
    study, folder = reproduce.EXPERIMENTS[name], SECOND_WORLD[name]
    assert study.results_subdir == f"{folder}/v2" and reproduce.is_study(study)
    plan = (ROOT / "results" / folder / "PLAN_v2.md").read_text()
    assert len(plan.splitlines()) <= 90 and name in plan
    for setting in study.settings.values():
        assert "--synthetic_world v2" in " ".join(setting.args)
    for claim in study.claims:
        assert claim.diagnostics, claim.statement
        sides = [claim.comparison.a[0], claim.comparison.b[0], *(d.setting for d in claim.diagnostics)]
        assert set(sides) <= set(study.settings), claim.statement
    assert len(reproduce.planned_runs([name], [42])) == len(study.settings)


def test_the_mechanism_checks_of_a_run_by_hand():
    checks = load_script("mechanism_checks", ROOT / "benchmarks" / "studies" / "mechanism_checks.py")
    metrics = {
        "diagnostics.vqa.image_score": 0.6, "diagnostics.vqa.text_only_score": 0.25,
        "diagnostics.pretraining.image_score": -1.5, "diagnostics.pretraining.text_only_score": -2.0,
        "diagnostics.attention_loss_start": 2.0, "diagnostics.attention_loss_end": 0.5,
        "diagnostics.refcoco.image_score": 0.9,  # no text-only score: no gap
    }  # fmt: skip
    assert checks.mechanism_checks(metrics) == pytest.approx(
        {"diagnostics.vqa.image_gap": 0.35, "diagnostics.pretraining.image_gap": 0.5,
         "diagnostics.attention_loss_relative_drop": 0.75}  # fmt: skip
    )
    assert checks.supervision_drop({"diagnostics.attention_loss_start": 1.0}) == {}
    table = {f"t.{layer}.{head}": 0.1 * layer + 0.01 * head for layer in range(3) for head in range(2)}
    halves = checks.layer_halves("t")({**table, "t.count": 9, "other.0.0": 5.0})
    assert halves == pytest.approx({"t.best_head_lower_layers": 0.01, "t.best_head_upper_layers": 0.21})


def test_the_qwen2vl_study_scores_localization_heads_of_each_model_on_the_scenes_refcoco_files(tmp_path):
    study = reproduce.EXPERIMENTS["vlm_qwen2vl_mechanism"]
    outputs = tmp_path / "outputs"
    command = reproduce.run_command(study, "direct_heads", "miniature", 42, outputs / "m" / "s" / "d" / "x", 1, outputs)
    model = outputs / "miniature" / study.name / "direct" / "seed42"
    assert command[:4] == ["-m", "hf_vlalign.cli", "localization-heads", str(model)]
    refcoco = reproduce.SYNTHETIC_REFCOCO_DIR
    assert command[command.index("--selection_data_file") + 1] == str(refcoco / "train.jsonl")
    assert command[command.index("--data_file") + 1] == str(refcoco / "val.jsonl")
    # the files hold the scenes' RefCOCO+ expressions as the library's builder reads them, with their images
    from studies.synthetic_refcoco import write_synthetic_refcoco  # benchmarks/studies/, on reproduce's path

    from hf_vlalign.data.builders.refcoco import build
    from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp

    config = SyntheticSceneConfig(num_train_images=3, num_val_images=2, distractors=True)
    rows = [json.loads(line) for line in (write_synthetic_refcoco(tmp_path / "refcoco", config) / "val.jsonl").open()]
    expected = build(load_or_generate_synthetic_vgp(config=config).refcoco_dir, "val")
    assert [(row["expression"], row["box"]) for row in rows] == [
        (row["expression"], row["expression_phrase_boxes"][0][0]) for row in expected
    ]
    assert all(Path(row["image"]).is_file() for row in rows)
    # planned, not run yet: the docs block names the plan and the command
    assert "Not run yet: planned in `results/vlm_qwen2vl_mechanism/PLAN.md`" in reproduce.planned_block(study.name)


def test_the_qwen2vl_second_plan_reads_the_scenes_on_canvases_with_their_boxes_moved(tmp_path):
    study = reproduce.EXPERIMENTS["vlm_qwen2vl_mechanism_v2"]
    assert reproduce.plan_file(study) == "results/vlm_qwen2vl_mechanism/PLAN_v2.md"
    outputs = tmp_path / "outputs"
    canvases = reproduce.SYNTHETIC_CANVASES_DIR
    command = reproduce.run_command(study, "direct", "miniature", 42, outputs / "m" / "s" / "d" / "x", 1, outputs)
    assert command[command.index("--train_file") + 1] == str(canvases / "train.jsonl")
    heads = reproduce.run_command(study, "none_heads", "miniature", 42, outputs / "m" / "s" / "n" / "x", 1, outputs)
    assert heads[heads.index("--data_file") + 1] == str(canvases / "refcoco_val.jsonl")
    assert heads[heads.index("--smoothing_sigma") + 1] == "0.3333"
    from PIL import Image
    from studies.synthetic_canvases import CANVASES, write_synthetic_canvases  # benchmarks/studies/

    from hf_vlalign.data.builders.refcoco import build
    from hf_vlalign.synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
    from hf_vlalign.vlms.data import grounded_caption_examples

    config = SyntheticSceneConfig(num_train_images=3, num_val_images=3, min_shapes=4, distractors=True)
    folder = write_synthetic_canvases(tmp_path / "canvases", config, seed=1)
    scenes = load_or_generate_synthetic_vgp(config=config)
    placements = json.loads((folder / "canvases.json").read_text())["placements"]
    captions = [json.loads(line) for line in (folder / "val.jsonl").open()]
    originals, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "val")
    assert [row["caption"] for row in captions] == [example["caption"] for example in originals]
    for row, original in zip(captions, originals):
        image_id = original["image_id"]
        (dx, dy), canvas = placements[image_id]["offset"], tuple(placements[image_id]["canvas"])
        image, scene = Image.open(folder / row["image"]), Image.open(original["image_path"]).convert("RGB")
        assert image.size == canvas and canvas in CANVASES
        # each phrase's moved box holds the scene's pixels of its original box
        for phrase, source in zip(row["phrases"], original["phrases"]):
            assert row["caption"][phrase["start"] :].startswith(phrase["text"])
            (x1, y1, x2, y2), moved = source["boxes"][0], phrase["boxes"][0]
            assert moved == [x1 + dx, y1 + dy, x2 + dx, y2 + dy]
            assert image.crop(moved).tobytes() == scene.crop((x1, y1, x2, y2)).tobytes()
    expressions = [json.loads(line) for line in (folder / "refcoco_val.jsonl").open()]
    expected = build(scenes.refcoco_dir, "val")
    assert [row["expression"] for row in expressions] == [row["expression"] for row in expected]
    for row, source in zip(expressions, expected):
        dx, dy = placements[Path(row["image"]).stem]["offset"]
        x1, y1, x2, y2 = source["expression_phrase_boxes"][0][0]
        assert row["box"] == [x1 + dx, y1 + dy, x2 + dx, y2 + dy]
