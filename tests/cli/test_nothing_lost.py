"""Nothing the user has is lost: every writing entry point refuses an output that is, is inside, or holds one of its
inputs (spelled directly, through a symbolic link, or relatively with `..`) before writing anything; `--overwrite`
replaces only what hf_vlalign wrote; every size that allocates is bounded; names derived from a 255-byte folder name
stay valid."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from analysis_models import SYNTHETIC_FLAGS, save_with_tokenizer, tiny_family_model
from PIL import Image
from published_features import write_lxmert_tsv_features
from script_modules import ROOT, load_script
from transformers import VisualBertConfig, VisualBertModel

from hf_vlalign.cli import main
from hf_vlalign.data.feature_store import METADATA_FILE, RegionFeatureStore, convert_features
from hf_vlalign.data.region_extraction import extract_region_features, grid_boxes
from hf_vlalign.evaluation.model_analysis import analyze_model, check_analysis_output
from hf_vlalign.evaluation.model_explorer import explore_model
from hf_vlalign.evaluation.tasks import evaluate_task
from hf_vlalign.hub.remote_code import PACKAGE_ROOT, save_with_remote_code
from hf_vlalign.synthetic import SyntheticSceneConfig
from hf_vlalign.trainers.regularization import save_fisher
from hf_vlalign.utils.atomic_folders import MAX_DERIVED_STEM_BYTES, derived_stem
from hf_vlalign.utils.output_paths import OutputPathError, refuse_output_overlapping_inputs
from hf_vlalign.utils.size_limits import (
    MAX_GRID_SIZE,
    MAX_NEW_TOKENS,
    MAX_NUM_BEAMS,
    MAX_REGIONS_PER_IMAGE,
    MAX_SYNTHETIC_IMAGES,
    SizeLimitError,
)

pytestmark = pytest.mark.usefixtures("synthetic_scene_cache")

NAME_MAX = 255
IMAGE_IDS = ["1", "2"]


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: inputs of every kind, and their bytes
# ----------------------------------------------------------------------------------------------------------------


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (or of the file), by relative name: equal before and after means untouched."""
    path = Path(path)
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {
        str(file.relative_to(path)): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(path.rglob("*"))
        if file.is_file()
    }


@pytest.fixture(scope="module")
def vgp_model_dir(tokenizer, tmp_path_factory):
    model = tiny_family_model("single_stream", tokenizer)
    return save_with_tokenizer(model, tokenizer, tmp_path_factory.mktemp("inputs") / "vgp_model")


