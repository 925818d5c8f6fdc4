"""BERT's building blocks, shared by the single- and two-stream families (transformers' `BertEmbeddings`,
`BertSelfAttention`, `BertSelfOutput`, `BertAttention`, `BertIntermediate`, `BertOutput`, `BertLayer`, `BertPooler`),
with BERT's attribute names, so BERT checkpoints copy into either family and the published checkpoints convert."""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention_utils import run_attention
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


class MultiHeadAttention(nn.Module):
    """Multi-head attention of `hidden_states` (queries) over `context` (keys and values): self-attention when they
    are the same tensor, cross-attention otherwise. Runs through the model's attention implementation
    ([`~hf_vlalign.models.attention_utils.run_attention`]); with `return_query_key` it also returns the per-head query
    and key projections, from which attention supervision computes its logits."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.attention_head_size**-0.5
        self.is_causal = False
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = make_dropout(config, config.attention_probs_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
        return_query_key: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
        input_shape = hidden_states.shape[:-1]
        query = self.query(hidden_states).view(*input_shape, -1, self.attention_head_size).transpose(1, 2)
        context_shape = (*context.shape[:-1], -1, self.attention_head_size)
        key = self.key(context).view(context_shape).transpose(1, 2)
        value = self.value(context).view(context_shape).transpose(1, 2)

        attn_output, attn_weights = run_attention(self, query, key, value, attention_mask, self.dropout.p, output_attentions)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return attn_output, attn_weights, (query, key) if return_query_key else None


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


class AttentionBlock(nn.Module):
    """Attention (`attention_class`, set by each family) followed by [`SelfOutput`] (BERT's `attention.self` /
    `attention.output` naming, so BERT layers load into it)."""

    attention_class: type[nn.Module] = MultiHeadAttention

    def __init__(self, config):
        super().__init__()
        self.self = self.attention_class(config)
        self.output = SelfOutput(config)

    def forward(self, hidden_states, context, attention_mask, output_attentions=False, return_query_key=False):
        attn_output, attn_weights, query_key = self.self(
            hidden_states, context, attention_mask, output_attentions, return_query_key
        )
        return self.output(attn_output, hidden_states), attn_weights, query_key


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


class TransformerLayer(GradientCheckpointingLayer):
    """BERT's layer: self-attention (`attention_class`, an [`AttentionBlock`] set by each family), then the feed-forward
    network. Returns the layer's output, the attention probabilities (with `output_attentions`) and the (query, key)
    projections (with `return_query_key`)."""

    attention_class: type[nn.Module] = AttentionBlock

    def __init__(self, config):
        super().__init__()
        self.attention = self.attention_class(config)
        self.intermediate = Intermediate(config)
        self.output = LayerOutput(config)

    def forward(self, hidden_states, attention_mask, output_attentions=False, return_query_key=False):
        attention_output, attn_weights, query_key = self.attention(
            hidden_states, hidden_states, attention_mask, output_attentions, return_query_key
        )
        layer_output = self.output(self.intermediate(attention_output), attention_output)
        return layer_output, attn_weights, query_key


class Pooler(nn.Module):
    """The first token's state through Linear and tanh (BERT's pooler)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


__all__ = [
    "AttentionBlock",
    "Intermediate",
    "LayerOutput",
    "MultiHeadAttention",
    "Pooler",
    "SelfOutput",
    "TextEmbeddings",
    "TransformerLayer",
]
