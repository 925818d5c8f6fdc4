"""`examples/samaran_table1.py` end to end on the real annotation samples (../shared/data): VGP fine-tuning with two
supervisions on Flickr30k Entities + the authors' VGP csvs (RA_Files), then VQA v2 and RefCOCO+ from each checkpoint,
with region features written in LXMERT's TSV layout and converted with `hf-vlalign convert-features`, as a user does.

What the samples lack is written here in the published layouts, and only that:
- VQA v2 val annotations for the official val questions head (the sample has questions only): one record per question
  in `v2_mscoco_val2014_annotations.json`'s layout, ten answers drawn from LXMERT's answer vocabulary (invented
  answers; the questions are real). Training reads AllenNLP's trimmed train2014 fixture (real questions and answers).
- RefCOCO+ (no sample exists): `refs(unc).p` (a protocol-2 pickle, as lichengunc/refer ships it) and `instances.json`
  for the COCO image ids of the VQA samples, with the referred objects' boxes among the images' detected regions.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch
from script_modules import ROOT, load_script
from shared_samples import real_sample

from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase
from hf_vlalign.cli import main as cli_main
from hf_vlalign.utils.text_model import default_text_model_path
from published_features import region_record, write_lxmert_tsv_features

# end to end: six trainings in this process (2 settings x VGP, VQA, RefCOCO+), three more in two launched processes
pytestmark = pytest.mark.slow

table1 = load_script("samaran_table1", ROOT / "examples" / "samaran_table1.py")
SETTINGS = ("none", "direct")
PAPER_COLUMNS = ["VQA val", "RefCOCO+ val", "RefCOCO+ testA", "RefCOCO+ testB"]
FEATURE_DIM = 16  # published_features' default
VGP_TRAIN_ROWS, VGP_EVAL_ROWS = 48, 32


# ----------------------------------------------------------------------------------------------------------------
# The files a user brings
# ----------------------------------------------------------------------------------------------------------------


def _head(source, target, rows):
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    target.write_text("".join(lines[: rows + 1]), encoding="utf-8")
    return target


def _convert(tsv, out):
    assert cli_main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(out)]) == 0
    return out


def _vqa_val_annotations(path, questions_file, vocab_file):
    """v2_mscoco_val2014_annotations.json's layout for the questions of `questions_file` (answers invented)."""
    questions = json.loads(questions_file.read_text())["questions"]
    vocab = sorted(json.loads(vocab_file.read_text()))[:20]
    annotations = []
    for index, question in enumerate(questions):
        main = vocab[index % len(vocab)]
        answers = [main] * 7 + [vocab[(index + 1) % len(vocab)]] * 3
        annotations.append({
            "question_type": " ".join(question["question"].lower().split()[:2]),
            "multiple_choice_answer": main,
            "answers": [{"answer": answer, "answer_confidence": "yes", "answer_id": i + 1} for i, answer in enumerate(answers)],
            "image_id": question["image_id"],
            "answer_type": "number" if main.isdigit() else "other",
            "question_id": question["question_id"],
        })  # fmt: skip
    content = {"info": {"description": "written by tests/examples/test_samaran_table1.py"}, "license": {},
               "data_subtype": "val2014", "annotations": annotations}  # fmt: skip
    path.write_text(json.dumps(content))
    return path


