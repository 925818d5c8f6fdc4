"""`examples/train_captioning.py` on the COCO Karpathy layout: the Ilinykh and Fei (A2) headline commands, each with its
config file and tiny-size overrides, end to end on real Karpathy val/test COCO ids (../shared/data/coco_karpathy) with
region features written in the published BUTD hdf5 and M2 hdf5 layouts and converted to a store as a user would
(`convert_features`, what `hf-vlalign convert-features` runs).

No sample of Karpathy's dataset_coco.json is available (../shared/data/SOURCES.md), so the test writes one in its
published layout for real ids: its val and test images are the first ids of karpathy_{val,test}_images.txt, its training
images further val-list ids marked "restval" (val2014 images that Karpathy's split trains on, as restval is); the
captions are the test's own, made up here."""

import json
import math
import sys
from pathlib import Path

import pytest

from hf_vlalign.data.feature_store import convert_features
from image_use_checks import assert_diagnostics_reported
from published_features import write_butd_h5_features, write_m2_hdf5_features
from script_modules import ROOT, load_script
from shared_samples import real_sample

train_captioning = load_script("train_captioning", ROOT / "examples" / "train_captioning.py")

PAPER_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")
# the test's own captions: words tied to the image so that captions of one image share n-grams
SUBJECTS = ("dog", "cat", "man", "woman", "bus", "train", "horse", "pizza")
PLACES = ("on the grass", "in the street", "near a table", "by the water", "in a kitchen")
TINY = [
    "--d_model", "32", "--ffn_dim", "64", "--attention_heads", "4", "--encoder_layers", "1", "--decoder_layers", "1",
    "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "16", "--warmup_steps", "0",
    "--learning_rate", "1e-3", "--max_new_tokens", "6", "--num_beams", "1", "--analysis_examples", "12",
    "--importance_examples", "12", "--image_use_examples", "12", "--save_strategy", "no", "--logging_steps", "1",
    "--report_to", "none", "--use_cpu", "--dataloader_pin_memory", "false", "--num_threads", "1",
]  # fmt: skip


def karpathy_ids(split: str, count: int, skip: int = 0) -> list[tuple[str, int]]:
    """(COCO folder, cocoid) of real Karpathy images, from bottom-up-attention's karpathy_<split>_images.txt."""
    lines = real_sample("coco_karpathy", f"karpathy_{split}_images.txt").read_text().split("\n")
    pairs = [line.split() for line in lines if line.strip()][skip : skip + count]
    return [(path.split("/")[0], int(cocoid)) for path, cocoid in pairs]


def write_dataset_coco(path: Path, splits: dict[str, list[tuple[str, int]]]) -> list[int]:
    """dataset_coco.json in Karpathy's layout; returns every cocoid it names."""
    images, sentid = [], 0
    for imgid, (split, folder, cocoid) in enumerate((s, f, c) for s, ids in splits.items() for f, c in ids):
        subject, place = SUBJECTS[cocoid % len(SUBJECTS)], PLACES[cocoid % len(PLACES)]
        raws = [f"a {subject} {place}", f"a {subject} standing {place}", f"the {subject} is {place}",
                f"a small {subject} {place}", f"one {subject} {place} ."]  # fmt: skip
        sentences = []
        for raw in raws:
            sentences.append({"tokens": raw.replace(".", "").split(), "raw": raw, "imgid": imgid, "sentid": sentid})
            sentid += 1
        images.append({
            "filepath": folder, "sentids": [s["sentid"] for s in sentences], "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
            "imgid": imgid, "split": split, "sentences": sentences, "cocoid": cocoid,
        })  # fmt: skip
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return [cocoid for ids in splits.values() for _, cocoid in ids]


@pytest.fixture(scope="module")
def karpathy(tmp_path_factory):
    """(dataset_coco.json, BUTD-converted store, M2-converted store) for 8 training, 3 val and 4 test images."""
    root = tmp_path_factory.mktemp("coco_karpathy")
    splits = {"restval": karpathy_ids("val", 8, skip=10), "val": karpathy_ids("val", 3), "test": karpathy_ids("test", 4)}
    cocoids = write_dataset_coco(root / "dataset_coco.json", splits)
    h5, id_map = write_butd_h5_features(root / "trainval36.hdf5", cocoids)
    butd = convert_features(h5, "butd_h5", root / "butd_store", id_map=id_map)
    m2, sizes = write_m2_hdf5_features(root / "coco_detections.hdf5", cocoids)
    m2_store = convert_features(m2, "m2_hdf5", root / "m2_store", image_sizes=sizes)
    assert len(butd) == len(m2_store) == len(cocoids)
    return root / "dataset_coco.json", root / "butd_store", root / "m2_store"


