"""The alignment decoder of Kervadec et al. (ECAI 2020, "Weak supervision helps emergence of word-object alignment"),
section 5: the final word states S' and object states O' are projected to a joint space, scored by a scaled dot
product (eqs. 11-12), turned into a top-k softmax over objects per word (eq. 13) and trained with a KL divergence to
soft alignment targets A* (eq. 14; the targets are built by `hf_vlalign.alignment.soft_targets`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.activations import ACT2FN

from ..utils.item_counts import item_count, mean_over_items
from ..utils.validation import check_alignment, check_finite, check_mask_not_empty, check_rank, check_tensor, require

# how eq. (14)'s KL treats target mass on regions outside eq. (13)'s top-k (see `alignment_kl_loss`)
OUTSIDE_TOP_K = ("renormalise_target", "floor", "target_support")


class AlignmentProjection(nn.Module):
    """proj(x) = LayerNorm(x + W2 act(W1 x)): feed-forward with a residual connection and LayerNorm (eqs. 11-12)."""

    def __init__(self, hidden_size: int, layer_norm_eps: float = 1e-12, hidden_act: str = "gelu"):
        super().__init__()
        self.dense_in = nn.Linear(hidden_size, hidden_size)
        self.activation = ACT2FN[hidden_act]
        self.dense_out = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(hidden_states + self.dense_out(self.activation(self.dense_in(hidden_states))))


class AlignmentDecoder(nn.Module):
    """Word-object alignment scores A_ij = s_i . o_j / sqrt(d) with s = proj_L(S'), o = proj_V(O') (eqs. 11-12).

    The language and vision projections have separate parameters. The scores are logits: eq. (13)'s top-k softmax
    is applied by `top_k_log_softmax` (and inside `alignment_kl_loss`), not here.
    """

    def __init__(self, hidden_size: int, layer_norm_eps: float = 1e-12, hidden_act: str = "gelu"):
        super().__init__()
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool) or hidden_size < 1:
            raise ValueError(f"`hidden_size` must be a positive int, got {hidden_size!r}.")
        if not layer_norm_eps > 0:
            raise ValueError(f"`layer_norm_eps` must be > 0, got {layer_norm_eps!r}.")
        if hidden_act not in ACT2FN:
            raise ValueError(
                f"`hidden_act` must be one of transformers' ACT2FN names {sorted(ACT2FN)}, got {hidden_act!r}."
            )
        self.hidden_size = hidden_size
        self.language_projection = AlignmentProjection(hidden_size, layer_norm_eps, hidden_act)
        self.vision_projection = AlignmentProjection(hidden_size, layer_norm_eps, hidden_act)

    def forward(self, language_states: torch.Tensor, vision_states: torch.Tensor) -> torch.Tensor:
        """(B, T, D) word states and (B, R, D) object states -> (B, T, R) alignment scores (eqs. 11-12)."""
        check_rank("language_states", language_states, 3, "(batch, text_length, hidden_size)")
        check_rank("vision_states", vision_states, 3, "(batch, num_regions, hidden_size)")
        if language_states.shape[0] != vision_states.shape[0]:
            raise ValueError(
                f"`language_states` and `vision_states` must share the batch size, got {tuple(language_states.shape)} "
                f"and {tuple(vision_states.shape)}."
            )
        for name, states in (("language_states", language_states), ("vision_states", vision_states)):
            if states.shape[-1] != self.hidden_size:
                raise ValueError(
                    f"`{name}` must end with hidden_size={self.hidden_size}, got shape {tuple(states.shape)}."
                )
        words = self.language_projection(language_states)
        objects = self.vision_projection(vision_states)
        return torch.matmul(words, objects.transpose(-1, -2)) / math.sqrt(self.hidden_size)


def _check_scores_and_region_mask(
    scores: torch.Tensor, region_mask: torch.Tensor | None, check_values: bool = True
) -> torch.Tensor:
    """Validates (B, T, R) scores and a (B, R) region mask; returns the mask as bool (all True when None).

    Shapes are always checked; values (finite scores, a real region per example) only with `check_values`, since
    reading them synchronises the device with the host."""
    check_rank("scores", scores, 3, "(batch, text_length, num_regions)")
    if check_values:
        check_finite("scores", scores)
    batch, _, num_regions = scores.shape
    if region_mask is None:
        return torch.ones(batch, num_regions, dtype=torch.bool, device=scores.device)
    check_rank("region_mask", region_mask, 2, "(batch, num_regions)")
    if tuple(region_mask.shape) != (batch, num_regions):
        raise ValueError(
            f"`region_mask` must have shape (batch, num_regions) = {(batch, num_regions)} to match `scores`, "
            f"got {tuple(region_mask.shape)}."
        )
    if check_values:
        check_mask_not_empty("region_mask", region_mask, "region")
    return region_mask.bool()


def _check_top_k(k: int, num_regions: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= num_regions:
        raise ValueError(
            f"`alignment_top_k` (k) must be an int in [1, {num_regions}] (the number of regions of `scores`), "
            f"got {k!r}."
        )


def top_k_mask(
    scores: torch.Tensor, k: int, region_mask: torch.Tensor | None = None, check_values: bool = True
) -> torch.Tensor:
    """(B, T, R) bool mask of each word's k highest-scoring real regions (eq. 13's top-k set).

    An example with fewer than k real regions keeps all of its real regions and no padded one. `check_values=False`
    skips the checks that read tensor values on the host (the shapes are still checked).
    """
    check_tensor("scores", scores)
    check_tensor("region_mask", region_mask, optional=True)
    region_mask = _check_scores_and_region_mask(scores, region_mask, check_values)
    _check_top_k(k, scores.shape[-1])
    masked_scores = scores.detach().masked_fill(~region_mask[:, None, :], float("-inf"))
    top_indices = masked_scores.topk(k, dim=-1).indices
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top_indices, True)
    return keep & region_mask[:, None, :]


def top_k_log_softmax(
    scores: torch.Tensor,
    k: int,
    region_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    always_keep: torch.Tensor | None = None,
    check_values: bool = True,
) -> torch.Tensor:
    """log A with A = softmax over each word's top-k real regions only (eq. 13), as (B, T, R) log-probabilities.

    Entries outside the top-k (and padded regions) have probability 0 in A; they read `log(eps)` here so that a loss
    reading them stays finite. Their gradient is zero: only the kept scores are trained. `always_keep` (B, T, R)
    adds entries to the kept set (the loss's "target_support" reading passes the target's support). `check_values=False` skips
    the checks that read tensor values on the host.
    """
    check_tensor("scores", scores)
    check_tensor("region_mask", region_mask, optional=True)
    check_tensor("always_keep", always_keep, optional=True)
    if not 0 < eps < 1:
        raise ValueError(f"`eps` must be in (0, 1), got {eps!r}.")
    keep = top_k_mask(scores, k, region_mask, check_values)
    if always_keep is not None:
        real_regions = _check_scores_and_region_mask(scores, region_mask, check_values=False)
        keep = keep | (always_keep.bool() & real_regions[:, None, :])
    logits = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    log_probs = torch.log_softmax(logits, dim=-1)
    return torch.where(keep, log_probs, torch.full_like(log_probs, math.log(eps)))


def _check_target(target: torch.Tensor, scores: torch.Tensor, region_mask: torch.Tensor, check_values: bool) -> None:
    if not isinstance(target, torch.Tensor) or tuple(target.shape) != tuple(scores.shape):
        got = tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__
        raise ValueError(
            f"`word_region_alignment` (target) must have the shape of `scores` (batch, text_length, num_regions) = "
            f"{tuple(scores.shape)}, got {got}."
        )
    if not check_values:
        return
    check_alignment("word_region_alignment", target)
    mass_on_padding = (target * (~region_mask)[:, None, :]).sum()
    require(
        mass_on_padding <= 1e-6,
        "`word_region_alignment` must put no mass on padded regions (region_mask == 0)",
        lambda: f"got a total mass of {float(mass_on_padding):.4g} there",
    )


def _grounded_rows(target: torch.Tensor, text_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T) bool: rows that carry target mass and belong to a real token."""
    grounded = target.sum(-1) > 0.5
    if text_mask is None:
        return grounded
    check_rank("text_mask", text_mask, 2, "(batch, text_length)")
    if tuple(text_mask.shape) != tuple(target.shape[:2]):
        raise ValueError(
            f"`text_mask` must have shape (batch, text_length) = {tuple(target.shape[:2])}, "
            f"got {tuple(text_mask.shape)}."
        )
    return grounded & text_mask.bool()


