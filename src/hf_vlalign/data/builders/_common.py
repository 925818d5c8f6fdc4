"""What every dataset builder shares: the grounding columns (docs/datasets.md), file checks, the `on_missing_image`
policy and the join to a `RegionFeatureStore`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import datasets
import torch

from ...alignment.boxes import alignment_target
from ..feature_store import RegionFeatureStore
from ..formats.text_files import FileFormatError, read_json_file

logger = logging.getLogger(__name__)

SPANS = datasets.List(datasets.List(datasets.Value("int32"), length=2))
BOXES = datasets.List(datasets.List(datasets.List(datasets.Value("float32"), length=4)))
IMAGE_SIZE = datasets.List(datasets.Value("int32"), length=2)
REGION_TARGETS = datasets.List(datasets.List(datasets.Value("float32")))
MISSING_IMAGE_CHOICES = ("raise", "skip")
ROWS_PER_ARROW_BATCH = 10_000  # rows held as Python dicts at once by `dataset_from_rows`
DEFAULT_ON_MISSING_IMAGE = "raise"
# each dataset's validation split in its own names (`split="validation"`, the name `datasets` and the Hub use)
VALIDATION_SPLITS = {
    "flickr30k_entities": "val",
    "vgp": "val",
    "gqa": "val",
    "visual_genome": "val",
    "vqa_v2": "val",
    "nlvr2": "dev",
    "refcoco+": "val",
    "coco_captions": "val",
    "lxmert_pretraining": "val",
    "synthetic_scenes": "val",
}


def resolve_split(name: str, split: str) -> str:
    """`split` in the dataset's own names: "validation" is `name`'s validation split, others are returned as they are."""
    return VALIDATION_SPLITS.get(name, split) if split == "validation" else split


def grounding_features(*text_columns: str) -> dict[str, datasets.List]:
    """The `<text>_phrase_spans` / `<text>_phrase_boxes` features of each grounded text column."""
    kinds = (("spans", SPANS), ("boxes", BOXES))
    return {f"{text}_phrase_{kind}": feature for text in text_columns for kind, feature in kinds}


def dataset_from_rows(
    rows: Iterable[dict], features: datasets.Features, batch_size: int = ROWS_PER_ARROW_BATCH
) -> datasets.Dataset:
    """`datasets.Dataset.from_list` of `rows`, `batch_size` rows at a time: only one batch is alive as Python dicts."""
    parts, batch = [], []
    for row in rows:
        batch.append(row)
        if len(batch) == batch_size:
            parts.append(datasets.Dataset.from_list(batch, features=features))
            batch = []
    if batch:
        parts.append(datasets.Dataset.from_list(batch, features=features))
    if not parts:
        return datasets.Dataset.from_dict({name: [] for name in features}, features=features)
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def resolve_path(data_dir: Path | None, path: str | Path) -> Path:
    """`path`, read from `data_dir` when it is relative."""
    path = Path(path)
    return data_dir / path if data_dir is not None and not path.is_absolute() else path


def xywh_to_xyxy(box: Sequence[float]) -> list[float]:
    """COCO / Visual Genome / GQA `[x, y, w, h]` (pixels) -> `[x1, y1, x2, y2]` (pixels)."""
    x, y, w, h = (float(v) for v in box)
    return [x, y, x + w, y + h]


def require_file(path: str | Path, argument: str, what: str) -> Path:
    """`path` as a Path; a ValueError naming the argument and what was expected when it is not a file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"`{argument}` must point to {what}, but {str(path)!r} is not a file.")
    return path


def read_json(path: str | Path, argument: str, what: str, kind: type[dict] | type[list] | None = None) -> object:
    """The JSON value of `path` (of `kind` when given); a ValueError naming `argument`, the file and the line for a file
    that is missing or not readable as JSON, or whose value is not of `kind`."""
    path = require_file(path, argument, what)
    try:
        content = read_json_file(path)
    except FileFormatError as error:
        raise FileFormatError(f"`{argument}` {error} Expected {what}.") from None
    if kind is not None and not isinstance(content, kind):
        json_kind = "object" if kind is dict else "list"
        raise ValueError(f"`{argument}` {path}: expected a JSON {json_kind} ({what}), got {type(content).__name__}.")
    return content


