"""Malformed files: every reader and builder refuses a damaged file with a ValueError naming the file and the line (or
the record: a feature file's image, an XML element, a pickle), never a UnicodeDecodeError, RecursionError, csv
swallowing the rest of the file, or a half-loaded model.

The damaged files are written byte by byte here; the restricted unpickler's bombs run in a subprocess under an
address-space limit and a timeout, so a reader that expanded them would fail the test instead of the machine.
"""

from __future__ import annotations

import json
import math
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from shared_samples import real_sample
from test_captioning import tiny_config as captioning_config
from test_feature_readers import butd_tsv_line, make_image, write_butd_h5_fixed, write_m2_hdf5
from test_single_stream import tiny_config as single_stream_config
from test_two_stream import tiny_config as two_stream_config
from transformers import AutoModel

from hf_vlalign import RegionCaptionerModel, SingleStreamModel, TwoStreamModel
from hf_vlalign.data.builders import coco_captions, nlvr2
from hf_vlalign.data.builders.gqa import read_scene_graphs
from hf_vlalign.data.builders.refcoco import read_refs
from hf_vlalign.data.builders.visual_genome import read_image_sizes
from hf_vlalign.data.builders.vqa_v2 import read_answer_vocab
from hf_vlalign.data.feature_store import METADATA_FILE, RegionFeatureStore
from hf_vlalign.data.formats import read_annotation, read_sentences, read_split, read_vgp_csv
from hf_vlalign.data.formats.butd_h5 import iter_butd_h5_records, load_id_map
from hf_vlalign.data.formats.butd_tsv import iter_butd_tsv_records
from hf_vlalign.data.formats.lxmert_tsv import iter_lxmert_tsv_records
from hf_vlalign.data.formats.m2_hdf5 import iter_m2_hdf5_records, load_image_sizes
from hf_vlalign.data.formats.npz_dir import iter_npz_dir_records
from hf_vlalign.data.formats.text_files import read_json_file
from hf_vlalign.data.formats.vlbert_json import iter_vlbert_json_records
from hf_vlalign.data.region_extraction import read_boxes_file

ROOT = Path(__file__).resolve().parents[2]
SAFE_PICKLE = ROOT / "src" / "hf_vlalign" / "data" / "formats" / "safe_pickle.py"


def raises_at(path: Path, line: int | None, problem: str):
    """pytest.raises for a ValueError whose message names `path`, then `line` (when given), then `problem`."""
    where = re.escape(str(path)) + (rf", line {line}:" if line is not None else "")
    return pytest.raises(ValueError, match=rf"{where}.*{problem}")


# ----------------------------------------------------------------------------------------------------------------
# JSON files: non-UTF-8 bytes, nesting too deep for `json`, integers of more than 4300 digits, syntax errors
# ----------------------------------------------------------------------------------------------------------------

JSON_DAMAGE = {  # name -> (file bytes, line of the damage, what the message says)
    "non_utf8": (b'{"a":\n "\xff\xfe"}', 2, "not UTF-8"),
    "deep_nesting": (b"\n\n" + b"[" * 100_000 + b"]" * 100_000, 3, "nested too deeply"),
    "huge_int": (b'{"a":\n' + b"7" * 5000 + b"}", 2, "4300 digits"),
    "syntax": (b'{"a": 1,\n "b": }', 2, "not valid JSON"),
}
JSON_READERS = {
    "coco_karpathy_dataset": lambda path: coco_captions.build(path, "train"),
    "visual_genome_image_data": read_image_sizes,
    "region_extraction_boxes": read_boxes_file,
    "gqa_scene_graphs": read_scene_graphs,
    "vqa_answer_vocab": read_answer_vocab,
    "refcoco_refs_json": read_refs,
    "butd_id_map_json": load_id_map,
    "m2_image_sizes": load_image_sizes,
}


@pytest.mark.parametrize("damage", list(JSON_DAMAGE))
def test_each_kind_of_json_damage_is_named_with_its_line(damage, tmp_path):
    data, line, problem = JSON_DAMAGE[damage]
    path = tmp_path / "annotations.json"
    path.write_bytes(data)
    with raises_at(path, line, problem):
        read_json_file(path)


