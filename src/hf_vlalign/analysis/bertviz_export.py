"""Attention in the format of bertviz's `head_view` / `model_view` (a sequence over layers of (1, H, N, N) tensors
and the N token labels), and a JSON file to carry it to a notebook: the example's text tokens, then its regions
labelled "[R0]", "[R1]", ...

Joint maps are exported as they are (positions after the regions labelled "[END]"). `AttentionBlocks` are
reassembled into one (H, T + R, T + R) map per layer, each block in its place and zeros where the model has no
attention; separate maps follow the order the model runs them (two-stream: the single-modality layers, then the
cross layers; captioner: the encoder layers, then the decoder layers). bertviz is not a dependency of this library:
`head_view(**load_bertviz_inputs("attention.json"))` in a notebook that has it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import zip_longest
from pathlib import Path

import torch

from .attention_blocks import AttentionBlocks

__all__ = ["bertviz_inputs", "load_bertviz_inputs", "save_bertviz_inputs"]

_JOINT_SOURCES = ("single_stream", "visual_bert")


def _region_tokens(num_regions: int) -> list[str]:
    return [f"[R{index}]" for index in range(num_regions)]


def _stages(blocks: AttentionBlocks) -> list[dict[str, torch.Tensor]]:
    """The exported layers, each a {block name: (B, H, Q, K)} dict (see the module docstring)."""
    def zipped(*names: str) -> list[dict[str, torch.Tensor]]:
        columns = [getattr(blocks, name) or () for name in names]
        return [
            {name: attention for name, attention in zip(names, layer) if attention is not None}
            for layer in zip_longest(*columns)
        ]

    if blocks.source in _JOINT_SOURCES:
        return zipped("word_to_word", "word_to_region", "region_to_region", "region_to_word")
    if blocks.source == "captioner":
        return zipped("region_to_region") + zipped("word_to_word", "word_to_region")
    return zipped("word_to_word", "region_to_region") + zipped("word_to_region", "region_to_word")


def _assemble(stage: dict[str, torch.Tensor], batch_index: int, num_text: int, num_regions: int) -> torch.Tensor:
    """One (1, H, T + R, T + R) map with the stage's blocks in place and zeros elsewhere."""
    reference = next(iter(stage.values()))
    size = num_text + num_regions
    joint = reference.new_zeros(1, reference.shape[1], size, size)
    spans = {"word": slice(0, num_text), "region": slice(num_text, size)}
    for name, attention in stage.items():
        query, key = name.split("_to_")
        joint[0, :, spans[query], spans[key]] = attention[batch_index]
    return joint


def _from_blocks(
    blocks: AttentionBlocks, tokens: list[str], batch_index: int, trim_padding: bool
) -> tuple[list[torch.Tensor], list[str]]:
    num_text, num_regions = blocks.text_mask.shape[1], blocks.region_mask.shape[1]
    layers = [_assemble(stage, batch_index, num_text, num_regions) for stage in _stages(blocks)]
    labels = list(tokens) + _region_tokens(num_regions)
    if trim_padding:
        keep = torch.cat([blocks.text_mask[batch_index], blocks.region_mask[batch_index]]).bool().to(layers[0].device)
        layers = [layer[:, :, keep][:, :, :, keep] for layer in layers]
        labels = [label for label, kept in zip(labels, keep.tolist()) if kept]
    return layers, labels


def _from_joint(
    attentions: Sequence[torch.Tensor], tokens: list[str], batch_index: int, num_regions: int | None
) -> tuple[list[torch.Tensor], list[str]]:
    rest = attentions[0].shape[-1] - len(tokens)
    regions = rest if num_regions is None else num_regions
    labels = list(tokens) + _region_tokens(regions) + ["[END]"] * (rest - regions)
    return [attention[batch_index : batch_index + 1] for attention in attentions], labels


def bertviz_inputs(
    blocks_or_attentions: AttentionBlocks | Sequence[torch.Tensor],
    tokens: list[str],
    *,
    batch_index: int = 0,
    num_regions: int | None = None,
    trim_padding: bool = True,
) -> dict:
    """The keyword arguments of bertviz's `head_view` / `model_view` for one example.

    Args:
        blocks_or_attentions: `AttentionBlocks`, or joint per-layer (B, H, N, N) maps over [text; regions; ...].
        tokens: the labels of the T text positions (regions are labelled "[R<i>]").
        batch_index: which example of the batch to export.
        num_regions: joint maps only: how many positions after the text are regions (the rest are "[END]");
            defaults to all of them.
        trim_padding: `AttentionBlocks` only: drop the example's padded words and regions.

    Returns:
        `{"attention": tuple over layers of (1, H, N, N) float tensors on the CPU, "tokens": N labels}`.
    """
    if isinstance(blocks_or_attentions, AttentionBlocks):
        layers, labels = _from_blocks(blocks_or_attentions, list(tokens), batch_index, trim_padding)
    else:
        layers, labels = _from_joint(blocks_or_attentions, list(tokens), batch_index, num_regions)
    return {"attention": tuple(layer.detach().float().cpu() for layer in layers), "tokens": labels}


def save_bertviz_inputs(
    path: str | Path, blocks_or_attentions: AttentionBlocks | Sequence[torch.Tensor], tokens: list[str], **kwargs
) -> Path:
    """Writes `bertviz_inputs(blocks_or_attentions, tokens, **kwargs)` as JSON (nested lists); returns the path."""
    inputs = bertviz_inputs(blocks_or_attentions, tokens, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"tokens": inputs["tokens"], "attention": [layer.tolist() for layer in inputs["attention"]]}
    path.write_text(json.dumps(payload))
    return path


def load_bertviz_inputs(path: str | Path) -> dict:
    """Reads a file written by `save_bertviz_inputs` back into `{"attention": tuple of tensors, "tokens": list}`."""
    payload = json.loads(Path(path).read_text())
    if not isinstance(payload, dict) or set(payload) != {"attention", "tokens"}:
        found = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"`path` must be a file written by save_bertviz_inputs, got {found!r}.")
    attention = tuple(torch.tensor(layer, dtype=torch.float32) for layer in payload["attention"])
    return {"attention": attention, "tokens": list(payload["tokens"])}
