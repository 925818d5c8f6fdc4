"""Synthetic scenes with distractors: each image's first shape (its target) has a same-kind / other-colour and a
same-colour / other-kind shape in its image; the default world is unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from script_modules import ROOT, load_script

from hf_vlalign.cli import USER_FILE, synthetic_config, build_parser, check_options
from hf_vlalign.data.formats import iter_lxmert_tsv_records
from hf_vlalign.data.region_extraction import CropEncoder
from hf_vlalign.recipes import DataArguments, parse_recipe_args, synthetic_scene_config
from hf_vlalign.synthetic import Shape, SyntheticSceneConfig, distractor_statistics, generate_synthetic_scenes
from hf_vlalign.synthetic.scenes import _manifest, _sample_scene

# The default world's cache digest and a hash of its first 50 sampled scenes, computed from the code before the
# `distractors` option existed: the default world must stay byte-identical. The digest and the files hash are those of
# FORMAT_VERSION 4 (GQA's entailed questions, gqa/{split}_all_questions.json); the scenes themselves are unchanged.
DEFAULT_WORLD_DIGEST = "193787fec7ef39d2"
DEFAULT_SCENES_HASH = "fce62af972f167cb"
# Every file of the default world with 6 train and 3 val images (seed 0), hashed by content (`_files_hash`).
TINY_DEFAULT_FILES_HASH = "31f4a1978c4011ea"


def _scenes(config: SyntheticSceneConfig, num_images: int) -> list[list[Shape]]:
    """The shapes of the first `num_images` images, drawn as `generate_synthetic_scenes` draws them."""
    return [_sample_scene(config, np.random.default_rng([config.seed, index]), 1) for index in range(num_images)]


def _digest(config: SyntheticSceneConfig) -> str:
    """The cache folder's digest (`load_or_generate_synthetic_vgp`)."""
    return hashlib.sha256(json.dumps(_manifest(config), sort_keys=True).encode()).hexdigest()[:16]


def _is_feature_file(path: Path) -> bool:
    return path.parent.name == "features" and path.suffix == ".tsv"


