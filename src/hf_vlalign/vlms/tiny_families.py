"""Tiny randomly initialised models of the multi-view VLM families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-NeXT,
LLaVA-OneVision, Idefics3, SmolVLM, Gemma 3, InternVL, Mistral 3) with their processors, built offline from
transformers' own classes: the family's `*ForConditionalGeneration`, its processor with its own image processor at a
small size, and the given word-level tokenizer with the family's special tokens added. Multi-view settings are on:
LLaVA-NeXT / OneVision anyres grid pinpoints, Idefics3 / SmolVLM image splitting, Gemma 3 pan-and-scan, InternVL tiles
and thumbnail, Qwen dynamic resolution with its 2 x 2 merge, Pixtral row breaks with the 2 x 2 spatial merge.

`image_size` is the side of one view (a tile, a crop, the base resolution); `patch_size` the vision encoder's patch.
Seven of these processors need torchvision (the Qwen-VL, LLaVA-OneVision, InternVL and SmolVLM ones hold a video
processor; PixtralProcessor requires it) and SmolVLM's num2words: both are install requirements of the library.
"""

from __future__ import annotations

import copy

from transformers import (
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    Gemma3TextConfig,
    GotOcr2ImageProcessorPil,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    Idefics3VisionConfig,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    InternVLVideoProcessor,
    InternVLVisionConfig,
    LlamaConfig,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralConfig,
    PixtralImageProcessorPil,
    PixtralProcessor,
    PixtralVisionConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
    SiglipVisionConfig,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
    SmolVLMProcessor,
    SmolVLMVideoProcessor,
    SmolVLMVisionConfig,
)

from ..utils.optional import require_processor_extras
from .image_token_geometry import image_placeholder

__all__ = ["MULTIVIEW_FAMILIES", "family_special_tokens", "family_tokenizer", "image_placeholder"]