@pytest.mark.parametrize("reader", list(JSON_READERS))
def test_json_readers_name_the_file_and_line(reader, tmp_path):
    data, line, problem = JSON_DAMAGE["syntax"]
    path = tmp_path / "annotations.json"
    path.write_bytes(data)
    with raises_at(path, line, problem):
        JSON_READERS[reader](path)


def test_nlvr2_names_the_line_of_a_damaged_json_line(tmp_path):
    data, _, problem = JSON_DAMAGE["deep_nesting"]
    good = json.dumps({"identifier": "dev-1-0-0", "sentence": "Two dogs.", "label": "True"}).encode()
    second = good.replace(b"dev-1-0-0", b"dev-1-0-1")
    (tmp_path / "dev.json").write_bytes(good + b"\n" + second + b"\n" + data.replace(b"\n", b" ") + b"\n")
    with raises_at(tmp_path / "dev.json", 3, problem):
        nlvr2.build(tmp_path, "dev")


# ----------------------------------------------------------------------------------------------------------------
# Text and CSV files: Flickr30k Entities sentences and splits, VGP CSV (unterminated quotes), feature TSVs
# ----------------------------------------------------------------------------------------------------------------

SENTENCE = b"[/EN#1/people A man] walks .\n"


@pytest.mark.parametrize(
    "reader, good, bad",
    [
        (read_sentences, SENTENCE, b"[/EN#2/people A caf\xe9 owner] sits .\n"),
        (read_split, b"1000092795\n", b"100\xa0207720\n"),
    ],
    ids=["sentences_latin1", "split_nbsp_latin1"],
)
def test_text_readers_name_the_line_of_non_utf8_bytes(reader, good, bad, tmp_path):
    path = tmp_path / "1.txt"
    path.write_bytes(good + good + bad + good)
    with raises_at(path, 3, "not UTF-8"):
        reader(path)


def _vgp_lines(count: int) -> list[str]:
    return real_sample("vgp", "VGP-Typology", "val_data.csv").read_text(encoding="utf-8-sig").splitlines(keepends=True)[:count]


@pytest.mark.parametrize(
    "bad_line, line, problem",
    [
        ('3637013,"a man,a guy,a man,a guy,syn,syn\n', 3, "quoted field opened on this line is never closed"),
        ('3637013,a man,"a guy"x,a man,a guy,syn,syn\n', 3, "malformed CSV"),
    ],
    ids=["unterminated_quote", "stray_quote"],
)
def test_vgp_csv_names_the_line_where_the_damage_opens(bad_line, line, problem, tmp_path):
    header, first, second = _vgp_lines(3)
    path = tmp_path / "val_data.csv"
    tail = "".join(_vgp_lines(8)[3:])  # complete rows after the damage: csv would read them into the open quote
    path.write_bytes((header + first + bad_line + tail).encode("utf-8", "surrogateescape"))
    assert read_vgp_csv(real_sample("vgp", "VGP-Typology", "val_data.csv"))  # the undamaged file reads
    with raises_at(path, line, problem):
        read_vgp_csv(path)


@pytest.mark.parametrize("reader", [iter_lxmert_tsv_records])
def test_feature_tsvs_name_the_line_of_non_utf8_bytes(reader, tmp_path):
    """Even with on_error="skip" (which drops line 1 from the LXMERT reader: a BUTD line has too few fields)."""
    path = tmp_path / "features.tsv"
    image = make_image(0)
    path.write_bytes(butd_tsv_line("1", image).encode() + b"\n" + butd_tsv_line("2\xff", image).encode("latin-1") + b"\n")
    with raises_at(path, 2, "not UTF-8"):
        list(reader(path, on_error="skip"))


# ----------------------------------------------------------------------------------------------------------------
# Image sizes: NaN, inf, negative, fractional, in every reader that takes one from the file
# ----------------------------------------------------------------------------------------------------------------

BAD_SIZES = {"nan": "nan", "negative": "-240"}


