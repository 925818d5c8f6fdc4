"""Builds `AttentionBlocks` from the outputs of each supported model (called with `output_attentions=True`).

How each source's outputs map onto the four blocks (T = `text_mask.shape[1]` words, R = `region_mask.shape[1]`):

- "single_stream" / "visual_bert": one joint (B, H, N, N) map per layer over [text; regions; [END]], sliced into the
  four blocks (rows of a block need not sum to 1); N = T + R + 1, or T + R without the end token (VisualBERT, or a
  model with `use_end_token=False`; `end_token=None` tells the two apart by the maps' size).
- "two_stream" / "lxmert": `language_attentions` -> word_to_word, `vision_attentions` -> region_to_region,
  `cross_encoder_attentions` -> word_to_region and (two_stream only; transformers' Lxmert returns no vision->language
  map) `cross_encoder_vision_attentions` -> region_to_word. Layer i of word_to_word is language layer i, layer i of
  word_to_region cross layer i.
- "captioner": `encoder_attentions` -> region_to_region, `decoder_attentions` (run without a cache) -> word_to_word,
  `cross_attentions` (before A2's alignment) -> word_to_region; no region_to_word.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .attention_blocks import AttentionBlocks

__all__ = ["SOURCES", "attention_blocks", "infer_source", "text_to_region_rows"]

SOURCES = ("single_stream", "two_stream", "captioner", "visual_bert", "lxmert")

# the possible numbers of extra positions after [text; regions] in a joint map (single stream: [END], or none when the
# model has `use_end_token=False`)
_JOINT_EXTRA = {"single_stream": (1, 0), "visual_bert": (0,)}

# output class name prefix -> source
_CLASS_PREFIXES = (
    ("SingleStream", "single_stream"),
    ("VisualParaphrase", "single_stream"),
    ("TwoStream", "two_stream"),
    ("RegionCaptioner", "captioner"),
    ("VisualBert", "visual_bert"),
    ("Lxmert", "lxmert"),
)


def _field(outputs: object, name: str) -> object:
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return getattr(outputs, name, None)


def infer_source(outputs: object) -> str:
    """The source of `outputs`, from its class name (our output classes, transformers' VisualBert / Lxmert outputs)
    or, for generic outputs such as VisualBertModel's `BaseModelOutputWithPooling`, from the fields it holds."""
    name = type(outputs).__name__
    for prefix, source in _CLASS_PREFIXES:
        if name.startswith(prefix):
            return source
    if _field(outputs, "cross_encoder_vision_attentions") is not None:
        return "two_stream"
    if _field(outputs, "cross_encoder_attentions") is not None:
        return "lxmert"
    if _field(outputs, "encoder_attentions") is not None or _field(outputs, "cross_attentions") is not None:
        return "captioner"
    if _field(outputs, "attentions") is not None:
        return "visual_bert"  # a joint map without end token, e.g. VisualBertModel's BaseModelOutputWithPooling
    raise ValueError(
        f"`outputs` ({name}) hold no attention maps; run the model with output_attentions=True or pass `source`."
    )


def _layers(outputs: object, name: str, required: bool = True) -> tuple[torch.Tensor, ...] | None:
    """The per-layer (B, H, Q, K) maps in field `name` of `outputs`, None when absent and not `required`."""
    maps = _field(outputs, name)
    if not maps:
        if required:
            raise ValueError(
                f"`outputs` ({type(outputs).__name__}) hold no `{name}`; run the model with output_attentions=True."
            )
        return None
    return tuple(maps)


def _joint_extras(source: str, end_token: bool | None) -> tuple[int, ...]:
    """The numbers of positions a joint map of `source` may have after [text; regions]."""
    if end_token is None:
        return _JOINT_EXTRA[source]
    if end_token and source == "visual_bert":
        raise ValueError("`end_token` must be False or None for source 'visual_bert' (no [END] token), got True.")
    return (1,) if end_token else (0,)


def _joint_blocks(
    outputs: object, text_mask: torch.Tensor, region_mask: torch.Tensor, source: str, extras: tuple[int, ...]
) -> dict:
    """Slices joint (B, H, N, N) maps over [text; regions; extra] into the four blocks."""
    maps = _layers(outputs, "attentions")
    (batch, num_text), num_regions = text_mask.shape, region_mask.shape[1]
    sizes = [num_text + num_regions + extra for extra in extras]
    layouts = " or ".join(
        f"N = T + R + 1 ([END]) = {size}" if extra else f"N = T + R = {size}" for extra, size in zip(extras, sizes)
    )
    if maps[0].shape[-1] not in sizes:
        raise ValueError(
            f"`text_mask` (T = {num_text}) and `region_mask` (R = {num_regions}) disagree with `outputs.attentions` "
            f"of shape {tuple(maps[0].shape)}: a {source} map must be (B = {batch}, H, N, N) with {layouts}."
        )
    text, regions = slice(0, num_text), slice(num_text, num_text + num_regions)
    spans = {"word": text, "region": regions}
    blocks = {}
    for query in ("word", "region"):
        for key in ("word", "region"):
            blocks[f"{query}_to_{key}"] = tuple(attention[:, :, spans[query], spans[key]] for attention in maps)
    return blocks


# block -> output field of the sources with separate maps (see the module docstring for the layer mapping)
_LXMERT_FIELDS = {
    "word_to_word": "language_attentions",
    "region_to_region": "vision_attentions",
    "word_to_region": "cross_encoder_attentions",
}
_SEPARATE_FIELDS = {
    "two_stream": {**_LXMERT_FIELDS, "region_to_word": "cross_encoder_vision_attentions"},
    "lxmert": _LXMERT_FIELDS,
    "captioner": {
        "region_to_region": "encoder_attentions",
        "word_to_word": "decoder_attentions",
        "word_to_region": "cross_attentions",
    },
}


def _separate_blocks(outputs: object, fields: dict[str, str]) -> dict:
    """Reads each block from its own output field; at least one field must be present."""
    blocks = {block: _layers(outputs, field, required=False) for block, field in fields.items()}
    if all(maps is None for maps in blocks.values()):
        names = ", ".join(f"`{field}`" for field in fields.values())
        raise ValueError(
            f"`outputs` ({type(outputs).__name__}) hold none of {names}; run the model with output_attentions=True."
        )
    return blocks


def attention_blocks(
    outputs: object,
    *,
    text_mask: torch.Tensor,
    region_mask: torch.Tensor,
    source: str | None = None,
    end_token: bool | None = None,
) -> AttentionBlocks:
    """The attention maps of `outputs` arranged by modality block.

    Args:
        outputs: the outputs of one of the library's models or of transformers' VisualBert / Lxmert, called with
            `output_attentions=True`.
        text_mask: (B, T) 1 for real text tokens (`attention_mask`, or `decoder_attention_mask` for the captioner).
        region_mask: (B, R) 1 for real regions (`visual_attention_mask`).
        source: one of `SOURCES`; inferred from the output class when None.
        end_token: joint single-stream maps only: whether the sequence ends with the [END] token (the model's
            `config.use_end_token`); None accepts both layouts, told apart by the maps' size.
    """
    if source is None:
        source = infer_source(outputs)
    if source not in SOURCES:
        raise ValueError(f"`source` must be one of {SOURCES}, got {source!r}.")
    if source in _JOINT_EXTRA:
        blocks = _joint_blocks(outputs, text_mask, region_mask, source, _joint_extras(source, end_token))
    elif end_token is not None:
        raise ValueError(
            f"`end_token` applies to joint maps ({sorted(_JOINT_EXTRA)}) only, got {end_token!r} for {source!r}."
        )
    else:
        blocks = _separate_blocks(outputs, _SEPARATE_FIELDS[source])
    return AttentionBlocks(text_mask=text_mask, region_mask=region_mask, source=source, **blocks)


def text_to_region_rows(blocks: AttentionBlocks) -> tuple[torch.Tensor, ...]:
    """Per layer, the (B, H, T, R) word->region attention with every row renormalised over the real regions (what
    the grounding probe reads: `GroundingProbe.update_from_text_to_region(torch.stack(text_to_region_rows(blocks)),
    ...)`)."""
    return blocks.row_normalised("word_to_region")
