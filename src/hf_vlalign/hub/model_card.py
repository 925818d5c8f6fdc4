"""Hub model cards rendered from the Jinja templates in `model_cards/` (one template per model family).

Families: `single_stream` (VGP fine-tuning with attention supervision, Samaran et al.), `two_stream` (LXMERT-style
pre-training with the alignment decoder of Kervadec et al.) and `captioner` (geometry-aware region captioner with A2
attention alignment). Every card's YAML metadata is a `huggingface_hub.ModelCardData`: `library_name: hf_vlalign`,
tags, datasets, `base_model` (when a Hub id) and a `model-index` built from the numeric entries of `eval_results.json`.

Where the templates are found:
- in a source checkout / editable install, in `<repository>/model_cards/` (edits show up at once);
- in an installed wheel, under `<prefix>/share/hf_vlalign/model_cards/`, where setup.cfg's `[options.data_files]`
  installs them; the exact location is read from the distribution's RECORD, so every install scheme works.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from numbers import Real
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..supervision.config import SUPERVISION_METHODS

__all__ = ["MODEL_CARD_FAMILIES", "metrics_from_eval_results", "render_model_card"]

MODEL_CARD_FAMILIES = ("single_stream", "two_stream", "captioner")

_DISTRIBUTION = "hf-vlalign"
_INSTALLED_TEMPLATE_FOLDER = "share/hf_vlalign/model_cards"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

# how each supervision method reads in a sentence, and what it does (Samaran et al. 2021, Sec. 3)
_SUPERVISION_NAMES = {"none": "no", "direct": "direct", "semi_direct": "semi-direct", "indirect": "indirect"}
_SUPERVISION_DESCRIPTIONS = {
    "none": "No attention supervision was used: this checkpoint is the unsupervised VGP fine-tuning baseline.",
    "direct": (
        "Direct supervision treats every supervised head as a classifier: its text->region attention rows, "
        "re-normalised over the regions, and its region->text rows, re-normalised over the words, are trained "
        "towards the gold phrase-box alignment."
    ),
    "semi_direct": (
        "Semi-direct supervision applies the direct objective to attention rollout (the attention flow through all "
        "layers up to the supervised one) instead of the raw per-head attention."
    ),
    "indirect": (
        "Indirect supervision trains a binary phrase-region classifier on the final hidden states, so the "
        "alignment signal reaches the attention only through the representations."
    ),
}
_TAGS = ["vision-language", "attention-supervision", "visual-grounding", "visually-grounded-paraphrases"]


@dataclass(frozen=True)
class _FamilyCard:
    """What differs between the families' cards: the `model-index` task, the tags, the config settings shown."""

    task_type: str
    task_name: str
    tags: tuple[str, ...]
    settings: tuple[str, ...]  # config fields shown in the card's "settings" table
    supervised: bool  # whether the family has `attention_supervision`


_FAMILIES = {
    "single_stream": _FamilyCard(
        task_type="text-classification",
        task_name="Visually grounded paraphrase identification",
        tags=tuple(_TAGS),
        settings=("attention_supervision", "supervised_layers", "supervised_heads", "attention_supervision_weight"),
        supervised=True,
    ),
    "two_stream": _FamilyCard(
        task_type="visual-question-answering",
        task_name="Visual question answering and word-object alignment",
        tags=("vision-language", "visual-grounding", "word-object-alignment", "visual-question-answering", "lxmert"),
        settings=(
            "l_layers", "r_layers", "x_layers", "attention_supervision", "supervised_layers", "supervised_heads",
            "attention_supervision_weight", "task_mask_lm", "task_obj_predict", "task_matched", "task_qa",
            "task_alignment", "alignment_top_k", "alignment_loss_weight",
        ),  # fmt: skip
        supervised=True,
    ),
    "captioner": _FamilyCard(
        task_type="image-to-text",
        task_name="Image captioning",
        tags=("vision-language", "image-captioning", "visual-grounding"),
        settings=(
            "encoder_layers", "decoder_layers", "use_geometry", "attention_alignment", "aligned_layers",
            "alignment_eta", "alignment_temperature", "mask_loss_weight", "normalize_before",
        ),  # fmt: skip
        supervised=False,
    ),
}

_MODEL_TYPES = {
    "single_stream": "vlalign_single_stream",
    "two_stream": "vlalign_two_stream",
    "captioner": "vlalign_captioner",
}

# the A2 fusions of the original and the aligned cross-attention (Fei 2022, sec. 3.3)
_FUSION_DESCRIPTIONS = {
    "none": "No attention alignment: the decoder uses its raw cross-attention (the A2 ablation baseline).",
    "max": "the element-wise maximum of the original and the aligned attention",
    "moving_average": "a moving average of the original and the aligned attention (ratio `alignment_eta`)",
    "exp_decay": "an exponentially decaying mix that moves from the original to the aligned attention during training "
    "(temperature `alignment_temperature`, in steps)",
    "gate": "a learnable gate between the original and the aligned attention",
}