@pytest.fixture(scope="module")
def visualbert_dir(tokenizer, tmp_path_factory):
    torch.manual_seed(0)
    config = VisualBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        visual_embedding_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("inputs") / "visualbert"
    VisualBertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_images(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for index, image_id in enumerate(IMAGE_IDS):
        Image.fromarray(np.full((32, 48, 3), 40 * index, dtype=np.uint8)).save(folder / f"{image_id}.png")
    return folder


def make_features_tsv(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_lxmert_tsv_features(folder / "feats.tsv", IMAGE_IDS)


# ----------------------------------------------------------------------------------------------------------------
# The overlap matrix: five spellings of an output that meets the input
# ----------------------------------------------------------------------------------------------------------------

# an output that is the input (through a symbolic link: the same once resolved), or holds it; a new output inside an
# input is the subject of `test_a_new_output_inside_an_input_is_refused_only_where_the_input_is_scanned`
RELATIONS = ("symlink", "input_inside_output")


def overlapping_output(relation: str, given: Path, inside_name: str = "out") -> str:
    """An output path that meets `given` in the way `relation` names (creating the link / the sibling it uses)."""
    given = Path(given)
    if relation == "equal":
        return str(given)
    if relation == "output_inside_input":
        return str(given / inside_name)
    if relation == "input_inside_output":
        return str(given.parent)
    if relation == "symlink":
        link = given.parent.parent / f"link_to_{given.name}_{time.monotonic_ns()}"
        link.symlink_to(given)
        return str(link)
    # relative, through a sibling folder and `..`, from the input's grandparent
    sibling = given.parent / "sibling"
    sibling.mkdir(exist_ok=True)
    os.chdir(given.parent.parent)
    return os.path.join(given.parent.name, "sibling", "..", given.name)


@pytest.fixture
def restore_cwd():
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


def assert_refused(capsys, verb: str, argv: list[str], *names: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"hf-vlalign {verb}: error: "), error
    assert "Traceback" not in error
    for name in names:
        assert f"`{name}`" in error, (name, error)
    return error


@pytest.mark.parametrize("relation", RELATIONS)
def test_convert_features_never_writes_over_its_source(relation, tmp_path, capsys, restore_cwd):
    tsv = make_features_tsv(tmp_path / "data")
    (tmp_path / "data" / "notes.txt").write_text("the user's own file")
    before = tree_digest(tmp_path / "data")
    out = overlapping_output(relation, tsv)
    argv = ["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", out, "--overwrite"]
    assert_refused(capsys, "convert-features", argv, "--out", "src")
    assert tree_digest(tmp_path / "data") == before
    with pytest.raises(OutputPathError, match="`out`.*`src`"):  # the library function alike
        convert_features(tsv, "lxmert_tsv", out, overwrite=True)
    assert tree_digest(tmp_path / "data") == before


@pytest.mark.parametrize("relation", RELATIONS)
def test_extract_features_never_writes_over_its_images(relation, tmp_path, capsys, restore_cwd):
    images = make_images(tmp_path / "data" / "images")
    before = tree_digest(tmp_path / "data")
    out = overlapping_output(relation, images)
    argv = ["extract-features", str(images), "--out", out, "--grid_size", "2", "--overwrite"]
    assert_refused(capsys, "extract-features", argv, "--out", "images")
    with pytest.raises(OutputPathError, match="`out_dir`.*`images`"):
        extract_region_features(images, out, grid_size=2, overwrite=True)
    assert tree_digest(tmp_path / "data") == before


def test_extract_features_never_writes_over_its_boxes_file(tmp_path, capsys):
    images = make_images(tmp_path / "images")
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps({image_id: [[0, 0, 10, 10]] for image_id in IMAGE_IDS}))
    before = tree_digest(boxes)
    argv = ["extract-features", str(images), "--out", str(boxes), "--boxes", str(boxes), "--overwrite"]
    assert_refused(capsys, "extract-features", argv, "--out", "--boxes")
    assert tree_digest(boxes) == before


@pytest.mark.parametrize("relation", RELATIONS)
def test_convert_never_writes_over_its_source_checkpoint(relation, visualbert_dir, tmp_path, capsys, restore_cwd):
    before = tree_digest(visualbert_dir)
    out = overlapping_output(relation, visualbert_dir)
    argv = ["convert", str(visualbert_dir), "--from", "visualbert", "--out", out, "--overwrite"]
    assert_refused(capsys, "convert", argv, "--out", "src")
    assert tree_digest(visualbert_dir) == before


@pytest.mark.parametrize("relation", RELATIONS)
def test_fisher_never_writes_over_its_model(relation, vgp_model_dir, capsys, restore_cwd):
    before = tree_digest(vgp_model_dir)
    out = overlapping_output(relation, vgp_model_dir, inside_name="model.safetensors")  # inside: over the weights
    argv = ["fisher", str(vgp_model_dir), "--out", out, "--num_batches", "1", *SYNTHETIC_FLAGS]
    assert_refused(capsys, "fisher", argv, "--out", "model")
    assert tree_digest(vgp_model_dir) == before


def test_fisher_never_writes_over_its_data_files(vgp_model_dir, tmp_path, capsys):
    features = tmp_path / "store"
    features.mkdir()
    (features / "region_features.arrow").write_bytes(b"user bytes")
    before = tree_digest(features)
    argv = [
        "fisher", str(vgp_model_dir), "--data", "vgp", "--out", str(features / "region_features.arrow"),
        "--features", str(features), "--flickr30k_entities_dir", str(tmp_path / "f30k"), "--vgp_train_csv", "a.csv",
        "--vgp_eval_csv", "b.csv",
    ]  # fmt: skip
    assert_refused(capsys, "fisher", argv, "--out", "--features")
    assert tree_digest(features) == before


@pytest.mark.parametrize("relation", RELATIONS)
def test_analyze_never_writes_into_its_model(relation, vgp_model_dir, capsys, restore_cwd):
    before = tree_digest(vgp_model_dir)
    out = overlapping_output(relation, vgp_model_dir, inside_name="config.json")  # inside: onto one of its files
    assert_refused(capsys, "analyze", ["analyze", str(vgp_model_dir), "--out", out, *SYNTHETIC_FLAGS], "--out", "model")
    with pytest.raises(OutputPathError, match="`out_dir`.*`model_dir`"):
        analyze_model(vgp_model_dir, out)
    assert tree_digest(vgp_model_dir) == before


def test_a_new_output_inside_an_input_is_refused_only_where_the_input_is_scanned(vgp_model_dir, tmp_path, capsys):
    # a new run folder inside a data folder read by known names destroys nothing: accepted
    data = tmp_path / "DATA"
    data.mkdir()
    refuse_output_overlapping_inputs(data / "run", {"--data_dir": data}, output_argument="--output_dir")
    check_analysis_output(vgp_model_dir / "analysis", {"model": vgp_model_dir})
    # an existing file inside an input is never replaced
    (data / "run").mkdir()
    with pytest.raises(OutputPathError, match="`--output_dir` .* is inside the input `--data_dir`.*already exists"):
        refuse_output_overlapping_inputs(data / "run", {"--data_dir": data}, output_argument="--output_dir")
    # except the run's own folder: a re-run writes into it again
    (data / "run" / "checkpoint-1").mkdir()
    (data / "run" / "checkpoint-1" / "trainer_state.json").write_text("{}")
    refuse_output_overlapping_inputs(data / "run", {"--data_dir": data}, output_argument="--output_dir")
    # a folder read by listing (the images of extract-features) would read the output as an input
    images = make_images(tmp_path / "images")
    argv = ["extract-features", str(images), "--out", str(images / "store"), "--grid_size", "2"]
    assert "read by scanning" in assert_refused(capsys, "extract-features", argv, "--out", "images")
    assert not (images / "store").exists()


def test_analyze_never_writes_into_its_feature_store(vgp_model_dir, tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    (store / "store.json").write_text("{}")
    argv = [
        "analyze", str(vgp_model_dir), "--data", "vgp", "--features", str(store), "--out", str(store / "analysis"),
        "--flickr30k_entities_dir", str(tmp_path / "f30k"), "--vgp_train_csv", "a.csv", "--vgp_eval_csv", "b.csv",
    ]  # fmt: skip
    assert_refused(capsys, "analyze", argv, "--out", "--features")
    assert sorted(path.name for path in store.iterdir()) == ["store.json"]


@pytest.mark.parametrize("relation", RELATIONS)
def test_explore_never_writes_over_its_model(relation, vgp_model_dir, capsys, restore_cwd):
    before = tree_digest(vgp_model_dir)
    out = overlapping_output(relation, vgp_model_dir, inside_name="config.json")  # inside: over the config
    assert_refused(capsys, "explore", ["explore", str(vgp_model_dir), "--out", out, *SYNTHETIC_FLAGS], "--out", "model")
    with pytest.raises(OutputPathError, match="`out`.*`model_dir`"):
        explore_model(vgp_model_dir, out)
    assert tree_digest(vgp_model_dir) == before


def test_explore_never_writes_over_its_image(vgp_model_dir, tmp_path, capsys):
    image = make_images(tmp_path / "images") / "1.png"
    before = tree_digest(image)
    argv = ["explore", str(vgp_model_dir), "--out", str(image), "--image", str(image), *SYNTHETIC_FLAGS]
    assert_refused(capsys, "explore", argv, "--out", "--image")
    assert tree_digest(image) == before


@pytest.mark.parametrize("relation", RELATIONS)
def test_save_with_remote_code_never_writes_into_the_library(relation, tokenizer, tmp_path, restore_cwd):
    model = tiny_family_model("single_stream", tokenizer)
    before = tree_digest(PACKAGE_ROOT)
    if relation == "symlink":
        folder = tmp_path / "link"
        folder.symlink_to(PACKAGE_ROOT / "models" / "single_stream")
    elif relation == "relative_dotdot":
        os.chdir(PACKAGE_ROOT.parent)
        folder = os.path.join(PACKAGE_ROOT.name, "models", "..", "models", "single_stream")
    else:
        folder = {
            "equal": PACKAGE_ROOT,
            "output_inside_input": PACKAGE_ROOT / "models" / "single_stream",  # the flat modules bear these names
            "input_inside_output": PACKAGE_ROOT.parent,
        }[relation]
    with pytest.raises(OutputPathError, match="`folder`.*hf_vlalign source folder"):
        save_with_remote_code(model, folder)
    assert tree_digest(PACKAGE_ROOT) == before


@pytest.fixture(scope="module")
def finetune_vgp():
    return load_script("finetune_vgp_nothing_lost", ROOT / "examples" / "finetune_vgp.py")


@pytest.mark.parametrize("relation", RELATIONS)
def test_example_output_dir_never_meets_its_model(relation, finetune_vgp, vgp_model_dir, restore_cwd):
    before = tree_digest(vgp_model_dir)
    output_dir = overlapping_output(relation, vgp_model_dir)
    with pytest.raises(OutputPathError, match="`--output_dir`.*`--model_name_or_path`"):
        finetune_vgp.main(["--model_name_or_path", str(vgp_model_dir), "--output_dir", output_dir, "--max_steps", "1"])
    assert tree_digest(vgp_model_dir) == before


def test_example_output_dir_never_meets_its_config_file_store_or_resume_checkpoint(finetune_vgp, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 1\n")
    with pytest.raises(OutputPathError, match="`--output_dir`.*`--config`"):
        finetune_vgp.parse_args(["--config", str(config), "--output_dir", str(config)])
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(OutputPathError, match="`--output_dir`.*is inside the input `--features`"):
        finetune_vgp.parse_args(["--features", str(store), "--output_dir", str(store / "run")])
    checkpoint = tmp_path / "other_run" / "checkpoint-1"
    (checkpoint / "x").mkdir(parents=True)  # existing: nothing inside an input is replaced
    with pytest.raises(OutputPathError, match="`--output_dir`.*`--resume_from_checkpoint`.*already exists"):
        finetune_vgp.parse_args(["--resume_from_checkpoint", str(checkpoint), "--output_dir", str(checkpoint / "x")])
    # a checkpoint of the run itself, under its output_dir, is how a run resumes
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    finetune_vgp.parse_args(["--resume_from_checkpoint", str(run / "checkpoint-1"), "--output_dir", str(run)])


def test_example_resumes_a_run_whose_folder_lies_inside_its_data_dir(tmp_path):
    finetune_vqa = load_script("finetune_vqa_nothing_lost", ROOT / "examples" / "finetune_vqa.py")
    data = tmp_path / "DATA"
    (data / "run" / "checkpoint-1").mkdir(parents=True)
    argv = ["--data_dir", str(data), "--features", str(tmp_path / "store"), "--output_dir", str(data / "run")]
    finetune_vqa.parse_args([*argv, "--resume_from_checkpoint", str(data / "run" / "checkpoint-1")])
    with pytest.raises(OutputPathError, match="`--output_dir`.*inside the input `--data_dir`.*already exists"):
        finetune_vqa.parse_args(argv)  # an existing folder that holds no run of the library


def test_a_hard_link_of_an_input_is_the_input(tmp_path):
    source = tmp_path / "feats.tsv"
    source.write_text("x")
    os.link(source, tmp_path / "alias.tsv")
    with pytest.raises(OutputPathError, match=r"`--out` .*alias\.tsv.* is the input `src`"):
        refuse_output_overlapping_inputs(tmp_path / "alias.tsv", {"src": source})
    refuse_output_overlapping_inputs(tmp_path / "new", {"src": source, "hub id": "bert-base-uncased", "none": None})


# ----------------------------------------------------------------------------------------------------------------
# --overwrite replaces only what the library wrote
# ----------------------------------------------------------------------------------------------------------------


def test_convert_features_overwrite_refuses_a_foreign_folder_and_replaces_a_store(tmp_path, capsys):
    tsv = make_features_tsv(tmp_path / "data")
    foreign = tmp_path / "photos"
    foreign.mkdir()
    for name in ("a.jpg", "b.jpg", "c.txt"):
        (foreign / name).write_text(name)
    before = tree_digest(foreign)
    argv = ["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(foreign), "--overwrite"]
    error = assert_refused(capsys, "convert-features", argv, "--out")
    assert "a.jpg, b.jpg, c.txt" in error and "region-feature store" in error
    assert tree_digest(foreign) == before
    store = tmp_path / "store"
    assert main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(store)]) == 0
    assert main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(store), "--overwrite"]) == 0
    assert len(RegionFeatureStore.load(store)) == len(IMAGE_IDS)


