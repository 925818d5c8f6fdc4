"""One tiny training run for `tests/trainers/test_resume.py`, in a process of its own so that the test can SIGKILL it.

    python tests/resume_worker.py RECIPE OUTPUT_DIR [--resume_from_checkpoint DIR] [--pause_after_save SECONDS]

RECIPE is `captioning` (A2 gate fusion), `pretraining` (two-stream, the VQA loss from epoch 1) or `vgp`. Every run:
seed 0, CPU, 3 batches per epoch, `max_steps=6`, a checkpoint every 2 steps (checkpoint-6 is the final weights). The
synthetic scenes are read from `$HF_VLALIGN_CACHE` (the test generates them first). `--pause_after_save` sleeps after
the first checkpoint is written, so that the test can kill the run there; nothing is written besides the checkpoints.
The first global step trained is printed (`first_step=K`), so the test can check that a resumed run did resume.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import AutoTokenizer, TrainerCallback, TrainingArguments

from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    TwoStreamConfig,
    TwoStreamForPreTraining,
    default_text_model_path,
)
from hf_vlalign.data import CaptioningCollator, TwoStreamPretrainingCollator, build_dataset
from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.data.builders.synthetic_scenes import synthetic_region_features
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.synthetic import COLOUR_NAMES, SHAPE_NAMES, SyntheticSceneConfig
from hf_vlalign.trainers import (
    TwoStreamPretrainingTrainer,
    TwoStreamPretrainingTrainingArguments,
    CaptioningTrainer,
    CaptioningTrainingArguments,
    VGPTrainer,
    VGPTrainingArguments,
)

RECIPES = ("captioning", "pretraining", "vgp")
SCENES = SyntheticSceneConfig(num_train_images=12, num_val_images=4, feature_dim=32, seed=5)
BATCH_SIZE = 8
ROWS = 3 * BATCH_SIZE  # 3 steps per epoch: the 6 steps cross one epoch boundary
MAX_STEPS = 6
SAVE_STEPS = 2


def prepare_data() -> None:
    """Generates the synthetic scenes once in `$HF_VLALIGN_CACHE`, before any worker reads them."""
    synthetic_region_features(None, SCENES)
    load_vgp_data(synthetic_config=SCENES)


class ProgressCallback(TrainerCallback):
    """Records the first step trained and, if asked, pauses after the first checkpoint (the kill window)."""

    def __init__(self, pause_after_save: float):
        self.pause_after_save = pause_after_save
        self.first_step: int | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first_step is None:
            self.first_step = state.global_step

    def on_save(self, args, state, control, **kwargs):
        if self.pause_after_save > 0:
            time.sleep(self.pause_after_save)


def training_arguments(output_dir: str, args_class: type[TrainingArguments], **settings) -> TrainingArguments:
    return args_class(
        output_dir=output_dir, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, per_device_train_batch_size=BATCH_SIZE,
        learning_rate=1e-3, logging_steps=1, report_to="none", remove_unused_columns=False, use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, **settings,
    )  # fmt: skip


def captioning_trainer(output_dir: str) -> CaptioningTrainer:
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    store = synthetic_region_features(None, SCENES)
    train = build_dataset("synthetic_scenes", None, "train", task="captions", config=SCENES).select(range(ROWS))
    torch.manual_seed(0)
    config = RegionCaptionerConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=SCENES.feature_dim,
        max_position_embeddings=32, geometry_dim=16, attention_alignment="gate", pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
    )  # fmt: skip
    return CaptioningTrainer(
        model=RegionCaptionerForConditionalGeneration(config),
        args=training_arguments(output_dir, CaptioningTrainingArguments, mask_update_every=2), train_dataset=train,
        data_collator=CaptioningCollator(tokenizer, store, text_columns=("sentence",)),
    )  # fmt: skip


def pretraining_trainer(output_dir: str) -> TwoStreamPretrainingTrainer:
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    store = synthetic_region_features(None, SCENES)
    train = build_dataset("synthetic_scenes", None, "train", task="questions", config=SCENES, region_features=store)
    torch.manual_seed(0)
    config = TwoStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64, l_layers=1,
        r_layers=1, x_layers=1, visual_feat_dim=SCENES.feature_dim, num_object_labels=len(SHAPE_NAMES),
        num_attr_labels=len(COLOUR_NAMES), num_qa_labels=16, task_alignment=True,
    )  # fmt: skip
    return TwoStreamPretrainingTrainer(
        model=TwoStreamForPreTraining(config),
        args=training_arguments(output_dir, TwoStreamPretrainingTrainingArguments, qa_start_epoch=1.0),
        train_dataset=train.select(range(ROWS)), data_collator=TwoStreamPretrainingCollator(tokenizer, store, num_answers=16),
    )  # fmt: skip


def vgp_trainer(output_dir: str) -> VGPTrainer:
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    data = load_vgp_data(synthetic_config=SCENES)
    torch.manual_seed(0)
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, visual_feat_dim=SCENES.feature_dim, attention_supervision="direct",
    )  # fmt: skip
    return VGPTrainer(
        model=SingleStreamForVisualParaphrase(config), args=training_arguments(output_dir, VGPTrainingArguments),
        train_dataset=data.train.select(range(ROWS)), data_collator=VGPCollator(tokenizer, data.region_features),
    )  # fmt: skip


BUILDERS = {"captioning": captioning_trainer, "pretraining": pretraining_trainer, "vgp": vgp_trainer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=[*RECIPES, "prepare"])
    parser.add_argument("output_dir", nargs="?")
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--pause_after_save", type=float, default=0.0)
    args = parser.parse_args()
    if "HF_VLALIGN_CACHE" not in os.environ:
        parser.error("set HF_VLALIGN_CACHE to the folder of the synthetic scenes")
    if args.recipe == "prepare":
        prepare_data()
        return
    trainer = BUILDERS[args.recipe](args.output_dir)
    progress = ProgressCallback(args.pause_after_save)
    trainer.add_callback(progress)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    print(f"first_step={progress.first_step}", flush=True)


if __name__ == "__main__":
    main()
