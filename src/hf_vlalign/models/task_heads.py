"""Task heads, losses and label checks shared by the single- and two-stream families: BERT's prediction heads, LXMERT's
answer head (VQA v2, GQA, NLVR2), VL-BERT's region scoring (RefCOCO+) and VisualBERT's `RegionToPhraseAttention`
(Flickr30k). Each loss is a plain function taking the number of items to divide by (`num_items`, global under data
parallelism)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers.activations import ACT2FN

from ..utils.item_counts import count_labeled, item_count, mean_cross_entropy, mean_over_items
from ..utils.validation import (
    check_binary_mask,
    check_finite,
    check_floating,
    check_in_range,
    check_integer,
    check_no_mass_on_padding,
    check_no_target_on_padding,
    check_rank,
    check_shape,
    require,
)


class PredictionHeadTransform(nn.Module):
    """Linear(d, d), activation, LayerNorm: BERT's `BertPredictionHeadTransform`, the first layer of the masked-word
    head and of each family's masked-region head."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class LMPredictionHead(nn.Module):
    """Masked-word scores (BERT's `BertLMPredictionHead`): the transform, then the decoder, tied to the word embeddings
    by the model's `_tied_weights_keys`, plus a bias of its own that a model's `_init_weights` sets to zero."""

    def __init__(self, config):
        super().__init__()
        self.transform = PredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states)) + self.bias

    @torch.no_grad()
    def resize_bias(self, vocab_size: int) -> None:
        """The bias for a vocabulary of `vocab_size` words (after `resize_token_embeddings`): the first entries are
        kept, new ones are zero."""
        if self.bias.shape[0] == vocab_size:
            return
        bias = self.bias.new_zeros(vocab_size)
        kept = min(vocab_size, self.bias.shape[0])
        bias[:kept] = self.bias[:kept]
        self.bias = nn.Parameter(bias, requires_grad=self.bias.requires_grad)


class AnswerHead(nn.Module):
    """Scores from a pooled state: Linear(d_in, 2d), GELU, LayerNorm, Linear(2d, labels) (LXMERT's answer head)."""

    def __init__(self, config, input_size: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(input_size, 2 * config.hidden_size)
        self.activation = ACT2FN["gelu"]
        self.LayerNorm = nn.LayerNorm(2 * config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(2 * config.hidden_size, num_labels)

    def forward(self, pooled_output: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.LayerNorm(self.activation(self.dense(pooled_output))))


class RegionScoringHead(nn.Module):
    """One score per region from its final state: Linear(d, d), activation, LayerNorm, Linear(d, 1) (VL-BERT's RoI
    classifier for referring expressions, Su et al. 2020, sec. 4.3; ViLBERT scores regions the same way)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def forward(self, region_states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.LayerNorm(self.activation(self.dense(region_states)))).squeeze(-1)


class RegionToPhraseAttention(nn.Module):
    """VisualBERT's phrase grounding head (Li et al. 2019, Flickr30k): one attention head whose scores between a
    phrase query and every region key are the grounding logits, s_pr = (W_q h_p) . (W_k h_r) / sqrt(d)."""

    def __init__(self, config):
        super().__init__()
        # VisualBERT's `query` / `key`, renamed so that LoRA's `query` / `key` targets never match this head
        self.phrase_projection = nn.Linear(config.hidden_size, config.hidden_size)
        self.region_projection = nn.Linear(config.hidden_size, config.hidden_size)
        self.scaling = config.hidden_size**-0.5

    def forward(self, phrase_states: torch.Tensor, region_states: torch.Tensor, region_mask: torch.Tensor) -> torch.Tensor:
        """(B, P, D), (B, R, D), (B, R) -> (B, P, R) logits; padding regions get the dtype's minimum."""
        queries, keys = self.phrase_projection(phrase_states), self.region_projection(region_states)
        scores = queries @ keys.transpose(-1, -2) * self.scaling
        return scores.masked_fill(~region_mask.bool().unsqueeze(1), torch.finfo(scores.dtype).min)


def mean_pool_phrases(hidden_states: torch.Tensor, phrase_masks: torch.Tensor) -> torch.Tensor:
    """Mean of each phrase's token states: (B, T, D), (B, P, T) -> (B, P, D); empty (padding) phrases give 0."""
    weights = phrase_masks.to(hidden_states.dtype)
    counts = weights.sum(-1, keepdim=True).clamp(min=1.0)
    return (weights @ hidden_states) / counts


# ----------------------------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------------------------


def weighted_total(weighted_losses: list[tuple[float, torch.Tensor | None]]) -> torch.Tensor | None:
    """sum_k w_k L_k over the losses that were computed; None when none was."""
    terms = [weight * loss for weight, loss in weighted_losses if loss is not None]
    return torch.stack(terms).sum() if terms else None


def answer_item_count(labels: torch.Tensor | None) -> torch.Tensor:
    """The questions [`answer_loss`] averages over: every row of (B, A) soft scores, the ids that are not -100."""
    if labels is not None and labels.dim() == 2:
        return torch.full((), labels.shape[0], device=labels.device)
    return count_labeled(labels)


def answer_loss(logits: torch.Tensor, labels: torch.Tensor, num_items: torch.Tensor | None = None) -> torch.Tensor | None:
    """Cross-entropy for one answer id per question (GQA; -100 ignored) or, for (B, A) soft scores (VQA), binary
    cross-entropy summed over answers and averaged over questions (LXMERT's `bce_loss * num_answers`). `num_items`:
    the number of questions to divide by (global under data parallelism; default: this batch's); 0 (in the graph) when
    every id is -100."""
    count = item_count(answer_item_count(labels), num_items)
    if labels.dim() == 2:
        total = nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="sum")
        return mean_over_items(total, count)
    return mean_cross_entropy(logits, labels, count)


def reasoning_loss(logits: torch.Tensor, labels: torch.Tensor, num_items: torch.Tensor | None = None) -> torch.Tensor:
    """NLVR2's binary cross-entropy of the pair score, averaged over the sentences (or divided by the global
    `num_items`)."""
    total = nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="sum")
    return mean_over_items(total, item_count(labels.numel(), num_items))


