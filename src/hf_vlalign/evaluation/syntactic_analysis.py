"""Syntactic grounding inside `hf-vlalign analyze` (Li et al. 2020, Table 2): each text is parsed with spaCy once, every
parse word is matched to the token the model read for it (its last WordPiece, through character offsets, so the two
word splits need not agree), and a word is an entity word when that token lies in a grounded phrase of the collator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..analysis.probe_plots import plot_top_relations
from ..analysis.syntactic_grounding import (
    SyntacticGroundingProbe,
    join_parses,
    load_spacy_model,
    parse_with_spacy,
    spacy_model_name,
    word_ids_from_offsets,
    word_token_index,
)

TOP_RELATIONS = 10


@dataclass
class SyntacticGroundingAnalysis:
    """Feeds a `SyntacticGroundingProbe` from collated batches and their rows (the texts to parse). `token_shift` moves
    encoding positions to the model's text positions: -1 for the captioner, whose decoder reads the caption without the
    leading [CLS]."""

    probe: SyntacticGroundingProbe
    tokenizer: object
    text_columns: tuple[str, ...]
    max_text_length: int
    token_shift: int = 0
    spacy_model: str | None = None
    parser: str = field(init=False)
    words: int = field(default=0, init=False)
    words_without_token: int = field(default=0, init=False)
    _parses: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.parser = spacy_model_name(load_spacy_model(self.spacy_model))  # ImportError when spaCy is missing

    def _parse(self, texts: list[list[str]]) -> list[list[list[dict]]]:
        """spaCy parses of each row's texts; each distinct text is parsed once over the whole analysis, the new ones of
        a batch in one `nlp.pipe` call."""
        new = sorted({text for row in texts for text in row if text not in self._parses})
        if new:
            self._parses.update(zip(new, parse_with_spacy(new, self.spacy_model)))
        return [[self._parses[text] for text in row] for row in texts]

    def _encoding(self, texts: list[list[str]], text_length: int):
        """The collator's encoding of `texts` again, now with character offsets (the collator drops them)."""
        encoding = self.tokenizer(
            *[[row[k] for row in texts] for k in range(len(self.text_columns))],
            padding="longest", truncation=True, max_length=self.max_text_length, return_offsets_mapping=True,
        )  # fmt: skip
        length = len(encoding["input_ids"][0]) + self.token_shift
        if length != text_length:
            raise ValueError(
                f"`data.collator` encodes its texts to {text_length} tokens, but its tokenizer with max_text_length="
                f"{self.max_text_length} gives {length}: the syntactic analysis cannot find the words' tokens."
            )
        return encoding

    @torch.no_grad()
    def update(self, examples: list[dict], batch: dict, rows: torch.Tensor) -> None:
        """Scores the arcs of one batch; `rows` (L, B, H, T, R) is the text->region attention the probe reads."""
        texts = [[example[column] for column in self.text_columns] for example in examples]
        parses = self._parse(texts)
        encoding = self._encoding(texts, rows.shape[3])
        num_words = max(sum(len(parse) for parse in row) for row in parses)
        token_index = torch.full((len(examples), num_words), -1, dtype=torch.long)
        iou = torch.zeros(len(examples), num_words, rows.shape[4])
        grounded = torch.zeros(len(examples), num_words, dtype=torch.bool)
        for i, row in enumerate(parses):
            spans = [[(word["start"], word["end"]) for word in parse] for parse in row]
            word_ids = word_ids_from_offsets(spans, encoding["offset_mapping"][i], encoding.sequence_ids(i))
            positions = [p + self.token_shift if p >= 0 else -1 for p in word_token_index(word_ids, sum(map(len, spans)))]
            self.words += len(positions)
            self.words_without_token += positions.count(-1)
            token_index[i, : len(positions)] = torch.tensor(positions, dtype=torch.long)
            self._entity_words(i, positions, batch, grounded, iou)
        self.probe.update(
            rows, [join_parses(row) for row in parses], token_index, iou, grounded, batch["visual_attention_mask"],
            batch["region_confidence"],
        )  # fmt: skip

    @staticmethod
    def _entity_words(i: int, positions: list[int], batch: dict, grounded: torch.Tensor, iou: torch.Tensor) -> None:
        """Marks the words of example `i` whose token lies in a grounded phrase, with the gold-box IoUs of the first
        such phrase."""
        positions = torch.tensor(positions, dtype=torch.long)
        words = (positions >= 0).nonzero().flatten()
        inside = batch["phrase_masks"][i][:, positions[words]]  # (P, words with a token)
        found, first = inside.any(dim=0), inside.to(torch.uint8).argmax(dim=0)  # argmax: the first maximal index
        words, first = words[found], first[found]
        grounded[i, words] = True
        iou[i, words] = batch["phrase_region_iou"][i, first]

    def report(
        self, out_dir: Path, title: str, k: int = TOP_RELATIONS, baseline_name: str = "detection-confidence baseline"
    ) -> dict:
        """analysis.json's "syntactic_grounding": the top-`k` relations (Li et al. Table 2: each with its best actively
        attending head and that head's `active_share`), the paper's metrics by relation and the plot."""
        if self.probe.num_pairs == 0:
            return {"skipped": f"no dependency arc touches a word of a grounded phrase (of {self.words} words parsed)."}
        result = self.probe.compute()
        rows = result.top_relations(min(k, len(result.relations)))
        for row in rows:
            row["mean_accuracy"] = float(np.mean(result.accuracy[row["relation"]]))
        plot = plot_top_relations(rows, out_dir / "syntactic_grounding.png", title=title, baseline_label=baseline_name)
        return {
            "parser": self.parser,
            "num_arcs": self.probe.num_pairs,
            "num_words": self.words,
            "words_without_token": self.words_without_token,  # truncated, or whitespace words spaCy keeps
            "iou_threshold": self.probe.iou_threshold,
            "active_threshold": self.probe.active_threshold,
            "active_heads_only": self.probe.active_heads_only,
            "top_relations": rows,
            # Li et al. Table 2's columns, by relation
            "syntactic_grounding_accuracy_best_head": {row["relation"]: row["accuracy"] for row in rows},
            "best_head_active_share": {row["relation"]: row["active_share"] for row in rows},
            "detection_confidence_baseline": {row["relation"]: row["baseline_accuracy"] for row in rows},
            "plot": plot.name,
            "relations": result.to_dict(),
        }


__all__ = ["TOP_RELATIONS", "SyntacticGroundingAnalysis"]
