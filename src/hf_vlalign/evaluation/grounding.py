"""Grounding evaluation of a model over a dataset: runs the model, feeds the probe of `analysis/`, picks an example to draw."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..analysis.grounding_probe import (
    BEST_AMONG_ALL,
    GroundingProbe,
    GroundingProbeResult,
    best_active_head,
    text_to_region_attention,
)
from ..utils.validation import check_callable, check_module, check_rows, check_tokenizer
from .inference import inference_batches, model_device, split_batch


@dataclass
class WordRegionAttention:
    """One example's attention from its grounded words to its regions in one head (rows re-normalised over regions)."""

    attention: np.ndarray  # (W, R)
    words: list[str]
    region_labels: list[str]
    gold: np.ndarray  # (W, R) gold alignment of the same words
    decoder: np.ndarray | None = None  # (W, R) softmax of the alignment decoder's scores, when the model has one


def _start_evaluation(model: torch.nn.Module, dataset, collator) -> bool:
    """Refuses arguments of the wrong kind and a `collator` without the probe targets, puts `model` in eval mode;
    returns whether it was training."""
    check_module("model", model)
    check_rows("dataset", dataset)
    check_callable("collator", collator, "a collator (called with a list of rows, returning a batch dict)")
    if not getattr(collator, "return_probe_targets", False):
        raise ValueError("`collator` must be built with `return_probe_targets=True` to evaluate grounding.")
    was_training = model.training
    model.eval()
    return was_training


@torch.no_grad()
def evaluate_grounding(
    model: torch.nn.Module,
    dataset,
    collator,
    batch_size: int = 32,
    iou_threshold: float = 0.5,
    progress: bool = True,
    active_heads_only: bool = True,
) -> GroundingProbeResult:
    """Li et al.'s probe over `dataset` of a single-stream model: every head of every layer as a classifier (see
    `GroundingProbe`; the best head is the best actively attending one unless `active_heads_only=False`), the same as
    `probe_attention_blocks` with its text mask. `collator` must return the probe targets (`return_probe_targets=True`).
    """
    return probe_attention_blocks(
        model, dataset, collator, "attention_mask", batch_size, iou_threshold, active_heads_only, progress
    )


def probe_over_blocks(
    probe: GroundingProbe, model: torch.nn.Module, dataset, collator, text_mask_key: str, batch_size: int, progress: bool
) -> GroundingProbe:
    """Feeds `probe` the word->region attention of `model` (any family, read through `analysis.adapters.
    attention_blocks`) over `dataset`, batched by `collator` (which returns the probe targets); the caller owns
    `torch.no_grad()` and the model's mode. Returns `probe`."""
    from ..analysis.adapters import attention_blocks
    from ..models.family import family_spec

    source, end_token = family_spec(model).name, getattr(model.config, "use_end_token", None)
    batches = inference_batches(
        model, dataset, collator, batch_size, exclude=("word_region_alignment", "phrase_masks"),
        forward_arguments_only=True, description="grounding probe", progress=progress,
    )  # fmt: skip
    for batch in batches:
        outputs = model(**batch.inputs, output_attentions=True)
        blocks = attention_blocks(
            outputs, text_mask=batch.batch[text_mask_key], region_mask=batch.batch["visual_attention_mask"],
            source=source, end_token=end_token,
        )  # fmt: skip
        probe.update_from_text_to_region(
            torch.stack(blocks.word_to_region).to(batch.targets["phrase_region_iou"].device),
            *_probe_targets(batch.targets, batch.inputs["visual_attention_mask"]),
        )
    return probe


@torch.no_grad()
def probe_attention_blocks(
    model: torch.nn.Module,
    dataset,
    collator,
    text_mask_key: str,
    batch_size: int = 32,
    iou_threshold: float = 0.5,
    active_heads_only: bool = True,
    progress: bool = True,
) -> GroundingProbeResult:
    """Li et al.'s probe over `dataset` for a model of any family (its word->region rows read through
    `analysis.adapters.attention_blocks`): every head of every layer as a classifier. `collator` must return the probe
    targets; `text_mask_key` is the batch key of the text mask ("decoder_attention_mask" for the captioner)."""
    from ..models.family import family_spec

    was_training = _start_evaluation(model, dataset, collator)
    probe = GroundingProbe(*family_spec(model).probe_shape(model), iou_threshold, active_heads_only=active_heads_only)
    probe_over_blocks(probe, model, dataset, collator, text_mask_key, batch_size, progress)
    model.train(was_training)
    return probe.compute()


