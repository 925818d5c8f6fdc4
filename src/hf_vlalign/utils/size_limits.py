"""The documented upper bounds of every user-given size that allocates memory or disk in proportion to it, refused
before anything is allocated (a typo such as `--grid_size 100000` would ask for 10^10 boxes). Each limit is far above
what the papers' experiments use (the comment says why that value). Standard library only: the CLI parser uses it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

# extract-features' g x g grid: 64 x 64 = 4096 regions per image, 40x the 100 regions of the published
# bottom-up-attention features, and each region's crop keeps at least 1 pixel on a 64-pixel image.
MAX_GRID_SIZE = 64
# boxes given for one image (a --boxes file, a store record): 4096, the region count of the largest grid above.
MAX_REGIONS_PER_IMAGE = 4096
# dimension of region features (extract-features --feature_dim, a processor's `feature_dim`): 16384, 8x the 2048-d
# bottom-up-attention features; the pixel encoder's projection is then ~520 x 16384 floats.
MAX_FEATURE_DIM = 16384
# bytes of one array a feature file declares for one image (an `.npy`, a member of an `.npz`, an HDF5 dataset slice):
# 1 GiB, 4x a MAX_REGIONS_PER_IMAGE x MAX_FEATURE_DIM float32 array would be 256 MiB; a small compressed file can
# declare far more, and NumPy / h5py allocate what is declared before reading.
MAX_ARRAY_BYTES = 1 << 30
# side in pixels of a backbone encoder's input (the `size` of its preprocessor_config.json), to which every image is
# resized: 4096, 8x the 518 pixels of the largest common ViT inputs.
MAX_BACKBONE_INPUT_SIDE = 4096
# images of the synthetic scenes per split: 200,000, more than COCO's 123,287 images; each one is a PNG on disk.
MAX_SYNTHETIC_IMAGES = 200_000
# examples read by the analysis verbs (analyze --max_examples, explore --num_examples / --probe_examples, probe
# --max_images): 1,000,000, above any evaluation split of the papers' data (VQA v2 val: 214,354 questions).
MAX_ANALYSIS_EXAMPLES = 1_000_000
# examples the explorer page embeds (explore --num_examples): each carries every layer's and head's word-region
# attention, about 1 MB of HTML for a 12-layer model; 1,000 keeps the page below a browser's comfortable size.
MAX_EXPLORER_EXAMPLES = 1_000
# examples per forward pass of the analysis and evaluation verbs (--batch_size): the attention maps kept for analysis are
# batch x layers x heads x (text + regions)^2 floats, 4 GB at 4096 for a 12-layer, 12-head model with 140 positions.
MAX_BATCH_SIZE = 4096
# k of the per-image spatial k-means (analyze --num_spatial_clusters): one cluster per region at most, and an image has
# at most MAX_REGIONS_PER_IMAGE regions.
MAX_SPATIAL_CLUSTERS = MAX_REGIONS_PER_IMAGE
# word pieces per text (--max_text_length): 8192, above the position embeddings of every BERT-family text model.
MAX_TEXT_LENGTH = 8192
# Fisher batches (fisher --num_batches): 10^7 batches, above any split of the papers' data at batch size 1.
MAX_FISHER_BATCHES = 10_000_000
# beams of `generate()` (num_beams): the decoder's cache holds batch x beams copies of every layer's keys and values;
# 64 is 16x the 3-5 beams of the captioning papers.
MAX_NUM_BEAMS = 64
# new tokens of `generate()` (max_new_tokens): 8192, above the position embeddings of the captioner (a caption is ~20
# tokens); the model refuses a caption longer than its own `max_position_embeddings` anyway, this bounds the request.
MAX_NEW_TOKENS = 8192


class SizeLimitError(ValueError):
    """A user-given size above its documented limit."""


def check_size(argument: str, value: object, limit: int, *, minimum: int = 1, limit_name: str = "") -> int:
    """`value` as an int in [minimum, limit]; otherwise a ValueError ([`SizeLimitError`] above the limit) naming
    `argument`, the bounds and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{argument}` must be an int in [{minimum}, {limit}], got {type(value).__name__} {value!r}.")
    if value < minimum:
        raise ValueError(f"`{argument}` must be >= {minimum}, got {value}.")
    if value > limit:
        named = f" ({limit_name} in hf_vlalign.utils.size_limits)" if limit_name else ""
        raise SizeLimitError(f"`{argument}` must be <= {limit}{named}, got {value}.")
    return value


def int_at_most(limit_name: str) -> Callable[[str], int]:
    """An argparse `type=`: the option's text as an int at most the limit named `limit_name` (a constant of this
    module), else argparse's one-line error "argument --x: must be <= ...". The lower bound stays with the function
    the option is passed to (its own message), or with the CLI's `check_options` for the counts it names."""
    limit = globals()[limit_name]

    def parse(text: str) -> int:
        value = int(text)  # a ValueError: argparse's own "invalid int value" message
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be <= {limit} ({limit_name} in hf_vlalign.utils.size_limits), got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def check_generation_sizes(num_beams: object, max_new_tokens: object) -> None:
    """The sizes of a `generate()` call that allocate (its beams and new tokens; None: not given), within
    `MAX_NUM_BEAMS` and `MAX_NEW_TOKENS`."""
    if num_beams is not None:
        check_size("num_beams", num_beams, MAX_NUM_BEAMS, limit_name="MAX_NUM_BEAMS")
    if max_new_tokens is not None:
        check_size("max_new_tokens", max_new_tokens, MAX_NEW_TOKENS, limit_name="MAX_NEW_TOKENS")
