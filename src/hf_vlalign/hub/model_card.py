"""Hub model cards, one Jinja template per kind of run in `model_cards/` filled from the run's results, as trl's
`generate_model_card` does: `render_model_card` for a family's own run (`FamilySpec.card`), `render_task_model_card`
for the downstream tasks and the single-stream pre-training. The templates are read from `<repository>/model_cards/` in
a source checkout, else from `<prefix>/share/hf_vlalign/model_cards/` (setup.cfg's `[options.data_files]`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..models.family import FAMILIES, LIBRARY_AUTO_CLASSES, SUPERVISION_FIELDS

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
TASK_CARD_TASKS = ("question_answering", "visual_reasoning", "referring_expression", "phrase_grounding", "pretraining")

_DISTRIBUTION = "hf-vlalign"
_INSTALLED_TEMPLATE_FOLDER = "share/hf_vlalign/model_cards"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# results that are not task metrics of the model: losses, the Trainer's bookkeeping, and baselines, chance levels and
# detector upper bounds measured on the data
_NOT_TASK_METRIC = re.compile(
    r"(^|[/_])(loss|runtime|samples_per_second|steps_per_second|epoch|baseline|chance|upper_bound|largest_region"
    r"|most_frequent)($|_)"
)
_SYNTHETIC_DATASET = ("synthetic-grounded-scenes", "synthetic grounded scenes (hf_vlalign)")
# the datasets of the library's builders (`hf_vlalign.data.build_dataset` names) as their papers name them
_DATASET_NAMES = {
    "vqa_v2": "VQA v2",
    "gqa": "GQA",
    "nlvr2": "NLVR2",
    "refcoco+": "RefCOCO+",
    "flickr30k_entities": "Flickr30k Entities",
    "coco_captions": "COCO Captions",
}


@dataclass(frozen=True)
class _TaskCard:
    """The metadata of a task's card (its prose is in model_cards/task.md). The model class and the Auto class of the
    loading snippet are the family's (`FamilySpec.model(task)`: a task card's task is a model kind)."""

    task_type: str  # `model-index` task
    task_name: str
    tags: tuple[str, ...]
    settings: tuple[str, ...]  # the task's own config fields shown in the settings table
    datasets: tuple[str, ...]  # the real datasets of the task (`_DATASET_NAMES` keys)
    supervised: bool = True  # whether the task's model takes `word_region_alignment` (attention supervision applies)
    pipeline_tag: str | None = None


_TASKS = {
    "question_answering": _TaskCard(
        "visual-question-answering", "Visual question answering", ("visual-question-answering",),
        ("num_qa_labels",), ("vqa_v2", "gqa"), pipeline_tag="visual-question-answering",
    ),
    "visual_reasoning": _TaskCard(
        "visual-reasoning", "Visual reasoning over image pairs", ("visual-reasoning", "nlvr2"), (), ("nlvr2",),
        supervised=False,
    ),
    "referring_expression": _TaskCard(
        "referring-expression-comprehension", "Referring expression comprehension",
        ("referring-expression-comprehension", "visual-grounding"), ("referring_iou_threshold",), ("refcoco+",),
    ),
    "phrase_grounding": _TaskCard(
        "phrase-grounding", "Phrase grounding", ("phrase-grounding", "visual-grounding"), (), ("flickr30k_entities",)
    ),
    "pretraining": _TaskCard(
        "vision-language-pretraining", "Masked language modelling with the image and sentence-image prediction",
        ("vision-language-pretraining", "masked-language-modeling", "visualbert"),
        ("num_object_labels", "mlm_weight", "sentence_image_weight", "region_feature_weight", "region_class_weight"),
        ("coco_captions",),
    ),
}  # fmt: skip


def _find_template(template: str) -> Path:
    """Path of `model_cards/<template>.md`, from the source checkout first, then from the installed distribution."""
    filename = f"{template}.md"
    package_root = Path(__file__).resolve().parents[1]  # .../hf_vlalign
    checkout_template = package_root.parent.parent / "model_cards" / filename
    if package_root.parent.name == "src" and checkout_template.is_file():
        return checkout_template
    try:
        files = metadata.distribution(_DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.as_posix().endswith(f"{_INSTALLED_TEMPLATE_FOLDER}/{filename}"):
            return Path(file.locate()).resolve()
    raise FileNotFoundError(
        f"The model-card template `{filename}` is neither in the source checkout (model_cards/) nor installed with "
        f"the `{_DISTRIBUTION}` distribution ({_INSTALLED_TEMPLATE_FOLDER}/); reinstall hf_vlalign."
    )


def metrics_from_eval_results(eval_results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The metrics of an `eval_results.json` dict for `render_model_card(results=...)`: its finite float values (not
    counts, settings or per-layer details), each name after `prefix` (e.g. `"with_alignment/"` for one run of several).
    """
    return {
        f"{prefix}{name}": value
        for name, value in eval_results.items()
        if isinstance(value, float) and math.isfinite(value)
    }