def test_store_write_overwrite_refuses_a_store_holding_other_files(tmp_path):
    tsv = make_features_tsv(tmp_path / "data")
    store = tmp_path / "store"
    convert_features(tsv, "lxmert_tsv", store)
    (store / "my_notes.md").write_text("mine")
    with pytest.raises(OutputPathError, match=r"`directory` .* holds 3 .*my_notes\.md"):
        RegionFeatureStore.write(iter(RegionFeatureStore.load(store)), store, overwrite=True)
    assert (store / "my_notes.md").read_text() == "mine"
    with pytest.raises(OutputPathError, match="`out_dir` .* is a file"):
        extract_region_features(make_images(tmp_path / "images"), tsv, grid_size=2, overwrite=True)
    assert tsv.read_text().startswith("1\t")


def test_extract_features_overwrite_replaces_its_own_store_only(tmp_path, capsys):
    images = make_images(tmp_path / "images")
    store = tmp_path / "store"
    assert main(["extract-features", str(images), "--out", str(store), "--grid_size", "2"]) == 0
    assert main(["extract-features", str(images), "--out", str(store), "--grid_size", "3", "--overwrite"]) == 0
    assert RegionFeatureStore.load(store)["1"]["boxes"].shape == (9, 4)
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    capsys.readouterr()
    argv = ["extract-features", str(images), "--out", str(home), "--grid_size", "2", "--overwrite"]
    assert "thesis.tex" in assert_refused(capsys, "extract-features", argv, "--out")
    assert (home / "thesis.tex").read_text() == "years of work"