@pytest.mark.parametrize("size", list(BAD_SIZES))
def test_butd_tsv_refuses_a_bad_image_size_naming_the_line(size, tmp_path):
    path = tmp_path / "features.tsv"
    image = make_image(0)
    path.write_text(butd_tsv_line("1", image) + "\n" + butd_tsv_line("2", image, image_h=BAD_SIZES[size]) + "\n")
    with pytest.raises(ValueError, match=r"^features\.tsv, line 2, field 'image_h': expected"):
        list(iter_butd_tsv_records(path))


@pytest.mark.parametrize("size", [240.5, "tall"])
def test_vlbert_json_refuses_a_bad_image_size_naming_the_file(size, tmp_path):
    from test_feature_readers import make_vlbert_image, vlbert_json, write_vlbert

    path = write_vlbert(tmp_path / "frcnn", {1: vlbert_json(1, make_vlbert_image(0), image_h=size)}, "folder")
    with pytest.raises(ValueError, match=r"frcnn/00000001\.json, field 'image_h': expected"):
        list(iter_vlbert_json_records(path))


@pytest.mark.parametrize("width", ["NaN", '"640"'])
def test_gqa_scene_graphs_refuse_a_bad_image_size_naming_the_image(width, tmp_path):
    path = tmp_path / "val_sceneGraphs.json"
    path.write_text('{"2354786": {"width": %s, "height": 480, "objects": {}}}' % width)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: image '2354786' must have a positive integer width"):
        read_scene_graphs(path)


@pytest.mark.parametrize("height", ["-5"])
def test_visual_genome_image_data_refuses_a_bad_image_size_naming_the_entry(height, tmp_path):
    path = tmp_path / "image_data.json"
    path.write_text('[{"image_id": 1, "width": 640, "height": 480}, {"image_id": 2, "width": 640, "height": %s}]' % height)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}, entry #1 \(image 2\): 'height' must be a positive"):
        read_image_sizes(path)


FLICKR_XML = (
    "<annotation><filename>1.jpg</filename><size><width>{width}</width><height>{height}</height><depth>3</depth>"
    "</size><object><name>1</name><bndbox><xmin>{xmin}</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox>"
    "</object></annotation>"
)


@pytest.mark.parametrize(
    "values, problem",
    [
        (dict(width=-500, height=333, xmin=1), r"<size> <width> must be a positive integer, got -500"),
        (dict(width="nan", height=333, xmin=1), r"<size>: <width> must be an integer, got 'nan'"),
        (dict(width=500, height=333, xmin=-3), r"<bndbox> must have non-negative pixel coordinates, got \[-3, 1, 5, 5\]"),
    ],
    ids=["negative_width", "nan", "negative_box"],
)
def test_flickr_annotation_refuses_bad_sizes_naming_the_file_and_element(values, problem, tmp_path):
    path = tmp_path / "1.xml"
    path.write_text(FLICKR_XML.format(**values))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: .*{problem}"):
        read_annotation(path)


def test_flickr_annotation_names_the_line_of_non_utf8_bytes(tmp_path):
    path = tmp_path / "1.xml"
    text = FLICKR_XML.format(width=500, height=333, xmin=1).replace("><", ">\n<")
    path.write_bytes(text.replace("<name>1</name>", "<name>caf\udce9</name>").encode("utf-8", "surrogateescape"))
    line = text.split("\n").index("<name>1</name>") + 1
    with raises_at(path, line, "malformed XML"):
        read_annotation(path)


# ----------------------------------------------------------------------------------------------------------------
# Feature arrays: non-numeric arrays in HDF5 and npz, corrupt .npy headers
# ----------------------------------------------------------------------------------------------------------------


def _string_array(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, "x", dtype="S3")


def test_butd_h5_refuses_non_numeric_features_naming_the_image(tmp_path):
    path = tmp_path / "trainval36.hdf5"
    write_butd_h5_fixed(path, [make_image(0), make_image(1)])
    with h5py.File(path, "a") as handle:
        shape = handle["image_features"].shape
        del handle["image_features"]
        handle.create_dataset("image_features", data=_string_array(shape))
    with pytest.raises(ValueError, match=r"^trainval36\.hdf5, image index 0 \(image_id 0\), field 'image_features': expected an array of numbers"):
        list(iter_butd_h5_records(path, id_map={"0": 0, "1": 1}))


