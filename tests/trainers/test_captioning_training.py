"""Captioning training: the A2 mask step touches only the mask networks, the captioner's optimiser never holds them,
every loss is logged, self-critical training runs on CIDEr-D rewards, and one end-to-end run of the example."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from image_use_checks import assert_image_use_reported
from transformers import AutoTokenizer, HfArgumentParser, TrainerCallback, TrainingArguments

from hf_vlalign import RegionCaptionerConfig, RegionCaptionerForConditionalGeneration, default_text_model_path
from hf_vlalign.data import CaptioningCollator, build_dataset
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.evaluation import image_use_gap
from hf_vlalign.synthetic import SyntheticSceneConfig
from hf_vlalign.trainers import CaptioningTrainer, CaptioningTrainingArguments
from hf_vlalign.trainers.base import last_complete_checkpoint
from hf_vlalign.trainers.captioning import sampled_labels

ROOT = Path(__file__).resolve().parents[2]
SCENES = SyntheticSceneConfig(num_train_images=20, num_val_images=6, seed=5)


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    store = synthetic_region_features(root, SCENES)
    train = build_dataset("synthetic_scenes", root, "train", task="captions", config=SCENES)
    references = {}
    for image_id, sentence in zip(train["image_id"], train["sentence"]):
        references.setdefault(image_id, []).append(sentence)
    train = train.map(lambda row: {"references": references[row["image_id"]]})
    return train, store, AutoTokenizer.from_pretrained(default_text_model_path())


def tiny_captioner(tokenizer, alignment: str = "gate") -> RegionCaptionerForConditionalGeneration:
    torch.manual_seed(0)
    config = RegionCaptionerConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=SCENES.feature_dim,
        max_position_embeddings=32, geometry_dim=16, attention_alignment=alignment, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
    )  # fmt: skip
    return RegionCaptionerForConditionalGeneration(config)


def training_args(tmp_path, **settings) -> CaptioningTrainingArguments:
    options = dict(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=16, logging_steps=1, report_to="none",
        remove_unused_columns=False, save_strategy="no", use_cpu=True, seed=0, learning_rate=1e-3,
    )  # fmt: skip
    return CaptioningTrainingArguments(**(options | settings))


def make_trainer(captions, tmp_path, alignment="gate", **settings) -> CaptioningTrainer:
    train, store, tokenizer = captions
    collator = CaptioningCollator(tokenizer, store, text_columns=("sentence",), reference_column="references")
    return CaptioningTrainer(
        model=tiny_captioner(tokenizer, alignment), args=training_args(tmp_path, **settings), train_dataset=train,
        data_collator=collator, processing_class=tokenizer,
    )  # fmt: skip


def test_mask_step_changes_only_the_mask_networks(captions, tmp_path):
    trainer = make_trainer(captions, tmp_path)
    train, _, _ = captions
    batch = trainer.data_collator([train[i] for i in range(16)])
    before = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items()}
    trainer._mask_step([batch], trainer.global_item_counts([batch]))
    mask_ids = {id(p) for p in trainer.model.mask_parameters()}
    changed = {name for name, tensor in trainer.model.state_dict().items() if not torch.equal(tensor, before[name])}
    mask_names = {name for name, p in trainer.model.named_parameters() if id(p) in mask_ids}
    assert changed and changed <= mask_names
    # the captioner's optimiser does not hold the mask networks
    trainer.create_optimizer()
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not held & mask_ids and len(held) > 0
    assert all(p.requires_grad for p in trainer.model.mask_parameters())


def test_lora_wrapped_captioner_trains_adapters_and_mask_copies_only(captions, tmp_path):
    from peft import get_peft_model

    from hf_vlalign.lora import lora_config

    train, store, tokenizer = captions
    captioner = tiny_captioner(tokenizer, alignment="max")
    peft_model = get_peft_model(captioner, lora_config(captioner))
    template = make_trainer(captions, tmp_path, alignment="max", max_steps=2)
    trainer = CaptioningTrainer(
        model=peft_model, args=template.args, train_dataset=train, data_collator=template.data_collator,
        processing_class=tokenizer,
    )
    before = {name: tensor.detach().clone() for name, tensor in peft_model.named_parameters()}
    trainer.train()
    changed = {name for name, tensor in peft_model.named_parameters() if not torch.equal(tensor, before[name])}
    assert any("lora_" in name for name in changed)
    assert any("modules_to_save" in name and "mask_network" in name for name in changed)
    # frozen base weights and the mask networks' original copies are untouched
    assert all("lora_" in name or "modules_to_save" in name for name in changed), sorted(changed)[:5]
    assert {"loss_caption", "loss_mask"} <= {key for row in trainer.state.log_history for key in row}


def test_training_alternates_and_logs_every_component(captions, tmp_path):
    trainer = make_trainer(captions, tmp_path, alignment="exp_decay", max_steps=4, mask_update_every=2)
    trainer.train()
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 4
    assert all("loss_caption" in log and "mask_mean" in log for log in steps)
    # one mask step every two captioner steps: steps 0 and 2
    assert [("loss_mask" in log) for log in steps] == [True, False, True, False]
    assert int(trainer.model.model.alignment_step) == 3  # s of eq. (8): the step being trained


def test_self_critical_training_rewards_cider(captions, tmp_path):
    trainer = make_trainer(captions, tmp_path, alignment="none", max_steps=2, scst_start_epoch=0.0, scst_max_new_tokens=6)
    trainer.train()
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert all("loss_scst" in log and "reward" in log for log in steps)
    assert all(log["reward"] >= 0 for log in steps)


def test_scst_learning_rate_replaces_the_schedule_from_the_switch_on(captions, tmp_path):
    # batches of 16 captions: 7 steps an epoch; the first is cross-entropy (epoch 0), the others self-critical
    trainer = make_trainer(captions, tmp_path, alignment="none", max_steps=3, scst_start_epoch=0.1,
                           scst_learning_rate=2e-5, scst_max_new_tokens=5, warmup_steps=0)  # fmt: skip
    seen = []

    class Rates(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            seen.append({group["lr"] for group in trainer.optimizer.param_groups})

    trainer.add_callback(Rates())
    trainer.train()
    # linear decay from 1e-3 over 3 steps: the cross-entropy step at 1e-3, then the fixed SCST rate in every group
    assert seen == [{1e-3}, {2e-5}, {2e-5}]
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert "loss_scst" not in steps[0] and all("loss_scst" in log for log in steps[1:])


def test_encoder_learning_rate_gets_its_own_scheduled_groups(captions, tmp_path):
    trainer = make_trainer(captions, tmp_path, max_steps=2, encoder_learning_rate=1e-4)
    trainer.train()
    encoder_ids = {id(p) for p in trainer.model.get_encoder().parameters()}
    groups = trainer.optimizer.param_groups
    for group in groups:
        ids = {id(p) for p in group["params"]}
        assert ids <= encoder_ids if group.get("separated") else not ids & encoder_ids
    separated = [group for group in groups if group.get("separated")]
    assert sum(len(group["params"]) for group in separated) == len(encoder_ids)
    # the linear schedule scales both rates alike: after 2 of 2 steps both are 0, after warm-up they were the peaks
    assert all(group["lr"] == 0.0 for group in groups)
    assert trainer.lr_scheduler.base_lrs.count(1e-4) == len(separated)
    # the encoder trained (at its own rate), the mask networks stayed out of the captioner's optimiser
    held = {id(p) for group in groups for p in group["params"]}
    assert not held & {id(p) for p in trainer.model.mask_parameters()}


def test_sampled_labels_stop_after_the_first_end_token():
    sequences = torch.tensor([[101, 7, 8, 102, 9, 0], [101, 7, 102, 0, 0, 0]])
    assert sampled_labels(sequences, eos_token_id=102, pad_token_id=0).tolist() == [
        [7, 8, 102, -100, -100],
        [7, 102, -100, -100, -100],
    ]


def test_self_critical_training_needs_the_processing_class(captions, tmp_path):
    train, store, tokenizer = captions
    with pytest.raises(ValueError, match=r"`scst_start_epoch` needs the trainer's `processing_class`"):
        CaptioningTrainer(model=tiny_captioner(tokenizer), args=training_args(tmp_path, scst_start_epoch=0.0))


def test_settings_are_arguments_parsed_listed_and_saved(captions, tmp_path):
    parser = HfArgumentParser(CaptioningTrainingArguments)
    flags = {
        "mask_update_every": "3", "mask_learning_rate": "0.002", "scst_start_epoch": "1.5", "scst_max_new_tokens": "7",
        "encoder_learning_rate": "0.0001", "scst_learning_rate": "5e-06",
    }  # fmt: skip
    argv = ["--output_dir", str(tmp_path), *(item for name, value in flags.items() for item in (f"--{name}", value))]
    (args,) = parser.parse_args_into_dataclasses(argv)
    assert (args.mask_update_every, args.mask_learning_rate, args.scst_start_epoch) == (3, 0.002, 1.5)
    assert (args.scst_max_new_tokens, args.encoder_learning_rate) == (7, 1e-4)
    help_text = parser.format_help()
    assert all(f"--{name}" in help_text for name in flags) and "--distill_from" in help_text
    saved = json.loads(args.to_json_string())  # what Trainer saves with the run
    assert {name: saved[name] for name in flags} == {"mask_update_every": 3, "mask_learning_rate": 0.002,
        "scst_start_epoch": 1.5, "scst_max_new_tokens": 7, "encoder_learning_rate": 1e-4,
        "scst_learning_rate": 5e-6}  # fmt: skip
    # the trainer takes its settings from `args` only, and a plain TrainingArguments becomes its arguments' class
    _, _, tokenizer = captions
    for old in ({"mask_update_every": 2}, {"scst_start_epoch": 0.0}, {"tokenizer": tokenizer}):
        with pytest.raises(TypeError, match=next(iter(old))):
            CaptioningTrainer(model=tiny_captioner(tokenizer), args=training_args(tmp_path), **old)
    plain = TrainingArguments(output_dir=str(tmp_path), learning_rate=3e-3, report_to="none", use_cpu=True)
    trainer = CaptioningTrainer(model=tiny_captioner(tokenizer), args=plain)
    assert type(trainer.args) is CaptioningTrainingArguments and trainer.args.learning_rate == 3e-3
    converted = trainer.args.to_dict()
    assert trainer.args.mask_update_every == 1 and {name: converted[name] for name in plain.to_dict()} == plain.to_dict()


@pytest.mark.slow
def test_example_trains_evaluates_and_draws(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(tmp_path / "cache"))
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_captioning
    finally:
        sys.path.remove(str(ROOT / "examples"))
    output = tmp_path / "out"
    argv = [
        "--output_dir", str(output), "--synthetic_train_images", "16", "--synthetic_eval_images", "5",
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--alignment", "moving_average", "--no-geometry",
        "--encoder_layers", "1", "--decoder_layers", "2", "--max_new_tokens", "5", "--use_cpu",
    ]  # fmt: skip
    results = train_captioning.main(argv)
    on_disk = json.loads((output / "eval_results.json").read_text())
    card = ModelCard.load(output / "README.md").data.to_dict()
    assert card["library_name"] == "hf_vlalign" and card["model-index"][0]["results"]
    assert on_disk == json.loads(json.dumps(results))
    for key in ("bleu_4", "cider", "meteor", "rouge_l", "alignment"):
        assert 0.0 <= results[key] <= 10.0, key
    assert len(results["alignment_per_layer"]) == 2 and results["num_test_images"] == 5
    assert_image_use_reported(results, None)
    samples = json.loads((output / "samples.json").read_text())
    assert len(samples) == 5 and all(len(sample["references"]) == 5 for sample in samples)
    assert (output / "attention_alignment.png").stat().st_size > 1000
    # the papers' table: caption metrics under their names, Ilinykh's entropy per layer and attention vs distance
    paper = json.loads((output / "paper_results.json").read_text())
    assert paper["BLEU-4"] == pytest.approx(results["bleu_4"]) and paper["CIDEr"] == pytest.approx(results["cider"])
    layers = {block: len(rows) for block, rows in paper["attention_entropy_per_layer"].items()}
    assert layers == {"region_to_region": 1, "word_to_word": 2, "decoder_cross": 2}
    assert len(paper["attention_vs_distance"]["per_layer"]) == 1
    # Ilinykh's effect sizes per layer, each with its last - first layer change (none with one encoder layer)
    distance = paper["attention_distance_effect"]
    assert len(distance["per_layer"]) == 1 and distance["depth_change"] is None
    (row,) = distance["per_layer"]
    assert row["effect"] == pytest.approx(row["attention_weighted_distance"] - row["uniform_distance"])
    assert set(paper["attention_entropy_depth_change"]) == {"region_to_region", "word_to_word", "decoder_cross"}
    assert paper["attention_entropy_depth_change"]["region_to_region"] is None
    (theme,) = paper["within_theme_attention"]["per_layer"]  # Analysis I: the synthetic kinds' themes
    assert theme["num_rows"] > 0 and theme["effect"] == pytest.approx(theme["within"] - theme["uniform_within"])
    grounded = paper["grounded_word_attention"]["per_layer"]  # Analysis IV, per decoder layer
    assert [row["layer"] for row in grounded] == [0, 1] and all(row["num_words"] > 0 for row in grounded)
    change = paper["grounded_word_attention"]["depth_change"]
    assert change == pytest.approx(grounded[1]["effect"] - grounded[0]["effect"])
    # Fei's Figure 2 on the aligned cross-attention: one finite Kendall tau per decoder layer, their mean in the results
    importance = paper["attention_importance_kendall_tau"]
    assert [row["layer"] for row in importance] == [0, 1] and all(row["num_words"] > 0 for row in importance)
    assert all(math.isfinite(row["kendall_tau"]) and -1.0 <= row["kendall_tau"] <= 1.0 for row in importance)
    mean_tau = (importance[0]["kendall_tau"] + importance[1]["kendall_tau"]) / 2
    assert results["attention_importance_kendall_tau"] == pytest.approx(mean_tau)
    assert (output / "attention_entropy.png").stat().st_size > 1000
    reloaded = RegionCaptionerForConditionalGeneration.from_pretrained(output)
    assert reloaded.config.attention_alignment == "moving_average" and reloaded.config.use_geometry is False
    # the image-use gap: the trained captioner reads the regions; one whose cross-attention adds nothing cannot
    args, _ = train_captioning.parse_args(argv)
    data = train_captioning.load_data(args)
    test = data.test
    collator = CaptioningCollator(AutoTokenizer.from_pretrained(output), data.store, text_columns=("sentence",))
    gap = image_use_gap(reloaded, test, collator, batch_size=8, seed=results["image_use"]["image_use_seed"], progress=False)
    assert gap["own_image_loss"] == pytest.approx(results["test_loss"], rel=1e-5)
    assert gap["shuffled_image_loss"] == pytest.approx(results["test_loss_other_images"], rel=1e-5)
    assert results["image_use"]["image_use_loss_gap"] == pytest.approx(gap["image_use_loss_gap"], abs=1e-4)
    assert gap["own_image_loss"] != gap["shuffled_image_loss"]
    for layer in reloaded.model.decoder.layers:
        layer.encoder_attn.out_proj.weight.data.zero_()
        layer.encoder_attn.out_proj.bias.data.zero_()
    blind = image_use_gap(reloaded, test, collator, batch_size=8, progress=False)
    assert blind["own_image_loss"] == pytest.approx(blind["shuffled_image_loss"], rel=1e-6)


def test_resume_true_skips_a_checkpoint_whose_save_was_interrupted(captions, tmp_path, caplog):
    train, store, tokenizer = captions
    collator = CaptioningCollator(tokenizer, store, text_columns=("sentence",))

    def trainer(max_steps: int) -> CaptioningTrainer:
        args = TrainingArguments(
            output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=16, save_strategy="steps",
            save_steps=2, report_to="none", remove_unused_columns=False, use_cpu=True, seed=0, learning_rate=1e-3,
        )  # fmt: skip
        return CaptioningTrainer(model=tiny_captioner(tokenizer), args=args, train_dataset=train, data_collator=collator)

    with pytest.raises(ValueError, match=r"`resume_from_checkpoint=True` found no complete checkpoint"):
        trainer(2).train(resume_from_checkpoint=True)
    trainer(2).train()
    # a later save killed midway: weights half-written, no trainer_state.json
    interrupted = tmp_path / "checkpoint-4"
    interrupted.mkdir()
    (interrupted / "model.safetensors").write_bytes((tmp_path / "checkpoint-2" / "model.safetensors").read_bytes()[:100])
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    resumed, steps_run = trainer(4), []
    resumed.add_callback(type("Count", (TrainerCallback,), {"on_step_end": lambda self, *a, **k: steps_run.append(1)}))
    with caplog.at_level("WARNING", logger="hf_vlalign"):
        resumed.train(resume_from_checkpoint=True)
    # resumed from checkpoint-2: two steps run, and the interrupted checkpoint-4 is now written whole
    assert len(steps_run) == 2 and resumed.state.global_step == 4
    assert f"Skipping the incomplete checkpoint {interrupted}" in caplog.text
    assert last_complete_checkpoint(tmp_path) == str(interrupted)