def test_convert_overwrite_refuses_a_foreign_folder_and_replaces_a_converted_checkpoint(
    visualbert_dir, tokenizer, tmp_path, capsys
):
    foreign = tmp_path / "other_model"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (foreign / "pytorch_model.bin").write_bytes(b"weights")
    before = tree_digest(foreign)
    argv = ["convert", str(visualbert_dir), "--from", "visualbert", "--out", str(foreign), "--overwrite"]
    error = assert_refused(capsys, "convert", argv, "--out")
    assert "an hf_vlalign checkpoint" in error and "pytorch_model.bin" in error
    assert tree_digest(foreign) == before
    out = tmp_path / "converted"
    assert main(["convert", str(visualbert_dir), "--from", "visualbert", "--out", str(out)]) == 0
    (out / "my_notes.md").write_text("kept")
    assert main(["convert", str(visualbert_dir), "--from", "visualbert", "--out", str(out), "--overwrite"]) == 0
    assert (out / "my_notes.md").read_text() == "kept"  # save_pretrained keeps the folder's other files


def test_synthesize_refuses_a_folder_of_other_files_and_rewrites_its_own_scenes(tmp_path, capsys):
    own_photos = tmp_path / "data"
    (own_photos / "images").mkdir(parents=True)
    (own_photos / "images" / "1000.png").write_bytes(b"my photo")
    before = tree_digest(own_photos)
    sizes = ["--train_images", "2", "--val_images", "1"]
    error = assert_refused(capsys, "synthesize", ["synthesize", "--out", str(own_photos), *sizes], "out_dir")
    assert "synthetic-scenes folder" in error and "images" in error
    assert tree_digest(own_photos) == before
    scenes = tmp_path / "scenes"
    assert main(["synthesize", "--out", str(scenes), *sizes]) == 0
    first = tree_digest(scenes)
    assert main(["synthesize", "--out", str(scenes), *sizes]) == 0  # earlier scenes: written again, identical
    assert tree_digest(scenes) == first