def entity_grounding_metrics(result: GroundingProbeResult) -> dict:
    """Li et al.'s entity grounding results under the paper's names: the accuracy of every head
    (`entity_grounding_accuracy`, L x H), of the best actively attending head overall and per layer (Figure 3), each
    best head's active share, and the baseline under the name of its kind (`<baseline_kind>_baseline`: Li et al.'s
    `detection_confidence_baseline` where the store holds detection confidences, else `store_order_baseline`)."""
    per_layer = []
    share = result.active_share
    for layer, accuracy in enumerate(result.accuracy):
        layer_share = None if share is None else share[layer : layer + 1]
        _, head, among = best_active_head(
            accuracy[None], layer_share, result.active_threshold, result.best_among != BEST_AMONG_ALL
        )
        per_layer.append(
            {
                "layer": layer,
                "head": head,
                "entity_grounding_accuracy": float(accuracy[head]),
                "active_share": None if share is None else float(share[layer, head]),
                "best_among": among,
            }
        )
    return {
        "entity_grounding_accuracy": result.accuracy.tolist(),
        "entity_grounding_accuracy_best_head": float(result.best_head_accuracy),
        "best_head": [int(result.best_layer), int(result.best_head)],
        "best_head_active_share": result.best_head_active_share,
        "best_among": result.best_among,
        "entity_grounding_accuracy_best_head_per_layer": per_layer,
        "entity_grounding_accuracy_mean_head": float(result.mean_head_accuracy),
        f"{result.baseline_kind}_baseline": float(result.baseline_accuracy),  # Li et al.'s detection_confidence_baseline
        "baseline_kind": result.baseline_kind,
        "active_threshold": float(result.active_threshold),
        "num_entities": int(result.num_phrases),
    }


def _grounded_rows(attention: torch.Tensor, model_inputs: dict, outputs, tokenizer, index: int) -> WordRegionAttention:
    """The (T, R) `attention` of example `index` restricted to its grounded words and real regions, with the gold
    alignment and, when the model has an alignment decoder, the softmax of its scores over the same regions."""
    gold = model_inputs["word_region_alignment"][index]
    words = gold.sum(-1).nonzero().flatten()
    if words.numel() == 0:
        raise ValueError(f"`batch` example {index} has no grounded token to draw.")
    regions = model_inputs["visual_attention_mask"][index].nonzero().flatten()
    tokens = tokenizer.convert_ids_to_tokens(model_inputs["input_ids"][index, words].tolist())
    return WordRegionAttention(
        attention=attention[words][:, regions].cpu().numpy(),
        words=[f"{token} ({position})" for token, position in zip(tokens, words.tolist())],
        region_labels=[f"r{r}" for r in regions.tolist()],
        gold=gold[words][:, regions].cpu().numpy(),
        decoder=(
            outputs.alignment_scores[index][words][:, regions].softmax(-1).cpu().numpy()
            if outputs.get("alignment_scores") is not None
            else None
        ),
    )


def _forward_in_eval_mode(model: torch.nn.Module, batch: dict) -> tuple[dict, object]:
    """(model inputs, outputs with attentions) of `batch` run in eval mode; the model's mode is put back."""
    was_training = model.training
    model.eval()
    model_inputs, _ = split_batch(batch, model_device(model))
    outputs = model(**model_inputs, output_attentions=True)
    model.train(was_training)
    return model_inputs, outputs


@torch.no_grad()
def word_region_attention(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], tokenizer, layer: int, head: int, index: int = 0
) -> WordRegionAttention:
    """Attention of example `index` of `batch` from its grounded tokens to its regions, in head (`layer`, `head`)."""
    check_module("model", model)
    check_tokenizer("tokenizer", tokenizer)
    model_inputs, outputs = _forward_in_eval_mode(model, batch)
    text_length, num_regions = model_inputs["input_ids"].shape[1], model_inputs["visual_feats"].shape[1]
    rows = text_to_region_attention(outputs.attentions, text_length, num_regions, model_inputs["visual_attention_mask"])
    return _grounded_rows(rows[layer, index, head], model_inputs, outputs, tokenizer, index)


def _probe_targets(probe_inputs: dict, visual_attention_mask: torch.Tensor) -> tuple:
    """The probe's arguments after the attention rows, in `GroundingProbe.update_from_text_to_region`'s order."""
    return (
        probe_inputs["phrase_token_index"],
        probe_inputs["phrase_region_iou"],
        visual_attention_mask,
        probe_inputs["region_confidence"],
    )


def _update_head_probes(per_head: GroundingProbe, summed: GroundingProbe, rows: torch.Tensor, targets: tuple) -> None:
    """Scores (L, B, H, T, R) text->region rows for every head and for each layer's heads summed."""
    per_head.update_from_text_to_region(rows, *targets)
    summed.update_from_text_to_region(rows.sum(dim=2, keepdim=True), *targets)


@dataclass
class CrossAttentionEvaluation:
    """Question answering and cross-attention grounding of a two-stream model: the probe of every head of every cross
    layer, of each layer's heads summed (Kervadec et al. 2020, Figure 4; accuracy (L, 1)) and of the alignment
    decoder's scores, with its mean L_align (eq. 14), when the model has one."""

    vqa_accuracy: float | None
    num_questions: int
    per_head: GroundingProbeResult
    summed_heads: GroundingProbeResult
    alignment_decoder: GroundingProbeResult | None = None
    alignment_loss: float | None = None

    def to_dict(self) -> dict:
        return {
            "vqa_accuracy": self.vqa_accuracy,
            "num_questions": self.num_questions,
            "cross_attention_grounding_per_layer": self.summed_heads.accuracy[:, 0].tolist(),
            "cross_attention_grounding_per_head": self.per_head.to_dict(),
            "alignment_decoder_grounding_accuracy": (
                self.alignment_decoder.accuracy[0, 0].item() if self.alignment_decoder is not None else None
            ),
            "alignment_loss": self.alignment_loss,
        }