@pytest.mark.parametrize("dataset", ["cls_prob"])
def test_m2_hdf5_refuses_non_numeric_arrays_naming_the_dataset(dataset, tmp_path):
    from test_feature_readers import make_detections

    path = tmp_path / "coco_detections.hdf5"
    write_m2_hdf5(path, {"9": make_detections(0)})
    with h5py.File(path, "a") as handle:
        shape = handle[f"9_{dataset}"].shape
        del handle[f"9_{dataset}"]
        handle.create_dataset(f"9_{dataset}", data=_string_array(shape))
    with pytest.raises(ValueError, match=rf"^coco_detections\.hdf5, image 9, field '9_{dataset}': expected an array of numbers"):
        list(iter_m2_hdf5_records(path))


def _npy_bytes(header: str, payload: bytes) -> bytes:
    header = header.encode("latin-1")
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload


CORRUPT_NPY = {
    "garbage_header": _npy_bytes("{'descr': <f4, 'shape': ((}", b"\x00" * 32),
    "object_dtype": _npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (2, 4), }", b"\x00" * 32),
    "huge_shape": _npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 4), }", b"\x00" * 32),
    "truncated_payload": _npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }", b"\x00" * 20),
}


@pytest.mark.parametrize("damage", list(CORRUPT_NPY))
def test_npz_dir_refuses_a_corrupt_npy_naming_the_file(damage, tmp_path):
    folder = tmp_path / "cocobu_att"
    folder.mkdir()
    image = make_image(0)
    np.savez_compressed(folder / "1", feat=image["features"], bbox=image["boxes"])
    (folder / "2.npy").write_bytes(CORRUPT_NPY[damage])
    with pytest.raises(ValueError, match=r"2\.npy"):
        list(iter_npz_dir_records(folder))


@pytest.mark.parametrize("key", ["bbox"])
def test_npz_dir_refuses_non_numeric_arrays_naming_the_file_and_key(key, tmp_path):
    folder = tmp_path / "cocobu_att"
    folder.mkdir()
    image = make_image(0)
    arrays = {"feat": image["features"], "bbox": image["boxes"]}
    arrays[key] = np.full(arrays[key].shape, "x")
    np.savez_compressed(folder / "1", **arrays)
    with pytest.raises(ValueError, match=rf"^cocobu_att/1\.npz, field '{key}': expected an array of numbers"):
        list(iter_npz_dir_records(folder))


def test_npz_dir_refuses_a_small_npz_that_unpacks_to_gigabytes_before_allocating(tmp_path):
    folder = tmp_path / "cocobu_att"
    folder.mkdir()
    shape, dtype = (20480, 16384), np.dtype("<f4")  # 1.25 GiB of zeros, a few MB deflated
    with zipfile.ZipFile(folder / "1.npz", "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("feat.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, {"descr": dtype.str, "fortran_order": False, "shape": shape})
            chunk, left = bytes(64 << 20), math.prod(shape) * dtype.itemsize
            while left:
                member.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
    assert (folder / "1.npz").stat().st_size < 20 << 20
    with pytest.raises(ValueError, match=r"^cocobu_att/1\.npz, field 'feat': the \.npy header declares shape \(20480, 16384\) .*MAX_ARRAY_BYTES"):
        list(iter_npz_dir_records(folder))


def test_m2_hdf5_refuses_a_declared_dataset_beyond_the_bound_before_reading_it(tmp_path):
    from test_feature_readers import make_detections

    path = tmp_path / "coco_detections.hdf5"
    write_m2_hdf5(path, {"9": make_detections(0)})
    with h5py.File(path, "a") as handle:
        del handle["9_features"]
        handle.create_dataset("9_features", shape=(1_000_000, 4096), dtype="f4", chunks=(1, 4096))  # 16 GB, none written
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=r"^coco_detections\.hdf5, image 9, field '9_features': the file declares shape .*MAX_ARRAY_BYTES"):
        list(iter_m2_hdf5_records(path))