def masked_language_modelling(
    lm_head: nn.Module,
    text_states: torch.Tensor,
    labels: torch.Tensor | None,
    training: bool,
    num_items: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(prediction_logits, loss_mlm): BERT's masked-word cross-entropy over the positions whose label is not -100
    (divided by `num_items` when given, the global count of masked words; 0 when no word is masked). Every position
    is scored, as BERT's and LXMERT's heads do: selecting the masked ones first would read their number on the host
    (a device synchronisation per step). In training no logits are returned."""
    prediction_logits = lm_head(text_states)
    loss = None
    if labels is not None:
        loss = mean_cross_entropy(prediction_logits.flatten(0, 1), labels.flatten(), num_items)
    return (None if training else prediction_logits), loss


def masked_feature_loss(
    features: torch.Tensor, feature_labels: torch.Tensor, masked: torch.Tensor, num_items: torch.Tensor | None = None
) -> torch.Tensor:
    """L2 regression of the masked regions' features: each masked region's squared error (mean over its dimensions),
    averaged over the masked regions (or divided by the global `num_items`). Every region is scored and the unmasked
    ones add 0: selecting the masked ones first would read their number on the host."""
    squared = nn.functional.mse_loss(features, feature_labels.to(features.dtype), reduction="none")
    total = squared.masked_fill(~masked[..., None], 0.0).sum()
    return mean_over_items(total / features.shape[-1], item_count(masked.sum(), num_items))


def referring_expression_loss(
    logits: torch.Tensor,
    region_mask: torch.Tensor,
    target_region_iou: torch.Tensor | None,
    labels: torch.Tensor | None,
    iou_threshold: float,
    num_items: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Binary cross-entropy of every real region against "IoU with the referred box >= iou_threshold" (VL-BERT and
    ViLBERT's RefCOCO+ loss), averaged over the batch's real regions (or over the global `num_items`); without IoUs,
    the `labels` region is the only positive."""
    if target_region_iou is None and labels is None:
        return None
    if target_region_iou is not None:
        targets = (target_region_iou >= iou_threshold).to(logits.dtype)
    else:
        targets = nn.functional.one_hot(labels.long(), logits.shape[-1]).to(logits.dtype)
    real = region_mask.bool()
    per_region = nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    total = per_region.masked_fill(~real, 0.0).sum()
    return mean_over_items(total, item_count(real.sum(), num_items))


def phrase_grounding_loss(
    logits: torch.Tensor, phrase_labels: torch.Tensor, num_items: torch.Tensor | None = None
) -> torch.Tensor | None:
    """KL(target || softmax(logits)) over regions, averaged over grounded phrases (rows of `phrase_labels` that sum to
    1; all-zero rows are padding), or divided by the global `num_items` when given. VisualBERT's `KLDivLoss` over
    `log_softmax` of the region-to-phrase scores. Padding rows (no target mass) add nothing to the sum."""
    grounded = phrase_labels.sum(-1) > 0
    count = item_count(grounded.sum(), num_items)
    log_probs = nn.functional.log_softmax(logits.float(), dim=-1)
    per_row = nn.functional.kl_div(log_probs, phrase_labels.float(), reduction="none").sum(-1)
    return mean_over_items(per_row.masked_fill(~grounded, 0.0).sum(), count)


def region_mask_or_ones(visual_attention_mask: torch.Tensor | None, visual_feats: torch.Tensor) -> torch.Tensor:
    """The (B, R) region mask, all ones when none is given."""
    if visual_attention_mask is not None:
        return visual_attention_mask
    return torch.ones(visual_feats.shape[:2], dtype=torch.long, device=visual_feats.device)


# ----------------------------------------------------------------------------------------------------------------
# Label checks: shapes and dtypes always, values with `values` (`utils.validation.checks_values`)
# ----------------------------------------------------------------------------------------------------------------


def check_labels(name: str, labels: torch.Tensor | None, shape: tuple[int, ...], num_labels: int, values: bool) -> None:
    """Integer labels of `shape` in [0, num_labels) or -100 (ignored)."""
    if labels is None:
        return
    check_rank(name, labels, len(shape), str(shape))
    check_integer(name, labels)
    check_shape(name, labels, shape)
    if values:
        check_in_range(name, labels, num_labels, ignore_index=-100)


def check_answer_labels(
    answer_labels: torch.Tensor | None, batch: int, num_answers: int, values: bool, name: str = "answer_labels"
) -> None:
    """(B,) answer ids (-100 ignored) or (B, num_answers) soft scores in [0, 1]."""
    if answer_labels is None:
        return
    if isinstance(answer_labels, torch.Tensor) and answer_labels.is_floating_point():
        check_shape(name, answer_labels, (batch, num_answers), "(batch, num_qa_labels) of soft scores")
        if values:
            check_finite(name, answer_labels)
            check_unit_interval(f"soft `{name}`", answer_labels, "be scores")
        return
    check_labels(name, answer_labels, (batch,), num_answers, values)


def check_unit_interval(described: str, values: torch.Tensor, what: str) -> None:
    """Floating `values` in [0, 1]; `described` names the tensor in the message (e.g. "soft `labels`"), `what` says
    what they must be (e.g. "be scores")."""
    require(
        ((values >= 0) & (values <= 1)).all(),
        f"{described} must {what} in [0, 1]",
        lambda: f"got values in [{float(values.min()):.4g}, {float(values.max()):.4g}]",
    )


def check_image_pair(visual_feats: torch.Tensor, batch: int) -> None:
    """NLVR2 inputs carry one image pair per sentence: `visual_feats` (B, 2, R, Dv)."""
    if visual_feats.dim() != 4 or tuple(visual_feats.shape[:2]) != (batch, 2):
        raise ValueError(
            f"`visual_feats` must have shape (batch, 2, R, visual_feat_dim) with batch={batch} (one image pair per "
            f"sentence), got {tuple(visual_feats.shape)}."
        )


def check_referring_inputs(
    labels, target_region_iou, batch: int, num_regions: int, visual_attention_mask: torch.Tensor | None, values: bool
) -> None:
    """`labels` (B,) name a real region (without IoUs they are the only positive, so -100 is refused);
    `target_region_iou` (B, R) are finite IoUs in [0, 1], zero on padded regions."""
    check_labels("labels", labels, (batch,), num_regions, values)
    if target_region_iou is not None:
        check_floating("target_region_iou", target_region_iou)
        check_shape("target_region_iou", target_region_iou, (batch, num_regions), "(batch, R)")
    if not values:
        return
    region_mask = visual_attention_mask if _has_shape(visual_attention_mask, (batch, num_regions)) else None
    if labels is not None and target_region_iou is None:
        require(
            ~(labels == -100).any(),
            "`labels` must name a region in [0, R - 1] for every expression",
            lambda: "got -100 (ignored) without `target_region_iou`",
        )
    if labels is not None and region_mask is not None:
        region = labels.clamp(min=0, max=num_regions - 1)[:, None]
        on_padding = ~region_mask.bool().gather(1, region).squeeze(1) & (labels != -100)
        require(
            ~on_padding.any(),
            "`labels` must name a real region",
            lambda: (
                "got a region where `visual_attention_mask` is 0 (padding) for batch index(es) "
                f"{on_padding.nonzero().flatten().tolist()}"
            ),
        )
    if target_region_iou is not None:
        check_finite("target_region_iou", target_region_iou)
        check_unit_interval("`target_region_iou`", target_region_iou, "hold IoUs")
        if region_mask is not None:
            check_no_mass_on_padding("target_region_iou", target_region_iou, region_mask, "visual_attention_mask")


def check_phrase_labels(
    phrase_labels: torch.Tensor | None,
    phrase_masks: torch.Tensor,
    num_regions: int,
    visual_attention_mask: torch.Tensor | None,
    values: bool,
) -> None:
    """(B, P, T) 0/1 `phrase_masks`; (B, P, R) `phrase_labels` rows that are distributions over real regions (grounded
    phrases) or all zeros (padding)."""
    check_rank("phrase_masks", phrase_masks, 3, "(batch, num_phrases, text_length)")
    expected = (*phrase_masks.shape[:2], num_regions)
    if phrase_labels is not None:
        check_floating("phrase_labels", phrase_labels)
        check_shape("phrase_labels", phrase_labels, expected, "(batch, P, R)")
    if not values:
        return
    check_binary_mask("phrase_masks", phrase_masks)
    if phrase_labels is None:
        return
    check_finite("phrase_labels", phrase_labels)
    if _has_shape(visual_attention_mask, (expected[0], num_regions)):
        check_no_mass_on_padding("phrase_labels", phrase_labels, visual_attention_mask[:, None, :], "visual_attention_mask")
    sums = phrase_labels.sum(-1)
    distributions = ~(phrase_labels < 0).any() & ((sums - 1).abs() < 1e-3).logical_or(sums == 0).all()
    require(distributions, "`phrase_labels` rows must be non-negative and sum to 1 (grounded phrase) or 0 (padding)")
    require(
        ~(sums > 0).logical_and(~phrase_masks.bool().any(-1)).any(),
        "`phrase_labels` must give no target to a phrase whose `phrase_masks` row has no token",
        message=lambda: "`phrase_labels` gives a target to a phrase whose `phrase_masks` row has no token.",
    )


def _has_shape(mask: torch.Tensor | None, shape: tuple[int, ...]) -> bool:
    """A mask to check targets against; one of another shape is left to the encoder's checks, which name it."""
    return isinstance(mask, torch.Tensor) and tuple(mask.shape) == tuple(shape)


def check_pretraining_shapes(
    input_ids: torch.Tensor,
    visual_feats: torch.Tensor,
    labels: torch.Tensor | None,
    masked_regions: torch.Tensor | None,
    feature_labels: torch.Tensor | None,
    vocab_size: int,
    values: bool,
) -> tuple[int, int]:
    """The shapes both families' pre-training reads: `input_ids` (B, T), `visual_feats` (B, R, Dv), masked-word
    `labels` (B, T) in [0, vocab_size) or -100, `masked_regions` (B, R) and `feature_labels` shaped as `visual_feats`.
    Returns (B, R)."""
    check_rank("input_ids", input_ids, 2, "(batch, text_length)")
    check_rank("visual_feats", visual_feats, 3, "(batch, num_regions, visual_feat_dim)")
    batch, text_length = input_ids.shape
    num_regions = visual_feats.shape[1]
    check_labels("labels", labels, (batch, text_length), vocab_size, values)
    if masked_regions is not None:
        check_shape("masked_regions", masked_regions, (batch, num_regions), "(batch, R)")
    if feature_labels is not None:
        check_floating("feature_labels", feature_labels)
        if tuple(feature_labels.shape) != tuple(visual_feats.shape):
            raise ValueError(
                f"`feature_labels` must have the shape of `visual_feats` {tuple(visual_feats.shape)}, got {tuple(feature_labels.shape)}."
            )
    return batch, num_regions


def check_pretraining_targets(
    labels: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    visual_attention_mask: torch.Tensor | None,
    masked_regions: torch.Tensor | None,
    feature_labels: torch.Tensor | None,
    region_labels: Mapping[str, torch.Tensor | None],
) -> None:
    """Values of the pre-training targets (read on the host: call it when `checks_values`): masked words where
    `attention_mask` is 1, masked regions (0/1) and their `region_labels` (object / attribute classes) where
    `visual_attention_mask` is 1; `feature_labels` finite. Shapes are checked before (`check_pretraining_shapes`)."""
    if labels is not None and _has_shape(attention_mask, labels.shape):
        check_no_target_on_padding("labels", labels, attention_mask, "attention_mask")
    if masked_regions is not None:
        check_binary_mask("masked_regions", masked_regions)
        if _has_shape(visual_attention_mask, masked_regions.shape):
            check_no_mass_on_padding("masked_regions", masked_regions, visual_attention_mask, "visual_attention_mask")
    for name, targets in region_labels.items():
        if targets is not None and _has_shape(visual_attention_mask, targets.shape):
            check_no_target_on_padding(name, targets, visual_attention_mask, "visual_attention_mask")
    if feature_labels is not None:
        check_finite("feature_labels", feature_labels)


def pair_repeat(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """The sentence once per image of its pair: (B, ...) -> (2B, ...)."""
    return None if tensor is None else tensor.repeat_interleave(2, dim=0)


def pair_flatten(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """The two images of each pair in a row: (B, 2, ...) -> (2B, ...)."""
    return None if tensor is None else tensor.flatten(0, 1)
