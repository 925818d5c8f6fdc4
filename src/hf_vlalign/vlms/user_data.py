"""One's own images and texts for transformers patch models: a user-format file (docs/own_data.md) of the `caption` task
(a caption and its phrases with pixel boxes) or of the `refcoco` task (an expression and the box it refers to) read
into the grounded-caption examples of `PatchGroundingCollator`. The file is read and checked by the library's user-data
reader (`hf_vlalign.data.builders.user_data`); a patch model reads the images themselves, so no region features are
made. A referring expression is one phrase spanning the whole text, grounded in its box (the reader's own layout).
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets

from ..data.builders.user_data import build_user_dataset, read_user_rows

__all__ = ["PATCH_USER_TASKS", "user_file_examples", "user_splits"]

# the user-data tasks a patch model reads, and the text column of each (its phrases are `<text>_phrase_spans` / `_boxes`)
PATCH_USER_TASKS = {"caption": "caption", "refcoco": "expression"}


def _user_rows(data_file: str | os.PathLike, task: str, argument: str) -> tuple[datasets.Dataset, dict[str, str]]:
    """(the file's rows as the user-data builder reads them, {image_id: image path})."""
    if task not in PATCH_USER_TASKS:
        raise ValueError(f"`{argument}` task must be one of {tuple(PATCH_USER_TASKS)}, got {task!r}.")
    paths = {row.images["image"].stem: str(row.images["image"]) for row in read_user_rows(data_file, task)}
    return build_user_dataset(data_file, task), paths


def _examples(rows: datasets.Dataset, paths: dict[str, str], task: str) -> list[dict]:
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


def _counts(examples: list[dict]) -> dict[str, int]:
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
    rows, paths = _user_rows(data_file, task, argument)
    examples = _examples(rows, paths, task)
    return examples, _counts(examples)


def user_splits(
    train_file: str | os.PathLike, validation_file: str | os.PathLike | None, task: str, seed: int
) -> tuple[list[dict], list[dict], dict, str]:
    """(training examples, evaluation examples, their counts, a description) of `--train_file` and
    `--validation_file`; without a validation file, the rows of a seeded share of the training file's images are held
    out for evaluation, as the region examples do (`hf_vlalign.recipes.user_data.held_out_split`)."""
    from ..recipes.user_data import HELD_OUT_FRACTION, MIN_EVAL_IMAGES, held_out_split

    rows, paths = _user_rows(train_file, task, "--train_file")
    train_name = Path(train_file).name
    if validation_file is None:
        train_rows, eval_rows = held_out_split(rows, seed, str(train_file))
        eval_paths = paths
        source = (
            f"user data: {train_name} ({len(rows)} rows; the {len(eval_rows)} rows of a seeded {HELD_OUT_FRACTION:.0%} "
            f"of its images, at least {MIN_EVAL_IMAGES}, held out for evaluation)"
        )
    else:
        eval_rows, eval_paths = _user_rows(validation_file, task, "--validation_file")
        shown = len(set(eval_rows["image_id"]))
        if shown < MIN_EVAL_IMAGES:
            raise ValueError(
                f"`--validation_file` {validation_file} shows {shown} image: the evaluation needs rows of at least "
                f"{MIN_EVAL_IMAGES} images (its own-image vs shuffled-image check swaps them)."
            )
        train_rows = rows
        source = f"user data: {train_name} ({len(rows)} rows), {Path(validation_file).name} ({len(eval_rows)} rows)"
    train, evaluation = _examples(train_rows, paths, task), _examples(eval_rows, eval_paths, task)
    return train, evaluation, {"train": _counts(train), "eval": _counts(evaluation)}, source
