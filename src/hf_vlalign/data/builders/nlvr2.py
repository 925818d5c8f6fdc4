"""NLVR2 (Suhr, Zhou et al., 2019): is a sentence true of a pair of photographs? One row per (sentence, image pair).

`data_dir` is `nlvr2/data` (JSON lines `{train,dev,test1,test2}.json`; `subset=` reads
`balanced/balanced_{dev,test1}.json` or `unbalanced/unbalanced_{dev,test1}.json`). Image ids follow the NLVR2 README's
naming (also LXMERT's feature ids); `attach_pair_features` joins both images of an example to a store.
"""

from __future__ import annotations

import logging
from pathlib import Path

import datasets

from ..feature_store import RegionFeatureStore
from ..formats.text_files import FileFormatError, parse_json, read_text
from ._common import (
    IMAGE_SIZE,
    UniqueIds,
    check_on_missing_image,
    check_split,
    missing_image_error,
    report_missing_images,
    require_file,
)

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test1", "test2")
SUBSETS = ("balanced", "unbalanced")
SUBSET_SPLITS = ("dev", "test1")
LABELS = {"False": 0, "True": 1}

FEATURES = datasets.Features(
    {
        "identifier": datasets.Value("string"),
        "sentence": datasets.Value("string"),
        "label": datasets.Value("int32"),  # 1 for "True", 0 for "False" (LXMERT's convention)
        "left_image_id": datasets.Value("string"),  # "<split>-<set_id>-<pair_id>-img0"
        "right_image_id": datasets.Value("string"),  # "<split>-<set_id>-<pair_id>-img1"
        "image_id": datasets.Value("string"),  # = `left_image_id`, the library-wide join column
        "image_size": IMAGE_SIZE,  # None: NLVR2 does not publish image sizes
        "synset": datasets.Value("string"),  # this and the rest as published
        "query": datasets.Value("string"),
        "left_url": datasets.Value("string"),
        "right_url": datasets.Value("string"),
    }
)


def build(data_dir: str | Path, split: str, *, subset: str | None = None) -> datasets.Dataset:
    """One NLVR2 file as rows (`FEATURES`).

    Args:
        data_dir: the `nlvr2/data` folder of the lil-lab/nlvr repository.
        subset: None for the full split, or "balanced" / "unbalanced" (dev and test1 only) for the subset files
            `data_dir/<subset>/<subset>_<split>.json`.
    """
    path = split_file(data_dir, split, subset)
    rows, identifiers = [], UniqueIds(str(path), "identifier")
    for line_number, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        record = parse_json(line, path, record=f"line {line_number}")
        try:
            rows.append(parse_example(record))
        except ValueError as error:
            raise FileFormatError(f"{path}, line {line_number}: {error}") from None
        identifiers.add(rows[-1]["identifier"], f"line {line_number}")
    if not rows:
        raise ValueError(f"{path}: no NLVR2 example in the file.")
    return datasets.Dataset.from_list(rows, features=FEATURES)


def split_file(data_dir: str | Path, split: str, subset: str | None = None) -> Path:
    """The published file of a split, `data_dir/<split>.json`, or of its balanced / unbalanced subset,
    `data_dir/<subset>/<subset>_<split>.json` (lil-lab/nlvr's `nlvr2/data` layout)."""
    check_split(split, SPLITS, "NLVR2")
    if data_dir is None:
        raise ValueError("`data_dir` must be the nlvr2/data folder of lil-lab/nlvr, got None.")
    data_dir = Path(data_dir)
    if subset is None:
        return require_file(data_dir / f"{split}.json", "data_dir", f"a folder holding the NLVR2 file {split}.json")
    if subset not in SUBSETS:
        raise ValueError(f"`subset` must be None or one of {list(SUBSETS)}, got {subset!r}.")
    if split not in SUBSET_SPLITS:
        raise ValueError(
            f"`subset` {subset!r} exists only for the splits {list(SUBSET_SPLITS)} "
            f"({', '.join(subset_file_name(subset, name) for name in SUBSET_SPLITS)}), got split {split!r}."
        )
    name = subset_file_name(subset, split)
    return require_file(data_dir / name, "data_dir", f"the nlvr2/data folder holding the NLVR2 subset file {name}")


def subset_file_name(subset: str, split: str) -> str:
    """Where lil-lab/nlvr publishes a subset of a split, relative to `nlvr2/data`: "<subset>/<subset>_<split>.json"."""
    return f"{subset}/{subset}_{split}.json"


def parse_example(record: object) -> dict:
    """One parsed JSON line of an NLVR2 file -> one row."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}.")
    missing = [key for key in ("identifier", "sentence", "label") if key not in record]
    if missing:
        raise ValueError(f"the example lacks the field(s) {missing}.")
    label = record["label"]
    if label not in LABELS:
        raise ValueError(f"`label` must be one of {list(LABELS)}, got {label!r}.")
    left_image_id, right_image_id = pair_image_ids(record["identifier"])
    return {
        "identifier": record["identifier"],
        "sentence": record["sentence"],
        "label": LABELS[label],
        "left_image_id": left_image_id,
        "right_image_id": right_image_id,
        "image_id": left_image_id,
        "image_size": None,
        "synset": record.get("synset"),
        "query": record.get("query"),
        "left_url": record.get("left_url"),
        "right_url": record.get("right_url"),
    }


def pair_image_ids(identifier: str) -> tuple[str, str]:
    """The (left, right) image ids of an example (nlvr2/README.md of lil-lab/nlvr): "dev-850-0-0" ->
    ("dev-850-0-img0", "dev-850-0-img1")."""
    parts = identifier.split("-") if isinstance(identifier, str) else []
    if len(parts) < 4 or not all(part.isdigit() for part in parts[-3:]):
        raise ValueError(f"`identifier` must look like 'split-set_id-pair_id-sentence_id', got {identifier!r}.")
    pair = "-".join(parts[:-1])
    return f"{pair}-img0", f"{pair}-img1"


def attach_pair_features(
    dataset: datasets.Dataset, store: RegionFeatureStore, on_missing_image: str = "raise"
) -> datasets.Dataset:
    """Adds `left_feature_row` and `right_feature_row`, the store rows of an example's two images (`store` keyed by
    "<split>-<set>-<pair>-img0/1"). `on_missing_image`: "raise" stops at the first example with an image missing from
    the store, "skip" drops such examples with a warning; the count is kept in `dataset.info.description`."""
    check_on_missing_image(on_missing_image)
    where = f"the region-feature store {store.directory} ({len(store)} images)"
    left_rows, right_rows, kept = [], [], []
    for index, (left, right) in enumerate(zip(dataset["left_image_id"][:], dataset["right_image_id"][:])):
        missing = [image_id for image_id in (left, right) if image_id not in store]
        if missing and on_missing_image == "raise":
            raise missing_image_error("NLVR2", f"row {index}", missing[0], where, unit="examples")
        if not missing:
            kept.append(index)
            left_rows.append(store.row_of(left))
            right_rows.append(store.row_of(right))
    dropped = len(dataset) - len(kept)
    report_missing_images("NLVR2", dropped, len(dataset), "examples", where)
    if dropped:
        dataset = dataset.select(kept)
    if not len(dataset):
        raise ValueError(f"no NLVR2 example has both images in the region-feature store {store.directory}.")
    dataset = dataset.add_column("left_feature_row", left_rows)
    dataset = dataset.add_column("right_feature_row", right_rows)
    dataset.info.description = f"{dropped} row(s) dropped: image not in the region-feature store"
    return dataset