def _find_template(family: str) -> Path:
    """Path of `model_cards/<family>.md`, from the source checkout first, then from the installed distribution."""
    filename = f"{family}.md"
    package_root = Path(__file__).resolve().parents[1]  # .../hf_vlalign
    if package_root.parent.name == "src":
        checkout_template = package_root.parent.parent / "model_cards" / filename
        if checkout_template.is_file():
            return checkout_template
    try:
        files = metadata.distribution(_DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.as_posix().endswith(f"{_INSTALLED_TEMPLATE_FOLDER}/{filename}"):
            installed_template = Path(file.locate()).resolve()
            if installed_template.is_file():
                return installed_template
    raise FileNotFoundError(
        f"The model-card template `{filename}` is neither in the source checkout (model_cards/) nor installed with "
        f"the `{_DISTRIBUTION}` distribution ({_INSTALLED_TEMPLATE_FOLDER}/); reinstall hf_vlalign."
    )


def _check_results(results: dict[str, float]) -> list[tuple[str, float]]:
    if not isinstance(results, dict):
        raise ValueError(f"`results` must be a dict of metric name -> number, got {type(results).__name__}.")
    checked = []
    for name, value in results.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"`results` keys must be non-empty metric names, got {name!r}.")
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"`results[{name!r}]` must be a finite number, got {value!r}.")
        checked.append((name, float(value)))
    return checked


def _check_training(training: dict[str, object]) -> list[tuple[str, str]]:
    if not isinstance(training, dict):
        raise ValueError(f"`training` must be a dict of setting name -> value, got {type(training).__name__}.")
    bad = [name for name in training if not isinstance(name, str) or not name]
    if bad:
        raise ValueError(f"`training` keys must be non-empty setting names, got {bad}.")
    return [(name, str(value)) for name, value in training.items()]


def metrics_from_eval_results(eval_results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The metrics of an `eval_results.json` dict for `render_model_card(results=...)`: its finite float values.

    Integers (counts, layer indices), booleans, strings, lists, nested dicts and `None` (settings and per-layer
    details) are left out, as are NaN and infinite values. `prefix` is put before every name (e.g. `"with_alignment/"`
    for one run of several).
    """
    if not isinstance(eval_results, Mapping):
        raise ValueError(f"`eval_results` must be a dict of name -> value, got {type(eval_results).__name__}.")
    return {
        f"{prefix}{name}": float(value)
        for name, value in eval_results.items()
        if isinstance(value, float) and math.isfinite(value)
    }


def _eval_results(
    results: list[tuple[str, float]], datasets: list[str] | None, family: _FamilyCard
) -> list[EvalResult] | None:
    """`model-index` entries: every metric measured on the family's task, on the first training dataset (or
    synthetic scenes)."""
    if not results:
        return None
    dataset = datasets[0] if datasets else "synthetic-grounded-scenes"
    return [
        EvalResult(
            task_type=family.task_type,
            task_name=family.task_name,
            dataset_type=dataset,
            dataset_name=dataset,
            metric_type=name,
            metric_name=name,
            metric_value=value,
        )
        for name, value in results
    ]


def _config_settings(config: Any, family: str) -> dict[str, Any]:
    """The family's settings read from `config` (a `PreTrainedConfig`, a config dict or None)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        values = dict(config)
    elif hasattr(config, "to_dict"):
        values = config.to_dict()
    else:
        raise ValueError(f"`config` must be a model configuration, a dict or None, got {type(config).__name__}.")
    model_type = values.get("model_type")
    expected = _MODEL_TYPES[family]
    if model_type is not None and model_type != expected:
        raise ValueError(
            f"`config` must be a `{expected}` configuration for the `{family}` card, got model_type {model_type!r}."
        )
    return {name: values[name] for name in _FAMILIES[family].settings if name in values}


def _resolve_supervision(supervision: str | None, settings: dict[str, Any], family: str) -> str:
    from_config = settings.get("attention_supervision")
    if supervision is None:
        supervision = from_config if from_config is not None else "none"
    key = supervision.replace("-", "_") if isinstance(supervision, str) else supervision
    if key not in SUPERVISION_METHODS:
        raise ValueError(f"`supervision` must be one of {SUPERVISION_METHODS}, got {supervision!r}.")
    if not _FAMILIES[family].supervised and key != "none":
        raise ValueError(
            f"`supervision` must be None or 'none' for the `{family}` family (it has no attention supervision), "
            f"got {supervision!r}."
        )
    if from_config is not None and from_config != key:
        raise ValueError(
            f"`supervision` ({supervision!r}) contradicts the config's `attention_supervision` ({from_config!r})."
        )
    return key


