"""Fixtures of the patch-model tests: the synthetic scenes' grounded captions and one saved tiny model folder per
multi-view family (model and processor, a word-level tokenizer over the captions), which the CLI tests read too."""

import pytest
import torch

from hf_vlalign.synthetic import SyntheticSceneConfig
from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
from hf_vlalign.vlms import grounded_caption_examples
from hf_vlalign.vlms.tiny import MULTIVIEW_FAMILIES, tiny_patch_model, word_level_tokenizer


@pytest.fixture(scope="session")
def synthetic_captions():
    """(train, evaluation) grounded captions of 12 + 6 synthetic scenes."""
    scenes = load_or_generate_synthetic_vgp(config=SyntheticSceneConfig(num_train_images=12, num_val_images=6))
    train, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "train")
    evaluation, _ = grounded_caption_examples(scenes.flickr30k_entities, scenes.images, "val")
    return train, evaluation


@pytest.fixture(scope="session")
def tiny_family_folders(tmp_path_factory, synthetic_captions):
    """model_type -> the folder of a saved tiny model of that multi-view family and its processor (64-px views of
    16-px patches, 2 layers of 4 heads)."""
    train, evaluation = synthetic_captions
    tokenizer = word_level_tokenizer(example["caption"] for example in [*train, *evaluation])
    folders = {}
    for model_type in MULTIVIEW_FAMILIES:
        torch.manual_seed(0)
        model, processor = tiny_patch_model(model_type, tokenizer=tokenizer, seed=3)
        folder = tmp_path_factory.mktemp(model_type)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        folders[model_type] = folder
    return folders