def test_fisher_refuses_a_foreign_file_and_replaces_its_own(vgp_model_dir, tmp_path, capsys):
    foreign = tmp_path / "weights.safetensors"
    foreign.write_bytes(b"not a fisher file")
    argv = ["fisher", str(vgp_model_dir), "--out", str(foreign), "--num_batches", "1", "--batch_size", "4", *SYNTHETIC_FLAGS]
    assert "a Fisher file" in assert_refused(capsys, "fisher", argv, "--out")
    assert foreign.read_bytes() == b"not a fisher file"
    own = tmp_path / "fisher.safetensors"
    save_fisher(own, {"w": torch.ones(2)}, {"w": torch.zeros(2)})
    argv[argv.index(str(foreign))] = str(own)
    assert main(argv) == 0
    with pytest.raises(OutputPathError, match="`path` .* not a Fisher file"):
        save_fisher(foreign, {"w": torch.ones(2)}, {"w": torch.zeros(2)})


def test_analyze_and_explore_refuse_foreign_outputs(vgp_model_dir, tmp_path, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "paper.pdf").write_bytes(b"%PDF")
    argv = ["analyze", str(vgp_model_dir), "--out", str(folder), *SYNTHETIC_FLAGS]
    assert "paper.pdf" in assert_refused(capsys, "analyze", argv, "--out")
    page = tmp_path / "index.html"
    page.write_text("<html>my own page</html>")
    argv = ["explore", str(vgp_model_dir), "--out", str(page), *SYNTHETIC_FLAGS]
    assert "attention explorer page" in assert_refused(capsys, "explore", argv, "--out")
    assert page.read_text() == "<html>my own page</html>" and (folder / "paper.pdf").read_bytes() == b"%PDF"


