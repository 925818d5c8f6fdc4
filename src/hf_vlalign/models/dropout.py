"""Dropout for every model family: torch's on accelerators, a cheaper mask on CPU.

CPU `torch.nn.functional.dropout` draws one Bernoulli sample per element through the single-threaded Mersenne Twister
(about 12 % of a MiniLM-sized training step, `benchmarks/run.py`). The CPU path draws 64 random bits per 4 elements and
keeps an element when its 16-bit share is above the threshold: the same inverted dropout with p rounded to a multiple of
2^-16 and the scale taken from that p (E[output] = input exactly), seeded by `torch.manual_seed`, its mask saved in the
input's dtype (a faster multiplication). While `torch.compile` traces, and with `dropout_implementation="torch"`,
`torch.nn.functional.dropout` is used.
"""

from __future__ import annotations

import torch
from torch import nn

DROPOUT_IMPLEMENTATIONS = ("auto", "torch")
_LEVELS = 1 << 16  # 16 random bits per element


def fast_dropout(hidden: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout with the 16-bit CPU mask described in the module docstring (torch's dropout off CPU and while
    compiling)."""
    if not training or p == 0.0:
        return hidden
    if hidden.device.type != "cpu" or torch.compiler.is_compiling():
        # torch's dropout off the CPU, and in a traced graph: the CPU mask's in-place `random_` does not trace
        return nn.functional.dropout(hidden, p=p, training=True)
    dropped_levels = round(p * _LEVELS)
    if dropped_levels == 0:
        return hidden
    if dropped_levels == _LEVELS:
        return hidden * 0.0
    count = hidden.numel()
    bits = torch.empty((count + 3) // 4, dtype=torch.int64, device=hidden.device).random_(-(2**63), None)
    # a uniform int16 is below -2^15 + k with probability k / 2^16; the 0/1 mask is written in the input's dtype
    # (a boolean mask would be converted on every multiplication, forward and backward)
    keep = torch.empty_like(hidden, memory_format=torch.contiguous_format)
    torch.ge(bits.view(torch.int16)[:count].view(hidden.shape), dropped_levels - _LEVELS // 2, out=keep)
    return hidden * keep.mul_(_LEVELS / (_LEVELS - dropped_levels))


class FastDropout(nn.Dropout):
    """`nn.Dropout` computed by [`fast_dropout`] (same `p`, same state dict: none)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return fast_dropout(hidden, self.p, self.training)


def make_dropout(config, p: float) -> nn.Dropout:
    """The dropout module a config asks for: [`FastDropout`] ("auto", the default) or `nn.Dropout` ("torch")."""
    if getattr(config, "dropout_implementation", "auto") == "torch":
        return nn.Dropout(p)
    return FastDropout(p)


def apply_dropout(config, hidden: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Functional form of [`make_dropout`]."""
    if getattr(config, "dropout_implementation", "auto") == "torch":
        return nn.functional.dropout(hidden, p=p, training=training)
    return fast_dropout(hidden, p, training)
