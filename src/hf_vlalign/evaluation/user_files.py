"""A saved model run on a user-format file (`data.builders.user_data`): the file's images get their regions and
features as the model's processor makes them (`region_options_for_model`, the one place that choice is made), in
`load_user_data`'s cache (`$HF_VLALIGN_CACHE/user_features`: each image's features reused while it and the options
are unchanged, the log saying so)."""

from __future__ import annotations

import os
from pathlib import Path

from ..data.builders.user_data import DEFAULT_REGION_OPTIONS, UserData, UserDataError, load_user_data

__all__ = ["check_grounded_phrases", "load_user_file", "region_options_for_model", "user_file_images"]


def region_options_for_model(model_dir: str | os.PathLike, config) -> dict:
    """The `extract_region_features` options that make regions and features of new images for the model saved in
    `model_dir`, as its processor makes them: those its `processor_config.json` records, else `DEFAULT_REGION_OPTIONS`;
    the pixel encoder's `feature_dim` is the model's `visual_feat_dim`. Refused: a processor without an encoder (e.g.
    published bottom-up-attention features) and one of another `feature_dim`."""
    import inspect

    from ..data.formats.text_files import read_json_file
    from ..data.region_extraction import extract_region_features

    visual_feat_dim = config.visual_feat_dim
    processor_file = Path(model_dir) / "processor_config.json"
    saved = read_json_file(processor_file) if processor_file.is_file() else {}
    saved = saved.get("image_processor") if isinstance(saved, dict) else None
    if not isinstance(saved, dict):
        return {**DEFAULT_REGION_OPTIONS, "feature_dim": visual_feat_dim}
    if "encoder" in saved and saved["encoder"] is None:
        raise ValueError(
            f"`model` {model_dir} reads region features made from files (its processor has no encoder, e.g. published "
            "bottom-up-attention features): the features of a data file's images cannot be made for it."
        )
    names = set(inspect.signature(extract_region_features).parameters) - {"images", "out_dir", "boxes", "overwrite"}
    options = {name: value for name, value in saved.items() if name in names and value is not None}
    if options.get("feature_dim", visual_feat_dim) != visual_feat_dim:
        raise ValueError(
            f"`model` {model_dir}: its processor makes {options['feature_dim']}-dimensional region features "
            f"(processor_config.json), but the model reads {visual_feat_dim} (`visual_feat_dim`)."
        )
    if options.get("encoder", "pixel") == "pixel":
        options["feature_dim"] = visual_feat_dim
    return options


def load_user_file(model_dir: str | os.PathLike, config, data_file: str | os.PathLike, task: str) -> UserData:
    """The user-format `data_file` of `task` joined to its images' region features, made with
    `region_options_for_model`; the store's feature dimension must be the model's `visual_feat_dim`."""
    data = load_user_data(data_file, task, region_options=region_options_for_model(model_dir, config))
    if data.store.feature_dim != config.visual_feat_dim:
        raise ValueError(
            f"the region features of `data_file` {data_file} have {data.store.feature_dim} dimensions, but `model` "
            f"{model_dir} reads {config.visual_feat_dim} (`visual_feat_dim`)."
        )
    return data


def check_grounded_phrases(data: UserData, data_file: str | os.PathLike, purpose: str) -> None:
    """Refuses a `caption` file without any phrase with boxes (`phrases`): `purpose` needs them."""
    if not any(spans for spans in data.train["caption_phrase_spans"]):
        raise UserDataError(
            f"`data_file` {data_file} has no grounded phrases (a `phrases` column of {{\"text\", \"boxes\"}} objects): "
            f"{purpose} scores each phrase's attention against its gold boxes."
        )


def user_file_images(data_file: str | os.PathLike | None, task: str, argument: str = "data_file") -> dict[str, Path]:
    """The images a user-format file of `task` names, labelled "<argument> image <name>", for the output-overlap checks
    ({} without a file): inputs that no output may be, be inside or hold."""
    from ..data.builders.user_data import read_user_rows

    if data_file is None:
        return {}
    images = dict.fromkeys(image for row in read_user_rows(data_file, task) for image in row.images.values())
    return {f"{argument} image {image.name}": image for image in images}