def _refcoco_folder(folder, image_ids):
    """refs(unc).p and instances.json (lichengunc/refer's layout) for `image_ids` (COCO ids): three objects per image
    (boxes of its detected regions), one ref per object, the images spread over train / val / testA / testB."""
    folder.mkdir()
    images, annotations, refs = [], [], []
    splits = ("train", "train", "val", "testA", "testB")
    categories = [{"id": 1, "name": "person", "supercategory": "person"}, {"id": 3, "name": "car", "supercategory": "vehicle"}]
    for image_index, image_id in enumerate(image_ids):
        record = region_record(f"COCO_train2014_{image_id:012d}")
        height, width = record["image_size"]
        images.append({"id": image_id, "width": width, "height": height,
                       "file_name": f"COCO_train2014_{image_id:012d}.jpg"})  # fmt: skip
        split = splits[image_index % len(splits)]
        for object_index in range(3):
            x1, y1, x2, y2 = (float(v) for v in record["boxes"][object_index])
            ann_id = image_id * 10 + object_index
            category = categories[object_index % 2]
            annotations.append({"id": ann_id, "image_id": image_id, "category_id": category["id"],
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})  # fmt: skip
            words = [["left", "person"], ["car", "in", "front"], ["man", "on", "right"]][object_index]
            ref_id = len(refs)
            refs.append({
                "image_id": image_id, "split": split, "ann_id": ann_id, "ref_id": ref_id, "category_id": category["id"],
                "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg",
                "sent_ids": [ref_id * 2, ref_id * 2 + 1],
                "sentences": [
                    {"sent_id": ref_id * 2, "sent": " ".join(words), "raw": " ".join(words).capitalize(), "tokens": words},
                    {"sent_id": ref_id * 2 + 1, "sent": "the " + " ".join(words), "raw": "The " + " ".join(words),
                     "tokens": ["the", *words]},
                ],
            })  # fmt: skip
    (folder / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    (folder / "instances.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return folder


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("samaran_table1")
    flickr = real_sample("flickr30k_entities")
    vgp = real_sample("vgp", "RA_Files")
    # the first rows of the authors' csvs (whole lines, unedited), so that six trainings take seconds on a CPU
    train_csv = _head(vgp / "full_data_type_phrase_pair_train.csv", root / "vgp_train.csv", VGP_TRAIN_ROWS)
    eval_csv = _head(vgp / "full_data_type_phrase_pair_val.csv", root / "vgp_val.csv", VGP_EVAL_ROWS)
    flickr_ids = sorted({row.split(",", 1)[0] for path in (train_csv, eval_csv) for row in path.read_text().splitlines()[1:]})
    flickr_store = _convert(write_lxmert_tsv_features(root / "flickr_obj36.tsv", flickr_ids), root / "flickr_store")

    vqa = real_sample("vqa_v2")
    val_questions = vqa / "official_val2014_questions_head" / "v2_OpenEnded_mscoco_val2014_questions.json"
    train_questions = vqa / "allennlp_fixture" / "questions.json"
    vqa_dir = root / "vqa"
    vqa_dir.mkdir()
    val_annotations = _vqa_val_annotations(
        vqa_dir / "v2_mscoco_val2014_annotations.json", val_questions, vqa / "trainval_ans2label.json"
    )
    train_ids = sorted({q["image_id"] for q in json.loads(train_questions.read_text())["questions"]})
    val_ids = sorted({q["image_id"] for q in json.loads(val_questions.read_text())["questions"]})
    # LXMERT's TSV ids: train2014 / val2014 images for VQA; RefCOCO+ images are all COCO train2014 ones
    refcoco_ids = train_ids + val_ids
    coco_ids = [f"COCO_train2014_{i:012d}" for i in refcoco_ids] + [f"COCO_val2014_{i:012d}" for i in val_ids]
    coco_store = _convert(write_lxmert_tsv_features(root / "coco_obj36.tsv", coco_ids), root / "coco_store")
    refcoco_dir = _refcoco_folder(root / "refcoco+", refcoco_ids)

    # the starting checkpoint: a tiny single-stream model with the embedded MiniLM's vocabulary
    torch.manual_seed(0)
    tokenizer_dir = default_text_model_path()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128, visual_feat_dim=FEATURE_DIM,
    )  # fmt: skip
    start = root / "tiny_start"
    SingleStreamForVisualParaphrase(config).save_pretrained(start)
    tokenizer.save_pretrained(start)

    return {
        "root": root,
        "driver": [
            "--config", str(ROOT / "examples" / "configs" / "samaran_table1.yaml"),
            "--flickr30k_entities_dir", str(flickr),
            "--vgp_train_csv", str(train_csv), "--vgp_eval_csv", str(eval_csv),
            "--features", str(flickr_store),
            "--vqa_dir", str(vqa_dir), "--coco_features", str(coco_store),
            "--refcoco_dir", str(refcoco_dir),
            "--supervisions", ",".join(SETTINGS),
        ],
        "tiny": [
            # tiny sizes and short runs; everything else is the config's
            "--vgp.model_name_or_path", str(start), "--vgp.num_train_epochs", "1", "--vgp.warmup_steps", "0",
            "--vgp.image_use_examples", "32", "--vgp.max_text_length", "48",
            "--vgp.per_device_train_batch_size", "16",
            "--vqa.questions_file", str(train_questions),
            "--vqa.annotations_file", str(vqa / "allennlp_fixture" / "annotations.json"),
            "--vqa.eval_questions_file", str(val_questions), "--vqa.eval_annotations_file", str(val_annotations),
            "--vqa.answer_vocab", str(vqa / "trainval_ans2label.json"),
            "--vqa.max_steps", "2", "--vqa.warmup_steps", "0", "--vqa.gradient_accumulation_steps", "1",
            "--refcoco.max_steps", "2", "--refcoco.warmup_steps", "0",
            "--common.report_to", "none", "--common.logging_steps", "1", "--common.per_device_eval_batch_size", "64",
        ],
    }  # fmt: skip


@pytest.fixture(scope="module")
def table_run(user_files):
    output_dir = user_files["root"] / "out"
    argv = [*user_files["driver"], *user_files["tiny"], "--output_dir", str(output_dir)]
    started = time.perf_counter()
    table = table1.main(argv)
    return output_dir, argv, table, time.perf_counter() - started


# ----------------------------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------------------------


def test_table_has_every_setting_and_the_papers_metrics(table_run):
    output_dir, _, table, _ = table_run
    written = json.loads((output_dir / "table1.json").read_text())
    assert written == json.loads(json.dumps(table))
    assert written["columns"] == PAPER_COLUMNS
    assert list(written["settings"]) == list(SETTINGS)
    for setting, entry in written["settings"].items():
        assert set(entry["metrics"]) == set(PAPER_COLUMNS) | set(table1.VGP_COLUMNS), setting
        for column, value in entry["metrics"].items():
            assert 0.0 <= value <= 1.0, (setting, column)
        assert list(entry["per_seed"]) == ["12345"]  # the config's seed (the authors' RNG_SEED)
    markdown = (output_dir / "table1.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| supervision"))
    assert all(column in header for column in PAPER_COLUMNS)
    assert all(any(line.startswith(f"| {setting} |") for line in markdown.splitlines()) for setting in SETTINGS)


