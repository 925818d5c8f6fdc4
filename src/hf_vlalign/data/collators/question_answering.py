"""The collator of question rows (VQA v2's soft scores, GQA's single answer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RegionTextCollator
from .rows import _checked_answer, check_answer_columns


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
        for index, example in enumerate(examples):
            check_answer_columns(index, example, examples[0], type(self).__name__)
        if "scores" in examples[0]:
            targets = torch.zeros(len(examples), self.num_answers)
            for i, example in enumerate(examples):
                for label, score in zip(example["labels"], example["scores"]):
                    targets[i, _checked_answer(label, self.num_answers)] = score
            tensors["labels"] = targets
        elif "label" in examples[0]:
            tensors["labels"] = torch.tensor(
                [_checked_answer(e["label"], self.num_answers) if e["label"] >= 0 else -100 for e in examples]
            )
        return tensors