def render_model_card(
    family: str,
    *,
    model_id: str | None,
    base_model: str | None,
    supervision: str | None = None,
    results: dict[str, float],
    training: dict[str, object],
    datasets: list[str] | None = None,
    license: str = "apache-2.0",
    synthetic_data: bool | None = None,
    config: Any = None,
    subfolder: str | None = None,
) -> ModelCard:
    """Renders the Hub model card of a checkpoint of `family` (YAML metadata + README body).

    Args:
        family: model family, one of `MODEL_CARD_FAMILIES` (the name of the template in `model_cards/`).
        model_id: Hub id of the checkpoint (`user/name`), used in the loading snippet; None for a local checkpoint.
        base_model: Hub id (or local path) of the text weights the model started from.
        supervision: attention-supervision method, one of `none`, `direct`, `semi_direct`, `indirect`; None reads
            `config.attention_supervision` (or `none`). The captioner has no attention supervision (None or `none`).
        results: metric name -> value, shown as a table and as `model-index` eval results
            (`metrics_from_eval_results(json.load(...))` turns an `eval_results.json` into this).
        training: training settings (epochs, learning rate, ...), shown as a table.
        datasets: Hub ids of the training datasets; None when the library's synthetic scenes were used.
        license: license id of the checkpoint.
        synthetic_data: whether the model was trained on synthetic scenes; defaults to `datasets is None`.
        config: the checkpoint's configuration (a `PreTrainedConfig` or its dict); its supervision / alignment settings
            (two-stream: `task_alignment`, `alignment_top_k`, ...; captioner: `use_geometry`, `attention_alignment`,
            ...) are described and shown as a table. Without it those parts of the card are left out.
        subfolder: folder of the checkpoint inside the repository, when it is not at the root (loading snippet).

    Returns:
        A `huggingface_hub.ModelCard`; `card.save("README.md")` or `card.push_to_hub(repo_id)` publishes it.
    """
    if family not in MODEL_CARD_FAMILIES:
        raise ValueError(f"`family` must be one of the known model families {MODEL_CARD_FAMILIES}, got {family!r}.")
    family_card = _FAMILIES[family]
    settings = _config_settings(config, family)
    supervision_key = _resolve_supervision(supervision, settings, family)
    for name, value in (("model_id", model_id), ("base_model", base_model), ("subfolder", subfolder)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"`{name}` must be a non-empty string or None, got {value!r}.")
    if datasets is not None and (
        not isinstance(datasets, list) or not all(isinstance(d, str) and d for d in datasets)
    ):
        raise ValueError(f"`datasets` must be a list of dataset ids or None, got {datasets!r}.")
    checked_results = _check_results(results)
    checked_training = _check_training(training)
    datasets = datasets or None
    synthetic_data = datasets is None if synthetic_data is None else bool(synthetic_data)

    task_alignment = bool(settings.get("task_alignment", False))
    fusion = settings.get("attention_alignment", "none")
    use_geometry = settings.get("use_geometry")
    if family == "single_stream":
        default_name = f"single-stream-vgp-{supervision_key}"
    elif family == "two_stream":
        default_name = "two-stream-pretrained" + ("-alignment" if task_alignment else "")
    else:
        default_name = f"region-captioner-{fusion}"
    model_name = model_id.split("/")[-1] if model_id else default_name
    # the Hub only accepts model ids as `base_model`; a local path is mentioned in the text only
    base_model_on_hub = (
        base_model is not None and _HUB_ID.match(base_model) is not None and not Path(base_model).exists()
    )
    tags = list(family_card.tags) + [family.replace("_", "-"), "hf_vlalign"]
    if supervision_key != "none":
        if "attention-supervision" not in tags:
            tags.append("attention-supervision")
        tags.append(f"{supervision_key.replace('_', '-')}-supervision")
    if task_alignment:
        tags.append("alignment-decoder")
    if use_geometry:
        tags.append("geometry-aware-attention")
    if fusion != "none":
        tags += ["attention-alignment", f"a2-{fusion.replace('_', '-')}"]
    if synthetic_data:
        tags.append("synthetic-data")

    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="hf_vlalign",
        base_model=base_model if base_model_on_hub else None,
        datasets=datasets,
        tags=tags,
        model_name=model_name if checked_results else None,  # the `model-index` name
        eval_results=_eval_results(checked_results, datasets, family_card),
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(_find_template(family)),
        model_name=model_name,
        load_id=model_id or "path/to/checkpoint",
        subfolder=subfolder,
        base_model=base_model,
        base_model_on_hub=base_model_on_hub,
        supervision=_SUPERVISION_NAMES[supervision_key],
        supervision_key=supervision_key,
        supervision_description=_SUPERVISION_DESCRIPTIONS[supervision_key],
        results=[(name, format(value, ".4g")) for name, value in checked_results],
        training=checked_training,
        datasets=datasets,
        synthetic_data=synthetic_data,
        has_config=config is not None,
        settings=[(name, str(value)) for name, value in settings.items()],
        task_alignment=task_alignment,
        alignment_top_k=settings.get("alignment_top_k"),
        use_geometry=use_geometry,
        attention_alignment=fusion,
        fusion_description=_FUSION_DESCRIPTIONS.get(fusion, fusion),
        aligned_layers=settings.get("aligned_layers"),
        scst=training.get("scst_start_epoch") is not None,
    )
