"""Tiny randomly initialised patch models (ViLT, LLaVA with CLIP, PaliGemma with SigLIP) with their processors, built
offline for tests, smoke runs and the mechanism check. The tokenizer is the embedded default's WordPiece with `<image>`
added, or a word-level one over a corpus (`word_level_tokenizer`): a tiny model's compute then goes to its layers
rather than to a 30,522-word language-model head.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from transformers import (
    AutoTokenizer,
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    GemmaConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PaliGemmaProcessor,
    PreTrainedTokenizerFast,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
    ViltConfig,
    ViltImageProcessorPil,
    ViltModel,
    ViltProcessor,
)

from ..models import default_text_model_path
from .tiny_families import MULTIVIEW_FAMILIES, build_multiview

__all__ = ["MAX_IMAGE_SIZE", "MULTIVIEW_FAMILIES", "TINY_FAMILIES", "tiny_patch_model", "word_level_tokenizer"]

# the one-grid families; the multi-view ones (`MULTIVIEW_FAMILIES`) are given by their `model_type`
TINY_FAMILIES = ("vilt", "llava", "paligemma")
IMAGE_TOKEN = "<image>"
# the largest image side of a tiny model: its patch embeddings grow with the square of the side
MAX_IMAGE_SIZE = 1024


def _tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(default_text_model_path())
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    return tokenizer


def word_level_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """A lowercasing word-level tokenizer over the words of `texts` (BERT's splitting of words and punctuation), with
    [PAD], [UNK], [CLS], [SEP] and `<image>`: a small vocabulary for tiny models trained from scratch. A family's own
    special tokens are added by `tiny_patch_model` (see `family_special_tokens`)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", IMAGE_TOKEN]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=special))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        additional_special_tokens=[IMAGE_TOKEN],
    )


def tiny_patch_model(
    family: str,
    image_size: int = 64,
    patch_size: int = 16,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    vision_layers: int = 1,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
    attn_implementation: str | None = None,
):
    """(model, processor) of a tiny `family` model ("vilt", "llava" or "paligemma") over `image_size` square images
    cut into `patch_size` patches, randomly initialised with `seed`; `family` may also be a multi-view family's
    `model_type` (`MULTIVIEW_FAMILIES`: "qwen2_vl", "llava_next", "idefics3", "gemma3", ...), whose views (tiles,
    crops, base resolution) are `image_size` on a side, an even number of patches for their 2 x 2 merges, and whose
    tokenizer gets the family's special tokens; `tokenizer`: one with an `<image>` token (e.g.
    `word_level_tokenizer`), default: the embedded default's WordPiece with `<image>` added; `attn_implementation`:
    the LLaVA / PaliGemma attention implementation (default: transformers' default, `sdpa`)."""
    import torch

    if family not in (*TINY_FAMILIES, *MULTIVIEW_FAMILIES):
        raise ValueError(f"`family` must be one of {(*TINY_FAMILIES, *MULTIVIEW_FAMILIES)}, got {family!r}.")
    if family == "vilt" and attn_implementation not in (None, "eager"):
        raise ValueError(f"`attn_implementation` of ViLT must be None or 'eager', got {attn_implementation!r}.")
    if not 0 < image_size <= MAX_IMAGE_SIZE:
        raise ValueError(f"`image_size` of a tiny model must be in 1..{MAX_IMAGE_SIZE} pixels, got {image_size}.")
    if image_size % patch_size:
        raise ValueError(f"`image_size` must be a multiple of `patch_size` ({patch_size}), got {image_size}.")
    if family in MULTIVIEW_FAMILIES and (image_size // patch_size) % 2:
        even = f"an even number of `patch_size` ({patch_size}) patches"
        raise ValueError(f"`image_size` of {family} must be {even} for its 2 x 2 merges, got {image_size}.")
    # a copy: processors add tokens to the tokenizer they get (PaliGemma's 1,152 <loc> / <seg> tokens)
    tokenizer = _tokenizer() if tokenizer is None else copy.deepcopy(tokenizer)
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        raise ValueError(f"`tokenizer` must have an {IMAGE_TOKEN} token, got none in its vocabulary.")
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    sizes = dict(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_attention_heads=num_heads)
    text_sizes = dict(vocab_size=len(tokenizer), num_hidden_layers=num_layers, **sizes)
    torch.manual_seed(seed)
    if family in MULTIVIEW_FAMILIES:
        args = (tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers)
        model, processor = build_multiview(family, *args)
        return _with_attention(model, attn_implementation), processor
    if family == "vilt":
        config = ViltConfig(
            **text_sizes, image_size=image_size, patch_size=patch_size, max_image_length=-1, max_position_embeddings=128,
        )  # fmt: skip
        image_processor = ViltImageProcessorPil(size={"shortest_edge": image_size}, size_divisor=patch_size)
        return ViltModel(config), ViltProcessor(image_processor=image_processor, tokenizer=tokenizer)
    if family == "llava":
        vision = CLIPVisionConfig(num_hidden_layers=vision_layers, image_size=image_size, patch_size=patch_size, **sizes)
        text = LlamaConfig(
            **text_sizes, num_key_value_heads=num_heads, max_position_embeddings=256,
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        config = LlavaConfig(
            vision_config=vision, text_config=text, image_token_id=image_token_id, vision_feature_layer=-1,
            image_seq_length=(image_size // patch_size) ** 2,
        )  # fmt: skip
        image_processor = CLIPImageProcessorPil(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        )
        processor = LlavaProcessor(
            image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
            vision_feature_select_strategy="default", image_token=IMAGE_TOKEN,
        )  # fmt: skip
        return _with_attention(LlavaForConditionalGeneration(config), attn_implementation), processor
    image_processor = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)  # adds its tokens first
    vision = SiglipVisionConfig(num_hidden_layers=vision_layers, image_size=image_size, patch_size=patch_size, **sizes)
    text = GemmaConfig(
        vocab_size=len(processor.tokenizer), num_hidden_layers=num_layers, num_key_value_heads=1,
        head_dim=hidden_size // num_heads, pad_token_id=tokenizer.pad_token_id, **sizes,
    )  # fmt: skip
    config = PaliGemmaConfig(
        vision_config=vision, text_config=text, image_token_id=image_token_id, projection_dim=hidden_size
    )
    return _with_attention(PaliGemmaForConditionalGeneration(config), attn_implementation), processor


def _with_attention(model, attn_implementation: str | None):
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    return model