def check_paper_results(run: Path, num_layers: int) -> dict:
    paper = json.loads((run / "paper_results.json").read_text())
    for name in PAPER_METRICS:
        assert 0.0 <= paper[name] <= 10.0, name
    assert paper["num_test_images"] == 4 and paper["split"] == "test"
    assert ("SPICE" in paper) != ("SPICE_skipped" in paper)  # SPICE where its CoreNLP jars are installed
    entropy = paper["attention_entropy_per_layer"]
    assert set(entropy) == {"region_to_region", "word_to_word", "decoder_cross"}
    for block, layers in entropy.items():
        assert [entry["layer"] for entry in layers] == list(range(num_layers)), block
        assert all(0.0 <= entry["normalised_entropy"] <= 1.0 + 1e-9 for entry in layers), block
    distance = paper["attention_vs_distance"]
    assert [row["layer"] for row in distance["per_layer"]] == list(range(num_layers))
    assert sum(row["num_pairs"] for row in distance["bins"] if row["layer"] == 0) == 12 * 10 * 9  # 10 regions a caption
    assert all(row["pearson_distance_attention"] is None or -1 <= row["pearson_distance_attention"] <= 1
               for row in distance["per_layer"])  # fmt: skip
    clusters = paper["within_cluster_attention"]
    assert clusters["cluster_source"] == "spatial"
    assert [row["layer"] for row in clusters["per_layer"]] == list(range(num_layers))
    assert all(abs(row["within"] + row["across"] - 1.0) < 1e-6 and row["num_rows"] > 0 for row in clusters["per_layer"])
    # Fei's Figure 2: per decoder layer, the mean Kendall tau of attention vs gradient importance, and their mean
    importance = paper["attention_importance_kendall_tau"]
    assert [row["layer"] for row in importance] == list(range(num_layers))
    for row in importance:
        assert math.isfinite(row["kendall_tau"]) and -1.0 <= row["kendall_tau"] <= 1.0, row
        assert row["num_words"] > 0 and row["num_undefined"] >= 0, row
    assert paper["num_importance_captions"] == 12  # a seeded sample of the 20 test captions
    mean = json.loads((run / "eval_results.json").read_text())["attention_importance_kendall_tau"]
    assert mean == pytest.approx(sum(row["kendall_tau"] for row in importance) / num_layers)
    for plot in ("attention_entropy.png", "attention_vs_distance.png", "within_cluster_attention.png", "attention_alignment.png"):
        assert (run / plot).stat().st_size > 1000, plot
    samples = json.loads((run / "samples.json").read_text())
    assert len(samples) == 4 and all(len(sample["references"]) == 5 for sample in samples)
    return paper


@pytest.mark.slow
def test_ilinykh_command_on_butd_features(karpathy, tmp_path):
    dataset_coco, butd_store, _ = karpathy
    run = tmp_path / "ilinykh"
    argv = ["--config", str(ROOT / "examples" / "configs" / "ilinykh.yaml"), "--karpathy_json", str(dataset_coco),
            "--features", str(butd_store), "--output_dir", str(run), *TINY, "--max_steps", "2"]  # fmt: skip
    args, training_args = train_captioning.parse_args(argv)
    # the config's values, which the tiny flags above override where they clash
    assert (args.alignment, args.geometry, args.eval_split, training_args.lr_scheduler_type) == (
        "none", True, "test", "inverse_sqrt")  # fmt: skip
    assert (training_args.adam_beta2, training_args.num_train_epochs) == (0.98, 30)
    results = train_captioning.main(argv)
    assert results["num_test_images"] == 4 and "alignment" not in results  # COCO captions have no phrase boxes
    # the geometry diagnostics: the caption loss with boxes shuffled / blanked, features kept, minus the true boxes'
    geometry = assert_diagnostics_reported(results, {"caption": "loss"}, supervised=False)["geometry"]
    image_use = results["image_use"]
    assert geometry == {"loss_change_boxes_shuffled": image_use["boxes_shuffled_loss"] - image_use["own_image_loss"],
                        "loss_change_boxes_zeroed": image_use["boxes_zeroed_loss"] - image_use["own_image_loss"]}
    paper = check_paper_results(run, num_layers=1)
    assert paper["attention_alignment"] == "none" and paper["geometry"] is True
    assert paper["CIDEr"] == pytest.approx(results["cider"]) and paper["BLEU-4"] == pytest.approx(results["bleu_4"])


