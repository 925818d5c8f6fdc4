"""`RegionFeatureStore`: the region features of a set of images, one memory-mapped Arrow file on disk, written by
every feature reader (`data/formats/`) and `extract_region_features`.

A store directory holds `region_features.arrow` (columns `image_id`, `image_size` [height, width] or null, `boxes`
(R, 4) pixels, `features` (R, D), and where the source has them `object_ids`, `object_conf`, `attr_ids`, `attr_conf`)
and `store.json` (format version, source, counts and the Arrow file's sha256). A store is written into
`<directory>.partial-<host>-<pid>` and renamed into place once complete (swapped atomically with `overwrite=True`), so
two writers of one directory (two processes filling one feature cache) both end with the complete store.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import itertools
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets.arrow_writer import ArrowWriter
from transformers.utils import logging

from ..utils.atomic_folders import derived_stem, fsync_path, recover_folder, remove_stale_siblings, replace_folder, writer_tag
from ..utils.output_paths import refuse_foreign_folder, refuse_output_overlapping_inputs
from .formats.region_records import check_store_record, normalise_record
from .formats.text_files import FileFormatError, read_json_file

logger = logging.get_logger(__name__)

STORE_FORMAT_VERSION = 1
ARROW_FILE = "region_features.arrow"
METADATA_FILE = "store.json"
PARTIAL_MARKER = ".partial-"


def store_features(feature_dim: int) -> datasets.Features:
    """The Arrow schema of a store whose features have dimension `feature_dim`."""
    return datasets.Features(
        {
            "image_id": datasets.Value("string"),
            "image_size": datasets.List(datasets.Value("int32"), length=2),
            "boxes": datasets.Array2D(shape=(None, 4), dtype="float32"),
            "features": datasets.Array2D(shape=(None, feature_dim), dtype="float32"),
            "object_ids": datasets.List(datasets.Value("int64")),
            "object_conf": datasets.List(datasets.Value("float32")),
            "attr_ids": datasets.List(datasets.Value("int64")),
            "attr_conf": datasets.List(datasets.Value("float32")),
        }
    )


class RegionFeatureStore:
    """Random access by image id into memory-mapped region features (see the module docstring for the columns).

    Open one with `RegionFeatureStore.load(directory)`; make one with `RegionFeatureStore.write(records, directory)`,
    `hf_vlalign.data.convert_features` or `hf-vlalign convert-features`. `store.dataset` is the underlying
    `datasets.Dataset` (torch format); `store[image_id]` one image's tensors; `store.batch(image_ids)` several.
    """

    def __init__(self, dataset: datasets.Dataset, directory: Path | None = None, metadata: dict | None = None):
        self.dataset = dataset.with_format("torch")
        self.directory = directory
        self.metadata = metadata or {}
        self.feature_dim = int(dataset.features["features"].shape[1])
        self._row_of = {image_id: row for row, image_id in enumerate(dataset["image_id"][:])}
        table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
        self._columns = {name: _RaggedColumn(table.column(name)) for name in _ARRAY_COLUMNS}
        if len(self._row_of) != len(dataset):
            raise ValueError(f"image ids of a region-feature store must be unique; {len(dataset) - len(self._row_of)} repeat.")

    @classmethod
    def write(
        cls,
        records: Iterable[dict],
        directory: str | Path,
        *,
        source: str = "",
        overwrite: bool = False,
        extra_metadata: dict | None = None,
    ) -> RegionFeatureStore:
        """Streams records (the `region_records` layout, each checked as the file readers check theirs, image ids
        unique) into a new store at `directory` and opens it. An existing directory is replaced only with
        `overwrite=True`, and only when it is a store (`check_store_output`). `extra_metadata`: more JSON fields of
        `store.json` (written with the store, atomically), e.g. what a cache needs to know of its images."""
        return cls._write(
            _checked_records(records), directory, source=source, overwrite=overwrite, extra_metadata=extra_metadata
        )

    @classmethod
    def _write(
        cls,
        records: Iterable[dict],
        directory: str | Path,
        *,
        source: str,
        overwrite: bool,
        extra_metadata: dict | None = None,
    ) -> RegionFeatureStore:
        """`write` of records already checked and normalised (those of `iter_checked_records`)."""
        directory = Path(directory)
        check_store_output(directory, "directory", overwrite=overwrite)
        iterator = iter(records)
        first = next(iterator, None)
        if first is None:
            raise ValueError("`records` is empty; a region-feature store needs at least one image.")
        feature_dim = first["features"].shape[1]
        remove_stale_siblings(directory, PARTIAL_MARKER)
        partial = directory.with_name(f"{derived_stem(directory.name)}{PARTIAL_MARKER}{writer_tag()}")  # <= NAME_MAX
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            count, sha256 = _write_arrow(partial / ARROW_FILE, itertools.chain([first], iterator), feature_dim)
            metadata = {
                **(extra_metadata or {}),
                "format_version": STORE_FORMAT_VERSION,
                "source": source,
                "num_images": count,
                "feature_dim": feature_dim,
                "sha256": {ARROW_FILE: sha256},
            }
            (partial / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
            _publish(partial, directory, overwrite)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return cls.load(directory, verify=False)  # just hashed while writing

    @classmethod
    def load(cls, directory: str | Path, *, verify: bool = True) -> RegionFeatureStore:
        """Opens a store written by `write` (memory-mapped), checked against its `store.json`: the row count always,
        the sha256 of the Arrow file with `verify=True` (one read of the file). A damaged store is a ValueError naming
        the store and what differs; a store without a recorded checksum opens with a warning."""
        directory = Path(directory)
        recover_folder(directory, PARTIAL_MARKER)  # a write killed mid-swap (where folders cannot be exchanged)
        arrow, metadata_file = directory / ARROW_FILE, directory / METADATA_FILE
        if not arrow.is_file() or not metadata_file.is_file():
            raise ValueError(
                f"`directory` {directory} is not a region-feature store: expected {ARROW_FILE} and {METADATA_FILE} in it "
                "(write one with `hf-vlalign convert-features`)."
            )
        metadata = _read_metadata(metadata_file)  # a dict
        if metadata.get("format_version") != STORE_FORMAT_VERSION:
            raise ValueError(
                f"{metadata_file}: store format version {metadata.get('format_version')!r} is not the supported "
                f"{STORE_FORMAT_VERSION}; convert the source features again."
            )
        expected_sha256 = (metadata.get("sha256") or {}).get(ARROW_FILE)
        if expected_sha256 is None:
            logger.warning(
                f"Region-feature store {directory}: {METADATA_FILE} records no checksum (written by an older "
                "hf_vlalign), so its Arrow file is unverified; convert it again to add one."
            )
        elif verify:
            with open(arrow, "rb") as file:
                got = hashlib.file_digest(file, "sha256").hexdigest()
            if got != expected_sha256:
                raise ValueError(
                    f"Region-feature store {directory} is damaged: the sha256 of {ARROW_FILE} is {got}, but "
                    f"{METADATA_FILE} expects {expected_sha256}; convert the source features again."
                )
        try:
            dataset = datasets.Dataset.from_file(str(arrow), in_memory=False)
        except (pa.ArrowException, OSError) as error:
            raise ValueError(
                f"Region-feature store {directory} is damaged: {ARROW_FILE} cannot be read as Arrow ({error}); "
                "convert the source features again."
            ) from None
        expected_rows = metadata.get("num_images")
        if expected_rows is not None and expected_rows != len(dataset):
            raise ValueError(
                f"Region-feature store {directory} is damaged: {METADATA_FILE} expects num_images={expected_rows}, "
                f"but {ARROW_FILE} has {len(dataset)} rows; convert the source features again."
            )
        return cls(dataset, directory=directory, metadata=metadata)

    def __len__(self) -> int:
        return len(self.dataset)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._row_of

    @property
    def image_ids(self) -> list[str]:
        return list(self._row_of)

    def row_of(self, image_id: str) -> int:
        """The store row of `image_id`; a ValueError (not a KeyError) naming it when the store lacks it."""
        try:
            return self._row_of[image_id]
        except (KeyError, TypeError):
            where = f" ({self.directory})" if self.directory else ""
            raise ValueError(f"`image_id` {image_id!r} is not in the region-feature store{where} of {len(self)} images.") from None

    def __getitem__(self, image_id: str) -> dict[str, torch.Tensor | str | None]:
        """One image: `image_id`, then tensors (`image_size` (2,), `boxes` (R, 4), `features` (R, D), ...) or None."""
        return self.image_at(self.row_of(image_id))

    def image_id_at(self, row: int) -> str:
        """The image id of store row `row`."""
        return self.dataset.data.column("image_id")[row].as_py()

    def batch(self, image_ids: Sequence[str], without: Sequence[str] = ()) -> list[dict]:
        """Several images, in the order asked (each as `store[image_id]`, less the columns named in `without`)."""
        return [self.image_at(self.row_of(image_id), without) for image_id in image_ids]

    def padded(self, image_ids: Sequence[str], name: str = "features") -> torch.Tensor:
        """Column `name` of several images in one zero-padded (B, R_max, ...) float32 tensor, copied once from the
        memory-mapped buffers (no per-image tensors); a ValueError when the store lacks the column."""
        if name not in self._columns:
            raise ValueError(f"`name` must be one of the store's columns {sorted(self._columns)}, got {name!r}.")
        views = [self._columns[name].row(self.row_of(image_id)) for image_id in image_ids]
        if any(view is None for view in views):
            raise ValueError(f"the region-feature store {self.directory} has no {name!r} for some of `image_ids`.")
        longest = max((len(view) for view in views), default=0)
        out = torch.zeros((len(views), longest, *views[0].shape[1:]) if views else (0, 0), dtype=torch.float32)
        out_numpy = out.numpy()
        for index, view in enumerate(views):
            out_numpy[index, : len(view)] = view
        return out

    def __iter__(self) -> Iterator[dict]:
        return (self.image_at(row) for row in range(len(self)))

    def image_at(self, row: int, without: Sequence[str] = ()) -> dict:
        """The image in store row `row` (the `feature_row` that `build_dataset(..., region_features=store)` adds)."""
        if not 0 <= row < len(self):
            raise ValueError(f"`row` must be in [0, {len(self)}), got {row}.")
        # read straight from the memory-mapped Arrow buffers: datasets' row formatting is ~50x slower on 2D arrays
        image = {"image_id": self.dataset.data.column("image_id")[row].as_py()}
        for name, column in self._columns.items():
            if name in without:
                continue
            values = column.row(row)
            image[name] = None if values is None else torch.from_numpy(values.copy())
        return image

    def __repr__(self) -> str:
        return f"RegionFeatureStore({len(self)} images, D={self.feature_dim}, directory={self.directory})"


_ARRAY_COLUMNS = ("image_size", "boxes", "features", "object_ids", "object_conf", "attr_ids", "attr_conf")


class _RaggedColumn:
    """Zero-copy numpy views of the rows of a list<...>, fixed_size_list<...> or list<list<...>> (datasets' Array2D)
    column of a memory-mapped Arrow table: each row is a slice of one flat value buffer."""

    def __init__(self, column):
        self.chunks, lengths = [], []
        for chunk in column.chunks:
            storage = chunk.storage if hasattr(chunk, "storage") else chunk
            values, width = storage.flatten(), None  # the values of the non-null rows, in row order
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):  # rows of equal-width inner lists
                inner_lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
                width, values = int(inner_lengths[0]) if len(inner_lengths) else 1, values.flatten()
            counts = pc.list_value_length(storage).fill_null(0).to_numpy(zero_copy_only=False) * (width or 1)
            stops = np.cumsum(counts)
            valid = storage.is_valid().to_numpy(zero_copy_only=False)
            self.chunks.append((values.to_numpy(zero_copy_only=False), stops - counts, stops, width, valid))
            lengths.append(len(storage))
        self.chunk_starts = np.cumsum([0, *lengths])

    def row(self, row: int) -> np.ndarray | None:
        chunk = int(np.searchsorted(self.chunk_starts, row, side="right")) - 1
        local = row - int(self.chunk_starts[chunk])
        values, starts, stops, width, valid = self.chunks[chunk]
        if not valid[local]:
            return None
        flat = values[starts[local] : stops[local]]
        return flat if width is None else flat.reshape(-1, width)


def _checked_records(records: Iterable[dict]) -> Iterator[dict]:
    """The records given to `RegionFeatureStore.write`, each checked, in stored form; a repeated image id (which
    `load` would refuse) raises, naming the id and both record numbers."""
    feature_dim, first_record = None, {}
    for index, record in enumerate(records):
        feature_dim = check_store_record(record, index, feature_dim)
        if (image_id := record["image_id"]) in first_record:
            raise ValueError(
                f"`records`: the image id {image_id!r} of record {index + 1} repeats record "
                f"{first_record[image_id] + 1} (counting from 1): image ids of a region-feature store must be unique."
            )
        first_record[image_id] = index
        yield normalise_record(record)


def _write_arrow(path: Path, records: Iterable[dict], feature_dim: int) -> tuple[int, str]:
    """Writes the records to `path`; returns their count and the sha256 of the bytes written (hashed on the way)."""
    count = 0
    with open(path, "wb") as file:
        hashing = _HashingFile(file)
        writer = ArrowWriter(features=store_features(feature_dim), stream=pa.PythonFile(hashing, mode="w"), writer_batch_size=256)
        try:
            for record in records:
                writer.write(_arrow_row(record))
                count += 1
            writer.finalize()
        finally:
            writer.close()
    return count, hashing.sha256.hexdigest()


def _publish(partial: Path, directory: Path, overwrite: bool) -> None:
    """Puts the complete store `partial` at `directory`. Without `overwrite` the rename is atomic and fails when
    another writer's store got there first: that one is kept when it holds the same bytes, else refused."""
    if overwrite:
        check_store_output(directory, "directory", overwrite=True)  # another writer may have put a folder there
        replace_folder(partial, directory)  # the old store stays in place until the new one is (atomic swap)
        return
    fsync_path(partial)
    try:
        os.rename(partial, directory)
    except OSError:
        if _checksums(directory) != _checksums(partial):
            check_store_output(directory, "directory", overwrite=False)
            raise
        shutil.rmtree(partial)
    fsync_path(directory.parent)


def _checksums(directory: Path) -> dict | None:
    try:
        return json.loads((directory / METADATA_FILE).read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None


class _HashingFile(io.RawIOBase):
    """A binary file wrapper that hashes what is written through it (so the checksum costs no second read); closing
    it leaves the real file to the caller."""

    def __init__(self, file):
        self.file = file
        self.sha256 = hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()

    def writable(self) -> bool:
        return True


def _read_metadata(metadata_file: Path) -> dict:
    """`store.json` as a dict; a ValueError naming the file (and line) when it is not UTF-8 JSON or its fields have
    the wrong types."""
    try:
        metadata = read_json_file(metadata_file)
    except FileFormatError as error:
        raise FileFormatError(f"{error} The store is damaged, convert it again.") from None
    if not isinstance(metadata, dict):
        raise FileFormatError(
            f"{metadata_file}: expected a JSON object, got {type(metadata).__name__}; the store is damaged, convert it again."
        )
    sha256 = metadata.get("sha256") or {}
    if not isinstance(sha256, dict) or not all(isinstance(v, str) for v in sha256.values()):
        raise FileFormatError(f"{metadata_file}: field 'sha256' must map file names to hex digests, got {sha256!r}.")
    num_images = metadata.get("num_images")
    if num_images is not None and (type(num_images) is not int or num_images < 0):
        raise FileFormatError(f"{metadata_file}: field 'num_images' must be a non-negative int, got {num_images!r}.")
    return metadata


def is_feature_store(directory: Path) -> bool:
    """Whether `directory` holds a store as `RegionFeatureStore.write` leaves it: its `store.json` (a JSON object with
    the format version) and Arrow file, and nothing else."""
    names = {entry.name for entry in directory.iterdir()}
    if not names <= {ARROW_FILE, METADATA_FILE} or METADATA_FILE not in names:
        return False
    try:
        metadata = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(metadata, dict) and "format_version" in metadata


def check_store_output(directory: str | Path, argument: str, *, overwrite: bool) -> None:
    """An existing `directory` is refused without `overwrite`, and with it unless it is a store (`is_feature_store`):
    a folder holding anything else (images, a checkpoint, a published feature file) is never replaced."""
    directory = Path(directory)
    if not os.path.lexists(directory):
        return
    if not overwrite:
        raise ValueError(f"`{argument}` {directory} already exists; pass overwrite=True (--overwrite) to replace it.")
    refuse_foreign_folder(directory, argument, description="a region-feature store", is_own=is_feature_store)


def _arrow_row(record: dict) -> dict:
    return {name: value.tolist() if isinstance(value, np.ndarray) and value.ndim == 1 else value for name, value in record.items()}


# each the module of `data/formats/` with its `iter_<format>_records(path, *, on_error, **options)`
FEATURE_FORMATS = ("lxmert_tsv", "butd_tsv", "butd_h5", "m2_hdf5", "npz_dir", "vlbert_json")


def iter_feature_records(src: str | Path, format: str, *, on_error: str = "raise", **options) -> Iterator[dict]:
    """The records of a published feature file (or folder) in `format` (one of `FEATURE_FORMATS`), streamed."""
    if format not in FEATURE_FORMATS:
        raise ValueError(f"`format` must be one of {sorted(FEATURE_FORMATS)}, got {format!r}.")
    module = importlib.import_module(f"{__package__}.formats.{format}")
    return getattr(module, f"iter_{format}_records")(src, on_error=on_error, **options)


def convert_features(
    src: str | Path, format: str, out: str | Path, *, on_error: str = "raise", overwrite: bool = False, **options
) -> RegionFeatureStore:
    """Converts a published feature file into a `RegionFeatureStore` at `out` (what `hf-vlalign convert-features` runs).

    `options` go to the format's reader (e.g. `id_map=` for `butd_h5`, `image_sizes=` for `m2_hdf5`). `out` may be
    neither `src` nor any file option, nor inside or around one; an existing `out` is replaced only with `overwrite=True`
    and only when it is a store (`check_store_output`).
    """
    out = Path(out)
    # checked before reading a possibly huge source: the output never replaces an input, nor a folder of other files
    refuse_output_overlapping_inputs(
        out, {"src": src} | {name: value for name, value in options.items() if isinstance(value, (str, os.PathLike))},
        output_argument="out",
    )
    check_store_output(out, "out", overwrite=overwrite)
    records = iter_feature_records(src, format, on_error=on_error, **options)
    return RegionFeatureStore._write(records, out, source=f"{format}:{Path(src).resolve()}", overwrite=overwrite)