_QWEN_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
_IDEFICS3_TOKENS = {
    "image_token": "<image>",
    "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}
# the tile-position tokens Idefics3 / SmolVLM write before each tile: <row_1_col_1> ... <row_6_col_6>
_ROW_COL_TOKENS = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
# named tokens (set as tokenizer attributes, which the processors read) and unnamed ones, per model_type
_SPECIAL_TOKENS: dict[str, tuple[dict[str, str], list[str]]] = {
    "qwen2_vl": (_QWEN_TOKENS, []),
    "qwen2_5_vl": (_QWEN_TOKENS, []),
    "qwen3_vl": (_QWEN_TOKENS, []),
    "llava_next": ({"image_token": "<image>"}, []),
    "llava_onevision": ({"image_token": "<image>", "video_token": "<video>"}, []),
    "idefics3": (_IDEFICS3_TOKENS, _ROW_COL_TOKENS),
    "smolvlm": ({**_IDEFICS3_TOKENS, "video_token": "<video>"}, _ROW_COL_TOKENS),
    "gemma3": (
        {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
        [],
    ),
    "internvl": (
        {
            "context_image_token": "<IMG_CONTEXT>",
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "video_token": "<video>",
        },
        [],
    ),
    "mistral3": ({"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}, []),
}
def family_special_tokens(model_type: str) -> list[str]:
    """Every special token a tiny `model_type` processor needs in its tokenizer."""
    named, unnamed = _SPECIAL_TOKENS[model_type]
    return list(dict.fromkeys([*named.values(), *unnamed]))


def family_tokenizer(tokenizer: PreTrainedTokenizerFast, model_type: str) -> PreTrainedTokenizerFast:
    """A copy of `tokenizer` with `model_type`'s special tokens: the named ones (e.g. `boi_token`) as attributes, which
    the family's processor reads and `save_pretrained` keeps."""
    named, unnamed = _SPECIAL_TOKENS[model_type]
    base = {key: getattr(tokenizer, key) for key in ("pad_token", "unk_token", "cls_token", "sep_token", "bos_token")}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=copy.deepcopy(tokenizer.backend_tokenizer),
        **{key: value for key, value in base.items() if value is not None},
        extra_special_tokens=dict(named),
    )
    new_tokens = [token for token in family_special_tokens(model_type) if token not in tokenizer.get_vocab()]
    tokenizer.add_tokens(new_tokens, special_tokens=True)
    return tokenizer


def _text_sizes(tokenizer, hidden_size: int, num_layers: int, num_heads: int) -> dict:
    return dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        pad_token_id=tokenizer.pad_token_id, max_position_embeddings=1024,
    )  # fmt: skip


def _qwen(model_type, tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    token_ids = {f"{key}_id": tokenizer.convert_tokens_to_ids(value) for key, value in _QWEN_TOKENS.items()}
    head_dim = hidden_size // num_heads
    # M-RoPE: the rotary half of a head split over (time, height, width)
    mrope = [head_dim // 2 - 2 * (head_dim // 8), head_dim // 8, head_dim // 8]
    text = dict(
        **_text_sizes(tokenizer, hidden_size, num_layers, num_heads),
        rope_parameters={"rope_type": "default", "mrope_section": mrope, "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=None,  # Qwen's defaults lie outside a tiny vocabulary
    )
    vision = dict(depth=vision_layers, hidden_size=hidden_size, num_heads=num_heads, patch_size=patch_size)
    video_processor_class = Qwen2VLVideoProcessor
    if model_type == "qwen2_vl":
        vision.update(embed_dim=hidden_size, mlp_ratio=4)
        config_class, model_class, processor_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    elif model_type == "qwen2_5_vl":
        vision.update(intermediate_size=4 * hidden_size, out_hidden_size=hidden_size, fullatt_block_indexes=[0])
        vision.update(window_size=2 * 2 * patch_size)
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        processor_class = Qwen2_5_VLProcessor
    else:
        vision.update(intermediate_size=4 * hidden_size, out_hidden_size=hidden_size, deepstack_visual_indexes=[0])
        vision.update(num_position_embeddings=(image_size // patch_size) ** 2)
        text.update(head_dim=head_dim)
        text["rope_parameters"]["mrope_interleaved"] = True
        video_processor_class = Qwen3VLVideoProcessor
        config_class, model_class, processor_class = Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    config = config_class(text_config=text, vision_config=vision, **token_ids, tie_word_embeddings=False)
    # dynamic resolution: sides rounded to multiples of 2 x 2 merged patches, pixels between one merged token and
    # four views of `image_size` squared
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=patch_size, merge_size=2, temporal_patch_size=2,
        size={"shortest_edge": (2 * patch_size) ** 2, "longest_edge": 4 * image_size**2},
    )  # fmt: skip
    # the processors hold a video processor (unused here) at the same patch sizes
    video_processor = video_processor_class(patch_size=patch_size, merge_size=2, temporal_patch_size=2)
    processor = processor_class(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor)
    return model_class(config), processor


def _pinpoints(image_size: int) -> list[list[int]]:
    return [[image_size, 2 * image_size], [2 * image_size, image_size], [2 * image_size, 2 * image_size]]


def _llava_next(tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    sizes = dict(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_attention_heads=num_heads)
    vision = CLIPVisionConfig(num_hidden_layers=vision_layers, image_size=image_size, patch_size=patch_size, **sizes)
    text = LlamaConfig(**_text_sizes(tokenizer, hidden_size, num_layers, num_heads))
    config = LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=_pinpoints(image_size), vision_feature_layer=-1, vision_feature_select_strategy="default",
    )  # fmt: skip
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
        image_grid_pinpoints=_pinpoints(image_size),
    )  # fmt: skip
    processor = LlavaNextProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,  # CLIP's CLS, dropped by "default"
    )  # fmt: skip
    return LlavaNextForConditionalGeneration(config), processor


def _llava_onevision(tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    sizes = dict(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_attention_heads=num_heads)
    vision = SiglipVisionConfig(num_hidden_layers=vision_layers, image_size=image_size, patch_size=patch_size, **sizes)
    text = Qwen2Config(**_text_sizes(tokenizer, hidden_size, num_layers, num_heads))
    config = LlavaOnevisionConfig(
        vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<video>"), image_grid_pinpoints=_pinpoints(image_size),
        vision_feature_layer=-1, vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
    )  # fmt: skip
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": image_size, "width": image_size}, image_grid_pinpoints=_pinpoints(image_size)
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=LlavaOnevisionVideoProcessor(),
        num_image_tokens=(image_size // patch_size) ** 2,
        vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
    )  # fmt: skip
    return LlavaOnevisionForConditionalGeneration(config), processor


def _idefics3(model_type, tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    sizes = dict(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_attention_heads=num_heads)
    text = LlamaConfig(**_text_sizes(tokenizer, hidden_size, num_layers, num_heads))
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    # splitting on: an image up to 2 x 2 views of `image_size` is cut into tiles of `image_size`, plus the global view
    image_kwargs = dict(
        do_image_splitting=True, size={"longest_edge": 2 * image_size}, max_image_size={"longest_edge": image_size}
    )
    image_seq_len = (image_size // patch_size) ** 2 // 4  # pixel shuffle with scale factor 2
    vision_kwargs = dict(num_hidden_layers=vision_layers, image_size=image_size, patch_size=patch_size, **sizes)
    if model_type == "idefics3":
        vision = Idefics3VisionConfig(**vision_kwargs)
        config = Idefics3Config(vision_config=vision, text_config=text, image_token_id=image_token_id, scale_factor=2)
        processor = Idefics3Processor(
            image_processor=Idefics3ImageProcessorPil(**image_kwargs), tokenizer=tokenizer, image_seq_len=image_seq_len
        )
        return Idefics3ForConditionalGeneration(config), processor
    vision = SmolVLMVisionConfig(**vision_kwargs)
    config = SmolVLMConfig(vision_config=vision, text_config=text, image_token_id=image_token_id, scale_factor=2)
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessorPil(**image_kwargs), tokenizer=tokenizer,
        video_processor=SmolVLMVideoProcessor(),
        image_seq_len=image_seq_len,
    )  # fmt: skip
    return SmolVLMForConditionalGeneration(config), processor


def _gemma3(tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    sizes = dict(hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_attention_heads=num_heads)
    vision = SiglipVisionConfig(num_hidden_layers=vision_layers, image_size=image_size, patch_size=patch_size, **sizes)
    text_sizes = _text_sizes(tokenizer, hidden_size, num_layers, num_heads)
    text = Gemma3TextConfig(**{**text_sizes, "num_key_value_heads": 1}, head_dim=hidden_size // num_heads)
    mm_tokens_per_image = (image_size // patch_size // 2) ** 2  # 2 x 2 average pooling of the patch grid
    config = Gemma3Config(
        vision_config=vision, text_config=text, mm_tokens_per_image=mm_tokens_per_image,
        image_token_id=tokenizer.convert_tokens_to_ids("<image_soft_token>"),
        boi_token_id=tokenizer.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_id=tokenizer.convert_tokens_to_ids("<end_of_image>"),
    )  # fmt: skip
    # pan and scan: an image of aspect ratio >= 1.2 gets crops of at least image_size / 2 besides the whole image
    image_processor = Gemma3ImageProcessorPil(
        size={"height": image_size, "width": image_size}, do_pan_and_scan=True,
        pan_and_scan_min_crop_size=image_size // 2, pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
    )  # fmt: skip
    processor = Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=mm_tokens_per_image
    )
    return Gemma3ForConditionalGeneration(config), processor


def _internvl(tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    vision = InternVLVisionConfig(
        hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=vision_layers,
        num_attention_heads=num_heads, image_size=[image_size, image_size], patch_size=[patch_size, patch_size],
    )  # fmt: skip
    text = Qwen2Config(**_text_sizes(tokenizer, hidden_size, num_layers, num_heads))
    config = InternVLConfig(
        vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        downsample_ratio=0.5, vision_feature_layer=-1, vision_feature_select_strategy="default",
    )  # fmt: skip
    # tiles: the aspect ratio's best grid of 1..4 tiles of `image_size`, plus a thumbnail when there is more than one
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": image_size, "width": image_size}, crop_to_patches=True, min_patches=1, max_patches=4
    )
    processor = InternVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=InternVLVideoProcessor(),
        image_seq_length=(image_size // patch_size) ** 2 // 4,  # pixel shuffle with downsample ratio 0.5
    )  # fmt: skip
    return InternVLForConditionalGeneration(config), processor


def _mistral3(tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    vision = PixtralVisionConfig(
        hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=vision_layers,
        num_attention_heads=num_heads, head_dim=hidden_size // num_heads, image_size=2 * image_size,
        patch_size=patch_size,
    )  # fmt: skip
    text_sizes = _text_sizes(tokenizer, hidden_size, num_layers, num_heads)
    text = MistralConfig(**text_sizes, head_dim=hidden_size // num_heads)
    config = Mistral3Config(
        vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2, vision_feature_layer=-1,
    )  # fmt: skip
    # native resolution up to 2 x `image_size` on the longest side, sides rounded up to 2 x 2 merged patches
    image_processor = PixtralImageProcessorPil(
        size={"longest_edge": 2 * image_size}, patch_size={"height": patch_size, "width": patch_size}
    )
    processor = PixtralProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size, spatial_merge_size=2
    )
    return Mistral3ForConditionalGeneration(config), processor


def _build(model_type, *args):
    if model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3", "smolvlm"):
        builder = _qwen if model_type.startswith("qwen") else _idefics3
        return builder(model_type, *args)
    return _BUILDERS[model_type](*args)


_BUILDERS = {
    "llava_next": _llava_next,
    "llava_onevision": _llava_onevision,
    "gemma3": _gemma3,
    "internvl": _internvl,
    "mistral3": _mistral3,
}
MULTIVIEW_FAMILIES = tuple(_SPECIAL_TOKENS)


def build_multiview(model_type, tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers):
    """(model, processor) of a tiny `model_type` (one of `MULTIVIEW_FAMILIES`) over `tokenizer` with the family's
    special tokens added."""
    require_processor_extras(model_type)
    tokenizer = family_tokenizer(tokenizer, model_type)
    return _build(model_type, tokenizer, image_size, patch_size, hidden_size, num_layers, num_heads, vision_layers)
