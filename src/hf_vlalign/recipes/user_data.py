"""The examples on one's own images and texts: `--train_file` / `--validation_file` in the user-data format
(`hf_vlalign.data.builders.user_data`) read into the rows of the example's task, with the same evaluation rule in every
example when no validation file is given (`HELD_OUT_FRACTION`)."""

from __future__ import annotations

import logging
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from transformers import TrainingArguments

from ..data.builders.user_data import DEFAULT_REGION_OPTIONS, load_user_data
from ..data.feature_store import RegionFeatureStore
from ..vlms.user_data import example_counts, grounded_examples, user_file_rows
from .arguments import UserDataArguments

logger = logging.getLogger(__name__)

# without `--validation_file`: this fraction of the training file's images (at least `MIN_EVAL_IMAGES`), with all
# their rows, is held out for evaluation, drawn with `--seed`; images, not rows, so no evaluation image is seen in
# training
HELD_OUT_FRACTION = 0.1
# the evaluation's own-image vs shuffled-image check (`image_use` in eval_results.json) swaps images between rows
MIN_EVAL_IMAGES = 2


@dataclass
class UserSplits:
    """The training and evaluation rows of a user's files joined to their region features; `source` names the data,
    `region_options` made the features (saved with the model); `answer_vocab` is set for the `vqa` task."""

    train: datasets.Dataset
    eval: datasets.Dataset
    store: RegionFeatureStore
    region_options: dict[str, Any]
    source: str
    answer_vocab: dict[str, int] | None = None


def held_out_split(dataset: datasets.Dataset, seed: int, file: str) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(training rows, evaluation rows): the rows of a seeded `HELD_OUT_FRACTION` of the images (at least
    `MIN_EVAL_IMAGES`; of an image pair, its left image) go to evaluation, the others' to training."""
    images = sorted(set(dataset["image_id"]))
    if len(images) <= MIN_EVAL_IMAGES:
        raise ValueError(
            f"`--train_file` {file} shows {len(images)} image(s): without `--validation_file` the rows of a seeded "
            f"{HELD_OUT_FRACTION:.0%} of its images (at least {MIN_EVAL_IMAGES}) are held out for evaluation, which "
            f"needs at least {MIN_EVAL_IMAGES + 1} images; pass `--validation_file` or add images."
        )
    count = max(MIN_EVAL_IMAGES, math.floor(len(images) * HELD_OUT_FRACTION))
    held_out = set(random.Random(seed).sample(images, count))
    in_eval = [image_id in held_out for image_id in dataset["image_id"]]
    train = dataset.select([index for index, held in enumerate(in_eval) if not held])
    evaluation = dataset.select([index for index, held in enumerate(in_eval) if held])
    return train, evaluation


def load_user_splits(args: UserDataArguments, task: str, training_args: TrainingArguments) -> UserSplits:
    """`--train_file` and `--validation_file` of `task` joined to their images' region features, extracted once by
    the main process first (the others then read the cached store). Without `--validation_file`, the evaluation rows
    are held out of the training file (`held_out_split`), as the log and `source` say."""
    # the whole image, then a `--grid_size` grid (a file that gives `regions` keeps only the `--region_encoder`)
    options = {**DEFAULT_REGION_OPTIONS, "grid_size": args.grid_size, "encoder": args.region_encoder}
    with training_args.main_process_first(desc="extracting the region features of the data's images"):
        data = load_user_data(args.train_file, task, args.validation_file, region_options=options)
    train_name = Path(args.train_file).name
    if data.validation is not None:
        train, evaluation = data.train, data.validation
        shown = len(set(evaluation["image_id"]))
        if shown < MIN_EVAL_IMAGES:
            raise ValueError(
                f"`--validation_file` {args.validation_file} shows {shown} image: the evaluation needs rows of at "
                f"least {MIN_EVAL_IMAGES} images (its own-image vs shuffled-image check swaps them)."
            )
        validation_name = Path(args.validation_file).name
        source = f"user data: {train_name} ({len(train)} rows), {validation_name} ({len(evaluation)} rows)"
    else:
        train, evaluation = held_out_split(data.train, training_args.seed, args.train_file)
        source = (
            f"user data: {train_name} ({len(data.train)} rows; the {len(evaluation)} rows of a seeded "
            f"{HELD_OUT_FRACTION:.0%} of its images, at least {MIN_EVAL_IMAGES}, held out for evaluation)"
        )
    (logger.info if data.validation is not None else logger.warning)("Training on %s.", source)
    return UserSplits(train, evaluation, data.store, data.region_options, source, data.answer_vocab)


def patch_user_splits(
    train_file: str | os.PathLike, validation_file: str | os.PathLike | None, task: str, seed: int
) -> tuple[list[dict], list[dict], dict, str]:
    """(training examples, evaluation examples, their counts, a description) of `--train_file` and
    `--validation_file`; without a validation file, the rows of a seeded share of the training file's images are held
    out for evaluation, as the region examples' are (`held_out_split`); the rows are grounded captions of a patch model
    (`hf_vlalign.vlms.user_data`), of the `caption` or the `refcoco` task."""
    rows, paths = user_file_rows(train_file, task, "--train_file")
    train_name = Path(train_file).name
    if validation_file is None:
        train_rows, eval_rows = held_out_split(rows, seed, str(train_file))
        eval_paths = paths
        source = (
            f"user data: {train_name} ({len(rows)} rows; the {len(eval_rows)} rows of a seeded {HELD_OUT_FRACTION:.0%} "
            f"of its images, at least {MIN_EVAL_IMAGES}, held out for evaluation)"
        )
    else:
        eval_rows, eval_paths = user_file_rows(validation_file, task, "--validation_file")
        shown = len(set(eval_rows["image_id"]))
        if shown < MIN_EVAL_IMAGES:
            raise ValueError(
                f"`--validation_file` {validation_file} shows {shown} image: the evaluation needs rows of at least "
                f"{MIN_EVAL_IMAGES} images (its own-image vs shuffled-image check swaps them)."
            )
        train_rows = rows
        source = f"user data: {train_name} ({len(rows)} rows), {Path(validation_file).name} ({len(eval_rows)} rows)"
    train, evaluation = grounded_examples(train_rows, paths, task), grounded_examples(eval_rows, eval_paths, task)
    return train, evaluation, {"train": example_counts(train), "eval": example_counts(evaluation)}, source


def rename_text_columns(dataset: datasets.Dataset, old: str, new: str) -> datasets.Dataset:
    """`old`, `old_phrase_spans`, `old_phrase_boxes` and `old_phrase_regions` renamed to `new...`: the user format's
    `caption` rows for a collator that reads `sentence`."""
    suffixes = ("", "_phrase_spans", "_phrase_boxes", "_phrase_regions")
    names = {old + suffix: new + suffix for suffix in suffixes if old + suffix in dataset.column_names}
    return dataset.rename_columns(names)


__all__ = [
    "HELD_OUT_FRACTION",
    "MIN_EVAL_IMAGES",
    "UserSplits",
    "held_out_split",
    "load_user_splits",
    "patch_user_splits",
    "rename_text_columns",
]
