"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers") for
any model's per-layer attention maps over one token sequence.

Both read the network as a layered graph whose edge (l - 1, j) -> (l, i) carries A_l[i, j] (`layer_capacities`):
rollout multiplies the A_l, flow takes the maximum flow from input token j to output token i with the A_l as edge
capacities (each path limited by its weakest edge).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from ..supervision.rollout import attention_rollout as _batched_rollout

__all__ = ["attention_flow", "layer_capacities", "layer_rollouts", "max_flow"]

# residual capacities below this count as saturated (the weights are probabilities, at most 1)
_EPS = 1e-12


def layer_rollouts(attentions: list[torch.Tensor], heads: list[int] | None = None) -> list[torch.Tensor]:
    """Rollout after each layer (Abnar & Zuidema 2020, eq. 1: R_l = A_l R_{l-1}, R_0 = I) for any model.

    A thin wrapper of `supervision.rollout.attention_rollout` (the rollout attention supervision uses, batched maps
    only) that also takes one example's maps.

    Args:
        attentions: per layer, (B, H, N, N) joint attention probabilities (rows = queries), or one example's
            (H, N, N) / (N, N) maps; all layers the same rank.
        heads: heads averaged in each layer (default: all).
    Returns:
        per layer, the rollout up to and including it: (B, N, N) for batched input, (N, N) for one example.
    """
    rank = attentions[0].dim()
    batched = [a if rank == 4 else a.reshape((1,) * (4 - rank) + tuple(a.shape)) for a in attentions]
    rollouts = _batched_rollout(batched, heads)
    return rollouts if rank == 4 else [rollout[0] for rollout in rollouts]


def layer_capacities(attentions: list, residual: bool = True) -> list[np.ndarray]:
    """Per layer, the (N, N) edge weights A_l of the attention graph: head-averaged, and with `residual`
    rownorm(W + I) as in Abnar & Zuidema's code (0.5 W + 0.5 I for row-stochastic W)."""
    layers = []
    for attention in attentions:
        weights = attention.detach().double().cpu().numpy() if isinstance(attention, torch.Tensor) else np.asarray(attention, dtype=np.float64)
        mixed = weights.mean(axis=0) if weights.ndim == 3 else weights
        if residual:
            mixed = mixed + np.eye(mixed.shape[-1])
            mixed = mixed / mixed.sum(-1, keepdims=True)
        layers.append(mixed)
    return layers


def max_flow(capacity: np.ndarray, source: int, sink: int) -> float:
    """Edmonds-Karp maximum flow on a dense (V, V) capacity matrix (capacity[u, v]: edge u -> v): shortest
    augmenting paths found by breadth-first search, O(V E^2) in the worst case."""
    residual = capacity.astype(np.float64, copy=True)
    total = 0.0
    while True:
        parent = _augmenting_path(residual, source, sink)
        if parent is None:
            return total
        path, node = [], sink
        while node != source:
            path.append((parent[node], node))
            node = parent[node]
        bottleneck = min(residual[u, v] for u, v in path)
        for u, v in path:
            residual[u, v] -= bottleneck
            residual[v, u] += bottleneck
        total += bottleneck


def _augmenting_path(residual: np.ndarray, source: int, sink: int) -> dict[int, int] | None:
    """Breadth-first search for a source -> sink path with spare capacity; returns each reached node's parent."""
    parent = {source: source}
    queue = deque([source])
    while queue:
        node = queue.popleft()
        for neighbour in np.flatnonzero(residual[node] > _EPS).tolist():
            if neighbour not in parent:
                parent[neighbour] = node
                if neighbour == sink:
                    return parent
                queue.append(neighbour)
    return None


def _layered_graph(layers: list[np.ndarray]) -> np.ndarray:
    """Dense capacities of the (L + 1) x N node graph: node l * N + k is token k after layer l, and the edge
    (l - 1, j) -> (l, i) has capacity A_l[i, j]."""
    num_tokens = layers[0].shape[-1]
    size = (len(layers) + 1) * num_tokens
    capacity = np.zeros((size, size), dtype=np.float64)
    for layer, weights in enumerate(layers, start=1):
        below, above = slice((layer - 1) * num_tokens, layer * num_tokens), slice(layer * num_tokens, (layer + 1) * num_tokens)
        capacity[below, above] = weights.T  # rows: the key j below, columns: the query i above
    return capacity


def attention_flow(attentions: list, residual: bool = True, normalise: bool = False) -> np.ndarray:
    """Attention flow of one example (Abnar & Zuidema 2020, Section 3): entry [i, j] is the maximum flow from input
    token j to output token i (after the last layer) in the layered attention graph.

    Cost: N^2 Edmonds-Karp max-flows on (L + 1) N nodes: for short sequences (tens of tokens, a few layers).

    Args:
        attentions: per layer, one example's (H, N, N) or (N, N) attention probabilities (rows = queries), e.g.
            `outputs.attentions[l][b]`.
        residual: add the residual connection, A = rownorm(mean_h W + I) (their code); False uses mean_h W as is.
        normalise: divide each output row by its sum, as their `compute_flows` does before plotting.
    Returns:
        (N, N) float64 array of flow values (rows: output tokens, columns: input tokens, like the rollout).
    """
    layers = layer_capacities(attentions, residual)
    num_tokens, num_layers = layers[0].shape[-1], len(layers)
    capacity = _layered_graph(layers)
    flow = np.zeros((num_tokens, num_tokens), dtype=np.float64)
    for output_token in range(num_tokens):
        for input_token in range(num_tokens):
            flow[output_token, input_token] = max_flow(capacity, input_token, num_layers * num_tokens + output_token)
    if normalise:
        totals = flow.sum(-1, keepdims=True)
        flow = np.divide(flow, totals, out=np.zeros_like(flow), where=totals > 0)
    return flow
