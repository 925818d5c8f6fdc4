"""Hub model cards rendered from the Jinja templates in `model_cards/` (one template per model family).

Families: `single_stream` (VGP fine-tuning with attention supervision, Samaran et al.), `two_stream` (LXMERT-style
pre-training with the alignment decoder of Kervadec et al.) and `captioner` (geometry-aware region captioner with A2
attention alignment), rendered by `render_model_card`; what differs between them is declared in each family's
`FamilySpec.card` (`hf_vlalign.models.family`). The downstream tasks (VQA / GQA, NLVR2, RefCOCO+, Flickr30k
phrase grounding) of either encoder family and the single-stream (VisualBERT-style) pre-training share one template,
`model_cards/task.md`, rendered by `render_task_model_card`. Every card's YAML metadata is a
`huggingface_hub.ModelCardData`: `library_name: hf_vlalign`, tags, datasets, `base_model` (when a Hub id) and a
`model-index` built from the task metrics among the numeric entries of `eval_results.json` (`is_task_metric`: no
losses, runtimes or baselines; the card's results table shows every entry). Given the `baselines` entry of
`eval_results.json` (`hf_vlalign.evaluation.baselines`), the results table shows each accuracy's baseline beside it and
flags, with a warning line under the table, every result that does not beat its baseline.

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

from ..models.family import FAMILIES, LIBRARY_AUTO_CLASSES, SUPERVISION_FIELDS
from ..supervision.config import SUPERVISION_METHODS

__all__ = [
    "MODEL_CARD_FAMILIES",
    "TASK_CARD_TASKS",
    "is_task_metric",
    "metrics_from_eval_results",
    "render_model_card",
    "render_task_model_card",
]

# every family has a card (`FamilySpec.card`, `hf_vlalign.models.family`)
MODEL_CARD_FAMILIES = tuple(FAMILIES)

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
# the A2 fusions of the original and the aligned cross-attention (Fei 2022, sec. 3.3)
_FUSION_DESCRIPTIONS = {
    "none": "No attention alignment: the decoder uses its raw cross-attention (the A2 ablation baseline).",
    "max": "the element-wise maximum of the original and the aligned attention",
    "moving_average": "a moving average of the original and the aligned attention (weight `alignment_eta`, form "
    "`alignment_moving_average`), re-normalised over the regions",
    "exp_decay": "an exponentially decaying mix that moves from the original to the aligned attention during training "
    "(temperature `alignment_temperature`, in steps)",
    "gate": "a learnable gate between the original and the aligned attention",
}


def _find_template(template: str) -> Path:
    """Path of `model_cards/<template>.md` (a family's `FamilySpec.card.template`, or "task"), from the source checkout
    first, then from the installed distribution."""
    filename = f"{template}.md"
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


# how each baseline kind (`hf_vlalign.evaluation.baselines.BASELINE_KINDS`) reads in the card's results table
_BASELINE_NAMES = {
    "majority_class": "majority class",
    "majority_class_per_type": "majority class per answer type",
    "majority_class_eval": "majority class of the evaluation rows",
    "largest_region": "largest region",
    "detection_confidence": "most confident region",
}
# what each kind predicts, in the legend under the results table
_BASELINE_LEGENDS = {
    "majority_class": "the most frequent training label (VQA: the training answer of the largest summed soft score) "
    "for every evaluation example, scored with the same metric",
    "majority_class_per_type": "each answer type's most frequent training answer for that type's questions",
    "majority_class_eval": "the most frequent label of the evaluation examples themselves (no training labels exist: "
    "the masks and mismatched captions are drawn at collation)",
    "largest_region": "the image's largest region, whatever the text says",
    "detection_confidence": "the detector's most confident region, whatever the text says (Li et al. 2020)",
}


def _check_baselines(baselines: Mapping[str, Mapping] | None, results: list[tuple[str, float]]) -> dict[str, dict]:
    """`baselines` (the `baselines` entry of `eval_results.json`: {metric: {"baseline", "kind", "beats", ...}}) checked
    against the card's `results`."""
    if baselines is None:
        return {}
    if not isinstance(baselines, Mapping):
        raise ValueError(f"`baselines` must be a dict of metric name -> baseline entry or None, got {type(baselines).__name__}.")
    names = {name for name, _ in results}
    checked = {}
    for name, entry in baselines.items():
        if name not in names:
            raise ValueError(f"`baselines[{name!r}]` compares a metric that is not in `results` ({sorted(names)}).")
        if not isinstance(entry, Mapping) or entry.get("kind") not in _BASELINE_NAMES:
            raise ValueError(
                f"`baselines[{name!r}]` must be a dict with a `kind` among {tuple(_BASELINE_NAMES)}, got {entry!r}."
            )
        value = entry.get("baseline")
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"`baselines[{name!r}]['baseline']` must be a finite number, got {value!r}.")
        if not isinstance(entry.get("beats"), bool):
            raise ValueError(f"`baselines[{name!r}]['beats']` must be true or false, got {entry.get('beats')!r}.")
        checked[name] = dict(entry)
    return checked


