"""The main job's trainer with a tiny model, for the trainer tests that need a whole `VGPTrainer`."""

from transformers import AutoTokenizer

from hf_vlalign import SingleStreamConfig, SingleStreamForVisualParaphrase, default_text_model_path
from hf_vlalign.data.collators import VGPCollator
from hf_vlalign.trainers import VGPTrainer, VGPTrainingArguments


def tiny_vgp_trainer(data, args: VGPTrainingArguments, num_hidden_layers: int, **trainer_kwargs) -> VGPTrainer:
    """The main job's trainer on `data` (the `vgp_data` fixture) with a tiny direct-supervised single-stream model."""
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    config = SingleStreamConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=num_hidden_layers, num_attention_heads=4,
        intermediate_size=64, visual_feat_dim=data.region_features.feature_dim, attention_supervision="direct",
    )  # fmt: skip
    return VGPTrainer(
        model=SingleStreamForVisualParaphrase(config), args=args, train_dataset=data.train, eval_dataset=data.eval,
        data_collator=VGPCollator(tokenizer, data.region_features), **trainer_kwargs,
    )  # fmt: skip
