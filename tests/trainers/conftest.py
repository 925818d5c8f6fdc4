"""Fixtures the trainer tests share."""

import pytest

from hf_vlalign.data.builders import load_vgp_data
from hf_vlalign.synthetic import SyntheticSceneConfig


@pytest.fixture(scope="module")
def vgp_data(tmp_path_factory):
    """The main job's data at its smallest: 4 + 4 synthetic scenes with 32-dim features, in a fresh cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_VLALIGN_CACHE", str(tmp_path_factory.mktemp("cache")))
        scenes = SyntheticSceneConfig(num_train_images=4, num_val_images=4, feature_dim=32)
        return load_vgp_data(synthetic_config=scenes)
