"""`AttentionSupervisionMixin`: the attention-supervision methods of Samaran et al. (2021), shared by every model family.

A model that mixes it in calls `init_attention_supervision()` in `__init__`, asks `layers_needing_query_key()` which
layers must hand over their (pre-dropout) query/key projections, and calls `attention_supervision_loss(...)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..utils.item_counts import count_true, num_items
from .direct import direct_supervision_loss_from_query_key, masked_log_softmax, supervised_row_counts
from .indirect import IndirectGroundingHead, indirect_supervision_loss, max_pool_phrases
from .rollout import attention_rollout, cross_modal_rollout, semi_direct_supervision_loss


def _indices_or_all(indices: list[int] | None, count: int) -> list[int]:
    """The sorted layer or head indices a config names (checked by the config); None means all `count` of them."""
    return list(range(count)) if indices is None else sorted(set(indices))


class AttentionSupervisionMixin:
    """Adds `none | direct | semi_direct | indirect` attention supervision, selected by `config.attention_supervision`."""

    def init_attention_supervision(self) -> None:
        if self.config.attention_supervision == "indirect":
            self.indirect_grounding_head = IndirectGroundingHead(self.config.hidden_size, self.config.hidden_dropout_prob)

    @property
    def supervised_layer_indices(self) -> list[int]:
        return _indices_or_all(self.config.supervised_layers, self.num_supervisable_layers)

    @property
    def supervised_head_indices(self) -> list[int]:
        return _indices_or_all(self.config.supervised_heads, self.config.num_attention_heads)

    @property
    def num_supervisable_layers(self) -> int:
        return self.config.num_hidden_layers

    def loss_item_counts(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """How many items each loss of this model averages over in `inputs` (a batch as its collator returns it), by
        the keys `forward` reads from `global_item_counts`. `ComponentLossTrainer` sums these over the micro-batches
        of an optimizer step and over processes, so that N processes x B examples train exactly as 1 x NB (see
        `hf_vlalign.utils.item_counts`). The keys depend on the config only. Heads add their own losses' counts."""
        return self.attention_supervision_item_counts(inputs.get("word_region_alignment"), inputs.get("phrase_masks"))

    def attention_supervision_item_counts(
        self, word_region_alignment: torch.Tensor | None, phrase_masks: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The items the configured supervision averages over in a batch, by `global_item_counts` key: grounded tokens
        and aligned regions (`attention_text_rows`, `attention_region_rows`) for direct and semi-direct supervision,
        real phrases (`attention_phrases`) for indirect supervision; zeros without `word_region_alignment`."""
        method = self.config.attention_supervision
        zero = torch.zeros((), dtype=torch.long)
        supervised = word_region_alignment is not None
        if method in ("direct", "semi_direct"):
            text_rows, region_rows = supervised_row_counts(word_region_alignment) if supervised else (zero, zero)
            return {"attention_text_rows": text_rows, "attention_region_rows": region_rows}
        if method == "indirect":
            phrases = count_true(phrase_masks.bool().any(-1)) if supervised and phrase_masks is not None else zero
            return {"attention_phrases": phrases}
        return {}

    def layers_needing_query_key(self) -> set[int]:
        """Layers whose query/key projections the supervision needs (rollout needs every layer up to the last one)."""
        method = self.config.attention_supervision
        if method == "direct":
            return set(self.supervised_layer_indices)
        if method == "semi_direct":
            return set(range(max(self.supervised_layer_indices) + 1))
        return set()

    def attention_supervision_loss(
        self,
        *,
        query_key_states: dict[int, tuple[torch.Tensor, torch.Tensor]],
        final_hidden_states: torch.Tensor,
        text_positions: slice,
        region_positions: slice,
        key_padding_mask: torch.Tensor,
        scaling: float,
        word_region_alignment: torch.Tensor,
        text_mask: torch.Tensor,
        region_mask: torch.Tensor,
        phrase_masks: torch.Tensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """Attention loss of the configured method over a joint text+region sequence.

        Args:
            query_key_states: layer index -> (query, key), each (B, H, N, d), before dropout.
            final_hidden_states: (B, N, D) last layer output (indirect supervision).
            text_positions / region_positions: where the text tokens and the regions sit in the sequence.
            key_padding_mask: (B, N) 1 for real positions (rollout needs the full attention).
            scaling: the attention's 1/sqrt(d).
            global_item_counts: the counts of [`attention_supervision_item_counts`] over the global batch (data
                parallelism, gradient accumulation); default: this batch's.
        """
        method = self.config.attention_supervision
        if method == "none":
            return None
        if method == "indirect":
            return self._indirect_loss(
                final_hidden_states, text_positions, region_positions, word_region_alignment, region_mask, phrase_masks,
                num_items(global_item_counts, "attention_phrases"),
            )  # fmt: skip
        targets = (word_region_alignment, text_mask, region_mask, global_item_counts)
        if method == "direct":
            t2r, r2t = [], []
            for layer in self.supervised_layer_indices:
                query, key = query_key_states[layer]
                t2r.append((query[:, :, text_positions], key[:, :, region_positions]))
                r2t.append((query[:, :, region_positions], key[:, :, text_positions]))
            return self._direct_loss(t2r, r2t, scaling, *targets)
        # semi_direct: full attention probabilities of every layer up to the last supervised one, then rollout
        probs = []
        for layer in range(max(self.supervised_layer_indices) + 1):
            query, key = query_key_states[layer]
            logits = query @ key.transpose(-1, -2) * scaling
            probs.append(masked_log_softmax(logits, key_padding_mask[:, None, None, :]).exp())
        rollouts = attention_rollout(probs, self.supervised_head_indices)
        return self._semi_direct_loss(rollouts, text_positions, region_positions, *targets)

    def cross_modal_supervision_loss(
        self,
        *,
        query_key_states: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]],
        language_states: torch.Tensor,
        vision_states: torch.Tensor,
        scaling: float,
        word_region_alignment: torch.Tensor,
        text_mask: torch.Tensor,
        region_mask: torch.Tensor,
        phrase_masks: torch.Tensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """Attention loss of the configured method over the cross-modality layers of a two-stream model.

        Direct supervision reads the language->vision cross-attention as text->region rows and the vision->language one
        as region->text rows (eqs. 6-8); semi-direct supervises their cross-modal rollout (`cross_modal_rollout`);
        indirect supervision classifies phrase-region pairs from the final language and vision states (eq. 5).

        Args:
            query_key_states: cross layer index -> {"language_to_vision", "vision_to_language", "language_self",
                "vision_self"} -> (query, key), each (B, H, N_query / N_key, d), before dropout.
            language_states / vision_states: (B, T, D) / (B, R, D) outputs of the last cross layer.
            global_item_counts: as in [`attention_supervision_loss`].
        """
        method = self.config.attention_supervision
        if method == "none":
            return None
        text_length = language_states.shape[1]
        text_positions = slice(0, text_length)
        region_positions = slice(text_length, text_length + vision_states.shape[1])
        if method == "indirect":
            final_states = torch.cat([language_states, vision_states], dim=1)
            return self._indirect_loss(
                final_states, text_positions, region_positions, word_region_alignment, region_mask, phrase_masks,
                num_items(global_item_counts, "attention_phrases"),
            )  # fmt: skip
        targets = (word_region_alignment, text_mask, region_mask, global_item_counts)
        if method == "direct":
            t2r = [query_key_states[layer]["language_to_vision"] for layer in self.supervised_layer_indices]
            r2t = [query_key_states[layer]["vision_to_language"] for layer in self.supervised_layer_indices]
            return self._direct_loss(t2r, r2t, scaling, *targets)
        key_masks = {
            "language_to_vision": region_mask, "vision_to_language": text_mask,
            "language_self": text_mask, "vision_self": region_mask,
        }  # fmt: skip
        probs = []
        for layer in range(max(self.supervised_layer_indices) + 1):
            probs.append({
                name: masked_log_softmax(query @ key.transpose(-1, -2) * scaling, key_masks[name][:, None, None, :]).exp()
                for name, (query, key) in query_key_states[layer].items()
            })  # fmt: skip
        rollouts = cross_modal_rollout(probs, self.supervised_head_indices)
        return self._semi_direct_loss(rollouts, text_positions, region_positions, *targets)

    def _direct_loss(self, text_to_region, region_to_text, scaling, word_region_alignment, text_mask, region_mask, counts):
        """Eqs. 6-8 from the supervised layers' (query, key) pairs; only the supervised heads are copied out of them
        (none when every head is supervised)."""
        heads = self.supervised_head_indices
        return direct_supervision_loss_from_query_key(
            text_to_region, region_to_text, scaling, word_region_alignment, text_mask, region_mask,
            None if heads == list(range(self.config.num_attention_heads)) else heads,
            num_items(counts, "attention_text_rows"), num_items(counts, "attention_region_rows"),
        )  # fmt: skip

    def _semi_direct_loss(
        self, rollouts, text_positions, region_positions, word_region_alignment, text_mask, region_mask, counts
    ):
        """Eqs. 6-8 on the rollout after each supervised layer."""
        return semi_direct_supervision_loss(
            [rollouts[layer] for layer in self.supervised_layer_indices], text_positions, region_positions,
            word_region_alignment, text_mask, region_mask,
            num_items(counts, "attention_text_rows"), num_items(counts, "attention_region_rows"),
        )  # fmt: skip

    def _indirect_loss(
        self, final_hidden_states, text_positions, region_positions, word_region_alignment, region_mask, phrase_masks, num_phrases
    ):
        if phrase_masks is None:
            raise ValueError("`phrase_masks` (B, P, T) is required when `attention_supervision='indirect'`, got None.")
        phrase_embeddings = max_pool_phrases(final_hidden_states[:, text_positions], phrase_masks)
        pair_logits = self.indirect_grounding_head(phrase_embeddings, final_hidden_states[:, region_positions])
        # a phrase's positive regions: those its tokens are aligned to
        targets = (phrase_masks.to(word_region_alignment.dtype) @ word_region_alignment > 0).to(pair_logits.dtype)
        return indirect_supervision_loss(pair_logits, targets, phrase_masks.bool().any(-1), region_mask, num_phrases)