def is_task_metric(name: str) -> bool:
    """Whether a result named `name` is a task metric of the model (an accuracy, BLEU-4, CIDEr-D, ...), listed in the
    card's `model-index`; losses (`eval_loss`, `loss_attention_supervision`, ...), runtimes, epochs, baselines, chance
    levels and upper bounds (`grounding_baseline_accuracy`, `largest_region_accuracy`, `upper_bound_accuracy`) stay in
    the card's results table only."""
    return not _NOT_TASK_METRIC.search(name)


def _is_hub_id(base_model: str | None) -> bool:
    """The Hub only accepts model ids as `base_model`; a local path is mentioned in the text only."""
    return base_model is not None and _HUB_ID.match(base_model) is not None and not Path(base_model).exists()


@dataclass(frozen=True)
class _Run:
    """What a training run gives its card: where it started, what it measured, how it trained, where it is saved."""

    model_id: str | None
    base_model: str | None
    results: dict[str, float]
    baselines: Mapping[str, Mapping] | None
    training: dict[str, object]
    config: Any
    datasets: list[str] | None
    synthetic_data: bool
    subfolder: str | None
    license: str

    def settings(self, fields: tuple[str, ...]) -> dict[str, Any]:
        """The settings `fields` of the run's config (a `PreTrainedConfig`, its dict or None)."""
        config = self.config
        values = {} if config is None else dict(config) if isinstance(config, Mapping) else config.to_dict()
        return {name: values[name] for name in fields if name in values}


def _supervision_tags(supervision: str) -> list[str]:
    return [] if supervision == "none" else ["attention-supervision", f"{supervision.replace('_', '-')}-supervision"]


