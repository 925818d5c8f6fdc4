"""Tiny models of the three families and the small synthetic scenes that the analysis tests (`analyze`, `explore`,
syntactic grounding) run them on; with `pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")` (conftest.py)
the scenes go to a temporary cache."""

from __future__ import annotations

import torch

from hf_vlalign import (
    RegionCaptionerConfig,
    RegionCaptionerForConditionalGeneration,
    SingleStreamConfig,
    SingleStreamForVisualParaphrase,
    TwoStreamConfig,
    TwoStreamForPreTraining,
)
from hf_vlalign.synthetic import COLOUR_NAMES, SHAPE_NAMES, SyntheticSceneConfig

SCENES = SyntheticSceneConfig(num_train_images=16, num_val_images=6, seed=5)
SYNTHETIC_FLAGS = ["--synthetic_train_images", "16", "--synthetic_eval_images", "6", "--synthetic_seed", "5"]
FAMILIES = ("single_stream", "two_stream", "captioner")


def tiny_family_model(family: str, tokenizer):
    """A seeded random model of `family` sized for the synthetic scenes: the VGP head, two-stream pre-training (object
    and attribute classes of the scenes) or the captioner with A2 alignment."""
    torch.manual_seed(0)
    if family == "single_stream":
        config = SingleStreamConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=80, visual_feat_dim=SCENES.feature_dim,
        )  # fmt: skip
        return SingleStreamForVisualParaphrase(config)
    if family == "two_stream":
        config = TwoStreamConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64, l_layers=1,
            r_layers=1, x_layers=2, visual_feat_dim=SCENES.feature_dim, num_object_labels=len(SHAPE_NAMES),
            num_attr_labels=len(COLOUR_NAMES), num_qa_labels=16,
        )  # fmt: skip
        return TwoStreamForPreTraining(config)
    config = RegionCaptionerConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, visual_feat_dim=SCENES.feature_dim,
        max_position_embeddings=64, geometry_dim=16, attention_alignment="max", pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
    )  # fmt: skip
    return RegionCaptionerForConditionalGeneration(config)


def save_with_tokenizer(model, tokenizer, folder):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