def test_each_setting_chains_vgp_into_both_downstream_runs(table_run):
    output_dir, _, table, _ = table_run
    for setting in SETTINGS:
        runs = table["settings"][setting]["runs"]["12345"]
        vgp = json.loads((output_dir / setting / "seed12345" / "vgp" / "eval_results.json").read_text())
        assert vgp["supervision"] == setting
        vgp_config = json.loads((output_dir / setting / "seed12345" / "vgp" / "config.json").read_text())
        assert vgp_config["attention_supervision"] == setting and vgp_config["hidden_size"] == 32
        for stage in ("vqa", "refcoco"):
            results = json.loads((output_dir / setting / "seed12345" / stage / "eval_results.json").read_text())
            args = json.loads((output_dir / setting / "seed12345" / stage / "training_args.json").read_text())
            assert runs[stage] == str(output_dir / setting / "seed12345" / stage)
            config = json.loads((output_dir / setting / "seed12345" / stage / "config.json").read_text())
            # the VGP run's encoder (its size), trained downstream without attention supervision
            assert config["hidden_size"] == 32 and config["attention_supervision"] == "none"
            assert results["supervision"] == "none" and args["seed"] == 12345
            card = (output_dir / setting / "seed12345" / stage / "README.md").read_text()
            assert f"started from `{output_dir / setting / 'seed12345' / 'vgp'}`" in card
        vqa = json.loads((output_dir / setting / "seed12345" / "vqa" / "eval_results.json").read_text())
        assert vqa["dataset"] == "vqa_v2" and vqa["eval_examples"] == 65  # every question of the official head
        assert table["settings"][setting]["metrics"]["VQA val"] == vqa["vqa_accuracy"]
        refcoco = json.loads((output_dir / setting / "seed12345" / "refcoco" / "eval_results.json").read_text())
        assert set(refcoco["test_splits"]) == {"testA", "testB"}
        assert table["settings"][setting]["metrics"]["RefCOCO+ testB"] == refcoco["test_splits"]["testB"]["accuracy"]
        # the referred boxes are detected regions: within reach on every split
        assert refcoco["upper_bound_accuracy"] == 1.0
        assert all(split["upper_bound_accuracy"] == 1.0 for split in refcoco["test_splits"].values())


def test_sub_runs_read_the_config_values(table_run):
    output_dir, _, _, _ = table_run
    vgp_args = json.loads((output_dir / "direct" / "seed12345" / "vgp" / "training_args.json").read_text())
    assert vgp_args["optim"] == "sgd" and vgp_args["learning_rate"] == pytest.approx(2.24e-3)
    refcoco_args = json.loads((output_dir / "none" / "seed12345" / "refcoco" / "training_args.json").read_text())
    assert refcoco_args["learning_rate"] == pytest.approx(1.28e-5) and refcoco_args["max_steps"] == 2
    written = json.loads((output_dir / "configs" / "direct" / "seed12345" / "vqa.json").read_text())
    assert written["learning_rate"] == 8.0e-5 and written["max_steps"] == 2  # the file's, then the flag's (typed as in YAML)
    # VL-BERT trains every parameter at one rate, not finetune_vqa.py's faster rate of the new head
    vqa_args = json.loads((output_dir / "none" / "seed12345" / "vqa" / "training_args.json").read_text())
    assert vqa_args["learning_rate"] == vqa_args["head_learning_rate"] == pytest.approx(8.0e-5)


