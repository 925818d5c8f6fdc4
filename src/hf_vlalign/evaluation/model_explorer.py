"""`hf-vlalign explore`: the interactive word-region attention explorer (`analysis.explorer`) of a saved model of any
family, on the first examples of the synthetic scenes or of a user's `caption` file, with the grounding probe's
per-head accuracy. Boxes are drawn only on the image whose regions they are: an `image` without its own text and
boxes is refused, never overlaid with another image's boxes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoTokenizer

from ..analysis.explorer import explorer_examples, is_explorer_page, probed_examples, write_attention_explorer
from ..analysis.grounding_probe import GroundingProbe
from ..models.family import family_spec
from ..synthetic import SyntheticSceneConfig
from ..utils.output_paths import refuse_foreign_file, refuse_output_overlapping_inputs
from ..utils.size_limits import MAX_ANALYSIS_EXAMPLES, MAX_BATCH_SIZE, MAX_EXPLORER_EXAMPLES, check_size
from .grounding import probe_over_blocks
from .inference import first_examples, inference_batches
from .model_analysis import ATTENTION_TARGET_KEYS, gold_phrases, synthetic_analysis_data, user_analysis_data
from .tasks import load_model
from .user_files import user_file_images

__all__ = ["ExplorerPage", "explore_model"]


class ExplorerPage(NamedTuple):
    """What `explore_model` wrote: the HTML file, the examples it shows and the examples its probe grid read."""

    path: Path
    num_examples: int
    probe_examples: int


def _readable_image(path: Path) -> Path:
    """`path` when PIL reads it as an image; else a ValueError naming `image` and the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            opened.verify()
    # PIL's truncated-file errors include SyntaxError; DecompressionBombError: more pixels than PIL's limit
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError) as error:
        raise ValueError(f"`image` {path} is not a readable image ({error}).") from None
    return path


def image_shown(image: str | os.PathLike | None, data_file: str | os.PathLike | None) -> str | None:
    """The image id whose rows `image` asks for (None without `image`), checked before the model runs: an image is
    refused without a `data_file` (it would get a synthetic scene's boxes and text) and when no row of the file names
    it (it would get another image's)."""
    from ..data.builders.user_data import read_user_rows

    if image is None:
        return None
    if data_file is None:
        raise ValueError(
            f"`image` {image} has no text and boxes of its own: the synthetic scenes' boxes and captions are drawn only "
            "on their own renderings; give a `data_file` whose rows name the image (its caption and phrase boxes)."
        )
    named = {path.resolve(): path for row in read_user_rows(data_file, "caption") for path in row.images.values()}
    if Path(image).resolve() not in named:
        names = ", ".join(sorted({path.name for path in named.values()}))
        raise ValueError(
            f"`image` {image} is named by no row of `data_file` {data_file} (its images: {names}): the explorer draws a "
            "row's boxes and text only on that row's own image."
        )
    return named[Path(image).resolve()].stem


def check_explorer_output(out: str | os.PathLike, inputs: dict, output_argument: str = "out") -> None:
    """Before the model runs: `out` is none of `inputs` (the model folder, the image), nor inside or around one, and is
    new or an earlier explorer page (any other file is left alone)."""
    refuse_output_overlapping_inputs(out, inputs, output_argument=output_argument)
    refuse_foreign_file(out, output_argument, description="an attention explorer page", is_own=is_explorer_page)