def _render(
    template: str, run: _Run, *, model_name: str, tags: list[str], index: dict[str, str], pipeline_tag=None, **variables
) -> ModelCard:
    """The card of `run`: `model_cards/<template>.md` (which may include the other templates there) filled with its
    results and `variables`, under its YAML metadata; `index` (`task_type`, `task_name`, `dataset_type`,
    `dataset_name`) heads the `model-index` of the task metrics among the results."""
    eval_results = [
        EvalResult(**index, metric_type=name, metric_name=name, metric_value=float(value))
        for name, value in run.results.items()
        if is_task_metric(name)
    ]
    card_data = ModelCardData(
        language="en",
        license=run.license,
        library_name="hf_vlalign",
        pipeline_tag=pipeline_tag,
        base_model=run.base_model if _is_hub_id(run.base_model) else None,
        datasets=run.datasets,
        tags=list(dict.fromkeys(tags + ["synthetic-data"] * run.synthetic_data)),
        model_name=model_name if eval_results else None,  # the model-index's name
        eval_results=eval_results or None,
    )
    baselines = dict(run.baselines or {})
    path = _find_template(template)
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(path.parent))
    content = environment.get_template(path.name).render(
        card_data=card_data.to_yaml(),
        model_name=model_name,
        load_id=run.model_id or "path/to/checkpoint",
        subfolder=run.subfolder,
        base_model=run.base_model,
        base_model_on_hub=_is_hub_id(run.base_model),
        datasets=run.datasets,
        synthetic_data=run.synthetic_data,
        has_config=run.config is not None,
        results=[(name, format(float(value), ".4g"), baselines.get(name)) for name, value in run.results.items()],
        baselines=baselines,
        training=[(name, str(value)) for name, value in run.training.items()],
        **variables,
    )
    return ModelCard(content)


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
        family: model family, one of `MODEL_CARD_FAMILIES`.
        model_id: Hub id of the checkpoint (`user/name`), used in the loading snippet; None for a local checkpoint.
        base_model: Hub id (or local path) of the text weights the model started from.
        supervision: attention-supervision method, one of `none`, `direct`, `semi_direct` (or `semi-direct`),
            `indirect`; None reads `config.attention_supervision` (or `none`). The captioner has none.
        results: metric name -> value, shown as a table and as `model-index` eval results
            (`metrics_from_eval_results(json.load(...))` turns an `eval_results.json` into this).
        training: training settings (steps trained, learning rate, ...), shown as a table.
        baselines: the `baselines` entry of `eval_results.json` (`compare_with_baselines`): each metric's baseline is
            shown beside it, with a warning when the model does not beat it. None: no baseline column.
        datasets: Hub ids of the training datasets; None when the library's synthetic scenes were used.
        license: license id of the checkpoint.
        synthetic_data: whether the model was trained on synthetic scenes; defaults to `datasets is None`.
        config: the checkpoint's configuration (a `PreTrainedConfig` or its dict); its settings (`FamilySpec.card`)
            are described and shown as a table. Without it those parts of the card are left out.
        subfolder: folder of the checkpoint inside the repository, when it is not at the root (loading snippet).

    Returns:
        A `huggingface_hub.ModelCard`; `card.save("README.md")` or `card.push_to_hub(repo_id)` publishes it.
    """
    card = FAMILIES[family].card
    synthetic_data = not datasets if synthetic_data is None else synthetic_data
    run = _Run(
        model_id, base_model, results, baselines, training, config, datasets or None, synthetic_data, subfolder, license
    )
    settings = run.settings(card.settings)
    supervision = (supervision or settings.get("attention_supervision") or "none").replace("-", "_")
    task_alignment = bool(settings.get("task_alignment", False))
    fusion = settings.get("attention_alignment", "none")
    default_name = card.default_name.format(
        supervision=supervision, alignment="-alignment" if task_alignment else "", fusion=fusion
    )
    tags = [*card.tags, family.replace("_", "-"), "hf_vlalign", *_supervision_tags(supervision)]
    tags += ["alignment-decoder"] * task_alignment + ["geometry-aware-attention"] * bool(settings.get("use_geometry"))
    if fusion != "none":
        tags += ["attention-alignment", f"a2-{fusion.replace('_', '-')}"]
    dataset = datasets[0] if datasets else _SYNTHETIC_DATASET[0]
    return _render(
        card.template,
        run,
        model_name=model_id.split("/")[-1] if model_id else default_name,
        tags=tags,
        index=dict(task_type=card.task_type, task_name=card.task_name, dataset_type=dataset, dataset_name=dataset),
        settings=settings,
        supervision_key=supervision,
        scst=training.get("scst_start_epoch") is not None,
    )


def _evaluation_dataset(task: str, dataset_name: str | None, datasets: list[str] | None, synthetic_data: bool) -> tuple:
    """(builder key or None, `model-index` dataset type, dataset name) of the evaluation data: `dataset_name` (a builder
    name such as "vqa_v2" reads as its paper's name, "VQA v2"), else the first training dataset, else the synthetic
    scenes, else the task's real dataset(s)."""
    task_datasets = _TASKS[task].datasets
    if dataset_name in _DATASET_NAMES:
        return dataset_name, dataset_name, _DATASET_NAMES[dataset_name]
    if dataset_name is not None:
        return None, datasets[0] if datasets else _slug(dataset_name), dataset_name
    if datasets:
        return None, datasets[0], datasets[0]
    if synthetic_data:
        return None, *_SYNTHETIC_DATASET
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
        model_id, base_model, results, training, baselines, subfolder, license: as in `render_model_card`.
        config: the checkpoint's configuration (a `PreTrainedConfig` or its dict); its attention supervision and task
            settings are described and shown as a table. Without it those parts of the card are left out.
        datasets: Hub ids of the training datasets (YAML `datasets`); None when none is on the Hub.
        synthetic_data: whether the model was trained on synthetic scenes; defaults to `datasets is None and
            dataset_name is None`.
        dataset_name: name of the evaluation dataset in `model-index` and in the text; a builder name of
            `hf_vlalign.data.build_dataset` ("vqa_v2", "gqa", "nlvr2", "refcoco+", "flickr30k_entities",
            "coco_captions") is shown as its paper names it and picks the matching objective and citation. Default:
            the first of `datasets`, else the synthetic scenes (when `synthetic_data`), else the task's real
            dataset(s).

    Returns:
        A `huggingface_hub.ModelCard`; `card.save("README.md")` or `card.push_to_hub(repo_id)` publishes it.
    """
    task_card, spec = _TASKS[task], FAMILIES[model_family]
    synthetic_data = not datasets and dataset_name is None if synthetic_data is None else synthetic_data
    run = _Run(
        model_id, base_model, results, baselines, training, config, datasets or None, synthetic_data, subfolder, license
    )
    settings = run.settings(spec.layer_fields + SUPERVISION_FIELDS + task_card.settings)
    supervision = settings.get("attention_supervision", "none")
    dataset_key, dataset_type, evaluation_dataset = _evaluation_dataset(task, dataset_name, datasets, synthetic_data)
    # the supervision the task's training applied: none for a task whose model takes no word-region alignment
    applied_supervision = supervision if task_card.supervised else "none"
    family_slug = model_family.replace("_", "-")
    default_name = f"{family_slug}-pretrained" if task == "pretraining" else f"{family_slug}-{task.replace('_', '-')}"
    if applied_supervision != "none":
        default_name += f"-{applied_supervision.replace('_', '-')}"
    model = spec.model(task)  # the task cards' tasks are the families' model kinds
    from_transformers = model.auto_class not in LIBRARY_AUTO_CLASSES
    return _render(
        "task",
        run,
        model_name=model_id.split("/")[-1] if model_id else default_name,
        tags=["vision-language", *task_card.tags, *spec.card.task_card_tags, "hf_vlalign"]
        + _supervision_tags(applied_supervision),
        index=dict(task_type=task_card.task_type, task_name=task_card.task_name, dataset_type=dataset_type,
                   dataset_name=evaluation_dataset),
        pipeline_tag=task_card.pipeline_tag,
        settings=settings,
        supervision_key=supervision,
        task=task,
        model_family=model_family,
        task_supervised=task_card.supervised,
        auto_class=model.auto_class if from_transformers else f"hf_vlalign.{model.auto_class}",
        transformers_imports=f"{model.auto_class}, AutoTokenizer" if from_transformers else "AutoTokenizer",
        model_class=model.class_name,
        dataset_key=dataset_key,
        evaluation_dataset=evaluation_dataset,
        cited_datasets=[dataset_key] if dataset_key else list(task_card.datasets),
    )
