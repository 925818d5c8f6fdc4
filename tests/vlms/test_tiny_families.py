"""Tiny models of every multi-view VLM family: built offline, the processor's image tokens reach the model, and a saved
folder reloads through the Auto classes with the same logits."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor

from hf_vlalign.vlms.tiny import tiny_patch_model, word_level_tokenizer
from hf_vlalign.vlms.image_token_geometry import processor_call_kwargs
from hf_vlalign.vlms.tiny_families import MULTIVIEW_FAMILIES, image_placeholder

CAPTION = "a red square left of a blue circle"
# a landscape and a square image: different tile / crop / resolution layouts
IMAGE_SIZES = ((96, 48), (112, 112))  # (width, height)


def _image(width, height):
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _inputs(model_type, processor, width, height):
    text = f"{image_placeholder(model_type)} {CAPTION}"
    # Gemma 3's processor turns pan-and-scan off at call time whatever its image processor says
    kwargs = processor_call_kwargs(model_type, processor.image_processor)
    return processor(images=[_image(width, height)], text=[text], return_tensors="pt", **kwargs)


@pytest.mark.parametrize("model_type", MULTIVIEW_FAMILIES)
def test_tiny_family_builds_runs_and_reloads(model_type, tmp_path):
    tokenizer = word_level_tokenizer([CAPTION])
    torch.set_num_threads(1)
    model, processor = tiny_patch_model(model_type, tokenizer=tokenizer)
    model.eval()
    assert model.config.model_type == model_type
    image_token_id = model.config.image_token_id
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    # the Pil image processor it was built with; AutoProcessor's default is the torchvision one where installed
    pil_image_processor = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    reloaded_processor = AutoProcessor.from_pretrained(tmp_path, image_processor=pil_image_processor)
    default_processor = AutoProcessor.from_pretrained(tmp_path)
    assert type(reloaded) is type(model) and type(reloaded_processor) is type(processor)
    counts = []
    for width, height in IMAGE_SIZES:
        inputs = _inputs(model_type, processor, width, height)
        reloaded_inputs = _inputs(model_type, reloaded_processor, width, height)
        assert inputs.keys() == reloaded_inputs.keys()
        for key in inputs:
            torch.testing.assert_close(inputs[key], reloaded_inputs[key])
        # whichever backend resizes, the token layout is the same
        assert torch.equal(_inputs(model_type, default_processor, width, height)["input_ids"], inputs["input_ids"])
        with torch.no_grad():
            image_features = model.get_image_features(**_image_inputs(inputs))
            logits = model(**inputs).logits
            reloaded_logits = reloaded(**reloaded_inputs).logits
        # the processor wrote one image token per feature the model scatters into the sequence
        num_image_tokens = int((inputs["input_ids"] == image_token_id).sum())
        assert num_image_tokens == _num_features(image_features)
        assert logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(logits).all()
        torch.testing.assert_close(logits, reloaded_logits)
        counts.append(num_image_tokens)
    assert counts[0] != counts[1]  # the two aspect ratios get different layouts


def _image_inputs(inputs):
    text_keys = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
    return {key: value for key, value in inputs.items() if key not in text_keys}


def _num_features(image_features) -> int:
    features = getattr(image_features, "pooler_output", image_features)
    if isinstance(features, torch.Tensor):
        return features.shape[:-1].numel()
    return sum(feature.shape[:-1].numel() for feature in features)


def test_tiny_family_needs_an_even_number_of_patches():
    with pytest.raises(ValueError, match="`image_size` of qwen2_vl must be an even number"):
        tiny_patch_model("qwen2_vl", image_size=48, patch_size=16, tokenizer=word_level_tokenizer([CAPTION]))