def test_write_attention_explorer_replaces_only_its_own_page(tmp_path):
    from test_explorer import _visual_bert, _write  # a tiny transformers VisualBert's attention, as a page

    parts = _visual_bert()
    page = tmp_path / "page.html"
    _write(*parts, page)
    _write(*parts, page)  # an earlier page is replaced
    foreign = tmp_path / "index.html"
    foreign.write_text("<html>mine</html>")
    with pytest.raises(OutputPathError, match="`path` .* is not an attention explorer page"):
        _write(*parts, foreign)
    assert foreign.read_text() == "<html>mine</html>"


# ----------------------------------------------------------------------------------------------------------------
# Sizes that allocate are bounded, and refused before allocating
# ----------------------------------------------------------------------------------------------------------------

CLI_SIZE_CASES = [
    ("extract-features", ["IMAGES", "--out", "OUT", "--grid_size", "1000000"], "--grid_size", MAX_GRID_SIZE),
    ("synthesize", ["--out", "OUT", "--train_images", "1000000000"], "--train_images", MAX_SYNTHETIC_IMAGES),
    ("probe", ["MODEL", "--max_images", "10000000000"], "--max_images", 1_000_000),
    ("explore", ["MODEL", "--out", "OUT", "--num_examples", "5000"], "--num_examples", 1000),
]  # fmt: skip