def _baseline_cell(entry: Mapping | None) -> str:
    """The results table's baseline cell: the baseline and its kind, flagged when the model does not beat it."""
    if entry is None:
        return ""
    kind = _BASELINE_NAMES[entry["kind"]]
    cell = f"{format(float(entry['baseline']), '.4g')} ({kind})"
    return cell if entry["beats"] else f"{cell} ⚠ does not beat the {kind} baseline"


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


# results that are not task metrics of the model: losses, the Trainer's bookkeeping, and baselines, chance levels and
# detector upper bounds measured on the data
_NOT_TASK_METRIC = re.compile(
    r"(^|[/_])(loss|runtime|samples_per_second|steps_per_second|epoch|baseline|chance|upper_bound|largest_region"
    r"|most_frequent)($|_)"
)


def is_task_metric(name: str) -> bool:
    """Whether a result named `name` is a task metric of the model (an accuracy, BLEU-4, CIDEr-D, ...), listed in the
    card's `model-index`; losses (`eval_loss`, `loss_attention_supervision`, ...), runtimes, epochs, baselines, chance
    levels and upper bounds (`grounding_baseline_accuracy`, `largest_region_accuracy`, `upper_bound_accuracy`) stay in
    the card's results table only."""
    return not _NOT_TASK_METRIC.search(name)


def _eval_results(
    results: list[tuple[str, float]], *, task_type: str, task_name: str, dataset_type: str, dataset_name: str
) -> list[EvalResult] | None:
    """`model-index` entries: every task metric (`is_task_metric`), measured on one task and one dataset."""
    results = [(name, value) for name, value in results if is_task_metric(name)]
    if not results:
        return None
    return [
        EvalResult(
            task_type=task_type,
            task_name=task_name,
            dataset_type=dataset_type,
            dataset_name=dataset_name,
            metric_type=name,
            metric_name=name,
            metric_value=value,
        )
        for name, value in results
    ]


