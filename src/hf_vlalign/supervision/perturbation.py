"""Perturbation-based self-supervised attention alignment of Fei (AAAI 2022, "Attention-aligned Transformer for image
captioning", A2) for a decoder's cross-attention a (B, H, T, R) over image regions: a mask network m (eq. 2), the
perturbed attention a_p (eq. 3) on which the mask network alone is trained (eq. 4, `mask_objective`), and
a_m = a * exp(1 - m) (eq. 5) fused with a by one of `FUSIONS` (eqs. 6-10). The readings where the paper is silent are
listed in docs/experiments.md. Training alternates a mask step (`mask_objective` over
`AttentionPerturbation.mask_parameters()`, the captioner on `perturb(...)`) and a captioning step (the caption loss
over everything else, the captioner on `align(...)` with the mask detached).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from transformers import initialization as init

from ..utils.item_counts import item_count, mean_over_items

FUSIONS = ("max", "moving_average", "exp_decay", "gate")
# the mask network of eq. (2): the printed form (decoder state only) or with a region-content term (module docstring)
MASK_INPUTS = ("query", "query_and_regions")
# eq. (7): the printed a + eta * a_m, or the convex (1 - eta) * a + eta * a_m (see `fuse_attention`)
MOVING_AVERAGES = ("additive", "convex")

# --- functional building blocks ---------------------------------------------------------------------------------------


def perturbed_attention(attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """a_p = m * a + (1 - m) * mean over heads of a (eq. 3), for (B, H, T, R) attention probabilities and a
    (B, H, T, 1) or (B, H, T, R) mask in [0, 1] (m = 1 leaves a head's attention untouched). As in the paper's form,
    a_p is not re-normalised; padded regions (0 in every head) stay 0."""
    return mask * attention + (1.0 - mask) * attention.mean(dim=1, keepdim=True)


def aligned_attention(attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """a_m = a * exp(1 - m) (eq. 5): the smaller m (the more perturbing it hurts), the more weight, up to e times.

    Not re-normalised here: `fuse_attention` re-normalises after the fusion (eqs. 6-10).
    """
    return attention * torch.exp(1.0 - mask)


def renormalise_over_regions(attention: torch.Tensor, region_mask: torch.Tensor | None = None) -> torch.Tensor:
    """a_tj / sum_j' a_tj' over the real regions (the normalisation after eqs. 6-10); padded regions get 0.

    Rows with no mass on a real region (e.g. padded decoder steps) stay all zeros, with a zero (never NaN) gradient.

    Args:
        attention: (B, H, T, R) non-negative weights.
        region_mask: (B, R), 1 for real regions (at least one per example); None keeps every region.
    """
    if region_mask is not None:
        attention = attention * region_mask[:, None, None, :].to(attention.dtype)
    sums = attention.sum(dim=-1, keepdim=True)
    # all-zero rows are divided by 1 and stay zero; dividing by a clamped sum would give the same values
    return attention / torch.where(sums > 0, sums, torch.ones_like(sums))


def exp_decay_weight(step: int | torch.Tensor, temperature: float) -> float | torch.Tensor:
    """w_s = exp(-s / T_P), the weight of the *original* attention in the exponential-decay fusion (eq. 8); a tensor
    when `step` is one (a model's step counter, never read on the host)."""
    if isinstance(step, torch.Tensor):
        return torch.exp(-step.double() / temperature).float()
    return math.exp(-step / temperature)


def fuse_attention(
    attention: torch.Tensor,
    aligned: torch.Tensor,
    fusion: str,
    *,
    eta: float = 0.5,
    step: int | torch.Tensor | None = None,
    temperature: float = 1000.0,
    gate: torch.Tensor | None = None,
    region_mask: torch.Tensor | None = None,
    moving_average: str = "additive",
) -> torch.Tensor:
    """Fuses the original attention a with the aligned attention a_m (eqs. 6-10), then divides by the sum over the real
    regions (none of the fused weights sums to 1; they replace attention probabilities).

    - "max" (eq. 6): max(a, a_m) elementwise (a_m >= a since m <= 1, so this is a_m re-normalised).
    - "moving_average" (eq. 7): a + eta * a_m ("additive", the printed form, eta >= 0) or (1 - eta) * a + eta * a_m
      ("convex", eta in [0, 1]: eta reads as the aligned attention's share and eta = 1 reaches a_m alone).
    - "exp_decay" (eq. 8): w_s * a + (1 - w_s) * a_m with w_s = exp(-s / T_P), s the training step: the decaying weight
      is the original attention's, so training moves from a (the mask network is untrained then) to a_m.
    - "gate" (eqs. 9-10, printed): g * a + (1 - g) * a_m, g = sigmoid(W_g q_t + b_g) per head and step, given as
      `gate`: g is the original attention's share. g * a_m + (1 - g) * a is the same family with g -> 1 - g (W_g, b_g
      -> -W_g, -b_g), so no option keeps it.

    Args:
        attention / aligned: (B, H, T, R) original attention a and aligned attention a_m (`aligned_attention`).
        fusion: one of `FUSIONS`; moving_average: one of `MOVING_AVERAGES` ("moving_average" only).
        eta: eq. 7's weight; step / temperature: s and T_P of eq. 8 (`step` required for "exp_decay").
        gate: (B, H, T, 1) gate values in [0, 1], required for "gate".
        region_mask: (B, R), 1 for real regions; padded regions get 0.

    Returns:
        (B, H, T, R) fused attention whose rows sum to 1 over the real regions (all-zero rows stay zero).
    """
    if fusion == "max":
        fused = torch.maximum(attention, aligned)
    elif fusion == "moving_average" and moving_average == "additive":
        fused = attention + eta * aligned
    elif fusion == "moving_average":
        fused = (1.0 - eta) * attention + eta * aligned
    elif fusion == "exp_decay":
        weight = exp_decay_weight(step, temperature)
        fused = weight * attention + (1.0 - weight) * aligned
    else:
        fused = gate * attention + (1.0 - gate) * aligned
    return renormalise_over_regions(fused, region_mask)


def mask_objective(
    caption_loss: torch.Tensor,
    masks: Sequence[torch.Tensor],
    weight: float,
    valid: torch.Tensor | None = None,
    num_steps: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_mask = -L_IC(a_p) + lambda * ||1 - m||^2 (eq. 4), to minimise over the mask networks' parameters only
    (`AttentionPerturbation.mask_parameters()`). The text of eq. 4 in ../shared/papers/fei2022_*.txt reads
    "L(θm) = LIC(αp t , θ) + λ||1 mt||2 2": its extraction drops minus signs (eq. 3's "(1 mt)" is (1 - m_t)), and the
    text sets the sign of L_IC: the mask network is to "destroy the description performance with limited operation on
    the original attention weights" (section 4) and the regular term is "to punish too much mask operation" (4.1).
    So L_IC enters with a minus (the mask maximises the caption loss) and the penalty with a plus (with +L_IC, m = 1,
    no perturbation, would be the trivial optimum). Minimised over the captioner, it would train the captioner to
    caption badly.

    Per aligned layer, (1 - m)^2 is summed over heads (and regions; padded regions have m = 1), averaged over the valid
    decoder steps, and the layers are summed; with no valid step the penalty is a zero attached to the masks' graph.

    Args:
        caption_loss: scalar captioning loss L_IC computed with the perturbed attention a_p (eq. 3).
        masks: one (B, H, T, 1) or (B, H, T, R) mask in [0, 1] per aligned layer.
        weight: lambda >= 0.
        valid: (B, T), 1 for real (non-padded) decoder steps; None counts every step.
        num_steps: the number of valid steps to average over (global under data parallelism, as for `caption_loss`);
            default: this batch's.
    """
    if valid is not None:
        valid = valid.bool()
    penalty = caption_loss.new_zeros(())
    for mask in masks:
        per_step = (1.0 - mask).pow(2).sum(dim=(1, 3))  # (B, T): sum over heads and mask positions
        if valid is not None:  # where(): with no valid step, a zero attached to the masks' graph
            per_step = torch.where(valid, per_step, torch.zeros_like(per_step))
        local_steps = per_step.numel() if valid is None else valid.sum()
        penalty = penalty + mean_over_items(per_step.sum(), item_count(local_steps, num_steps))
    return -caption_loss + weight * penalty


# --- module ---------------------------------------------------------------------------------------------------------


class PerturbationLinear(nn.Linear):
    """A Linear layer with the initialisation A2 needs (a model's `_init_weights` must call `init_parameters` on it
    instead of its generic Linear init, which would zero the mask bias and make m start at 0.5)."""

    def __init__(self, in_features: int, out_features: int, weight_std: float, bias_value: float | None):
        super().__init__(in_features, out_features, bias=bias_value is not None)
        self.weight_std = float(weight_std)
        self.bias_value = bias_value
        self.init_parameters()

    @torch.no_grad()
    def init_parameters(self) -> None:
        # transformers' guarded initialisers: a weight loaded from a checkpoint is never re-initialised
        if self.weight_std > 0:
            init.normal_(self.weight, mean=0.0, std=self.weight_std)
        else:
            init.zeros_(self.weight)
        if self.bias is not None:
            init.constant_(self.bias, float(self.bias_value))


class AttentionPerturbation(nn.Module):
    """The A2 alignment of one decoder layer's cross-attention: mask network (eq. 2), perturbation (eq. 3), alignment
    and fusion (eqs. 5-10).

    Parameters: `mask_network` (W_m, b_m of eq. 2: hidden -> heads * num_region_slots for `mask_input="query"`, hidden ->
    heads for "query_and_regions"), `region_network` (U_m, the region-content term of "query_and_regions", else None)
    and, for fusion "gate", `gate` (W_g, b_g of eqs. 9-10). Initialised so that m starts near sigmoid(mask_bias_init)
    (almost no perturbation), U_m = 0 and g near 0.5 (`reset_parameters`).

    Args:
        hidden_size / num_heads: the decoder's hidden size and cross-attention heads.
        fusion: one of `FUSIONS`; eta: eq. 7's weight; temperature: T_P of eq. 8.
        mask_input: one of `MASK_INPUTS`; num_region_slots: the region slots of the "query" mask network (an image may
            have at most that many regions); moving_average: one of `MOVING_AVERAGES`.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        fusion: str,
        eta: float = 0.5,
        temperature: float = 1000.0,
        mask_bias_init: float = 3.0,
        initializer_range: float = 0.02,
        mask_input: str = "query",
        num_region_slots: int = 100,
        moving_average: str = "additive",
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.fusion = fusion
        self.eta = float(eta)
        self.temperature = float(temperature)
        self.mask_bias_init = float(mask_bias_init)
        self.initializer_range = float(initializer_range)
        self.mask_input = mask_input
        self.num_region_slots = num_region_slots
        self.moving_average = moving_average
        self.fixed_mask_value: float | None = None  # set by `fixed_mask` (diagnostics): a constant m instead of eq. 2
        mask_outputs = num_heads * num_region_slots if mask_input == "query" else num_heads
        self.mask_network = PerturbationLinear(hidden_size, mask_outputs, weight_std=initializer_range, bias_value=mask_bias_init)
        self.region_network = (
            PerturbationLinear(hidden_size, num_heads, weight_std=0.0, bias_value=None)
            if mask_input == "query_and_regions"
            else None
        )
        self.gate = PerturbationLinear(hidden_size, num_heads, weight_std=initializer_range, bias_value=0.0) if fusion == "gate" else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialises eq. 2 so that m starts near sigmoid(mask_bias_init) (no perturbation) and eq. 9 so that g ~ 0.5."""
        for layer in (self.mask_network, self.region_network, self.gate):
            if layer is not None:
                layer.init_parameters()

    def mask_parameters(self) -> list[nn.Parameter]:
        """The parameters eq. (4) trains (W_m, b_m and, with "query_and_regions", U_m): give only these to the mask
        step's optimiser."""
        networks = (self.mask_network, self.region_network)
        return [parameter for network in networks if network is not None for parameter in network.parameters()]

    def mask(
        self,
        hidden_states: torch.Tensor,
        region_states: torch.Tensor | None = None,
        region_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The mask of eq. (2), in (0, 1]: m_t = sigmoid(W_m h_t + b_m) ("query", the R regions taking the first R
        region slots; `region_states` is read for R only and may be omitted when `region_mask` is given) or
        sigmoid(W_m h_t + U_m v_j + b_m) ("query_and_regions"; without `region_states`, one value per head and step).

        Args:
            hidden_states: (B, T, D) decoder states h_t feeding the cross-attention.
            region_states: (B, R, D) region states v_j (the cross-attention's keys' input).
            region_mask: (B, R), 1 for real regions; padded regions get m = 1 (no perturbation, penalty or gradient).

        Returns:
            (B, H, T, R) mask ((B, H, T, 1) for "query_and_regions" without `region_states`).
        """
        batch, steps = hidden_states.shape[:2]
        logits = self.mask_network(hidden_states)
        if self.mask_input == "query":
            num_regions = region_states.shape[1] if region_states is not None else region_mask.shape[-1]
            if num_regions > self.num_region_slots:
                raise ValueError(
                    f"the mask network scores at most `alignment_mask_regions` = {self.num_region_slots} regions "
                    f"(eq. 2, one value per region slot), got an image with {num_regions} regions; raise "
                    f"`alignment_mask_regions` or use `alignment_mask_input='query_and_regions'`."
                )
            logits = logits.view(batch, steps, self.num_heads, self.num_region_slots)[..., :num_regions]
            mask = torch.sigmoid(logits).transpose(1, 2)  # (B, H, T, R)
        elif region_states is None:
            return torch.sigmoid(logits).transpose(1, 2).unsqueeze(-1)
        else:
            logits = logits[:, :, None, :] + self.region_network(region_states)[:, None, :, :]  # (B, T, R, H)
            mask = torch.sigmoid(logits).permute(0, 3, 1, 2)  # (B, H, T, R)
        if self.fixed_mask_value is not None:
            mask = torch.full_like(mask, self.fixed_mask_value)
        if region_mask is not None:
            mask = mask.masked_fill(~region_mask.bool()[:, None, None, :], 1.0)
        return mask

    def perturb(self, attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """a_p = m * a + (1 - m) * mean over heads of a (eq. 3); see `perturbed_attention`."""
        return perturbed_attention(attention, mask)

    def align(
        self,
        attention: torch.Tensor,
        mask: torch.Tensor,
        queries: torch.Tensor | None = None,
        step: int | torch.Tensor | None = None,
        region_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """a_m = a * exp(1 - m) (eq. 5) fused with a by `self.fusion` (eqs. 6-10), re-normalised over the real regions
        ([`fuse_attention`]). Pass `mask.detach()` so that only eq. 4 trains the mask network; `queries` (B, T, D), the
        cross-attention's query projections q_t = W_Q h_t (all heads concatenated), are required by fusion "gate" and
        `step` by "exp_decay". Returns (B, H, T, R) attention."""
        gate = None
        if self.fusion == "gate":
            # eq. 10: g_t = sigmoid(W_g q_t + b_g) per head and step; q_t is the query ("we first linearly project the
            # hidden state of previous caption decoder layer to the query Q", section 2), eq. 2's mask reads h_t
            gate = torch.sigmoid(self.gate(queries)).transpose(1, 2).unsqueeze(-1)
        return fuse_attention(
            attention,
            aligned_attention(attention, mask),
            self.fusion,
            eta=self.eta,
            step=step,
            temperature=self.temperature,
            gate=gate,
            region_mask=region_mask,
            moving_average=self.moving_average,
        )

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, fusion={self.fusion!r}, eta={self.eta}, "
            f"temperature={self.temperature}, mask_bias_init={self.mask_bias_init}, mask_input={self.mask_input!r}, "
            f"num_region_slots={self.num_region_slots}, moving_average={self.moving_average!r}"
        )


# --- diagnostics: does A2 act? -----------------------------------------------------------------------------------------
# A row is one head's attention (or mask) at one decoder step over an image's regions (B, H, T, R -> B, H, T).
A2_DIAGNOSTICS = (
    "mask_mean", "mask_std_across_regions", "mask_loss", "attention_change_l1", "argmax_change_share",
    "caption_loss_change_zero_mask", "head_diversity",
)  # fmt: skip


def mask_row_statistics(mask: torch.Tensor, region_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the mean of the eq. 2 mask m over the real regions and its (population) standard deviation across
    them: a mask that does not tell regions apart has std 0, and eq. 5 then rescales a row uniformly, which the
    re-normalisation undoes. `mask` (B, H, T, R), `region_mask` (B, R) 1 for real regions; returns two (B, H, T)."""
    if region_mask is None:
        return mask.mean(dim=-1), mask.std(dim=-1, unbiased=False)
    real = region_mask[:, None, None, :].to(mask.dtype)
    count = real.sum(dim=-1)
    mean = (mask * real).sum(dim=-1) / count
    variance = ((mask - mean[..., None]).pow(2) * real).sum(dim=-1) / count
    return mean, variance.sqrt()


def attention_change(raw: torch.Tensor, aligned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the L1 distance sum_j |a_a - a| between the aligned attention (eqs. 5-10) and the raw one, and whether
    the most attended region changes (argmax over regions). Both (B, H, T, R); returns (B, H, T) float and bool."""
    return (aligned - raw).abs().sum(dim=-1), aligned.argmax(dim=-1) != raw.argmax(dim=-1)


def head_diversity(attention: torch.Tensor) -> torch.Tensor:
    """Per decoder step, the mean over heads of the L1 distance sum_j |a_hj - mean_h a_hj| between each head's
    attention and the head mean that eq. 3 perturbs towards: 0 when the heads agree (then no mask perturbs anything).
    `attention` (B, H, T, R); returns (B, T)."""
    return (attention - attention.mean(dim=1, keepdim=True)).abs().sum(dim=-1).mean(dim=1)


class fixed_mask:
    """Context manager: every `AttentionPerturbation` of `model` uses the constant mask `value` (padded regions keep
    1), e.g. 0, the strongest perturbation eq. 3 allows (every head replaced by the head mean), or 1 (none)."""

    def __init__(self, model: nn.Module, value: float):
        self.modules = [module for module in model.modules() if isinstance(module, AttentionPerturbation)]
        self.value = float(value)

    def __enter__(self):
        for module in self.modules:
            module.fixed_mask_value = self.value
        return self

    def __exit__(self, *exc):
        for module in self.modules:
            module.fixed_mask_value = None


class A2Diagnostics:
    """Whether A2 acts in a captioner (`RegionCaptionerForConditionalGeneration` with aligned layers), teacher-forced
    on batches (`update`), as `compute()`'s keys `A2_DIAGNOSTICS` (every row: aligned layer, example, head and caption
    step with a label, each row weighing the same; losses per caption token):

    - mask_mean / mask_std_across_regions: the eq. 2 mask's mean over the real regions and its standard deviation
      across them (`mask_row_statistics`);
    - mask_loss: eq. 4 (`mask_objective`) with the learned mask;
    - attention_change_l1 / argmax_change_share: aligned vs raw cross-attention (`attention_change`);
    - caption_loss_change_zero_mask: L_IC(a_p) with m = 0 everywhere (eq. 3's strongest perturbation) - L_IC(a);
    - head_diversity: the raw attention's heads against their mean (`head_diversity`), the room eq. 3 has to perturb.
    """

    def __init__(self):
        self.sums = dict.fromkeys(A2_DIAGNOSTICS, 0.0)
        self.rows = self.steps = self.tokens = 0

    @torch.no_grad()
    def update(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
        valid = inputs["labels"] != -100  # (B, T)
        region_mask = inputs.get("visual_attention_mask")
        outputs = model(**inputs, output_attentions=True)
        tokens = int(valid.sum())
        layers = model.config.aligned_layers or range(model.config.decoder_layers)
        raw_layers = [outputs.cross_attentions[layer] for layer in layers]
        aligned_layers = [outputs.aligned_cross_attentions[layer] for layer in layers]
        for mask, raw, aligned in zip(outputs.alignment_masks, raw_layers, aligned_layers):
            rows = valid[:, None, :].expand(-1, mask.shape[1], -1)  # (B, H, T)
            mean, std = mask_row_statistics(mask, region_mask)
            l1, changed = attention_change(raw, aligned)
            for key, value in (("mask_mean", mean), ("mask_std_across_regions", std), ("attention_change_l1", l1),
                               ("argmax_change_share", changed.float())):  # fmt: skip
                self.sums[key] += float(value[rows].sum())
            self.sums["head_diversity"] += float(head_diversity(raw)[valid].sum())
            self.rows += int(rows.sum())
            self.steps += tokens
        self.sums["mask_loss"] += float(model(**inputs, alignment_mode="perturb").loss_mask) * tokens
        with fixed_mask(model, 0.0):
            perturbed = float(model(**inputs, alignment_mode="perturb").loss_caption)
        with fixed_mask(model, 1.0):  # a_p = a: the raw attention
            raw_loss = float(model(**inputs, alignment_mode="perturb").loss_caption)
        self.sums["caption_loss_change_zero_mask"] += (perturbed - raw_loss) * tokens
        self.tokens += tokens

    def compute(self) -> dict[str, float]:
        per_row = ("mask_mean", "mask_std_across_regions", "attention_change_l1", "argmax_change_share")
        per_token = ("mask_loss", "caption_loss_change_zero_mask")
        return {
            **{key: self.sums[key] / self.rows if self.rows else math.nan for key in per_row},
            **{key: self.sums[key] / self.tokens if self.tokens else math.nan for key in per_token},
            "head_diversity": self.sums["head_diversity"] / self.steps if self.steps else math.nan,
        }
