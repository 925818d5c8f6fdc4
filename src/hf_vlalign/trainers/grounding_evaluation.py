"""Grounding evaluation of a model over a dataset: runs the model, feeds the probe of `analysis/`, picks an example to draw."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..data.collators import PROBE_KEYS
from ..analysis.grounding_probe import GroundingProbe, GroundingProbeResult, text_to_region_attention


@dataclass
class WordRegionAttention:
    """One example's attention from its grounded words to its regions in one head (rows re-normalised over regions)."""

    attention: np.ndarray  # (W, R)
    words: list[str]
    region_labels: list[str]
    gold: np.ndarray  # (W, R) gold alignment of the same words


def _split_batch(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[dict, dict]:
    model_inputs = {k: v.to(device) for k, v in batch.items() if k not in PROBE_KEYS}
    probe_inputs = {k: batch[k].to(device) for k in PROBE_KEYS}
    return model_inputs, probe_inputs


@torch.no_grad()
def evaluate_grounding(
    model: torch.nn.Module, dataset, collator, batch_size: int = 32, iou_threshold: float = 0.5, progress: bool = True
) -> GroundingProbeResult:
    """Li et al.'s probe over `dataset`: every head of every layer as a classifier (see `GroundingProbe`).

    `collator` must return the probe targets (`return_probe_targets=True`).
    """
    if not getattr(collator, "return_probe_targets", False):
        raise ValueError("`collator` must be built with `return_probe_targets=True` to evaluate grounding.")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    probe = GroundingProbe(model.config.num_hidden_layers, model.config.num_attention_heads, iou_threshold)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collator)
    for batch in tqdm(loader, desc="grounding probe", disable=not progress):
        model_inputs, probe_inputs = _split_batch(batch, device)
        outputs = model(**model_inputs, output_attentions=True)
        probe.update(
            outputs.attentions,
            model_inputs["input_ids"].shape[1],
            probe_inputs["phrase_token_index"],
            probe_inputs["phrase_region_iou"],
            model_inputs["visual_attention_mask"],
            probe_inputs["region_confidence"],
        )
    model.train(was_training)
    return probe.compute()


@torch.no_grad()
def word_region_attention(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], tokenizer, layer: int, head: int, index: int = 0
) -> WordRegionAttention:
    """Attention of example `index` of `batch` from its grounded tokens to its regions, in head (`layer`, `head`)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    model_inputs, _ = _split_batch(batch, device)
    outputs = model(**model_inputs, output_attentions=True)
    model.train(was_training)
    text_length, num_regions = model_inputs["input_ids"].shape[1], model_inputs["visual_feats"].shape[1]
    rows = text_to_region_attention(outputs.attentions, text_length, num_regions, model_inputs["visual_attention_mask"])
    gold = model_inputs["word_region_alignment"][index]
    words = gold.sum(-1).nonzero().flatten()
    if words.numel() == 0:
        raise ValueError(f"`batch` example {index} has no grounded token to draw.")
    regions = model_inputs["visual_attention_mask"][index].nonzero().flatten()
    tokens = tokenizer.convert_ids_to_tokens(model_inputs["input_ids"][index, words].tolist())
    return WordRegionAttention(
        attention=rows[layer, index, head][words][:, regions].cpu().numpy(),
        words=[f"{token} ({position})" for token, position in zip(tokens, words.tolist())],
        region_labels=[f"r{r}" for r in regions.tolist()],
        gold=gold[words][:, regions].cpu().numpy(),
    )