def _config_settings(config: Any, family: str, fields: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The settings `fields` (default: the family's) of `config` (a `PreTrainedConfig`, a config dict or None)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        values = dict(config)
    elif hasattr(config, "to_dict"):
        values = config.to_dict()
    else:
        raise ValueError(f"`config` must be a model configuration, a dict or None, got {type(config).__name__}.")
    model_type = values.get("model_type")
    expected = FAMILIES[family].model_type
    if model_type is not None and model_type != expected:
        raise ValueError(
            f"`config` must be a `{expected}` configuration for the `{family}` card, got model_type {model_type!r}."
        )
    fields = FAMILIES[family].card.settings if fields is None else fields
    return {name: values[name] for name in fields if name in values}


def _resolve_supervision(supervision: str | None, settings: dict[str, Any], family: str) -> str:
    from_config = settings.get("attention_supervision")
    if supervision is None:
        supervision = from_config if from_config is not None else "none"
    key = supervision.replace("-", "_") if isinstance(supervision, str) else supervision
    if key not in SUPERVISION_METHODS:
        raise ValueError(f"`supervision` must be one of {SUPERVISION_METHODS}, got {supervision!r}.")
    if not FAMILIES[family].attention_supervision and key != "none":
        raise ValueError(
            f"`supervision` must be None or 'none' for the `{family}` family (it has no attention supervision), "
            f"got {supervision!r}."
        )
    if from_config is not None and from_config != key:
        raise ValueError(
            f"`supervision` ({supervision!r}) contradicts the config's `attention_supervision` ({from_config!r})."
        )
    return key


@dataclass(frozen=True)
class _CommonArguments:
    """The arguments every card checks the same way."""

    datasets: list[str] | None
    results: list[tuple[str, float]]
    baselines: dict[str, dict]
    training: list[tuple[str, str]]
    synthetic_data: bool


def _check_common_arguments(
    *,
    model_id: str | None,
    base_model: str | None,
    subfolder: str | None,
    datasets: list[str] | None,
    results: dict[str, float],
    baselines: Mapping[str, Mapping] | None,
    training: dict[str, object],
    synthetic_data: bool | None,
) -> _CommonArguments:
    for name, value in (("model_id", model_id), ("base_model", base_model), ("subfolder", subfolder)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"`{name}` must be a non-empty string or None, got {value!r}.")
    if datasets is not None and (
        not isinstance(datasets, list) or not all(isinstance(d, str) and d for d in datasets)
    ):
        raise ValueError(f"`datasets` must be a list of dataset ids or None, got {datasets!r}.")
    checked_results = _check_results(results)
    checked_baselines = _check_baselines(baselines, checked_results)
    checked_training = _check_training(training)
    datasets = datasets or None
    synthetic_data = datasets is None if synthetic_data is None else bool(synthetic_data)
    return _CommonArguments(datasets, checked_results, checked_baselines, checked_training, synthetic_data)


def _is_hub_id(base_model: str | None) -> bool:
    """The Hub only accepts model ids as `base_model`; a local path is mentioned in the text only."""
    return base_model is not None and _HUB_ID.match(base_model) is not None and not Path(base_model).exists()


def _add_supervision_tags(tags: list[str], supervision_key: str) -> None:
    if supervision_key == "none":
        return
    if "attention-supervision" not in tags:
        tags.append("attention-supervision")
    tags.append(f"{supervision_key.replace('_', '-')}-supervision")


def _template_variables(
    arguments: _CommonArguments,
    *,
    model_name: str,
    model_id: str | None,
    subfolder: str | None,
    base_model: str | None,
    supervision_key: str,
    settings: dict[str, Any],
    config: Any,
) -> dict[str, Any]:
    """The variables every template reads."""
    return dict(
        model_name=model_name,
        load_id=model_id or "path/to/checkpoint",
        subfolder=subfolder,
        base_model=base_model,
        base_model_on_hub=_is_hub_id(base_model),
        supervision=_SUPERVISION_NAMES[supervision_key],
        supervision_key=supervision_key,
        supervision_description=_SUPERVISION_DESCRIPTIONS[supervision_key],
        results=[
            (name, format(value, ".4g"), _baseline_cell(arguments.baselines.get(name))) for name, value in arguments.results
        ],
        has_baselines=bool(arguments.baselines),
        baseline_legend=[
            (_BASELINE_NAMES[kind], _BASELINE_LEGENDS[kind])
            for kind in dict.fromkeys(entry["kind"] for entry in arguments.baselines.values())
        ],
        baselines_not_beaten=[name for name, entry in arguments.baselines.items() if not entry["beats"]],
        training=arguments.training,
        datasets=arguments.datasets,
        synthetic_data=arguments.synthetic_data,
        has_config=config is not None,
        settings=[(name, str(value)) for name, value in settings.items()],
    )


def render_model_card(
    family: str,
    *,
    model_id: str | None,
    base_model: str | None,
    supervision: str | None = None,
    results: dict[str, float],
    training: dict[str, object],
    baselines: Mapping[str, Mapping] | None = None,
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
        training: training settings (steps trained, learning rate, ...), shown as a table.
        baselines: the `baselines` entry of `eval_results.json` ({metric: {"baseline", "kind", "beats"}}, built by
            `hf_vlalign.evaluation.baselines.compare_with_baselines`): each metric's baseline is shown beside it, with
            a warning when the model does not beat it. None: no baseline column.
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
    family_card = FAMILIES[family].card
    settings = _config_settings(config, family)
    supervision_key = _resolve_supervision(supervision, settings, family)
    arguments = _check_common_arguments(
        model_id=model_id,
        base_model=base_model,
        subfolder=subfolder,
        datasets=datasets,
        results=results,
        baselines=baselines,
        training=training,
        synthetic_data=synthetic_data,
    )

    task_alignment = bool(settings.get("task_alignment", False))
    fusion = settings.get("attention_alignment", "none")
    use_geometry = settings.get("use_geometry")
    alignment = "-alignment" if task_alignment else ""
    default_name = family_card.default_name.format(supervision=supervision_key, alignment=alignment, fusion=fusion)
    model_name = model_id.split("/")[-1] if model_id else default_name
    tags = list(family_card.tags) + [family.replace("_", "-"), "hf_vlalign"]
    _add_supervision_tags(tags, supervision_key)
    if task_alignment:
        tags.append("alignment-decoder")
    if use_geometry:
        tags.append("geometry-aware-attention")
    if fusion != "none":
        tags += ["attention-alignment", f"a2-{fusion.replace('_', '-')}"]
    if arguments.synthetic_data:
        tags.append("synthetic-data")

    dataset = arguments.datasets[0] if arguments.datasets else "synthetic-grounded-scenes"
    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="hf_vlalign",
        base_model=base_model if _is_hub_id(base_model) else None,
        datasets=arguments.datasets,
        tags=tags,
        model_name=model_name if any(is_task_metric(name) for name, _ in arguments.results) else None,  # model-index
        eval_results=_eval_results(
            arguments.results,
            task_type=family_card.task_type,
            task_name=family_card.task_name,
            dataset_type=dataset,
            dataset_name=dataset,
        ),
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(_find_template(family_card.template)),
        **_template_variables(
            arguments,
            model_name=model_name,
            model_id=model_id,
            subfolder=subfolder,
            base_model=base_model,
            supervision_key=supervision_key,
            settings=settings,
            config=config,
        ),
        task_alignment=task_alignment,
        alignment_top_k=settings.get("alignment_top_k"),
        use_geometry=use_geometry,
        attention_alignment=fusion,
        fusion_description=_FUSION_DESCRIPTIONS.get(fusion, fusion),
        aligned_layers=settings.get("aligned_layers"),
        scst=training.get("scst_start_epoch") is not None,
    )


# ----------------------------------------------------------------------------------------------------------------
# Downstream tasks and single-stream pre-training: one template, model_cards/task.md
# ----------------------------------------------------------------------------------------------------------------

TASK_CARD_TASKS = ("question_answering", "visual_reasoning", "referring_expression", "phrase_grounding", "pretraining")
# the families with task cards (`FamilySpec.card.task_card_tags`)
_TASK_CARD_FAMILIES = tuple(name for name, spec in FAMILIES.items() if spec.card.task_card_tags is not None)
_TASK_TEMPLATE = "task"
_SYNTHETIC_DATASET_NAME = "synthetic grounded scenes (hf_vlalign)"

# the datasets of the library's builders (`hf_vlalign.data.build_dataset` names) as their papers name them
_DATASET_NAMES = {
    "vqa_v2": "VQA v2",
    "gqa": "GQA",
    "nlvr2": "NLVR2",
    "refcoco+": "RefCOCO+",
    "flickr30k_entities": "Flickr30k Entities",
    "coco_captions": "COCO Captions",
}
_TASK_NO_SUPERVISION = "No attention supervision was used: the attention was trained by the task loss only."


@dataclass(frozen=True)
class _TaskCard:
    """What differs between the tasks' cards (the prose lives in model_cards/task.md). The model class and the Auto
    class of the loading snippet are the family's (`FamilySpec.model(task)`: a task card's task is a model kind)."""

    task_type: str  # `model-index` task
    task_name: str
    tags: tuple[str, ...]
    pipeline_tag: str | None
    settings: tuple[str, ...]  # the task's own config fields shown in the settings table
    datasets: tuple[str, ...]  # the real datasets of the task (`_DATASET_NAMES` keys)
    supervised: bool  # whether the task's model takes `word_region_alignment` (so attention supervision applies)
    families: tuple[str, ...] = _TASK_CARD_FAMILIES


_TASKS = {
    "question_answering": _TaskCard(
        task_type="visual-question-answering",
        task_name="Visual question answering",
        tags=("visual-question-answering",),
        pipeline_tag="visual-question-answering",
        settings=("num_qa_labels",),
        datasets=("vqa_v2", "gqa"),
        supervised=True,
    ),
    "visual_reasoning": _TaskCard(
        task_type="visual-reasoning",
        task_name="Visual reasoning over image pairs",
        tags=("visual-reasoning", "nlvr2"),
        pipeline_tag=None,
        settings=(),
        datasets=("nlvr2",),
        supervised=False,
    ),
    "referring_expression": _TaskCard(
        task_type="referring-expression-comprehension",
        task_name="Referring expression comprehension",
        tags=("referring-expression-comprehension", "visual-grounding"),
        pipeline_tag=None,
        settings=("referring_iou_threshold",),
        datasets=("refcoco+",),
        supervised=True,
    ),
    "phrase_grounding": _TaskCard(
        task_type="phrase-grounding",
        task_name="Phrase grounding",
        tags=("phrase-grounding", "visual-grounding"),
        pipeline_tag=None,
        settings=(),
        datasets=("flickr30k_entities",),
        supervised=True,
    ),
    "pretraining": _TaskCard(
        task_type="vision-language-pretraining",
        task_name="Masked language modelling with the image and sentence-image prediction",
        tags=("vision-language-pretraining", "masked-language-modeling", "visualbert"),
        pipeline_tag=None,
        settings=(
            "num_object_labels", "mlm_weight", "sentence_image_weight", "region_feature_weight",
            "region_class_weight",
        ),  # fmt: skip
        datasets=("coco_captions",),
        supervised=True,
        families=("single_stream",),  # the two-stream pre-training has its own card (`render_model_card("two_stream")`)
    ),
}


def _check_task(task: str, model_family: str) -> _TaskCard:
    if task not in TASK_CARD_TASKS:
        raise ValueError(f"`task` must be one of {TASK_CARD_TASKS}, got {task!r}.")
    if model_family not in _TASK_CARD_FAMILIES:
        raise ValueError(f"`model_family` must be one of {_TASK_CARD_FAMILIES}, got {model_family!r}.")
    task_card = _TASKS[task]
    if model_family not in task_card.families:
        raise ValueError(
            f"`model_family` must be one of {task_card.families} for the `{task}` card, got {model_family!r}; the "
            "two-stream pre-training has its own card: `render_model_card('two_stream', ...)`."
        )
    return task_card


def _evaluation_dataset(
    task: str, dataset_name: str | None, datasets: list[str] | None, synthetic_data: bool
) -> tuple[str | None, str, str]:
    """(builder key or None, `model-index` dataset type, dataset name) of the evaluation data.

    The name is `dataset_name` (a builder name such as "vqa_v2" reads as its paper's name, "VQA v2"), else the first
    training dataset, else the synthetic scenes, else the task's real dataset(s)."""
    task_datasets = _TASKS[task].datasets
    if dataset_name is not None:
        if not isinstance(dataset_name, str) or not dataset_name.strip():
            raise ValueError(f"`dataset_name` must be a non-empty string or None, got {dataset_name!r}.")
        if dataset_name in _DATASET_NAMES:
            if dataset_name not in task_datasets:
                raise ValueError(
                    f"`dataset_name` must be a dataset of the `{task}` task {task_datasets} (or a free-form name), "
                    f"got {dataset_name!r}."
                )
            return dataset_name, dataset_name, _DATASET_NAMES[dataset_name]
        return None, datasets[0] if datasets else _slug(dataset_name), dataset_name
    if datasets:
        return None, datasets[0], datasets[0]
    if synthetic_data:
        return None, "synthetic-grounded-scenes", _SYNTHETIC_DATASET_NAME
    key = task_datasets[0] if len(task_datasets) == 1 else None
    return key, _slug(" ".join(task_datasets)), " / ".join(_DATASET_NAMES[name] for name in task_datasets)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "dataset"


def render_task_model_card(
    task: str,
    *,
    model_family: str,
    model_id: str | None,
    base_model: str | None,
    results: dict[str, float],
    training: dict[str, object],
    baselines: Mapping[str, Mapping] | None = None,
    config: Any = None,
    datasets: list[str] | None = None,
    synthetic_data: bool | None = None,
    subfolder: str | None = None,
    license: str = "apache-2.0",
    dataset_name: str | None = None,
) -> ModelCard:
    """Renders the Hub model card of a downstream-task checkpoint (or a single-stream pre-trained one) from
    `model_cards/task.md`.

    Args:
        task: one of `TASK_CARD_TASKS`: `question_answering` (VQA v2 / GQA), `visual_reasoning` (NLVR2),
            `referring_expression` (RefCOCO+), `phrase_grounding` (Flickr30k Entities) or `pretraining`
            (VisualBERT-style, single-stream only; the two-stream pre-training has its own card,
            `render_model_card("two_stream", ...)`).
        model_family: `single_stream` (VL-BERT / VisualBERT style) or `two_stream` (LXMERT style).
        model_id: Hub id of the checkpoint (`user/name`), used in the loading snippet; None for a local checkpoint.
        base_model: Hub id (or local path) of the weights the model started from.
        results: metric name -> value, shown as a table and as `model-index` eval results.
        training: training settings (steps trained, learning rate, ...), shown as a table.
        baselines: the `baselines` entry of `eval_results.json` ({metric: {"baseline", "kind", "beats"}}, built by
            `hf_vlalign.evaluation.baselines.compare_with_baselines`): each metric's baseline is shown beside it, with
            a warning when the model does not beat it. None: no baseline column.
        config: the checkpoint's configuration (a `PreTrainedConfig` or its dict); its attention supervision and task
            settings are described and shown as a table. Without it those parts of the card are left out.
        datasets: Hub ids of the training datasets (YAML `datasets`); None when none is on the Hub.
        synthetic_data: whether the model was trained on synthetic scenes; defaults to `datasets is None and
            dataset_name is None`.
        subfolder: folder of the checkpoint inside the repository, when it is not at the root (loading snippet).
        license: license id of the checkpoint.
        dataset_name: name of the evaluation dataset in `model-index` and in the text; a builder name of
            `hf_vlalign.data.build_dataset` ("vqa_v2", "gqa", "nlvr2", "refcoco+", "flickr30k_entities",
            "coco_captions") is shown as its paper names it and picks the matching objective and citation. Default:
            the first of `datasets`, else the synthetic scenes (when `synthetic_data`), else the task's real
            dataset(s).

    Returns:
        A `huggingface_hub.ModelCard`; `card.save("README.md")` or `card.push_to_hub(repo_id)` publishes it.
    """
    task_card = _check_task(task, model_family)
    if synthetic_data is None and dataset_name is not None:
        synthetic_data = False  # a named evaluation dataset is real data, with or without a Hub id
    spec = FAMILIES[model_family]
    fields = spec.layer_fields + SUPERVISION_FIELDS + task_card.settings
    settings = _config_settings(config, model_family, fields)
    supervision_key = _resolve_supervision(None, settings, model_family)
    arguments = _check_common_arguments(
        model_id=model_id,
        base_model=base_model,
        subfolder=subfolder,
        datasets=datasets,
        results=results,
        baselines=baselines,
        training=training,
        synthetic_data=synthetic_data,
    )
    dataset_key, dataset_type, evaluation_dataset = _evaluation_dataset(
        task, dataset_name, arguments.datasets, arguments.synthetic_data
    )
    # the supervision the task's training applied: none for a task whose model takes no word-region alignment
    applied_supervision = supervision_key if task_card.supervised else "none"

    family_slug = model_family.replace("_", "-")
    default_name = f"{family_slug}-pretrained" if task == "pretraining" else f"{family_slug}-{task.replace('_', '-')}"
    if applied_supervision != "none":
        default_name += f"-{applied_supervision.replace('_', '-')}"
    model_name = model_id.split("/")[-1] if model_id else default_name
    tags = ["vision-language", *task_card.tags, *spec.card.task_card_tags, "hf_vlalign"]
    _add_supervision_tags(tags, applied_supervision)
    if arguments.synthetic_data:
        tags.append("synthetic-data")

    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="hf_vlalign",
        pipeline_tag=task_card.pipeline_tag,
        base_model=base_model if _is_hub_id(base_model) else None,
        datasets=arguments.datasets,
        tags=tags,
        model_name=model_name if any(is_task_metric(name) for name, _ in arguments.results) else None,  # model-index
        eval_results=_eval_results(
            arguments.results,
            task_type=task_card.task_type,
            task_name=task_card.task_name,
            dataset_type=dataset_type,
            dataset_name=evaluation_dataset,
        ),
    )
    variables = _template_variables(
        arguments,
        model_name=model_name,
        model_id=model_id,
        subfolder=subfolder,
        base_model=base_model,
        supervision_key=supervision_key,
        settings=settings,
        config=config,
    )
    if supervision_key == "none":
        variables["supervision_description"] = _TASK_NO_SUPERVISION
    model = spec.model(task)  # the task cards' tasks are the families' model kinds
    if model.auto_class not in LIBRARY_AUTO_CLASSES:  # imported from transformers
        auto_class, transformers_imports = model.auto_class, f"{model.auto_class}, AutoTokenizer"
    else:  # an `hf_vlalign` attribute
        auto_class, transformers_imports = f"hf_vlalign.{model.auto_class}", "AutoTokenizer"
    return ModelCard.from_template(
        card_data,
        template_path=str(_find_template(_TASK_TEMPLATE)),
        **variables,
        task=task,
        model_family=model_family,
        task_supervised=task_card.supervised,
        auto_class=auto_class,
        transformers_imports=transformers_imports,
        model_class=model.class_name,
        dataset_key=dataset_key,
        evaluation_dataset=evaluation_dataset,
        cited_datasets=[dataset_key] if dataset_key else list(task_card.datasets),
        num_qa_labels=settings.get("num_qa_labels"),
        referring_iou_threshold=settings.get("referring_iou_threshold", 0.5),
        num_object_labels=settings.get("num_object_labels"),
    )