@pytest.mark.slow
def test_fei_command_compares_fusions_with_scst_on_m2_features(karpathy, tmp_path):
    dataset_coco, _, m2_store = karpathy
    root = tmp_path / "fei"
    # 40 training captions, batches of 16: 3 steps an epoch; step 3 starts at epoch 2/3 > 0.5, so it is self-critical
    argv = ["--config", str(ROOT / "examples" / "configs" / "fei_a2.yaml"), "--karpathy_json", str(dataset_coco),
            "--features", str(m2_store), "--output_dir", str(root), *TINY, "--a2_fusions", "none,gate",
            "--max_steps", "3", "--scst_start_epoch", "0.5", "--scst_max_new_tokens", "5"]  # fmt: skip
    comparison = train_captioning.main(argv)
    assert list(comparison) == ["none", "gate"]
    on_disk = json.loads((root / "a2_comparison.json").read_text())
    assert on_disk == json.loads(json.dumps(comparison))
    table = (root / "a2_comparison.md").read_text().splitlines()
    assert table[0].startswith("| fusion | BLEU-1") and "CIDEr" in table[0] and len(table) == 4
    for fusion in ("none", "gate"):
        paper = check_paper_results(root / fusion, num_layers=1)
        assert paper["attention_alignment"] == fusion and paper["geometry"] is False
        assert comparison[fusion]["CIDEr"] == paper["CIDEr"]
        state = json.loads((root / fusion / "trainer_state.json").read_text())
        logged = {key for entry in state["log_history"] for key in entry}
        assert {"loss_scst", "reward"} <= logged, fusion  # the last step was self-critical
        assert ("loss_mask" in logged) == (fusion != "none")
        # whether A2 acts, in the run file (the A2 runs only)
        diagnostics = json.loads((root / fusion / "eval_results.json").read_text()).get("diagnostics", {})
        assert ("a2" in diagnostics) == (fusion != "none")
    a2 = json.loads((root / "gate" / "eval_results.json").read_text())["diagnostics"]["a2"]
    assert 0.0 < a2["mask_mean"] <= 1.0 and a2["mask_std_across_regions"] >= 0.0 and a2["num_captions"] == 12
    assert 0.0 <= a2["argmax_change_share"] <= 1.0 and 0.0 <= a2["attention_change_l1"] <= 2.0
    assert all(math.isfinite(a2[key]) for key in ("mask_loss", "caption_loss_change_zero_mask", "head_diversity"))


def test_configs_hold_the_papers_settings_and_flags_are_checked(tmp_path):
    data = ["--karpathy_json", "dataset_coco.json", "--features", "store", "--output_dir", str(tmp_path), "--use_cpu"]
    args, training_args = train_captioning.parse_args(["--config", str(ROOT / "examples/configs/ilinykh.yaml"), *data])
    sizes = (args.encoder_layers, args.decoder_layers, args.d_model, args.ffn_dim, args.attention_heads, args.dropout)
    assert sizes == (6, 6, 512, 2048, 8, 0.1) and args.geometry and args.alignment == "none"
    # NoamOpt(512, factor 1, warmup 10000): the peak of transformers' inverse_sqrt schedule
    assert training_args.learning_rate == pytest.approx(512**-0.5 * 10000**-0.5)
    assert (training_args.warmup_steps, training_args.per_device_train_batch_size, training_args.num_train_epochs) == (10000, 75, 30)
    assert training_args.encoder_learning_rate is None and training_args.scst_start_epoch is None
    args, training_args = train_captioning.parse_args(["--config", str(ROOT / "examples/configs/fei_a2.yaml"), *data])
    assert train_captioning.fusions(args) == ["none", "max", "moving_average", "exp_decay", "gate"]
    assert (args.d_model, args.attention_heads, args.dropout, args.geometry) == (512, 8, 0.1, False)
    assert (args.alignment_mask_input, args.alignment_moving_average) == ("query", "additive")  # eqs. 2 and 7 as printed
    assert (training_args.scst_start_epoch, training_args.num_train_epochs, training_args.scst_learning_rate) == (20, 30, 5e-6)
    single, _ = train_captioning.parse_args(["--config", str(ROOT / "examples/configs/fei_a2.yaml"), *data, "--a2_fusions", ""])
    assert train_captioning.fusions(single) == [] and single.alignment == "gate"
    with pytest.raises(ValueError, match=r"`--karpathy_json` and `--features` go together"):
        train_captioning.parse_args(["--karpathy_json", "dataset_coco.json", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"`--a2_fusions` must name fusions from .*got 'average'"):
        train_captioning.parse_args(["--a2_fusions", "none,average", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"`--a2_fusions` must be a comma-separated list of distinct fusions"):
        train_captioning.parse_args(["--a2_fusions", "max,max", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"`--num_beams` must be <= 64 \(MAX_NUM_BEAMS"):  # refused before training
        train_captioning.parse_args(["--num_beams", "100000", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"`--max_new_tokens` must be an integer >= 1, got 0"):
        train_captioning.parse_args(["--max_new_tokens", "0", "--output_dir", str(tmp_path)])


def test_exp_decay_temperature_is_the_configs_and_the_fei_configs(tmp_path):
    # T_P of eq. 8: one value (the config's 1000) for the example without the flag and for examples/configs/fei_a2.yaml
    from hf_vlalign.models.captioning import RegionCaptionerConfig

    default_t_p = RegionCaptionerConfig().alignment_temperature
    args, _ = train_captioning.parse_args(["--alignment", "exp_decay", "--output_dir", str(tmp_path)])
    assert args.alignment_temperature is None and default_t_p == 1000.0  # None: the config's value is used
    data = ["--karpathy_json", "dataset_coco.json", "--features", "store", "--output_dir", str(tmp_path)]
    fei, _ = train_captioning.parse_args(["--config", str(ROOT / "examples/configs/fei_a2.yaml"), *data])
    assert fei.alignment_temperature == default_t_p
