"""Does the decoder's cross-attention point at the regions that matter? (Fei, "Attention-aligned transformer for image
captioning" (A2), Figure 2: Kendall-tau between attention weights and gradient-based importance.)

Reading used here: for caption word y_t (teacher-forced), the importance of region i is
||d p(y_t | y_<t, I) / d h_i||_2, h_i the encoder output state of region i; the attention is the head-averaged
cross-attention row of decoder position t as the layer used it (`aligned_cross_attentions`). Per layer, Kendall's tau-b between the two rankings of the real
regions is averaged over words; a word whose attention or importance is constant has no tau-b and is counted in
"num_undefined".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

__all__ = ["captioner_attention_importance", "kendall_tau", "region_importance"]


def _as_vector(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().double().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def _tau_b_terms(x: np.ndarray, y: np.ndarray) -> tuple[float, int, int, int]:
    """(sum over pairs i < j of sign(dx) sign(dy), number of pairs, pairs tied in x, pairs tied in y)."""
    upper = np.triu(np.ones((len(x), len(x)), dtype=bool), k=1)
    sign_x, sign_y = np.sign(x[:, None] - x[None, :])[upper], np.sign(y[:, None] - y[None, :])[upper]
    return float((sign_x * sign_y).sum()), int(upper.sum()), int((sign_x == 0).sum()), int((sign_y == 0).sum())


def kendall_tau(x: Sequence[float] | np.ndarray | torch.Tensor, y: Sequence[float] | np.ndarray | torch.Tensor) -> float:
    """Kendall's tau-b with ties: (n_c - n_d) / sqrt((n_0 - n_1)(n_0 - n_2)), n_0 = n(n - 1) / 2 pairs, n_1 / n_2 the
    pairs tied in x / y (Kendall 1945). O(n^2) time and memory.

    Raises:
        ValueError: lengths differ, fewer than 2 values, or x or y constant (tau-b undefined).
    """
    x, y = _as_vector(x), _as_vector(y)
    if len(x) != len(y):
        raise ValueError(f"`x` and `y` must have the same length, got {len(x)} and {len(y)}.")
    if len(x) < 2:
        raise ValueError(f"`x` and `y` must hold at least 2 values to rank, got {len(x)}.")
    concordance, pairs, ties_x, ties_y = _tau_b_terms(x, y)
    if ties_x == pairs or ties_y == pairs:
        which = "x" if ties_x == pairs else "y"
        raise ValueError(f"`{which}` must not be constant: Kendall's tau-b is undefined when every pair is tied.")
    return concordance / math.sqrt((pairs - ties_x) * (pairs - ties_y))


def _tau_or_none(x: np.ndarray, y: np.ndarray) -> float | None:
    """tau-b, or None when one side is constant (the word is counted as undefined, not skipped silently)."""
    concordance, pairs, ties_x, ties_y = _tau_b_terms(x, y)
    if ties_x == pairs or ties_y == pairs:
        return None
    return concordance / math.sqrt((pairs - ties_x) * (pairs - ties_y))


def _decoder_states_and_outputs(model, batch: dict, encoder_states: torch.Tensor):
    """The teacher-forced forward pass of `model` on `encoder_states`, with the decoder's final states (B, T, D), the
    input of the output head, caught by a pre-hook (the output holds only the logits computed from them)."""
    head = model.get_output_embeddings()
    caught = {}
    handle = head.register_forward_pre_hook(lambda module, inputs: caught.update(states=inputs[0]))
    try:
        outputs = model(
            visual_attention_mask=batch.get("visual_attention_mask"),
            labels=batch["labels"],
            decoder_attention_mask=batch.get("decoder_attention_mask"),
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
            output_attentions=True,
            use_cache=False,
        )
    finally:
        handle.remove()
    return caught["states"], outputs


def region_importance(model, batch: dict) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """Gradient importance |d p(y_t) / d h_i| of every region for every caption word, with the cross-attention.

    Runs `model` (a `RegionCaptionerForConditionalGeneration`) in eval mode (restored after) on the teacher-forced
    caption, with the encoder output h passed back in as `encoder_outputs` so it can take a gradient; one backward
    pass per caption position, batched over the examples (they are independent, so each position's probabilities are
    summed over the batch). Each position's probabilities are recomputed from its decoder state by the output head, so
    a backward pass goes through the vocabulary projection of one position only, not of all T.

    Returns:
        importance (B, T, R), the per-layer cross-attention used (B, H, T, R), and the mask of real words (B, T).
    """
    labels = batch["labels"]
    region_mask = batch.get("visual_attention_mask")
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            encoded = model.get_encoder()(batch["visual_feats"], batch["visual_boxes"], region_mask)
            states = encoded.last_hidden_state.detach().requires_grad_(True)
            decoder_states, outputs = _decoder_states_and_outputs(model, batch, states)
            head = model.get_output_embeddings()
            words = labels != -100
            importance = torch.zeros(*labels.shape, states.shape[1], dtype=torch.float64)
            for position in range(labels.shape[1]):
                scored = words[:, position]
                if not bool(scored.any()):
                    continue
                logits = head(decoder_states[scored, position]).float()
                word_probability = logits.softmax(-1).gather(-1, labels[scored, position].unsqueeze(-1))
                (gradient,) = torch.autograd.grad(word_probability.sum(), states, retain_graph=True)
                importance[:, position] = gradient.detach().double().norm(dim=-1).cpu()
    finally:
        model.train(was_training)
    attentions = outputs.aligned_cross_attentions or outputs.cross_attentions
    return importance, tuple(a.detach().double().cpu() for a in attentions), words.cpu()


def captioner_attention_importance(model, batch: dict) -> list[dict]:
    """Per decoder layer, Kendall's tau-b between head-averaged cross-attention and gradient importance over the
    real regions, averaged over the caption words (A2, Figure 2; see the module docstring for the reading).

    Args:
        model: a `RegionCaptionerForConditionalGeneration`.
        batch: visual_feats (B, R, Dv), visual_boxes (B, R, 4), visual_attention_mask (B, R) (optional) and labels
            (B, T) with -100 on padding.
    Returns:
        rows {"layer", "kendall_tau" (mean over words, NaN if no word had a defined tau), "num_words" (words
        averaged), "num_undefined" (words left out because attention or importance was constant over the regions)}.
    """
    importance, attentions, words = region_importance(model, batch)
    region_mask = batch.get("visual_attention_mask")
    real = (torch.ones(importance.shape[0], importance.shape[2]) if region_mask is None else region_mask).bool().cpu()
    table = []
    for layer, attention in enumerate(attentions):
        mixed = attention.mean(dim=1)  # (B, T, R)
        taus, undefined = [], 0
        for example, position in words.nonzero().tolist():
            keep = real[example]
            if int(keep.sum()) < 2:
                undefined += 1
                continue
            tau = _tau_or_none(mixed[example, position, keep].numpy(), importance[example, position, keep].numpy())
            if tau is None:
                undefined += 1
            else:
                taus.append(tau)
        mean = float(np.mean(taus)) if taus else math.nan
        table.append({"layer": layer, "kendall_tau": mean, "num_words": len(taus), "num_undefined": undefined})
    return table