def _files_hash(root: Path) -> str:
    """Every file of a world, hashed by content: the images by their pixels (PNG bytes vary with the zlib build) and
    the feature files without their region features, float32 matrix products whose last bits vary with the BLAS
    build and CPU (`_assert_features_are_the_encoders` checks those)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        digest.update(str(path.relative_to(root)).encode())
        if path.suffix == ".png":
            digest.update(np.asarray(Image.open(path)).tobytes())
        elif _is_feature_file(path):
            for record in iter_lxmert_tsv_records(path):
                fields = {key: np.asarray(value).tolist() for key, value in record.items() if key != "features"}
                digest.update(repr(fields).encode())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _assert_features_are_the_encoders(root: Path, config: SyntheticSceneConfig) -> None:
    """Each image's region features are the crop encoder's output on its image and boxes, within float32 rounding."""
    encoder = CropEncoder(config.feature_dim, config.seed)
    records = list(iter_lxmert_tsv_records(root / "features" / "features.tsv"))
    assert len(records) == config.num_train_images + config.num_val_images
    for record in records:
        image = Image.open(root / "images" / f"{record['image_id']}.png").convert("RGB")
        expected = encoder.encode(image, record["boxes"])
        np.testing.assert_allclose(record["features"], expected, rtol=1e-5, atol=1e-6)


def test_every_target_has_both_distractors_and_triples_stay_distinct():
    config = SyntheticSceneConfig(distractors=True, seed=3)
    for shapes in _scenes(config, 60):
        assert config.max_shapes >= len(shapes) >= 3
        target = shapes[0]
        assert any(s.kind == target.kind and s.colour != target.colour for s in shapes[1:])
        assert any(s.colour == target.colour and s.kind != target.kind for s in shapes[1:])
        triples = [(s.kind, s.colour, s.size) for s in shapes]
        assert len(set(triples)) == len(triples)


def test_min_shapes_above_three_is_kept_with_distractors():
    config = SyntheticSceneConfig(min_shapes=4, max_shapes=5, distractors=True)
    assert {len(shapes) for shapes in _scenes(config, 30)} <= {4, 5}


def test_default_world_is_unchanged():
    config = SyntheticSceneConfig()
    assert "distractors" not in _manifest(config)["config"]
    assert _digest(config) == DEFAULT_WORLD_DIGEST
    assert _digest(SyntheticSceneConfig(distractors=True)) != DEFAULT_WORLD_DIGEST
    scenes_hash = hashlib.sha256()
    for index in range(50):
        rng = np.random.default_rng([config.seed, index])
        scenes_hash.update(repr(_sample_scene(config, rng, 1)).encode())
        scenes_hash.update(repr(rng.random()).encode())  # the draws after the scene are unchanged too
    assert scenes_hash.hexdigest()[:16] == DEFAULT_SCENES_HASH


def test_default_world_files_are_unchanged(tmp_path):
    config = SyntheticSceneConfig(num_train_images=6, num_val_images=3)
    paths = generate_synthetic_scenes(tmp_path / "scenes", config)
    assert _files_hash(paths.root) == TINY_DEFAULT_FILES_HASH
    _assert_features_are_the_encoders(paths.root, config)


def test_distractor_statistics_of_generated_worlds(tmp_path):
    statistics = {}
    for distractors in (False, True):
        config = SyntheticSceneConfig(num_train_images=8, num_val_images=2, feature_dim=8, distractors=distractors)
        paths = generate_synthetic_scenes(tmp_path / str(distractors), config)
        statistics[distractors] = distractor_statistics(paths, "train")
        assert statistics[distractors]["num_images"] == 8
        assert json.loads((paths.root / "manifest.json").read_text())["config"].get("distractors", False) is distractors
    assert statistics[True]["images_with_both"] == 1.0
    for key in ("same_kind_other_colour", "same_colour_other_kind", "images_with_both"):
        assert statistics[True][key] > statistics[False][key]


def test_distractor_statistics_of_shape_lists():
    default = distractor_statistics(_scenes(SyntheticSceneConfig(), 100))
    distractors = distractor_statistics(_scenes(SyntheticSceneConfig(distractors=True), 100))
    assert distractors["images_with_both"] == 1.0 > default["images_with_both"]
    assert distractors["same_kind_other_colour"] > default["same_kind_other_colour"]
    assert distractors["same_colour_other_kind"] > default["same_colour_other_kind"]
    # the target and its distractor of each kind qualify: at least 2 of at most max_shapes shapes per image
    lowest = 2 / SyntheticSceneConfig().max_shapes
    assert min(distractors["same_kind_other_colour"], distractors["same_colour_other_kind"]) >= lowest


def test_distractor_statistics_counts_by_hand():
    box = (0, 0, 1, 1)
    shapes = [
        Shape("circle", "red", "small", box, "1"),
        Shape("circle", "blue", "small", box, "2"),  # same kind as 1, other colour
        Shape("square", "green", "large", box, "3"),  # no partner
    ]
    lonely = [Shape("star", "red", "small", box, "4")]
    statistics = distractor_statistics([shapes, lonely])
    assert statistics == {
        "same_kind_other_colour": 2 / 4,
        "same_colour_other_kind": 0.0,
        "images_with_both": 0.0,
        "num_images": 2,
        "num_shapes": 4,
    }


@pytest.mark.parametrize(
    "scenes, message",
    [
        ([[]], "must hold at least one shape"),
        (3, "must be a SyntheticVGPPaths or a list of shape lists, got int"),
    ],
)
def test_distractor_statistics_refuses_bad_input(scenes, message):
    with pytest.raises(ValueError, match=message):
        distractor_statistics(scenes)


def test_distractors_must_be_a_bool():
    for value in (1, "yes", None, np.bool_(True)):
        with pytest.raises(ValueError, match=rf"`distractors` must be a bool, got {type(value).__name__}"):
            SyntheticSceneConfig(distractors=value)


def test_int_fields_still_refuse_bools():
    with pytest.raises(ValueError, match="`seed` must be an int, got bool True"):
        SyntheticSceneConfig(seed=True)


def test_distractors_need_three_shapes():
    with pytest.raises(ValueError, match="`max_shapes` must be >= 3 with `distractors=True`.*got 2"):
        SyntheticSceneConfig(min_shapes=1, max_shapes=2, distractors=True)
    SyntheticSceneConfig(min_shapes=1, max_shapes=2)  # fine without distractors


def test_example_flag_reaches_the_scene_config(tmp_path):
    example = load_script("finetune_vgp", ROOT / "examples" / "finetune_vgp.py")
    args, _ = example.parse_args(["--output_dir", str(tmp_path), "--use_cpu", "--synthetic_distractors"])
    assert synthetic_scene_config(args).distractors is True
    args, _ = example.parse_args(["--output_dir", str(tmp_path), "--use_cpu"])
    assert synthetic_scene_config(args).distractors is False
    with pytest.raises(ValueError, match="`--synthetic_distractors` names another data source than `--train_file`"):
        example.parse_args(["--train_file", "train.jsonl", "--synthetic_distractors", "--output_dir", str(tmp_path)])


def test_data_arguments_flag_reaches_the_scene_config_and_is_refused_with_another_dataset():
    (data_args, _) = parse_recipe_args(["--output_dir", "o", "--use_cpu", "--synthetic_distractors"], (DataArguments,))
    assert synthetic_scene_config(data_args) == SyntheticSceneConfig(distractors=True)
    argv = ["--output_dir", "o", "--dataset", "flickr30k_entities", "--synthetic_distractors"]
    with pytest.raises(ValueError, match="`--synthetic_distractors` applies only to"):
        parse_recipe_args(argv, (DataArguments,))


def test_cli_flags_reach_the_scene_config():
    parser = build_parser()
    args = parser.parse_args(["evaluate", "MODEL", "--task", "vgp", "--synthetic_distractors"])
    assert synthetic_config(args).distractors is True
    assert synthetic_config(parser.parse_args(["evaluate", "MODEL", "--task", "vgp"])).distractors is False
    assert parser.parse_args(["synthesize", "--out", "o", "--distractors"]).distractors is True
    args.data, args.data_file = USER_FILE, "captions.jsonl"
    with pytest.raises(ValueError, match="`--synthetic_distractors` applies only to `--data synthetic`"):
        check_options(args, {"synthetic_distractors"})
