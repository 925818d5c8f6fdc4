"""One's own images and texts for transformers patch models: a user-format file (docs/own_data.md) of the `caption` task
(a caption and its phrases with pixel boxes) or of the `refcoco` task (an expression and the box it refers to) read
into the grounded-caption examples of `PatchGroundingCollator`. The file is read and checked by the library's user-data
reader (`hf_vlalign.data.builders.user_data`); a patch model reads the images themselves, so no region features are
made. A referring expression is one phrase spanning the whole text, grounded in its box (the reader's own layout).
"""

from __future__ import annotations

import os

import datasets

from ..data.builders.user_data import build_user_dataset, read_user_rows

__all__ = ["PATCH_USER_TASKS", "example_counts", "grounded_examples", "user_file_examples", "user_file_rows"]

# the user-data tasks a patch model reads, and the text column of each (its phrases are `<text>_phrase_spans` / `_boxes`)
PATCH_USER_TASKS = {"caption": "caption", "refcoco": "expression"}


def user_file_rows(data_file: str | os.PathLike, task: str, argument: str) -> tuple[datasets.Dataset, dict[str, str]]:
    """(the rows of a user-format file of `task` as the user-data builder reads them, {image_id: image path});
    `argument` names the file in the refusal of another task."""
    if task not in PATCH_USER_TASKS:
        raise ValueError(f"`{argument}` task must be one of {tuple(PATCH_USER_TASKS)}, got {task!r}.")
    paths = {row.images["image"].stem: str(row.images["image"]) for row in read_user_rows(data_file, task)}
    return build_user_dataset(data_file, task), paths


def grounded_examples(rows: datasets.Dataset, paths: dict[str, str], task: str) -> list[dict]:
    """The grounded-caption examples of `user_file_rows`' rows and images, in order."""
    text = PATCH_USER_TASKS[task]
    examples = []
    for row in rows:
        phrases = [
            {"char_start": start, "char_end": end, "boxes": boxes}
            for (start, end), boxes in zip(row[f"{text}_phrase_spans"], row[f"{text}_phrase_boxes"])
        ]
        examples.append(
            {"image_id": row["image_id"], "image_path": paths[row["image_id"]], "caption": row[text], "phrases": phrases}
        )
    return examples


def example_counts(examples: list[dict]) -> dict[str, int]:
    """The counts `grounded_caption_examples` gives (a user file's phrases all have boxes)."""
    return {
        "images": len({example["image_path"] for example in examples}),
        "captions": len(examples),
        "phrases": sum(len(example["phrases"]) for example in examples),
        "phrases_without_box": 0,
    }


def user_file_examples(
    data_file: str | os.PathLike, task: str = "caption", argument: str = "--data_file"
) -> tuple[list[dict], dict[str, int]]:
    """(grounded-caption examples, counts) of a user-format file of `task` ("caption" or "refcoco"), in its order."""
    rows, paths = user_file_rows(data_file, task, argument)
    examples = grounded_examples(rows, paths, task)
    return examples, example_counts(examples)
