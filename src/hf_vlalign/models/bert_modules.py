"""BERT's building blocks, shared by the single- and two-stream families: the text embeddings, the projection after
attention, the feed-forward network and the pooler (transformers' `BertEmbeddings`, `BertSelfOutput`,
`BertIntermediate`, `BertOutput`, `BertPooler`). Their attribute names are BERT's, so BERT checkpoints copy into
either family (`hf_vlalign.models.text_init.copy_module_weights`) and the published checkpoints convert
(`hf_vlalign.hub`). The prediction heads on top of them are in `hf_vlalign.models.task_heads`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from .dropout import make_dropout


class TextEmbeddings(nn.Module):
    """BERT's text embeddings (word + position + token type), named as in BERT so its weights copy over. A model's
    `_init_weights` resets `position_ids` (a non-persistent buffer)."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.hidden_dropout_prob)
        self.position_ids = nn.Buffer(torch.arange(config.max_position_embeddings).expand((1, -1)), persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        position_ids = self.position_ids[:, : input_ids.shape[1]]
        embeddings = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(position_ids)
        )
        return self.dropout(self.LayerNorm(embeddings))


class SelfOutput(nn.Module):
    """After attention: projection (from `input_size`, default `hidden_size`), dropout, residual and LayerNorm (BERT's
    `attention.output`)."""

    def __init__(self, config, input_size: int | None = None):
        super().__init__()
        self.dense = nn.Linear(input_size or config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = make_dropout(config, config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class Intermediate(nn.Module):
    """The feed-forward network's first half: projection to `intermediate_size` and activation."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class LayerOutput(SelfOutput):
    """The feed-forward network's second half: projection back from `intermediate_size`, dropout, residual and
    LayerNorm (BERT's `output`)."""

    def __init__(self, config):
        super().__init__(config, config.intermediate_size)


class Pooler(nn.Module):
    """The first token's state through Linear and tanh (BERT's pooler)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


__all__ = ["Intermediate", "LayerOutput", "Pooler", "SelfOutput", "TextEmbeddings"]