@torch.no_grad()
def evaluate_cross_attention(
    model: torch.nn.Module, dataset, collator, batch_size: int = 32, iou_threshold: float = 0.5, progress: bool = True
) -> CrossAttentionEvaluation:
    """Answer accuracy (argmax of `question_answering_score` vs `answer_labels`, where given) and Li et al.'s probe
    applied to the language->vision cross-attention of a two-stream model; `collator` must return the probe targets
    and mask nothing (e.g. a `TwoStreamPretrainingCollator` with its probabilities at 0)."""
    was_training = _start_evaluation(model, dataset, collator)
    config = model.config
    per_head = GroundingProbe(config.x_layers, config.num_attention_heads, iou_threshold)
    summed = GroundingProbe(config.x_layers, 1, iou_threshold)
    decoder = GroundingProbe(1, 1, iou_threshold)
    correct = total = 0
    alignment_losses = []
    for batch in inference_batches(model, dataset, collator, batch_size, description="evaluation", progress=progress):
        model_inputs = batch.inputs
        outputs = model(**model_inputs, output_attentions=True)
        targets = _probe_targets(batch.targets, model_inputs["visual_attention_mask"])
        _update_head_probes(per_head, summed, torch.stack(outputs.cross_encoder_attentions), targets)
        if outputs.get("alignment_scores") is not None:
            decoder.update_from_text_to_region(outputs.alignment_scores[None, :, None], *targets)
        if outputs.get("loss_alignment") is not None:
            alignment_losses.append(float(outputs.loss_alignment))
        answers = model_inputs.get("answer_labels")
        scores = outputs.get("question_answering_score")
        if answers is not None and scores is not None and answers.dim() == 1:
            known = answers != -100
            correct += int((scores.argmax(-1)[known] == answers[known]).sum())
            total += int(known.sum())
    model.train(was_training)
    return CrossAttentionEvaluation(
        vqa_accuracy=correct / total if total else None,
        num_questions=total,
        per_head=per_head.compute(),
        summed_heads=summed.compute(),
        alignment_decoder=decoder.compute() if decoder.num_phrases else None,
        alignment_loss=sum(alignment_losses) / len(alignment_losses) if alignment_losses else None,
    )


@torch.no_grad()
def cross_attention_rows(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], tokenizer, layer: int, index: int = 0
) -> WordRegionAttention:
    """Language->vision attention of cross layer `layer`, summed over heads, from example `index`'s grounded words
    to its regions (Kervadec et al. 2020, Figure 4), with the gold alignment and, when the model has an alignment
    decoder, the softmax of its scores over the same regions."""
    check_module("model", model)
    check_tokenizer("tokenizer", tokenizer)
    if not -model.config.x_layers <= layer < model.config.x_layers:
        raise ValueError(f"`layer` must index one of the {model.config.x_layers} cross layers, got {layer}.")
    model_inputs, outputs = _forward_in_eval_mode(model, batch)
    attention = outputs.cross_encoder_attentions[layer][index].sum(0)
    return _grounded_rows(attention, model_inputs, outputs, tokenizer, index)


@torch.no_grad()
def evaluate_decoder_grounding(
    model: torch.nn.Module, dataset, collator, batch_size: int = 32, iou_threshold: float = 0.5, progress: bool = True
) -> tuple[GroundingProbeResult, GroundingProbeResult]:
    """Li et al.'s probe on a captioner's decoder cross-attention, teacher-forced on the reference captions: the word at
    label position t is grounded by the attention of the decoder step that generates it (query t), as the decoder used
    it (`aligned_cross_attentions`). Returns (per head of every decoder layer, every layer's heads summed)."""
    was_training = _start_evaluation(model, dataset, collator)
    config = model.config
    per_head = GroundingProbe(config.decoder_layers, config.decoder_attention_heads, iou_threshold)
    summed = GroundingProbe(config.decoder_layers, 1, iou_threshold)
    batches = inference_batches(
        model, dataset, collator, batch_size, exclude=("word_region_alignment", "phrase_masks"),
        description="decoder grounding", progress=progress,
    )  # fmt: skip
    for batch in batches:
        rows = torch.stack(model(**batch.inputs, output_attentions=True).aligned_cross_attentions)  # (L, B, H, T, R)
        _update_head_probes(per_head, summed, rows, _probe_targets(batch.targets, batch.inputs["visual_attention_mask"]))
    model.train(was_training)
    return per_head.compute(), summed.compute()
