"""The `PreTrainedModel` base of the single- and two-stream families: what both share above BERT's blocks (the
initialisation of the shared blocks and heads, where the word embeddings are, the call of the base model that every
task head makes). Each family's `XPreTrainedModel` subclasses it and adds its config class, its own modules'
initialisation and `from_text_pretrained`."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from ..supervision import AttentionSupervisionMixin
from .bert_modules import TextEmbeddings
from .saving import SaveLoadMixin
from .task_heads import LMPredictionHead
from .visual_features import VisualFeatureStatisticsMixin, init_feature_normalization


class VisionLanguagePreTrainedModel(SaveLoadMixin, AttentionSupervisionMixin, VisualFeatureStatisticsMixin, PreTrainedModel):
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # transformers' `get_input_embeddings` / `set_input_embeddings` find them at `embeddings.word_embeddings` (the
    # base model) or through `base_model` (a task head)
    _input_embed_layer = "word_embeddings"
    # the losses divide by the per-loss counts of `loss_item_counts` (a dict, passed by `ComponentLossTrainer`), not by
    # the one token count transformers' Trainer would pass through `**kwargs`
    accepts_loss_kwargs = False

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        init_feature_normalization(module)
        if isinstance(module, TextEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))
        elif isinstance(module, LMPredictionHead):
            init.zeros_(module.bias)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> torch.nn.Embedding:
        """`PreTrainedModel.resize_token_embeddings`, also resizing the output bias of every masked-word head
        ([`~hf_vlalign.models.task_heads.LMPredictionHead`], whose decoder is tied to the word embeddings): kept
        entries keep their values, new ones start at zero (transformers resizes a bias only when it is the decoder's own
        `nn.Linear` bias, which ours is not, so the next forward would add a bias of the old size)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        for module in self.modules():
            if isinstance(module, LMPredictionHead):
                module.resize_bias(embeddings.weight.shape[0])
        return embeddings

    def _base_outputs(
        self,
        input_ids: torch.Tensor,
        visual_feats: torch.Tensor,
        visual_boxes: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        visual_attention_mask: torch.Tensor | None,
        word_region_alignment: torch.Tensor | None = None,
        phrase_masks: torch.Tensor | None = None,
        global_item_counts: Mapping[str, torch.Tensor] | None = None,
        **kwargs,
    ) -> ModelOutput:
        """A task head's call of its base model with the shared input names (in the order of the base model's
        `forward`), returning a `ModelOutput` whatever `config.return_dict` says."""
        return self.base_model(
            input_ids,
            visual_feats,
            visual_boxes,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            visual_attention_mask=visual_attention_mask,
            word_region_alignment=word_region_alignment,
            phrase_masks=phrase_masks,
            return_dict=True,
            global_item_counts=global_item_counts,
            **kwargs,
        )


__all__ = ["VisionLanguagePreTrainedModel"]