# ----------------------------------------------------------------------------------------------------------------
# store.json of the wrong shape, or binary
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    (root / "features.tsv").write_text("".join(butd_tsv_line(str(i), make_image(i)) + "\n" for i in range(2)))
    RegionFeatureStore.write(iter_butd_tsv_records(root / "features.tsv"), root / "store")
    return root / "store"


def _metadata_with(store_dir: Path, **changes) -> bytes:
    metadata = json.loads((store_dir / METADATA_FILE).read_text())
    return json.dumps(metadata | changes).encode()


STORE_JSON_DAMAGE = {  # name -> (bytes or a function of the store, message)
    "binary": (lambda store: b"\x00\x01\xff\xfe" * 16, r"store.json, line 1: not UTF-8"),
    "list": (lambda store: b"[1, 2]", r"store.json: expected a JSON object, got list"),
    "sha256_number": (lambda store: _metadata_with(store, sha256={"region_features.arrow": 5}), r"store.json: field 'sha256' must map"),
    "num_images_negative": (lambda store: _metadata_with(store, num_images=-2), r"store.json: field 'num_images' must be"),
    "version_missing": (lambda store: b"{}", r"store.json: store format version None is not the supported"),
}


@pytest.mark.parametrize("damage", list(STORE_JSON_DAMAGE))
def test_store_json_of_the_wrong_shape_or_binary_is_refused_by_name(damage, store_dir, tmp_path):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(store_dir, store)
    make, problem = STORE_JSON_DAMAGE[damage]
    (store / METADATA_FILE).write_bytes(make(store_dir))
    with pytest.raises(ValueError, match=rf"{re.escape(str(store))}/{problem}"):
        RegionFeatureStore.load(store)
    assert len(RegionFeatureStore.load(store_dir)) == 2  # the undamaged store loads


# ----------------------------------------------------------------------------------------------------------------
# The restricted unpickler: memo-reference bombs and self-referencing structures, in bounded time and memory
# ----------------------------------------------------------------------------------------------------------------


def _doubling_bomb(levels: int) -> bytes:
    """L0 = [1, 1]; L(k) = [L(k-1), L(k-1)] by memo references: 3 * 2**levels values from a few bytes per level."""
    data = b"\x80\x02](K\x01K\x01eq\x00"
    for k in range(1, levels):
        data += b"](h" + bytes([k - 1]) + b"h" + bytes([k - 1]) + b"eq" + bytes([k])
    return data + b"."


def _dict_bomb(levels: int) -> bytes:
    """D0 = {"a": 1}; D(k) = {"a": D(k-1), "b": D(k-1), "c": D(k-1)}: 3**levels."""
    data = b"\x80\x02}(X\x01\x00\x00\x00aK\x01ur" + struct.pack("<I", 0)
    for k in range(1, levels):
        get = b"j" + struct.pack("<I", k - 1)
        data += b"}(X\x01\x00\x00\x00a" + get + b"X\x01\x00\x00\x00b" + get + b"X\x01\x00\x00\x00c" + get
        data += b"ur" + struct.pack("<I", k)
    return data + b"."


def _wide_bomb(copies: int) -> bytes:
    """A 10,000-int list referenced `copies` times from one list: 10**4 * copies values from 2 bytes a copy."""
    return b"\x80\x02](" + b"K\x07" * 10_000 + b"eq\x00](" + b"h\x00" * copies + b"e."


