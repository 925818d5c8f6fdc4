"""The embedded default data: synthetic grounded scenes (`hf_vlalign.synthetic`), generated once in the published
formats (cached in `data_dir`, or `$HF_VLALIGN_CACHE` / `~/.cache/hf_vlalign`) and read by the real builder of `task`
(`TASKS`; see docs/datasets.md).
"""

from __future__ import annotations

from pathlib import Path

import datasets

from ...synthetic.questions import ANSWER_VOCAB_FILE, scene_graphs_file
from ...synthetic.scenes import SyntheticSceneConfig, load_or_generate_synthetic_vgp
from ...synthetic.tasks import NLVR2_SPLITS, REFCOCO_SPLITS
from ..feature_store import RegionFeatureStore
from . import flickr30k_entities, gqa, nlvr2, refcoco
from .nlvr2 import attach_pair_features  # what `build_dataset(..., task="nlvr2", region_features=store)` joins with
from ._common import DEFAULT_ON_MISSING_IMAGE
from .vgp import _synthetic_store, build_vgp_dataset

TASKS = ("vgp", "captions", "questions", "nlvr2", "refcoco")
SPLITS = ("train", "val")
TASK_SPLITS = {"nlvr2": {**NLVR2_SPLITS, "dev": "dev"}, "refcoco": REFCOCO_SPLITS}  # our split -> the dataset's


def build(
    data_dir: str | Path | None,
    split: str,
    *,
    task: str = "vgp",
    config: SyntheticSceneConfig | None = None,
    on_missing_image: str = DEFAULT_ON_MISSING_IMAGE,
    **options,
) -> datasets.Dataset:
    """One split of the synthetic scenes; `options` and `on_missing_image` go to the task's builder (e.g.
    `negatives=` for "vgp", or `answer_vocab=` / `scene_graphs=` replacing the generated ones for "questions")."""
    _check_task(task)
    splits = TASK_SPLITS.get(task, {name: name for name in SPLITS})
    if split not in splits:
        raise ValueError(f"`split` of synthetic_scenes (task {task!r}) must be one of {list(splits)}, got {split!r}.")
    paths = load_or_generate_synthetic_vgp(cache_dir=data_dir, config=config)
    if task == "vgp":
        seed = options.pop("seed", {"train": 1, "val": 2}[split])
        return build_vgp_dataset(
            paths.flickr30k_entities, paths.vgp_csv[split], seed=seed, on_missing_image=on_missing_image, **options
        )
    if task == "questions":
        options.setdefault("scene_graphs", scene_graphs_file(split))
        options.setdefault("answer_vocab", ANSWER_VOCAB_FILE)
        return gqa.build(paths.gqa_dir, split, on_missing_image=on_missing_image, **options)
    if task == "nlvr2":
        return nlvr2.build(paths.nlvr2_dir, splits[split], **options)
    if task == "refcoco":
        return refcoco.build(paths.refcoco_dir, splits[split], on_missing_image=on_missing_image, **options)
    return flickr30k_entities.build(paths.flickr30k_entities, split, on_missing_image=on_missing_image, **options)


def synthetic_region_features(
    data_dir: str | Path | None = None, config: SyntheticSceneConfig | None = None, *, task: str | None = None
) -> RegionFeatureStore:
    """The region-feature store of the synthetic scenes (converted once from their LXMERT TSV); with task="nlvr2",
    that of the NLVR2 pair images, keyed by NLVR2's image ids."""
    if task is not None:
        _check_task(task)
    paths = load_or_generate_synthetic_vgp(cache_dir=data_dir, config=config)
    if task == "nlvr2":
        return _synthetic_store(paths.nlvr2_features_tsv, paths.root / "nlvr2_region_features")
    return _synthetic_store(paths.features_tsv, paths.root / "region_features")


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"`task` of synthetic_scenes must be one of {TASKS}, got {task!r}.")
