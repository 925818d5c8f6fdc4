"""The collator of question rows (VQA v2's soft scores, GQA's single answer)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import RegionTextCollator
from .rows import answer_labels


@dataclass
class QuestionAnsweringCollator(RegionTextCollator):
    """Question rows. VQA's soft scores (`labels` + `scores` lists) become `labels` (B, num_answers) float; GQA's single
    `label` becomes `labels` (B,), with -100 for answers outside the vocabulary (ignored by the loss)."""

    text_columns: tuple[str, ...] = ("question",)
    num_answers: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.num_answers, int) or self.num_answers < 1:
            raise ValueError(f"`num_answers` must be the size of the answer vocabulary (>= 1), got {self.num_answers!r}.")

    def task_tensors(self, examples, encoding, batch):
        tensors = self.grounding_tensors(examples, encoding, batch)
        if "scores" in examples[0] or "label" in examples[0]:
            tensors["labels"] = answer_labels(examples, self.num_answers, type(self).__name__)
        return tensors