def grounded_word_count(target: torch.Tensor, text_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The number of words [`alignment_kl_loss`] averages over: real tokens whose target row carries mass."""
    check_tensor("target", target)
    check_tensor("text_mask", text_mask, optional=True)
    return _grounded_rows(target, text_mask).sum()


def _check_outside_top_k(outside_top_k: str) -> None:
    if outside_top_k not in OUTSIDE_TOP_K:
        raise ValueError(
            f"`alignment_outside_top_k` (outside_top_k) must be one of {OUTSIDE_TOP_K}, got {outside_top_k!r}."
        )


def alignment_kl_loss(
    scores: torch.Tensor,
    target: torch.Tensor,
    region_mask: torch.Tensor | None = None,
    text_mask: torch.Tensor | None = None,
    k: int = 3,
    eps: float = 1e-6,
    num_words: torch.Tensor | None = None,
    outside_top_k: str = "renormalise_target",
    check_values: bool = True,
) -> torch.Tensor:
    """L_align = KL(A* || A) = sum_j A*_j (log A*_j - log A_j), averaged over the grounded words (eq. 14).

    A is eq. (13)'s softmax over each word's k highest-scoring real regions only: the other regions have probability 0
    in A and their scores get no gradient, so `k` decides which scores the loss trains. The paper does not say what
    becomes of target mass on a region outside the top-k, where KL(A* || A) is infinite; `outside_top_k` chooses:

    - "renormalise_target" (default): A* is restricted to the top-k and renormalised there,
      A*_j <- A*_j 1[j in top-k] / sum_{j' in top-k} A*_j'. The loss is eq. (14) between two distributions over the
      same k regions, zero when A matches A* there. A word whose target has no mass in its top-k contributes 0 (and
      no gradient) but still counts among the grounded words, so that the divisor does not depend on the scores.
    - "floor": A is read as max(A, eps) in the KL: target mass outside the top-k adds the constant
      A*_j (log A*_j - log eps) and no gradient. Inside the top-k the gradient equals the renormalised one scaled by
      the target mass in the top-k, so words whose target mostly falls outside weigh less.
    - "target_support": the kept set is the top-k united with the target's support {j : A*_j > 0} and A* is used as
      is, so the KL is exact and the target regions are raised even when the decoder does not rank them in its
      top-k yet. Its drawback, and why it is not the default: the semantic criterion of A* (eq. 16) is positive on
      almost every region, so the kept set is then nearly all regions and `k` has no effect (the loss equals the
      full-softmax KL).

    With k = 1, A is 1 on the best region and the first two readings give no gradient (the renormalised target is 1
    there too): k >= 2 is needed for a training signal, as with the paper's k = 3.

    Rows whose target is all zeros (ungrounded words) and rows where `text_mask` is 0 are ignored; with no grounded
    word the loss is a zero connected to the graph of `scores`. With `check_values=False` (a model passes its
    `config.validate_inputs`) the loss reads no tensor value on the host: the top-k set is a `topk` on the device and
    the renormalisation a division by a guarded sum.

    Args:
        scores: (B, T, R) alignment scores from `AlignmentDecoder`.
        target: (B, T, R) soft targets A* (`word_region_alignment`), each row a distribution or all zeros.
        region_mask: (B, R) 1 for real regions; target mass on padded regions is an error.
        text_mask: (B, T) 1 for real tokens.
        k: the top-k of eq. (13) (config field `alignment_top_k`), in [1, R].
        eps: the probability read for entries outside the kept set, in (0, 1) (the floor of "floor"; the other
            readings put no target mass there).
        num_words: the number of grounded words to divide by (global under data parallelism); default: this batch's.
        outside_top_k: one of `OUTSIDE_TOP_K` (config field `alignment_outside_top_k`), see above.
        check_values: check the values of `scores` (finite) and `target` (rows are distributions or zeros, no mass on
            padded regions); the shapes are always checked.
    """
    check_tensor("scores", scores)
    check_tensor("target", target)
    check_tensor("region_mask", region_mask, optional=True)
    check_tensor("text_mask", text_mask, optional=True)
    check_tensor("num_words", num_words, optional=True)
    _check_outside_top_k(outside_top_k)
    region_mask = _check_scores_and_region_mask(scores, region_mask, check_values)
    _check_target(target, scores, region_mask, check_values)
    grounded = _grounded_rows(target, text_mask)  # from the full target: the divisor does not depend on the scores
    always_keep = target > 0 if outside_top_k == "target_support" else None
    log_probs = top_k_log_softmax(scores, k, region_mask, eps, always_keep=always_keep, check_values=False)
    target = target.to(log_probs.dtype)
    if outside_top_k == "renormalise_target":
        kept_target = target * top_k_mask(scores, k, region_mask, check_values=False).to(target.dtype)
        kept_mass = kept_target.sum(-1, keepdim=True)
        # a row with no target mass in its top-k is divided by 1 and stays all zeros (loss 0, no NaN)
        target = kept_target / torch.where(kept_mass > 0, kept_mass, torch.ones_like(kept_mass))
    per_word = (torch.xlogy(target, target) - target * log_probs).sum(-1)
    # where(): a batch without grounded word gives a zero connected to the graph of `scores`
    total = torch.where(grounded, per_word, torch.zeros_like(per_word)).sum()
    return mean_over_items(total, item_count(grounded.sum(), num_words))