@pytest.mark.parametrize(("verb", "argv", "argument", "limit"), CLI_SIZE_CASES, ids=lambda case: str(case))
def test_cli_sizes_above_their_limit_are_refused_at_parsing(verb, argv, argument, limit, tmp_path, capsys):
    argv = [{"IMAGES": str(tmp_path), "OUT": str(tmp_path / "out"), "MODEL": str(tmp_path)}.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main([verb, *argv])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {argument}: must be <= {limit} (MAX_" in error and "size_limits" in error, error
    assert not (tmp_path / "out").exists()


def test_library_sizes_above_their_limit_fail_fast(tmp_path, tokenizer):
    started = time.perf_counter()
    with pytest.raises(SizeLimitError, match=f"`grid_size` must be <= {MAX_GRID_SIZE}.*got 1000000"):
        grid_boxes(100, 100, 1_000_000)
    with pytest.raises(SizeLimitError, match="`grid_size` must be <= "):
        extract_region_features(make_images(tmp_path / "images"), tmp_path / "out", grid_size=10**9)
    boxes = {"1": [[0, 0, 1, 1]] * (MAX_REGIONS_PER_IMAGE + 1), "2": [[0, 0, 1, 1]]}
    with pytest.raises(SizeLimitError, match=f"{MAX_REGIONS_PER_IMAGE + 1} boxes, more than MAX_REGIONS_PER_IMAGE"):
        extract_region_features(tmp_path / "images", tmp_path / "out", boxes=boxes)
    with pytest.raises(SizeLimitError, match="`num_train_images` must be <= 200000"):
        SyntheticSceneConfig(num_train_images=10**12)
    with pytest.raises(SizeLimitError, match="`batch_size` must be <= "):
        analyze_model(tmp_path, tmp_path / "analysis", batch_size=10**9)
    with pytest.raises(SizeLimitError, match="`num_examples` must be <= 1000"):
        explore_model(tmp_path, tmp_path / "page.html", num_examples=10**9)
    with pytest.raises(SizeLimitError, match="`max_examples` must be <= 1000000"):
        evaluate_task(tmp_path, "vgp", max_examples=10**9)
    assert time.perf_counter() - started < 5
    assert not (tmp_path / "out").exists() and not (tmp_path / "analysis").exists()


def test_generate_sizes_above_their_limit_are_refused_before_decoding(tokenizer):
    model = tiny_family_model("captioner", tokenizer).eval()
    inputs = {"visual_feats": torch.randn(1, 3, 256), "visual_boxes": torch.tensor([[[0.0, 0.0, 0.5, 0.5]] * 3])}
    with pytest.raises(SizeLimitError, match=f"`num_beams` must be <= {MAX_NUM_BEAMS}.*got 100000"):
        model.generate(**inputs, num_beams=100_000)
    with pytest.raises(SizeLimitError, match=f"`max_new_tokens` must be <= {MAX_NEW_TOKENS}.*got 1000000000"):
        model.generate(**inputs, max_new_tokens=10**9)
    assert model.generate(**inputs, num_beams=2, max_new_tokens=3).shape[0] == 1


# ----------------------------------------------------------------------------------------------------------------
# Names derived from a 255-byte folder name
# ----------------------------------------------------------------------------------------------------------------


def long_name(tag: str) -> str:
    name = tag + "x" * (NAME_MAX - len(os.fsencode(tag)))
    assert len(os.fsencode(name)) == NAME_MAX
    return name


def dead_pid() -> int:
    for pid in range(4_194_303, 4_000_000, -1):  # above the usual pid range: no process has it
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid found")


def test_derived_names_of_a_255_byte_name_stay_within_name_max():
    name = long_name("é")  # a multi-byte character at the start: the cut never splits one
    stem = derived_stem(name)
    assert len(os.fsencode(stem)) <= MAX_DERIVED_STEM_BYTES and stem == derived_stem(name)
    assert derived_stem(long_name("other")) != derived_stem(long_name("anoth"))
    assert derived_stem("short") == "short"


def test_save_pretrained_into_a_255_byte_folder_and_its_stale_staging_cleanup(tokenizer, tmp_path):
    model = tiny_family_model("single_stream", tokenizer)
    target = tmp_path / long_name("model")
    host = socket.gethostname()
    stale = tmp_path / f".{derived_stem(target.name)}.saving-{host}-{dead_pid()}-abcd1234"
    stale.mkdir()  # left by a killed save
    model.save_pretrained(target)
    (target / "notes.md").write_text("kept")
    model.save_pretrained(target)  # replacing it: staging folder beside the 255-byte name
    assert (target / "config.json").is_file() and (target / "notes.md").read_text() == "kept"
    assert not stale.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == [target.name]


def test_store_into_a_255_byte_folder_and_its_stale_partial_cleanup(tmp_path, capsys):
    tsv = make_features_tsv(tmp_path / "data")
    store = tmp_path / long_name("store")
    stale = tmp_path / f"{derived_stem(store.name)}.partial-{socket.gethostname()}-{dead_pid()}"
    stale.mkdir()
    assert main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(store)]) == 0
    assert main(["convert-features", str(tsv), "--format", "lxmert_tsv", "--out", str(store), "--overwrite"]) == 0
    assert len(RegionFeatureStore.load(store)) == len(IMAGE_IDS) and (store / METADATA_FILE).is_file()
    assert not stale.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data", store.name]


@pytest.mark.parametrize("relation", RELATIONS)
def test_probe_and_evaluate_results_never_overwrite_their_model(relation, vgp_model_dir, capsys, restore_cwd):
    before = tree_digest(vgp_model_dir)
    out = overlapping_output(relation, vgp_model_dir, inside_name="config.json")
    assert_refused(capsys, "probe", ["probe", str(vgp_model_dir), "--json", out, *SYNTHETIC_FLAGS], "--json", "model")
    assert_refused(capsys, "probe", ["probe", str(vgp_model_dir), "--plot", out, *SYNTHETIC_FLAGS], "--plot", "model")
    argv = ["evaluate", str(vgp_model_dir), "--task", "vgp", "--out", out, *SYNTHETIC_FLAGS]
    assert_refused(capsys, "evaluate", argv, "--out", "model")
    assert tree_digest(vgp_model_dir) == before