@torch.no_grad()
def explore_model(
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    num_examples: int = 4,
    data_file: str | os.PathLike | None = None,
    image: str | os.PathLike | None = None,
    max_text_length: int = 64,
    synthetic: SyntheticSceneConfig | None = None,
    probe_examples: int = 128,
    batch_size: int = 32,
    progress: bool = True,
) -> ExplorerPage:
    """Writes the attention explorer (one self-contained HTML file) of the model saved in `model_dir`; returns the file
    and the counts of examples it shows and probed (a count larger than the split is cut to it, with a warning).

    Args:
        model_dir: an hf_vlalign checkpoint of any family (with its tokenizer).
        out: the HTML file, new or an earlier explorer page, and none of the inputs, nor inside or around one.
        num_examples: the first N examples to show (at most `MAX_EXPLORER_EXAMPLES`).
        data_file: a user's `caption` file (default: the synthetic scenes' evaluation split, `synthetic`), each
            example drawn on its own image; `image`: show only the rows of this image, which the file names.
        max_text_length: word pieces per caption of `data_file` (longer ones are cut).
        probe_examples: examples the grounding probe's accuracy grid is computed on (0: no grid), `batch_size` at a time.
    """
    for name, value, low in (
        ("num_examples", num_examples, 1),
        ("probe_examples", probe_examples, 0),
        ("batch_size", batch_size, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}.")
    check_size("num_examples", num_examples, MAX_EXPLORER_EXAMPLES, limit_name="MAX_EXPLORER_EXAMPLES")
    check_size("probe_examples", probe_examples, MAX_ANALYSIS_EXAMPLES, minimum=0, limit_name="MAX_ANALYSIS_EXAMPLES")
    check_size("batch_size", batch_size, MAX_BATCH_SIZE, limit_name="MAX_BATCH_SIZE")
    if image is not None and not Path(image).is_file():
        problem = "is a folder" if Path(image).is_dir() else "which does not exist"
        raise ValueError(f"`image` must be an image file that `data_file` names, got {str(image)!r} {problem}.")
    inputs = {"model_dir": model_dir, "data_file": data_file, "image": image}
    check_explorer_output(out, inputs | user_file_images(data_file, "caption"))
    if image is not None:  # checked before the model runs
        _readable_image(Path(image))
    image_id = image_shown(image, data_file)
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if data_file is not None:
        data = user_analysis_data(model_dir, model, tokenizer, data_file, max_text_length, require_phrases=False)
    else:
        data = synthetic_analysis_data(model, tokenizer, synthetic or SyntheticSceneConfig())
    source = family_spec(model).name
    if data.encoder_only:  # single captions carry no inputs of a single-stream task head
        model = model.base_model
    end_token = getattr(model.config, "use_end_token", None)
    captioner = source == "captioner"
    dataset = data.dataset if image_id is None else data.dataset.filter(lambda row: row["image_id"] == image_id)
    probe, probed = None, ()
    if probe_examples:  # Li et al.'s probe of every word->region head (no grid when no phrase is grounded)
        probed = first_examples(dataset, probe_examples, data.description, "probe_examples")
        probe = GroundingProbe(*family_spec(model).probe_shape(model))
        probe_over_blocks(probe, model, probed, data.collator, data.text_mask_key, batch_size, progress)
        probe = probe.compute() if probe.num_phrases else None
    examples = []
    shown = first_examples(dataset, num_examples, data.description, "num_examples")
    batches = inference_batches(model, shown, data.collator, 1, exclude=ATTENTION_TARGET_KEYS, forward_arguments_only=True)
    for one in batches:
        row, batch = one.rows[0], one.batch
        image = data.image_path(row["image_id"])  # the user file's image, or the synthetic scene's rendering
        outputs = model(**one.inputs, output_attentions=True)
        text_mask = batch[data.text_mask_key]
        ids = batch["labels" if captioner else "input_ids"][0][text_mask[0].bool()]
        examples += explorer_examples(
            outputs, words=[tokenizer.convert_ids_to_tokens(ids.tolist())], region_boxes=batch["visual_boxes"],
            text_mask=text_mask, region_mask=batch["visual_attention_mask"], gold=[gold_phrases(row, data, captioner)],
            images=[image if image is not None and image.is_file() else None], source=source, end_token=end_token,
            titles=[" / ".join(row[column] for column in data.collator.text_columns)],
        )  # fmt: skip
    subtitle = (
        f"{model.config.model_type} from {model_dir}; {data.description}; each query's weights renormalised over the "
        "keys of the direction (language \u2192 vision: a word's weights over the boxes sum to 1); layers and heads "
        "counted from 0"
    )
    path = write_attention_explorer(
        examples,
        out,
        probe=probe,
        title=f"Word-region attention: {Path(model_dir).name}",
        subtitle=subtitle,
        source=source,
        probe_examples=_probe_examples_note(len(probed), len(dataset), data.description, image_id),
    )
    return ExplorerPage(path, len(shown), len(probed))


def _probe_examples_note(count: int, total: int, description: str, image_id: str | None) -> str:
    """Which examples the probe grid read and, for a whole data file or split, how `hf-vlalign analyze` reads the same
    ones (its best head is then the page's: the same probe on the same examples)."""
    if image_id is not None:
        return f"{probed_examples(count, total)} of image {image_id} in {description}"
    same = "" if count == total else f" --max_examples {count}"
    return f"{probed_examples(count, total)} of {description} (hf-vlalign analyze{same} reads the same)"
