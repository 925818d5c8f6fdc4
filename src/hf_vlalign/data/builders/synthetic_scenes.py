"""The embedded default data: synthetic grounded scenes (`data/synthetic.py`), read through the real builders.

`load_dataset("synthetic_scenes", data_dir, split, task="vgp")` generates the scenes once (cached in `data_dir`, or
in `$HF_VLALIGN_CACHE` / `~/.cache/hf_vlalign` when `data_dir` is None) in the published Flickr30k Entities, VGP and
GQA formats, then builds them with the `vgp` builder (`task="vgp"`), the `flickr30k_entities` builder
(`task="captions"`, one row per caption) or the `gqa` builder (`task="questions"`, one row per question, with the
split's scene graphs and the trainval answer vocabulary, so rows have `label` and boxed pointers). Their region
features: `synthetic_region_features(...)`; its image ids are the rows' `image_id`.
"""

from __future__ import annotations

from pathlib import Path

import datasets

from ..feature_store import RegionFeatureStore
from ..synthetic import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from ..synthetic_questions import ANSWER_VOCAB_FILE, scene_graphs_file
from .vgp import _synthetic_store, build_vgp_dataset

TASKS = ("vgp", "captions", "questions")
SPLITS = ("train", "val")


def build(
    data_dir: str | Path | None,
    split: str,
    *,
    task: str = "vgp",
    config: SyntheticSceneConfig | None = None,
    **options,
) -> datasets.Dataset:
    """One split of the synthetic scenes; `options` go to the task's builder (e.g. `negatives=` for "vgp", or
    `answer_vocab=` / `scene_graphs=` replacing the generated ones for "questions")."""
    if task not in TASKS:
        raise ValueError(f"`task` of synthetic_scenes must be one of {TASKS}, got {task!r}.")
    if split not in SPLITS:
        raise ValueError(f"`split` of synthetic_scenes must be one of {SPLITS}, got {split!r}.")
    paths = load_or_generate_synthetic_vgp(cache_dir=data_dir, config=config)
    if task == "vgp":
        seed = options.pop("seed", {"train": 1, "val": 2}[split])
        return build_vgp_dataset(paths.flickr30k_entities, paths.vgp_csv[split], seed=seed, **options)
    if task == "questions":
        from .gqa import build as build_questions

        options.setdefault("scene_graphs", scene_graphs_file(split))
        options.setdefault("answer_vocab", ANSWER_VOCAB_FILE)
        return build_questions(paths.gqa_dir, split, **options)
    from .flickr30k_entities import build as build_captions

    return build_captions(paths.flickr30k_entities, split, **options)


def synthetic_region_features(
    data_dir: str | Path | None = None, config: SyntheticSceneConfig | None = None
) -> RegionFeatureStore:
    """The region-feature store of the synthetic scenes (converted once from their LXMERT TSV)."""
    paths = load_or_generate_synthetic_vgp(cache_dir=data_dir, config=config)
    return _synthetic_store(paths.features_tsv, paths.root / "region_features")