def test_a_rerun_skips_the_finished_sub_runs(table_run):
    output_dir, argv, table, first_seconds = table_run
    weights = output_dir / "direct" / "seed12345" / "vqa" / "model.safetensors"
    written = weights.stat().st_mtime_ns
    started = time.perf_counter()
    again = table1.main(argv)
    assert time.perf_counter() - started < first_seconds / 4
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(table))
    assert weights.stat().st_mtime_ns == written

    # an unfinished sub-run (no results, a checkpoint) resumes from its last checkpoint instead of starting over
    unfinished = output_dir / "none" / "seed12345" / "refcoco"
    (unfinished / "eval_results.json").unlink()
    state = json.loads((unfinished / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    resumed = table1.main(argv)
    assert (unfinished / "eval_results.json").is_file()
    # the checkpoint holds the final weights: the resumed run takes no step and reports the same accuracies
    assert json.loads(json.dumps(resumed)) == json.loads(json.dumps(table))
    assert weights.stat().st_mtime_ns == written


def test_two_processes_under_accelerate_launch_run_the_indirect_setting(user_files):
    """The sub-runs' Trainers one after the other in each of two launched processes (gloo on the CPU): every
    TrainingArguments resets accelerate's state, the driver's barriers keep the processes together."""
    output_dir = user_files["root"] / "launched"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "examples" / "samaran_table1.py"),
        *user_files["driver"], *user_files["tiny"], "--supervisions", "indirect", "--output_dir", str(output_dir),
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    table = json.loads((output_dir / "table1.json").read_text())
    assert list(table["settings"]) == ["indirect"] and table["columns"] == PAPER_COLUMNS
    assert set(table["settings"]["indirect"]["metrics"]) == set(PAPER_COLUMNS) | set(table1.VGP_COLUMNS)
    vgp_config = json.loads((output_dir / "indirect" / "seed12345" / "vgp" / "config.json").read_text())
    assert vgp_config["attention_supervision"] == "indirect"
    assert completed.stdout.count("| indirect |") == 1  # the table is printed by the main process only


# ----------------------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------------------


def test_unknown_config_keys_and_section_flags_are_named(user_files, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("supervisions: none\nvgp:\n  learning_rte: 1.0\n")
    argv = [*user_files["driver"], "--output_dir", str(tmp_path / "o")]
    assert argv[0] == "--config"
    with pytest.raises(ValueError, match=r"section `vgp` names flags \['learning_rte'\]"):
        table1.parse_args(["--config", str(config), *argv[2:]])
    config.write_text("supervison: none\n")
    with pytest.raises(ValueError, match=r"keys this command does not take: \['supervison'\]"):
        table1.parse_args(["--config", str(config), *argv[2:]])
    with pytest.raises(ValueError, match=r"the vqa stage reads `--vqa_train_file` .* or its published .*missing: \['vqa_dir'\]"):
        table1.parse_args([token for token in argv if token != "--vqa_dir" and not token.endswith("/vqa")])
    with pytest.raises(ValueError, match=r"section `refcoco` sets \['model_name_or_path'\], which the driver sets"):
        table1.parse_args([*argv, "--refcoco.model_name_or_path", "x"])
    with pytest.raises(ValueError, match=r"`--vqa_typo.x`: a sub-run flag is `--<section>.<flag>`"):
        table1.parse_args([*argv, "--vqa_typo.x", "1"])
    with pytest.raises(ValueError, match=r"`--supervisions` must be comma-separated values among"):
        table1.parse_args([*argv, "--supervisions", "none,rollout"])
    # `common` reaches only the stages that take the flag: negatives is VGP's own
    args, flags = table1.parse_args([*argv, "--common.negatives", "random"])
    assert flags["vgp"]["negatives"] == "random" and "negatives" not in flags["vqa"]
    assert flags["vqa"]["learning_rate"] == 8.0e-5 and flags["vgp"]["mixed_precision"] == "no"
    assert args.supervision_list == list(SETTINGS) and args.seed_list == [12345]


def test_seeds_are_averaged_with_their_spread():
    per_seed = {"1": {"VQA val": 0.5, "RefCOCO+ val": 0.25}, "2": {"VQA val": 0.7, "RefCOCO+ val": 0.25}}
    means, stds = table1.summarise(per_seed)
    assert means == {"VQA val": pytest.approx(0.6), "RefCOCO+ val": 0.25}
    assert stds["VQA val"] == pytest.approx(0.1414213562, abs=1e-9) and stds["RefCOCO+ val"] == 0.0  # sample std
    table = {"columns": ["VQA val", "RefCOCO+ val"], "vgp_columns": [], "seeds": [1, 2],
             "settings": {"direct": {"metrics": means, "std": stds}}}  # fmt: skip
    assert "| direct | 60.00 ± 14.14 | 25.00 ± 0.00 |" in table1.render_table(table)