def check_keys(record: object, types: dict[str, type], where: str) -> None:
    """`record` is a dict with each key of `types`, of that type (bools are not ints); else a ValueError naming `where`."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a dict, got {type(record).__name__}.")
    for key, kind in types.items():
        if key not in record:
            raise ValueError(f"{where}: missing the field {key!r} (has {sorted(record)}).")
        value = record[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{where}: field {key!r} must be a {kind.__name__}, got {value!r}.")


class UniqueIds:
    """Where each id of a file was first read; `add` refuses an id read twice, naming the file, the id and both places."""

    def __init__(self, source: str, what: str) -> None:
        self.source, self.what, self.first = source, what, {}

    def add(self, key: object, where: str) -> None:
        if key in self.first:
            raise ValueError(
                f"{self.source}: {self.what} {key!r} appears twice, at {self.first[key]} and at {where}; ids must be "
                "unique (which copy to use is ambiguous), remove or renumber one."
            )
        self.first[key] = where


def check_image_id_template(template: str | None, example: str, **fields) -> None:
    """A ValueError naming `image_id_template` unless it is None or a `str.format` template of `fields` alone."""
    if template is None:
        return
    try:
        template.format(**fields)
    except (AttributeError, KeyError, IndexError, ValueError) as error:
        raise ValueError(
            f"`image_id_template` may only use the fields {', '.join(f'{{{name}}}' for name in fields)}, e.g. "
            f"{example!r}, got {template!r} ({error!r})."
        ) from None


def check_split(split: str, splits: Sequence[str], dataset: str) -> None:
    if split not in splits:
        raise ValueError(f"`split` of {dataset} must be one of {list(splits)}, got {split!r}.")


def check_on_missing_image(on_missing_image: str) -> None:
    """A ValueError naming `on_missing_image` unless it is one of `MISSING_IMAGE_CHOICES`."""
    if not isinstance(on_missing_image, str) or on_missing_image not in MISSING_IMAGE_CHOICES:
        raise ValueError(f"`on_missing_image` must be one of {MISSING_IMAGE_CHOICES}, got {on_missing_image!r}.")


def missing_image_error(
    source: str, item: str, image_id: object, where: str, unit: str = "rows", tried: Sequence[str] | None = None
) -> ValueError:
    """The error of `on_missing_image="raise"`: the dataset, the row, its image (and the ids `tried`) and where."""
    image = f"image {image_id!r}" + (f" (tried {list(tried)})" if tried is not None else "")
    return ValueError(
        f"{source}: {item}: {image} is not in {where}; pass on_missing_image='skip' to drop such {unit} "
        "(they are counted in a warning)."
    )


def report_missing_images(source: str, skipped: int, total: int, unit: str, where: str) -> None:
    """The one warning every builder gives for what `on_missing_image="skip"` dropped (nothing when `skipped` is 0)."""
    if skipped:
        logger.warning(
            "%s: %d of %d %s skipped (on_missing_image='skip'): image not in %s.", source, skipped, total, unit, where
        )


def attach_region_features(
    dataset: datasets.Dataset,
    store: RegionFeatureStore,
    *,
    store_image_ids: Callable[[dict], Sequence[str]] | None = None,
    id_columns: Sequence[str] = ("image_id",),
    iou_threshold: float = 0.5,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
    source: str = "attach_region_features",
) -> datasets.Dataset:
    """Joins every row to its image's regions in `store`: adds `feature_row` and `<text>_phrase_regions`.

    Args:
        store_image_ids: candidate store ids of a row, tried in order (default: the row's `image_id`), read from
            `id_columns`; builders whose ids differ from the feature files' (VQA's integer COCO ids) pass their own.
        iou_threshold: IoU at which a detected region counts as showing a phrase's gold box.
        on_missing_image: "raise" or "skip"; the count skipped is kept in `dataset.info.description`.
        source: the dataset named in the error and the warning.
    """
    if not isinstance(store, RegionFeatureStore):
        raise ValueError(f"`store` must be a RegionFeatureStore (RegionFeatureStore.load(dir)), got {type(store).__name__}.")
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"`iou_threshold` must be in (0, 1], got {iou_threshold}.")
    check_on_missing_image(on_missing_image)
    candidates_of = store_image_ids or (lambda row: [row["image_id"]])
    rows_in_store = []
    for index, row in enumerate(dataset.select_columns(list(dict.fromkeys(["image_id", *id_columns])))):
        found = next((store.row_of(c) for c in candidates_of(row) if c in store), None)
        if found is None and on_missing_image == "raise":
            where = f"the region-feature store {store.directory} of {len(store)} images"
            raise missing_image_error(source, f"row {index}", row["image_id"], where, tried=candidates_of(row))
        rows_in_store.append(found)
    missing = sum(found is None for found in rows_in_store)
    if missing:
        report_missing_images(source, missing, len(dataset), "rows", f"the region-feature store {store.directory}")
        dataset = dataset.select([i for i, found in enumerate(rows_in_store) if found is not None])
        rows_in_store = [found for found in rows_in_store if found is not None]
    if not len(dataset):
        raise ValueError(f"no row of the dataset has its image in the region-feature store {store.directory}.")
    dataset = dataset.add_column("feature_row", rows_in_store)
    for column in [name for name in dataset.column_names if name.endswith("_phrase_boxes")]:
        targets = [_phrase_region_targets(boxes, store, row, iou_threshold) for boxes, row in zip(dataset[column], rows_in_store)]
        dataset = dataset.add_column(column.replace("_phrase_boxes", "_phrase_regions"), targets, feature=REGION_TARGETS)
    dataset.info.description = f"{missing} row(s) dropped: image not in the region-feature store"
    return dataset


def _phrase_region_targets(phrase_boxes: list, store: RegionFeatureStore, row: int, threshold: float) -> list[list[float]]:
    regions = store.image_at(row)["boxes"]
    mask = torch.ones(len(regions), dtype=torch.long)
    targets = []
    for gold in phrase_boxes:
        gold = torch.tensor(gold, dtype=torch.float32).reshape(-1, 4)
        targets.append(alignment_target(gold, regions, mask, threshold).tolist() if len(gold) else [0.0] * len(regions))
    return targets