# ----------------------------------------------------------------------------------------------------------------
# Result files: written atomically, replacing only what the library wrote
# ----------------------------------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_previous_result_whole(vgp_model_dir, tmp_path, capsys, monkeypatch):
    from hf_vlalign.utils import atomic_folders

    out, plot = tmp_path / "probe.json", tmp_path / "probe.png"
    argv = ["probe", str(vgp_model_dir), "--json", str(out), "--plot", str(plot), *SYNTHETIC_FLAGS]
    assert main(argv) == 0
    assert main(argv) == 0  # its own results are replaced
    before = {path: path.read_bytes() for path in (out, plot)}

    def disk_full(path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(atomic_folders, "fsync_path", disk_full)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(argv)
    assert "hf-vlalign probe: error: No space left on device" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in (out, plot)} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["probe.json", "probe.png"]  # no partial file left


def test_results_never_replace_a_file_the_library_did_not_write(vgp_model_dir, tmp_path, capsys):
    notes, photo = tmp_path / "notes.json", tmp_path / "photo.png"
    notes.write_text('{"my": "notes"}')
    Image.new("RGB", (8, 8), (10, 200, 10)).save(photo)
    before = tree_digest(tmp_path)
    probe = ["probe", str(vgp_model_dir), *SYNTHETIC_FLAGS]
    assert_refused(capsys, "probe", [*probe, "--json", str(notes)], "--json")
    assert_refused(capsys, "probe", [*probe, "--plot", str(photo)], "--plot")
    assert_refused(capsys, "evaluate", ["evaluate", str(vgp_model_dir), "--task", "vgp", "--out", str(notes)], "--out")
    assert_refused(capsys, "explore", ["explore", str(vgp_model_dir), "--out", str(notes)], "--out")
    assert tree_digest(tmp_path) == before


def test_a_result_that_is_a_hard_link_leaves_the_linked_file_alone(vgp_model_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(vgp_model_dir, model)
    out = tmp_path / "probe.json"
    assert main(["probe", str(model), "--json", str(out), *SYNTHETIC_FLAGS]) == 0
    (model / "probe.json").write_text(out.read_text() + " ")  # an earlier result, kept there
    out.unlink()
    os.link(model / "probe.json", out)  # the --json path shares its content with a file inside the model folder
    before = tree_digest(model)
    assert main(["probe", str(model), "--json", str(out), *SYNTHETIC_FLAGS]) == 0
    assert tree_digest(model) == before and out.stat().st_nlink == 1


def test_a_symbolic_link_loop_as_output_is_one_line(vgp_model_dir, tmp_path, capsys):
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    error = assert_refused(capsys, "probe", ["probe", str(vgp_model_dir), "--json", str(loop), *SYNTHETIC_FLAGS], "--json")
    assert str(loop) in error


def test_a_wrong_typed_config_field_is_one_line_naming_the_file_and_field(vgp_model_dir, tmp_path, capsys):
    from hf_vlalign.vlms.tiny import tiny_patch_model, word_level_tokenizer

    model = tmp_path / "model"
    shutil.copytree(vgp_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"hidden_size": "wide"}))
    error = assert_refused(capsys, "evaluate", ["evaluate", str(model), "--task", "vgp", *SYNTHETIC_FLAGS])
    assert f"{model}/config.json" in error and "hidden_size" in error
    # a transformers VLM's config: huggingface_hub's strict dataclasses refuse the field
    llava, processor = tiny_patch_model("llava", tokenizer=word_level_tokenizer(["a red circle"]), seed=0)
    llava.save_pretrained(tmp_path / "llava")
    processor.save_pretrained(tmp_path / "llava")
    config = json.loads((tmp_path / "llava" / "config.json").read_text())
    config["text_config"]["vocab_size"] = "many"
    (tmp_path / "llava" / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # the save's progress bar
    error = assert_refused(capsys, "probe", ["probe", str(tmp_path / "llava"), *SYNTHETIC_FLAGS], "model")
    assert f"{tmp_path / 'llava'}/config.json" in error and "'vocab_size'" in error