PICKLE_BOMBS = {  # name -> (pickle bytes, what the message says)
    "doubling_list_60_levels": (_doubling_bomb(60), "memo-reference bomb"),
    "doubling_list_250_levels": (_doubling_bomb(250), "memo-reference bomb|nests deeper"),
    "tripling_dict_40_levels": (_dict_bomb(40), "memo-reference bomb"),
    "wide_shared_list": (_wide_bomb(100_000), "memo-reference bomb"),
    "list_contains_itself": (b"\x80\x02]q\x00h\x00a.", "list of the pickle contains itself"),
    "dict_contains_itself": (b"\x80\x02}q\x00X\x01\x00\x00\x00ah\x00s.", "dict of the pickle contains itself"),
    "cycle_through_two_lists": (b"\x80\x02]q\x00]q\x01h\x00aa.", "list of the pickle contains itself"),
    "tuple_holding_a_cycle": (b"\x80\x02]q\x00h\x00\x85q\x01a.", "contains itself"),
    "nested_200000_lists": (b"\x80\x02" + b"]" * 200_000 + b"a" * 199_999 + b".", "nests deeper than 100"),
    # the C unpickler would allocate a 32 GB memo for this index (a MemoryError under the limit)
    "memo_index_4_billion": (b"\x80\x02]r" + struct.pack("<I", 0xFFFFFFF0) + b"j" + struct.pack("<I", 0xFFFFFFF0) + b"a.", "contains itself"),
    "get_of_a_missing_memo": (b"\x80\x02]h\x05a.", "not a pickle of plain"),
    "global_os_system": (b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00idj\x85R.", "refused to load the global os.system"),
    "truncated": (b"\x80\x02](K\x01K", "not a pickle of plain"),
    "set_of_ints": (b"\x80\x04\x8f(K\x01K\x02\x90.", "expected only dicts, lists, ints and strings"),
}
# the subprocess: the restricted unpickler's module alone (no torch), under a 1 GiB address-space limit
BOMB_RUNNER = textwrap.dedent(
    """
    import importlib.util, json, resource, sys
    spec = importlib.util.spec_from_file_location("safe_pickle", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    results = {}
    for path in sys.argv[2:]:
        try:
            module.load_restricted_pickle(path)
            results[path] = ["loaded", ""]
        except ValueError as error:
            results[path] = ["ValueError", str(error)]
        except BaseException as error:
            results[path] = [type(error).__name__, str(error)[:300]]
    print(json.dumps(results))
    """
)


@pytest.mark.slow
def test_restricted_unpickler_refuses_bombs_and_cycles_in_bounded_time_and_memory(tmp_path):
    paths = {}
    for name, (data, _) in PICKLE_BOMBS.items():
        paths[name] = tmp_path / f"{name}.p"
        paths[name].write_bytes(data)
    command = [sys.executable, "-c", BOMB_RUNNER, str(SAFE_PICKLE), *map(str, paths.values())]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout)
    for name, (_, problem) in PICKLE_BOMBS.items():
        kind, message = outcomes[str(paths[name])]
        assert kind == "ValueError", (name, kind, message)
        assert message.startswith(str(paths[name])) and re.search(problem, message), (name, message)


def test_restricted_unpickler_still_reads_shared_references_of_plain_data(tmp_path):
    """A legitimately shared sub-list (the pickler memoises every container) is read and copied, not refused."""
    from hf_vlalign.data.formats.safe_pickle import load_restricted_pickle

    shared = ["person", "man"]
    refs = [{"ref_id": i, "categories": shared, "sentences": [{"sent": "the man", "tokens": ["the", "man"]}]} for i in range(50)]
    import pickle

    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps(refs, protocol=2))
    assert load_restricted_pickle(path) == refs


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints: a truncated model.safetensors (damaged Trainer state files on resume: tests/trainers/test_resume.py)
# ----------------------------------------------------------------------------------------------------------------

FAMILIES = {
    "single_stream": (SingleStreamModel, single_stream_config),
    "two_stream": (TwoStreamModel, two_stream_config),
    "captioning": (RegionCaptionerModel, captioning_config),
}
TRUNCATIONS = {"half": lambda data: data[: len(data) // 2], "empty": lambda data: b""}


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for family, (model_class, config) in FAMILIES.items():
        folders[family] = tmp_path_factory.mktemp(family)
        model_class(config()).save_pretrained(folders[family])
    return folders


@pytest.mark.parametrize("family, truncation", [("single_stream", "half"), ("captioning", "empty")])
def test_from_pretrained_names_a_truncated_safetensors_file(family, truncation, saved_models, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(saved_models[family], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(TRUNCATIONS[truncation](weights.read_bytes()))
    model_class = FAMILIES[family][0]
    for load in (model_class.from_pretrained, AutoModel.from_pretrained):
        with pytest.raises(ValueError, match=rf"{re.escape(str(weights))} is not a complete safetensors file"):
            load(folder)
    assert model_class.from_pretrained(saved_models[family]) is not None  # the undamaged folder loads
