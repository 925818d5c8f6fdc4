"""One batch's attention maps arranged by modality block, the common input of every analysis, whatever the model's
layout (a joint map over [text; regions], separate language, vision and cross maps, or an encoder-decoder's);
`analysis.adapters` builds it from each model's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_NAMES = ("word_to_word", "word_to_region", "region_to_region", "region_to_word")


@dataclass
class AttentionBlocks:
    """Per-layer attention by modality block, each a tuple over layers of (B, H, queries, keys) tensors (rows are
    queries), or None when the model has no such block.

    Attributes:
        text_mask (`(B, T)`): 1 for real words (queries of `word_to_*`, keys of `*_to_word`).
        region_mask (`(B, R)`): 1 for real regions.
        word_to_word / word_to_region / region_to_region / region_to_word: the blocks. In a joint map (single-stream)
            a block is a slice of each row, so its rows need not sum to 1; in a separate map (two-stream, captioner)
            they do. `row_normalised(name)` gives every block's rows renormalised over the block's real keys.
        source (`str`): where the maps come from ("single_stream", "two_stream", "captioner", "visual_bert",
            "lxmert"); for the captioner `word_to_region` is the decoder cross-attention.
    """

    text_mask: torch.Tensor
    region_mask: torch.Tensor
    word_to_word: tuple[torch.Tensor, ...] | None = None
    word_to_region: tuple[torch.Tensor, ...] | None = None
    region_to_region: tuple[torch.Tensor, ...] | None = None
    region_to_word: tuple[torch.Tensor, ...] | None = None
    source: str = ""

    def block(self, name: str) -> tuple[torch.Tensor, ...] | None:
        """Block `name`, one of `BLOCK_NAMES`."""
        return getattr(self, name)

    def available(self) -> tuple[str, ...]:
        """Names of the blocks this model has."""
        return tuple(name for name in BLOCK_NAMES if getattr(self, name) is not None)

    def masks(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(query mask (B, Q), key mask (B, K)) of block `name`."""
        query, key = name.split("_to_")
        pick = {"word": self.text_mask, "region": self.region_mask}
        return pick[query], pick[key]

    def row_normalised(self, name: str) -> tuple[torch.Tensor, ...] | None:
        """Block `name` with padded keys zeroed and every row renormalised to sum to 1 over the real keys (rows with
        no attention mass on real keys stay zero)."""
        maps = self.block(name)
        if maps is None:
            return None
        _, key_mask = self.masks(name)
        keep = key_mask[:, None, None, :].to(maps[0].dtype)
        out = []
        for attention in maps:
            masked = attention * keep
            total = masked.sum(-1, keepdim=True)
            out.append(torch.where(total > 0, masked / total.clamp(min=torch.finfo(masked.dtype).tiny), masked))
        return tuple(out)


__all__ = ["BLOCK_NAMES", "AttentionBlocks"]
